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
      `{"execution_id":"${EXEC}","dispatch_id":"${DISPATCH}","lease_timeout_seconds":-3}`,
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
    `{"execution_id":"${EXEC}","dispatch_id":"${DISPATCH}","dispatch_attempt":"1"}`,
    // 14.2 step 2: absent or a positive integer; `null` is neither
    `{"execution_id":"${EXEC}","dispatch_id":"${DISPATCH}","dispatch_attempt":null}`
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
      { decision: "denied", step_id: "", reason: "", approval_id: "", rule_id: "", resources: [] },
      { decision: "denied" }
    ],
    // the current stage's rule id of a denial (PROTOCOL-CURRENT C.8.4)
    [
      { decision: "denied", step_id: STEP, reason: "no email", rule_id: "block-email" },
      { decision: "denied", stepId: STEP, reason: "no email", ruleId: "block-email" }
    ],
    // rate-limit parking: blocked without approval id or step id (C.8.3)
    [
      { decision: "blocked", reason: "rate_limit_exceeded" },
      { decision: "blocked", reason: "rate_limit_exceeded" }
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

describe("the current stage (PROTOCOL-CURRENT)", () => {
  const PARENT = "0192f1a0-0000-7000-8000-0000000000aa"

  it("Execution: session, parent, fork, idempotency key and spawned_by (C.4, C.5, C.7, C.10)", () => {
    const execution = decode(Protocol.Execution, {
      id: EXEC,
      agent_id: "researcher",
      input: { query: "hi" },
      status: "running",
      session: "chat:u42:c7",
      parent_execution_id: PARENT,
      forked_from: PARENT,
      fork_seq: 12,
      idempotency_key: "k-1",
      spawned_by: { execution_id: PARENT, step_id: STEP },
      restoration: { workspace: { checkpoint_ref: "snap-0", covered: true } },
      created_at: "2026-08-18T19:40:54Z",
      updated_at: "2026-08-18T19:40:54Z"
    })
    expect(execution).toMatchObject({
      session: "chat:u42:c7",
      parentExecutionId: PARENT,
      forkedFrom: PARENT,
      forkSeq: 12,
      idempotencyKey: "k-1",
      spawnedBy: { executionId: PARENT, stepId: STEP },
      restoration: { workspace: { checkpoint_ref: "snap-0", covered: true } }
    })
    // no agent_version in the current stage: the seed member decodes as ""
    expect(execution.agentVersion).toBe("")
  })

  it("Execution: the members omitted when empty are absent (null, \"\" and 0 count as empty)", () => {
    for (
      const wire of [
        { id: EXEC, status: "running" },
        {
          id: EXEC,
          status: "running",
          session: "",
          parent_execution_id: null,
          forked_from: "",
          fork_seq: 0,
          idempotency_key: null,
          spawned_by: null
        }
      ]
    ) {
      const execution = decode(Protocol.Execution, wire)
      for (const member of ["session", "parentExecutionId", "forkedFrom", "forkSeq", "idempotencyKey", "spawnedBy"]) {
        expect(member in execution).toBe(false)
      }
    }
  })

  it("Execution: a spawned_by that is not an object is refused", () => {
    expect(Result.isFailure(Schema.decodeUnknownResult(Protocol.Execution)({ id: EXEC, spawned_by: "x" }))).toBe(true)
  })

  it("Agent: snake_case without the secret (C.10), and the Go names of older kernels", () => {
    const current = decode(Protocol.Agent, {
      id: "hello",
      webhook_url: "http://localhost:5000/webhook",
      policy_bundle: "rules: []",
      registered_at: "2026-08-18T19:40:54Z",
      lease_timeout_seconds: 60
    })
    expect({ ...current }).toEqual({
      id: "hello",
      webhookUrl: "http://localhost:5000/webhook",
      policyBundle: "rules: []",
      registeredAt: "2026-08-18T19:40:54Z",
      leaseTimeoutSeconds: 60
    })
    const older = decode(Protocol.Agent, {
      ID: "hello",
      WebhookURL: "http://localhost:5000/webhook",
      Secret: "leaked",
      PolicyBundle: "",
      RegisteredAt: "2026-08-18T19:40:54Z"
    })
    expect(older).toMatchObject({ id: "hello", webhookUrl: "http://localhost:5000/webhook", policyBundle: "" })
    expect(older.leaseTimeoutSeconds).toBeUndefined()
    expect(JSON.stringify(older)).not.toContain("leaked")
    // optional members absent; a list of either spelling decodes
    const list = decode(Protocol.NullableList(Protocol.Agent), [{ id: "a", webhook_url: "http://a" }, { ID: "b" }])
    expect(list.map((a) => [a.id, a.webhookUrl, a.policyBundle])).toEqual([["a", "http://a", ""], ["b", "", ""]])
    // encoding writes the current spelling
    expect(Schema.encodeSync(Protocol.Agent)(current)).toEqual({
      id: "hello",
      webhook_url: "http://localhost:5000/webhook",
      policy_bundle: "rules: []",
      registered_at: "2026-08-18T19:40:54Z",
      lease_timeout_seconds: 60
    })
    expect(Result.isFailure(Schema.decodeUnknownResult(Protocol.Agent)("hello"))).toBe(true)
  })

  it("ErrorEnvelope: details ignored", () => {
    expect(decode(Protocol.ErrorEnvelope, { code: "validation_error", message: "m", details: { field: "x" } })).toEqual({
      code: "validation_error",
      message: "m"
    })
  })

  it("request bodies and answers of the new routes", () => {
    expect(decode(Protocol.CompleteExecutionBody, { output: { answer: 42 }, state: { messages: [] } })).toEqual({
      output: { answer: 42 },
      state: { messages: [] }
    })
    expect(
      decode(Protocol.CreateExecutionBody, {
        agent_id: "researcher",
        input: { query: "hello" },
        session: "chat:u42:c7",
        parent_execution_id: PARENT,
        idempotency_key: "k-1",
        spawned_by: { execution_id: PARENT, step_id: STEP }
      })
    ).toEqual({
      agentId: "researcher",
      input: { query: "hello" },
      session: "chat:u42:c7",
      parentExecutionId: PARENT,
      idempotencyKey: "k-1",
      spawnedBy: { executionId: PARENT, stepId: STEP }
    })
    const metadata = { description: "Answers questions", inputSchema: null, outputSchema: { type: "object" } }
    expect(Schema.encodeSync(Protocol.AgentMetadataBody)(metadata)).toEqual({
      description: "Answers questions",
      input_schema: null,
      output_schema: { type: "object" }
    })
    expect(decode(Protocol.AgentMetadataBody, { description: null, input_schema: null, output_schema: null })).toEqual({
      description: null,
      inputSchema: null,
      outputSchema: null
    })
    expect(decode(Protocol.PreviousState, { state: { n: 1 } })).toEqual({ state: { n: 1 } })
    expect(decode(Protocol.PreviousState, {})).toEqual({ state: null })
    expect(decode(Protocol.SuspendAnswer, { suspended: true })).toEqual({ suspended: true })
    expect(Result.isFailure(Schema.decodeUnknownResult(Protocol.SuspendAnswer)({}))).toBe(true)
  })
})
