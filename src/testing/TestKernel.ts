/**
 * The test kit: the embedded kernel's core provided in-process as a Layer, with
 * in-process webhook delivery and a `KernelClient` and `Client` wired to it, all
 * on Effect's `Clock` — so an agent is unit-tested deterministically under
 * `TestClock`: replay, crashes, lease loss, approvals, denials, rate limits,
 * cancellation and heartbeats, without sockets or real time.
 *
 * The kernel speaks the current stage by default (PROTOCOL-CURRENT; the
 * `stage` option pins `"seed"` or `"v0.14.0"`): executions of a session run
 * one at a time and pass their state on (`session` on {@link RunOptions} and
 * {@link CreateOptions}), a subagent call runs the other agent — registered
 * in the same kit — while its parent is suspended, a rate limit with
 * `max_wait` parks the execution and settling moves virtual time to its
 * redelivery, and scoped API keys work through the kit's `Client`
 * ({@link Options.apiToken}, {@link TestKernel.Service.client}).
 *
 * Faults are injected at the agent → kernel calls: a crash (the agent's process
 * dies), a lease lapse (the process stalls while staying alive, and is fenced
 * when it wakes up), a transport failure (the kernel is unreachable, before or
 * after it processed the call), and failing webhooks. Every agent → kernel call
 * is logged ({@link KernelCall}), so a test can count exactly what ran.
 *
 * @example
 * ```ts
 * import { expect, it } from "@effect/vitest"
 * import { Effect, Schema } from "effect"
 * import { Agent, Tool } from "effect-rebuno"
 * import { TestKernel } from "effect-rebuno/testing"
 *
 * const search = Tool.make("search", {
 *   args: Schema.Struct({ query: Schema.String }),
 *   success: Schema.Array(Schema.String),
 *   execute: ({ query }) => Effect.succeed([`result for ${query}`])
 * })
 *
 * const researcher = Agent.make({
 *   id: "researcher",
 *   input: Schema.Struct({ prompt: Schema.String }),
 *   handler: ({ prompt }) =>
 *     Effect.gen(function*() {
 *       const hits = yield* search({ query: prompt })
 *       const more = yield* search({ query: `${prompt} again` })
 *       return { hits: [...hits, ...more] }
 *     })
 * })
 *
 * it.effect("replays after a crash", () =>
 *   Effect.gen(function*() {
 *     const kernel = yield* TestKernel.TestKernel
 *     const run = yield* kernel.run(researcher, { prompt: "hi" }, { crash: { afterSteps: 1 } })
 *     expect(run.status).toBe("completed")
 *     expect(run.deliveries).toBe(2) // crashed once, redelivered once
 *   }).pipe(Effect.provide(TestKernel.layer({ agents: [researcher] }))))
 * ```
 *
 * @since 0.1.0
 */
import { Array as Arr, Clock, Context, Effect, Layer, Option, Redacted, Schema, Scope } from "effect"
import type { Duration } from "effect"
import type { HttpClient } from "effect/http"
import type { TestClock } from "effect/testing"
import type * as Agent from "../Agent.js"
import * as Client from "../Client.js"
import * as Core from "../kernel/Core.js"
import * as Dispatcher from "../kernel/Dispatcher.js"
import { KernelClient } from "../KernelClient.js"
import type * as Protocol from "../Protocol.js"
import { stringifyStrict } from "../internal/wire/json.js"
import { Activity } from "./internal/activity.js"
import { CallLog } from "./internal/callLog.js"
import * as Clients from "./internal/clients.js"
import * as DeadlineSweeps from "./internal/deadlineSweeps.js"
import type * as DirectClient from "./internal/directClient.js"
import * as Faults from "./internal/faults.js"
import * as Forks from "./internal/forks.js"
import * as Processes from "./internal/processes.js"
import * as TrackedClock from "./internal/trackedClock.js"
import * as VirtualTime from "./internal/virtualTime.js"
import * as Views from "./internal/views.js"

/**
 * The agent → kernel calls the kit intercepts.
 *
 * @since 0.1.0
 * @category models
 */
export type CallName = DirectClient.CallName

/**
 * The calls a crash or a lease lapse can be placed around.
 *
 * @since 0.1.0
 * @category models
 */
export type StepCallName =
  | "submitStep"
  | "completeStep"
  | "failStep"
  | "completeExecution"
  | "failExecution"
  /** The resource calls of a run (PROTOCOL-CURRENT C.6.2, C.6.3, C.6.6), since 0.2.0. */
  | "registerResource"
  | "bindResource"
  | "publishCheckpoints"

/**
 * Where a simulated crash happens. The agent's process "dies" at that point:
 * every run of that agent in this process is interrupted, nothing more is sent,
 * heartbeats stop, and a fresh runtime takes over — so the kernel redelivers
 * once the lease lapses, exactly as after a real crash.
 *
 * - `{ afterSteps: n }`: after the `n`-th step outcome (complete or fail) of the
 *   run has been recorded.
 * - `{ call, index, when }`: around the `index`-th (0-based) call of that kind in
 *   the run — `"before"` the kernel sees it, or `"after"` it answered but before
 *   the agent saw the answer.
 *
 * A crash fires once, in the first run of the execution that reaches it.
 *
 * @since 0.1.0
 * @category models
 */
export type CrashPoint =
  | { readonly afterSteps: number }
  | {
    readonly call: StepCallName
    readonly index: number
    readonly when: "before" | "after"
  }

