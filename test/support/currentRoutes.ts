/**
 * An in-process harness over the embedded kernel's routes in the current
 * stage (PROTOCOL-CURRENT): bearer requests, `v1=`-signed agent requests
 * (signed at the TestClock's time), a running execution with its lease
 * headers, and the answers as a user sees them (status, headers, body text);
 * and the reads and writes the kernel test files share.
 */
import { expect } from "@effect/vitest"
import { Clock, Effect } from "effect"
import * as Core from "../../src/kernel/Core.js"
import * as Routes from "../../src/kernel/Routes.js"
import * as Signature from "../../src/Signature.js"
import * as StepId from "../../src/StepId.js"

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

/** The kernel's error envelope as it is written on the wire. */
export const errorBody = (code: string, message: string) => JSON.stringify({ code, message }) + "\n"
export const validationError = (message: string) => errorBody("validation_error", message)
export const RECORDED = "{\"decision\":\"recorded\"}\n"
export const EXECUTION_TERMINAL = errorBody("execution_terminal", "execution terminal")
export const LEASE_SUPERSEDED = errorBody("lease_superseded", "dispatch lease superseded")
/** A policy that holds every `send_email` step for an approval. */
export const APPROVE_SEND_EMAIL =
  "default_action: allow\nrules:\n  - id: gate\n    when: { target: send_email }\n    then: { decision: require_approval }\n"

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

/** A signed request of `agentId`, with its body (default empty) and extra headers (lease headers). */
export type AgentRequest = (
  agentId: string,
  method: string,
  url: string,
  body?: string,
  headers?: HeaderInput
) => Effect.Effect<Answer>

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
  readonly agent: AgentRequest
  /** A `sha256=`-signed request of `agentId` (the seed stage's scheme). */
  readonly agentSha256: AgentRequest
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

/** `Rebuno-Dispatch-Id` and `Rebuno-Dispatch-Attempt` of a claimed dispatch. */
export type Lease = Readonly<Record<string, string>>

export const leaseOf = (claim: { readonly dispatchId: string; readonly attempt: number }): Lease => ({
  "Rebuno-Dispatch-Id": claim.dispatchId,
  "Rebuno-Dispatch-Attempt": String(claim.attempt)
})

export interface Running {
  readonly id: string
  /** `Rebuno-Dispatch-Id` and `Rebuno-Dispatch-Attempt` of the claimed dispatch. */
  readonly lease: Lease
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
    return { id, lease: leaseOf(claim) } satisfies Running
  })

/** The event types of an execution, in order. */
export const eventTypes = (h: Harness, id: string) =>
  Effect.map(h.core.eventLog(id), (events) => events.map((e) => e.type))

/** `hello` submits a `send_email` step (held by {@link APPROVE_SEND_EMAIL}). */
export const submitSendEmail = (h: Harness, id: string, lease: Lease) =>
  h.agent(
    "hello",
    "POST",
    `/v0/executions/${id}/steps`,
    "{\"kind\":\"tool_call\",\"target\":\"send_email\",\"args\":{}}",
    lease
  )

/** `POST /v0/executions` with this body, over the bearer side. */
export const create = (h: Harness, body: Record<string, unknown>) =>
  h.send("POST", "/v0/executions", { body: JSON.stringify(body) })

const claimed = new WeakMap<Core.KernelCore, Map<string, Lease>>()

/** Claims every due dispatch (remembering them); answers the lease headers of `id`'s latest claim. */
export const claim = (h: Harness, id: string) =>
  Effect.map(h.core.claimDue(100), (claims) => {
    let leases = claimed.get(h.core)
    if (leases === undefined) claimed.set(h.core, leases = new Map())
    for (const c of claims) leases.set(c.executionId, leaseOf(c))
    const lease = leases.get(id)
    if (lease === undefined) throw new Error("no dispatch for " + id)
    return lease
  })

/** Claims `id`'s dispatch and ends the execution over the wire with this body (204 expected). */
export const endExecution = (h: Harness, id: string, route: "complete" | "fail", body: string, agentId = "hello") =>
  Effect.gen(function*() {
    const lease = yield* claim(h, id)
    const res = yield* h.agent(agentId, "POST", `/v0/executions/${id}/${route}`, body, lease)
    expect(res.status).toBe(204)
  })

