/**
 * The fault matrix over real loopback HTTP (PROTOCOL 5.4, 5.7, 5.8, 14.2, 15):
 * the embedded kernel (`Kernel.start({ port: 0 })`, delivery driven with
 * `dispatcher.tick`), a real agent served by `Agent.serve`, and between the
 * agent and the kernel a small HTTP proxy of our own that can refuse a request
 * (the kernel never sees it) or forward it and then drop the connection (the
 * kernel processed it, the agent never hears back).
 *
 * - a submit lost after the kernel recorded it → the run abandons: that submit
 *   reached the kernel exactly once, heartbeats stop, and once the lease lapses
 *   the kernel redelivers and the run completes with each tool body run the
 *   right number of times (`safe_to_retry` once; `at_most_once` never, reported
 *   `indeterminate`);
 * - complete step, fail step, complete execution lost (before or after the
 *   kernel saw them) → retried with backoff, the run completes, nothing is
 *   recorded twice; a lost heartbeat is retried with the same backoff and
 *   keeps the lease;
 * - a kernel that is down for seconds (a TCP proxy that resets every
 *   connection, or refuses them) during a body, its heartbeats, a step
 *   complete and the execution complete → every outcome is retried until the
 *   kernel is back, within the lease: one delivery, each body run once,
 *   nothing `indeterminate` (issue 13); an outage longer than the lease → the
 *   run gives up when its lease cannot be valid any more, and the kernel
 *   redelivers;
 * - a webhook answered 500, refused, or left unanswered past the webhook
 *   timeout → backoff (1, 2, 4, 8 s) then `dispatch_exhausted` after attempt 5;
 * - the exact signed webhook bytes replayed → one run.
 *
 * Real time is unavoidable over sockets; the kernel's clock is a "warp" clock
 * (wall time plus an offset the test can move) so lease lapses and backoffs are
 * jumped over instead of waited for. The file runs in seconds.
 */
import { NodeHttpClient } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Clock, Deferred, Duration, Effect, Layer, Result, Schema } from "effect"
import * as Http from "node:http"
import * as Net from "node:net"
import * as Agent from "../../src/Agent.js"
import * as Kernel from "../../src/kernel/index.js"
import * as KernelClient from "../../src/KernelClient.js"
import type { ToolError } from "../../src/RebunoError.js"
import * as Signature from "../../src/Signature.js"
import * as Tool from "../../src/Tool.js"
import * as TestLogs from "../support/logging.js"
import { pause } from "../support/realTime.js"

const SECRET = "fault-secret"
const LEASE_MS = 2_000

// ---------------------------------------------------------------------------
// A clock the test can move forward (wall time + offset; sleeps are real)
// ---------------------------------------------------------------------------

const makeWarpClock = () => {
  let offset = 0
  const now = () => Date.now() + offset
  // Monotonic time moves with the warp too (the offset only grows).
  const monotonic = () => process.hrtime.bigint() + BigInt(offset) * 1_000_000n
  const clock: Clock.Clock = {
    currentTimeMillisUnsafe: now,
    currentTimeMillis: Effect.sync(now),
    currentTimeNanosUnsafe: () => BigInt(now()) * 1_000_000n,
    currentTimeNanos: Effect.sync(() => BigInt(now()) * 1_000_000n),
    monotonicTimeNanosUnsafe: monotonic,
    monotonicTimeNanos: Effect.sync(monotonic),
    sleep: (duration) =>
      Effect.callback<void>((resume) => {
        const timer = setTimeout(() => resume(Effect.void), Duration.toMillis(duration))
        return Effect.sync(() => clearTimeout(timer))
      })
  }
  return { clock, warp: (ms: number) => Effect.sync(() => void (offset += ms)) }
}

/**
 * Runs `f` with a fresh warp clock as the `Clock` of everything it starts (the
 * kernel, the agent, their forked fibers); `warp` moves that clock forward.
 * Their log lines (failed deliveries, rejected webhooks) are captured, not
 * printed (test/support/logging.ts).
 */
const withWarpClock = <A, E, R>(f: (warp: (ms: number) => Effect.Effect<void>) => Effect.Effect<A, E, R>) =>
  Effect.suspend(() => {
    const { clock, warp } = makeWarpClock()
    return Effect.provideService(f(warp), Clock.Clock, clock).pipe(Effect.provide(TestLogs.layer))
  })

/** Polls `condition` (real time) until it holds. */
const waitFor = <E, R>(what: string, condition: Effect.Effect<boolean, E, R>, timeoutMs = 10_000) =>
  Effect.gen(function*() {
    const deadline = Date.now() + timeoutMs
    while (Date.now() < deadline) {
      if (yield* condition) return
      yield* pause(10)
    }
    return yield* Effect.die(new Error(`timed out waiting for ${what}`))
  })

