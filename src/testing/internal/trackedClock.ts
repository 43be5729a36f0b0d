/**
 * A `TestClock` that also knows its sleeps in flight.
 *
 * Effect 4's `TestClock` no longer lists pending sleeps, but the test kit (and
 * tests that must wait until a backoff or timeout is registered after real
 * I/O) need to know when the next sleeper wakes. This clock delegates every
 * operation to the `TestClock` it wraps and records the wake-up time of each
 * sleep while it is in flight.
 *
 * @since 0.2.0
 * @internal
 */
import { Clock, Duration, Effect, Layer } from "effect"
import type { TestClock } from "effect/testing"

/**
 * A `TestClock` whose sleeps in flight can be read.
 *
 * @internal
 */
export interface TrackedClock extends TestClock.TestClock {
  /** The wake-up times (epoch millis on the test clock) of the sleeps in flight, ascending. */
  readonly pendingSleeps: () => ReadonlyArray<number>
}

/**
 * Is this clock a {@link TrackedClock}?
 *
 * @internal
 */
export const isTrackedClock = (clock: Clock.Clock): clock is TrackedClock =>
  typeof (clock as Partial<TrackedClock>).pendingSleeps === "function"

/**
 * Wrap a `TestClock` so that its sleeps in flight can be read.
 *
 * @internal
 */
export const wrap = (inner: TestClock.TestClock): TrackedClock => {
  const wakeUps: Array<number> = []
  const remove = (at: number) => {
    const i = wakeUps.indexOf(at)
    if (i !== -1) wakeUps.splice(i, 1)
  }
  return {
    currentTimeMillisUnsafe: () => inner.currentTimeMillisUnsafe(),
    currentTimeMillis: inner.currentTimeMillis,
    currentTimeNanosUnsafe: () => inner.currentTimeNanosUnsafe(),
    currentTimeNanos: inner.currentTimeNanos,
    monotonicTimeNanosUnsafe: () => inner.monotonicTimeNanosUnsafe(),
    monotonicTimeNanos: inner.monotonicTimeNanos,
    sleep: (duration: Duration.Duration) =>
      Effect.suspend(() => {
        const at = inner.currentTimeMillisUnsafe() + Duration.toMillis(duration)
        return Effect.acquireUseRelease(
          Effect.sync(() => {
            let i = wakeUps.length
            while (i > 0 && wakeUps[i - 1]! > at) i--
            wakeUps.splice(i, 0, at)
          }),
          () => inner.sleep(duration),
          () => Effect.sync(() => remove(at))
        )
      }),
    adjust: (duration) => inner.adjust(duration),
    setTime: (timestamp) => inner.setTime(timestamp),
    withLive: (effect) => inner.withLive(effect),
    pendingSleeps: () => wakeUps.slice()
  }
}

/**
 * Replace the current `TestClock` with a {@link TrackedClock} over it, for
 * everything built on this layer. Use it in tests as
 * `Effect.provide(TrackedClock.layer)`; `TestClock.adjust` keeps working.
 *
 * @internal
 */
export const layer: Layer.Layer<never> = Layer.effect(
  Clock.Clock,
  Clock.clockWith((clock) => Effect.succeed(isTrackedClock(clock) ? clock : wrap(clock as TestClock.TestClock)))
)

/**
 * The wake-up times of the sleeps in flight on the current clock (empty when
 * it is not a {@link TrackedClock}).
 *
 * @internal
 */
export const pendingSleeps: Effect.Effect<ReadonlyArray<number>> = Clock.clockWith((clock) =>
  Effect.succeed(isTrackedClock(clock) ? clock.pendingSleeps() : [])
)

/**
 * Run `self` with a {@link TrackedClock} over the current `TestClock`.
 *
 * @internal
 */
export const tracked = <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Clock.clockWith((clock) =>
    isTrackedClock(clock) ? self : Effect.provideService(self, Clock.Clock, wrap(clock as TestClock.TestClock))
  )
