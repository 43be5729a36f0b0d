/**
 * Audit of PROTOCOL-CURRENT C.8–C.12 against the embedded kernel: the
 * normative statements no other test covered, checked on the wire through the
 * kernel's routes (current stage, `v1=`-signed agent requests, TestClock) with
 * the exact status, bytes and events the spec gives. Each test names its
 * section. Statements that do not hold are reported, not tested here.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import {
  decide,
  FORBIDDEN,
  type Harness,
  harness,
  JSON_TYPE,
  LEASE_SUPERSEDED,
  claimNext,
  complete,
  loadPolicy,
  nothingDue,
  NOT_FOUND,
  RECORDED,
  running,
  type Running,
  submit,
  stepIdOf,
  submitText,
  UNAUTHORIZED,
  UNKNOWN_ID,
  validationError
} from "../support/currentRoutes.js"

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const outcome = (h: Harness, run: Running, stepId: string, route: "complete" | "fail", body: unknown) =>
  h.agent("hello", "POST", `/v0/executions/${run.id}/steps/${stepId}/${route}`, JSON.stringify(body), run.lease)

const types = (h: Harness, id: string, from = 0) =>
  Effect.map(h.core.eventLog(id), (log) => log.slice(from).map((e) => e.type))

const countEvents = (h: Harness, id: string) => Effect.map(h.core.eventLog(id), (log) => log.length)

const payloadsOf = (h: Harness, id: string, type: string) =>
  Effect.map(h.core.eventLog(id), (log) => log.filter((e) => e.type === type).map((e) => JSON.parse(e.payload)))

const text = (d: Record<string, unknown>) => JSON.stringify(d) + "\n"

/** An `llm_call` result as the SDK records it, carrying this usage. */
const llmResult = (usage: Record<string, number>) => ({
  status: 200,
  headers: { "content-type": "application/json" },
  body: JSON.stringify({ usage })
})

const bearer = (token: string) => ({ Authorization: `Bearer ${token}` })

const createKey = (h: Harness, scopes: ReadonlyArray<string>, name = "k") =>
  Effect.map(
    h.send("POST", "/v0/api-keys", { body: JSON.stringify({ name, scopes }) }),
    (res) => JSON.parse(res.body) as { id: string; token: string; name: string; scopes: Array<string> }
  )

const OTHER_LEASE = {
  "Rebuno-Dispatch-Id": "01920000-0000-7000-8000-000000000001",
  "Rebuno-Dispatch-Attempt": "1"
}

const EXECUTION_TERMINAL = "{\"decision\":\"execution_terminal\"}\n"

// ---------------------------------------------------------------------------
// C.8.1 Submit order
// ---------------------------------------------------------------------------

