/**
 * The agents' processes of the test kit: one agent runtime per registered
 * agent, serving it in-process, in a scope the kit can close to "crash" it.
 * A restart replaces the process (its runs die); a partition or a stall cuts
 * it off from new deliveries while its runs carry on — a stalled process is
 * frozen until the next attempt of its execution is delivered. Webhook
 * deliveries go to the current process, or fail when the kit says so.
 *
 * @since 0.2.0
 * @internal
 */
import { STATUS_CODES } from "node:http"
import { Array as Arr, Clock, Context, Deferred, Effect, Exit, Option, Scope } from "effect"
import * as Agent from "../../Agent.js"
import * as Client from "../../Client.js"
import * as Core from "../../kernel/Core.js"
import * as Dispatcher from "../../kernel/Dispatcher.js"
import * as Wire from "../../kernel/Wire.js"
import { KernelClient } from "../../KernelClient.js"
import * as Signature from "../../Signature.js"
import type { TestKernel } from "../TestKernel.js"
import { yieldRound } from "./activity.js"
import { inProcessUrl } from "./clients.js"
import type { TrackedClock } from "./trackedClock.js"

/** One process serving an agent. */
interface Process {
  readonly scope: Scope.Closeable
  readonly runtime: Agent.AgentRuntime
}

interface Served {
  current: Process
  readonly rebuild: Effect.Effect<Agent.AgentRuntime, never, Scope.Scope>
}

/** A stalled run: every call of its lease waits for `release`. */
interface Stall {
  readonly executionId: string
  readonly release: Deferred.Deferred<void>
  released: boolean
}

const encoder = new TextEncoder()

/**
 * An answer other than 2xx, as the kernel's HTTP deliverer reports it
 * (`the agent answered 500 Internal Server Error`).
 */
const answeredWith = (status: number): Dispatcher.DeliveryError => {
  const text = STATUS_CODES[status]
  return new Dispatcher.DeliveryError({
    reason: "http_status",
    message: `the agent answered ${text === undefined ? String(status) : `${status} ${text}`}`,
    status
  })
}

/** No process serves the agent: nothing listens at its webhook URL. */
const refused = (): Dispatcher.DeliveryError =>
  new Dispatcher.DeliveryError({ reason: "connection_refused", message: "connection refused" })

/**
 * The lease timeout of an execution's dispatches: its agent's, or the kernel's.
 *
 * @since 0.2.0
 * @internal
 */
export const leaseTimeoutOf = (core: Core.KernelCore, executionId: string): Effect.Effect<number> =>
  Effect.gen(function*() {
    const execution = yield* Effect.option(core.getExecution(executionId))
    if (Option.isNone(execution)) return core.settings.leaseTimeoutMs
    const agent = yield* Effect.option(core.getAgent(execution.value.agentId))
    return Option.isSome(agent) && agent.value.leaseTimeoutMs !== undefined ?
      agent.value.leaseTimeoutMs :
      core.settings.leaseTimeoutMs
  })

/**
 * The agents' processes.
 *
 * @since 0.2.0
 * @internal
 */
export interface Processes {
  /**
   * Register an agent with the core (upsert) and serve it from a fresh
   * process, with `kernelClient` and, unless the caller's context has one,
   * `client` (subagent calls create their children with it).
   */
  readonly register: <R>(
    agent: Agent.Agent<any, any, any, R>,
    kernelClient: KernelClient.Service,
    client: Client.Client.Service,
    policy: string | undefined
  ) => Effect.Effect<void, Core.KernelFailure, Exclude<R, Client.Client>>
  /** The agent's process dies: its runs are interrupted and a fresh process serves it. */
  readonly restart: (agentId: string) => Effect.Effect<void>
  /** A fresh process serves the agent; the runs of the previous one carry on. */
  readonly partition: (agentId: string) => Effect.Effect<void>
  /**
   * The process running this run (its lease key) stalls: it is cut off from new
   * deliveries, and the run's calls wait until the next attempt of its
   * execution is delivered. Returns that wait.
   */
  readonly stall: (key: string, executionId: string, agentId: string) => Effect.Effect<Effect.Effect<void>>
  /** Whether the run (by its lease key) is stalled and not woken up yet. */
  readonly isStalled: (key: string) => boolean
  /** The wait of a stalled run (by its lease key), or `undefined` when it is not stalled. */
  readonly stalled: (key: string) => Effect.Effect<void> | undefined
  /** Whether any run has ever stalled. */
  readonly anyStalls: () => boolean
  /** Runs of the current processes, and of cut-off processes that are awake (a frozen one is not waited for). */
  readonly activeRuns: Effect.Effect<number>
  /**
   * The dispatcher's delivery: wakes the stalled runs of the execution, then
   * hands the webhook to its agent. A failed delivery fails with the
   * `DeliveryError` the kernel's HTTP deliverer would give: an injected
   * webhook failure as a `500` answer, an agent no process serves as a
   * refused connection, another answer than 2xx with its status.
   */
  readonly deliver: Dispatcher.Deliver
  /** Send a signed webhook for an execution straight to its agent's process. */
  readonly webhook: TestKernel.Service["webhook"]
  /** Fail the agent's next `times` webhook deliveries. */
  readonly failWebhooks: (agentId: string, times: number) => void
  /** Webhook deliveries (runs started) so far, per execution. */
  readonly deliveries: (executionId: string) => number
  /** Stop every process: release the stalled runs, close every scope. */
  readonly close: Effect.Effect<void>
}

/**
 * Make the processes of a kit over `core`. Agents are registered with
 * `secret`, and their runtimes (and so their runs) see `clock`.
 *
 * @since 0.2.0
 * @internal
 */
