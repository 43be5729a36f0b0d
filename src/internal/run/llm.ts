/**
 * The durable LLM call of PROTOCOL.md 14.7 behind both public wrappers of
 * `Llm`: the `fetch` function for Promise-based provider SDKs and the
 * `HttpClient` transform for Effect-native clients. A provider request whose
 * body is a JSON object is submitted as an `llm_call` step (target = its
 * `model`); refusals become HTTP answers (and run signals), a replay rebuilds
 * the recorded response without calling the provider, and on `proceed` the
 * provider's answer is recorded — read whole, or teed when it is an event
 * stream.
 *
 * @since 0.1.0
 * @internal
 */
import { Cause, Clock, Context, Data, Effect, Exit, Option, Result, Stream } from "effect"
import { HttpClient, HttpClientError, HttpClientResponse } from "effect/http"
import type { HttpBody, HttpClientRequest } from "effect/http"
import { Execution } from "../../Execution.js"
import type * as Protocol from "../../Protocol.js"
import {
  Abandoned,
  Blocked,
  DecodeError,
  InvalidArguments,
  KernelError,
  LeaseSuperseded,
  PolicyError,
  RateLimited,
  Terminated,
  ToolError
} from "../../RebunoError.js"
import { isTransportFailure } from "../http/exchange.js"
import * as Tracing from "../http/tracing.js"
import { stringifyStrict } from "../wire/json.js"
import { answerFor, refusalAnswer, registerRefusalResponse } from "./llmRefusal.js"
import { blockedBy } from "./run.js"
import type { Refusal, RefusalAnswer } from "./llmRefusal.js"
import * as ReplayLog from "./replayLog.js"
import { teeStream } from "./llmStream.js"
import type { TeeHooks } from "./llmStream.js"

/**
 * A `fetch`-compatible function.
 *
 * @since 0.1.0
 * @internal
 */
export type Fetch = (input: RequestInfo | URL, init?: RequestInit) => Promise<Response>

/**
 * The step kind of every LLM call.
 *
 * @since 0.1.0
 * @internal
 */
export const KIND = "llm_call"

const JSON_TYPE = "application/json"

/**
 * Set while this module talks to the kernel, so that a kernel client sharing a
 * recording `HttpClient` is never recorded itself.
 */
const InsideKernelCall = Context.Reference<boolean>("effect-rebuno/Llm/InsideKernelCall", {
  defaultValue: () => false
})

const kernelCall = <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.provideService(self, InsideKernelCall, true)

// ---------------------------------------------------------------------------
// Request bodies
// ---------------------------------------------------------------------------

/**
 * The parsed request body when it is a JSON object, otherwise `undefined`.
 *
 * @since 0.1.0
 * @internal
 */
export const parseObject = (text: string): Record<string, unknown> | undefined => {
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    return undefined
  }
  return typeof value === "object" && value !== null && !Array.isArray(value)
    ? value as Record<string, unknown>
    : undefined
}

const utf8 = new TextDecoder("utf-8", { fatal: true })

/** The text of an `HttpClient` request body, when it is text. */
const bodyText = (body: HttpBody.HttpBody): string | undefined => {
  switch (body._tag) {
    case "Uint8Array":
      try {
        return utf8.decode(body.body)
      } catch {
        return undefined
      }
    case "Raw":
      return typeof body.body === "string" ? body.body : undefined
    default:
      return undefined
  }
}

/** One call to be recorded. */
interface Call {
  readonly execution: Execution.Service
  readonly target: string
  readonly argsJson: string
}

const prepare = (
  execution: Execution.Service,
  body: Record<string, unknown>
): Call | InvalidArguments => {
  const target = String(body["model"] ?? "")
  const args = stringifyStrict(body)
  return args._tag === "Ok"
    ? { execution, target, argsJson: args.json }
    : new InvalidArguments({ target, path: args.path, reason: args.reason })
}

// ---------------------------------------------------------------------------
// Answers (refusals and replays)
// ---------------------------------------------------------------------------

/** A response to give without calling the provider. */
interface Answer {
  readonly status: number
  readonly headers: ReadonlyArray<readonly [string, string]>
  readonly body: string
  readonly refusal: Refusal | undefined
}

const fromRefusal = (answer: RefusalAnswer): Answer => ({
  status: answer.status,
  // `x-should-retry: false` keeps provider SDKs from retrying a refusal (they
  // retry 409 and 429 by default, and each retry would submit again).
  headers: [["content-type", JSON_TYPE], ["x-should-retry", "false"]],
  body: answer.body,
  refusal: answer.refusal
})