describe("C.8.1 submit, exact order", () => {
  it.effect("C.8.1: decoding and lease headers (1) before the lookup (2), the lookup and owner (2) before terminal (3), terminal (3) before the fence (4)", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const run = yield* running(h)
      // 1 before 2: an unknown execution without lease headers is a 400
      const noLease = yield* h.agent("hello", "POST", `/v0/executions/${UNKNOWN_ID}/steps`, submitText({ target: "t" }))
      expect(noLease).toEqual({
        status: 400,
        headers: { "content-type": JSON_TYPE },
        body: validationError("validation error: bad or missing Rebuno-Dispatch-Id")
      })
      // 2: unknown → 404 (whatever the lease), another agent's → 403
      expect(yield* submit(h, { ...run, id: UNKNOWN_ID }, { target: "t" })).toMatchObject({ status: 404, body: NOT_FOUND })
      yield* h.send("POST", `/v0/executions/${run.id}/cancel`)
      expect(yield* submit(h, run, { target: "t" }, "other")).toMatchObject({ status: 403, body: FORBIDDEN })
      // 3 before 4: a terminal execution answers 200 execution_terminal even with a lease that is not its own
      const before = yield* countEvents(h, run.id)
      const stale = yield* submit(h, { ...run, lease: OTHER_LEASE }, { target: "t" })
      expect(stale).toEqual({ status: 200, headers: { "content-type": JSON_TYPE }, body: EXECUTION_TERMINAL })
      // … but the lease headers are still parsed first (1)
      const missing = yield* h.agent("hello", "POST", `/v0/executions/${run.id}/steps`, submitText({ target: "t" }))
      expect(missing.status).toBe(400)
      expect(yield* countEvents(h, run.id)).toBe(before)
    }))

  it.effect("C.8.1: the fence (4) comes before an existing step's answer (6): a replay with a superseded lease is 409", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const run = yield* running(h)
      const call = { target: "web_search", args: { q: 1 } }
      yield* decide(h, run, call)
      yield* complete(h, run, stepIdOf(run, call), { hits: 1 })
      // the lease lapses; the redelivered run holds the new one
      yield* h.core.expireLeases()
      const next = yield* claimNext(h, run.id)
      const seen = yield* countEvents(h, run.id)
      for (const lease of [run.lease, OTHER_LEASE]) {
        const res = yield* submit(h, { ...run, lease }, call)
        expect(res).toEqual({ status: 409, headers: { "content-type": JSON_TYPE }, body: LEASE_SUPERSEDED })
      }
      expect(yield* countEvents(h, run.id)).toBe(seen)
      // with its lease the replay answers
      expect(yield* decide(h, next, call)).toEqual({
        decision: "replay",
        step_id: stepIdOf(run, call),
        result: { hits: 1 }
      })
    }))

  it.effect("C.8.1: the indeterminate-retry guard (9) also follows an agent-reported indeterminate failure, and precedes the policy (10)", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* loadPolicy(
        h,
        "hello",
        "default_action: deny\nrules:\n  - { id: pay-ok, when: { target: pay }, then: { decision: allow, reason: fine } }\n"
      )
      const run = yield* running(h)
      // the first attempt is safe_to_retry; the agent reports its outcome as unknown
      const pay = { target: "pay", args: { amount: 5 } }
      expect((yield* decide(h, run, pay)).decision).toBe("proceed")
      const failed = yield* outcome(h, run, stepIdOf(run, pay), "fail", {
        error: { message: "timeout", reason: "indeterminate" }
      })
      expect(failed.body).toBe(RECORDED)
      const seen = yield* countEvents(h, run.id)
      // an at_most_once retry of the same call: denied by the guard, not allowed by pay-ok
      const retry = { ...pay, idempotency: "at_most_once" }
      const retryId = stepIdOf(run, retry, 1)
      expect((yield* submit(h, run, retry)).body).toBe(
        "{\"decision\":\"denied\",\"step_id\":\"" + retryId +
          "\",\"reason\":\"prior attempt outcome unknown; retry refused\",\"rule_id\":\"__indeterminate_retry\"}\n"
      )
      expect(yield* types(h, run.id, seen)).toEqual(["step.proposed", "step.denied"])
      // other args are another call: the policy decides
      expect((yield* decide(h, run, { ...retry, args: { amount: 6 } })).decision).toBe("proceed")
      // a plain failure (no reason indeterminate) does not arm the guard
      const refund = { target: "pay", args: { amount: 7 } }
      yield* decide(h, run, refund)
      yield* outcome(h, run, stepIdOf(run, refund), "fail", { error: { message: "declined" } })
      expect((yield* decide(h, run, { ...refund, idempotency: "at_most_once" })).decision).toBe("proceed")
    }))
})

// ---------------------------------------------------------------------------
// C.8.2 Existing steps
// ---------------------------------------------------------------------------

describe("C.8.2 existing steps", () => {
  it.effect("C.8.2: after a grant the allowed step starts on resubmission: step.executing, then proceed", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* loadPolicy(
        h,
        "hello",
        "default_action: allow\nrules:\n  - { id: gate, when: { target: send }, then: { decision: require_approval } }\n"
      )
      const run = yield* running(h)
      const send = { target: "send", args: { to: "ops" } }
      const stepId = stepIdOf(run, send)
      const first = yield* decide(h, run, send)
      expect(first).toMatchObject({ decision: "blocked", step_id: stepId })
      // a grant: the step is allowed; the redelivered run gets proceed and the step starts
      const grant = yield* h.send("POST", `/v0/approvals/${first.approval_id}/grant`, {
        body: "{\"decided_by\":\"alice\"}"
      })
      expect(grant.status).toBe(204)
      const next = yield* claimNext(h, run.id)
      const before = yield* countEvents(h, run.id)
      expect((yield* submit(h, next, send)).body).toBe(text({ decision: "proceed", step_id: stepId }))
      const started = yield* types(h, run.id, before)
      expect(started).toEqual(["step.executing"])
      expect((yield* h.core.getStep(run.id, stepId)).status).toBe("executing")
    }))
})