/**
 * A transport failure between the agent and the kernel: the call fails as a
 * connection error would (`KernelError` with reason `Transport`).
 *
 * - `when: "before"`: the request never reached the kernel.
 * - `when: "after"`: the kernel processed it; the answer was lost.
 *
 * It hits the `index`-th (0-based, default 0) call of that kind in the first run
 * that reaches it, and the `times - 1` calls of that kind that follow in the same
 * run (default `times: 1`) — retries count as calls, so `times: 3` on a step
 * complete lets the fourth try through. `getExecution` carries no lease: its
 * index counts over the whole execution.
 *
 * @since 0.1.0
 * @category models
 */
export interface Fault {
  readonly call: CallName
  readonly index?: number | undefined
  readonly when: "before" | "after"
  readonly times?: number | undefined
}

/**
 * Options of {@link TestKernel.Service.run} and {@link TestKernel.Service.settle}.
 *
 * @since 0.1.0
 * @category models
 */
export interface RunOptions {
  /** Inject a crash into the first run that reaches this point (or the first of these points). */
  readonly crash?: CrashPoint | ReadonlyArray<CrashPoint> | undefined
  /**
   * Inject a lease lapse: at this point the run's process stalls (a long pause, a
   * partition) but stays alive — its calls and heartbeats freeze, the lease lapses,
   * and the kernel redelivers to a fresh process. When the next attempt is
   * delivered the stalled run wakes up: its next mutation must be fenced
   * (`lease_superseded`), which stops it.
   */
  readonly lapse?: CrashPoint | undefined
  /**
   * How the lease of a crashed or stalled run lapses: `"lease"` (default) when the
   * lease timeout has passed on virtual time, as the kernel would; `"immediate"`
   * at once (every in-flight lease is reclaimed and the next tick redelivers), so
   * the rest of the run sees the same virtual time as without the fault.
   */
  readonly recovery?: "lease" | "immediate" | undefined
  /** Transport failures to inject. */
  readonly faults?: ReadonlyArray<Fault> | undefined
  /** The agent version label recorded on the execution (seed stage and v0.14.0 only). */
  readonly agentVersion?: string | undefined
  /**
   * Run the execution in this session (PROTOCOL-CURRENT C.4): it waits for the
   * session's earlier executions and reads their state with `previous`.
   *
   * @since 0.2.0
   */
  readonly session?: string | undefined
  /**
   * The create's idempotency key (PROTOCOL-CURRENT C.4.1): a repeat settles
   * the first execution and runs nothing new.
   *
   * @since 0.2.0
   */
  readonly idempotencyKey?: string | undefined
  /**
   * An explicit parent: a completed execution of the same agent, whose state
   * `previous` reads (PROTOCOL-CURRENT C.4.1).
   *
   * @since 0.2.0
   */
  readonly parentExecutionId?: string | undefined
  /**
   * The virtual-time budget of settling (default 1 hour), counted from the
   * start of the call: settling gives up once the `TestClock` has moved this
   * far and the execution has still not settled, and returns the execution
   * as it is then with {@link RunResult.timedOut} `true` (its `status`
   * usually `"running"`). A run that sleeps longer — an `Effect.sleep`, a
   * durable `Step.sleep`, a long retry backoff — needs a longer budget:
   * `timeout: "30 days"` settles a 30-day sleep. The budget costs no wall
   * time by itself: virtual time moves from one wake-up to the next (each
   * heartbeat of a sleeping run is one, every 30 s with the default lease),
   * so a day of sleep costs its 2,880 heartbeats' worth of work (about
   * 0.2 s of wall time), not a day. An infinite duration settles however
   * long it takes (and never returns if the execution never settles).
   */
  readonly timeout?: Duration.Input | undefined
}

/**
 * Options of {@link TestKernel.Service.create}: what `POST /v0/executions`
 * takes besides the agent and the input. The current-stage members
 * (PROTOCOL-CURRENT C.4.1, C.5.1) are ignored by the older stages; an empty
 * string counts as absent.
 *
 * @since 0.2.0
 * @category models
 */
export interface CreateOptions {
  /** The agent version label (seed stage and v0.14.0 only). */
  readonly agentVersion?: string | undefined
  /** The session: one execution at a time, each reading its predecessor's state (C.4). */
  readonly session?: string | undefined
  /** At most one execution per agent and key: a repeat answers the first (C.4.1 step 4). */
  readonly idempotencyKey?: string | undefined
  /** An explicit parent: a completed execution of the same agent (C.4.1 step 5). */
  readonly parentExecutionId?: string | undefined
  /** Bind the execution as a subagent of this executing step (C.5.1). */
  readonly spawnedBy?: { readonly executionId: string; readonly stepId: string } | undefined
}

/**
 * One agent → kernel call, as the kit saw it.
 *
 * @since 0.1.0
 * @category models
 */
export interface KernelCall {
  /** Position in the kit's call log (all executions). */
  readonly seq: number
  readonly call: CallName
  readonly executionId: string
  /** The lease of the run that made the call (`undefined` for reads). */
  readonly dispatchId: string | undefined
  readonly attempt: number | undefined
  /** The index of this call among the calls of its kind in the run (0-based). */
  readonly index: number
  /** The step: named by the route (complete / fail) or by the decision (submit). */
  readonly stepId: string | undefined
  /** Step kind, target, arguments (JSON text) and idempotency, when known. */
  readonly kind: string | undefined
  readonly target: string | undefined
  readonly argsJson: string | undefined
  readonly idempotency: "safe_to_retry" | "at_most_once" | undefined
  /** Virtual time of the call. */
  readonly atMs: number
  /** Whether the kernel processed the call. */
  readonly reached: boolean
  /**
   * The kernel's answer: the decision (`proceed`, `replay`, `denied`, …, or
   * `recorded` for complete / fail), `ok` for an empty success, or the error
   * code (`lease_superseded`, `execution_terminal`, …). `undefined` when the
   * call never reached the kernel.
   */
  readonly answer: string | undefined
  /**
   * The length of the call log when the answer arrived: calls with a `seq` at
   * least this were made after it (`undefined` while unanswered).
   */
  readonly answerSeq: number | undefined
  /** Whether the answer reached the agent (not lost to a crash or a fault). */
  readonly delivered: boolean
  /** What the kit injected at this call. */
  readonly injected: "crash" | "lapse" | "fault" | undefined
}

