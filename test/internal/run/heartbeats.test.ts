/**
 * The heartbeat timer of an agent runtime (PROTOCOL.md 5.8, issue 14): one
 * timer for every run; each run's next beat is due one interval after its
 * previous beat ended; a stopped run beats no more.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Deferred, Effect, References } from "effect"
import { TestClock } from "effect/testing"
import * as Heartbeats from "../../../src/internal/run/heartbeats.js"

describe("Heartbeats", () => {
  it.effect("thousands of runs due at the same instant all beat, each once per interval", () =>
    Effect.gen(function*() {
      const heartbeats = yield* Heartbeats.make
      const beats = new Map<number, Array<number>>()
      const runs = 5_000
      for (let i = 0; i < runs; i++) {
        beats.set(i, [])
        yield* heartbeats.start(1_000, () =>
          Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.sync(() => beats.get(i)!.push(now))))
      }
      yield* TestClock.adjust("3 seconds")
      for (const at of beats.values()) expect(at).toEqual([1_000, 2_000, 3_000])
    }))

  it.effect("the next beat is due an interval after the previous one ended; stop ends the beats", () =>
    Effect.gen(function*() {
      const heartbeats = yield* Heartbeats.make
      const started: Array<number> = []
      const slow = yield* heartbeats.start(1_000, () =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          started.push(now)
          return Effect.sleep("500 millis")
        }))
      const fast: Array<number> = []
      const other = yield* heartbeats.start(300, () =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.sync(() => fast.push(now))))
      yield* TestClock.adjust("3 seconds")
      expect(started).toEqual([1_000, 2_500])
      expect(fast).toEqual([300, 600, 900, 1_200, 1_500, 1_800, 2_100, 2_400, 2_700, 3_000])
      // Stopped during a beat: the beat is interrupted, and no other follows.
      yield* TestClock.adjust("1 second")
      expect(started).toEqual([1_000, 2_500, 4_000])
      yield* slow.stop
      yield* other.stop
      yield* TestClock.adjust("10 seconds")
      expect(started).toHaveLength(3)
      expect(fast).toHaveLength(13)
    }))

  it.effect("a beat runs with the context of the fiber that started it", () =>
    Effect.gen(function*() {
      const heartbeats = yield* Heartbeats.make
      const seen = yield* Deferred.make<ReadonlyArray<string>>()
      yield* heartbeats.start(1_000, () =>
        Effect.gen(function*() {
          const annotations = yield* References.CurrentLogAnnotations
          yield* Deferred.succeed(seen, Object.keys(annotations))
        })).pipe(Effect.annotateLogs({ run: "a" }))
      yield* TestClock.adjust("1 second")
      expect(yield* Deferred.await(seen)).toEqual(["run"])
    }))
})
