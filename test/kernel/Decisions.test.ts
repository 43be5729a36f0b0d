/**
 * The decision path of the current stage (PROTOCOL-CURRENT C.8), on the wire
 * through the kernel's routes: the submit order of C.8.1 (`resources`, kinds,
 * `args`, the indeterminate-retry guard), existing-step answers (C.8.2),
 * rate limits that refuse or park (C.8.3), how decisions are recorded
 * (C.8.4), token budgets and `usage` (C.8.5), `judge` rules (C.8.6) and
 * bundles refused at load. Each test checks the status, the exact JSON a
 * client reads and the events in order — and that refused input changed
 * nothing.
 */
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Deferred, Effect, Fiber, Option, Redacted } from "effect"
import { TestClock } from "effect/testing"
import { createHash } from "node:crypto"
import * as KernelConfig from "../../src/kernel/Config.js"
import * as Core from "../../src/kernel/Core.js"
import * as Usage from "../../src/kernel/internal/usage.js"
import * as Policy from "../../src/kernel/Policy.js"
import * as FakeOpenAi from "../support/fakeOpenAi.js"
import {
  claimNext,
  complete,
  decide,
  errorBody,
  type Harness,
  harness,
  loadPolicy,
  nothingDue,
  running,
  type Running,
  stepIdOf,
  submit,
  submitText,
  validationError
} from "../support/currentRoutes.js"

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const sha256 = (text: string): string => createHash("sha256").update(text, "utf8").digest("hex")


const fail = (h: Harness, run: Running, stepId: string, error: unknown) =>
  Effect.map(
    h.agent("hello", "POST", `/v0/executions/${run.id}/steps/${stepId}/fail`, JSON.stringify({ error }), run.lease),
    (res) => {
      expect(res.body).toBe("{\"decision\":\"recorded\"}\n")
    }
  )

interface WireEvent {
  readonly type: string
  readonly payload: Record<string, unknown>
}

/** The execution's events as `GET …/events` answers them. */
const events = (h: Harness, id: string) =>
  Effect.map(h.send("GET", `/v0/executions/${id}/events?limit=1000`), (res) => {
    expect(res.status).toBe(200)
    return (JSON.parse(res.body) ?? []) as ReadonlyArray<WireEvent>
  })

/** The events after the first `n`. */
const eventsAfter = (h: Harness, id: string, n: number) => Effect.map(events(h, id), (all) => all.slice(n))

const types = (list: ReadonlyArray<WireEvent>) => list.map((e) => e.type)

/** Retires the run's dispatch (its lease lapses) and claims the redelivery. */
const redeliver = (h: Harness, run: Running) =>
  Effect.gen(function*() {
    yield* h.core.expireLeases()
    return yield* claimNext(h, run.id)
  })

const stepsOf = (h: Harness, id: string) =>
  Effect.map(h.send("GET", `/v0/executions/${id}/steps`), (res) => {
    expect(res.status).toBe(200)
    return (JSON.parse(res.body) ?? []) as ReadonlyArray<Record<string, unknown>>
  })

const statusOf = (h: Harness, id: string) =>
  Effect.map(h.send("GET", `/v0/executions/${id}`), (res) => JSON.parse(res.body).status as string)

const decisionText = (d: Record<string, unknown>) => JSON.stringify(d) + "\n"

// ---------------------------------------------------------------------------
// C.8.1 Submit
// ---------------------------------------------------------------------------