/**
 * A step of a {@link RunResult}: the step as a client sees it, with its
 * position in call order.
 *
 * @since 0.2.0
 * @category models
 */
export interface RunStep extends Protocol.Step {
  /**
   * The step's position (0-based) in the order the execution first submitted
   * its steps — from the event log, so the same on every run of the same
   * agent and input, and across a replay.
   */
  readonly sequence: number
}

/**
 * What a settled execution looks like from outside: its status, output,
 * failure reason, steps, events and pending approvals, decoded exactly as a
 * client would see them over HTTP. Steps, events and calls are those of the
 * moment the execution settled, decoded when first read.
 *
 * `A` is the type of the output: {@link TestKernel.Service.run} given an
 * agent types it by the agent's output (and decodes the recorded JSON with
 * the agent's output Schema, when it has one).
 *
 * @example
 * ```ts
 * import { expect, it } from "@effect/vitest"
 * import { Effect, Schema } from "effect"
 * import { Agent, Tool } from "effect-rebuno"
 * import { TestKernel } from "effect-rebuno/testing"
 *
 * const reverse = Tool.make("reverse", {
 *   args: Schema.Struct({ text: Schema.String }),
 *   success: Schema.Struct({ reversed: Schema.String }),
 *   execute: ({ text }) => Effect.succeed({ reversed: Array.from(text).reverse().join("") })
 * })
 *
 * const wordCount = Tool.make("word_count", {
 *   args: Schema.Struct({ text: Schema.String }),
 *   success: Schema.Struct({ count: Schema.Number }),
 *   execute: ({ text }) => Effect.succeed({ count: text.split(/\s+/).filter((word) => word !== "").length })
 * })
 *
 * const hello = Agent.make({
 *   id: "hello",
 *   input: Schema.Struct({ query: Schema.String }),
 *   output: Schema.Struct({ query: Schema.String, reversed: Schema.String, word_count: Schema.Number }),
 *   handler: ({ query }) =>
 *     Effect.gen(function*() {
 *       const { reversed } = yield* reverse({ text: query })
 *       const { count } = yield* wordCount({ text: query })
 *       return { query, reversed, word_count: count }
 *     })
 * })
 *
 * it.effect("reads a settled run", () =>
 *   Effect.gen(function*() {
 *     const kernel = yield* TestKernel.TestKernel
 *     const run = yield* kernel.run(hello, { query: "a b" })
 *     expect(run.output?.word_count).toBe(2) // number | undefined, from hello's output Schema
 *     expect(run.steps.map((s) => [s.sequence, s.target])).toEqual([[0, "reverse"], [1, "word_count"]])
 *     expect(run.failureReason).toBeUndefined() // absent unless the execution failed or was cancelled
 *   }).pipe(Effect.provide(TestKernel.layer({ agents: [hello] }))))
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface RunResult<A = unknown> {
  readonly executionId: string
  readonly status: Protocol.ExecutionStatus
  /**
   * The recorded output; `undefined` when none was recorded. From
   * `kernel.run(agent, …)` with an agent that has an output Schema, the
   * recorded JSON decoded with it; otherwise the parsed JSON. The JSON as
   * recorded is `execution.output`.
   */
  readonly output: A | undefined
  /** Why the execution failed or was cancelled; absent (not `""`) when there is no reason. */
  readonly failureReason?: string | undefined
  readonly execution: Protocol.Execution
  /**
   * The execution's steps in call order (the order of their first
   * submission), each with its {@link RunStep.sequence}. (The kernel's
   * listing, {@link TestKernel.Service.steps}, is sorted by step id.)
   *
   * @since 0.1.0 (in call order, with `sequence`, since 0.2.0)
   */
  readonly steps: ReadonlyArray<RunStep>
  readonly events: ReadonlyArray<Protocol.Event>
  /** Pending approvals of this execution (non-empty when `status` is `blocked`). */
  readonly approvals: ReadonlyArray<Protocol.Approval>
  /** How many webhook deliveries (runs) the execution took. */
  readonly deliveries: number
  /** The agent → kernel calls of the execution, in order. */
  readonly calls: ReadonlyArray<KernelCall>
  /** Whether an injected crash fired. */
  readonly crashed: boolean
  /** Whether an injected lease lapse fired. */
  readonly lapsed: boolean
  /**
   * Whether settling gave up because the virtual-time budget
   * ({@link RunOptions.timeout}, default 1 hour) ran out before the execution
   * settled. The result is then a snapshot of the execution at the end of
   * the budget — typically `status: "running"`, with a run still sleeping,
   * heartbeating or waiting on a retry — not its outcome: give a longer
   * `timeout` (e.g. `"30 days"`) for the whole run, or settle the same
   * execution again to carry on from where it stopped. `false` whenever
   * the execution settled (terminal, or waiting on people).
   *
   * @since 0.2.0
   */
  readonly timedOut: boolean
  /**
   * A fork's restoration (PROTOCOL-CURRENT C.7.1), on the result of
   * {@link TestKernel.Service.fork} only: for each resource the source had
   * registered by the fork point, the checkpoint the fork's resource starts
   * from and whether it covers the fork point. Absent on other results, and
   * when the source had no resources.
   *
   * @since 0.2.0
   */
  readonly restoration?: Protocol.Restoration | undefined
}

