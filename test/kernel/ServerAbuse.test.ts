/**
 * Adversarial HTTP against the embedded kernel over real sockets (`node:net`):
 * malformed request lines and framing, oversized heads and bodies, request
 * smuggling shapes, pipelining across the synchronous step path and the
 * general one, HTTP/1.0, cut connections, hostile JSON in every route that
 * reads a body, idle and slow clients. Every case asserts what a client sees —
 * an answer with the status the protocol (or HTTP) requires, or a closed
 * connection — and that the kernel still serves another client afterwards.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Option, Redacted, Scope } from "effect"
import * as Crypto from "node:crypto"
import * as Net from "node:net"
import { type Exchange, exchange, type Part, type Response, responses } from "../support/rawHttp.js"
import * as Kernel from "../../src/kernel/index.js"

const SECRET = "abuse-secret"
const VALIDATION = "{\"code\":\"validation_error\",\"message\":\"validation error\"}\n"
const UNAUTHORIZED = "{\"code\":\"unauthorized\",\"message\":\"unauthorized\"}\n"
const MIB10 = 10 * 1024 * 1024

// ---------------------------------------------------------------------------
// Raw sockets (test/support/rawHttp)
// ---------------------------------------------------------------------------

const answers = (x: Exchange): ReadonlyArray<Response> => responses(x.bytes).list

/** One request in one connection that the client closes for the server (`Connection: close`). */
const once = (port: number, request: string | Buffer) =>
  Effect.map(exchange(port, [request], { ceiling: 1900 }), answers)

const head = (method: string, target: string, headers: Readonly<Record<string, string>> = {}, version = "1.1") =>
  `${method} ${target} HTTP/${version}\r\nHost: kernel\r\n` +
  Object.entries(headers).map(([name, value]) => `${name}: ${value}\r\n`).join("") + "\r\n"

const post = (target: string, body: string | Buffer, headers: Readonly<Record<string, string>> = {}) => {
  const bytes = typeof body === "string" ? Buffer.from(body, "utf8") : body
  return Buffer.concat([
    Buffer.from(head("POST", target, { "Content-Type": "application/json", "Content-Length": String(bytes.length), ...headers }), "latin1"),
    bytes
  ])
}

const GET_HEALTH = head("GET", "/v0/health")
const CLOSE = { Connection: "close" }

/** The kernel still answers a fresh client. */
const stillServing = (port: number) =>
  Effect.gen(function*() {
    const [health] = yield* once(port, head("GET", "/v0/health", CLOSE))
    expect(health?.status).toBe(200)
    expect(health?.body).toBe("{\"status\":\"ok\"}\n")
  })

// ---------------------------------------------------------------------------
// Kernels and signed agent requests
// ---------------------------------------------------------------------------

const hmac = (...parts: ReadonlyArray<string | Buffer>) => {
  const h = Crypto.createHmac("sha256", SECRET)
  for (const part of parts) h.update(part)
  return h.digest("hex")
}

interface Lease {
  readonly id: string
  readonly dispatchId: string
  readonly attempt: string
}

/**
 * A kernel of the given stage with agent `a` and one running, claimed
 * execution; `signed` builds a signed agent request (`v1=` in the current
 * stage, `sha256=` in v0.14.0).
 */
const setup = (stage: "current" | "v0.14.0" = "current") =>
  Effect.gen(function*() {
    const kernel = yield* Kernel.start({
      port: 0,
      stage,
      dispatcher: { background: false, deliver: () => Effect.succeed(true) }
    })
    const port = Number(new URL(kernel.url).port)
    yield* kernel.core.registerAgent({ id: "a", webhookUrl: "http://127.0.0.1:1/webhook", secret: SECRET })
    const created = yield* kernel.core.createExecution({ agentId: "a", inputRaw: "{}", agentVersion: undefined })
    const [claim] = yield* kernel.core.claimDue(1)
    const lease: Lease = { id: created.id, dispatchId: claim!.dispatchId, attempt: String(claim!.attempt) }
    const signed = (
      method: string,
      target: string,
      body: string | Buffer = "",
      options: { readonly close?: boolean; readonly version?: string; readonly extra?: Record<string, string> } = {}
    ): Buffer => {
      const bytes = typeof body === "string" ? Buffer.from(body, "utf8") : body
      const timestamp = String(Math.floor(Date.now() / 1000))
      const signature = stage === "current"
        ? "v1=" +
          hmac(`rebuno-request-v1\n${method}\n${target}\n${timestamp}\n${lease.dispatchId}\n${lease.attempt}\n`, bytes)
        : "sha256=" + hmac(bytes)
      const headers: Record<string, string> = {
        "Content-Type": "application/json",
        "Rebuno-Agent-Id": "a",
        "Rebuno-Signature": signature,
        ...(stage === "current" ? { "Rebuno-Timestamp": timestamp } : {}),
        "Rebuno-Dispatch-Id": lease.dispatchId,
        "Rebuno-Dispatch-Attempt": lease.attempt,
        "Content-Length": String(bytes.length),
        ...(options.close === true ? CLOSE : {}),
        ...options.extra
      }
      return Buffer.concat([Buffer.from(head(method, target, headers, options.version), "latin1"), bytes])
    }
    return { kernel, port, lease, signed, base: "/v0/executions/" + created.id }
  })

