/**
 * Subagents and suspend in the current stage (PROTOCOL-CURRENT C.5), on the
 * wire through the kernel's routes: a child bound to an executing step of its
 * parent and the checks of C.5.1 in order, `POST …/suspend` (C.5.2), the
 * parent's step settled by the child's end and the parent resumed only when
 * nothing waits (C.5.3, also for approvals), and children cancelled with their
 * parent, down the tree.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import {
  allIds,
  APPROVE_SEND_EMAIL,
  claim,
  create,
  endExecution,
  errorBody,
  eventsFrom,
  EXECUTION_TERMINAL,
  FORBIDDEN,
  type Harness,
  harness,
  type Lease,
  LEASE_SUPERSEDED,
  NOT_FOUND,
  seqOf,
  submitSendEmail,
  UNKNOWN_ID,
  VALIDATION
} from "../support/currentRoutes.js"
import { expectVectorLeaseSuperseded, v1Vector } from "../support/currentVectors.js"

const SUSPENDED = "{\"suspended\":true}\n"
const NOT_SUSPENDED = "{\"suspended\":false}\n"

/** A running execution of `agentId`, claimed: its id and lease headers. */
const started = (h: Harness, agentId = "hello", extra: Record<string, unknown> = {}) =>
  Effect.gen(function*() {
    const res = yield* create(h, { agent_id: agentId, ...extra })
    expect(res.status).toBe(201)
    const id = JSON.parse(res.body).id as string
    return { id, lease: yield* claim(h, id) }
  })

/** Submits a tool step (allowed: no policy) and answers its id. */
const toolStep = (h: Harness, id: string, lease: Lease, target = "delegate", agentId = "hello") =>
  Effect.gen(function*() {
    const res = yield* h.agent(
      agentId,
      "POST",
      `/v0/executions/${id}/steps`,
      JSON.stringify({ kind: "tool_call", target, args: { task: target }, idempotency: "safe_to_retry" }),
      lease
    )
    const decision = JSON.parse(res.body)
    expect(decision.decision).toBe("proceed")
    return decision.step_id as string
  })

/** Creates the child of a step; answers the parsed execution. */
const spawn = (h: Harness, parent: string, stepId: string, extra: Record<string, unknown> = {}, agentId = "other") =>
  Effect.gen(function*() {
    const res = yield* create(h, {
      agent_id: agentId,
      input: { task: "sub" },
      spawned_by: { execution_id: parent, step_id: stepId },
      ...extra
    })
    expect(res.status).toBe(201)
    return JSON.parse(res.body) as Record<string, unknown> & { readonly id: string }
  })

/** A running parent with a tool step `delegate` and the child running for it. */
const parentWithChild = (h: Harness) =>
  Effect.gen(function*() {
    const parent = yield* started(h)
    const stepId = yield* toolStep(h, parent.id, parent.lease)
    const child = yield* spawn(h, parent.id, stepId)
    return { parent, stepId, child }
  })

const suspend = (h: Harness, id: string, lease: Lease, agentId = "hello") =>
  h.agent(agentId, "POST", `/v0/executions/${id}/suspend`, "", lease)

const finish = (h: Harness, id: string, body: string, agentId = "other") =>
  endExecution(h, id, "complete", body, agentId)

const failRun = (h: Harness, id: string, reason: string, agentId = "other") =>
  endExecution(h, id, "fail", JSON.stringify({ error: reason }), agentId)

const status = (h: Harness, id: string) =>
  Effect.map(h.send("GET", `/v0/executions/${id}`), (res) => JSON.parse(res.body).status as string)

