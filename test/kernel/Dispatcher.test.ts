import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { describe, expect, it } from "@effect/vitest"
import { Clock, Deferred, Effect, Fiber, Queue, Ref, References } from "effect"
import { TestClock } from "effect/testing"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as Signature from "../../src/Signature.js"
import * as Core from "../../src/kernel/Core.js"
import * as Dispatcher from "../../src/kernel/Dispatcher.js"
import * as TestLogs from "../support/logging.js"

const SECRET = "hello-secret"

interface Delivered {
  readonly claim: Core.Claim
  readonly body: string
  readonly signature: string
  readonly at: number
}

/** A fake deliverer that records every call and answers with `answer()`. */
const recorder = (answer: (claim: Core.Claim) => boolean = () => true) =>
  Effect.gen(function*() {
    const log = yield* Queue.unbounded<Delivered>()
    const deliver: Dispatcher.Deliver = (claim, body, signature) =>
      Effect.gen(function*() {
        const at = yield* Clock.currentTimeMillis
        yield* Queue.offer(log, { claim, body, signature, at })
        return answer(claim)
      })
    return { log, deliver }
  })

const setup = (settings: Partial<Core.Settings> = {}) =>
  Effect.gen(function*() {
    const core = yield* Core.make({ random: () => 0, ...settings })
    yield* core.registerAgent({ id: "hello", webhookUrl: "http://127.0.0.1:1/webhook", secret: SECRET })
    const create = Effect.map(
      core.createExecution({ agentId: "hello", inputRaw: "{}", agentVersion: undefined }),
      (e) => e.id
    )
    return { core, create }
  })

/** Lets forked fibers run until they block. */
const settle = Effect.repeat(Effect.yieldNow, { times: 20 })

/** Waits (in real time, for Web Crypto signing) until `check` holds. */
const eventually = <E, R>(check: Effect.Effect<boolean, E, R>) =>
  Effect.gen(function*() {
    for (let i = 0; i < 500; i++) {
      if (yield* check) return
      yield* Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, 2)))
    }
    throw new Error("condition not reached")
  })

/**
 * Waits until every claim has been handed to the deliverer (signing uses Web
 * Crypto, which resolves in real time), so the clock only moves between ticks.
 */
const deliveredAll = (core: Core.KernelCore, log: Queue.Queue<Delivered>, taken = 0) =>
  Effect.andThen(
    settle,
    eventually(
      Effect.zipWith(
        core.dispatches(),
        Queue.size(log),
        (dispatches, size) =>
          dispatches.reduce((sum, d) => sum + Math.min(d.attempt, d.maxAttempts), 0) === size + taken
      )
    )
  )

const eventTypes = (core: Core.KernelCore, id: string) =>
  Effect.map(core.eventLog(id), (events) => events.map((e) => e.type))


const payloadsOf = (core: Core.KernelCore, id: string, type: string) =>
  Effect.map(core.eventLog(id), (events) => events.filter((e) => e.type === type).map((e) => e.payload))

