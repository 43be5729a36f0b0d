/**
 * The retry schedule of `internal/http/exchange.ts` (PROTOCOL.md 15.1, issue
 * 13): the short schedule of a call outside any budget (100, 200, 400 ms),
 * and the lease-bound budget of a run's outcome calls — capped exponential
 * backoff with jitter until the lease cannot be valid any more — and the
 * lease clock that sets that budget (`internal/run/runtime.ts`). Under
 * TestClock; every try's virtual time is recorded.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Effect, Exit, Fiber, Random } from "effect"
import { TestClock } from "effect/testing"
import * as Http from "../../../src/internal/http/exchange.js"
import { defaultLeaseTimeoutMillis, makeLeaseClock, withinLease } from "../../../src/internal/run/runtime.js"
import { defaultOutcomeRetry } from "../../../src/KernelClient.js"
import { KernelError, LeaseSuperseded, StatusError, TransportError } from "../../../src/RebunoError.js"

const refused = new KernelError({ reason: new TransportError({ description: "connect ECONNREFUSED 127.0.0.1:8080" }) })
const unavailable = new KernelError({
  reason: new StatusError({ status: 503, code: "internal_error", description: "restarting" })
})

/** A `Random` whose every draw is `value` (0.5: every delay is its nominal value). */
const fixedRandom = (value: number): Random.Random => ({ nextDoubleUnsafe: () => value, nextIntUnsafe: () => 0 })

/**
 * A kernel call whose tries fail with `failures[i]` (then succeed), recording
 * the virtual time of each try.
 */
const call = (failures: ReadonlyArray<unknown>) => {
  const tries: Array<number> = []
  const effect = Effect.flatMap(Clock.currentTimeMillis, (now): Effect.Effect<string, unknown> => {
    tries.push(now)
    const failure = failures[tries.length - 1]
    return failure === undefined ? Effect.succeed("ok") : Effect.fail(failure)
  })
  return { tries, effect }
}

/** Run `effect` to its end, moving virtual time forward, and give its exit. */
const settle = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(effect)
    yield* TestClock.adjust("1 hour")
    return yield* Fiber.await(fiber)
  })

const always = (failure: unknown) => Array.from({ length: 10_000 }, () => failure)

const relative = (tries: ReadonlyArray<number>) => tries.map((t) => t - tries[0]!)

describe("retryTransport without a budget (reads, calls outside a run)", () => {
  it.effect("retries three times, 100, 200 and 400 ms apart, then fails with the last failure", () =>
    Effect.gen(function*() {
      const { effect, tries } = call(always(refused))
      const exit = yield* settle(Http.retryTransport(effect))
      expect(relative(tries)).toEqual([0, 100, 300, 700])
      expect(exit).toStrictEqual(Exit.fail(refused))
    }))

  it.effect("a try that gets through ends it; an answer that is not a transport failure is not retried", () =>
    Effect.gen(function*() {
      const flaky = call([refused, unavailable])
      expect(yield* settle(Http.retryTransport(flaky.effect))).toStrictEqual(Exit.succeed("ok"))
      expect(relative(flaky.tries)).toEqual([0, 100, 300])

      const fenced = call([refused, new LeaseSuperseded()])
      expect(yield* settle(Http.retryTransport(fenced.effect))).toStrictEqual(Exit.fail(new LeaseSuperseded()))
      expect(fenced.tries).toHaveLength(2)
    }))
})

describe("retryTransport within a budget (a run's outcome calls)", () => {
  const budget = (deadlineAfter: number): Http.RetryBudget => ({
    baseMillis: 100,
    capMillis: 5_000,
    deadline: (first) => first + deadlineAfter
  })

  it.effect("capped exponential backoff (100 ms doubling to 5 s) until the deadline, the last try at it", () =>
    Effect.gen(function*() {
      const { effect, tries } = call(always(refused))
      const exit = yield* settle(
        Http.retryTransport(effect).pipe(
          Effect.provideService(Http.CurrentRetryBudget, budget(30_000)),
          Effect.provideService(Random.Random, fixedRandom(0.5))
        )
      )
      expect(relative(tries)).toEqual([
        0,
        100,
        300,
        700,
        1_500,
        3_100,
        6_300,
        11_300,
        16_300,
        21_300,
        26_300,
        30_000
      ])
      expect(exit).toStrictEqual(Exit.fail(refused))
    }))

  it.effect("a kernel back within the budget: the call succeeds; 5xx answers count as transport failures", () =>
    Effect.gen(function*() {
      const { effect, tries } = call([refused, refused, unavailable, refused, refused, refused, refused, refused])
      const exit = yield* settle(
        Http.retryTransport(effect).pipe(
          Effect.provideService(Http.CurrentRetryBudget, budget(120_000)),
          Effect.provideService(Random.Random, fixedRandom(0.5))
        )
      )
      expect(exit).toStrictEqual(Exit.succeed("ok"))
      expect(relative(tries).at(-1)).toBe(16_300)
    }))

  it.effect("each delay is drawn from 80 %–120 % of its nominal value", () =>
    Effect.gen(function*() {
      const low = call(always(refused))
      yield* settle(
        Http.retryTransport(low.effect).pipe(
          Effect.provideService(Http.CurrentRetryBudget, budget(20_000)),
          Effect.provideService(Random.Random, fixedRandom(0))
        )
      )
      expect(relative(low.tries).slice(0, 9)).toEqual([0, 80, 240, 560, 1_200, 2_480, 5_040, 9_040, 13_040])
      const high = call(always(refused))
      yield* settle(
        Http.retryTransport(high.effect).pipe(
          Effect.provideService(Http.CurrentRetryBudget, budget(20_000)),
          Effect.provideService(Random.Random, fixedRandom(0.9999))
        )
      )
      expect(relative(high.tries).slice(0, 8)).toEqual([0, 120, 360, 840, 1_800, 3_720, 7_560, 13_560])
    }))

  it.effect("an answer stops the retries at once, whatever budget is left", () =>
    Effect.gen(function*() {
      const { effect, tries } = call([refused, refused, refused, refused, refused, new LeaseSuperseded()])
      const exit = yield* settle(
        Http.retryTransport(effect).pipe(Effect.provideService(Http.CurrentRetryBudget, budget(120_000)))
      )
      expect(exit).toStrictEqual(Exit.fail(new LeaseSuperseded()))
      expect(tries).toHaveLength(6)
    }))

  it.effect("a deadline already past: the first failure is the call's error", () =>
    Effect.gen(function*() {
      const { effect, tries } = call(always(refused))
      const exit = yield* settle(
        Http.retryTransport(effect).pipe(Effect.provideService(Http.CurrentRetryBudget, budget(0)))
      )
      expect(exit).toStrictEqual(Exit.fail(refused))
      expect(tries).toEqual([0])
    }))
})