const isObject = (u: unknown): u is Record<string, unknown> =>
  typeof u === "object" && u !== null && !Array.isArray(u)

const validStatus = (u: unknown): number =>
  typeof u === "number" && Number.isInteger(u) && u >= 200 && u <= 599 ? u : 200

/**
 * The response a replay gives (PROTOCOL.md 14.7 rule 6): the recorded
 * `status` (default 200), `headers` (default JSON content type) and `body`; a
 * value that is not an object is a 200 JSON response of its JSON text.
 *
 * @since 0.1.0
 * @internal
 */
export const replayAnswer = (result: unknown): Answer => {
  if (!isObject(result)) {
    const text = JSON.stringify(result)
    return { status: 200, headers: [["content-type", JSON_TYPE]], body: text ?? "null", refusal: undefined }
  }
  const recordedHeaders = result["headers"]
  const headers: Array<readonly [string, string]> = []
  if (isObject(recordedHeaders)) {
    for (const [name, value] of Object.entries(recordedHeaders)) {
      if (typeof value === "string") headers.push([name, value])
    }
  } else {
    headers.push(["content-type", JSON_TYPE])
  }
  const body = result["body"]
  return {
    status: validStatus(result["status"]),
    headers,
    body: typeof body === "string" ? body : body === undefined || body === null ? "" : JSON.stringify(body),
    refusal: undefined
  }
}

const NULL_BODY_STATUS = new Set([204, 205, 304])

const webHeaders = (entries: ReadonlyArray<readonly [string, string]>): Headers => {
  const headers = new Headers()
  for (const [name, value] of entries) {
    try {
      headers.append(name, value)
    } catch {
      // an invalid recorded header name or value is dropped
    }
  }
  return headers
}

const makeResponse = (
  body: BodyInit | null,
  status: number,
  statusText: string,
  headers: Headers
): Response => {
  const valid = validStatus(status)
  return new Response(NULL_BODY_STATUS.has(valid) ? null : body, { status: valid, statusText, headers })
}

const answerResponse = (answer: Answer): Response => {
  const response = makeResponse(answer.body, answer.status, "", webHeaders(answer.headers))
  if (answer.refusal !== undefined) {
    registerRefusalResponse(response, answer.refusal)
    registerRefusalResponse(response.headers, answer.refusal)
  }
  return response
}

/** The provider's headers minus those that described the bytes on the wire. */
const providerHeaders = (entries: Iterable<readonly [string, string]>): Headers => {
  const headers = new Headers()
  for (const [name, value] of entries) {
    const lower = name.toLowerCase()
    if (lower === "content-length" || lower === "content-encoding" || lower === "transfer-encoding") continue
    try {
      headers.append(name, value)
    } catch {
      // skip
    }
  }
  return headers
}

const isEventStream = (contentType: string): boolean =>
  contentType.split(";")[0]!.trim().toLowerCase() === "text/event-stream"

// ---------------------------------------------------------------------------
// Kernel exchange
// ---------------------------------------------------------------------------

type Admission =
  | { readonly _tag: "Proceed"; readonly stepId: string }
  | { readonly _tag: "Answer"; readonly answer: Answer }

type SubmitFailure = Abandoned | KernelError | ToolError

const isSignal = (refusal: Refusal): refusal is Blocked | Terminated | LeaseSuperseded =>
  refusal._tag === "Blocked" || refusal._tag === "Terminated" || refusal._tag === "LeaseSuperseded"

/** Record the refusal's signal on the run (when it is one) and answer with it. */
const refuse = (execution: Execution.Service, answer: RefusalAnswer): Effect.Effect<Admission> =>
  Effect.as(
    isSignal(answer.refusal) ? execution.raise(answer.refusal) : Effect.void,
    { _tag: "Answer", answer: fromRefusal(answer) }
  )

const abandon = (execution: Execution.Service, reason: string): Effect.Effect<never, Abandoned> => {
  const signal = new Abandoned({ reason })
  return Effect.andThen(execution.raise(signal), Effect.fail(signal))
}

const decodeFailure = (description: string) => new KernelError({ reason: new DecodeError({ description }) })

const unexpected = (decision: string) => decodeFailure(`unexpected step decision: ${decision}`)