const freePort = Effect.promise(() =>
  new Promise<number>((resolve) => {
    const probe = Net.createServer()
    probe.listen(0, "127.0.0.1", () => {
      const port = (probe.address() as Net.AddressInfo).port
      probe.close(() => resolve(port))
    })
  })
)

// ---------------------------------------------------------------------------
// The proxy
// ---------------------------------------------------------------------------

interface Exchange {
  readonly method: string
  readonly path: string
  readonly attempt: string | undefined
  readonly headers: Http.IncomingHttpHeaders
  readonly body: Buffer
  /** Wall time the request arrived. */
  readonly at: number
  readonly action: Action
  /** The kernel's status, when forwarded. */
  status: number | undefined
}

/**
 * `forward`: pass through. `refuse`: drop the connection, the target never sees
 * the request. `dropAfterForward`: the target processes it, then the connection
 * is dropped before the answer.
 */
type Action = "forward" | "refuse" | "dropAfterForward"

type Decide = (request: { readonly method: string; readonly path: string; readonly attempt: string | undefined }) => Action

const HOP_BY_HOP = new Set(["host", "connection", "keep-alive", "transfer-encoding", "content-length"])

const startProxy = (target: string, decide: Decide) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly url: string; readonly log: Array<Exchange>; readonly server: Http.Server }>((resume) => {
      const log: Array<Exchange> = []
      const server = Http.createServer((req, res) => {
        const chunks: Array<Buffer> = []
        req.on("data", (c: Buffer) => chunks.push(c))
        req.on("end", () => {
          const body = Buffer.concat(chunks)
          const method = req.method ?? "GET"
          const path = req.url ?? "/"
          const attemptHeader = req.headers["rebuno-dispatch-attempt"]
          const attempt = Array.isArray(attemptHeader) ? attemptHeader[0] : attemptHeader
          const action = decide({ method, path, attempt })
          const exchange: Exchange = { method, path, attempt, headers: req.headers, body, at: Date.now(), action, status: undefined }
          log.push(exchange)
          if (action === "refuse") {
            req.socket.destroy()
            return
          }
          const headers: Http.OutgoingHttpHeaders = {}
          for (const [k, v] of Object.entries(req.headers)) if (!HOP_BY_HOP.has(k) && v !== undefined) headers[k] = v
          headers["content-length"] = body.length
          const upstream = Http.request(target + path, { method, headers, agent: false }, (answer) => {
            const parts: Array<Buffer> = []
            answer.on("data", (c: Buffer) => parts.push(c))
            answer.on("end", () => {
              exchange.status = answer.statusCode
              if (action === "dropAfterForward") {
                req.socket.destroy()
                return
              }
              const out: Http.OutgoingHttpHeaders = {}
              for (const [k, v] of Object.entries(answer.headers)) if (!HOP_BY_HOP.has(k) && v !== undefined) out[k] = v
              const payload = Buffer.concat(parts)
              out["content-length"] = payload.length
              res.writeHead(answer.statusCode ?? 502, out)
              res.end(payload)
            })
          })
          upstream.on("error", () => req.socket.destroy())
          upstream.end(body)
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const port = (server.address() as Net.AddressInfo).port
        resume(Effect.succeed({ url: `http://127.0.0.1:${port}`, log, server }))
      })
    }),
    ({ server }) =>
      Effect.callback<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  )

/** Starts a plain HTTP endpoint (a broken agent); closed with the scope. */
const startEndpoint = (handler: Http.RequestListener) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly url: string; readonly server: Http.Server }>((resume) => {
      const server = Http.createServer(handler)
      server.listen(0, "127.0.0.1", () => {
        const port = (server.address() as Net.AddressInfo).port
        resume(Effect.succeed({ url: `http://127.0.0.1:${port}`, server }))
      })
    }),
    ({ server }) =>
      Effect.callback<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  )

// ---------------------------------------------------------------------------
// A kernel, a proxy and a real agent
// ---------------------------------------------------------------------------

const startKernel = (options: { readonly webhookTimeoutMs?: number } = {}) =>
  Kernel.start({
    port: 0,
    settings: { leaseTimeoutMs: LEASE_MS, random: () => 0 },
    dispatcher: { background: false, timeoutMs: options.webhookTimeoutMs ?? 2_000 }
  })

/** The kernel client's transports: `KernelClient.layer` on an `HttpClient`, `layerUndici`, `layerSocket`. */
type Transport = "httpClient" | "undici" | "socket"

/**
 * Serves `agent` with `Agent.serve` on a free port, its kernel calls going to
 * `kernelUrl` through `transport` (by default `KernelClient.layer` on
 * `NodeHttpClient.layerUndici`).
 */
