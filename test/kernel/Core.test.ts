import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Queue } from "effect"
import { TestClock } from "effect/testing"
import * as fc from "fast-check"
import { readFileSync } from "node:fs"
import * as Core from "../../src/kernel/Core.js"
import * as StepId from "../../src/StepId.js"

const stepIds = JSON.parse(
  readFileSync(new URL("../../../shared/fixtures/step-ids.json", import.meta.url), "utf8")
) as {
  readonly vectors: ReadonlyArray<{
    readonly name: string
    readonly execution_id: string
    readonly kind: string
    readonly target: string
    readonly raw_args: string | null
    readonly occurrence: number
    readonly step_id: string
  }>
}

const POLICY = `
default_action: allow
rules:
  - id: gate
    priority: 1
    when: { target: send_email }
    then:
      decision: require_approval
      approval_config: { approvers: [alice], timeout: 5m, message: "check the mail" }
  - id: gate-anyone
    priority: 2
    when: { target: publish }
    then: { decision: require_approval }
  - id: nope
    priority: 3
    when: { target: rm }
    then: { decision: deny }
  - id: nope-reason
    priority: 4
    when: { target: rm2 }
    then: { decision: deny, reason: dangerous }
  - id: limited
    priority: 5
    when: { target: limited }
    then: { decision: allow, rate_limit: { max_calls: 1, window: 1m } }
  - id: limited-strict
    priority: 6
    when: { target: limited_strict }
    then: { decision: allow, rate_limit: { max_calls: 1, window: 1m, on_limiter_error: deny } }
`

const setup = (settings?: Partial<Core.Settings>, policyBundle?: string) =>
  Effect.gen(function*() {
    const core = yield* Core.make(settings)
    yield* core.registerAgent({ id: "hello", webhookUrl: "http://localhost:5000/webhook", secret: "s", policyBundle })
    return core
  })

/** Create an execution and claim its dispatch (attempt 1). */
const start = (core: Core.KernelCore, input = "{\"q\":1}", id?: string) =>
  Effect.gen(function*() {
    const execution = yield* core.createExecution({ agentId: "hello", inputRaw: input, agentVersion: undefined, id })
    const claims = yield* core.claimDue(10)
    const claim = claims.find((c) => c.executionId === execution.id)!
    yield* core.recordDelivery(claim, true)
    return { execution, claim, lease: { dispatchId: claim.dispatchId, attempt: claim.attempt } as Core.Lease }
  })

/** A tool_call submission; `args: null` means the member is absent. */
const tool = (target: string, args: string | null = "{\"a\":1}", idempotency = "") => ({
  kind: "tool_call",
  target,
  argsRaw: args ?? undefined,
  idempotency
})

const types = (events: ReadonlyArray<Core.EventRecord>) => events.map((e) => e.type)

const eventsAfter = (core: Core.KernelCore, id: string, afterSeq: number) =>
  Effect.map(core.eventLog(id), (events) => events.filter((e) => e.seq > afterSeq))

const lastSeq = (core: Core.KernelCore, id: string) => Effect.map(core.eventLog(id), (events) => events.length)

/** Reclaim the lease and claim again (next attempt). */
const redeliver = (core: Core.KernelCore, executionId: string) =>
  Effect.gen(function*() {
    yield* core.expireLeases()
    const claim = (yield* core.claimDue(10)).find((c) => c.executionId === executionId)!
    return { claim, lease: { dispatchId: claim.dispatchId, attempt: claim.attempt } as Core.Lease }
  })

const failure = <A>(effect: Effect.Effect<A, Core.KernelFailure>) =>
  Effect.map(Effect.flip(effect), (f) => ({ status: f.status, code: f.code, message: f.message }))

const LEASE_SUPERSEDED = { status: 409, code: "lease_superseded", message: "dispatch lease superseded" }
const EXECUTION_TERMINAL = { status: 409, code: "execution_terminal", message: "execution terminal" }
const NOT_FOUND = { status: 404, code: "not_found", message: "not found" }

