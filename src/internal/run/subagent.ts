/**
 * The subagent call of PROTOCOL-CURRENT C.5 as a durable step: a `tool_call`
 * step whose body creates the child execution bound to it (`spawned_by`),
 * then suspends the run once every step in flight waits (C.5.4 #2) and either
 * ends the run quietly (`suspended: true`) or reads the step the child has
 * already settled (`suspended: false`). On replay the step's recorded outcome
 * is the child's: its output, or the kernel's error
 * `{"execution_id","failure_reason","reason":"subagent_failed"|"subagent_cancelled"}`.
 *
 * @since 0.2.0
 * @internal
 */
import { Effect } from "effect"
import type * as Client from "../../Client.js"
import type { Execution } from "../../Execution.js"
import type * as Protocol from "../../Protocol.js"
import {
  Abandoned,
  Blocked,
  DecodeError,
  KernelError,
  LeaseSuperseded,
  StepDecodeError,
  SubagentError,
  Terminated,
  ToolError
} from "../../RebunoError.js"
import { isTransportFailure } from "../http/exchange.js"
import { describeRecordedError } from "./failureReason.js"
import { inFlight, recordFailure, signal, submit } from "./run.js"
import * as Resources from "./resources.js"
import type { StepError } from "./run.js"

/**
 * One subagent call.
 *
 * @since 0.2.0
 * @internal
 */
export interface Call<O> {
  /** The child's agent id. */
  readonly agentId: string
  /** The step's target (the child's agent id unless renamed). */
  readonly target: string
  /** The encoded input: the step's `args` and the child's `input`. */
  readonly input: unknown
  /** The child's session label, if any (never the parent's, C.5.1). */
  readonly session: string | undefined
  /** Decode the child's output (replayed or read). */
  readonly decode: (output: unknown) => Effect.Effect<O, StepDecodeError>
}

const SUBAGENT_REASONS: ReadonlySet<unknown> = new Set(["subagent_failed", "subagent_cancelled"])

const missing = (what: string) =>
  Effect.die(new Error(`the KernelClient in use cannot run subagents (it has no \`${what}\` call)`))

/**
 * The error a step recorded for a failed or cancelled child (C.5.3) as a
 * `SubagentError`; any other recorded error as the `ToolError` every step
 * raises for it.
 */
const recordedFailure = (
  agentId: string,
  target: string,
  stepId: string,
  error: unknown
): SubagentError | ToolError => {
  if (typeof error === "object" && error !== null && SUBAGENT_REASONS.has((error as { reason?: unknown }).reason)) {
    const e = error as { readonly reason: string; readonly execution_id?: unknown; readonly failure_reason?: unknown }
    return new SubagentError({
      agentId,
      executionId: typeof e.execution_id === "string" ? e.execution_id : "",
      reason: e.reason,
      failureReason: typeof e.failure_reason === "string" ? e.failure_reason : "",
      target,
      stepId
    })
  }
  return new ToolError({
    toolId: target,
    stepId,
    error,
    retryable: false,
    text: `${target}: ${describeRecordedError(error)}`
  })
}

/** A settled step's outcome: its result decoded, or its error. */
const outcome = <O>(
  call: Call<O>,
  stepId: string,
  result: unknown,
  error: unknown
): Effect.Effect<O, SubagentError | ToolError | StepDecodeError> =>
  error !== undefined && error !== null
    ? Effect.fail(recordedFailure(call.agentId, call.target, stepId, error))
    : call.decode(result === undefined ? null : result)

/** The step as read after `suspended: false` (C.5.4 #4): it must be settled by now. */
const settledStep = <O>(
  call: Call<O>,
  step: Protocol.Step
): Effect.Effect<O, SubagentError | ToolError | StepDecodeError | KernelError> => {
  switch (step.status) {
    case "succeeded":
    case "failed":
    case "denied":
    case "cancelled":
      return outcome(call, step.stepId, step.result, step.status === "succeeded" ? undefined : (step.error ?? {}))
    default:
      return Effect.fail(
        new KernelError({
          reason: new DecodeError({
            description: `subagent step ${step.stepId} is ${step.status} although the execution did not suspend`
          })
        })
      )
  }
}

/**
 * Run the subagent call as a step of the running execution.
 *
 * @since 0.2.0
 * @internal
 */
export const run = <O>(
  execution: Execution.Service,
  client: Client.Client.Service,
  call: Call<O>
): Effect.Effect<O, StepError | SubagentError> => {
  const submitted = submit(execution, { kind: "tool_call", target: call.target, args: call.input, idempotency: "safe_to_retry" })
  const step = Effect.flatMap(
    // Its start must not fall inside another step's body and capture (PROTOCOL-CURRENT C.6.8 #4);
    // the wait for the child holds nothing.
    Resources.isEnabled() ? Resources.exclusive(submitted) : submitted,
    (admission): Effect.Effect<O, StepError | SubagentError> =>
      admission._tag === "Replay"
        ? outcome(call, admission.stepId, admission.result, admission.error)
        : proceed(execution, client, call, admission.stepId)
  )
  const suspension = execution.suspension
  return suspension === undefined ? step : inFlight(suspension, step)
}

const proceed = <O>(
  execution: Execution.Service,
  client: Client.Client.Service,
  call: Call<O>,
  stepId: string
): Effect.Effect<O, StepError | SubagentError> => {
  const { kernel } = execution
  const suspend = kernel.suspend
  const getStep = kernel.getStep
  if (suspend === undefined) return missing("suspend")
  if (getStep === undefined) return missing("getStep")
  const created = client.create(call.agentId, call.input, {
    spawnedBy: { executionId: execution.executionId, stepId },
    ...(call.session === undefined ? {} : { session: call.session })
  }).pipe(
    Effect.catch((error): Effect.Effect<never, StepError> =>
      error._tag === "KernelError" && isTransportFailure(error)
        // The child may exist: let the kernel redeliver; the create is idempotent on the step (C.5.1).
        ? signal(execution, new Abandoned({ reason: `cannot create the subagent execution: ${error.message}` }))
        : recordFailure(execution, call.target, stepId, `cannot start subagent ${call.agentId}: ${error.message}`)
    )
  )
  const suspendOnce = suspend(execution.caller, execution.executionId)
  const suspended = (execution.suspension === undefined ? suspendOnce : execution.suspension.await(suspendOnce)).pipe(
    Effect.catch((error): Effect.Effect<never, StepError> => {
      // C.5.4 #5: every waiting call gets the answer of the one suspend.
      if (error instanceof LeaseSuperseded || error instanceof Terminated) return signal(execution, error)
      if (isTransportFailure(error)) {
        return signal(execution, new Abandoned({ reason: `suspend failed: ${error.message}` }))
      }
      return recordFailure(execution, call.target, stepId, `cannot suspend for subagent ${call.agentId}: ${error.message}`)
    })
  )
  return created.pipe(
    Effect.andThen(suspended),
    Effect.flatMap((isSuspended): Effect.Effect<O, StepError | SubagentError> =>
      isSuspended
        ? signal(execution, new Blocked({ stepId, reason: "awaiting_steps" }))
        : getStep({ agentId: execution.agentId }, execution.executionId, stepId).pipe(
          Effect.catch((error): Effect.Effect<never, StepError> =>
            error._tag === "KernelError" && isTransportFailure(error)
              ? signal(execution, new Abandoned({ reason: `cannot read the subagent step: ${error.message}` }))
              : Effect.fail(error)
          ),
          Effect.flatMap((read) => settledStep(call, read))
        )
    )
  )
}
