/**
 * The policy test route, `POST /v0/policies/{agent_id}/test` (PROTOCOL-CURRENT
 * C.8.6; the body format is the embedded kernel's own, see
 * src/kernel/internal/policyTest.ts): cases with `expect` / `expect_rule`,
 * unreached rules, the bundle validated as a load validates it and never
 * stored, execution replay, the 400/403/404 answers, the two scopes, and the
 * Client's `testPolicy` over HTTP.
 */
import { NodeHttpClient } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import { Client } from "effect-rebuno"
import * as Kernel from "effect-rebuno/kernel"
import {
  FORBIDDEN,
  harness,
  type Harness,
  JSON_TYPE,
  NOT_FOUND,
  NOT_FOUND_PAGE,
  running,
  UNAUTHORIZED,
  UNKNOWN_ID,
  VALIDATION,
  validationError
} from "../support/currentRoutes.js"

const BUNDLE = [
  "default_action: deny",
  "rules:",
  "  - id: search",
  "    when: { target: web_search }",
  "    then: { decision: allow, reason: searching is fine }",
  "  - id: rm",
  "    when: { target: shell, arguments: { cmd: { contains: \"rm \" } } }",
  "    then: { decision: deny, reason: no deleting }",
  "  - id: fetch",
  "    when: { target: fetch }",
  "    then: { decision: allow, rate_limit: { max_calls: 1, window: 1m }, budget: { max_tokens: 10 } }",
  "  - id: never",
  "    when: { target: nothing_calls_this }",
  "    then: { decision: deny }",
  ""
].join("\n")

/** The policy the replayed execution runs under. */
const RUN_POLICY = [
  "default_action: deny",
  "rules:",
  "  - id: search",
  "    when: { target: web_search }",
  "    then: { decision: allow }",
  "  - id: mail",
  "    when: { target: send_email }",
  "    then: { decision: require_approval }",
  ""
].join("\n")

/** {@link RUN_POLICY} made stricter: search only for the weather, mail denied. */
const STRICTER = [
  "default_action: deny",
  "rules:",
  "  - id: search",
  "    when: { target: web_search, arguments: { query: { equals: weather } } }",
  "    then: { decision: allow }",
  "  - id: mail",
  "    when: { target: send_email }",
  "    then: { decision: deny }",
  ""
].join("\n")

const BOOTSTRAP = "bootstrap-token"

const testPolicy = (h: Harness, body: unknown, options: { agentId?: string; headers?: Record<string, string> } = {}) =>
  h.send("POST", `/v0/policies/${options.agentId ?? "hello"}/test`, {
    body: typeof body === "string" ? body : JSON.stringify(body),
    headers: options.headers ?? {}
  })

const results = (body: string) =>
  (JSON.parse(body) as { results: Array<Record<string, unknown>> }).results.map((r) => [
    r.name,
    r.decision,
    r.rule_id,
    r.passed
  ])

/** Submits a step as `hello`; answers the decision. */
const submit = (h: Harness, id: string, lease: Record<string, string>, target: string, args: unknown = {}) =>
  Effect.map(
    h.agent("hello", "POST", `/v0/executions/${id}/steps`, JSON.stringify({ kind: "tool_call", target, args }), lease),
    (res) => JSON.parse(res.body) as { decision: string; step_id: string; rule_id?: string }
  )

