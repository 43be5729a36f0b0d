/**
 * An `HttpClient` that answers from the embedded kernel's routes in-process:
 * the exact request bytes go through the same checks, encoders and status codes
 * as over a socket, without a socket. Given an interceptor, the agent routes
 * (read execution, submit / complete / fail step, heartbeat, complete / fail
 * execution) pass through the same hooks as the direct client, so crashes,
 * stalls and transport faults can be injected on the wire too: a fault makes
 * the request fail as a connection error would.
 *
 * @since 0.1.0
 * @internal
 */
import { Clock, Effect, Stream } from "effect"
import { HttpClient, HttpClientError, HttpClientResponse } from "effect/http"
import type { HttpClientRequest } from "effect/http"
import type * as Routes from "../../kernel/Routes.js"
import type { StepSubmission } from "../../KernelClient.js"
import type { KernelError } from "../../RebunoError.js"
import type { CallAnswer, CallInfo, CallName, Interceptor } from "./directClient.js"

const emptyBody = new Uint8Array(0)

const encodeError = (request: HttpClientRequest.HttpClientRequest, description: string) =>
  new HttpClientError.HttpClientError({ reason: new HttpClientError.EncodeError({ request, description }) })

const requestBody = (
  request: HttpClientRequest.HttpClientRequest
): Effect.Effect<Uint8Array, HttpClientError.HttpClientError> => {
  const body = request.body
  switch (body._tag) {
    case "Empty":
      return Effect.succeed(emptyBody)
    case "Uint8Array":
      return Effect.succeed(body.body)
    case "Raw":
      return typeof body.body === "string"
        ? Effect.succeed(new TextEncoder().encode(body.body))
        : body.body instanceof Uint8Array
        ? Effect.succeed(body.body)
        : Effect.fail(encodeError(request, "unsupported raw body"))
    case "Stream":
      return Stream.runFold(body.stream, () => emptyBody, (acc, chunk) => {
        const next = new Uint8Array(acc.length + chunk.length)
        next.set(acc)
        next.set(chunk, acc.length)
        return next
      }).pipe(
        Effect.mapError((cause) =>
          new HttpClientError.HttpClientError({ reason: new HttpClientError.EncodeError({ request, cause }) })
        )
      )
    case "FormData":
      return Effect.fail(encodeError(request, "form data is not supported"))
  }
}

const decoder = new TextDecoder()

const parseJson = (text: string): unknown => {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}

const AGENT_ROUTE =
  /^\/v0\/executions\/([^/]+)(?:\/(steps(?:\/([^/]+)\/(complete|fail))?|heartbeat|suspend|previous|complete|fail|resources(?:\/checkpoints|\/([^/]+)\/binding)?))?$/

/** Which agent call a request is, if any (only requests that carry an agent id). */
const describe = (
  method: string,
  pathname: string,
  header: (name: string) => string | undefined,
  body: Uint8Array
): CallInfo | undefined => {
  const agentId = header("rebuno-agent-id")
  if (agentId === undefined) return undefined
  const match = AGENT_ROUTE.exec(pathname)
  if (match === null) return undefined
  const executionId = match[1]!
  const tail = match[2]
  let call: CallName
  let stepId: string | undefined
  let submission: StepSubmission | undefined
  if (tail === undefined || tail === "previous") {
    if (method !== "GET") return undefined
    call = tail === undefined ? "getExecution" : "previous"
  } else if (method !== "POST") {
    return undefined
  } else if (tail === "steps") {
    call = "submitStep"
    const parsed = parseJson(decoder.decode(body)) as Record<string, unknown> | undefined
    if (parsed === undefined || parsed === null || typeof parsed !== "object") return undefined
    submission = {
      kind: String(parsed["kind"]),
      target: String(parsed["target"]),
      argsJson: JSON.stringify(parsed["args"] ?? null),
      idempotency: parsed["idempotency"] === "at_most_once" ? "at_most_once" : "safe_to_retry"
    }
  } else if (tail.startsWith("resources")) {
    // PROTOCOL-CURRENT C.6.2, C.6.3, C.6.6
    call = match[5] !== undefined
      ? "bindResource"
      : tail === "resources"
      ? "registerResource"
      : "publishCheckpoints"
  } else if (match[3] !== undefined) {
    call = match[4] === "complete" ? "completeStep" : "failStep"
    stepId = match[3]
  } else {
    call = tail === "heartbeat"
      ? "heartbeat"
      : tail === "suspend"
      ? "suspend"
      : tail === "complete"
      ? "completeExecution"
      : "failExecution"
  }
  const dispatchId = header("rebuno-dispatch-id")
  const attempt = header("rebuno-dispatch-attempt")
  return {
    call,
    agentId,
    lease: dispatchId === undefined ?
      undefined :
      { dispatchId, attempt: attempt === undefined ? undefined : Number(attempt) },
    executionId,
    stepId,
    submission
  }
}

const answerOfResponse = (response: Routes.KernelResponse): CallAnswer => {
  const text = typeof response.body === "string"
    ? response.body
    : response.body instanceof Uint8Array
    ? decoder.decode(response.body)
    : ""
  const parsed = parseJson(text) as Record<string, unknown> | undefined
  if (response.status < 300) {
    if (parsed !== undefined && parsed !== null && typeof parsed === "object" && typeof parsed["decision"] === "string") {
      return {
        answer: parsed["decision"],
        stepId: typeof parsed["step_id"] === "string" ? parsed["step_id"] : undefined
      }
    }
    return { answer: "ok", stepId: undefined }
  }
  const code = parsed !== undefined && parsed !== null && typeof parsed === "object" ? parsed["code"] : undefined
  return { answer: typeof code === "string" ? code : `http_${response.status}`, stepId: undefined }
}

/**
 * Build an `HttpClient` over a routes handler, optionally intercepting the
 * agent's calls.
 *
 * @since 0.1.0
 * @internal
 */
export const make = (
  handle: (request: Routes.KernelRequest) => Effect.Effect<Routes.KernelResponse>,
  interceptor?: Interceptor
): HttpClient.HttpClient =>
  HttpClient.make((request, url) =>
    Effect.gen(function*() {
      const body = yield* requestBody(request)
      const headers = (name: string): ReadonlyArray<string> => {
        const value = request.headers[name.toLowerCase()]
        return value === undefined ? [] : [value]
      }
      const lost = (error: KernelError) =>
        new HttpClientError.HttpClientError({
          reason: new HttpClientError.TransportError({ request, description: error.reason.description })
        })
      const info = interceptor === undefined ?
        undefined :
        describe(request.method, url.pathname, (name) => request.headers[name], body)
      let id: number | undefined
      if (info !== undefined && interceptor !== undefined) {
        const before = interceptor.before(info, yield* Clock.currentTimeMillis)
        id = typeof before === "number" ? before : yield* Effect.mapError(before, lost)
      }
      const response = yield* handle({ method: request.method, url: url.pathname + url.search, headers, body })
      if (id !== undefined && interceptor !== undefined) {
        const answer = answerOfResponse(response)
        const after = interceptor.after(id, answer.answer, answer.stepId)
        if (after !== undefined) yield* Effect.mapError(after, lost)
      }
      const payload = typeof response.body === "string" || response.body instanceof Uint8Array
        ? (response.body.length === 0 ? null : response.body)
        : Stream.toReadableStream(response.body)
      return HttpClientResponse.fromWeb(
        request,
        new Response(response.status === 204 ? null : payload as BodyInit | null, {
          status: response.status,
          headers: response.headers
        })
      )
    })
  )
