/**
 * The executions of the kernel core: each execution's record with its event
 * log, steps, dispatches and approvals, the id order used for listing
 * (PROTOCOL 11.3), the set of executions with a live deadline, and status
 * changes; in the current stage also the sessions with their members and
 * pending queues, and the executions by idempotency key (PROTOCOL-CURRENT
 * C.4). The transitions between statuses live in `lifecycle`.
 *
 * @since 0.1.0
 * @internal
 */
import { uuidv7 } from "../../internal/wire/uuid.js"
import type { ExecutionStatus } from "../../Protocol.js"
import type * as Policy from "../Policy.js"
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
  /**
   * The `state` of its `complete`, when one was sent and not `null`
   * (PROTOCOL-CURRENT C.4.5); read by `previous` (C.4.6), shown nowhere else.
   */
  stateRaw: string | undefined
  /** The subagents it created, oldest first (C.5.1); `undefined` until the first. */
  children: Array<ExecState> | undefined
  /**
   * Whether it takes its session's head as parent when it starts (C.4.3 step
   * 1): a session execution without an explicit parent that is not a fork.
   */
  followsHead: boolean
  /** Its registered resources by key, in registration order (PROTOCOL-CURRENT C.6); `undefined` until the first. */
  resources: Map<string, ResourceState> | undefined
  /** Its checkpoints, oldest first (C.6.5–C.6.7); `undefined` until the first. */
  checkpoints: Array<CheckpointState> | undefined
  /** The policy bundle of its own, a fork's (C.7.2 step 1); `undefined` = the agent's applies. */
  policy: OwnPolicy | undefined
}

/**
 * A policy bundle an execution runs under instead of its agent's (a fork's,
 * PROTOCOL-CURRENT C.7.2 step 1): the YAML text and its compiled form.
 *
 * @since 0.2.0
 * @internal
 */
export interface OwnPolicy {
  readonly text: string
  readonly bundle: Policy.Bundle
}

/**
 * A resource as the core keeps it (PROTOCOL-CURRENT C.6.1); read out as a
 * `ResourceRecord`.
 *
 * @since 0.2.0
 * @internal
 */
export interface ResourceState {
  readonly key: string
  readonly driverId: string
  /** Compacted raw JSON; `undefined` when none. */
  readonly configurationRaw: string | undefined
  /** SHA-256 of the canonical configuration (C.6.2), `null` when none. */
  readonly fingerprint: string
  readonly coverageReuse: boolean
  everySteps: number
  onCompletion: boolean
  readonly registeredSeq: number
  generation: number
  count: number
  bindingRaw: string | undefined
  /** Canonical JSON of the binding, to compare a second binding with (C.6.3). */
  bindingCanonical: string | undefined
  readonly checkpointRef: string | undefined
  /** Every generation it had and the seq it got it at, oldest first (a fork reads the one of its fork point). */
  readonly generations: Array<{ readonly seq: number; readonly generation: number }>
}

/**
 * A stored checkpoint (PROTOCOL-CURRENT C.6.5); open while `invalidatedSeq`
 * is `undefined`.
 *
 * @since 0.2.0
 * @internal
 */
export interface CheckpointState {
  readonly key: string
  readonly generation: number
  readonly checkpointRef: string
  readonly coveredSeq: number
  invalidatedSeq: number | undefined
}

/**
 * The executions of one session (PROTOCOL-CURRENT C.4.4), which run one at a
 * time: every member in creation order, and the `pending` ones waiting for
 * admission, oldest first.
 *
 * @since 0.2.0
 * @internal
 */
export interface SessionState {
  readonly members: Array<ExecState>
  /** Pending members in creation order; entries that left `pending` are skipped, then dropped. */
  readonly queue: Array<ExecState>
  /** The member started last: the only one that can be running or blocked. */
  active: ExecState | undefined
  /** Set while an admission runs, so that an end it causes does not start another one. */
  admitting: boolean
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

const keyOf = (agentId: string, key: string): string => agentId.length + ":" + agentId + key

const clampLimit = (limit: number, fallback: number, max: number): number =>
  !Number.isFinite(limit) || limit <= 0 ? fallback : limit > max ? max : Math.floor(limit)

/**
 * A new execution's record: `pending`, created and updated at `now`, due
 * `deadlineMs` after it when the kernel gives executions a deadline.
 *
 * @internal
 */
export const pendingRecord = (
  id: string,
  from: Pick<ExecutionRecord, "agentId" | "agentVersion" | "inputRaw">,
  now: number,
  deadlineMs: number | undefined
): ExecutionRecord => ({
  id,
  agentId: from.agentId,
  agentVersion: from.agentVersion,
  inputRaw: from.inputRaw,
  status: "pending",
  outputRaw: undefined,
  failureReason: "",
  createdAtMs: now,
  updatedAtMs: now,
  deadlineAtMs: deadlineMs === undefined ? undefined : now + deadlineMs
})

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
  /** Sessions by label (PROTOCOL-CURRENT C.4.4). */
  readonly sessions = new Map<string, SessionState>()
  /** Labels of the sessions whose queue may hold a pending execution (the admission sweep's work list). */
  readonly queued = new Set<string>()