const serveAgent = <In, A, E>(
  agent: Agent.Agent<In, A, E, never>,
  kernelUrl: string,
  retry: KernelClient.OutcomeRetrySettings = KernelClient.defaultOutcomeRetry,
  transport: Transport = "httpClient"
) =>
  Effect.gen(function*() {
    const port = yield* freePort
    const options = { baseUrl: kernelUrl, secret: SECRET, timeout: "5 seconds" } as const
    const kernelClient = transport === "undici"
      ? KernelClient.layerUndici(options)
      : transport === "socket"
      ? KernelClient.layerSocket(options)
      : KernelClient.layer(options).pipe(Layer.provide(NodeHttpClient.layerUndici))
    yield* Layer.launch(
      Agent.serve(agent, { port, host: "127.0.0.1" }).pipe(
        Layer.provide(kernelClient),
        Layer.provide(Layer.succeed(KernelClient.OutcomeRetry, retry))
      )
    ).pipe(Effect.provide(TestLogs.layer), Effect.forkScoped)
    const url = `http://127.0.0.1:${port}`
    yield* waitFor(
      "the agent to listen",
      Effect.promise(() =>
        new Promise<boolean>((resolve) => {
          const req = Http.request(url + "/", { method: "GET", agent: false }, (res) => {
            res.resume()
            resolve(true)
          })
          req.on("error", () => resolve(false))
          req.end()
        })
      )
    )
    return url
  })

const statusOf = (kernel: Kernel.RunningKernel, id: string) =>
  Effect.map(Effect.orDie(kernel.core.getExecution(id)), (e) => e.status)

const eventsOf = (kernel: Kernel.RunningKernel, id: string) => kernel.core.eventLog(id)

const expectDense = (events: ReadonlyArray<{ readonly seq: number }>) =>
  expect(events.map((e) => e.seq)).toEqual(events.map((_, i) => i + 1))

const isSubmit = (e: Exchange) => e.method === "POST" && /\/v0\/executions\/[^/]+\/steps$/.test(e.path)
const isHeartbeat = (e: Exchange) => e.path.endsWith("/heartbeat")

/** POST a raw webhook to the agent, exactly as given. */
const postWebhook = (url: string, body: Buffer, signature: string) =>
  Effect.promise(() =>
    new Promise<number>((resolve, reject) => {
      const req = Http.request(
        url + "/webhook",
        {
          method: "POST",
          agent: false,
          headers: { "content-type": "application/json", "rebuno-signature": signature, "content-length": body.length }
        },
        (res) => {
          res.resume()
          resolve(res.statusCode!)
        }
      )
      req.on("error", reject)
      req.end(body)
    })
  )

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

