import { describe, expect, it } from "@effect/vitest"
import { Clock, Effect, Schema } from "effect"
import { Agent, Step, Tool } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"

const HOUR = 3_600_000
const DAY = 24 * HOUR
/** The heartbeat interval with the kit's default lease (120 s): min(lease / 3, 30 s). */
const BEAT = 30_000

/** A tool that notes the virtual time it ran at. */
const makeStamp = () => {
  const ran: Array<{ readonly who: string; readonly atMs: number }> = []
  const stamp = Tool.make("stamp", {
    args: Schema.Struct({ who: Schema.String }),
    success: Schema.Struct({ atMs: Schema.Number }),
    execute: ({ who }) =>
      Effect.map(Clock.currentTimeMillis, (atMs) => {
        ran.push({ who, atMs })
        return { atMs }
      })
  })
  return { ran, stamp }
}

/** The virtual times of an execution's heartbeats. */
const beats = (run: TestKernel.RunResult) => run.calls.filter((c) => c.call === "heartbeat").map((c) => c.atMs)

/** Each heartbeat one interval after the previous one, the first one interval after `from`: none skipped, none doubled. */
const expectEveryBeat = (times: ReadonlyArray<number>, from: number, until: number) => {
  const expected: Array<number> = []
  for (let t = from + BEAT; t < until; t += BEAT) expected.push(t)
  expect(times.length).toBe(expected.length)
  expect(times).toEqual(expected)
}

