/**
 * The execution context of one run: which execution, dispatch and attempt the
 * handler is working for, its raw input, and the per-run machinery that steps
 * need (the run-scoped kernel client, the suspension backstop and the stop
 * switch). The dispatch runtime of `Agent` provides it for every webhook it
 * accepts; anything that records a step requires `Execution` in its context, so
 * calling a tool outside a running execution is a type error rather than a
 * runtime surprise.
 *
 * @since 0.1.0
 */
import { Context, Effect, Layer, Option, Ref } from "effect"
import type { Deferred } from "effect"
import { KernelClient } from "./KernelClient.js"
import type { Caller } from "./KernelClient.js"
import type { RunSignal } from "./RebunoError.js"
import { makeRunState } from "./internal/run/runtime.js"
import type { RunClient, RunState } from "./internal/run/runtime.js"
import type { Suspension } from "./internal/run/suspension.js"

/**
 * @since 0.1.0
 * @category models
 */
export declare namespace Execution {
  /**
   * @since 0.1.0
   * @category models
   */
  export interface Service {
    /** The execution being run. */
    readonly executionId: string
    /** The agent this process serves. */
    readonly agentId: string
    /** The dispatch this run was delivered for. */
    readonly dispatchId: string
    /** The delivery attempt (`undefined` when a v0.14.0 kernel did not send one). */
    readonly dispatchAttempt: number | undefined
    /** The lease timeout announced by the webhook, in seconds (`undefined` when absent). */
    readonly leaseTimeoutSeconds: number | undefined
    /** The raw execution input, as JSON (before any input schema). */
    readonly input: unknown
    /** The agent id plus this run's lease, sent with every kernel call. */
    readonly caller: Caller
    /**
     * The kernel client of this run. It refuses every call with
     * `LeaseSuperseded`, without sending anything, once the run has stopped.
     */
    readonly kernel: RunClient
    /** The suspension backstop: the first run signal raised anywhere in the run. */
    readonly signal: Ref.Ref<Option.Option<RunSignal>>
    /**
     * Record a run signal. `LeaseSuperseded` and `Abandoned` also stop the run
     * at once (its handler is interrupted and its client refuses further calls).
     */
    readonly raise: (signal: RunSignal) => Effect.Effect<void>
    /** Completed when the run has been told to stop. */
    readonly stopped: Deferred.Deferred<void>
    /**
     * The run's steps in flight, for the suspension of subagent calls
     * (PROTOCOL-CURRENT C.5.4). Absent on services built by hand: their steps
     * are not counted.
     *
     * @since 0.2.0
     * @internal
     */
    readonly suspension?: Suspension | undefined
  }
}

/**
 * The per-run execution context.
 *
 * @since 0.1.0
 * @category tags
 */
export class Execution extends Context.Service<Execution, Execution.Service>()("effect-rebuno/Execution") {}

/**
 * What a run is started from: the decoded webhook plus the agent id.
 *
 * @since 0.1.0
 * @category models
 */
export interface RunOptions {
  readonly agentId: string
  readonly executionId: string
  readonly dispatchId: string
  readonly dispatchAttempt?: number | undefined
  readonly leaseTimeoutSeconds?: number | undefined
  readonly input?: unknown
}

/**
 * Build the execution context of a run from its run state (used by the
 * dispatch runtime).
 *
 * @since 0.1.0
 * @category constructors
 * @internal
 */
export const fromRunState = (
  state: RunState,
  options: RunOptions
): Execution.Service =>
  Execution.of({
    executionId: options.executionId,
    agentId: options.agentId,
    dispatchId: options.dispatchId,
    dispatchAttempt: options.dispatchAttempt,
    leaseTimeoutSeconds: options.leaseTimeoutSeconds,
    input: options.input === undefined ? null : options.input,
    caller: state.caller,
    kernel: state.client,
    signal: state.signal,
    raise: state.raise,
    stopped: state.stopped,
    suspension: state.suspension
  })

/**
 * Build an execution context over a kernel client, outside the dispatch
 * runtime (for test kits and custom runtimes). Nothing is sent to the kernel.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: (options: RunOptions) => Effect.Effect<Execution.Service, never, KernelClient> = Effect.fnUntraced(
  function*(options: RunOptions) {
    const kernel = yield* KernelClient
    const caller: Caller = {
      agentId: options.agentId,
      lease: { dispatchId: options.dispatchId, attempt: options.dispatchAttempt }
    }
    const state = yield* makeRunState(kernel, caller, options.executionId, {
      leaseTimeoutSeconds: options.leaseTimeoutSeconds
    })
    return fromRunState(state, options)
  }
)

/**
 * A Layer providing an execution context built with {@link make}.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: RunOptions): Layer.Layer<Execution, never, KernelClient> =>
  Layer.effect(Execution, make(options))

/**
 * The run signal recorded so far (the suspension backstop), if any.
 *
 * @since 0.1.0
 * @category accessors
 */
export const signal: Effect.Effect<Option.Option<RunSignal>, never, Execution> = Execution.use((execution) =>
  Ref.get(execution.signal)
)

/**
 * The id of the running execution.
 *
 * @since 0.1.0
 * @category accessors
 */
export const executionId: Effect.Effect<string, never, Execution> = Execution.useSync((execution) =>
  execution.executionId
)
