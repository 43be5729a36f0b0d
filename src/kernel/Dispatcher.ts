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
 * Every failed delivery is logged (`Warning`) with the agent id, its webhook
 * URL, the execution, dispatch and attempt as log annotations and the cause
 * in the message — the HTTP status the agent answered, a refused connection,
 * a timeout — with a hint at the usual mistake; the last one is followed by
 * an `Error` line for the execution failing with `dispatch_exhausted`. A
 * delivery that succeeds is logged at `Debug`. In the current stage the
 * cause is also recorded on the `dispatch.failed` event as
 * `error: {message, reason, status?}`.
 *
 * @since 0.1.0
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import * as Semaphore from "effect/Semaphore"
import * as HttpClient from "effect/http/HttpClient"
import type * as HttpClientError from "effect/http/HttpClientError"
import * as HttpClientRequest from "effect/http/HttpClientRequest"
import { STATUS_CODES } from "node:http"
import * as Signature from "../Signature.js"
import type * as Core from "./Core.js"
import * as Wire from "./Wire.js"

/**
 * Why a webhook delivery failed, as the default deliverer reports it:
 *
 * - `http_status`: the agent answered something other than 2xx (`status`);
 * - `too_many_redirects`: more than 10 redirects (`status` of the last);
 * - `connection_refused`: nothing listens at the webhook URL;
 * - `timeout`: no answer within the webhook timeout;
 * - `network_error`: any other transport failure (unknown host, reset, bad URL);
 * - `internal_error`: the deliverer itself failed unexpectedly.
 *
 * `message` is the readable cause (`the agent answered 401 Unauthorized`,
 * `connection refused`, `no answer within 30s`). The dispatcher logs it and,
 * in the current stage, records it on `dispatch.failed` as
 * `error: {message, reason, status?}`.
 *
 * @since 0.2.0
 * @category errors
 */
export class DeliveryError extends Schema.TaggedError<DeliveryError>("effect-rebuno/kernel/DeliveryError")(
  "DeliveryError",
  {
    reason: Schema.Literals([
      "http_status",
      "too_many_redirects",
      "connection_refused",
      "timeout",
      "network_error",
      "internal_error"
    ]),
    message: Schema.String,
    status: Schema.optional(Schema.Int)
  }
) {}

/**
 * Sends one webhook. Succeeds with `true` when the agent answered 2xx; any
 * other outcome is a failed delivery: fail with a {@link DeliveryError} saying
 * why (or succeed with `false` when there is no cause to tell). Like a webhook
 * answer, it should resolve once the agent has accepted the dispatch, not when
 * its run ends: a tick awaits its deliveries.
 *
 * @since 0.1.0
 * @category models
 */
