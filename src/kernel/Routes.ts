/**
 * The HTTP surface of the embedded kernel (PROTOCOL 2, 3, 6, 11) as a pure
 * function from a small request model to a response model, independent of any
 * server library so it can be driven in-process by tests. It implements the
 * route table of 2.1 with the reference kernel's exact bytes: bearer and agent
 * authentication (3.1–3.4, with optional `v1=` signatures of 17.B), the check
 * order of 6.0, strict body decoding (2.3), the 10 MiB body cap (2.4), JSON
 * answers with a trailing newline (2.2), `null` empty lists (2.7), routing
 * errors (2.9) and the live-delta SSE stream (11.6). `Server` adapts it to
 * `effect/http`.
 *
 * In the current stage (PROTOCOL-CURRENT) agent requests must be `v1=` signed
 * (C.2.1), bearer requests run as the bootstrap token or a scoped API key whose
 * scopes every route checks (C.9.1, {@link bearerScopes}), agent principals act
 * only on their own executions (C.9.3), and the metadata, API-key, resource
 * and fork routes exist (C.3, C.9.2, C.6, C.7), with captures on step
 * outcomes (C.6.5), and the policy test route (C.8.6, with a body of our
 * own); the seed and v0.14.0 stages answer as before.
 *
 * The step submit and outcome routes, which an agent calls on every step,
 * also have a synchronous form ({@link makeHandlers}): it answers a request
 * that passes every check without building an Effect per check, and leaves
 * anything else to the general path, which then answers from the start.
 *
 * @since 0.1.0
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Stream from "effect/Stream"
import * as Json from "../internal/wire/json.js"
import * as Uuid from "../internal/wire/uuid.js"
import { decodeUtf8 } from "../internal/wire/utf8.js"
import * as Signature from "../Signature.js"
import type * as Core from "./Core.js"
import * as Decisions from "./internal/decisions.js"
import { conflict, forbidden, KernelFailure, notFound, validation as validationFailure } from "./internal/model.js"
import { compileBundle } from "./internal/agents.js"
import * as GoHttp from "./internal/goHttp.js"
import * as PolicyTest from "./internal/policyTest.js"
import * as Resources from "./internal/resources.js"
import * as Wire from "./Wire.js"

/**
 * The request body was larger than {@link maxBodyBytes}.
 *
 * @since 0.1.0
 * @category errors
 */
export class BodyTooLarge extends Schema.TaggedError<BodyTooLarge>("effect-rebuno/kernel/BodyTooLarge")(
  "BodyTooLarge",
  {}
) {}

/**
 * The request body could not be read (connection error, aborted upload).
 *
 * @since 0.1.0
 * @category errors
 */
export class BodyReadError extends Schema.TaggedError<BodyReadError>("effect-rebuno/kernel/BodyReadError")(
  "BodyReadError",
  { cause: Schema.Defect() }
) {}

/**
 * A request as the routes see it.
 *
 * @since 0.1.0
 * @category models
 */
export interface KernelRequest {
  readonly method: string
  /** Path plus query exactly as on the request line, e.g. `/v0/executions?limit=5`. */
  readonly url: string
  /** Every value of a header (case-insensitive name), in order; `[]` when absent. */
  readonly headers: (name: string) => ReadonlyArray<string>
  /** The raw body, or an effect that reads it (only run by routes that need it). */
  readonly body: Uint8Array | Effect.Effect<Uint8Array, BodyTooLarge | BodyReadError>
}

/**
 * A response as the routes produce it. `body` is a `Stream` only for the SSE
 * route; header names are lowercase.
 *
 * @since 0.1.0
 * @category models
 */
export interface KernelResponse {
  readonly status: number
  readonly headers: Readonly<Record<string, string>>
  readonly body: string | Uint8Array | Stream.Stream<Uint8Array>
}

/**
 * Options of {@link make}.
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /**
   * Bootstrap bearer token of client/admin routes (full access). Absent or
   * empty: dev mode — every request passes in the older stages; in the current
   * stage a request without `Authorization` has full access and one with it
   * must carry a valid API key (PROTOCOL-CURRENT C.9.1).
   */
  readonly apiToken?: Redacted.Redacted<string> | undefined
}

/**
 * Request body cap: 10 MiB (PROTOCOL 2.4).
 *
 * @since 0.1.0
 * @category constants
 */
export const maxBodyBytes = 10 * 1024 * 1024

/**
 * Largest `data` of a live delta, in UTF-8 bytes (PROTOCOL 6.6).
 *
 * @since 0.1.0
 * @category constants
 */
export const maxDeltaBytes = 7000

/**
 * Interval of the SSE `: keep-alive` comment (PROTOCOL 11.6).
 *
 * @since 0.1.0
 * @category constants
 */
export const keepAliveInterval: Duration.Duration = Duration.seconds(15)

// ---------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------

const JSON_TYPE = "application/json; charset=utf-8"
const encoder = new TextEncoder()

const json = (status: number, text: string): KernelResponse => ({
  status,
  headers: { "content-type": JSON_TYPE },
  body: text + "\n"
})

const errorResponse = (status: number, code: string, message: string): KernelResponse =>
  json(status, Wire.encodeError({ code, message }))

const noContent: KernelResponse = { status: 204, headers: {}, body: "" }

const notFoundPage: KernelResponse = {
  status: 404,
  headers: { "content-type": "text/plain; charset=utf-8", "x-content-type-options": "nosniff" },
  body: "404 page not found\n"
}

const methodNotAllowed = (allowed: ReadonlyArray<string>): KernelResponse => ({
  status: 405,
  headers: { allow: allowed.join(", ") },
  body: ""
})

/** A finished response used to short-circuit a handler through the error channel. */
class Reject {
  readonly _tag = "Reject"
  constructor(readonly response: KernelResponse) {}
}

const reject = (response: KernelResponse): Effect.Effect<never, Reject> => Effect.fail(new Reject(response))

const unauthorized = errorResponse(401, "unauthorized", "unauthorized")
const forbiddenResponse = errorResponse(403, "forbidden", "forbidden")
const validation = errorResponse(400, "validation_error", "validation error")
const badDispatchId = errorResponse(400, "validation_error", "validation error: bad or missing Rebuno-Dispatch-Id")
const badDispatchAttempt = errorResponse(
  400,
  "validation_error",
  "validation error: bad or missing Rebuno-Dispatch-Attempt"
)
const missingDispatchIdCompat = errorResponse(400, "validation_error", "validation error: missing dispatch_id")
const internalError = errorResponse(500, "internal_error", "internal error")

const failureResponse = (failure: Core.KernelFailure): KernelResponse =>
  json(failure.status, Wire.encodeError(failure))

// ---------------------------------------------------------------------------
// Request parsing
// ---------------------------------------------------------------------------

const firstHeader = (req: KernelRequest, name: string): string => req.headers(name)[0] ?? ""

const splitTarget = (url: string): { readonly path: string; readonly query: string } => {
  let target = url
  const scheme = /^[a-zA-Z][a-zA-Z0-9+.-]*:\/\/[^/]*/.exec(target)
  if (scheme !== null) target = target.slice(scheme[0].length) || "/"
  const hash = target.indexOf("#")
  if (hash >= 0) target = target.slice(0, hash)
  const q = target.indexOf("?")
  return q < 0 ? { path: target, query: "" } : { path: target.slice(0, q), query: target.slice(q + 1) }
}