describe("submit in the current stage (C.8.1)", () => {
  it.effect("`resources: []` is accepted; a declared key of a new step is unknown and changes nothing", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const run = yield* running(h)
      const first = { target: "web_search", args: { q: "a" }, resources: [] }
      const ok = yield* submit(h, run, first)
      expect(ok).toMatchObject({ status: 200 })
      expect(ok.body).toBe(decisionText({ decision: "proceed", step_id: stepIdOf(run, first) }))
      const before = yield* events(h, run.id)

      const declared = { target: "write_file", args: { path: "a" }, resources: ["workspace", "db"] }
      const refused = yield* submit(h, run, declared)
      expect(refused.status).toBe(400)
      expect(refused.body).toBe(validationError("validation error: unknown resource \"workspace\""))
      expect(yield* events(h, run.id)).toEqual(before)
      expect(yield* stepsOf(h, run.id)).toHaveLength(1)
      // the occurrence was not consumed: the same call without resources is occurrence 0
      const again = yield* decide(h, run, { ...declared, resources: [] })
      expect(again).toEqual({ decision: "proceed", step_id: stepIdOf(run, declared) })
      // an llm_call's declaration is ignored; a replayed step is answered before the check
      const llm = yield* decide(h, run, { kind: "llm_call", target: "gpt", args: { m: 1 }, resources: ["workspace"] })
      expect(llm.decision).toBe("proceed")
      yield* complete(h, run, stepIdOf(run, first), { hits: 1 })
      const replayRun = yield* redeliver(h, run)
      const replay = yield* decide(h, replayRun, { ...first, resources: ["workspace"] })
      expect(replay).toEqual({ decision: "replay", step_id: stepIdOf(run, first), result: { hits: 1 } })
    }))

  it.effect("`resources` must be a list of strings (null is none)", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const run = yield* running(h)
      for (const resources of ["workspace", [1], { a: 1 }, [["a"]]]) {
        const res = yield* submit(h, run, { target: "t", resources })
        expect(res.status).toBe(400)
        expect(res.body).toBe(validationError("validation error"))
      }
      expect(yield* events(h, run.id)).toHaveLength(3) // created, started, dispatch.queued
      expect((yield* decide(h, run, { target: "t", resources: null })).decision).toBe("proceed")
    }))

  it.effect("the seed stage does not know `resources` (strict decoding)", () =>
    Effect.gen(function*() {
      const h = yield* harness({}, { stage: "seed" })
      const run = yield* running(h)
      const res = yield* h.agentSha256(
        "hello",
        "POST",
        `/v0/executions/${run.id}/steps`,
        submitText({ target: "t", resources: [] }),
        run.lease
      )
      expect(res.status).toBe(400)
      expect(res.body).toBe(validationError("validation error"))
    }))

  it.effect("kinds other than tool_call, llm_call and local are refused before anything is looked up (C.15 #5)", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const run = yield* running(h)
      const before = yield* events(h, run.id)
      for (const kind of ["shell", "", "Tool_call"]) {
        const res = yield* submit(h, run, { kind, target: "t" })
        expect(res.status).toBe(400)
        expect(res.body).toBe(validationError(`validation error: unknown step kind ${JSON.stringify(kind)}`))
      }
      expect(yield* events(h, run.id)).toEqual(before)
      // decoding comes first: an unknown execution with a bad kind is a 400, not a 404
      const unknown = yield* h.agent(
        "hello",
        "POST",
        "/v0/executions/0192f1a0-0000-7000-8000-000000000000/steps",
        submitText({ kind: "shell", target: "t" }),
        run.lease
      )
      expect(unknown.status).toBe(400)
      for (const kind of ["tool_call", "llm_call", "local"]) {
        expect((yield* decide(h, run, { kind, target: "t" })).decision).toBe("proceed")
      }
      // the seed stage accepts any kind, as PROTOCOL 6.3 says
      const seed = yield* harness({}, { stage: "seed" })
      const seedRun = yield* running(seed)
      const res = yield* seed.agentSha256(
        "hello",
        "POST",
        `/v0/executions/${seedRun.id}/steps`,
        submitText({ kind: "shell", target: "t" }),
        seedRun.lease
      )
      expect(JSON.parse(res.body).decision).toBe("proceed")
    }))

  it.effect("an at_most_once step with an unknown outcome is not retried (__indeterminate_retry)", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const run = yield* running(h)
      const pay = { target: "pay", args: { amount: 5 }, idempotency: "at_most_once" }
      const first = yield* decide(h, run, pay)
      expect(first).toEqual({ decision: "proceed", step_id: stepIdOf(run, pay) })
      // the run crashes mid-body; the redelivered run finds the step executing
      const second = yield* redeliver(h, run)
      const seen = (yield* events(h, run.id)).length
      const orphan = yield* submit(h, second, pay)
      expect(orphan.body).toBe(
        decisionText({
          decision: "replay",
          step_id: stepIdOf(run, pay),
          error: {
            message: "outcome unknown: this may already have taken effect. Check the state before continuing.",
            reason: "indeterminate"
          }
        })
      )
      // the handler tries again: a new occurrence, refused by the guard and recorded like a denial
      const retry = yield* submit(h, second, pay)
      const retryId = stepIdOf(run, pay, 1)
      expect(retry.body).toBe(
        "{\"decision\":\"denied\",\"step_id\":\"" + retryId +
          "\",\"reason\":\"prior attempt outcome unknown; retry refused\",\"rule_id\":\"__indeterminate_retry\"}\n"
      )
      const after = yield* eventsAfter(h, run.id, seen)
      expect(after).toEqual([
        {
          ...after[0],
          type: "step.failed",
          payload: {
            error: {
              message: "outcome unknown: this may already have taken effect. Check the state before continuing.",
              reason: "indeterminate"
            },
            step_id: stepIdOf(run, pay),
            step_type: "tool_call",
            target: "pay"
          }
        },
        { ...after[1], type: "step.proposed", payload: { step_id: retryId, step_type: "tool_call", target: "pay" } },
        {
          ...after[2],
          type: "step.denied",
          payload: {
            error: { reason: "prior attempt outcome unknown; retry refused", rule_id: "__indeterminate_retry" },
            rule_id: "__indeterminate_retry",
            step_id: retryId,
            step_type: "tool_call",
            target: "pay"
          }
        }
      ])
      // safe_to_retry calls of the same target are not guarded
      expect((yield* decide(h, second, { ...pay, idempotency: "safe_to_retry" })).decision).toBe("proceed")
    }))
})

// ---------------------------------------------------------------------------
// C.8.2 Existing steps, C.8.4 recording
// ---------------------------------------------------------------------------

const GOVERNED = `default_action: allow
rules:
  - id: no-rm
    when: { target: rm }
    then: { decision: deny, reason: dangerous }
  - id: no-drop
    when: { target: drop }
    then: { decision: deny }
  - id: gate
    when: { target: send }
    then:
      decision: require_approval
      reason: mail leaves the house
      approval_config: { approvers: [alice], message: check the mail }
  - id: search
    when: { target: "web_*" }
    then: { decision: allow, reason: research is fine }
`