// ---------------------------------------------------------------------------
// C.8.3 Rate limits and parking
// ---------------------------------------------------------------------------

const limited = (options: string, id = "pace", target = "api_*") => `  - id: ${id}
    when: { target: "${target}" }
    then:
      decision: allow
      rate_limit: { max_calls: 1, window: 1m${options} }
`

describe("C.8.3 rate limits and parking", () => {
  it.effect("C.8.3: max_wait zero refuses (no parking)", () =>
    Effect.gen(function*() {
      const h = yield* harness({}, { random: () => 0 })
      yield* loadPolicy(h, "hello", "rules:\n" + limited(", max_wait: 0s"))
      const run = yield* running(h)
      yield* decide(h, run, { target: "api_a" })
      const seen = yield* countEvents(h, run.id)
      expect((yield* submit(h, run, { target: "api_b" })).body).toBe(
        "{\"decision\":\"rate_limited\",\"reason\":\"rate_limit_exceeded\"}\n"
      )
      expect(yield* types(h, run.id, seen)).toEqual(["step.rate_limited"])
    }))

  it.effect("C.8.3: a wait exactly max_wait parks (only a longer one is refused); the dispatch is due after it", () =>
    Effect.gen(function*() {
      const h = yield* harness({}, { random: () => 0 })
      yield* loadPolicy(h, "hello", "rules:\n" + limited(", max_wait: 1m"))
      const run = yield* running(h)
      yield* decide(h, run, { target: "api_a" })
      const seen = yield* countEvents(h, run.id)
      const parked = yield* submit(h, run, { target: "api_b" })
      expect(parked.body).toBe("{\"decision\":\"blocked\",\"reason\":\"rate_limit_exceeded\"}\n")
      expect(yield* types(h, run.id, seen)).toEqual(["step.rate_limited", "dispatch.queued"])
      yield* TestClock.adjust("59999 millis")
      yield* nothingDue(h, run.id)
      yield* TestClock.adjust("1 millis")
      yield* claimNext(h, run.id)
    }))

  it.effect("C.8.3 (C.15 #10): an earlier refusal counts as the execution's one step.rate_limited: a later limit with max_wait refuses", () =>
    Effect.gen(function*() {
      const h = yield* harness({}, { random: () => 0 })
      yield* loadPolicy(
        h,
        "hello",
        "rules:\n" + limited("", "strict", "strict_*") + limited(", max_wait: 5m", "patient", "patient_*")
      )
      const run = yield* running(h)
      yield* decide(h, run, { target: "strict_a" })
      expect((yield* submit(h, run, { target: "strict_b" })).body).toBe(
        "{\"decision\":\"rate_limited\",\"reason\":\"rate_limit_exceeded\"}\n"
      )
      yield* decide(h, run, { target: "patient_a" })
      const seen = yield* countEvents(h, run.id)
      expect((yield* submit(h, run, { target: "patient_b" })).body).toBe(
        "{\"decision\":\"rate_limited\",\"reason\":\"rate_limit_exceeded\"}\n"
      )
      expect(yield* types(h, run.id, seen)).toEqual(["step.rate_limited"])
      // a fresh execution parks under the same rule
      const fresh = yield* running(h)
      yield* decide(h, fresh, { target: "patient_a" })
      expect((yield* submit(h, fresh, { target: "patient_b" })).body).toBe(
        "{\"decision\":\"blocked\",\"reason\":\"rate_limit_exceeded\"}\n"
      )
    }))

  it.effect("C.8.3: parking retires the execution's dispatches: the parked run's heartbeat and submit are 409 lease_superseded", () =>
    Effect.gen(function*() {
      const h = yield* harness({}, { random: () => 0 })
      yield* loadPolicy(h, "hello", "rules:\n" + limited(", max_wait: 2m"))
      const run = yield* running(h)
      yield* decide(h, run, { target: "api_a" })
      yield* submit(h, run, { target: "api_b" })
      expect(yield* submit(h, run, { target: "other" })).toMatchObject({ status: 409, body: LEASE_SUPERSEDED })
      const execution = JSON.parse((yield* h.send("GET", `/v0/executions/${run.id}`)).body)
      expect(execution.status).toBe("running")
    }))
})

