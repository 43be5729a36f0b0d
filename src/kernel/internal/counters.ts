/**
 * A dispatch's occurrence counters (PROTOCOL 8.4): for each `(kind, target,
 * args hash)` submitted during the dispatch, the last occurrence it consumed;
 * and the dispatch's cursor in the execution's step order.
 *
 * Keyed by the args hash (a string the step record keeps anyway), with the
 * rare `(kind, target)` pairs that share one hash chained behind it: no key
 * string is built per submission, and a dispatch of N distinct steps holds N
 * small entries.
 *
 * @since 0.1.0
 * @internal
 */

/**
 * One `(kind, target, args hash)` counter. `last` is `-1` until an occurrence
 * is consumed, so an entry looked up but never committed counts as absent.
 *
 * @since 0.1.0
 * @internal
 */
export interface Counter {
  readonly kind: string
  readonly target: string
  last: number
  /** The next counter with the same args hash and another kind or target. */
  next: Counter | undefined
}

/**
 * @since 0.1.0
 * @internal
 */
export class Counters {
  private readonly byHash = new Map<string, Counter>()
  /**
   * Where the dispatch's next submission is expected in the execution's step
   * order: a run that replays submits its recorded steps again, in order.
   */
  cursor = 0

  /** The counter of `(kind, target, argsHash)`, created (at `-1`) when absent. */
  counter(kind: string, target: string, argsHash: string): Counter {
    const first = this.byHash.get(argsHash)
    let counter = first
    while (counter !== undefined) {
      if (counter.kind === kind && counter.target === target) return counter
      counter = counter.next
    }
    const created: Counter = { kind, target, last: -1, next: first }
    this.byHash.set(argsHash, created)
    return created
  }

  /** Forget every counter and rewind the cursor (a new attempt counts from zero). */
  clear(): void {
    this.byHash.clear()
    this.cursor = 0
  }
}
