/**
 * An in-memory `HttpClient` test double: records every request (method, URL,
 * headers without trace headers, body) and answers from a script — a
 * `Response`, a transport failure, or never.
 */
import { Effect, Layer } from "effect"
import { HttpClient, HttpClientError, HttpClientResponse } from "effect/http"

export interface Recorded {
  readonly method: string
  readonly url: string
  readonly headers: Readonly<Record<string, string>>
  /** Request body bytes; `undefined` when the request had no body at all. */
  readonly body: Uint8Array | undefined
  readonly text: string | undefined
}

export type Answer = Response | "transport" | "never"

const TRACE_HEADERS = new Set(["traceparent", "b3", "tracestate"])

export const makeDouble = (script: (request: Recorded, index: number) => Answer) => {
  const requests: Array<Recorded> = []
  const client = HttpClient.make((request, url) =>
    Effect.suspend(() => {
      const body = request.body._tag === "Uint8Array" ? request.body.body : undefined
      const headers: Record<string, string> = {}
      for (const [k, v] of Object.entries(request.headers)) if (!TRACE_HEADERS.has(k)) headers[k] = v
      const recorded: Recorded = {
        method: request.method,
        url: url.toString(),
        headers,
        body,
        text: body === undefined ? undefined : new TextDecoder().decode(body)
      }
      requests.push(recorded)
      const answer = script(recorded, requests.length - 1)
      if (answer === "never") return Effect.never
      if (answer === "transport") {
        return Effect.fail(
          new HttpClientError.HttpClientError({
            reason: new HttpClientError.TransportError({ request, cause: new Error("connect ECONNREFUSED") })
          })
        )
      }
      return Effect.succeed(HttpClientResponse.fromWeb(request, answer))
    })
  )
  return { requests, layer: Layer.succeed(HttpClient.HttpClient, client) }
}

/** A kernel-style JSON answer: the value followed by `\n`. */
export const json = (status: number, body: unknown) =>
  new Response(JSON.stringify(body) + "\n", {
    status,
    headers: { "content-type": "application/json; charset=utf-8" }
  })

export const noContent = () => new Response(null, { status: 204 })

/** The kernel's error envelope, with optional extra members (newer kernels add some). */
export const envelope = (status: number, code: string, message: string, extra: Record<string, unknown> = {}) =>
  json(status, { code, message, ...extra })
