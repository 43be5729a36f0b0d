/**
 * The bad-input properties again, over real loopback sockets: the embedded
 * kernel started with `Kernel.start({ port: 0 })` and the agent's webhook
 * served with `Agent.serve`. Fewer runs than in-process (each run starts a
 * kernel), plus the cases only a socket has: bodies over the 10 MiB cap (400 on
 * bearer routes, 401 on agent routes — with and without `Content-Length`),
 * exactly-at-the-cap bodies that must still be accepted, uploads cut off
 * mid-body, chunked uploads reset half way, and bytes that are not HTTP at all.
 * After each of them a health check and a full valid flow prove the process
 * still serves.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Layer, Redacted, Result } from "effect"
import * as fc from "fast-check"
import * as Http from "node:http"
import * as Net from "node:net"
import * as Agent from "../../src/Agent.js"
import * as Kernel from "../../src/kernel/index.js"
import type * as Routes from "../../src/kernel/Routes.js"
import * as Signature from "../../src/Signature.js"
import {
  build,
  checkProperty,
  completes,
  invariants,
  KERNEL_AGENT,
  KERNEL_TOKEN,
  membersText,
  oversizedBody,
  requestPlan,
  propertyTimeout,
  scaledRuns,
  secretArb,
  seedCore,
  send,
  signatureMode,
  stubKernel,
  TEN_MIB,
  validFlow,
  verdict,
  webhookDelivery,
  webhookMembers,
  webhookPlan,
  type World
} from "../support/arbitraries.js"

interface RawResponse {
  readonly status: number
  readonly headers: Http.IncomingHttpHeaders
  readonly body: string
}

/** One raw HTTP/1.1 exchange (no pooling). An SSE answer is cut after its headers. */
const raw = (
  base: string,
  method: string,
  path: string,
  headers: Http.OutgoingHttpHeaders,
  body?: Uint8Array
): Promise<RawResponse> =>
  new Promise((resolve, reject) => {
    const url = new URL(base)
    // Node frames a GET body with neither Content-Length nor chunking: always declare it.
    const framed = body === undefined || body.length === 0 ? headers : { ...headers, "content-length": body.length }
    const req = Http.request(
      { host: url.hostname, port: url.port, method, path, headers: framed, agent: false },
      (res) => {
        if (res.headers["content-type"] === "text/event-stream") {
          resolve({ status: res.statusCode!, headers: res.headers, body: "" })
          req.destroy()
          return
        }
        const chunks: Array<Buffer> = []
        res.on("data", (c: Buffer) => chunks.push(c))
        res.on("end", () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks).toString("utf8") }))
        res.on("error", reject)
      }
    )
    req.on("error", reject)
    req.end(body === undefined ? undefined : Buffer.from(body.buffer, body.byteOffset, body.byteLength))
  })

/**
 * Starts an upload that never finishes: the headers promise `declared` bytes,
 * `sent` bytes follow, then the connection is destroyed. Resolves once the
 * socket is gone (an answer, if any, is ignored).
 */
const abortedUpload = (base: string, path: string, headers: Record<string, string>, declared: number, sent: number) =>
  new Promise<void>((resolve) => {
    const url = new URL(base)
    const socket = Net.connect(Number(url.port), url.hostname, () => {
      const head = [`POST ${path} HTTP/1.1`, `Host: ${url.host}`, `Content-Length: ${declared}`]
      for (const [k, v] of Object.entries(headers)) head.push(`${k}: ${v}`)
      socket.write(head.join("\r\n") + "\r\n\r\n")
      socket.write(Buffer.alloc(sent, 0x7b), () => {
        setTimeout(() => socket.destroy(), 5)
      })
    })
    socket.on("error", () => {})
    socket.on("close", () => resolve())
  })

/** A chunked upload reset after `chunks` chunks (no Content-Length at all). */
const resetChunked = (base: string, path: string, chunks: number, size: number) =>
  new Promise<void>((resolve) => {
    const url = new URL(base)
    const req = Http.request({ host: url.hostname, port: url.port, method: "POST", path, agent: false })
    req.on("error", () => resolve())
    req.on("close", () => resolve())
    let n = 0
    const next = () => {
      if (n++ >= chunks) {
        req.destroy()
        return
      }
      req.write(Buffer.alloc(size, 0x20), next)
    }
    next()
  })

/** Bytes that are not HTTP; Node answers 400 itself and closes. */
const garbage = (base: string, bytes: string) =>
  new Promise<string>((resolve) => {
    const url = new URL(base)
    const socket = Net.connect(Number(url.port), url.hostname, () => socket.end(bytes))
    let answer = ""
    socket.on("data", (c: Buffer) => (answer += c.toString("latin1")))
    socket.on("error", () => {})
    socket.on("close", () => resolve(answer))
  })