describe("the lease clock of a run", () => {
  it.effect("an outcome call retries until the lease cannot be valid: last renewal + lease timeout", () =>
    Effect.gen(function*() {
      // The lease was last renewed 100 s before the call first fails (timeout 120 s): 20 s are left.
      const lease = makeLeaseClock(-100_000, 120, defaultOutcomeRetry)
      const { effect, tries } = call(always(refused))
      const exit = yield* settle(
        withinLease(lease, Http.retryTransport(effect)).pipe(Effect.provideService(Random.Random, fixedRandom(0.5)))
      )
      expect(exit).toStrictEqual(Exit.fail(refused))
      expect(tries).toEqual([0, 100, 300, 700, 1_500, 3_100, 6_300, 11_300, 16_300, 20_000])
    }))

  it.effect("a renewal meanwhile (a heartbeat got through) extends it, up to one lease timeout after the first failure", () =>
    Effect.gen(function*() {
      const lease = makeLeaseClock(-100_000, 120, defaultOutcomeRetry)
      const { effect, tries } = call(always(refused))
      const renewing = effect.pipe(
        Effect.tapError(() =>
          Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.sync(() => now === 6_300 && lease.renewed(now)))
        )
      )
      const exit = yield* settle(
        withinLease(lease, Http.retryTransport(renewing)).pipe(Effect.provideService(Random.Random, fixedRandom(0.5)))
      )
      expect(exit).toStrictEqual(Exit.fail(refused))
      // renewed at 6.3 s: valid until 126.3 s, but no call retries longer than 120 s
      expect(tries.at(-1)).toBe(120_000)
      expect(tries.at(-2)).toBe(116_300)
    }))

  it.effect("maxElapsed bounds a call's retries below the lease; base and cap set the schedule", () =>
    Effect.gen(function*() {
      const lease = makeLeaseClock(0, 120, { baseDelay: "1 second", maxDelay: "2 seconds", maxElapsed: "5 seconds" })
      const { effect, tries } = call(always(refused))
      yield* settle(
        withinLease(lease, Http.retryTransport(effect)).pipe(Effect.provideService(Random.Random, fixedRandom(0.5)))
      )
      expect(tries).toEqual([0, 1_000, 3_000, 5_000])
    }))

  it("without a lease timeout from the kernel (v0.14.0), the kernel default of 120 s", () => {
    const lease = makeLeaseClock(1_000, undefined, defaultOutcomeRetry)
    expect(lease.timeoutMillis).toBe(defaultLeaseTimeoutMillis)
    expect(defaultLeaseTimeoutMillis).toBe(120_000)
    expect(lease.budget.deadline(5_000)).toBe(121_000)
    expect(makeLeaseClock(0, 30, defaultOutcomeRetry).budget.deadline(0)).toBe(30_000)
  })

  it("renewals only move it forward; a zero base delay cannot spin", () => {
    const lease = makeLeaseClock(10_000, 60, { baseDelay: 0, maxDelay: 0 })
    lease.renewed(5_000)
    expect(lease.renewedAt()).toBe(10_000)
    lease.renewed(20_000)
    expect(lease.renewedAt()).toBe(20_000)
    expect([lease.budget.baseMillis, lease.budget.capMillis]).toEqual([1, 1])
  })

  it("the nominal delays: min(cap, base × 2^n)", () => {
    const budget = { baseMillis: 100, capMillis: 5_000 }
    expect([0, 1, 2, 3, 4, 5, 6, 7, 100, 5_000].map((n) => Http.nominalDelayMillis(budget, n))).toEqual([
      100,
      200,
      400,
      800,
      1_600,
      3_200,
      5_000,
      5_000,
      5_000,
      5_000
    ])
  })
})
