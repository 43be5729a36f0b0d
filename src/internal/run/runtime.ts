/**
 * Per-run state shared by the dispatch runtime, `Execution` and `Step`: the
 * run-scoped kernel client (which refuses every call once the run has stopped,
 * PROTOCOL.md 14.1), the suspension backstop (the first run signal raised
 * anywhere in the run, 14.3), the stop switch that interrupts the run when
 * its lease is lost or it is abandoned, and the lease clock that bounds the
 * retries of the run's outcome calls and heartbeat (issue 13).
 *
 * @since 0.1.0
 * @internal
 */
import { Clock, Deferred, Duration, Effect, Option, Ref } from "effect"
import type { Fiber } from "effect"
import { OutcomeRetry } from "../../KernelClient.js"
import type { Caller, CheckpointRecords, KernelClient, OutcomeRetrySettings } from "../../KernelClient.js"
import type * as Protocol from "../../Protocol.js"
import { Abandoned, LeaseSuperseded, Terminated } from "../../RebunoError.js"
import { CurrentRetryBudget } from "../http/exchange.js"
import type { RetryBudget } from "../http/exchange.js"
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
    error: StepFailureRecord,
    records?: CheckpointRecords | undefined
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
    /** The run's lease: a submit renews it; a step outcome retries within its budget. */
    readonly lease?: LeaseClock | undefined
  } | undefined
}

/**
 * What a run knows of its lease (PROTOCOL.md 5.7): its timeout and the latest
 * instant it may have been renewed at — the delivery, then every answered
 * submit and heartbeat (RENEW calls). It cannot be valid after
 * `renewedAt() + timeoutMillis`; the retry budget of the run's outcome calls
 * and heartbeat ends there (issue 13).
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export interface LeaseClock {
  readonly timeoutMillis: number
  /** Epoch milliseconds, on the run's `Clock`. */
  readonly renewedAt: () => number
  /** Record a renewal answered at `nowMillis`. */
  readonly renewed: (nowMillis: number) => void
  /** The retry budget of the run's outcome calls. */
  readonly budget: RetryBudget
}

/**
 * The lease timeout assumed when the webhook does not tell it (v0.14.0
 * kernels): the kernel's default, 120 s (PROTOCOL.md 5.7).
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const defaultLeaseTimeoutMillis = 120_000

const millisOf = (input: Duration.Input): number => Duration.toMillis(Duration.fromInputUnsafe(input))

/**
 * A run's lease clock, renewed now (at delivery).
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const makeLeaseClock = (
  nowMillis: number,
  leaseTimeoutSeconds: number | undefined,
  settings: OutcomeRetrySettings
): LeaseClock => {
  const timeoutMillis = leaseTimeoutSeconds !== undefined && leaseTimeoutSeconds > 0
    ? leaseTimeoutSeconds * 1_000
    : defaultLeaseTimeoutMillis
  const baseMillis = Math.max(1, millisOf(settings.baseDelay))
  const capMillis = Math.max(baseMillis, millisOf(settings.maxDelay))
  const maxElapsedMillis = settings.maxElapsed === undefined ? timeoutMillis : Math.max(0, millisOf(settings.maxElapsed))
  let renewedAt = nowMillis
  return {
    timeoutMillis,
    renewedAt: () => renewedAt,
    renewed: (now) => {
      if (now > renewedAt) renewedAt = now
    },
    budget: {
      baseMillis,
      capMillis,
      deadline: (firstFailure) => Math.min(renewedAt + timeoutMillis, firstFailure + maxElapsedMillis)
    }
  }
}

/**
 * Run `call` within the lease's retry budget: its transport failures are
 * retried while the lease can still be valid (see `retryTransport`).
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const withinLease = <A, E, R>(lease: LeaseClock | undefined, call: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  lease === undefined ? call : Effect.provideService(call, CurrentRetryBudget, lease.budget)

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
  /** The tag of an undeclared tagged error (`message` starts with it too). */
  readonly _tag?: string
  /** The attempt (from 1) of a step with a `retry` schedule. */
  readonly attempt?: number
  /** When the schedule retries the step: the epoch milliseconds of the next attempt. */
  readonly retry_at_ms?: number
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
  /**
   * The run's lease: its timeout, its last renewal, and the retry budget of
   * the outcome calls and the heartbeat.
   *
   * @since 0.2.0
   */
  readonly lease: LeaseClock
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
  executionId: string,
  options?: {
    /** From the webhook; the kernel default (120 s) when absent. */
    readonly leaseTimeoutSeconds?: number | undefined
    /** The outage retry settings; the fiber's `KernelClient.OutcomeRetry` when absent. */
    readonly retry?: OutcomeRetrySettings | undefined
  }
): Effect.fn.Return<RunState> {
  const lease = makeLeaseClock(
    yield* Clock.currentTimeMillis,
    options?.leaseTimeoutSeconds,
    options?.retry ?? (yield* OutcomeRetry)
  )
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
  const client = scopedClient(kernel, () => isStopped, raise, lease)
  const attach = (running: Fiber.Fiber<unknown, unknown>): void => {
    fiber = running
    if (isStopped) interruptRun()
  }
  return {
    executionId,
    caller,
    client,
    signal,
    stopped,
    raise,
    close,
    finishing,
    attach,
    suspension: Suspension.make(),
    lease
  }
})