describe("POST /v0/policies/{agent_id}/test: cases", () => {
  it.effect("evaluates each case: decision, rule and reason; expect and expect_rule pass or fail; unreached rules", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const res = yield* testPolicy(h, {
        bundle: BUNDLE,
        cases: [
          { name: "search", target: "web_search", args: { query: "hi" }, expect: "allow", expect_rule: "search" },
          { name: "rm", target: "shell", args: { cmd: "rm -rf /" }, expect: "deny", expect_rule: "rm" },
          { name: "ls is denied by rm (wrong)", target: "shell", args: { cmd: "ls" }, expect_rule: "rm" },
          { target: "fetch", kind: "llm_call" },
          { name: "local", kind: "local", target: "scratch", expect: "allow", expect_rule: "local" },
          { name: "other agent", target: "web_search", agent_id: "other", expect: "deny" }
        ]
      })
      expect(res.status).toBe(200)
      expect(res.headers).toEqual({ "content-type": JSON_TYPE })
      expect(res.body.endsWith("}\n")).toBe(true)
      const body = JSON.parse(res.body)
      expect(body.passed).toBe(false)
      expect(results(res.body)).toEqual([
        ["search", "allow", "search", true],
        ["rm", "deny", "rm", true],
        ["ls is denied by rm (wrong)", "deny", "default", false],
        ["cases[3]", "allow", "fetch", true],
        ["local", "allow", "local", true],
        ["other agent", "allow", "search", false]
      ])
      expect(body.unreached_rules).toEqual(["never"])
      // member order, and the optional members only when set
      expect(JSON.stringify(body.results[0])).toBe(
        "{\"name\":\"search\",\"kind\":\"tool_call\",\"target\":\"web_search\",\"decision\":\"allow\"," +
          "\"rule_id\":\"search\",\"reason\":\"searching is fine\",\"expect\":\"allow\",\"expect_rule\":\"search\"," +
          "\"passed\":true}"
      )
      expect(body.results[2]).toEqual({
        name: "ls is denied by rm (wrong)",
        kind: "tool_call",
        target: "shell",
        decision: "deny",
        rule_id: "default",
        reason: "no explicit allow rule matched",
        expect_rule: "rm",
        passed: false
      })
      expect(body.results[3]).toEqual({
        name: "cases[3]",
        kind: "llm_call",
        target: "fetch",
        decision: "allow",
        rule_id: "fetch",
        reason: "",
        rate_limit: true,
        budget: true,
        passed: true
      })
      expect(Object.keys(body)).toEqual(["passed", "results", "unreached_rules"])
    }))

  it.effect("every case passing passes; no cases: [] and every rule unreached; a judge rule answers judge", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const ok = yield* testPolicy(h, {
        bundle: BUNDLE,
        cases: [{ target: "web_search", expect: "allow" }, { target: "unknown", expect: "deny", expect_rule: "default" }]
      })
      expect(JSON.parse(ok.body).passed).toBe(true)
      const none = yield* testPolicy(h, { bundle: BUNDLE, cases: [] })
      expect(none.status).toBe(200)
      expect(none.body).toBe("{\"passed\":true,\"results\":[],\"unreached_rules\":[\"search\",\"rm\",\"fetch\",\"never\"]}\n")
      const judge = yield* testPolicy(h, {
        bundle: "rules:\n  - id: j\n    when: { target: x }\n    then: { decision: judge, reason: ask, judge: { instructions: be careful } }\n",
        cases: [{ target: "x", expect: "judge", expect_rule: "j" }]
      })
      expect(results(judge.body)).toEqual([["cases[0]", "judge", "j", true]])
      // an empty bundle is no policy, as loading "" is
      const empty = yield* testPolicy(h, { bundle: "", cases: [{ target: "x", expect: "allow" }] })
      expect(empty.body).toBe(
        "{\"passed\":true,\"results\":[{\"name\":\"cases[0]\",\"kind\":\"tool_call\",\"target\":\"x\"," +
          "\"decision\":\"allow\",\"rule_id\":\"permissive\",\"reason\":\"\",\"expect\":\"allow\",\"passed\":true}]," +
          "\"unreached_rules\":[]}\n"
      )
    }))

  it.effect("a bad bundle is the 400 loading it gives", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      for (
        const bad of [
          "rules:\n  - when: { target: x }\n    then: { decision: allow }\n",
          "rules:\n  - id: a\n    priority: 1\n    then: { decision: allow }\n",
          "rules: [",
          "rules:\n  - id: a\n    then: { decision: maybe }\n"
        ]
      ) {
        const loaded = yield* h.send("POST", "/v0/policies/hello", { body: JSON.stringify({ bundle: bad }) })
        expect(loaded.status).toBe(400)
        const tested = yield* testPolicy(h, { bundle: bad, cases: [] })
        expect(tested).toEqual(loaded)
      }
    }))

  it.effect("the bundle is not stored: the agent's policy still decides", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      expect((yield* h.send("POST", "/v0/policies/hello", { body: JSON.stringify({ bundle: RUN_POLICY }) })).status)
        .toBe(204)
      const tested = yield* testPolicy(h, {
        bundle: "default_action: allow\nrules: []\n",
        cases: [{ target: "shell", expect: "allow" }]
      })
      expect(JSON.parse(tested.body).passed).toBe(true)
      const { id, lease } = yield* running(h)
      const decision = yield* submit(h, id, lease, "shell")
      expect([decision.decision, decision.rule_id]).toEqual(["denied", "default"])
    }))
})

