import { describe, expect, it } from "@effect/vitest"
import { Clock, Duration, Effect } from "effect"
import { Agent, Step } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"
import { TestClock } from "effect/testing"
import * as TrackedClock from "../../src/testing/internal/trackedClock.js"

const MINUTE = 60_000
const HOUR = 60 * MINUTE
const DAY = 24 * HOUR
/** The heartbeat interval with the kit's default lease (120 s): min(lease / 3, 30 s). */
const BEAT = 30_000

/** The virtual times of an execution's heartbeats. */
const beats = (run: TestKernel.RunResult) => run.calls.filter((c) => c.call === "heartbeat").map((c) => c.atMs)

/** Each heartbeat one interval after the previous one, the first one interval after `from`, up to `until` (inclusive). */
const expectEveryBeat = (times: ReadonlyArray<number>, from: number, until: number) => {
  const expected: Array<number> = []
  for (let t = from + BEAT; t <= until; t += BEAT) expected.push(t)
  expect(times.length).toBe(expected.length)
  expect(times).toEqual(expected)
}

/** When the execution was cancelled (its `execution.cancelled` event). */
const cancelledAt = (run: TestKernel.RunResult) => {
  const cancelled = run.events.filter((e) => e.type === "execution.cancelled")
  expect(cancelled.length).toBe(1)
  return Date.parse(cancelled[0]!.occurredAt)
}

/**
 * Run `body` with the kit's tracked clock counting its moves: each is one
 * visit of the settling loop (a wake-up or a dispatcher tick it stopped at).
 */
const countingVisits = <A, E, R>(body: (visits: () => number) => Effect.Effect<A, E, R>) =>
  Clock.clockWith((clock) => {
    const tracked = TrackedClock.wrap(clock as TestClock.TestClock)
    let visits = 0
    const counting: TrackedClock.TrackedClock = {
      ...tracked,
      adjust: (duration) => {
        visits++
        return tracked.adjust(duration)
      }
    }
    return Effect.provideService(body(() => visits), Clock.Clock, counting)
  })

const sleeper = (sleep: (d: Duration.Input) => Effect.Effect<void, any, any>, d: Duration.Input) =>
  Agent.make({
    id: "sleeper",
    handler: () =>
      Effect.gen(function*() {
        yield* sleep(d)
        return yield* Step.now
      })
  })

