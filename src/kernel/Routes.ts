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
import * as Signature from "../Signature.js"
import type * as Core from "./Core.js"
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
  /** Bearer token of client/admin routes; dev mode (every request passes) when absent or empty. */
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
const decoder = new TextDecoder("utf-8", { ignoreBOM: true })

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
  errorResponse(failure.status, failure.code, failure.message)

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

const decodeSegment = (s: string): string => {
  try {
    return decodeURIComponent(s)
  } catch {
    return s
  }
}

/** Go's `strconv.Atoi`: optional sign, decimal digits, within int64. */
const parseGoInt = (s: string): number | undefined => {
  if (!/^[+-]?[0-9]+$/.test(s)) return undefined
  const n = BigInt(s)
  if (n > 9223372036854775807n || n < -9223372036854775808n) return undefined
  return Number(n)
}

const NIL_UUID = "00000000-0000-0000-0000-000000000000"

type FieldType = "string" | "any" | "int"
type FieldValue<T extends FieldType> = T extends "int" ? number : string
type Decoded<S extends Record<string, FieldType>> = { readonly [K in keyof S]?: FieldValue<S[K]> }

/**
 * Strict body decoding (PROTOCOL 2.3): exactly one JSON object, only the given
 * members, each of the right type. `null` is `""` for a string, `0` for an
 * integer and the raw text `null` for an any-JSON member.
 */
