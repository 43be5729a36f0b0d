/**
 * The execution lifecycle of the kernel core: creation and start (PROTOCOL
 * 11.1), a dispatch queued for every (re)start (5.2), blocking on an approval
 * (7.5) and resuming (9.3), completion and failure through the lease
 * (6.8, 6.9), heartbeats (6.7), cancellation by the client (11.4) or the
 * deadline sweep (11.1). Each transition appends its events in protocol order
 * and releases the execution's dispatches when it stops running.
 *
 * In the current stage (PROTOCOL-CURRENT C.4, C.5) it also runs sessions
 * (labels, idempotent create, pending executions admitted one at a time,
 * the session head as parent, `state` and `previous`) and subagents (a child
 * bound to an executing step of its parent, suspension, the parent's step
 * settled by the child's end, children cancelled with their parent). Every
 * move to a terminal state goes through one hook that does the last three.
 *
 * @since 0.1.0
 * @internal
 */
import { formatTimestamp } from "../../internal/wire/time.js"
import type { ExecState } from "./executions.js"
import { pendingRecord } from "./executions.js"
import { goQuote } from "./goQuote.js"
import type { ExecutionRecord, Lease, SpawnedBy } from "./model.js"
import {
  conflict,
  executionTerminal,
  isTerminalExecution,
  KernelFailure,
  leaseSuperseded,
  notFound
} from "./model.js"
import * as Payload from "./payloads.js"
import * as Resources from "./resources.js"
import * as Sessions from "./sessions.js"
import type { CoreState } from "./state.js"
import { compatMode, isCurrent } from "./state.js"
import { compactRaw } from "./storedJson.js"
import * as Subagents from "./subagents.js"

/**
 * Queue a new dispatch for the execution (5.2) and wake the delivery loop; a
 * parked execution's dispatch is due later (PROTOCOL-CURRENT C.8.3).
 *
 * @since 0.1.0
 * @internal
 */
export const enqueueDispatch = (state: CoreState, ex: ExecState, now: number, dueAtMs: number = now): void => {
  const d = state.dispatches.enqueue(
    ex.record.id,
    now,
    state.settings.maxAttempts,
    state.settings.leaseTimeoutMs,
    dueAtMs
  )
  ex.dispatches.push(d)
  ex.events.push("dispatch.queued", Payload.dispatchPayload(0, d.id, ex.record.id, "pending"), now)
  state.dispatches.wake()
}

/**
 * Retire every dispatch of the execution: it no longer runs.
 *
 * @since 0.1.0
 * @internal
 */
export const release = (state: CoreState, ex: ExecState): void => {
  state.dispatches.release(ex.dispatches, compatMode(state))
}

/**
 * What a create asks for. The members after `id` are the current stage's
 * (PROTOCOL-CURRENT C.4.1) and are ignored by the older stages; empty labels
 * mean absent.
 *
 * @since 0.2.0
 */
export interface CreateRequest {
  readonly agentId: string
  readonly inputRaw: string | undefined
  readonly agentVersion: string | undefined
  /** Test hook: create with this canonical id (`409 conflict` when taken). */
  readonly id?: string | undefined
  readonly session?: string | undefined
  readonly idempotencyKey?: string | undefined
  /** Canonical lowercase UUID. */
  readonly parentExecutionId?: string | undefined
  /** `executionId` canonical lowercase. */
  readonly spawnedBy?: SpawnedBy | undefined
}

const parentConflict = (): KernelFailure =>
  new KernelFailure({
    status: 409,
    code: "conflict",
    message: "conflict: the parent must be a completed execution of the same agent"
  })

const sessionTaken = (session: string): KernelFailure =>
  new KernelFailure({ status: 409, code: "conflict", message: "conflict: session " + goQuote(session) + " already has executions" })

/**
 * PROTOCOL 11.1. In the current stage, the checks of PROTOCOL-CURRENT C.4.1 in
 * their order (labels, the key a subagent defaults to, the agent, an earlier
 * execution with the key — answered as it is now, writing nothing —, the
 * explicit parent, `spawned_by` under the parent, C.5.1), then C.4.2: the
 * execution starts at once without a session, and with one it waits `pending`
 * until its session admits it, which may be at once.
 *
 * @since 0.1.0
 * @internal
 */
