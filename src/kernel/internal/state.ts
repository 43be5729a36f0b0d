/**
 * The state of one kernel core, as the core's transitions see it: the current
 * settings and the tables of agents, executions, dispatches and approvals,
 * plus the rate limiter's buckets. Every transition takes it and the current
 * time, and runs synchronously.
 *
 * @since 0.1.0
 * @internal
 */
import type * as RateLimiter from "../RateLimiter.js"
import type { AgentTable } from "./agents.js"
import type { ApiKeyTable } from "./apiKeys.js"
import type { ApprovalTable } from "./approvalTable.js"
import type { DispatchQueue } from "./dispatchQueue.js"
import type { ExecutionTable } from "./executions.js"
import type { Settings } from "./model.js"

/**
 * @since 0.1.0
 * @internal
 */
export interface CoreState {
  settings: Settings
  readonly agents: AgentTable
  readonly executions: ExecutionTable
  readonly dispatches: DispatchQueue
  readonly approvals: ApprovalTable
  readonly limiter: RateLimiter.RateLimiter
  /** Scoped API keys (PROTOCOL-CURRENT C.9). */
  readonly apiKeys: ApiKeyTable
}

/**
 * Whether the core emulates a v0.14.0 kernel: no attempts, no fencing (17.A).
 *
 * @since 0.1.0
 * @internal
 */
export const compatMode = (state: CoreState): boolean => state.settings.stage === "v0.14.0"

/**
 * Whether the core speaks the current stage (PROTOCOL-CURRENT): every
 * behaviour of C.2–C.12 is gated on it, so the seed and v0.14.0 stages keep
 * behaving exactly as before.
 *
 * @since 0.2.0
 * @internal
 */
export const isCurrent = (state: CoreState): boolean => state.settings.stage === "current"
