/**
 * The test kit: the embedded kernel's core provided in-process as a Layer, with
 * in-process webhook delivery and a `KernelClient` and `Client` wired to it, all
 * on Effect's `Clock` — so an agent is unit-tested deterministically under
 * `TestClock`: replay, crashes, lease loss, approvals, denials, rate limits,
 * cancellation and heartbeats, without sockets or real time.
 *
 * Faults are injected at the agent → kernel calls: a crash (the agent's process
 * dies), a lease lapse (the process stalls while staying alive, and is fenced
 * when it wakes up), a transport failure (the kernel is unreachable, before or
 * after it processed the call), and failing webhooks. Every agent → kernel call
 * is logged ({@link KernelCall}), so a test can count exactly what ran.
 *
 * @example
 * ```ts
 * it.effect("replays after a crash", () =>
 *   Effect.gen(function*() {
 *     const kernel = yield* TestKernel.TestKernel
 *     const run = yield* kernel.run(researcher, { prompt: "hi" }, { crash: { afterSteps: 1 } })
 *     expect(run.status).toBe("completed")
 *   }).pipe(Effect.provide(TestKernel.layer({ agents: [researcher] }))))
 * ```
 *
 * @since 0.1.0
 */
import { HttpClient } from "@effect/platform"
import {
  Array as Arr,
  Chunk,
  Clock,
  Context,
  Deferred,
  Duration,
  Effect,
  Exit,
  Layer,
  Option,
  Scope,
  TestClock
} from "effect"
import * as Agent from "../Agent.js"
import * as Client from "../Client.js"
import * as Core from "../kernel/Core.js"
import * as Dispatcher from "../kernel/Dispatcher.js"
import * as Routes from "../kernel/Routes.js"
import * as Wire from "../kernel/Wire.js"
import * as KernelClientModule from "../KernelClient.js"
import { KernelClient } from "../KernelClient.js"
import * as Protocol from "../Protocol.js"
import { KernelError } from "../RebunoError.js"
import * as Signature from "../Signature.js"
import { stringifyStrict } from "../internal/json.js"
import * as DirectClient from "./internal/directClient.js"
import * as InMemoryHttp from "./internal/inMemoryHttp.js"

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
export type StepCallName = "submitStep" | "completeStep" | "failStep" | "completeExecution" | "failExecution"

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
  /** The agent version label recorded on the execution. */
  readonly agentVersion?: string | undefined
  /** Give up after this much virtual time (default 1 hour). */
  readonly timeout?: Duration.DurationInput | undefined
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
 * What a settled execution looks like from outside: its status, output,
 * failure reason, steps, events and pending approvals, decoded exactly as a
 * client would see them over HTTP. Steps and events are those of the moment the
 * execution settled, decoded when first read.
 *
 * @since 0.1.0
 * @category models
 */
export interface RunResult {
  readonly executionId: string
  readonly status: Protocol.ExecutionStatus
  /** The recorded output (parsed JSON); `undefined` when none was recorded. */
  readonly output: unknown
  readonly failureReason: string
  readonly execution: Protocol.Execution
  readonly steps: ReadonlyArray<Protocol.Step>
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
}

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
   * `"direct"` (default) calls the core without serialising; `"http"` sends the
   * exact signed bytes through the kernel's routes in-process, as over a socket.
   * Both retry the calls PROTOCOL.md 15.1 declares safe; faults work with both.
   */
  readonly transport?: "direct" | "http" | undefined
  /** The agent secret used for every agent (default `"test-secret"`). */
  readonly secret?: string | undefined
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
    /** Register an agent (upsert) and start serving it in-process. */
    readonly register: <R>(
      agent: Agent.Agent<any, any, any, R>,
      options?: { readonly policy?: string | undefined }
    ) => Effect.Effect<void, Core.KernelFailure, R>
    /** Create an execution (input must be JSON); it is delivered on the next tick. */
    readonly create: (
      agentId: string,
      input?: unknown,
      options?: { readonly agentVersion?: string | undefined }
    ) => Effect.Effect<string, Core.KernelFailure>
    /**
     * Drive the kernel (ticks, deliveries, virtual time for heartbeats, backoff
     * and lease expiry) until the execution is terminal or blocked on an approval
     * and no run is in progress. Dispatcher ticks happen on a 2 s grid of virtual
     * time from the start of the call (and at once after an enqueue), as the
     * embedded kernel's loop would; idle stretches are skipped in one step.
     */
    readonly settle: (executionId: string, options?: RunOptions) => Effect.Effect<RunResult, Core.KernelFailure>
    /** Create an execution of a registered agent and settle it. */
    readonly run: (
      agent: Agent.Agent<any, any, any, any> | string,
      input?: unknown,
      options?: RunOptions
    ) => Effect.Effect<RunResult, Core.KernelFailure>
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
  }
}

