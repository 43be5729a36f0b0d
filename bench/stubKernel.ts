/**
 * A minimal stub of the kernel's agent routes for the HTTP micro-benchmarks: a
 * bare `node:http` server on 127.0.0.1 that answers without validating or
 * checking signatures.
 *
 * - `GET /v0/executions/{id}` → a running execution;
 * - `POST …/steps` → `{"decision":"proceed","step_id":"<64 hex>"}`, or, for the
 *   execution id {@link REPLAY_EXECUTION_ID}, a `replay` decision with a small
 *   result;
 * - `POST …/steps/{step_id}/complete` and `/fail` → `{"decision":"recorded"}`;
 * - heartbeat, complete / fail execution → `204`.
 *
 * Run as a child process (`node .bench/bench/stubKernel.js`) it prints
 * `listening <port>` on stdout, so the benchmark's client side gets a core of
 * its own.
 *
 * @since 0.1.0
 */
import { createServer } from "node:http"
import type { IncomingMessage, Server, ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"

/** Submissions for this execution are answered with `replay`. */
export const REPLAY_EXECUTION_ID = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
/** Every other execution id gets `proceed`. */
export const PROCEED_EXECUTION_ID = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c"

const STEP_ID = "7f".repeat(32)
const PROCEED = JSON.stringify({ decision: "proceed", step_id: STEP_ID })
const REPLAY = JSON.stringify({ decision: "replay", step_id: STEP_ID, result: { ok: true } })
const RECORDED = JSON.stringify({ decision: "recorded" })

const execution = (id: string): string =>
  JSON.stringify({
    id,
    agent_id: "bench",
    agent_version: "",
    input: {},
    status: "running",
    failure_reason: "",
    created_at: "2026-01-01T00:00:00Z",
    updated_at: "2026-01-01T00:00:00Z",
    deadline_at: ""
  })

const json = (res: ServerResponse, body: string): void => {
  res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) })
  res.end(body)
}

const handle = (req: IncomingMessage, res: ServerResponse): void => {
  // Drain the body (never inspected), then answer.
  req.on("data", () => {})
  req.on("end", () => {
    const url = req.url ?? "/"
    const parts = url.split("?")[0]!.split("/") // ["", "v0", "executions", id, ...]
    const id = parts[3] ?? ""
    if (req.method === "GET" && parts.length === 4) return json(res, execution(id))
    if (req.method !== "POST") {
      res.writeHead(404).end()
      return
    }
    if (parts.length === 5 && parts[4] === "steps") return json(res, id === REPLAY_EXECUTION_ID ? REPLAY : PROCEED)
    if (parts.length === 7 && parts[4] === "steps") return json(res, RECORDED)
    res.writeHead(204).end()
  })
}

/**
 * Start the stub in this process; resolves with the server and its base URL.
 *
 * @since 0.1.0
 */
export const start = (): Promise<{ readonly server: Server; readonly url: string }> =>
  new Promise((resolve, reject) => {
    const server = createServer({ keepAliveTimeout: 60_000 }, handle)
    server.on("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as AddressInfo
      resolve({ server, url: `http://127.0.0.1:${port}` })
    })
  })

if (process.env["BENCH_STUB_CHILD"] === "1") {
  start().then(({ url }) => {
    process.stdout.write(`listening ${url}\n`)
    // Exit when the parent goes away.
    process.stdin.resume()
    process.stdin.on("end", () => process.exit(0))
    process.stdin.on("close", () => process.exit(0))
  })
}