describe("POST /v0/policies/{agent_id}/test: execution replay", () => {
  it.effect("the recorded steps are the cases: the same bundle passes, a stricter one fails the changed steps", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* h.send("POST", "/v0/policies/hello", { body: JSON.stringify({ bundle: RUN_POLICY }) })
      const { id, lease } = yield* running(h)
      const search = yield* submit(h, id, lease, "web_search", { query: "hello" })
      expect(search.decision).toBe("proceed")
      const done = yield* h.agent(
        "hello",
        "POST",
        `/v0/executions/${id}/steps/${search.step_id}/complete`,
        "{\"result\":\"ok\"}",
        lease
      )
      expect(done.status).toBe(200)
      const shell = yield* submit(h, id, lease, "shell", { cmd: "ls" })
      expect(shell.decision).toBe("denied")
      const mail = yield* submit(h, id, lease, "send_email", { to: "a@b.c" })
      expect(mail.decision).toBe("blocked")

      const same = yield* testPolicy(h, { bundle: RUN_POLICY, execution_id: id })
      expect(same.status).toBe(200)
      expect(JSON.parse(same.body).passed).toBe(true)
      expect(results(same.body)).toEqual([
        [search.step_id, "allow", "search", true],
        [shell.step_id, "deny", "default", true],
        [mail.step_id, "require_approval", "mail", true]
      ])

      const stricter = yield* testPolicy(h, { bundle: STRICTER, execution_id: id })
      const body = JSON.parse(stricter.body)
      expect(body.passed).toBe(false)
      expect(results(stricter.body)).toEqual([
        [search.step_id, "deny", "default", false],
        [shell.step_id, "deny", "default", true],
        [mail.step_id, "deny", "mail", false]
      ])
      expect(body.results[0]).toMatchObject({ kind: "tool_call", target: "web_search", expect: "allow", expect_rule: "search" })
      expect(body.unreached_rules).toEqual(["search"])
    }))

  it.effect("404 for an unknown execution or agent, 403 for another agent's execution, 400 for a bad id", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const { id } = yield* running(h)
      expect(yield* testPolicy(h, { bundle: RUN_POLICY, execution_id: UNKNOWN_ID })).toMatchObject({
        status: 404,
        body: NOT_FOUND
      })
      expect(yield* testPolicy(h, { bundle: RUN_POLICY, execution_id: id }, { agentId: "other" })).toMatchObject({
        status: 403,
        body: FORBIDDEN
      })
      expect(yield* testPolicy(h, { bundle: RUN_POLICY, execution_id: id }, { agentId: "nobody" })).toMatchObject({
        status: 404,
        body: NOT_FOUND
      })
      expect(yield* testPolicy(h, { bundle: RUN_POLICY, cases: [] }, { agentId: "nobody" })).toMatchObject({
        status: 404,
        body: NOT_FOUND
      })
      expect(yield* testPolicy(h, { bundle: RUN_POLICY, execution_id: "not-a-uuid" })).toMatchObject({
        status: 400,
        body: validationError("validation error: execution_id must be an execution id (a UUID)")
      })
    }))
})

describe("POST /v0/policies/{agent_id}/test: validation", () => {
  it.effect("strict body, exactly one of cases and execution_id, strict cases", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const exactlyOne = validationError("validation error: exactly one of cases and execution_id is required")
      const table: ReadonlyArray<readonly [unknown, string]> = [
        ["{\"bundle\":\"\",\"cases\":[],\"extra\":1}", VALIDATION],
        ["{\"bundle\":1,\"cases\":[]}", VALIDATION],
        ["not json", VALIDATION],
        ["[]", VALIDATION],
        [{ bundle: "", cases: [], execution_id: UNKNOWN_ID }, exactlyOne],
        [{ bundle: "" }, exactlyOne],
        [{ bundle: "", cases: null, execution_id: "" }, exactlyOne],
        [{ cases: [] }, validationError("validation error: bundle is required")],
        [{ bundle: "", cases: {} }, validationError("validation error: cases must be a list of objects")],
        [{ bundle: "", cases: [1] }, validationError("validation error: cases[0]: not an object")],
        [
          { bundle: "", cases: [{ target: "a" }, { target: "b", when: 1 }] },
          validationError("validation error: cases[1]: unknown key \"when\"")
        ],
        [{ bundle: "", cases: [{ target: "" }] }, validationError("validation error: cases[0]: target is required")],
        [{ bundle: "", cases: [{ name: "x" }] }, validationError("validation error: cases[0]: target is required")],
        [{ bundle: "", cases: [{ target: 1 }] }, validationError("validation error: cases[0]: target must be a string")],
        [
          { bundle: "", cases: [{ target: "a", kind: "shell" }] },
          validationError("validation error: cases[0]: unknown step kind \"shell\"")
        ],
        [
          { bundle: "", cases: [{ target: "a", expect: "proceed" }] },
          validationError("validation error: cases[0]: unknown decision \"proceed\"")
        ]
      ]
      for (const [body, answer] of table) {
        const res = yield* testPolicy(h, body)
        expect([body, res.status, res.body]).toEqual([body, 400, answer])
      }
    }))

  it.effect("current stage only: older stages answer the plain 404", () =>
    Effect.gen(function*() {
      const h = yield* harness({}, { stage: "seed" })
      expect(yield* testPolicy(h, { bundle: "", cases: [] })).toMatchObject({ status: 404, body: NOT_FOUND_PAGE })
    }))
})

