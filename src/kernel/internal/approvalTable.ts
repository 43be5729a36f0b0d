/**
 * The approvals of the kernel core (PROTOCOL 9): every approval record, the
 * pending ones oldest first, and the pending approval of each step. How
 * approvals are requested and decided lives in `approvals`.
 *
 * @since 0.1.0
 * @internal
 */
import type { ApprovalStatus } from "../../Protocol.js"
import type { ApprovalRecord } from "./model.js"

/**
 * @since 0.1.0
 * @internal
 */
export class ApprovalTable {
  readonly byId = new Map<string, ApprovalRecord>()
  /** Pending approval ids, oldest first. */
  private readonly pendingIds = new Set<string>()
  private readonly pendingByStep = new Map<string, string>()

  /** Pending approval ids, oldest first (settling one while iterating is fine). */
  get pending(): ReadonlySet<string> {
    return this.pendingIds
  }

  /** Add a pending approval. */
  add(approval: ApprovalRecord): void {
    this.byId.set(approval.id, approval)
    this.pendingIds.add(approval.id)
    this.pendingByStep.set(approval.stepId, approval.id)
  }

  /** The id of the step's pending approval, if any. */
  pendingFor(stepId: string): string | undefined {
    return this.pendingByStep.get(stepId)
  }

  /** Record a decision or an expiry: the approval is no longer pending. */
  settle(
    approval: ApprovalRecord,
    patch: {
      readonly status: ApprovalStatus
      readonly decidedAtMs: number
      readonly rationale: string
      readonly decidedBy?: string
    }
  ): void {
    this.byId.set(approval.id, { ...approval, ...patch })
    this.pendingIds.delete(approval.id)
    if (this.pendingByStep.get(approval.stepId) === approval.id) this.pendingByStep.delete(approval.stepId)
  }

  /** Pending approvals only, oldest first (11.8). */
  listPending(): Array<ApprovalRecord> {
    const pending: Array<ApprovalRecord> = []
    for (const id of this.pendingIds) pending.push(this.byId.get(id)!)
    return pending.sort((a, b) => a.createdAtMs - b.createdAtMs)
  }
}