// ---------------------------------------------------------------------------
// C.8.1 step 11, C.8.5 Token budgets
// ---------------------------------------------------------------------------

const budgetRule = (options: string) => `default_action: allow
rules:
  - id: llm
    when: { step_kind: llm_call }
    then:
      decision: allow
      budget: { max_tokens: 30${options} }
`

describe("C.8.5 token budgets", () => {
  it.effect("C.8.5: one token under max_tokens is allowed; at max_tokens the decision is denied", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* loadPolicy(h, "hello", budgetRule(""))
      const run = yield* running(h)
      const call = (turn: number) => ({ kind: "llm_call", target: "gpt", args: { turn } })
      yield* decide(h, run, call(1))
      yield* complete(h, run, stepIdOf(run, call(1)), llmResult({ input_tokens: 20, output_tokens: 9 }))
      expect(yield* decide(h, run, call(2))).toEqual({ decision: "proceed", step_id: stepIdOf(run, call(2)) })
      yield* complete(h, run, stepIdOf(run, call(2)), llmResult({ input_tokens: 1 }))
      expect((yield* submit(h, run, call(3))).body).toBe(
        text({
          decision: "denied",
          step_id: stepIdOf(run, call(3)),
          reason: "execution_token_budget_exceeded",
          rule_id: "llm"
        })
      )
    }))

  it.effect("C.8.5: scope session without a session counts the execution's own steps only", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* loadPolicy(h, "hello", budgetRule(", scope: session"))
      const a = yield* running(h)
      const call = { kind: "llm_call", target: "gpt", args: {} }
      yield* decide(h, a, call)
      yield* complete(h, a, stepIdOf(a, call), llmResult({ prompt_tokens: 30 }))
      expect((yield* decide(h, a, { ...call, args: { n: 2 } })).decision).toBe("denied")
      const b = yield* running(h)
      expect((yield* decide(h, b, call)).decision).toBe("proceed")
    }))

  it.effect("C.8.5: a budget applies only when its rule decides allow (deny and require_approval keep their reasons)", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* loadPolicy(
        h,
        "hello",
        `default_action: allow
rules:
  - id: no-rm
    when: { target: rm }
    then: { decision: deny, budget: { max_tokens: 1 } }
  - id: gate
    when: { target: send }
    then: { decision: require_approval, budget: { max_tokens: 1 } }
`
      )
      const run = yield* running(h)
      const llm = { kind: "llm_call", target: "gpt", args: {} }
      yield* decide(h, run, llm)
      yield* complete(h, run, stepIdOf(run, llm), llmResult({ input_tokens: 50, output_tokens: 50 }))
      expect((yield* submit(h, run, { target: "rm" })).body).toBe(
        text({ decision: "denied", step_id: stepIdOf(run, { target: "rm" }), reason: "policy_denied", rule_id: "no-rm" })
      )
      const seen = yield* countEvents(h, run.id)
      const blocked = yield* decide(h, run, { target: "send" })
      expect(blocked.decision).toBe("blocked")
      const [awaiting] = yield* payloadsOf(h, run.id, "step.awaiting_approval")
      expect(awaiting).not.toHaveProperty("reason")
      expect(awaiting.rule_id).toBe("gate")
      expect(yield* types(h, run.id, seen)).toEqual([
        "step.proposed",
        "step.awaiting_approval",
        "approval.requested",
        "execution.blocked"
      ])
    }))

  it.effect("C.8.1 step 11: the rate limit comes before the budget: a budget denial took a limiter token; over the limit the answer is rate_limited", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* loadPolicy(
        h,
        "hello",
        `rules:
  - id: llm
    when: { step_kind: llm_call }
    then:
      decision: allow
      rate_limit: { max_calls: 2, window: 1h }
      budget: { max_tokens: 10 }
`
      )
      const run = yield* running(h)
      const call = (n: number) => ({ kind: "llm_call", target: "gpt", args: { n } })
      yield* decide(h, run, call(1))
      yield* complete(h, run, stepIdOf(run, call(1)), llmResult({ input_tokens: 10 }))
      expect((yield* decide(h, run, call(2))).reason).toBe("execution_token_budget_exceeded")
      expect((yield* submit(h, run, call(3))).body).toBe(
        "{\"decision\":\"rate_limited\",\"reason\":\"rate_limit_exceeded\"}\n"
      )
    }))

  it.effect("C.8.5: a failed llm_call carries no usage; a result's usage inside an SSE body is read as the maximum per direction", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const run = yield* running(h)
      const a = { kind: "llm_call", target: "claude", args: { n: 1 } }
      const b = { kind: "llm_call", target: "claude", args: { n: 2 } }
      yield* decide(h, run, a)
      yield* decide(h, run, b)
      const sse = "event: message_start\n" +
        "data: {\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
        "data: {\"usage\":{\"output_tokens\":15}}\n\ndata: [DONE]\n"
      yield* complete(h, run, stepIdOf(run, a), { status: 200, headers: {}, body: sse })
      yield* outcome(h, run, stepIdOf(run, b), "fail", { error: { message: "x", usage: { input_tokens: 9 } } })
      const log = yield* h.core.eventLog(run.id)
      const succeeded = log.find((e) => e.type === "step.succeeded")!
      expect(succeeded.payload).toContain("\"usage\":{\"input_tokens\":25,\"output_tokens\":15}")
      const failed = log.find((e) => e.type === "step.failed")!
      expect(JSON.parse(failed.payload)).not.toHaveProperty("usage")
    }))
})