/**
 * What a fork records instead of a copied step's outcome
 * ({@link ForkOptions.override}): the step replays `result` as `succeeded`,
 * or `error` as `failed` — the JSON the step's body would have recorded. An
 * `error` given as a string is recorded as the SDK records a failure,
 * `{"message": <string>}` (a tool call then fails with a `ToolError` whose
 * `text` is `"<target>: <string>"`).
 *
 * The value must be JSON as it stands — it is recorded exactly, never
 * coerced as `JSON.stringify` would: `NaN`, `±Infinity`, `undefined`
 * (anywhere, object members included), a `Date`, a `Map`, a class instance,
 * an object with `toJSON`, a function, a bigint or a cycle is refused, and
 * the fork fails with `400 validation_error` `validation error: override of
 * "<step id>" is not JSON` (the source step's id, also when the override was
 * keyed by target) — with nothing forked. Encode such values first (e.g. a
 * `Date` as its ISO string, as the step's Schema would have recorded it).
 *
 * @since 0.2.0
 * @category models
 */
export type StepOverride = { readonly result: unknown } | { readonly error: unknown }

/**
 * Where a fork starts (PROTOCOL-CURRENT C.7), at most one of:
 *
 * - `atStep: k` — step `k` (0-based, in call order: `run.steps[k]`) and
 *   every step after it run live in the fork; the steps before it that had
 *   settled replay from the source's record (their bodies do not run).
 *   `k` may be the number of steps: every settled step replays.
 * - `atSeq: n` — the source's event seq `n` (`1..latest`): the steps
 *   settled by then replay. `"latestCovered"`: the latest seq at which every
 *   resource has a checkpoint covering it (`Protocol.latestCoveredSeq`), so
 *   that each resource is restored exactly as it was there.
 * - neither — the source's latest seq.
 *
 * @since 0.2.0
 * @category models
 */
export type ForkPoint =
  | { readonly atStep: number; readonly atSeq?: undefined }
  | { readonly atSeq: number | "latestCovered"; readonly atStep?: undefined }
  | { readonly atStep?: undefined; readonly atSeq?: undefined }

/**
 * Options of {@link TestKernel.Service.fork}: where the fork starts
 * ({@link ForkPoint}), what is different in it — its own `policy`, the
 * `override`n outcome of copied steps — and, as for
 * {@link TestKernel.Service.run}, the faults to inject into its runs.
 *
 * @since 0.2.0
 * @category models
 */
export type ForkOptions = ForkPoint & {
  /**
   * A policy bundle (YAML) for the fork only (C.7.2 step 1): every step that
   * runs live in the fork is decided by it. Without one the fork runs under
   * the source's own bundle (a fork of a fork) or the agent's. Copied steps
   * replay whatever the policy says.
   */
  readonly policy?: string | undefined
  /**
   * Record other outcomes for copied steps, keyed by the **source** step's
   * id (`run.steps[i].stepId`) or by a target, which names every copied step
   * with that target. A key that names no copied step fails with `400
   * validation_error` and nothing is forked. Not a wire feature: a fork with
   * overrides is made through the kernel core on both transports.
   */
  readonly override?: Readonly<Record<string, StepOverride>> | undefined
  /** Run the fork in this session (it must have no executions yet, C.4.1). */
  readonly session?: string | undefined
} & Pick<RunOptions, "crash" | "lapse" | "recovery" | "faults" | "timeout">

/**
 * The test kernel's settings.
 *
 * @since 0.1.0
 * @category models
 */
export interface Options<R = never> {
  /** Agents to register (with the kit's secret) and serve in-process. */
  readonly agents?: ReadonlyArray<Agent.Agent<any, any, any, R>> | undefined
  /** Policy bundles (the reference kernel's YAML) by agent id. */
  readonly policies?: Readonly<Record<string, string>> | undefined
  /** Kernel settings (lease timeout, max attempts, approval timeout, …). */
  readonly settings?: Partial<Core.Settings> | undefined
  /**
   * The protocol stage the kernel speaks (default `"current"`,
   * PROTOCOL-CURRENT): sessions, subagents, rate-limit parking, scoped API
   * keys. `"seed"` is PROTOCOL.md as before the current stage; `"v0.14.0"`
   * emulates the reference kernel v0.14.0 (no attempts, no fencing). Wins
   * over `settings.stage`.
   *
   * @since 0.2.0
   */
  readonly stage?: Core.Settings["stage"] | undefined
  /**
   * `"direct"` (default) calls the core without serialising; `"http"` sends the
   * exact signed bytes through the kernel's routes in-process, as over a socket.
   * Both retry the calls PROTOCOL.md 15.1 declares safe; faults work with both.
   */
  readonly transport?: "direct" | "http" | undefined
  /** The agent secret used for every agent (default `"test-secret"`). */
  readonly secret?: string | undefined
  /**
   * The kernel's bootstrap token (PROTOCOL-CURRENT C.9.1): with one, every
   * bearer route needs `Authorization: Bearer` with this token (full access)
   * or an API key's token (its scopes). The kit's `Client` sends it. Without
   * one the kernel is open, as a dev kernel is — unless a request brings an
   * API key, which is then checked. {@link TestKernel.Service.client} makes
   * further clients with other keys.
   *
   * @since 0.2.0
   */
  readonly apiToken?: Redacted.Redacted<string> | string | undefined
}

