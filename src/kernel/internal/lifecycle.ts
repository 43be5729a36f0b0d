/**
 * The execution lifecycle of the kernel core: creation and start (PROTOCOL
 * 11.1), a dispatch queued for every (re)start (5.2), blocking on an approval
 * (7.5) and resuming (9.3), completion and failure through the lease
 * (6.8, 6.9), heartbeats (6.7), cancellation by the client (11.4) or the
 * deadline sweep (11.1). Each transition appends its events in protocol order
 * and releases the execution's dispatches when it stops running.
 *
 * @since 0.1.0
 * @internal
 */
import { uuidv7 } from "../../internal/wire/uuid.js"
import { formatTimestamp } from "../../internal/wire/time.js"
import type { ExecState } from "./executions.js"
import type { ExecutionRecord, KernelFailure, Lease } from "./model.js"
import {
  conflict,
  executionTerminal,
  isTerminalExecution,
  leaseSuperseded,
  notFound
} from "./model.js"
import * as Payload from "./payloads.js"
import type { CoreState } from "./state.js"
import { compatMode } from "./state.js"
import { compactRaw } from "./storedJson.js"

/**
 * Queue a new dispatch for the execution (5.2) and wake the delivery loop.
 *
 * @since 0.1.0
 * @internal
 */
export const enqueueDispatch = (state: CoreState, ex: ExecState, now: number): void => {
  const d = state.dispatches.enqueue(ex.record.id, now, state.settings.maxAttempts, state.settings.leaseTimeoutMs)
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
 * PROTOCOL 11.1. `id` (optional, test hook) creates the execution with a given
 * canonical id (`409 conflict` when taken).
 *
 * @since 0.1.0
 * @internal
 */
export const create = (
  state: CoreState,
  r: {
    readonly agentId: string
    readonly inputRaw: string | undefined
    readonly agentVersion: string | undefined
    readonly id?: string | undefined
  },
  now: number
): ExecutionRecord | KernelFailure => {
  const executions = state.executions
  if (!state.agents.has(r.agentId)) return notFound()
  let id = r.id
  if (id !== undefined) {
    if (executions.byId.has(id)) return conflict()
  } else {
    do id = uuidv7(now)
    while (executions.byId.has(id))
  }
  const deadlineMs = state.settings.deadlineMs
  const deadlineAtMs = deadlineMs === undefined ? undefined : now + deadlineMs
  const ex = executions.add({
    id,
    agentId: r.agentId,
    agentVersion: r.agentVersion,
    inputRaw: compactRaw(r.inputRaw),
    status: "pending",
    outputRaw: undefined,
    failureReason: "",
    createdAtMs: now,
    updatedAtMs: now,
    deadlineAtMs
  })
  const deadlineAt = deadlineAtMs === undefined ? undefined : formatTimestamp(deadlineAtMs)
  ex.events.push("execution.created", Payload.executionPayload(id, "pending", { deadlineAt }), now)
  ex.events.push("execution.started", Payload.executionPayload(id, "running", { deadlineAt }), now)
  executions.setStatus(ex, "running", now)
  if (deadlineAtMs !== undefined) executions.deadlines.set(id, ex)
  enqueueDispatch(state, ex, now)
  return ex.record
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

/** 11.4: cancelled, dispatches retired, pending approvals expired, executing steps cancelled. */
const cancelExecution = (state: CoreState, ex: ExecState, now: number): void => {
  const executionId = ex.record.id
  ex.events.push(
    "execution.cancelled",
    Payload.executionPayload(executionId, "cancelled", { reason: "client_cancelled" }),
    now
  )
  state.executions.setStatus(ex, "cancelled", now, ex.record.outputRaw, "client_cancelled")
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
  }
}

/**
 * PROTOCOL 11.4: `404` when unknown, `409 execution_terminal` when finished.
 *
 * @since 0.1.0
 * @internal
 */
export const cancel = (state: CoreState, id: string, now: number): void | KernelFailure => {
  const ex = state.executions.byId.get(id)
  if (ex === undefined) return notFound()
  if (isTerminalExecution(ex.record.status)) return executionTerminal()
  cancelExecution(state, ex, now)
}

/**
 * 11.1 deadline sweep: cancel every running execution past its deadline;
 * returns the number cancelled.
 *
 * @since 0.1.0
 * @internal
 */
export const cancelPastDeadline = (state: CoreState, now: number): number => {
  const deadlines = state.executions.deadlines
  let count = 0
  for (const ex of deadlines.values()) {
    if (isTerminalExecution(ex.record.status)) {
      deadlines.delete(ex.record.id)
    } else if (ex.record.deadlineAtMs !== undefined && ex.record.deadlineAtMs <= now) {
      cancelExecution(state, ex, now)
      count++
    }
  }
  return count
}

/**
 * 6.8 and 6.9: the run's outcome, accepted through a renewed lease (not in
 * compat mode).
 *
 * @since 0.1.0
 * @internal
 */
export const finish = (
  state: CoreState,
  now: number,
  executionId: string,
  lease: Lease,
  outcome: { readonly _tag: "completed"; readonly outputRaw: string | undefined } | {
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
  ex.events.push("execution.completed", Payload.executionPayload(executionId, "completed", { output }), now)
  state.executions.setStatus(ex, "completed", now, output)
  release(state, ex)
}

/**
 * 6.7: RENEW the lease; in v0.14.0 mode, touch every in-flight dispatch of the
 * execution and never fail.
 *
 * @since 0.1.0
 * @internal
 */
export const heartbeat = (state: CoreState, executionId: string, lease: Lease, now: number): void | KernelFailure => {
  if (compatMode(state)) {
    const ex = state.executions.byId.get(executionId)
    if (ex !== undefined) state.dispatches.touchAll(ex.dispatches, now)
    return
  }
  if (state.dispatches.renewLease(executionId, lease, now) === undefined) return leaseSuperseded()
}