describe("Core", () => {
  describe("executions", () => {
    it.effect("create writes created, started, queued (seq 1-3) and answers running", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const execution = yield* core.createExecution({ agentId: "hello", inputRaw: "{ \"a\" : \"<b>\" }", agentVersion: "v1" })
        expect(execution.status).toBe("running")
        expect(execution.inputRaw).toBe("{\"a\":\"\\u003cb\\u003e\"}")
        expect(execution.agentVersion).toBe("v1")
        const events = yield* core.listEvents(execution.id, 0, 0)
        const [dispatch] = yield* core.dispatches(execution.id)
        expect(dispatch).toMatchObject({ status: "pending", attempt: 0, maxAttempts: 5, lockedAtMs: undefined })
        expect(events.map((e) => [e.seq, e.type, e.payload])).toEqual([
          [1, "execution.created", `{"execution_id":"${execution.id}","status":"pending"}`],
          [2, "execution.started", `{"execution_id":"${execution.id}","status":"running"}`],
          [3, "dispatch.queued", `{"attempt":0,"dispatch_id":"${dispatch!.id}","execution_id":"${execution.id}","status":"pending"}`]
        ])
        expect(yield* core.getExecution(execution.id)).toEqual(execution)
      }))

    it.effect("a long event log keeps every event in order, read whole or by page; steps in submission order", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const { execution, lease } = yield* start(core)
        const submitted: Array<string> = []
        for (let i = 0; i < 600; i++) {
          const decision = yield* core.submitStep(execution.id, lease, tool("t", `{"i":${i}}`))
          submitted.push(decision.stepId!)
          yield* core.completeStep(execution.id, decision.stepId!, lease, "{\"ok\":true}")
        }
        const events = yield* core.eventLog(execution.id)
        expect(events.map((e) => e.seq)).toEqual(Array.from({ length: events.length }, (_, i) => i + 1))
        expect(events.length).toBeGreaterThan(2 * 1024)
        const stepEvents = events.filter((e) => e.type.startsWith("step."))
        expect(stepEvents.length).toBe(600 * 4)
        stepEvents.forEach((e, i) => {
          expect(e.type).toBe(["step.proposed", "step.allowed", "step.executing", "step.succeeded"][i % 4])
          expect(JSON.parse(e.payload).step_id).toBe(submitted[Math.floor(i / 4)])
        })
        for (const afterSeq of [0, 1020, 1023, 2047, events.length - 3]) {
          expect(yield* core.listEvents(execution.id, afterSeq, 10)).toEqual(events.slice(afterSeq, afterSeq + 10))
        }
        expect(core.unsafeStepsInOrder(execution.id).map((s) => s.stepId)).toEqual(submitted)
        expect([...core.unsafeStepsInOrder(execution.id)].sort((a, b) => (a.stepId < b.stepId ? -1 : 1)))
          .toEqual(yield* core.listSteps(execution.id, false))
      }))

    it.effect("unknown agent and unknown execution are 404", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        expect(yield* failure(core.createExecution({ agentId: "nobody", inputRaw: undefined, agentVersion: undefined })))
          .toEqual(NOT_FOUND)
        expect(yield* failure(core.getExecution("0192f1a0-0000-7000-8000-000000000000"))).toEqual(NOT_FOUND)
        expect(yield* failure(core.cancelExecution("0192f1a0-0000-7000-8000-000000000000"))).toEqual(NOT_FOUND)
        expect(yield* core.listEvents("0192f1a0-0000-7000-8000-000000000000", 0, 0)).toEqual([])
        expect(yield* core.listSteps("0192f1a0-0000-7000-8000-000000000000", false)).toEqual([])
      }))

    it.effect("a deadline is put in both creation events and cancels like a client cancel", () =>
      Effect.gen(function*() {
        const core = yield* setup({ deadlineMs: 60_000, stage: "seed" })
        const { execution } = yield* start(core)
        expect(execution.deadlineAtMs).toBe(60_000)
        const events = yield* core.eventLog(execution.id)
        expect(events[0]!.payload).toBe(
          `{"deadline_at":"1970-01-01T00:01:00Z","execution_id":"${execution.id}","status":"pending"}`
        )
        expect(events[1]!.payload).toContain("\"deadline_at\":\"1970-01-01T00:01:00Z\"")
        yield* TestClock.adjust("59 seconds")
        expect(yield* core.cancelPastDeadline()).toBe(0)
        yield* TestClock.adjust("1 second")
        expect(yield* core.cancelPastDeadline()).toBe(1)
        const after = yield* core.getExecution(execution.id)
        expect(after).toMatchObject({ status: "cancelled", failureReason: "client_cancelled", updatedAtMs: 60_000 })
        expect(types(yield* eventsAfter(core, execution.id, 4))).toEqual(["execution.cancelled"])
        expect(yield* core.cancelPastDeadline()).toBe(0)
      }))

    it.effect("list: newest first, filters, cursor, limit clamping", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        yield* core.registerAgent({ id: "other", webhookUrl: "", secret: "" })
        const ids: Array<string> = []
        for (let i = 0; i < 7; i++) {
          const e = yield* core.createExecution({ agentId: i % 2 === 0 ? "hello" : "other", inputRaw: undefined, agentVersion: undefined })
          ids.push(e.id)
          yield* TestClock.adjust("1 millis")
        }
        const desc = ids.slice().reverse()
        const all = yield* core.listExecutions({ agentId: "", status: "", cursor: undefined, limit: 0 })
        expect(all.executions.map((e) => e.id)).toEqual(desc)
        expect(all.nextCursor).toBeUndefined()
        const page1 = yield* core.listExecutions({ agentId: "", status: "", cursor: undefined, limit: 3 })
        expect(page1.executions.map((e) => e.id)).toEqual(desc.slice(0, 3))
        expect(page1.nextCursor).toBe(desc[2])
        const page2 = yield* core.listExecutions({ agentId: "", status: "", cursor: page1.nextCursor!.toUpperCase(), limit: 3 })
        expect(page2.executions.map((e) => e.id)).toEqual(desc.slice(3, 6))
        const page3 = yield* core.listExecutions({ agentId: "", status: "", cursor: page2.nextCursor, limit: 3 })
        expect(page3.executions.map((e) => e.id)).toEqual(desc.slice(6))
        expect(page3.nextCursor).toBeUndefined()
        const exact = yield* core.listExecutions({ agentId: "hello", status: "", cursor: undefined, limit: 4 })
        expect(exact.executions.map((e) => e.id)).toEqual([ids[6], ids[4], ids[2], ids[0]])
        expect(exact.nextCursor).toBeUndefined()
        const none = yield* core.listExecutions({ agentId: "", status: "completed", cursor: undefined, limit: 10 })
        expect(none.executions).toEqual([])
        // > 200 is clamped to 200
        for (let i = 0; i < 200; i++) yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined })
        const big = yield* core.listExecutions({ agentId: "", status: "", cursor: undefined, limit: 1000 })
        expect(big.executions.length).toBe(200)
        expect(big.nextCursor).toBe(big.executions[199]!.id)
        const dflt = yield* core.listExecutions({ agentId: "", status: "", cursor: undefined, limit: -5 })
        expect(dflt.executions.length).toBe(50)
      }))

    it.effect("cancel: cancelled, approvals expired, executing steps cancelled (11.4 order)", () =>
      Effect.gen(function*() {
        const core = yield* setup({ stage: "seed" }, POLICY)
        const { execution, lease } = yield* start(core)
        const first = yield* core.submitStep(execution.id, lease, tool("web"))
        const gated = yield* core.submitStep(execution.id, lease, tool("send_email"))
        expect(gated.decision).toBe("blocked")
        const seq = yield* lastSeq(core, execution.id)
        yield* TestClock.adjust("3 seconds")
        yield* core.cancelExecution(execution.id)
        const events = yield* eventsAfter(core, execution.id, seq)
        expect(events.map((e) => [e.type, e.payload])).toEqual([
          ["execution.cancelled", `{"execution_id":"${execution.id}","reason":"client_cancelled","status":"cancelled"}`],
          [
            "approval.expired",
            `{"approval_id":"${gated.approvalId}","execution_id":"${execution.id}","rationale":"execution_cancelled","status":"expired","step_id":"${gated.stepId}"}`
          ],
          [
            "step.denied",
            `{"error":{"reason":"execution_cancelled"},"step_id":"${gated.stepId}","step_type":"tool_call","target":"send_email"}`
          ],
          [
            "step.cancelled",
            `{"error":{"reason":"execution_cancelled"},"step_id":"${first.stepId}","step_type":"tool_call","target":"web"}`
          ]
        ])
        expect(yield* core.getExecution(execution.id)).toMatchObject({
          status: "cancelled",
          failureReason: "client_cancelled",
          updatedAtMs: 3000
        })
        expect(yield* core.getApproval(gated.approvalId!)).toMatchObject({
          status: "expired",
          rationale: "execution_cancelled",
          decidedAtMs: 3000
        })
        expect(yield* core.getStep(execution.id, first.stepId!)).toMatchObject({
          status: "cancelled",
          errorRaw: "{\"reason\":\"execution_cancelled\"}",
          completedAtMs: 3000
        })
        expect(yield* core.getStep(execution.id, gated.stepId!)).toMatchObject({ status: "denied", completedAtMs: 3000 })
        expect(yield* core.listApprovals()).toEqual([])
        expect(yield* failure(core.cancelExecution(execution.id))).toEqual(EXECUTION_TERMINAL)
        // the agent learns it through its next calls
        expect(yield* core.completeStep(execution.id, first.stepId!, lease, "1")).toEqual({ decision: "execution_terminal" })
      }))
  })

  describe("steps", () => {
    it.effect("submit proceeds, complete records, the next delivery replays", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const { execution, lease } = yield* start(core)
        const seq = yield* lastSeq(core, execution.id)
        const decision = yield* core.submitStep(execution.id, lease, tool("web_search", "{ \"q\" : \"<x>\" }"))
        expect(decision.decision).toBe("proceed")
        expect(Object.keys(decision)).toEqual(["decision", "stepId"])
        const stepId = decision.stepId!
        const step = yield* core.getStep(execution.id, stepId)
        expect(step).toMatchObject({
          status: "executing",
          idempotency: "safe_to_retry",
          occurrence: 0,
          argsRaw: "{\"q\":\"\\u003cx\\u003e\"}",
          startedAtMs: 0
        })
        yield* TestClock.adjust("1 second")
        expect(yield* core.completeStep(execution.id, stepId, lease, "{ \"hits\" : 3 }")).toEqual({ decision: "recorded" })
        const events = yield* eventsAfter(core, execution.id, seq)
        const p = `"step_id":"${stepId}","step_type":"tool_call","target":"web_search"}`
        expect(events.map((e) => [e.type, e.payload])).toEqual([
          ["step.proposed", "{" + p],
          ["step.allowed", "{\"rule_id\":\"permissive\"," + p],
          ["step.executing", "{" + p],
          ["step.succeeded", "{" + p]
        ])
        expect(yield* core.getStep(execution.id, stepId)).toMatchObject({
          status: "succeeded",
          resultRaw: "{\"hits\":3}",
          completedAtMs: 1000
        })
        // completing again: replay with the result only
        expect(yield* core.completeStep(execution.id, stepId, lease, "2")).toEqual({
          decision: "replay",
          resultRaw: "{\"hits\":3}"
        })
        expect(yield* core.failStep(execution.id, stepId, lease, "{}")).toEqual({ decision: "replay" })
        const again = yield* redeliver(core, execution.id)
        const before = yield* lastSeq(core, execution.id)
        expect(yield* core.submitStep(execution.id, again.lease, tool("web_search", "{\"q\":\"<x>\"}"))).toEqual({
          decision: "replay",
          stepId,
          resultRaw: "{\"hits\":3}"
        })
        expect(yield* lastSeq(core, execution.id)).toBe(before)
      }))

    it.effect("occurrences: identical calls get 0, 1; a claim resets counters and they replay in order", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const { execution, lease } = yield* start(core)
        const a = yield* core.submitStep(execution.id, lease, tool("roll"))
        const b = yield* core.submitStep(execution.id, lease, tool("roll"))
        const other = yield* core.submitStep(execution.id, lease, tool("roll", "{\"a\":2}"))
        expect(a.stepId).not.toBe(b.stepId)
        expect((yield* core.getStep(execution.id, a.stepId!)).occurrence).toBe(0)
        expect((yield* core.getStep(execution.id, b.stepId!)).occurrence).toBe(1)
        expect((yield* core.getStep(execution.id, other.stepId!)).occurrence).toBe(0)
        yield* core.completeStep(execution.id, a.stepId!, lease, "\"first\"")
        yield* core.failStep(execution.id, b.stepId!, lease, "{\"message\":\"second\"}")
        const again = yield* redeliver(core, execution.id)
        expect(again.claim.attempt).toBe(2)
        expect(yield* core.submitStep(execution.id, again.lease, tool("roll"))).toEqual({
          decision: "replay",
          stepId: a.stepId,
          resultRaw: "\"first\""
        })
        expect(yield* core.submitStep(execution.id, again.lease, tool("roll"))).toEqual({
          decision: "replay",
          stepId: b.stepId,
          errorRaw: "{\"message\":\"second\"}"
        })
        // a third identical call is new: occurrence 2
        const c = yield* core.submitStep(execution.id, again.lease, tool("roll"))
        expect(c.decision).toBe("proceed")
        expect((yield* core.getStep(execution.id, c.stepId!)).occurrence).toBe(2)
      }))

    it("every attempt's step ids are those derived from scratch, however its submissions differ from the last", () => {
      // The core skips hashing when a submission repeats the step recorded at the
      // same place in the execution; the model below derives every id from scratch.
      const submission = fc.record({
        kind: fc.constantFrom("tool_call", "local"),
        target: fc.constantFrom("a", "b"),
        args: fc.constantFrom<string | null>("{\"x\":1}", "{ \"x\" : 1 }", "{\"x\":2}", "null", null, "{oops")
      })
      const attempts = fc.array(fc.array(submission, { maxLength: 8 }), { minLength: 1, maxLength: 4 })
      fc.assert(
        fc.property(attempts, (runs) =>
          Effect.runSync(Effect.gen(function*() {
            const core = yield* setup({ stage: "seed" })
            const { execution, lease: first } = yield* start(core)
            const recorded = new Set<string>()
            let lease = first
            for (const [attempt, run] of runs.entries()) {
              if (attempt > 0) lease = (yield* redeliver(core, execution.id)).lease
              const counts = new Map<string, number>()
              for (const s of run) {
                const argsHash = StepId.argsHash(s.args ?? undefined)
                const key = `${s.kind}/${s.target}/${argsHash}`
                const occurrence = counts.get(key) ?? 0
                counts.set(key, occurrence + 1)
                const stepId = StepId.make({ executionId: execution.id, kind: s.kind, target: s.target, argsHash, occurrence })
                const decision = yield* core.submitStep(execution.id, lease, {
                  kind: s.kind,
                  target: s.target,
                  argsRaw: s.args ?? undefined,
                  idempotency: ""
                })
                expect(decision.stepId).toBe(stepId)
                expect(decision.decision).toBe(recorded.has(stepId) ? "replay" : "proceed")
                if (!recorded.has(stepId)) {
                  yield* core.completeStep(execution.id, stepId, lease, `"${attempt}"`)
                  recorded.add(stepId)
                }
              }
            }
            expect((yield* core.listSteps(execution.id, false)).length).toBe(recorded.size)
          }))
        ),
        { numRuns: 300 }
      )
    })

    it.effect("step ids match the fixture vectors", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const [v1, v2] = stepIds.vectors
        expect(v1!.name).toBe("whitespace_and_key_order")
        expect(v2!.name).toBe("second_occurrence")
        const { execution, lease } = yield* start(core, "null", v1!.execution_id)
        expect(execution.id).toBe("0192f1a0-0000-7000-8000-000000000000")
        const a = yield* core.submitStep(execution.id, lease, tool(v1!.target, v1!.raw_args!))
        expect(a.stepId).toBe("cd3f927155fb730379530bac1d739ba26565d892ef2e70ff5c52fe235a4d5c29")
        const b = yield* core.submitStep(execution.id, lease, tool(v2!.target, v2!.raw_args!))
        expect(b.stepId).toBe(v2!.step_id)
        expect(yield* failure(core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined, id: execution.id })))
          .toEqual({ status: 409, code: "conflict", message: "conflict" })
      }))

    it.effect("absent and null args hash the same; only null is stored", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const { execution, lease } = yield* start(core)
        const a = yield* core.submitStep(execution.id, lease, tool("t", null))
        const b = yield* core.submitStep(execution.id, lease, tool("t", "null"))
        const sa = yield* core.getStep(execution.id, a.stepId!)
        const sb = yield* core.getStep(execution.id, b.stepId!)
        expect(sa.argsHash).toBe(sb.argsHash)
        expect([sa.occurrence, sb.occurrence]).toEqual([0, 1])
        expect(sa.argsRaw).toBeUndefined()
        expect(sb.argsRaw).toBe("null")
      }))

    it.effect("list sorted by step_id, terminal filter, point lookup scoped to the execution", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const { execution, lease } = yield* start(core)
        const decisions: Array<Core.Decision> = []
        for (let i = 0; i < 6; i++) decisions.push(yield* core.submitStep(execution.id, lease, tool("t" + i)))
        yield* core.completeStep(execution.id, decisions[0]!.stepId!, lease, "1")
        yield* core.failStep(execution.id, decisions[1]!.stepId!, lease, "{\"message\":\"x\"}")
        const listed = yield* core.listSteps(execution.id, false)
        const ids = decisions.map((d) => d.stepId!)
        expect(listed.map((s) => s.stepId)).toEqual(ids.slice().sort())
        const terminal = yield* core.listSteps(execution.id, true)
        expect(terminal.map((s) => s.stepId)).toEqual([ids[0]!, ids[1]!].sort())
        const other = yield* start(core)
        expect(yield* failure(core.getStep(other.execution.id, ids[0]!))).toEqual(NOT_FOUND)
        expect(yield* failure(core.completeStep(other.execution.id, ids[2]!, other.lease, "1"))).toEqual(NOT_FOUND)
        expect(yield* failure(core.failStep(execution.id, "ff".repeat(32), lease, "1"))).toEqual(NOT_FOUND)
      }))

    it.effect("orphaned at_most_once step resolves indeterminate; a fresh identical at_most_once is refused", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const { execution, lease } = yield* start(core)
        const first = yield* core.submitStep(execution.id, lease, tool("send_email", "{}", "at_most_once"))
        const safe = yield* core.submitStep(execution.id, lease, tool("fetch", "{}", "safe_to_retry"))
        expect(first.decision).toBe("proceed")
        const again = yield* redeliver(core, execution.id)
        const seq = yield* lastSeq(core, execution.id)
        yield* TestClock.adjust("5 seconds")
        const indeterminate =
          "{\"message\":\"outcome unknown: this may already have taken effect. Check the state before continuing.\",\"reason\":\"indeterminate\"}"
        expect(yield* core.submitStep(execution.id, again.lease, tool("send_email", "{}", "at_most_once"))).toEqual({
          decision: "replay",
          stepId: first.stepId,
          errorRaw: indeterminate
        })
        // safe_to_retry: proceed again, no event
        expect(yield* core.submitStep(execution.id, again.lease, tool("fetch", "{}", "safe_to_retry"))).toEqual({
          decision: "proceed",
          stepId: safe.stepId
        })
        const events = yield* eventsAfter(core, execution.id, seq)
        expect(events.map((e) => [e.type, e.payload])).toEqual([
          [
            "step.failed",
            `{"error":${indeterminate},"step_id":"${first.stepId}","step_type":"tool_call","target":"send_email"}`
          ]
        ])
        expect(yield* core.getStep(execution.id, first.stepId!)).toMatchObject({
          status: "failed",
          errorRaw: indeterminate,
          completedAtMs: 5000
        })
        // the handler tries again: a new occurrence, refused
        const retry = yield* core.submitStep(execution.id, again.lease, tool("send_email", "{}", "at_most_once"))
        expect(retry).toMatchObject({ decision: "denied", reason: "prior attempt outcome unknown; retry refused" })
        expect((yield* core.getStep(execution.id, retry.stepId!)).errorRaw).toBe(
          "{\"reason\":\"prior attempt outcome unknown; retry refused\",\"rule_id\":\"__indeterminate_retry\"}"
        )
        // safe_to_retry with the same identity is not refused
        const retrySafe = yield* core.submitStep(execution.id, again.lease, tool("send_email", "{}", "safe_to_retry"))
        expect(retrySafe.decision).toBe("proceed")
      }))

    it.effect("an agent-reported indeterminate failure also refuses at_most_once retries", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const { execution, lease } = yield* start(core)
        const first = yield* core.submitStep(execution.id, lease, tool("pay", "{}", "at_most_once"))
        yield* core.failStep(execution.id, first.stepId!, lease, "{\"reason\":\"indeterminate\"}")
        const retry = yield* core.submitStep(execution.id, lease, tool("pay", "{}", "at_most_once"))
        expect(retry.decision).toBe("denied")
      }))
  })

  describe("fencing", () => {
    it.effect("an older attempt is superseded; CHECK and RENEW", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const { execution, lease } = yield* start(core)
        const proceeded = yield* core.submitStep(execution.id, lease, tool("a"))
        const again = yield* redeliver(core, execution.id)
        expect(again.claim.attempt).toBe(2)
        const seq = yield* lastSeq(core, execution.id)
        expect(yield* failure(core.submitStep(execution.id, lease, tool("b")))).toEqual(LEASE_SUPERSEDED)
        expect(yield* failure(core.heartbeat(execution.id, lease))).toEqual(LEASE_SUPERSEDED)
        expect(yield* failure(core.completeStep(execution.id, proceeded.stepId!, lease, "1"))).toEqual(LEASE_SUPERSEDED)
        expect(yield* failure(core.failStep(execution.id, proceeded.stepId!, lease, "1"))).toEqual(LEASE_SUPERSEDED)
        expect(yield* failure(core.completeExecution(execution.id, lease, "1"))).toEqual(LEASE_SUPERSEDED)
        expect(yield* failure(core.failExecution(execution.id, lease, "x"))).toEqual(LEASE_SUPERSEDED)
        // unknown dispatch, other execution
        expect(yield* failure(core.heartbeat(execution.id, { dispatchId: "0192f1a0-0000-7000-8000-000000000000", attempt: 1 })))
          .toEqual(LEASE_SUPERSEDED)
        const other = yield* start(core)
        expect(yield* failure(core.submitStep(execution.id, other.lease, tool("b")))).toEqual(LEASE_SUPERSEDED)
        expect(yield* lastSeq(core, execution.id)).toBe(seq)
        // the current attempt works
        yield* core.heartbeat(execution.id, again.lease)
        expect(yield* core.completeStep(execution.id, proceeded.stepId!, again.lease, "1")).toEqual({ decision: "recorded" })
      }))

    it.effect("heartbeat and submit renew the lease; complete step does not", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const { execution, lease } = yield* start(core)
        const step = yield* core.submitStep(execution.id, lease, tool("a"))
        yield* TestClock.adjust("100 seconds")
        yield* core.heartbeat(execution.id, lease)
        expect((yield* core.dispatches(execution.id))[0]!.lockedAtMs).toBe(100_000)
        yield* TestClock.adjust("100 seconds")
        yield* core.completeStep(execution.id, step.stepId!, lease, "1")
        expect((yield* core.dispatches(execution.id))[0]!.lockedAtMs).toBe(100_000)
        expect(yield* core.reclaimStale()).toBe(0)
        yield* TestClock.adjust("20 seconds")
        expect(yield* core.reclaimStale()).toBe(0) // exactly at the timeout: not older
        yield* TestClock.adjust("1 millis")
        expect(yield* core.reclaimStale()).toBe(1)
        expect((yield* core.dispatches(execution.id))[0]).toMatchObject({
          status: "pending",
          lockedAtMs: undefined,
          nextAttemptAtMs: 220_001,
          attempt: 1
        })
      }))

    it.effect("after completion: heartbeat 409 superseded, submit/complete step terminal, complete 409 terminal", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const { execution, lease } = yield* start(core)
        const step = yield* core.submitStep(execution.id, lease, tool("a"))
        yield* TestClock.adjust("1 second")
        yield* core.completeExecution(execution.id, lease, "{ \"ok\" : true }")
        const record = yield* core.getExecution(execution.id)
        expect(record).toMatchObject({ status: "completed", outputRaw: "{\"ok\":true}", updatedAtMs: 1000 })
        const events = yield* core.eventLog(execution.id)
        expect(events.at(-1)!.payload).toBe(`{"execution_id":"${execution.id}","output":{"ok":true},"status":"completed"}`)
        expect((yield* core.dispatches(execution.id))[0]).toMatchObject({ status: "exhausted", lockedAtMs: undefined })
        expect(yield* failure(core.heartbeat(execution.id, lease))).toEqual(LEASE_SUPERSEDED)
        expect(yield* core.submitStep(execution.id, lease, tool("b"))).toEqual({ decision: "execution_terminal" })
        expect(yield* core.completeStep(execution.id, step.stepId!, lease, "1")).toEqual({ decision: "execution_terminal" })
        expect(yield* core.failStep(execution.id, step.stepId!, lease, "1")).toEqual({ decision: "execution_terminal" })
        expect(yield* failure(core.completeExecution(execution.id, lease, undefined))).toEqual(EXECUTION_TERMINAL)
        expect(yield* failure(core.failExecution(execution.id, lease, "x"))).toEqual(EXECUTION_TERMINAL)
        // a late webhook outcome is fenced
        const seq = yield* lastSeq(core, execution.id)
        yield* core.recordDelivery({ ...(yield* core.claimDue(10))[0]!, attempt: 1 } as Core.Claim, false).pipe(
          Effect.catchDefect(() => Effect.void)
        )
        expect(yield* lastSeq(core, execution.id)).toBe(seq)
      }))

    it.effect("fail execution: reason stored, empty reason omitted from the event", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const a = yield* start(core)
        yield* core.failExecution(a.execution.id, a.lease, "boom")
        expect(yield* core.getExecution(a.execution.id)).toMatchObject({ status: "failed", failureReason: "boom" })
        expect((yield* core.eventLog(a.execution.id)).at(-1)!.payload).toBe(
          `{"execution_id":"${a.execution.id}","reason":"boom","status":"failed"}`
        )
        const b = yield* start(core)
        yield* core.failExecution(b.execution.id, b.lease, "")
        expect((yield* core.eventLog(b.execution.id)).at(-1)!.payload).toBe(
          `{"execution_id":"${b.execution.id}","status":"failed"}`
        )
        const c = yield* start(core)
        yield* core.completeExecution(c.execution.id, c.lease, undefined)
        expect((yield* core.getExecution(c.execution.id)).outputRaw).toBeUndefined()
        expect((yield* core.eventLog(c.execution.id)).at(-1)!.payload).toBe(
          `{"execution_id":"${c.execution.id}","status":"completed"}`
        )
      }))
  })

  describe("delivery", () => {
    it.effect("a lapsing lease is reclaimed with the same dispatch id; the sixth claim exhausts", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const execution = yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined })
        let dispatchId = ""
        for (let attempt = 1; attempt <= 5; attempt++) {
          const claims = yield* core.claimDue(10)
          expect(claims.map((c) => c.attempt)).toEqual([attempt])
          expect(claims[0]!.leaseTimeoutSeconds).toBe(120)
          if (attempt === 1) dispatchId = claims[0]!.dispatchId
          expect(claims[0]!.dispatchId).toBe(dispatchId)
          yield* core.recordDelivery(claims[0]!, true)
          expect(yield* core.claimDue(10)).toEqual([])
          yield* TestClock.adjust("120001 millis")
          expect(yield* core.reclaimStale()).toBe(1)
        }
        expect(yield* core.claimDue(10)).toEqual([])
        const events = yield* core.eventLog(execution.id)
        expect(types(events)).toEqual([
          "execution.created",
          "execution.started",
          "dispatch.queued",
          "dispatch.acked",
          "dispatch.acked",
          "dispatch.acked",
          "dispatch.acked",
          "dispatch.acked",
          "execution.failed"
        ])
        expect(events.slice(3, 8).map((e) => JSON.parse(e.payload).attempt)).toEqual([1, 2, 3, 4, 5])
        expect(events[8]!.payload).toBe(
          `{"execution_id":"${execution.id}","reason":"dispatch_exhausted","status":"failed"}`
        )
        expect(yield* core.getExecution(execution.id)).toMatchObject({
          status: "failed",
          failureReason: "dispatch_exhausted"
        })
        expect((yield* core.dispatches(execution.id))[0]).toMatchObject({ status: "exhausted", attempt: 6 })
      }))

    it.effect("webhook failures back off 1s, 2s, 4s, 8s and exhaust after max attempts", () =>
      Effect.gen(function*() {
        const core = yield* setup({ random: () => 0 })
        const execution = yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined })
        const waits = [1000, 2000, 4000, 8000]
        for (let attempt = 1; attempt <= 5; attempt++) {
          const [claim] = yield* core.claimDue(10)
          expect(claim!.attempt).toBe(attempt)
          yield* core.recordDelivery(claim!, false)
          if (attempt === 5) break
          const wait = waits[attempt - 1]!
          expect((yield* core.dispatches(execution.id))[0]).toMatchObject({ status: "failed", lockedAtMs: undefined })
          yield* TestClock.adjust(wait - 1)
          expect(yield* core.claimDue(10)).toEqual([])
          yield* TestClock.adjust(1)
        }
        const events = yield* core.eventLog(execution.id)
        expect(types(events.slice(3))).toEqual([
          "dispatch.failed",
          "dispatch.failed",
          "dispatch.failed",
          "dispatch.failed",
          "dispatch.failed",
          "execution.failed"
        ])
        expect(events[7]!.payload).toBe(
          `{"attempt":5,"dispatch_id":"${(yield* core.dispatches(execution.id))[0]!.id}","execution_id":"${execution.id}","status":"failed"}`
        )
        expect(yield* core.getExecution(execution.id)).toMatchObject({ status: "failed", failureReason: "dispatch_exhausted" })
      }))

    it.effect("backoff jitter is below 25% and capped at 30s", () =>
      Effect.gen(function*() {
        const core = yield* setup({ random: () => 0.9999, maxAttempts: 10 })
        const execution = yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined })
        const expected = [1000, 2000, 4000, 8000, 16000, 30000, 30000]
        for (const base of expected) {
          const [claim] = yield* core.claimDue(10)
          yield* core.recordDelivery(claim!, false)
          const [d] = yield* core.dispatches(execution.id)
          const now = yield* TestClockNow
          const wait = d!.nextAttemptAtMs - now
          expect(wait).toBeGreaterThanOrEqual(base)
          expect(wait).toBeLessThan(base * 1.25)
          expect(wait).toBeGreaterThan(base * 1.2)
          yield* TestClock.adjust(wait)
        }
      }))

    it.effect("claims oldest next_attempt_at first, at most limit; a deleted agent leaves the dispatch in flight", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const ids: Array<string> = []
        for (let i = 0; i < 5; i++) {
          ids.push((yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined })).id)
          yield* TestClock.adjust("1 millis")
        }
        expect((yield* core.claimDue(2)).map((c) => c.executionId)).toEqual(ids.slice(0, 2))
        yield* core.deleteAgent("hello")
        expect(yield* core.claimDue(10)).toEqual([])
        const ds = yield* core.dispatches()
        expect(ds.map((d) => d.status)).toEqual(["in_flight", "in_flight", "in_flight", "in_flight", "in_flight"])
      }))

    it.effect("per-agent lease timeout (>= 10 s) applies to claims and reclaim", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        yield* core.registerAgent({ id: "fast", webhookUrl: "", secret: "", leaseTimeoutSeconds: 15 })
        yield* core.registerAgent({ id: "ignored", webhookUrl: "", secret: "", leaseTimeoutSeconds: 5 })
        expect((yield* core.getAgent("ignored")).leaseTimeoutMs).toBeUndefined()
        yield* core.createExecution({ agentId: "fast", inputRaw: undefined, agentVersion: undefined })
        yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined })
        const claims = yield* core.claimDue(10)
        expect(claims.map((c) => c.leaseTimeoutSeconds)).toEqual([15, 120])
        yield* TestClock.adjust("16 seconds")
        expect(yield* core.reclaimStale()).toBe(1)
        expect((yield* core.claimDue(10)).map((c) => [c.agent.id, c.attempt])).toEqual([["fast", 2]])
      }))

    it.effect("enqueued signals a new dispatch", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const waiter = yield* Effect.forkChild(core.enqueued)
        yield* Effect.yieldNow
        expect(waiter.pollUnsafe()).toBeUndefined()
        yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined })
        yield* Fiber.join(waiter)
        // nothing pending now
        const second = yield* Effect.forkChild(core.enqueued)
        yield* Effect.yieldNow
        expect(second.pollUnsafe()).toBeUndefined()
        yield* Fiber.interrupt(second)
      }))

    it.effect("compat v0.14.0: no fencing, 400s for foreign dispatches, unfenced delivery outcome", () =>
      Effect.gen(function*() {
        const core = yield* setup({ stage: "v0.14.0" })
        const { execution, claim } = yield* start(core)
        const lease: Core.Lease = { dispatchId: claim.dispatchId, attempt: undefined }
        const step = yield* core.submitStep(execution.id, lease, tool("a"))
        expect(step.decision).toBe("proceed")
        yield* core.heartbeat(execution.id, lease)
        yield* core.heartbeat("0192f1a0-0000-7000-8000-000000000000", lease)
        expect(yield* failure(core.submitStep(execution.id, { dispatchId: "0192f1a0-0000-7000-8000-000000000000", attempt: undefined }, tool("a"))))
          .toEqual({ status: 400, code: "validation_error", message: "validation error: unknown dispatch_id" })
        const other = yield* start(core)
        expect(yield* failure(core.submitStep(execution.id, { dispatchId: other.claim.dispatchId, attempt: undefined }, tool("a"))))
          .toEqual({ status: 400, code: "validation_error", message: "validation error: dispatch_id belongs to another execution" })
        // a reclaimed run is not fenced
        yield* redeliver(core, execution.id)
        expect((yield* core.submitStep(execution.id, lease, tool("b"))).decision).toBe("proceed")
        expect(yield* core.completeStep(execution.id, step.stepId!, lease, "1")).toEqual({ decision: "recorded" })
        yield* core.completeExecution(execution.id, lease, undefined)
        // the delivery outcome is not fenced: the dispatch comes back and is discarded
        yield* core.recordDelivery(claim, false)
        yield* TestClock.adjust("10 seconds")
        expect(yield* core.claimDue(10)).toEqual([])
        const events = yield* core.eventLog(execution.id)
        expect(types(events.slice(-3))).toEqual(["execution.completed", "dispatch.failed", "dispatch.discarded"])
        expect(JSON.parse(events.at(-1)!.payload)).toEqual({
          attempt: 3,
          dispatch_id: claim.dispatchId,
          execution_id: execution.id,
          status: "exhausted"
        })
      }))
  })

  describe("policy", () => {
    it.effect("denied reason quirk: fresh omits reason when the rule has none, replay says policy_denied", () =>
      Effect.gen(function*() {
        const core = yield* setup({ stage: "seed" }, POLICY)
        const { execution, lease } = yield* start(core)
        const seq = yield* lastSeq(core, execution.id)
        const denied = yield* core.submitStep(execution.id, lease, tool("rm"))
        expect(denied).toEqual({ decision: "denied", stepId: denied.stepId })
        const withReason = yield* core.submitStep(execution.id, lease, tool("rm2"))
        expect(withReason).toEqual({ decision: "denied", stepId: withReason.stepId, reason: "dangerous" })
        const events = yield* eventsAfter(core, execution.id, seq)
        expect(events.map((e) => [e.type, e.payload])).toEqual([
          ["step.proposed", `{"step_id":"${denied.stepId}","step_type":"tool_call","target":"rm"}`],
          [
            "step.denied",
            `{"error":{"reason":"policy_denied","rule_id":"nope"},"rule_id":"nope","step_id":"${denied.stepId}","step_type":"tool_call","target":"rm"}`
          ],
          ["step.proposed", `{"step_id":"${withReason.stepId}","step_type":"tool_call","target":"rm2"}`],
          [
            "step.denied",
            `{"error":{"reason":"dangerous","rule_id":"nope-reason"},"rule_id":"nope-reason","step_id":"${withReason.stepId}","step_type":"tool_call","target":"rm2"}`
          ]
        ])
        expect(yield* core.getStep(execution.id, denied.stepId!)).toMatchObject({ status: "denied", completedAtMs: 0 })
        const again = yield* redeliver(core, execution.id)
        expect(yield* core.submitStep(execution.id, again.lease, tool("rm"))).toEqual({
          decision: "denied",
          stepId: denied.stepId,
          reason: "policy_denied"
        })
        expect(yield* core.submitStep(execution.id, again.lease, tool("rm2"))).toEqual({
          decision: "denied",
          stepId: withReason.stepId,
          reason: "dangerous"
        })
      }))

    it.effect("default deny: reason, and a denied step with empty target omits target", () =>
      Effect.gen(function*() {
        const core = yield* setup({ stage: "seed" }, "default_action: deny\nrules: []\n")
        const { execution, lease } = yield* start(core)
        const d = yield* core.submitStep(execution.id, lease, tool(""))
        expect(d).toEqual({ decision: "denied", stepId: d.stepId, reason: "no explicit allow rule matched" })
        expect((yield* core.eventLog(execution.id)).at(-1)!.payload).toBe(
          `{"error":{"reason":"no explicit allow rule matched","rule_id":"default"},"rule_id":"default","step_id":"${d.stepId}","step_type":"tool_call"}`
        )
        const local = yield* core.submitStep(execution.id, lease, { kind: "local", target: "now", argsRaw: "{}", idempotency: "" })
        expect(local.decision).toBe("proceed")
      }))

    it.effect("rate limit refusal records nothing and does not advance the counter", () =>
      Effect.gen(function*() {
        const core = yield* setup({ stage: "seed" }, POLICY)
        const { execution, lease } = yield* start(core)
        const first = yield* core.submitStep(execution.id, lease, tool("limited"))
        expect(first.decision).toBe("proceed")
        const seq = yield* lastSeq(core, execution.id)
        expect(yield* core.submitStep(execution.id, lease, tool("limited"))).toEqual({
          decision: "rate_limited",
          reason: "rate_limit_exceeded"
        })
        expect(yield* lastSeq(core, execution.id)).toBe(seq)
        expect((yield* core.listSteps(execution.id, false)).length).toBe(1)
        yield* TestClock.adjust("1 minute")
        const second = yield* core.submitStep(execution.id, lease, tool("limited"))
        expect(second.decision).toBe("proceed")
        expect((yield* core.getStep(execution.id, second.stepId!)).occurrence).toBe(1)
        // replays never consult the limiter
        const again = yield* redeliver(core, execution.id)
        expect((yield* core.submitStep(execution.id, again.lease, tool("limited"))).decision).toBe("proceed")
        expect((yield* core.submitStep(execution.id, again.lease, tool("limited"))).decision).toBe("proceed")
      }))

    it.effect("limiter errors: fail open by default, rate_limiter_unavailable with on_limiter_error deny", () =>
      Effect.gen(function*() {
        const core = yield* setup({ limiterError: true, stage: "seed" }, POLICY)
        const { execution, lease } = yield* start(core)
        expect((yield* core.submitStep(execution.id, lease, tool("limited"))).decision).toBe("proceed")
        expect((yield* core.submitStep(execution.id, lease, tool("limited"))).decision).toBe("proceed")
        expect(yield* core.submitStep(execution.id, lease, tool("limited_strict"))).toEqual({
          decision: "rate_limited",
          reason: "rate_limiter_unavailable"
        })
        yield* core.updateSettings({ limiterError: false })
        expect(core.settings.limiterError).toBe(false)
        expect((yield* core.submitStep(execution.id, lease, tool("limited_strict"))).decision).toBe("proceed")
      }))

    it.effect("loadPolicy: validation before lookup, not found, empty removes; re-registration drops the policy", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const invalid = yield* failure(core.loadPolicy("nobody", "rules:\n  - priority: 1\n"))
        expect(invalid.status).toBe(400)
        expect(invalid.code).toBe("validation_error")
        expect(invalid.message.startsWith("load policy bundle: validation error: invalid policy bundle: ")).toBe(true)
        expect(yield* failure(core.loadPolicy("nobody", "default_action: deny\n"))).toEqual({
          status: 404,
          code: "not_found",
          message: "load policy bundle: not found"
        })
        yield* core.loadPolicy("hello", "default_action: deny\n")
        expect((yield* core.getAgent("hello")).policyBundle).toBe("default_action: deny\n")
        const { execution, lease } = yield* start(core)
        expect((yield* core.submitStep(execution.id, lease, tool("x"))).decision).toBe("denied")
        yield* core.loadPolicy("hello", "")
        expect((yield* core.submitStep(execution.id, lease, tool("y"))).decision).toBe("proceed")
        yield* core.loadPolicy("hello", "default_action: deny\n")
        yield* core.registerAgent({ id: "hello", webhookUrl: "u", secret: "s" })
        expect((yield* core.getAgent("hello")).policyBundle).toBe("")
        const bad = yield* failure(core.registerAgent({ id: "x", webhookUrl: "", secret: "", policyBundle: "rules:\n  - priority: 1\n" }))
        expect(bad.message.startsWith("agent \"x\": invalid policy bundle: ")).toBe(true)
      }))

    it.effect("agents: sorted list, delete is idempotent, 404 on unknown", () =>
      Effect.gen(function*() {
        const core = yield* Core.make()
        expect(yield* core.listAgents()).toEqual([])
        yield* core.registerAgent({ id: "b", webhookUrl: "", secret: "" })
        yield* core.registerAgent({ id: "B", webhookUrl: "", secret: "" })
        yield* core.registerAgent({ id: "a", webhookUrl: "", secret: "" })
        expect((yield* core.listAgents()).map((a) => a.id)).toEqual(["B", "a", "b"])
        yield* core.deleteAgent("a")
        yield* core.deleteAgent("a")
        expect(yield* failure(core.getAgent("a"))).toEqual(NOT_FOUND)
      }))
  })

  describe("approvals", () => {
    const blocked = (settings?: Partial<Core.Settings>) =>
      Effect.gen(function*() {
        const core = yield* setup({ stage: "seed", ...settings }, POLICY)
        const { execution, lease } = yield* start(core)
        const earlier = yield* core.submitStep(execution.id, lease, tool("web"))
        const seq = yield* lastSeq(core, execution.id)
        const decision = yield* core.submitStep(execution.id, lease, tool("send_email"))
        return { core, execution, lease, earlier, decision, seq }
      })

    it.effect("require_approval blocks: approval, events, dispatch released", () =>
      Effect.gen(function*() {
        const { core, execution, lease, earlier, decision, seq } = yield* blocked()
        expect(decision).toEqual({ decision: "blocked", stepId: decision.stepId, approvalId: decision.approvalId })
        const approvalId = decision.approvalId!
        const stepId = decision.stepId!
        expect(yield* core.getApproval(approvalId)).toEqual({
          id: approvalId,
          stepId,
          executionId: execution.id,
          status: "pending",
          approvers: ["alice"],
          message: "check the mail",
          timeoutAtMs: 300_000,
          decidedBy: "",
          rationale: "",
          createdAtMs: 0
        })
        const events = yield* eventsAfter(core, execution.id, seq)
        expect(events.map((e) => [e.type, e.payload])).toEqual([
          ["step.proposed", `{"step_id":"${stepId}","step_type":"tool_call","target":"send_email"}`],
          ["step.awaiting_approval", `{"rule_id":"gate","step_id":"${stepId}","step_type":"tool_call","target":"send_email"}`],
          [
            "approval.requested",
            `{"approval_id":"${approvalId}","execution_id":"${execution.id}","status":"pending","step_id":"${stepId}"}`
          ],
          ["execution.blocked", `{"execution_id":"${execution.id}","status":"blocked"}`]
        ])
        expect((yield* core.getExecution(execution.id)).status).toBe("blocked")
        expect((yield* core.dispatches(execution.id)).map((d) => d.status)).toEqual(["exhausted"])
        expect(yield* core.getStep(execution.id, stepId)).toMatchObject({ status: "awaiting_approval" })
        expect((yield* core.listApprovals()).map((a) => a.id)).toEqual([approvalId])
        // the run's lease is gone, but its proceeded step can still be completed (CHECK)
        expect(yield* failure(core.submitStep(execution.id, lease, tool("more")))).toEqual(LEASE_SUPERSEDED)
        expect(yield* failure(core.heartbeat(execution.id, lease))).toEqual(LEASE_SUPERSEDED)
        expect(yield* failure(core.completeExecution(execution.id, lease, undefined))).toEqual(LEASE_SUPERSEDED)
        expect(yield* core.completeStep(execution.id, earlier.stepId!, lease, "1")).toEqual({ decision: "recorded" })
      }))

    it.effect("grant: events, new dispatch, the gated step proceeds", () =>
      Effect.gen(function*() {
        const { core, execution, decision } = yield* blocked()
        const seq = yield* lastSeq(core, execution.id)
        yield* TestClock.adjust("10 seconds")
        yield* core.grantApproval(decision.approvalId!, { decidedBy: "alice", rationale: "ok <3" })
        const dispatches = yield* core.dispatches(execution.id)
        expect(dispatches.map((d) => [d.status, d.attempt])).toEqual([["exhausted", 1], ["pending", 0]])
        const events = yield* eventsAfter(core, execution.id, seq)
        expect(events.map((e) => [e.type, e.payload])).toEqual([
          [
            "approval.granted",
            `{"approval_id":"${decision.approvalId}","decided_by":"alice","execution_id":"${execution.id}","rationale":"ok \\u003c3","status":"granted","step_id":"${decision.stepId}"}`
          ],
          ["step.allowed", `{"step_id":"${decision.stepId}","step_type":"tool_call","target":"send_email"}`],
          ["execution.resumed", `{"execution_id":"${execution.id}","status":"running"}`],
          [
            "dispatch.queued",
            `{"attempt":0,"dispatch_id":"${dispatches[1]!.id}","execution_id":"${execution.id}","status":"pending"}`
          ]
        ])
        expect(yield* core.getApproval(decision.approvalId!)).toMatchObject({
          status: "granted",
          decidedBy: "alice",
          decidedAtMs: 10_000,
          rationale: "ok <3"
        })
        expect(yield* core.getExecution(execution.id)).toMatchObject({ status: "running", updatedAtMs: 10_000 })
        expect(yield* core.listApprovals()).toEqual([])
        const [claim] = yield* core.claimDue(10)
        expect(claim!.attempt).toBe(1)
        const lease = { dispatchId: claim!.dispatchId, attempt: 1 }
        const seq2 = yield* lastSeq(core, execution.id)
        expect((yield* core.submitStep(execution.id, lease, tool("web"))).decision).toBe("proceed")
        expect(yield* core.submitStep(execution.id, lease, tool("send_email", "{\"a\":1}", "at_most_once"))).toEqual({
          decision: "proceed",
          stepId: decision.stepId
        })
        expect(types(yield* eventsAfter(core, execution.id, seq2))).toEqual(["step.executing"])
        expect(yield* core.getStep(execution.id, decision.stepId!)).toMatchObject({ status: "executing", startedAtMs: 10_000 })
      }))

    it.effect("deny: the step is denied with the rationale (or approval_denied) and the execution resumes", () =>
      Effect.gen(function*() {
        const { core, execution, decision } = yield* blocked()
        const seq = yield* lastSeq(core, execution.id)
        yield* core.denyApproval(decision.approvalId!, { decidedBy: "alice", rationale: "" })
        const events = yield* eventsAfter(core, execution.id, seq)
        expect(types(events)).toEqual(["approval.denied", "step.denied", "execution.resumed", "dispatch.queued"])
        expect(events[0]!.payload).toBe(
          `{"approval_id":"${decision.approvalId}","decided_by":"alice","execution_id":"${execution.id}","status":"denied","step_id":"${decision.stepId}"}`
        )
        expect(events[1]!.payload).toBe(
          `{"error":{"reason":"approval_denied"},"step_id":"${decision.stepId}","step_type":"tool_call","target":"send_email"}`
        )
        expect(yield* core.getStep(execution.id, decision.stepId!)).toMatchObject({
          status: "denied",
          errorRaw: "{\"reason\":\"approval_denied\"}",
          completedAtMs: 0
        })
        expect((yield* core.getExecution(execution.id)).status).toBe("running")
        const [claim] = yield* core.claimDue(10)
        const lease = { dispatchId: claim!.dispatchId, attempt: claim!.attempt }
        yield* core.submitStep(execution.id, lease, tool("web"))
        expect(yield* core.submitStep(execution.id, lease, tool("send_email"))).toEqual({
          decision: "denied",
          stepId: decision.stepId,
          reason: "approval_denied"
        })
      }))

    it.effect("deny with a rationale uses it as the reason", () =>
      Effect.gen(function*() {
        const { core, execution, decision } = yield* blocked()
        yield* core.denyApproval(decision.approvalId!, { decidedBy: "alice", rationale: "not today" })
        expect((yield* core.getStep(execution.id, decision.stepId!)).errorRaw).toBe("{\"reason\":\"not today\"}")
        expect(yield* core.getApproval(decision.approvalId!)).toMatchObject({ status: "denied", rationale: "not today" })
      }))

    it.effect("expiry: after the rule's timeout the step is denied approval_timeout and the execution resumes", () =>
      Effect.gen(function*() {
        const { core, execution, decision } = yield* blocked()
        const seq = yield* lastSeq(core, execution.id)
        yield* TestClock.adjust("299999 millis")
        expect(yield* core.expireApprovals()).toBe(0)
        yield* TestClock.adjust("1 millis")
        expect(yield* core.expireApprovals()).toBe(1)
        const events = yield* eventsAfter(core, execution.id, seq)
        expect(types(events)).toEqual(["approval.expired", "step.denied", "execution.resumed", "dispatch.queued"])
        expect(events[0]!.payload).toBe(
          `{"approval_id":"${decision.approvalId}","execution_id":"${execution.id}","rationale":"timeout","status":"expired","step_id":"${decision.stepId}"}`
        )
        expect(events[1]!.payload).toContain("{\"error\":{\"reason\":\"approval_timeout\"}")
        expect(yield* core.getApproval(decision.approvalId!)).toMatchObject({
          status: "expired",
          rationale: "timeout",
          decidedBy: "",
          decidedAtMs: 300_000
        })
        expect(yield* core.expireApprovals()).toBe(0)
        const [claim] = yield* core.claimDue(10)
        const lease = { dispatchId: claim!.dispatchId, attempt: claim!.attempt }
        yield* core.submitStep(execution.id, lease, tool("web"))
        expect((yield* core.submitStep(execution.id, lease, tool("send_email"))).reason).toBe("approval_timeout")
      }))

    it.effect("the kernel default timeout applies when the rule sets none; approvers null", () =>
      Effect.gen(function*() {
        const core = yield* setup({ approvalTimeoutMs: 60_000, stage: "seed" }, POLICY)
        const { execution, lease } = yield* start(core)
        const d = yield* core.submitStep(execution.id, lease, tool("publish"))
        expect(yield* core.getApproval(d.approvalId!)).toMatchObject({ approvers: null, timeoutAtMs: 60_000, message: "" })
        yield* core.grantApproval(d.approvalId!, { decidedBy: "", rationale: "" })
        expect((yield* core.eventLog(execution.id)).find((e) => e.type === "approval.granted")!.payload).toBe(
          `{"approval_id":"${d.approvalId}","execution_id":"${execution.id}","status":"granted","step_id":"${d.stepId}"}`
        )
      }))

    it.effect("approvers: 403 for others; deciding twice is 409; unknown is 404", () =>
      Effect.gen(function*() {
        const { core, execution, decision } = yield* blocked()
        const seq = yield* lastSeq(core, execution.id)
        expect(yield* failure(core.grantApproval(decision.approvalId!, { decidedBy: "bob", rationale: "" }))).toEqual({
          status: 403,
          code: "forbidden",
          message: "forbidden: \"bob\" is not an approver for this approval"
        })
        expect((yield* failure(core.denyApproval(decision.approvalId!, { decidedBy: "Alice \"x\"", rationale: "" }))).message)
          .toBe("forbidden: \"Alice \\\"x\\\"\" is not an approver for this approval")
        expect((yield* failure(core.denyApproval(decision.approvalId!, { decidedBy: "", rationale: "" }))).status).toBe(403)
        // Go %q rendering
        expect((yield* failure(core.denyApproval(decision.approvalId!, { decidedBy: "a\u0001\u00a0\n<é😀\\", rationale: "" }))).message)
          .toBe("forbidden: \"a\\x01\\u00a0\\n<é😀\\\\\" is not an approver for this approval")
        expect(yield* lastSeq(core, execution.id)).toBe(seq)
        yield* core.grantApproval(decision.approvalId!, { decidedBy: "alice", rationale: "" })
        expect(yield* failure(core.grantApproval(decision.approvalId!, { decidedBy: "alice", rationale: "" }))).toEqual({
          status: 409,
          code: "conflict",
          message: "conflict"
        })
        expect((yield* failure(core.denyApproval(decision.approvalId!, { decidedBy: "alice", rationale: "" }))).code).toBe("conflict")
        expect(yield* failure(core.grantApproval("0192f1a0-0000-7000-8000-000000000000", { decidedBy: "", rationale: "" })))
          .toEqual(NOT_FOUND)
      }))

    it.effect("a resubmitted awaiting_approval step answers blocked with the approval id, no events", () =>
      Effect.gen(function*() {
        // Only reachable without fencing: v0.14.0 redelivers the released dispatch after a failed webhook.
        const core = yield* setup({ stage: "v0.14.0", random: () => 0 }, POLICY)
        const { execution, claim } = yield* start(core)
        const d = yield* core.submitStep(execution.id, { dispatchId: claim.dispatchId, attempt: undefined }, tool("send_email"))
        yield* core.recordDelivery(claim, false)
        yield* TestClock.adjust("1 second")
        const [again] = yield* core.claimDue(10)
        expect(again!.attempt).toBe(2)
        const lease = { dispatchId: again!.dispatchId, attempt: undefined }
        const seq = yield* lastSeq(core, execution.id)
        expect(yield* core.submitStep(execution.id, lease, tool("send_email"))).toEqual({
          decision: "blocked",
          stepId: d.stepId,
          approvalId: d.approvalId
        })
        expect(yield* core.submitStep(execution.id, lease, tool("other"))).toEqual({ decision: "execution_blocked" })
        expect(yield* lastSeq(core, execution.id)).toBe(seq)
      }))
  })

  describe("events and deltas", () => {
    it.effect("paging: after_seq, limit defaults and clamps", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const { execution, lease } = yield* start(core)
        for (let i = 0; i < 400; i++) yield* core.submitStep(execution.id, lease, tool("t" + i))
        const total = (yield* core.eventLog(execution.id)).length
        expect(total).toBe(4 + 1200)
        const first = yield* core.listEvents(execution.id, 0, 0)
        expect(first.map((e) => e.seq)).toEqual(Array.from({ length: 100 }, (_, i) => i + 1))
        expect((yield* core.listEvents(execution.id, 100, 5)).map((e) => e.seq)).toEqual([101, 102, 103, 104, 105])
        expect((yield* core.listEvents(execution.id, -3, 2)).map((e) => e.seq)).toEqual([1, 2])
        expect((yield* core.listEvents(execution.id, 0, 5000)).length).toBe(1000)
        expect((yield* core.listEvents(execution.id, Number.NaN, Number.NaN)).length).toBe(100)
        expect(yield* core.listEvents(execution.id, total, 10)).toEqual([])
      }))

    it.effect("every payload has sorted keys and is valid JSON", () =>
      Effect.gen(function*() {
        const { core, execution } = yield* Effect.gen(function*() {
          const core = yield* setup({ deadlineMs: 1_000_000, stage: "seed" }, POLICY)
          const { execution, lease } = yield* start(core)
          yield* core.submitStep(execution.id, lease, tool("web"))
          yield* core.submitStep(execution.id, lease, tool("rm"))
          const d = yield* core.submitStep(execution.id, lease, tool("send_email"))
          yield* core.grantApproval(d.approvalId!, { decidedBy: "alice", rationale: "r" })
          const [claim] = yield* core.claimDue(10)
          yield* core.recordDelivery(claim!, true)
          const l2 = { dispatchId: claim!.dispatchId, attempt: claim!.attempt }
          const s = yield* core.submitStep(execution.id, l2, tool("x"))
          yield* core.failStep(execution.id, s.stepId!, l2, "{\"z\":1,\"a\":2}")
          yield* core.cancelExecution(execution.id)
          return { core, execution }
        })
        const events = yield* core.eventLog(execution.id)
        expect(events.length).toBeGreaterThan(15)
        for (const e of events) {
          const keys = Object.keys(JSON.parse(e.payload))
          expect(keys).toEqual(keys.slice().sort())
        }
        expect(events.map((e) => e.seq)).toEqual(events.map((_, i) => i + 1))
      }))

    it.effect("deltas fan out per execution; a full 64-delta buffer drops new ones", () =>
      Effect.gen(function*() {
        const core = yield* setup()
        const a = yield* core.subscribeDeltas("e1")
        const b = yield* core.subscribeDeltas("e1")
        const other = yield* core.subscribeDeltas("e2")
        for (let i = 0; i < 70; i++) yield* core.publishDelta("e1", { stepId: "s", seq: i, data: "d" + i })
        const got = yield* Queue.clear(a)
        expect(got.map((d) => d.seq)).toEqual(Array.from({ length: 64 }, (_, i) => i))
        expect((yield* Queue.clear(b)).length).toBe(64)
        expect((yield* Queue.clear(other)).length).toBe(0)
        yield* core.publishDelta("e1", { stepId: "s", seq: 70, data: "x" })
        expect((yield* Queue.take(a)).seq).toBe(70)
      }))
  })

  describe("current stage: sessions and subagents (PROTOCOL-CURRENT C.4, C.5)", () => {
    const GATE = "default_action: allow\nrules:\n  - id: gate\n    when: { target: send_email }\n    then: { decision: require_approval }\n"
    const create = (core: Core.KernelCore, r: Partial<Parameters<Core.KernelCore["createExecution"]>[0]> = {}) =>
      core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined, ...r })
    const claimFor = (core: Core.KernelCore, id: string) =>
      Effect.map(core.claimDue(100), (claims) => {
        const claim = claims.find((c) => c.executionId === id)!
        return { dispatchId: claim.dispatchId, attempt: claim.attempt } as Core.Lease
      })

    it.effect("a session runs one at a time; state is kept for previousState, the head is the parent", () =>
      Effect.gen(function*() {
        const core = yield* setup({ stage: "current" })
        const first = yield* create(core, { session: "s", idempotencyKey: "k1" })
        const second = yield* create(core, { session: "s" })
        expect(first).toMatchObject({ status: "running", session: "s", idempotencyKey: "k1" })
        expect(second).toMatchObject({ status: "pending", session: "s" })
        expect(second.parentExecutionId).toBeUndefined()
        expect(yield* create(core, { session: "s", idempotencyKey: "k1", inputRaw: "1" })).toEqual(first)
        expect(yield* core.previousState(first.id)).toBe("null")
        const lease = yield* claimFor(core, first.id)
        yield* core.completeExecution(first.id, lease, "{\"out\":1}", "{ \"s\" : 1 }")
        expect(yield* core.getExecution(second.id)).toMatchObject({ status: "running", parentExecutionId: first.id })
        expect(yield* core.previousState(second.id)).toBe("{\"s\":1}")
        expect(yield* failure(core.previousState("0192f1a0-0000-7000-8000-000000000000"))).toEqual(NOT_FOUND)
        const page = yield* core.listExecutions({ agentId: "", status: "", cursor: undefined, limit: 0, session: "s" })
        expect(page.executions.map((e) => e.id)).toEqual([second.id, first.id])
        expect(yield* failure(create(core, { session: " " }))).toEqual({
          status: 400,
          code: "validation_error",
          message: "validation error: session must be a nonblank UTF-8 string of at most 256 bytes without NUL"
        })
      }))

    it.effect("suspendExecution blocks only while a child runs; the child's end settles the step and resumes", () =>
      Effect.gen(function*() {
        const core = yield* setup({ stage: "current" })
        const parent = yield* create(core)
        const lease = yield* claimFor(core, parent.id)
        const step = yield* core.submitStep(parent.id, lease, tool("delegate"))
        expect(yield* core.suspendExecution(parent.id, lease)).toBe(false)
        const child = yield* create(core, { spawnedBy: { executionId: parent.id, stepId: step.stepId! } })
        expect(child).toMatchObject({ status: "running", idempotencyKey: step.stepId })
        expect(yield* core.suspendExecution(parent.id, lease)).toBe(true)
        expect((yield* core.getExecution(parent.id)).status).toBe("blocked")
        expect(yield* failure(core.suspendExecution(parent.id, lease))).toEqual(LEASE_SUPERSEDED)
        const childLease = yield* claimFor(core, child.id)
        yield* core.completeExecution(child.id, childLease, "[1,2]")
        expect(yield* core.getStep(parent.id, step.stepId!)).toMatchObject({ status: "succeeded", resultRaw: "[1,2]" })
        expect(types(yield* core.eventLog(parent.id)).slice(-4)).toEqual([
          "execution.blocked",
          "step.succeeded",
          "execution.resumed",
          "dispatch.queued"
        ])
      }))

    it.effect("complete/fail of a step that is not executing is 409 conflict; the seed stage records it", () =>
      Effect.gen(function*() {
        for (const stage of ["current", "seed"] as const) {
          const core = yield* setup({ stage }, GATE)
          const { execution, lease } = yield* start(core)
          const gated = yield* core.submitStep(execution.id, lease, tool("send_email"))
          expect(gated.decision).toBe("blocked")
          const outcome = yield* Effect.result(core.completeStep(execution.id, gated.stepId!, lease, "1"))
          if (stage === "current") {
            expect(yield* failure(core.failStep(execution.id, gated.stepId!, lease, "{}"))).toEqual({
              status: 409,
              code: "conflict",
              message: "conflict: cannot record outcome for step in status awaiting_approval"
            })
            expect(outcome._tag).toBe("Failure")
            expect((yield* core.getStep(execution.id, gated.stepId!)).status).toBe("awaiting_approval")
          } else {
            expect(outcome._tag).toBe("Success")
            expect((yield* core.getStep(execution.id, gated.stepId!)).status).toBe("succeeded")
          }
        }
      }))
  })
})

const TestClockNow = Effect.clockWith((clock) => clock.currentTimeMillis)
