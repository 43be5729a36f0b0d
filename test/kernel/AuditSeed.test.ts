/**
 * Statement-by-statement audit of PROTOCOL.md's kernel sections against the
 * embedded kernel in the seed stage (and, for 17.A, the v0.14.0 stage), over
 * real HTTP: the statements no other test pins, each `it` named by its
 * section. Where the seed stage behaves as v0.14.0, the expected bytes were
 * checked against the Go reference kernel v0.14.0.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { createHash, createHmac } from "node:crypto"
import * as Kernel from "../../src/kernel/index.js"

const SECRET = "audit-secret"
const JSON_TYPE = "application/json; charset=utf-8"
const VALIDATION = "{\"code\":\"validation_error\",\"message\":\"validation error\"}\n"
const UNAUTHORIZED = "{\"code\":\"unauthorized\",\"message\":\"unauthorized\"}\n"
const NOT_FOUND = "{\"code\":\"not_found\",\"message\":\"not found\"}\n"
const SUPERSEDED = "{\"code\":\"lease_superseded\",\"message\":\"dispatch lease superseded\"}\n"
const TERMINAL = "{\"code\":\"execution_terminal\",\"message\":\"execution terminal\"}\n"
const CONFLICT = "{\"code\":\"conflict\",\"message\":\"conflict\"}\n"
const BAD_ATTEMPT =
  "{\"code\":\"validation_error\",\"message\":\"validation error: bad or missing Rebuno-Dispatch-Attempt\"}\n"
const UNKNOWN = "0192f1a0-0000-7000-8000-000000000000"
const UNKNOWN_DISPATCH = "0192f1a0-0000-7000-8000-0000000000d1"

/** v0.14.0-language bundle: `deploy` needs alice-ish or bob, `open` anyone. */
const BUNDLE = [
  "default_action: allow",
  "rules:",
  "  - id: gate",
  "    priority: 1",
  "    when: { target: deploy }",
  "    then:",
  "      decision: require_approval",
  "      approval_config: { approvers: [\"al\\\"ice\", \"bob\"] }",
  ""
].join("\n")

const sign = (body: string) => "sha256=" + createHmac("sha256", SECRET).update(body).digest("hex")
const sha256 = (text: string) => createHash("sha256").update(text, "utf8").digest("hex")
/** PROTOCOL 8.2 from an args hash. */
const stepId = (executionId: string, kind: string, target: string, argsHash: string, occurrence: number) =>
  sha256(
    [executionId, kind, target, argsHash, String(occurrence)]
      .map((f) => `${Buffer.byteLength(f, "utf8")}:${f}`)
      .join("")
  )

interface Answer {
  readonly status: number
  readonly type: string | null
  readonly body: string
}

type Headers = Readonly<Record<string, string>>

const http = (base: string, method: string, path: string, body?: string, headers: Headers = {}) =>
  Effect.promise(async (): Promise<Answer> => {
    const init: RequestInit = { method, headers }
    if (body !== undefined) init.body = body
    const res = await fetch(base + path, init)
    return { status: res.status, type: res.headers.get("content-type"), body: await res.text() }
  })

const json = (status: number, body: string): Answer => ({ status, type: JSON_TYPE, body })
const empty = (status: number): Answer => ({ status, type: null, body: "" })

interface Webhook {
  readonly execution_id: string
  readonly dispatch_id: string
  readonly dispatch_attempt?: number
}

/** The latest webhook of an execution. */
const lastWebhook = (webhooks: ReadonlyArray<Webhook>, id: string): Webhook =>
  webhooks.filter((w) => w.execution_id === id).at(-1)!

