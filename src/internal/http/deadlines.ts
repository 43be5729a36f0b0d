/**
 * The request timeouts of one transport on one timer.
 *
 * @since 0.2.0
 * @internal
 */
import type { Duration } from "effect"

/**
 * The request timeouts of one transport on one timer (they all have the same
 * length, so the requests in flight are due in the order they were sent).
 *
 * A timer per request costs a `setTimeout` and a `clearTimeout` per round
 * trip — with one request in flight at a time, also a timer list created and
 * dropped each time. Here a request joins the end of a list and leaves it when
 * answered; one timer, set for the earliest deadline, is the only timer, and it
 * is set again when it fires (for the next deadline still pending) rather than
 * when requests come and go. It is `unref`'d: a request in flight is kept alive
 * by its socket, not by its timeout.
 *
 * @internal
 */
export class Deadlines {
  private head: Deadline | undefined = undefined
  private tail: Deadline | undefined = undefined
  private timer: ReturnType<typeof setTimeout> | undefined = undefined

  constructor(private readonly millis: number, readonly timeout: Duration.Duration) {}

  /** Call `onTimeout` once the timeout has passed, unless the deadline is removed first. */
  add(onTimeout: () => void): Deadline {
    const deadline = new Deadline(performance.now() + this.millis, onTimeout)
    const tail = this.tail
    deadline.prev = tail
    if (tail === undefined) this.head = deadline
    else tail.next = deadline
    this.tail = deadline
    if (this.timer === undefined) this.arm(deadline.at)
    return deadline
  }

  remove(deadline: Deadline): void {
    if (!deadline.pending) return
    deadline.pending = false
    const { next, prev } = deadline
    if (prev === undefined) this.head = next
    else prev.next = next
    if (next === undefined) this.tail = prev
    else next.prev = prev
    deadline.prev = undefined
    deadline.next = undefined
  }

  private arm(at: number): void {
    this.timer = setTimeout(this.fire, Math.max(1, Math.ceil(at - performance.now())))
    this.timer.unref()
  }

  private readonly fire = (): void => {
    this.timer = undefined
    const now = performance.now()
    let head = this.head
    while (head !== undefined && head.at <= now) {
      this.remove(head)
      head.onTimeout()
      head = this.head
    }
    if (head !== undefined && this.timer === undefined) this.arm(head.at)
  }
}

/** One request's place in {@link Deadlines}: due at `at` (`performance.now()` milliseconds). @internal */
export class Deadline {
  prev: Deadline | undefined = undefined
  next: Deadline | undefined = undefined
  pending = true
  constructor(readonly at: number, readonly onTimeout: () => void) {}
}

