/**
 * Per-run state shared by the dispatch runtime, `Execution` and `Step`: the
 * run-scoped kernel client (which refuses every call once the run has stopped,
 * PROTOCOL.md 14.1), the suspension backstop (the first run signal raised
 * anywhere in the run, 14.3) and the stop switch that interrupts the run when
 * its lease is lost or it is abandoned.
 *
 * @since 0.1.0
 * @internal
 */
import { Deferred, Effect, Option, Ref } from "effect"
import type { Fiber } from "effect"
import type { Caller, KernelClient } from "../../KernelClient.js"
import type * as Protocol from "../../Protocol.js"
import { Abandoned, LeaseSuperseded, Terminated } from "../../RebunoError.js"
import { stringifyStrict } from "../wire/json.js"
import * as Suspension from "./suspension.js"
import type { KernelError, RunSignal } from "../../RebunoError.js"

/**
 * The kernel client of one run: the process-wide client, except that every call
 * (reads included) is refused with LeaseSuperseded once the run has stopped.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export interface RunClient extends Omit<KernelClient.Service, "getExecution" | "previous" | "getStep"> {
  readonly getExecution: (
    caller: { readonly agentId: string },
    executionId: string
  ) => Effect.Effect<Protocol.Execution, KernelError | LeaseSuperseded>
  readonly previous?:
    | ((caller: { readonly agentId: string }, executionId: string) => Effect.Effect<unknown, KernelError | LeaseSuperseded>)
    | undefined
  readonly getStep?:
    | ((
      caller: { readonly agentId: string },
      executionId: string,
      stepId: string
    ) => Effect.Effect<Protocol.Step, KernelError | LeaseSuperseded>)
    | undefined
  /**
   * Fail a step with a whole error object (`{"message":…}` plus, for typed
   * failures, `"failure":…`); only `message` is recorded when the failure does
   * not encode to JSON.
   */
  readonly failStepWith: (
    caller: Caller,
    executionId: string,
    stepId: string,
    error: StepFailureRecord
  ) => Effect.Effect<Protocol.StepDecision, KernelError | LeaseSuperseded | Terminated>
  /**
   * The step path's way around the guard: whether the run has stopped, and the
   * process-wide client. A caller using it refuses calls itself once stopped and
   * records the signals the kernel answers (absent on clients built elsewhere).
   *
   * @internal
   */
  readonly unguarded?: {
    readonly isStopped: () => boolean
    readonly kernel: KernelClient.Service
  } | undefined
}

/**
 * The error object recorded for a failed step.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export interface StepFailureRecord {
  readonly message: string
  readonly failure?: unknown
}

/**
 * The mutable state of one run.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export interface RunState {
  readonly executionId: string
  readonly caller: Caller
  /** The kernel client of this run: refuses every call with LeaseSuperseded once stopped. */
  readonly client: RunClient
  /** The suspension backstop: the first signal raised anywhere in the run. */
  readonly signal: Ref.Ref<Option.Option<RunSignal>>
  /** Completed when the run must stop (lease lost, abandoned, superseded, or finished). */
  readonly stopped: Deferred.Deferred<void>
  /** Record a signal; LeaseSuperseded and Abandoned also stop the run at once. */
  readonly raise: (signal: RunSignal) => Effect.Effect<void>
  /** Stop the run without recording anything (the run is over). */
  readonly close: Effect.Effect<void>
  /**
   * The fiber running the run: a signal that stops the run (LeaseSuperseded,
   * Abandoned) interrupts it — at once if the run has already stopped.
   */
  readonly attach: (fiber: Fiber.Fiber<unknown, unknown>) => void
  /** Set once the run has started posting its outcome (heartbeat answers then no longer stop it). */
  readonly finishing: Ref.Ref<boolean>
  /** The steps in flight, for a subagent's suspension (PROTOCOL-CURRENT C.5.4). */
  readonly suspension: Suspension.Suspension
}

const stopsTheRun = (signal: RunSignal): boolean => signal instanceof LeaseSuperseded || signal instanceof Abandoned

