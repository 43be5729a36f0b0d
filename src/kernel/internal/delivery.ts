/**
 * Delivery bookkeeping of the kernel core: claiming due dispatches with the
 * pre-delivery checks (PROTOCOL 5.3 step 2, 5.4) and recording each delivery's
 * outcome, fenced on `(dispatch_id, attempt)` (5.4 step 6). The dispatcher
 * sends the webhooks in between.
 *
 * @since 0.1.0
 * @internal
 */
import * as Lifecycle from "./lifecycle.js"
import type { Claim } from "./model.js"
import { isTerminalExecution } from "./model.js"
import * as Payload from "./payloads.js"
import type { CoreState } from "./state.js"
import { compatMode, isCurrent } from "./state.js"

/**
 * Why a webhook delivery failed: a reason code (`http_status`,
 * `connection_refused`, `timeout`, …), a readable message and, for an HTTP
 * answer, its status. Recorded as `error` on `dispatch.failed` in the
 * current stage.
 *
 * @since 0.2.0
 * @category models
 */
export interface DeliveryCause {
  readonly reason: string
  readonly message: string
  readonly status?: number | undefined
}

/**
 * What recording a delivery did: acked; failed and retried in `retryInMs`
 * (the backoff of 5.4); failed for the last time, failing the execution with
 * `dispatch_exhausted`; or nothing (the attempt no longer held the lease).
 *
 * @since 0.2.0
 * @category models
 */
export type DeliveryRecorded =
  | { readonly _tag: "Acked" }
  | { readonly _tag: "Retrying"; readonly maxAttempts: number; readonly retryInMs: number }
  | { readonly _tag: "Exhausted"; readonly maxAttempts: number }
  | { readonly _tag: "Ignored" }

const acked: DeliveryRecorded = { _tag: "Acked" }
const ignored: DeliveryRecorded = { _tag: "Ignored" }

/**
 * 5.3 step 2 plus the pre-delivery checks of 5.4 (terminal → `dispatch.discarded`;
 * attempt > max → `dispatch_exhausted`; missing agent → stays in flight). Only
 * deliverable claims are returned; `limit` bounds the dispatches claimed.
 *
 * @since 0.1.0
 * @internal
 */
export const claimDue = (state: CoreState, limit: number, now: number): ReadonlyArray<Claim> => {
  const queue = state.dispatches
  const claims: Array<Claim> = []
  let claimed = 0
  while (claimed < limit) {
    const d = queue.takeDue(now)
    if (d === undefined) break
    claimed++
    const ex = state.executions.byId.get(d.executionId)
    const agent = ex === undefined ? undefined : state.agents.get(ex.record.agentId)
    queue.begin(d, now, agent?.leaseTimeoutMs ?? state.settings.leaseTimeoutMs)
    if (ex === undefined) continue
    if (isTerminalExecution(ex.record.status)) {
      ex.events.push(
        "dispatch.discarded",
        Payload.dispatchPayload(d.attempt, d.id, d.executionId, "exhausted"),
        now
      )
      queue.exhaust(d, compatMode(state))
      continue
    }
    if (d.attempt > d.maxAttempts) {
      Lifecycle.fail(state, ex, "dispatch_exhausted", now)
      continue
    }
    if (agent === undefined) continue
    claims.push({
      dispatchId: d.id,
      executionId: d.executionId,
      attempt: d.attempt,
      agent,
      leaseTimeoutSeconds: d.leaseTimeoutMs / 1000
    })
  }
  return claims
}

/**
 * 5.4 step 6: `dispatch.acked`, or `dispatch.failed` and a retry after the
 * backoff (the execution fails once the last attempt failed). Fenced on
 * `(dispatch_id, attempt)`, except in compat mode. In the current stage a
 * failure's `cause` is recorded as `error` on `dispatch.failed`.
 *
 * @since 0.1.0
 * @internal
 */
export const recordDelivery = (
  state: CoreState,
  claim: Claim,
  ok: boolean,
  now: number,
  cause?: DeliveryCause | undefined
): DeliveryRecorded => {
  const d = state.dispatches.byId.get(claim.dispatchId)
  if (d === undefined) return ignored
  const compat = compatMode(state)
  if (!compat && (d.status !== "in_flight" || d.attempt !== claim.attempt)) return ignored
  const ex = state.executions.byId.get(d.executionId)
  if (ex === undefined) return ignored
  const n = claim.attempt
  if (ok) {
    ex.events.push("dispatch.acked", Payload.dispatchPayload(n, d.id, d.executionId, "acked"), now)
    return acked
  }
  const error = cause === undefined || !isCurrent(state)
    ? undefined
    : Payload.deliveryError(cause.message, cause.reason, cause.status)
  ex.events.push("dispatch.failed", Payload.dispatchPayload(n, d.id, d.executionId, "failed", error), now)
  if (n >= d.maxAttempts) {
    if (isTerminalExecution(ex.record.status)) return ignored
    Lifecycle.fail(state, ex, "dispatch_exhausted", now)
    return { _tag: "Exhausted", maxAttempts: d.maxAttempts }
  }
  state.dispatches.retryLater(d, n, now, state.settings.random)
  return { _tag: "Retrying", maxAttempts: d.maxAttempts, retryInMs: d.nextAttemptAtMs - now }
}