const isSignalError = (e: unknown): e is LeaseSuperseded | Terminated =>
  e instanceof LeaseSuperseded || e instanceof Terminated

/**
 * Wrap the kernel client: refuse once stopped (without sending anything),
 * record the signals that the kernel answers (`lease_superseded`,
 * `execution_terminal`) on the run, and retry the outcome calls within the
 * lease's budget.
 */
const scopedClient = (
  kernel: KernelClient.Service,
  isStopped: () => boolean,
  raise: (signal: RunSignal) => Effect.Effect<void>,
  lease: LeaseClock
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
  /** An outcome call: guarded, and retried while the lease can be valid. */
  const outcome = <A, E, R>(call: () => Effect.Effect<A, E, R>): Effect.Effect<A, E | LeaseSuperseded, R> =>
    withinLease(lease, guard(call))
  const { bindResource, getStep, previous, publishCheckpoints, publishMetadata, registerResource, suspend } = kernel
  return {
    secret: kernel.secret,
    unguarded: { isStopped, kernel, lease },
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
    completeStep: (caller, executionId, stepId, resultJson, records) =>
      outcome(() =>
        records === undefined
          ? kernel.completeStep(caller, executionId, stepId, resultJson)
          : kernel.completeStep(caller, executionId, stepId, resultJson, records)
      ),
    failStep: (caller, executionId, stepId, message) =>
      outcome(() => kernel.failStep(caller, executionId, stepId, message)),
    failStepJson: (caller, executionId, stepId, errorJson, records) =>
      outcome(() =>
        records === undefined
          ? kernel.failStepJson(caller, executionId, stepId, errorJson)
          : kernel.failStepJson(caller, executionId, stepId, errorJson, records)
      ),
    failStepWith: (caller, executionId, stepId, error, records) =>
      outcome(() => {
        const json = stringifyStrict(error)
        // With captures (PROTOCOL-CURRENT C.6.5) the error goes as JSON, `message` only when it is not JSON.
        if (records !== undefined) {
          const errorJson = json._tag === "Ok" ? json.json : JSON.stringify({ message: error.message })
          return kernel.failStepJson(caller, executionId, stepId, errorJson, records)
        }
        return json._tag === "Ok"
          ? kernel.failStepJson(caller, executionId, stepId, json.json)
          : kernel.failStep(caller, executionId, stepId, error.message)
      }),
    publishDelta: (caller, executionId, stepId, seq, data) =>
      Effect.suspend(() => isStopped() ? Effect.void : kernel.publishDelta(caller, executionId, stepId, seq, data)),
    // PROTOCOL-CURRENT C.6.2–C.6.6: lease-fenced; the clients retry them on transport failures.
    registerResource: registerResource === undefined
      ? undefined
      : (caller, executionId, registration) => guard(() => registerResource(caller, executionId, registration)),
    bindResource: bindResource === undefined
      ? undefined
      : (caller, executionId, key, bindingJson) => guard(() => bindResource(caller, executionId, key, bindingJson)),
    publishCheckpoints: publishCheckpoints === undefined
      ? undefined
      : (caller, executionId, records) => guard(() => publishCheckpoints(caller, executionId, records)),
    // The heartbeat loop decides itself what a lease_superseded answer means (5.8).
    heartbeat: (caller, executionId) => guard(() => kernel.heartbeat(caller, executionId), false),
    completeExecution: (caller, executionId, outputJson, stateJson) =>
      outcome(() =>
        stateJson === undefined ?
          kernel.completeExecution(caller, executionId, outputJson) :
          kernel.completeExecution(caller, executionId, outputJson, stateJson)
      ),
    failExecution: (caller, executionId, reason) => outcome(() => kernel.failExecution(caller, executionId, reason))
  }
}
