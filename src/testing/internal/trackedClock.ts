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
import { Clock, Context, Duration, Effect, Layer } from "effect"
import type { TestClock } from "effect/testing"
import { Execution } from "../../Execution.js"

/**
 * A `TestClock` whose sleeps in flight can be read.
 *
 * @internal
 */
export interface TrackedClock extends TestClock.TestClock {
  /** The wake-up times (epoch millis on the test clock) of the sleeps in flight, ascending. */
  readonly pendingSleeps: () => ReadonlyArray<number>
  /**
   * The sleeps that ended by waking up (not interrupted) since the last call,
   * counted by who slept: `run` — a fiber of a run (the `Execution` is in its
   * context: the handler, its steps, retries, beats of its heartbeat) — or
   * `background` — a fiber outside any run (an agent runtime's heartbeat
   * timer). Resets the counts.
   */
  readonly takeWakeUps: () => WakeUps
}

/**
 * Sleeps that woke up, by who slept (see {@link TrackedClock.takeWakeUps}).
 *
 * @internal
 */
export interface WakeUps {
  readonly run: number
  readonly background: number
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
  let wokeRun = 0
  let wokeBackground = 0
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
      Effect.withFiber((fiber) => {
        const at = inner.currentTimeMillisUnsafe() + Duration.toMillis(duration)
        const inRun = Context.getOption(fiber.context, Execution)._tag === "Some"
        return Effect.acquireUseRelease(
          Effect.sync(() => {
            let i = wakeUps.length
            while (i > 0 && wakeUps[i - 1]! > at) i--
            wakeUps.splice(i, 0, at)
          }),
          () =>
            Effect.tap(inner.sleep(duration), () =>
              Effect.sync(() => {
                if (inRun) wokeRun++
                else wokeBackground++
              })),
          () => Effect.sync(() => remove(at))
        )
      }),
    adjust: (duration) => inner.adjust(duration),
    setTime: (timestamp) => inner.setTime(timestamp),
    withLive: (effect) => inner.withLive(effect),
    pendingSleeps: () => wakeUps.slice(),
    takeWakeUps: () => {
      const taken = { run: wokeRun, background: wokeBackground }
      wokeRun = 0
      wokeBackground = 0
      return taken
    }
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
