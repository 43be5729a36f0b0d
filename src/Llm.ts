/**
 * Durable LLM calls (PROTOCOL.md 14.7, 14.8). Provider calls made inside a run
 * are recorded as `llm_call` steps — target = the request's `model`, args = the
 * whole JSON request body — so that a re-delivered run replays the recorded
 * response instead of calling the provider again, and policy can deny,
 * rate-limit or hold a model call for approval. Two entry points share one
 * implementation:
 *
 * - {@link makeFetch} builds a `fetch` for Promise-based provider SDKs (the
 *   `openai` client's `fetch` option, and the like);
 * - {@link transformClient} / {@link layerHttpClient} wrap an `HttpClient` (from
 *   `effect/http`) so that Effect-native clients built on it are recorded too.
 *
 * Refusals are answered as HTTP responses whose body carries a
 * `rebuno_refusal: …` marker (403, 429 or 409); the provider SDK turns them into
 * its own error, and {@link raiseForRefusal} turns that error back into the
 * typed `PolicyError`, `RateLimited` or run signal. Event streams are teed: the
 * caller gets the provider's bytes as they come, the kernel gets live deltas
 * and, at the end, the whole transcript.
 *
 * @since 0.1.0
 */
import { Effect, Layer, Option } from "effect"
import { HttpClient } from "effect/http"
import { Execution } from "./Execution.js"
import type { Blocked, LeaseSuperseded, PolicyError, RateLimited, Terminated } from "./RebunoError.js"
import * as internal from "./internal/run/llm.js"
import * as refusal from "./internal/run/llmRefusal.js"
import * as stream from "./internal/run/llmStream.js"

/**
 * A `fetch`-compatible function (what provider SDKs accept as their `fetch`
 * option).
 *
 * @since 0.1.0
 * @category models
 */
export type Fetch = internal.Fetch

/**
 * Options of {@link makeFetch}.
 *
 * @since 0.1.0
 * @category models
 */
export interface FetchOptions {
  /** The fetch that reaches the provider (default: `globalThis.fetch`, looked up per call). */
  readonly fetch?: Fetch | undefined
}

/**
 * What a refusal marker decodes to.
 *
 * @since 0.1.0
 * @category models
 */
export type Refusal = Blocked | Terminated | LeaseSuperseded | PolicyError | RateLimited

/**
 * A `fetch` that records provider calls as `llm_call` steps of the current
 * run. The function captures the run when it is built, so build it inside the
 * handler and hand it to the provider SDK:
 *
 * - only a request whose body is a string holding a JSON object is recorded;
 *   everything else goes to the provider untouched;
 * - refusals are answered without calling the provider: 403 (`denied`,
 *   `blocked`, `execution_terminal`), 429 (`rate_limited`), 409
 *   (`lease_superseded`), `application/json` bodies of the form
 *   `{"error":{"type":"rebuno_refusal","message":"rebuno_refusal: denied reason=…"}}`;
 *   run signals are also recorded on the run;
 * - a replay rebuilds the recorded response; the provider is not called;
 * - on `proceed` the response is recorded as
 *   `{"status":…,"headers":{"content-type":…},"body":…}` (error statuses
 *   included), and `text/event-stream` answers are teed with live deltas;
 * - the returned Promise rejects with `Abandoned` when the submission's outcome
 *   is unknown (the run is abandoned), with the provider's own error when the
 *   provider call or reading its body fails (the step is failed first), with a
 *   `ToolError` (`<model>: <message>`) when replaying a failed call, and with
 *   `InvalidArguments` when the body holds a number JSON cannot carry.
 *
 * @example
 * ```ts
 * import { Effect, Schema } from "effect"
 * import { Agent, Llm } from "effect-rebuno"
 * import OpenAI from "openai"
 *
 * const assistant = Agent.make({
 *   id: "assistant",
 *   input: Schema.Struct({ prompt: Schema.String }),
 *   handler: ({ prompt }) =>
 *     Effect.gen(function*() {
 *       const fetch = yield* Llm.makeFetch() // built in the handler: it records this run's calls
 *       const openai = new OpenAI({ fetch }) // the API key from OPENAI_API_KEY
 *       const completion = yield* Effect.tryPromise(() =>
 *         openai.chat.completions.create({ model: "gpt-4o-mini", messages: [{ role: "user", content: prompt }] })
 *       ).pipe(Llm.liftRefusals)
 *       return completion.choices[0]?.message.content ?? ""
 *     })
 * })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const makeFetch = (options?: FetchOptions): Effect.Effect<Fetch, never, Execution> =>
  Effect.flatMap(
    Execution,
    (execution) =>
      Effect.map(
        Effect.context<never>(),
        (context) => internal.makeFetch(context, Option.some(execution), options?.fetch)
      )
  )

/**
 * Like {@link makeFetch}, but usable anywhere: outside a run the returned
 * function passes every request through (PROTOCOL.md 14.7 rule 1).
 *
 * @since 0.1.0
 * @category constructors
 */
