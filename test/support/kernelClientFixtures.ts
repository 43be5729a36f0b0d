/**
 * The values both kernel-client test files build their requests from: the
 * agent secret, its signatures of the empty body and of the submit body, and
 * the ids of the execution, dispatch and step under test.
 */
import type * as KernelClient from "../../src/KernelClient.js"

export const SECRET = "hello-secret"
/** `sha256=` of the empty body with {@link SECRET}. */
export const EMPTY_SIGNATURE = "sha256=1da6af7253b037edb9d9bd6b9618bd15b98c72a795629e4aa38ecfc138c71703"
/**
 * `sha256=` with {@link SECRET} of the submit body
 * `{"kind":"tool_call","target":"web_search","args":{"query":"hello"},"idempotency":"safe_to_retry"}`.
 */
export const SUBMIT_SIGNATURE = "sha256=e9476b1512d71f59877d922dcc9669d921be4d0d58ad2b325aba0b0bac1fbe62"
export const EXEC = "0192f1a0-0000-7000-8000-000000000000"
export const DISPATCH = "0192f1a0-0000-7000-8000-0000000000d1"
export const STEP = "cd3f" + "0".repeat(56) + "5c29"
export const caller: KernelClient.Caller = { agentId: "hello", lease: { dispatchId: DISPATCH, attempt: 1 } }

/** The execution {@link EXEC} as the kernel answers `GET /v0/executions/{id}`. */
export const EXECUTION_WIRE = {
  id: EXEC,
  agent_id: "hello",
  input: { query: "hi" },
  status: "running",
  failure_reason: null,
  created_at: "2026-08-18T19:40:54.1Z",
  updated_at: "2026-08-18T19:40:54.1Z"
}