const HEADER_NAMES = [
  "content-type",
  "authorization",
  "rebuno-agent-id",
  "rebuno-signature",
  "rebuno-dispatch-id",
  "rebuno-dispatch-attempt"
]

/** The routes' request model sent over a socket; `status: 0` marks an upload aborted on purpose. */
const socketHandle = (base: string) => (req: Routes.KernelRequest): Effect.Effect<Routes.KernelResponse> =>
  Effect.gen(function*() {
    const headers: Http.OutgoingHttpHeaders = {}
    for (const name of HEADER_NAMES) {
      const values = req.headers(name)
      if (values.length > 0) headers[name] = values.length === 1 ? values[0]! : [...values]
    }
    let body: Uint8Array
    if (req.body instanceof Uint8Array) {
      body = req.body
    } else {
      const read = yield* Effect.result(req.body)
      if (Result.isSuccess(read)) {
        body = read.success
      } else if (read.failure._tag === "BodyTooLarge") {
        body = oversizedBody()
      } else {
        const plain: Record<string, string> = {}
        for (const [k, v] of Object.entries(headers)) plain[k] = Array.isArray(v) ? v[0]! : String(v)
        yield* Effect.promise(() => abortedUpload(base, req.url, plain, 1_000, 10))
        return { status: 0, headers: {}, body: "" }
      }
    }
    const res = yield* Effect.promise(() => raw(base, req.method, req.url, headers, body))
    const type = res.headers["content-type"]
    return { status: res.status, headers: type === undefined ? {} : { "content-type": type }, body: res.body }
  })

// The properties check the seed stage's statuses and `sha256=` signatures.
const startKernel = (tokenMode: boolean) =>
  Kernel.start({
    port: 0,
    stage: "seed",
    ...(tokenMode ? { apiToken: Redacted.make(KERNEL_TOKEN) } : {}),
    dispatcher: { deliver: () => Effect.succeed(true), background: false }
  })

const healthy = (url: string) =>
  Effect.gen(function*() {
    const res = yield* Effect.promise(() => raw(url, "GET", "/v0/health", {}))
    expect(res.status).toBe(200)
    expect(res.body).toBe("{\"status\":\"ok\"}\n")
  })

