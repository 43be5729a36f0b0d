/**
 * Sessions of the kernel core in the current stage (PROTOCOL-CURRENT C.4): the
 * label rule of `session` and `idempotency_key` (C.4.1), when a session is busy
 * and which of its executions is admitted next (C.4.4), and the session head a
 * new execution continues from (C.4.3). Pure reads of the execution table; the
 * transitions that start executions live in `lifecycle`.
 *
 * @since 0.2.0
 * @internal
 */
import type { ExecState, ExecutionTable, SessionState } from "./executions.js"
import { isSpace } from "./goFormat.js"
import type { KernelFailure } from "./model.js"
import { validation } from "./model.js"

/**
 * Whether `s` is a valid label (C.4.1): at most 256 bytes of UTF-8 (a lone
 * surrogate has no UTF-8 form), no NUL, not whitespace only. Empty labels are
 * absent and never reach this check.
 *
 * @since 0.2.0
 * @internal
 */
export const isLabel = (s: string): boolean => {
  let bytes = 0
  let blank = true
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    if (c === 0) return false
    if (c < 0x80) bytes += 1
    else if (c < 0x800) bytes += 2
    else if (c >= 0xd800 && c <= 0xdbff) {
      const next = s.charCodeAt(i + 1)
      if (!(next >= 0xdc00 && next <= 0xdfff)) return false
      bytes += 4
      i++
      blank = false
      continue
    } else if (c >= 0xdc00 && c <= 0xdfff) return false
    else bytes += 3
    if (blank && !isSpace(c)) blank = false
  }
  return bytes <= 256 && !blank
}

/**
 * `400 validation_error` for a bad label (C.4.1), named by its member.
 *
 * @since 0.2.0
 * @internal
 */
export const badLabel = (member: "session" | "idempotency_key"): KernelFailure =>
  validation("validation error: " + member + " must be a nonblank UTF-8 string of at most 256 bytes without NUL")

/**
 * Whether the session is busy (C.4.4): one of its executions is `running` or
 * `blocked` (approvals, suspension and parking all keep it). Members start
 * one at a time, so only the one started last can be.
 *
 * @since 0.2.0
 * @internal
 */
export const isBusy = (session: SessionState): boolean => {
  const status = session.active?.record.status
  return status === "running" || status === "blocked"
}

/**
 * The oldest `pending` execution of the session, dropping queue entries that
 * left `pending` (cancelled, deadline) on the way; `undefined` when none waits.
 *
 * @since 0.2.0
 * @internal
 */
export const oldestPending = (session: SessionState): ExecState | undefined => {
  const queue = session.queue
  while (queue.length > 0) {
    const first = queue[0]!
    if (first.record.status === "pending") return first
    queue.shift()
  }
  return undefined
}

/**
 * The session head (C.4.3 step 1): the most recently created `completed`
 * execution of `agentId` in the session; failed and cancelled executions
 * never become a parent.
 *
 * @since 0.2.0
 * @internal
 */
export const head = (executions: ExecutionTable, session: string, agentId: string): ExecState | undefined => {
  const members = executions.sessions.get(session)?.members
  if (members === undefined) return undefined
  // Members are in creation order: the first match from the end is the newest.
  for (let i = members.length - 1; i >= 0; i--) {
    const candidate = members[i]!
    if (candidate.record.status === "completed" && candidate.record.agentId === agentId) return candidate
  }
  return undefined
}