const decodeStrict = <S extends Record<string, FieldType>>(
  bytes: Uint8Array,
  spec: S
): Decoded<S> | undefined => {
  const members = Json.parseObjectMembers(decoder.decode(bytes))
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

interface Ctx {
  readonly req: KernelRequest
  readonly params: Readonly<Record<string, string>>
  readonly query: URLSearchParams
  /** The body, read once; fails with the response the route's auth kind prescribes. */
  readonly body: Effect.Effect<Uint8Array, Reject>
}

interface Route {
  readonly method: string
  readonly pattern: ReadonlyArray<string>
  readonly auth: Auth
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

/**
 * Builds the request handler of a kernel core.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  core: Core.KernelCore,
  options: Options = {}
): (req: KernelRequest) => Effect.Effect<KernelResponse> => {
  const configured = options.apiToken === undefined ? "" : Redacted.value(options.apiToken)
  const token = configured === "" ? undefined : configured
  const compat = () => core.settings.compat === "v0.14.0"
  let requestCount = 0

  // --- authentication -------------------------------------------------------

  const bearer = (req: KernelRequest): Effect.Effect<void, Reject> => {
    if (token === undefined) return Effect.void
    const header = firstHeader(req, "authorization")
    if (!header.startsWith("Bearer ")) return reject(unauthorized)
    return Signature.timingSafeEqual(header.slice(7), token) ? Effect.void : reject(unauthorized)
  }

  const agent = (ctx: Ctx): Effect.Effect<void, Reject> =>
    Effect.gen(function*() {
      const req = ctx.req
      const agentId = firstHeader(req, "rebuno-agent-id")
      const signature = firstHeader(req, "rebuno-signature")
      if (agentId === "" || signature === "") return yield* reject(unauthorized)
      const record = yield* core.getAgent(agentId).pipe(Effect.mapError(() => new Reject(unauthorized)))
      const body = yield* ctx.body
      let ok = false
      if (signature.startsWith("sha256=")) {
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

  /** Lease headers of 6.0 (or the v0.14.0 rules of 17.A). */
  const lease = (ctx: Ctx, route: "submit" | "other"): Effect.Effect<Core.Lease, Reject> => {
    const rawId = firstHeader(ctx.req, "rebuno-dispatch-id")
    const parsed = rawId === "" ? undefined : Uuid.parseUuid(rawId)
    const dispatchId = parsed === NIL_UUID ? undefined : parsed
    if (compat()) {
      if (route === "submit" && dispatchId === undefined) return reject(missingDispatchIdCompat)
      return Effect.succeed({ dispatchId: dispatchId ?? "", attempt: undefined })
    }
    if (dispatchId === undefined) return reject(badDispatchId)
    const attempt = parseGoInt(firstHeader(ctx.req, "rebuno-dispatch-attempt"))
    if (attempt === undefined || attempt <= 0) return reject(badDispatchAttempt)
    return Effect.succeed({ dispatchId, attempt })
  }

  // --- handlers ---------------------------------------------------------------

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
  ): Route => ({ method, pattern: path.split("/"), auth, handle })

  const routes: ReadonlyArray<Route> = [
    route("GET", "/v0/health", "none", () => Effect.succeed(json(200, "{\"status\":\"ok\"}"))),
    route("GET", "/v0/ready", "none", () => Effect.succeed(json(200, "{\"status\":\"ready\"}"))),
    route("GET", "/metrics", "none", () => Effect.sync(metrics)),

    // --- executions (client) ---
    route("POST", "/v0/executions", "bearer", (ctx) =>
      Effect.gen(function*() {
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
          limit
        })
        return json(200, Wire.encodeExecutionList(page))
      })),
    route("GET", "/v0/executions/{id}", "dual", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        return json(200, Wire.encodeExecution(yield* core.getExecution(id)))
      })),
    route("GET", "/v0/executions/{id}/events", "bearer", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const afterSeq = parseGoInt(ctx.query.get("after_seq") ?? "") ?? 0
        const rawLimit = parseGoInt(ctx.query.get("limit") ?? "") ?? 0
        const limit = rawLimit <= 0 ? 100 : rawLimit > 1000 ? 1000 : rawLimit
        const events = yield* core.listEvents(id, afterSeq, limit)
        return json(200, Wire.encodeEvents(events))
      })),
    route("GET", "/v0/executions/{id}/stream", "bearer", (ctx) => Effect.map(executionId(ctx), sse)),
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
        const terminalOnly = ctx.query.get("status") === "terminal"
        const steps = yield* core.listSteps(id, terminalOnly)
        return json(200, Wire.encodeSteps(steps, terminalOnly))
      })),
    route("GET", "/v0/executions/{id}/steps/{step_id}", "dual", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        return json(200, Wire.encodeStep(yield* core.getStep(id, ctx.params.step_id!)))
      })),

    // --- agent routes ---
    route("POST", "/v0/executions/{id}/steps", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { kind: "string", target: "string", args: "any", idempotency: "string" })
        const l = yield* lease(ctx, "submit")
        const decision = yield* core.submitStep(id, l, {
          kind: body.kind ?? "",
          target: body.target ?? "",
          argsRaw: body.args,
          idempotency: body.idempotency ?? ""
        })
        return json(200, Wire.encodeDecision(decision))
      })),
    route("POST", "/v0/executions/{id}/steps/{step_id}/complete", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { result: "any" })
        const l = yield* lease(ctx, "other")
        return json(200, Wire.encodeDecision(yield* core.completeStep(id, ctx.params.step_id!, l, body.result)))
      })),
    route("POST", "/v0/executions/{id}/steps/{step_id}/fail", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { error: "any" })
        const l = yield* lease(ctx, "other")
        return json(200, Wire.encodeDecision(yield* core.failStep(id, ctx.params.step_id!, l, body.error)))
      })),
    route("POST", "/v0/executions/{id}/steps/{step_id}/stream", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { seq: "int", data: "string" })
        const data = body.data ?? ""
        if (encoder.encode(data).length > maxDeltaBytes) return yield* reject(validation)
        yield* core.publishDelta(id, { stepId: ctx.params.step_id!, seq: body.seq ?? 0, data })
        return noContent
      })),
    route("POST", "/v0/executions/{id}/heartbeat", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const l = yield* lease(ctx, "other")
        yield* core.heartbeat(id, l)
        return noContent
      })),
    route("POST", "/v0/executions/{id}/complete", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { output: "any" })
        const l = yield* lease(ctx, "other")
        yield* core.completeExecution(id, l, body.output)
        return noContent
      })),
    route("POST", "/v0/executions/{id}/fail", "agent", (ctx) =>
      Effect.gen(function*() {
        const id = yield* executionId(ctx)
        const body = yield* strict(ctx, { error: "string" })
        const l = yield* lease(ctx, "other")
        yield* core.failExecution(id, l, body.error ?? "")
        return noContent
      })),

    // --- agents and policies (admin) ---
    route("POST", "/v0/agents", "bearer", (ctx) =>
      Effect.gen(function*() {
        const body = yield* strict(ctx, { id: "string", webhook_url: "string", secret: "string" })
        const record = yield* core.registerAgent({
          id: body.id ?? "",
          webhookUrl: body.webhook_url ?? "",
          secret: body.secret ?? ""
        })
        return json(201, Wire.encodeAgent(record))
      })),
    route("GET", "/v0/agents", "bearer", () =>
      Effect.map(core.listAgents(), (agents) => json(200, Wire.encodeAgents(agents)))),
    route("GET", "/v0/agents/{id}", "bearer", (ctx) =>
      Effect.map(core.getAgent(ctx.params.id!), (agent) => json(200, Wire.encodeAgent(agent)))),
    route("DELETE", "/v0/agents/{id}", "bearer", (ctx) => Effect.as(core.deleteAgent(ctx.params.id!), noContent)),
    route("POST", "/v0/policies/{agent_id}", "bearer", (ctx) =>
      Effect.gen(function*() {
        const body = yield* strict(ctx, { bundle: "string" })
        yield* core.loadPolicy(ctx.params.agent_id!, body.bundle ?? "")
        return noContent
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
      }))
  ]

  const dispatch = (req: KernelRequest): Effect.Effect<KernelResponse, Reject | Core.KernelFailure> => {
    const { path, query } = splitTarget(req.url)
    const segments = path.split("/").map(decodeSegment)
    const allowed: Array<string> = []
    for (const r of routes) {
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
      const ctx: Ctx = { req, params, query: new URLSearchParams(query), body }
      const auth = r.auth === "none" ? Effect.void : agentPath ? agent(ctx) : bearer(req)
      return Effect.andThen(auth, r.handle(ctx))
    }
    return Effect.succeed(allowed.length > 0 ? methodNotAllowed(allowed) : notFoundPage)
  }

  return (req: KernelRequest): Effect.Effect<KernelResponse> =>
    Effect.suspend(() => {
      requestCount++
      return dispatch(req)
    }).pipe(
      Effect.catch((e) => Effect.succeed(e._tag === "Reject" ? e.response : failureResponse(e))),
      Effect.catchDefect(() => Effect.succeed(internalError))
    )
}
