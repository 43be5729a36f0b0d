/**
 * Event payload builders for the kernel core (PROTOCOL 12.2). Every payload is
 * JSON text with its keys in alphabetical order and optional keys omitted when
 * empty; the builders write the members in sorted order directly instead of
 * sorting at run time. Ids (UUIDs, hex step ids) never need escaping; free text
 * goes through Go-compatible quoting, embedded raw JSON is inserted as stored
 * (already compacted).
 *
 * @since 0.1.0
 * @internal
 */
import { quoteString } from "../../internal/wire/json.js"

const id = (s: string): string => "\"" + s + "\""

/**
 * @since 0.1.0
 * @internal
 */
export const executionPayload = (
  executionId: string,
  status: string,
  options?: {
    readonly deadlineAt?: string | undefined
    readonly output?: string | undefined
    readonly reason?: string | undefined
    /** PROTOCOL-CURRENT C.4.3: on `execution.started`. */
    readonly parentExecutionId?: string | undefined
    /** PROTOCOL-CURRENT C.4.2, C.4.3: on `execution.created` and `execution.started`. */
    readonly session?: string | undefined
    /** PROTOCOL-CURRENT C.5.1: on a subagent's `execution.created`. */
    readonly spawnedBy?: { readonly executionId: string; readonly stepId: string } | undefined
  }
): string => {
  let out = "{"
  if (options?.deadlineAt !== undefined) out += "\"deadline_at\":" + quoteString(options.deadlineAt) + ","
  out += "\"execution_id\":" + id(executionId)
  if (options?.output !== undefined) out += ",\"output\":" + options.output
  if (options?.parentExecutionId !== undefined) out += ",\"parent_execution_id\":" + id(options.parentExecutionId)
  if (options?.reason !== undefined && options.reason !== "") out += ",\"reason\":" + quoteString(options.reason)
  if (options?.session !== undefined) out += ",\"session\":" + quoteString(options.session)
  if (options?.spawnedBy !== undefined) {
    out += ",\"spawned_by\":{\"execution_id\":" + id(options.spawnedBy.executionId) + ",\"step_id\":" +
      quoteString(options.spawnedBy.stepId) + "}"
  }
  return out + ",\"status\":" + quoteString(status) + "}"
}

/**
 * @since 0.1.0
 * @internal
 */
export interface StepPayloadOptions {
  readonly error?: string | undefined
  readonly ruleId?: string | undefined
  readonly omitEmptyTarget?: boolean | undefined
  /** PROTOCOL-CURRENT C.8.4: the deciding bundle's hash (omitted when empty). */
  readonly policyHash?: string | undefined
  /** PROTOCOL-CURRENT C.8.4: the decision's reason (omitted when empty). */
  readonly reason?: string | undefined
  /** PROTOCOL-CURRENT C.8.5: `{"input_tokens":…,"output_tokens":…}` on `step.succeeded`. */
  readonly usage?: string | undefined
  /** PROTOCOL-CURRENT C.6.4: `{"<key>":<generation>,…}` on `step.executing` (raw JSON, keys sorted). */
  readonly generations?: string | undefined
  /** PROTOCOL-CURRENT C.6.4: the affected keys on `step.executing` (raw JSON array). */
  readonly resources?: string | undefined
}

/**
 * @since 0.1.0
 * @internal
 */
export const stepPayload = (
  stepId: string,
  kind: string,
  target: string,
  options?: StepPayloadOptions
): string => {
  let out = "{"
  if (options?.error !== undefined) out += "\"error\":" + options.error + ","
  if (options?.generations !== undefined) out += "\"generations\":" + options.generations + ","
  if (options?.policyHash !== undefined && options.policyHash !== "") out += "\"policy_hash\":" + id(options.policyHash) + ","
  if (options?.reason !== undefined && options.reason !== "") out += "\"reason\":" + quoteString(options.reason) + ","
  if (options?.resources !== undefined) out += "\"resources\":" + options.resources + ","
  if (options?.ruleId !== undefined && options.ruleId !== "") out += "\"rule_id\":" + quoteString(options.ruleId) + ","
  out += "\"step_id\":" + id(stepId) + ",\"step_type\":" + quoteString(kind)
  if (!(options?.omitEmptyTarget === true && target === "")) out += ",\"target\":" + quoteString(target)
  if (options?.usage !== undefined) out += ",\"usage\":" + options.usage
  return out + "}"
}

