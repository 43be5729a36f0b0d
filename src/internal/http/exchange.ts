/**
 * HTTP plumbing shared by `KernelClient` (agent → kernel) and `Client`
 * (backends and operators): base-URL normalisation, one exchange with a
 * per-request timeout, the error mapping of PROTOCOL.md 13.3, the
 * transport-failure test and retry schedule of section 15, JSON decoding into
 * `KernelError`s, and an incremental `text/event-stream` parser.
 *
 * @since 0.1.0
 * @internal
 */
import { Clock, Context, Duration, Effect, Fiber, Random, Result, Schedule, Schema } from "effect"
import type { HttpClient, HttpClientError, HttpClientRequest } from "effect/http"
import { createParser } from "eventsource-parser"
import { DecodeError, isKernelError, KernelError, StatusError, TransportError } from "../../RebunoError.js"

/**
 * A normalised kernel base URL: `url` has its trailing `/` characters stripped
 * and is prefixed to every route path; `pathname` is its path prefix (`""` for
 * none), used as the start of a `v1` signature's request target.
 *
 * @internal
 */
export interface BaseUrl {
  readonly url: string
  readonly pathname: string
}

/**
 * Normalise a base URL (PROTOCOL.md 4.3, 14.1): trailing slashes stripped, an
 * optional path prefix kept. Fails with a reason string when the URL is unusable.
 *
 * @internal
 */
export const normalizeBaseUrl = (raw: string): Result.Result<BaseUrl, string> => {
  const trimmed = raw.trim().replace(/\/+$/, "")
  if (trimmed === "") return Result.fail("must not be empty")
  let parsed: URL
  try {
    parsed = new URL(trimmed)
  } catch {
    return Result.fail("is not a valid URL")
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    return Result.fail("must be an http or https URL")
  }
  if (parsed.search !== "" || parsed.hash !== "") {
    return Result.fail("must not contain a query or fragment")
  }
  return Result.succeed({ url: trimmed, pathname: parsed.pathname.replace(/\/+$/, "") })
}

/**
 * The status and body text of one answered request.
 *
 * @internal
 */
export interface Reply {
  readonly status: number
  readonly text: string
}

/** What failed, in the words of the Effect 3 reasons (`request failed`, `request encode error`, …). */
const describeReason = (reason: HttpClientError.HttpClientErrorReason): string => {
  switch (reason._tag) {
    case "TransportError":
      return "request failed"
    case "EncodeError":
      return "request encode error"
    case "InvalidUrlError":
      return "request invalidurl error"
    default:
      return "reading the response failed"
  }
}

const describeTransport = (error: HttpClientError.HttpClientError): string => {
  const reason = error.reason
  const cause = reason.cause
  const detail = cause instanceof Error ? cause.message : reason.description
  const what = describeReason(reason)
  return detail === undefined || detail === "" ? what : `${what}: ${detail}`
}

/**
 * A transport failure (connection error, reset, unreadable body). The request
 * itself is deliberately not kept: its headers carry credentials.
 *
 * @internal
 */
export const transportError = (error: HttpClientError.HttpClientError): KernelError =>
  new KernelError({
    reason: new TransportError({ description: describeTransport(error), cause: error.reason.cause })
  })

/**
 * The error of a request that ran out of time.
 *
 * @internal
 */
export const timeoutError = (timeout: Duration.Duration): KernelError =>
  new KernelError({ reason: new TransportError({ description: `request timed out after ${Duration.format(timeout)}` }) })

/**
 * Send one request and read its body, within `timeout`. Any answer is a
 * `Reply`, whatever its status; only transport failures and the timeout fail.
 *
 * @internal
 */
export const send = (
  client: HttpClient.HttpClient,
  request: HttpClientRequest.HttpClientRequest,
  timeout: Duration.Duration
): Effect.Effect<Reply, KernelError> =>
  withTimeout(
    client.execute(request).pipe(
      Effect.flatMap((response) => Effect.map(response.text, (text): Reply => ({ status: response.status, text }))),
      Effect.mapError(transportError)
    ),
    timeout
  )

/**
 * The class of Effect's live `Clock`: the default value of the `Clock`
 * reference, which every fiber uses unless a clock (a `TestClock`) is provided.
 */
const liveClockConstructor: unknown = Clock.Clock.defaultValue().constructor

