/**
 * The schedule of the kit's deadline sweeps (PROTOCOL 11.1), kept so that
 * settling can skip the dispatcher ticks in between.
 *
 * The dispatcher sweeps execution deadlines on a tick at least
 * `deadlineCheckIntervalMs` (30 s) after its last sweep — its first tick
 * sweeps. Settling with deadlines on used to tick at every point of its grid
 * (every 250 ms of virtual time), so its sweeps fell on the first grid point
 * 30 s or more after the last sweep (or on an earlier tick off the grid,
 * after an enqueue). A tick that settling now skips (nothing due) must still
 * count as the sweep it would have been, or the next sweep — the one that
 * cancels — would move: so the kit's dispatcher asks this schedule at every
 * tick, and the schedule sweeps as the dispatcher would have, counting the
 * skipped grid points as ticks that found no deadline past. It also says when
 * the next sweep that finds a deadline past is, for settling to stop there.
 *
 * @since 0.2.0
 * @internal
 */
import { Clock, Effect } from "effect"
import type * as Core from "../../kernel/Core.js"
import * as Dispatcher from "../../kernel/Dispatcher.js"

/**
 * A grid of virtual time: `start + tickMs · k` (a settle's ticks).
 *
 * @internal
 */
export interface Grid {
  readonly start: number
  readonly tickMs: number
}

/**
 * The kit's deadline-sweep schedule.
 *
 * @internal
 */
export interface DeadlineSweeps {
  /** The core to give the dispatcher: its deadline sweep goes through this schedule. */
  readonly core: Core.KernelCore
  /**
   * The dispatcher options that make it ask the schedule at every tick (the
   * schedule keeps the interval).
   */
  readonly dispatcherOptions: { readonly deadlineCheckIntervalMs: number }
  /**
   * Settling jumped from `from` to `to`: the grid points strictly between
   * them went by without a tick (nothing was due there), each counting as the
   * sweep it would have been.
   */
  readonly passed: (grid: Grid, from: number, to: number) => void
  /** A tick on the grid at `at` was skipped (nothing was due). */
  readonly skippedAt: (at: number) => void
  /**
   * The first point of the grid after `after` at which a sweep, with every
   * grid point ticked from then on, finds the earliest deadline past
   * (`Infinity` when no execution has a deadline).
   */
  readonly due: (grid: Grid, after: number) => number
}

/**
 * Make the deadline-sweep schedule of a kit over its core.
 *
 * @internal
 */
export const make = (core: Core.KernelCore): DeadlineSweeps => {
  const intervalMs = Dispatcher.defaults.deadlineCheckIntervalMs
  /** The last sweep, real or counted (`undefined` before the first). */
  let last: number | undefined

  const sweepsAt = (at: number) => last === undefined || at >= last + intervalMs

  /** The first grid point at or after `t`. */
  const atOrAfter = (grid: Grid, t: number) => grid.start + Math.ceil((t - grid.start) / grid.tickMs) * grid.tickMs
  /** The first grid point strictly after `t`. */
  const after = (grid: Grid, t: number) => grid.start + (Math.floor((t - grid.start) / grid.tickMs) + 1) * grid.tickMs
  /** The grid step between two sweeps when every grid point ticks. */
  const period = (grid: Grid) => Math.ceil(intervalMs / grid.tickMs) * grid.tickMs
  /** The first sweep on the grid after `t`, every grid point ticking. */
  const nextSweep = (grid: Grid, t: number) => {
    const next = after(grid, t)
    return last === undefined ? next : Math.max(next, atOrAfter(grid, last + intervalMs))
  }

  const gated: Core.KernelCore = Object.create(core, {
    cancelPastDeadline: {
      value: () =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          if (!sweepsAt(now)) return Effect.succeed(0)
          last = now
          return core.cancelPastDeadline()
        })
    }
  })

  return {
    core: gated,
    // Asked at every tick: never `now < last + interval` (also with the clock set back).
    dispatcherOptions: { deadlineCheckIntervalMs: -Infinity },
    passed: (grid, from, to) => {
      const first = nextSweep(grid, from)
      if (first >= to) return
      // The grid point before `to`, and the sweeps from `first` on, one period apart, up to it.
      const lastPoint = atOrAfter(grid, to) - grid.tickMs
      last = first + Math.floor((lastPoint - first) / period(grid)) * period(grid)
    },
    skippedAt: (at) => {
      if (sweepsAt(at)) last = at
    },
    due: (grid, t) => {
      const deadline = core.unsafeEarliestDeadline()
      if (deadline === undefined) return Infinity
      const first = nextSweep(grid, t)
      if (first >= deadline) return first
      return first + Math.ceil((deadline - first) / period(grid)) * period(grid)
    }
  }
}
