/**
 * An in-process harness over the embedded kernel's routes in the current
 * stage (PROTOCOL-CURRENT): bearer requests, `v1=`-signed agent requests
 * (signed at the TestClock's time), a running execution with its lease
 * headers, and the answers as a user sees them (status, headers, body text).
 */
import { Clock, Effect } from "effect"
import * as Core from "../../src/kernel/Core.js"
import * as Routes from "../../src/kernel/Routes.js"
import * as Signature from "../../src/Signature.js"

const encoder = new TextEncoder()
const decoder = new TextDecoder()

export const SECRET = "hello-secret"
export const OTHER_SECRET = "other-secret"
export const JSON_TYPE = "application/json; charset=utf-8"
export const UNAUTHORIZED = "{\"code\":\"unauthorized\",\"message\":\"unauthorized\"}\n"
export const FORBIDDEN = "{\"code\":\"forbidden\",\"message\":\"forbidden\"}\n"
export const NOT_FOUND = "{\"code\":\"not_found\",\"message\":\"not found\"}\n"
export const VALIDATION = "{\"code\":\"validation_error\",\"message\":\"validation error\"}\n"
export const NOT_FOUND_PAGE = "404 page not found\n"
export const UNKNOWN_ID = "0192f1a0-0000-7000-8000-000000000000"
export const SUBMIT =
  "{\"kind\":\"tool_call\",\"target\":\"web_search\",\"args\":{\"query\":\"hello\"},\"idempotency\":\"safe_to_retry\"}"

export type HeaderInput = Readonly<Record<string, string | ReadonlyArray<string>>>

export interface Answer {
  readonly status: number
  readonly headers: Readonly<Record<string, string>>
  readonly body: string
}

export const request = (
  method: string,
  url: string,
  options: { readonly headers?: HeaderInput; readonly body?: string | Uint8Array } = {}
): Routes.KernelRequest => {
  const headers = new Map<string, ReadonlyArray<string>>()
  for (const [name, value] of Object.entries(options.headers ?? {})) {
    headers.set(name.toLowerCase(), typeof value === "string" ? [value] : value)
  }
  const body = options.body
  return {
    method,
    url,
    headers: (name) => headers.get(name.toLowerCase()) ?? [],
    body: body === undefined ? new Uint8Array(0) : typeof body === "string" ? encoder.encode(body) : body
  }
}

const text = (res: Routes.KernelResponse): string => {
  if (typeof res.body === "string") return res.body
  if (res.body instanceof Uint8Array) return decoder.decode(res.body)
  return "<stream>"
}

export interface Harness {
  readonly core: Core.KernelCore
  readonly handle: (req: Routes.KernelRequest) => Effect.Effect<Routes.KernelResponse>
  /** A request without agent headers (the bearer side). */
  readonly send: (
    method: string,
    url: string,
    options?: { readonly headers?: HeaderInput; readonly body?: string | Uint8Array }
  ) => Effect.Effect<Answer>
  /** A `v1=`-signed request of `agentId` (timestamp = the clock's second, lease headers signed when given). */
  readonly agent: (
    agentId: string,
    method: string,
    url: string,
    body?: string,
    headers?: HeaderInput
  ) => Effect.Effect<Answer>
  /** A `sha256=`-signed request of `agentId` (the seed stage's scheme). */
  readonly agentSha256: (
    agentId: string,
    method: string,
    url: string,
    body?: string,
    headers?: HeaderInput
  ) => Effect.Effect<Answer>
}

const secrets: Record<string, string> = { hello: SECRET, other: OTHER_SECRET }

/**
 * A current-stage kernel with the agents `hello` and `other` registered.
 */
export const harness = (options: Routes.Options = {}, settings: Partial<Core.Settings> = {}) =>
  Effect.gen(function*() {
    const core = yield* Core.make({ stage: "current", ...settings })
    yield* core.registerAgent({ id: "hello", webhookUrl: "http://localhost:5000/webhook", secret: SECRET })
    yield* core.registerAgent({ id: "other", webhookUrl: "http://localhost:5001/webhook", secret: OTHER_SECRET })
    const handle = Routes.make(core, options)
    const send: Harness["send"] = (method, url, opts = {}) =>
      Effect.map(handle(request(method, url, opts)), (res) => ({
        status: res.status,
        headers: res.headers,
        body: text(res)
      }))
    const agent: Harness["agent"] = (agentId, method, url, body = "", headers = {}) =>
      Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const timestamp = String(Math.floor(now / 1000))
        const single = (name: string) => {
          const v = headers[name]
          return typeof v === "string" ? v : ""
        }
        const signature = yield* Signature.signV1(secrets[agentId] ?? "", {
          method,
          target: url,
          timestamp,
          dispatchId: single("Rebuno-Dispatch-Id"),
          dispatchAttempt: single("Rebuno-Dispatch-Attempt"),
          body
        })
        return yield* send(method, url, {
          body,
          headers: {
            "Rebuno-Agent-Id": agentId,
            "Rebuno-Timestamp": timestamp,
            "Rebuno-Signature": signature,
            ...headers
          }
        })
      })
    const agentSha256: Harness["agentSha256"] = (agentId, method, url, body = "", headers = {}) =>
      Effect.flatMap(Signature.sign(secrets[agentId] ?? "", body), (signature) =>
        send(method, url, {
          body,
          headers: { "Rebuno-Agent-Id": agentId, "Rebuno-Signature": signature, ...headers }
        }))
    return { core, handle, send, agent, agentSha256 } satisfies Harness
  })

export interface Running {
  readonly id: string
  /** `Rebuno-Dispatch-Id` and `Rebuno-Dispatch-Attempt` of the claimed dispatch. */
  readonly lease: Readonly<Record<string, string>>
}

/** Creates an execution of `agentId` over the bearer side and claims its dispatch. */
export const running = (h: Harness, agentId = "hello") =>
  Effect.gen(function*() {
    const created = yield* h.send("POST", "/v0/executions", {
      body: JSON.stringify({ agent_id: agentId, input: { q: 1 } })
    })
    if (created.status !== 201) throw new Error("create failed: " + created.status + " " + created.body)
    const id = JSON.parse(created.body).id as string
    const claims = yield* h.core.claimDue(10)
    const claim = claims.find((c) => c.executionId === id)!
    return {
      id,
      lease: { "Rebuno-Dispatch-Id": claim.dispatchId, "Rebuno-Dispatch-Attempt": String(claim.attempt) }
    } satisfies Running
  })

/** The event types of an execution, in order. */
export const eventTypes = (h: Harness, id: string) =>
  Effect.map(h.core.eventLog(id), (events) => events.map((e) => e.type))