const INT64_MAX = 9223372036854775807n
const INT64_MIN = -9223372036854775808n

/** Go's `strconv.Atoi`: optional sign, decimal digits, within int64. */
const parseGoInt = (s: string): number | undefined => {
  if (!/^[+-]?[0-9]+$/.test(s)) return undefined
  // A sign and at most 15 digits: exact as a number (`+ 0` turns `-0` into `0`, as `BigInt` does).
  if (s.length <= 16) return Number(s) + 0
  const n = BigInt(s)
  if (n > INT64_MAX || n < INT64_MIN) return undefined
  return Number(n)
}

/**
 * Go's `strconv.ParseInt(s, 10, 64)` with its error ignored, as the
 * reference kernel reads the event paging parameters (11.5): 0 for text that
 * is not a number, the int64 bound for a number beyond it.
 */
const parseGoIntLenient = (s: string): number => {
  if (!/^[+-]?[0-9]+$/.test(s)) return 0
  if (s.length <= 16) return Number(s) + 0
  const n = BigInt(s)
  return Number(n > INT64_MAX ? INT64_MAX : n < INT64_MIN ? INT64_MIN : n)
}

const NIL_UUID = "00000000-0000-0000-0000-000000000000"

/**
 * The `resources` member of a submission (PROTOCOL-CURRENT C.6.4): a list of
 * strings, `null` meaning none; `undefined` for anything else (a `400`).
 */
const resourceKeys = (raw: string): ReadonlyArray<string> | undefined => {
  if (raw === "null") return []
  let value: unknown
  try {
    value = JSON.parse(raw)
  } catch {
    return undefined
  }
  return Array.isArray(value) && value.every((key) => typeof key === "string") ? value : undefined
}

type FieldType = "string" | "any" | "int" | "number"
type FieldValue<T extends FieldType> = T extends "int" | "number" ? number : string

const JSON_NUMBER = /^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$/
type Decoded<S extends Record<string, FieldType>> = { readonly [K in keyof S]?: FieldValue<S[K]> }

/**
 * Strict body decoding (PROTOCOL 2.3): exactly one JSON object, only the given
 * members, each of the right type. `null` is `""` for a string, `0` for an
 * integer or a number and the raw text `null` for an any-JSON member.
 */
const decodeStrict = <S extends Record<string, FieldType>>(
  bytes: Uint8Array,
  spec: S
): Decoded<S> | undefined => {
  // Invalid UTF-8: one U+FFFD per byte, as Go decodes it (8.3), so step ids match the reference kernel's.
  const members = Json.parseObjectMembers(decodeUtf8(bytes))
  if (members === undefined) return undefined
  const out: Record<string, string | number> = {}
  for (const [name, raw] of members) {
    if (!Object.prototype.hasOwnProperty.call(spec, name)) return undefined
    const type = spec[name]!
    if (type === "any") {
      out[name] = raw
    } else if (raw === "null") {
      out[name] = type === "string" ? "" : 0
    } else if (type === "string") {
      const s = Json.parseString(raw)
      if (s === undefined) return undefined
      out[name] = s
    } else if (type === "number") {
      // A float64, as Go decodes it: `1e400` does not fit and is refused.
      const n = JSON_NUMBER.test(raw) ? Number(raw) : NaN
      if (!Number.isFinite(n)) return undefined
      out[name] = n
    } else {
      const n = parseGoInt(raw)
      if (n === undefined) return undefined
      out[name] = n
    }
  }
  return out as Decoded<S>
}

// ---------------------------------------------------------------------------
// Routing
// ---------------------------------------------------------------------------

type Auth = "none" | "bearer" | "agent" | "dual"

/**
 * Who a request runs as (PROTOCOL-CURRENT C.9): full access (dev mode, the
 * bootstrap token, unauthenticated routes), a scoped API key, or an agent
 * principal (a signed agent request, C.2.1).
 *
 * @since 0.2.0
 * @category models
 */
export type Principal =
  | { readonly _tag: "Full" }
  | { readonly _tag: "ApiKey"; readonly key: Core.ApiKeyRecord }
  | { readonly _tag: "Agent"; readonly agentId: string }

const FULL: Principal = { _tag: "Full" }

/**
 * The scopes each bearer route needs (PROTOCOL-CURRENT C.9.1), by
 * `"<METHOD> <pattern>"`; dual routes list what their bearer side needs. A
 * bearer route missing here is open to full access only (fail closed).
 *
 * @since 0.2.0
 * @category constants
 */
export const bearerScopes: Readonly<Record<string, ReadonlyArray<Core.Scope>>> = {
  "POST /v0/executions": ["executions:write"],
  "POST /v0/executions/{id}/cancel": ["executions:write"],
  "POST /v0/executions/{id}/fork": ["executions:write"],
  "GET /v0/executions": ["executions:read"],
  "GET /v0/executions/{id}": ["executions:read"],
  "GET /v0/executions/{id}/events": ["executions:read"],
  "GET /v0/executions/{id}/stream": ["executions:read"],
  "GET /v0/executions/{id}/fork-points": ["executions:read"],
  "GET /v0/executions/{id}/previous": ["executions:read"],
  "GET /v0/executions/{id}/steps": ["executions:read"],
  "GET /v0/executions/{id}/steps/{step_id}": ["executions:read"],
  "GET /v0/approvals": ["approvals:read"],
  "GET /v0/approvals/{id}": ["approvals:read"],
  "POST /v0/approvals/{id}/grant": ["approvals:write"],
  "POST /v0/approvals/{id}/deny": ["approvals:write"],
  "GET /v0/agents": ["agents:read"],
  "GET /v0/agents/{id}": ["agents:read"],
  "POST /v0/agents": ["agents:write"],
  "DELETE /v0/agents/{id}": ["agents:write"],
  "POST /v0/policies/{agent_id}": ["policies:write"],
  "POST /v0/policies/{agent_id}/test": ["policies:write", "executions:read"],
  "POST /v0/api-keys": ["api_keys:manage"],
  "GET /v0/api-keys": ["api_keys:manage"],
  "POST /v0/api-keys/{id}/rotate": ["api_keys:manage"],
  "DELETE /v0/api-keys/{id}": ["api_keys:manage"]
}

/**
 * Whether a principal holds a scope: full access holds every scope, a key
 * its own; write does not imply read (C.9.1 step 5). Agents hold none.
 *
 * @since 0.2.0
 * @category auth
 */
export const hasScope = (principal: Principal, scope: Core.Scope): boolean =>
  principal._tag === "Full" || (principal._tag === "ApiKey" && principal.key.scopes.includes(scope))

interface RequestCtx {
  readonly req: KernelRequest
  readonly params: Readonly<Record<string, string>>
  readonly query: URLSearchParams
  /** The body, read once; fails with the response the route's auth kind prescribes. */
  readonly body: Effect.Effect<Uint8Array, Reject>
}

interface Ctx extends RequestCtx {
  /** Who the request runs as, once authenticated. */
  readonly principal: Principal
}