const describeRecorded = (error: unknown): string => {
  if (isObject(error)) {
    const message = error["message"]
    if (message !== undefined && message !== null) return typeof message === "string" ? message : safeJson(message)
    const reason = error["reason"]
    if (reason !== undefined && reason !== null) return typeof reason === "string" ? reason : safeJson(reason)
  }
  return safeJson(error)
}

const safeJson = (u: unknown): string => {
  try {
    return JSON.stringify(u) ?? String(u)
  } catch {
    return String(u)
  }
}

const messageOf = (u: unknown): string => {
  if (u instanceof Error) return u.message
  if (typeof u === "string") return u
  if (isObject(u) && typeof u["message"] === "string") return u["message"]
  return safeJson(u)
}

const decide = (call: Call, decision: Protocol.StepDecision): Effect.Effect<Admission, SubmitFailure> => {
  const { execution, target } = call
  const stepId = decision.stepId
  ReplayLog.decided(execution.kernel, decision.decision)
  switch (decision.decision) {
    case "proceed":
      return stepId === undefined
        ? Effect.fail(decodeFailure("proceed decision without step_id"))
        : Effect.succeed({ _tag: "Proceed", stepId })
    case "replay": {
      const error = decision.error
      if (error !== undefined && error !== null) {
        return Effect.fail(
          new ToolError({
            toolId: target,
            stepId: stepId ?? "",
            error,
            retryable: false,
            text: `${target}: ${describeRecorded(error)}`
          })
        )
      }
      return Effect.succeed({ _tag: "Answer", answer: replayAnswer(decision.result === undefined ? null : decision.result) })
    }
    case "denied": {
      const reason = decision.reason ?? "denied by policy"
      return refuse(
        execution,
        refusalAnswer(
          "denied",
          new PolicyError({
            reason,
            target,
            ...(decision.ruleId === undefined ? {} : { ruleId: decision.ruleId }),
            ...(stepId === undefined ? {} : { stepId })
          }),
          reason
        )
      )
    }
    case "blocked":
    case "execution_blocked":
      // Approval waits and rate-limit parking (PROTOCOL-CURRENT C.8.3) alike: the run ends quietly.
      return refuse(execution, refusalAnswer("blocked", blockedBy(decision)))
    case "rate_limited":
      return refuse(
        execution,
        refusalAnswer(
          "rate_limited",
          new RateLimited({ reason: decision.reason ?? "rate_limit_exceeded", target }),
          decision.reason
        )
      )
    case "execution_terminal":
      return refuse(execution, refusalAnswer("execution_terminal", new Terminated()))
    default:
      return Effect.fail(unexpected(decision.decision))
  }
}

/** Submit the call and map the kernel's answer (PROTOCOL.md 7.2, 14.7 rules 4–6). */
const admit = (call: Call): Effect.Effect<Admission, SubmitFailure> => {
  const { execution } = call
  return kernelCall(
    execution.kernel.submitStep(execution.caller, execution.executionId, {
      kind: KIND,
      target: call.target,
      argsJson: call.argsJson,
      idempotency: "safe_to_retry"
    })
  ).pipe(
    Effect.matchEffect({
      onFailure: (error): Effect.Effect<Admission, SubmitFailure> => {
        switch (error._tag) {
          case "PolicyError":
            return refuse(
              execution,
              answerFor(error.target === undefined ? new PolicyError({ ...error, target: call.target }) : error)
            )
          case "LeaseSuperseded":
          case "Terminated":
            return refuse(execution, answerFor(error))
          case "KernelError":
            // A submit is never retried: its outcome is unknown, so the run is abandoned (15.1).
            return isTransportFailure(error)
              ? abandon(execution, `step submission failed: ${error.message}`)
              : Effect.fail(error)
        }
      },
      onSuccess: (decision) => decide(call, decision)
    })
  )
}

type RecordFailure = Terminated | LeaseSuperseded | Abandoned | KernelError

/** Complete the step with `{"status":…,"headers":{"content-type":…},"body":…}`. */
const record = (
  call: Call,
  stepId: string,
  status: number,
  contentType: string,
  body: string
): Effect.Effect<void, RecordFailure> => {
  const { execution } = call
  const resultJson = JSON.stringify({ status, headers: { "content-type": contentType }, body })
  return kernelCall(execution.kernel.completeStep(execution.caller, execution.executionId, stepId, resultJson)).pipe(
    Effect.flatMap((decision): Effect.Effect<void, RecordFailure> => {
      switch (decision.decision) {
        case "recorded":
        case "replay":
          return Effect.void
        case "execution_terminal": {
          const signal = new Terminated()
          return Effect.andThen(execution.raise(signal), Effect.fail(signal))
        }
        default:
          return Effect.fail(unexpected(decision.decision))
      }
    }),
    Effect.catchIf(
      (e): e is KernelError => e._tag === "KernelError" && isTransportFailure(e),
      (e) => abandon(execution, `step complete failed: ${e.message}`)
    )
  )
}