export interface Deliver {
  (claim: Core.Claim, body: string, signature: string): Effect.Effect<boolean, DeliveryError>
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

const statusText = (status: number): string => {
  const text = STATUS_CODES[status]
  return text === undefined ? String(status) : `${status} ${text}`
}

/** The `code` of the first error in a cause chain that has one (`ECONNREFUSED`, …). */
const errorCode = (error: unknown): { readonly code: string; readonly message: string } | undefined => {
  let current: unknown = error
  for (let depth = 0; depth < 8 && typeof current === "object" && current !== null; depth++) {
    const code = (current as { readonly code?: unknown }).code
    if (typeof code === "string") {
      const message = (current as { readonly message?: unknown }).message
      return { code, message: typeof message === "string" ? message : code }
    }
    current = (current as { readonly cause?: unknown }).cause
  }
  return undefined
}

/** A transport failure of the HTTP client as a {@link DeliveryError}. */
const transportFailure = (error: unknown): DeliveryError => {
  const found = errorCode(error)
  switch (found?.code) {
    case "ECONNREFUSED":
      return new DeliveryError({ reason: "connection_refused", message: "connection refused" })
    case "ENOTFOUND":
    case "EAI_AGAIN":
      return new DeliveryError({ reason: "network_error", message: `unknown host (${found.message})` })
    case "ECONNRESET":
    case "UND_ERR_SOCKET":
      return new DeliveryError({ reason: "network_error", message: "connection reset by the agent" })
    case "ERR_INVALID_URL":
      return new DeliveryError({ reason: "network_error", message: "invalid webhook URL" })
  }
  const message = found?.message ??
    (error instanceof Error ? error.message : typeof error === "string" ? error : "transport error")
  return new DeliveryError({ reason: "network_error", message })
}

/** What a failed delivery's `Cause` says, as a {@link DeliveryError} (`undefined`: interrupted). */
const failureOf = (cause: Cause.Cause<unknown>, timeoutMs: number): DeliveryError | undefined => {
  for (const reason of cause.reasons) {
    if (Cause.isFailReason(reason)) {
      const error = reason.error
      if (error instanceof DeliveryError) return error
      if (Cause.isTimeoutError(error)) {
        return new DeliveryError({ reason: "timeout", message: `no answer within ${formatSeconds(timeoutMs)}` })
      }
      return transportFailure(error)
    }
    if (Cause.isDieReason(reason)) {
      const defect = reason.defect
      return new DeliveryError({
        reason: "internal_error",
        message: defect instanceof Error ? defect.message : String(defect)
      })
    }
  }
  return undefined
}

const formatSeconds = (ms: number): string =>
  ms % 1000 === 0 ? `${ms / 1000}s` : `${(Math.max(0, ms) / 1000).toFixed(1)}s`

/**
 * The default deliverer: POSTs the webhook with `HttpClient`, follows up to 10
 * redirects the way Go's client does (301/302/303 continue as a bodiless GET,
 * 307/308 repeat the POST), reads and discards every response body, and treats
 * anything but a final 2xx as a failure, failing with a {@link DeliveryError}
 * that says why: the status the agent answered, too many redirects, a refused
 * connection, another transport error, or the timeout.
 *
 * @since 0.1.0
 * @category webhook
 */
export const httpDeliver = (
  options: { readonly timeoutMs?: number | undefined } = {}
): Effect.Effect<Deliver, never, HttpClient.HttpClient> =>
  Effect.map(HttpClient.HttpClient, (client): Deliver => (claim, body, signature) => {
    const timeoutMs = options.timeoutMs ?? defaults.timeoutMs
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
    ): Effect.Effect<boolean, HttpClientError.HttpClientError | DeliveryError> =>
      Effect.flatMap(client.execute(request), (response) =>
        Effect.flatMap(Effect.ignore(response.arrayBuffer), () => {
          const location = response.headers["location"]
          if (isRedirect(response.status) && location !== undefined) {
            if (redirects >= defaults.maxRedirects) {
              return Effect.fail(
                new DeliveryError({
                  reason: "too_many_redirects",
                  message: `stopped after ${defaults.maxRedirects} redirects`,
                  status: response.status
                })
              )
            }
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
          return response.status >= 200 && response.status < 300
            ? Effect.succeed(true)
            : Effect.fail(
              new DeliveryError({
                reason: "http_status",
                message: `the agent answered ${statusText(response.status)}`,
                status: response.status
              })
            )
        }))
    return loop(post, 0).pipe(
      Effect.timeout(Duration.millis(timeoutMs)),
      Effect.catchCause((cause) => {
        const error = failureOf(cause, timeoutMs)
        return error === undefined ? Effect.failCause(cause as Cause.Cause<never>) : Effect.fail(error)
      })
    )
  })

/**
 * {@link httpDeliver} on an undici client built in the current scope on the
 * first delivery, not before: a kernel that has not delivered yet has not
 * loaded undici, so it starts sooner.
 */
const lazyHttpDeliver = (timeoutMs: number | undefined): Effect.Effect<Deliver, never, Scope.Scope> =>
  Effect.gen(function*() {
    const scope = yield* Effect.scope
    const built = yield* Effect.cached(
      Effect.flatMap(
        Layer.buildWithScope(NodeHttpClient.layerUndici, scope),
        (context) => httpDeliver({ timeoutMs }).pipe(Effect.provideContext(context))
      )
    )
    return (claim, body, signature) => Effect.flatMap(built, (deliver) => deliver(claim, body, signature))
  })

/** The webhook URL with any user info masked: it goes into logs. */
const loggableUrl = (url: string): string => {
  try {
    const parsed = new URL(url)
    if (parsed.username === "" && parsed.password === "") return url
    parsed.username = "***"
    parsed.password = ""
    return parsed.toString()
  } catch {
    return url
  }
}

/** The usual mistake behind a failed delivery, as advice to append to the log line. */
const hintFor = (error: DeliveryError | undefined, url: string): string => {
  if (error === undefined) return ""
  switch (error.reason) {
    case "connection_refused":
      return ` (is the agent running and listening at ${url}?)`
    case "http_status":
      return error.status === 401 || error.status === 403
        ? " (the agent rejected the signature: compare the agent's REBUNO_AGENT_SECRET with this agent's secret in the kernel's manifest)"
        : error.status === 404 || error.status === 405
        ? ` (no webhook at ${url}: check the path of the agent's webhook_url)`
        : ""
    case "timeout":
      return " (the agent must answer the webhook at once and work in the background; see --dispatch-timeout)"
    default:
      return ""
  }
}

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
    const deliver = options.deliver ?? (yield* lazyHttpDeliver(options.timeoutMs))
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

