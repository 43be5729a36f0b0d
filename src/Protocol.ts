/**
 * Effect `Schema` models of the Rebuno wire objects (PROTOCOL.md 5.5, 6, 7.1,
 * 11.12, 13.1): the webhook notice, the request bodies the SDK sends, the
 * `StepDecision`, executions, steps, events, approvals, agents, live deltas,
 * the error envelope and the executions page.
 *
 * Decoding is lenient in the way PROTOCOL.md 11.12 asks of SDKs: snake_case on
 * the wire becomes camelCase in TypeScript, unknown members are ignored, missing
 * or `null` strings decode as `""`, missing numbers as `0`, lists that arrive as
 * `null` as `[]`, and JSON payloads (`input`, `output`, `args`, `result`,
 * `error`, `payload`) stay parsed JSON values. The two objects on an agent's hot
 * path — the webhook notice and the step decision — also have hand-written
 * decoders ({@link decodeWebhookNotice}, {@link decodeStepDecision}) that agree
 * with their schemas but skip the schema machinery.
 *
 * @since 0.1.0
 */
import { Option, Schema } from "effect"

// ---------------------------------------------------------------------------
// Member helpers
// ---------------------------------------------------------------------------

/** A string member: absent or `null` decodes as `""`. */
const str = Schema.optionalWith(Schema.String, { nullable: true, default: () => "" })

/** A number member: absent or `null` decodes as `0`. */
const num = Schema.optionalWith(Schema.Number, { nullable: true, default: () => 0 })

/** An "any JSON" member that is always present on the wire (`null` when none). */
const json = Schema.optionalWith(Schema.Unknown, { default: () => null })

/** An "any JSON" member that is present (possibly `null`) exactly when a value is stored. */
const optionalJson = Schema.optionalWith(Schema.Unknown, { exact: true })

/** A list member: absent or `null` decodes as `[]`. */
const list = <S extends Schema.Schema.Any>(item: S) =>
  Schema.optionalWith(Schema.Array(item), { nullable: true, default: () => [] })

/** A string member that is omitted when empty: absent, `null` and `""` all decode as absent. */
const nonEmpty = Schema.optionalToOptional(Schema.NullOr(Schema.String), Schema.UndefinedOr(Schema.String), {
  decode: Option.flatMap((s) => (s === null || s === "" ? Option.none() : Option.some(s))),
  encode: Option.flatMap(Option.fromNullable)
})

/**
 * A top-level list response: PROTOCOL.md 2.7 sends `null` for an empty list, so
 * `null` and `[]` both decode as `[]`.
 *
 * @since 0.1.0
 * @category combinators
 */
export const NullableList = <A, I, R>(item: Schema.Schema<A, I, R>): Schema.Schema<ReadonlyArray<A>, ReadonlyArray<I> | null, R> =>
  Schema.transform(Schema.NullOr(Schema.Array(item)), Schema.Array(Schema.typeSchema(item)), {
    strict: true,
    decode: (items) => items ?? [],
    encode: (items) => items
  })

// ---------------------------------------------------------------------------
// Statuses
// ---------------------------------------------------------------------------

/**
 * Execution statuses. `completed`, `failed` and `cancelled` are terminal.
 *
 * @since 0.1.0
 * @category models
 */
export type ExecutionStatus = "pending" | "running" | "blocked" | "completed" | "failed" | "cancelled"

/**
 * Is an execution status terminal (`completed`, `failed` or `cancelled`)?
 *
 * @since 0.1.0
 * @category predicates
 */
export const isTerminalStatus = (status: string): boolean =>
  status === "completed" || status === "failed" || status === "cancelled"

/**
 * Step statuses. `succeeded`, `failed`, `denied` and `cancelled` are terminal.
 *
 * @since 0.1.0
 * @category models
 */
export type StepStatus =
  | "proposed"
  | "allowed"
  | "denied"
  | "awaiting_approval"
  | "executing"
  | "succeeded"
  | "failed"
  | "cancelled"