describe("recording decisions (C.8.4)", () => {
  it.effect("allow, deny and require_approval: answers, events with rule_id, reason and policy_hash", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* loadPolicy(h, "hello", GOVERNED)
      const hash = sha256(GOVERNED)
      const run = yield* running(h)
      const seen = (yield* events(h, run.id)).length

      const web = { target: "web_search", args: { q: 1 } }
      const webId = stepIdOf(run, web)
      expect((yield* submit(h, run, web)).body).toBe(decisionText({ decision: "proceed", step_id: webId }))
      const rm = { target: "rm", args: { path: "/" } }
      const rmId = stepIdOf(run, rm)
      expect((yield* submit(h, run, rm)).body).toBe(
        decisionText({ decision: "denied", step_id: rmId, reason: "dangerous", rule_id: "no-rm" })
      )
      const drop = { target: "drop", args: {} }
      const dropId = stepIdOf(run, drop)
      expect((yield* submit(h, run, drop)).body).toBe(
        decisionText({ decision: "denied", step_id: dropId, reason: "policy_denied", rule_id: "no-drop" })
      )
      const send = { target: "send", args: { to: "ops" } }
      const sendId = stepIdOf(run, send)
      const blocked = JSON.parse((yield* submit(h, run, send)).body)
      expect(Object.keys(blocked)).toEqual(["decision", "step_id", "approval_id"])
      expect(blocked).toMatchObject({ decision: "blocked", step_id: sendId })

      const after = yield* eventsAfter(h, run.id, seen)
      const step = (id: string, target: string) => ({ step_id: id, step_type: "tool_call", target })
      expect(after.map((e) => [e.type, e.payload])).toEqual([
        ["step.proposed", step(webId, "web_search")],
        ["step.allowed", { ...step(webId, "web_search"), rule_id: "search", reason: "research is fine", policy_hash: hash }],
        ["step.executing", step(webId, "web_search")],
        ["step.proposed", step(rmId, "rm")],
        [
          "step.denied",
          { ...step(rmId, "rm"), rule_id: "no-rm", error: { reason: "dangerous", rule_id: "no-rm" }, policy_hash: hash }
        ],
        ["step.proposed", step(dropId, "drop")],
        [
          "step.denied",
          {
            ...step(dropId, "drop"),
            rule_id: "no-drop",
            error: { reason: "policy_denied", rule_id: "no-drop" },
            policy_hash: hash
          }
        ],
        ["step.proposed", step(sendId, "send")],
        [
          "step.awaiting_approval",
          { ...step(sendId, "send"), rule_id: "gate", reason: "mail leaves the house", policy_hash: hash }
        ],
        [
          "approval.requested",
          { approval_id: blocked.approval_id, execution_id: run.id, status: "pending", step_id: sendId }
        ],
        ["execution.blocked", { execution_id: run.id, status: "blocked" }]
      ])
      // the raw payload keeps sorted keys
      const raw = yield* h.send("GET", `/v0/executions/${run.id}/events?after_seq=${seen + 1}&limit=1`)
      expect(raw.body).toContain(
        `"payload":{"policy_hash":"${hash}","reason":"research is fine","rule_id":"search","step_id":"${webId}","step_type":"tool_call","target":"web_search"}`
      )
      // the denied steps store the error a replay reads
      const steps = yield* stepsOf(h, run.id)
      expect(steps.find((s) => s.step_id === rmId)).toMatchObject({
        status: "denied",
        error: { reason: "dangerous", rule_id: "no-rm" }
      })
    }))

  it.effect("fixed rule ids: permissive, default, local, bundle-error", () =>
    Effect.gen(function*() {
      // permissive: no bundle, no reason, no hash
      const open = yield* harness()
      const openRun = yield* running(open)
      const seen = (yield* events(open, openRun.id)).length
      yield* decide(open, openRun, { target: "anything" })
      const allowed = (yield* eventsAfter(open, openRun.id, seen))[1]!
      expect(allowed.payload).toEqual({
        rule_id: "permissive",
        step_id: stepIdOf(openRun, { target: "anything" }),
        step_type: "tool_call",
        target: "anything"
      })

      // default deny / local / default allow
      const h = yield* harness()
      const denyAll = "default_action: deny\n"
      yield* loadPolicy(h, "hello", denyAll)
      yield* loadPolicy(h, "other", "default_action: allow\n")
      const run = yield* running(h)
      const start = (yield* events(h, run.id)).length
      const denied = yield* decide(h, run, { target: "x" })
      expect(denied).toEqual({
        decision: "denied",
        step_id: stepIdOf(run, { target: "x" }),
        reason: "no explicit allow rule matched",
        rule_id: "default"
      })
      yield* decide(h, run, { kind: "local", target: "now" })
      const recorded = yield* eventsAfter(h, run.id, start)
      expect(recorded[1]!.payload).toMatchObject({ rule_id: "default", policy_hash: sha256(denyAll) })
      expect(recorded[3]!.payload).toMatchObject({
        rule_id: "local",
        reason: "local step",
        policy_hash: sha256(denyAll)
      })
      const other = yield* running(h, "other")
      const otherStart = (yield* events(h, other.id)).length
      yield* decide(h, other, { target: "x" }, "other")
      expect((yield* eventsAfter(h, other.id, otherStart))[1]!.payload).toMatchObject({
        rule_id: "default",
        reason: "default allow",
        policy_hash: sha256("default_action: allow\n")
      })

      // a bundle stored under the seed stage that the current language refuses
      const old = yield* harness({}, { stage: "seed" })
      yield* loadPolicy(old, "hello", "rules:\n  - { id: a, priority: 1, then: { decision: allow } }\n")
      yield* old.core.updateSettings({ stage: "current" })
      const oldRun = yield* running(old)
      expect(yield* decide(old, oldRun, { target: "x" })).toEqual({
        decision: "denied",
        step_id: stepIdOf(oldRun, { target: "x" }),
        reason: "policy_bundle_invalid",
        rule_id: "bundle-error"
      })
      // and the other way round: a judge rule means nothing to the seed stage
      const fresh = yield* harness()
      yield* loadPolicy(fresh, "hello", "rules:\n  - { id: j, then: { decision: judge, judge: { instructions: x } } }\n")
      yield* fresh.core.updateSettings({ stage: "seed" })
      const seedRun = yield* running(fresh)
      const res = yield* fresh.agentSha256(
        "hello",
        "POST",
        `/v0/executions/${seedRun.id}/steps`,
        submitText({ target: "x" }),
        seedRun.lease
      )
      expect(res.body).toBe(
        decisionText({ decision: "denied", step_id: stepIdOf(seedRun, { target: "x" }), reason: "policy_bundle_invalid" })
      )
    }))
})

describe("existing steps (C.8.2)", () => {
  it.effect("every answer carries step_id; a replayed denial carries its reason and rule_id", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* loadPolicy(h, "hello", GOVERNED)
      const run = yield* running(h)
      const web = { target: "web_search", args: { q: 1 } }
      const flaky = { target: "web_flaky", args: {} }
      const slow = { target: "web_slow", args: {} }
      const rm = { target: "rm", args: {} }
      const drop = { target: "drop", args: {} }
      const send = { target: "send", args: {} }
      yield* decide(h, run, web)
      yield* complete(h, run, stepIdOf(run, web), { hits: 3 })
      yield* decide(h, run, flaky)
      yield* fail(h, run, stepIdOf(run, flaky), { message: "boom" })
      yield* decide(h, run, slow)
      yield* decide(h, run, rm)
      yield* decide(h, run, drop)
      const blocked = yield* decide(h, run, send)
      // a human denies the approval: the step is denied with the rationale, no rule
      const deny = yield* h.send("POST", `/v0/approvals/${blocked.approval_id}/deny`, {
        body: JSON.stringify({ decided_by: "alice", rationale: "not today" })
      })
      expect(deny.status).toBe(204)

      const next = yield* claimNext(h, run.id)
      const seen = (yield* events(h, run.id)).length
      const answers = []
      for (const s of [web, flaky, slow, rm, drop, send]) answers.push((yield* submit(h, next, s)).body)
      expect(answers).toEqual([
        decisionText({ decision: "replay", step_id: stepIdOf(run, web), result: { hits: 3 } }),
        decisionText({ decision: "replay", step_id: stepIdOf(run, flaky), error: { message: "boom" } }),
        decisionText({ decision: "proceed", step_id: stepIdOf(run, slow) }),
        decisionText({ decision: "denied", step_id: stepIdOf(run, rm), reason: "dangerous", rule_id: "no-rm" }),
        decisionText({ decision: "denied", step_id: stepIdOf(run, drop), reason: "policy_denied", rule_id: "no-drop" }),
        decisionText({ decision: "denied", step_id: stepIdOf(run, send), reason: "not today" })
      ])
      // replays write nothing (an executing safe_to_retry step proceeds again silently)
      expect(yield* eventsAfter(h, run.id, seen)).toEqual([])
    }))
})

// ---------------------------------------------------------------------------
// C.8.3 Rate limits
// ---------------------------------------------------------------------------

const limited = (options: string) => `default_action: allow
rules:
  - id: pace
    when: { target: "api_*" }
    then:
      decision: allow
      rate_limit: { max_calls: 1, window: 1m${options} }
`

