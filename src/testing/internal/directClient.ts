/**
 * A `KernelClient` that calls the embedded kernel's core directly: no bytes,
 * no signatures, the same decisions, errors and state. This is what makes the
 * test kit fast; `TestKernel.layer({ transport: "http" })` swaps in the real
 * HTTP client over in-process routes when a test wants the wire too. Like the
 * HTTP client, it retries the calls PROTOCOL.md 15.1 declares safe (reads,
 * step complete / fail, outcome posts) on transport failures — which, here,
 * only the test kit's fault injection produces — and never retries a submit.
 *
 * @since 0.1.0
 * @internal
 */
import { Effect, Exit, Redacted, Schema } from "effect"
import type * as Core from "../../kernel/Core.js"
import * as Wire from "../../kernel/Wire.js"
import type { Caller, KernelClient, Lease, StepSubmission } from "../../KernelClient.js"
import * as Protocol from "../../Protocol.js"
import { KernelError, LeaseSuperseded, PolicyError, Terminated } from "../../RebunoError.js"
import * as Http from "../../internal/http.js"

/**
 * The intercepted agent → kernel calls.
 *
 * @since 0.1.0
 * @internal
 */
export type CallName =
  | "getExecution"
  | "submitStep"
  | "completeStep"
  | "failStep"
  | "heartbeat"
  | "completeExecution"
  | "failExecution"

/**
 * One agent → kernel call as the interceptor sees it before it is sent.
 *
 * @since 0.1.0
 * @internal
 */
export interface CallInfo {
  readonly call: CallName
  readonly agentId: string
  /** `undefined` for reads, which carry no lease. */
  readonly lease: Lease | undefined
  readonly executionId: string
  /** Complete / fail: the step named by the route. */
  readonly stepId: string | undefined
  /** Submit: what was submitted. */
  readonly submission: StepSubmission | undefined
}

/**
 * The kernel's answer to a call: a decision value (`proceed`, `replay`, …,
 * `recorded`), `ok` for an empty success, or the error code.
 *
 * @since 0.1.0
 * @internal
 */
export interface CallAnswer {
  readonly answer: string
  /** The decision's `step_id`, when it has one. */
  readonly stepId: string | undefined
}

/**
 * Hooks around every call, used for crash, stall and fault injection and for
 * the call log. `before` runs before the kernel sees the call and returns an
 * id for `after`; it may fail with a transport error (the call never reaches
 * the kernel) or never return (the process died). `after` runs once the kernel
 * has answered; failing there means the answer was lost on the way back.
 *
 * @since 0.1.0
 * @internal
 */
export interface Interceptor {
  readonly before: (info: CallInfo) => Effect.Effect<number, KernelError>
  readonly after: (id: number, answer: CallAnswer) => Effect.Effect<void, KernelError>
}

/**
 * The answer of a core call, for the interceptor.
 *
 * @since 0.1.0
 * @internal
 */
export const answerOf = (exit: Exit.Exit<unknown, Core.KernelFailure>): CallAnswer => {
  if (Exit.isFailure(exit)) {
    const failure = exit.cause._tag === "Fail" ? exit.cause.error : undefined
    return { answer: failure === undefined ? "interrupted" : failure.code, stepId: undefined }
  }
  const value = exit.value as Partial<Core.Decision> | undefined
  if (value !== undefined && value !== null && typeof value === "object" && typeof value.decision === "string") {
    return { answer: value.decision, stepId: value.stepId }
  }
  return { answer: "ok", stepId: undefined }
}

const statusError = (f: Core.KernelFailure): KernelError =>
  new KernelError({ reason: "Status", status: f.status, code: f.code, description: f.message })

const signalOr = (f: Core.KernelFailure): LeaseSuperseded | Terminated | KernelError =>
  f.code === "lease_superseded"
    ? new LeaseSuperseded()
    : f.code === "execution_terminal"
    ? new Terminated()
    : statusError(f)

const leaseOr = (f: Core.KernelFailure): LeaseSuperseded | KernelError =>
  f.code === "lease_superseded" ? new LeaseSuperseded() : statusError(f)

/** Map kernel failures; injected transport errors pass through. */
const mapFailure = <E>(f: (failure: Core.KernelFailure) => E) => (e: Core.KernelFailure | KernelError): E | KernelError =>
  e instanceof KernelError ? e : f(e)

const parseRaw = (raw: string): unknown => JSON.parse(raw)

const toDecision = (d: Core.Decision): Protocol.StepDecision => {
  const out: {
    decision: string
    stepId?: string
    result?: unknown
    error?: unknown
    approvalId?: string
    reason?: string
  } = { decision: d.decision }
  if (d.stepId !== undefined) out.stepId = d.stepId
  if (d.resultRaw !== undefined) out.result = parseRaw(d.resultRaw)
  if (d.errorRaw !== undefined) out.error = parseRaw(d.errorRaw)
  if (d.approvalId !== undefined) out.approvalId = d.approvalId
  if (d.reason !== undefined && d.reason !== "") out.reason = d.reason
  return out
}

