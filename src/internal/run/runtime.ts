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
import type { Caller, CheckpointRecords, KernelClient, OutcomeRetrySettings, StepSubmission } from "../../KernelClient.js"
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
  return new Lease(nowMillis, timeoutMillis, baseMillis, capMillis, maxElapsedMillis)
}

/**
 * A lease clock that is its own retry budget: one object per run, its methods
 * on the prototype (10,000 runs in flight each hold one).
 */
class Lease implements LeaseClock, RetryBudget {
  constructor(
    private renewedAtMillis: number,
    readonly timeoutMillis: number,
    readonly baseMillis: number,
    readonly capMillis: number,
    private readonly maxElapsedMillis: number
  ) {}
  get budget(): RetryBudget {
    return this
  }
  renewedAt(): number {
    return this.renewedAtMillis
  }
  renewed(nowMillis: number): void {
    if (nowMillis > this.renewedAtMillis) this.renewedAtMillis = nowMillis
  }
  deadline(firstFailureMillis: number): number {
    return Math.min(this.renewedAtMillis + this.timeoutMillis, firstFailureMillis + this.maxElapsedMillis)
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
export const makeRunState = (
  kernel: KernelClient.Service,
  caller: Caller,
  executionId: string,
  options?: {
    /** From the webhook; the kernel default (120 s) when absent. */
    readonly leaseTimeoutSeconds?: number | undefined
    /** The outage retry settings; the fiber's `KernelClient.OutcomeRetry` when absent. */
    readonly retry?: OutcomeRetrySettings | undefined
  }
): Effect.Effect<RunState> =>
  Effect.withFiber((fiber) =>
    Effect.succeed(
      new Run(
        kernel,
        caller,
        executionId,
        makeLeaseClock(
          fiber.getRef(Clock.Clock).currentTimeMillisUnsafe(),
          options?.leaseTimeoutSeconds,
          options?.retry ?? fiber.getRef(OutcomeRetry)
        )
      )
    )
  )

/**
 * The state of one run. A run in flight holds one of these (plus its client)
 * for as long as it is parked, so the bookkeeping lives in fields and
 * prototype methods rather than in a closure per operation.
 */
class Run implements RunState {
  readonly signal: Ref.Ref<Option.Option<RunSignal>> = Ref.makeUnsafe(Option.none())
  readonly stopped: Deferred.Deferred<void> = Deferred.makeUnsafe<void>()
  readonly finishing: Ref.Ref<boolean> = Ref.makeUnsafe(false)
  readonly suspension: Suspension.Suspension = Suspension.make()
  readonly client: RunClient
  /** Mirrors `stopped` (completed only by `close`), so that each call checks it without an Effect. */
  isStopped = false
  private fiber: Fiber.Fiber<unknown, unknown> | undefined = undefined

  constructor(
    kernel: KernelClient.Service,
    readonly caller: Caller,
    readonly executionId: string,
    readonly lease: LeaseClock
  ) {
    this.client = new GuardedClient(kernel, this)
  }

  /** Bound: `Execution` hands it out as a plain function. */
  readonly raise = (s: RunSignal): Effect.Effect<void> =>
    Effect.suspend(() => {
      const ref = this.signal.ref
      if (Option.isNone(ref.current)) ref.current = Option.some(s)
      return stopsTheRun(s) ? this.stop() : Effect.void
    })

  get close(): Effect.Effect<void> {
    return Effect.suspend(() => {
      this.isStopped = true
      return Effect.asVoid(Deferred.succeed(this.stopped, undefined))
    })
  }

  attach(running: Fiber.Fiber<unknown, unknown>): void {
    this.fiber = running
    if (this.isStopped) running.interruptUnsafe()
  }

  /** Interrupting the run's fiber (not racing it against `stopped`) keeps a run to one fiber. */
  private stop(): Effect.Effect<void> {
    return Effect.andThen(
      this.close,
      Effect.sync(() => this.fiber?.interruptUnsafe())
    )
  }
}

const isSignalError = (e: unknown): e is LeaseSuperseded | Terminated =>
  e instanceof LeaseSuperseded || e instanceof Terminated

/**
 * The kernel client of a run: refuses once the run has stopped (without
 * sending anything), records the signals that the kernel answers
 * (`lease_superseded`, `execution_terminal`) on the run, and retries the
 * outcome calls within the lease's budget. The calls a run rarely makes
 * (`previous`, `getStep`, `suspend`, the resource routes) are getters that
 * build their function when asked for, so that a parked run holds none.
 */
class GuardedClient implements RunClient {
  readonly secret: KernelClient.Service["secret"]
  readonly signingScheme: KernelClient.Service["signingScheme"]
  readonly observeWebhook: KernelClient.Service["observeWebhook"]
  readonly publishMetadata: KernelClient.Service["publishMetadata"]
  readonly unguarded: NonNullable<RunClient["unguarded"]>

  constructor(private readonly kernel: KernelClient.Service, private readonly run: Run) {
    this.secret = kernel.secret
    this.signingScheme = kernel.signingScheme
    this.observeWebhook = kernel.observeWebhook
    this.publishMetadata = kernel.publishMetadata
    this.unguarded = { isStopped: () => run.isStopped, kernel, lease: run.lease }
  }

  private guard<A, E, R>(call: () => Effect.Effect<A, E, R>, record = true): Effect.Effect<A, E | LeaseSuperseded, R> {
    return Effect.suspend((): Effect.Effect<A, E | LeaseSuperseded, R> =>
      this.run.isStopped
        ? Effect.fail(new LeaseSuperseded())
        : record
        ? Effect.tapError(call(), (e) => isSignalError(e) ? this.run.raise(e) : Effect.void)
        : call()
    )
  }

  /** An outcome call: guarded, and retried while the lease can be valid. */
  private outcome<A, E, R>(call: () => Effect.Effect<A, E, R>): Effect.Effect<A, E | LeaseSuperseded, R> {
    return withinLease(this.run.lease, this.guard(call))
  }

  getExecution(caller: { readonly agentId: string }, executionId: string) {
    return this.guard(() => this.kernel.getExecution(caller, executionId))
  }

  get previous(): RunClient["previous"] {
    const previous = this.kernel.previous
    return previous === undefined ? undefined : (caller, executionId) => this.guard(() => previous(caller, executionId))
  }

  get getStep(): RunClient["getStep"] {
    const getStep = this.kernel.getStep
    return getStep === undefined
      ? undefined
      : (caller, executionId, stepId) => this.guard(() => getStep(caller, executionId, stepId))
  }

  get suspend(): RunClient["suspend"] {
    const suspend = this.kernel.suspend
    return suspend === undefined ? undefined : (caller, executionId) => this.guard(() => suspend(caller, executionId))
  }

  submitStep(caller: Caller, executionId: string, submission: StepSubmission) {
    return this.guard(() => this.kernel.submitStep(caller, executionId, submission))
  }

  completeStep(caller: Caller, executionId: string, stepId: string, resultJson: string, records?: CheckpointRecords) {
    return this.outcome(() =>
      records === undefined
        ? this.kernel.completeStep(caller, executionId, stepId, resultJson)
        : this.kernel.completeStep(caller, executionId, stepId, resultJson, records)
    )
  }

  failStep(caller: Caller, executionId: string, stepId: string, message: string) {
    return this.outcome(() => this.kernel.failStep(caller, executionId, stepId, message))
  }

  failStepJson(caller: Caller, executionId: string, stepId: string, errorJson: string, records?: CheckpointRecords) {
    return this.outcome(() =>
      records === undefined
        ? this.kernel.failStepJson(caller, executionId, stepId, errorJson)
        : this.kernel.failStepJson(caller, executionId, stepId, errorJson, records)
    )
  }

  failStepWith(
    caller: Caller,
    executionId: string,
    stepId: string,
    error: StepFailureRecord,
    records?: CheckpointRecords | undefined
  ) {
    return this.outcome(() => {
      const json = stringifyStrict(error)
      // With captures (PROTOCOL-CURRENT C.6.5) the error goes as JSON, `message` only when it is not JSON.
      if (records !== undefined) {
        const errorJson = json._tag === "Ok" ? json.json : JSON.stringify({ message: error.message })
        return this.kernel.failStepJson(caller, executionId, stepId, errorJson, records)
      }
      return json._tag === "Ok"
        ? this.kernel.failStepJson(caller, executionId, stepId, json.json)
        : this.kernel.failStep(caller, executionId, stepId, error.message)
    })
  }

  publishDelta(caller: Caller, executionId: string, stepId: string, seq: number, data: string) {
    return Effect.suspend(() =>
      this.run.isStopped ? Effect.void : this.kernel.publishDelta(caller, executionId, stepId, seq, data)
    )
  }

  // PROTOCOL-CURRENT C.6.2–C.6.6: lease-fenced; the clients retry them on transport failures.
  get registerResource(): RunClient["registerResource"] {
    const registerResource = this.kernel.registerResource
    return registerResource === undefined
      ? undefined
      : (caller, executionId, registration) => this.guard(() => registerResource(caller, executionId, registration))
  }

  get bindResource(): RunClient["bindResource"] {
    const bindResource = this.kernel.bindResource
    return bindResource === undefined
      ? undefined
      : (caller, executionId, key, bindingJson) => this.guard(() => bindResource(caller, executionId, key, bindingJson))
  }

  get publishCheckpoints(): RunClient["publishCheckpoints"] {
    const publishCheckpoints = this.kernel.publishCheckpoints
    return publishCheckpoints === undefined
      ? undefined
      : (caller, executionId, records) => this.guard(() => publishCheckpoints(caller, executionId, records))
  }

  /** The heartbeat loop decides itself what a lease_superseded answer means (5.8). */
  heartbeat(caller: Caller, executionId: string) {
    return this.guard(() => this.kernel.heartbeat(caller, executionId), false)
  }

  completeExecution(caller: Caller, executionId: string, outputJson?: string, stateJson?: string) {
    return this.outcome(() =>
      stateJson === undefined
        ? this.kernel.completeExecution(caller, executionId, outputJson)
        : this.kernel.completeExecution(caller, executionId, outputJson, stateJson)
    )
  }

  failExecution(caller: Caller, executionId: string, reason: string) {
    return this.outcome(() => this.kernel.failExecution(caller, executionId, reason))
  }
}
