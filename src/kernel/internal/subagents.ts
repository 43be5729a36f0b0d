/**
 * Subagents of the kernel core in the current stage (PROTOCOL-CURRENT C.5): the
 * checks a child's `spawned_by` must pass under its parent (C.5.1), whether an
 * execution is waiting on its steps (C.5.2: an approval, or a child still
 * running for an executing step), and the error a parent's step records when
 * its child fails or is cancelled (C.5.3). Pure reads; the transitions live in
 * `lifecycle`.
 *
 * @since 0.2.0
 * @internal
 */
import { quoteString } from "../../internal/wire/json.js"
import type { ExecState, ExecutionTable } from "./executions.js"
import type { SpawnedBy } from "./model.js"
import { isTerminalExecution, KernelFailure, notFound, validation } from "./model.js"

/**
 * C.5.1, in order: the parent exists (`404`), is not terminal (`409`), the
 * child does not join the parent's session (`400`), the step is the parent's
 * (`400`) and is `executing` (`409`). Answers the parent.
 *
 * @since 0.2.0
 * @internal
 */
export const checkSpawn = (
  executions: ExecutionTable,
  spawnedBy: SpawnedBy,
  childSession: string | undefined
): ExecState | KernelFailure => {
  const parent = executions.byId.get(spawnedBy.executionId)
  if (parent === undefined) return notFound()
  if (isTerminalExecution(parent.record.status)) {
    return new KernelFailure({ status: 409, code: "conflict", message: "conflict: the parent execution is terminal" })
  }
  if (childSession !== undefined && childSession === parent.record.session) {
    return validation("validation error: a subagent cannot join its parent's session")
  }
  const step = parent.steps.get(spawnedBy.stepId)
  if (step === undefined) return validation("validation error: spawned_by names no step of the parent execution")
  if (step.status !== "executing") {
    return new KernelFailure({
      status: 409,
      code: "conflict",
      message: "conflict: the parent step is in status " + step.status
    })
  }
  return parent
}

/**
 * Whether the execution waits on its steps (C.5.2): a step is
 * `awaiting_approval`, or an `executing` step has a child that has not ended.
 *
 * @since 0.2.0
 * @internal
 */
export const isWaiting = (ex: ExecState): boolean => {
  for (const step of ex.order) if (step.status === "awaiting_approval") return true
  const children = ex.children
  if (children === undefined) return false
  for (const child of children) {
    if (isTerminalExecution(child.record.status)) continue
    if (ex.steps.get(child.record.spawnedBy!.stepId)?.status === "executing") return true
  }
  return false
}

/**
 * The error of a parent's step whose child failed or was cancelled (C.5.3):
 * `{"execution_id":…,"failure_reason":…,"reason":"subagent_failed"|"subagent_cancelled"}`.
 *
 * @since 0.2.0
 * @internal
 */
export const childError = (child: ExecState): string =>
  "{\"execution_id\":\"" + child.record.id + "\",\"failure_reason\":" + quoteString(child.record.failureReason) +
  ",\"reason\":\"" + (child.record.status === "cancelled" ? "subagent_cancelled" : "subagent_failed") + "\"}"
