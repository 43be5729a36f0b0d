import { describe, expect, it } from "@effect/vitest"
import { Redacted, Result, Schema } from "effect"
import * as Protocol from "../src/Protocol.js"

const EXEC = "0192f1a0-0000-7000-8000-000000000000"
const DISPATCH = "0192f1a0-0000-7000-8000-0000000000d1"
const STEP = "cd3f" + "0".repeat(56) + "5c29"

const decode = <S extends Schema.ConstraintDecoder<unknown>>(schema: S, u: unknown): S["Type"] =>
  Schema.decodeUnknownSync(schema)(u)

describe("WebhookNotice", () => {
  const accepted: ReadonlyArray<readonly [string, Protocol.WebhookNotice]> = [
    [
      `{"execution_id":"${EXEC}","dispatch_id":"${DISPATCH}","dispatch_attempt":1,"lease_timeout_seconds":120}`,
      { executionId: EXEC, dispatchId: DISPATCH, dispatchAttempt: 1, leaseTimeoutSeconds: 120 }
    ],
    // v0.14.0 kernel: no attempt, no lease timeout
    [
      `{"execution_id":"${EXEC}","dispatch_id":"${DISPATCH}"}`,
      { executionId: EXEC, dispatchId: DISPATCH, dispatchAttempt: undefined, leaseTimeoutSeconds: undefined }
    ],
    // member order, whitespace and unknown members do not matter
    [
      ` { "lease_timeout_seconds" : 2.5, "extra": [1], "dispatch_attempt": 7, "dispatch_id":"${DISPATCH}", "execution_id":"${EXEC}" } `,
      { executionId: EXEC, dispatchId: DISPATCH, dispatchAttempt: 7, leaseTimeoutSeconds: 2.5 }
    ],
    // non-positive or non-number lease timeouts count as absent
    [
      `{"execution_id":"${EXEC}","dispatch_id":"${DISPATCH}","lease_timeout_seconds":0}`,
      { executionId: EXEC, dispatchId: DISPATCH, dispatchAttempt: undefined, leaseTimeoutSeconds: undefined }
    ],
    [
      `{"execution_id":"${EXEC}","dispatch_id":"${DISPATCH}","lease_timeout_seconds":"120"}`,
      { executionId: EXEC, dispatchId: DISPATCH, dispatchAttempt: undefined, leaseTimeoutSeconds: undefined }
    ],
    [
      `{"execution_id":"${EXEC}","dispatch_id":"${DISPATCH}","dispatch_attempt":null,"lease_timeout_seconds":-3}`,
      { executionId: EXEC, dispatchId: DISPATCH, dispatchAttempt: undefined, leaseTimeoutSeconds: undefined }
    ]
  ]

  const rejected: ReadonlyArray<string> = [
    "",
    "not json",
    "null",
    "[]",
    "\"x\"",
    `{"dispatch_id":"${DISPATCH}"}`,
    `{"execution_id":"","dispatch_id":"${DISPATCH}"}`,
    `{"execution_id":"${EXEC}","dispatch_id":""}`,
    `{"execution_id":1,"dispatch_id":"${DISPATCH}"}`,
    `{"execution_id":"${EXEC}","dispatch_id":"${DISPATCH}","dispatch_attempt":0}`,
    `{"execution_id":"${EXEC}","dispatch_id":"${DISPATCH}","dispatch_attempt":-1}`,
    `{"execution_id":"${EXEC}","dispatch_id":"${DISPATCH}","dispatch_attempt":1.5}`,
    `{"execution_id":"${EXEC}","dispatch_id":"${DISPATCH}","dispatch_attempt":"1"}`
  ]

  it.each(accepted)("accepts %s", (text, expected) => {
    expect(Protocol.decodeWebhookNotice(text)).toEqual(expected)
    expect(decode(Protocol.WebhookNotice, JSON.parse(text))).toEqual(expected)
  })

  it.each(rejected)("rejects %j", (text) => {
    expect(Protocol.decodeWebhookNotice(text)).toBeUndefined()
    let parsed: unknown
    try {
      parsed = JSON.parse(text)
    } catch {
      return
    }
    expect(Result.isFailure(Schema.decodeUnknownResult(Protocol.WebhookNotice)(parsed))).toBe(true)
  })
})

