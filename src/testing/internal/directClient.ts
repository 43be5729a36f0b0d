/**
 * A `KernelClient` that calls the embedded kernel's core directly: no bytes,
 * no signatures, the same decisions, errors and state. This is what makes the
 * test kit fast; `TestKernel.layer({ transport: "http" })` swaps in the real
 * HTTP client over in-process routes when a test wants the wire too.
 *
 * @since 0.1.0
 * @internal
 */
import { Effect, Redacted, Schema } from "effect"
import type * as Core from "../../kernel/Core.js"
import * as Wire from "../../kernel/Wire.js"
import type { Caller, KernelClient } from "../../KernelClient.js"
import * as Protocol from "../../Protocol.js"
import { KernelError, LeaseSuperseded, PolicyError, Terminated } from "../../RebunoError.js"

/**
 * Hooks around every call, used for crash injection: `before` runs before the
 * core sees the call, `after` once it has answered (successfully or not).
 *
 * @since 0.1.0
 * @internal
 */
export interface Interceptor {
  readonly before: (call: CallName, caller: Caller, executionId: string) => Effect.Effect<void>
  readonly after: (call: CallName, caller: Caller, executionId: string) => Effect.Effect<void>
}

/**
 * The intercepted calls.
 *
 * @since 0.1.0
 * @internal
 */
export type CallName =
  | "submitStep"
  | "completeStep"
  | "failStep"
  | "heartbeat"
  | "completeExecution"
  | "failExecution"

const statusError = (f: Core.KernelFailure): KernelError =>
  new KernelError({ reason: "Status", status: f.status, code: f.code, description: f.message })

const signalOr = (f: Core.KernelFailure): LeaseSuperseded | Terminated | KernelError =>
  f.code === "lease_superseded"
    ? new LeaseSuperseded()
    : f.code === "execution_terminal"
    ? new Terminated()
    : statusError(f)

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
  const around = <A, E>(
    call: CallName,
    caller: Caller,
    executionId: string,
    effect: Effect.Effect<A, E>
  ): Effect.Effect<A, E> =>
    Effect.zipRight(
      interceptor.before(call, caller, executionId),
      Effect.onExit(effect, () => interceptor.after(call, caller, executionId))
    )
  const failStepJson: KernelClient.Service["failStepJson"] = (caller, executionId, stepId, errorJson) =>
    around(
      "failStep",
      caller,
      executionId,
      core.failStep(executionId, stepId, caller.lease, errorJson).pipe(
        Effect.mapBoth({ onFailure: signalOr, onSuccess: toDecision })
      )
    )
  return {
    secret: Redacted.make(secret),
    getExecution: (_caller, executionId) =>
      core.getExecution(executionId).pipe(Effect.mapBoth({ onFailure: statusError, onSuccess: toExecution })),
    submitStep: (caller, executionId, s) =>
      around(
        "submitStep",
        caller,
        executionId,
        core.submitStep(executionId, caller.lease, {
          kind: s.kind,
          target: s.target,
          argsRaw: s.argsJson,
          idempotency: s.idempotency
        }).pipe(
          Effect.mapBoth({
            onFailure: (f) =>
              f.code === "policy_denied" ? new PolicyError({ reason: f.message }) : signalOr(f),
            onSuccess: toDecision
          })
        )
      ),
    completeStep: (caller, executionId, stepId, resultJson) =>
      around(
        "completeStep",
        caller,
        executionId,
        core.completeStep(executionId, stepId, caller.lease, resultJson).pipe(
          Effect.mapBoth({ onFailure: signalOr, onSuccess: toDecision })
        )
      ),
    failStep: (caller, executionId, stepId, message) => failStepJson(caller, executionId, stepId, JSON.stringify({ message })),
    failStepJson,
    publishDelta: (_caller, executionId, stepId, seq, data) => core.publishDelta(executionId, { stepId, seq, data }),
    heartbeat: (caller, executionId) =>
      around(
        "heartbeat",
        caller,
        executionId,
        core.heartbeat(executionId, caller.lease).pipe(
          Effect.mapError((f) => f.code === "lease_superseded" ? new LeaseSuperseded() : statusError(f))
        )
      ),
    completeExecution: (caller, executionId, outputJson) =>
      around(
        "completeExecution",
        caller,
        executionId,
        core.completeExecution(executionId, caller.lease, outputJson).pipe(
          Effect.catchIf((f) => f.code === "execution_terminal", () => Effect.void),
          Effect.mapError((f) => f.code === "lease_superseded" ? new LeaseSuperseded() : statusError(f))
        )
      ),
    failExecution: (caller, executionId, reason) =>
      around(
        "failExecution",
        caller,
        executionId,
        core.failExecution(executionId, caller.lease, reason).pipe(
          Effect.catchIf((f) => f.code === "execution_terminal", () => Effect.void),
          Effect.mapError((f) => f.code === "lease_superseded" ? new LeaseSuperseded() : statusError(f))
        )
      )
  }
}
