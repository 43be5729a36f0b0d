/**
 * The test kit: the embedded kernel's core provided in-process as a Layer, with
 * in-process webhook delivery and a `KernelClient` and `Client` wired to it, all
 * on Effect's `Clock` — so an agent is unit-tested deterministically under
 * `TestClock`: replay, crashes, lease loss, approvals, denials, rate limits,
 * cancellation and heartbeats, without sockets or real time.
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
import { stringifyStrict } from "../internal/json.js"
import * as DirectClient from "./internal/directClient.js"
import * as InMemoryHttp from "./internal/inMemoryHttp.js"

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
    readonly call: "submitStep" | "completeStep" | "failStep" | "completeExecution" | "failExecution"
    readonly index: number
    readonly when: "before" | "after"
  }

/**
 * Options of {@link TestKernel.Service.run} and {@link TestKernel.Service.settle}.
 *
 * @since 0.1.0
 * @category models
 */
export interface RunOptions {
  /** Inject a crash into the first run that reaches this point. */
  readonly crash?: CrashPoint | undefined
  /** The agent version label recorded on the execution. */
  readonly agentVersion?: string | undefined
  /** Give up after this much virtual time (default 1 hour). */
  readonly timeout?: Duration.DurationInput | undefined
}

/**
 * What a settled execution looks like from outside: its status, output,
 * failure reason, steps, events and pending approvals, decoded exactly as a
 * client would see them over HTTP.
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
     * and lease expiry) until the execution is terminal or blocked on an approval.
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
    /** Simulate a restart of an agent's process: its runs die, a fresh runtime serves it. */
    readonly restart: (agentId: string) => Effect.Effect<void>
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
    /** Webhook deliveries made so far, per execution. */
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

interface Served {
  scope: Scope.CloseableScope
  runtime: Agent.AgentRuntime
  readonly rebuild: Effect.Effect<Agent.AgentRuntime, never, Scope.Scope>
}

interface CrashPlan {
  readonly point: CrashPoint
  fired: boolean
}

const leaseKey = (executionId: string, lease: KernelClientModule.Lease): string =>
  `${executionId}/${lease.dispatchId}/${lease.attempt ?? "?"}`

