/**
 * The dispatch queue of the kernel core (PROTOCOL 5): every dispatch with its
 * attempts, the due queue ordered by `next_attempt_at` (a heap whose stale
 * entries are skipped, never removed), the in-flight set grouped by lease
 * timeout so lapsed leases are found without a scan, the RENEW and CHECK
 * lease fences (5.6), reclaim (5.3 step 1), retry backoff (5.4) and
 * exhaustion. It knows dispatches only; the execution lifecycle decides when
 * to enqueue, release or fail.
 *
 * @since 0.1.0
 * @internal
 */
import * as Queue from "effect/Queue"
import { uuidv7 } from "../../internal/wire/uuid.js"
import { Counters } from "./counters.js"
import * as Heap from "./heap.js"
import type { DispatchRecord, DispatchStatus, Lease } from "./model.js"

/**
 * A dispatch as the queue keeps it (5.1), updated in place.
 *
 * @since 0.1.0
 * @internal
 */
export interface DispatchState {
  readonly id: string
  readonly executionId: string
  status: DispatchStatus
  attempt: number
  readonly maxAttempts: number
  nextAttemptAtMs: number
  lockedAtMs: number | undefined
  /** The lease timeout group the dispatch is in while `in_flight`. */
  leaseTimeoutMs: number
  /** Occurrence counters (8.4) and the cursor in the execution's step order. */
  readonly counters: Counters
  /** Bumped whenever the dispatch is (re)scheduled or leaves the claimable set. */
  version: number
}

interface DueEntry {
  readonly at: number
  readonly seq: number
  readonly dispatch: DispatchState
  readonly version: number
}

/**
 * Backoff before the next attempt after attempt `n` failed (5.4).
 *
 * @since 0.1.0
 * @internal
 */
export const backoffMs = (n: number, random: () => number): number => {
  const base = Math.min(2 ** (n - 1) * 1000, 30_000)
  return base + Math.floor(random() * 0.25 * base)
}

/**
 * A snapshot of a dispatch (5.1).
 *
 * @since 0.1.0
 * @internal
 */
export const snapshot = (d: DispatchState): DispatchRecord => ({
  id: d.id,
  executionId: d.executionId,
  status: d.status,
  attempt: d.attempt,
  maxAttempts: d.maxAttempts,
  nextAttemptAtMs: d.nextAttemptAtMs,
  lockedAtMs: d.lockedAtMs
})

/**
 * @since 0.1.0
 * @internal
 */
export class DispatchQueue {
  readonly byId = new Map<string, DispatchState>()
  private readonly due = Heap.make<DueEntry>((a, b) => a.at < b.at || (a.at === b.at && a.seq < b.seq))
  private dueSeq = 0
  /** In-flight dispatches grouped by lease timeout; each group ordered by `lockedAtMs`. */
  private readonly inFlight = new Map<number, Map<string, DispatchState>>()

  /** `signal` gets a wake-up whenever a dispatch is enqueued (it may drop them). */
  constructor(private readonly signal: Queue.Queue<void>) {}

  /** A new pending dispatch of attempt 0, due at `dueAtMs` (default `now`). */
  enqueue(
    executionId: string,
    now: number,
    maxAttempts: number,
    leaseTimeoutMs: number,
    dueAtMs: number = now
  ): DispatchState {
    const d: DispatchState = {
      id: uuidv7(now),
      executionId,
      status: "pending",
      attempt: 0,
      maxAttempts,
      nextAttemptAtMs: dueAtMs,
      lockedAtMs: undefined,
      leaseTimeoutMs,
      counters: new Counters(),
      version: 0
    }
    this.byId.set(d.id, d)
    this.schedule(d)
    return d
  }

  /** Tell the delivery loop that a dispatch was enqueued. */
  wake(): void {
    Queue.offerUnsafe(this.signal, undefined)
  }

  /**
   * The next due dispatch (`next_attempt_at <= now`, pending or failed), taken
   * off the due queue; `undefined` when none is due.
   */
  takeDue(now: number): DispatchState | undefined {
    for (;;) {
      const top = this.due.peek()
      if (top === undefined) return undefined
      const d = top.dispatch
      if (top.version !== d.version || (d.status !== "pending" && d.status !== "failed")) {
        this.due.pop()
        continue
      }
      if (top.at > now) return undefined
      this.due.pop()
      return d
    }
  }