describe("property: bad input over real sockets", () => {
  it.effect("kernel: protocol statuses and exact envelopes over HTTP; the server keeps serving", () =>
    Effect.gen(function*() {
      yield* checkProperty(
        "kernel routes (socket)",
        fc.record({
          tokenMode: fc.boolean(),
          secret: secretArb,
          requests: fc.array(requestPlan, { minLength: 1, maxLength: 3 })
        }),
        ({ requests, secret, tokenMode }) =>
          Effect.gen(function*() {
            const kernel = yield* startKernel(tokenMode)
            const world: World = yield* seedCore(kernel.core, {
              tokenMode,
              secret,
              socket: true,
              handle: socketHandle(kernel.url)
            })
            for (const plan of requests) {
              const built = yield* build(world, plan)
              const record = yield* Effect.result(world.core.getAgent(KERNEL_AGENT))
              const agentSecret = Result.isSuccess(record) ? record.success.secret : undefined
              const expected = agentSecret === undefined || built.body._tag !== "Bytes"
                ? "<none>"
                : yield* Signature.sign(agentSecret, built.body.bytes)
              const res = yield* send(world, built.request)
              if (res.status === 0) continue // an upload aborted on purpose gets no answer
              const problem = verdict(world, built, res, agentSecret, expected)
              if (problem !== undefined) return yield* Effect.die(new Error(problem))
            }
            yield* healthy(kernel.url)
            yield* invariants(world)
            return requests.length + (yield* validFlow(world))
          }).pipe(Effect.scoped),
        { numRuns: scaledRuns(40, 20) }
      )
    }), propertyTimeout)

  it.effect("kernel: the 10 MiB cap (400 bearer, 401 agent), at-the-cap bodies, aborted and non-HTTP input", () =>
    Effect.gen(function*() {
      const kernel = yield* startKernel(false)
      const world = yield* seedCore(kernel.core, {
        tokenMode: false,
        secret: "cap-secret",
        socket: true,
        handle: socketHandle(kernel.url)
      })
      const url = kernel.url
      const VALIDATION = "{\"code\":\"validation_error\",\"message\":\"validation error\"}\n"
      const UNAUTHORIZED = "{\"code\":\"unauthorized\",\"message\":\"unauthorized\"}\n"

      /** `{"agent_id":"hello","input":"aaa…"}` padded to exactly `size` bytes. */
      const padded = (prefix: string, size: number) => {
        const head = Buffer.from(prefix + "\"")
        const out = Buffer.alloc(size, 0x61)
        head.copy(out, 0)
        Buffer.from("\"}").copy(out, size - 2)
        return new Uint8Array(out.buffer, out.byteOffset, out.byteLength)
      }

      // Bearer route: exactly at the cap is decoded (201), one byte more is 400.
      const atCap = yield* Effect.promise(() =>
        raw(url, "POST", "/v0/executions", {}, padded("{\"agent_id\":\"hello\",\"input\":", TEN_MIB))
      )
      expect(atCap.status).toBe(201)
      const overCap = yield* Effect.promise(() =>
        raw(url, "POST", "/v0/executions", {}, padded("{\"agent_id\":\"hello\",\"input\":", TEN_MIB + 1))
      )
      expect([overCap.status, overCap.body]).toEqual([400, VALIDATION])

      // Agent route: a signed body at the cap passes the signature (then the lease
      // check answers), one byte more is 401 — the signature check cannot read it.
      const lease = world.leases.running
      const agentHeaders = (signature: string) => ({
        "rebuno-agent-id": KERNEL_AGENT,
        "rebuno-signature": signature,
        "rebuno-dispatch-id": lease.dispatchId,
        "rebuno-dispatch-attempt": String(lease.attempt)
      })
      const completePath = `/v0/executions/${world.ids.running}/complete`
      const capBody = padded("{\"output\":", TEN_MIB)
      const signedAtCap = yield* Effect.promise(() =>
        Effect.runPromise(Signature.sign("cap-secret", capBody)).then((sig) =>
          raw(url, "POST", completePath, agentHeaders(sig), capBody)
        )
      )
      expect(signedAtCap.status).toBe(204)
      const bigBody = padded("{\"output\":", TEN_MIB + 1)
      const signedOver = yield* Effect.promise(() =>
        Effect.runPromise(Signature.sign("cap-secret", bigBody)).then((sig) =>
          raw(url, "POST", `/v0/executions/${world.ids.blocked}/complete`, agentHeaders(sig), bigBody)
        )
      )
      expect([signedOver.status, signedOver.body]).toEqual([401, UNAUTHORIZED])

      // Over the cap without Content-Length (chunked): counted while reading.
      const chunked = yield* Effect.promise(() =>
        new Promise<RawResponse>((resolve, reject) => {
          const target = new URL(url)
          const req = Http.request(
            { host: target.hostname, port: target.port, method: "POST", path: "/v0/executions", agent: false },
            (res) => {
              const chunks: Array<Buffer> = []
              res.on("data", (c: Buffer) => chunks.push(c))
              res.on("end", () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks).toString() }))
            }
          )
          req.on("error", reject)
          let sent = 0
          const chunk = Buffer.alloc(1024 * 1024, 0x20)
          const write = () => {
            while (sent <= TEN_MIB) {
              sent += chunk.length
              if (!req.write(chunk)) return void req.once("drain", write)
            }
            req.end()
          }
          write()
        })
      )
      expect([chunked.status, chunked.body]).toEqual([400, VALIDATION])
      yield* healthy(url)

      // Uploads cut off mid-body (declared length never arrives), on a bearer and an agent route.
      yield* Effect.promise(() => abortedUpload(url, "/v0/executions", { "content-type": "application/json" }, 1_000, 10))
      yield* Effect.promise(() =>
        abortedUpload(url, completePath, { "rebuno-agent-id": KERNEL_AGENT, "rebuno-signature": "sha256=00" }, 5_000_000, 65_536)
      )
      yield* Effect.promise(() => abortedUpload(url, "/v0/executions", {}, TEN_MIB + 10, 1_000_000))
      // A chunked upload reset half way.
      yield* Effect.promise(() => resetChunked(url, "/v0/agents", 4, 64 * 1024))
      // Not HTTP at all: Node's parser answers 400 and closes; the kernel is untouched.
      const answer = yield* Effect.promise(() => garbage(url, "\u0000\u0001GARBAGE \r\n\r\n"))
      expect(answer.startsWith("HTTP/1.1 400")).toBe(true)
      yield* Effect.promise(() => garbage(url, "POST /v0/executions HTTP/1.1\r\nContent-Length: abc\r\n\r\n"))

      // Still serving, state intact.
      yield* healthy(url)
      yield* invariants(world)
      yield* validFlow(world)
    }))

  it.effect("agent: Agent.serve over a socket — verdicts, the webhook body cap, aborted uploads", () =>
    Effect.gen(function*() {
      const SECRET = "serve-prop-secret"
      const kernel = stubKernel(SECRET)
      const agent = Agent.make({ id: "serve-agent", handler: () => Effect.void })
      // Agent.serve binds a given port: take a free one first.
      const port = yield* Effect.promise(() =>
        new Promise<number>((resolve) => {
          const probe = Net.createServer()
          probe.listen(0, "127.0.0.1", () => {
            const p = (probe.address() as Net.AddressInfo).port
            probe.close(() => resolve(p))
          })
        })
      )
      yield* Layer.launch(Agent.serve(agent, { port, host: "127.0.0.1" }).pipe(Layer.provide(kernel.layer))).pipe(
        Effect.forkScoped
      )
      const base = `http://127.0.0.1:${port}`
      // Wait until it listens.
      for (let i = 0; i < 200; i++) {
        const up = yield* Effect.promise(() => raw(base, "GET", "/", {}).then(() => true, () => false))
        if (up) break
        yield* Effect.promise(() => new Promise((r) => setTimeout(r, 5)))
      }
      const post = (body: Uint8Array, signature: string | undefined, path = "/webhook") =>
        Effect.promise(() =>
          raw(base, "POST", path, signature === undefined ? {} : { "rebuno-signature": signature }, body)
        )

      yield* checkProperty(
        "agent webhook (Agent.serve socket)",
        fc.tuple(fc.uuid({ version: 7 }), fc.uuid({ version: 7 }), fc.integer({ min: 1, max: 3 }), webhookPlan, signatureMode),
        ([executionId, dispatchId, attempt, plan, mode]) =>
          Effect.gen(function*() {
            const d = yield* webhookDelivery(SECRET, executionId, dispatchId, attempt, plan, mode)
            const exit = yield* completes(post(d.bytes, d.signature))
            if (Exit.isFailure(exit)) return yield* Effect.die(new Error(`${d.description}: no answer`))
            const expected = d.bytes.length > Agent.maxWebhookBodyBytes ? 401 : d.expected
            if (exit.value.status !== expected || exit.value.body !== "") {
              return yield* Effect.die(new Error(`${d.description}: got ${exit.value.status}, expected ${expected}`))
            }
            return 1
          }),
        { numRuns: scaledRuns(60, 20) }
      )

      // The cap: declared or streamed over 1 MiB is 401 and never reaches the signature check.
      const valid = new TextEncoder().encode(membersText(webhookMembers("0192f1a0-0000-7000-8000-00000000bbbb", "d", 1)))
      const big = new Uint8Array(Agent.maxWebhookBodyBytes + 1).fill(0x20)
      big.set(valid, 0)
      const bigSignature = yield* Signature.sign(SECRET, big)
      expect((yield* post(big, bigSignature)).status).toBe(401)
      expect((yield* post(oversizedBody(), "sha256=00")).status).toBe(401)
      const atCap = new Uint8Array(Agent.maxWebhookBodyBytes).fill(0x20)
      atCap.set(valid, 0)
      // At the cap the body is read and judged: correctly signed and valid JSON → 200.
      expect((yield* post(atCap, yield* Signature.sign(SECRET, atCap))).status).toBe(200)
      const streamed = yield* Effect.promise(() =>
        new Promise<number | "reset">((resolve) => {
          const req = Http.request(
            { host: "127.0.0.1", port, method: "POST", path: "/webhook", agent: false, headers: { "rebuno-signature": "sha256=00" } },
            (res) => {
              res.resume()
              resolve(res.statusCode!)
            }
          )
          req.on("error", () => resolve("reset"))
          const chunk = Buffer.alloc(256 * 1024, 0x20)
          let sent = 0
          const write = () => {
            while (sent <= 2 * Agent.maxWebhookBodyBytes) {
              sent += chunk.length
              if (!req.write(chunk)) return void req.once("drain", write)
            }
            req.end()
          }
          write()
        })
      )
      // Without Content-Length the receiver stops reading at the cap: 401, or the
      // connection is dropped before the client finished sending.
      expect([401, "reset"]).toContain(streamed)

      // Aborted uploads and non-webhook paths do not hurt it.
      yield* Effect.promise(() => abortedUpload(base, "/webhook", { "rebuno-signature": "sha256=00" }, 1_000, 10))
      yield* Effect.promise(() => abortedUpload(base, "/webhook", {}, Agent.maxWebhookBodyBytes - 1, 100_000))
      expect((yield* post(valid, undefined, "/other")).status).toBe(404)
      expect((yield* Effect.promise(() => raw(base, "GET", "/webhook", {}))).status).toBe(404)

      // Still serving: a valid, signed webhook is accepted.
      const fresh = new TextEncoder().encode(membersText(webhookMembers("0192f1a0-0000-7000-8000-00000000cccc", "d", 1)))
      expect((yield* post(fresh, yield* Signature.sign(SECRET, fresh))).status).toBe(200)
    }), propertyTimeout)
})
