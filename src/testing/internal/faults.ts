/**
 * Fault injection at the agent → kernel calls: the crash, lease-lapse and
 * transport-failure plans of each execution, and the interceptor that logs
 * every call and applies them. A crash kills the agent's process at the
 * point; a lapse stalls it until the next attempt; a fault fails the call as
 * a lost connection would, before or after the kernel processed it.
 *
 * @since 0.2.0
 * @internal
 */
import { Effect } from "effect"
import type * as Core from "../../kernel/Core.js"
import { KernelError, TransportError } from "../../RebunoError.js"
import type { CrashPoint, Fault, RunOptions } from "../TestKernel.js"
import type { Activity } from "./activity.js"
import type { CallLog, CallRecord } from "./callLog.js"
import type { CallInfo, Interceptor } from "./directClient.js"
import type { Processes } from "./processes.js"

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

interface FaultPlan {
  readonly fault: Fault
  remaining: number
  /** The run (lease key) the fault is bound to once it first fired. */
  key: string | undefined
}

const injectedFailure = (when: "before" | "after") =>
  new KernelError({
    reason: new TransportError({
      description: when === "before" ?
        "injected transport failure: the kernel is unreachable" :
        "injected transport failure: the connection dropped before the answer arrived"
    })
  })

/**
 * The fault plans of a kit and the interceptor that applies them.
 *
 * @since 0.2.0
 * @internal
 */
export interface Faults {
  /** Logs every call and injects what is planned at it. */
  readonly interceptor: Interceptor
  /** Plan the crashes, lapse and faults of a run's options for an execution. */
  readonly arm: (executionId: string, options: RunOptions | undefined) => void
  /** Plan a crash (lease recovery) for an execution. */
  readonly crash: (executionId: string, point: CrashPoint) => void
  /** Plan a transport failure for an execution's calls. */
  readonly fault: (executionId: string, fault: Fault) => void
  /** Whether a crashed or stalled run asked for an immediate lease lapse since the last clear. */
  readonly expiryRequested: () => boolean
  readonly clearExpiryRequests: () => void
  /** Whether a planned crash / lapse of the execution fired. */
  readonly crashed: (executionId: string) => boolean
  readonly lapsed: (executionId: string) => boolean
}

/**
 * Make the fault plans of a kit.
 *
 * @since 0.2.0
 * @internal
 */
export const make = (options: {
  readonly core: Core.KernelCore
  readonly callLog: CallLog
  readonly processes: Processes
  readonly activity: Activity
}): Faults => {
  const { activity, callLog, core, processes } = options
  const crashPlans = new Map<string, CrashPlan>()
  const lapsePlans = new Map<string, LapsePlan>()
  const faultPlans = new Map<string, Array<FaultPlan>>()
  /** Executions whose crashed or stalled run asked for an immediate lease lapse. */
  const expiryRequested = new Set<string>()

  /** The process dies here: restart the agent from a detached fiber and never return. */
  const crashNow = (executionId: string, agentId: string, recovery: "lease" | "immediate"): Effect.Effect<never> =>
    Effect.gen(function*() {
      if (recovery === "immediate") expiryRequested.add(executionId)
      yield* Effect.forkDetach(processes.restart(agentId))
      // A dead process makes no progress, even inside an uninterruptible region
      // of the run (e.g. recording an outcome): let the restart interrupt it.
      return yield* Effect.interruptible(Effect.never)
    })

  /** The process stalls here: cut it off from new deliveries and wait until the next attempt wakes it up. */
  const stallNow = (record: CallRecord, agentId: string, recovery: "lease" | "immediate"): Effect.Effect<void> =>
    Effect.gen(function*() {
      const wake = yield* processes.stall(record.key, record.executionId, agentId)
      if (recovery === "immediate") expiryRequested.add(record.executionId)
      yield* activity.parked(wake)
    })

  const matches = (point: CrashPoint, record: CallRecord, when: "before" | "after"): boolean => {
    if ("afterSteps" in point) {
      if (when !== "after" || (record.call !== "completeStep" && record.call !== "failStep")) return false
      const counts = callLog.countsOf(record.key)
      return (counts?.completeStep ?? 0) + (counts?.failStep ?? 0) >= point.afterSteps
    }
    return point.call === record.call && point.index === record.index && point.when === when
  }

  /** What is injected at a call once it is recorded: a stall, a crash, a lapse or a fault. */
  const injectBefore = (info: CallInfo, record: CallRecord): Effect.Effect<number, KernelError> =>
    Effect.gen(function*() {
      // A stalled run makes no call until it wakes up.
      const stalled = processes.stalled(record.key)
      if (stalled !== undefined) yield* activity.parked(stalled)

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
    if (crashPlans.size === 0 && lapsePlans.size === 0 && faultPlans.size === 0 && !processes.anyStalls()) {
      return false
    }
    if (processes.isStalled(key)) return true
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

  const interceptor: Interceptor = {
    before: (info, now) => {
      activity.progress++
      const seq = callLog.append(info, now)
      return planned(info.executionId, callLog.keyOf(seq)) ? injectBefore(info, callLog.get(seq)!) : seq
    },
    after: (id, answer, stepId) => {
      activity.progress++
      if (!callLog.isPending(id)) return
      const inject = callLog.losesAnswer(id) || planned(callLog.executionIdOf(id), callLog.keyOf(id))
      callLog.answered(id, answer, stepId, !inject)
      if (inject) return injectAfter(callLog.get(id)!)
    },
    track: activity.countInFlight
  }

  const addFault = (executionId: string, fault: Fault): void => {
    let list = faultPlans.get(executionId)
    if (list === undefined) {
      list = []
      faultPlans.set(executionId, list)
    }
    list.push({ fault, remaining: Math.max(0, fault.times ?? 1), key: undefined })
  }

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

  return {
    interceptor,
    arm,
    crash: (executionId, point) => void crashPlans.set(executionId, { points: [point], recovery: "lease", fired: false }),
    fault: addFault,
    expiryRequested: () => expiryRequested.size > 0,
    clearExpiryRequests: () => expiryRequested.clear(),
    crashed: (executionId) => crashPlans.get(executionId)?.fired ?? false,
    lapsed: (executionId) => lapsePlans.get(executionId)?.fired ?? false
  }
}