/**
 * Is a step status terminal (`succeeded`, `failed`, `denied` or `cancelled`)?
 *
 * @since 0.1.0
 * @category predicates
 */
export const isTerminalStepStatus = (status: string): boolean =>
  status === "succeeded" || status === "failed" || status === "denied" || status === "cancelled"

/**
 * Approval statuses.
 *
 * @since 0.1.0
 * @category models
 */
export type ApprovalStatus = "pending" | "granted" | "denied" | "expired"

// ---------------------------------------------------------------------------
// Webhook notice
// ---------------------------------------------------------------------------

const positiveInt = (u: unknown): u is number => typeof u === "number" && Number.isInteger(u) && u > 0

const positiveNumber = (u: unknown): u is number => typeof u === "number" && Number.isFinite(u) && u > 0

/**
 * The webhook body the kernel POSTs to the agent (PROTOCOL.md 5.5, 14.2 step 2):
 * non-empty `execution_id` and `dispatch_id`, an optional positive integer
 * `dispatch_attempt` and an optional `lease_timeout_seconds` (a non-positive or
 * non-number value counts as absent). `dispatchAttempt` and
 * `leaseTimeoutSeconds` are `undefined` on v0.14.0 kernels (17.A).
 *
 * @since 0.1.0
 * @category schemas
 */
export const WebhookNotice = Schema.Struct({
  executionId: Schema.propertySignature(Schema.NonEmptyString).pipe(Schema.fromKey("execution_id")),
  dispatchId: Schema.propertySignature(Schema.NonEmptyString).pipe(Schema.fromKey("dispatch_id")),
  dispatchAttempt: Schema.optionalToRequired(
    Schema.NullOr(Schema.Int.pipe(Schema.positive())),
    Schema.UndefinedOr(Schema.Number),
    {
      decode: (o) => (Option.isSome(o) && o.value !== null ? o.value : undefined),
      encode: Option.fromNullable
    }
  ).pipe(Schema.fromKey("dispatch_attempt")),
  leaseTimeoutSeconds: Schema.optionalToRequired(Schema.Unknown, Schema.UndefinedOr(Schema.Number), {
    decode: (o) => (Option.isSome(o) && positiveNumber(o.value) ? o.value : undefined),
    encode: Option.fromNullable
  }).pipe(Schema.fromKey("lease_timeout_seconds"))
})

/**
 * A decoded webhook notice.
 *
 * @since 0.1.0
 * @category models
 */
export interface WebhookNotice extends Schema.Schema.Type<typeof WebhookNotice> {}

/**
 * Decode a raw webhook body per PROTOCOL.md 14.2 step 2 (same rules as the
 * {@link WebhookNotice} schema, without the schema machinery). Returns
 * `undefined` when the body is not acceptable (the agent answers `400`).
 *
 * @since 0.1.0
 * @category decoding
 */
export const decodeWebhookNotice = (text: string): WebhookNotice | undefined => {
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    return undefined
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return undefined
  const o = value as Record<string, unknown>
  const executionId = o["execution_id"]
  const dispatchId = o["dispatch_id"]
  if (typeof executionId !== "string" || executionId === "") return undefined
  if (typeof dispatchId !== "string" || dispatchId === "") return undefined
  const attempt = o["dispatch_attempt"]
  let dispatchAttempt: number | undefined
  if (attempt !== undefined && attempt !== null) {
    if (!positiveInt(attempt)) return undefined
    dispatchAttempt = attempt
  }
  const lease = o["lease_timeout_seconds"]
  const leaseTimeoutSeconds = positiveNumber(lease) ? lease : undefined
  return { executionId, dispatchId, dispatchAttempt, leaseTimeoutSeconds }
}

// ---------------------------------------------------------------------------
// Request bodies sent by the SDK (PROTOCOL.md 6.0, 11)
// ---------------------------------------------------------------------------

/**
 * `POST /v0/executions/{id}/steps` body (6.3):
 * `{"kind":…,"target":…,"args":…,"idempotency":…}`.
 *
 * @since 0.1.0
 * @category request bodies
 */