describe("rate limits (C.8.3)", () => {
  it.effect("without max_wait: refused, a step.rate_limited event, no step, the occurrence not consumed", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* loadPolicy(h, "hello", limited(""))
      const run = yield* running(h)
      const first = { target: "api_call", args: { n: 1 } }
      const second = { target: "api_call", args: { n: 2 } }
      yield* decide(h, run, first)
      const seen = (yield* events(h, run.id)).length
      const refused = yield* submit(h, run, second)
      expect(refused.body).toBe("{\"decision\":\"rate_limited\",\"reason\":\"rate_limit_exceeded\"}\n")
      const after = yield* eventsAfter(h, run.id, seen)
      expect(after.map((e) => [e.type, e.payload])).toEqual([[
        "step.rate_limited",
        {
          error: { reason: "rate_limit_exceeded", rule_id: "pace" },
          rule_id: "pace",
          step_id: stepIdOf(run, second),
          step_type: "tool_call",
          target: "api_call"
        }
      ]])
      expect(yield* stepsOf(h, run.id)).toHaveLength(1)
      expect(yield* statusOf(h, run.id)).toBe("running")
      // a minute later the same call gets the id it would have had
      yield* TestClock.adjust("1 minute")
      expect(yield* decide(h, run, second)).toEqual({ decision: "proceed", step_id: stepIdOf(run, second) })
    }))

  it.effect("with max_wait: the execution parks, stays running and is redelivered after the wait; it parks once", () =>
    Effect.gen(function*() {
      const h = yield* harness({}, { random: () => 0 })
      yield* loadPolicy(h, "hello", limited(", max_wait: 2m"))
      const run = yield* running(h)
      yield* decide(h, run, { target: "api_a" })
      const seen = (yield* events(h, run.id)).length
      const next = { target: "api_b", args: { page: 2 } }
      const parked = yield* submit(h, run, next)
      expect(parked.body).toBe("{\"decision\":\"blocked\",\"reason\":\"rate_limit_exceeded\"}\n")
      const after = yield* eventsAfter(h, run.id, seen)
      expect(types(after)).toEqual(["step.rate_limited", "dispatch.queued"])
      expect(after[0]!.payload).toEqual({
        error: { reason: "rate_limit_exceeded", rule_id: "pace" },
        rule_id: "pace",
        step_id: stepIdOf(run, next),
        step_type: "tool_call",
        target: "api_b"
      })
      expect(yield* statusOf(h, run.id)).toBe("running")
      expect(yield* stepsOf(h, run.id)).toHaveLength(1)
      // the parked run's lease is gone
      const beat = yield* h.agent("hello", "POST", `/v0/executions/${run.id}/heartbeat`, "", run.lease)
      expect(beat.status).toBe(409)
      expect(beat.body).toBe(errorBody("lease_superseded", "dispatch lease superseded"))
      // the new dispatch is due after the limiter's estimate (no jitter here): one minute
      yield* TestClock.adjust("59999 millis")
      yield* nothingDue(h, run.id)
      yield* TestClock.adjust("1 millis")
      const resumed = yield* claimNext(h, run.id)
      expect(after[1]!.payload).toMatchObject({
        dispatch_id: resumed.lease["Rebuno-Dispatch-Id"],
        status: "pending",
        attempt: 0
      })
      // the rerun resubmits and gets the same step id
      yield* decide(h, resumed, { target: "api_a" })
      expect(yield* decide(h, resumed, next)).toEqual({ decision: "proceed", step_id: stepIdOf(run, next) })
      // over the limit again: this execution already parked, so it is refused
      const again = yield* submit(h, resumed, { target: "api_c" })
      expect(again.body).toBe("{\"decision\":\"rate_limited\",\"reason\":\"rate_limit_exceeded\"}\n")
      expect(yield* statusOf(h, run.id)).toBe("running")
    }))

  it.effect("the wait has jitter up to half the estimate, capped at max_wait; a longer estimate is refused", () =>
    Effect.gen(function*() {
      const h = yield* harness({}, { random: () => 0.999 })
      yield* loadPolicy(h, "hello", limited(", max_wait: 70s"))
      const run = yield* running(h)
      yield* decide(h, run, { target: "api_a" })
      expect((yield* submit(h, run, { target: "api_b" })).body).toBe(
        "{\"decision\":\"blocked\",\"reason\":\"rate_limit_exceeded\"}\n"
      )
      // 60 s + 29.97 s of jitter, capped at 70 s
      yield* TestClock.adjust("69999 millis")
      yield* nothingDue(h, run.id)
      yield* TestClock.adjust("1 millis")
      yield* claimNext(h, run.id)

      const short = yield* harness()
      yield* loadPolicy(short, "hello", limited(", max_wait: 10s"))
      const shortRun = yield* running(short)
      yield* decide(short, shortRun, { target: "api_a" })
      const seen = (yield* events(short, shortRun.id)).length
      expect((yield* submit(short, shortRun, { target: "api_b" })).body).toBe(
        "{\"decision\":\"rate_limited\",\"reason\":\"rate_limit_exceeded\"}\n"
      )
      expect(types(yield* eventsAfter(short, shortRun.id, seen))).toEqual(["step.rate_limited"])
    }))

  it.effect("per_what: execution, agent, global and session scopes", () =>
    Effect.gen(function*() {
      const scoped = (perWhat: string) =>
        Effect.gen(function*() {
          const h = yield* harness()
          const bundle = limited(`, per_what: ${perWhat}`).replace("window: 1m", "window: 1h")
          yield* loadPolicy(h, "hello", bundle)
          yield* loadPolicy(h, "other", bundle)
          return h
        })
      const outcome = (h: Harness, run: Running, agentId = "hello") =>
        Effect.map(decide(h, run, { target: "api_x" }, agentId), (d) => d.decision)

      const execution = yield* scoped("execution")
      const e1 = yield* running(execution)
      const e2 = yield* running(execution)
      expect([yield* outcome(execution, e1), yield* outcome(execution, e1), yield* outcome(execution, e2)]).toEqual([
        "proceed",
        "rate_limited",
        "proceed"
      ])

      const agent = yield* scoped("agent")
      const a1 = yield* running(agent)
      const a2 = yield* running(agent)
      const a3 = yield* running(agent, "other")
      expect([yield* outcome(agent, a1), yield* outcome(agent, a2), yield* outcome(agent, a3, "other")]).toEqual([
        "proceed",
        "rate_limited",
        "proceed"
      ])

      const global = yield* scoped("global")
      const g1 = yield* running(global)
      const g2 = yield* running(global, "other")
      expect([yield* outcome(global, g1), yield* outcome(global, g2, "other")]).toEqual(["proceed", "rate_limited"])

      const session = yield* scoped("session")
      const inSession = (label: string) =>
        Effect.gen(function*() {
          const res = yield* session.send("POST", "/v0/executions", {
            body: JSON.stringify({ agent_id: "hello", input: {}, session: label })
          })
          expect(res.status).toBe(201)
          return JSON.parse(res.body).id as string
        })
      const s1 = yield* inSession("chat:1")
      const s1Run = yield* claimNext(session, s1)
      expect(yield* outcome(session, s1Run)).toBe("proceed")
      const done = yield* session.agent("hello", "POST", `/v0/executions/${s1}/complete`, "{\"output\":1}", s1Run.lease)
      expect(done.status).toBe(204)
      // the next execution of the session shares the bucket; another session does not
      const s2 = yield* inSession("chat:1")
      expect(yield* outcome(session, yield* claimNext(session, s2))).toBe("rate_limited")
      const s3 = yield* inSession("chat:2")
      expect(yield* outcome(session, yield* claimNext(session, s3))).toBe("proceed")
      // without a session, per_what session is the execution's own bucket
      const loose = yield* running(session)
      expect([yield* outcome(session, loose), yield* outcome(session, loose)]).toEqual(["proceed", "rate_limited"])
    }))

  it.effect("a limiter error lets the step through, unless on_limiter_error: deny (rate_limiter_unavailable)", () =>
    Effect.gen(function*() {
      const h = yield* harness({}, { limiterError: true })
      yield* loadPolicy(
        h,
        "hello",
        `rules:
  - { id: open, when: { target: open }, then: { decision: allow, rate_limit: { max_calls: 1, window: 1m } } }
  - id: strict
    when: { target: strict }
    then: { decision: allow, rate_limit: { max_calls: 1, window: 1m, max_wait: 5m, on_limiter_error: deny } }
`
      )
      const run = yield* running(h)
      expect((yield* decide(h, run, { target: "open" })).decision).toBe("proceed")
      expect((yield* decide(h, run, { target: "open", args: { again: true } })).decision).toBe("proceed")
      const seen = (yield* events(h, run.id)).length
      const refused = yield* submit(h, run, { target: "strict" })
      expect(refused.body).toBe("{\"decision\":\"rate_limited\",\"reason\":\"rate_limiter_unavailable\"}\n")
      expect((yield* eventsAfter(h, run.id, seen)).map((e) => [e.type, e.payload])).toEqual([[
        "step.rate_limited",
        {
          error: { reason: "rate_limiter_unavailable", rule_id: "strict" },
          rule_id: "strict",
          step_id: stepIdOf(run, { target: "strict" }),
          step_type: "tool_call",
          target: "strict"
        }
      ]])
    }))
})