/**
 * @since 0.1.0
 * @category models
 */
export declare namespace TestKernel {
  /**
   * @since 0.1.0
   * @category models
   */
  export interface Service {
    /** The kernel core, for direct inspection. */
    readonly core: Core.KernelCore
    /**
     * Register an agent (upsert) and start serving it in-process. Its handler
     * gets the kit's `Client` (for subagent calls) unless the context already
     * has one.
     */
    readonly register: <R>(
      agent: Agent.Agent<any, any, any, R>,
      options?: { readonly policy?: string | undefined }
    ) => Effect.Effect<void, Core.KernelFailure, Exclude<R, Client.Client>>
    /**
     * Create an execution (input must be JSON); it is delivered on the next
     * tick — or, in a busy session, once the session frees up
     * (PROTOCOL-CURRENT C.4.4).
     */
    readonly create: (
      agentId: string,
      input?: unknown,
      options?: CreateOptions
    ) => Effect.Effect<string, Core.KernelFailure>
    /**
     * Drive the kernel (ticks, deliveries, virtual time for heartbeats, backoff,
     * rate-limit parking and lease expiry) until the execution is terminal or
     * waits on people, and no run is in progress. Waiting on people: blocked on
     * an approval; blocked on subagents (PROTOCOL-CURRENT C.5.2) that all wait
     * on people; pending in a session whose busy execution waits on people.
     * Meanwhile every other execution moves too: earlier executions of its
     * session, its subagents. Dispatcher ticks happen on a grid of virtual time
     * from the start of the call (250 ms in the current stage, 2 s before it;
     * and at once after an enqueue), as the embedded kernel's loop would; idle
     * stretches are skipped in one step.
     */
    readonly settle: (executionId: string, options?: RunOptions) => Effect.Effect<RunResult, Core.KernelFailure>
    /**
     * Create an execution of a registered agent and settle it. Given the
     * agent (not its id), the result's `output` has the agent's output type,
     * decoded with its output Schema when it has one.
     */
    readonly run: <Ag extends Agent.Agent<any, any, any, any, any> | string>(
      agent: Ag,
      input?: unknown,
      options?: RunOptions
    ) => Effect.Effect<RunResult<OutputOf<Ag>>, Core.KernelFailure>
    /**
     * "What if": fork a settled execution (PROTOCOL-CURRENT C.7) — at a step,
     * at an event seq, or at the latest seq where its resources are covered —
     * optionally under another policy or with other recorded outcomes for the
     * steps it copies, and settle the fork. The fork reruns the agent from the
     * top on the same input: the copied steps replay without running their
     * bodies and without asking the policy; every step after the fork point
     * runs live under the fork's policy, `at_most_once` steps included.
     *
     * Given the source's {@link RunResult}, the fork's `output` has its type
     * (decoded with the agent's output Schema, as `run` does); given an id, it
     * is the parsed JSON. The result carries the fork's `restoration`. On the
     * `"http"` transport the fork is made with `POST …/fork` through the
     * kit's `Client` (unless it has overrides, which are not on the wire).
     * Fails as the route does (`404` unknown source, `400` a bad seq, session
     * or bundle, `409` a session in use), plus `400` for a bad `atStep` or an
     * override that names no copied step — with nothing forked.
     *
     * @example
     * ```ts
     * import { expect, it } from "@effect/vitest"
     * import { Effect, Schema } from "effect"
     * import { Agent, Tool } from "effect-rebuno"
     * import { TestKernel } from "effect-rebuno/testing"
     *
     * const lookupOrder = Tool.make("lookup_order", {
     *   args: Schema.Struct({ order: Schema.String }),
     *   success: Schema.Struct({ amount: Schema.Number }),
     *   execute: () => Effect.succeed({ amount: 40 })
     * })
     *
     * const refund = Tool.make("refund", {
     *   args: Schema.Struct({ order: Schema.String, amount: Schema.Number }),
     *   success: Schema.Struct({ refunded: Schema.Number }),
     *   idempotency: "at_most_once",
     *   execute: ({ amount }) => Effect.succeed({ refunded: amount })
     * })
     *
     * const refunds = Agent.make({
     *   id: "refunds",
     *   input: Schema.Struct({ order: Schema.String }),
     *   handler: ({ order }) =>
     *     Effect.gen(function*() {
     *       const { amount } = yield* lookupOrder({ order })
     *       if (amount === 0) return "nothing to refund"
     *       return yield* refund({ order, amount }).pipe(
     *         Effect.map(({ refunded }) => `refunded ${refunded}`),
     *         Effect.catchTag("PolicyError", (e) => Effect.succeed(`refund refused: ${e.reason}`))
     *       )
     *     })
     * })
     *
     * const denyRefunds = `
     * default_action: allow
     * rules:
     *   - id: deny-refunds
     *     when: { target: refund }
     *     then: { decision: deny, reason: refunds are paused }
     * `
     *
     * it.effect("what if", () =>
     *   Effect.gen(function*() {
     *     const kernel = yield* TestKernel.TestKernel
     *     const source = yield* kernel.run(refunds, { order: "A-1" })
     *     // would the fork still refund if the policy denied it?
     *     const fork = yield* kernel.fork(source, { atStep: 1, policy: denyRefunds })
     *     expect(fork.steps[1]?.status).toBe("denied")
     *     // and if the lookup had found another amount?
     *     const other = yield* kernel.fork(source, {
     *       atStep: 1,
     *       override: { lookup_order: { result: { amount: 0 } } }
     *     })
     *     expect(other.output).toBe("nothing to refund")
     *   }).pipe(Effect.provide(TestKernel.layer({ agents: [refunds] }))))
     * ```
     *
     * @since 0.2.0
     */
    readonly fork: <A = unknown>(
      source: RunResult<A> | string,
      options?: ForkOptions
    ) => Effect.Effect<RunResult<A>, Core.KernelFailure>
    /**
     * The points an execution may be forked at (PROTOCOL-CURRENT C.7.3): its
     * latest seq, its resources with the seq each was registered at, and
     * every checkpoint with the seqs it covers — read through
     * `GET …/fork-points` over the kit's `Client` on the `"http"` transport.
     * `Protocol.isCovered` and `Protocol.latestCoveredSeq` read it.
     *
     * @since 0.2.0
     */
    readonly forkPoints: (executionId: string) => Effect.Effect<Protocol.ForkPoints, Core.KernelFailure>
    /** Arrange a crash in the next run of an execution that reaches the point. */
    readonly crash: (executionId: string, point: CrashPoint) => Effect.Effect<void>
    /** Arrange a transport failure for an execution's calls. */
    readonly fault: (executionId: string, fault: Fault) => Effect.Effect<void>
    /** Simulate a restart of an agent's process: its runs die, a fresh runtime serves it. */
    readonly restart: (agentId: string) => Effect.Effect<void>
    /**
     * Start a second process for an agent: new deliveries go to it, while the runs
     * of the previous process carry on (heartbeats included) — a zombie worker
     * on the other side of a partition. Its runs are fenced by the kernel once
     * their lease is superseded.
     */
    readonly partition: (agentId: string) => Effect.Effect<void>
    /**
     * The agent's webhook fails (as a `500` answer would) without starting a run,
     * for the next `times` deliveries (default: all, until called again with `times: 0`).
     */
    readonly failWebhooks: (agentId: string, options?: { readonly times?: number | undefined }) => Effect.Effect<void>
    /**
     * Send a signed webhook for an execution straight to its agent's runtime, as
     * the kernel would (for duplicate, stale or out-of-order deliveries). The
     * dispatch defaults to the execution's latest one, the attempt to its current
     * attempt. Returns the HTTP status the agent answered.
     */
    readonly webhook: (
      executionId: string,
      notice?: {
        readonly dispatchId?: string | undefined
        readonly attempt?: number | undefined
        readonly leaseTimeoutSeconds?: number | undefined
      }
    ) => Effect.Effect<number, Core.KernelFailure>
    /** Run one dispatcher tick (reclaim, expiry sweeps, claim, deliver). */
    readonly tick: Effect.Effect<void>
    /** Reclaim every in-flight lease now. */
    readonly expireLeases: Effect.Effect<number>
    /** Expire every pending approval that is due now. */
    readonly expireApprovals: Effect.Effect<number>
    /** The execution as a client sees it. */
    readonly execution: (executionId: string) => Effect.Effect<Protocol.Execution, Core.KernelFailure>
    /** The execution's steps, sorted by step id as the kernel lists them. */
    readonly steps: (executionId: string) => Effect.Effect<ReadonlyArray<Protocol.Step>>
    /** The execution's whole event log. */
    readonly events: (executionId: string) => Effect.Effect<ReadonlyArray<Protocol.Event>>
    /** The agent → kernel calls made so far (all executions, or one), in order. */
    readonly calls: (executionId?: string) => Effect.Effect<ReadonlyArray<KernelCall>>
    /** Runs in progress in the agents' processes. */
    readonly activeRuns: Effect.Effect<number>
    /** Pending approvals (all executions, or one). */
    readonly approvals: (executionId?: string) => Effect.Effect<ReadonlyArray<Protocol.Approval>>
    /** Grant an approval as `decidedBy` (default `""`). */
    readonly grant: (
      approvalId: string,
      decision?: { readonly decidedBy?: string | undefined; readonly rationale?: string | undefined }
    ) => Effect.Effect<void, Core.KernelFailure>
    /** Deny an approval. */
    readonly deny: (
      approvalId: string,
      decision?: { readonly decidedBy?: string | undefined; readonly rationale?: string | undefined }
    ) => Effect.Effect<void, Core.KernelFailure>
    /** Cancel an execution as a client would. */
    readonly cancel: (executionId: string) => Effect.Effect<void, Core.KernelFailure>
    /** Load (or with `""` remove) an agent's policy bundle. */
    readonly loadPolicy: (agentId: string, bundle: string) => Effect.Effect<void, Core.KernelFailure>
    /** Webhook deliveries (runs started) so far, per execution. */
    readonly deliveries: (executionId: string) => Effect.Effect<number>
    /** An `HttpClient` that answers from this kernel's routes in-process. */
    readonly httpClient: HttpClient.HttpClient
    /**
     * A `Client` over this kernel's routes in-process that sends `apiKey`
     * as its bearer token (an API key's token, or the bootstrap token), or
     * no `Authorization` header without one (PROTOCOL-CURRENT C.9.1).
     *
     * @since 0.2.0
     */
    readonly client: (
      options?: { readonly apiKey?: Redacted.Redacted<string> | string | undefined }
    ) => Effect.Effect<Client.Client.Service>
  }
}