// ---------------------------------------------------------------------------
// C.8.4, C.8.6 Bundles
// ---------------------------------------------------------------------------

describe("C.8.4 / C.8.6 bundle language on the wire", () => {
  it.effect("C.8.6: default_action other than exactly allow denies (rule default); absent denies", () =>
    Effect.gen(function*() {
      for (const bundle of ["default_action: Allow\n", "default_action: \"yes\"\n", "rules: []\n"]) {
        const h = yield* harness()
        yield* loadPolicy(h, "hello", bundle)
        const run = yield* running(h)
        expect(yield* decide(h, run, { target: "x" })).toEqual({
          decision: "denied",
          step_id: stepIdOf(run, { target: "x" }),
          reason: "no explicit allow rule matched",
          rule_id: "default"
        })
        // an unmatched local step is still allowed (rule local)
        expect((yield* decide(h, run, { kind: "local", target: "now" })).decision).toBe("proceed")
      }
    }))

  it.effect("C.8.6: every rule needs an id: a bundle with a rule without one is refused at load", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const res = yield* h.send("POST", "/v0/policies/hello", {
        body: JSON.stringify({ bundle: "rules:\n  - { then: { decision: allow } }\n" })
      })
      expect(res.status).toBe(400)
      expect(res.body).toBe(
        validationError("load policy bundle: validation error: invalid policy bundle: rules[0]: rule missing id")
      )
      expect((yield* h.core.getAgent("hello")).policyBundle).toBe("")
    }))

  it.effect("C.8.4: require_approval retires the dispatches: the held run's heartbeat is 409 lease_superseded", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* loadPolicy(
        h,
        "hello",
        "default_action: allow\nrules:\n  - { id: gate, when: { target: send }, then: { decision: require_approval } }\n"
      )
      const run = yield* running(h)
      yield* decide(h, run, { target: "send" })
      const beat = yield* h.agent("hello", "POST", `/v0/executions/${run.id}/heartbeat`, "", run.lease)
      expect(beat).toEqual({ status: 409, headers: { "content-type": JSON_TYPE }, body: LEASE_SUPERSEDED })
      const [blocked] = yield* payloadsOf(h, run.id, "execution.blocked")
      expect(blocked).toEqual({ execution_id: run.id, status: "blocked" })
    }))
})

// ---------------------------------------------------------------------------
// C.9 Scoped API keys and ownership
// ---------------------------------------------------------------------------

