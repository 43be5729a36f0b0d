import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Fiber, Redacted, Stream } from "effect"
import { TestClock } from "effect/testing"
import * as Signature from "../../src/Signature.js"
import * as Core from "../../src/kernel/Core.js"
import * as Routes from "../../src/kernel/Routes.js"

const decoder = new TextDecoder()
const encoder = new TextEncoder()
const SECRET = "hello-secret"
const JSON_TYPE = "application/json; charset=utf-8"
const VALIDATION = "{\"code\":\"validation_error\",\"message\":\"validation error\"}\n"
const UNAUTHORIZED = "{\"code\":\"unauthorized\",\"message\":\"unauthorized\"}\n"
const BAD_DISPATCH_ID =
  "{\"code\":\"validation_error\",\"message\":\"validation error: bad or missing Rebuno-Dispatch-Id\"}\n"
const BAD_ATTEMPT =
  "{\"code\":\"validation_error\",\"message\":\"validation error: bad or missing Rebuno-Dispatch-Attempt\"}\n"
const UNKNOWN_ID = "0192f1a0-0000-7000-8000-000000000000"

type HeaderInput = Readonly<Record<string, string | ReadonlyArray<string>>>

const request = (
  method: string,
  url: string,
  options: { readonly headers?: HeaderInput; readonly body?: string | Uint8Array | Routes.KernelRequest["body"] } = {}
): Routes.KernelRequest => {
  const headers = new Map<string, ReadonlyArray<string>>()
  for (const [name, value] of Object.entries(options.headers ?? {})) {
    headers.set(name.toLowerCase(), typeof value === "string" ? [value] : value)
  }
  const body = options.body
  return {
    method,
    url,
    headers: (name) => headers.get(name.toLowerCase()) ?? [],
    body: body === undefined ? new Uint8Array(0) : typeof body === "string" ? encoder.encode(body) : body
  }
}

const bodyText = (res: Routes.KernelResponse): string => {
  if (typeof res.body === "string") return res.body
  if (res.body instanceof Uint8Array) return decoder.decode(res.body)
  throw new Error("stream body")
}

interface Harness {
  readonly core: Core.KernelCore
  readonly handle: (req: Routes.KernelRequest) => Effect.Effect<Routes.KernelResponse>
  /** Sends a request and returns status, content type and body text. */
  readonly send: (
    method: string,
    url: string,
    options?: { readonly headers?: HeaderInput; readonly body?: string | Uint8Array }
  ) => Effect.Effect<{ readonly status: number; readonly type: string | undefined; readonly body: string }>
  /** Sends an agent-signed request (sha256= over the body). */
  readonly agent: (
    method: string,
    url: string,
    body?: string,
    headers?: HeaderInput
  ) => Effect.Effect<{ readonly status: number; readonly type: string | undefined; readonly body: string }>
}

/** The seed stage unless `settings.stage` says otherwise: these tests pin seed behaviour. */
const harness = (options: Routes.Options = {}, settings: Partial<Core.Settings> = {}) =>
  Effect.gen(function*() {
    const core = yield* Core.make({ stage: "seed", ...settings })
    yield* core.registerAgent({ id: "hello", webhookUrl: "http://localhost:5000/webhook", secret: SECRET })
    const handle = Routes.make(core, options)
    const send: Harness["send"] = (method, url, opts = {}) =>
      Effect.map(handle(request(method, url, opts)), (res) => ({
        status: res.status,
        type: res.headers["content-type"],
        body: bodyText(res)
      }))
    const agent: Harness["agent"] = (method, url, body = "", headers = {}) =>
      Effect.flatMap(Signature.sign(SECRET, body), (signature) =>
        send(method, url, {
          body,
          headers: { "Rebuno-Agent-Id": "hello", "Rebuno-Signature": signature, ...headers }
        }))
    return { core, handle, send, agent } satisfies Harness
  })