describe("Dispatcher", () => {
  it.effect("delivers the exact signed webhook body", () =>
    Effect.gen(function*() {
      const { core, create } = yield* setup()
      const { deliver, log } = yield* recorder()
      const dispatcher = yield* Dispatcher.make(core, { deliver, background: false })
      const id = yield* create
      yield* dispatcher.tick
      const sent = yield* Queue.take(log)
      const dispatchId = sent.claim.dispatchId
      expect(sent.body).toBe(
        `{"execution_id":"${id}","dispatch_id":"${dispatchId}","dispatch_attempt":1,"lease_timeout_seconds":120}`
      )
      expect(sent.signature).toBe(yield* Signature.sign(SECRET, sent.body))
      expect(yield* eventTypes(core, id)).toEqual([
        "execution.created",
        "execution.started",
        "dispatch.queued",
        "dispatch.acked"
      ])
      const [dispatch] = yield* core.dispatches(id)
      expect(dispatch).toMatchObject({ status: "in_flight", attempt: 1 })
    }))

  it.effect("the current and seed stages always send dispatch_attempt and lease_timeout_seconds (C.2.2)", () =>
    Effect.gen(function*() {
      for (const stage of ["current", "seed"] as const) {
        const { core, create } = yield* setup({ stage, leaseTimeoutMs: 60_000 })
        const { deliver, log } = yield* recorder()
        const dispatcher = yield* Dispatcher.make(core, { deliver, background: false })
        const id = yield* create
        yield* dispatcher.tick
        const sent = yield* Queue.take(log)
        expect(JSON.parse(sent.body)).toEqual({
          execution_id: id,
          dispatch_id: sent.claim.dispatchId,
          dispatch_attempt: 1,
          lease_timeout_seconds: 60
        })
      }
    }))

  it.effect("compat v0.14.0 webhooks carry only the two ids", () =>
    Effect.gen(function*() {
      const { core, create } = yield* setup({ stage: "v0.14.0" })
      const { deliver, log } = yield* recorder()
      const dispatcher = yield* Dispatcher.make(core, { deliver, background: false })
      const id = yield* create
      yield* dispatcher.tick
      const sent = yield* Queue.take(log)
      expect(sent.body).toBe(`{"execution_id":"${id}","dispatch_id":"${sent.claim.dispatchId}"}`)
    }))

  it.effect("per-agent lease timeouts show in the webhook", () =>
    Effect.gen(function*() {
      const { core } = yield* setup()
      yield* core.registerAgent({ id: "slow", webhookUrl: "", secret: "s", leaseTimeoutSeconds: 45 })
      const { deliver, log } = yield* recorder()
      const dispatcher = yield* Dispatcher.make(core, { deliver, background: false })
      yield* core.createExecution({ agentId: "slow", inputRaw: undefined, agentVersion: undefined })
      yield* dispatcher.tick
      expect((yield* Queue.take(log)).body).toMatch(/"dispatch_attempt":1,"lease_timeout_seconds":45\}$/)
    }))

  it.effect("ticks at once on enqueue, then every 2 s", () =>
    Effect.gen(function*() {
      const { core, create } = yield* setup({ leaseTimeoutMs: 120_000 })
      const { deliver, log } = yield* recorder()
      yield* Dispatcher.make(core, { deliver })
      yield* settle
      yield* TestClock.adjust("5 seconds")
      yield* settle
      yield* create
      yield* settle
      // delivered immediately, without waiting for the next tick
      const first = yield* Queue.take(log)
      expect(first.at).toBe(5_000)
      yield* create
      yield* settle
      expect((yield* Queue.take(log)).at).toBe(5_000)
      expect(yield* Queue.size(log)).toBe(0)
    }))

  it.effect("failed deliveries back off and exhaust after max attempts", () =>
    Effect.gen(function*() {
      const { core, create } = yield* setup({ maxAttempts: 5, stage: "seed" })
      const { deliver, log } = yield* recorder(() => false)
      yield* Dispatcher.make(core, { deliver })
      yield* settle
      const id = yield* create
      for (let i = 0; i < 40; i++) {
        yield* deliveredAll(core, log)
        yield* TestClock.adjust("1 second")
      }
      const sent = yield* Queue.clear(log)
      expect([...sent].map((d) => [d.claim.attempt, d.at])).toEqual([
        [1, 0],
        [2, 2_000],
        [3, 4_000],
        [4, 8_000],
        [5, 16_000]
      ])
      const execution = yield* core.getExecution(id)
      expect(execution.status).toBe("failed")
      expect(execution.failureReason).toBe("dispatch_exhausted")
      expect(yield* eventTypes(core, id)).toEqual([
        "execution.created",
        "execution.started",
        "dispatch.queued",
        "dispatch.failed",
        "dispatch.failed",
        "dispatch.failed",
        "dispatch.failed",
        "dispatch.failed",
        "execution.failed"
      ])
    }))

  it.effect("lapsed leases are reclaimed and redelivered with the same dispatch id", () =>
    Effect.gen(function*() {
      const { core, create } = yield* setup({ leaseTimeoutMs: 10_000, maxAttempts: 2 })
      const { deliver, log } = yield* recorder()
      yield* Dispatcher.make(core, { deliver })
      yield* settle
      const id = yield* create
      for (let i = 0; i < 30; i++) {
        yield* deliveredAll(core, log)
        yield* TestClock.adjust("1 second")
      }
      const sent = [...(yield* Queue.clear(log))]
      expect(sent.map((d) => d.claim.attempt)).toEqual([1, 2])
      expect(sent[1]!.claim.dispatchId).toBe(sent[0]!.claim.dispatchId)
      // reclaimed on the first tick after locked_at + 10 s
      expect(sent[1]!.at).toBeGreaterThan(10_000)
      expect(sent[1]!.at).toBeLessThanOrEqual(12_000)
      expect(yield* eventTypes(core, id)).toEqual([
        "execution.created",
        "execution.started",
        "dispatch.queued",
        "dispatch.acked",
        "dispatch.acked",
        "execution.failed"
      ])
    }))

  it.effect("delivers at most `concurrency` webhooks at once and tick awaits them", () =>
    Effect.gen(function*() {
      const { core, create } = yield* setup({ stage: "seed" })
      const active = yield* Ref.make(0)
      const peak = yield* Ref.make(0)
      const release = yield* Deferred.make<void>()
      const deliver: Dispatcher.Deliver = () =>
        Effect.gen(function*() {
          const now = yield* Ref.updateAndGet(active, (n) => n + 1)
          yield* Ref.update(peak, (p) => Math.max(p, now))
          yield* Deferred.await(release)
          yield* Ref.update(active, (n) => n - 1)
          return true
        })
      const dispatcher = yield* Dispatcher.make(core, { deliver, concurrency: 3, background: false })
      for (let i = 0; i < 12; i++) yield* create
      const tick = yield* Effect.forkChild(dispatcher.tick)
      yield* eventually(Effect.map(Ref.get(active), (n) => n === 3))
      yield* Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, 20)))
      expect(yield* Ref.get(active)).toBe(3)
      expect(tick.pollUnsafe()).toBeUndefined()
      yield* Deferred.succeed(release, undefined)
      yield* Fiber.join(tick)
      expect(yield* Ref.get(peak)).toBe(3)
      const dispatches = yield* core.dispatches()
      // claim batch of 10 per tick
      expect(dispatches.filter((d) => d.attempt === 1)).toHaveLength(10)
      expect(dispatches.filter((d) => d.attempt === 0)).toHaveLength(2)
    }))

  it.effect("each tick expires due approvals", () =>
    Effect.gen(function*() {
      const { core, create } = yield* setup({ approvalTimeoutMs: 60_000 })
      yield* core.loadPolicy(
        "hello",
        "default_action: allow\nrules:\n  - id: gate\n    when: { step_kind: tool_call }\n    then: { decision: require_approval }\n"
      )
      const { deliver, log } = yield* recorder()
      const dispatcher = yield* Dispatcher.make(core, { deliver, background: false })
      const id = yield* create
      yield* dispatcher.tick
      const first = yield* Queue.take(log)
      const decision = yield* core.submitStep(
        id,
        { dispatchId: first.claim.dispatchId, attempt: first.claim.attempt },
        { kind: "tool_call", target: "send", argsRaw: "{}", idempotency: "" }
      )
      expect(decision.decision).toBe("blocked")
      yield* TestClock.adjust("59 seconds")
      yield* dispatcher.tick
      expect((yield* core.getExecution(id)).status).toBe("blocked")
      yield* TestClock.adjust("1 second")
      yield* dispatcher.tick
      expect((yield* core.getExecution(id)).status).toBe("running")
      const second = yield* Queue.take(log)
      expect(second.claim.dispatchId).not.toBe(first.claim.dispatchId)
      expect(second.claim.attempt).toBe(1)
    }))

  it.effect("deadline sweep runs every 30 s when deadlines are on", () =>
    Effect.gen(function*() {
      const { core, create } = yield* setup({ deadlineMs: 5_000, stage: "seed" })
      const { deliver } = yield* recorder()
      const dispatcher = yield* Dispatcher.make(core, { deliver, background: false })
      yield* dispatcher.tick // sweeps at t=0
      const id = yield* create
      yield* TestClock.adjust("29 seconds")
      yield* dispatcher.tick
      expect((yield* core.getExecution(id)).status).toBe("running")
      yield* TestClock.adjust("1 second")
      yield* dispatcher.tick
      const execution = yield* core.getExecution(id)
      expect(execution.status).toBe("cancelled")
      expect(execution.failureReason).toBe("client_cancelled")
    }))

  it.effect("current stage: a deadline cancels with deadline_exceeded", () =>
    Effect.gen(function*() {
      const { core, create } = yield* setup({ deadlineMs: 5_000 })
      const { deliver } = yield* recorder()
      const dispatcher = yield* Dispatcher.make(core, { deliver, background: false })
      const id = yield* create
      yield* TestClock.adjust("30 seconds")
      yield* dispatcher.tick
      const execution = yield* core.getExecution(id)
      expect(execution.status).toBe("cancelled")
      expect(execution.failureReason).toBe("deadline_exceeded")
      const events = yield* core.eventLog(id)
      const cancelled = events.filter((e) => e.type === "execution.cancelled")
      expect(cancelled).toHaveLength(1)
      expect(JSON.parse(cancelled[0]!.payload)).toMatchObject({
        execution_id: id,
        status: "cancelled",
        reason: "deadline_exceeded"
      })
    }))

  describe("current stage (PROTOCOL-CURRENT C.10)", () => {
    it.effect("polls about every 250 ms: a retry goes out when its backoff ends", () =>
      Effect.gen(function*() {
        const { core, create } = yield* setup({ maxAttempts: 5, stage: "current" })
        const { deliver, log } = yield* recorder(() => false)
        yield* Dispatcher.make(core, { deliver })
        yield* settle
        yield* create
        for (let i = 0; i < 64; i++) {
          yield* deliveredAll(core, log)
          yield* TestClock.adjust("250 millis")
        }
        const sent = yield* Queue.clear(log)
        expect([...sent].map((d) => [d.claim.attempt, d.at])).toEqual([
          [1, 0],
          [2, 1_000],
          [3, 3_000],
          [4, 7_000],
          [5, 15_000]
        ])
      }))

    it.effect("a lapsed lease is redelivered on the first poll after it lapsed", () =>
      Effect.gen(function*() {
        const { core, create } = yield* setup({ leaseTimeoutMs: 10_000, stage: "current" })
        const { deliver, log } = yield* recorder()
        yield* Dispatcher.make(core, { deliver })
        yield* settle
        yield* create
        for (let i = 0; i < 44; i++) {
          yield* deliveredAll(core, log)
          yield* TestClock.adjust("250 millis")
        }
        const sent = [...(yield* Queue.clear(log))]
        expect(sent.map((d) => [d.claim.attempt, d.at])).toEqual([[1, 0], [2, 10_250]])
        expect(sent[1]!.claim.dispatchId).toBe(sent[0]!.claim.dispatchId)
      }))

    it.effect("claims only as many as idle workers: a tick claims no more than `concurrency`", () =>
      Effect.gen(function*() {
        const { core, create } = yield* setup({ stage: "current" })
        const { deliver } = yield* recorder()
        const dispatcher = yield* Dispatcher.make(core, { deliver, concurrency: 3, background: false })
        for (let i = 0; i < 12; i++) yield* create
        yield* dispatcher.tick
        const dispatches = yield* core.dispatches()
        expect(dispatches.filter((d) => d.attempt === 1)).toHaveLength(3)
        expect(dispatches.filter((d) => d.attempt === 0)).toHaveLength(9)
      }))

    it.effect("after a full claim the loop polls again at once", () =>
      Effect.gen(function*() {
        const { core, create } = yield* setup({ stage: "current" })
        const { deliver, log } = yield* recorder()
        for (let i = 0; i < 12; i++) yield* create
        yield* Dispatcher.make(core, { deliver, concurrency: 3 })
        yield* deliveredAll(core, log)
        const sent = [...(yield* Queue.clear(log))]
        expect(sent).toHaveLength(12)
        expect(sent.every((d) => d.at === 0)).toBe(true)
      }))

    it.effect("each tick admits waiting session executions (the C.4.4 sweep)", () =>
      Effect.gen(function*() {
        const { core } = yield* setup({ stage: "current" })
        const { deliver } = yield* recorder()
        const dispatcher = yield* Dispatcher.make(core, { deliver, background: false })
        const first = yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined, session: "s" })
        const second = yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined, session: "s" })
        // the seed stage admits nothing when the first one ends
        yield* core.updateSettings({ stage: "seed" })
        yield* core.cancelExecution(first.id)
        yield* core.updateSettings({ stage: "current" })
        expect((yield* core.getExecution(second.id)).status).toBe("pending")
        yield* dispatcher.tick
        expect((yield* core.getExecution(second.id)).status).toBe("running")
        expect((yield* core.dispatches(second.id)).map((d) => d.attempt)).toEqual([1])
      }))
  })

  describe("HTTP deliverer", () => {
    const serve = (handler: Http.RequestListener) =>
      Effect.acquireRelease(
        Effect.callback<Http.Server>((resume) => {
          const server = Http.createServer(handler)
          server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
        }),
        (server) =>
          Effect.callback<void>((resume) => {
            server.closeAllConnections()
            server.close(() => resume(Effect.void))
          })
      ).pipe(Effect.map((server) => `http://127.0.0.1:${(server.address() as AddressInfo).port}`))

    interface Seen {
      readonly method: string
      readonly url: string
      readonly headers: Http.IncomingHttpHeaders
      readonly body: string
    }

    const claimFor = (url: string): Core.Claim => ({
      dispatchId: "0192f1a0-0000-7000-8000-0000000000d1",
      executionId: "0192f1a0-0000-7000-8000-000000000000",
      attempt: 1,
      leaseTimeoutSeconds: 120,
      agent: {
        id: "hello",
        webhookUrl: url,
        secret: SECRET,
        policyBundle: "",
        policy: undefined,
        registeredAtMs: 0,
        leaseTimeoutMs: undefined
      }
    })

    const BODY =
      "{\"execution_id\":\"0192f1a0-0000-7000-8000-000000000000\",\"dispatch_id\":\"0192f1a0-0000-7000-8000-0000000000d1\",\"dispatch_attempt\":1,\"lease_timeout_seconds\":120}"
    const SIG = "sha256=25199efc9ab5c6ddfaa8f3436f2487db5b2c76046e09e31cdc458b50bb37f58a"

    it.live("POSTs the webhook with its headers, follows redirects like Go, maps statuses", () =>
      Effect.gen(function*() {
        const seen: Array<Seen> = []
        const base = yield* serve((req, res) => {
          let body = ""
          req.setEncoding("utf8")
          req.on("data", (c) => (body += c))
          req.on("end", () => {
            seen.push({ method: req.method!, url: req.url!, headers: req.headers, body })
            const redirect = (status: number, to: string) => {
              res.writeHead(status, { location: to })
              res.end("moved")
            }
            switch (req.url) {
              case "/ok":
                res.writeHead(200, { "content-type": "text/plain" })
                return res.end("ignored body")
              case "/accepted":
                res.writeHead(202)
                return res.end()
              case "/307":
                return redirect(307, "/ok")
              case "/302":
                return redirect(302, "/ok")
              case "/loop":
                return redirect(302, "/loop")
              case "/400":
                res.writeHead(400)
                return res.end("bad")
              default:
                res.writeHead(500)
                return res.end()
            }
          })
        })
        const deliver = yield* Dispatcher.httpDeliver({ timeoutMs: 5_000 })
        const send = (path: string) => deliver(claimFor(base + path), BODY, SIG)

        expect(yield* send("/ok")).toBe(true)
        expect(seen[0]!.method).toBe("POST")
        expect(seen[0]!.body).toBe(BODY)
        expect(seen[0]!.headers["content-type"]).toBe("application/json")
        expect(seen[0]!.headers["rebuno-signature"]).toBe(SIG)
        expect(seen[0]!.headers["rebuno-execution-id"]).toBe("0192f1a0-0000-7000-8000-000000000000")
        expect(seen[0]!.headers["rebuno-agent-id"]).toBeUndefined()

        expect(yield* send("/accepted")).toBe(true)
        seen.length = 0
        expect(yield* send("/307")).toBe(true)
        expect(seen.map((s) => [s.method, s.url, s.body])).toEqual([["POST", "/307", BODY], ["POST", "/ok", BODY]])
        seen.length = 0
        expect(yield* send("/302")).toBe(true)
        expect(seen.map((s) => [s.method, s.url, s.body])).toEqual([["POST", "/302", BODY], ["GET", "/ok", ""]])
        seen.length = 0
        const failure = (path: string) => Effect.flip(send(path))
        expect(yield* failure("/loop")).toMatchObject({
          _tag: "DeliveryError",
          reason: "too_many_redirects",
          status: 302,
          message: "stopped after 10 redirects"
        })
        expect(seen).toHaveLength(11)
        expect(yield* failure("/400")).toMatchObject({
          reason: "http_status",
          status: 400,
          message: "the agent answered 400 Bad Request"
        })
        expect(yield* failure("/500")).toMatchObject({
          reason: "http_status",
          status: 500,
          message: "the agent answered 500 Internal Server Error"
        })
      }).pipe(Effect.provide(NodeHttpClient.layerUndici)))

    it.live("network errors and timeouts are failures", () =>
      Effect.gen(function*() {
        const base = yield* serve(() => {
          // never answers
        })
        const deliver = yield* Dispatcher.httpDeliver({ timeoutMs: 200 })
        const failure = (url: string) => Effect.flip(deliver(claimFor(url), BODY, SIG))
        expect(yield* failure(base + "/hang")).toMatchObject({ reason: "timeout", message: "no answer within 0.2s" })
        const refused = yield* failure("http://127.0.0.1:1/webhook")
        expect(refused).toMatchObject({ reason: "connection_refused", message: "connection refused" })
        expect(refused.status).toBeUndefined()
        expect(yield* failure("not a url")).toMatchObject({ reason: "network_error", message: "invalid webhook URL" })
      }).pipe(Effect.provide(NodeHttpClient.layerUndici)))

    it.live("a refused connection, a 401 and a timeout: a warning each with agent, URL, attempt and cause, and the cause on dispatch.failed", () => {
      const capture = TestLogs.captureLogs()
      return Effect.gen(function*() {
        const rejecting = yield* serve((req, res) => {
          req.resume()
          req.on("end", () => {
            res.writeHead(401)
            res.end()
          })
        })
        const hanging = yield* serve(() => {
          // never answers
        })
        const core = yield* Core.make({ random: () => 0 })
        const urls: Record<string, string> = {
          down: "http://127.0.0.1:1/webhook",
          strict: rejecting + "/webhook",
          slow: hanging + "/webhook"
        }
        const executions: Record<string, string> = {}
        for (const [agentId, webhookUrl] of Object.entries(urls)) {
          yield* core.registerAgent({ id: agentId, webhookUrl, secret: SECRET })
          executions[agentId] = (yield* core.createExecution({ agentId, inputRaw: "{}", agentVersion: undefined })).id
        }
        const dispatcher = yield* Dispatcher.make(core, { background: false, timeoutMs: 300 })
        yield* dispatcher.tick

        const causes = {
          down: { message: "connection refused", reason: "connection_refused" },
          strict: { message: "the agent answered 401 Unauthorized", reason: "http_status", status: 401 },
          slow: { message: "no answer within 0.3s", reason: "timeout" }
        }
        const hints = {
          down: ` (is the agent running and listening at ${urls["down"]}?)`,
          strict:
            " (the agent rejected the signature: compare the agent's REBUNO_AGENT_SECRET with this agent's secret in the kernel's manifest)",
          slow: " (the agent must answer the webhook at once and work in the background; see --dispatch-timeout)"
        }
        for (const agentId of ["down", "strict", "slow"] as const) {
          const executionId = executions[agentId]!
          const [dispatch] = yield* core.dispatches(executionId)
          // The event: its members as PROTOCOL 12.2 lists them, plus `error` with the cause.
          expect(yield* payloadsOf(core, executionId, "dispatch.failed")).toEqual([
            `{"attempt":1,"dispatch_id":"${dispatch!.id}","error":${JSON.stringify(causes[agentId])},` +
            `"execution_id":"${executionId}","status":"failed"}`
          ])
          // The log line: one warning naming the cause, with the delivery's identity as annotations.
          const lines = capture.lines.filter((l) => l.annotations["rebuno.agent_id"] === agentId)
          expect(lines.map((l) => [l.level, l.message])).toEqual([[
            "Warn",
            `webhook delivery to agent ${agentId} failed: ${causes[agentId].message}${hints[agentId]}; attempt 1 of 5, next in 1s`
          ]])
          expect(lines[0]!.annotations).toEqual({
            "rebuno.agent_id": agentId,
            "rebuno.webhook_url": urls[agentId],
            "rebuno.execution_id": executionId,
            "rebuno.dispatch_id": dispatch!.id,
            "rebuno.dispatch_attempt": "1",
            "rebuno.error": causes[agentId].reason,
            ...(agentId === "strict" ? { "rebuno.http_status": 401 } : {})
          })
        }
      }).pipe(Effect.provide(capture.layer))
    })
  })

  describe("what a failed delivery tells", () => {
    const rejected = new Dispatcher.DeliveryError({
      reason: "http_status",
      message: "the agent answered 404 Not Found",
      status: 404
    })

    it.effect("every attempt is logged, the last one with the execution's failure; a success at debug level", () => {
      const capture = TestLogs.captureLogs()
      return Effect.gen(function*() {
        const { core, create } = yield* setup({ maxAttempts: 2 })
        const dispatcher = yield* Dispatcher.make(core, { deliver: () => Effect.fail(rejected), background: false })
        const id = yield* create
        yield* dispatcher.tick
        yield* TestClock.adjust("2 seconds")
        yield* dispatcher.tick
        expect((yield* core.getExecution(id)).failureReason).toBe("dispatch_exhausted")
        const hint = " (no webhook at http://127.0.0.1:1/webhook: check the path of the agent's webhook_url)"
        expect(capture.lines.map((l) => [l.level, l.message])).toEqual([
          ["Warn", `webhook delivery to agent hello failed: the agent answered 404 Not Found${hint}; attempt 1 of 2, next in 1s`],
          ["Warn", `webhook delivery to agent hello failed: the agent answered 404 Not Found${hint}; attempt 2 of 2, the last`],
          [
            "Error",
            `execution ${id} failed with dispatch_exhausted: gave up on agent hello after 2 attempts (last: the agent answered 404 Not Found)`
          ]
        ])
        expect(capture.lines[2]!.annotations).toMatchObject({
          "rebuno.execution_id": id,
          "rebuno.dispatch_attempt": "2",
          "rebuno.error": "http_status",
          "rebuno.http_status": 404
        })
        expect((yield* payloadsOf(core, id, "dispatch.failed")).map((p) => JSON.parse(p).error)).toEqual([
          { message: "the agent answered 404 Not Found", reason: "http_status", status: 404 },
          { message: "the agent answered 404 Not Found", reason: "http_status", status: 404 }
        ])

        capture.lines.length = 0
        const ok = yield* setup()
        const okDispatcher = yield* Dispatcher.make(ok.core, { deliver: () => Effect.succeed(true), background: false })
        const okId = yield* ok.create
        yield* okDispatcher.tick
        expect(capture.lines.map((l) => [l.level, l.message])).toEqual([
          ["Debug", "webhook delivered to agent hello; attempt 1"]
        ])
        expect(capture.lines[0]!.annotations).toMatchObject({ "rebuno.execution_id": okId, "rebuno.dispatch_attempt": "1" })
      }).pipe(Effect.provide(capture.layer))
    })

    it.effect("a deliverer's plain `false` and its defects are failures too; the logs stay silent below their level", () => {
      const capture = TestLogs.captureLogs()
      return Effect.gen(function*() {
        const { core, create } = yield* setup({ maxAttempts: 5 })
        let calls = 0
        const dispatcher = yield* Dispatcher.make(core, {
          deliver: () => (calls++ === 0 ? Effect.succeed(false) : Effect.die(new Error("boom"))),
          background: false
        })
        const id = yield* create
        yield* dispatcher.tick
        yield* TestClock.adjust("2 seconds")
        yield* dispatcher.tick
        expect(capture.lines.map((l) => l.message)).toEqual([
          "webhook delivery to agent hello failed: the deliverer reported a failure; attempt 1 of 5, next in 1s",
          "webhook delivery to agent hello failed: boom; attempt 2 of 5, next in 2s"
        ])
        // a failure without a cause records no `error`
        expect((yield* payloadsOf(core, id, "dispatch.failed")).map((p) => JSON.parse(p).error)).toEqual([
          undefined,
          { message: "boom", reason: "internal_error" }
        ])
        // Above the level, nothing is logged.
        capture.lines.length = 0
        yield* TestClock.adjust("4 seconds")
        yield* dispatcher.tick.pipe(Effect.provideService(References.MinimumLogLevel, "Error"))
        expect(capture.lines).toEqual([])
      }).pipe(Effect.provide(capture.layer))
    })

    it.effect("credentials in a webhook URL stay out of the logs", () => {
      const capture = TestLogs.captureLogs()
      return Effect.gen(function*() {
        const core = yield* Core.make({ random: () => 0 })
        yield* core.registerAgent({ id: "hello", webhookUrl: "http://bob:hunter2@127.0.0.1:1/webhook", secret: SECRET })
        yield* core.createExecution({ agentId: "hello", inputRaw: "{}", agentVersion: undefined })
        const refused = new Dispatcher.DeliveryError({ reason: "connection_refused", message: "connection refused" })
        const dispatcher = yield* Dispatcher.make(core, { deliver: () => Effect.fail(refused), background: false })
        yield* dispatcher.tick
        expect(capture.lines[0]!.message).toContain("listening at http://***@127.0.0.1:1/webhook?")
        expect(capture.lines[0]!.annotations["rebuno.webhook_url"]).toBe("http://***@127.0.0.1:1/webhook")
        expect(JSON.stringify(capture.lines)).not.toContain("hunter2")
        expect(JSON.stringify(capture.lines)).not.toContain(SECRET)
      }).pipe(Effect.provide(capture.layer))
    })

    it.effect("seed and v0.14.0 stages keep dispatch.failed as PROTOCOL 12.2 writes it; the log still tells the cause", () => {
      const capture = TestLogs.captureLogs()
      return Effect.gen(function*() {
        for (const stage of ["seed", "v0.14.0"] as const) {
          const { core, create } = yield* setup({ stage })
          const dispatcher = yield* Dispatcher.make(core, { deliver: () => Effect.fail(rejected), background: false })
          const id = yield* create
          yield* dispatcher.tick
          const [dispatch] = yield* core.dispatches(id)
          expect(yield* payloadsOf(core, id, "dispatch.failed")).toEqual([
            `{"attempt":1,"dispatch_id":"${dispatch!.id}","execution_id":"${id}","status":"failed"}`
          ])
        }
        expect(capture.lines.filter((l) => l.message.includes("the agent answered 404 Not Found"))).toHaveLength(2)
      }).pipe(Effect.provide(capture.layer))
    })
  })
})