  /** Executions by agent and idempotency key (PROTOCOL-CURRENT C.4.1 step 4). */
  private readonly keys = new Map<string, ExecState>()

  /**
   * The id of a new execution: the requested one, or `undefined` when an
   * execution already has it; without a request, a fresh UUIDv7 no execution has.
   */
  idFor(requested: string | undefined, now: number): string | undefined {
    if (requested !== undefined) return this.byId.has(requested) ? undefined : requested
    let id: string
    do id = uuidv7(now)
    while (this.byId.has(id))
    return id
  }

  /**
   * Add an execution with this record (its id not taken yet), as a member of
   * its session (queued when `pending`), under its idempotency key and, with a
   * deadline, among the executions with one; no events, no dispatch.
   */
  add(record: ExecutionRecord): ExecState {
    const id = record.id
    const ex: ExecState = {
      record,
      events: new EventLog(id),
      steps: new Map(),
      order: [],
      dispatches: [],
      approvals: [],
      indeterminate: undefined,
      stateRaw: undefined,
      children: undefined,
      followsHead: false,
      resources: undefined,
      checkpoints: undefined,
      policy: undefined
    }
    this.byId.set(id, ex)
    const at = lowerBound(this.ids, id)
    if (at === this.ids.length) this.ids.push(id)
    else this.ids.splice(at, 0, id)
    if (record.session !== undefined) {
      let session = this.sessions.get(record.session)
      if (session === undefined) {
        session = { members: [], queue: [], active: undefined, admitting: false }
        this.sessions.set(record.session, session)
      }
      session.members.push(ex)
      if (record.status === "pending") {
        session.queue.push(ex)
        this.queued.add(record.session)
      }
    }
    if (record.idempotencyKey !== undefined) this.keys.set(keyOf(record.agentId, record.idempotencyKey), ex)
    if (record.deadlineAtMs !== undefined) this.deadlines.set(id, ex)
    return ex
  }

  /** The execution of this agent created with this idempotency key (C.4.1 step 4). */
  byKey(agentId: string, key: string): ExecState | undefined {
    return this.keys.get(keyOf(agentId, key))
  }

  /** A new record with this status, updated at `now`; a terminal execution leaves the deadline set. */
  setStatus(
    ex: ExecState,
    status: ExecutionStatus,
    now: number,
    outputRaw: string | undefined = ex.record.outputRaw,
    failureReason: string = ex.record.failureReason
  ): void {
    ex.record = { ...ex.record, status, outputRaw, failureReason, updatedAtMs: now }
    if (isTerminalExecution(status)) this.deadlines.delete(ex.record.id)
  }

  /** 11.3: newest first, filtered, from below `cursor`; `limit` clamped to 1–200 (default 50). */
  list(q: {
    readonly agentId: string
    readonly status: string
    readonly cursor: string | undefined
    readonly limit: number
    /** PROTOCOL-CURRENT C.4.7: exact session; `""` or absent = any. */
    readonly session?: string | undefined
  }): ExecutionPage {
    const limit = clampLimit(q.limit, 50, 200)
    const session = q.session ?? ""
    if (session !== "" && !this.sessions.has(session)) return { executions: [], nextCursor: undefined }
    let index = q.cursor === undefined ? this.ids.length : lowerBound(this.ids, q.cursor.toLowerCase())
    const page: Array<ExecutionRecord> = []
    let nextCursor: string | undefined
    while (--index >= 0) {
      const record = this.byId.get(this.ids[index]!)!.record
      if (q.agentId !== "" && record.agentId !== q.agentId) continue
      if (q.status !== "" && record.status !== q.status) continue
      if (session !== "" && record.session !== session) continue
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
