/**
 * Waiting in real time, whatever the Effect clock: for tests that watch real
 * sockets and servers, where virtual time would not move anything.
 */
import { Effect } from "effect"

/** A real pause of `ms` milliseconds. */
export const pause = (ms: number): Effect.Effect<void> =>
  Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, ms)))

/** Polls `condition` every 5 ms of real time until it holds; dies after 5 s, naming `what` it waited for. */
export const waitUntil = (what: string, condition: () => boolean): Effect.Effect<void> =>
  Effect.gen(function*() {
    const deadline = Date.now() + 5_000
    while (!condition()) {
      if (Date.now() > deadline) return yield* Effect.die(new Error(`timed out waiting for ${what}`))
      yield* pause(5)
    }
  })