/**
 * @since 0.1.0
 * @internal
 */
export const approvalPayload = (
  approvalId: string,
  executionId: string,
  stepId: string,
  status: string,
  options?: {
    readonly decidedBy?: string | undefined
    readonly rationale?: string | undefined
    /** `approval.expired` always carries `rationale`. */
    readonly keepRationale?: boolean | undefined
  }
): string => {
  let out = "{\"approval_id\":" + id(approvalId)
  if (options?.decidedBy !== undefined && options.decidedBy !== "") {
    out += ",\"decided_by\":" + quoteString(options.decidedBy)
  }
  out += ",\"execution_id\":" + id(executionId)
  if (options?.rationale !== undefined && (options.rationale !== "" || options.keepRationale === true)) {
    out += ",\"rationale\":" + quoteString(options.rationale)
  }
  return out + ",\"status\":" + quoteString(status) + ",\"step_id\":" + id(stepId) + "}"
}

/**
 * `error` (raw JSON, see {@link deliveryError}) is the cause of a failed
 * delivery on `dispatch.failed`; omitted when absent.
 *
 * @since 0.1.0
 * @internal
 */
export const dispatchPayload = (
  attempt: number,
  dispatchId: string,
  executionId: string,
  status: string,
  error?: string | undefined
): string =>
  "{\"attempt\":" + attempt + ",\"dispatch_id\":" + id(dispatchId) +
  (error === undefined ? "" : ",\"error\":" + error) +
  ",\"execution_id\":" + id(executionId) + ",\"status\":" + quoteString(status) + "}"

/**
 * `{"message":…,"reason":…[,"status":n]}` — why a webhook delivery failed, on
 * `dispatch.failed` (an addition of the embedded kernel's current stage: event
 * payloads are key/value maps whose readers ignore unknown members).
 *
 * @since 0.2.0
 * @internal
 */
export const deliveryError = (message: string, reason: string, status?: number | undefined): string =>
  "{\"message\":" + quoteString(message) + ",\"reason\":" + quoteString(reason) +
  (status === undefined ? "" : ",\"status\":" + status) + "}"

/**
 * `{"reason":…,"rule_id":…}` — the stored error of a policy denial (7.5).
 *
 * @since 0.1.0
 * @internal
 */
export const denialError = (reason: string, ruleId: string): string =>
  "{\"reason\":" + quoteString(reason) + ",\"rule_id\":" + quoteString(ruleId) + "}"

/**
 * `{"reason":…}` — the stored error of a human denial, expiry or cancel.
 *
 * @since 0.1.0
 * @internal
 */
export const reasonError = (reason: string): string => "{\"reason\":" + quoteString(reason) + "}"

/**
 * The stored error of an orphaned `at_most_once` step (7.4).
 *
 * @since 0.1.0
 * @internal
 */
export const indeterminateError =
  "{\"message\":\"outcome unknown: this may already have taken effect. Check the state before continuing.\",\"reason\":\"indeterminate\"}"

// ---------------------------------------------------------------------------
// Resources and forks (PROTOCOL-CURRENT C.6, C.7)
// ---------------------------------------------------------------------------

/**
 * `resource.registered`: `{"configuration","coverage_reuse","driver_id","every_steps","key","on_completion"}`
 * (`configuration` is `null` when none).
 *
 * @since 0.2.0
 * @internal
 */