// ---------------------------------------------------------------------------
// C.8.5 Usage and token budgets
// ---------------------------------------------------------------------------

/** An `llm_call` result as the SDK records it: the provider's answer text in `body`. */
const llmResult = (body: string) => ({ status: 200, headers: { "content-type": "application/json" }, body })

describe("usage of llm_call steps (C.8.5)", () => {
  it.effect("step.succeeded carries the usage of an llm_call result; other steps and results without usage do not", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const run = yield* running(h)
      const llm = { kind: "llm_call", target: "gpt-4o", args: { messages: [] } }
      const tool = { target: "echo", args: {} }
      const bare = { kind: "llm_call", target: "gpt-4o", args: { n: 2 } }
      yield* decide(h, run, llm)
      yield* decide(h, run, tool)
      yield* decide(h, run, bare)
      const seen = (yield* events(h, run.id)).length
      const answer = FakeOpenAi.completionText("gpt-4o", "hi")
      yield* complete(h, run, stepIdOf(run, llm), llmResult(answer))
      yield* complete(h, run, stepIdOf(run, tool), llmResult(answer))
      yield* complete(h, run, stepIdOf(run, bare), { text: "no usage here" })
      const after = yield* eventsAfter(h, run.id, seen)
      expect(after.map((e) => [e.type, e.payload])).toEqual([
        [
          "step.succeeded",
          {
            step_id: stepIdOf(run, llm),
            step_type: "llm_call",
            target: "gpt-4o",
            usage: { input_tokens: 3, output_tokens: 5 }
          }
        ],
        ["step.succeeded", { step_id: stepIdOf(run, tool), step_type: "tool_call", target: "echo" }],
        ["step.succeeded", { step_id: stepIdOf(run, bare), step_type: "llm_call", target: "gpt-4o" }]
      ])
    }))

  it("reads JSON or SSE, in `body` or the result itself, every known key, the maximum per direction", () => {
    expect(Usage.extract(JSON.stringify({ usage: { prompt_tokens: 12, completion_tokens: 7 } }))).toEqual({
      inputTokens: 12,
      outputTokens: 7
    })
    // Anthropic, Gemini, Ollama and camelCase keys, nested anywhere
    expect(Usage.extract(JSON.stringify({ body: JSON.stringify({ usage: { input_tokens: 4, output_tokens: 9 } }) })))
      .toEqual({ inputTokens: 4, outputTokens: 9 })
    expect(
      Usage.extract(JSON.stringify({ usageMetadata: { promptTokenCount: 8, candidatesTokenCount: 2, totalTokenCount: 10 } }))
    ).toEqual({ inputTokens: 8, outputTokens: 2 })
    expect(Usage.extract(JSON.stringify({ prompt_eval_count: 26, eval_count: 290 }))).toEqual({
      inputTokens: 26,
      outputTokens: 290
    })
    expect(Usage.extract(JSON.stringify([{ a: { inputTokens: 1 } }, { b: [{ outputTokens: 6 }] }]))).toEqual({
      inputTokens: 1,
      outputTokens: 6
    })
    // an SSE stream: every data line that is JSON; the maximum per direction wins
    const sse = [
      "event: message_start",
      `data: ${JSON.stringify({ type: "message_start", message: { usage: { input_tokens: 25, output_tokens: 1 } } })}`,
      "",
      "data: not json",
      `data: ${JSON.stringify({ type: "message_delta", usage: { output_tokens: 15 } })}`,
      "data: [DONE]",
      ""
    ].join("\n")
    expect(Usage.extract(JSON.stringify(llmResult(sse)))).toEqual({ inputTokens: 25, outputTokens: 15 })
    const openAiStream = FakeOpenAi.streamText("gpt", "hello") // no usage chunk
    expect(Usage.extract(JSON.stringify(llmResult(openAiStream)))).toBeUndefined()
    // numbers only; zero usage is no usage; no result, no usage
    expect(Usage.extract(JSON.stringify({ prompt_tokens: "12", completion_tokens: "3" }))).toBeUndefined()
    expect(Usage.extract(JSON.stringify({ prompt_tokens: 0, completion_tokens: 0 }))).toBeUndefined()
    expect(Usage.extract(JSON.stringify({ prompt_tokens: 0, completion_tokens: 4 }))).toEqual({
      inputTokens: 0,
      outputTokens: 4
    })
    expect(Usage.extract(undefined)).toBeUndefined()
    expect(Usage.extract("null")).toBeUndefined()
    // an empty `body` means the result itself is read
    expect(Usage.extract(JSON.stringify({ body: "", usage: { input_tokens: 2 } }))).toEqual({
      inputTokens: 2,
      outputTokens: 0
    })
  })
})