/** The longest delay `setTimeout` honours. */
const MAX_TIMER_MILLIS = 2_147_483_647

/**
 * Apply a request timeout on Effect's clock. On the live clock (and a delay
 * `setTimeout` honours) `onTimer` gets the delay in milliseconds and applies it
 * with a plain timer; under any other clock (`TestClock`) it is
 * `Effect.timeoutOrElse`, so virtual time drives it.
 *
 * @internal
 */
export const timeoutOnClock = <A>(
  timeout: Duration.Duration,
  self: Effect.Effect<A, KernelError>,
  onTimer: (millis: number) => Effect.Effect<A, KernelError>
): Effect.Effect<A, KernelError> =>
  Effect.clockWith((clock) => {
    const millis = Duration.toMillis(timeout)
    return clock.constructor === liveClockConstructor && millis >= 0 && millis <= MAX_TIMER_MILLIS
      ? onTimer(millis)
      : Effect.timeoutOrElse(self, { duration: timeout, orElse: () => Effect.fail(timeoutError(timeout)) })
  })

/**
 * Fail with the timeout error unless `self` finishes within `timeout`.
 *
 * `Effect.timeoutOrElse` races `self` against a sleep on the clock, which costs
 * a noticeable part of a keep-alive round trip to a local kernel. On Effect's
 * live clock this does the same with one detached fiber, its observer and a
 * plain timer (see {@link timeoutOnClock}). On timeout the fiber is interrupted
 * at once (which aborts the request) and the timeout error follows once it has
 * ended.
 */
const withTimeout = <A>(self: Effect.Effect<A, KernelError>, timeout: Duration.Duration): Effect.Effect<A, KernelError> =>
  timeoutOnClock(timeout, self, (millis) =>
    Effect.uninterruptibleMask((restore) =>
      Effect.flatMap(Effect.forkDetach(restore(self)), (fiber) =>
        Effect.onInterrupt(
          restore(Effect.callback<A, KernelError>((resume) => {
            let settled = false
            const timer = setTimeout(() => {
              if (settled) return
              settled = true
              removeObserver()
              fiber.interruptUnsafe()
              resume(Effect.andThen(Fiber.await(fiber), Effect.fail(timeoutError(timeout))))
            }, millis)
            const removeObserver = fiber.addObserver((exit) => {
              if (settled) return
              settled = true
              clearTimeout(timer)
              resume(exit)
            })
            return Effect.sync(() => {
              settled = true
              clearTimeout(timer)
              removeObserver()
            })
          })),
          () => Fiber.interrupt(fiber)
        ))
    ))

/**
 * A decoded error answer (status ≥ 300), per PROTOCOL.md 13.3: the envelope's
 * `code` and `message`, or `internal_error` with the body text (or
 * `request failed` when empty) when the body is not JSON or has no `code`.
 *
 * @internal
 */
export interface ApiFailure {
  readonly status: number
  readonly code: string
  readonly message: string
  readonly ruleId: string | undefined
}

const MAX_ERROR_TEXT = 4096

/** @internal */
export const apiFailure = (reply: Reply): ApiFailure => {
  const parsed = parseJson(reply.text)
  if (Result.isSuccess(parsed)) {
    const body = parsed.success
    if (typeof body === "object" && body !== null && !Array.isArray(body)) {
      const o = body as Record<string, unknown>
      const code = o["code"]
      if (typeof code === "string" && code !== "") {
        const message = o["message"]
        const ruleId = o["rule_id"]
        return {
          status: reply.status,
          code,
          message: typeof message === "string" ? message : "",
          ruleId: typeof ruleId === "string" && ruleId !== "" ? ruleId : undefined
        }
      }
    }
  }
  const text = reply.text.trim()
  return {
    status: reply.status,
    code: "internal_error",
    message: text === "" ? "request failed" : text.length > MAX_ERROR_TEXT ? text.slice(0, MAX_ERROR_TEXT) + "…" : text,
    ruleId: undefined
  }
}

/**
 * The `KernelError` of an error answer: a `StatusError` with the HTTP status
 * and the kernel's code.
 *
 * @internal
 */
export const statusError = (failure: ApiFailure): KernelError =>
  new KernelError({
    reason: new StatusError({ status: failure.status, code: failure.code, description: failure.message })
  })

/**
 * Is this a transport failure in the sense of PROTOCOL.md 15 — an outcome after
 * which the caller cannot know whether the kernel processed the request
 * (connection error, timeout, unreadable answer, or a `5xx` status)?
 *
 * @internal
 */