export const SubmitStepBody = Schema.Struct({
  kind: str,
  target: str,
  args: optionalJson,
  idempotency: str
})

/**
 * `POST …/steps/{step_id}/complete` body (6.4): `{"result":…}`.
 *
 * @since 0.1.0
 * @category request bodies
 */
export const CompleteStepBody = Schema.Struct({
  result: optionalJson
})

/**
 * `POST …/steps/{step_id}/fail` body (6.5). The SDK always sends
 * `{"error":{"message":"<text>"}}`.
 *
 * @since 0.1.0
 * @category request bodies
 */
export const FailStepBody = Schema.Struct({
  error: optionalJson
})

/**
 * `POST …/steps/{step_id}/stream` body (6.6): `{"seq":…,"data":"…"}`.
 *
 * @since 0.1.0
 * @category request bodies
 */
export const StreamDeltaBody = Schema.Struct({
  seq: num,
  data: str
})

/**
 * `POST /v0/executions/{id}/complete` body (6.8): `{"output":…}` or `{}`.
 *
 * @since 0.1.0
 * @category request bodies
 */
export const CompleteExecutionBody = Schema.Struct({
  output: optionalJson
})

/**
 * `POST /v0/executions/{id}/fail` body (6.9): `{"error":"<string>"}`.
 *
 * @since 0.1.0
 * @category request bodies
 */
export const FailExecutionBody = Schema.Struct({
  error: str
})

/**
 * `POST /v0/executions` body (11.1): `{"agent_id":…,"input":…,"agent_version":…}`
 * (`input` and `agent_version` omitted when absent).
 *
 * @since 0.1.0
 * @category request bodies
 */
export const CreateExecutionBody = Schema.Struct({
  agentId: str.pipe(Schema.fromKey("agent_id")),
  input: optionalJson,
  agentVersion: Schema.optionalWith(Schema.String, { exact: true }).pipe(Schema.fromKey("agent_version"))
})

/**
 * `POST /v0/approvals/{id}/grant` and `…/deny` body (9.3):
 * `{"decided_by":…,"rationale":…}` (`rationale` optional).
 *
 * @since 0.1.0
 * @category request bodies
 */
export const ApprovalDecisionBody = Schema.Struct({
  decidedBy: str.pipe(Schema.fromKey("decided_by")),
  rationale: Schema.optionalWith(Schema.String, { exact: true })
})

/**
 * `POST /v0/agents` body (11.9): exactly `{"id":…,"webhook_url":…,"secret":…}`.
 *
 * @since 0.1.0
 * @category request bodies
 */
export const RegisterAgentBody = Schema.Struct({
  id: str,
  webhookUrl: str.pipe(Schema.fromKey("webhook_url")),
  secret: Schema.Redacted(Schema.String)
})

/**
 * `POST /v0/policies/{agent_id}` body (11.10): `{"bundle":"<raw YAML text>"}`.
 *
 * @since 0.1.0
 * @category request bodies
 */
export const LoadPolicyBody = Schema.Struct({
  bundle: str
})

// ---------------------------------------------------------------------------
// Step decisions (PROTOCOL.md 7)
// ---------------------------------------------------------------------------

/**
 * The `decision` values of the target protocol (7.2). A decoded
 * {@link StepDecision} keeps `decision` as a plain string so that an unknown
 * value can be reported as `unexpected step decision: <value>`.
 *
 * @since 0.1.0
 * @category models
 */
export type DecisionKind =
  | "proceed"
  | "replay"
  | "denied"
  | "blocked"
  | "execution_blocked"
  | "rate_limited"
  | "execution_terminal"
  | "recorded"

const StepDecisionStruct = Schema.Struct({
  decision: Schema.String,
  stepId: nonEmpty.pipe(Schema.fromKey("step_id")),
  result: optionalJson,
  error: optionalJson,
  approvalId: nonEmpty.pipe(Schema.fromKey("approval_id")),
  reason: nonEmpty
})