  /** A claimed dispatch starts its next attempt (5.3 step 2): in flight, locked at `now`, counters reset. */
  begin(d: DispatchState, now: number, leaseTimeoutMs: number): void {
    d.counters.clear()
    d.attempt += 1
    d.status = "in_flight"
    d.lockedAtMs = now
    d.version++
    d.leaseTimeoutMs = leaseTimeoutMs
    this.addInFlight(d)
  }

  /** A failed delivery of attempt `n` (5.4 step 6): retried after the backoff. */
  retryLater(d: DispatchState, n: number, now: number, random: () => number): void {
    if (d.status === "in_flight") this.removeInFlight(d)
    d.status = "failed"
    d.lockedAtMs = undefined
    d.nextAttemptAtMs = now + backoffMs(n, random)
    this.schedule(d)
  }

  /**
   * Retire a dispatch. A v0.14.0 kernel keeps counting on a retired dispatch
   * (17.A), so `keepCounters` leaves its occurrence counters in place.
   */
  exhaust(d: DispatchState, keepCounters: boolean): void {
    if (d.status === "in_flight") this.removeInFlight(d)
    d.status = "exhausted"
    d.lockedAtMs = undefined
    d.version++
    if (!keepCounters) d.counters.clear()
  }

  /** Retire every dispatch of an execution that is not retired yet. */
  release(dispatches: ReadonlyArray<DispatchState>, keepCounters: boolean): void {
    for (const d of dispatches) if (d.status !== "exhausted") this.exhaust(d, keepCounters)
  }

  /** RENEW (5.6): exists, belongs, same attempt, in flight → `locked_at = now`. */
  renewLease(executionId: string, lease: Lease, now: number): DispatchState | undefined {
    const d = this.byId.get(lease.dispatchId)
    if (
      d === undefined || d.executionId !== executionId || d.attempt !== lease.attempt || d.status !== "in_flight"
    ) return undefined
    this.renew(d, now)
    return d
  }

  /** CHECK (5.6): exists, belongs, same attempt. */
  checkLease(executionId: string, lease: Lease): boolean {
    const d = this.byId.get(lease.dispatchId)
    return d !== undefined && d.executionId === executionId && d.attempt === lease.attempt
  }

  /** v0.14.0: submit and heartbeat touch every in-flight dispatch of the execution. */
  touchAll(dispatches: ReadonlyArray<DispatchState>, now: number): void {
    for (const d of dispatches) if (d.status === "in_flight") this.renew(d, now)
  }

  /** 5.3 step 1: reclaim in-flight dispatches whose lease lapsed. Returns how many. */
  reclaimStale(now: number): number {
    let count = 0
    for (const [timeoutMs, group] of this.inFlight) {
      for (const d of group.values()) {
        if (d.lockedAtMs! >= now - timeoutMs) break
        this.reclaim(d, now)
        count++
      }
    }
    return count
  }

  /** Reclaim every in-flight dispatch now, whatever its lease. Returns how many. */
  reclaimAll(now: number): number {
    let count = 0
    for (const group of this.inFlight.values()) {
      for (const d of group.values()) {
        this.reclaim(d, now)
        count++
      }
    }
    return count
  }

  /** Snapshots of every dispatch, in creation order. */
  snapshots(): Array<DispatchRecord> {
    return Array.from(this.byId.values(), snapshot)
  }

  private reclaim(d: DispatchState, now: number): void {
    this.removeInFlight(d)
    d.status = "pending"
    d.lockedAtMs = undefined
    d.nextAttemptAtMs = now
    this.schedule(d)
  }

  private schedule(d: DispatchState): void {
    d.version++
    this.due.push({ at: d.nextAttemptAtMs, seq: this.dueSeq++, dispatch: d, version: d.version })
  }

  private addInFlight(d: DispatchState): void {
    let group = this.inFlight.get(d.leaseTimeoutMs)
    if (group === undefined) {
      group = new Map()
      this.inFlight.set(d.leaseTimeoutMs, group)
    }
    group.set(d.id, d)
  }

  private removeInFlight(d: DispatchState): void {
    this.inFlight.get(d.leaseTimeoutMs)?.delete(d.id)
  }

  private renew(d: DispatchState, now: number): void {
    // Renewed already at this instant: every later entry of its group was locked at `now` too.
    if (d.lockedAtMs === now) return
    d.lockedAtMs = now
    const group = this.inFlight.get(d.leaseTimeoutMs)
    if (group !== undefined) {
      // Re-insert so each group stays ordered by lockedAtMs.
      group.delete(d.id)
      group.set(d.id, d)
    }
  }
}