/**
 * The output type of an agent (`unknown` for an agent id).
 *
 * @since 0.2.0
 * @category models
 */
export type OutputOf<Ag> = Ag extends Agent.Agent<any, infer A, any, any, any> ? A : unknown

/**
 * The test kernel service.
 *
 * @since 0.1.0
 * @category tags
 */
export class TestKernel extends Context.Service<TestKernel, TestKernel.Service>()("effect-rebuno/testing/TestKernel") {}

const nonEmpty = (s: string | undefined): string | undefined => s === "" ? undefined : s

/**
 * The result with its recorded output decoded by the agent's output Schema
 * (when it has one and an output was recorded). A recorded output that does
 * not decode — a Schema whose encoding does not round-trip — is a defect of
 * the test, reported as such.
 */
const decodeOutput = (
  agent: Agent.Agent<any, any, any, any, any>,
  result: RunResult,
  kitContext: Context.Context<never>
): Effect.Effect<RunResult> => {
  const schema = agent.outputSchema
  if (schema === undefined || result.output === undefined) return Effect.succeed(result)
  // The decoding services: the caller's, over those the kit was built with (the agents' services).
  const decode = Effect.flatMap(
    Effect.context<never>(),
    (context) =>
      Effect.provideContext(
        Schema.decodeUnknownEffect(schema)(result.output) as Effect.Effect<unknown, Schema.SchemaError, never>,
        Context.merge(kitContext, context)
      )
  )
  return decode.pipe(
    Effect.map((output) => Object.defineProperty(result, "output", { value: output, enumerable: true })),
    Effect.catch((error) =>
      Effect.die(
        new Error(
          `kernel.run: the output recorded for agent "${agent.id}" does not decode with its output Schema: ${error.message}`
        )
      )
    )
  )
}

