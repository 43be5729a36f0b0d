/**
 * A dispatch's occurrence counters (PROTOCOL 8.4): for each `(kind, target,
 * args hash)` submitted during the dispatch, the last occurrence it consumed;
 * and the dispatch's cursor in the execution's step order.
 *
 * Every consumed occurrence is a recorded step (a new one, or the existing
 * one a replay answered), so a counter is that step itself: keyed by its args
 * hash, with the rare steps of another `(kind, target)` that share the hash
 * in an array behind it. No key string and no counter object is built per
 * submission; a dispatch of N distinct steps holds N map entries.
 *
 * @since 0.1.0
 * @internal
 */

/**
 * What a counter reads of the step that consumed an occurrence.
 *
 * @since 0.2.0
 * @internal
 */
export interface Occurrence {
  readonly kind: string
  readonly target: string
  readonly argsHash: string
  readonly occurrence: number
}

/**
 * @since 0.1.0
 * @internal
 */
export class Counters {
  private readonly byHash = new Map<string, Occurrence | Array<Occurrence>>()
  /**
   * Where the dispatch's next submission is expected in the execution's step
   * order: a run that replays submits its recorded steps again, in order.
   */
  cursor = 0

  /** The last occurrence of `(kind, target, argsHash)` consumed in this dispatch, `-1` when none. */
  last(kind: string, target: string, argsHash: string): number {
    const entry = this.byHash.get(argsHash)
    if (entry === undefined) return -1
    if (!Array.isArray(entry)) return entry.kind === kind && entry.target === target ? entry.occurrence : -1
    for (const step of entry) if (step.kind === kind && step.target === target) return step.occurrence
    return -1
  }

  /** `step`'s occurrence is consumed: it is the last of its `(kind, target, argsHash)`. */
  consume(step: Occurrence): void {
    const entry = this.byHash.get(step.argsHash)
    if (entry === undefined || (!Array.isArray(entry) && entry.kind === step.kind && entry.target === step.target)) {
      this.byHash.set(step.argsHash, step)
    } else if (!Array.isArray(entry)) {
      this.byHash.set(step.argsHash, [entry, step])
    } else {
      const index = entry.findIndex((s) => s.kind === step.kind && s.target === step.target)
      if (index === -1) entry.push(step)
      else entry[index] = step
    }
  }

  /** Forget every counter and rewind the cursor (a new attempt counts from zero). */
  clear(): void {
    this.byHash.clear()
    this.cursor = 0
  }
}
