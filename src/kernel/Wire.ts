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
  ApiKeyRecord,
  ApprovalRecord,
  Claim,
  Decision,
  Delta,
  EventRecord,
  ExecutionPage,
  ExecutionRecord,
  ForkPoints,
  IssuedApiKey,
  ResourceRecord,
  Restoration,
  Stage,
  StepRecord
} from "./Core.js"

/** UUIDs and hex step ids never need escaping. */
const id = (s: string): string => "\"" + s + "\""
const time = (ms: number): string => "\"" + formatTimestamp(ms) + "\""

/**
 * An Execution object (11.12): `agent_version`, `output`, `failure_reason` and
 * `deadline_at` only when set; `input` always (`null` when absent). The
 * current stage's `session`, `parent_execution_id`, `forked_from`,
 * `fork_seq`, `idempotency_key` and `spawned_by` (PROTOCOL-CURRENT C.10)
 * follow `failure_reason`, each only when set (only a current-stage kernel
 * sets them). `restoration` — given only for the answer of a fork (C.7.1) —
 * follows `fork_seq`.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeExecution = (e: ExecutionRecord, restoration?: ReadonlyArray<Restoration> | undefined): string => {
  let out = "{\"id\":" + id(e.id) + ",\"agent_id\":" + quoteString(e.agentId)
  if (e.agentVersion !== undefined && e.agentVersion !== "") out += ",\"agent_version\":" + quoteString(e.agentVersion)
  out += ",\"input\":" + (e.inputRaw ?? "null") + ",\"status\":" + quoteString(e.status)
  if (e.outputRaw !== undefined) out += ",\"output\":" + e.outputRaw
  if (e.failureReason !== "") out += ",\"failure_reason\":" + quoteString(e.failureReason)
  if (e.session !== undefined) out += ",\"session\":" + quoteString(e.session)
  if (e.parentExecutionId !== undefined) out += ",\"parent_execution_id\":" + id(e.parentExecutionId)
  if (e.forkedFrom !== undefined) out += ",\"forked_from\":" + id(e.forkedFrom)
  if (e.forkSeq !== undefined) out += ",\"fork_seq\":" + e.forkSeq
  if (restoration !== undefined) out += ",\"restoration\":" + encodeRestoration(restoration)
  if (e.idempotencyKey !== undefined) out += ",\"idempotency_key\":" + quoteString(e.idempotencyKey)
  if (e.spawnedBy !== undefined) {
    out += ",\"spawned_by\":{\"execution_id\":" + id(e.spawnedBy.executionId) + ",\"step_id\":" +
      quoteString(e.spawnedBy.stepId) + "}"
  }
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
 * An Agent object of the current stage (PROTOCOL-CURRENT C.10): snake_case,
 * `{"id","webhook_url","policy_bundle"?,"registered_at","lease_timeout_seconds"?}`,
 * the secret never included. `policy_bundle` only when a bundle is loaded,
 * `lease_timeout_seconds` only when the agent has its own lease timeout.
 * The published metadata (C.3) is not part of it: C.10 lists the members and
 * no source shows metadata in agent JSON (C.15 #1); read it from
 * `AgentRecord.metadata`.
 *
 * @since 0.2.0
 * @category encoding
 */
export const encodeCurrentAgent = (a: AgentRecord): string => {
  let out = "{\"id\":" + quoteString(a.id) + ",\"webhook_url\":" + quoteString(a.webhookUrl)
  if (a.policyBundle !== "") out += ",\"policy_bundle\":" + quoteString(a.policyBundle)
  out += ",\"registered_at\":" + time(a.registeredAtMs)
  if (a.leaseTimeoutMs !== undefined) out += ",\"lease_timeout_seconds\":" + a.leaseTimeoutMs / 1000
  return out + "}"
}

/**
 * `GET /v0/agents` of the current stage: `[]` when empty.
 *
 * @since 0.2.0
 * @category encoding
 */
export const encodeCurrentAgents = (agents: ReadonlyArray<AgentRecord>): string =>
  encodeList(agents, encodeCurrentAgent, { emptyAsArray: true })

/**
 * An API key as listed (PROTOCOL-CURRENT C.9.2):
 * `{"id","name","scopes","created_at"[,"revoked_at"]}`.
 *
 * @since 0.2.0
 * @category encoding
 */
export const encodeApiKey = (k: ApiKeyRecord): string => {
  let out = "{\"id\":" + id(k.id) + ",\"name\":" + quoteString(k.name) + ",\"scopes\":[" +
    k.scopes.map(quoteString).join(",") + "],\"created_at\":" + time(k.createdAtMs)
  if (k.revokedAtMs !== undefined) out += ",\"revoked_at\":" + time(k.revokedAtMs)
  return out + "}"
}

/**
 * The answer of create and rotate (PROTOCOL-CURRENT C.9.2):
 * `{"id","name","scopes","created_at","token"}`.
 *
 * @since 0.2.0
 * @category encoding
 */
export const encodeIssuedApiKey = (issued: IssuedApiKey): string => {
  const k = issued.key
  return "{\"id\":" + id(k.id) + ",\"name\":" + quoteString(k.name) + ",\"scopes\":[" +
    k.scopes.map(quoteString).join(",") + "],\"created_at\":" + time(k.createdAtMs) + ",\"token\":" +
    quoteString(issued.token) + "}"
}

/**
 * `GET /v0/api-keys`: revoked keys included; `[]` when empty.
 *
 * @since 0.2.0
 * @category encoding
 */
export const encodeApiKeys = (keys: ReadonlyArray<ApiKeyRecord>): string =>
  encodeList(keys, encodeApiKey, { emptyAsArray: true })