export const create = (state: CoreState, r: CreateRequest, now: number): ExecutionRecord | KernelFailure => {
  const executions = state.executions
  const current = isCurrent(state)
  let session: string | undefined
  let key: string | undefined
  let parent: ExecState | undefined
  let spawner: ExecState | undefined
  if (current) {
    if (r.session !== undefined && r.session !== "") {
      if (!Sessions.isLabel(r.session)) return Sessions.badLabel("session")
      session = r.session
    }
    if (r.idempotencyKey !== undefined && r.idempotencyKey !== "") {
      if (!Sessions.isLabel(r.idempotencyKey)) return Sessions.badLabel("idempotency_key")
      key = r.idempotencyKey
    } else if (r.spawnedBy !== undefined && r.spawnedBy.stepId !== "") {
      key = r.spawnedBy.stepId
    }
  }
  if (!state.agents.has(r.agentId)) return notFound()
  if (current) {
    if (key !== undefined) {
      const earlier = executions.byKey(r.agentId, key)
      if (earlier !== undefined) return earlier.record
    }
    if (r.parentExecutionId !== undefined && r.parentExecutionId !== "") {
      parent = executions.byId.get(r.parentExecutionId)
      if (parent === undefined) return notFound()
      if (parent.record.agentId !== r.agentId || parent.record.status !== "completed") return parentConflict()
      if (session !== undefined && executions.sessions.has(session)) return sessionTaken(session)
    }
    if (r.spawnedBy !== undefined) {
      const checked = Subagents.checkSpawn(executions, r.spawnedBy, session)
      if (checked instanceof KernelFailure) return checked
      spawner = checked
    }
  }
  const id = executions.idFor(r.id, now)
  if (id === undefined) return conflict()
  let record = pendingRecord(
    id,
    { agentId: r.agentId, agentVersion: r.agentVersion, inputRaw: compactRaw(r.inputRaw) },
    now,
    state.settings.deadlineMs
  )
  if (current) {
    if (session !== undefined) record = { ...record, session }
    if (parent !== undefined) record = { ...record, parentExecutionId: parent.record.id }
    if (key !== undefined) record = { ...record, idempotencyKey: key }
    if (r.spawnedBy !== undefined) {
      record = { ...record, spawnedBy: { executionId: r.spawnedBy.executionId, stepId: r.spawnedBy.stepId } }
    }
  }
  const ex = executions.add(record)
  ex.followsHead = session !== undefined && parent === undefined
  if (spawner !== undefined) (spawner.children ??= []).push(ex)
  const deadlineAt = record.deadlineAtMs === undefined ? undefined : formatTimestamp(record.deadlineAtMs)
  ex.events.push(
    "execution.created",
    Payload.executionPayload(id, "pending", { deadlineAt, session, spawnedBy: record.spawnedBy }),
    now
  )
  if (session === undefined) start(state, ex, now)
  else admit(state, session, now)
  return ex.record
}

/**
 * Start a `pending` execution (PROTOCOL-CURRENT C.4.3; PROTOCOL 11.1): a
 * session execution that follows its session's head (no explicit parent, not
 * a fork) takes the head as its parent; then `running`, `execution.started`,
 * the parent's resources when the parent is in the same session and this is
 * not a fork (C.6.7), and a dispatch.
 *
 * @since 0.2.0
 * @internal
 */
export const start = (state: CoreState, ex: ExecState, now: number): void => {
  const record = ex.record
  if (ex.followsHead && record.session !== undefined) {
    const head = Sessions.head(state.executions, record.session, record.agentId)
    if (head !== undefined) ex.record = { ...record, parentExecutionId: head.record.id }
  }
  ex.events.push(
    "execution.started",
    Payload.executionPayload(record.id, "running", {
      deadlineAt: record.deadlineAtMs === undefined ? undefined : formatTimestamp(record.deadlineAtMs),
      session: record.session,
      parentExecutionId: ex.record.parentExecutionId
    }),
    now
  )
  const parentId = ex.record.parentExecutionId
  if (parentId !== undefined && record.session !== undefined && record.forkedFrom === undefined) {
    const parent = state.executions.byId.get(parentId)
    if (parent !== undefined && parent.record.session === record.session) Resources.inherit(ex, parent, now)
  }
  state.executions.setStatus(ex, "running", now)
  if (record.session !== undefined) state.executions.sessions.get(record.session)!.active = ex
  enqueueDispatch(state, ex, now)
}

