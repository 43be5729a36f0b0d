/**
 * The kernel client's transports: how one signed request reaches the kernel and
 * its answer comes back as a {@link Reply}. Two implementations send the same
 * bytes:
 *
 * - {@link fromHttpClient}: any `effect/http` `HttpClient` (fetch, undici,
 *   a test double, a client with tracing or proxy transforms);
 * - {@link fromDispatcher}: an undici `Dispatcher` driven directly through its
 *   handler interface — no request/response objects, streams or promises per
 *   call, which is most of what a keep-alive round trip to a local kernel costs.
 *
 * Both apply the per-request timeout on Effect's clock (on the live clock a
 * plain timer — for the dispatcher, one timer shared by the transport's
 * requests; `Effect.timeoutOrElse` under `TestClock`), map connection
 * failures to `TransportError` `KernelError`s, and never follow redirects.
 *
 * @since 0.1.0
 * @internal
 */
import type * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { Duration, Effect, Option } from "effect"
import type { HttpClient } from "effect/http"
import { Headers, HttpBody, HttpClientRequest, UrlParams } from "effect/http"
import { KernelError, TransportError } from "../../RebunoError.js"
import type { BaseUrl, Reply } from "./exchange.js"
import type { Deadline } from "./deadlines.js"
import { Deadlines } from "./deadlines.js"
import { send, timeoutError, timeoutOnClock } from "./exchange.js"

/**
 * One request, fully built and signed: `path` is the route (`/v0/…`) relative
 * to the base URL, `headers` are lower-case names.
 *
 * @internal
 */
export interface WireRequest {
  readonly method: "GET" | "POST" | "PUT"
  readonly path: string
  readonly headers: Record<string, string>
  readonly body: Uint8Array | undefined
}

/**
 * Send one request and read the whole answer, whatever its status; only
 * transport failures and the timeout fail.
 *
 * @internal
 */
export type Send = (request: WireRequest) => Effect.Effect<Reply, KernelError>

const JSON_TYPE = "application/json"

/**
 * An undici `Dispatcher`, as provided by `NodeHttpClient.Dispatcher`.
 *
 * @internal
 */
export type UndiciDispatcher = NodeHttpClient.Dispatcher["Service"]

/**
 * A transport over an `HttpClient`.
 *
 * @internal
 */
export const fromHttpClient = (
  client: HttpClient.HttpClient,
  base: BaseUrl,
  timeout: Duration.Duration
): Send =>
(request) => {
  const body = request.body
  let headers = request.headers
  // The request as built on Effect 3, so that a `transformClient` sees the same
  // headers: a non-empty body adds its length last; an empty one adds none (the
  // HTTP client sends `content-length: 0` itself), where Effect 4's `setBody`
  // would add `content-length: 0`.
  if (body !== undefined && body.length > 0) headers = { ...headers, "content-length": String(body.length) }
  return send(
    client,
    HttpClientRequest.makeWith(
      request.method,
      base.url + request.path,
      UrlParams.empty,
      Option.none(),
      Headers.fromRecordUnsafe(headers),
      body === undefined ? HttpBody.empty : HttpBody.uint8Array(body, JSON_TYPE)
    ),
    timeout
  )
}

/**
 * A transport over an undici `Dispatcher` (an `Agent`, `Pool` or `Client`).
 *
 * @internal
 */
export const fromDispatcher = (
  dispatcher: UndiciDispatcher,
  base: BaseUrl,
  timeout: Duration.Duration
): Send => {
  const origin = new URL(base.url).origin
  return withDeadlines(timeout, (request, deadlines) => dispatch(dispatcher, origin, base.pathname, request, deadlines))
}

/**
 * A transport from one exchange that fails with the timeout error once its
 * deadline in `deadlines` (if given) has passed: on Effect's live clock every
 * request gets a deadline in one {@link Deadlines} list shared by the
 * transport's requests; under any other clock (`TestClock`) none, and
 * `timeoutOnClock` applies the timeout in virtual time.
 *
 * @internal
 */
export const withDeadlines = (
  timeout: Duration.Duration,
  exchange: (request: WireRequest, deadlines: Deadlines | undefined) => Effect.Effect<Reply, KernelError>
): Send => {
  let deadlines: Deadlines | undefined
  return (request) =>
    timeoutOnClock(
      timeout,
      exchange(request, undefined),
      (millis) => exchange(request, deadlines ??= new Deadlines(millis, timeout))
    )
}

/**
 * A transport failure: `prefix` (`request failed`, `reading the response
 * failed`) and the cause's message.
 *
 * @internal
 */
export const failure = (prefix: string, error: unknown): KernelError => {
  const detail = error instanceof Error ? error.message : ""
  return new KernelError({
    reason: new TransportError({ description: detail === "" ? prefix : `${prefix}: ${detail}`, cause: error })
  })
}

/** The abort reason handed to undici on interruption or timeout; never surfaces. */
class Aborted extends Error {}

/**
 * One exchange through the dispatcher's handler interface. With `deadlines`,
 * the request fails with the timeout error (and is aborted) once its
 * deadline has passed.
 */
const dispatch = (
  dispatcher: UndiciDispatcher,
  origin: string,
  pathPrefix: string,
  request: WireRequest,
  deadlines: Deadlines | undefined
): Effect.Effect<Reply, KernelError> =>
  Effect.callback<Reply, KernelError>((resume) => {
    let settled = false
    let controller: { abort(reason: Error): void } | undefined
    let abortRequested = false
    let status = 0
    let responded = false
    const chunks: Array<Buffer> = []
    let deadline: Deadline | undefined

    const settle = (effect: Effect.Effect<Reply, KernelError>) => {
      if (settled) return
      settled = true
      if (deadline !== undefined) deadlines!.remove(deadline)
      resume(effect)
    }
    const abort = () => {
      abortRequested = true
      if (controller !== undefined) controller.abort(new Aborted("aborted"))
    }

    if (deadlines !== undefined) {
      deadline = deadlines.add(() => {
        settle(Effect.fail(timeoutError(deadlines.timeout)))
        abort()
      })
    }

    try {
      dispatcher.dispatch({
        origin,
        path: pathPrefix + request.path,
        method: request.method,
        headers: request.headers,
        body: request.body ?? null
      }, {
        onRequestStart(c) {
          controller = c
          if (abortRequested) c.abort(new Aborted("aborted"))
        },
        onResponseStart(_c, statusCode) {
          // 1xx informational answers are followed by the real one.
          if (statusCode < 200) return
          status = statusCode
          responded = true
        },
        onResponseData(_c, chunk) {
          chunks.push(chunk)
        },
        onResponseEnd() {
          const text = chunks.length === 1 ? chunks[0]!.toString("utf8") : Buffer.concat(chunks).toString("utf8")
          settle(Effect.succeed({ status, text }))
        },
        onResponseError(_c, error) {
          if (error instanceof Aborted) return
          settle(Effect.fail(failure(responded ? "reading the response failed" : "request failed", error)))
        }
      })
    } catch (error) {
      settle(Effect.fail(failure("request failed", error)))
    }

    return Effect.sync(() => {
      settled = true
      if (deadline !== undefined) deadlines!.remove(deadline)
      abort()
    })
  })