interface Route {
  readonly method: string
  readonly pattern: ReadonlyArray<string>
  readonly auth: Auth
  /** Scopes of the bearer side (C.9.1); `undefined` = full access only. */
  readonly scopes: ReadonlyArray<Core.Scope> | undefined
  /** Served only in the current stage (PROTOCOL-CURRENT); a plain 404 otherwise. */
  readonly currentOnly: boolean
  readonly handle: (ctx: Ctx) => Effect.Effect<KernelResponse, Reject | Core.KernelFailure>
}

const matchPattern = (
  pattern: ReadonlyArray<string>,
  segments: ReadonlyArray<string>
): Record<string, string> | undefined => {
  if (pattern.length !== segments.length) return undefined
  const params: Record<string, string> = {}
  for (let i = 0; i < pattern.length; i++) {
    const p = pattern[i]!
    const s = segments[i]!
    if (p.startsWith("{")) {
      if (s === "") return undefined
      params[p.slice(1, -1)] = s
    } else if (p !== s) {
      return undefined
    }
  }
  return params
}

const readBody = (req: KernelRequest): Effect.Effect<Uint8Array, BodyTooLarge | BodyReadError> =>
  req.body instanceof Uint8Array
    ? req.body.length > maxBodyBytes ? Effect.fail(new BodyTooLarge()) : Effect.succeed(req.body)
    : req.body

/** `Cache-Control: no-store` on an answer carrying a token (PROTOCOL-CURRENT C.9.2). */
const noStore = (response: KernelResponse): KernelResponse => ({
  ...response,
  headers: { ...response.headers, "cache-control": "no-store" }
})

/** The members of a step outcome body, as raw JSON text. */
interface OutcomeBody {
  readonly result?: string
  readonly error?: string
  readonly captures?: string
  readonly capture_failures?: string
}

/** A JSON boolean member: `null` or absent = `undefined`; anything but `true`/`false` is `null` (a `400`). */
const decodeBool = (raw: string | undefined): boolean | undefined | null =>
  raw === undefined || raw === "null" ? undefined : raw === "true" ? true : raw === "false" ? false : null

/**
 * The `captures` and `capture_failures` lists of PROTOCOL-CURRENT C.6.5 and
 * C.6.6 (`null` or absent = none), each entry decoded strictly;
 * `undefined` for anything else (a `400`).
 */
const decodeCaptures = (
  capturesRaw: string | undefined,
  failuresRaw: string | undefined
): Core.CaptureRecords | undefined => {
  // Each element as its source text, so the strict member decoding sees `1.0` as sent (not an int).
  const items = (raw: string | undefined): ReadonlyArray<string> | undefined =>
    raw === undefined || raw === "null" ? [] : Json.parseArrayElements(raw)
  const captureItems = items(capturesRaw)
  const failureItems = items(failuresRaw)
  if (captureItems === undefined || failureItems === undefined) return undefined
  const captures: Array<Core.Capture> = []
  for (const item of captureItems) {
    const d = decodeStrict(encoder.encode(item), { key: "string", generation: "int", checkpoint_ref: "string" })
    if (d === undefined) return undefined
    captures.push({ key: d.key ?? "", generation: d.generation ?? 0, checkpointRef: d.checkpoint_ref ?? "" })
  }
  const captureFailures: Array<Core.CaptureFailure> = []
  for (const item of failureItems) {
    const d = decodeStrict(encoder.encode(item), { key: "string", generation: "int", error: "string" })
    if (d === undefined) return undefined
    captureFailures.push({ key: d.key ?? "", generation: d.generation ?? 0, error: d.error ?? "" })
  }
  const out: { captures?: ReadonlyArray<Core.Capture>; captureFailures?: ReadonlyArray<Core.CaptureFailure> } = {}
  if (captures.length > 0) out.captures = captures
  if (captureFailures.length > 0) out.captureFailures = captureFailures
  return out
}

/** A JSON array of strings (`null` or absent = empty); `undefined` for anything else. */
const decodeStringList = (raw: string | undefined): ReadonlyArray<string> | undefined => {
  if (raw === undefined || raw === "null") return []
  let parsed: unknown
  try {
    parsed = JSON.parse(raw)
  } catch {
    return undefined
  }
  return Array.isArray(parsed) && parsed.every((item) => typeof item === "string") ? parsed : undefined
}

/** A JSON object (raw text, compacted) or `null`; `undefined` for anything else. */
const objectOrNull = (raw: string | undefined): string | null | undefined => {
  if (raw === undefined || raw === "null") return null
  if (Json.parseObjectMembers(raw) === undefined) return undefined
  return Json.compact(raw) ?? raw
}

/** The metadata body of PROTOCOL-CURRENT C.3.1: each member `null` or of its type. */
const decodeMetadata = (
  body: { readonly description?: string; readonly input_schema?: string; readonly output_schema?: string }
): Core.AgentMetadata | undefined => {
  let description: string | null = null
  if (body.description !== undefined && body.description !== "null") {
    const s = Json.parseString(body.description)
    if (s === undefined) return undefined
    description = s
  }
  const inputSchemaRaw = objectOrNull(body.input_schema)
  const outputSchemaRaw = objectOrNull(body.output_schema)
  if (inputSchemaRaw === undefined || outputSchemaRaw === undefined) return undefined
  return { description, inputSchemaRaw, outputSchemaRaw }
}

/**
 * Builds the request handler of a kernel core.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  core: Core.KernelCore,
  options: Options = {}
): (req: KernelRequest) => Effect.Effect<KernelResponse> => makeHandlers(core, options).handle

/**
 * The request handlers of a kernel core, sharing one request counter.
 *
 * @since 0.2.0
 * @category models
 */
export interface Handlers {
  /** Every route ({@link make}). */
  readonly handle: (req: KernelRequest) => Effect.Effect<KernelResponse>
  /**
   * The hot agent routes (step submit, complete and fail) as a plain
   * function of the current time (epoch ms), for a server on a hot path: the
   * answer `handle` would give when the request is authentic and well formed
   * (the body already read), or `undefined` — nothing changed — when any
   * check fails or the route is another one; `handle` then answers.
   */
  readonly handleSync: (req: KernelRequest, now: number) => KernelResponse | undefined
}

/**
 * Builds the request handlers of a kernel core: {@link make}'s handler and
 * its synchronous path for the step routes (see {@link Handlers}).
 *
 * @since 0.2.0
 * @category constructors
 */