const submit = (target: string, args = "{}") =>
  `{"kind":"tool_call","target":${JSON.stringify(target)},"args":${args},"idempotency":"safe_to_retry"}`

const PROCEED = /^\{"decision":"proceed","step_id":"[0-9a-f]{64}"\}\n$/

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

describe("the kernel under adversarial HTTP", () => {
  it.live("malformed request lines and heads: refused as Go refuses them, and the connection closed", () =>
    Effect.gen(function*() {
      const { port } = yield* setup()
      const refused: ReadonlyArray<readonly [string, number]> = [
        ["PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 405], // chi's answer to the HTTP/2 preface
        ["GET /v0/health HTTP/9.9\r\nHost: kernel\r\n\r\n", 505]
      ]
      for (const [request, status] of refused) {
        const x = yield* exchange(port, [request])
        expect(x.closed).toBe(true)
        expect(answers(x).map((r) => r.status)).toEqual([status])
      }
      const malformed = [
        "GARBAGE\r\n\r\n",
        "GET /v0/he alth HTTP/1.1\r\nHost: kernel\r\n\r\n",
        "GET /v0/health HTTP/1.1\r\nHost: kernel\r\nNoColon\r\n\r\n",
        "GET /v0/health HTTP/1.1\r\nHost: kernel\r\nX-A: a\0b\r\n\r\n",
        "GET /v0/health\0 HTTP/1.1\r\nHost: kernel\r\n\r\n",
        "GET /v0/health HTTP/1.1\r\n\r\n", // HTTP/1.1 without Host
        Buffer.from([0, 1, 2, 3, 0xff, 0xfe, 13, 10, 13, 10])
      ]
      for (const request of malformed) {
        const x = yield* exchange(port, [request])
        expect(x.closed).toBe(true)
        expect(answers(x).map((r) => r.status)).toEqual([400])
      }
      yield* stillServing(port)
    }))

  it.live("heads up to 1 MiB are read (as Go's default); larger ones get 431 (or the connection reset), and the kernel keeps serving", () =>
    Effect.gen(function*() {
      const { port } = yield* setup()
      const [large] = yield* once(port, head("GET", "/v0/health", { "X-Big": "a".repeat(100_000), ...CLOSE }))
      expect(large?.status).toBe(200)
      const big = [
        head("GET", "/v0/health", { "X-Big": "a".repeat(1_100_000) }),
        head("GET", "/v0/health?" + "a".repeat(1_100_000)),
        "GET /v0/health HTTP/1.1\r\nHost: kernel\r\n" + "X-A: b\r\n".repeat(150_000) + "\r\n"
      ]
      for (const request of big) {
        const x = yield* exchange(port, [request])
        expect(x.closed).toBe(true)
        // Node answers 431 and closes; with unread bytes left the client may see a reset instead.
        for (const r of answers(x)) expect(r.status).toBe(431)
      }
      yield* stillServing(port)
    }))

  it.live("body cap (PROTOCOL 2.4): 400 on a bearer route, 401 on an agent route, by content-length or chunked", () =>
    Effect.gen(function*() {
      const { base, port, signed } = yield* setup()
      // declared over the cap: answered at once, without waiting for the body
      const declared = yield* exchange(port, [head("POST", "/v0/executions", { "Content-Length": String(MIB10 + 1) })])
      expect(answers(declared).map((r) => [r.status, r.body])).toEqual([[400, VALIDATION]])
      // sent over the cap, with and without content-length
      const sent = yield* exchange(port, [post("/v0/executions", Buffer.alloc(MIB10 + 1, 0x20))], { ceiling: 1900 })
      expect(answers(sent).map((r) => [r.status, r.body])).toEqual([[400, VALIDATION]])
      const megabyte = "100000\r\n" + " ".repeat(0x100000) + "\r\n"
      const chunked = yield* exchange(port, [
        head("POST", "/v0/executions", { "Transfer-Encoding": "chunked" }),
        ...Array.from({ length: 11 }, () => megabyte),
        "0\r\n\r\n"
      ], { expect: 1, ceiling: 1900 })
      expect(answers(chunked).map((r) => [r.status, r.body])).toEqual([[400, VALIDATION]])
      // an agent route (the hot submit route declines it: over its own small limit)
      const agent = yield* exchange(port, [signed("POST", base + "/steps", Buffer.alloc(MIB10 + 1, 0x20))], {
        expect: 1,
        ceiling: 1900
      })
      expect(answers(agent).map((r) => [r.status, r.body])).toEqual([[401, UNAUTHORIZED]])
      const agentChunked = yield* exchange(port, [
        head("POST", base + "/complete", {
          "Rebuno-Agent-Id": "a",
          "Rebuno-Signature": "sha256=00",
          "Transfer-Encoding": "chunked"
        }),
        ...Array.from({ length: 11 }, () => megabyte),
        "0\r\n\r\n"
      ], { expect: 1, ceiling: 1900 })
      expect(answers(agentChunked).map((r) => [r.status, r.body])).toEqual([[401, UNAUTHORIZED]])
      yield* stillServing(port)
    }))

  it.live("a body of exactly 10 MiB is accepted", () =>
    Effect.gen(function*() {
      const { port } = yield* setup()
      const body = Buffer.concat([
        Buffer.from("{\"agent_id\":\"a\",\"input\":\""),
        Buffer.alloc(MIB10 - 27, 0x61),
        Buffer.from("\"}")
      ])
      expect(body.length).toBe(MIB10)
      const [created] = answers(yield* exchange(port, [post("/v0/executions", body, CLOSE)], { ceiling: 1900 }))
      expect(created?.status).toBe(201)
    }))

  it.live("malformed chunked framing: 400 and closed; chunk extensions and trailers are fine", () =>
    Effect.gen(function*() {
      const { port } = yield* setup()
      const chunked = head("POST", "/v0/executions", { "Transfer-Encoding": "chunked" })
      for (const framing of ["zz\r\n{}\r\n0\r\n\r\n", "2\r\n{}0\r\n\r\n", "ffffffffffffffffff\r\n{}\r\n0\r\n\r\n", "2\n{}\n0\n\n"]) {
        const x = yield* exchange(port, [chunked + framing])
        expect(x.closed).toBe(true)
        expect(answers(x).map((r) => r.status)).toEqual([400])
      }
      const body = "{\"agent_id\":\"a\"}"
      const size = body.length.toString(16)
      for (const framing of [`${size};ext=1\r\n${body}\r\n0\r\n\r\n`, `${size}\r\n${body}\r\n0\r\nX-Trailer: 1\r\n\r\n`]) {
        const [created] = answers(yield* exchange(port, [chunked + framing], { expect: 1 }))
        expect(created?.status).toBe(201)
      }
      yield* stillServing(port)
    }))

  it.live("smuggling shapes: content-length with transfer-encoding, duplicate content-lengths — 400, closed, nothing smuggled", () =>
    Effect.gen(function*() {
      const { base, port, signed } = yield* setup()
      const smuggled = "GET /v0/ready HTTP/1.1\r\nHost: kernel\r\n\r\n"
      const shapes = [
        head("POST", "/v0/executions", { "Content-Length": "4", "Transfer-Encoding": "chunked" }) + "0\r\n\r\n" + smuggled,
        "POST /v0/executions HTTP/1.1\r\nHost: kernel\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\n{}" + smuggled,
        head("POST", "/v0/executions", { "Content-Length": "2, 2" }) + "{}" + smuggled,
        head("POST", "/v0/executions", { "Content-Length": "-1" }) + "{}" + smuggled,
        head("POST", "/v0/executions", { "Transfer-Encoding": "chunked, gzip" }) + "0\r\n\r\n" + smuggled,
        "POST /v0/executions HTTP/1.1\r\nHost: kernel\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + smuggled
      ]
      for (const request of shapes) {
        const x = yield* exchange(port, [request])
        expect(x.closed).toBe(true)
        // Go's 501 for a coding it does not implement (`chunked, gzip`), its 400 otherwise
        expect(answers(x).map((r) => r.status)).toEqual([request.includes("chunked, gzip") ? 501 : 400])
      }
      // the same on the hot submit route
      const submitted = signed("POST", base + "/steps", submit("dup")).toString("latin1")
      const doubled = submitted.replace(/(Content-Length: \d+\r\n)/, "$1$1")
      const x = yield* exchange(port, [Buffer.from(doubled + smuggled, "latin1")])
      expect(x.closed).toBe(true)
      expect(answers(x).map((r) => r.status)).toEqual([400])
      yield* stillServing(port)
    }))

  it.live("pipelining: hot step routes and ordinary GETs in one write are answered in order", () =>
    Effect.gen(function*() {
      const { base, kernel, port, signed } = yield* setup()
      const first = answers(yield* exchange(port, [signed("POST", base + "/steps", submit("s0"))], { expect: 1 }))[0]!
      const stepId = JSON.parse(first.body).step_id as string
      const batch = Buffer.concat([
        Buffer.from(head("GET", "/v0/health")),
        signed("POST", base + "/steps", submit("s1")),
        Buffer.from(head("GET", "/v0/ready")),
        signed("POST", base + "/steps/" + stepId + "/complete", "{\"result\":1}"),
        Buffer.from(head("GET", "/nope")),
        signed("POST", base + "/steps", submit("s1")), // identical: occurrence 1, another step
        signed("POST", base + "/steps/" + "f".repeat(64) + "/fail", "{\"error\":{\"message\":\"x\"}}"),
        Buffer.from(head("GET", base)),
        signed("POST", base + "/steps", "{\"kind\":1}"), // declined by the hot path: the general path's 400
        Buffer.from(head("GET", "/v0/health"))
      ])
      const got = answers(yield* exchange(port, [batch], { expect: 10 }))
      expect(got.map((r) => r.status)).toEqual([200, 200, 200, 200, 404, 200, 404, 200, 400, 200])
      expect(got[0]!.body).toBe("{\"status\":\"ok\"}\n")
      expect(got[1]!.body).toMatch(PROCEED)
      expect(got[2]!.body).toBe("{\"status\":\"ready\"}\n")
      expect(got[3]!.body).toBe("{\"decision\":\"recorded\"}\n")
      expect(got[4]!.body).toBe("404 page not found\n")
      expect(got[5]!.body).toMatch(PROCEED)
      expect(got[5]!.body).not.toBe(got[1]!.body)
      expect(JSON.parse(got[7]!.body).id).toBe(base.slice("/v0/executions/".length))
      expect(got[8]!.body).toBe(VALIDATION)
      expect(got[9]!.body).toBe("{\"status\":\"ok\"}\n")
      // a bad signature in the middle of a pipeline does not disturb its neighbours
      const mixed = Buffer.concat([
        signed("POST", base + "/steps", submit("s2")),
        Buffer.from(signed("POST", base + "/steps", submit("s3")).toString("latin1").replace(/=([0-9a-f])/, "=0$1"), "latin1"),
        Buffer.from(GET_HEALTH)
      ])
      const second = answers(yield* exchange(port, [mixed], { expect: 3 }))
      expect(second.map((r) => r.status)).toEqual([200, 401, 200])
      expect(second[1]!.body).toBe(UNAUTHORIZED)
      expect((yield* kernel.core.listSteps(base.slice("/v0/executions/".length), false)).length).toBe(4)
    }))

  it.live("HTTP/1.0: closed after one answer unless keep-alive, on the hot path and the general one", () =>
    Effect.gen(function*() {
      const { base, port, signed } = yield* setup()
      const plain = yield* exchange(port, [head("GET", "/v0/health", {}, "1.0")])
      expect(plain.closed).toBe(true)
      expect(answers(plain).map((r) => [r.status, r.headers.connection])).toEqual([[200, "close"]])
      const kept = yield* exchange(port, [
        head("GET", "/v0/health", { Connection: "keep-alive" }, "1.0") + head("GET", "/v0/ready", {}, "1.0")
      ])
      expect(kept.closed).toBe(true)
      expect(answers(kept).map((r) => [r.status, r.headers.connection])).toEqual([[200, "keep-alive"], [200, "close"]])
      const hot = yield* exchange(port, [signed("POST", base + "/steps", submit("h10"), { version: "1.0" })])
      expect(hot.closed).toBe(true)
      expect(answers(hot).map((r) => r.status)).toEqual([200])
      expect(answers(hot)[0]!.body).toMatch(PROCEED)
      const hotKept = yield* exchange(port, [
        signed("POST", base + "/steps", submit("h10ka"), { version: "1.0", extra: { Connection: "keep-alive" } }),
        head("GET", "/v0/health", {}, "1.0")
      ])
      expect(answers(hotKept).map((r) => [r.status, r.headers.connection])).toEqual([[200, "keep-alive"], [200, "close"]])
      // a 1.0 POST without a length has no body framing: 400
      const unframed = yield* exchange(port, ["POST /v0/executions HTTP/1.0\r\n\r\n{}"], { end: true })
      expect(answers(unframed).map((r) => r.status)).toEqual([400])
    }))

  it.live("connections cut mid-body on the general path; a half-closed pipeline still gets its earlier answers", () =>
    Effect.gen(function*() {
      const { base, port, signed } = yield* setup()
      const create = post("/v0/executions", "{\"agent_id\":\"a\",\"input\":1}")
      for (let i = 0; i < 5; i++) {
        // reset, and half-closed (the client sends FIN): Node answers 400 to the unfinished request
        const reset = yield* exchange(port, [create.subarray(0, create.length - 5), 20], { ceiling: 100 })
        expect(answers(reset)).toEqual([])
      }
      const halfClosed = yield* exchange(port, [create.subarray(0, create.length - 5)], { end: true })
      expect(halfClosed.closed).toBe(true)
      expect(answers(halfClosed).map((r) => r.status)).toEqual([400])
      // complete hot requests before a cut one on the general path are answered
      const cut = post("/v0/executions", "{\"agent_id\":\"a\"}")
      const pipeline = yield* exchange(port, [
        Buffer.concat([
          signed("POST", base + "/steps", submit("q1")),
          Buffer.from(GET_HEALTH),
          cut.subarray(0, cut.length - 3)
        ])
      ], { end: true })
      expect(answers(pipeline).map((r) => r.status)).toEqual([200, 200, 400])
      expect(answers(pipeline)[0]!.body).toMatch(PROCEED)
      yield* stillServing(port)
    }))

  it.live("Expect: 100-continue is acknowledged before the body (RFC 9110 10.1.1)", () =>
    Effect.gen(function*() {
      const { port } = yield* setup()
      const body = "{\"agent_id\":\"a\"}"
      const x = yield* exchange(port, [
        head("POST", "/v0/executions", { "Content-Length": String(body.length), Expect: "100-continue" })
      ], { expect: 1, ceiling: 1000 })
      expect(answers(x).map((r) => r.status)).toEqual([100])
    }))

  it.live("a connection cut mid-body on the hot step path leaves nothing behind: the kernel still shuts down", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const { base, port, signed } = yield* setup().pipe(Scope.provide(scope))
      const request = signed("POST", base + "/steps", submit("cut"))
      yield* exchange(port, [request.subarray(0, request.length - 10)], { end: true })
      yield* stillServing(port)
      // Scope.close is uninterruptible: wait for it from outside
      const closing = yield* Effect.forkDetach(Scope.close(scope, Exit.void))
      const closed = yield* Fiber.await(closing).pipe(Effect.timeoutOption("3 seconds"))
      expect(Option.isSome(closed)).toBe(true)
    }))

  it.live("lease_timeout_seconds: not a float64 is a 400; beyond Go's longest duration it is ignored, never Infinity on the wire (C.10, 2.3)", () =>
    Effect.gen(function*() {
      const { port } = yield* setup()
      const register = (id: string, value: string) =>
        once(port, post("/v0/agents", `{"id":"${id}","webhook_url":"http://127.0.0.1:1/w","secret":"s","lease_timeout_seconds":${value}}`, CLOSE))
      const [overflow] = yield* register("inf", "1e400")
      expect([overflow?.status, overflow?.body]).toEqual([400, VALIDATION])
      for (const [id, value] of [["large", "1e308"], ["longest", "9223372037"]] as const) {
        const [large] = yield* register(id, value)
        expect(large?.status).toBe(201)
        expect(JSON.parse(large!.body)).not.toHaveProperty("lease_timeout_seconds")
      }
      const [kept] = yield* register("kept", "9223372036")
      expect(JSON.parse(kept!.body).lease_timeout_seconds).toBe(9223372036)
    }))

  it.live("invalid UTF-8 in a submitted target becomes one U+FFFD per invalid byte (PROTOCOL 8.2, 8.3)", () =>
    Effect.gen(function*() {
      const { base, port, signed } = yield* setup()
      const body = Buffer.concat([
        Buffer.from("{\"kind\":\"tool_call\",\"target\":\"a"),
        Buffer.from([0xe2, 0x82]), // a truncated 3-byte sequence: two invalid bytes
        Buffer.from("b\",\"args\":{},\"idempotency\":\"x\"}")
      ])
      const [submitted] = yield* once(port, signed("POST", base + "/steps", body, { close: true }))
      const stepId = JSON.parse(submitted!.body).step_id as string
      const [step] = yield* once(port, signed("GET", base + "/steps/" + stepId, "", { close: true }))
      expect(JSON.parse(step!.body).target).toBe("a\ufffd\ufffdb")
    }))

  it.live("Expect: 100-continue with a body over the cap is refused at once; an unknown expectation is 417", () =>
    Effect.gen(function*() {
      const { port } = yield* setup()
      const overCap = yield* exchange(port, [
        head("POST", "/v0/executions", { "Content-Length": String(MIB10 * 2), Expect: "100-continue" })
      ])
      expect(answers(overCap).map((r) => [r.status, r.body])).toEqual([[400, VALIDATION]])
      const unknown = yield* exchange(port, [
        head("POST", "/v0/executions", { "Content-Length": "2", Expect: "something" }) + "{}"
      ], { expect: 1 })
      expect(answers(unknown).map((r) => r.status)).toEqual([417])
      yield* stillServing(port)
    }))

  it.live("hostile bytes and JSON in request bodies (PROTOCOL 2.3)", () =>
    Effect.gen(function*() {
      const { base, port, signed } = yield* setup()
      const create = (body: string | Buffer) =>
        Effect.map(once(port, post("/v0/executions", body, CLOSE)), (r) => [r[0]?.status, r[0]?.body] as const)
      const withBom = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from("{\"agent_id\":\"a\"}")])
      expect(yield* create(withBom)).toEqual([400, VALIDATION])
      expect(yield* create(Buffer.from("{\"agent_id\":\"a\"}", "utf16le"))).toEqual([400, VALIDATION])
      expect(yield* create("{\"agent_id\":\"a\",\"input\":\"a\0b\"}")).toEqual([400, VALIDATION]) // raw NUL
      expect(yield* create("{\"agent_id\":\"a\"}\0")).toEqual([400, VALIDATION]) // trailing NUL
      expect(yield* create("null")).toEqual([400, VALIDATION])
      expect(yield* create("")).toEqual([400, VALIDATION])
      const escapedNul = yield* create("{\"agent_id\":\"a\",\"input\":\"a\\u0000b\"}")
      expect(escapedNul[0]).toBe(201)
      expect(JSON.parse(escapedNul[1]!).input).toBe("a\0b")
      // echoed verbatim (2.8): huge number literals, lone surrogate escapes
      const huge = yield* create("{\"agent_id\":\"a\",\"input\":1e999999}")
      expect(huge[1]).toContain("\"input\":1e999999,")
      const long = "9".repeat(100_000)
      expect((yield* create(`{"agent_id":"a","input":${long}}`))[1]).toContain(`"input":${long},`)
      expect((yield* create("{\"agent_id\":\"a\",\"input\":\"\\ud800x\\udc00\"}"))[1]).toContain(
        "\"input\":\"\\ud800x\\udc00\""
      )
      // duplicate keys: the last wins
      const dup = yield* create("{\"agent_id\":\"nobody\",\"agent_id\":\"a\",\"input\":1,\"input\":2}")
      expect(dup[0]).toBe(201)
      expect(JSON.parse(dup[1]!).input).toBe(2)
      // invalid UTF-8 never reaches a 500; in a key it is an unknown member
      const badKey = Buffer.concat([Buffer.from("{\"agent_id\":\"a\",\"in"), Buffer.from([0xff]), Buffer.from("put\":1}")])
      expect(yield* create(badKey)).toEqual([400, VALIDATION])

      // the hot submit route: lone surrogates decode to U+FFFD (8.2), duplicate keys, raw NUL, BOM
      const hot = (body: string | Buffer) =>
        Effect.map(once(port, signed("POST", base + "/steps", body, { close: true })), (r) => [r[0]?.status, r[0]?.body] as const)
      const lone = yield* hot("{\"kind\":\"tool_call\",\"target\":\"\\ud800\",\"args\":{\"\\udc00\":1},\"idempotency\":\"x\"}")
      expect(lone[1]).toMatch(PROCEED)
      const [step] = answers(
        yield* exchange(port, [signed("GET", base + "/steps/" + JSON.parse(lone[1]!).step_id, "", { close: true })])
      )
      expect(JSON.parse(step!.body).target).toBe("\ufffd")
      expect((yield* hot("{\"kind\":\"x\",\"kind\":\"tool_call\",\"target\":\"dk\",\"args\":1,\"args\":{}}"))[1]).toMatch(PROCEED)
      expect(yield* hot("{\"kind\":\"tool_call\",\"target\":\"a\0b\",\"args\":{}}")).toEqual([400, VALIDATION])
      expect(yield* hot(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(submit("bom"))]))).toEqual([
        400,
        VALIDATION
      ])
      const attempt = yield* once(
        port,
        Buffer.from(
          signed("POST", base + "/steps", submit("att"), { close: true }).toString("latin1").replace(
            /Rebuno-Dispatch-Attempt: \d+/,
            "Rebuno-Dispatch-Attempt: 99999999999999999999999"
          ),
          "latin1"
        )
      )
      // the signature no longer matches in the current stage: 401 before the lease check
      expect(attempt[0]?.status).toBe(401)
      yield* stillServing(port)
    }))

  for (const stage of ["current", "v0.14.0"] as const) {
    it.live(`100,000 unclosed '[' in every route that reads a body (${stage}): 400, never a crash or a 500`, () =>
      Effect.gen(function*() {
        const { base, lease, port, signed } = yield* setup(stage)
        const deep = "[".repeat(100_000)
        const closed = "[".repeat(100_000) + "]".repeat(100_000)
        const step = "0".repeat(64)
        const agentRoutes: ReadonlyArray<readonly [string, string, (v: string) => string]> = [
          ["POST", base + "/steps", (v) => `{"kind":"tool_call","target":"t","args":${v},"idempotency":"x"}`],
          ["POST", base + "/steps/" + step + "/complete", (v) => `{"result":${v}}`],
          ["POST", base + "/steps/" + step + "/fail", (v) => `{"error":${v}}`],
          ["POST", base + "/steps/" + step + "/stream", (v) => `{"seq":1,"data":${v}}`],
          ["POST", base + "/complete", (v) => `{"output":${v}}`],
          ["POST", base + "/fail", (v) => `{"error":${v}}`],
          ...(stage === "current"
            ? [
              ["POST", base + "/steps", (v: string) => `{"kind":"tool_call","target":"t","args":{},"resources":${v}}`],
              ["POST", base + "/steps/" + step + "/complete", (v: string) => `{"result":1,"captures":${v}}`],
              ["POST", base + "/complete", (v: string) => `{"state":${v}}`],
              ["POST", base + "/resources", (v: string) => `{"key":"k","driver_id":"d","configuration":${v}}`],
              ["POST", base + "/resources/k/binding", (v: string) => `{"binding":${v}}`],
              ["POST", base + "/resources/checkpoints", (v: string) => `{"captures":${v}}`],
              ["PUT", "/v0/agents/a/metadata", (v: string) => `{"input_schema":${v}}`]
            ] as const
            : [])
        ]
        const bearerRoutes: ReadonlyArray<readonly [string, (v: string) => string]> = [
          ["/v0/executions", (v) => `{"agent_id":"a","input":${v}}`],
          ["/v0/agents", (v) => `{"id":"x","webhook_url":${v}}`],
          ["/v0/policies/a", (v) => `{"bundle":${v}}`],
          ["/v0/approvals/" + lease.id + "/grant", (v) => `{"decided_by":${v}}`],
          ["/v0/approvals/" + lease.id + "/deny", (v) => `{"rationale":${v}}`],
          ...(stage === "current"
            ? [
              ["/v0/executions/" + lease.id + "/fork", (v: string) => `{"session":${v}}`],
              ["/v0/api-keys", (v: string) => `{"name":"k","scopes":${v}}`]
            ] as const
            : [])
        ]
        for (const value of [deep, closed, deep + "]"]) {
          for (const [method, target, body] of agentRoutes) {
            const [r] = yield* once(port, signed(method, target, body(value), { close: true }))
            expect([target, r?.status, r?.body]).toEqual([target, 400, VALIDATION])
          }
          for (const [target, body] of bearerRoutes) {
            const [r] = yield* once(port, post(target, body(value), CLOSE))
            expect([target, r?.status, r?.body]).toEqual([target, 400, VALIDATION])
          }
          // as the whole body
          const [top] = yield* once(port, post("/v0/executions", value, CLOSE))
          expect(top?.status).toBe(400)
        }
        yield* stillServing(port)
      }))
  }

  it.live("a thousand idle connections, half of them with a partial head, do not stop other clients", () =>
    Effect.gen(function*() {
      const { port } = yield* setup()
      const sockets = yield* Effect.promise(() =>
        Promise.all(Array.from({ length: 1000 }, (_, i) =>
          new Promise<Net.Socket>((resolve) => {
            const socket = Net.connect(port, "127.0.0.1")
            socket.on("error", () => {})
            socket.on("connect", () => {
              if (i % 2 === 0) socket.write("GET /v0/health HTTP/1.1\r\nHo")
              resolve(socket)
            })
          })))
      )
      yield* stillServing(port)
      for (const socket of sockets) socket.destroy()
      yield* stillServing(port)
    }))

  it.live("a slow client (one byte per 100 ms) is served, and others are served meanwhile", () =>
    Effect.gen(function*() {
      const { port } = yield* setup()
      const body = "{\"agent_id\":\"a\"}"
      const parts: Array<Part> = [head("POST", "/v0/executions", { "Content-Length": String(body.length), ...CLOSE })]
      for (const c of body) parts.push(100, c)
      const slow = yield* Effect.forkChild(exchange(port, parts, { ceiling: 1950 }))
      yield* stillServing(port)
      yield* stillServing(port)
      const [created] = answers(yield* Fiber.join(slow))
      expect(created?.status).toBe(201)
    }))

  it.live("bearer token (--api-token): exact prefix and value, OWS trimmed, the first Authorization header counts", () =>
    Effect.gen(function*() {
      const kernel = yield* Kernel.start({ port: 0, apiToken: Redacted.make("x") })
      const port = Number(new URL(kernel.url).port)
      const status = (headers: string) =>
        Effect.map(once(port, `GET /v0/agents HTTP/1.1\r\nHost: kernel\r\nConnection: close\r\n${headers}\r\n`), (r) => r[0]?.status)
      expect(yield* status("")).toBe(401)
      expect(yield* status("Authorization: Bearer x\r\n")).toBe(200)
      expect(yield* status("Authorization: Bearer x \r\n")).toBe(200)
      expect(yield* status("authorization: bearer x\r\n")).toBe(401)
      expect(yield* status("Authorization: Bearer  x\r\n")).toBe(401)
      expect(yield* status("Authorization: Bearer\tx\r\n")).toBe(401)
      expect(yield* status("Authorization: Bearer y\r\nAuthorization: Bearer x\r\n")).toBe(401)
      expect(yield* status("Authorization: Bearer x\r\nAuthorization: Bearer y\r\n")).toBe(200)
      expect(yield* status("Authorization: Bearer " + "x".repeat(15_000) + "\r\n")).toBe(401)
      expect(yield* status("Authorization: Bearer \xff\r\n")).toBe(401)
    }))
})