describe("StepDecision", () => {
  const cases: ReadonlyArray<readonly [unknown, Protocol.StepDecision]> = [
    [{ decision: "proceed", step_id: STEP }, { decision: "proceed", stepId: STEP }],
    [
      { decision: "replay", step_id: STEP, result: { hits: 3 } },
      { decision: "replay", stepId: STEP, result: { hits: 3 } }
    ],
    [{ decision: "replay", step_id: STEP, result: null }, { decision: "replay", stepId: STEP, result: null }],
    [{ decision: "replay", error: { message: "x" } }, { decision: "replay", error: { message: "x" } }],
    [{ decision: "replay", step_id: STEP }, { decision: "replay", stepId: STEP }],
    [
      { decision: "denied", step_id: STEP, reason: "policy_denied" },
      { decision: "denied", stepId: STEP, reason: "policy_denied" }
    ],
    [
      { decision: "blocked", step_id: STEP, approval_id: EXEC },
      { decision: "blocked", stepId: STEP, approvalId: EXEC }
    ],
    [
      { decision: "rate_limited", reason: "rate_limit_exceeded" },
      { decision: "rate_limited", reason: "rate_limit_exceeded" }
    ],
    [{ decision: "execution_terminal" }, { decision: "execution_terminal" }],
    [{ decision: "recorded" }, { decision: "recorded" }],
    // unknown members of newer kernels are ignored; empty strings count as absent
    [
      { decision: "denied", step_id: "", reason: "", approval_id: "", rule_id: "r", resources: [] },
      { decision: "denied" }
    ],
    [{ decision: "something_new" }, { decision: "something_new" }]
  ]

  it.each(cases)("decodes %j", (wire, expected) => {
    const fast = Protocol.decodeStepDecision(wire)
    expect(fast).toEqual(expected)
    expect(decode(Protocol.StepDecision, wire)).toEqual(expected)
    // `result` / `error` present exactly when sent
    expect(fast !== undefined && "result" in fast).toBe("result" in (wire as object))
    expect(fast !== undefined && "error" in fast).toBe("error" in (wire as object))
  })

  it.each([null, [], "proceed", 1, {}, { decision: 1 }, { decision: null }])("rejects %j", (wire) => {
    expect(Protocol.decodeStepDecision(wire)).toBeUndefined()
    expect(Result.isFailure(Schema.decodeUnknownResult(Protocol.StepDecision)(wire))).toBe(true)
  })
})

describe("Execution", () => {
  it("maps snake_case, defaults missing / null strings to \"\" and keeps JSON payloads", () => {
    const execution = decode(Protocol.Execution, {
      id: EXEC,
      agent_id: "hello",
      input: { query: "<hi>", n: [1, 2] },
      status: "completed",
      output: null,
      failure_reason: null,
      created_at: "2026-08-18T19:40:54.1Z",
      updated_at: "2026-08-18T19:40:54.123456789Z",
      future_member: { x: 1 }
    })
    // A plain object now (Protocol's wire objects are Structs, not classes).
    expect(Object.getPrototypeOf(execution)).toBe(Object.prototype)
    expect({ ...execution }).toEqual({
      id: EXEC,
      agentId: "hello",
      agentVersion: "",
      input: { query: "<hi>", n: [1, 2] },
      status: "completed",
      output: null,
      failureReason: "",
      createdAt: "2026-08-18T19:40:54.1Z",
      updatedAt: "2026-08-18T19:40:54.123456789Z",
      deadlineAt: ""
    })
    expect(Protocol.isTerminalStatus(execution.status)).toBe(true)
  })

  it("has no output member when none was recorded, and input null when absent", () => {
    const execution = decode(Protocol.Execution, { id: EXEC, status: "running" })
    expect("output" in execution).toBe(false)
    expect(execution.input).toBeNull()
    expect(execution.agentId).toBe("")
  })

  it("rejects a wrongly typed member", () => {
    expect(Result.isFailure(Schema.decodeUnknownResult(Protocol.Execution)({ id: 1, status: "running" }))).toBe(true)
  })
})

describe("Step, Event, Approval, Agent", () => {
  it("Step", () => {
    const step = decode(Protocol.Step, {
      step_id: STEP,
      execution_id: EXEC,
      kind: "tool_call",
      target: "web_search",
      args_hash: "a".repeat(64),
      occurrence: 2,
      status: "failed",
      idempotency: "safe_to_retry",
      args: null,
      error: { reason: "approval_denied" },
      started_at: "2026-08-18T19:40:54Z"
    })
    expect({ ...step }).toEqual({
      stepId: STEP,
      executionId: EXEC,
      kind: "tool_call",
      target: "web_search",
      argsHash: "a".repeat(64),
      occurrence: 2,
      status: "failed",
      idempotency: "safe_to_retry",
      args: null,
      error: { reason: "approval_denied" },
      startedAt: "2026-08-18T19:40:54Z",
      completedAt: ""
    })
    expect("result" in step).toBe(false)
    expect(decode(Protocol.Step, { step_id: STEP }).occurrence).toBe(0)
    expect(Protocol.isTerminalStepStatus("failed")).toBe(true)
    expect(Protocol.isTerminalStepStatus("executing")).toBe(false)
  })

  it("Event", () => {
    const event = decode(Protocol.Event, {
      execution_id: EXEC,
      event_seq: 7,
      type: "step.succeeded",
      payload: { step_id: STEP, result: [1] },
      occurred_at: "2026-08-18T19:40:54.12Z"
    })
    expect({ ...event }).toEqual({
      executionId: EXEC,
      eventSeq: 7,
      type: "step.succeeded",
      payload: { step_id: STEP, result: [1] },
      occurredAt: "2026-08-18T19:40:54.12Z"
    })
  })

  it("Approval: null approvers decode as []", () => {
    const approval = decode(Protocol.Approval, {
      id: EXEC,
      step_id: STEP,
      execution_id: EXEC,
      status: "pending",
      approvers: null,
      timeout_at: "2026-08-18T19:55:54Z",
      created_at: "2026-08-18T19:40:54Z"
    })
    expect(approval.approvers).toEqual([])
    expect(approval.message).toBe("")
    expect(approval.decidedBy).toBe("")
    expect(decode(Protocol.Approval, { id: EXEC, approvers: ["alice", "bob"] }).approvers).toEqual(["alice", "bob"])
  })

  it("Agent: Go field names on the wire; the Secret member is never decoded", () => {
    const agent = decode(Protocol.Agent, {
      ID: "hello",
      WebhookURL: "http://localhost:5000/webhook",
      Secret: "leaked-secret",
      PolicyBundle: "",
      RegisteredAt: "2026-08-18T19:40:54.1Z"
    })
    expect({ ...agent }).toEqual({
      id: "hello",
      webhookUrl: "http://localhost:5000/webhook",
      policyBundle: "",
      registeredAt: "2026-08-18T19:40:54.1Z"
    })
    expect(JSON.stringify(agent)).not.toContain("leaked-secret")
    expect(String(agent)).not.toContain("leaked-secret")
  })
})