describe("C.9.1 scopes on the routes the scope test did not list", () => {
  it.effect("C.9.1: stream, fork-points and previous need executions:read, fork executions:write; write does not imply read", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const run = yield* running(h)
      const routes: ReadonlyArray<readonly [string, string, string, string]> = [
        ["GET", `/v0/executions/${run.id}/stream`, "", "executions:read"],
        ["GET", `/v0/executions/${run.id}/fork-points`, "", "executions:read"],
        ["GET", `/v0/executions/${run.id}/previous`, "", "executions:read"],
        ["POST", `/v0/executions/${UNKNOWN_ID}/fork`, "{\"at_seq\":1}", "executions:write"]
      ]
      const everything = [
        "executions:read",
        "executions:write",
        "approvals:read",
        "approvals:write",
        "agents:read",
        "agents:write",
        "policies:write",
        "api_keys:manage"
      ]
      for (const [method, path, body, scope] of routes) {
        const without = yield* createKey(h, everything.filter((s) => s !== scope))
        const denied = yield* h.send(method, path, { body, headers: bearer(without.token) })
        expect([method, path, denied.status, denied.body]).toEqual([method, path, 403, FORBIDDEN])
        const withScope = yield* createKey(h, [scope])
        const allowed = yield* h.send(method, path, { body, headers: bearer(withScope.token) })
        expect([method, path, allowed.status]).toEqual([method, path, path.endsWith("/fork") ? 404 : 200])
      }
    }))

  it.effect("C.9.1 step 4: a token whose key id is not a UUID, or an unknown key, is 401", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const key = yield* createKey(h, ["executions:read"])
      const secret = key.token.split(".")[1]!
      for (
        const token of [
          "rbk_not-a-uuid." + secret,
          `rbk_${UNKNOWN_ID}.${secret}`,
          key.token.replace("rbk_", "rbk_" + "x"),
          key.token + "=",
          key.token.toUpperCase()
        ]
      ) {
        const res = yield* h.send("GET", "/v0/executions", { headers: bearer(token) })
        expect([token, res.status, res.body]).toEqual([token, 401, UNAUTHORIZED])
      }
      expect((yield* h.send("GET", "/v0/executions", { headers: bearer(key.token) })).status).toBe(200)
    }))
})

describe("C.9.2 /v0/api-keys edges", () => {
  it.effect("C.9.2: the name is trimmed before its 1–200 byte check; 200 bytes of multi-byte text pass", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const padded = yield* h.send("POST", "/v0/api-keys", {
        body: JSON.stringify({ name: "  " + "x".repeat(200) + "  ", scopes: ["agents:read"] })
      })
      expect(padded.status).toBe(201)
      expect(JSON.parse(padded.body).name).toBe("x".repeat(200))
      const wide = yield* h.send("POST", "/v0/api-keys", {
        body: JSON.stringify({ name: "é".repeat(100), scopes: ["agents:read"] })
      })
      expect(wide.status).toBe(201)
      // the rotated answer is the create answer's shape, without revoked_at
      const rotated = yield* h.send("POST", `/v0/api-keys/${JSON.parse(wide.body).id}/rotate`)
      expect(Object.keys(JSON.parse(rotated.body))).toEqual(["id", "name", "scopes", "created_at", "token"])
    }))

  it.effect("C.9.2: the name is trimmed as Go's strings.TrimSpace: NEL is space, a byte order mark is not", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const create = (name: string) =>
        h.send("POST", "/v0/api-keys", { body: JSON.stringify({ name, scopes: ["agents:read"] }) })
      const nel = yield* create("\u0085")
      expect([nel.status, JSON.parse(nel.body).message]).toEqual([400, "validation error: name and scopes are required"])
      const bom = yield* create("\ufeff")
      expect(bom.status).toBe(201)
      expect(JSON.parse(bom.body).name).toBe("\ufeff")
      const padded = yield* create("\u0085\u3000ops\u2028 ")
      expect(JSON.parse(padded.body).name).toBe("ops")
    }))
})