/**
 * Build a test kernel in the current scope. Prefer {@link layer}.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = <R = never>(
  options: Options<R> = {}
): Effect.Effect<
  {
    readonly kernel: TestKernel.Service
    readonly kernelClient: KernelClient.Service
    readonly client: Client.Client.Service
  },
  never,
  Scope.Scope | Exclude<R, Client.Client>
> =>
  Effect.gen(function*() {
    const secret = options.secret ?? "test-secret"
    const kitContext = Context.omit(Scope.Scope)(yield* Effect.context<never>()) as Context.Context<never>
    // Every sleep of the kit's runs goes through this clock, so that settling can
    // move virtual time straight to the next one (TestClock lists no sleeps).
    const clock = yield* Clock.clockWith((clock) =>
      Effect.succeed(TrackedClock.isTrackedClock(clock) ? clock : TrackedClock.wrap(clock as TestClock.TestClock))
    )
    const core = yield* Core.make(
      options.stage === undefined ? options.settings : { ...options.settings, stage: options.stage }
    )
    const activity = new Activity()
    const callLog = new CallLog(core)
    const processes = Processes.make({ core, secret, clock })
    const faults = Faults.make({ core, callLog, processes, activity })
    const apiToken = options.apiToken === undefined || Redacted.isRedacted(options.apiToken)
      ? options.apiToken
      : Redacted.make(options.apiToken)
    const { client, clientWith, httpClient, kernelClient } = yield* Clients.make({
      core,
      secret,
      transport: options.transport ?? "direct",
      interceptor: faults.interceptor,
      activity,
      ...(apiToken === undefined ? {} : { apiToken })
    })
    const sweeps = DeadlineSweeps.make(core)
    const dispatcher = yield* Dispatcher.make(sweeps.core, {
      deliver: processes.deliver,
      background: false,
      ...sweeps.dispatcherOptions
    })
    yield* Effect.addFinalizer(() => processes.close)

    /** The registered agents by id: a fork of a typed result decodes its output with the agent's Schema. */
    const agents = new Map<string, Agent.Agent<any, any, any, any, any>>()
    const register: TestKernel.Service["register"] = (agent, registerOptions) =>
      Effect.tap(
        processes.register(agent, kernelClient, client, registerOptions?.policy ?? options.policies?.[agent.id]),
        () => Effect.sync(() => agents.set(agent.id, agent))
      )

    const create: TestKernel.Service["create"] = (agentId, input, createOptions) =>
      Effect.gen(function*() {
        let inputRaw: string | undefined
        if (input !== undefined) {
          const encoded = stringifyStrict(input)
          if (encoded._tag === "Invalid") {
            return yield* new Core.KernelFailure({
              status: 400,
              code: "validation_error",
              message: `input is not JSON at ${encoded.path}: ${encoded.reason}`
            })
          }
          inputRaw = encoded.json
        }
        const record = yield* core.createExecution({
          agentId,
          inputRaw,
          agentVersion: nonEmpty(createOptions?.agentVersion),
          session: nonEmpty(createOptions?.session),
          idempotencyKey: nonEmpty(createOptions?.idempotencyKey),
          parentExecutionId: nonEmpty(createOptions?.parentExecutionId),
          spawnedBy: createOptions?.spawnedBy
        })
        return record.id
      })

    const settle = VirtualTime.makeSettle({
      core,
      dispatcher,
      clock,
      activity,
      processes,
      faults,
      callLog,
      sweeps,
      result: (executionId, timedOut) =>
        Views.runResult(core, executionId, (id) => ({
          deliveries: processes.deliveries(id),
          calls: callLog.callsNow(id),
          crashed: faults.crashed(id),
          lapsed: faults.lapsed(id),
          timedOut
        }))
    })

    // Forks go through the kit's `Client` on the wire transport (PROTOCOL-CURRENT C.7.1, C.7.3).
    const forkClient = options.transport === "http" ? client : undefined
    const fork = <A = unknown>(
      source: RunResult<A> | string,
      forkOptions: ForkOptions = {}
    ): Effect.Effect<RunResult<A>, Core.KernelFailure> =>
      Effect.gen(function*() {
        const sourceId = typeof source === "string" ? source : source.executionId
        const atSeq = yield* Forks.resolveSeq(
          core,
          () => Forks.forkPoints(core, forkClient, sourceId),
          sourceId,
          forkOptions
        )
        const overrides = yield* Forks.resolveOverrides(core, sourceId, atSeq, forkOptions.override)
        const created = yield* Forks.create(core, forkClient, sourceId, {
          atSeq,
          session: nonEmpty(forkOptions.session),
          policyBundle: nonEmpty(forkOptions.policy),
          overrides
        })
        let result = yield* settle(created.id, {
          crash: forkOptions.crash,
          lapse: forkOptions.lapse,
          recovery: forkOptions.recovery,
          faults: forkOptions.faults,
          timeout: forkOptions.timeout
        })
        if (created.restoration !== undefined) {
          Object.defineProperty(result, "restoration", { value: created.restoration, enumerable: true })
        }
        const agent = typeof source === "string" ? undefined : agents.get(result.execution.agentId)
        if (agent !== undefined) result = yield* decodeOutput(agent, result, kitContext)
        return result as RunResult<A>
      })

    const kernel: TestKernel.Service = {
      core,
      register,
      create,
      settle,
      run: <Ag extends Agent.Agent<any, any, any, any, any> | string>(
        agent: Ag,
        input?: unknown,
        runOptions?: RunOptions
      ): Effect.Effect<RunResult<OutputOf<Ag>>, Core.KernelFailure> =>
        create(typeof agent === "string" ? agent : agent.id, input, {
          agentVersion: runOptions?.agentVersion,
          session: runOptions?.session,
          idempotencyKey: runOptions?.idempotencyKey,
          parentExecutionId: runOptions?.parentExecutionId
        }).pipe(
          Effect.flatMap((id) => settle(id, runOptions)),
          Effect.flatMap((result) =>
            typeof agent === "string" ? Effect.succeed(result) : decodeOutput(agent, result, kitContext)
          )
        ) as Effect.Effect<RunResult<OutputOf<Ag>>, Core.KernelFailure>,
      fork,
      forkPoints: (executionId) => Forks.forkPoints(core, forkClient, executionId),
      crash: (executionId, point) => Effect.sync(() => faults.crash(executionId, point)),
      fault: (executionId, fault) => Effect.sync(() => faults.fault(executionId, fault)),
      restart: processes.restart,
      partition: processes.partition,
      failWebhooks: (agentId, failOptions) =>
        Effect.sync(() => processes.failWebhooks(agentId, failOptions?.times ?? Infinity)),
      webhook: processes.webhook,
      tick: Effect.provideService(dispatcher.tick, Clock.Clock, clock),
      expireLeases: core.expireLeases(),
      expireApprovals: core.expireApprovals(),
      execution: (executionId) => Views.execution(core, executionId),
      steps: (executionId) => Views.steps(core, executionId),
      events: (executionId) => Views.events(core, executionId),
      calls: (executionId) => Effect.sync(() => callLog.calls(executionId)),
      activeRuns: processes.activeRuns,
      approvals: (executionId) => Views.approvals(core, executionId),
      grant: (approvalId, decision) =>
        core.grantApproval(approvalId, { decidedBy: decision?.decidedBy ?? "", rationale: decision?.rationale ?? "" }),
      deny: (approvalId, decision) =>
        core.denyApproval(approvalId, { decidedBy: decision?.decidedBy ?? "", rationale: decision?.rationale ?? "" }),
      cancel: (executionId) => core.cancelExecution(executionId),
      loadPolicy: (agentId, bundle) => core.loadPolicy(agentId, bundle),
      deliveries: (executionId) => Effect.sync(() => processes.deliveries(executionId)),
      httpClient,
      client: (clientOptions) => clientWith(clientOptions?.apiKey)
    }

    for (const agent of options.agents ?? []) {
      yield* Effect.orDie(register(agent))
    }

    return { kernel, kernelClient, client }
  })