/**
 * PROTOCOL-CURRENT C.4.4: when the session is free, start its oldest `pending`
 * execution. One whose deadline has passed is not started but cancelled with
 * `deadline_exceeded`, and the next one is tried. Returns whether one started.
 *
 * @since 0.2.0
 * @internal
 */
export const admit = (state: CoreState, label: string, now: number): boolean => {
  const session = state.executions.sessions.get(label)
  // A cancellation below ends here again: the loop of the outer call goes on.
  if (session === undefined || session.admitting) return false
  session.admitting = true
  try {
    for (;;) {
      if (Sessions.isBusy(session)) return false
      const next = Sessions.oldestPending(session)
      if (next === undefined) {
        state.executions.queued.delete(label)
        return false
      }
      session.queue.shift()
      const deadlineAtMs = next.record.deadlineAtMs
      if (deadlineAtMs !== undefined && deadlineAtMs <= now) {
        cancelExecution(state, next, "deadline_exceeded", now)
        continue
      }
      start(state, next, now)
      return true
    }
  } finally {
    session.admitting = false
  }
}

/**
 * The periodic admission sweep of PROTOCOL-CURRENT C.4.4: every free session
 * with a pending execution starts its oldest one. Returns how many started.
 * (Admission also happens on every terminal transition, in the same step, so
 * in this kernel the sweep only finds work after a stage change.)
 *
 * @since 0.2.0
 * @internal
 */
export const admitAll = (state: CoreState, now: number): number => {
  const queued = state.executions.queued
  if (queued.size === 0 || !isCurrent(state)) return 0
  let count = 0
  for (const label of Array.from(queued)) if (admit(state, label, now)) count++
  return count
}

/**
 * Every move to a terminal state ends here (current stage): the children are
 * cancelled with `parent_agent_terminal` (and theirs, down the tree), the
 * parent's step is settled by this child's end (C.5.3), and the session
 * admits its next execution (C.4.4).
 */
const ended = (state: CoreState, ex: ExecState, now: number): void => {
  if (!isCurrent(state)) return
  const children = ex.children
  if (children !== undefined) {
    for (const child of children) {
      if (!isTerminalExecution(child.record.status)) cancelExecution(state, child, "parent_agent_terminal", now)
    }
  }
  const spawnedBy = ex.record.spawnedBy
  if (spawnedBy !== undefined) settleParentStep(state, ex, spawnedBy, now)
  const session = ex.record.session
  if (session !== undefined) admit(state, session, now)
}

/**
 * PROTOCOL-CURRENT C.5.3: a child's end settles the step it was created by —
 * only while the parent runs and the step is still `executing`, counting it
 * against its resources (C.6.5) — and a blocked parent with nothing left to
 * wait for resumes.
 */
const settleParentStep = (state: CoreState, child: ExecState, spawnedBy: SpawnedBy, now: number): void => {
  const parent = state.executions.byId.get(spawnedBy.executionId)
  if (parent === undefined || isTerminalExecution(parent.record.status)) return
  const step = parent.steps.get(spawnedBy.stepId)
  if (step === undefined || step.status !== "executing") return
  if (child.record.status === "completed") {
    step.set("succeeded", child.record.outputRaw ?? "null", step.errorRaw, step.startedAtMs, now)
    parent.events.pushStep("step.succeeded", now, step)
  } else {
    const error = Subagents.childError(child)
    step.set("failed", step.resultRaw, error, step.startedAtMs, now)
    parent.events.pushStep("step.failed", now, step, { error })
  }
  Resources.count(parent, step)
  if (parent.record.status === "blocked") resumeIfIdle(state, parent, now)
}

/**
 * The execution fails with `reason`.
 *
 * @since 0.1.0
 * @internal
 */
export const fail = (state: CoreState, ex: ExecState, reason: string, now: number): void => {
  ex.events.push("execution.failed", Payload.executionPayload(ex.record.id, "failed", { reason }), now)
  state.executions.setStatus(ex, "failed", now, ex.record.outputRaw, reason)
  release(state, ex)
  ended(state, ex, now)
}

/**
 * The execution waits for an approval (7.5): blocked, its dispatches retired.
 *
 * @since 0.1.0
 * @internal
 */
export const block = (state: CoreState, ex: ExecState, now: number): void => {
  ex.events.push("execution.blocked", Payload.executionPayload(ex.record.id, "blocked"), now)
  state.executions.setStatus(ex, "blocked", now)
  release(state, ex)
}

