/**
 * Settling an execution on virtual time: the test kit drives the kernel as
 * the embedded kernel's loop would — a dispatcher tick on a grid of virtual
 * time (250 ms in the current stage, 2 s before it), and at once after an
 * enqueue — lets the agents' processes run
 * until nothing moves, then moves the `TestClock` straight to the next thing
 * that can happen: a sleep of a run ending (heartbeats, backoffs, the agent's
 * own sleeps, all on the kit's tracked clock), or a tick with kernel work
 * due (a retry, a lease expiry, an approval timeout). Idle stretches are
 * skipped in one step.
 *
 * A long sleep of a run is mostly heartbeats (one every 30 s of virtual time
 * with the default lease): each is its own wake-up, in order, as on a real
 * kernel. A wake-up that only beat — every sleep that ended was a heartbeat
 * timer's, every call it made was a heartbeat answered `ok`, nothing is in
 * flight — changed nothing but the renewed leases, so the kit does not wait
 * for the processes to go quiet after it, and skips the dispatcher tick of
 * that instant when no kernel work is due and nothing has moved since the
 * last tick (such a tick would do nothing).
 *
 * With execution deadlines on, the kernel work due includes the next
 * deadline sweep that finds a deadline past, on the schedule the dispatcher
 * sweeps on when every tick of the grid is made (`DeadlineSweeps`): the
 * ticks skipped before it count as the sweeps they would have been, so the
 * execution is cancelled at the same virtual time as when every 250 ms tick
 * was made, without making them.
 *
 * @since 0.2.0
 * @internal
 */
import { Clock, Duration, Effect } from "effect"
import type * as Core from "../../kernel/Core.js"
import * as Dispatcher from "../../kernel/Dispatcher.js"
import * as Protocol from "../../Protocol.js"
import type { RunOptions, RunResult } from "../TestKernel.js"
import { type Activity, yieldRound } from "./activity.js"
import type { CallLog } from "./callLog.js"
import type { DeadlineSweeps } from "./deadlineSweeps.js"
import type { Faults } from "./faults.js"
import { leaseTimeoutOf, type Processes } from "./processes.js"
import * as Views from "./views.js"
import type { TrackedClock } from "./trackedClock.js"

/**
 * Make the `settle` of a kit.
 *
 * @since 0.2.0
 * @internal
 */