describe("HTTP fault matrix", () => {
  const lostSubmit = (idempotency: "safe_to_retry" | "at_most_once", slowFirstTool: boolean) =>
    withWarpClock((warp) =>
    Effect.gen(function*() {
      const runs = { fetch: 0, notify: 0, handler: 0 }
      const fetch = Tool.make("fetch", {
        args: Schema.Struct({ key: Schema.String }),
        success: Schema.String,
        execute: ({ key }) =>
          Effect.gen(function*() {
            runs.fetch++
            // Long enough for heartbeats to happen during the first run.
            if (slowFirstTool) yield* Effect.sleep("1500 millis")
            return "value of " + key
          })
      })
      const notify = Tool.make("notify", {
        args: Schema.Struct({ to: Schema.String }),
        success: Schema.String,
        idempotency,
        execute: ({ to }) => Effect.sync(() => (runs.notify++, "sent to " + to))
      })
      const shop = Agent.make({
        id: "shop",
        handler: () =>
          Effect.gen(function*() {
            runs.handler++
            const value = yield* fetch({ key: "k" })
            const sent = yield* notify({ to: "ops" }).pipe(
              Effect.catchTag("ToolError", (e: ToolError) => e.indeterminate ? Effect.succeed("unknown") : Effect.fail(e))
            )
            return { value, sent }
          })
      })

      const kernel = yield* startKernel()
      // Drop the answer to the second submit of the first delivery, after the kernel recorded it.
      let submitsOfAttempt1 = 0
      const proxy = yield* startProxy(kernel.url, ({ attempt, method, path }) => {
        if (method === "POST" && /\/steps$/.test(path) && attempt === "1" && ++submitsOfAttempt1 === 2) return "dropAfterForward"
        return "forward"
      })
      const agentUrl = yield* serveAgent(shop, proxy.url)
      yield* kernel.core.registerAgent({ id: "shop", webhookUrl: agentUrl + "/webhook", secret: SECRET })
      const execution = yield* kernel.core.createExecution({ agentId: "shop", inputRaw: "{}", agentVersion: undefined })
      const id = execution.id

      yield* kernel.dispatcher.tick
      yield* waitFor(
        "the lost submit",
        Effect.sync(() => proxy.log.some((e) => e.action === "dropAfterForward" && e.status !== undefined))
      )
      const dropped = proxy.log.find((e) => e.action === "dropAfterForward")!
      expect(dropped.status).toBe(200) // the kernel answered: it recorded the step
      // The run abandons: nothing more from attempt 1 — no retried submit, no heartbeat, no outcome.
      yield* pause(slowFirstTool ? 2_500 : 1_200)
      const attempt1 = proxy.log.filter((e) => e.attempt === "1")
      expect(attempt1.filter((e) => e.at > dropped.at)).toEqual([])
      expect(attempt1.filter(isSubmit)).toHaveLength(2)
      if (slowFirstTool) expect(attempt1.filter(isHeartbeat).length).toBeGreaterThan(0)
      expect(yield* statusOf(kernel, id)).toBe("running")
      // The lost step is recorded and still executing.
      const before = yield* kernel.core.listSteps(id, false)
      expect(before.map((s) => [s.target, s.status]).sort()).toEqual([["fetch", "succeeded"], ["notify", "executing"]])

      // The lease lapses (jumped over), the next tick reclaims and redelivers attempt 2.
      yield* warp(LEASE_MS + 1_000)
      yield* kernel.dispatcher.tick
      yield* waitFor("the second run to finish", Effect.map(statusOf(kernel, id), (s) => s === "completed"))

      const final = yield* kernel.core.getExecution(id).pipe(Effect.orDie)
      expect(JSON.parse(final.outputRaw!)).toEqual({
        value: "value of k",
        sent: idempotency === "safe_to_retry" ? "sent to ops" : "unknown"
      })
      expect(runs).toEqual({ fetch: 1, notify: idempotency === "safe_to_retry" ? 1 : 0, handler: 2 })
      const steps = yield* kernel.core.listSteps(id, false)
      expect(steps).toHaveLength(2) // no orphan: the replay maps onto the same step ids
      expect(steps.map((s) => [s.target, s.status]).sort()).toEqual([
        ["fetch", "succeeded"],
        ["notify", idempotency === "safe_to_retry" ? "succeeded" : "failed"]
      ])
      const dispatches = yield* kernel.core.dispatches(id)
      expect(dispatches.map((d) => [d.attempt, d.status])).toEqual([[2, "exhausted"]])
      const events = yield* eventsOf(kernel, id)
      expectDense(events)
      expect(events.filter((e) => e.type === "dispatch.acked").map((e) => JSON.parse(e.payload).attempt)).toEqual([1, 2])
      expect(events.filter((e) => e.type === "execution.completed")).toHaveLength(1)
      // Attempt 2 submitted both steps once and posted the outcome once.
      const attempt2 = proxy.log.filter((e) => e.attempt === "2")
      expect(attempt2.filter(isSubmit)).toHaveLength(2)
      expect(attempt2.filter((e) => /\/v0\/executions\/[^/]+\/complete$/.test(e.path))).toHaveLength(1)
    }))

  it.live("a submit lost after the kernel recorded it: abandon, heartbeats stop, redelivery completes (safe_to_retry)", () =>
    lostSubmit("safe_to_retry", true))

  it.live("a lost at_most_once submit: redelivery reports indeterminate, the body never runs", () =>
    lostSubmit("at_most_once", false))

  it.live("complete step, fail step, complete execution and heartbeat lost: retried, the run completes once", () =>
    withWarpClock(() =>
    Effect.gen(function*() {
      const runs = { slow: 0, broken: 0 }
      const slow = Tool.make("slow", {
        args: Schema.Struct({}),
        success: Schema.String,
        // Outlives the lease: only heartbeats keep it.
        execute: () => Effect.sleep("2300 millis").pipe(Effect.as("done"), Effect.tap(() => Effect.sync(() => void runs.slow++)))
      })
      const broken = Tool.make("broken", {
        args: Schema.Struct({}),
        success: Schema.String,
        execute: () => Effect.sync(() => runs.broken++).pipe(Effect.andThen(Effect.fail(new Error("broken"))))
      })
      const agent = Agent.make({
        id: "steady",
        handler: () =>
          Effect.gen(function*() {
            const a = yield* slow({})
            const b = yield* Effect.result(broken({}))
            return { a, brokenFailed: Result.isFailure(b) }
          })
      })

      const kernel = yield* startKernel()
      const seen = { completeStep: 0, failStep: 0, completeExecution: 0, heartbeat: 0 }
      const proxy = yield* startProxy(kernel.url, ({ method, path }) => {
        if (method !== "POST") return "forward"
        if (/\/steps\/[^/]+\/complete$/.test(path)) return seen.completeStep++ === 0 ? "refuse" : "forward"
        if (/\/steps\/[^/]+\/fail$/.test(path)) return seen.failStep++ === 0 ? "dropAfterForward" : "forward"
        if (/\/v0\/executions\/[^/]+\/complete$/.test(path)) return seen.completeExecution++ === 0 ? "dropAfterForward" : "forward"
        if (path.endsWith("/heartbeat")) return seen.heartbeat++ === 0 ? "refuse" : "forward"
        return "forward"
      })
      const agentUrl = yield* serveAgent(agent, proxy.url)
      yield* kernel.core.registerAgent({ id: "steady", webhookUrl: agentUrl + "/webhook", secret: SECRET })
      const execution = yield* kernel.core.createExecution({ agentId: "steady", inputRaw: "{}", agentVersion: undefined })
      const id = execution.id
      yield* kernel.dispatcher.tick

      // The first heartbeat is refused; its retry (about 100 ms later) renews the lease.
      yield* waitFor(
        "a heartbeat to get through",
        Effect.sync(() => proxy.log.some((e) => isHeartbeat(e) && e.status === 204))
      )
      const beats = proxy.log.filter(isHeartbeat)
      expect(beats[0]!.action).toBe("refuse")
      expect(beats[1]!.at - beats[0]!.at).toBeGreaterThanOrEqual(70)
      expect(beats[1]!.at - beats[0]!.at).toBeLessThan(600)
      // The submit renewed the lease ~1 s before the refused beat; without the second beat the
      // lease would lapse at ~2 s. A tick now must find the lease alive (no redelivery).
      const submitAt = proxy.log.find(isSubmit)!.at
      yield* waitFor("the lease to be older than its timeout without the renewal", Effect.sync(() => Date.now() > submitAt + LEASE_MS + 50))
      yield* kernel.dispatcher.tick
      expect((yield* kernel.core.dispatches(id)).map((d) => d.attempt)).toEqual([1])

      yield* waitFor("the run to finish", Effect.map(statusOf(kernel, id), (s) => s === "completed"), 15_000)
      // The kernel completed on the first (lost) post; wait for the agent's retry to land too.
      const outcomePosts = () => proxy.log.filter((e) => /\/v0\/executions\/[^/]+\/complete$/.test(e.path))
      yield* waitFor("the outcome retry", Effect.sync(() => outcomePosts().length === 2 && outcomePosts()[1]!.status !== undefined))
      const final = yield* kernel.core.getExecution(id).pipe(Effect.orDie)
      expect(JSON.parse(final.outputRaw!)).toEqual({ a: "done", brokenFailed: true })
      expect(runs).toEqual({ slow: 1, broken: 1 })

      // Each lost call was retried after a backoff and landed once.
      const completes = proxy.log.filter((e) => /\/steps\/[^/]+\/complete$/.test(e.path))
      expect(completes.map((e) => e.action)).toEqual(["refuse", "forward"])
      expect(completes[1]!.at - completes[0]!.at).toBeGreaterThanOrEqual(70)
      const fails = proxy.log.filter((e) => /\/steps\/[^/]+\/fail$/.test(e.path))
      expect(fails.map((e) => [e.action, e.status])).toEqual([["dropAfterForward", 200], ["forward", 200]])
      expect(fails[1]!.body.equals(fails[0]!.body)).toBe(true) // the same bytes, re-signed per try
      const outcomes = proxy.log.filter((e) => /\/v0\/executions\/[^/]+\/complete$/.test(e.path))
      // The first post completed the execution; its retry is told "execution terminal" and counts as done.
      expect(outcomes.map((e) => [e.action, e.status])).toEqual([["dropAfterForward", 204], ["forward", 409]])
      expect(proxy.log.filter((e) => e.path.endsWith("/fail") && !e.path.includes("/steps/"))).toEqual([])

      const events = yield* eventsOf(kernel, id)
      expectDense(events)
      const types = events.map((e) => e.type)
      expect(types.filter((t) => t === "step.succeeded")).toHaveLength(1)
      expect(types.filter((t) => t === "step.failed")).toHaveLength(1)
      expect(types.filter((t) => t === "execution.completed")).toHaveLength(1)
      expect(types.filter((t) => t === "dispatch.acked")).toHaveLength(1)
    })))

  const exhaust = (endpoint: "500" | "refused" | "timeout") =>
    withWarpClock((warp) =>
    Effect.gen(function*() {
      const kernel = yield* startKernel({ webhookTimeoutMs: 300 })
      let hits = 0
      let webhookUrl: string
      if (endpoint === "refused") {
        webhookUrl = `http://127.0.0.1:${yield* freePort}/webhook`
      } else {
        const server = yield* startEndpoint((req, res) => {
          hits++
          req.resume()
          if (endpoint === "500") {
            req.on("end", () => {
              res.writeHead(500)
              res.end("agent exploded")
            })
          }
          // "timeout": never answer
        })
        webhookUrl = server.url + "/webhook"
      }
      yield* kernel.core.registerAgent({ id: "broken", webhookUrl, secret: SECRET })
      const execution = yield* kernel.core.createExecution({ agentId: "broken", inputRaw: "{}", agentVersion: undefined })
      const id = execution.id
      for (let attempt = 1; attempt <= 5; attempt++) {
        yield* kernel.dispatcher.tick
        const now = yield* Clock.currentTimeMillis
        const [dispatch] = yield* kernel.core.dispatches(id)
        expect(dispatch!.attempt).toBe(attempt)
        if (attempt < 5) {
          expect(dispatch!.status).toBe("failed")
          // backoff(n) = min(2^(n-1) s, 30 s), no jitter here
          const backoff = Math.min(2 ** (attempt - 1) * 1_000, 30_000)
          const due = dispatch!.nextAttemptAtMs - now
          expect(due).toBeGreaterThan(backoff - 1_000)
          expect(due).toBeLessThanOrEqual(backoff)
          // Not due yet: a tick delivers nothing.
          yield* kernel.dispatcher.tick
          expect((yield* kernel.core.dispatches(id))[0]!.attempt).toBe(attempt)
          yield* warp(backoff)
        }
      }
      const final = yield* kernel.core.getExecution(id).pipe(Effect.orDie)
      expect([final.status, final.failureReason]).toEqual(["failed", "dispatch_exhausted"])
      const events = yield* eventsOf(kernel, id)
      expectDense(events)
      expect(events.filter((e) => e.type === "dispatch.failed").map((e) => JSON.parse(e.payload).attempt)).toEqual([
        1,
        2,
        3,
        4,
        5
      ])
      expect(events.at(-1)!.type).toBe("execution.failed")
      if (endpoint !== "refused") expect(hits).toBe(5)
      // Nothing more is ever delivered.
      yield* warp(60_000)
      yield* kernel.dispatcher.tick
      expect((yield* kernel.core.dispatches(id)).map((d) => [d.attempt, d.status])).toEqual([[5, "exhausted"]])
      if (endpoint !== "refused") expect(hits).toBe(5)
    }))

  it.live("webhook answered 500: backoff, then dispatch_exhausted after the 5th attempt", () => exhaust("500"))
  it.live("webhook connection refused: backoff, then dispatch_exhausted", () => exhaust("refused"))
  it.live("webhook never answered (timeout): backoff, then dispatch_exhausted", () => exhaust("timeout"))

  it.live("the exact signed webhook bytes replayed: one run", () =>
    withWarpClock(() =>
    Effect.gen(function*() {
      const release = yield* Deferred.make<void>()
      const runs = { handler: 0, tool: 0 }
      const once = Tool.make("once", {
        args: Schema.Struct({}),
        success: Schema.Number,
        execute: () => Effect.sync(() => ++runs.tool)
      })
      const agent = Agent.make({
        id: "replayed",
        handler: () =>
          Effect.gen(function*() {
            runs.handler++
            const n = yield* once({})
            yield* Deferred.await(release)
            return { n }
          })
      })
      const kernel = yield* startKernel()
      const agentUrl = yield* serveAgent(agent, kernel.url)
      // Kernel → recorder → agent: keep the exact webhook bytes and signature.
      const recorder = yield* startProxy(agentUrl, () => "forward")
      yield* kernel.core.registerAgent({ id: "replayed", webhookUrl: recorder.url + "/webhook", secret: SECRET })
      const execution = yield* kernel.core.createExecution({ agentId: "replayed", inputRaw: "{}", agentVersion: undefined })
      const id = execution.id
      yield* kernel.dispatcher.tick
      yield* waitFor("the tool to run", Effect.sync(() => runs.tool === 1))
      const [webhook] = recorder.log
      const signature = webhook!.headers["rebuno-signature"] as string
      expect(signature).toBe(yield* Signature.sign(SECRET, webhook!.body))

      // Replayed twice in a row, and twice at once, while the run is active: duplicates.
      expect(yield* postWebhook(agentUrl, webhook!.body, signature)).toBe(200)
      expect(yield* postWebhook(agentUrl, webhook!.body, signature)).toBe(200)
      const both = yield* Effect.all([
        postWebhook(agentUrl, webhook!.body, signature),
        postWebhook(agentUrl, webhook!.body, signature)
      ], { concurrency: 2 })
      expect(both).toEqual([200, 200])
      yield* pause(100)
      expect(runs).toEqual({ handler: 1, tool: 1 })

      yield* Deferred.succeed(release, undefined)
      yield* waitFor("the run to finish", Effect.map(statusOf(kernel, id), (s) => s === "completed"))
      // Replayed after the end: the run sees a terminal execution and does nothing.
      expect(yield* postWebhook(agentUrl, webhook!.body, signature)).toBe(200)
      yield* pause(200)
      expect(runs).toEqual({ handler: 1, tool: 1 })
      // A tampered replay is refused.
      expect(yield* postWebhook(agentUrl, Buffer.concat([webhook!.body, Buffer.from(" ")]), signature)).toBe(401)
      const events = yield* eventsOf(kernel, id)
      expectDense(events)
      expect(events.filter((e) => e.type === "execution.completed")).toHaveLength(1)
      expect(events.filter((e) => e.type === "step.succeeded")).toHaveLength(1)
      expect(recorder.log).toHaveLength(1)
    })))
})