/**
 * The test kernel service.
 *
 * @since 0.1.0
 * @category tags
 */
export class TestKernel extends Context.Tag("effect-rebuno/testing/TestKernel")<TestKernel, TestKernel.Service>() {}

/** The base URL the in-process clients use; never dialled. */
const inProcessUrl = "http://test-kernel.invalid"

/** One process serving an agent. */
interface Process {
  readonly scope: Scope.CloseableScope
  readonly runtime: Agent.AgentRuntime
}

interface Served {
  current: Process
  readonly rebuild: Effect.Effect<Agent.AgentRuntime, never, Scope.Scope>
}

interface CrashPlan {
  readonly points: ReadonlyArray<CrashPoint>
  readonly recovery: "lease" | "immediate"
  fired: boolean
}

interface LapsePlan {
  readonly point: CrashPoint
  readonly recovery: "lease" | "immediate"
  fired: boolean
}

/** A stalled run: every call of its lease waits for `release`. */
interface Stall {
  readonly executionId: string
  readonly release: Deferred.Deferred<void>
  released: boolean
}

interface FaultPlan {
  readonly fault: Fault
  remaining: number
  /** The run (lease key) the fault is bound to once it first fired. */
  key: string | undefined
}

/**
 * One call in the log: the call as the direct client described it, plus what
 * happened to it. What the call's step was (kind, target, idempotency of a
 * complete or fail) is looked up when the log is read: a step's identity
 * never changes.
 */
class CallRecord {
  answer: string | undefined = undefined
  answerSeq: number | undefined = undefined
  /** The step named by the route, or the one the submit's answer named. */
  stepId: string | undefined
  reached = false
  delivered = false
  injected: "crash" | "lapse" | "fault" | undefined = undefined
  /** Internal: lose the answer (fault `after`). */
  loseAnswer = false
  /** Internal: sent and not yet answered (nor lost before reaching the kernel). */
  pending = true
  constructor(
    readonly seq: number,
    readonly info: DirectClient.CallInfo,
    readonly index: number,
    readonly atMs: number,
    /** Internal: the run's key for counting. */
    readonly key: string
  ) {
    this.stepId = info.stepId
  }
  get call(): CallName {
    return this.info.call
  }
  get executionId(): string {
    return this.info.executionId
  }
}

const leaseKeys = new WeakMap<KernelClientModule.Lease, { readonly executionId: string; readonly key: string }>()

/** The key of a run's calls; kept per lease object (a run passes the same one to every call). */
const leaseKey = (executionId: string, lease: KernelClientModule.Lease): string => {
  const known = leaseKeys.get(lease)
  if (known !== undefined && known.executionId === executionId) return known.key
  const key = `${executionId}/${lease.dispatchId}/${lease.attempt ?? "?"}`
  leaseKeys.set(lease, { executionId, key })
  return key
}

/** How many calls of each kind a run has made. */
type CallCounts = Record<CallName, number>

const idempotencyOf = (step: Core.StepRecord | undefined): "safe_to_retry" | "at_most_once" | undefined =>
  step === undefined ? undefined : step.idempotency === "at_most_once" ? "at_most_once" : "safe_to_retry"

const noCalls = (): CallCounts => ({
  getExecution: 0,
  submitStep: 0,
  completeStep: 0,
  failStep: 0,
  heartbeat: 0,
  completeExecution: 0,
  failExecution: 0
})

const encoder = new TextEncoder()

const injectedFailure = (when: "before" | "after") =>
  new KernelError({
    reason: "Transport",
    description: when === "before" ?
      "injected transport failure: the kernel is unreachable" :
      "injected transport failure: the connection dropped before the answer arrived"
  })

const decodeStep = (s: Core.StepRecord): Protocol.Step => DirectClient.fromWire(Protocol.Step, Wire.encodeStep(s))
const decodeEvent = (e: Core.EventRecord): Protocol.Event => DirectClient.fromWire(Protocol.Event, Wire.encodeEvent(e))