    const timeoutMs = options.timeoutMs ?? defaults.timeoutMs

    /** Logs a failed delivery and, when it was the last attempt, the execution's failure. */
    const logFailure = (
      claim: Core.Claim,
      error: DeliveryError | undefined,
      recorded: Core.DeliveryRecorded
    ): Effect.Effect<void> =>
      Effect.gen(function*() {
        const url = loggableUrl(claim.agent.webhookUrl)
        const cause = error?.message ?? "the deliverer reported a failure"
        let progress = `attempt ${claim.attempt}`
        if (recorded._tag === "Retrying") {
          progress += ` of ${recorded.maxAttempts}, next in ${formatSeconds(recorded.retryInMs)}`
        } else if (recorded._tag === "Exhausted") {
          progress += ` of ${recorded.maxAttempts}, the last`
        }
        yield* Effect.logWarning(
          `webhook delivery to agent ${claim.agent.id} failed: ${cause}${hintFor(error, url)}; ${progress}`
        )
        if (recorded._tag === "Exhausted") {
          const attempts = recorded.maxAttempts === 1 ? "1 attempt" : `${recorded.maxAttempts} attempts`
          yield* Effect.logError(
            `execution ${claim.executionId} failed with dispatch_exhausted: ` +
              `gave up on agent ${claim.agent.id} after ${attempts} (last: ${cause})`
          )
        }
      }).pipe(
        Effect.annotateLogs({
          "rebuno.agent_id": claim.agent.id,
          "rebuno.webhook_url": loggableUrl(claim.agent.webhookUrl),
          "rebuno.execution_id": claim.executionId,
          "rebuno.dispatch_id": claim.dispatchId,
          "rebuno.dispatch_attempt": String(claim.attempt),
          ...(error === undefined ? {} : { "rebuno.error": error.reason }),
          ...(error?.status === undefined ? {} : { "rebuno.http_status": error.status })
        })
      )

    const deliverOne = (claim: Core.Claim): Effect.Effect<void> =>
      Effect.gen(function*() {
        const body = webhookBody(claim, core.settings.stage)
        const signature = yield* Signature.sign(claim.agent.secret, body)
        const exit = yield* Effect.exit(deliver(claim, body, signature))
        if (Exit.isSuccess(exit) && exit.value) {
          yield* core.recordDelivery(claim, true)
          yield* Effect.logDebug(`webhook delivered to agent ${claim.agent.id}; attempt ${claim.attempt}`).pipe(
            Effect.annotateLogs({
              "rebuno.agent_id": claim.agent.id,
              "rebuno.execution_id": claim.executionId,
              "rebuno.dispatch_id": claim.dispatchId,
              "rebuno.dispatch_attempt": String(claim.attempt)
            })
          )
          return
        }
        const error = Exit.isSuccess(exit) ? undefined : failureOf(exit.cause, timeoutMs)
        const recorded = yield* core.recordDelivery(claim, false, error)
        yield* logFailure(claim, error, recorded)
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