export const isTransportFailure = (error: unknown): boolean =>
  isKernelError(error) &&
  (error.reason._tag === "TransportError" || (error.reason._tag === "StatusError" && error.reason.status >= 500))

/**
 * Backoff for the calls PROTOCOL.md 15 declares safe to retry: 100 ms, 200 ms,
 * 400 ms (four tries in all), on Effect's clock. This is the short schedule;
 * a run's outcome calls retry longer (see {@link CurrentRetryBudget}).
 *
 * @internal
 */
export const retrySchedule: Schedule.Schedule<unknown> = Schedule.max([
  Schedule.exponential("100 millis", 2),
  Schedule.recurs(3)
])

/**
 * How long a call keeps retrying transport failures once it has failed: a
 * capped exponential backoff with jitter (`baseMillis`, doubling, at most
 * `capMillis`, each delay drawn from 80 %–120 % of its nominal value with the
 * fiber's `Random`), until `deadline` — the instant after which the run's
 * lease cannot be valid any more, or the retry budget is spent. The last try
 * lands at the deadline; a failure after it is the call's error.
 *
 * @internal
 */
export interface RetryBudget {
  readonly baseMillis: number
  readonly capMillis: number
  /**
   * The epoch milliseconds (on the fiber's `Clock`) after which no try starts,
   * for a call whose first try failed at `firstFailureMillis`. Asked again
   * before every retry, so that a lease renewed meanwhile extends it.
   */
  readonly deadline: (firstFailureMillis: number) => number
}

/**
 * The retry budget of the calls made in this fiber: `undefined` (the default)
 * is the short schedule of {@link retrySchedule}; a run provides its lease's
 * budget around its outcome calls (step complete / fail, execution complete /
 * fail) and its heartbeat, so that a kernel outage shorter than the lease does
 * not lose finished work (issue 13). Read only once a try has failed.
 *
 * @internal
 */
export const CurrentRetryBudget = Context.Reference<RetryBudget | undefined>(
  "effect-rebuno/internal/http/CurrentRetryBudget",
  { defaultValue: () => undefined }
)

/**
 * The nominal delay before retry `retry` (0-based) of a budget:
 * `min(cap, base × 2^retry)`.
 *
 * @internal
 */
export const nominalDelayMillis = (budget: Pick<RetryBudget, "baseMillis" | "capMillis">, retry: number): number =>
  Math.min(budget.capMillis, budget.baseMillis * 2 ** Math.min(retry, 52))

/** A delay drawn from 80 %–120 % of `millis`, as `Schedule.jittered` draws it. */
const jitter = (millis: number, random: number): number => millis * 0.8 * (1 - random) + millis * 1.2 * random

/**
 * Retry an effect on transport failures only. With `again`, the first try is
 * `self` and the retries run `again` (for a first try already under way).
 *
 * Without a {@link CurrentRetryBudget} in the fiber it retries three times
 * (100, 200, 400 ms); with one it retries until the budget's deadline.
 *
 * @internal
 */
export const retryTransport = <A, E, R>(
  self: Effect.Effect<A, E, R>,
  again: Effect.Effect<A, E, R> = self
): Effect.Effect<A, E, R> =>
  Effect.catchIf(self, isTransportFailure, (error) =>
    Effect.withFiber((fiber) => {
      const budget = fiber.getRef(CurrentRetryBudget)
      return budget === undefined
        ? Effect.andThen(Effect.sleep(Duration.millis(RETRY_DELAYS_MILLIS[0]!)), retryFrom(again, again, 1))
        : retryWithin(again, budget, fiber.getRef(Clock.Clock).currentTimeMillisUnsafe(), 0, error)
    }))

/** The delays of {@link retrySchedule}, as plain numbers: nothing is set up until a try fails. */
const RETRY_DELAYS_MILLIS: ReadonlyArray<number> = [100, 200, 400]

const retryFrom = <A, E, R>(
  self: Effect.Effect<A, E, R>,
  again: Effect.Effect<A, E, R>,
  retry: number
): Effect.Effect<A, E, R> =>
  retry >= RETRY_DELAYS_MILLIS.length
    ? self
    : Effect.catchIf(
      self,
      isTransportFailure,
      () => Effect.andThen(Effect.sleep(Duration.millis(RETRY_DELAYS_MILLIS[retry]!)), retryFrom(again, again, retry + 1))
    )