const BUDGET = (options: string) => `default_action: allow
rules:
  - id: llm
    when: { step_kind: llm_call }
    then:
      decision: allow
      budget: { max_tokens: 30${options} }
`

describe("token budgets (C.8.5)", () => {
  it.effect("once the execution's tokens reach max_tokens, an allow becomes a denial (or an approval)", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const bundle = BUDGET("")
      yield* loadPolicy(h, "hello", bundle)
      const run = yield* running(h)
      const first = { kind: "llm_call", target: "gpt", args: { turn: 1 } }
      const second = { kind: "llm_call", target: "gpt", args: { turn: 2 } }
      yield* decide(h, run, first)
      // a step in flight has no usage yet: still allowed; the one that crosses the limit still runs
      expect((yield* decide(h, run, second)).decision).toBe("proceed")
      yield* complete(h, run, stepIdOf(run, first), llmResult(JSON.stringify({ usage: { input_tokens: 20, output_tokens: 10 } })))
      const seen = (yield* events(h, run.id)).length
      const third = { kind: "llm_call", target: "gpt", args: { turn: 3 } }
      const denied = yield* submit(h, run, third)
      expect(denied.body).toBe(
        decisionText({
          decision: "denied",
          step_id: stepIdOf(run, third),
          reason: "execution_token_budget_exceeded",
          rule_id: "llm"
        })
      )
      expect((yield* eventsAfter(h, run.id, seen))[1]).toMatchObject({
        type: "step.denied",
        payload: {
          error: { reason: "execution_token_budget_exceeded", rule_id: "llm" },
          rule_id: "llm",
          policy_hash: sha256(bundle)
        }
      })
      // tools are not under this rule
      expect((yield* decide(h, run, { target: "echo" })).decision).toBe("proceed")

      const gated = yield* harness()
      yield* loadPolicy(gated, "hello", BUDGET(", on_exceed: require_approval"))
      const gatedRun = yield* running(gated)
      yield* decide(gated, gatedRun, first)
      yield* complete(gated, gatedRun, stepIdOf(gatedRun, first), llmResult(JSON.stringify({ eval_count: 31 })))
      const before = (yield* events(gated, gatedRun.id)).length
      const blocked = yield* decide(gated, gatedRun, second)
      expect(blocked).toMatchObject({ decision: "blocked", step_id: stepIdOf(gatedRun, second) })
      expect(typeof blocked.approval_id).toBe("string")
      const after = yield* eventsAfter(gated, gatedRun.id, before)
      expect(types(after)).toEqual(["step.proposed", "step.awaiting_approval", "approval.requested", "execution.blocked"])
      expect(after[1]!.payload).toMatchObject({ rule_id: "llm", reason: "execution_token_budget_exceeded" })
    }))

  it.effect("scope session sums every execution of the session; scope execution does not", () =>
    Effect.gen(function*() {
      const withScope = (scope: string) =>
        Effect.gen(function*() {
          const h = yield* harness()
          yield* loadPolicy(h, "hello", BUDGET(`, scope: ${scope}`))
          const create = Effect.gen(function*() {
            const res = yield* h.send("POST", "/v0/executions", {
              body: JSON.stringify({ agent_id: "hello", input: {}, session: "chat:7" })
            })
            return JSON.parse(res.body).id as string
          })
          const firstId = yield* create
          const first = yield* claimNext(h, firstId)
          const call = { kind: "llm_call", target: "gpt", args: { turn: 1 } }
          yield* decide(h, first, call)
          yield* complete(h, first, stepIdOf(first, call), llmResult(JSON.stringify({ prompt_tokens: 25, completion_tokens: 5 })))
          const done = yield* h.agent("hello", "POST", `/v0/executions/${firstId}/complete`, "{\"output\":1}", first.lease)
          expect(done.status).toBe(204)
          const secondId = yield* create
          const second = yield* claimNext(h, secondId)
          return (yield* decide(h, second, call)).decision
        })
      expect(yield* withScope("session")).toBe("denied")
      expect(yield* withScope("execution")).toBe("proceed")
    }))
})

// ---------------------------------------------------------------------------
// C.8.6 Judge rules
// ---------------------------------------------------------------------------

const JUDGED = `default_action: deny
rules:
  - id: deploys
    when: { target: deploy }
    then:
      decision: judge
      judge: { instructions: "Allow staging deploys; production needs a human." }
  - id: strict
    when: { target: drop }
    then:
      decision: judge
      judge: { instructions: "Never drop data.", threshold: 0.9, fallback: deny }
`

const fixedJudge = (
  scores: Policy.JudgeScores,
  asked: Array<Policy.JudgeRequest> = []
): Policy.Judge => ({
  ask: (request) =>
    Effect.sync(() => {
      asked.push(request)
      return scores
    })
})