/** An enumerable property computed on first read and kept. */
const lazyProperty = <A>(compute: () => A): PropertyDescriptor => {
  let value: { readonly a: A } | undefined
  return {
    enumerable: true,
    get: () => (value ??= { a: compute() }).a
  }
}

const snapshot = (core: Core.KernelCore, r: CallRecord): KernelCall => {
  const submission = r.info.submission
  const step = submission !== undefined || r.info.stepId === undefined
    ? undefined
    : core.unsafeGetStep(r.executionId, r.info.stepId)
  return {
    seq: r.seq,
    call: r.call,
    executionId: r.executionId,
    dispatchId: r.info.lease?.dispatchId,
    attempt: r.info.lease?.attempt,
    index: r.index,
    stepId: r.stepId,
    kind: submission?.kind ?? step?.kind,
    target: submission?.target ?? step?.target,
    argsJson: submission?.argsJson,
    idempotency: submission?.idempotency ?? idempotencyOf(step),
    atMs: r.atMs,
    reached: r.reached,
    answer: r.answer,
    answerSeq: r.answerSeq,
    delivered: r.delivered,
    injected: r.injected
  }
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
  { readonly kernel: TestKernel.Service; readonly kernelClient: KernelClient["Type"]; readonly client: Client.Client["Type"] },
  never,
  Scope.Scope | R
> =>
  Effect.gen(function*() {
    const secret = options.secret ?? "test-secret"
    const core = yield* Core.make(options.settings)
    const routes = Routes.make(core)
    const httpClient = InMemoryHttp.make(routes)
    const served = new Map<string, Served>()
    /** Processes cut off from new deliveries (stalled or partitioned) whose runs may still be alive. */
    const zombies: Array<Process & { readonly stall: Stall | undefined }> = []
    const crashPlans = new Map<string, CrashPlan>()
    const lapsePlans = new Map<string, LapsePlan>()
    const faultPlans = new Map<string, Array<FaultPlan>>()
    const stalls = new Map<string, Stall>()
    const callCounts = new Map<string, CallCounts>()
    const deliveryCounts = new Map<string, number>()
    const webhookFailures = new Map<string, { remaining: number }>()
    /** Executions whose crashed or stalled run asked for an immediate lease lapse. */
    const expiryRequested = new Set<string>()
    const callLog: Array<CallRecord> = []
    const callsByExecution = new Map<string, Array<CallRecord>>()
    /** The execution whose calls were logged last (a run makes many calls in a row). */
    let lastLog: { readonly executionId: string; readonly calls: Array<CallRecord> } | undefined
    const executionLog = (executionId: string): Array<CallRecord> => {
      if (lastLog !== undefined && lastLog.executionId === executionId) return lastLog.calls
      let calls = callsByExecution.get(executionId)
      if (calls === undefined) {
        calls = []
        callsByExecution.set(executionId, calls)
      }
      lastLog = { executionId, calls }
      return calls
    }
    let progress = 0
    /** Agent → kernel calls in flight (signing included), minus those parked by a stall. */
    let inFlight = 0

    /** Cut the agent's process off from new deliveries (its runs carry on) and start a fresh one. */
    const detach = (agentId: string, stall: Stall | undefined): Effect.Effect<void> =>
      Effect.gen(function*() {
        const entry = served.get(agentId)
        if (entry === undefined) return
        const old = entry.current
        const scope = yield* Scope.make()
        entry.current = { scope, runtime: yield* Scope.extend(entry.rebuild, scope) }
        zombies.push({ ...old, stall })
      })

    const restart = (agentId: string): Effect.Effect<void> =>
      Effect.gen(function*() {
        const entry = served.get(agentId)
        if (entry === undefined) return
        const old = entry.current
        const scope = yield* Scope.make()
        entry.current = { scope, runtime: yield* Scope.extend(entry.rebuild, scope) }
        yield* Scope.close(old.scope, Exit.void)
      })

    /** The process dies here: restart the agent from a daemon fiber and never return. */
    const crashNow = (executionId: string, agentId: string, recovery: "lease" | "immediate"): Effect.Effect<never> =>
      Effect.gen(function*() {
        if (recovery === "immediate") expiryRequested.add(executionId)
        yield* Effect.forkDaemon(restart(agentId))
        // A dead process makes no progress, even inside an uninterruptible region
        // of the run (e.g. recording an outcome): let the restart interrupt it.
        return yield* Effect.interruptible(Effect.never)
      })

    /** The process stalls here: cut it off from new deliveries and wait until the next attempt wakes it up. */
    const stallNow = (record: CallRecord, agentId: string, recovery: "lease" | "immediate"): Effect.Effect<void> =>
      Effect.gen(function*() {
        const release = yield* Deferred.make<void>()
        const stall: Stall = { executionId: record.executionId, release, released: false }
        yield* detach(agentId, stall)
        stalls.set(record.key, stall)
        if (recovery === "immediate") expiryRequested.add(record.executionId)
        yield* parked(Deferred.await(release))
      })

    const parked = <A, E>(effect: Effect.Effect<A, E>): Effect.Effect<A, E> =>
      Effect.acquireUseRelease(Effect.sync(() => void inFlight--), () => effect, () => Effect.sync(() => void inFlight++))

    const countCall = (call: CallName, key: string): number => {
      let counts = callCounts.get(key)
      if (counts === undefined) {
        counts = noCalls()
        callCounts.set(key, counts)
      }
      return counts[call]++
    }

    const matches = (point: CrashPoint, record: CallRecord, when: "before" | "after"): boolean => {
      if ("afterSteps" in point) {
        if (when !== "after" || (record.call !== "completeStep" && record.call !== "failStep")) return false
        const counts = callCounts.get(record.key)
        return (counts?.completeStep ?? 0) + (counts?.failStep ?? 0) >= point.afterSteps
      }
      return point.call === record.call && point.index === record.index && point.when === when
    }

    /** What is injected at a call once it is recorded: a stall, a crash, a lapse or a fault. */
    const injectBefore = (info: DirectClient.CallInfo, record: CallRecord): Effect.Effect<number, KernelError> =>
      Effect.gen(function*() {
        // A stalled run makes no call until it wakes up.
        const stall = stalls.get(record.key)
        if (stall !== undefined && !stall.released) yield* parked(Deferred.await(stall.release))

        const crash = crashPlans.get(info.executionId)
        if (crash !== undefined && !crash.fired && crash.points.some((p) => matches(p, record, "before"))) {
          crash.fired = true
          record.injected = "crash"
          return yield* crashNow(info.executionId, info.agentId, crash.recovery)
        }
        const lapse = lapsePlans.get(info.executionId)
        if (lapse !== undefined && !lapse.fired && matches(lapse.point, record, "before")) {
          lapse.fired = true
          record.injected = "lapse"
          yield* stallNow(record, info.agentId, lapse.recovery)
        }
        for (const plan of faultPlans.get(info.executionId) ?? []) {
          if (plan.remaining <= 0 || plan.fault.call !== info.call) continue
          if (plan.key === undefined) {
            if (record.index !== (plan.fault.index ?? 0)) continue
            plan.key = record.key
          } else if (plan.key !== record.key) {
            continue
          }
          plan.remaining--
          record.injected = "fault"
          if (plan.fault.when === "before") {
            record.pending = false
            return yield* injectedFailure("before")
          }
          record.loseAnswer = true
          break
        }
        return record.seq
      })

    /** Could anything be injected at this execution's calls (or is its run stalled)? */
    const planned = (executionId: string, key: string): boolean => {
      // Most kits never plan anything: no lookups then.
      if (crashPlans.size === 0 && lapsePlans.size === 0 && faultPlans.size === 0 && stalls.size === 0) return false
      const stall = stalls.get(key)
      if (stall !== undefined && !stall.released) return true
      const crash = crashPlans.get(executionId)
      if (crash !== undefined && !crash.fired) return true
      const lapse = lapsePlans.get(executionId)
      if (lapse !== undefined && !lapse.fired) return true
      const faults = faultPlans.get(executionId)
      return faults !== undefined && faults.some((plan) => plan.remaining > 0)
    }

    /** What is injected once the kernel has answered: a crash, a lapse or a lost answer. */
    const injectAfter = (record: CallRecord): Effect.Effect<void, KernelError> =>
      Effect.gen(function*() {
        const crash = crashPlans.get(record.executionId)
        if (crash !== undefined && !crash.fired && crash.points.some((p) => matches(p, record, "after"))) {
          crash.fired = true
          record.injected = "crash"
          const agentId = (yield* Effect.orDie(core.getExecution(record.executionId))).agentId
          return yield* crashNow(record.executionId, agentId, crash.recovery)
        }
        const lapse = lapsePlans.get(record.executionId)
        if (lapse !== undefined && !lapse.fired && matches(lapse.point, record, "after")) {
          lapse.fired = true
          record.injected = "lapse"
          const agentId = (yield* Effect.orDie(core.getExecution(record.executionId))).agentId
          yield* stallNow(record, agentId, lapse.recovery)
        }
        if (record.loseAnswer) return yield* injectedFailure("after")
        record.delivered = true
      })

    const interceptor: DirectClient.Interceptor = {
      before: (info, now) => {
        progress++
        const key = info.lease === undefined ? `${info.executionId}/read` : leaseKey(info.executionId, info.lease)
        const record = new CallRecord(callLog.length, info, countCall(info.call, key), now, key)
        callLog.push(record)
        executionLog(info.executionId).push(record)
        return planned(info.executionId, key) ? injectBefore(info, record) : record.seq
      },
      after: (id, answer, stepId) => {
        progress++
        const record = callLog[id]
        if (record === undefined || !record.pending) return
        record.pending = false
        record.reached = true
        record.answer = answer
        record.answerSeq = callLog.length
        if (record.stepId === undefined && stepId !== undefined) record.stepId = stepId
        if (record.loseAnswer || planned(record.executionId, record.key)) return injectAfter(record)
        record.delivered = true
      },
      track: (effect) => tracked(effect)
    }

    /** Count calls in flight, so settling does not move time while a call is being signed or answered. */
    const tracked = <A, E>(effect: Effect.Effect<A, E>): Effect.Effect<A, E> =>
      Effect.acquireUseRelease(
        Effect.sync(() => {
          inFlight++
          progress++
        }),
        () => effect,
        () =>
          Effect.sync(() => {
            inFlight--
            progress++
          })
      )

    const trackedClient = (service: KernelClient["Type"]): KernelClient["Type"] => ({
      secret: service.secret,
      getExecution: (caller, executionId) => tracked(service.getExecution(caller, executionId)),
      submitStep: (caller, executionId, s) => tracked(service.submitStep(caller, executionId, s)),
      completeStep: (caller, executionId, stepId, result) =>
        tracked(service.completeStep(caller, executionId, stepId, result)),
      failStep: (caller, executionId, stepId, message) => tracked(service.failStep(caller, executionId, stepId, message)),
      failStepJson: (caller, executionId, stepId, error) =>
        tracked(service.failStepJson(caller, executionId, stepId, error)),
      publishDelta: service.publishDelta,
      heartbeat: (caller, executionId) => tracked(service.heartbeat(caller, executionId)),
      completeExecution: (caller, executionId, output) =>
        tracked(service.completeExecution(caller, executionId, output)),
      failExecution: (caller, executionId, reason) => tracked(service.failExecution(caller, executionId, reason))
    })

    // The direct client tracks the calls that can suspend itself; over HTTP every call is tracked.
    const kernelClient: KernelClient["Type"] = options.transport === "http"
      ? trackedClient(
        yield* KernelClientModule.make({ baseUrl: inProcessUrl, secret }).pipe(
          Effect.provideService(HttpClient.HttpClient, InMemoryHttp.make(routes, interceptor)),
          Effect.orDie
        )
      )
      : DirectClient.make(core, secret, interceptor)

    const client = yield* Client.make({ baseUrl: inProcessUrl }).pipe(
      Effect.provideService(HttpClient.HttpClient, httpClient),
      Effect.orDie
    )

    /** Let forked fibers and pending promises (Web Crypto) make progress. */
    const yieldRound = Effect.zipRight(
      Effect.repeatN(Effect.yieldNow(), 4),
      Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
    )

    const deliver: Dispatcher.Deliver = (claim, body, signature) =>
      Effect.gen(function*() {
        // A run stalled on an older attempt of this execution wakes up now; its lease is gone.
        let woke = false
        for (const stall of stalls.values()) {
          if (stall.executionId !== claim.executionId || stall.released) continue
          stall.released = true
          woke = true
          yield* Deferred.succeed(stall.release, undefined)
        }
        if (woke) yield* Effect.repeatN(yieldRound, 2)
        const failing = webhookFailures.get(claim.agent.id)
        if (failing !== undefined && failing.remaining > 0) {
          failing.remaining--
          return false
        }
        const entry = served.get(claim.agent.id)
        if (entry === undefined) return false
        deliveryCounts.set(claim.executionId, (deliveryCounts.get(claim.executionId) ?? 0) + 1)
        const status = yield* entry.current.runtime.handleWebhook({ body: encoder.encode(body), signature })
        return status >= 200 && status < 300
      })

    const dispatcher = yield* Dispatcher.make(core, { deliver, background: false })

    const register = <RA>(
      agent: Agent.Agent<any, any, any, RA>,
      registerOptions?: { readonly policy?: string | undefined }
    ): Effect.Effect<void, Core.KernelFailure, RA> =>
      Effect.gen(function*() {
        const policy = registerOptions?.policy ?? options.policies?.[agent.id]
        yield* core.registerAgent({
          id: agent.id,
          webhookUrl: `${inProcessUrl}/agents/${agent.id}/webhook`,
          secret,
          ...(policy === undefined ? {} : { policyBundle: policy })
        })
        // Without the caller's Scope, so the runtime lives in the scope we can close to "crash" it.
        const context = Context.omit(Scope.Scope)(yield* Effect.context<RA>()) as Context.Context<RA>
        const rebuild = Agent.runtime(agent).pipe(
          Effect.provideService(KernelClient, kernelClient),
          Effect.provide(context)
        ) as Effect.Effect<Agent.AgentRuntime, never, Scope.Scope>
        const existing = served.get(agent.id)
        if (existing !== undefined) yield* Scope.close(existing.current.scope, Exit.void)
        const scope = yield* Scope.make()
        const runtime = yield* Scope.extend(rebuild, scope)
        served.set(agent.id, { current: { scope, runtime }, rebuild })
      })

    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        for (const stall of stalls.values()) {
          if (!stall.released) yield* Deferred.interrupt(stall.release)
        }
        yield* Effect.forEach(zombies, (process) => Scope.close(process.scope, Exit.void), { discard: true })
        yield* Effect.forEach(served.values(), (entry) => Scope.close(entry.current.scope, Exit.void), {
          discard: true
        })
      })
    )

    const create = (
      agentId: string,
      input?: unknown,
      createOptions?: { readonly agentVersion?: string | undefined }
    ): Effect.Effect<string, Core.KernelFailure> =>
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
          agentVersion: createOptions?.agentVersion
        })
        return record.id
      })

    /** Runs of the current processes, and of cut-off processes that are awake (a frozen one is not waited for). */
    const activeRuns = Effect.suspend(() =>
      Effect.map(
        Effect.forEach(
          [
            ...Arr.map(Arr.fromIterable(served.values()), (entry) => entry.current.runtime),
            ...zombies.filter((z) => z.stall === undefined || z.stall.released).map((z) => z.runtime)
          ],
          (runtime) => runtime.activeRuns
        ),
        Arr.reduce(0, (a, b) => a + b)
      )
    )

    /** Yield until nothing moves: no call made or answered for a few rounds (longer while calls are in flight). */
    const drain = Effect.gen(function*() {
      let idle = 0
      while (true) {
        const before = progress
        yield* yieldRound
        if (progress !== before) {
          idle = 0
          continue
        }
        if (inFlight <= 0 && (yield* activeRuns) === 0) return
        idle++
        if (idle >= (inFlight > 0 ? 24 : 3)) return
      }
    })

    const leaseTimeoutOf = (executionId: string): Effect.Effect<number> =>
      Effect.gen(function*() {
        const execution = yield* Effect.option(core.getExecution(executionId))
        if (Option.isNone(execution)) return core.settings.leaseTimeoutMs
        const agent = yield* Effect.option(core.getAgent(execution.value.agentId))
        return Option.isSome(agent) && agent.value.leaseTimeoutMs !== undefined ?
          agent.value.leaseTimeoutMs :
          core.settings.leaseTimeoutMs
      })

    /** The earliest virtual time at which a tick would have something to do (`Infinity` if never). */
    const kernelDue = (now: number): Effect.Effect<number> =>
      Effect.gen(function*() {
        let due = Infinity
        for (const d of yield* core.dispatches()) {
          if (d.status === "pending" || d.status === "failed") {
            due = Math.min(due, d.nextAttemptAtMs)
          } else if (d.status === "in_flight" && d.lockedAtMs !== undefined) {
            due = Math.min(due, d.lockedAtMs + (yield* leaseTimeoutOf(d.executionId)) + 1)
          }
        }
        for (const approval of yield* core.listApprovals()) due = Math.min(due, approval.timeoutAtMs)
        if (core.settings.deadlineMs !== undefined) due = Math.min(due, now + 1)
        return due
      })

    /** A dispatch enqueued since the last tick: the kernel's loop would tick at once. */
    const freshlyEnqueued = (now: number): Effect.Effect<boolean> =>
      Effect.map(
        core.dispatches(),
        (list) => list.some((d) => d.status === "pending" && d.attempt === 0 && d.nextAttemptAtMs <= now)
      )

    const executionCalls = (executionId: string): ReadonlyArray<KernelCall> =>
      (callsByExecution.get(executionId) ?? []).map((r) => snapshot(core, r))

    const toResult = (executionId: string): Effect.Effect<RunResult, Core.KernelFailure> =>
      Effect.gen(function*() {
        const execution = yield* getExecution(executionId)
        // Steps are copied now and events counted now (the log only grows); both
        // are decoded through the wire on first use: most tests never read them all.
        const stepRecords = yield* core.listSteps(executionId, false)
        const log = core.unsafeEventLog(executionId)
        const eventCount = log?.length ?? 0
        const result: Omit<RunResult, "steps" | "events"> = {
          executionId,
          status: execution.status as Protocol.ExecutionStatus,
          output: execution.output,
          failureReason: execution.failureReason,
          execution,
          approvals: yield* approvals(executionId),
          deliveries: deliveryCounts.get(executionId) ?? 0,
          calls: executionCalls(executionId),
          crashed: crashPlans.get(executionId)?.fired ?? false,
          lapsed: lapsePlans.get(executionId)?.fired ?? false
        }
        return Object.defineProperties(result as RunResult, {
          steps: lazyProperty(() => stepRecords.map(decodeStep)),
          events: lazyProperty(() => (log?.slice(0, eventCount) ?? []).map(decodeEvent))
        })
      })

    const arm = (executionId: string, runOptions: RunOptions | undefined): void => {
      const recovery = runOptions?.recovery ?? "lease"
      const crash = runOptions?.crash
      if (crash !== undefined) {
        const points: ReadonlyArray<CrashPoint> = Array.isArray(crash) ? crash : [crash as CrashPoint]
        crashPlans.set(executionId, { points, recovery, fired: false })
      }
      if (runOptions?.lapse !== undefined) {
        lapsePlans.set(executionId, { point: runOptions.lapse, recovery, fired: false })
      }
      for (const fault of runOptions?.faults ?? []) addFault(executionId, fault)
    }

    const addFault = (executionId: string, fault: Fault): void => {
      let list = faultPlans.get(executionId)
      if (list === undefined) {
        list = []
        faultPlans.set(executionId, list)
      }
      list.push({ fault, remaining: Math.max(0, fault.times ?? 1), key: undefined })
    }

    const settle = (executionId: string, runOptions?: RunOptions): Effect.Effect<RunResult, Core.KernelFailure> =>
      Effect.gen(function*() {
        arm(executionId, runOptions)
        const tickMs = Dispatcher.defaults.tickIntervalMs
        const start = yield* Clock.currentTimeMillis
        const deadline = start + Duration.toMillis(Duration.decode(runOptions?.timeout ?? Duration.hours(1)))
        let lastTick: number | undefined
        while (true) {
          const now = yield* Clock.currentTimeMillis
          let tickNow = ((now - start) % tickMs === 0 && lastTick !== now) || (yield* freshlyEnqueued(now))
          if (expiryRequested.size > 0) {
            // A crashed or stalled run asked for its lease to lapse at once.
            expiryRequested.clear()
            yield* core.expireLeases()
            tickNow = true
          }
          if (tickNow) {
            lastTick = now
            yield* dispatcher.tick
          }
          yield* drain
          if (expiryRequested.size > 0) continue
          const record = yield* core.getExecution(executionId)
          const settled = Protocol.isTerminalStatus(record.status) || record.status === "blocked"
          if (settled && (yield* activeRuns) === 0) break
          const current = yield* Clock.currentTimeMillis
          if (current >= deadline) break
          // Move virtual time to the next thing that can happen: a sleep ending, or a
          // tick (on the 2 s grid) with kernel work due.
          const due = yield* kernelDue(current)
          const gridAfter = (t: number) => start + Math.ceil((Math.max(t, current + 1) - start) / tickMs) * tickMs
          const sleeps = Chunk.toReadonlyArray(yield* TestClock.sleeps()).filter((t) => t > current)
          let next = Math.min(Number.isFinite(due) ? gridAfter(due) : Infinity, ...sleeps)
          if (!Number.isFinite(next)) next = gridAfter(current + 1)
          yield* TestClock.adjust(Duration.millis(Math.min(next, deadline) - current))
        }
        return yield* toResult(executionId)
      })

    const getExecution = (executionId: string) =>
      Effect.map(
        core.getExecution(executionId),
        (r) => DirectClient.fromWire(Protocol.Execution, Wire.encodeExecution(r))
      )
    const steps = (executionId: string) => Effect.map(core.listSteps(executionId, false), Arr.map(decodeStep))
    const events = (executionId: string) => Effect.map(core.eventLog(executionId), Arr.map(decodeEvent))
    const approvals = (executionId?: string) =>
      Effect.map(
        core.listApprovals(),
        (list) =>
          list
            .filter((a) => executionId === undefined || a.executionId === executionId)
            .map((a) => DirectClient.fromWire(Protocol.Approval, Wire.encodeApproval(a)))
      )

    const webhook: TestKernel.Service["webhook"] = (executionId, notice) =>
      Effect.gen(function*() {
        const record = yield* core.getExecution(executionId)
        const dispatches = yield* core.dispatches(executionId)
        const dispatch = notice?.dispatchId === undefined ?
          dispatches[dispatches.length - 1] :
          dispatches.find((d) => d.id === notice.dispatchId)
        const dispatchId = notice?.dispatchId ?? dispatch?.id
        if (dispatchId === undefined) {
          return yield* new Core.KernelFailure({ status: 404, code: "not_found", message: "no dispatch to deliver" })
        }
        const agent = yield* core.getAgent(record.agentId)
        const body = Wire.encodeWebhookBody({
          dispatchId,
          executionId,
          attempt: notice?.attempt ?? Math.max(1, dispatch?.attempt ?? 1),
          agent,
          leaseTimeoutSeconds: notice?.leaseTimeoutSeconds ?? (yield* leaseTimeoutOf(executionId)) / 1000
        })
        const entry = served.get(record.agentId)
        if (entry === undefined) {
          return yield* new Core.KernelFailure({ status: 404, code: "not_found", message: "agent not served" })
        }
        const signature = yield* Signature.sign(agent.secret, body)
        return yield* entry.current.runtime.handleWebhook({ body: encoder.encode(body), signature })
      })

    const kernel: TestKernel.Service = {
      core,
      register,
      create,
      settle,
      run: (agent, input, runOptions) =>
        Effect.flatMap(
          create(typeof agent === "string" ? agent : agent.id, input, { agentVersion: runOptions?.agentVersion }),
          (id) => settle(id, runOptions)
        ),
      crash: (executionId, point) =>
        Effect.sync(() => void crashPlans.set(executionId, { points: [point], recovery: "lease", fired: false })),
      fault: (executionId, fault) => Effect.sync(() => addFault(executionId, fault)),
      restart,
      partition: (agentId) => detach(agentId, undefined),
      failWebhooks: (agentId, failOptions) =>
        Effect.sync(() =>
          void webhookFailures.set(agentId, { remaining: failOptions?.times ?? Infinity })
        ),
      webhook,
      tick: dispatcher.tick,
      expireLeases: core.expireLeases(),
      expireApprovals: core.expireApprovals(),
      execution: getExecution,
      steps,
      events,
      calls: (executionId) =>
        Effect.sync(() => executionId === undefined ? callLog.map((r) => snapshot(core, r)) : executionCalls(executionId)),
      activeRuns,
      approvals,
      grant: (approvalId, decision) =>
        core.grantApproval(approvalId, { decidedBy: decision?.decidedBy ?? "", rationale: decision?.rationale ?? "" }),
      deny: (approvalId, decision) =>
        core.denyApproval(approvalId, { decidedBy: decision?.decidedBy ?? "", rationale: decision?.rationale ?? "" }),
      cancel: (executionId) => core.cancelExecution(executionId),
      loadPolicy: (agentId, bundle) => core.loadPolicy(agentId, bundle),
      deliveries: (executionId) => Effect.sync(() => deliveryCounts.get(executionId) ?? 0),
      httpClient
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
 * (`it.effect` / `it.scoped` from `@effect/vitest`).
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = <R = never>(
  options: Options<R> = {}
): Layer.Layer<TestKernel | KernelClient | Client.Client, never, R> =>
  Layer.scopedContext(
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