/**
 * A decided or expired approval lets the execution run again (9.3, 9.4).
 *
 * @since 0.1.0
 * @internal
 */
export const resume = (state: CoreState, ex: ExecState, now: number): void => {
  // Only reachable for a terminal execution in v0.14.0 mode (a blocked execution
  // completed without a lease check); a finished execution is not revived.
  if (isTerminalExecution(ex.record.status)) return
  ex.events.push("execution.resumed", Payload.executionPayload(ex.record.id, "running"), now)
  state.executions.setStatus(ex, "running", now)
  enqueueDispatch(state, ex, now)
}

/**
 * {@link resume}, except that in the current stage a blocked execution that
 * still waits on a step — another approval, a running child — stays blocked
 * (PROTOCOL-CURRENT C.5.3, C.8.7).
 *
 * @since 0.2.0
 * @internal
 */
export const resumeIfIdle = (state: CoreState, ex: ExecState, now: number): void => {
  if (isCurrent(state) && Subagents.isWaiting(ex)) return
  resume(state, ex, now)
}

/**
 * PROTOCOL-CURRENT C.5.2: `POST …/suspend`. Unknown `404`, terminal `409
 * execution_terminal`, the lease RENEWed (`409 lease_superseded`); then an
 * execution waiting on its steps blocks (`execution.blocked` with reason
 * `awaiting_steps`, its dispatches retired) and the answer is `true`; else
 * nothing is written and the answer is `false`.
 *
 * @since 0.2.0
 * @internal
 */
export const suspend = (state: CoreState, executionId: string, lease: Lease, now: number): boolean | KernelFailure => {
  const ex = state.executions.byId.get(executionId)
  if (ex === undefined) return notFound()
  if (isTerminalExecution(ex.record.status)) return executionTerminal()
  if (state.dispatches.renewLease(executionId, lease, now) === undefined) return leaseSuperseded()
  if (!Subagents.isWaiting(ex)) return false
  ex.events.push("execution.blocked", Payload.executionPayload(executionId, "blocked", { reason: "awaiting_steps" }), now)
  state.executions.setStatus(ex, "blocked", now)
  release(state, ex)
  return true
}

/**
 * PROTOCOL-CURRENT C.4.6: what `GET …/previous` answers, as raw JSON — the
 * parent's stored `state`, else its `output`, else `null` (also without a
 * parent). `404` for an unknown execution.
 *
 * @since 0.2.0
 * @internal
 */
export const previous = (state: CoreState, executionId: string): string | KernelFailure => {
  const ex = state.executions.byId.get(executionId)
  if (ex === undefined) return notFound()
  const parentId = ex.record.parentExecutionId
  const parent = parentId === undefined ? undefined : state.executions.byId.get(parentId)
  if (parent === undefined) return "null"
  return parent.stateRaw ?? parent.record.outputRaw ?? "null"
}

/**
 * 11.4: cancelled with `reason` (`client_cancelled`; in the current stage also
 * `deadline_exceeded` and `parent_agent_terminal`), dispatches retired,
 * pending approvals expired, executing steps cancelled.
 */
const cancelExecution = (state: CoreState, ex: ExecState, reason: string, now: number): void => {
  const executionId = ex.record.id
  ex.events.push("execution.cancelled", Payload.executionPayload(executionId, "cancelled", { reason }), now)
  state.executions.setStatus(ex, "cancelled", now, ex.record.outputRaw, reason)
  release(state, ex)
  const cancelledError = Payload.reasonError("execution_cancelled")
  for (const approvalId of ex.approvals) {
    const approval = state.approvals.byId.get(approvalId)!
    if (approval.status !== "pending") continue
    const step = ex.steps.get(approval.stepId)!
    ex.events.push(
      "approval.expired",
      Payload.approvalPayload(approval.id, executionId, approval.stepId, "expired", {
        rationale: "execution_cancelled",
        keepRationale: true
      }),
      now
    )
    ex.events.pushStep("step.denied", now, step, { error: cancelledError, omitEmptyTarget: true })
    state.approvals.settle(approval, { status: "expired", decidedAtMs: now, rationale: "execution_cancelled" })
    step.set("denied", step.resultRaw, cancelledError, step.startedAtMs, now)
  }
  for (const step of ex.steps.values()) {
    if (step.status !== "executing") continue
    ex.events.pushStep("step.cancelled", now, step, { error: cancelledError })
    step.set("cancelled", step.resultRaw, cancelledError, step.startedAtMs, now)
    Resources.count(ex, step)
  }
  ended(state, ex, now)
}

