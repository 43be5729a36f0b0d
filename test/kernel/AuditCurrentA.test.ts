/**
 * Audit of PROTOCOL-CURRENT C.2–C.7 against the embedded kernel: the
 * normative statements (and the edge cases around them) that the other
 * kernel test files leave uncovered, on the wire through the kernel's routes,
 * with the exact status codes and bodies. Each `it` names its section.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import * as Signature from "../../src/Signature.js"
import {
  APPROVE_SEND_EMAIL,
  claim,
  create,
  errorBody,
  EXECUTION_TERMINAL,
  FORBIDDEN,
  type Harness,
  harness,
  type HeaderInput,
  type Lease,
  LEASE_SUPERSEDED,
  leaseOf,
  NOT_FOUND,
  running,
  type Running,
  SECRET,
  seqOf,
  submitSendEmail,
  UNAUTHORIZED,
  UNKNOWN_ID,
  validationError,
  VALIDATION
} from "../support/currentRoutes.js"

type Json = any

const NOW = 1_700_000_000
const SESSION_RULE = "validation error: session must be a nonblank UTF-8 string of at most 256 bytes without NUL"
const KEY_RULE = "validation error: key must match ^[A-Za-z0-9_.-]{1,128}$"

/** A `v1=` signature of agent `hello` with the given header values. */
const signHello = (method: string, target: string, timestamp: string, dispatchId = "", dispatchAttempt = "", body = "") =>
  Signature.signV1(SECRET, { method, target, timestamp, dispatchId, dispatchAttempt, body })

/** A request of agent `hello` with exactly these headers (besides the agent id). */
const sendAs = (h: Harness, method: string, url: string, headers: HeaderInput, body = "") =>
  h.send(method, url, { body, headers: { "Rebuno-Agent-Id": "hello", ...headers } })

const createdId = (h: Harness, body: Record<string, unknown>) =>
  Effect.map(create(h, body), (res) => {
    expect(res.status, res.body).toBe(201)
    return JSON.parse(res.body).id as string
  })

const getExecution = (h: Harness, id: string) =>
  Effect.map(h.send("GET", `/v0/executions/${id}`), (res) => JSON.parse(res.body) as Json)

const submitRaw = (h: Harness, run: Running, body: string, agentId = "hello") =>
  h.agent(agentId, "POST", `/v0/executions/${run.id}/steps`, body, run.lease)

const toolStep = (h: Harness, run: Running, target: string, extra = "") =>
  Effect.map(
    submitRaw(h, run, `{"kind":"tool_call","target":"${target}","args":{}${extra}}`),
    (res) => {
      expect(res.status, res.body).toBe(200)
      return JSON.parse(res.body) as Json
    }
  )

const register = (h: Harness, run: Running, body: string, agentId = "hello", lease: Lease = run.lease) =>
  h.agent(agentId, "POST", `/v0/executions/${run.id}/resources`, body, lease)

const bind = (h: Harness, run: Running, key: string, body: string, agentId = "hello") =>
  h.agent(agentId, "POST", `/v0/executions/${run.id}/resources/${key}/binding`, body, run.lease)

const publish = (h: Harness, run: Running, body: string) =>
  h.agent("hello", "POST", `/v0/executions/${run.id}/resources/checkpoints`, body, run.lease)

const typesAndPayloads = (h: Harness, id: string, from = 0) =>
  Effect.map(h.core.eventLog(id), (log) => log.slice(from).map((e) => [e.type, JSON.parse(e.payload)] as const))