describe("judge rules (C.8.6)", () => {
  it.effect("without a judge configured a judge rule denies: judge not configured", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* loadPolicy(h, "hello", JUDGED)
      const run = yield* running(h)
      const seen = (yield* events(h, run.id)).length
      const res = yield* submit(h, run, { target: "deploy", args: { env: "prod" } })
      const stepId = stepIdOf(run, { target: "deploy", args: { env: "prod" } })
      expect(res.body).toBe(
        decisionText({ decision: "denied", step_id: stepId, reason: "judge not configured", rule_id: "deploys" })
      )
      expect((yield* eventsAfter(h, run.id, seen)).map((e) => e.payload)).toEqual([
        { step_id: stepId, step_type: "tool_call", target: "deploy" },
        {
          error: { reason: "judge not configured", rule_id: "deploys" },
          policy_hash: sha256(JUDGED),
          rule_id: "deploys",
          step_id: stepId,
          step_type: "tool_call",
          target: "deploy"
        }
      ])
    }))

  it.effect("the judge's top decision stands at the threshold: an ordinary answer with the rule's id", () =>
    Effect.gen(function*() {
      const asked: Array<Policy.JudgeRequest> = []
      const h = yield* harness({}, { judge: fixedJudge({ allow: 0.91, deny: 0.04, requireApproval: 0.05 }, asked) })
      yield* loadPolicy(h, "hello", JUDGED)
      const run = yield* running(h)
      const seen = (yield* events(h, run.id)).length
      const call = { target: "deploy", args: { env: "staging" } }
      expect(yield* decide(h, run, call)).toEqual({ decision: "proceed", step_id: stepIdOf(run, call) })
      expect(asked).toEqual([{
        executionId: run.id,
        agentId: "hello",
        kind: "tool_call",
        target: "deploy",
        argsRaw: "{\"env\":\"staging\"}",
        instructions: "Allow staging deploys; production needs a human.",
        ruleId: "deploys"
      }])
      const after = yield* eventsAfter(h, run.id, seen)
      expect(types(after)).toEqual(["step.proposed", "step.allowed", "step.executing"])
      expect(after[1]!.payload).toMatchObject({
        rule_id: "deploys",
        reason: "judge: allow 0.91",
        policy_hash: sha256(JUDGED)
      })
      // a replay never asks again
      const rerun = yield* redeliver(h, run)
      yield* decide(h, rerun, call)
      expect(asked).toHaveLength(1)
    }))

  it.effect("below the threshold the fallback applies; a failing judge gives the fallback too", () =>
    Effect.gen(function*() {
      const h = yield* harness({}, { judge: fixedJudge({ allow: 0.55, deny: 0.25, requireApproval: 0.2 }) })
      yield* loadPolicy(h, "hello", JUDGED)
      const run = yield* running(h)
      const drop = { target: "drop", args: { table: "users" } }
      expect(yield* decide(h, run, drop)).toEqual({
        decision: "denied",
        step_id: stepIdOf(run, drop),
        reason: "judge: allow 0.55 below threshold 0.90",
        rule_id: "strict"
      })
      const seen = (yield* events(h, run.id)).length
      const deploy = { target: "deploy", args: { env: "prod" } }
      const blocked = yield* decide(h, run, deploy)
      expect(blocked).toMatchObject({ decision: "blocked", step_id: stepIdOf(run, deploy) })
      const after = yield* eventsAfter(h, run.id, seen)
      expect(types(after)).toEqual(["step.proposed", "step.awaiting_approval", "approval.requested", "execution.blocked"])
      expect(after[1]!.payload).toMatchObject({ rule_id: "deploys", reason: "judge: allow 0.55 below threshold 0.60" })

      const broken = yield* harness({}, {
        judge: { ask: () => Effect.fail(new Policy.JudgeError({ message: "HTTP 503" })) }
      })
      yield* loadPolicy(broken, "hello", JUDGED)
      const brokenRun = yield* running(broken)
      expect(yield* decide(broken, brokenRun, drop)).toEqual({
        decision: "denied",
        step_id: stepIdOf(brokenRun, drop),
        reason: "judge unavailable: HTTP 503",
        rule_id: "strict"
      })
      const dying = yield* harness({}, { judge: { ask: () => Effect.die(new Error("judge crashed")) } })
      yield* loadPolicy(dying, "hello", JUDGED)
      const dyingRun = yield* running(dying)
      expect((yield* decide(dying, dyingRun, drop)).reason).toBe("judge unavailable: judge crashed")
    }))

  it.effect("the judge is asked between two halves: what happens meanwhile counts (a cancel wins)", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const judge: Policy.Judge = {
        ask: () => Effect.as(Deferred.await(gate), { allow: 1, deny: 0, requireApproval: 0 })
      }
      const h = yield* harness({}, { judge })
      yield* loadPolicy(h, "hello", JUDGED)
      const run = yield* running(h)
      const seen = (yield* events(h, run.id)).length
      const pending = yield* Effect.forkChild(submit(h, run, { target: "deploy" }))
      yield* Effect.yieldNow
      const cancel = yield* h.send("POST", `/v0/executions/${run.id}/cancel`)
      expect(cancel.status).toBe(204)
      yield* Deferred.succeed(gate, undefined)
      const answer = yield* Fiber.join(pending)
      expect(answer.body).toBe("{\"decision\":\"execution_terminal\"}\n")
      expect(types(yield* eventsAfter(h, run.id, seen))).toEqual(["execution.cancelled"])
      expect(yield* stepsOf(h, run.id)).toEqual([])

      // through the synchronous path (the test kit's direct client) a judge that answers at once decides
      const sync = yield* harness({}, { judge: fixedJudge({ allow: 0, deny: 0.95, requireApproval: 0.05 }) })
      yield* loadPolicy(sync, "hello", JUDGED)
      const syncRun = yield* running(sync)
      const decision = sync.core.unsafeSubmitStep(0, syncRun.id, {
        dispatchId: syncRun.lease["Rebuno-Dispatch-Id"]!,
        attempt: Number(syncRun.lease["Rebuno-Dispatch-Attempt"])
      }, { kind: "tool_call", target: "deploy", argsRaw: "{}", idempotency: "" })
      expect(decision).toMatchObject({ decision: "denied", reason: "judge: deny 0.95", ruleId: "deploys" })
      // … and one that must wait gives the fallback
      const slow = yield* harness({}, { judge: { ask: () => Effect.never } })
      yield* loadPolicy(slow, "hello", JUDGED)
      const slowRun = yield* running(slow)
      const fallback = slow.core.unsafeSubmitStep(0, slowRun.id, {
        dispatchId: slowRun.lease["Rebuno-Dispatch-Id"]!,
        attempt: Number(slowRun.lease["Rebuno-Dispatch-Attempt"])
      }, { kind: "tool_call", target: "drop", argsRaw: "{}", idempotency: "" })
      expect(fallback).toMatchObject({
        decision: "denied",
        reason: "judge unavailable: the judge did not answer synchronously",
        ruleId: "strict"
      })
    }))

  it.effect("the kernel configuration names the judge: REBUNO_JUDGE_URL, _MODEL, _API_KEY, _TIMEOUT", () =>
    Effect.gen(function*() {
      const read = (env: Record<string, string>) =>
        KernelConfig.kernelConfig.pipe(
          Effect.provideService(
            ConfigProvider.ConfigProvider,
            ConfigProvider.fromUnknown(env, { preserveEmptyStrings: true })
          ),
          Effect.map((config) => config.judge)
        )
      expect(yield* read({})).toEqual(Option.none())
      expect(yield* read({ REBUNO_JUDGE_URL: " " })).toEqual(Option.none())
      const defaults = Option.getOrThrow(yield* read({ REBUNO_JUDGE_URL: "http://localhost:11434/v1" }))
      expect(defaults).toEqual({ url: "http://localhost:11434/v1", model: "gpt-4o-mini", apiKey: undefined, timeoutMs: 10_000 })
      const full = Option.getOrThrow(
        yield* read({
          REBUNO_JUDGE_URL: "https://api.openai.com/v1",
          REBUNO_JUDGE_MODEL: "gpt-4.1",
          REBUNO_JUDGE_API_KEY: "sk-test",
          REBUNO_JUDGE_TIMEOUT: "3s"
        })
      )
      expect({ ...full, apiKey: full.apiKey === undefined ? undefined : Redacted.value(full.apiKey) }).toEqual({
        url: "https://api.openai.com/v1",
        model: "gpt-4.1",
        apiKey: "sk-test",
        timeoutMs: 3_000
      })
      expect(String(full.apiKey)).not.toContain("sk-test")
      const bad = yield* Effect.result(read({ REBUNO_JUDGE_URL: "http://x", REBUNO_JUDGE_TIMEOUT: "3" }))
      expect(bad._tag).toBe("Failure")
    }))

  it.live("openAiJudge asks an OpenAI-compatible endpoint and reads the probabilities", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: "{\"allow\": 0.2, \"deny\": 0.7, \"require_approval\": 0.1}" })
      const judge = Policy.openAiJudge({ url: fake.url, model: "judge-1" })
      const request: Policy.JudgeRequest = {
        executionId: "0192f1a0-0000-7000-8000-000000000000",
        agentId: "hello",
        kind: "tool_call",
        target: "deploy",
        argsRaw: "{\"env\":\"prod\"}",
        instructions: "Production needs a human.",
        ruleId: "deploys"
      }
      expect(yield* judge.ask(request)).toEqual({ allow: 0.2, deny: 0.7, requireApproval: 0.1 })
      const sent = fake.requests[0] as {
        readonly model: string
        readonly temperature: number
        readonly messages: ReadonlyArray<{ readonly role: string; readonly content: string }>
      }
      expect(sent.model).toBe("judge-1")
      expect(sent.temperature).toBe(0)
      expect(sent.messages[0]!.content).toContain("Production needs a human.")
      expect(JSON.parse(sent.messages[1]!.content)).toEqual({
        agent_id: "hello",
        kind: "tool_call",
        target: "deploy",
        args: { env: "prod" }
      })
      // the arguments go as recorded, however deep the kernel let them be (10,000 levels)
      const deepArgs = "{\"a\":" + "[".repeat(9_998) + "1" + "]".repeat(9_998) + "}"
      expect(yield* judge.ask({ ...request, argsRaw: deepArgs })).toEqual({ allow: 0.2, deny: 0.7, requireApproval: 0.1 })
      expect((fake.requests[1] as typeof sent).messages[1]!.content).toBe(
        "{\"agent_id\":\"hello\",\"kind\":\"tool_call\",\"target\":\"deploy\",\"args\":" + deepArgs + "}"
      )
      // a fenced answer is read too; an answer without probabilities and an error status are failures
      fake.reply = "```json\n{\"allow\": 1}\n```"
      expect(yield* judge.ask(request)).toEqual({ allow: 1, deny: 0, requireApproval: 0 })
      fake.reply = "I think it is fine."
      expect((yield* Effect.flip(judge.ask(request))).message).toBe("the answer holds no decision probabilities")
      fake.mode = "error"
      fake.errorStatus = 500
      expect((yield* Effect.flip(judge.ask(request))).message).toBe("HTTP 500")
      // unreachable
      const closed = Policy.openAiJudge({ url: "http://127.0.0.1:1/v1", model: "m", timeoutMs: 2_000 })
      expect((yield* Effect.flip(closed.ask(request)))._tag).toBe("JudgeError")
    }))
})