const alreadyTerminal = (): KernelFailure =>
  new KernelFailure({ status: 409, code: "conflict", message: "conflict: execution is already terminal" })

/**
 * PROTOCOL 11.4: `404` when unknown, `409 execution_terminal` when finished —
 * `409 conflict` in the current stage (PROTOCOL-CURRENT C.10). A `pending`
 * execution can be cancelled too.
 *
 * @since 0.1.0
 * @internal
 */
export const cancel = (state: CoreState, id: string, now: number): void | KernelFailure => {
  const ex = state.executions.byId.get(id)
  if (ex === undefined) return notFound()
  if (isTerminalExecution(ex.record.status)) return isCurrent(state) ? alreadyTerminal() : executionTerminal()
  cancelExecution(state, ex, "client_cancelled", now)
}

/**
 * 11.1 deadline sweep: cancel every execution past its deadline; returns the
 * number cancelled. The deadline runs from creation, so a `pending` execution
 * expires too; the reason is `client_cancelled`, `deadline_exceeded` in the
 * current stage (PROTOCOL-CURRENT C.4.4, C.10).
 *
 * @since 0.1.0
 * @internal
 */
export const cancelPastDeadline = (state: CoreState, now: number): number => {
  const deadlines = state.executions.deadlines
  const reason = isCurrent(state) ? "deadline_exceeded" : "client_cancelled"
  const expired: Array<ExecState> = []
  for (const ex of deadlines.values()) {
    if (isTerminalExecution(ex.record.status)) {
      deadlines.delete(ex.record.id)
    } else if (ex.record.deadlineAtMs !== undefined && ex.record.deadlineAtMs <= now) {
      expired.push(ex)
    }
  }
  // A cancellation may end others of the list first (admission cancels an
  // expired pending execution, a parent its children): they count all the same.
  for (const ex of expired) {
    if (!isTerminalExecution(ex.record.status)) cancelExecution(state, ex, reason, now)
  }
  return expired.length
}

/**
 * 6.8 and 6.9: the run's outcome, accepted through a renewed lease (not in
 * compat mode). A completion's `stateRaw`, when present and not `null`, is
 * stored for `previous` (PROTOCOL-CURRENT C.4.5) and shown nowhere else.
 *
 * @since 0.1.0
 * @internal
 */
export const finish = (
  state: CoreState,
  now: number,
  executionId: string,
  lease: Lease,
  outcome: {
    readonly _tag: "completed"
    readonly outputRaw: string | undefined
    readonly stateRaw?: string | undefined
  } | {
    readonly _tag: "failed"
    readonly reason: string
  }
): void | KernelFailure => {
  const ex = state.executions.byId.get(executionId)
  if (ex === undefined) return notFound()
  if (isTerminalExecution(ex.record.status)) return executionTerminal()
  if (!compatMode(state) && state.dispatches.renewLease(executionId, lease, now) === undefined) {
    return leaseSuperseded()
  }
  if (outcome._tag === "failed") {
    fail(state, ex, outcome.reason, now)
    return
  }
  const output = compactRaw(outcome.outputRaw)
  if (outcome.stateRaw !== undefined) {
    const stored = compactRaw(outcome.stateRaw)
    if (stored !== "null") ex.stateRaw = stored
  }
  ex.events.push("execution.completed", Payload.executionPayload(executionId, "completed", { output }), now)
  state.executions.setStatus(ex, "completed", now, output)
  release(state, ex)
  ended(state, ex, now)
}

/**
 * 6.7: RENEW the lease; in v0.14.0 mode, touch every in-flight dispatch of the
 * execution and never fail.
 *
 * @since 0.1.0
 * @internal
 */
export const heartbeat = (state: CoreState, executionId: string, lease: Lease, now: number): void | KernelFailure => {
  // PROTOCOL-CURRENT C.10: an unknown execution is `404` before any lease check.
  if (isCurrent(state) && !state.executions.byId.has(executionId)) return notFound()
  if (compatMode(state)) {
    const ex = state.executions.byId.get(executionId)
    if (ex !== undefined) state.dispatches.touchAll(ex.dispatches, now)
    return
  }
  if (state.dispatches.renewLease(executionId, lease, now) === undefined) return leaseSuperseded()
}