export const resourceRegisteredPayload = (r: {
  readonly key: string
  readonly driverId: string
  readonly configurationRaw: string | undefined
  readonly coverageReuse: boolean
  readonly everySteps: number
  readonly onCompletion: boolean
}): string =>
  "{\"configuration\":" + (r.configurationRaw ?? "null") + ",\"coverage_reuse\":" + r.coverageReuse +
  ",\"driver_id\":" + quoteString(r.driverId) + ",\"every_steps\":" + r.everySteps + ",\"key\":" +
  quoteString(r.key) + ",\"on_completion\":" + r.onCompletion + "}"

/**
 * `resource.bound`: `{"binding","key"}`.
 *
 * @since 0.2.0
 * @internal
 */
export const resourceBoundPayload = (key: string, bindingRaw: string): string =>
  "{\"binding\":" + bindingRaw + ",\"key\":" + quoteString(key) + "}"

/**
 * `resource.checkpointed`: `{"checkpoint_ref","covered_seq","generation","key"}`.
 *
 * @since 0.2.0
 * @internal
 */
export const resourceCheckpointedPayload = (
  key: string,
  generation: number,
  checkpointRef: string,
  coveredSeq: number
): string =>
  "{\"checkpoint_ref\":" + quoteString(checkpointRef) + ",\"covered_seq\":" + coveredSeq + ",\"generation\":" +
  generation + ",\"key\":" + quoteString(key) + "}"

/**
 * `resource.checkpoint_failed`: `{"error","generation","key"}`.
 *
 * @since 0.2.0
 * @internal
 */
export const resourceCheckpointFailedPayload = (key: string, generation: number, error: string): string =>
  "{\"error\":" + quoteString(error) + ",\"generation\":" + generation + ",\"key\":" + quoteString(key) + "}"

/**
 * `resource.initialized` (a fork's resource, C.7.2 step 4):
 * `{"checkpoint_ref"?,"generation","key"}`.
 *
 * @since 0.2.0
 * @internal
 */
export const resourceInitializedPayload = (key: string, generation: number, checkpointRef: string | undefined): string =>
  "{" + (checkpointRef === undefined ? "" : "\"checkpoint_ref\":" + quoteString(checkpointRef) + ",") +
  "\"generation\":" + generation + ",\"key\":" + quoteString(key) + "}"

/**
 * A restoration map (C.7.1, C.7.2): `{"<key>":{"checkpoint_ref"?,"checkpoint_seq"?,"covered"},…}`,
 * keys in the order given (callers sort them).
 *
 * @since 0.2.0
 * @internal
 */
export const restorationJson = (
  entries: ReadonlyArray<{
    readonly key: string
    readonly checkpointRef: string | undefined
    readonly checkpointSeq: number | undefined
    readonly covered: boolean
  }>
): string => {
  let out = "{"
  for (let i = 0; i < entries.length; i++) {
    const e = entries[i]!
    if (i > 0) out += ","
    out += quoteString(e.key) + ":{"
    if (e.checkpointRef !== undefined) out += "\"checkpoint_ref\":" + quoteString(e.checkpointRef) + ","
    if (e.checkpointSeq !== undefined) out += "\"checkpoint_seq\":" + e.checkpointSeq + ","
    out += "\"covered\":" + e.covered + "}"
  }
  return out + "}"
}

/**
 * `execution.forked` (C.7.2 step 2):
 * `{"fork_seq","policy_override","restoration"?,"source_execution_id"}`.
 *
 * @since 0.2.0
 * @internal
 */
export const executionForkedPayload = (
  sourceExecutionId: string,
  forkSeq: number,
  policyOverride: boolean,
  restorationRaw: string | undefined
): string =>
  "{\"fork_seq\":" + forkSeq + ",\"policy_override\":" + policyOverride +
  (restorationRaw === undefined ? "" : ",\"restoration\":" + restorationRaw) + ",\"source_execution_id\":" +
  id(sourceExecutionId) + "}"