/**
 * The kernel's answer to a step submission, or to a step complete / fail
 * (PROTOCOL.md 7.1, 7.2). `result` and `error` are present (possibly `null`)
 * exactly when the kernel sent them; empty `step_id`, `approval_id` and
 * `reason` count as absent; unknown members (`rule_id`, `resources`) are
 * ignored.
 *
 * @since 0.1.0
 * @category models
 */
export interface StepDecision {
  readonly decision: string
  readonly stepId?: string | undefined
  readonly result?: unknown
  readonly error?: unknown
  readonly approvalId?: string | undefined
  readonly reason?: string | undefined
}

/**
 * Schema of {@link StepDecision}.
 *
 * @since 0.1.0
 * @category schemas
 */
export const StepDecision: Schema.Schema<StepDecision, Schema.Schema.Encoded<typeof StepDecisionStruct>> =
  StepDecisionStruct

/**
 * Decode a StepDecision from parsed JSON (same rules as the
 * {@link StepDecision} schema, without the schema machinery: this runs twice
 * per step). Returns `undefined` when the value is not an object with a string
 * `decision`.
 *
 * @since 0.1.0
 * @category decoding
 */
export const decodeStepDecision = (u: unknown): StepDecision | undefined => {
  if (typeof u !== "object" || u === null || Array.isArray(u)) return undefined
  const o = u as Record<string, unknown>
  const decision = o["decision"]
  if (typeof decision !== "string") return undefined
  const out: {
    decision: string
    stepId?: string
    result?: unknown
    error?: unknown
    approvalId?: string
    reason?: string
  } = { decision }
  const stepId = o["step_id"]
  if (typeof stepId === "string" && stepId !== "") out.stepId = stepId
  if ("result" in o) out.result = o["result"]
  if ("error" in o) out.error = o["error"]
  const approvalId = o["approval_id"]
  if (typeof approvalId === "string" && approvalId !== "") out.approvalId = approvalId
  const reason = o["reason"]
  if (typeof reason === "string" && reason !== "") out.reason = reason
  return out
}

// ---------------------------------------------------------------------------
// Objects (PROTOCOL.md 11.12)
// ---------------------------------------------------------------------------

/**
 * An execution (PROTOCOL.md 11.12). `input` is `null` when none was given;
 * `output` is absent when none was recorded (present, possibly `null`, when
 * it was). Timestamps are RFC 3339 strings (`""` when absent).
 *
 * @since 0.1.0
 * @category models
 */
export class Execution extends Schema.Class<Execution>("effect-rebuno/Protocol/Execution")({
  id: str,
  agentId: str.pipe(Schema.fromKey("agent_id")),
  agentVersion: str.pipe(Schema.fromKey("agent_version")),
  input: json,
  status: str,
  output: optionalJson,
  failureReason: str.pipe(Schema.fromKey("failure_reason")),
  createdAt: str.pipe(Schema.fromKey("created_at")),
  updatedAt: str.pipe(Schema.fromKey("updated_at")),
  deadlineAt: str.pipe(Schema.fromKey("deadline_at"))
}) {}

/**
 * Decode an {@link Execution} from parsed JSON.
 *
 * @since 0.1.0
 * @category decoding
 */
export const decodeExecution = Schema.decodeUnknown(Execution)

/**
 * A recorded step (PROTOCOL.md 11.12). `args`, `result` and `error` are present
 * exactly when stored.
 *
 * @since 0.1.0
 * @category models
 */
export class Step extends Schema.Class<Step>("effect-rebuno/Protocol/Step")({
  stepId: str.pipe(Schema.fromKey("step_id")),
  executionId: str.pipe(Schema.fromKey("execution_id")),
  kind: str,
  target: str,
  argsHash: str.pipe(Schema.fromKey("args_hash")),
  occurrence: num,
  status: str,
  idempotency: str,
  args: optionalJson,
  result: optionalJson,
  error: optionalJson,
  startedAt: str.pipe(Schema.fromKey("started_at")),
  completedAt: str.pipe(Schema.fromKey("completed_at"))
}) {}

/**
 * An execution event (PROTOCOL.md 11.12, 12). `eventSeq` starts at 1 and is
 * dense per execution.
 *
 * @since 0.1.0
 * @category models
 */