/**
 * The test kit as a Layer: provides {@link TestKernel}, an in-process
 * `KernelClient` (what agents use) and an in-process `Client` (what backends
 * use), all over one embedded kernel core. Use it under `TestClock`
 * (`it.effect` from `@effect/vitest`): the kit's runs sleep on a clock that
 * delegates to it, so `TestClock.adjust` moves them too. The agents' handlers
 * get the kit's `Client` (a subagent call creates its child with it), so an
 * agent's need for a `Client` is not asked of the caller.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = <R = never>(
  options: Options<R> = {}
): Layer.Layer<TestKernel | KernelClient | Client.Client, never, Exclude<R, Client.Client>> =>
  Layer.effectContext(
    Effect.map(make(options), ({ client, kernel, kernelClient }) =>
      Context.make(TestKernel, kernel).pipe(
        Context.add(KernelClient, kernelClient),
        Context.add(Client.Client, client)
      ))
  )

/**
 * The pending approval of an execution, failing when there is none.
 *
 * @since 0.1.0
 * @category helpers
 */
export const pendingApproval = (executionId: string): Effect.Effect<Protocol.Approval, Core.KernelFailure, TestKernel> =>
  Effect.flatMap(TestKernel, (kernel) =>
    Effect.flatMap(kernel.approvals(executionId), (list) =>
      Option.match(Arr.head(list), {
        onNone: () =>
          Effect.fail(
            new Core.KernelFailure({ status: 404, code: "not_found", message: `no pending approval for ${executionId}` })
          ),
        onSome: Effect.succeed
      })))