/**
 * Create the state of a run over the process-wide kernel client.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const makeRunState = Effect.fnUntraced(function*(
  kernel: KernelClient.Service,
  caller: Caller,
  executionId: string
): Effect.fn.Return<RunState> {
  const signal = yield* Ref.make<Option.Option<RunSignal>>(Option.none())
  const stopped = yield* Deferred.make<void>()
  const finishing = yield* Ref.make(false)
  // Mirrors `stopped` (completed only here), so that each call checks it without an Effect.
  let isStopped = false
  let fiber: Fiber.Fiber<unknown, unknown> | undefined
  const close = Effect.suspend(() => {
    isStopped = true
    return Effect.asVoid(Deferred.succeed(stopped, undefined))
  })
  // Interrupting the run's fiber (not racing it against `stopped`) keeps a run to two fibers.
  const interruptRun = (): void => fiber?.interruptUnsafe()
  const stop = Effect.andThen(close, Effect.sync(interruptRun))
  const raise = (s: RunSignal): Effect.Effect<void> =>
    Effect.andThen(
      Ref.update(signal, (current) => Option.isNone(current) ? Option.some(s) : current),
      stopsTheRun(s) ? stop : Effect.void
    )
  const client = scopedClient(kernel, () => isStopped, raise)
  const attach = (running: Fiber.Fiber<unknown, unknown>): void => {
    fiber = running
    if (isStopped) interruptRun()
  }
  return { executionId, caller, client, signal, stopped, raise, close, finishing, attach, suspension: Suspension.make() }
})

const isSignalError = (e: unknown): e is LeaseSuperseded | Terminated =>
  e instanceof LeaseSuperseded || e instanceof Terminated

/**
 * Wrap the kernel client: refuse once stopped (without sending anything) and
 * record the signals that the kernel answers (`lease_superseded`,
 * `execution_terminal`) on the run.
 */
const scopedClient = (
  kernel: KernelClient.Service,
  isStopped: () => boolean,
  raise: (signal: RunSignal) => Effect.Effect<void>
): RunClient => {
  const recordSignal = (e: unknown) => isSignalError(e) ? raise(e) : Effect.void
  const guard = <A, E, R>(
    call: () => Effect.Effect<A, E, R>,
    record = true
  ): Effect.Effect<A, E | LeaseSuperseded, R> =>
    Effect.suspend((): Effect.Effect<A, E | LeaseSuperseded, R> =>
      isStopped()
        ? Effect.fail(new LeaseSuperseded())
        : record
        ? Effect.tapError(call(), recordSignal)
        : call()
    )
  const { getStep, previous, publishMetadata, suspend } = kernel
  return {
    secret: kernel.secret,
    unguarded: { isStopped, kernel },
    signingScheme: kernel.signingScheme,
    observeWebhook: kernel.observeWebhook,
    getExecution: (caller, executionId) => guard(() => kernel.getExecution(caller, executionId)),
    previous: previous === undefined ? undefined : (caller, executionId) => guard(() => previous(caller, executionId)),
    getStep: getStep === undefined ?
      undefined :
      (caller, executionId, stepId) => guard(() => getStep(caller, executionId, stepId)),
    suspend: suspend === undefined ? undefined : (caller, executionId) => guard(() => suspend(caller, executionId)),
    publishMetadata,
    submitStep: (caller, executionId, submission) => guard(() => kernel.submitStep(caller, executionId, submission)),
    completeStep: (caller, executionId, stepId, resultJson) =>
      guard(() => kernel.completeStep(caller, executionId, stepId, resultJson)),
    failStep: (caller, executionId, stepId, message) =>
      guard(() => kernel.failStep(caller, executionId, stepId, message)),
    failStepJson: (caller, executionId, stepId, errorJson) =>
      guard(() => kernel.failStepJson(caller, executionId, stepId, errorJson)),
    failStepWith: (caller, executionId, stepId, error) =>
      guard(() => {
        const json = stringifyStrict(error)
        return json._tag === "Ok"
          ? kernel.failStepJson(caller, executionId, stepId, json.json)
          : kernel.failStep(caller, executionId, stepId, error.message)
      }),
    publishDelta: (caller, executionId, stepId, seq, data) =>
      Effect.suspend(() => isStopped() ? Effect.void : kernel.publishDelta(caller, executionId, stepId, seq, data)),
    // The heartbeat loop decides itself what a lease_superseded answer means (5.8).
    heartbeat: (caller, executionId) => guard(() => kernel.heartbeat(caller, executionId), false),
    completeExecution: (caller, executionId, outputJson, stateJson) =>
      guard(() =>
        stateJson === undefined ?
          kernel.completeExecution(caller, executionId, outputJson) :
          kernel.completeExecution(caller, executionId, outputJson, stateJson)
      ),
    failExecution: (caller, executionId, reason) => guard(() => kernel.failExecution(caller, executionId, reason))
  }
}