describe("POST /v0/policies/{agent_id}/test: auth (C.9.1)", () => {
  it.effect("needs both policies:write and executions:read; 401 without credentials when a token is set", () =>
    Effect.gen(function*() {
      const h = yield* harness({ apiToken: Redacted.make(BOOTSTRAP) })
      const keyWith = (scopes: ReadonlyArray<string>) =>
        Effect.map(
          h.send("POST", "/v0/api-keys", {
            body: JSON.stringify({ name: scopes.join("+"), scopes }),
            headers: { Authorization: `Bearer ${BOOTSTRAP}` }
          }),
          (res) => (JSON.parse(res.body) as { token: string }).token
        )
      const body = { bundle: BUNDLE, cases: [{ target: "web_search" }] }
      const as = (token: string) => testPolicy(h, body, { headers: { Authorization: `Bearer ${token}` } })
      expect(yield* as(yield* keyWith(["policies:write"]))).toMatchObject({ status: 403, body: FORBIDDEN })
      expect(yield* as(yield* keyWith(["executions:read"]))).toMatchObject({ status: 403, body: FORBIDDEN })
      expect((yield* as(yield* keyWith(["policies:write", "executions:read"]))).status).toBe(200)
      expect((yield* as(BOOTSTRAP)).status).toBe(200)
      expect(yield* testPolicy(h, body)).toMatchObject({ status: 401, body: UNAUTHORIZED })
      expect(yield* as("wrong")).toMatchObject({ status: 401, body: UNAUTHORIZED })
    }))

  it("the scope table names both scopes", () => {
    expect(Kernel.Routes.bearerScopes["POST /v0/policies/{agent_id}/test"]).toEqual(["policies:write", "executions:read"])
  })
})

describe("Client.testPolicy", () => {
  it.live("cases and a replay body through the SDK over HTTP; errors as KernelError / InvalidArguments", () =>
    Effect.gen(function*() {
      const kernel = yield* Kernel.start({ port: 0, settings: { stage: "current" } })
      const client = yield* Effect.map(
        Layer.build(Client.layer({ baseUrl: kernel.url }).pipe(Layer.provide(NodeHttpClient.layerUndici))),
        Context.get(Client.Client)
      )
      yield* client.registerAgent({ id: "hello", webhookUrl: "http://127.0.0.1:9/webhook", secret: "s" })
      const report = yield* client.testPolicy("hello", {
        bundle: BUNDLE,
        cases: [
          { name: "search", target: "web_search", args: { query: "hi" }, expect: "allow", expectRule: "search" },
          { target: "fetch", expect: "deny" }
        ]
      })
      expect(report.passed).toBe(false)
      expect(report.unreachedRules).toEqual(["rm", "never"])
      expect(report.results[0]).toEqual({
        name: "search",
        kind: "tool_call",
        target: "web_search",
        decision: "allow",
        ruleId: "search",
        reason: "searching is fine",
        rateLimit: false,
        budget: false,
        expect: "allow",
        expectRule: "search",
        passed: true
      })
      expect(report.results[1]).toMatchObject({ name: "cases[1]", decision: "allow", rateLimit: true, passed: false })

      // a replay body: the execution is looked up (an unknown one is 404, not a 400 for the body)
      const unknown = yield* Effect.flip(client.testPolicy("hello", { bundle: BUNDLE, executionId: UNKNOWN_ID }))
      expect(unknown._tag === "KernelError" && [unknown.status, unknown.code]).toEqual([404, "not_found"])

      const bad = yield* Effect.flip(client.testPolicy("hello", { bundle: "rules: [", cases: [] }))
      expect(bad._tag === "KernelError" && [bad.status, bad.code]).toEqual([400, "validation_error"])
      const invalid = yield* Effect.flip(client.testPolicy("hello", { bundle: "", cases: [{ target: "x", args: NaN }] }))
      expect(invalid._tag).toBe("InvalidArguments")
    }).pipe(Effect.scoped))
})
