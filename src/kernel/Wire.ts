/**
 * Encoders from kernel-core records to the exact JSON text the embedded kernel
 * sends (PROTOCOL 7.1, 11.12, 12, 13.1): members in the reference kernel's order,
 * optional members omitted when empty, strings quoted the way Go's
 * `encoding/json` does (HTML-escaped), stored raw JSON inserted verbatim (it is
 * compacted when stored), timestamps in RFC 3339 UTC. Every encoder returns the
 * JSON value only; the HTTP layer appends the trailing newline.
 *
 * @since 0.1.0
 */
import { quoteString } from "../internal/wire/json.js"
import { formatTimestamp } from "../internal/wire/time.js"
import type {
  AgentRecord,
  ApprovalRecord,
  Claim,
  Decision,
  Delta,
  EventRecord,
  ExecutionPage,
  ExecutionRecord,
  StepRecord
} from "./Core.js"

/** UUIDs and hex step ids never need escaping. */
const id = (s: string): string => "\"" + s + "\""
const time = (ms: number): string => "\"" + formatTimestamp(ms) + "\""

/**
 * An Execution object (11.12): `agent_version`, `output`, `failure_reason` and
 * `deadline_at` only when set; `input` always (`null` when absent).
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeExecution = (e: ExecutionRecord): string => {
  let out = "{\"id\":" + id(e.id) + ",\"agent_id\":" + quoteString(e.agentId)
  if (e.agentVersion !== undefined && e.agentVersion !== "") out += ",\"agent_version\":" + quoteString(e.agentVersion)
  out += ",\"input\":" + (e.inputRaw ?? "null") + ",\"status\":" + quoteString(e.status)
  if (e.outputRaw !== undefined) out += ",\"output\":" + e.outputRaw
  if (e.failureReason !== "") out += ",\"failure_reason\":" + quoteString(e.failureReason)
  out += ",\"created_at\":" + time(e.createdAtMs) + ",\"updated_at\":" + time(e.updatedAtMs)
  if (e.deadlineAtMs !== undefined) out += ",\"deadline_at\":" + time(e.deadlineAtMs)
  return out + "}"
}

/**
 * A Step object (11.12): `args`, `result`, `error`, `started_at`, `completed_at`
 * only when set.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeStep = (s: StepRecord): string => {
  let out = "{\"step_id\":" + id(s.stepId) + ",\"execution_id\":" + id(s.executionId) + ",\"kind\":" +
    quoteString(s.kind) + ",\"target\":" + quoteString(s.target) + ",\"args_hash\":" + id(s.argsHash) +
    ",\"occurrence\":" + s.occurrence + ",\"status\":" + quoteString(s.status) + ",\"idempotency\":" +
    quoteString(s.idempotency)
  if (s.argsRaw !== undefined) out += ",\"args\":" + s.argsRaw
  if (s.resultRaw !== undefined) out += ",\"result\":" + s.resultRaw
  if (s.errorRaw !== undefined) out += ",\"error\":" + s.errorRaw
  if (s.startedAtMs !== undefined) out += ",\"started_at\":" + time(s.startedAtMs)
  if (s.completedAtMs !== undefined) out += ",\"completed_at\":" + time(s.completedAtMs)
  return out + "}"
}

/**
 * An Approval object (11.12): `approvers` always (`null` when unrestricted);
 * `message`, `decided_by`, `decided_at`, `rationale` only when set.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeApproval = (a: ApprovalRecord): string => {
  let out = "{\"id\":" + id(a.id) + ",\"step_id\":" + id(a.stepId) + ",\"execution_id\":" + id(a.executionId) +
    ",\"status\":" + quoteString(a.status) + ",\"approvers\":" +
    (a.approvers === null ? "null" : "[" + a.approvers.map(quoteString).join(",") + "]")
  if (a.message !== "") out += ",\"message\":" + quoteString(a.message)
  out += ",\"timeout_at\":" + time(a.timeoutAtMs)
  if (a.decidedBy !== "") out += ",\"decided_by\":" + quoteString(a.decidedBy)
  if (a.decidedAtMs !== undefined) out += ",\"decided_at\":" + time(a.decidedAtMs)
  if (a.rationale !== "") out += ",\"rationale\":" + quoteString(a.rationale)
  return out + ",\"created_at\":" + time(a.createdAtMs) + "}"
}

/**
 * An Event object (11.12); the payload is inserted as stored.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeEvent = (e: EventRecord): string =>
  "{\"execution_id\":" + id(e.executionId) + ",\"event_seq\":" + e.seq + ",\"type\":" + quoteString(e.type) +
  ",\"payload\":" + e.payload + ",\"occurred_at\":" + time(e.occurredAtMs) + "}"

/**
 * An Agent object with Go field names (11.9). `Secret` is always `""`.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeAgent = (a: AgentRecord): string =>
  "{\"ID\":" + quoteString(a.id) + ",\"WebhookURL\":" + quoteString(a.webhookUrl) + ",\"Secret\":\"\"" +
  ",\"PolicyBundle\":" + quoteString(a.policyBundle) + ",\"RegisteredAt\":" + time(a.registeredAtMs) + "}"

/**
 * A StepDecision (7.1): every member but `decision` omitted when empty; `result`
 * and `error` present exactly when stored.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeDecision = (d: Decision): string => {
  let out = "{\"decision\":" + quoteString(d.decision)
  if (d.stepId !== undefined && d.stepId !== "") out += ",\"step_id\":" + id(d.stepId)
  if (d.resultRaw !== undefined) out += ",\"result\":" + d.resultRaw
  if (d.errorRaw !== undefined) out += ",\"error\":" + d.errorRaw
  if (d.approvalId !== undefined && d.approvalId !== "") out += ",\"approval_id\":" + id(d.approvalId)
  if (d.reason !== undefined && d.reason !== "") out += ",\"reason\":" + quoteString(d.reason)
  return out + "}"
}

/**
 * A live delta as sent on the SSE stream (11.6): `{"step_id","seq","data"}`.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeDelta = (d: Delta): string =>
  "{\"step_id\":" + quoteString(d.stepId) + ",\"seq\":" + d.seq + ",\"data\":" + quoteString(d.data) + "}"

/**
 * A JSON array of encoded items, or `null` when empty (2.7); `emptyAsArray`
 * selects the `[]` exceptions.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeList = <A>(
  items: ReadonlyArray<A>,
  encode: (item: A) => string,
  options?: { readonly emptyAsArray?: boolean | undefined }
): string => {
  if (items.length === 0) return options?.emptyAsArray === true ? "[]" : "null"
  let out = "["
  for (let i = 0; i < items.length; i++) {
    if (i > 0) out += ","
    out += encode(items[i]!)
  }
  return out + "]"
}

/**
 * `GET /v0/executions` (11.3): `{"executions":[…]|null,"next_cursor"?}`.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeExecutionList = (page: ExecutionPage): string =>
  "{\"executions\":" + encodeList(page.executions, encodeExecution) +
  (page.nextCursor === undefined ? "" : ",\"next_cursor\":" + quoteString(page.nextCursor)) + "}"

/**
 * `GET /v0/executions/{id}/events`: `null` when empty.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeEvents = (events: ReadonlyArray<EventRecord>): string => encodeList(events, encodeEvent)

/**
 * `GET /v0/executions/{id}/steps`: `null` when empty, but `[]` for
 * `?status=terminal` (2.7).
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeSteps = (steps: ReadonlyArray<StepRecord>, terminalOnly: boolean): string =>
  encodeList(steps, encodeStep, { emptyAsArray: terminalOnly })

/**
 * `GET /v0/approvals`: `null` when empty.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeApprovals = (approvals: ReadonlyArray<ApprovalRecord>): string =>
  encodeList(approvals, encodeApproval)

/**
 * `GET /v0/agents`: `[]` when empty (2.7).
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeAgents = (agents: ReadonlyArray<AgentRecord>): string =>
  encodeList(agents, encodeAgent, { emptyAsArray: true })

/**
 * The error envelope (13.1): `{"code":…,"message":…}`.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeError = (e: { readonly code: string; readonly message: string }): string =>
  "{\"code\":" + quoteString(e.code) + ",\"message\":" + quoteString(e.message) + "}"

/**
 * The webhook body (5.5). With `compat` (v0.14.0, 17.A) only `execution_id` and
 * `dispatch_id` are sent.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeWebhookBody = (claim: Claim, options?: { readonly compat?: boolean | undefined }): string =>
  "{\"execution_id\":" + id(claim.executionId) + ",\"dispatch_id\":" + id(claim.dispatchId) +
  (options?.compat === true
    ? "}"
    : ",\"dispatch_attempt\":" + claim.attempt + ",\"lease_timeout_seconds\":" + claim.leaseTimeoutSeconds + "}")