const setup = (stage: "seed" | "v0.14.0" = "seed") =>
  Effect.gen(function*() {
    const webhooks: Array<Webhook> = []
    const kernel = yield* Kernel.start({
      port: 0,
      stage,
      dispatcher: {
        background: false,
        deliver: (_claim, body) =>
          Effect.sync(() => {
            webhooks.push(JSON.parse(body))
            return true
          })
      }
    })
    yield* kernel.core.registerAgent({ id: "audit", webhookUrl: "http://127.0.0.1:9/webhook", secret: SECRET })
    const bearer = (method: string, path: string, body?: string, headers: Headers = {}) =>
      http(kernel.url, method, path, body, headers)
    const agent = (method: string, path: string, body = "", headers: Headers = {}) =>
      http(kernel.url, method, path, method === "GET" ? undefined : body, {
        "Rebuno-Agent-Id": "audit",
        "Rebuno-Signature": sign(body),
        ...headers
      })
    /** Creates an execution and delivers its dispatch: the id and the lease headers of that delivery. */
    const running = Effect.gen(function*() {
      const created = yield* bearer("POST", "/v0/executions", "{\"agent_id\":\"audit\"}")
      expect(created.status).toBe(201)
      const id: string = JSON.parse(created.body).id
      yield* kernel.dispatcher.tick
      const hook = lastWebhook(webhooks, id)
      const lease: Headers = {
        "Rebuno-Dispatch-Id": hook.dispatch_id,
        "Rebuno-Dispatch-Attempt": String(hook.dispatch_attempt ?? 1)
      }
      return { id, lease, dispatchId: hook.dispatch_id }
    })
    const redeliver = (id: string) =>
      Effect.gen(function*() {
        yield* kernel.dispatcher.tick
        const hook = lastWebhook(webhooks, id)
        return {
          "Rebuno-Dispatch-Id": hook.dispatch_id,
          "Rebuno-Dispatch-Attempt": String(hook.dispatch_attempt ?? 1)
        } as Headers
      })
    const eventCount = (id: string) =>
      Effect.map(bearer("GET", `/v0/executions/${id}/events?limit=1000`), (res) => (JSON.parse(res.body) ?? []).length)
    return { kernel, bearer, agent, running, redeliver, eventCount }
  })

const tool = (target: string, extra = "") => `{"kind":"tool_call","target":"${target}"${extra}}`

