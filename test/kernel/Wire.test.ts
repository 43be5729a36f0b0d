import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { readFileSync } from "node:fs"
import type * as Core from "../../src/kernel/Core.js"
import * as Wire from "../../src/kernel/Wire.js"
import * as Signature from "../../src/Signature.js"

const currentVectors = JSON.parse(
  readFileSync(new URL("../../../shared/fixtures/current-vectors.json", import.meta.url), "utf8")
) as { readonly webhook: { readonly secret: string; readonly body: string; readonly signature: string } }

const EXEC_ID = "0192f1a0-0000-7000-8000-000000000000"
const STEP_ID = "cd3f927155fb730379530bac1d739ba26565d892ef2e70ff5c52fe235a4d5c29"
const HASH = "338db425bb36266fa8a2a902d03dc29e83b82a4776296048d2774d510924a0ce"
const T = Date.UTC(2026, 7, 18, 19, 40, 54, 120)
const T_TEXT = "2026-08-18T19:40:54.12Z"

const execution: Core.ExecutionRecord = {
  id: EXEC_ID,
  agentId: "hello",
  agentVersion: undefined,
  inputRaw: undefined,
  status: "running",
  outputRaw: undefined,
  failureReason: "",
  createdAtMs: T,
  updatedAtMs: T + 880,
  deadlineAtMs: undefined
}

const step: Core.StepRecord = {
  stepId: STEP_ID,
  executionId: EXEC_ID,
  kind: "tool_call",
  target: "web_search",
  argsHash: HASH,
  occurrence: 0,
  status: "executing",
  idempotency: "safe_to_retry",
  argsRaw: undefined,
  resultRaw: undefined,
  errorRaw: undefined
}

const approval: Core.ApprovalRecord = {
  id: EXEC_ID,
  stepId: STEP_ID,
  executionId: EXEC_ID,
  status: "pending",
  approvers: null,
  message: "",
  timeoutAtMs: T,
  decidedBy: "",
  rationale: "",
  createdAtMs: 0
}