/** Fail the step with the error's message; failures of this call are swallowed. */
const failStep = (call: Call, stepId: string, error: unknown): Effect.Effect<void> => {
  const { execution } = call
  return kernelCall(execution.kernel.failStep(execution.caller, execution.executionId, stepId, messageOf(error))).pipe(
    Effect.flatMap((decision) =>
      decision.decision === "execution_terminal" ? execution.raise(new Terminated()) : Effect.void
    ),
    Effect.ignore
  )
}

/** A run signal met while recording: answer with its refusal; anything else stays an error. */
const signalAnswer = (error: RecordFailure): Answer | undefined =>
  error._tag === "Terminated" || error._tag === "LeaseSuperseded" ? fromRefusal(answerFor(error)) : undefined

const teeHooks = (
  call: Call,
  stepId: string,
  status: number,
  contentType: string,
  context: Context.Context<never>
): TeeHooks => {
  const { execution } = call
  const run = Effect.runPromiseWith(context)
  const clock = Context.getUnsafe(context, Clock.Clock)
  return {
    now: () => clock.currentTimeMillisUnsafe(),
    publish: (seq, data) =>
      run(kernelCall(execution.kernel.publishDelta(execution.caller, execution.executionId, stepId, seq, data)))
        .catch(() => undefined),
    complete: (transcript) =>
      run(
        Effect.match(record(call, stepId, status, contentType, transcript), {
          onFailure: (error): unknown => error,
          onSuccess: (): unknown => undefined
        })
      ).catch((defect: unknown) => defect),
    fail: (error) => run(failStep(call, stepId, error)).catch(() => undefined)
  }
}

// ---------------------------------------------------------------------------
// fetch
// ---------------------------------------------------------------------------

/** The provider's own failure, rethrown as it is. */
class ProviderFailure extends Data.TaggedError("ProviderFailure")<{ readonly cause: unknown }> {}

const proceedFetch = (
  call: Call,
  stepId: string,
  send: () => Promise<Response>
): Effect.Effect<Response, ProviderFailure | RecordFailure> =>
  Effect.gen(function*() {
    const response = yield* Effect.tryPromise({ try: send, catch: (cause) => new ProviderFailure({ cause }) }).pipe(
      Effect.tapError((e) => failStep(call, stepId, e.cause))
    )
    const status = response.status
    const contentType = response.headers.get("content-type") ?? JSON_TYPE
    const headers = providerHeaders(response.headers)
    if (isEventStream(contentType) && status < 400 && response.body !== null) {
      const context = yield* Effect.context<never>()
      const body = teeStream(response.body, teeHooks(call, stepId, status, contentType, context))
      return new Response(body, { status, statusText: response.statusText, headers })
    }
    const text = yield* Effect.tryPromise({
      try: () => response.text(),
      catch: (cause) => new ProviderFailure({ cause })
    }).pipe(Effect.tapError((e) => failStep(call, stepId, e.cause)))
    const recorded = yield* Effect.result(record(call, stepId, status, contentType, text))
    if (Result.isFailure(recorded)) {
      const answer = signalAnswer(recorded.failure)
      return answer === undefined ? yield* Effect.fail(recorded.failure) : answerResponse(answer)
    }
    return makeResponse(text, status, response.statusText, headers)
  })

const span = (name: string, call: Call) =>
  Tracing.withSpan(name, {
    attributes: {
      ...Tracing.runAttributes(call.execution),
      "rebuno.step.kind": KIND,
      "rebuno.step.target": call.target
    }
  })

const recordFetch = (
  call: Call,
  send: () => Promise<Response>
): Effect.Effect<Response, ProviderFailure | SubmitFailure | RecordFailure> =>
  Effect.flatMap(admit(call), (admission) =>
    admission._tag === "Answer"
      ? Effect.succeed(answerResponse(admission.answer))
      : proceedFetch(call, admission.stepId, send)).pipe(span("Llm.fetch", call))

/** What a rejected fetch rejects with: the provider's own error, or the Rebuno error. */
const rejection = (cause: Cause.Cause<unknown>): unknown => {
  const failure = Cause.findErrorOption(cause)
  if (Option.isSome(failure)) {
    return failure.value instanceof ProviderFailure ? failure.value.cause : failure.value
  }
  return Cause.squash(cause)
}

