/**
 * The delivery loop of the embedded kernel (PROTOCOL 5.3–5.5). Every 2 s on
 * Effect's `Clock` — and at once when the core enqueues a dispatch — a tick
 * reclaims stale leases, expires due approvals, sweeps execution deadlines,
 * admits waiting session executions, claims up to 10 due dispatches and
 * delivers them concurrently (at most `concurrency` at a time), recording
 * each outcome in the core. In the current stage (PROTOCOL-CURRENT C.10) it
 * polls about every 250 ms, at once again after a full claim, and claims no
 * more dispatches than it has idle workers. Delivery is
 * pluggable: the default POSTs the signed webhook with `HttpClient`; the test kit
 * plugs in an in-process deliverer. `tick` runs one tick on demand and awaits its
 * deliveries (the test hook of 16.4).
 *
 * @since 0.1.0
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Scope from "effect/Scope"
import * as Semaphore from "effect/Semaphore"
import * as HttpClient from "effect/http/HttpClient"
import type * as HttpClientError from "effect/http/HttpClientError"
import * as HttpClientRequest from "effect/http/HttpClientRequest"
import * as Signature from "../Signature.js"
import type * as Core from "./Core.js"
import * as Wire from "./Wire.js"

/**
 * Sends one webhook. Succeeds with `true` when the agent answered 2xx and with
 * `false` for any other outcome; never fails. Like a webhook answer, it should
 * resolve once the agent has accepted the dispatch, not when its run ends: a
 * tick awaits its deliveries.
 *
 * @since 0.1.0
 * @category models
 */
export interface Deliver {
  (claim: Core.Claim, body: string, signature: string): Effect.Effect<boolean>
}

/**
 * Options of the dispatcher.
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** Deliveries in flight at once (default 8). */
  readonly concurrency?: number | undefined
  /** Webhook timeout of the default HTTP deliverer in ms (default 30 000). */
  readonly timeoutMs?: number | undefined
  /** Interval between deadline sweeps in ms (default 30 000); only when the core has deadlines on. */
  readonly deadlineCheckIntervalMs?: number | undefined
  /**
   * Tick interval in ms (default 2 000; 250 in the current stage, which polls
   * continuously, PROTOCOL-CURRENT C.10).
   */
  readonly tickIntervalMs?: number | undefined
  /** Claim batch (default 10; in the current stage never more than the idle workers). */
  readonly claimBatch?: number | undefined
  /** Custom delivery; defaults to the HTTP deliverer on `NodeHttpClient`. */
  readonly deliver?: Deliver | undefined
  /** Run the background loop (default `true`); `false` leaves ticking to `tick`. */
  readonly background?: boolean | undefined
}

/**
 * A running dispatcher.
 *
 * @since 0.1.0
 * @category models
 */
export interface Dispatcher {
  /** Runs one tick now (reclaim, sweeps, claim, deliver) and awaits its deliveries. */
  readonly tick: Effect.Effect<void>
}

/**
 * The dispatcher as a service.
 *
 * @since 0.1.0
 * @category tags
 */
export class DispatcherTag extends Context.Service<DispatcherTag, Dispatcher>()("effect-rebuno/kernel/Dispatcher") {}

/**
 * Defaults of PROTOCOL Appendix A.
 *
 * @since 0.1.0
 * @category constants
 */
export const defaults = {
  concurrency: 8,
  timeoutMs: 30_000,
  deadlineCheckIntervalMs: 30_000,
  tickIntervalMs: 2_000,
  currentTickIntervalMs: 250,
  claimBatch: 10,
  maxRedirects: 10
} as const

/**
 * The exact webhook body of PROTOCOL 5.5 (members in order, no whitespace):
 * `dispatch_attempt` and `lease_timeout_seconds` always (PROTOCOL-CURRENT
 * C.2.2), except in the `"v0.14.0"` stage, whose form has neither.
 *
 * @since 0.1.0
 * @category webhook
 */
export const webhookBody = (claim: Core.Claim, stage: Core.Stage): string =>
  Wire.encodeWebhookBody(claim, { stage })

const isRedirect = (status: number): boolean =>
  status === 301 || status === 302 || status === 303 || status === 307 || status === 308

/**
 * The default deliverer: POSTs the webhook with `HttpClient`, follows up to 10
 * redirects the way Go's client does (301/302/303 continue as a bodiless GET,
 * 307/308 repeat the POST), reads and discards every response body, and treats
 * anything but a final 2xx — including errors and the timeout — as failure.
 *
 * @since 0.1.0
 * @category webhook
 */