describe("lists, pages, deltas, envelopes", () => {
  it("NullableList: null and [] both decode as []", () => {
    const events = Protocol.NullableList(Protocol.Event)
    expect(decode(events, null)).toEqual([])
    expect(decode(events, [])).toEqual([])
    expect(decode(events, [{ event_seq: 1, type: "execution.created" }]).map((e) => e.eventSeq)).toEqual([1])
  })

  it("ExecutionPage: null executions, optional next_cursor", () => {
    expect(decode(Protocol.ExecutionPage, { executions: null })).toEqual({ executions: [], nextCursor: undefined })
    const page = decode(Protocol.ExecutionPage, {
      executions: [{ id: EXEC, status: "running" }],
      next_cursor: EXEC
    })
    expect(page.executions.map((e) => e.id)).toEqual([EXEC])
    expect(page.nextCursor).toBe(EXEC)
    expect(decode(Protocol.ExecutionPage, {})).toEqual({ executions: [], nextCursor: undefined })
  })

  it("LiveDelta", () => {
    expect(decode(Protocol.LiveDelta, { step_id: STEP, seq: 3, data: "he\u003cllo" })).toEqual({
      stepId: STEP,
      seq: 3,
      data: "he<llo"
    })
  })

  it("ErrorEnvelope: unknown members ignored, rule_id kept when present", () => {
    expect(decode(Protocol.ErrorEnvelope, { code: "not_found", message: "not found", details: "x" })).toEqual({
      code: "not_found",
      message: "not found"
    })
    expect(decode(Protocol.ErrorEnvelope, { code: "policy_denied", message: "no", rule_id: "r1" })).toEqual({
      code: "policy_denied",
      message: "no",
      ruleId: "r1"
    })
  })
})

describe("request bodies", () => {
  it("decode what the SDK sends", () => {
    expect(
      decode(Protocol.SubmitStepBody, {
        kind: "tool_call",
        target: "web_search",
        args: { query: "hello" },
        idempotency: "safe_to_retry"
      })
    ).toEqual({ kind: "tool_call", target: "web_search", args: { query: "hello" }, idempotency: "safe_to_retry" })
    expect(decode(Protocol.CompleteStepBody, {})).toEqual({})
    expect(decode(Protocol.CompleteStepBody, { result: null })).toEqual({ result: null })
    expect(decode(Protocol.FailStepBody, { error: { message: "x" } })).toEqual({ error: { message: "x" } })
    expect(decode(Protocol.StreamDeltaBody, { seq: 1, data: "d" })).toEqual({ seq: 1, data: "d" })
    expect(decode(Protocol.CompleteExecutionBody, { output: [1] })).toEqual({ output: [1] })
    expect(decode(Protocol.FailExecutionBody, { error: "boom" })).toEqual({ error: "boom" })
    expect(decode(Protocol.CreateExecutionBody, { agent_id: "hello", input: null })).toEqual({
      agentId: "hello",
      input: null
    })
    expect(decode(Protocol.ApprovalDecisionBody, { decided_by: "alice" })).toEqual({ decidedBy: "alice" })
    expect(decode(Protocol.LoadPolicyBody, { bundle: "rules: []" })).toEqual({ bundle: "rules: []" })
  })

  it("RegisterAgentBody keeps the secret redacted", () => {
    const body = decode(Protocol.RegisterAgentBody, { id: "a", webhook_url: "http://x", secret: "s3cret" })
    expect(Redacted.value(body.secret)).toBe("s3cret")
    expect(String(body.secret)).not.toContain("s3cret")
    expect(Schema.encodeSync(Protocol.RegisterAgentBody)(body)).toEqual({
      id: "a",
      webhook_url: "http://x",
      secret: "s3cret"
    })
  })
})
