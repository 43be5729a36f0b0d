/**
 * Live deltas (PROTOCOL 6.6, 11.6): fan-out of each execution's deltas to its
 * subscribers, each with a 64-delta dropping buffer. Deltas are never stored.
 *
 * @since 0.1.0
 * @internal
 */
import * as Effect from "effect/Effect"
import * as Queue from "effect/Queue"
import type * as Scope from "effect/Scope"
import type { Delta } from "./model.js"

/**
 * @since 0.1.0
 * @internal
 */
export class Deltas {
  private readonly subscribers = new Map<string, Set<Queue.Queue<Delta>>>()

  /** Offer a delta to every subscriber of the execution (a full buffer drops it). */
  publish(executionId: string, d: Delta): void {
    const queues = this.subscribers.get(executionId)
    if (queues === undefined) return
    for (const queue of queues) Queue.offerUnsafe(queue, d)
  }

  /** A 64-delta dropping buffer, unsubscribed when the scope closes. */
  subscribe(executionId: string): Effect.Effect<Queue.Dequeue<Delta>, never, Scope.Scope> {
    return Effect.acquireRelease(
      Effect.flatMap(Queue.dropping<Delta>(64), (queue) =>
        Effect.sync(() => {
          let queues = this.subscribers.get(executionId)
          if (queues === undefined) {
            queues = new Set()
            this.subscribers.set(executionId, queues)
          }
          queues.add(queue)
          return queue
        })),
      (queue) =>
        Effect.suspend(() => {
          const queues = this.subscribers.get(executionId)
          if (queues !== undefined) {
            queues.delete(queue)
            if (queues.size === 0) this.subscribers.delete(executionId)
          }
          return Queue.shutdown(queue)
        })
    )
  }
}