describe("TestKernel: long sleeps with execution deadlines on", () => {
  it.effect("a 24-hour durable Step.sleep under a 7-day deadline completes at the right virtual time, every heartbeat in order", () => {
    const agent = sleeper(Step.sleep, "24 hours")
    return countingVisits((visits) =>
      Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const start = yield* Clock.currentTimeMillis
        const run = yield* kernel.run(agent, {}, { timeout: "25 hours" })
        expect(run.status).toBe("completed")
        expect(run.timedOut).toBe(false)
        expect(run.deliveries).toBe(1)
        expect(run.output).toBe(start + DAY)
        expect(Date.parse(run.execution.deadlineAt!)).toBe(start + 7 * DAY)
        expectEveryBeat(beats(run), start, start + DAY - BEAT)
        expect(run.calls.every((c) => c.call !== "heartbeat" || c.answer === "ok")).toBe(true)
        expect(run.events.map((e) => e.type)).not.toContain("execution.cancelled")
        expect(run.events.map((e) => e.type)).not.toContain("dispatch.reclaimed")
        expect(yield* Clock.currentTimeMillis).toBe(start + DAY)
        // One stop per heartbeat (2,880 a day) and a few more, not one per 250 ms dispatcher tick (345,600 a day).
        expect(visits()).toBeLessThan(3_000)
      }).pipe(Effect.provide(TestKernel.layer({ agents: [agent], settings: { deadlineMs: 7 * DAY } })))
    )
  }, 120_000)

  it.effect("a deadline that passes mid-sleep cancels the execution at the first deadline sweep after it (every 30 s)", () => {
    const agent = sleeper(Effect.sleep, "3 hours")
    return countingVisits((visits) =>
      Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const start = yield* Clock.currentTimeMillis
        const run = yield* kernel.run(agent, {}, { timeout: "4 hours" })
        expect(run.status).toBe("cancelled")
        expect(run.failureReason).toBe("deadline_exceeded")
        expect(run.timedOut).toBe(false)
        expect(Date.parse(run.execution.deadlineAt!)).toBe(start + 90 * MINUTE + 123)
        // The dispatcher sweeps deadlines on its first tick and then on the first tick 30 s or more after the
        // last sweep: at start + 30 s · k. The deadline (start + 90 min + 123 ms) is past at start + 90.5 min.
        expect(cancelledAt(run)).toBe(start + 90 * MINUTE + 30_000)
        // The run heartbeats until its next beat learns of the cancellation, and stops.
        const times = beats(run)
        expectEveryBeat(times, start, start + 91 * MINUTE)
        expect(run.calls.filter((c) => c.call === "heartbeat" && c.answer !== "ok").map((c) => c.atMs)).toEqual([
          start + 91 * MINUTE
        ])
        expect(run.events.map((e) => e.type)).not.toContain("dispatch.reclaimed")
        expect(yield* Clock.currentTimeMillis).toBe(start + 91 * MINUTE)
        expect(yield* kernel.activeRuns).toBe(0)
        expect(visits()).toBeLessThan(300)
      }).pipe(Effect.provide(TestKernel.layer({ agents: [agent], settings: { deadlineMs: 90 * MINUTE + 123 } })))
    )
  }, 120_000)

  it.effect("in the seed stage (2 s ticks) the deadline cancels at the same sweep, as client_cancelled", () => {
    const agent = sleeper(Effect.sleep, "3 hours")
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const start = yield* Clock.currentTimeMillis
      const run = yield* kernel.run(agent, {}, { timeout: "4 hours" })
      expect(run.status).toBe("cancelled")
      expect(run.failureReason).toBe("client_cancelled")
      expect(cancelledAt(run)).toBe(start + 90 * MINUTE + 30_000)
      expectEveryBeat(beats(run), start, start + 91 * MINUTE)
      expect(yield* Clock.currentTimeMillis).toBe(start + 91 * MINUTE)
    }).pipe(
      Effect.provide(TestKernel.layer({ agents: [agent], stage: "seed", settings: { deadlineMs: 90 * MINUTE + 123 } }))
    )
  }, 120_000)

  it.effect("the sweep schedule carries over from earlier ticks: a kernel.tick off the grid, then a settle on another grid", () => {
    const quick = Agent.make({ id: "quick", handler: () => Effect.succeed("done") })
    const agent = sleeper(Effect.sleep, "3 hours")
    return countingVisits((visits) =>
      Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const t0 = yield* Clock.currentTimeMillis
        // First sweep at t0 (the first tick ever).
        expect((yield* kernel.run(quick, {})).status).toBe("completed")
        expect(yield* Clock.currentTimeMillis).toBe(t0)
        // A tick 30.077 s later sweeps (30 s or more since the last sweep), off any settling grid.
        yield* TestClock.adjust(30_077)
        yield* kernel.tick
        yield* TestClock.adjust(10_123)
        const start = yield* Clock.currentTimeMillis
        expect(start).toBe(t0 + 40_200)
        const run = yield* kernel.run(agent, {}, { timeout: "4 hours" })
        expect(run.status).toBe("cancelled")
        expect(run.failureReason).toBe("deadline_exceeded")
        // This settle ticks at start + 250 ms · k; the sweeps are on the first of those ticks 30 s or more
        // after the last one: t0 + 60.2 s (start + 20 s), then every 30 s, so start + 20 s + 30 s · k. The
        // deadline (start + 90 min + 123 ms) is past at start + 90 min + 20 s.
        expect(cancelledAt(run)).toBe(start + 90 * MINUTE + 20_000)
        expectEveryBeat(beats(run), start, start + 90 * MINUTE + 30_000)
        expect(yield* Clock.currentTimeMillis).toBe(start + 90 * MINUTE + 30_000)
        expect(visits()).toBeLessThan(300)
      }).pipe(Effect.provide(TestKernel.layer({ agents: [quick, agent], settings: { deadlineMs: 90 * MINUTE + 123 } })))
    )
  }, 120_000)
})