/** The retry after which a budgeted call says, once, that it keeps retrying (the short schedule would have given up). */
const WARN_AT_RETRY = RETRY_DELAYS_MILLIS.length

/**
 * Retry `again` after the backoff delay of `retry`, cut short at the budget's
 * deadline; fail with `error` (the last failure) once the deadline has passed.
 */
const retryWithin = <A, E, R>(
  again: Effect.Effect<A, E, R>,
  budget: RetryBudget,
  firstFailure: number,
  retry: number,
  error: E
): Effect.Effect<A, E, R> =>
  Effect.withFiber((fiber) => {
    const now = fiber.getRef(Clock.Clock).currentTimeMillisUnsafe()
    const deadline = budget.deadline(firstFailure)
    // Whole milliseconds: a sub-millisecond remainder is no time to retry in.
    const remaining = Math.ceil(deadline - now)
    if (!(remaining >= 1)) return Effect.fail(error)
    const drawn = Math.round(jitter(nominalDelayMillis(budget, retry), fiber.getRef(Random.Random).nextDoubleUnsafe()))
    const delay = Math.min(remaining, Math.max(1, drawn))
    const next = Effect.andThen(
      Effect.sleep(Duration.millis(delay)),
      Effect.catchIf(again, isTransportFailure, (e) => retryWithin(again, budget, firstFailure, retry + 1, e))
    )
    return retry === WARN_AT_RETRY
      ? Effect.andThen(
        Effect.logWarning(
          `the kernel is unreachable (${describeError(error)}); retrying until ${
            new Date(deadline).toISOString()
          }, while the run's lease can still be valid`
        ),
        next
      )
      : next
  })

const describeError = (error: unknown): string => error instanceof Error ? error.message : String(error)

/**
 * `JSON.parse` without throwing.
 *
 * @internal
 */
export const parseJson = (text: string): Result.Result<unknown, string> => {
  try {
    return Result.succeed(JSON.parse(text))
  } catch (e) {
    return Result.fail(e instanceof Error ? e.message : "invalid JSON")
  }
}

/**
 * The `KernelError` of an answer whose body could not be decoded.
 *
 * @internal
 */
export const decodeError = (status: number, description: string): KernelError =>
  new KernelError({ reason: new DecodeError({ status, description }) })

/**
 * Build a decoder from a reply's JSON body to a schema's type, failing with a
 * `DecodeError` `KernelError`.
 *
 * @internal
 */
export const jsonDecoder = <S extends Schema.ConstraintDecoder<unknown>>(schema: S) => {
  const decode = Schema.decodeUnknownResult(schema)
  return (reply: Reply): Effect.Effect<S["Type"], KernelError> => {
    const parsed = parseJson(reply.text)
    if (Result.isFailure(parsed)) {
      return Effect.fail(decodeError(reply.status, `response is not JSON: ${parsed.failure}`))
    }
    const decoded = decode(parsed.success)
    return Result.isSuccess(decoded)
      ? Effect.succeed(decoded.success)
      : Effect.fail(decodeError(reply.status, `unexpected response: ${decoded.failure.message}`))
  }
}

// ---------------------------------------------------------------------------
// text/event-stream
// ---------------------------------------------------------------------------

/**
 * An incremental `text/event-stream` parser: feed it decoded text chunks (split
 * anywhere, including inside a line or between CR and LF) and it returns the
 * `data` of every event completed so far. Lines starting with `:` are
 * comments; fields other than `data` are ignored (an event's type does not
 * filter it out); an event is dispatched at a blank line when it has data; an
 * unterminated event at the end is dropped. The parsing is `eventsource-parser`'s
 * (the WHATWG algorithm, a leading BOM stripped); this only collects the data.
 *
 * @internal
 */
export interface SseParser {
  readonly feed: (chunk: string) => ReadonlyArray<string>
}

/** @internal */
export const makeSseParser = (): SseParser => {
  let out: Array<string> = []
  const parser = createParser({
    onEvent: (event) => {
      out.push(event.data)
    }
  })
  return {
    feed: (chunk) => {
      parser.feed(chunk)
      if (out.length === 0) return EMPTY
      const events = out
      out = []
      return events
    }
  }
}

const EMPTY: ReadonlyArray<string> = []
