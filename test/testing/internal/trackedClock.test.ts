import { it, expect } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import * as TrackedClock from "../../../src/testing/internal/trackedClock.js"

it.effect("tracks", () => Effect.gen(function*() {
  const f = yield* Effect.forkChild(Effect.sleep("5 seconds"))
  yield* Effect.yieldNow
  expect(yield* TrackedClock.pendingSleeps).toEqual([5000])
  yield* TestClock.adjust("5 seconds")
  yield* Fiber.join(f)
  expect(yield* TrackedClock.pendingSleeps).toEqual([])
}).pipe(Effect.provide(TrackedClock.layer)))

it.effect("tracked()", () => TrackedClock.tracked(Effect.gen(function*() {
  const f = yield* Effect.forkChild(Effect.sleep("2 seconds"))
  yield* Effect.yieldNow
  expect(yield* TrackedClock.pendingSleeps).toEqual([2000])
  yield* TestClock.adjust("2 seconds")
  yield* Fiber.join(f)
})))