// ---------------------------------------------------------------------------
// A kernel outage (issue 13): a TCP proxy that goes down for a while
// ---------------------------------------------------------------------------

interface TcpProxy {
  readonly url: string
  /**
   * The kernel is unreachable for `ms` from now: every open connection is
   * reset, and new ones are reset at once (`"reset"`) or refused — nothing
   * listens (`"refuse"`).
   */
  readonly down: (ms: number, mode: "reset" | "refuse") => void
  /** The outages so far, in wall time. */
  readonly outages: Array<{ readonly from: number; readonly until: number; readonly mode: "reset" | "refuse" }>
  /** Wall times of the connections forwarded to the kernel. */
  readonly forwarded: Array<number>
  /** Wall times of the connections reset during an outage, open ones included. */
  readonly reset: Array<number>
}

/** A plain TCP proxy to `target` (an `http://host:port` URL); closed with the scope. */
const startTcpProxy = (target: string) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly proxy: TcpProxy; readonly close: () => Promise<void> }>((resume) => {
      const { hostname, port: targetPort } = new URL(target)
      const open = new Set<Net.Socket>()
      const timers = new Set<ReturnType<typeof setTimeout>>()
      const outages: TcpProxy["outages"] = []
      const forwarded: Array<number> = []
      const reset: Array<number> = []
      let downUntil = 0
      let listening = false
      let closed = false
      const server = Net.createServer((client) => {
        if (Date.now() < downUntil) {
          reset.push(Date.now())
          client.resetAndDestroy()
          return
        }
        forwarded.push(Date.now())
        const upstream = Net.connect(Number(targetPort), hostname)
        open.add(client)
        open.add(upstream)
        const end = () => {
          open.delete(client)
          open.delete(upstream)
          client.destroy()
          upstream.destroy()
        }
        client.on("error", end).on("close", end)
        upstream.on("error", end).on("close", end)
        client.pipe(upstream)
        upstream.pipe(client)
      })
      let port = 0
      const listen = (done?: () => void) =>
        server.listen(port, "127.0.0.1", () => {
          listening = true
          port = (server.address() as Net.AddressInfo).port
          done?.()
        })
      const later = (ms: number, f: () => void) => {
        const timer = setTimeout(() => {
          timers.delete(timer)
          f()
        }, ms)
        timers.add(timer)
      }
      const down = (ms: number, mode: "reset" | "refuse") => {
        const now = Date.now()
        downUntil = now + ms
        outages.push({ from: now, until: now + ms, mode })
        for (const socket of open) {
          reset.push(now)
          socket.resetAndDestroy()
        }
        open.clear()
        if (mode === "refuse" && listening) {
          listening = false
          server.close()
          later(ms, () => {
            if (!closed) listen()
          })
        }
      }
      const close = () =>
        new Promise<void>((resolve) => {
          closed = true
          for (const timer of timers) clearTimeout(timer)
          for (const socket of open) socket.destroy()
          if (listening) server.close(() => resolve())
          else resolve()
        })
      listen(() =>
        resume(Effect.succeed({
          proxy: { url: `http://127.0.0.1:${port}`, down, outages, forwarded, reset },
          close
        }))
      )
    }),
    ({ close }) => Effect.promise(close)
  ).pipe(Effect.map(({ proxy }) => proxy))

