/**
 * Refusals of LLM calls (PROTOCOL.md 14.7): the HTTP answers the durable fetch
 * and HttpClient wrappers give instead of calling the provider, and the decoder
 * that turns a provider SDK's error carrying a `rebuno_refusal: …` marker back
 * into the typed Rebuno error or signal.
 *
 * @since 0.1.0
 * @internal
 */
import { Blocked, isRebunoError, LeaseSuperseded, PolicyError, RateLimited, Terminated } from "../../RebunoError.js"

/**
 * What a refusal marker turns into.
 *
 * @since 0.1.0
 * @internal
 */
export type Refusal = Blocked | Terminated | LeaseSuperseded | PolicyError | RateLimited

/**
 * The marker kinds of the refusal table.
 *
 * @since 0.1.0
 * @internal
 */
export type RefusalKind = "blocked" | "denied" | "execution_terminal" | "rate_limited" | "lease_superseded"

/**
 * An HTTP refusal: status and exact body text, plus the typed error it stands for.
 *
 * @since 0.1.0
 * @internal
 */
export interface RefusalAnswer {
  readonly status: number
  readonly body: string
  readonly refusal: Refusal
}

/** @internal */
export const REFUSAL_TYPE = "rebuno_refusal"

/** @internal */
export const REFUSAL_PATTERN = /rebuno_refusal: (\w+)( reason=([^\n]*))?/

const STATUS: Readonly<Record<RefusalKind, number>> = {
  blocked: 403,
  denied: 403,
  execution_terminal: 403,
  rate_limited: 429,
  lease_superseded: 409
}

/**
 * The marker text: `rebuno_refusal: <kind>`, plus ` reason=<reason>` when the
 * reason is non-empty.
 *
 * @since 0.1.0
 * @internal
 */
export const refusalMessage = (kind: RefusalKind, reason?: string | undefined): string =>
  reason === undefined || reason === "" ? `${REFUSAL_TYPE}: ${kind}` : `${REFUSAL_TYPE}: ${kind} reason=${reason}`

/**
 * The exact body of a refusal answer.
 *
 * @since 0.1.0
 * @internal
 */
export const refusalBody = (kind: RefusalKind, reason?: string | undefined): string =>
  JSON.stringify({ error: { type: REFUSAL_TYPE, message: refusalMessage(kind, reason) } })

/**
 * The refusal answer of PROTOCOL.md 14.7 for a kind and reason.
 *
 * @since 0.1.0
 * @internal
 */
export const refusalAnswer = (kind: RefusalKind, refusal: Refusal, reason?: string | undefined): RefusalAnswer => ({
  status: STATUS[kind],
  body: refusalBody(kind, reason),
  refusal
})

/**
 * The refusal answer that stands for a typed refusal (the inverse of the decoder).
 *
 * @since 0.1.0
 * @internal
 */
export const answerFor = (refusal: Refusal): RefusalAnswer => {
  switch (refusal._tag) {
    case "Blocked":
      return refusalAnswer("blocked", refusal)
    case "Terminated":
      return refusalAnswer("execution_terminal", refusal)
    case "LeaseSuperseded":
      return refusalAnswer("lease_superseded", refusal)
    case "PolicyError":
      return refusalAnswer("denied", refusal, refusal.reason === "" ? "denied by policy" : refusal.reason)
    case "RateLimited":
      return refusalAnswer("rate_limited", refusal, refusal.reason)
  }
}

/**
 * Responses (and their header objects) this process produced as refusals, so
 * that the decoder can find the typed refusal — with its step and approval ids
 * — behind an error that keeps the response (`effect/http`'s `HttpClientError`) or
 * its headers (the `openai` client's `APIError`).
 */
const answered = new WeakMap<object, Refusal>()

/**
 * Remember that `response` is the refusal answer for `refusal`.
 *
 * @since 0.1.0
 * @internal
 */
export const registerRefusalResponse = (response: object, refusal: Refusal): void => {
  answered.set(response, refusal)
}

const REFUSAL_TAGS: ReadonlySet<string> = new Set(["Blocked", "Terminated", "LeaseSuperseded", "PolicyError", "RateLimited"])

/** A typed refusal (by tag, so that one from another copy of this package counts too). */
const isRefusal = (u: unknown): u is Refusal => isRebunoError(u) && REFUSAL_TAGS.has(u._tag)

const member = (u: object, key: string): unknown => {
  try {
    return (u as Record<string, unknown>)[key]
  } catch {
    return undefined
  }
}

const TRAILING = /["'}\s]+$/u

/**
 * Decode one marker text, or `undefined` when there is no (known) marker.
 *
 * @since 0.1.0
 * @internal
 */
export const decodeMarker = (text: string): Refusal | undefined => {
  const match = REFUSAL_PATTERN.exec(text)
  if (match === null) return undefined
  const raw = match[3]
  const trimmed = raw === undefined ? "" : raw.replace(TRAILING, "")
  const reason = trimmed === "" ? undefined : trimmed
  switch (match[1]) {
    case "blocked":
    case "execution_blocked":
      return new Blocked({})
    case "execution_terminal":
      return new Terminated()
    case "lease_superseded":
      return new LeaseSuperseded()
    case "denied":
      return new PolicyError({ reason: reason ?? "policy_denied" })
    case "rate_limited":
      return new RateLimited({ reason: reason ?? "rate_limit_exceeded" })
    default:
      return undefined
  }
}

const MAX_DEPTH = 10

/**
 * The refusal decoder of PROTOCOL.md 14.7. Walks `error` and up to 10 levels of
 * `cause`; at each level, in order: a typed Rebuno refusal is returned as it
 * is; a `response` (or `headers`) member that this process produced as a
 * refusal yields its refusal; a string `body` member (the Effect AI errors keep the provider's
 * body there) or the `message` (a string error is its own message) carrying
 * the marker `rebuno_refusal: <kind>[ reason=<reason>]` is decoded. The first
 * hit wins; `undefined` when there is none.
 *
 * @since 0.1.0
 * @internal
 */
export const decodeRefusal = (error: unknown): Refusal | undefined => {
  let current: unknown = error
  for (let depth = 0; depth <= MAX_DEPTH && current !== undefined && current !== null; depth++) {
    if (typeof current === "string") return decodeMarker(current)
    if (typeof current !== "object") return undefined
    if (isRefusal(current)) return current
    for (const key of ["response", "headers"]) {
      const value = member(current, key)
      if (typeof value === "object" && value !== null) {
        const known = answered.get(value)
        if (known !== undefined) return known
      }
    }
    const body = member(current, "body")
    if (typeof body === "string") {
      const fromBody = decodeMarker(body)
      if (fromBody !== undefined) return fromBody
    }
    const message = member(current, "message")
    if (typeof message === "string") {
      const fromMessage = decodeMarker(message)
      if (fromMessage !== undefined) return fromMessage
    }
    current = member(current, "cause")
  }
  return undefined
}
