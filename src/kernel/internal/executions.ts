/**
 * The executions of the kernel core: each execution's record with its event
 * log, steps, dispatches and approvals, the id order used for listing
 * (PROTOCOL 11.3), the set of executions with a live deadline, and status
 * changes. The transitions between statuses live in `lifecycle`.
 *
 * @since 0.1.0
 * @internal
 */
import type { ExecutionStatus } from "../../Protocol.js"
import type { DispatchState } from "./dispatchQueue.js"
import { EventLog } from "./eventLog.js"
import type { EventRecord, ExecutionPage, ExecutionRecord } from "./model.js"
import { isTerminalExecution } from "./model.js"
import type { StepState } from "./stepState.js"

/**
 * An execution as the core keeps it.
 *
 * @since 0.1.0
 * @internal
 */
export interface ExecState {
  record: ExecutionRecord
  readonly events: EventLog
  readonly steps: Map<string, StepState>
  /** The steps in the order they were first submitted. */
  readonly order: Array<StepState>
  readonly dispatches: Array<DispatchState>
  /** Approval ids, oldest first. */
  readonly approvals: Array<string>
  /** Counter keys of steps failed with reason `indeterminate` (7.3 step 10). */
  indeterminate: Set<string> | undefined
}

/** Lower bound: first index whose id is ≥ `id`. */
const lowerBound = (ids: ReadonlyArray<string>, id: string): number => {
  let lo = 0
  let hi = ids.length
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if (ids[mid]! < id) lo = mid + 1
    else hi = mid
  }
  return lo
}

const clampLimit = (limit: number, fallback: number, max: number): number =>
  !Number.isFinite(limit) || limit <= 0 ? fallback : limit > max ? max : Math.floor(limit)

/**
 * @since 0.1.0
 * @internal
 */
export class ExecutionTable {
  readonly byId = new Map<string, ExecState>()
  /** Execution ids ascending (UUIDv7 ⇒ creation order), for listing only. */
  private readonly ids: Array<string> = []
  /** Non-terminal executions with a deadline. */
  readonly deadlines = new Map<string, ExecState>()

  /** Add an execution with this record (its id not taken yet) and nothing else. */
  add(record: ExecutionRecord): ExecState {
    const id = record.id
    const ex: ExecState = {
      record,
      events: new EventLog(id),
      steps: new Map(),
      order: [],
      dispatches: [],
      approvals: [],
      indeterminate: undefined
    }
    this.byId.set(id, ex)
    const at = lowerBound(this.ids, id)
    if (at === this.ids.length) this.ids.push(id)
    else this.ids.splice(at, 0, id)
    return ex
  }

  /** A new record with this status, updated at `now`; a terminal execution leaves the deadline set. */
  setStatus(
    ex: ExecState,
    status: ExecutionStatus,
    now: number,
    outputRaw: string | undefined = ex.record.outputRaw,
    failureReason: string = ex.record.failureReason
  ): void {
    const r = ex.record
    ex.record = {
      id: r.id,
      agentId: r.agentId,
      agentVersion: r.agentVersion,
      inputRaw: r.inputRaw,
      status,
      outputRaw,
      failureReason,
      createdAtMs: r.createdAtMs,
      updatedAtMs: now,
      deadlineAtMs: r.deadlineAtMs
    }
    if (isTerminalExecution(status)) this.deadlines.delete(ex.record.id)
  }

  /** 11.3: newest first, filtered, from below `cursor`; `limit` clamped to 1–200 (default 50). */
  list(q: {
    readonly agentId: string
    readonly status: string
    readonly cursor: string | undefined
    readonly limit: number
  }): ExecutionPage {
    const limit = clampLimit(q.limit, 50, 200)
    let index = q.cursor === undefined ? this.ids.length : lowerBound(this.ids, q.cursor.toLowerCase())
    const page: Array<ExecutionRecord> = []
    let nextCursor: string | undefined
    while (--index >= 0) {
      const record = this.byId.get(this.ids[index]!)!.record
      if (q.agentId !== "" && record.agentId !== q.agentId) continue
      if (q.status !== "" && record.status !== q.status) continue
      if (page.length === limit) {
        nextCursor = page[page.length - 1]!.id
        break
      }
      page.push(record)
    }
    return { executions: page, nextCursor }
  }

  /** 11.5: events with `seq > afterSeq`; `limit` clamped to 1–1000 (default 100); empty when unknown. */
  events(id: string, afterSeq: number, limit: number): ReadonlyArray<EventRecord> {
    const ex = this.byId.get(id)
    if (ex === undefined) return []
    const from = Number.isFinite(afterSeq) && afterSeq > 0 ? Math.floor(afterSeq) : 0
    return ex.events.slice(from, from + clampLimit(limit, 100, 1000))
  }
}
