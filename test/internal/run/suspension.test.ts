/**
 * The suspension bookkeeping of a run (PROTOCOL-CURRENT C.5.4 #2): one
 * suspend for all the calls that wait together, only once every step in
 * flight waits or has ended.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber } from "effect"
import * as Suspension from "../../../src/internal/run/suspension.js"

/** A suspend call that counts itself and answers `answer`. */
const counting = (answer: Effect.Effect<boolean, string> = Effect.succeed(true)) => {
  const calls = { n: 0 }
  return { calls, suspend: Effect.andThen(Effect.sync(() => calls.n++), answer) }
}

/** A fresh suspension with `steps` steps in flight, and a counting suspend call. */
const inFlight = (steps: number, answer?: Effect.Effect<boolean, string>) => {
  const s = Suspension.make()
  for (let i = 0; i < steps; i++) s.enter()
  return { s, ...counting(answer) }
}

const settle = Effect.repeat(Effect.yieldNow, { times: 20 })

describe("Suspension", () => {
  it.effect("a single step in flight that waits suspends at once", () =>
    Effect.gen(function*() {
      const { calls, s, suspend } = inFlight(1)
      expect(yield* s.await(suspend)).toBe(true)
      expect(calls.n).toBe(1)
    }))

  it.effect("waiters wait for every step in flight; then one suspend answers them all", () =>
    Effect.gen(function*() {
      const { calls, s, suspend } = inFlight(3)
      const a = yield* Effect.forkChild(s.await(suspend))
      const b = yield* Effect.forkChild(s.await(suspend))
      yield* settle
      expect(calls.n).toBe(0)
      expect(a.pollUnsafe()).toBeUndefined()
      // the third step ends without waiting: the two waiters are all that is in flight
      yield* s.exit
      yield* settle
      expect(yield* Fiber.join(a)).toBe(true)
      expect(yield* Fiber.join(b)).toBe(true)
      expect(calls.n).toBe(1)
    }))

  it.effect("a failure of the suspend reaches every waiter", () =>
    Effect.gen(function*() {
      const { calls, s, suspend } = inFlight(2, Effect.fail("conflict"))
      const exits = yield* Effect.all([Effect.exit(s.await(suspend)), Effect.exit(s.await(suspend))], {
        concurrency: "unbounded"
      })
      expect(exits).toEqual([Exit.fail("conflict"), Exit.fail("conflict")])
      expect(calls.n).toBe(1)
    }))

  it.effect("a waiter interrupted before the round no longer counts", () =>
    Effect.gen(function*() {
      const { calls, s, suspend } = inFlight(3)
      const gone = yield* Effect.forkChild(s.await(suspend))
      const stays = yield* Effect.forkChild(s.await(suspend))
      yield* settle
      yield* Fiber.interrupt(gone)
      yield* s.exit // the interrupted waiter's step ends
      yield* settle
      expect(calls.n).toBe(0)
      yield* s.exit // the third step ends
      expect(yield* Fiber.join(stays)).toBe(true)
      expect(calls.n).toBe(1)
    }))

  it.effect("a later round suspends again", () =>
    Effect.gen(function*() {
      const { calls, s, suspend } = inFlight(1, Effect.succeed(false))
      expect(yield* s.await(suspend)).toBe(false)
      yield* s.exit
      s.enter()
      expect(yield* s.await(suspend)).toBe(false)
      expect(calls.n).toBe(2)
    }))

  it.effect("steps forked together: the first to wait lets its siblings enter before it decides", () =>
    Effect.gen(function*() {
      const { calls, s, suspend } = inFlight(0)
      const step = Effect.suspend(() => {
        s.enter()
        return Effect.ensuring(s.await(suspend), s.exit)
      })
      expect(yield* Effect.all([step, step, step], { concurrency: "unbounded" })).toEqual([true, true, true])
      expect(calls.n).toBe(1)
    }))
})
