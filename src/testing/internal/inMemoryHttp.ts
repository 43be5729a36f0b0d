/**
 * An `HttpClient` that answers from the embedded kernel's routes in-process:
 * the exact request bytes go through the same checks, encoders and status codes
 * as over a socket, without a socket.
 *
 * @since 0.1.0
 * @internal
 */
import { HttpClient, HttpClientError, HttpClientResponse } from "@effect/platform"
import type { HttpClientRequest } from "@effect/platform"
import { Effect, Stream } from "effect"
import type * as Routes from "../../kernel/Routes.js"

const emptyBody = new Uint8Array(0)

const requestBody = (
  request: HttpClientRequest.HttpClientRequest
): Effect.Effect<Uint8Array, HttpClientError.RequestError> => {
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
        : Effect.fail(
          new HttpClientError.RequestError({ request, reason: "Encode", description: "unsupported raw body" })
        )
    case "Stream":
      return Stream.runFold(body.stream, emptyBody, (acc, chunk) => {
        const next = new Uint8Array(acc.length + chunk.length)
        next.set(acc)
        next.set(chunk, acc.length)
        return next
      }).pipe(
        Effect.mapError((cause) => new HttpClientError.RequestError({ request, reason: "Encode", cause }))
      )
    case "FormData":
      return Effect.fail(
        new HttpClientError.RequestError({ request, reason: "Encode", description: "form data is not supported" })
      )
  }
}

/**
 * Build an `HttpClient` over a routes handler.
 *
 * @since 0.1.0
 * @internal
 */
export const make = (
  handle: (request: Routes.KernelRequest) => Effect.Effect<Routes.KernelResponse>
): HttpClient.HttpClient =>
  HttpClient.make((request, url) =>
    Effect.gen(function*() {
      const body = yield* requestBody(request)
      const headers = (name: string): ReadonlyArray<string> => {
        const value = request.headers[name.toLowerCase()]
        return value === undefined ? [] : [value]
      }
      const response = yield* handle({ method: request.method, url: url.pathname + url.search, headers, body })
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