describe("TestKernel: long virtual sleeps", () => {
  it.effect("an Effect.sleep of 24 hours completes at the right virtual time, every heartbeat in order", () => {
    const { ran, stamp } = makeStamp()
    const sleeper = Agent.make({
      id: "sleeper",
      handler: () =>
        Effect.gen(function*() {
          yield* Effect.sleep("24 hours")
          return yield* stamp({ who: "sleeper" })
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const start = yield* Clock.currentTimeMillis
      const run = yield* kernel.run(sleeper, {}, { timeout: "25 hours" })
      expect(run.status).toBe("completed")
      expect(run.timedOut).toBe(false)
      expect(run.deliveries).toBe(1)
      expect(ran).toEqual([{ who: "sleeper", atMs: start + DAY }])
      expect(run.output).toEqual({ atMs: start + DAY })
      expectEveryBeat(beats(run), start, start + DAY)
      expect(run.calls.every((c) => c.call !== "heartbeat" || c.answer === "ok")).toBe(true)
      // The lease never lapsed: no reclaim, no second dispatch.
      expect(run.events.map((e) => e.type)).not.toContain("dispatch.reclaimed")
      expect(yield* Clock.currentTimeMillis).toBe(start + DAY)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [sleeper] })))
  })

  it.effect("a lease timeout not divisible by 3 ms (47 s): the heartbeat interval is whole milliseconds and a 1-hour sleep settles", () => {
    const { ran, stamp } = makeStamp()
    const sleeper = Agent.make({
      id: "sleeper",
      handler: () =>
        Effect.gen(function*() {
          yield* Effect.sleep("1 hour")
          return yield* stamp({ who: "sleeper" })
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const start = yield* Clock.currentTimeMillis
      const run = yield* kernel.run(sleeper, {}, { timeout: "2 hours" })
      expect(run.status).toBe("completed")
      expect(ran).toEqual([{ who: "sleeper", atMs: start + HOUR }])
      const times = beats(run)
      expect(times.length).toBe(Math.floor(HOUR / 15_666))
      expect(times.every((t, i) => t === start + (i + 1) * 15_666)).toBe(true)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [sleeper], settings: { leaseTimeoutMs: 47_000 } })))
  })

  it.effect("a durable Step.sleep of 30 days completes with timeout: \"30 days\" and more", () => {
    const sleeper = Agent.make({
      id: "sleeper",
      handler: () =>
        Effect.gen(function*() {
          yield* Step.sleep("30 days")
          return yield* Step.now
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const start = yield* Clock.currentTimeMillis
      const run = yield* kernel.run(sleeper, {}, { timeout: "31 days" })
      expect(run.status).toBe("completed")
      expect(run.timedOut).toBe(false)
      expect(run.output).toBe(start + 30 * DAY)
      expectEveryBeat(beats(run), start, start + 30 * DAY)
      expect(run.steps.map((s) => [s.sequence, s.target, s.status])).toEqual([
        [0, "sleep", "succeeded"],
        [1, "now", "succeeded"]
      ])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [sleeper] })))
  }, 60_000)

  it.effect("a 7-day durable sleep survives a crash: the re-run sleeps only the rest, heartbeats of both runs in order", () => {
    const sleeper = Agent.make({
      id: "sleeper",
      handler: () =>
        Effect.gen(function*() {
          yield* Step.sleep("7 days")
          return yield* Step.now
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const start = yield* Clock.currentTimeMillis
      // Dies as soon as the deadline is recorded; the kernel redelivers once the lease lapses.
      const run = yield* kernel.run(sleeper, {}, { crash: { afterSteps: 1 }, timeout: "8 days" })
      expect(run.status).toBe("completed")
      expect(run.crashed).toBe(true)
      expect(run.deliveries).toBe(2)
      expect(run.output).toBe(start + 7 * DAY)
      const second = run.calls.filter((c) => c.attempt === 2)
      const resumedAt = second[0]!.atMs
      // Redelivered on the first dispatcher tick after the lease (120 s) lapsed.
      expect(resumedAt).toBeGreaterThan(start + 120_000)
      expect(resumedAt).toBeLessThanOrEqual(start + 120_000 + 250 + 1)
      expectEveryBeat(second.filter((c) => c.call === "heartbeat").map((c) => c.atMs), resumedAt, start + 7 * DAY)
      const times = run.calls.map((c) => c.atMs)
      expect(times).toEqual([...times].sort((a, b) => a - b))
    }).pipe(Effect.provide(TestKernel.layer({ agents: [sleeper] })))
  }, 30_000)

  it.effect("timers of several executions fire in time order: none skipped while another run only heartbeats", () => {
    const { ran, stamp } = makeStamp()
    const nap = ({ hours, who }: { readonly who: string; readonly hours: number }) =>
      Effect.gen(function*() {
        yield* stamp({ who: `${who}:start` })
        yield* Effect.sleep(`${hours} hours`)
        return yield* stamp({ who: `${who}:end` })
      })
    const input = Schema.Struct({ who: Schema.String, hours: Schema.Number })
    const napper = Agent.make({ id: "napper", input, handler: nap })
    // Another agent (another process): its crash does not take the nappers' runs with it.
    const crasher = Agent.make({ id: "crasher", input, handler: nap })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const start = yield* Clock.currentTimeMillis
      // b crashes after its first step: its lease lapses (a kernel timer) while a only heartbeats.
      const b = yield* kernel.create("crasher", { who: "b", hours: 3 })
      yield* kernel.crash(b, { afterSteps: 1 })
      const c = yield* kernel.create("napper", { who: "c", hours: 2 })
      const a = yield* kernel.run(napper, { who: "a", hours: 5 }, { timeout: "6 hours" })
      expect(a.status).toBe("completed")
      const all = yield* kernel.calls()
      const times = all.map((call) => call.atMs)
      expect(times).toEqual([...times].sort((x, y) => x - y))
      // b was redelivered on the first tick after its lease lapsed, not at a's next heartbeat.
      const bCalls = all.filter((call) => call.executionId === b)
      const lapsedAt = bCalls.find((call) => call.attempt === 2)!.atMs
      const lastRenewal = bCalls.filter((call) => call.attempt === 1).at(-1)!.atMs
      expect(lapsedAt).toBeGreaterThan(lastRenewal + 120_000)
      expect(lapsedAt).toBeLessThanOrEqual(lastRenewal + 120_000 + 250 + 1)
      expect(lapsedAt % BEAT).not.toBe(0)
      expect(ran.filter((r) => r.who.endsWith(":end"))).toEqual([
        { who: "c:end", atMs: start + 2 * HOUR },
        { who: "b:end", atMs: lapsedAt + 3 * HOUR },
        { who: "a:end", atMs: start + 5 * HOUR }
      ])
      for (const id of [b, c]) expect((yield* kernel.execution(id)).status).toBe("completed")
      for (const id of [a.executionId, b, c]) {
        // (reads carry no lease: only the calls of a run, by attempt)
        const own = all.filter((call) => call.executionId === id && call.attempt !== undefined)
        for (const attempt of new Set(own.map((call) => call.attempt))) {
          const mine = own.filter((call) => call.attempt === attempt)
          const beatsOf = mine.filter((call) => call.call === "heartbeat").map((call) => call.atMs)
          // one beat every 30 s from the delivery until the run ended (a crashed run stops beating)
          const from = mine[0]!.atMs
          const until = mine.at(-1)!.atMs
          expectEveryBeat(beatsOf, from, until)
        }
      }
    }).pipe(Effect.provide(TestKernel.layer({ agents: [napper, crasher] })))
  }, 30_000)

  it.effect("the virtual-time budget running out is reported: timedOut, still running, and a second settle finishes", () => {
    const sleeper = Agent.make({
      id: "sleeper",
      handler: () =>
        Effect.gen(function*() {
          yield* Effect.sleep("2 hours")
          return yield* Step.now
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const start = yield* Clock.currentTimeMillis
      const first = yield* kernel.run(sleeper, {}) // default budget: 1 hour
      expect(first.timedOut).toBe(true)
      expect(first.status).toBe("running")
      expect(first.output).toBeUndefined()
      expect(yield* Clock.currentTimeMillis).toBe(start + HOUR)
      const rest = yield* kernel.settle(first.executionId, { timeout: "2 hours" })
      expect(rest.timedOut).toBe(false)
      expect(rest.status).toBe("completed")
      expect(rest.output).toBe(start + 2 * HOUR)
      expect(rest.deliveries).toBe(1)
      expectEveryBeat(beats(rest), start, start + 2 * HOUR)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [sleeper] })))
  })

  it.effect("a blocked or settled execution is not timed out", () => {
    const quick = Agent.make({ id: "quick", handler: () => Effect.succeed("done") })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(quick, {}, { timeout: "1 millis" })
      expect(run.status).toBe("completed")
      expect(run.timedOut).toBe(false)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [quick] })))
  })
})