describe("Audit of PROTOCOL-CURRENT C.2–C.7 (embedded kernel)", () => {
  describe("C.2 signatures", () => {
    it.effect("C.2.1: the lease headers are signed on every route: a GET with them signed passes, signed as empty it is 401", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id, lease } = yield* running(h)
        yield* TestClock.setTime(NOW * 1000)
        const path = `/v0/executions/${id}`
        const ts = String(NOW)
        const withLease = yield* signHello("GET", path, ts, lease["Rebuno-Dispatch-Id"], lease["Rebuno-Dispatch-Attempt"])
        const ok = yield* sendAs(h, "GET", path, { "Rebuno-Timestamp": ts, "Rebuno-Signature": withLease, ...lease })
        expect(ok.status).toBe(200)
        expect(JSON.parse(ok.body)).toMatchObject({ id, status: "running" })
        const asEmpty = yield* signHello("GET", path, ts)
        expect(yield* sendAs(h, "GET", path, { "Rebuno-Timestamp": ts, "Rebuno-Signature": asEmpty, ...lease }))
          .toMatchObject({ status: 401, body: UNAUTHORIZED })
        // and an absent header is signed as the empty string
        expect((yield* sendAs(h, "GET", path, { "Rebuno-Timestamp": ts, "Rebuno-Signature": asEmpty })).status).toBe(200)
      }))

    it.effect("C.2.1 (§17.B 1–3): a repeated signature, CR/LF in a lease header, a timestamp not base-10 or absent, no v1= prefix — all 401", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id } = yield* running(h)
        yield* TestClock.setTime(NOW * 1000)
        const path = `/v0/executions/${id}`
        const ts = String(NOW)
        const good = yield* signHello("GET", path, ts)
        const lf = yield* signHello("GET", path, ts, "a\nb")
        const cases: ReadonlyArray<HeaderInput> = [
          { "Rebuno-Timestamp": ts, "Rebuno-Signature": [good, good] },
          { "Rebuno-Timestamp": ts, "Rebuno-Signature": lf, "Rebuno-Dispatch-Id": "a\nb" },
          { "Rebuno-Signature": good },
          { "Rebuno-Timestamp": ts, "Rebuno-Signature": good.slice("v1=".length) }
        ]
        for (const headers of cases) {
          expect(yield* sendAs(h, "GET", path, headers)).toMatchObject({ status: 401, body: UNAUTHORIZED })
        }
        for (const bad of ["1700000000.0", " 1700000000", "0x6553F100", "1.7e9"]) {
          const signature = yield* signHello("GET", path, bad)
          expect(yield* sendAs(h, "GET", path, { "Rebuno-Timestamp": bad, "Rebuno-Signature": signature }), bad)
            .toMatchObject({ status: 401, body: UNAUTHORIZED })
        }
        // base-10 as Go's ParseInt reads it: a sign and leading zeros are fine
        for (const fine of ["+1700000000", "01700000000"]) {
          const signature = yield* signHello("GET", path, fine)
          expect((yield* sendAs(h, "GET", path, { "Rebuno-Timestamp": fine, "Rebuno-Signature": signature })).status, fine)
            .toBe(200)
        }
      }))

    it.effect("C.2.1: the signature covers the raw query as sent; the same signature without it is 401", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id } = yield* running(h)
        yield* TestClock.setTime(NOW * 1000)
        const ts = String(NOW)
        const target = `/v0/executions/${id}/steps?x=a%20b`
        const signed = yield* signHello("GET", target, ts)
        expect(yield* sendAs(h, "GET", target, { "Rebuno-Timestamp": ts, "Rebuno-Signature": signed })).toMatchObject({
          status: 200,
          body: "null\n"
        })
        const pathOnly = yield* signHello("GET", `/v0/executions/${id}/steps`, ts)
        expect(yield* sendAs(h, "GET", target, { "Rebuno-Timestamp": ts, "Rebuno-Signature": pathOnly })).toMatchObject({
          status: 401,
          body: UNAUTHORIZED
        })
      }))

    it.effect("C.2.1: dual route GET …/steps/{step_id}: either agent header takes the agent path; bearer without; another agent's execution is 403", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const step = yield* toolStep(h, run, "t")
        const path = `/v0/executions/${run.id}/steps/${step.step_id}`
        expect(yield* h.send("GET", path, { headers: { "Rebuno-Signature": "v1=00" } })).toMatchObject({
          status: 401,
          body: UNAUTHORIZED
        })
        expect(yield* h.send("GET", path, { headers: { "Rebuno-Agent-Id": "hello" } })).toMatchObject({
          status: 401,
          body: UNAUTHORIZED
        })
        expect(JSON.parse((yield* h.send("GET", path)).body)).toMatchObject({ step_id: step.step_id, status: "executing" })
        expect(JSON.parse((yield* h.agent("hello", "GET", path)).body)).toMatchObject({ step_id: step.step_id })
        expect(yield* h.agent("other", "GET", path)).toMatchObject({ status: 403, body: FORBIDDEN })
      }))
  })

  describe("C.3 agent metadata", () => {
    it.effect("C.3.3: absent members decode as null (204); a null body or trailing bytes are 400; lease headers are ignored", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { lease } = yield* running(h)
        const put = (body: string, headers: HeaderInput = {}) =>
          h.agent("hello", "PUT", "/v0/agents/hello/metadata", body, headers)
        expect(yield* put("{}")).toEqual({ status: 204, headers: {}, body: "" })
        expect((yield* h.core.getAgent("hello")).metadata).toEqual({
          description: null,
          inputSchemaRaw: null,
          outputSchemaRaw: null
        })
        expect((yield* put("{\"description\":\"d\"}")).status).toBe(204)
        expect((yield* h.core.getAgent("hello")).metadata).toMatchObject({ description: "d" })
        for (
          const body of [
            "null",
            "{\"description\":\"d\",\"input_schema\":null,\"output_schema\":null} x",
            "{\"description\":\"\",\"input_schema\":true,\"output_schema\":null}"
          ]
        ) {
          expect(yield* put(body), body).toMatchObject({ status: 400, body: VALIDATION })
        }
        expect((yield* put("{\"description\":\"e\",\"input_schema\":null,\"output_schema\":null}", lease)).status).toBe(204)
        expect((yield* h.core.getAgent("hello")).metadata).toMatchObject({ description: "e" })
      }))
  })

  describe("C.4 sessions, state and idempotent create", () => {
    it.effect("C.4.1: a session label with a lone surrogate or invalid UTF-8 decodes to U+FFFD (valid UTF-8, as Go decodes it) and is accepted", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const surrogate = yield* h.send("POST", "/v0/executions", { body: "{\"agent_id\":\"hello\",\"session\":\"\\ud800\"}" })
        expect(surrogate.status).toBe(201)
        expect(JSON.parse(surrogate.body).session).toBe("\ufffd")
        const encoder = new TextEncoder()
        const bytes = new Uint8Array([
          ...encoder.encode("{\"agent_id\":\"hello\",\"session\":\"x"),
          0xff,
          ...encoder.encode("\"}")
        ])
        const invalid = yield* h.send("POST", "/v0/executions", { body: bytes })
        expect(invalid.status).toBe(201)
        expect(JSON.parse(invalid.body).session).toBe("x\ufffd")
        // NUL stays refused; a tab next to other text is not whitespace-only
        expect(yield* h.send("POST", "/v0/executions", { body: "{\"agent_id\":\"hello\",\"session\":\"a\\u0000\"}" }))
          .toMatchObject({ status: 400, body: validationError(SESSION_RULE) })
        expect((yield* h.send("POST", "/v0/executions", { body: "{\"agent_id\":\"hello\",\"session\":\"\\tx\"}" })).status)
          .toBe(201)
      }))

    it.effect("C.4.1 step 5: the session conflict message quotes the label as Go's %q does, JSON HTML-escaped", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const root = yield* createdId(h, { agent_id: "hello" })
        yield* h.agent("hello", "POST", `/v0/executions/${root}/complete`, "{\"output\":1}", yield* claim(h, root))
        const cases: ReadonlyArray<readonly [string, string]> = [
          ["q\"d", "\"q\\\"d\""],
          ["é", "\"é\""],
          ["tab\tx", "\"tab\\tx\""],
          ["\u00a0x", "\"\\u00a0x\""]
        ]
        for (const [session, quoted] of cases) {
          yield* createdId(h, { agent_id: "other", session })
          const res = yield* create(h, { agent_id: "hello", session, parent_execution_id: root })
          expect(res.status).toBe(409)
          expect(res.body).toBe(errorBody("conflict", `conflict: session ${quoted} already has executions`))
        }
        yield* createdId(h, { agent_id: "other", session: "<&>" })
        const html = yield* create(h, { agent_id: "hello", session: "<&>", parent_execution_id: root })
        expect(html.body).toBe(
          "{\"code\":\"conflict\",\"message\":\"conflict: session \\\"\\u003c\\u0026\\u003e\\\" already has executions\"}\n"
        )
      }))

    it.effect("C.4.1: null members and an empty parent_execution_id are absent", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        for (
          const body of [
            { agent_id: "hello", session: null, idempotency_key: null, parent_execution_id: null, spawned_by: null },
            { agent_id: "hello", parent_execution_id: "" }
          ]
        ) {
          const res = yield* create(h, body)
          expect(res.status).toBe(201)
          expect(Object.keys(JSON.parse(res.body))).toEqual([
            "id",
            "agent_id",
            "input",
            "status",
            "created_at",
            "updated_at"
          ])
          expect(JSON.parse(res.body).status).toBe("running")
        }
      }))

    it.effect("C.4.6: a stored state that is false, 0, \"\" or [] is answered as is, not replaced by the output", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        for (const state of ["false", "0", "\"\"", "[]"]) {
          const session = "s" + state
          const first = yield* createdId(h, { agent_id: "hello", session })
          const res = yield* h.agent(
            "hello",
            "POST",
            `/v0/executions/${first}/complete`,
            `{"output":"out","state":${state}}`,
            yield* claim(h, first)
          )
          expect(res.status).toBe(204)
          const second = yield* createdId(h, { agent_id: "hello", session })
          expect(yield* h.agent("hello", "GET", `/v0/executions/${second}/previous`)).toMatchObject({
            status: 200,
            body: `{"state":${state}}\n`
          })
        }
      }))

    it.effect("C.4.6: a pending execution has no parent yet: {\"state\":null}", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const head = yield* createdId(h, { agent_id: "hello", session: "s" })
        yield* h.agent("hello", "POST", `/v0/executions/${head}/complete`, "{\"output\":1,\"state\":2}", yield* claim(h, head))
        yield* createdId(h, { agent_id: "hello", session: "s" })
        const waiting = yield* createdId(h, { agent_id: "hello", session: "s" })
        expect((yield* getExecution(h, waiting)).status).toBe("pending")
        expect(yield* h.agent("hello", "GET", `/v0/executions/${waiting}/previous`)).toMatchObject({
          status: 200,
          body: "{\"state\":null}\n"
        })
      }))

    it.effect("C.4.7: an empty session filter filters nothing", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        yield* createdId(h, { agent_id: "hello", session: "a" })
        yield* createdId(h, { agent_id: "hello" })
        const res = yield* h.send("GET", "/v0/executions?session=")
        expect(res.status).toBe(200)
        expect(JSON.parse(res.body).executions).toHaveLength(2)
      }))
  })

  describe("C.5 subagents and suspend", () => {
    it.effect("C.5.1: create order — unknown agent (404) and an explicit parent (409) are checked before spawned_by", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const step = yield* toolStep(h, run, "t")
        const spawnedBy = { execution_id: run.id, step_id: step.step_id }
        expect(yield* create(h, { agent_id: "ghost", spawned_by: { execution_id: UNKNOWN_ID, step_id: "x" } }))
          .toMatchObject({ status: 404, body: NOT_FOUND })
        expect(yield* create(h, { agent_id: "hello", parent_execution_id: run.id, spawned_by: spawnedBy })).toMatchObject({
          status: 409,
          body: errorBody("conflict", "conflict: the parent must be a completed execution of the same agent")
        })
        expect(yield* create(h, { agent_id: "other", spawned_by: { execution_id: run.id, step_id: "" } })).toMatchObject({
          status: 400,
          body: validationError("validation error: spawned_by names no step of the parent execution")
        })
        expect(yield* create(h, { agent_id: "other", spawned_by: { execution_id: "", step_id: step.step_id } }))
          .toMatchObject({ status: 400, body: VALIDATION })
      }))

    it.effect("C.5.1: any executing step can have a child, an llm_call included", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const llm = JSON.parse((yield* submitRaw(h, run, "{\"kind\":\"llm_call\",\"target\":\"m\",\"args\":{}}")).body)
        expect(llm.decision).toBe("proceed")
        const res = yield* create(h, { agent_id: "other", spawned_by: { execution_id: run.id, step_id: llm.step_id } })
        expect(res.status).toBe(201)
        expect(JSON.parse(res.body)).toMatchObject({ status: "running", idempotency_key: llm.step_id })
      }))

    it.effect("C.5.2: a child still pending in its own busy session keeps the parent waiting; its end resumes the parent", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const busy = yield* createdId(h, { agent_id: "other", session: "s" })
        const parent = yield* running(h)
        const step = yield* toolStep(h, parent, "delegate")
        const child = yield* createdId(h, {
          agent_id: "other",
          session: "s",
          spawned_by: { execution_id: parent.id, step_id: step.step_id }
        })
        expect((yield* getExecution(h, child)).status).toBe("pending")
        expect(yield* h.agent("hello", "POST", `/v0/executions/${parent.id}/suspend`, "", parent.lease)).toMatchObject({
          status: 200,
          body: "{\"suspended\":true}\n"
        })
        expect((yield* getExecution(h, parent.id)).status).toBe("blocked")
        expect((yield* h.send("POST", `/v0/executions/${busy}/cancel`)).status).toBe(204)
        expect((yield* getExecution(h, child)).status).toBe("running")
        const seq = yield* seqOf(h, parent.id)
        yield* h.agent("other", "POST", `/v0/executions/${child}/complete`, "{\"output\":\"x\"}", yield* claim(h, child))
        expect((yield* typesAndPayloads(h, parent.id, seq)).map(([type]) => type)).toEqual([
          "step.succeeded",
          "execution.resumed",
          "dispatch.queued"
        ])
      }))

    it.effect("C.5.2: an execution blocked on an approval holds no lease: suspend is 409 lease_superseded, nothing written", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        yield* h.core.loadPolicy("hello", APPROVE_SEND_EMAIL)
        const { id, lease } = yield* running(h)
        expect(JSON.parse((yield* submitSendEmail(h, id, lease)).body).decision).toBe("blocked")
        const seq = yield* seqOf(h, id)
        expect(yield* h.agent("hello", "POST", `/v0/executions/${id}/suspend`, "", lease)).toMatchObject({
          status: 409,
          body: LEASE_SUPERSEDED
        })
        expect(yield* seqOf(h, id)).toBe(seq)
      }))

    it.effect("C.5.3: a parent that fails cancels its running children with parent_agent_terminal", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const parent = yield* running(h)
        const step = yield* toolStep(h, parent, "delegate")
        const child = yield* createdId(h, {
          agent_id: "other",
          spawned_by: { execution_id: parent.id, step_id: step.step_id }
        })
        const res = yield* h.agent("hello", "POST", `/v0/executions/${parent.id}/fail`, "{\"error\":\"boom\"}", parent.lease)
        expect(res.status).toBe(204)
        expect(yield* getExecution(h, child)).toMatchObject({ status: "cancelled", failure_reason: "parent_agent_terminal" })
        expect((yield* typesAndPayloads(h, child)).at(-1)).toEqual([
          "execution.cancelled",
          { execution_id: child, reason: "parent_agent_terminal", status: "cancelled" }
        ])
      }))
  })

  describe("C.6 resources and checkpoints", () => {
    it.effect("C.6.1: a key of exactly 128 characters is accepted; non-ASCII and a trailing newline are refused", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const long = "k".repeat(128)
        const res = yield* register(h, run, `{"key":"${long}","driver_id":"d"}`)
        expect(res.status).toBe(200)
        expect(JSON.parse(res.body).key).toBe(long)
        for (const key of ["é", "k\\n", "a/b"]) {
          expect(yield* register(h, run, `{"key":"${key}","driver_id":"d"}`), key).toMatchObject({
            status: 400,
            body: validationError(KEY_RULE)
          })
        }
        // an absent key is the empty key
        expect(yield* register(h, run, "{\"driver_id\":\"d\"}")).toMatchObject({ status: 400, body: validationError(KEY_RULE) })
      }))

    it.effect("C.6.2: every_steps is a strict integer (1e1, 10.0, 2^63 are 400); -0 is 0; null members take their defaults", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        for (const n of ["1e1", "10.0", "9223372036854775808"]) {
          expect(yield* register(h, run, `{"key":"a","driver_id":"d","every_steps":${n}}`), n).toMatchObject({
            status: 400,
            body: VALIDATION
          })
        }
        expect(JSON.parse((yield* register(h, run, "{\"key\":\"a\",\"driver_id\":\"d\",\"every_steps\":-0}")).body))
          .toMatchObject({ every_steps: 0, on_completion: false })
        const nulls = yield* register(
          h,
          run,
          "{\"key\":\"b\",\"driver_id\":\"d\",\"configuration\":null,\"coverage_reuse\":null,\"every_steps\":null,\"on_completion\":null}"
        )
        expect(nulls.body).toBe(
          "{\"key\":\"b\",\"driver_id\":\"d\",\"coverage_reuse\":false,\"every_steps\":0,\"on_completion\":false," +
            `"registered_seq":${(yield* seqOf(h, run.id))},"generation":0,"count":0,"covered":false}\n`
        )
      }))

    it.effect("C.6.2/C.6.3/C.6.6: register, binding and checkpoints renew the lease", () =>
      Effect.gen(function*() {
        const routes: ReadonlyArray<readonly [string, string]> = [
          ["/resources", "{\"key\":\"w\",\"driver_id\":\"d\"}"],
          ["/resources/w/binding", "{\"binding\":1}"],
          ["/resources/checkpoints", "{}"]
        ]
        for (const [path, body] of routes) {
          const h = yield* harness()
          const run = yield* running(h)
          yield* register(h, run, "{\"key\":\"w\",\"driver_id\":\"d\"}")
          yield* TestClock.adjust("100 seconds")
          const res = yield* h.agent("hello", "POST", `/v0/executions/${run.id}${path}`, body, run.lease)
          expect(res.status, path).toBeLessThan(300)
          yield* TestClock.adjust("100 seconds")
          expect(yield* h.core.reclaimStale(), path).toBe(0)
          yield* TestClock.adjust("21 seconds")
          expect(yield* h.core.reclaimStale(), path).toBe(1)
        }
      }))

    it.effect("C.6.3: binding of another agent's execution is 403, of a terminal one 409 execution_terminal; false and {} are bindings", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        yield* register(h, run, "{\"key\":\"w\",\"driver_id\":\"d\"}")
        yield* register(h, run, "{\"key\":\"z\",\"driver_id\":\"d\"}")
        const theirs = yield* running(h, "other")
        expect(yield* bind(h, theirs, "w", "{\"binding\":1}", "hello")).toMatchObject({ status: 403, body: FORBIDDEN })
        const seq = yield* seqOf(h, run.id)
        expect(yield* bind(h, run, "w", "{\"binding\":false}")).toMatchObject({ status: 204, body: "" })
        expect(yield* bind(h, run, "z", "{\"binding\":{}}")).toMatchObject({ status: 204, body: "" })
        expect(yield* typesAndPayloads(h, run.id, seq)).toEqual([
          ["resource.bound", { key: "w", binding: false }],
          ["resource.bound", { key: "z", binding: {} }]
        ])
        yield* h.agent("hello", "POST", `/v0/executions/${run.id}/complete`, "{}", run.lease)
        expect(yield* bind(h, run, "z", "{\"binding\":2}")).toMatchObject({ status: 409, body: EXECUTION_TERMINAL })
      }))

    it.effect("C.6.6: checkpoints on a terminal execution are 409 execution_terminal, nothing written", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        yield* register(h, run, "{\"key\":\"w\",\"driver_id\":\"d\",\"every_steps\":1}")
        yield* h.agent("hello", "POST", `/v0/executions/${run.id}/complete`, "{}", run.lease)
        const seq = yield* seqOf(h, run.id)
        expect(yield* publish(h, run, "{\"captures\":[{\"key\":\"w\",\"generation\":0,\"checkpoint_ref\":\"s\"}]}"))
          .toMatchObject({ status: 409, body: EXECUTION_TERMINAL })
        expect(yield* seqOf(h, run.id)).toBe(seq)
      }))

    it.effect("C.6.5/C.6.6: a capture's generation is an integer as sent: 1.0, 1e0, 10e-1 are 400 and nothing is recorded", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        yield* register(h, run, "{\"key\":\"w\",\"driver_id\":\"d\",\"every_steps\":1}")
        const step = yield* toolStep(h, run, "t", ",\"resources\":[\"w\"]")
        const seq = yield* seqOf(h, run.id)
        for (const generation of ["1.0", "1e0", "10e-1", "-0.0"]) {
          const capture = `[{"key":"w","generation":${generation},"checkpoint_ref":"s"}]`
          const failure = `[{"key":"w","generation":${generation},"error":"e"}]`
          expect(yield* publish(h, run, `{"captures":${capture}}`), generation).toMatchObject({ status: 400, body: VALIDATION })
          expect(yield* publish(h, run, `{"capture_failures":${failure}}`), generation).toMatchObject({
            status: 400,
            body: VALIDATION
          })
          const completed = yield* h.agent(
            "hello",
            "POST",
            `/v0/executions/${run.id}/steps/${step.step_id}/complete`,
            `{"result":1,"captures":${capture}}`,
            run.lease
          )
          expect(completed, generation).toMatchObject({ status: 400, body: VALIDATION })
        }
        expect(yield* seqOf(h, run.id)).toBe(seq)
        // the same capture with an integer generation is recorded
        expect(yield* publish(h, run, "{\"captures\":[{\"key\":\"w\",\"generation\":1,\"checkpoint_ref\":\"s\"}]}"))
          .toMatchObject({ status: 204 })
      }))

    it.effect("C.6.4: resources null is none; a key declared twice is affected once; every_steps 0 is never due", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        yield* register(h, run, "{\"key\":\"w\",\"driver_id\":\"d\"}")
        const none = yield* toolStep(h, run, "t1", ",\"resources\":null")
        expect(none.resources).toEqual([{ key: "w", generation: 1 }])
        expect(JSON.parse((yield* h.core.eventLog(run.id)).at(-1)!.payload)).not.toHaveProperty("resources")
        const twice = yield* toolStep(h, run, "t2", ",\"resources\":[\"w\",\"w\"]")
        expect(twice.resources).toEqual([{ key: "w", generation: 2 }])
        expect(JSON.parse((yield* h.core.eventLog(run.id)).at(-1)!.payload)).toMatchObject({
          resources: ["w"],
          generations: { w: 2 }
        })
        yield* h.agent("hello", "POST", `/v0/executions/${run.id}/steps/${twice.step_id}/complete`, "{\"result\":1}", run.lease)
        expect(JSON.parse((yield* register(h, run, "{\"key\":\"w\",\"driver_id\":\"d\"}")).body)).toMatchObject({
          count: 1,
          generation: 2
        })
        expect((yield* toolStep(h, run, "t3", ",\"resources\":[\"w\"]")).resources).toEqual([{ key: "w", generation: 3 }])
      }))

    it.effect("C.6.4: the unknown-resource message quotes the key as Go's %q (the empty key too); non-string keys are 400", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const seq = yield* seqOf(h, run.id)
        expect(yield* submitRaw(h, run, "{\"kind\":\"tool_call\",\"target\":\"t\",\"resources\":[\"a\\\"b<\"]}")).toMatchObject({
          status: 400,
          body: "{\"code\":\"validation_error\",\"message\":\"validation error: unknown resource \\\"a\\\\\\\"b\\u003c\\\"\"}\n"
        })
        expect(yield* submitRaw(h, run, "{\"kind\":\"tool_call\",\"target\":\"t\",\"resources\":[\"\"]}")).toMatchObject({
          status: 400,
          body: validationError("validation error: unknown resource \"\"")
        })
        expect(yield* submitRaw(h, run, "{\"kind\":\"tool_call\",\"target\":\"t\",\"resources\":[1]}")).toMatchObject({
          status: 400,
          body: VALIDATION
        })
        expect(yield* seqOf(h, run.id)).toBe(seq)
      }))

    it.effect("C.6.4 (interpretation): an llm_call's declaration is ignored entirely, an unregistered key included", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const res = yield* submitRaw(h, run, "{\"kind\":\"llm_call\",\"target\":\"m\",\"args\":{},\"resources\":[\"nope\"]}")
        expect(res.status).toBe(200)
        expect(JSON.parse(res.body)).toEqual({ decision: "proceed", step_id: JSON.parse(res.body).step_id })
      }))

    it.effect("C.6.5/C.6.6: capture entries with members absent take zero values (unknown_resource for the empty key)", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        yield* register(h, run, "{\"key\":\"w\",\"driver_id\":\"d\",\"every_steps\":1}")
        const seq = yield* seqOf(h, run.id)
        const res = yield* publish(
          h,
          run,
          "{\"captures\":[{\"generation\":0,\"checkpoint_ref\":\"x\"},{\"key\":\"w\",\"checkpoint_ref\":\"ok\"}],\"capture_failures\":[{}]}"
        )
        expect(res).toMatchObject({ status: 204, body: "" })
        expect(yield* typesAndPayloads(h, run.id, seq)).toEqual([
          ["resource.checkpoint_failed", { error: "", generation: 0, key: "" }],
          ["resource.checkpoint_failed", { error: "unknown_resource", generation: 0, key: "" }],
          ["resource.checkpointed", { key: "w", generation: 0, checkpoint_ref: "ok", covered_seq: seq }]
        ])
        // null lists are empty
        expect(yield* publish(h, run, "{\"captures\":null,\"capture_failures\":null}")).toMatchObject({ status: 204 })
        expect(yield* seqOf(h, run.id)).toBe(seq + 3)
      }))

    it.effect("C.6.7: an explicit parent (in a new session or none) passes no resources; the session head does", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const parent = yield* createdId(h, { agent_id: "hello", session: "ps" })
        const lease = yield* claim(h, parent)
        yield* register(h, { id: parent, lease }, "{\"key\":\"w\",\"driver_id\":\"d\"}")
        yield* h.agent("hello", "POST", `/v0/executions/${parent}/complete`, "{\"output\":1}", lease)
        const branch = yield* createdId(h, { agent_id: "hello", session: "branch", parent_execution_id: parent })
        const plain = yield* createdId(h, { agent_id: "hello", parent_execution_id: parent })
        const next = yield* createdId(h, { agent_id: "hello", session: "ps" })
        expect((yield* getExecution(h, branch)).parent_execution_id).toBe(parent)
        expect(yield* h.core.listResources(branch)).toEqual([])
        expect(yield* h.core.listResources(plain)).toEqual([])
        expect(yield* h.core.listResources(next)).toMatchObject([{ key: "w", generation: 0, count: 0 }])
      }))
  })

  describe("C.7 forks", () => {
    it.effect("C.7.1: at_seq is a strict integer (1.0 is 400); null or absent is the range error; empty session and policy_bundle are absent", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const latest = yield* seqOf(h, run.id)
        const fork = (body: string, headers: HeaderInput = {}) =>
          h.send("POST", `/v0/executions/${run.id}/fork`, { body, headers })
        expect(yield* fork("{\"at_seq\":1.0}")).toMatchObject({ status: 400, body: VALIDATION })
        const range = validationError(`validation error: at_seq must be between 1 and ${latest}`)
        for (const body of ["{\"at_seq\":null}", "{}", "{\"at_seq\":-1}"]) {
          expect(yield* fork(body), body).toMatchObject({ status: 400, body: range })
        }
        const token = JSON.parse(
          (yield* h.send("POST", "/v0/api-keys", { body: JSON.stringify({ name: "w", scopes: ["executions:write"] }) })).body
        ).token as string
        for (const body of ["{\"at_seq\":1,\"session\":\"\",\"policy_bundle\":\"\"}", "{\"at_seq\":1,\"session\":null,\"policy_bundle\":null}"]) {
          const res = yield* fork(body, { Authorization: `Bearer ${token}` })
          expect(res.status, body).toBe(201)
          const created = JSON.parse(res.body)
          expect(created).toMatchObject({ status: "running", forked_from: run.id, fork_seq: 1 })
          expect(created.session).toBeUndefined()
          expect(JSON.parse((yield* h.core.eventLog(created.id))[1]!.payload).policy_override).toBe(false)
        }
      }))

    it.effect("C.7.2: failed and denied steps are copied and replay as such; the resource counts the failed step only, +1 generation uncovered", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        yield* h.core.loadPolicy(
          "hello",
          "default_action: allow\nrules:\n  - id: no-rm\n    when: { target: rm }\n    then: { decision: deny, reason: nope }\n"
        )
        const run = yield* running(h)
        yield* register(h, run, "{\"key\":\"w\",\"driver_id\":\"d\",\"every_steps\":1}")
        const a = yield* toolStep(h, run, "a", ",\"resources\":[\"w\"]")
        yield* h.agent("hello", "POST", `/v0/executions/${run.id}/steps/${a.step_id}/fail`, "{\"error\":{\"message\":\"x\"}}", run.lease)
        const rm = yield* toolStep(h, run, "rm", ",\"resources\":[\"w\"]")
        expect(rm.decision).toBe("denied")
        const latest = yield* seqOf(h, run.id)
        const res = yield* h.send("POST", `/v0/executions/${run.id}/fork`, { body: `{"at_seq":${latest}}` })
        expect(res.status).toBe(201)
        const fork = JSON.parse(res.body) as Json
        expect(fork.restoration).toEqual({ w: { covered: false } })
        const log = yield* typesAndPayloads(h, fork.id)
        expect(log.map(([type]) => type)).toEqual([
          "execution.created",
          "execution.forked",
          "resource.registered",
          "step.proposed",
          "step.allowed",
          "step.executing",
          "step.failed",
          "step.proposed",
          "step.denied",
          "resource.initialized",
          "execution.started",
          "dispatch.queued"
        ])
        expect(log[9]).toEqual(["resource.initialized", { key: "w", generation: 2 }])
        expect(yield* h.core.listResources(fork.id)).toMatchObject([{ key: "w", generation: 2, count: 1, covered: false }])
        const forkRun: Running = {
          id: fork.id,
          lease: leaseOf((yield* h.core.claimDue(10)).find((c) => c.executionId === fork.id)!)
        }
        const replayA = yield* toolStep(h, forkRun, "a")
        expect(replayA).toEqual({ decision: "replay", step_id: replayA.step_id, error: { message: "x" } })
        expect(yield* toolStep(h, forkRun, "rm")).toMatchObject({ decision: "denied", reason: "nope", rule_id: "no-rm" })
      }))

    it.effect("C.7.1: a pending source can be forked (running, no session); its busy session is a 409", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        yield* createdId(h, { agent_id: "hello", session: "sx" })
        const pending = yield* createdId(h, { agent_id: "hello", session: "sx" })
        const res = yield* h.send("POST", `/v0/executions/${pending}/fork`, { body: "{\"at_seq\":1}" })
        expect(res.status).toBe(201)
        expect(JSON.parse(res.body)).toMatchObject({ status: "running", forked_from: pending, fork_seq: 1 })
        expect(yield* h.send("POST", `/v0/executions/${pending}/fork`, { body: "{\"at_seq\":1,\"session\":\"sx\"}" }))
          .toMatchObject({ status: 409, body: errorBody("conflict", "conflict: session \"sx\" already has executions") })
      }))
  })
})