const encoder = new TextEncoder()

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
    const crashPlans = new Map<string, CrashPlan>()
    const callCounts = new Map<string, Map<string, number>>()
    const deliveryCounts = new Map<string, number>()
    let progress = 0

    const restart = (agentId: string): Effect.Effect<void> =>
      Effect.gen(function*() {
        const entry = served.get(agentId)
        if (entry === undefined) return
        const old = entry.scope
        entry.scope = yield* Scope.make()
        entry.runtime = yield* Scope.extend(entry.rebuild, entry.scope)
        yield* Scope.close(old, Exit.void)
      })

    /** The process dies here: restart the agent from a daemon fiber and never return. */
    const crashNow = (executionId: string): Effect.Effect<void> =>
      Effect.gen(function*() {
        const record = yield* Effect.orDie(core.getExecution(executionId))
        yield* Effect.forkDaemon(restart(record.agentId))
        // A dead process makes no progress, even inside an uninterruptible region
        // of the run (e.g. recording an outcome): let the restart interrupt it.
        return yield* Effect.interruptible(Effect.never)
      })

    const countCall = (call: string, caller: KernelClientModule.Caller, executionId: string): number => {
      const key = leaseKey(executionId, caller.lease)
      let counts = callCounts.get(key)
      if (counts === undefined) {
        counts = new Map()
        callCounts.set(key, counts)
      }
      const n = counts.get(call) ?? 0
      counts.set(call, n + 1)
      return n
    }

    const interceptor: DirectClient.Interceptor = {
      before: (call, caller, executionId) =>
        Effect.suspend(() => {
          progress++
          const plan = crashPlans.get(executionId)
          const index = countCall(call, caller, executionId)
          if (plan === undefined || plan.fired || !("call" in plan.point)) return Effect.void
          if (plan.point.call === call && plan.point.index === index && plan.point.when === "before") {
            plan.fired = true
            return crashNow(executionId)
          }
          return Effect.void
        }),
      after: (call, caller, executionId) =>
        Effect.suspend(() => {
          progress++
          const plan = crashPlans.get(executionId)
          if (plan === undefined || plan.fired) return Effect.void
          const counts = callCounts.get(leaseKey(executionId, caller.lease))
          const index = (counts?.get(call) ?? 1) - 1
          const point = plan.point
          if ("afterSteps" in point) {
            if (call !== "completeStep" && call !== "failStep") return Effect.void
            const outcomes = (counts?.get("completeStep") ?? 0) + (counts?.get("failStep") ?? 0)
            if (outcomes < point.afterSteps) return Effect.void
          } else if (point.call !== call || point.index !== index || point.when !== "after") {
            return Effect.void
          }
          plan.fired = true
          return crashNow(executionId)
        })
    }

    const direct = DirectClient.make(core, secret, interceptor)
    const kernelClient: KernelClient["Type"] = options.transport === "http"
      ? yield* KernelClientModule.make({ baseUrl: inProcessUrl, secret }).pipe(
        Effect.provideService(HttpClient.HttpClient, httpClient),
        Effect.orDie
      )
      : direct

    const client = yield* Client.make({ baseUrl: inProcessUrl }).pipe(
      Effect.provideService(HttpClient.HttpClient, httpClient),
      Effect.orDie
    )

    const deliver: Dispatcher.Deliver = (claim, body, signature) =>
      Effect.suspend(() => {
        const entry = served.get(claim.agent.id)
        if (entry === undefined) return Effect.succeed(false)
        deliveryCounts.set(claim.executionId, (deliveryCounts.get(claim.executionId) ?? 0) + 1)
        return Effect.map(
          entry.runtime.handleWebhook({ body: encoder.encode(body), signature }),
          (status) => status >= 200 && status < 300
        )
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
        if (existing !== undefined) yield* Scope.close(existing.scope, Exit.void)
        const scope = yield* Scope.make()
        const runtime = yield* Scope.extend(rebuild, scope)
        served.set(agent.id, { scope, runtime, rebuild })
      })

    yield* Effect.addFinalizer(() =>
      Effect.forEach(served.values(), (entry) => Scope.close(entry.scope, Exit.void), { discard: true })
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

    const activeRuns = Effect.map(
      Effect.forEach(Arr.fromIterable(served.values()), (entry) => entry.runtime.activeRuns),
      Arr.reduce(0, (a, b) => a + b)
    )

    /** Let forked fibers and pending promises (Web Crypto) make progress. */
    const yieldRound = Effect.zipRight(
      Effect.repeatN(Effect.yieldNow(), 4),
      Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
    )

    /** Wait for the runs in progress to end, moving virtual time while they only wait on it. */
    const drainRuns = (deadline: number) =>
      Effect.gen(function*() {
        let idleRounds = 0
        while (true) {
          const before = progress
          yield* yieldRound
          if ((yield* activeRuns) === 0) return
          if (progress !== before) {
            idleRounds = 0
            continue
          }
          idleRounds++
          if (idleRounds < 3) continue
          idleRounds = 0
          const sleeps = yield* TestClock.sleeps()
          const now = yield* Clock.currentTimeMillis
          if (now >= deadline) return
          const next = Chunk.isEmpty(sleeps) ? now + 1_000 : Math.min(...Chunk.toReadonlyArray(sleeps))
          yield* TestClock.adjust(Duration.millis(Math.max(1, Math.min(next, deadline) - now)))
        }
      })

    const toResult = (executionId: string): Effect.Effect<RunResult, Core.KernelFailure> =>
      Effect.gen(function*() {
        const execution = yield* getExecution(executionId)
        return {
          executionId,
          status: execution.status as Protocol.ExecutionStatus,
          output: execution.output,
          failureReason: execution.failureReason,
          execution,
          steps: yield* steps(executionId),
          events: yield* events(executionId),
          approvals: yield* approvals(executionId),
          deliveries: deliveryCounts.get(executionId) ?? 0
        }
      })

    const settle = (executionId: string, runOptions?: RunOptions): Effect.Effect<RunResult, Core.KernelFailure> =>
      Effect.gen(function*() {
        if (runOptions?.crash !== undefined) crashPlans.set(executionId, { point: runOptions.crash, fired: false })
        const start = yield* Clock.currentTimeMillis
        const deadline = start + Duration.toMillis(Duration.decode(runOptions?.timeout ?? Duration.hours(1)))
        while (true) {
          yield* dispatcher.tick
          yield* drainRuns(deadline)
          const record = yield* core.getExecution(executionId)
          if (Protocol.isTerminalStatus(record.status) || record.status === "blocked") break
          const now = yield* Clock.currentTimeMillis
          if (now >= deadline) break
          // Nothing is running: wait for a backoff or a lease to lapse, one tick at a time.
          yield* TestClock.adjust(Duration.millis(Dispatcher.defaults.tickIntervalMs))
        }
        return yield* toResult(executionId)
      })

    const getExecution = (executionId: string) =>
      Effect.map(
        core.getExecution(executionId),
        (r) => DirectClient.fromWire(Protocol.Execution, Wire.encodeExecution(r))
      )
    const steps = (executionId: string) =>
      Effect.map(
        core.listSteps(executionId, false),
        Arr.map((s) => DirectClient.fromWire(Protocol.Step, Wire.encodeStep(s)))
      )
    const events = (executionId: string) =>
      Effect.map(
        core.eventLog(executionId),
        Arr.map((e) => DirectClient.fromWire(Protocol.Event, Wire.encodeEvent(e)))
      )
    const approvals = (executionId?: string) =>
      Effect.map(
        core.listApprovals(),
        (list) =>
          list
            .filter((a) => executionId === undefined || a.executionId === executionId)
            .map((a) => DirectClient.fromWire(Protocol.Approval, Wire.encodeApproval(a)))
      )

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
      crash: (executionId, point) => Effect.sync(() => void crashPlans.set(executionId, { point, fired: false })),
      restart,
      tick: dispatcher.tick,
      expireLeases: core.expireLeases(),
      expireApprovals: core.expireApprovals(),
      execution: getExecution,
      steps,
      events,
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