describe("Subagents (PROTOCOL-CURRENT C.5)", () => {
  describe("creating a child (C.5.1)", () => {
    it.effect("a child is bound to an executing step: spawned_by in its events and JSON, the key is the step id", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const parent = yield* started(h)
        const stepId = yield* toolStep(h, parent.id, parent.lease)
        const parentSeq = yield* seqOf(h, parent.id)
        const res = yield* create(h, {
          agent_id: "other",
          input: { task: "sub" },
          spawned_by: { execution_id: parent.id, step_id: stepId }
        })
        expect(res.status).toBe(201)
        const child = JSON.parse(res.body).id as string
        expect(res.body).toBe(
          `{"id":"${child}","agent_id":"other","input":{"task":"sub"},"status":"running",` +
            `"idempotency_key":"${stepId}","spawned_by":{"execution_id":"${parent.id}","step_id":"${stepId}"},` +
            `"created_at":"1970-01-01T00:00:00Z","updated_at":"1970-01-01T00:00:00Z"}\n`
        )
        const log = yield* h.core.eventLog(child)
        expect(log.map((e) => e.type)).toEqual(["execution.created", "execution.started", "dispatch.queued"])
        expect(log[0]!.payload).toBe(
          `{"execution_id":"${child}","spawned_by":{"execution_id":"${parent.id}","step_id":"${stepId}"},"status":"pending"}`
        )
        // the parent keeps running and nothing is written to it
        expect(yield* status(h, parent.id)).toBe("running")
        expect(yield* seqOf(h, parent.id)).toBe(parentSeq)
      }))

    it.effect("one step starts one child: a repeated create answers it, even once the step has settled", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const parent = yield* started(h)
        const stepId = yield* toolStep(h, parent.id, parent.lease)
        const first = yield* spawn(h, parent.id, stepId)
        const again = yield* spawn(h, parent.id, stepId, { input: { other: 1 } })
        expect(again).toEqual(first)
        yield* finish(h, first.id, "{\"output\":\"sub done\"}")
        const later = yield* spawn(h, parent.id, stepId)
        expect(later).toMatchObject({ id: first.id, status: "completed", output: "sub done" })
        // an explicit key is the key: a second child of the same step
        const second = yield* create(h, {
          agent_id: "other",
          idempotency_key: "k",
          spawned_by: { execution_id: parent.id, step_id: stepId }
        })
        expect(second).toMatchObject({
          status: 409,
          body: errorBody("conflict", "conflict: the parent step is in status succeeded")
        })
      }))

    it.effect("the checks in order: parent, terminal, session, step, step status — nothing created", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const parent = yield* started(h, "hello", { session: "p" })
        const stepId = yield* toolStep(h, parent.id, parent.lease)
        const other = yield* started(h)
        const otherStep = yield* toolStep(h, other.id, other.lease, "elsewhere")
        const before = yield* allIds(h)
        const attempt = (spawnedBy: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
          create(h, { agent_id: "other", spawned_by: spawnedBy, ...extra })
        expect(yield* attempt({ execution_id: UNKNOWN_ID, step_id: stepId })).toMatchObject({
          status: 404,
          body: NOT_FOUND
        })
        expect(yield* attempt({ execution_id: parent.id, step_id: stepId }, { session: "p" })).toMatchObject({
          status: 400,
          body: errorBody("validation_error", "validation error: a subagent cannot join its parent's session")
        })
        const noStep = errorBody("validation_error", "validation error: spawned_by names no step of the parent execution")
        expect(yield* attempt({ execution_id: parent.id, step_id: "f".repeat(64) })).toMatchObject({
          status: 400,
          body: noStep
        })
        expect(yield* attempt({ execution_id: parent.id, step_id: otherStep })).toMatchObject({ status: 400, body: noStep })
        expect(yield* attempt({ execution_id: parent.id })).toMatchObject({ status: 400, body: noStep })
        // a settled step
        const settled = yield* toolStep(h, parent.id, parent.lease, "settled")
        yield* h.agent("hello", "POST", `/v0/executions/${parent.id}/steps/${settled}/fail`, "{\"error\":{}}", parent.lease)
        expect(yield* attempt({ execution_id: parent.id, step_id: settled })).toMatchObject({
          status: 409,
          body: errorBody("conflict", "conflict: the parent step is in status failed")
        })
        expect(yield* allIds(h)).toEqual(before)
        // a terminal parent wins over a bad step and a bad session
        yield* finish(h, parent.id, "{\"output\":1}", "hello")
        expect(yield* attempt({ execution_id: parent.id, step_id: "nope" }, { session: "p" })).toMatchObject({
          status: 409,
          body: errorBody("conflict", "conflict: the parent execution is terminal")
        })
        expect(yield* allIds(h)).toEqual(before)
        // a child with its own session is fine
        const child = yield* spawn(h, other.id, otherStep, { session: "child-session" })
        expect(child).toMatchObject({ status: "running", session: "child-session", idempotency_key: otherStep })
        // with the idempotency key a settled step still answers the existing child (C.5.1: lookup first)
        expect(yield* attempt({ execution_id: UNKNOWN_ID, step_id: otherStep })).toMatchObject({ status: 201 })
        expect(yield* attempt({ execution_id: "not-a-uuid", step_id: otherStep })).toMatchObject({
          status: 400,
          body: VALIDATION
        })
      }))
  })

  describe("suspend (C.5.2)", () => {
    it.effect("waiting on a child: execution.blocked awaiting_steps, dispatch retired, {\"suspended\":true}", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { parent } = yield* parentWithChild(h)
        const seq = yield* seqOf(h, parent.id)
        const res = yield* suspend(h, parent.id, parent.lease)
        expect(res).toEqual({ status: 200, headers: { "content-type": "application/json; charset=utf-8" }, body: SUSPENDED })
        expect(yield* eventsFrom(h, parent.id, seq)).toEqual([
          ["execution.blocked", { execution_id: parent.id, reason: "awaiting_steps", status: "blocked" }]
        ])
        expect((yield* h.core.eventLog(parent.id))[seq]!.payload).toBe(
          `{"execution_id":"${parent.id}","reason":"awaiting_steps","status":"blocked"}`
        )
        expect(yield* status(h, parent.id)).toBe("blocked")
        expect((yield* h.core.dispatches(parent.id)).map((d) => d.status)).toEqual(["exhausted"])
        // the lease is gone with the dispatch
        expect(yield* suspend(h, parent.id, parent.lease)).toMatchObject({ status: 409, body: LEASE_SUPERSEDED })
      }))

    it.effect("nothing to wait for: {\"suspended\":false} and nothing written", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const parent = yield* started(h)
        yield* toolStep(h, parent.id, parent.lease)
        const seq = yield* seqOf(h, parent.id)
        expect(yield* suspend(h, parent.id, parent.lease)).toMatchObject({ status: 200, body: NOT_SUSPENDED })
        expect(yield* seqOf(h, parent.id)).toBe(seq)
        expect(yield* status(h, parent.id)).toBe("running")
        // a child that already settled its step does not count
        const stepId = yield* toolStep(h, parent.id, parent.lease, "quick")
        const child = yield* spawn(h, parent.id, stepId)
        yield* finish(h, child.id, "{\"output\":7}")
        const after = yield* seqOf(h, parent.id)
        expect(yield* suspend(h, parent.id, parent.lease)).toMatchObject({ status: 200, body: NOT_SUSPENDED })
        expect(yield* seqOf(h, parent.id)).toBe(after)
        // the SDK then reads the settled step
        const step = yield* h.agent("hello", "GET", `/v0/executions/${parent.id}/steps/${stepId}`)
        expect(JSON.parse(step.body)).toMatchObject({ step_id: stepId, status: "succeeded", result: 7 })
      }))

    it.effect("check order: id, lease headers, 404, 403, terminal, stale lease", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { parent } = yield* parentWithChild(h)
        const seq = yield* seqOf(h, parent.id)
        expect(yield* suspend(h, "not-a-uuid", {})).toMatchObject({ status: 400, body: VALIDATION })
        expect(yield* suspend(h, parent.id, {})).toMatchObject({
          status: 400,
          body: errorBody("validation_error", "validation error: bad or missing Rebuno-Dispatch-Id")
        })
        expect(yield* suspend(h, parent.id, { "Rebuno-Dispatch-Id": parent.lease["Rebuno-Dispatch-Id"]! })).toMatchObject({
          status: 400,
          body: errorBody("validation_error", "validation error: bad or missing Rebuno-Dispatch-Attempt")
        })
        expect(yield* suspend(h, UNKNOWN_ID, parent.lease)).toMatchObject({ status: 404, body: NOT_FOUND })
        expect(yield* suspend(h, parent.id, parent.lease, "other")).toMatchObject({ status: 403, body: FORBIDDEN })
        const stale = { ...parent.lease, "Rebuno-Dispatch-Attempt": "2" }
        expect(yield* suspend(h, parent.id, stale)).toMatchObject({ status: 409, body: LEASE_SUPERSEDED })
        expect(yield* h.send("POST", `/v0/executions/${parent.id}/suspend`)).toMatchObject({ status: 401 })
        expect(yield* seqOf(h, parent.id)).toBe(seq)
        expect(yield* status(h, parent.id)).toBe("running")
        const done = yield* started(h)
        yield* finish(h, done.id, "{}", "hello")
        expect(yield* suspend(h, done.id, done.lease)).toMatchObject({ status: 409, body: EXECUTION_TERMINAL })
      }))

    it.effect("the suspend lease renews the lease", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const parent = yield* started(h)
        yield* TestClock.adjust("100 seconds")
        expect(yield* suspend(h, parent.id, parent.lease)).toMatchObject({ status: 200, body: NOT_SUSPENDED })
        yield* TestClock.adjust("100 seconds")
        expect(yield* h.core.reclaimStale()).toBe(0)
        yield* TestClock.adjust("21 seconds")
        expect(yield* h.core.reclaimStale()).toBe(1)
      }))

    it.effect("the C.14 suspend vector passes the signature check", () =>
      Effect.gen(function*() {
        // signed correctly, but not this kernel's dispatch
        yield* expectVectorLeaseSuperseded(v1Vector("suspend"))
      }))
  })

  describe("settling the parent's step (C.5.3)", () => {
    it.effect("child completed: step succeeded with its output, the parent resumes and replays it", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { parent, stepId, child } = yield* parentWithChild(h)
        yield* suspend(h, parent.id, parent.lease)
        const seq = yield* seqOf(h, parent.id)
        yield* TestClock.adjust("5 seconds")
        yield* finish(h, child.id, "{\"output\":{\"answer\":42}}")
        const [dispatch] = (yield* h.core.dispatches(parent.id)).slice(-1)
        expect(yield* eventsFrom(h, parent.id, seq)).toEqual([
          ["step.succeeded", { step_id: stepId, step_type: "tool_call", target: "delegate" }],
          ["execution.resumed", { execution_id: parent.id, status: "running" }],
          ["dispatch.queued", { attempt: 0, dispatch_id: dispatch!.id, execution_id: parent.id, status: "pending" }]
        ])
        const step = JSON.parse((yield* h.send("GET", `/v0/executions/${parent.id}/steps/${stepId}`)).body)
        expect(step).toMatchObject({ status: "succeeded", result: { answer: 42 }, completed_at: "1970-01-01T00:00:05Z" })
        // the rerun replays the child's outcome; the SDK's late complete is a harmless replay
        const lease = yield* claim(h, parent.id)
        const replay = yield* h.agent(
          "hello",
          "POST",
          `/v0/executions/${parent.id}/steps`,
          JSON.stringify({ kind: "tool_call", target: "delegate", args: { task: "delegate" }, idempotency: "safe_to_retry" }),
          lease
        )
        expect(replay.body).toBe(`{"decision":"replay","step_id":"${stepId}","result":{"answer":42}}\n`)
        const late = yield* h.agent(
          "hello",
          "POST",
          `/v0/executions/${parent.id}/steps/${stepId}/complete`,
          "{\"result\":\"mine\"}",
          lease
        )
        expect(late).toMatchObject({ status: 200, body: "{\"decision\":\"replay\",\"result\":{\"answer\":42}}\n" })
      }))

    it.effect("child without output: the step's result is null", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { parent, stepId, child } = yield* parentWithChild(h)
        yield* finish(h, child.id, "{}")
        const step = JSON.parse((yield* h.send("GET", `/v0/executions/${parent.id}/steps/${stepId}`)).body)
        expect(step).toMatchObject({ status: "succeeded", result: null })
        // not suspended: settled, but no resume
        expect((yield* h.core.eventLog(parent.id)).map((e) => e.type).slice(-2)).toEqual([
          "step.executing",
          "step.succeeded"
        ])
      }))

    it.effect("child failed or cancelled: step failed with subagent_failed / subagent_cancelled", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const parent = yield* started(h)
        const failing = yield* toolStep(h, parent.id, parent.lease, "a")
        const cancelling = yield* toolStep(h, parent.id, parent.lease, "b")
        const childA = yield* spawn(h, parent.id, failing)
        const childB = yield* spawn(h, parent.id, cancelling)
        expect(yield* suspend(h, parent.id, parent.lease)).toMatchObject({ body: SUSPENDED })
        const seq = yield* seqOf(h, parent.id)
        yield* failRun(h, childA.id, "tool_error: boom")
        const errorA = { execution_id: childA.id, failure_reason: "tool_error: boom", reason: "subagent_failed" }
        // the other child still runs: no resume yet
        expect(yield* eventsFrom(h, parent.id, seq)).toEqual([
          ["step.failed", { error: errorA, step_id: failing, step_type: "tool_call", target: "a" }]
        ])
        expect(yield* status(h, parent.id)).toBe("blocked")
        expect((yield* h.send("POST", `/v0/executions/${childB.id}/cancel`)).status).toBe(204)
        const errorB = { execution_id: childB.id, failure_reason: "client_cancelled", reason: "subagent_cancelled" }
        expect(yield* eventsFrom(h, parent.id, seq + 1)).toMatchObject([
          ["step.failed", { error: errorB, step_id: cancelling, step_type: "tool_call", target: "b" }],
          ["execution.resumed", { execution_id: parent.id, status: "running" }],
          ["dispatch.queued", {}]
        ])
        expect((yield* h.core.eventLog(parent.id))[seq]!.payload).toBe(
          `{"error":{"execution_id":"${childA.id}","failure_reason":"tool_error: boom","reason":"subagent_failed"},` +
            `"step_id":"${failing}","step_type":"tool_call","target":"a"}`
        )
        const lease = yield* claim(h, parent.id)
        const replay = yield* h.agent(
          "hello",
          "POST",
          `/v0/executions/${parent.id}/steps`,
          JSON.stringify({ kind: "tool_call", target: "a", args: { task: "a" }, idempotency: "safe_to_retry" }),
          lease
        )
        expect(JSON.parse(replay.body)).toEqual({ decision: "replay", step_id: failing, error: errorA })
      }))

    it.effect("a step the parent settled itself stays as it is when the child ends", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { parent, stepId, child } = yield* parentWithChild(h)
        yield* h.agent("hello", "POST", `/v0/executions/${parent.id}/steps/${stepId}/complete`, "{\"result\":\"own\"}", parent.lease)
        const seq = yield* seqOf(h, parent.id)
        yield* finish(h, child.id, "{\"output\":\"child\"}")
        expect(yield* seqOf(h, parent.id)).toBe(seq)
        const step = JSON.parse((yield* h.send("GET", `/v0/executions/${parent.id}/steps/${stepId}`)).body)
        expect(step).toMatchObject({ status: "succeeded", result: "own" })
      }))

    it.effect("an approval decided while a child runs does not resume the parent; the child's end does", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        yield* h.core.loadPolicy("hello", APPROVE_SEND_EMAIL)
        const { parent, child } = yield* parentWithChild(h)
        const gated = yield* submitSendEmail(h, parent.id, parent.lease)
        const approvalId = JSON.parse(gated.body).approval_id as string
        expect(yield* status(h, parent.id)).toBe("blocked")
        const seq = yield* seqOf(h, parent.id)
        expect((yield* h.send("POST", `/v0/approvals/${approvalId}/grant`, { body: "{\"decided_by\":\"alice\"}" })).status)
          .toBe(204)
        expect((yield* eventsFrom(h, parent.id, seq)).map(([type]) => type)).toEqual(["approval.granted", "step.allowed"])
        expect(yield* status(h, parent.id)).toBe("blocked")
        yield* finish(h, child.id, "{\"output\":1}")
        expect((yield* eventsFrom(h, parent.id, seq + 2)).map(([type]) => type)).toEqual([
          "step.succeeded",
          "execution.resumed",
          "dispatch.queued"
        ])
      }))

    it.effect("an approval expiring while a child runs does not resume the parent either", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        yield* h.core.loadPolicy(
          "hello",
          "default_action: allow\nrules:\n  - id: gate\n    when: { target: send_email }\n    then:\n      decision: require_approval\n      approval_config: { timeout: 1m }\n"
        )
        const { parent, child } = yield* parentWithChild(h)
        yield* submitSendEmail(h, parent.id, parent.lease)
        const seq = yield* seqOf(h, parent.id)
        yield* TestClock.adjust("1 minute")
        expect(yield* h.core.expireApprovals()).toBe(1)
        expect((yield* eventsFrom(h, parent.id, seq)).map(([type]) => type)).toEqual(["approval.expired", "step.denied"])
        expect(yield* status(h, parent.id)).toBe("blocked")
        yield* h.send("POST", `/v0/executions/${child.id}/cancel`)
        expect((yield* eventsFrom(h, parent.id, seq + 2)).map(([type]) => type)).toEqual([
          "step.failed",
          "execution.resumed",
          "dispatch.queued"
        ])
      }))
  })

  describe("a parent's end (C.5.3)", () => {
    it.effect("its children are cancelled with parent_agent_terminal, down the tree", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { parent, child } = yield* parentWithChild(h)
        const childLease = yield* claim(h, child.id)
        const childStep = yield* toolStep(h, child.id, childLease, "deeper", "other")
        const grandchild = yield* spawn(h, child.id, childStep, {}, "hello")
        const sibling = yield* toolStep(h, parent.id, parent.lease, "quick")
        const done = yield* spawn(h, parent.id, sibling)
        yield* finish(h, done.id, "{\"output\":1}")
        const doneSeq = yield* seqOf(h, done.id)
        yield* TestClock.adjust("2 seconds")
        yield* finish(h, parent.id, "{\"output\":\"parent done\"}", "hello")
        for (const id of [child.id, grandchild.id]) {
          const res = JSON.parse((yield* h.send("GET", `/v0/executions/${id}`)).body)
          expect(res).toMatchObject({ status: "cancelled", failure_reason: "parent_agent_terminal" })
          const log = yield* h.core.eventLog(id)
          expect(log.map((e) => e.type)).toContain("execution.cancelled")
        }
        expect((yield* eventsFrom(h, child.id, 0)).filter(([t]) => t.startsWith("execution.") || t === "step.cancelled"))
          .toEqual([
            ["execution.created", expect.anything()],
            ["execution.started", expect.anything()],
            ["execution.cancelled", { execution_id: child.id, reason: "parent_agent_terminal", status: "cancelled" }],
            [
              "step.cancelled",
              { error: { reason: "execution_cancelled" }, step_id: childStep, step_type: "tool_call", target: "deeper" }
            ]
          ])
        // the finished child is left alone, and the terminal parent records nothing more
        expect(yield* seqOf(h, done.id)).toBe(doneSeq)
        expect((yield* h.core.eventLog(parent.id)).at(-1)!.type).toBe("execution.completed")
      }))

    it.effect("a client cancel of the parent cancels a child waiting pending in its own session", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const busy = yield* started(h, "other", { session: "s" })
        const parent = yield* started(h)
        const stepId = yield* toolStep(h, parent.id, parent.lease)
        const child = yield* spawn(h, parent.id, stepId, { session: "s" })
        expect(child.status).toBe("pending")
        expect((yield* h.send("POST", `/v0/executions/${parent.id}/cancel`)).status).toBe(204)
        expect((yield* eventsFrom(h, child.id, 0)).map(([type, payload]) => [type, payload.reason])).toEqual([
          ["execution.created", undefined],
          ["execution.cancelled", "parent_agent_terminal"]
        ])
        expect(yield* status(h, busy.id)).toBe("running")
      }))
  })
})
