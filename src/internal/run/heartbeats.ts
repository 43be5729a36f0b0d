/**
 * The heartbeats of an agent runtime's runs (PROTOCOL.md 5.8) on one timer.
 *
 * A run does not keep a fiber of its own sleeping between beats: the runtime
 * keeps every beating run in a queue per interval, ordered by when its next
 * beat is due, and one timer fiber sleeps (on the runtime's `Clock`, so a
 * `TestClock` drives it) until the earliest of them. When it wakes it starts
 * the beats that are due, each in a fiber of its own with the run's context,
 * and the next beat of a run is due one interval after its beat has ended —
 * as with a loop of `sleep` then beat. A parked run thus costs an entry in a
 * list instead of a fiber, its stack and a timer (issue 14: 10,000 runs in
 * flight in one process).
 *
 * @since 0.2.0
 * @internal
 */
import { Clock, Context, Duration, Effect, Fiber } from "effect"
import type { Scope } from "effect"

/**
 * One run's place in the heartbeat queue: stop it when the run ends.
 *
 * @since 0.2.0
 * @internal
 */
export interface Beating {
  /** Stop beating; a beat under way is interrupted and awaited. */
  readonly stop: Effect.Effect<void>
}

/**
 * The heartbeat timer of one agent runtime.
 *
 * @since 0.2.0
 * @internal
 */
export interface Heartbeats {
  /**
   * Beat every `intervalMillis` from now on: the first beat is due one
   * interval from now, each next one an interval after the previous beat
   * ended. `beat` runs with the context of the fiber that calls `start`.
   */
  readonly start: (intervalMillis: number, beat: () => Effect.Effect<void>) => Effect.Effect<Beating>
}

/** A beating run, linked into the queue of its interval while it waits for its next beat. */
class Entry implements Beating {
  prev: Entry | undefined = undefined
  next: Entry | undefined = undefined
  queued = false
  stopped = false
  fiber: Fiber.Fiber<void> | undefined = undefined

  constructor(
    readonly queue: Queue,
    public dueAt: number,
    readonly beat: () => Effect.Effect<void>,
    readonly context: Context.Context<never>
  ) {}

  get stop(): Effect.Effect<void> {
    return Effect.suspend(() => {
      this.stopped = true
      if (this.queued) this.queue.remove(this)
      const fiber = this.fiber
      this.fiber = undefined
      return fiber === undefined ? Effect.void : Fiber.interrupt(fiber)
    })
  }
}

/** The runs of one interval waiting for their next beat, earliest due first. */
class Queue {
  head: Entry | undefined = undefined
  tail: Entry | undefined = undefined

  constructor(readonly intervalMillis: number) {}

  /**
   * Insert in due order. Entries of one interval are nearly always due in the
   * order they are queued (a beat ends, its next is due an interval later),
   * so this walks back from the tail only when the clock went backwards.
   */
  insert(entry: Entry): void {
    let after = this.tail
    while (after !== undefined && after.dueAt > entry.dueAt) after = after.prev
    entry.prev = after
    entry.next = after === undefined ? this.head : after.next
    if (entry.next === undefined) this.tail = entry
    else entry.next.prev = entry
    if (after === undefined) this.head = entry
    else after.next = entry
    entry.queued = true
  }

  remove(entry: Entry): void {
    if (entry.prev === undefined) this.head = entry.next
    else entry.prev.next = entry.next
    if (entry.next === undefined) this.tail = entry.prev
    else entry.next.prev = entry.prev
    entry.prev = undefined
    entry.next = undefined
    entry.queued = false
  }
}

class Timer implements Heartbeats {
  private readonly queues = new Map<number, Queue>()
  /** The sleeping timer fiber and when it wakes (`Infinity`: none). */
  private sleeper: Fiber.Fiber<void> | undefined = undefined
  private wakeAt = Infinity
  private closed = false
  /** Set while due beats are being started: the timer is planned once they all are. */
  private waking = false