export const make = (options: {
  readonly core: Core.KernelCore
  readonly secret: string
  readonly clock: TrackedClock
}): Processes => {
  const { core, secret } = options
  const served = new Map<string, Served>()
  /** Processes cut off from new deliveries (stalled or partitioned) whose runs may still be alive. */
  const zombies: Array<Process & { readonly stall: Stall | undefined }> = []
  const stalls = new Map<string, Stall>()
  const deliveryCounts = new Map<string, number>()
  const webhookFailures = new Map<string, { remaining: number }>()

  const register = <R>(
    agent: Agent.Agent<any, any, any, R>,
    kernelClient: KernelClient.Service,
    client: Client.Client.Service,
    policy: string | undefined
  ): Effect.Effect<void, Core.KernelFailure, Exclude<R, Client.Client>> =>
    Effect.gen(function*() {
      yield* core.registerAgent({
        id: agent.id,
        webhookUrl: `${inProcessUrl}/agents/${agent.id}/webhook`,
        secret,
        ...(policy === undefined ? {} : { policyBundle: policy })
      })
      // Without the caller's Scope, so the runtime lives in the scope we can close to "crash" it;
      // on the kit's clock (provided below), which the runtime's runs inherit.
      // The kit's Client unless the caller brings its own (e.g. one with a scoped API key).
      const context = Context.merge(
        Context.make(Client.Client, client),
        Context.omit(Scope.Scope)(yield* Effect.context<Exclude<R, Client.Client>>())
      ) as Context.Context<R>
      const rebuild = Agent.runtime(agent).pipe(
        Effect.provideService(KernelClient, kernelClient),
        Effect.provide(context)
      ) as Effect.Effect<Agent.AgentRuntime, never, Scope.Scope>
      const existing = served.get(agent.id)
      if (existing !== undefined) yield* Scope.close(existing.current.scope, Exit.void)
      const scope = yield* Scope.make()
      const runtime = yield* Scope.provide(rebuild, scope)
      served.set(agent.id, { current: { scope, runtime }, rebuild })
    }).pipe(Effect.provideService(Clock.Clock, options.clock))

  /** Cut the agent's process off from new deliveries (its runs carry on) and start a fresh one. */
  const detach = (agentId: string, stall: Stall | undefined): Effect.Effect<void> =>
    Effect.gen(function*() {
      const entry = served.get(agentId)
      if (entry === undefined) return
      const old = entry.current
      const scope = yield* Scope.make()
      entry.current = { scope, runtime: yield* Scope.provide(entry.rebuild, scope) }
      zombies.push({ ...old, stall })
    })

  const restart = (agentId: string): Effect.Effect<void> =>
    Effect.gen(function*() {
      const entry = served.get(agentId)
      if (entry === undefined) return
      const old = entry.current
      const scope = yield* Scope.make()
      entry.current = { scope, runtime: yield* Scope.provide(entry.rebuild, scope) }
      yield* Scope.close(old.scope, Exit.void)
    })

  const stall = (key: string, executionId: string, agentId: string): Effect.Effect<Effect.Effect<void>> =>
    Effect.gen(function*() {
      const release = yield* Deferred.make<void>()
      const stall: Stall = { executionId, release, released: false }
      yield* detach(agentId, stall)
      stalls.set(key, stall)
      return Deferred.await(release)
    })

  const stalled = (key: string): Effect.Effect<void> | undefined => {
    const stall = stalls.get(key)
    return stall === undefined || stall.released ? undefined : Deferred.await(stall.release)
  }

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
      if (woke) for (let i = 0; i < 3; i++) yield* yieldRound
      const failing = webhookFailures.get(claim.agent.id)
      if (failing !== undefined && failing.remaining > 0) {
        failing.remaining--
        return yield* answeredWith(500)
      }
      const entry = served.get(claim.agent.id)
      if (entry === undefined) return yield* refused()
      deliveryCounts.set(claim.executionId, (deliveryCounts.get(claim.executionId) ?? 0) + 1)
      const status = yield* entry.current.runtime.handleWebhook({ body: encoder.encode(body), signature })
      if (status >= 200 && status < 300) return true
      return yield* answeredWith(status)
    })

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
        leaseTimeoutSeconds: notice?.leaseTimeoutSeconds ?? (yield* leaseTimeoutOf(core, executionId)) / 1000
      })
      const entry = served.get(record.agentId)
      if (entry === undefined) {
        return yield* new Core.KernelFailure({ status: 404, code: "not_found", message: "agent not served" })
      }
      const signature = yield* Signature.sign(agent.secret, body)
      return yield* entry.current.runtime.handleWebhook({ body: encoder.encode(body), signature })
    })

  const close = Effect.gen(function*() {
    for (const stall of stalls.values()) {
      if (!stall.released) yield* Deferred.interrupt(stall.release)
    }
    yield* Effect.forEach(zombies, (process) => Scope.close(process.scope, Exit.void), { discard: true })
    yield* Effect.forEach(served.values(), (entry) => Scope.close(entry.current.scope, Exit.void), {
      discard: true
    })
  })

  return {
    register,
    restart,
    partition: (agentId) => detach(agentId, undefined),
    stall,
    isStalled: (key) => {
      const stall = stalls.get(key)
      return stall !== undefined && !stall.released
    },
    stalled,
    anyStalls: () => stalls.size > 0,
    activeRuns,
    deliver,
    webhook,
    failWebhooks: (agentId, times) => void webhookFailures.set(agentId, { remaining: times }),
    deliveries: (executionId) => deliveryCounts.get(executionId) ?? 0,
    close
  }
}