describe("Wire", () => {
  it("execution: minimal and full member order", () => {
    expect(Wire.encodeExecution(execution)).toBe(
      `{"id":"${EXEC_ID}","agent_id":"hello","input":null,"status":"running","created_at":"${T_TEXT}","updated_at":"2026-08-18T19:40:55Z"}`
    )
    expect(
      Wire.encodeExecution({
        ...execution,
        agentVersion: "abc",
        inputRaw: "{\"q\":\"x\"}",
        status: "failed",
        outputRaw: "null",
        failureReason: "a<b",
        deadlineAtMs: 0
      })
    ).toBe(
      `{"id":"${EXEC_ID}","agent_id":"hello","agent_version":"abc","input":{"q":"x"},"status":"failed","output":null,"failure_reason":"a\\u003cb","created_at":"${T_TEXT}","updated_at":"2026-08-18T19:40:55Z","deadline_at":"1970-01-01T00:00:00Z"}`
    )
    expect(Wire.encodeExecution({ ...execution, agentVersion: "" })).not.toContain("agent_version")
  })

  it("step: optional members only when set", () => {
    expect(Wire.encodeStep(step)).toBe(
      `{"step_id":"${STEP_ID}","execution_id":"${EXEC_ID}","kind":"tool_call","target":"web_search","args_hash":"${HASH}","occurrence":0,"status":"executing","idempotency":"safe_to_retry"}`
    )
    expect(
      Wire.encodeStep({
        ...step,
        target: "café & co",
        occurrence: 3,
        status: "failed",
        argsRaw: "null",
        resultRaw: "{\"r\":1}",
        errorRaw: "{\"message\":\"x\"}",
        startedAtMs: T,
        completedAtMs: T + 1000
      })
    ).toBe(
      `{"step_id":"${STEP_ID}","execution_id":"${EXEC_ID}","kind":"tool_call","target":"café \\u0026 co","args_hash":"${HASH}","occurrence":3,"status":"failed","idempotency":"safe_to_retry","args":null,"result":{"r":1},"error":{"message":"x"},"started_at":"${T_TEXT}","completed_at":"2026-08-18T19:40:55.12Z"}`
    )
  })

  it("approval: approvers null, [] or a list; optional members", () => {
    expect(Wire.encodeApproval(approval)).toBe(
      `{"id":"${EXEC_ID}","step_id":"${STEP_ID}","execution_id":"${EXEC_ID}","status":"pending","approvers":null,"timeout_at":"${T_TEXT}","created_at":"1970-01-01T00:00:00Z"}`
    )
    expect(Wire.encodeApproval({ ...approval, approvers: [] })).toContain("\"approvers\":[],")
    expect(
      Wire.encodeApproval({
        ...approval,
        status: "granted",
        approvers: ["alice", "b\"ob"],
        message: "check",
        decidedBy: "alice",
        decidedAtMs: T,
        rationale: "ok"
      })
    ).toBe(
      `{"id":"${EXEC_ID}","step_id":"${STEP_ID}","execution_id":"${EXEC_ID}","status":"granted","approvers":["alice","b\\"ob"],"message":"check","timeout_at":"${T_TEXT}","decided_by":"alice","decided_at":"${T_TEXT}","rationale":"ok","created_at":"1970-01-01T00:00:00Z"}`
    )
  })

  it("event, agent, delta, error, webhook body", () => {
    expect(
      Wire.encodeEvent({
        executionId: EXEC_ID,
        seq: 7,
        type: "step.succeeded",
        payload: "{\"a\":1}",
        occurredAtMs: T
      })
    ).toBe(
      `{"execution_id":"${EXEC_ID}","event_seq":7,"type":"step.succeeded","payload":{"a":1},"occurred_at":"${T_TEXT}"}`
    )
    expect(
      Wire.encodeAgent({
        id: "hello",
        webhookUrl: "http://localhost:5000/webhook?a=1&b=2",
        secret: "hello-secret",
        policyBundle: "default_action: deny\n",
        policy: undefined,
        registeredAtMs: Date.UTC(2026, 7, 18, 19, 40, 54, 100),
        leaseTimeoutMs: undefined
      })
    ).toBe(
      "{\"ID\":\"hello\",\"WebhookURL\":\"http://localhost:5000/webhook?a=1\\u0026b=2\",\"Secret\":\"\",\"PolicyBundle\":\"default_action: deny\\n\",\"RegisteredAt\":\"2026-08-18T19:40:54.1Z\"}"
    )
    expect(Wire.encodeDelta({ stepId: STEP_ID, seq: 2, data: "<b>\u2028" })).toBe(
      `{"step_id":"${STEP_ID}","seq":2,"data":"\\u003cb\\u003e\\u2028"}`
    )
    expect(Wire.encodeError({ code: "forbidden", message: "forbidden: \"bob\" is not an approver for this approval" }))
      .toBe("{\"code\":\"forbidden\",\"message\":\"forbidden: \\\"bob\\\" is not an approver for this approval\"}")
    const claim = {
      dispatchId: "0192f1a0-0000-7000-8000-000000000001",
      executionId: EXEC_ID,
      attempt: 2,
      agent: undefined as never,
      leaseTimeoutSeconds: 120
    }
    expect(Wire.encodeWebhookBody(claim)).toBe(
      `{"execution_id":"${EXEC_ID}","dispatch_id":"0192f1a0-0000-7000-8000-000000000001","dispatch_attempt":2,"lease_timeout_seconds":120}`
    )
    expect(Wire.encodeWebhookBody(claim, { stage: "v0.14.0" })).toBe(
      `{"execution_id":"${EXEC_ID}","dispatch_id":"0192f1a0-0000-7000-8000-000000000001"}`
    )
  })

  it("decision: members omitted when empty, result/error present exactly when stored", () => {
    expect(Wire.encodeDecision({ decision: "proceed", stepId: STEP_ID })).toBe(
      `{"decision":"proceed","step_id":"${STEP_ID}"}`
    )
    expect(Wire.encodeDecision({ decision: "replay", stepId: STEP_ID, resultRaw: "null" })).toBe(
      `{"decision":"replay","step_id":"${STEP_ID}","result":null}`
    )
    expect(Wire.encodeDecision({ decision: "replay", errorRaw: "{\"m\":1}" })).toBe(
      "{\"decision\":\"replay\",\"error\":{\"m\":1}}"
    )
    expect(Wire.encodeDecision({ decision: "blocked", stepId: STEP_ID, approvalId: EXEC_ID })).toBe(
      `{"decision":"blocked","step_id":"${STEP_ID}","approval_id":"${EXEC_ID}"}`
    )
    expect(Wire.encodeDecision({ decision: "denied", stepId: STEP_ID, reason: "a & b" })).toBe(
      `{"decision":"denied","step_id":"${STEP_ID}","reason":"a \\u0026 b"}`
    )
    expect(Wire.encodeDecision({ decision: "rate_limited", reason: "rate_limit_exceeded" })).toBe(
      "{\"decision\":\"rate_limited\",\"reason\":\"rate_limit_exceeded\"}"
    )
    expect(Wire.encodeDecision({ decision: "execution_terminal", reason: "" })).toBe(
      "{\"decision\":\"execution_terminal\"}"
    )
  })

  it("lists: null when empty, with the [] exceptions", () => {
    expect(Wire.encodeEvents([])).toBe("null")
    expect(Wire.encodeSteps([], false)).toBe("null")
    expect(Wire.encodeSteps([], true)).toBe("[]")
    expect(Wire.encodeApprovals([])).toBe("null")
    expect(Wire.encodeAgents([])).toBe("[]")
    expect(Wire.encodeSteps([step, step], true)).toBe("[" + Wire.encodeStep(step) + "," + Wire.encodeStep(step) + "]")
    expect(Wire.encodeList([1, 2], String)).toBe("[1,2]")
    expect(Wire.encodeExecutionList({ executions: [], nextCursor: undefined })).toBe("{\"executions\":null}")
    expect(Wire.encodeExecutionList({ executions: [execution], nextCursor: EXEC_ID })).toBe(
      "{\"executions\":[" + Wire.encodeExecution(execution) + `],"next_cursor":"${EXEC_ID}"}`
    )
  })

  it.effect("every encoding is valid JSON", () =>
    Effect.sync(() => {
      for (
        const text of [
          Wire.encodeExecution(execution),
          Wire.encodeStep(step),
          Wire.encodeApproval(approval),
          Wire.encodeDecision({ decision: "replay", stepId: STEP_ID, resultRaw: "[1]" })
        ]
      ) expect(() => JSON.parse(text)).not.toThrow()
    }))

  describe("current stage (PROTOCOL-CURRENT)", () => {
    const agent: Core.AgentRecord = {
      id: "hello",
      webhookUrl: "http://localhost:5000/webhook?a=1&b=2",
      secret: "hello-secret",
      policyBundle: "",
      policy: undefined,
      registeredAtMs: Date.UTC(2026, 7, 18, 19, 40, 54, 100),
      leaseTimeoutMs: undefined,
      metadata: { description: "d", inputSchemaRaw: "{}", outputSchemaRaw: null }
    }

    it("agent JSON is snake_case, without the secret or the metadata (C.10)", () => {
      expect(Wire.encodeCurrentAgent(agent)).toBe(
        "{\"id\":\"hello\",\"webhook_url\":\"http://localhost:5000/webhook?a=1\\u0026b=2\",\"registered_at\":\"2026-08-18T19:40:54.1Z\"}"
      )
      expect(Wire.encodeCurrentAgent({ ...agent, policyBundle: "default_action: deny\n", leaseTimeoutMs: 12_500 }))
        .toBe(
          "{\"id\":\"hello\",\"webhook_url\":\"http://localhost:5000/webhook?a=1\\u0026b=2\",\"policy_bundle\":\"default_action: deny\\n\",\"registered_at\":\"2026-08-18T19:40:54.1Z\",\"lease_timeout_seconds\":12.5}"
        )
      expect(Wire.encodeCurrentAgents([])).toBe("[]")
    })

    it("API keys: listed without the token, issued with it (C.9.2)", () => {
      const key: Core.ApiKeyRecord = {
        id: EXEC_ID,
        name: "read\"er",
        scopes: ["agents:read", "executions:read"],
        createdAtMs: T,
        revokedAtMs: undefined,
        tokenHash: "0".repeat(64)
      }
      expect(Wire.encodeApiKey(key)).toBe(
        `{"id":"${EXEC_ID}","name":"read\\"er","scopes":["agents:read","executions:read"],"created_at":"${T_TEXT}"}`
      )
      expect(Wire.encodeApiKey({ ...key, revokedAtMs: T + 880 })).toBe(
        `{"id":"${EXEC_ID}","name":"read\\"er","scopes":["agents:read","executions:read"],"created_at":"${T_TEXT}","revoked_at":"2026-08-18T19:40:55Z"}`
      )
      expect(Wire.encodeIssuedApiKey({ key, token: "rbk_x" })).toBe(
        `{"id":"${EXEC_ID}","name":"read\\"er","scopes":["agents:read","executions:read"],"created_at":"${T_TEXT}","token":"rbk_x"}`
      )
      expect(Wire.encodeApiKeys([])).toBe("[]")
    })

    it("the error envelope may carry details (C.10)", () => {
      expect(Wire.encodeError({ code: "validation_error", message: "validation error", details: "{\"field\":\"x\"}" }))
        .toBe("{\"code\":\"validation_error\",\"message\":\"validation error\",\"details\":{\"field\":\"x\"}}")
      expect(Wire.encodeError({ code: "conflict", message: "conflict", details: undefined })).toBe(
        "{\"code\":\"conflict\",\"message\":\"conflict\"}"
      )
    })

    it.effect("the C.14 webhook vector: body and sha256= signature", () =>
      Effect.gen(function*() {
        const { body, secret, signature } = currentVectors.webhook
        const claim = {
          dispatchId: "01920000-0000-7000-8000-000000000001",
          executionId: "018f3a2b-4c5d-7e6f-8a9b-0c1d2e3f4a5b",
          attempt: 3,
          agent: undefined as never,
          leaseTimeoutSeconds: 120
        }
        for (const stage of ["current", "seed"] as const) expect(Wire.encodeWebhookBody(claim, { stage })).toBe(body)
        expect(yield* Signature.sign(secret, body)).toBe(signature)
      }))
  })
})