/** Creates an execution and claims its dispatch: returns the id and lease headers. */
const running = (h: Harness) =>
  Effect.gen(function*() {
    const created = yield* h.send("POST", "/v0/executions", { body: "{\"agent_id\":\"hello\",\"input\":{\"q\":1}}" })
    expect(created.status).toBe(201)
    const id = JSON.parse(created.body).id as string
    const claims = yield* h.core.claimDue(10)
    const claim = claims.find((c) => c.executionId === id)!
    return {
      id,
      lease: { "Rebuno-Dispatch-Id": claim.dispatchId, "Rebuno-Dispatch-Attempt": String(claim.attempt) }
    }
  })

const SUBMIT = "{\"kind\":\"tool_call\",\"target\":\"web_search\",\"args\":{\"query\":\"hello\"},\"idempotency\":\"safe_to_retry\"}"

describe("Routes", () => {
  describe("operational routes and routing errors", () => {
    it.effect("health and ready answer exact JSON bytes", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const health = yield* h.handle(request("GET", "/v0/health"))
        expect(health.status).toBe(200)
        expect(health.headers).toEqual({ "content-type": JSON_TYPE })
        expect(bodyText(health)).toBe("{\"status\":\"ok\"}\n")
        const ready = yield* h.send("GET", "/v0/ready")
        expect(ready).toEqual({ status: 200, type: JSON_TYPE, body: "{\"status\":\"ready\"}\n" })
      }))

    it.effect("unknown paths are a plain-text 404, wrong methods an empty 405", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        for (const path of ["/v0/nope", "/v0/executions/", "/", "/v0/executions/x/y/z/w/v"]) {
          const res = yield* h.send("GET", path)
          expect(res).toEqual({ status: 404, type: "text/plain; charset=utf-8", body: "404 page not found\n" })
        }
        const res = yield* h.handle(request("PUT", "/v0/health"))
        expect(res.status).toBe(405)
        expect(res.headers["content-type"]).toBeUndefined()
        expect(bodyText(res)).toBe("")
        const del = yield* h.send("DELETE", "/v0/executions")
        expect(del.status).toBe(405)
      }))

    it.effect("metrics answers Prometheus text", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const res = yield* h.send("GET", "/metrics")
        expect(res.status).toBe(200)
        expect(res.type).toMatch(/^text\/plain/)
        expect(res.body).toContain("rebuno_dev_kernel_up 1\n")
      }))
  })

  describe("bearer auth", () => {
    it.effect("dev mode passes every request", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        expect((yield* h.send("GET", "/v0/agents")).status).toBe(200)
        expect((yield* h.send("GET", "/v0/agents", { headers: { Authorization: "garbage" } })).status).toBe(200)
      }))

    it.effect("with a token: exact Bearer prefix and exact token", () =>
      Effect.gen(function*() {
        const h = yield* harness({ apiToken: Redacted.make("s3cret") })
        const cases: ReadonlyArray<readonly [HeaderInput, number]> = [
          [{}, 401],
          [{ Authorization: "bearer s3cret" }, 401],
          [{ Authorization: "Bearer  s3cret" }, 401],
          [{ Authorization: "Bearer S3CRET" }, 401],
          [{ Authorization: "Bearer s3cret2" }, 401],
          [{ Authorization: "Bearer s3cret" }, 200]
        ]
        for (const [headers, status] of cases) {
          const res = yield* h.send("GET", "/v0/approvals", { headers })
          expect(res.status).toBe(status)
          if (status === 401) expect(res.body).toBe(UNAUTHORIZED)
        }
        // health needs no auth
        expect((yield* h.send("GET", "/v0/health")).status).toBe(200)
      }))
  })

  describe("agent auth (3.3)", () => {
    it.effect("missing headers, unknown agent, bad or uppercase signature are 401", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const url = "/v0/executions/" + UNKNOWN_ID + "/heartbeat"
        const good = yield* Signature.sign(SECRET, "")
        const cases: ReadonlyArray<HeaderInput> = [
          {},
          { "Rebuno-Agent-Id": "hello" },
          { "Rebuno-Signature": good },
          { "Rebuno-Agent-Id": "", "Rebuno-Signature": good },
          { "Rebuno-Agent-Id": "nobody", "Rebuno-Signature": good },
          { "Rebuno-Agent-Id": "hello", "Rebuno-Signature": good.toUpperCase().replace("SHA256=", "sha256=") },
          { "Rebuno-Agent-Id": "hello", "Rebuno-Signature": good.slice("sha256=".length) },
          { "Rebuno-Agent-Id": "hello", "Rebuno-Signature": "sha512=" + good.slice(7) },
          { "Rebuno-Agent-Id": "hello", "Rebuno-Signature": (yield* Signature.sign("other", "")) }
        ]
        for (const headers of cases) {
          const res = yield* h.send("POST", url, { headers })
          expect(res).toEqual({ status: 401, type: JSON_TYPE, body: UNAUTHORIZED })
        }
        // with the right signature the request reaches the lease checks
        const ok = yield* h.agent("POST", url)
        expect(ok.body).toBe(BAD_DISPATCH_ID)
      }))

    it.effect("the signature covers the exact body bytes", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id, lease } = yield* running(h)
        const signature = yield* Signature.sign(SECRET, SUBMIT)
        const tampered = yield* h.send("POST", `/v0/executions/${id}/steps`, {
          body: SUBMIT + " ",
          headers: { "Rebuno-Agent-Id": "hello", "Rebuno-Signature": signature, ...lease }
        })
        expect(tampered.status).toBe(401)
      }))

    it.effect("dual routes take the agent path as soon as an agent header is present", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id } = yield* running(h)
        expect((yield* h.send("GET", `/v0/executions/${id}`)).status).toBe(200)
        const bad = yield* h.send("GET", `/v0/executions/${id}`, { headers: { "Rebuno-Agent-Id": "hello" } })
        expect(bad.status).toBe(401)
        const badSig = yield* h.send("GET", `/v0/executions/${id}/steps`, {
          headers: { "Rebuno-Signature": "sha256=00" }
        })
        expect(badSig.status).toBe(401)
        const signed = yield* h.agent("GET", `/v0/executions/${id}`)
        expect(signed.status).toBe(200)
        expect(JSON.parse(signed.body).status).toBe("running")
      }))

    it.effect("bearer-only routes ignore agent headers", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const res = yield* h.send("GET", "/v0/approvals", { headers: { "Rebuno-Agent-Id": "nobody" } })
        expect(res).toEqual({ status: 200, type: JSON_TYPE, body: "null\n" })
      }))

    it.effect("accepts v1= signatures inside the ±300 s window", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id, lease } = yield* running(h)
        const target = `/v0/executions/${id}/heartbeat`
        const now = 1_700_000_000
        yield* TestClock.setTime(now * 1000)
        const v1 = (timestamp: number) =>
          Signature.signV1(SECRET, {
            method: "POST",
            target,
            timestamp: String(timestamp),
            dispatchId: lease["Rebuno-Dispatch-Id"],
            dispatchAttempt: lease["Rebuno-Dispatch-Attempt"],
            body: ""
          })
        const send = (timestamp: number, extra: HeaderInput = {}) =>
          Effect.flatMap(v1(timestamp), (signature) =>
            h.send("POST", target, {
              headers: {
                "Rebuno-Agent-Id": "hello",
                "Rebuno-Signature": signature,
                "Rebuno-Timestamp": String(timestamp),
                ...lease,
                ...extra
              }
            }))
        expect((yield* send(now)).status).toBe(204)
        expect((yield* send(now - 300)).status).toBe(204)
        expect((yield* send(now + 300)).status).toBe(204)
        expect((yield* send(now - 301)).status).toBe(401)
        expect((yield* send(now + 301)).status).toBe(401)
        expect((yield* send(now, { "Rebuno-Timestamp": [String(now), String(now)] })).status).toBe(401)
        // signed over the path: another target fails
        const signature = yield* v1(now)
        const other = yield* h.send("POST", `/v0/executions/${id}/heartbeat?x=1`, {
          headers: { "Rebuno-Agent-Id": "hello", "Rebuno-Signature": signature, "Rebuno-Timestamp": String(now), ...lease }
        })
        expect(other.status).toBe(401)
      }))

    it.effect("v1 fixture vector: signature passes, then the non-UUID id is 400", () =>
      Effect.gen(function*() {
        const core = yield* Core.make()
        yield* core.registerAgent({ id: "a", webhookUrl: "", secret: "test-secret" })
        const handle = Routes.make(core)
        yield* TestClock.setTime(1_700_000_000_000)
        const res = yield* handle(request("GET", "/v0/executions/alpha", {
          headers: {
            "Rebuno-Agent-Id": "a",
            "Rebuno-Timestamp": "1700000000",
            "Rebuno-Signature": "v1=d0f262ef4226bcdf886ec35a7ce4cf77286055b563078faca8b307caa8ca5839"
          }
        }))
        expect(res.status).toBe(400)
        expect(bodyText(res)).toBe(VALIDATION)
      }))
  })

  describe("check order (6.0)", () => {
    it.effect("signature → id → body → lease headers", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id, lease } = yield* running(h)
        // bad signature wins over everything
        const unsigned = yield* h.send("POST", "/v0/executions/not-a-uuid/steps", {
          body: "nope",
          headers: { "Rebuno-Agent-Id": "hello", "Rebuno-Signature": "sha256=00" }
        })
        expect(unsigned.status).toBe(401)
        // bad id before bad body
        expect((yield* h.agent("POST", "/v0/executions/not-a-uuid/steps", "nope")).body).toBe(VALIDATION)
        // bad body before lease headers
        expect((yield* h.agent("POST", `/v0/executions/${id}/steps`, "nope")).body).toBe(VALIDATION)
        // then the lease headers
        expect((yield* h.agent("POST", `/v0/executions/${id}/steps`, SUBMIT)).body).toBe(BAD_DISPATCH_ID)
        expect(
          (yield* h.agent("POST", `/v0/executions/${id}/steps`, SUBMIT, {
            "Rebuno-Dispatch-Id": lease["Rebuno-Dispatch-Id"]
          })).body
        ).toBe(BAD_ATTEMPT)
        const ok = yield* h.agent("POST", `/v0/executions/${id}/steps`, SUBMIT, lease)
        expect(ok.status).toBe(200)
        expect(ok.type).toBe(JSON_TYPE)
        expect(ok.body).toMatch(/^\{"decision":"proceed","step_id":"[0-9a-f]{64}"\}\n$/)
      }))

    it.effect("lease header parsing", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id, lease } = yield* running(h)
        const dispatchId = lease["Rebuno-Dispatch-Id"]
        const beat = (headers: HeaderInput) => h.agent("POST", `/v0/executions/${id}/heartbeat`, "", headers)
        const idCases = ["", "nope", "00000000-0000-0000-0000-000000000000", dispatchId + "0"]
        for (const value of idCases) {
          expect((yield* beat({ "Rebuno-Dispatch-Id": value, "Rebuno-Dispatch-Attempt": "1" })).body)
            .toBe(BAD_DISPATCH_ID)
        }
        for (const value of ["", "0", "-1", "1.0", "one", "0x1", " 1", "99999999999999999999"]) {
          expect((yield* beat({ "Rebuno-Dispatch-Id": dispatchId, "Rebuno-Dispatch-Attempt": value })).body)
            .toBe(BAD_ATTEMPT)
        }
        // accepted forms: uppercase / braced UUIDs, leading + and zeros
        for (
          const headers of [
            { "Rebuno-Dispatch-Id": dispatchId.toUpperCase(), "Rebuno-Dispatch-Attempt": "1" },
            { "Rebuno-Dispatch-Id": `{${dispatchId}}`, "Rebuno-Dispatch-Attempt": "+01" },
            { "Rebuno-Dispatch-Id": dispatchId, "Rebuno-Dispatch-Attempt": "001" }
          ]
        ) {
          expect((yield* beat(headers)).status).toBe(204)
        }
        // a stale attempt passes parsing and fails the fence
        const stale = yield* beat({ "Rebuno-Dispatch-Id": dispatchId, "Rebuno-Dispatch-Attempt": "2" })
        expect(stale).toEqual({
          status: 409,
          type: JSON_TYPE,
          body: "{\"code\":\"lease_superseded\",\"message\":\"dispatch lease superseded\"}\n"
        })
      }))

    it.effect("compat v0.14.0: only the dispatch id on submit is required", () =>
      Effect.gen(function*() {
        const h = yield* harness({}, { stage: "v0.14.0" })
        const { id, lease } = yield* running(h)
        const missing = yield* h.agent("POST", `/v0/executions/${id}/steps`, SUBMIT)
        expect(missing.body).toBe(
          "{\"code\":\"validation_error\",\"message\":\"validation error: missing dispatch_id\"}\n"
        )
        const ok = yield* h.agent("POST", `/v0/executions/${id}/steps`, SUBMIT, {
          "Rebuno-Dispatch-Id": lease["Rebuno-Dispatch-Id"]
        })
        expect(JSON.parse(ok.body).decision).toBe("proceed")
        expect((yield* h.agent("POST", `/v0/executions/${id}/heartbeat`)).status).toBe(204)
      }))
  })

  describe("strict body decoding (2.3)", () => {
    it.effect("rejects empty, invalid, non-object, null, trailing and unknown members", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const bad = [
          "",
          " ",
          "{",
          "[]",
          "null",
          "\"x\"",
          "{\"agent_id\":\"hello\"} x",
          "{\"agent_id\":\"hello\"}{}",
          "{\"agent_id\":\"hello\",\"session\":\"s\"}",
          "{\"AGENT_ID\":\"hello\"}",
          "{\"agent_id\":1}",
          "{\"agent_id\":\"hello\",\"agent_version\":true}",
          "\ufeff{\"agent_id\":\"hello\"}"
        ]
        for (const body of bad) {
          const res = yield* h.send("POST", "/v0/executions", { body })
          expect({ body, res }).toEqual({ body, res: { status: 400, type: JSON_TYPE, body: VALIDATION } })
        }
        const ok = yield* h.send("POST", "/v0/executions", {
          body: " \n{\"agent_id\":\"nobody\",\"agent_id\":\"hello\",\"input\":null,\"agent_version\":null}\t\n"
        })
        expect(ok.status).toBe(201)
        const execution = JSON.parse(ok.body)
        expect(execution.agent_id).toBe("hello")
        expect(execution.input).toBeNull()
        expect(execution.agent_version).toBeUndefined()
        expect(execution.status).toBe("running")
      }))

    it.effect("per-route member types on agent routes", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id, lease } = yield* running(h)
        const post = (path: string, body: string) => h.agent("POST", `/v0/executions/${id}${path}`, body, lease)
        expect((yield* post("/steps", "{\"kind\":1}")).body).toBe(VALIDATION)
        expect((yield* post("/steps", "{\"kind\":\"tool_call\",\"resources\":[]}")).body).toBe(VALIDATION)
        expect((yield* post("/fail", "{\"error\":{\"message\":\"x\"}}")).body).toBe(VALIDATION)
        expect((yield* post("/complete", "{\"output\":1,\"state\":{}}")).body).toBe(VALIDATION)
        expect((yield* post("/complete", "")).body).toBe(VALIDATION)
        const streamPath = "/steps/abc/stream"
        expect((yield* post(streamPath, "{\"seq\":1.5,\"data\":\"x\"}")).body).toBe(VALIDATION)
        expect((yield* post(streamPath, "{\"seq\":1e3,\"data\":\"x\"}")).body).toBe(VALIDATION)
        expect((yield* post(streamPath, "{\"seq\":\"1\",\"data\":\"x\"}")).body).toBe(VALIDATION)
        expect((yield* post(streamPath, "{\"seq\":1,\"data\":null}")).status).toBe(204)
        // null for a string member is ""
        const proceed = yield* post("/steps", "{\"kind\":null,\"target\":null,\"args\":null,\"idempotency\":null}")
        const decision = JSON.parse(proceed.body)
        expect(decision.decision).toBe("proceed")
        const step = yield* h.send("GET", `/v0/executions/${id}/steps/${decision.step_id}`)
        expect(JSON.parse(step.body)).toMatchObject({ kind: "", target: "", args: null, idempotency: "safe_to_retry" })
        // complete step with an absent result, then complete the execution with {}
        expect((yield* post(`/steps/${decision.step_id}/complete`, "{}")).body).toBe("{\"decision\":\"recorded\"}\n")
        const done = yield* post("/complete", "{}")
        expect(done).toEqual({ status: 204, type: undefined, body: "" })
        const execution = JSON.parse((yield* h.send("GET", `/v0/executions/${id}`)).body)
        expect(execution.status).toBe("completed")
        expect("output" in execution).toBe(false)
      }))

    it.effect("echoed JSON is compacted and HTML-escaped", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const res = yield* h.send("POST", "/v0/executions", {
          body: "{\"agent_id\":\"hello\",\"input\": {\"b\" : 1.0, \"a\":\"<&>\"}}"
        })
        expect(res.body).toContain("\"input\":{\"b\":1.0,\"a\":\"\\u003c\\u0026\\u003e\"}")
      }))
  })

  describe("body size cap (2.4)", () => {
    it.effect("over 10 MiB: 401 on agent routes, 400 on decoding bearer routes", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id, lease } = yield* running(h)
        const big = new Uint8Array(Routes.maxBodyBytes + 1).fill(0x20)
        const signature = yield* Signature.sign(SECRET, big)
        const agentRes = yield* h.send("POST", `/v0/executions/${id}/complete`, {
          body: big,
          headers: { "Rebuno-Agent-Id": "hello", "Rebuno-Signature": signature, ...lease }
        })
        expect(agentRes.status).toBe(401)
        const bearerRes = yield* h.send("POST", "/v0/executions", { body: big })
        expect(bearerRes).toEqual({ status: 400, type: JSON_TYPE, body: VALIDATION })
        // a streaming reader that reports the overflow
        const res = yield* h.handle(request("POST", "/v0/agents", { body: Effect.fail(new Routes.BodyTooLarge()) }))
        expect(res.status).toBe(400)
        // exactly at the cap is read (and here rejected only as invalid JSON)
        const atCap = new Uint8Array(Routes.maxBodyBytes).fill(0x20)
        const capRes = yield* h.send("POST", "/v0/executions", { body: atCap })
        expect(capRes.body).toBe(VALIDATION)
      }))

    it.effect("routes without a body never read it", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id } = yield* running(h)
        const res = yield* h.handle(
          request("POST", `/v0/executions/${id}/cancel`, { body: Effect.die("must not read") })
        )
        expect(res.status).toBe(204)
        const again = yield* h.send("POST", `/v0/executions/${id}/cancel`)
        expect(again.body).toBe("{\"code\":\"execution_terminal\",\"message\":\"execution terminal\"}\n")
      }))
  })

  describe("lists", () => {
    it.effect("empty lists are null, except terminal steps and agents", () =>
      Effect.gen(function*() {
        const core = yield* Core.make()
        const handle = Routes.make(core)
        const get = (url: string) => Effect.map(handle(request("GET", url)), bodyText)
        expect(yield* get("/v0/agents")).toBe("[]\n")
        expect(yield* get("/v0/approvals")).toBe("null\n")
        expect(yield* get("/v0/executions")).toBe("{\"executions\":null}\n")
        expect(yield* get(`/v0/executions/${UNKNOWN_ID}/events`)).toBe("null\n")
        expect(yield* get(`/v0/executions/${UNKNOWN_ID}/steps`)).toBe("null\n")
        expect(yield* get(`/v0/executions/${UNKNOWN_ID}/steps?status=terminal`)).toBe("[]\n")
        expect(yield* get(`/v0/executions/${UNKNOWN_ID}/steps?status=other`)).toBe("null\n")
        expect(yield* get(`/v0/executions/${UNKNOWN_ID}`)).toBe("{\"code\":\"not_found\",\"message\":\"not found\"}\n")
        expect(yield* get(`/v0/approvals/${UNKNOWN_ID}`)).toBe("{\"code\":\"not_found\",\"message\":\"not found\"}\n")
        expect(yield* get("/v0/approvals/nope")).toBe(VALIDATION)
      }))

    it.effect("execution list paging parameters (11.3)", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const ids: Array<string> = []
        for (let i = 0; i < 3; i++) {
          ids.push(JSON.parse((yield* h.send("POST", "/v0/executions", { body: "{\"agent_id\":\"hello\"}" })).body).id)
          yield* TestClock.adjust(1)
        }
        expect((yield* h.send("GET", "/v0/executions?limit=abc")).body).toBe(VALIDATION)
        expect((yield* h.send("GET", "/v0/executions?limit=1.5")).body).toBe(VALIDATION)
        expect((yield* h.send("GET", "/v0/executions?cursor=xyz")).body).toBe(VALIDATION)
        const all = JSON.parse((yield* h.send("GET", "/v0/executions?limit=0")).body)
        expect(all.executions.map((e: { id: string }) => e.id)).toEqual([...ids].reverse())
        expect(all.next_cursor).toBeUndefined()
        const page = JSON.parse((yield* h.send("GET", "/v0/executions?limit=2")).body)
        expect(page.executions).toHaveLength(2)
        expect(page.next_cursor).toBe(ids[1])
        const rest = JSON.parse(
          (yield* h.send("GET", `/v0/executions?limit=2&cursor=${page.next_cursor.toUpperCase()}`)).body
        )
        expect(rest.executions.map((e: { id: string }) => e.id)).toEqual([ids[0]])
        const filtered = yield* h.send("GET", "/v0/executions?agent_id=other&limit=")
        expect(filtered.body).toBe("{\"executions\":null}\n")
      }))

    it.effect("event paging parameters (11.5)", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id } = yield* running(h)
        const seqs = (url: string) =>
          Effect.map(h.send("GET", url), (res) => (JSON.parse(res.body) ?? []).map((e: { event_seq: number }) => e.event_seq))
        expect(yield* seqs(`/v0/executions/${id}/events`)).toEqual([1, 2, 3])
        expect(yield* seqs(`/v0/executions/${id}/events?after_seq=1`)).toEqual([2, 3])
        expect(yield* seqs(`/v0/executions/${id}/events?after_seq=abc&limit=x`)).toEqual([1, 2, 3])
        expect(yield* seqs(`/v0/executions/${id}/events?limit=1`)).toEqual([1])
        expect(yield* seqs(`/v0/executions/${id}/events?limit=-5`)).toEqual([1, 2, 3])
        expect(yield* seqs(`/v0/executions/${id}/events?after_seq=3`)).toEqual([])
        expect((yield* h.send("GET", `/v0/executions/${id}/events?after_seq=3`)).body).toBe("null\n")
        expect((yield* h.send("GET", "/v0/executions/bad/events")).body).toBe(VALIDATION)
      }))
  })

  describe("agents and approvals admin", () => {
    it.effect("register answers 201 without the secret; strict body; delete is always 204", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const res = yield* h.send("POST", "/v0/agents", {
          body: "{\"id\":\"b\",\"webhook_url\":\"http://x/webhook\",\"secret\":\"shh\"}"
        })
        expect(res.status).toBe(201)
        expect(res.body).toMatch(
          /^\{"ID":"b","WebhookURL":"http:\/\/x\/webhook","Secret":"","PolicyBundle":"","RegisteredAt":"[^"]+"\}\n$/
        )
        const withPolicy = yield* h.send("POST", "/v0/agents", {
          body: "{\"id\":\"b\",\"webhook_url\":\"\",\"secret\":\"\",\"policy_bundle\":\"x\"}"
        })
        expect(withPolicy.body).toBe(VALIDATION)
        const list = JSON.parse((yield* h.send("GET", "/v0/agents")).body)
        expect(list.map((a: { ID: string }) => a.ID)).toEqual(["b", "hello"])
        expect((yield* h.send("GET", "/v0/agents/b")).status).toBe(200)
        expect((yield* h.send("DELETE", "/v0/agents/b")).status).toBe(204)
        expect((yield* h.send("DELETE", "/v0/agents/b")).status).toBe(204)
        expect((yield* h.send("GET", "/v0/agents/b")).status).toBe(404)
      }))

    it.effect("load policy: validation before agent lookup", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const invalid = yield* h.send("POST", "/v0/policies/nobody", { body: "{\"bundle\":\"rules: 3\"}" })
        expect(invalid.status).toBe(400)
        expect(JSON.parse(invalid.body).message).toMatch(/^load policy bundle: validation error: invalid policy bundle: /)
        const missing = yield* h.send("POST", "/v0/policies/nobody", { body: "{\"bundle\":\"\"}" })
        expect(missing.body).toBe("{\"code\":\"not_found\",\"message\":\"load policy bundle: not found\"}\n")
        expect((yield* h.send("POST", "/v0/policies/hello", { body: "{\"bundle\":\"\"}" })).status).toBe(204)
        expect((yield* h.send("POST", "/v0/policies/hello", { body: "{\"bundle\":1}" })).body).toBe(VALIDATION)
      }))

    it.effect("grant/deny check the id, then the body", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        expect((yield* h.send("POST", "/v0/approvals/nope/grant", { body: "x" })).body).toBe(VALIDATION)
        expect((yield* h.send("POST", `/v0/approvals/${UNKNOWN_ID}/grant`, { body: "" })).body).toBe(VALIDATION)
        expect((yield* h.send("POST", `/v0/approvals/${UNKNOWN_ID}/deny`, { body: "{}" })).status).toBe(404)
      }))
  })

  describe("live deltas", () => {
    it.effect("stream route: 7000-byte cap, any step id, 204", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const url = `/v0/executions/${UNKNOWN_ID}/steps/anything/stream`
        const data = (n: number) => JSON.stringify({ seq: 0, data: "é".repeat(n / 2) })
        expect((yield* h.agent("POST", url, data(7000))).status).toBe(204)
        expect((yield* h.agent("POST", url, data(7002))).body).toBe(VALIDATION)
        expect((yield* h.agent("POST", "/v0/executions/x/steps/a/stream", data(2))).body).toBe(VALIDATION)
      }))

    it.effect("SSE frames deltas and keep-alives and never ends", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id } = yield* running(h)
        expect((yield* h.send("GET", "/v0/executions/nope/stream")).body).toBe(VALIDATION)
        const res = yield* h.handle(request("GET", `/v0/executions/${id}/stream`))
        expect(res.status).toBe(200)
        expect(res.headers).toEqual({
          "content-type": "text/event-stream",
          "cache-control": "no-cache",
          connection: "keep-alive"
        })
        const pull = yield* Stream.toPull(res.body as Stream.Stream<Uint8Array>)
        const next = (): Effect.Effect<string, Cause.Done> =>
          Effect.map(pull, (chunk) => chunk.map((b) => decoder.decode(b)).join(""))
        // the first (empty) chunk marks the subscription as live
        expect(yield* next()).toBe("")
        yield* h.agent("POST", `/v0/executions/${id}/steps/s1/stream`, "{\"seq\":0,\"data\":\"<b>\"}")
        expect(yield* next()).toBe("data: {\"step_id\":\"s1\",\"seq\":0,\"data\":\"\\u003cb\\u003e\"}\n\n")
        const keepAlive = yield* Effect.forkChild(next())
        yield* TestClock.adjust("14 seconds")
        yield* TestClock.adjust("1 second")
        expect(yield* Fiber.join(keepAlive)).toBe(": keep-alive\n\n")
        // the execution ending does not end the stream
        yield* h.send("POST", `/v0/executions/${id}/cancel`)
        const more = yield* Effect.forkChild(next())
        yield* TestClock.adjust("15 seconds")
        expect(yield* Fiber.join(more)).toBe(": keep-alive\n\n")
      }))
  })
})