describe("C.9.3 agent ownership", () => {
  it.effect("C.9.3: another agent's terminal execution is 403 on every agent route (ownership before terminal)", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const run = yield* running(h)
      yield* h.send("POST", `/v0/executions/${run.id}/cancel`)
      const routes: ReadonlyArray<readonly [string, string, string]> = [
        ["POST", `/v0/executions/${run.id}/steps`, submitText({ target: "t" })],
        ["POST", `/v0/executions/${run.id}/heartbeat`, ""],
        ["POST", `/v0/executions/${run.id}/complete`, "{\"output\":1}"],
        ["POST", `/v0/executions/${run.id}/fail`, "{\"error\":\"x\"}"],
        ["POST", `/v0/executions/${run.id}/suspend`, ""],
        ["GET", `/v0/executions/${run.id}/previous`, ""]
      ]
      for (const [method, path, body] of routes) {
        const res = yield* h.agent("other", method, path, body, run.lease)
        expect([path, res.status, res.body]).toEqual([path, 403, FORBIDDEN])
      }
      // the owner gets the terminal answers
      expect((yield* submit(h, run, { target: "t" })).body).toBe(EXECUTION_TERMINAL)
    }))

  it.effect("C.9.3: a bearer API key is deployment-wide: it reads any agent's executions and steps", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const mine = yield* running(h)
      const theirs = yield* running(h, "other")
      const key = yield* createKey(h, ["executions:read"])
      for (const id of [mine.id, theirs.id]) {
        for (const suffix of ["", "/steps", "/previous", "/events"]) {
          const res = yield* h.send("GET", `/v0/executions/${id}${suffix}`, { headers: bearer(key.token) })
          expect([suffix, res.status]).toEqual([suffix, 200])
        }
      }
    }))
})

// ---------------------------------------------------------------------------
// C.10 Other changed responses
// ---------------------------------------------------------------------------

describe("C.10 changed responses", () => {
  it.effect("C.10: lease_timeout_seconds of exactly 10 is kept; under 10 is dropped", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* TestClock.setTime(Date.UTC(2025, 0, 2, 3, 4, 5))
      const ten = yield* h.send("POST", "/v0/agents", {
        body: "{\"id\":\"ten\",\"webhook_url\":\"http://127.0.0.1:9/t\",\"secret\":\"s\",\"lease_timeout_seconds\":10}"
      })
      expect(ten.body).toBe(
        "{\"id\":\"ten\",\"webhook_url\":\"http://127.0.0.1:9/t\",\"registered_at\":\"2025-01-02T03:04:05Z\",\"lease_timeout_seconds\":10}\n"
      )
      const under = yield* h.send("POST", "/v0/agents", {
        body: "{\"id\":\"nine\",\"webhook_url\":\"http://127.0.0.1:9/n\",\"secret\":\"s\",\"lease_timeout_seconds\":9.99}"
      })
      expect(JSON.parse(under.body)).not.toHaveProperty("lease_timeout_seconds")
    }))

  it.effect("C.10: step outcomes answer 200 decisions: recorded, replay of a terminal step, execution_terminal", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const run = yield* running(h)
      const call = { target: "echo", args: { n: 1 } }
      yield* decide(h, run, call)
      const stepId = stepIdOf(run, call)
      yield* complete(h, run, stepId, { ok: true })
      const again = yield* outcome(h, run, stepId, "complete", { result: { ok: false } })
      expect(again).toEqual({
        status: 200,
        headers: { "content-type": JSON_TYPE },
        body: "{\"decision\":\"replay\",\"result\":{\"ok\":true}}\n"
      })
      const failLate = yield* outcome(h, run, stepId, "fail", { error: { message: "late" } })
      expect(failLate.body).toBe("{\"decision\":\"replay\"}\n")
      yield* h.send("POST", `/v0/executions/${run.id}/cancel`)
      const afterCancel = yield* outcome(h, run, stepId, "complete", { result: 1 })
      expect(afterCancel).toEqual({ status: 200, headers: { "content-type": JSON_TYPE }, body: EXECUTION_TERMINAL })
    }))

  it.effect("C.10: an unknown step of a known execution is 404 on complete and fail", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const run = yield* running(h)
      for (const route of ["complete", "fail"] as const) {
        const res = yield* outcome(h, run, "c".repeat(64), route, route === "complete" ? { result: 1 } : { error: {} })
        expect([route, res.status, res.body]).toEqual([route, 404, NOT_FOUND])
      }
    }))
})
