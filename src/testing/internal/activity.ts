/**
 * How the test kit knows that the agents' processes have gone quiet: a
 * counter bumped whenever an agent → kernel call is made, answered, starts or
 * stops being in flight, and the number of calls in flight. Settling moves
 * virtual time only once nothing moves and no call is in flight.
 *
 * @since 0.2.0
 * @internal
 */
import { Effect } from "effect"

/**
 * The activity of the agents' processes.
 *
 * @since 0.2.0
 * @internal
 */
export class Activity {
  /** Bumped by every call made or answered, and by every call entering or leaving flight. */
  progress = 0
  /** Agent → kernel calls in flight (signing included), minus those parked by a stall. */
  inFlight = 0

  /** Count `effect` as a call in flight while it runs. */
  readonly countInFlight = <A, E>(effect: Effect.Effect<A, E>): Effect.Effect<A, E> =>
    Effect.acquireUseRelease(
      Effect.sync(() => {
        this.inFlight++
        this.progress++
      }),
      () => effect,
      () =>
        Effect.sync(() => {
          this.inFlight--
          this.progress++
        })
    )

  /** Do not count the current call as in flight while `effect` (a stalled call's wait) runs. */
  readonly parked = <A, E>(effect: Effect.Effect<A, E>): Effect.Effect<A, E> =>
    Effect.acquireUseRelease(
      Effect.sync(() => void this.inFlight--),
      () => effect,
      () => Effect.sync(() => void this.inFlight++)
    )
}

/**
 * Let forked fibers and pending promises (Web Crypto) make progress.
 *
 * @since 0.2.0
 * @internal
 */
export const yieldRound: Effect.Effect<void> = Effect.gen(function*() {
  for (let i = 0; i < 5; i++) yield* Effect.yieldNow
  yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
})