describe("a kernel outage through a TCP proxy (issue 13)", () => {
  it.live.each(["httpClient", "undici", "socket"] as const)(
    "%s: down during a body and its heartbeats, at a step complete and at the execution complete: one delivery, each body once, nothing indeterminate",
    (transport) =>
      Effect.gen(function*() {
        // Lease 6 s, a beat every 2 s. A 1 s warm-up step, then `slow`, submitted at ~1 s: the
        // lease can be valid until ~7 s. The kernel is down from ~1.3 s to ~6.4 s (refusing
        // connections) while `slow` runs: the beats of 2, 4 and 6 s fail, and without a retry
        // the next one (8 s) would come after the lease lapsed. Then down for 1.5 s (resetting
        // connections) when the at_most_once `charge` ends, and for 1.5 s (refusing) when the
        // handler returns. Retries every 50–100 ms (configured).
        const runs = { warmup: 0, slow: 0, charge: 0, handler: 0 }
        let proxy: TcpProxy | undefined
        const warmup = Tool.make("warmup", {
          args: Schema.Struct({}),
          success: Schema.String,
          execute: () => Effect.sync(() => void runs.warmup++).pipe(Effect.andThen(Effect.sleep("1 second")), Effect.as("warm"))
        })
        const slow = Tool.make("slow", {
          args: Schema.Struct({}),
          success: Schema.String,
          execute: () =>
            Effect.gen(function*() {
              runs.slow++
              yield* Effect.sleep("300 millis")
              proxy!.down(5_100, "refuse")
              yield* Effect.sleep("6200 millis")
              return "slow done"
            })
        })
        const charge = Tool.make("charge", {
          args: Schema.Struct({ amount: Schema.Number }),
          success: Schema.String,
          idempotency: "at_most_once",
          execute: ({ amount }) =>
            Effect.sync(() => {
              runs.charge++
              proxy!.down(1_500, "reset")
              return `receipt-${amount}`
            })
        })
        const agent = Agent.make({
          id: "enduring",
          handler: () =>
            Effect.gen(function*() {
              runs.handler++
              const warm = yield* warmup({})
              const done = yield* slow({})
              const receipt = yield* charge({ amount: 10 }).pipe(
                Effect.catchTag("ToolError", (e: ToolError) => e.indeterminate ? Effect.succeed("unknown") : Effect.fail(e))
              )
              proxy!.down(1_500, "refuse")
              return { warm, done, receipt }
            })
        })

        const kernel = yield* Kernel.start({
          port: 0,
          settings: { leaseTimeoutMs: 6_000, random: () => 0 },
          dispatcher: { background: false, timeoutMs: 2_000 }
        })
        proxy = yield* startTcpProxy(kernel.url)
        const agentUrl = yield* serveAgent(
          agent,
          proxy.url,
          { baseDelay: "50 millis", maxDelay: "100 millis" },
          transport
        )
        yield* kernel.core.registerAgent({ id: "enduring", webhookUrl: agentUrl + "/webhook", secret: SECRET })
        const execution = yield* kernel.core.createExecution({ agentId: "enduring", inputRaw: "{}", agentVersion: undefined })
        const id = execution.id
        // The kernel's loop: a tick every 100 ms (lease expiry, redelivery).
        yield* Effect.forkScoped(Effect.forever(Effect.andThen(kernel.dispatcher.tick, pause(100))))

        yield* waitFor("the execution to complete", Effect.map(statusOf(kernel, id), (s) => s === "completed"), 30_000)
        const final = yield* kernel.core.getExecution(id).pipe(Effect.orDie)
        expect(JSON.parse(final.outputRaw!)).toEqual({ warm: "warm", done: "slow done", receipt: "receipt-10" })
        // every body ran once, in the one and only delivery; nothing is indeterminate
        expect(runs).toEqual({ warmup: 1, slow: 1, charge: 1, handler: 1 })
        const steps = yield* kernel.core.listSteps(id, false)
        expect(steps.map((s) => [s.target, s.status, s.errorRaw]).sort()).toEqual([
          ["charge", "succeeded", undefined],
          ["slow", "succeeded", undefined],
          ["warmup", "succeeded", undefined]
        ])
        expect((yield* kernel.core.dispatches(id)).map((d) => [d.attempt, d.status])).toEqual([[1, "exhausted"]])
        const events = yield* eventsOf(kernel, id)
        expectDense(events)
        const types = events.map((e) => e.type)
        expect(types.filter((t) => t === "dispatch.acked")).toHaveLength(1)
        expect(types.filter((t) => t === "step.succeeded")).toHaveLength(3)
        expect(types.filter((t) => t === "execution.completed")).toHaveLength(1)

        // The three outages happened, and after each the agent was back within moments: the
        // heartbeat's retry after the first (the body was still running, nothing else was
        // sent), the step complete's after the second, the execution complete's after the third.
        expect(proxy.outages.map((o) => o.mode)).toEqual(["refuse", "reset", "refuse"])
        for (const outage of proxy.outages) {
          const back = proxy.forwarded.find((t) => t >= outage.until)
          expect(back).toBeDefined()
          expect(back! - outage.until).toBeLessThan(1_000)
        }
        const second = proxy.outages[1]!
        expect(proxy.reset.filter((t) => t >= second.from && t < second.until).length).toBeGreaterThan(1)
      })
  )
})