export class Event extends Schema.Class<Event>("effect-rebuno/Protocol/Event")({
  executionId: str.pipe(Schema.fromKey("execution_id")),
  eventSeq: num.pipe(Schema.fromKey("event_seq")),
  type: str,
  payload: json,
  occurredAt: str.pipe(Schema.fromKey("occurred_at"))
}) {}

/**
 * A human approval (PROTOCOL.md 9, 11.12). An empty `approvers` list means
 * anyone may decide.
 *
 * @since 0.1.0
 * @category models
 */
export class Approval extends Schema.Class<Approval>("effect-rebuno/Protocol/Approval")({
  id: str,
  stepId: str.pipe(Schema.fromKey("step_id")),
  executionId: str.pipe(Schema.fromKey("execution_id")),
  status: str,
  approvers: list(Schema.String),
  message: str,
  timeoutAt: str.pipe(Schema.fromKey("timeout_at")),
  decidedBy: str.pipe(Schema.fromKey("decided_by")),
  decidedAt: str.pipe(Schema.fromKey("decided_at")),
  rationale: str,
  createdAt: str.pipe(Schema.fromKey("created_at"))
}) {}

/**
 * A registered agent (PROTOCOL.md 11.9). On the wire the members carry Go field
 * names (`ID`, `WebhookURL`, `PolicyBundle`, `RegisteredAt`). The wire's
 * `Secret` member is deliberately not decoded: it is `""` from a conforming
 * kernel, and a reference kernel that echoes it must not leak it into logs.
 *
 * @since 0.1.0
 * @category models
 */
export class Agent extends Schema.Class<Agent>("effect-rebuno/Protocol/Agent")({
  id: str.pipe(Schema.fromKey("ID")),
  webhookUrl: str.pipe(Schema.fromKey("WebhookURL")),
  policyBundle: str.pipe(Schema.fromKey("PolicyBundle")),
  registeredAt: str.pipe(Schema.fromKey("RegisteredAt"))
}) {}

/**
 * A live delta (PROTOCOL.md 6.6, 11.6): `{"step_id":…,"seq":…,"data":…}`.
 * Never stored by the kernel.
 *
 * @since 0.1.0
 * @category schemas
 */
export const LiveDelta = Schema.Struct({
  stepId: str.pipe(Schema.fromKey("step_id")),
  seq: num,
  data: str
})

/**
 * A decoded live delta.
 *
 * @since 0.1.0
 * @category models
 */
export interface LiveDelta extends Schema.Schema.Type<typeof LiveDelta> {}

/**
 * The error envelope (PROTOCOL.md 13.1): `{"code":…,"message":…}`; newer
 * kernels may add `rule_id`.
 *
 * @since 0.1.0
 * @category schemas
 */
export const ErrorEnvelope = Schema.Struct({
  code: str,
  message: str,
  ruleId: nonEmpty.pipe(Schema.fromKey("rule_id"))
})

/**
 * A decoded error envelope.
 *
 * @since 0.1.0
 * @category models
 */
export interface ErrorEnvelope extends Schema.Schema.Type<typeof ErrorEnvelope> {}

/**
 * One page of `GET /v0/executions` (PROTOCOL.md 11.3):
 * `{"executions":[…],"next_cursor":"…"}`. `nextCursor` is `undefined` on the
 * last page; pass it back exactly as received.
 *
 * @since 0.1.0
 * @category schemas
 */
export const ExecutionPage = Schema.Struct({
  executions: list(Execution),
  nextCursor: Schema.optionalToRequired(Schema.NullOr(Schema.String), Schema.UndefinedOr(Schema.String), {
    decode: (o) => (Option.isSome(o) && o.value !== null && o.value !== "" ? o.value : undefined),
    encode: Option.fromNullable
  }).pipe(Schema.fromKey("next_cursor"))
})

/**
 * A decoded executions page.
 *
 * @since 0.1.0
 * @category models
 */
export interface ExecutionPage extends Schema.Schema.Type<typeof ExecutionPage> {}