  constructor(private readonly clock: Clock.Clock, private readonly context: Context.Context<never>) {}

  start(intervalMillis: number, beat: () => Effect.Effect<void>): Effect.Effect<Beating> {
    return Effect.withFiber((fiber) => {
      let queue = this.queues.get(intervalMillis)
      if (queue === undefined) {
        queue = new Queue(intervalMillis)
        this.queues.set(intervalMillis, queue)
      }
      const now = this.clock.currentTimeMillisUnsafe()
      const entry = new Entry(queue, now + intervalMillis, beat, fiber.context as Context.Context<never>)
      this.enqueue(entry, now)
      return Effect.succeed(entry)
    })
  }

  /** Stop the timer: no beat starts any more (the runtime's scope is closing; each run stops its own beat under way). */
  close(): Effect.Effect<void> {
    return Effect.suspend(() => {
      this.closed = true
      const fibers: Array<Fiber.Fiber<void>> = []
      if (this.sleeper !== undefined) fibers.push(this.sleeper)
      this.sleeper = undefined
      this.wakeAt = Infinity
      for (const queue of this.queues.values()) {
        while (queue.head !== undefined) queue.remove(queue.head)
      }
      return Fiber.interruptAll(fibers)
    })
  }

  private enqueue(entry: Entry, now: number): void {
    entry.queue.insert(entry)
    if (!this.waking && entry.dueAt < this.wakeAt) this.plan(now)
  }

  /** Sleep until the earliest due beat, replacing a timer that would wake later. */
  private plan(now: number): void {
    if (this.closed) return
    let earliest = Infinity
    for (const queue of this.queues.values()) {
      if (queue.head !== undefined && queue.head.dueAt < earliest) earliest = queue.head.dueAt
    }
    if (earliest >= this.wakeAt) return
    const previous = this.sleeper
    this.wakeAt = earliest
    this.sleeper = Effect.runForkWith(this.context)(
      Effect.andThen(Effect.sleep(Duration.millis(Math.max(0, earliest - now))), Effect.sync(() => this.wake()))
    )
    previous?.interruptUnsafe()
  }

  private wake(): void {
    this.sleeper = undefined
    this.wakeAt = Infinity
    const now = this.clock.currentTimeMillisUnsafe()
    this.waking = true
    try {
      for (const queue of this.queues.values()) {
        while (queue.head !== undefined && queue.head.dueAt <= now) {
          const entry = queue.head
          queue.remove(entry)
          this.beat(entry)
        }
      }
    } finally {
      this.waking = false
    }
    this.plan(now)
  }

  /** Run one beat in a fiber of its own, with the run's context; queue the next one when it ends. */
  private beat(entry: Entry): void {
    // Built inside the fiber: a beat that throws is that beat's defect, not the timer's.
    const fiber = Effect.runForkWith(entry.context)(Effect.suspend(entry.beat))
    if (fiber.pollUnsafe() !== undefined) return this.beaten(entry)
    entry.fiber = fiber
    fiber.addObserver(() => {
      if (entry.fiber !== fiber) return
      entry.fiber = undefined
      this.beaten(entry)
    })
  }

  private beaten(entry: Entry): void {
    if (entry.stopped || this.closed) return
    const now = this.clock.currentTimeMillisUnsafe()
    entry.dueAt = now + entry.queue.intervalMillis
    this.enqueue(entry, now)
  }
}

/**
 * The heartbeat timer of a runtime, on the fiber's `Clock`; it stops with the
 * current `Scope`.
 *
 * @since 0.2.0
 * @internal
 */
export const make: Effect.Effect<Heartbeats, never, Scope.Scope> = Effect.withFiber((fiber) => {
  const timer = new Timer(fiber.getRef(Clock.Clock), fiber.context as Context.Context<never>)
  return Effect.as(Effect.addFinalizer(() => timer.close()), timer)
})