// ---------------------------------------------------------------------------
// Loading bundles
// ---------------------------------------------------------------------------

describe("loading bundles in the current stage", () => {
  it.effect("POST /v0/policies refuses a bundle the current language rejects, and nothing changes", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const good = "default_action: allow\nrules:\n  - { id: no-rm, when: { target: rm }, then: { decision: deny } }\n"
      yield* loadPolicy(h, "hello", good)
      const cases: ReadonlyArray<readonly [string, string]> = [
        [
          "rules:\n  - { id: a, priority: 1, then: { decision: allow } }\n",
          "rule \"a\": unknown key \"priority\" (rules are evaluated in file order; remove priority and order the rules instead)"
        ],
        [
          "rules:\n  - { id: a, then: { decision: allow } }\n  - { id: a, then: { decision: deny } }\n",
          "duplicate rule id \"a\" (rule ids must be unique)"
        ],
        ["rules:\n  - { id: a, when: { target: \"[x\" }, then: { decision: allow } }\n", "rule \"a\": when.target: malformed glob \"[x\": unclosed character class"],
        ["version: 2\n", "bundle: unknown key \"version\""]
      ]
      for (const [bundle, detail] of cases) {
        const res = yield* h.send("POST", "/v0/policies/hello", { body: JSON.stringify({ bundle }) })
        expect(res.status).toBe(400)
        expect(res.body).toBe(validationError("load policy bundle: validation error: invalid policy bundle: " + detail))
      }
      const agent = yield* h.core.getAgent("hello")
      expect(agent.policyBundle).toBe(good)
      const run = yield* running(h)
      expect(yield* decide(h, run, { target: "rm" })).toMatchObject({ decision: "denied", rule_id: "no-rm" })
      expect((yield* decide(h, run, { target: "ls" })).decision).toBe("proceed")
      // an unknown agent is a 404 after validation
      const missing = yield* h.send("POST", "/v0/policies/nobody", { body: JSON.stringify({ bundle: good }) })
      expect(missing.status).toBe(404)
      // the seed stage reads the seed language
      const seed = yield* harness({}, { stage: "seed" })
      yield* loadPolicy(seed, "hello", cases[0]![0])
    }))

  it.effect("registration validates in the stage's language too", () =>
    Effect.gen(function*() {
      const core = yield* Core.make({ stage: "current" })
      const refused = yield* Effect.flip(core.registerAgent({
        id: "x",
        webhookUrl: "http://localhost:1/webhook",
        secret: "s",
        policyBundle: "rules:\n  - { id: a, then: { decision: allow }, colour: red }\n"
      }))
      expect(refused.message).toBe("agent \"x\": invalid policy bundle: rule \"a\": unknown key \"colour\"")
      expect(yield* Effect.flip(core.getAgent("x"))).toMatchObject({ status: 404 })
    }))
})
