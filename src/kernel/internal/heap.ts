/**
 * A small binary min-heap used by the kernel core to find due dispatches
 * (oldest `next_attempt_at` first) without scanning every dispatch. Entries are
 * never removed from the middle: callers mark them stale and skip them on pop.
 *
 * @since 0.1.0
 * @internal
 */

/**
 * @since 0.1.0
 * @internal
 */
export interface Heap<A> {
  readonly size: () => number
  readonly push: (value: A) => void
  readonly peek: () => A | undefined
  readonly pop: () => A | undefined
}

/**
 * @since 0.1.0
 * @internal
 */
export const make = <A>(less: (a: A, b: A) => boolean): Heap<A> => {
  const items: Array<A> = []
  const up = (index: number): void => {
    const item = items[index]!
    while (index > 0) {
      const parent = (index - 1) >> 1
      const p = items[parent]!
      if (!less(item, p)) break
      items[index] = p
      index = parent
    }
    items[index] = item
  }
  const down = (index: number): void => {
    const n = items.length
    const item = items[index]!
    for (;;) {
      const left = 2 * index + 1
      if (left >= n) break
      const right = left + 1
      const child = right < n && less(items[right]!, items[left]!) ? right : left
      if (!less(items[child]!, item)) break
      items[index] = items[child]!
      index = child
    }
    items[index] = item
  }
  return {
    size: () => items.length,
    push: (value) => {
      items.push(value)
      up(items.length - 1)
    },
    peek: () => items[0],
    pop: () => {
      if (items.length === 0) return undefined
      const top = items[0]!
      const last = items.pop()!
      if (items.length > 0) {
        items[0] = last
        down(0)
      }
      return top
    }
  }
}