export const makeFetchOptional = (options?: FetchOptions): Effect.Effect<Fetch> =>
  Effect.flatMap(
    Effect.serviceOption(Execution),
    (execution) => Effect.map(Effect.context<never>(), (context) => internal.makeFetch(context, execution, options?.fetch))
  )

/**
 * Record the requests of an `HttpClient` as `llm_call` steps, with the same
 * semantics as {@link makeFetch}. The run is looked up when a request is
 * executed, so one transformed client serves every run; requests executed
 * outside a run pass through. Refusals are answered as responses (which
 * `HttpClient.filterStatusOk` turns into an `HttpClientError` with a
 * `StatusCodeError` reason that {@link raiseForRefusal} decodes). Failures of
 * the kernel exchange are `HttpClientError`s with a `TransportError` reason
 * whose `cause` is the Rebuno error.
 *
 * Give it only to the provider's client, not to the kernel client.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { HttpClient } from "effect/http"
 * import { Llm } from "effect-rebuno"
 *
 * // the provider's client: its requests inside a run are llm_call steps
 * const makeProvider = Effect.gen(function*() {
 *   const provider = (yield* HttpClient.HttpClient).pipe(Llm.transformClient, HttpClient.filterStatusOk)
 *   return provider
 * })
 * ```
 *
 * @since 0.1.0
 * @category HttpClient
 */
export const transformClient: (client: HttpClient.HttpClient) => HttpClient.HttpClient = internal.transformClient

/**
 * Replace the `HttpClient` in context with its recording version
 * ({@link transformClient}). Provide it to the provider's client layer only.
 *
 * @since 0.1.0
 * @category HttpClient
 */
export const layerHttpClient: Layer.Layer<HttpClient.HttpClient, never, HttpClient.HttpClient> = Layer.effect(
  HttpClient.HttpClient,
  Effect.map(HttpClient.HttpClient, internal.transformClient)
)

/**
 * Find a refusal behind a provider SDK's error: walk `error` and up to 10
 * levels of `cause`, and decode the first `rebuno_refusal: <kind>[ reason=…]`
 * marker (reason trimmed of trailing quotes, braces and spaces). A Rebuno
 * error found on the way, or a refusal response this module produced, counts
 * too.
 *
 * @since 0.1.0
 * @category refusals
 */
export const decodeRefusal = (error: unknown): Option.Option<Refusal> =>
  Option.fromNullishOr(refusal.decodeRefusal(error))

/**
 * The refusal decoder of PROTOCOL.md 14.7 as an Effect: fail with the typed
 * error behind a refusal marker — `blocked` / `execution_blocked` → `Blocked`,
 * `execution_terminal` → `Terminated`, `lease_superseded` → `LeaseSuperseded`,
 * `denied` → `PolicyError` (reason default `policy_denied`), `rate_limited` →
 * `RateLimited` (default `rate_limit_exceeded`) — and succeed when there is
 * none. Inside a run, a signal is also recorded on the run.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Llm } from "effect-rebuno"
 * import type OpenAI from "openai"
 *
 * // `openai` made with `fetch: yield* Llm.makeFetch()` in the handler
 * const complete = (openai: OpenAI, request: OpenAI.Chat.ChatCompletionCreateParamsNonStreaming) =>
 *   Effect.tryPromise(() => openai.chat.completions.create(request)).pipe(
 *     Effect.tapError(Llm.raiseForRefusal) // a refusal fails with PolicyError, RateLimited, Blocked…
 *   )
 * ```
 *
 * @since 0.1.0
 * @category refusals
 */