/** How many events an execution has: the seq the next one gets. */
export const seqOf = (h: Harness, id: string) => Effect.map(h.core.eventLog(id), (log) => log.length)

/** The events of an execution from `seq` on, as type and parsed payload. */
export const eventsFrom = (h: Harness, id: string, seq = 0) =>
  Effect.map(h.core.eventLog(id), (log) => log.slice(seq).map((e) => [e.type, JSON.parse(e.payload)] as const))

/** Every execution id the kernel holds, newest first. */
export const allIds = (h: Harness) =>
  Effect.map(
    h.core.listExecutions({ agentId: "", status: "", cursor: undefined, limit: 200 }),
    (page) => page.executions.map((e) => e.id)
  )

export interface WireEvent {
  readonly seq: number
  readonly type: string
  readonly payload: any
}

/** The events of an execution as `GET …/events` answers them. */
export const wireEvents = (h: Harness, id: string) =>
  Effect.map(
    h.send("GET", `/v0/executions/${id}/events?limit=1000`),
    (res) =>
      (JSON.parse(res.body) ?? []).map((e: any) => ({ seq: e.event_seq, type: e.type, payload: e.payload })) as Array<
        WireEvent
      >
  )

/** A step submission of PROTOCOL-CURRENT C.8.1 (defaults: a safe-to-retry tool call with `{}` args). */
export interface Submission {
  readonly kind?: string
  readonly target: string
  readonly args?: unknown
  readonly idempotency?: string
  readonly resources?: unknown
}

export const submitText = (s: Submission): string =>
  JSON.stringify({
    kind: s.kind ?? "tool_call",
    target: s.target,
    args: s.args ?? {},
    idempotency: s.idempotency ?? "safe_to_retry",
    ...(s.resources === undefined ? {} : { resources: s.resources })
  })

export const submit = (h: Harness, run: Running, s: Submission, agentId = "hello") =>
  h.agent(agentId, "POST", `/v0/executions/${run.id}/steps`, submitText(s), run.lease)

/** Submits and answers the parsed decision (status 200 expected). */
export const decide = (h: Harness, run: Running, s: Submission, agentId = "hello") =>
  Effect.map(submit(h, run, s, agentId), (res) => {
    expect(res.status, res.body).toBe(200)
    return JSON.parse(res.body) as Record<string, any>
  })

/** The step id (PROTOCOL 8.2) of a submission's `occurrence`-th call in the run's execution. */
export const stepIdOf = (run: Running, s: Submission, occurrence = 0) =>
  StepId.make({
    executionId: run.id,
    kind: s.kind ?? "tool_call",
    target: s.target,
    argsHash: StepId.argsHash(JSON.stringify(s.args ?? {})),
    occurrence
  })

/** Completes a step over the wire (answer `recorded` expected). */
export const complete = (h: Harness, run: Running, stepId: string, result: unknown) =>
  Effect.map(
    h.agent("hello", "POST", `/v0/executions/${run.id}/steps/${stepId}/complete`, JSON.stringify({ result }), run.lease),
    (res) => {
      expect(res.body).toBe(RECORDED)
    }
  )

/** Loads a policy bundle over the wire (204 expected). */
export const loadPolicy = (h: Harness, agentId: string, bundle: string) =>
  Effect.map(h.send("POST", `/v0/policies/${agentId}`, { body: JSON.stringify({ bundle }) }), (res) => {
    expect(res.status, res.body).toBe(204)
  })

/** Claims the execution's next due dispatch. */
export const claimNext = (h: Harness, id: string) =>
  Effect.map(h.core.claimDue(100), (claims): Running => {
    const claim = claims.find((c) => c.executionId === id)
    if (claim === undefined) throw new Error("no due dispatch for " + id)
    return { id, lease: leaseOf(claim) }
  })

/** Asserts the execution has no due dispatch. */
export const nothingDue = (h: Harness, id: string) =>
  Effect.map(h.core.claimDue(100), (claims) => {
    expect(claims.some((c) => c.executionId === id)).toBe(false)
  })