export const makeHandlers = (core: Core.KernelCore, options: Options = {}): Handlers => {
  const configured = options.apiToken === undefined ? "" : Redacted.value(options.apiToken)
  const token = configured === "" ? undefined : configured
  const compat = () => core.settings.stage === "v0.14.0"
  /** The current stage (PROTOCOL-CURRENT): every behaviour of C.2–C.10 is gated on it. */
  const current = () => core.settings.stage === "current"
  let requestCount = 0

  // --- authentication -------------------------------------------------------

  /** Seed and v0.14.0: the bootstrap token or dev mode (3.1). */
  const bearerSeed = (req: KernelRequest): Effect.Effect<Principal, Reject> => {
    if (token === undefined) return Effect.succeed(FULL)
    const header = firstHeader(req, "authorization")
    if (!header.startsWith("Bearer ")) return reject(unauthorized)
    return Signature.timingSafeEqual(header.slice(7), token) ? Effect.succeed(FULL) : reject(unauthorized)
  }

  /** PROTOCOL-CURRENT C.9.1 steps 1–5. */
  const bearerCurrent = (req: KernelRequest, route: Route): Effect.Effect<Principal, Reject> =>
    Effect.gen(function*() {
      const header = firstHeader(req, "authorization")
      let principal: Principal
      if (token === undefined && header === "") {
        principal = FULL
      } else {
        if (!header.startsWith("Bearer ")) return yield* reject(unauthorized)
        const presented = header.slice(7)
        if (token !== undefined && Signature.timingSafeEqual(presented, token)) {
          principal = FULL
        } else {
          const key = yield* core.authenticateApiKey(presented)
          if (key === undefined) return yield* reject(unauthorized)
          principal = { _tag: "ApiKey", key }
        }
      }
      if (principal._tag === "ApiKey") {
        const needed = route.scopes
        if (needed === undefined || !needed.every((scope) => hasScope(principal, scope))) {
          return yield* reject(forbiddenResponse)
        }
      }
      return principal
    })

  const bearer = (req: KernelRequest, route: Route): Effect.Effect<Principal, Reject> =>
    current() ? bearerCurrent(req, route) : bearerSeed(req)

  /**
   * Agent authentication (3.3, 17.B; PROTOCOL-CURRENT C.2.1): ids and
   * signature present, agent registered, body read under the cap, signature
   * verified — in the current stage only `v1=`, within ±300 s.
   */
  const agent = (ctx: RequestCtx): Effect.Effect<Principal, Reject> =>
    Effect.gen(function*() {
      const req = ctx.req
      const agentId = firstHeader(req, "rebuno-agent-id")
      const signature = firstHeader(req, "rebuno-signature")
      if (agentId === "" || signature === "") return yield* reject(unauthorized)
      const record = yield* core.getAgent(agentId).pipe(Effect.mapError(() => new Reject(unauthorized)))
      const body = yield* ctx.body
      let ok = false
      if (signature.startsWith("sha256=") && !current()) {
        ok = yield* Signature.verify(record.secret, body, signature)
      } else if (signature.startsWith("v1=")) {
        const single = (name: string) => {
          const values = req.headers(name)
          return values.length > 1 ? undefined : values[0] ?? ""
        }
        const timestamp = single("rebuno-timestamp")
        const dispatchId = single("rebuno-dispatch-id")
        const dispatchAttempt = single("rebuno-dispatch-attempt")
        if (
          timestamp !== undefined && dispatchId !== undefined && dispatchAttempt !== undefined &&
          req.headers("rebuno-signature").length === 1
        ) {
          const now = yield* Clock.currentTimeMillis
          ok = yield* Signature.verifyV1(
            record.secret,
            { method: req.method, target: req.url, timestamp, dispatchId, dispatchAttempt, body },
            signature,
            Math.floor(now / 1000)
          )
        }
      }
      if (!ok) return yield* reject(unauthorized)
      return { _tag: "Agent", agentId } satisfies Principal
    })

  const usesAgentPath = (req: KernelRequest): boolean =>
    firstHeader(req, "rebuno-agent-id") !== "" || firstHeader(req, "rebuno-signature") !== ""

  // --- shared checks ----------------------------------------------------------

  const executionId = (ctx: Ctx, name = "id"): Effect.Effect<string, Reject> => {
    const id = Uuid.parseUuid(ctx.params[name] ?? "")
    return id === undefined ? reject(validation) : Effect.succeed(id)
  }

  const strict = <S extends Record<string, FieldType>>(ctx: Ctx, spec: S): Effect.Effect<Decoded<S>, Reject> =>
    Effect.flatMap(ctx.body, (bytes) => {
      const decoded = decodeStrict(bytes, spec)
      return decoded === undefined ? reject(validation) : Effect.succeed(decoded)
    })

  /**
   * PROTOCOL-CURRENT C.9.3 and C.10: in the current stage, an agent principal
   * may act only on its own executions — unknown → `404` (before any lease
   * check), another agent's → `403 forbidden`. Bearer principals are
   * deployment-wide; the seed and v0.14.0 stages check nothing here.
   */
  const owned = (ctx: Ctx, id: string): Effect.Effect<void, Core.KernelFailure> => {
    const principal = ctx.principal
    if (principal._tag !== "Agent" || !current()) return Effect.void
    return Effect.flatMap(core.getExecution(id), (execution) =>
      execution.agentId === principal.agentId
        ? Effect.void
        : Effect.fail(forbidden()))
  }

  /** Lease headers of 6.0 (or the v0.14.0 rules of 17.A): the lease, or the `400` to answer. */
  const leaseOf = (req: KernelRequest, route: "submit" | "other"): Core.Lease | KernelResponse => {
    const rawId = firstHeader(req, "rebuno-dispatch-id")
    const parsed = rawId === "" ? undefined : Uuid.parseUuid(rawId)
    const dispatchId = parsed === NIL_UUID ? undefined : parsed
    if (compat()) {
      // 17.A: an absent (or nil) id is "missing"; one that does not parse is the plain 400 of 2.5.
      if (route === "submit" && dispatchId === undefined) {
        return rawId !== "" && parsed === undefined ? validation : missingDispatchIdCompat
      }
      return { dispatchId: dispatchId ?? "", attempt: undefined }
    }
    if (dispatchId === undefined) return badDispatchId
    const attempt = parseGoInt(firstHeader(req, "rebuno-dispatch-attempt"))
    if (attempt === undefined || attempt <= 0) return badDispatchAttempt
    return { dispatchId, attempt }
  }

  const lease = (ctx: Ctx, route: "submit" | "other"): Effect.Effect<Core.Lease, Reject> => {
    const l = leaseOf(ctx.req, route)
    return "status" in l ? reject(l) : Effect.succeed(l)
  }

  // --- handlers ---------------------------------------------------------------

  /**
   * A step outcome body of the current stage (PROTOCOL-CURRENT C.6.5):
   * `result` (or `error`) plus the optional `captures` and
   * `capture_failures`, strictly.
   */
  const outcomeBody = (ctx: Ctx, member: "result" | "error") =>
    Effect.gen(function*() {
      let value: string | undefined
      let capturesRaw: string | undefined
      let failuresRaw: string | undefined
      if (member === "result") {
        const body = yield* strict(ctx, { result: "any", captures: "any", capture_failures: "any" })
        value = body.result
        capturesRaw = body.captures
        failuresRaw = body.capture_failures
      } else {
        const body = yield* strict(ctx, { error: "any", captures: "any", capture_failures: "any" })
        value = body.error
        capturesRaw = body.captures
        failuresRaw = body.capture_failures
      }
      const captures = decodeCaptures(capturesRaw, failuresRaw)
      if (captures === undefined) return yield* reject(validation)
      const none = captures.captures === undefined && captures.captureFailures === undefined
      return { value, captures: none ? undefined : captures }
    })

  /**
   * `POST /v0/executions` in the current stage (PROTOCOL-CURRENT C.4.1): the
   * body knows `session`, `parent_execution_id`, `idempotency_key` and
   * `spawned_by` (strictly, like every body) and no longer `agent_version`;
   * the core checks the rest in order.
   */
  const createCurrent = (ctx: Ctx): Effect.Effect<KernelResponse, Reject | Core.KernelFailure> =>
    Effect.gen(function*() {
      const body = yield* strict(ctx, {
        agent_id: "string",
        input: "any",
        session: "string",
        parent_execution_id: "string",
        idempotency_key: "string",
        spawned_by: "any"
      })
      let parentExecutionId: string | undefined
      if (body.parent_execution_id !== undefined && body.parent_execution_id !== "") {
        parentExecutionId = Uuid.parseUuid(body.parent_execution_id)
        if (parentExecutionId === undefined) return yield* reject(validation)
      }
      let spawnedBy: Core.SpawnedBy | undefined
      if (body.spawned_by !== undefined && body.spawned_by !== "null") {
        const decoded = decodeStrict(encoder.encode(body.spawned_by), { execution_id: "string", step_id: "string" })
        const parent = decoded === undefined ? undefined : Uuid.parseUuid(decoded.execution_id ?? "")
        if (decoded === undefined || parent === undefined) return yield* reject(validation)
        spawnedBy = { executionId: parent, stepId: decoded.step_id ?? "" }
      }
      const execution = yield* core.createExecution({
        agentId: body.agent_id ?? "",
        inputRaw: body.input,
        agentVersion: undefined,
        session: body.session,
        idempotencyKey: body.idempotency_key,
        parentExecutionId,
        spawnedBy
      })
      return json(201, Wire.encodeExecution(execution))
    })

  const sse = (id: string): KernelResponse => {
    const keepAlive = encoder.encode(": keep-alive\n\n")
    const body = Stream.unwrap(
      Effect.map(core.subscribeDeltas(id), (queue) =>
        Stream.concat(
          // An empty first chunk lets the server flush the headers at once.
          Stream.make(new Uint8Array(0)),
          Stream.merge(
            Stream.map(Stream.fromQueue(queue), (delta) => encoder.encode("data: " + Wire.encodeDelta(delta) + "\n\n")),
            Stream.map(Stream.fromSchedule(Schedule.spaced(keepAliveInterval)), () => keepAlive)
          )
        ))
    )
    return {
      status: 200,
      headers: { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" },
      body
    }
  }

  const metrics = (): KernelResponse => ({
    status: 200,
    headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
    body: "# HELP rebuno_dev_kernel_up Whether the embedded dev kernel is serving.\n" +
      "# TYPE rebuno_dev_kernel_up gauge\n" +
      "rebuno_dev_kernel_up 1\n" +
      "# HELP rebuno_dev_kernel_http_requests_total HTTP requests handled.\n" +
      "# TYPE rebuno_dev_kernel_http_requests_total counter\n" +
      `rebuno_dev_kernel_http_requests_total ${requestCount}\n`
  })

  const route = (
    method: string,
    path: string,
    auth: Auth,
    handle: Route["handle"]
  ): Route => ({
    method,
    pattern: path.split("/"),
    auth,
    scopes: bearerScopes[method + " " + path],
    currentOnly: false,
    handle
  })

  /** A route of the current stage only (PROTOCOL-CURRENT); older stages answer the plain 404. */
  const routeCurrent = (method: string, path: string, auth: Auth, handle: Route["handle"]): Route => ({
    ...route(method, path, auth, handle),
    currentOnly: true
  })

  const routes: ReadonlyArray<Route> = [
    route("GET", "/v0/health", "none", () => Effect.succeed(json(200, "{\"status\":\"ok\"}"))),
    route("GET", "/v0/ready", "none", () => Effect.succeed(json(200, "{\"status\":\"ready\"}"))),
    route("GET", "/metrics", "none", () => Effect.sync(metrics)),

    // --- executions (client) ---
    route("POST", "/v0/executions", "bearer", (ctx) =>
      Effect.gen(function*() {
        if (current()) return yield* createCurrent(ctx)
        const body = yield* strict(ctx, { agent_id: "string", input: "any", agent_version: "string" })
        const execution = yield* core.createExecution({
          agentId: body.agent_id ?? "",
          inputRaw: body.input,
          agentVersion: body.agent_version === "" ? undefined : body.agent_version
        })
        return json(201, Wire.encodeExecution(execution))
      })),
    route("GET", "/v0/executions", "bearer", (ctx) =>
      Effect.gen(function*() {
        const limitText = ctx.query.get("limit") ?? ""
        let limit = 50
        if (limitText !== "") {
          const n = parseGoInt(limitText)
          if (n === undefined) return yield* reject(validation)
          limit = n <= 0 ? 50 : n > 200 ? 200 : n
        }
        const cursorText = ctx.query.get("cursor") ?? ""
        let cursor: string | undefined
        if (cursorText !== "") {
          cursor = Uuid.parseUuid(cursorText)
          if (cursor === undefined) return yield* reject(validation)
        }
        const page = yield* core.listExecutions({
          agentId: ctx.query.get("agent_id") ?? "",
          status: ctx.query.get("status") ?? "",
          cursor,
          limit,
          // PROTOCOL-CURRENT C.4.7: `session` filters by exact session.
          session: current() ? ctx.query.get("session") ?? "" : ""
        })
        return json(200, Wire.encodeExecutionList(page))
      })),
    route("GET", "/v0/executions/{id}", "dual", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        yield* owned(ctx, id)
        return json(200, Wire.encodeExecution(yield* core.getExecution(id)))
      })),
    routeCurrent("GET", "/v0/executions/{id}/previous", "dual", (ctx) =>
      Effect.gen(function*() {
        // PROTOCOL-CURRENT C.4.6: 400 for a non-UUID id, 404 unknown, 403 another agent's.
        const id = yield* executionId(ctx)
        yield* owned(ctx, id)
        return json(200, "{\"state\":" + (yield* core.previousState(id)) + "}")
      })),
    route("GET", "/v0/executions/{id}/events", "bearer", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const afterSeq = parseGoIntLenient(ctx.query.get("after_seq") ?? "")
        const rawLimit = parseGoIntLenient(ctx.query.get("limit") ?? "")
        const limit = rawLimit <= 0 ? 100 : rawLimit > 1000 ? 1000 : rawLimit
        const events = yield* core.listEvents(id, afterSeq, limit)
        return json(200, Wire.encodeEvents(events))
      })),
    route("GET", "/v0/executions/{id}/stream", "bearer", (ctx) => Effect.map(executionId(ctx), sse)),
    routeCurrent("POST", "/v0/executions/{id}/fork", "bearer", (ctx) =>
      Effect.gen(function*() {
        // PROTOCOL-CURRENT C.7.1: the core checks in order; `policy_bundle` needs `policies:write`.
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { session: "string", at_seq: "int", policy_bundle: "string" })
        const result = yield* core.fork(id, {
          atSeq: body.at_seq ?? 0,
          session: body.session,
          policyBundle: body.policy_bundle,
          mayWritePolicies: hasScope(ctx.principal, "policies:write")
        })
        return json(201, Wire.encodeExecution(result.execution, result.restoration))
      })),
    routeCurrent("GET", "/v0/executions/{id}/fork-points", "bearer", (ctx) =>
      Effect.gen(function*() {
        // PROTOCOL-CURRENT C.7.3
        const id = yield* executionId(ctx)
        return json(200, Wire.encodeForkPoints(yield* core.forkPoints(id)))
      })),
    route("POST", "/v0/executions/{id}/cancel", "bearer", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        yield* core.cancelExecution(id)
        return noContent
      })),

    // --- steps (dual reads) ---
    route("GET", "/v0/executions/{id}/steps", "dual", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        yield* owned(ctx, id)
        const terminalOnly = ctx.query.get("status") === "terminal"
        const steps = yield* core.listSteps(id, terminalOnly)
        return json(200, Wire.encodeSteps(steps, terminalOnly))
      })),
    route("GET", "/v0/executions/{id}/steps/{step_id}", "dual", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        yield* owned(ctx, id)
        return json(200, Wire.encodeStep(yield* core.getStep(id, ctx.params.step_id!)))
      })),

    // --- agent routes ---
    route("POST", "/v0/executions/{id}/steps", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, {
          kind: "string",
          target: "string",
          args: "any",
          idempotency: "string",
          resources: "any"
        })
        // `resources` is a member of the current stage only (PROTOCOL-CURRENT C.6.4, C.8.1 step 1)
        const resources = body.resources === undefined
          ? undefined
          : current()
          ? resourceKeys(body.resources)
          : undefined
        if (body.resources !== undefined && resources === undefined) return yield* reject(validation)
        // the kind is part of decoding in the current stage (C.8.1 step 1, C.15 #5)
        const badKind = current() ? Decisions.checkKind(body.kind ?? "") : undefined
        if (badKind !== undefined) return yield* Effect.fail(badKind)
        const l = yield* lease(ctx, "submit")
        yield* owned(ctx, id)
        const decision = yield* core.submitStep(id, l, {
          kind: body.kind ?? "",
          target: body.target ?? "",
          argsRaw: body.args,
          idempotency: body.idempotency ?? "",
          resources
        })
        return json(200, Wire.encodeDecision(decision))
      })),
    route("POST", "/v0/executions/{id}/steps/{step_id}/complete", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        if (current()) {
          const { captures, value } = yield* outcomeBody(ctx, "result")
          const l = yield* lease(ctx, "other")
          yield* owned(ctx, id)
          return json(200, Wire.encodeDecision(yield* core.completeStep(id, ctx.params.step_id!, l, value, captures)))
        }
        const body = yield* strict(ctx, { result: "any" })
        const l = yield* lease(ctx, "other")
        yield* owned(ctx, id)
        return json(200, Wire.encodeDecision(yield* core.completeStep(id, ctx.params.step_id!, l, body.result)))
      })),
    route("POST", "/v0/executions/{id}/steps/{step_id}/fail", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        if (current()) {
          const { captures, value } = yield* outcomeBody(ctx, "error")
          const l = yield* lease(ctx, "other")
          yield* owned(ctx, id)
          return json(200, Wire.encodeDecision(yield* core.failStep(id, ctx.params.step_id!, l, value, captures)))
        }
        const body = yield* strict(ctx, { error: "any" })
        const l = yield* lease(ctx, "other")
        yield* owned(ctx, id)
        return json(200, Wire.encodeDecision(yield* core.failStep(id, ctx.params.step_id!, l, body.error)))
      })),
    route("POST", "/v0/executions/{id}/steps/{step_id}/stream", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { seq: "int", data: "string" })
        const data = body.data ?? ""
        if (encoder.encode(data).length > maxDeltaBytes) return yield* reject(validation)
        if (current()) {
          // PROTOCOL-CURRENT C.9.3, C.10: the step must be an executing step of this execution.
          yield* owned(ctx, id)
          const step = core.unsafeGetStep(id, ctx.params.step_id!)
          if (step === undefined) return yield* Effect.fail(notFound())
          if (step.status !== "executing") return yield* Effect.fail(conflict())
        }
        yield* core.publishDelta(id, { stepId: ctx.params.step_id!, seq: body.seq ?? 0, data })
        return noContent
      })),
    route("POST", "/v0/executions/{id}/heartbeat", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const l = yield* lease(ctx, "other")
        yield* owned(ctx, id)
        yield* core.heartbeat(id, l)
        return noContent
      })),
    route("POST", "/v0/executions/{id}/complete", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { output: "any", state: "any" })
        // `state` is a member of the current stage only (PROTOCOL-CURRENT C.4.5).
        if (body.state !== undefined && !current()) return yield* reject(validation)
        const l = yield* lease(ctx, "other")
        yield* owned(ctx, id)
        yield* core.completeExecution(id, l, body.output, body.state)
        return noContent
      })),
    routeCurrent("POST", "/v0/executions/{id}/suspend", "agent", (ctx) =>
      Effect.gen(function*() {
        // PROTOCOL-CURRENT C.5.2: id, lease headers, then 404/403, terminal, lease; empty body.
        const id = yield* executionId(ctx)
        const l = yield* lease(ctx, "other")
        yield* owned(ctx, id)
        const suspended = yield* core.suspendExecution(id, l)
        return json(200, suspended ? "{\"suspended\":true}" : "{\"suspended\":false}")
      })),
    routeCurrent("POST", "/v0/executions/{id}/resources", "agent", (ctx) =>
      Effect.gen(function*() {
        // PROTOCOL-CURRENT C.6.2: strict body, lease headers, the members, then 404/403, terminal, lease.
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, {
          key: "string",
          driver_id: "string",
          configuration: "any",
          coverage_reuse: "any",
          every_steps: "int",
          on_completion: "any"
        })
        const coverageReuse = decodeBool(body.coverage_reuse)
        const onCompletion = decodeBool(body.on_completion)
        if (coverageReuse === null || onCompletion === null) return yield* reject(validation)
        const l = yield* lease(ctx, "other")
        const registration: Core.ResourceRegistration = {
          key: body.key ?? "",
          driverId: body.driver_id ?? "",
          configurationRaw: body.configuration,
          coverageReuse,
          everySteps: body.every_steps,
          onCompletion
        }
        const bad = Resources.checkRegistration(registration)
        if (bad !== undefined) return yield* Effect.fail(bad)
        yield* owned(ctx, id)
        return json(200, Wire.encodeResource(yield* core.registerResource(id, l, registration)))
      })),
    routeCurrent("POST", "/v0/executions/{id}/resources/checkpoints", "agent", (ctx) =>
      Effect.gen(function*() {
        // PROTOCOL-CURRENT C.6.6
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { captures: "any", capture_failures: "any" })
        const records = decodeCaptures(body.captures, body.capture_failures)
        if (records === undefined) return yield* reject(validation)
        const l = yield* lease(ctx, "other")
        yield* owned(ctx, id)
        yield* core.publishCheckpoints(id, l, records)
        return noContent
      })),
    routeCurrent("POST", "/v0/executions/{id}/resources/{key}/binding", "agent", (ctx) =>
      Effect.gen(function*() {
        // PROTOCOL-CURRENT C.6.3: strict body, lease headers, `binding` required, then 404/403, terminal, lease.
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { binding: "any" })
        const l = yield* lease(ctx, "other")
        const bad = Resources.checkBinding(body.binding)
        if (bad !== undefined) return yield* Effect.fail(bad)
        yield* owned(ctx, id)
        yield* core.bindResource(id, ctx.params.key!, l, body.binding)
        return noContent
      })),
    route("POST", "/v0/executions/{id}/fail", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { error: "string" })
        const l = yield* lease(ctx, "other")
        yield* owned(ctx, id)
        yield* core.failExecution(id, l, body.error ?? "")
        return noContent
      })),

    // --- agents and policies (admin) ---
    route("POST", "/v0/agents", "bearer", (ctx) =>
      Effect.gen(function*() {
        if (current()) {
          // PROTOCOL-CURRENT C.10: `lease_timeout_seconds` (under 10 ignored), snake_case answer.
          const body = yield* strict(ctx, {
            id: "string",
            webhook_url: "string",
            secret: "string",
            lease_timeout_seconds: "number"
          })
          const record = yield* core.registerAgent({
            id: body.id ?? "",
            webhookUrl: body.webhook_url ?? "",
            secret: body.secret ?? "",
            leaseTimeoutSeconds: body.lease_timeout_seconds
          })
          return json(201, Wire.encodeCurrentAgent(record))
        }
        const body = yield* strict(ctx, { id: "string", webhook_url: "string", secret: "string" })
        const record = yield* core.registerAgent({
          id: body.id ?? "",
          webhookUrl: body.webhook_url ?? "",
          secret: body.secret ?? ""
        })
        return json(201, Wire.encodeAgent(record))
      })),
    route("GET", "/v0/agents", "bearer", () =>
      Effect.map(
        core.listAgents(),
        (agents) => json(200, current() ? Wire.encodeCurrentAgents(agents) : Wire.encodeAgents(agents))
      )),
    route("GET", "/v0/agents/{id}", "bearer", (ctx) =>
      Effect.map(
        core.getAgent(ctx.params.id!),
        (agent) => json(200, current() ? Wire.encodeCurrentAgent(agent) : Wire.encodeAgent(agent))
      )),
    routeCurrent("PUT", "/v0/agents/{id}/metadata", "agent", (ctx) =>
      Effect.gen(function*() {
        // PROTOCOL-CURRENT C.3.3: a known agent (404), the signer's own (403), strict body, 204 —
        // lookup before ownership, as for executions (C.9.3).
        const agentId = ctx.params.id!
        yield* core.getAgent(agentId)
        if (ctx.principal._tag !== "Agent" || ctx.principal.agentId !== agentId) return yield* Effect.fail(forbidden())
        const body = yield* strict(ctx, { description: "any", input_schema: "any", output_schema: "any" })
        const metadata = decodeMetadata(body)
        if (metadata === undefined) return yield* reject(validation)
        yield* core.setAgentMetadata(agentId, metadata)
        return noContent
      })),
    route("DELETE", "/v0/agents/{id}", "bearer", (ctx) => Effect.as(core.deleteAgent(ctx.params.id!), noContent)),
    route("POST", "/v0/policies/{agent_id}", "bearer", (ctx) =>
      Effect.gen(function*() {
        const body = yield* strict(ctx, { bundle: "string" })
        yield* core.loadPolicy(ctx.params.agent_id!, body.bundle ?? "")
        return noContent
      })),
    routeCurrent("POST", "/v0/policies/{agent_id}/test", "bearer", (ctx) =>
      Effect.gen(function*() {
        // PROTOCOL-CURRENT C.8.6; the body is the embedded kernel's own (internal/policyTest.ts)
        const agentId = ctx.params.agent_id!
        const body = yield* strict(ctx, { bundle: "string", cases: "any", execution_id: "string" })
        if (body.bundle === undefined) {
          return yield* Effect.fail(validationFailure("validation error: bundle is required"))
        }
        const hasCases = body.cases !== undefined && body.cases !== "null"
        const hasExecution = body.execution_id !== undefined && body.execution_id !== ""
        if (hasCases === hasExecution) {
          return yield* Effect.fail(
            validationFailure("validation error: exactly one of cases and execution_id is required")
          )
        }
        const bundle = compileBundle(body.bundle)
        if (bundle instanceof KernelFailure) return yield* Effect.fail(bundle)
        let cases: ReadonlyArray<PolicyTest.TestCase>
        if (hasCases) {
          const decoded = PolicyTest.decodeCases(body.cases!, agentId)
          if (decoded instanceof KernelFailure) return yield* Effect.fail(decoded)
          yield* core.getAgent(agentId)
          cases = decoded
        } else {
          const id = Uuid.parseUuid(body.execution_id!)
          if (id === undefined) {
            return yield* Effect.fail(
              validationFailure("validation error: execution_id must be an execution id (a UUID)")
            )
          }
          yield* core.getAgent(agentId)
          const execution = yield* core.getExecution(id)
          if (execution.agentId !== agentId) return yield* Effect.fail(forbidden())
          const events = yield* core.eventLog(id)
          cases = PolicyTest.replayCases(events, agentId, (stepId) => core.unsafeGetStep(id, stepId)?.argsRaw)
        }
        return json(200, PolicyTest.encodeReport(PolicyTest.run(bundle, cases)))
      })),

    // --- approvals ---
    route("GET", "/v0/approvals", "bearer", () =>
      Effect.map(core.listApprovals(), (approvals) => json(200, Wire.encodeApprovals(approvals)))),
    route("GET", "/v0/approvals/{id}", "bearer", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        return json(200, Wire.encodeApproval(yield* core.getApproval(id)))
      })),
    route("POST", "/v0/approvals/{id}/grant", "bearer", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { decided_by: "string", rationale: "string" })
        yield* core.grantApproval(id, { decidedBy: body.decided_by ?? "", rationale: body.rationale ?? "" })
        return noContent
      })),
    route("POST", "/v0/approvals/{id}/deny", "bearer", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { decided_by: "string", rationale: "string" })
        yield* core.denyApproval(id, { decidedBy: body.decided_by ?? "", rationale: body.rationale ?? "" })
        return noContent
      })),

    // --- API keys (PROTOCOL-CURRENT C.9.2) ---
    routeCurrent("POST", "/v0/api-keys", "bearer", (ctx) =>
      Effect.gen(function*() {
        const body = yield* strict(ctx, { name: "string", scopes: "any" })
        const scopes = decodeStringList(body.scopes)
        if (scopes === undefined) return yield* reject(validation)
        const issued = yield* core.createApiKey({ name: body.name ?? "", scopes })
        return noStore(json(201, Wire.encodeIssuedApiKey(issued)))
      })),
    routeCurrent("GET", "/v0/api-keys", "bearer", () =>
      Effect.map(core.listApiKeys(), (keys) => json(200, Wire.encodeApiKeys(keys)))),
    routeCurrent("POST", "/v0/api-keys/{id}/rotate", "bearer", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        return noStore(json(200, Wire.encodeIssuedApiKey(yield* core.rotateApiKey(id))))
      })),
    routeCurrent("DELETE", "/v0/api-keys/{id}", "bearer", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        yield* core.revokeApiKey(id)
        return noContent
      }))
  ]

  const dispatch = (req: KernelRequest): Effect.Effect<KernelResponse, Reject | Core.KernelFailure> => {
    const { path, query } = splitTarget(req.url)
    const segments = GoHttp.routedSegments(path)
    const allowed: Array<string> = []
    const isCurrent = current()
    for (const r of routes) {
      if (r.currentOnly && !isCurrent) continue
      const params = matchPattern(r.pattern, segments)
      if (params === undefined) continue
      if (r.method !== req.method) {
        if (!allowed.includes(r.method)) allowed.push(r.method)
        continue
      }
      const agentPath = r.auth === "agent" || (r.auth === "dual" && usesAgentPath(req))
      let cached: Uint8Array | undefined
      const body: Effect.Effect<Uint8Array, Reject> = Effect.suspend(() =>
        cached !== undefined
          ? Effect.succeed(cached)
          : readBody(req).pipe(
            Effect.map((bytes) => (cached = bytes)),
            // Over the cap or unreadable: the signature check fails (401) on the
            // agent path; a decoding route answers 400 (PROTOCOL 2.4).
            Effect.mapError(() => new Reject(agentPath ? unauthorized : validation))
          )
      )
      const base: RequestCtx = { req, params, query: new URLSearchParams(query), body }
      const auth: Effect.Effect<Principal, Reject> = r.auth === "none"
        ? Effect.succeed(FULL)
        : agentPath
        ? agent(base)
        : bearer(req, r)
      return Effect.flatMap(auth, (principal) => r.handle({ ...base, principal }))
    }
    return Effect.succeed(allowed.length > 0 ? methodNotAllowed(allowed) : notFoundPage)
  }

  const general = (req: KernelRequest): Effect.Effect<KernelResponse> =>
    Effect.suspend(() => {
      requestCount++
      return dispatch(req)
    }).pipe(
      Effect.catch((e) => Effect.succeed(e._tag === "Reject" ? e.response : failureResponse(e))),
      Effect.catchDefect(() => Effect.succeed(internalError))
    )

  // --- the synchronous path of the step routes -------------------------------

  /**
   * {@link agent} and {@link owned} together, computed on the spot: `true`
   * when the request is an authentic agent request (3.3, 17.B;
   * PROTOCOL-CURRENT C.2.1) on an execution the agent may act on (C.9.3);
   * `false` when any check fails or the signature needs Web Crypto (then the
   * general path answers).
   */
  const agentCheck = (req: KernelRequest, body: Uint8Array, now: number, id: string): boolean => {
    const agentId = firstHeader(req, "rebuno-agent-id")
    const signature = firstHeader(req, "rebuno-signature")
    if (agentId === "" || signature === "") return false
    const record = core.unsafeGetAgent(agentId)
    if (record === undefined) return false
    let verified: boolean | undefined
    if (signature.startsWith("sha256=") && !current()) {
      verified = Signature.verifySync(record.secret, body, signature)
    } else {
      if (!signature.startsWith("v1=") || req.headers("rebuno-signature").length !== 1) return false
      const timestamp = req.headers("rebuno-timestamp")
      const dispatchId = req.headers("rebuno-dispatch-id")
      const dispatchAttempt = req.headers("rebuno-dispatch-attempt")
      if (timestamp.length > 1 || dispatchId.length > 1 || dispatchAttempt.length > 1) return false
      verified = Signature.verifyV1Sync(
        record.secret,
        {
          method: req.method,
          target: req.url,
          timestamp: timestamp[0] ?? "",
          dispatchId: dispatchId[0] ?? "",
          dispatchAttempt: dispatchAttempt[0] ?? "",
          body
        },
        signature,
        Math.floor(now / 1000)
      )
    }
    if (verified !== true) return false
    return !current() || core.unsafeGetExecution(id)?.agentId === agentId
  }

  /**
   * The step submit and the step outcome routes, answered synchronously at
   * time `now` when every check before the core passes: the same checks in
   * the same order as their routes, then the same core transition and answer
   * (the core's refusals included). `undefined` whenever a check fails (or a
   * judge is configured, which may need to wait): the general path then
   * answers, from the start, with nothing changed yet.
   */
  const handleSync = (req: KernelRequest, now: number): KernelResponse | undefined => {
    const body = req.body
    if (req.method !== "POST" || !(body instanceof Uint8Array) || body.length > maxBodyBytes) return undefined
    if (core.settings.judge !== undefined) return undefined
    const url = req.url
    // The plain form only: no query, fragment or escapes to decode, no absolute form.
    if (!url.startsWith("/v0/executions/") || /[?#%]/.test(url)) return undefined
    const segments = url.split("/")
    const settle = segments.length === 7 && (segments[6] === "complete" || segments[6] === "fail")
    if (!(segments.length === 5 || settle) || segments[4] !== "steps" || segments[3] === "") return undefined
    if (settle && segments[5] === "") return undefined
    const id = Uuid.parseUuid(segments[3]!)
    if (id === undefined) return undefined
    let answer: Core.Decision | Core.KernelFailure
    try {
      if (!settle) {
        const b = decodeStrict(body, {
          kind: "string",
          target: "string",
          args: "any",
          idempotency: "string",
          resources: "any"
        })
        if (b === undefined) return undefined
        const resources = b.resources === undefined ? undefined : current() ? resourceKeys(b.resources) : undefined
        if (b.resources !== undefined && resources === undefined) return undefined
        if (current() && Decisions.checkKind(b.kind ?? "") !== undefined) return undefined
        const l = leaseOf(req, "submit")
        if ("status" in l || !agentCheck(req, body, now, id)) return undefined
        requestCount++
        answer = core.unsafeSubmitStep(now, id, l, {
          kind: b.kind ?? "",
          target: b.target ?? "",
          argsRaw: b.args,
          idempotency: b.idempotency ?? "",
          resources
        })
      } else {
        const outcome = segments[6] === "complete" ? "succeeded" : "failed"
        // `result` (or `error`), plus the captures in the current stage (C.6.5)
        const b: OutcomeBody | undefined = current()
          ? outcome === "succeeded"
            ? decodeStrict(body, { result: "any", captures: "any", capture_failures: "any" })
            : decodeStrict(body, { error: "any", captures: "any", capture_failures: "any" })
          : outcome === "succeeded"
          ? decodeStrict(body, { result: "any" })
          : decodeStrict(body, { error: "any" })
        if (b === undefined) return undefined
        const records = current() ? decodeCaptures(b.captures, b.capture_failures) : {}
        if (records === undefined) return undefined
        const value = outcome === "succeeded" ? b.result : b.error
        const captures = records.captures === undefined && records.captureFailures === undefined ? undefined : records
        const l = leaseOf(req, "other")
        if ("status" in l || !agentCheck(req, body, now, id)) return undefined
        requestCount++
        answer = core.unsafeSettleStep(now, id, segments[5]!, l, outcome, value, captures)
      }
      return answer instanceof KernelFailure ? failureResponse(answer) : json(200, Wire.encodeDecision(answer))
    } catch {
      return internalError
    }
  }

  const handle = (req: KernelRequest): Effect.Effect<KernelResponse> =>
    req.body instanceof Uint8Array && req.method === "POST" && req.url.startsWith("/v0/executions/")
      ? Effect.flatMap(Clock.currentTimeMillis, (now) => {
        const response = handleSync(req, now)
        return response === undefined ? general(req) : Effect.succeed(response)
      })
      : general(req)

  return { handle, handleSync }
}