export const httpDeliver = (
  options: { readonly timeoutMs?: number | undefined } = {}
): Effect.Effect<Deliver, never, HttpClient.HttpClient> =>
  Effect.map(HttpClient.HttpClient, (client): Deliver => (claim, body, signature) => {
    const post = HttpClientRequest.post(claim.agent.webhookUrl).pipe(
      HttpClientRequest.setHeaders({
        "Rebuno-Signature": signature,
        "Rebuno-Execution-Id": claim.executionId
      }),
      HttpClientRequest.bodyText(body, "application/json")
    )
    const loop = (
      request: HttpClientRequest.HttpClientRequest,
      redirects: number
    ): Effect.Effect<boolean, HttpClientError.HttpClientError> =>
      Effect.flatMap(client.execute(request), (response) =>
        Effect.flatMap(Effect.ignore(response.arrayBuffer), () => {
          const location = response.headers["location"]
          if (isRedirect(response.status) && location !== undefined && redirects < defaults.maxRedirects) {
            const url = new URL(location, request.url).toString()
            const next = response.status === 307 || response.status === 308
              ? HttpClientRequest.setUrl(request, url)
              : HttpClientRequest.get(url).pipe(
                HttpClientRequest.setHeaders({
                  "Rebuno-Signature": signature,
                  "Rebuno-Execution-Id": claim.executionId
                })
              )
            return loop(next, redirects + 1)
          }
          return Effect.succeed(response.status >= 200 && response.status < 300)
        }))
    return loop(post, 0).pipe(
      Effect.timeout(Duration.millis(options.timeoutMs ?? defaults.timeoutMs)),
      Effect.catchCause(() => Effect.succeed(false))
    )
  })

/**
 * Creates a dispatcher over a core and, unless `background: false`, forks its
 * loop in the current scope.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  core: Core.KernelCore,
  options: Options = {}
): Effect.Effect<Dispatcher, never, Scope.Scope> =>
  Effect.gen(function*() {
    const deliver = options.deliver ??
      (yield* httpDeliver({ timeoutMs: options.timeoutMs }).pipe(
        Effect.provideContext(yield* Layer.build(NodeHttpClient.layerUndici))
      ))
    const concurrency = Math.max(1, options.concurrency ?? defaults.concurrency)
    const semaphore = yield* Semaphore.make(concurrency)
    // PROTOCOL-CURRENT C.10: the current stage polls about every 250 ms and
    // claims only as many dispatches as there are idle workers, so that no
    // claimed dispatch waits for a worker while its lease runs.
    const current = () => core.settings.stage === "current"
    const seedInterval = Duration.millis(options.tickIntervalMs ?? defaults.tickIntervalMs)
    const currentInterval = Duration.millis(options.tickIntervalMs ?? defaults.currentTickIntervalMs)
    const deadlineInterval = options.deadlineCheckIntervalMs ?? defaults.deadlineCheckIntervalMs
    const claimBatch = options.claimBatch ?? defaults.claimBatch
    let lastDeadlineSweep: number | undefined
    /** Claimed dispatches not recorded yet. */
    let busyWorkers = 0

    const deliverOne = (claim: Core.Claim): Effect.Effect<void> =>
      Effect.gen(function*() {
        const body = webhookBody(claim, core.settings.stage)
        const signature = yield* Signature.sign(claim.agent.secret, body)
        const ok = yield* deliver(claim, body, signature).pipe(Effect.catchCause(() => Effect.succeed(false)))
        yield* core.recordDelivery(claim, ok)
      }).pipe(
        semaphore.withPermits(1),
        Effect.ensuring(Effect.sync(() => {
          busyWorkers--
        }))
      )

    const sweepDeadlines = Effect.gen(function*() {
      if (core.settings.deadlineMs === undefined) return
      const now = yield* Clock.currentTimeMillis
      if (lastDeadlineSweep !== undefined && now < lastDeadlineSweep + deadlineInterval) return
      lastDeadlineSweep = now
      yield* core.cancelPastDeadline()
    })

    /** One tick; `true` when it claimed as many as it could, so more may be due at once. */
    const tickOnce: Effect.Effect<boolean> = Effect.gen(function*() {
      yield* core.reclaimStale()
      yield* core.expireApprovals()
      yield* sweepDeadlines
      yield* core.admitSessions()
      const limit = current() ? Math.min(claimBatch, concurrency - busyWorkers) : claimBatch
      if (limit <= 0) return false
      const claims = yield* core.claimDue(limit)
      busyWorkers += claims.length
      yield* Effect.forEach(claims, deliverOne, { concurrency: "unbounded", discard: true })
      return claims.length === limit
    }).pipe(Effect.withSpan("Dispatcher.tick"))

    const tick: Effect.Effect<void> = Effect.asVoid(tickOnce)

    if (options.background ?? true) {
      const loop = Effect.gen(function*() {
        const full = yield* tickOnce.pipe(
          Effect.catchCause((cause) => Effect.as(Effect.logError("dispatcher tick failed", cause), false))
        )
        if (full && current()) return
        yield* Effect.raceFirst(Effect.sleep(current() ? currentInterval : seedInterval), core.enqueued)
      }).pipe(Effect.forever)
      yield* Effect.forkScoped(loop)
    }

    return { tick }
  })

/**
 * The dispatcher as a scoped layer.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (core: Core.KernelCore, options: Options = {}): Layer.Layer<DispatcherTag> =>
  Layer.effect(DispatcherTag, make(core, options))