describe("PROTOCOL.md audit, seed stage (over HTTP)", () => {
  it.live("2.5, 8.2: {id} in any UUID form; the step id is computed from the canonical lowercase id", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const { id, lease, dispatchId } = yield* k.running
      const canonical = yield* k.bearer("GET", `/v0/executions/${id}`)
      expect(canonical.status).toBe(200)
      for (const form of [id.toUpperCase(), `{${id}}`, `urn:uuid:${id}`, `URN:UUID:${id}`, id.replace(/-/g, "")]) {
        expect(yield* k.bearer("GET", `/v0/executions/${form}`)).toEqual(canonical)
      }
      for (const bad of [`{${id}`, `${id}}`, id.slice(0, 35) + "g", id.replace(/-/g, "") + "0", id + "-"]) {
        expect(yield* k.bearer("GET", `/v0/executions/${bad}`)).toEqual(json(400, VALIDATION))
      }
      // vector 1 (whitespace_and_key_order) submitted through an upper-case and a braced path
      const args = "{\"query\": \"hello world\", \"limit\": 10}"
      const hash = "338db425bb36266fa8a2a902d03dc29e83b82a4776296048d2774d510924a0ce"
      const body = `{"kind":"tool_call","target":"web_search","args":${args}}`
      const first = yield* k.agent("POST", `/v0/executions/${id.toUpperCase()}/steps`, body, lease)
      expect(first).toEqual(json(200, `{"decision":"proceed","step_id":"${stepId(id, "tool_call", "web_search", hash, 0)}"}\n`))
      const second = yield* k.agent("POST", `/v0/executions/{${id}}/steps`, body, lease)
      expect(second).toEqual(json(200, `{"decision":"proceed","step_id":"${stepId(id, "tool_call", "web_search", hash, 1)}"}\n`))
      // the Rebuno-Dispatch-Id header takes the same forms
      for (const form of [`urn:uuid:${dispatchId}`, `URN:UUID:${dispatchId}`, dispatchId.replace(/-/g, "")]) {
        expect(yield* k.agent("POST", `/v0/executions/${id}/heartbeat`, "", { ...lease, "Rebuno-Dispatch-Id": form }))
          .toEqual(empty(204))
      }
    }))

  it.live("2.9: agent and client paths with a wrong method are an empty 405; trailing slashes a plain-text 404", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const { id } = yield* k.running
      const wrong: ReadonlyArray<readonly [string, string]> = [
        ["GET", `/v0/executions/${id}/heartbeat`],
        ["GET", `/v0/executions/${id}/cancel`],
        ["GET", `/v0/executions/${id}/complete`],
        ["PUT", `/v0/executions/${id}/steps`],
        ["DELETE", `/v0/executions/${id}`],
        ["GET", `/v0/executions/${id}/steps/abc/complete`],
        ["DELETE", "/v0/approvals"],
        ["GET", `/v0/approvals/${UNKNOWN}/grant`],
        ["POST", "/v0/health"]
      ]
      for (const [method, path] of wrong) {
        expect({ method, path, res: yield* k.bearer(method, path) }).toEqual({ method, path, res: empty(405) })
      }
      for (const path of [`/v0/executions/${id}/`, `/v0/executions/${id}/steps/`, "/v0/agents/", "/v0/health/"]) {
        expect(yield* k.bearer("GET", path)).toEqual({
          status: 404,
          type: "text/plain; charset=utf-8",
          body: "404 page not found\n"
        })
      }
    }))

  it.live("2.3: a bare null body or trailing data is 400 on every decoding route, and nothing is recorded", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const { id, lease } = yield* k.running
      const { decision, step_id } = JSON.parse(
        (yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("a"), lease)).body
      )
      expect(decision).toBe("proceed")
      const events = yield* k.eventCount(id)
      const agentRoutes = [
        `/v0/executions/${id}/steps`,
        `/v0/executions/${id}/steps/${step_id}/complete`,
        `/v0/executions/${id}/steps/${step_id}/fail`,
        `/v0/executions/${id}/steps/${step_id}/stream`,
        `/v0/executions/${id}/complete`,
        `/v0/executions/${id}/fail`
      ]
      for (const path of agentRoutes) {
        for (const body of ["null", "{} {}", "{}x", "[]"]) {
          expect({ path, body, res: yield* k.agent("POST", path, body, lease) })
            .toEqual({ path, body, res: json(400, VALIDATION) })
        }
      }
      const bearerRoutes = ["/v0/agents", "/v0/policies/audit", `/v0/approvals/${UNKNOWN}/grant`, `/v0/approvals/${UNKNOWN}/deny`]
      for (const path of bearerRoutes) {
        expect({ path, res: yield* k.bearer("POST", path, "null") }).toEqual({ path, res: json(400, VALIDATION) })
      }
      expect(yield* k.eventCount(id)).toBe(events)
      expect(JSON.parse((yield* k.bearer("GET", `/v0/executions/${id}`)).body).status).toBe("running")
    }))

  it.live("6.3, 7.3 step 2, 11.12: {} submits an empty kind and target; idempotency is stored as given, \"\" as safe_to_retry", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const { id, lease } = yield* k.running
      const submit = (body: string) =>
        Effect.map(k.agent("POST", `/v0/executions/${id}/steps`, body, lease), (res) => {
          expect(res.status).toBe(200)
          const d = JSON.parse(res.body)
          expect(d.decision).toBe("proceed")
          return d.step_id as string
        })
      const stepOf = (sid: string) =>
        Effect.map(k.bearer("GET", `/v0/executions/${id}/steps/${sid}`), (res) => res.body)
      const nullHash = "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"
      const bare = yield* submit("{}")
      expect(bare).toBe(stepId(id, "", "", nullHash, 0))
      expect(yield* stepOf(bare)).toMatch(
        new RegExp(
          `^\\{"step_id":"${bare}","execution_id":"${id}","kind":"","target":"","args_hash":"${nullHash}",` +
            `"occurrence":0,"status":"executing","idempotency":"safe_to_retry","started_at":"[^"]+"\\}\\n$`
        )
      )
      const odd = yield* submit(tool("t", ",\"idempotency\":\"Exactly_Once\""))
      expect(JSON.parse(yield* stepOf(odd)).idempotency).toBe("Exactly_Once")
      const blank = yield* submit(tool("u", ",\"idempotency\":\"\""))
      expect(JSON.parse(yield* stepOf(blank)).idempotency).toBe("safe_to_retry")
      // wrong member types are 400
      for (const body of ["{\"target\":1}", "{\"idempotency\":true}", "{\"kind\":[]}", "{\"kind\":{}}"]) {
        expect(yield* k.agent("POST", `/v0/executions/${id}/steps`, body, lease)).toEqual(json(400, VALIDATION))
      }
    }))

  it.live("6.4, 6.5: a terminal step answers replay before the lease CHECK; an unknown step is 404 before it", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const x = yield* k.running
      const y = yield* k.running
      const submit = (target: string) =>
        Effect.map(
          k.agent("POST", `/v0/executions/${x.id}/steps`, tool(target), x.lease),
          (res) => JSON.parse(res.body).step_id as string
        )
      const ok = yield* submit("ok")
      const bad = yield* submit("bad")
      const open = yield* submit("open")
      const post = (sid: string, verb: string, body: string, lease: Headers) =>
        k.agent("POST", `/v0/executions/${x.id}/steps/${sid}/${verb}`, body, lease)
      expect(yield* post(ok, "complete", "{\"result\":{\"n\":\"<7>\"}}", x.lease)).toEqual(json(200, "{\"decision\":\"recorded\"}\n"))
      expect(yield* post(bad, "fail", "{\"error\":{\"message\":\"&\"}}", x.lease)).toEqual(json(200, "{\"decision\":\"recorded\"}\n"))
      // with another execution's lease, or a later attempt: the stored outcome, no CHECK
      for (const lease of [y.lease, { ...x.lease, "Rebuno-Dispatch-Attempt": "7" }]) {
        expect(yield* post(ok, "complete", "{}", lease)).toEqual(json(200, "{\"decision\":\"replay\",\"result\":{\"n\":\"\\u003c7\\u003e\"}}\n"))
        // failing a succeeded step: replay with its (absent) error, never the result (6.5 step 5)
        expect(yield* post(ok, "fail", "{\"error\":{}}", lease)).toEqual(json(200, "{\"decision\":\"replay\"}\n"))
        // completing a failed step: replay without the error (quirk, reproduced)
        expect(yield* post(bad, "complete", "{}", lease)).toEqual(json(200, "{\"decision\":\"replay\"}\n"))
        expect(yield* post(bad, "fail", "{}", lease)).toEqual(json(200, "{\"decision\":\"replay\",\"error\":{\"message\":\"\\u0026\"}}\n"))
        // unknown step ids are 404 whatever the lease
        expect(yield* post("0".repeat(64), "complete", "{}", lease)).toEqual(json(404, NOT_FOUND))
        expect(yield* post("not-hex", "fail", "{}", lease)).toEqual(json(404, NOT_FOUND))
        // a step that is not terminal does go through CHECK
        expect(yield* post(open, "complete", "{}", lease)).toEqual(json(409, SUPERSEDED))
      }
      // a step of another execution is 404 (16.3 #4)
      expect(yield* k.agent("POST", `/v0/executions/${y.id}/steps/${open}/complete`, "{}", y.lease)).toEqual(json(404, NOT_FOUND))
      expect(yield* post(open, "complete", "{}", x.lease)).toEqual(json(200, "{\"decision\":\"recorded\"}\n"))
    }))

  it.live("5.6, 7.3 step 5, 6.4 step 4: on a terminal execution no lease is checked, except by heartbeat", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const { id, lease } = yield* k.running
      const sid = JSON.parse((yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("a"), lease)).body).step_id
      expect(yield* k.bearer("POST", `/v0/executions/${id}/cancel`)).toEqual(empty(204))
      const events = yield* k.eventCount(id)
      const bogus = { "Rebuno-Dispatch-Id": UNKNOWN_DISPATCH, "Rebuno-Dispatch-Attempt": "9" }
      for (const l of [lease, bogus]) {
        expect(yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("a"), l)).toEqual(json(200, "{\"decision\":\"execution_terminal\"}\n"))
        expect(yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("new"), l)).toEqual(json(200, "{\"decision\":\"execution_terminal\"}\n"))
        expect(yield* k.agent("POST", `/v0/executions/${id}/steps/${sid}/complete`, "{}", l)).toEqual(json(200, "{\"decision\":\"execution_terminal\"}\n"))
        expect(yield* k.agent("POST", `/v0/executions/${id}/steps/${sid}/fail`, "{}", l)).toEqual(json(200, "{\"decision\":\"execution_terminal\"}\n"))
        expect(yield* k.agent("POST", `/v0/executions/${id}/complete`, "{}", l)).toEqual(json(409, TERMINAL))
        expect(yield* k.agent("POST", `/v0/executions/${id}/fail`, "{\"error\":\"x\"}", l)).toEqual(json(409, TERMINAL))
        expect(yield* k.agent("POST", `/v0/executions/${id}/heartbeat`, "", l)).toEqual(json(409, SUPERSEDED))
      }
      // the step's status is terminal too (cancelled): still execution_terminal, nothing written
      expect(yield* k.eventCount(id)).toBe(events)
      // lease headers are still validated first (6.0 step 4)
      expect(yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("a"), { ...lease, "Rebuno-Dispatch-Attempt": "0" }))
        .toEqual(json(400, BAD_ATTEMPT))
    }))

  it.live("5.6: RENEW and CHECK refuse a dispatch of another execution and any other attempt; nothing changes", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const x = yield* k.running
      const y = yield* k.running
      const sid = JSON.parse((yield* k.agent("POST", `/v0/executions/${x.id}/steps`, tool("a"), x.lease)).body).step_id
      const events = yield* k.eventCount(x.id)
      const leases: ReadonlyArray<Headers> = [
        y.lease,
        { ...x.lease, "Rebuno-Dispatch-Attempt": "2" },
        { ...x.lease, "Rebuno-Dispatch-Id": UNKNOWN_DISPATCH }
      ]
      for (const lease of leases) {
        expect(yield* k.agent("POST", `/v0/executions/${x.id}/steps`, tool("b"), lease)).toEqual(json(409, SUPERSEDED))
        expect(yield* k.agent("POST", `/v0/executions/${x.id}/heartbeat`, "", lease)).toEqual(json(409, SUPERSEDED))
        expect(yield* k.agent("POST", `/v0/executions/${x.id}/steps/${sid}/complete`, "{}", lease)).toEqual(json(409, SUPERSEDED))
        expect(yield* k.agent("POST", `/v0/executions/${x.id}/steps/${sid}/fail`, "{}", lease)).toEqual(json(409, SUPERSEDED))
        expect(yield* k.agent("POST", `/v0/executions/${x.id}/complete`, "{}", lease)).toEqual(json(409, SUPERSEDED))
        expect(yield* k.agent("POST", `/v0/executions/${x.id}/fail`, "{\"error\":\"x\"}", lease)).toEqual(json(409, SUPERSEDED))
      }
      expect(yield* k.eventCount(x.id)).toBe(events)
      // a refused submit consumed no occurrence (8.4): the next identical call of the lease holder is occurrence 0
      const b = JSON.parse((yield* k.agent("POST", `/v0/executions/${x.id}/steps`, tool("b"), x.lease)).body)
      const step = JSON.parse((yield* k.bearer("GET", `/v0/executions/${x.id}/steps/${b.step_id}`)).body)
      expect(step.occurrence).toBe(0)
    }))

  it.live("5.6, 9.2: once blocked, every RENEW of the run is superseded; its step outcomes still pass CHECK", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      expect(yield* k.bearer("POST", "/v0/policies/audit", JSON.stringify({ bundle: BUNDLE }))).toEqual(empty(204))
      const { id, lease } = yield* k.running
      const a = JSON.parse((yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("a"), lease)).body).step_id
      const gated = JSON.parse((yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("deploy"), lease)).body)
      expect(gated.decision).toBe("blocked")
      expect(yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("c"), lease)).toEqual(json(409, SUPERSEDED))
      expect(yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("deploy"), lease)).toEqual(json(409, SUPERSEDED))
      expect(yield* k.agent("POST", `/v0/executions/${id}/heartbeat`, "", lease)).toEqual(json(409, SUPERSEDED))
      expect(yield* k.agent("POST", `/v0/executions/${id}/complete`, "{}", lease)).toEqual(json(409, SUPERSEDED))
      expect(yield* k.agent("POST", `/v0/executions/${id}/fail`, "{\"error\":\"x\"}", lease)).toEqual(json(409, SUPERSEDED))
      expect(yield* k.agent("POST", `/v0/executions/${id}/steps/${a}/complete`, "{\"result\":1}", lease))
        .toEqual(json(200, "{\"decision\":\"recorded\"}\n"))
      expect(JSON.parse((yield* k.bearer("GET", `/v0/executions/${id}`)).body).status).toBe("blocked")
      // the approval's new dispatch is a new lease: the old one stays superseded
      expect(yield* k.bearer("POST", `/v0/approvals/${gated.approval_id}/grant`, "{\"decided_by\":\"bob\"}")).toEqual(empty(204))
      const next = yield* k.redeliver(id)
      expect(next["Rebuno-Dispatch-Id"]).not.toBe(lease["Rebuno-Dispatch-Id"])
      expect(next["Rebuno-Dispatch-Attempt"]).toBe("1")
      expect(yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("a"), lease)).toEqual(json(409, SUPERSEDED))
      expect(yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("a"), next))
        .toEqual(json(200, `{"decision":"replay","step_id":"${a}","result":1}\n`))
      expect(yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("deploy"), next))
        .toEqual(json(200, `{"decision":"proceed","step_id":"${gated.step_id}"}\n`))
    }))

  it.live("9.3: the 403 renders decided_by Go-quoted; approvers match exactly; a decided approval is 409 first", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      expect(yield* k.bearer("POST", "/v0/policies/audit", JSON.stringify({ bundle: BUNDLE }))).toEqual(empty(204))
      const { id, lease } = yield* k.running
      const gated = JSON.parse((yield* k.agent("POST", `/v0/executions/${id}/steps`, tool("deploy"), lease)).body)
      const grant = `/v0/approvals/${gated.approval_id}/grant`
      const deny = `/v0/approvals/${gated.approval_id}/deny`
      const forbidden = (quoted: string) => {
        const text = JSON.stringify(`forbidden: ${quoted} is not an approver for this approval`)
          .replace(/</g, "\\u003c")
          .replace(/>/g, "\\u003e")
        return json(403, `{"code":"forbidden","message":${text}}\n`)
      }
      // strconv.Quote: \" \\ \x01 \n \t \x7f \u2028 \u00a0 \u200b escaped; é, 😀 and U+FFFD kept (checked against v0.14.0)
      const weird = "{\"decided_by\":\"a\\\"b\\\\c<é>\\u0001\\n\\t\\u007f\\u2028😀\\ud800\\u00a0\\u200b\"}"
      expect(yield* k.bearer("POST", grant, weird))
        .toEqual(forbidden("\"a\\\"b\\\\c<é>\\x01\\n\\t\\x7f\\u2028😀\ufffd\\u00a0\\u200b\""))
      for (const body of ["{}", "{\"decided_by\":null}", "{\"decided_by\":\"\"}"]) {
        expect(yield* k.bearer("POST", grant, body)).toEqual(forbidden("\"\""))
      }
      expect(yield* k.bearer("POST", deny, "{\"decided_by\":\"BOB\"}")).toEqual(forbidden("\"BOB\""))
      expect(yield* k.bearer("POST", deny, "{\"decided_by\":\"al\\\"ice\",\"rationale\":null}")).toEqual(empty(204))
      for (const [path, by] of [[grant, "carol"], [deny, "carol"], [grant, "bob"], [deny, "al\\\"ice"]] as const) {
        expect(yield* k.bearer("POST", path, `{"decided_by":"${by}"}`)).toEqual(json(409, CONFLICT))
      }
      const approval = JSON.parse((yield* k.bearer("GET", `/v0/approvals/${gated.approval_id}`)).body)
      expect(approval).toMatchObject({ status: "denied", decided_by: "al\"ice", approvers: ["al\"ice", "bob"] })
      expect("rationale" in approval).toBe(false)
    }))

  it.live("6.6: the stream route ignores lease headers and the execution's existence, not the signature", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const { id } = yield* k.running
      const body = "{\"seq\":-3,\"data\":\"\"}"
      const garbage = { "Rebuno-Dispatch-Id": "garbage", "Rebuno-Dispatch-Attempt": "-4" }
      expect(yield* k.agent("POST", `/v0/executions/${id}/steps/x/stream`, body, garbage)).toEqual(empty(204))
      expect(yield* k.agent("POST", `/v0/executions/${UNKNOWN}/steps/x/stream`, body)).toEqual(empty(204))
      expect(yield* k.bearer("POST", `/v0/executions/${id}/steps/x/stream`, body)).toEqual(json(401, UNAUTHORIZED))
      for (const bad of ["{\"seq\":1}", "{\"data\":\"x\"}", "{\"seq\":1.0,\"data\":\"x\"}", "{\"seq\":9223372036854775808,\"data\":\"x\"}"]) {
        // Go's int: a missing member is the zero value; 1.0 and out-of-range integers do not decode
        const expected = bad.startsWith("{\"seq\":1}") || bad.startsWith("{\"data\"") ? empty(204) : json(400, VALIDATION)
        expect({ bad, res: yield* k.agent("POST", `/v0/executions/${id}/steps/x/stream`, bad) }).toEqual({ bad, res: expected })
      }
      expect(yield* k.eventCount(id)).toBe(4)
    }))

  it.live("6.7: heartbeat never decodes its body (only signs it)", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const { id, lease } = yield* k.running
      for (const body of ["", "{", "null", "garbage"]) {
        expect(yield* k.agent("POST", `/v0/executions/${id}/heartbeat`, body, lease)).toEqual(empty(204))
      }
      expect(yield* k.agent("POST", `/v0/executions/nope/heartbeat`, "{", lease)).toEqual(json(400, VALIDATION))
    }))

  it.live("6.9, 12.2: {\"error\":null} is the empty reason: no failure_reason, no reason on execution.failed", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const { id, lease } = yield* k.running
      expect(yield* k.agent("POST", `/v0/executions/${id}/fail`, "{\"error\":null}", lease)).toEqual(empty(204))
      const execution = JSON.parse((yield* k.bearer("GET", `/v0/executions/${id}`)).body)
      expect(execution.status).toBe("failed")
      expect("failure_reason" in execution).toBe(false)
      const last = JSON.parse((yield* k.bearer("GET", `/v0/executions/${id}/events?after_seq=4`)).body)
      expect(last).toEqual([
        expect.objectContaining({ type: "execution.failed", payload: { execution_id: id, status: "failed" } })
      ])
    }))

  it.live("11.3: limit and cursor parse like Go (sign, leading zeros; first value wins); filters match exactly", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const ids: Array<string> = []
      for (let i = 0; i < 3; i++) ids.push((yield* k.running).id)
      ids.reverse()
      const list = (query: string) =>
        Effect.map(k.bearer("GET", `/v0/executions?${query}`), (res) => {
          if (res.status !== 200) return res.status
          const page = JSON.parse(res.body)
          return { ids: (page.executions ?? []).map((e: { id: string }) => e.id), next: page.next_cursor }
        })
      expect(yield* list("limit=%2B1")).toEqual({ ids: [ids[0]], next: ids[0] })
      expect(yield* list("limit=01")).toEqual({ ids: [ids[0]], next: ids[0] })
      expect(yield* list("limit=1&limit=x")).toEqual({ ids: [ids[0]], next: ids[0] })
      expect(yield* list("limit=-1")).toEqual({ ids, next: undefined })
      expect(yield* list("limit=201")).toEqual({ ids, next: undefined })
      for (const bad of ["limit=%201", "limit=1%20", "limit=0x10", "limit=99999999999999999999", "limit=x&limit=1", "limit=1e1"]) {
        expect({ bad, res: yield* list(bad) }).toEqual({ bad, res: 400 })
      }
      expect(yield* list("cursor=")).toEqual({ ids, next: undefined })
      expect(yield* list(`cursor=%7B${ids[0]}%7D`)).toEqual({ ids: ids.slice(1), next: undefined })
      expect(yield* list(`cursor=urn:uuid:${ids[1]}`)).toEqual({ ids: ids.slice(2), next: undefined })
      expect(yield* list("status=RUNNING")).toEqual({ ids: [], next: undefined })
      expect(yield* list("agent_id=AUDIT")).toEqual({ ids: [], next: undefined })
      expect(yield* list("status=running&agent_id=audit&limit=2")).toEqual({ ids: ids.slice(0, 2), next: ids[1] })
    }))

  it.live("11.5: after_seq and limit take a sign; fractions and junk are 0; the first value wins", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const { id } = yield* k.running
      const seqs = (query: string) =>
        Effect.map(k.bearer("GET", `/v0/executions/${id}/events?${query}`), (res) =>
          (JSON.parse(res.body) ?? []).map((e: { event_seq: number }) => e.event_seq))
      expect(yield* seqs("after_seq=%2B1")).toEqual([2, 3, 4])
      expect(yield* seqs("after_seq=-5")).toEqual([1, 2, 3, 4])
      expect(yield* seqs("after_seq=1.5")).toEqual([1, 2, 3, 4])
      expect(yield* seqs("after_seq=2&after_seq=0")).toEqual([3, 4])
      expect(yield* seqs("limit=%2B1")).toEqual([1])
      expect(yield* seqs("limit=1e3")).toEqual([1, 2, 3, 4])
      expect(yield* seqs("limit=2&after_seq=1")).toEqual([2, 3])
      // beyond int64: Go's ParseInt gives the bound (its error ignored), not 0
      expect(yield* seqs("after_seq=99999999999999999999")).toEqual([])
      expect(yield* seqs("after_seq=-99999999999999999999")).toEqual([1, 2, 3, 4])
      expect(yield* seqs("limit=99999999999999999999")).toEqual([1, 2, 3, 4])
    }))

  it.live("2.9: routing is on the path as sent unless it is the canonical escaping of the decoded one (Go's RawPath, chi)", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const { id } = yield* k.running
      const textNotFound: Answer = { status: 404, type: "text/plain; charset=utf-8", body: "404 page not found\n" }
      expect(yield* k.bearer("GET", "/v0/health")).toEqual(json(200, "{\"status\":\"ok\"}\n"))
      expect(yield* k.bearer("GET", "/v0/%68ealth")).toEqual(textNotFound)
      expect(yield* k.bearer("GET", "/%760/health")).toEqual(textNotFound)
      expect(yield* k.bearer("GET", `/v0/executions/${id}/%73teps`)).toEqual(textNotFound)
      // the id as sent does not parse
      expect(yield* k.bearer("GET", `/v0/executions/%${id.charCodeAt(0).toString(16)}${id.slice(1)}`)).toEqual(json(400, VALIDATION))
      // canonical escapes are decoded: an agent id with a space
      yield* k.kernel.core.registerAgent({ id: "a b", webhookUrl: "http://127.0.0.1:9/webhook", secret: SECRET })
      expect((yield* k.bearer("GET", "/v0/agents/a%20b")).status).toBe(200)
      expect((yield* k.bearer("GET", "/v0/agents/a%20b%2")).status).toBe(400)
    }))

  it.live("11.4, 11.9, 4.1: cancel never reads its body; empty agent fields are accepted by the admin API", () =>
    Effect.gen(function*() {
      const k = yield* setup()
      const { id } = yield* k.running
      expect(yield* k.bearer("POST", `/v0/executions/${id}/cancel`, "{not json")).toEqual(empty(204))
      expect(yield* k.bearer("POST", `/v0/executions/nope/cancel`, "{}")).toEqual(json(400, VALIDATION))
      expect(yield* k.bearer("POST", `/v0/executions/${UNKNOWN}/cancel`, "x")).toEqual(json(404, NOT_FOUND))
      const empty1 = yield* k.bearer("POST", "/v0/agents", "{}")
      expect(empty1.status).toBe(201)
      expect(empty1.body).toMatch(/^\{"ID":"","WebhookURL":"","Secret":"","PolicyBundle":"","RegisteredAt":"[^"]+"\}\n$/)
      const nulls = yield* k.bearer("POST", "/v0/agents", "{\"id\":\"q\",\"webhook_url\":null,\"secret\":null}")
      expect(nulls.status).toBe(201)
      expect(JSON.parse(nulls.body)).toMatchObject({ ID: "q", WebhookURL: "", Secret: "" })
      expect(yield* k.bearer("POST", "/v0/agents", "{\"id\":\"q\",\"webhook_url\":1}")).toEqual(json(400, VALIDATION))
      // the exact-case key rule: "ID" is an unknown member (16.3 #3)
      expect(yield* k.bearer("POST", "/v0/agents", "{\"id\":\"q\",\"ID\":\"r\"}")).toEqual(json(400, VALIDATION))
    }))

  it.live("17.A (--stage v0.14.0): the dispatch id on submit only; no fencing; heartbeat always 204", () =>
    Effect.gen(function*() {
      const k = yield* setup("v0.14.0")
      const x = yield* k.running
      const y = yield* k.running
      const submit = (headers: Headers) => k.agent("POST", `/v0/executions/${x.id}/steps`, "{\"kind\":\"k\"}", headers)
      const message = (m: string) => json(400, `{"code":"validation_error","message":"validation error: ${m}"}\n`)
      expect(yield* submit({})).toEqual(message("missing dispatch_id"))
      expect(yield* submit({ "Rebuno-Dispatch-Id": "00000000-0000-0000-0000-000000000000" })).toEqual(message("missing dispatch_id"))
      // a value that does not parse is 2.5's plain 400, not "missing"
      expect(yield* submit({ "Rebuno-Dispatch-Id": "nope" })).toEqual(json(400, VALIDATION))
      expect(yield* submit({ "Rebuno-Dispatch-Id": `{${UNKNOWN_DISPATCH}}` })).toEqual(message("unknown dispatch_id"))
      expect(yield* submit({ "Rebuno-Dispatch-Id": UNKNOWN_DISPATCH })).toEqual(message("unknown dispatch_id"))
      expect(yield* submit({ "Rebuno-Dispatch-Id": y.dispatchId })).toEqual(message("dispatch_id belongs to another execution"))
      expect((yield* submit({ "Rebuno-Dispatch-Id": x.dispatchId, "Rebuno-Dispatch-Attempt": "junk" })).status).toBe(200)
      expect(yield* k.agent("POST", `/v0/executions/${UNKNOWN}/heartbeat`)).toEqual(empty(204))
      expect(yield* k.agent("POST", `/v0/executions/nope/heartbeat`)).toEqual(json(400, VALIDATION))
      expect(yield* k.agent("POST", `/v0/executions/${x.id}/heartbeat`, "", { "Rebuno-Dispatch-Id": "nope" })).toEqual(empty(204))
      expect(yield* k.agent("POST", `/v0/executions/${x.id}/complete`, "{}")).toEqual(empty(204))
      expect(yield* k.agent("POST", `/v0/executions/${y.id}/fail`, "{\"error\":\"x\"}")).toEqual(empty(204))
      expect(yield* submit({ "Rebuno-Dispatch-Id": x.dispatchId })).toEqual(json(200, "{\"decision\":\"execution_terminal\"}\n"))
    }))
})