export const raiseForRefusal = (error: unknown): Effect.Effect<void, Refusal> =>
  Effect.suspend((): Effect.Effect<void, Refusal> => {
    const found = refusal.decodeRefusal(error)
    if (found === undefined) return Effect.void
    if (found._tag === "PolicyError" || found._tag === "RateLimited") return Effect.fail(found)
    return Effect.flatMap(Effect.serviceOption(Execution), (execution) =>
      Effect.andThen(
        Option.isSome(execution) ? execution.value.raise(found) : Effect.void,
        Effect.fail(found)
      ))
  })

/**
 * Let the refusals behind an effect's failures surface as typed errors: a
 * failure that {@link raiseForRefusal} decodes is replaced by its refusal;
 * other failures stay as they are.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Llm } from "effect-rebuno"
 * import type OpenAI from "openai"
 *
 * // `openai` made with `fetch: yield* Llm.makeFetch()` in the handler
 * const answer = (openai: OpenAI, request: OpenAI.Chat.ChatCompletionCreateParamsNonStreaming) =>
 *   Effect.tryPromise(() => openai.chat.completions.create(request)).pipe(
 *     Llm.liftRefusals,
 *     Effect.map((completion) => completion.choices[0]?.message.content ?? ""),
 *     Effect.catchTag("PolicyError", (e) => Effect.succeed(`denied: ${e.reason}`))
 *   )
 * ```
 *
 * @since 0.1.0
 * @category refusals
 */
export const liftRefusals = <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E | Refusal, R> =>
  Effect.catch(self, (error) => Effect.andThen(raiseForRefusal(error), Effect.fail(error)))

/**
 * The `type` of a refusal body's `error` object: `"rebuno_refusal"`.
 *
 * @since 0.1.0
 * @category constants
 */
export const refusalType: string = refusal.REFUSAL_TYPE

/**
 * The marker that refusal messages carry:
 * `rebuno_refusal: (\w+)( reason=([^\n]*))?`.
 *
 * @since 0.1.0
 * @category constants
 */
export const refusalPattern: RegExp = refusal.REFUSAL_PATTERN

/**
 * HTTP status of a `blocked`, `denied` or `execution_terminal` refusal.
 *
 * @since 0.1.0
 * @category constants
 */
export const refusalStatusForbidden = 403

/**
 * HTTP status of a `rate_limited` refusal.
 *
 * @since 0.1.0
 * @category constants
 */
export const refusalStatusRateLimited = 429

/**
 * HTTP status of a `lease_superseded` refusal.
 *
 * @since 0.1.0
 * @category constants
 */
export const refusalStatusLeaseSuperseded = 409

/**
 * The exact body of a refusal answer, e.g.
 * `refusalBody("denied", "no llm")` =
 * `{"error":{"type":"rebuno_refusal","message":"rebuno_refusal: denied reason=no llm"}}`
 * (` reason=…` only when the reason is non-empty).
 *
 * @since 0.1.0
 * @category refusals
 */
export const refusalBody: (
  kind: "blocked" | "denied" | "execution_terminal" | "rate_limited" | "lease_superseded",
  reason?: string
) => string = refusal.refusalBody

/**
 * The step kind of LLM calls: `"llm_call"`.
 *
 * @since 0.1.0
 * @category constants
 */
export const stepKind: string = internal.KIND

/**
 * Streaming: pending text is flushed as live deltas when it reaches this many
 * characters (2000)…
 *
 * @since 0.1.0
 * @category constants
 */
export const flushChars: number = stream.FLUSH_CHARS

/**
 * …or when this many milliseconds (50) have passed since the last flush.
 *
 * @since 0.1.0
 * @category constants
 */
export const flushIntervalMillis: number = stream.FLUSH_INTERVAL_MILLIS

/**
 * Streaming: the largest live delta, in characters (1750), cut on code-point
 * boundaries.
 *
 * @since 0.1.0
 * @category constants
 */
export const maxDeltaChars: number = stream.MAX_DELTA_CHARS