/**
 * A StepDecision (7.1): every member but `decision` omitted when empty; `result`
 * and `error` present exactly when stored; `rule_id` last (current stage,
 * PROTOCOL-CURRENT C.8.4: `{"decision":"denied","step_id","reason","rule_id"}`).
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
  if (d.ruleId !== undefined && d.ruleId !== "") out += ",\"rule_id\":" + quoteString(d.ruleId)
  const resources = d.resources
  if (resources !== undefined && resources.length > 0) {
    out += ",\"resources\":["
    for (let i = 0; i < resources.length; i++) {
      const r = resources[i]!
      out += (i > 0 ? "," : "") + "{\"key\":" + quoteString(r.key) + ",\"generation\":" + r.generation +
        (r.due ? ",\"due\":true}" : "}")
    }
    out += "]"
  }
  return out + "}"
}

/**
 * A fork's restoration (PROTOCOL-CURRENT C.7.1):
 * `{"<key>":{"checkpoint_ref"?,"checkpoint_seq"?,"covered"},…}`, keys sorted.
 *
 * @since 0.2.0
 * @category encoding
 */
export const encodeRestoration = (restoration: ReadonlyArray<Restoration>): string => {
  const sorted = restoration.slice().sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0))
  let out = "{"
  for (let i = 0; i < sorted.length; i++) {
    const r = sorted[i]!
    out += (i > 0 ? "," : "") + quoteString(r.key) + ":{"
    if (r.checkpointRef !== undefined) out += "\"checkpoint_ref\":" + quoteString(r.checkpointRef) + ","
    if (r.checkpointSeq !== undefined) out += "\"checkpoint_seq\":" + r.checkpointSeq + ","
    out += "\"covered\":" + r.covered + "}"
  }
  return out + "}"
}

/**
 * A Resource object (PROTOCOL-CURRENT C.6.1), members in this order:
 * `{"key","driver_id","configuration"?,"coverage_reuse","every_steps","on_completion",
 * "registered_seq","generation","count","binding"?,"checkpoint_ref"?,"covered"}`.
 *
 * @since 0.2.0
 * @category encoding
 */
export const encodeResource = (r: ResourceRecord): string => {
  let out = "{\"key\":" + quoteString(r.key) + ",\"driver_id\":" + quoteString(r.driverId)
  if (r.configurationRaw !== undefined) out += ",\"configuration\":" + r.configurationRaw
  out += ",\"coverage_reuse\":" + r.coverageReuse + ",\"every_steps\":" + r.everySteps + ",\"on_completion\":" +
    r.onCompletion + ",\"registered_seq\":" + r.registeredSeq + ",\"generation\":" + r.generation + ",\"count\":" +
    r.count
  if (r.bindingRaw !== undefined) out += ",\"binding\":" + r.bindingRaw
  if (r.checkpointRef !== undefined) out += ",\"checkpoint_ref\":" + quoteString(r.checkpointRef)
  return out + ",\"covered\":" + r.covered + "}"
}

/**
 * `GET …/fork-points` (PROTOCOL-CURRENT C.7.3):
 * `{"latest_seq","resources":{"<key>":<registered_seq>,…},"checkpoints":[{"key","generation","checkpoint_ref","covered_seq","invalidated_seq"?},…]}`;
 * `resources` keys sorted, `{}` and `[]` when empty.
 *
 * @since 0.2.0
 * @category encoding
 */
export const encodeForkPoints = (points: ForkPoints): string => {
  const resources = points.resources.slice().sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0))
  let out = "{\"latest_seq\":" + points.latestSeq + ",\"resources\":{"
  for (let i = 0; i < resources.length; i++) {
    out += (i > 0 ? "," : "") + quoteString(resources[i]!.key) + ":" + resources[i]!.registeredSeq
  }
  out += "},\"checkpoints\":["
  for (let i = 0; i < points.checkpoints.length; i++) {
    const c = points.checkpoints[i]!
    out += (i > 0 ? "," : "") + "{\"key\":" + quoteString(c.key) + ",\"generation\":" + c.generation +
      ",\"checkpoint_ref\":" + quoteString(c.checkpointRef) + ",\"covered_seq\":" + c.coveredSeq
    if (c.invalidatedSeq !== undefined) out += ",\"invalidated_seq\":" + c.invalidatedSeq
    out += "}"
  }
  return out + "]}"
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
 * The error envelope (13.1): `{"code":…,"message":…}`, plus the current
 * stage's optional `details` (PROTOCOL-CURRENT C.10), raw JSON inserted as given.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeError = (
  e: { readonly code: string; readonly message: string; readonly details?: string | undefined }
): string =>
  "{\"code\":" + quoteString(e.code) + ",\"message\":" + quoteString(e.message) +
  (e.details === undefined ? "}" : ",\"details\":" + e.details + "}")

/**
 * The webhook body (5.5): `dispatch_attempt` and `lease_timeout_seconds` are
 * always sent (PROTOCOL-CURRENT C.2.2), except in the `"v0.14.0"` stage (17.A),
 * which sends only `execution_id` and `dispatch_id`.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encodeWebhookBody = (claim: Claim, options?: { readonly stage?: Stage | undefined }): string =>
  "{\"execution_id\":" + id(claim.executionId) + ",\"dispatch_id\":" + id(claim.dispatchId) +
  (options?.stage === "v0.14.0"
    ? "}"
    : ",\"dispatch_attempt\":" + claim.attempt + ",\"lease_timeout_seconds\":" + claim.leaseTimeoutSeconds + "}")