/**
 * Decode a core record through its exact wire encoding, so in-process callers
 * see precisely what an HTTP client would.
 *
 * @since 0.1.0
 * @internal
 */
export const fromWire = <A, I>(schema: Schema.Schema<A, I>, text: string): A =>
  Schema.decodeUnknownSync(schema)(JSON.parse(text))

const toExecution = (r: Core.ExecutionRecord): Protocol.Execution =>
  fromWire(Protocol.Execution, Wire.encodeExecution(r))

/**
 * Build the direct client.
 *
 * @since 0.1.0
 * @internal
 */
export const make = (
  core: Core.KernelCore,
  secret: string,
  interceptor: Interceptor
): KernelClient.Service => {
  const around = <A>(
    info: CallInfo,
    effect: Effect.Effect<A, Core.KernelFailure>
  ): Effect.Effect<A, Core.KernelFailure | KernelError> =>
    Effect.flatMap(interceptor.before(info), (id) =>
      Effect.flatMap(Effect.exit(effect), (exit) => Effect.zipRight(interceptor.after(id, answerOf(exit)), exit)))

  const info = (
    call: CallName,
    caller: { readonly agentId: string; readonly lease?: Lease | undefined },
    executionId: string,
    extra?: { readonly stepId?: string; readonly submission?: StepSubmission }
  ): CallInfo => ({
    call,
    agentId: caller.agentId,
    lease: caller.lease,
    executionId,
    stepId: extra?.stepId,
    submission: extra?.submission
  })

  const failStepJson: KernelClient.Service["failStepJson"] = (caller, executionId, stepId, errorJson) =>
    around(
      info("failStep", caller, executionId, { stepId }),
      core.failStep(executionId, stepId, caller.lease, errorJson)
    ).pipe(Effect.mapBoth({ onFailure: mapFailure(signalOr), onSuccess: toDecision }), Http.retryTransport)

  /** Complete / fail execution: `409 execution_terminal` means an earlier try (or a cancel) got there first. */
  const outcome = (
    info: CallInfo,
    effect: Effect.Effect<void, Core.KernelFailure>
  ): Effect.Effect<void, KernelError | LeaseSuperseded> =>
    around(info, effect).pipe(
      Effect.catchIf((f) => !(f instanceof KernelError) && f.code === "execution_terminal", () => Effect.void),
      Effect.mapError(mapFailure(leaseOr)),
      Http.retryTransport
    )

  return {
    secret: Redacted.make(secret),
    getExecution: (caller, executionId) =>
      around(info("getExecution", caller, executionId), core.getExecution(executionId)).pipe(
        Effect.mapBoth({ onFailure: mapFailure(statusError), onSuccess: toExecution }),
        Http.retryTransport
      ),
    // Never retried (PROTOCOL.md 15.1).
    submitStep: (caller: Caller, executionId, s) =>
      around(
        info("submitStep", caller, executionId, { submission: s }),
        core.submitStep(executionId, caller.lease, {
          kind: s.kind,
          target: s.target,
          argsRaw: s.argsJson,
          idempotency: s.idempotency
        })
      ).pipe(
        Effect.mapBoth({
          onFailure: mapFailure((f) => f.code === "policy_denied" ? new PolicyError({ reason: f.message }) : signalOr(f)),
          onSuccess: toDecision
        })
      ),
    completeStep: (caller, executionId, stepId, resultJson) =>
      around(
        info("completeStep", caller, executionId, { stepId }),
        core.completeStep(executionId, stepId, caller.lease, resultJson)
      ).pipe(Effect.mapBoth({ onFailure: mapFailure(signalOr), onSuccess: toDecision }), Http.retryTransport),
    failStep: (caller, executionId, stepId, message) => failStepJson(caller, executionId, stepId, JSON.stringify({ message })),
    failStepJson,
    publishDelta: (_caller, executionId, stepId, seq, data) => core.publishDelta(executionId, { stepId, seq, data }),
    // Not retried: the next beat is the retry (PROTOCOL.md 15.1).
    heartbeat: (caller, executionId) =>
      around(info("heartbeat", caller, executionId), core.heartbeat(executionId, caller.lease)).pipe(
        Effect.mapError(mapFailure(leaseOr))
      ),
    completeExecution: (caller, executionId, outputJson) =>
      outcome(info("completeExecution", caller, executionId), core.completeExecution(executionId, caller.lease, outputJson)),
    failExecution: (caller, executionId, reason) =>
      outcome(info("failExecution", caller, executionId), core.failExecution(executionId, caller.lease, reason))
  }
}