/**
 * A recording `fetch` over `underlying` (resolved per call; `globalThis.fetch`
 * when absent). With no execution it passes every request through.
 *
 * @since 0.1.0
 * @internal
 */
export const makeFetch = (
  context: Context.Context<never>,
  execution: Option.Option<Execution.Service>,
  underlying: Fetch | undefined
): Fetch =>
(input, init) => {
  const send = () => (underlying ?? globalThis.fetch)(input, init)
  if (Option.isNone(execution)) return send()
  const body = init?.body
  if (typeof body !== "string") return send()
  const parsed = parseObject(body)
  if (parsed === undefined) return send()
  const call = prepare(execution.value, parsed)
  // The fetch contract is a Promise: this is where failures become rejections.
  if (call instanceof InvalidArguments) return Promise.reject(call)
  return Effect.runPromiseExitWith(context)(recordFetch(call, send)).then((exit) =>
    Exit.isSuccess(exit) ? exit.value : Promise.reject(rejection(exit.cause))
  )
}

// ---------------------------------------------------------------------------
// HttpClient
// ---------------------------------------------------------------------------

const requestError = (request: HttpClientRequest.HttpClientRequest, error: Error) =>
  new HttpClientError.HttpClientError({
    reason: new HttpClientError.TransportError({ request, cause: error, description: error.message })
  })

const clientAnswer = (request: HttpClientRequest.HttpClientRequest, answer: Answer) => {
  const response = HttpClientResponse.fromWeb(request, answerResponse(answer))
  if (answer.refusal !== undefined) registerRefusalResponse(response, answer.refusal)
  return response
}

const proceedClient = (
  call: Call,
  stepId: string,
  request: HttpClientRequest.HttpClientRequest,
  send: Effect.Effect<HttpClientResponse.HttpClientResponse, HttpClientError.HttpClientError>
): Effect.Effect<HttpClientResponse.HttpClientResponse, HttpClientError.HttpClientError> =>
  Effect.gen(function*() {
    const response = yield* Effect.tapError(send, (e) => failStep(call, stepId, e))
    const status = response.status
    const contentType = response.headers["content-type"] ?? JSON_TYPE
    const headers = providerHeaders(Object.entries(response.headers))
    if (isEventStream(contentType) && status < 400) {
      const context = yield* Effect.context<never>()
      const source = Stream.toReadableStreamWith(response.stream, context)
      const body = teeStream(source, teeHooks(call, stepId, status, contentType, context))
      return HttpClientResponse.fromWeb(request, new Response(body, { status, headers }))
    }
    const text = yield* Effect.tapError(response.text, (e) => failStep(call, stepId, e))
    const recorded = yield* Effect.result(record(call, stepId, status, contentType, text))
    if (Result.isFailure(recorded)) {
      const answer = signalAnswer(recorded.failure)
      return answer === undefined
        ? yield* Effect.fail(requestError(request, recorded.failure))
        : clientAnswer(request, answer)
    }
    return HttpClientResponse.fromWeb(request, makeResponse(text, status, "", headers))
  })

/**
 * The recording `HttpClient` transform: requests made inside a run (the
 * `Execution` is looked up when the request runs) with a JSON-object text body
 * are recorded; everything else passes through.
 *
 * @since 0.1.0
 * @internal
 */
export const transformClient = (client: HttpClient.HttpClient): HttpClient.HttpClient =>
  HttpClient.transform(client, (send, request) =>
    Effect.gen(function*() {
      if (yield* InsideKernelCall) return yield* send
      const execution = yield* Effect.serviceOption(Execution)
      if (Option.isNone(execution)) return yield* send
      const text = bodyText(request.body)
      const parsed = text === undefined ? undefined : parseObject(text)
      if (parsed === undefined) return yield* send
      const call = prepare(execution.value, parsed)
      if (call instanceof InvalidArguments) {
        return yield* new HttpClientError.HttpClientError({
          reason: new HttpClientError.EncodeError({ request, cause: call, description: call.message })
        })
      }
      return yield* Effect.mapError(admit(call), (e) => requestError(request, e)).pipe(
        Effect.flatMap((admission) =>
          admission._tag === "Answer"
            ? Effect.succeed(clientAnswer(request, admission.answer))
            : proceedClient(call, admission.stepId, request, send)
        ),
        span("Llm.httpClient", call)
      )
    }))
