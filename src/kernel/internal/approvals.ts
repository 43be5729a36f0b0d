/**
 * Approvals in the kernel core (PROTOCOL 9): a `require_approval` decision
 * requests one and blocks the execution (9.1), a human grants or denies it
 * (9.3, with the approver check), or it expires (9.4); a decided or expired
 * approval settles its step and resumes the execution with a new dispatch —
 * in the current stage only when no other step still waits (PROTOCOL-CURRENT
 * C.5.3, C.8.7).
 *
 * @since 0.1.0
 * @internal
 */
import { uuidv7 } from "../../internal/wire/uuid.js"
import type * as Policy from "../Policy.js"
import type { ExecState } from "./executions.js"
import { goQuote } from "./goQuote.js"
import * as Lifecycle from "./lifecycle.js"
import type { ApprovalRecord } from "./model.js"
import { conflict, KernelFailure, notFound } from "./model.js"
import * as Payload from "./payloads.js"
import type { CoreState } from "./state.js"

/**
 * 9.1: a pending approval for the step (the rule's timeout, else the default),
 * then the execution blocks. The step is already recorded as awaiting it.
 *
 * @since 0.1.0
 * @internal
 */
export const request = (
  state: CoreState,
  ex: ExecState,
  stepId: string,
  config: Policy.ApprovalConfig | undefined,
  now: number
): ApprovalRecord => {
  const executionId = ex.record.id
  const timeoutMs = config !== undefined && config.timeoutMs > 0 ? config.timeoutMs : state.settings.approvalTimeoutMs
  const approval: ApprovalRecord = {
    id: uuidv7(now),
    stepId,
    executionId,
    status: "pending",
    approvers: config?.approvers ?? null,
    message: config?.message ?? "",
    timeoutAtMs: now + timeoutMs,
    decidedBy: "",
    rationale: "",
    createdAtMs: now
  }
  state.approvals.add(approval)
  ex.approvals.push(approval.id)
  ex.events.push("approval.requested", Payload.approvalPayload(approval.id, executionId, stepId, "pending"), now)
  Lifecycle.block(state, ex, now)
  return approval
}

/** Human denial or expiry: the step is denied, the execution resumes (9.3, 9.4). */
const resumeDenied = (
  state: CoreState,
  ex: ExecState,
  approval: ApprovalRecord,
  eventType: "approval.denied" | "approval.expired",
  decidedBy: string,
  rationale: string,
  stepReason: string,
  now: number
): void => {
  const step = ex.steps.get(approval.stepId)!
  const error = Payload.reasonError(stepReason)
  const status = eventType === "approval.denied" ? "denied" : "expired"
  ex.events.push(
    eventType,
    Payload.approvalPayload(approval.id, ex.record.id, approval.stepId, status, {
      decidedBy,
      rationale,
      keepRationale: status === "expired"
    }),
    now
  )
  ex.events.pushStep("step.denied", now, step, { error, omitEmptyTarget: true })
  state.approvals.settle(
    approval,
    status === "denied" ? { status, decidedAtMs: now, rationale, decidedBy } : { status, decidedAtMs: now, rationale }
  )
  step.set("denied", step.resultRaw, error, step.startedAtMs, now)
  Lifecycle.resumeIfIdle(state, ex, now)
}

/**
 * 9.3: grant or deny a pending approval — `404` unknown, `409 conflict` when
 * already settled, `403 forbidden` when approvers are listed and the decider
 * is not one of them.
 *
 * @since 0.1.0
 * @internal
 */
export const decide = (
  state: CoreState,
  kind: "grant" | "deny",
  id: string,
  d: { readonly decidedBy: string; readonly rationale: string },
  now: number
): void | KernelFailure => {
  const approval = state.approvals.byId.get(id)
  if (approval === undefined) return notFound()
  if (approval.status !== "pending") return conflict()
  if (approval.approvers !== null && approval.approvers.length > 0 && !approval.approvers.includes(d.decidedBy)) {
    return new KernelFailure({
      status: 403,
      code: "forbidden",
      message: "forbidden: " + goQuote(d.decidedBy) + " is not an approver for this approval"
    })
  }
  const ex = state.executions.byId.get(approval.executionId)!
  if (kind === "deny") {
    resumeDenied(state, ex, approval, "approval.denied", d.decidedBy, d.rationale, d.rationale || "approval_denied", now)
    return
  }
  const step = ex.steps.get(approval.stepId)!
  ex.events.push(
    "approval.granted",
    Payload.approvalPayload(approval.id, ex.record.id, approval.stepId, "granted", {
      decidedBy: d.decidedBy,
      rationale: d.rationale
    }),
    now
  )
  ex.events.pushStep("step.allowed", now, step)
  state.approvals.settle(approval, {
    status: "granted",
    decidedAtMs: now,
    rationale: d.rationale,
    decidedBy: d.decidedBy
  })
  step.set("allowed", step.resultRaw, step.errorRaw, step.startedAtMs, step.completedAtMs)
  Lifecycle.resumeIfIdle(state, ex, now)
}

/**
 * 9.4 sweep: expire every pending approval past its timeout; returns the
 * number expired.
 *
 * @since 0.1.0
 * @internal
 */
export const expireDue = (state: CoreState, now: number): number => {
  let count = 0
  for (const id of state.approvals.pending) {
    const approval = state.approvals.byId.get(id)!
    if (approval.timeoutAtMs > now) continue
    const ex = state.executions.byId.get(approval.executionId)!
    resumeDenied(state, ex, approval, "approval.expired", "", "timeout", "approval_timeout", now)
    count++
  }
  return count
}