export const makeSettle = (options: {
  readonly core: Core.KernelCore
  readonly dispatcher: Dispatcher.Dispatcher
  readonly clock: TrackedClock
  readonly activity: Activity
  readonly processes: Processes
  readonly faults: Faults
  readonly callLog: CallLog
  readonly sweeps: DeadlineSweeps
  readonly result: (executionId: string, timedOut: boolean) => Effect.Effect<RunResult, Core.KernelFailure>
}): (executionId: string, runOptions?: RunOptions) => Effect.Effect<RunResult, Core.KernelFailure> => {
  const { activity, callLog, clock, core, dispatcher, faults, processes, sweeps } = options

  /**
   * Whether the calls logged from `from` on are all heartbeats that reached
   * the kernel, were answered `ok` and got their answer, with nothing injected.
   */
  const onlyBeats = (from: number): boolean => {
    for (let seq = from; seq < callLog.size; seq++) {
      const call = callLog.get(seq)!
      if (
        call.call !== "heartbeat" || call.pending || !call.reached || !call.delivered || call.answer !== "ok" ||
        call.injected !== undefined
      ) return false
    }
    return true
  }

  /** Yield until nothing moves: no call made or answered for a few rounds (longer while calls are in flight). */
  const drain = Effect.gen(function*() {
    let idle = 0
    while (true) {
      const before = activity.progress
      yield* yieldRound
      if (activity.progress !== before) {
        idle = 0
        continue
      }
      if (activity.inFlight <= 0 && (yield* processes.activeRuns) === 0) return
      idle++
      if (idle >= (activity.inFlight > 0 ? 24 : 3)) return
    }
  })

  /**
   * The earliest virtual time at which a tick would have something to do
   * (`Infinity` if never), deadline sweeps aside (see {@link DeadlineSweeps.due}).
   */
  const kernelDue: Effect.Effect<number> =
    Effect.gen(function*() {
      let due = Infinity
      for (const d of yield* core.dispatches()) {
        if (d.status === "pending" || d.status === "failed") {
          due = Math.min(due, d.nextAttemptAtMs)
        } else if (d.status === "in_flight" && d.lockedAtMs !== undefined) {
          due = Math.min(due, d.lockedAtMs + (yield* leaseTimeoutOf(core, d.executionId)) + 1)
        }
      }
      for (const approval of yield* core.listApprovals()) due = Math.min(due, approval.timeoutAtMs)
      return due
    })

  /**
   * Whether a non-terminal, non-running execution can only move on when
   * someone acts (or a timeout fires): it is `blocked` on an approval; or
   * `blocked` on its subagents (PROTOCOL-CURRENT C.5.2) all of which wait on
   * people themselves; or `pending` in a session (C.4.4) whose busy
   * execution waits on people. A blocked execution with a subagent still at
   * work, or a pending one whose session will free up, is not settled.
   */
  const waitsOnPeople = (record: Core.ExecutionRecord): Effect.Effect<boolean> =>
    Effect.gen(function*() {
      if (record.status === "blocked") {
        if (core.settings.stage !== "current") return true
        if ((yield* core.listApprovals()).some((a) => a.executionId === record.id)) return true
        const children = yield* Views.children(core, record.id)
        const active = children.filter((c) => !Protocol.isTerminalStatus(c.status))
        if (active.length === 0) return true
        for (const child of active) {
          if (child.status === "running" || !(yield* waitsOnPeople(child))) return false
        }
        return true
      }
      if (record.status === "pending" && record.session !== undefined) {
        const members = yield* Views.sessionMembers(core, record.session)
        const busy = members.find((m) => m.status === "running" || m.status === "blocked")
        return busy !== undefined && busy.status === "blocked" && (yield* waitsOnPeople(busy))
      }
      return false
    })

  /** A dispatch enqueued since the last tick: the kernel's loop would tick at once. */
  const freshlyEnqueued = (now: number): Effect.Effect<boolean> =>
    Effect.map(
      core.dispatches(),
      (list) => list.some((d) => d.status === "pending" && d.attempt === 0 && d.nextAttemptAtMs <= now)
    )

  return (executionId, runOptions) =>
    Effect.gen(function*() {
      faults.arm(executionId, runOptions)
      // The current stage's dispatcher polls every 250 ms (PROTOCOL-CURRENT C.10), older ones every 2 s.
      const tickMs = core.settings.stage === "current"
        ? Dispatcher.defaults.currentTickIntervalMs
        : Dispatcher.defaults.tickIntervalMs
      const start = yield* Clock.currentTimeMillis
      const grid = { start, tickMs }
      // (`deadlineMs` is read where it is used: a test may turn deadlines on or off between settles.)
      const deadlinesOn = () => core.settings.deadlineMs !== undefined
      const deadline = start + Duration.toMillis(Duration.fromInputUnsafe(runOptions?.timeout ?? Duration.hours(1)))
      let lastTick: number | undefined
      /** The last wake-up only beat (see the module's doc): no waiting for quiet after it. */
      let quiet = false
      /** Something moved (a call other than a beat, a tick that did work) since the last tick. */
      let moved = true
      /** The earliest virtual time with kernel work due, as of the end of the last iteration. */
      let dueAt = -Infinity
      let timedOut = false
      while (true) {
        const now = yield* Clock.currentTimeMillis
        let tickNow = ((now - start) % tickMs === 0 && lastTick !== now) || (yield* freshlyEnqueued(now))
        if (faults.expiryRequested()) {
          // A crashed or stalled run asked for its lease to lapse at once.
          faults.clearExpiryRequests()
          yield* core.expireLeases()
          tickNow = true
          quiet = false
          moved = true
        }
        // After a wake-up that only beat, a tick with no kernel work due and nothing moved since the last one would do nothing.
        if (tickNow && quiet && !moved && now < dueAt) {
          tickNow = false
          if (deadlinesOn()) sweeps.skippedAt(now)
        }
        const progress = activity.progress
        if (tickNow) {
          lastTick = now
          moved = false
          yield* dispatcher.tick
        }
        if (!quiet || tickNow) yield* drain
        if (activity.progress !== progress) moved = true
        if (faults.expiryRequested()) continue
        const record = yield* core.getExecution(executionId)
        const settled = Protocol.isTerminalStatus(record.status) ||
          (record.status !== "running" && (yield* waitsOnPeople(record)))
        if (settled && (yield* processes.activeRuns) === 0) break
        const current = yield* Clock.currentTimeMillis
        if (current >= deadline) {
          timedOut = true
          break
        }
        // Move virtual time to the next thing that can happen: a sleep ending, or a
        // tick (on the grid) with kernel work due.
        const due = yield* kernelDue
        const gridAfter = (t: number) => start + Math.ceil((Math.max(t, current + 1) - start) / tickMs) * tickMs
        dueAt = Number.isFinite(due) ? gridAfter(due) : Infinity
        if (deadlinesOn()) dueAt = Math.min(dueAt, sweeps.due(grid, current))
        const sleeps = clock.pendingSleeps().filter((t) => t > current)
        let next = Math.min(dueAt, ...sleeps)
        if (!Number.isFinite(next)) next = gridAfter(current + 1)
        const calls = callLog.size
        const inFlight = activity.inFlight
        clock.takeWakeUps()
        const to = Math.min(next, deadline)
        // The ticks of the grid points jumped over would have found nothing due: deadline sweeps included.
        if (deadlinesOn()) sweeps.passed(grid, current, to)
        yield* clock.adjust(Duration.millis(to - current))
        const woke = clock.takeWakeUps()
        quiet = woke.run === 0 && inFlight <= 0 && activity.inFlight <= 0 && !faults.expiryRequested() &&
          onlyBeats(calls)
        if (!quiet) moved = true
      }
      return yield* options.result(executionId, timedOut)
    }).pipe(Effect.provideService(Clock.Clock, clock))
}
