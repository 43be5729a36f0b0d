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
import * as Option from "effect/Option"
import * as Predicate from "effect/Predicate"
import * as Schema from "effect/Schema"
import * as SchemaGetter from "effect/SchemaGetter"
import type * as Types from "effect/Types"

// ---------------------------------------------------------------------------
// Member helpers
// ---------------------------------------------------------------------------

/** Absent or `null` on the wire decodes as `fallback()`; encoding writes the value. */
const orDefault = <S extends Schema.Top>(schema: S, fallback: () => S["Type"]) =>
  Schema.optionalKey(Schema.NullOr(schema)).pipe(
    Schema.decodeTo(Schema.toType(schema), {
      decode: SchemaGetter.transformOptional((o: Option.Option<S["Type"] | null>) =>
        Option.orElseSome(Option.filter(o, Predicate.isNotNull), fallback)
      ),
      encode: SchemaGetter.required()
    })
  )

/** A string member: absent or `null` decodes as `""`. */
const str = orDefault(Schema.String, () => "")

/** A number member: absent or `null` decodes as `0`. */
const num = orDefault(Schema.Number, () => 0)

/** An "any JSON" member that is always present on the wire (`null` when none). */
const json = Schema.optionalKey(Schema.Unknown).pipe(
  Schema.decodeTo(Schema.Unknown, {
    decode: SchemaGetter.transformOptional((o: Option.Option<unknown>) => Option.orElseSome(o, () => null)),
    encode: SchemaGetter.required()
  })
)

/** An "any JSON" member that is present (possibly `null`) exactly when a value is stored. */
const optionalJson = Schema.optionalKey(Schema.Unknown)

/** A list member: absent or `null` decodes as `[]`. */
const list = <S extends Schema.Top>(item: S) =>
  orDefault(Schema.Array(item), () => [])

/** A string member that is omitted when empty: absent, `null` and `""` all decode as absent. */
const nonEmpty = Schema.optionalKey(Schema.NullOr(Schema.String)).pipe(
  Schema.decodeTo(Schema.optionalKey(Schema.String), {
    decode: SchemaGetter.transformOptional((o: Option.Option<string | null>) =>
      Option.filter(o, (s): s is string => s !== null && s !== "")
    ),
    encode: SchemaGetter.transformOptional((o: Option.Option<string>) => o)
  })
)

/** A member omitted when empty: absent, `null` and values for which `isEmpty` holds decode as absent. */
const omittedWhen = <S extends Schema.Top>(schema: S, isEmpty: (a: S["Type"]) => boolean) =>
  Schema.optionalKey(Schema.NullOr(schema)).pipe(
    Schema.decodeTo(Schema.optionalKey(Schema.toType(schema)), {
      decode: SchemaGetter.transformOptional((o: Option.Option<S["Type"] | null>) =>
        Option.filter(o, (a): a is S["Type"] => a !== null && !isEmpty(a))
      ),
      encode: SchemaGetter.transformOptional((o: Option.Option<S["Type"]>) => o)
    })
  )

/** Absent, `null` or rejected by `keep` decodes as `undefined`; any other value must match `schema`. */
const orAbsent = <S extends Schema.Top>(schema: S, keep: (a: S["Type"]) => boolean = () => true) =>
  Schema.optionalKey(Schema.NullOr(schema)).pipe(
    Schema.decodeTo(Schema.UndefinedOr(Schema.toType(schema)), {
      decode: SchemaGetter.transformOptional((o: Option.Option<S["Type"] | null>) =>
        Option.some(Option.getOrUndefined(Option.filter(o, (a) => a !== null && keep(a))))
      ),
      encode: SchemaGetter.transformOptional((o: Option.Option<S["Type"] | undefined>) =>
        Option.filter(o, Predicate.isNotUndefined)
      )
    })
  )

/** Absent decodes as `undefined`; a present value (`null` too) must match `schema`. */
const absentOr = <S extends Schema.Top>(schema: S) =>
  Schema.optionalKey(schema).pipe(
    Schema.decodeTo(Schema.UndefinedOr(Schema.toType(schema)), {
      decode: SchemaGetter.transformOptional((o: Option.Option<S["Type"]>) => Option.some(Option.getOrUndefined(o))),
      encode: SchemaGetter.transformOptional((o: Option.Option<S["Type"] | undefined>) =>
        Option.filter(o, Predicate.isNotUndefined)
      )
    })
  )

/** A member that decodes as `undefined` unless it is present and passes `check`. */
const orUndefined = <S extends Schema.Top>(schema: S, check: (u: unknown) => u is S["Type"]) =>
  Schema.optionalKey(Schema.Unknown).pipe(
    Schema.decodeTo(Schema.UndefinedOr(Schema.toType(schema)), {
      decode: SchemaGetter.transformOptional((o: Option.Option<unknown>) =>
        Option.some(Option.isSome(o) && check(o.value) ? o.value : undefined)
      ),
      encode: SchemaGetter.transformOptional((o: Option.Option<S["Type"] | undefined>) =>
        Option.filter(o, Predicate.isNotUndefined)
      )
    })
  )

/**
 * A top-level list response: PROTOCOL.md 2.7 sends `null` for an empty list, so
 * `null` and `[]` both decode as `[]`.
 *
 * @since 0.1.0
 * @category combinators
 */
export const NullableList = <S extends Schema.Top>(
  item: S
): Schema.decodeTo<Schema.$Array<Schema.toType<S>>, Schema.NullOr<Schema.$Array<S>>> =>
  Schema.NullOr(Schema.Array(item)).pipe(
    Schema.decodeTo(Schema.Array(Schema.toType(item)), {
      decode: SchemaGetter.transform((items: ReadonlyArray<S["Type"]> | null) => items ?? []),
      encode: SchemaGetter.transform((items: ReadonlyArray<S["Type"]>) => items)
    })
  )

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
 * `dispatch_attempt` (absent, not `null`) and an optional `lease_timeout_seconds` (a non-positive or
 * non-number value counts as absent). `dispatchAttempt` and
 * `leaseTimeoutSeconds` are `undefined` on v0.14.0 kernels (17.A).
 *
 * @since 0.1.0
 * @category schemas
 */
export const WebhookNotice = Schema.Struct({
  executionId: Schema.NonEmptyString,
  dispatchId: Schema.NonEmptyString,
  dispatchAttempt: absentOr(Schema.Int.check(Schema.isGreaterThan(0))),
  leaseTimeoutSeconds: orUndefined(Schema.Number, positiveNumber)
}).pipe(Schema.encodeKeys({
  executionId: "execution_id",
  dispatchId: "dispatch_id",
  dispatchAttempt: "dispatch_attempt",
  leaseTimeoutSeconds: "lease_timeout_seconds"
}))

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
  // Absent or a positive integer (14.2 step 2): `null` is neither.
  if (attempt !== undefined) {
    if (!positiveInt(attempt)) return undefined
    dispatchAttempt = attempt
  }
  const lease = o["lease_timeout_seconds"]
  const leaseTimeoutSeconds = positiveNumber(lease) ? lease : undefined
  return { executionId, dispatchId, dispatchAttempt, leaseTimeoutSeconds }
}

/**
 * The step of a parent execution that a child execution is bound to
 * (PROTOCOL-CURRENT C.5.1): `{"execution_id":…,"step_id":…}`. The child
 * settles that step when it ends.
 *
 * @since 0.2.0
 * @category schemas
 */
export const SpawnedBy = Schema.Struct({
  executionId: str,
  stepId: str
}).pipe(Schema.encodeKeys({ executionId: "execution_id", stepId: "step_id" }))

/**
 * A decoded `spawned_by` binding.
 *
 * @since 0.2.0
 * @category models
 */
export interface SpawnedBy extends Schema.Schema.Type<typeof SpawnedBy> {}

// ---------------------------------------------------------------------------
// Request bodies sent by the SDK (PROTOCOL.md 6.0, 11)
// ---------------------------------------------------------------------------

/**
 * `POST /v0/executions/{id}/steps` body (6.3):
 * `{"kind":…,"target":…,"args":…,"idempotency":…}`, plus in the current
 * stage the keys of the registered resources the step's body may change,
 * `"resources":[…]` (PROTOCOL-CURRENT C.6.4; sent only when a step declares
 * some).
 *
 * @since 0.1.0
 * @category request bodies
 */
export const SubmitStepBody = Schema.Struct({
  kind: str,
  target: str,
  args: optionalJson,
  idempotency: str,
  resources: Schema.optionalKey(Schema.Array(Schema.String))
})

/**
 * A checkpoint captured after a step's body (PROTOCOL-CURRENT C.6.5):
 * `{"key","generation","checkpoint_ref"}`; `generation` is the one the
 * `proceed` decision named.
 *
 * @since 0.2.0
 * @category request bodies
 */
export const Capture = Schema.Struct({
  key: Schema.String,
  generation: Schema.Number,
  checkpointRef: Schema.String
}).pipe(Schema.encodeKeys({ checkpointRef: "checkpoint_ref" }))

/**
 * A decoded capture.
 *
 * @since 0.2.0
 * @category models
 */
export interface Capture extends Schema.Schema.Type<typeof Capture> {}

/**
 * A capture that failed (PROTOCOL-CURRENT C.6.5): `{"key","generation","error"}`.
 *
 * @since 0.2.0
 * @category request bodies
 */
export const CaptureFailure = Schema.Struct({
  key: Schema.String,
  generation: Schema.Number,
  error: Schema.String
})

/**
 * A decoded capture failure.
 *
 * @since 0.2.0
 * @category models
 */
export interface CaptureFailure extends Schema.Schema.Type<typeof CaptureFailure> {}

/**
 * `POST …/steps/{step_id}/complete` body (6.4): `{"result":…}`, plus in the
 * current stage the captures of the resources due after the body
 * (`captures`, `capture_failures`, PROTOCOL-CURRENT C.6.5; each sent only
 * when non-empty).
 *
 * @since 0.1.0
 * @category request bodies
 */
export const CompleteStepBody = Schema.Struct({
  result: optionalJson,
  captures: Schema.optionalKey(Schema.Array(Capture)),
  captureFailures: Schema.optionalKey(Schema.Array(CaptureFailure))
}).pipe(Schema.encodeKeys({ captureFailures: "capture_failures" }))

/**
 * `POST …/steps/{step_id}/fail` body (6.5). The SDK sends
 * `{"error":{"message":"<text>"}}` (typed failures add `failure`), plus the
 * captures of the resources due after the body, as on complete.
 *
 * @since 0.1.0
 * @category request bodies
 */
export const FailStepBody = Schema.Struct({
  error: optionalJson,
  captures: Schema.optionalKey(Schema.Array(Capture)),
  captureFailures: Schema.optionalKey(Schema.Array(CaptureFailure))
}).pipe(Schema.encodeKeys({ captureFailures: "capture_failures" }))

/**
 * `POST /v0/executions/{id}/resources` body (PROTOCOL-CURRENT C.6.2):
 * `{"key","driver_id","configuration","coverage_reuse","every_steps","on_completion"}`,
 * every member present (`configuration` is `null` without one).
 *
 * @since 0.2.0
 * @category request bodies
 */
export const RegisterResourceBody = Schema.Struct({
  key: Schema.String,
  driverId: Schema.String,
  configuration: Schema.NullOr(Schema.Unknown),
  coverageReuse: Schema.Boolean,
  everySteps: Schema.Number,
  onCompletion: Schema.Boolean
}).pipe(Schema.encodeKeys({
  driverId: "driver_id",
  coverageReuse: "coverage_reuse",
  everySteps: "every_steps",
  onCompletion: "on_completion"
}))

/**
 * `POST /v0/executions/{id}/resources/{key}/binding` body (PROTOCOL-CURRENT
 * C.6.3): `{"binding":<json>}`.
 *
 * @since 0.2.0
 * @category request bodies
 */
export const BindResourceBody = Schema.Struct({
  binding: Schema.Unknown
})

/**
 * `POST /v0/executions/{id}/resources/checkpoints` body (PROTOCOL-CURRENT
 * C.6.6): `{"captures":[…],"capture_failures":[…]}`, both optional.
 *
 * @since 0.2.0
 * @category request bodies
 */
export const CheckpointsBody = Schema.Struct({
  captures: Schema.optionalKey(Schema.Array(Capture)),
  captureFailures: Schema.optionalKey(Schema.Array(CaptureFailure))
}).pipe(Schema.encodeKeys({ captureFailures: "capture_failures" }))

/**
 * `POST /v0/executions/{id}/fork` body (PROTOCOL-CURRENT C.7.1):
 * `{"at_seq":<int>[,"session":…][,"policy_bundle":…]}`, the optional members
 * sent only when non-empty.
 *
 * @since 0.2.0
 * @category request bodies
 */
export const ForkBody = Schema.Struct({
  atSeq: Schema.Number,
  session: Schema.optionalKey(Schema.String),
  policyBundle: Schema.optionalKey(Schema.String)
}).pipe(Schema.encodeKeys({ atSeq: "at_seq", policyBundle: "policy_bundle" }))

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
 * `POST /v0/executions/{id}/complete` body (6.8): `{"output":…}` or `{}`; in
 * the current stage also `"state":…`, the session state the next execution
 * of the session reads (PROTOCOL-CURRENT C.4.5; omitted when there is none).
 *
 * @since 0.1.0
 * @category request bodies
 */
export const CompleteExecutionBody = Schema.Struct({
  output: optionalJson,
  state: optionalJson
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
 * `POST /v0/executions` body (11.1, PROTOCOL-CURRENT C.4.1):
 * `{"agent_id":…,"input":…}` plus, each omitted when absent, `agent_version`
 * (seed stage and v0.14.0 only) or the current stage's `session`,
 * `parent_execution_id`, `idempotency_key` and `spawned_by`.
 *
 * @since 0.1.0
 * @category request bodies
 */
export const CreateExecutionBody = Schema.Struct({
  agentId: str,
  input: optionalJson,
  agentVersion: Schema.optionalKey(Schema.String),
  session: Schema.optionalKey(Schema.String),
  parentExecutionId: Schema.optionalKey(Schema.String),
  idempotencyKey: Schema.optionalKey(Schema.String),
  spawnedBy: Schema.optionalKey(SpawnedBy)
}).pipe(Schema.encodeKeys({
  agentId: "agent_id",
  agentVersion: "agent_version",
  parentExecutionId: "parent_execution_id",
  idempotencyKey: "idempotency_key",
  spawnedBy: "spawned_by"
}))

/**
 * `PUT /v0/agents/{agent_id}/metadata` body (PROTOCOL-CURRENT C.3.1):
 * `{"description":…,"input_schema":…,"output_schema":…}`, every member always
 * present and `null` when unknown. The schemas are JSON Schema objects.
 *
 * @since 0.2.0
 * @category request bodies
 */
export const AgentMetadataBody = Schema.Struct({
  description: Schema.NullOr(Schema.String),
  inputSchema: Schema.NullOr(Schema.Unknown),
  outputSchema: Schema.NullOr(Schema.Unknown)
}).pipe(Schema.encodeKeys({ inputSchema: "input_schema", outputSchema: "output_schema" }))

/**
 * An agent's published metadata.
 *
 * @since 0.2.0
 * @category models
 */
export interface AgentMetadataBody extends Schema.Schema.Type<typeof AgentMetadataBody> {}

/**
 * `POST /v0/approvals/{id}/grant` and `…/deny` body (9.3):
 * `{"decided_by":…,"rationale":…}` (`rationale` optional).
 *
 * @since 0.1.0
 * @category request bodies
 */
export const ApprovalDecisionBody = Schema.Struct({
  decidedBy: str,
  rationale: Schema.optionalKey(Schema.String)
}).pipe(Schema.encodeKeys({ decidedBy: "decided_by" }))

/**
 * `POST /v0/agents` body (11.9): exactly `{"id":…,"webhook_url":…,"secret":…}`.
 *
 * @since 0.1.0
 * @category request bodies
 */
export const RegisterAgentBody = Schema.Struct({
  id: str,
  webhookUrl: str,
  secret: Schema.RedactedFromValue(Schema.String)
}).pipe(Schema.encodeKeys({ webhookUrl: "webhook_url" }))

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

/**
 * A resource a starting step touches, as the `proceed` decision lists it
 * (PROTOCOL-CURRENT C.6.4): `{"key","generation"[,"due":true]}`. `due` is
 * `true` when the step's body must be followed by a capture of the resource
 * (sent with the step's outcome, C.6.5); absent means `false`.
 *
 * @since 0.2.0
 * @category schemas
 */
export const StepResource = Schema.Struct({
  key: str,
  generation: num,
  due: orDefault(Schema.Boolean, () => false)
})

/**
 * A decoded step resource.
 *
 * @since 0.2.0
 * @category models
 */
export interface StepResource extends Schema.Schema.Type<typeof StepResource> {}

const StepDecisionStruct = Schema.Struct({
  decision: Schema.String,
  stepId: nonEmpty,
  result: optionalJson,
  error: optionalJson,
  approvalId: nonEmpty,
  reason: nonEmpty,
  ruleId: nonEmpty,
  resources: omittedWhen(Schema.Array(StepResource), (list) => list.length === 0)
}).pipe(Schema.encodeKeys({ stepId: "step_id", approvalId: "approval_id", ruleId: "rule_id" }))

/**
 * The kernel's answer to a step submission, or to a step complete / fail
 * (PROTOCOL.md 7.1, 7.2). `result` and `error` are present (possibly `null`)
 * exactly when the kernel sent them; empty `step_id`, `approval_id`,
 * `reason` and `rule_id` count as absent; unknown members are ignored.
 *
 * A `blocked` decision without `approval_id` is rate-limit parking
 * (PROTOCOL-CURRENT C.8.3, `reason` `rate_limit_exceeded`): the execution
 * stays running and is redelivered after the wait. `ruleId` names the rule
 * that decided a `denied` step (C.8.4). `resources` lists the registered
 * resources a starting step touched, with their new generations and whether
 * a capture is due after the body (C.6.4); absent when none (an empty list
 * counts as absent).
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
  /** @since 0.2.0 */
  readonly ruleId?: string | undefined
  /** @since 0.2.0 */
  readonly resources?: ReadonlyArray<StepResource> | undefined
}

/**
 * Schema of {@link StepDecision}.
 *
 * @since 0.1.0
 * @category schemas
 */
export const StepDecision: Schema.Codec<StepDecision, typeof StepDecisionStruct.Encoded> =
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
  const out: Types.Mutable<StepDecision> = { decision }
  const stepId = o["step_id"]
  if (typeof stepId === "string" && stepId !== "") out.stepId = stepId
  if ("result" in o) out.result = o["result"]
  if ("error" in o) out.error = o["error"]
  const approvalId = o["approval_id"]
  if (typeof approvalId === "string" && approvalId !== "") out.approvalId = approvalId
  const reason = o["reason"]
  if (typeof reason === "string" && reason !== "") out.reason = reason
  const ruleId = o["rule_id"]
  if (typeof ruleId === "string" && ruleId !== "") out.ruleId = ruleId
  const resources = o["resources"]
  if (Array.isArray(resources) && resources.length > 0) {
    const decoded = decodeStepResources(resources)
    if (decoded.length > 0) out.resources = decoded
  }
  return out
}

/**
 * The `resources` of a decision, as {@link StepResource} decodes them; an entry
 * that is not an object with a string `key` is left out (the step still runs,
 * without that capture).
 */
const decodeStepResources = (list: ReadonlyArray<unknown>): ReadonlyArray<StepResource> => {
  const out: Array<StepResource> = []
  for (const item of list) {
    if (typeof item !== "object" || item === null || Array.isArray(item)) continue
    const r = item as Record<string, unknown>
    const key = r["key"]
    if (typeof key !== "string" || key === "") continue
    const generation = r["generation"]
    out.push({ key, generation: typeof generation === "number" ? generation : 0, due: r["due"] === true })
  }
  return out
}

// ---------------------------------------------------------------------------
// Objects (PROTOCOL.md 11.12)
// ---------------------------------------------------------------------------

/**
 * An execution (PROTOCOL.md 11.12, PROTOCOL-CURRENT C.10). `input` is `null`
 * when none was given; `output` is absent when none was recorded (present,
 * possibly `null`, when it was). Timestamps are RFC 3339 strings (`""` when
 * absent).
 *
 * The members of the current stage (C.4, C.5, C.7) are omitted by the kernel
 * when empty, and absent from the decoded value then (`null`, `""` and `0`
 * count as empty): `session`,
 * `parentExecutionId` (the execution whose state `previous` reads),
 * `forkedFrom` and `forkSeq` (a fork's source and fork point),
 * `idempotencyKey`, `spawnedBy` (the parent step of a subagent's execution)
 * and `restoration` (only on a fork's answer). `agentVersion` is a member of
 * the seed stage and v0.14.0 only.
 *
 * @since 0.1.0
 * @category models
 */
export const Execution = Schema.Struct({
  id: str,
  agentId: str,
  agentVersion: str,
  input: json,
  status: str,
  output: optionalJson,
  failureReason: str,
  createdAt: str,
  updatedAt: str,
  deadlineAt: str,
  session: nonEmpty,
  parentExecutionId: nonEmpty,
  forkedFrom: nonEmpty,
  forkSeq: omittedWhen(Schema.Number, (n) => n === 0),
  idempotencyKey: nonEmpty,
  spawnedBy: omittedWhen(SpawnedBy, () => false),
  restoration: optionalJson
}).pipe(Schema.encodeKeys({
  agentId: "agent_id",
  agentVersion: "agent_version",
  failureReason: "failure_reason",
  createdAt: "created_at",
  updatedAt: "updated_at",
  deadlineAt: "deadline_at",
  parentExecutionId: "parent_execution_id",
  forkedFrom: "forked_from",
  forkSeq: "fork_seq",
  idempotencyKey: "idempotency_key",
  spawnedBy: "spawned_by"
}))

/**
 * A decoded execution.
 *
 * @since 0.1.0
 * @category models
 */
export interface Execution extends Schema.Schema.Type<typeof Execution> {}

/**
 * Decode an {@link Execution} from parsed JSON.
 *
 * @since 0.1.0
 * @category decoding
 */
export const decodeExecution = Schema.decodeUnknownEffect(Execution)

/**
 * A recorded step (PROTOCOL.md 11.12). `args`, `result` and `error` are present
 * exactly when stored.
 *
 * @since 0.1.0
 * @category models
 */
export const Step = Schema.Struct({
  stepId: str,
  executionId: str,
  kind: str,
  target: str,
  argsHash: str,
  occurrence: num,
  status: str,
  idempotency: str,
  args: optionalJson,
  result: optionalJson,
  error: optionalJson,
  startedAt: str,
  completedAt: str}).pipe(Schema.encodeKeys({ stepId: "step_id", executionId: "execution_id", argsHash: "args_hash", startedAt: "started_at", completedAt: "completed_at" }))

/**
 * A decoded step.
 *
 * @since 0.1.0
 * @category models
 */
export interface Step extends Schema.Schema.Type<typeof Step> {}

/**
 * An execution event (PROTOCOL.md 11.12, 12). `eventSeq` starts at 1 and is
 * dense per execution.
 *
 * @since 0.1.0
 * @category models
 */
export const Event = Schema.Struct({
  executionId: str,
  eventSeq: num,
  type: str,
  payload: json,
  occurredAt: str}).pipe(Schema.encodeKeys({ executionId: "execution_id", eventSeq: "event_seq", occurredAt: "occurred_at" }))

/**
 * A decoded event.
 *
 * @since 0.1.0
 * @category models
 */
export interface Event extends Schema.Schema.Type<typeof Event> {}

/**
 * A human approval (PROTOCOL.md 9, 11.12). An empty `approvers` list means
 * anyone may decide.
 *
 * @since 0.1.0
 * @category models
 */
export const Approval = Schema.Struct({
  id: str,
  stepId: str,
  executionId: str,
  status: str,
  approvers: list(Schema.String),
  message: str,
  timeoutAt: str,
  decidedBy: str,
  decidedAt: str,
  rationale: str,
  createdAt: str}).pipe(Schema.encodeKeys({ stepId: "step_id", executionId: "execution_id", timeoutAt: "timeout_at", decidedBy: "decided_by", decidedAt: "decided_at", createdAt: "created_at" }))

/**
 * A decoded approval.
 *
 * @since 0.1.0
 * @category models
 */
export interface Approval extends Schema.Schema.Type<typeof Approval> {}

const AgentStruct = Schema.Struct({
  id: str,
  webhookUrl: str,
  policyBundle: str,
  registeredAt: str,
  leaseTimeoutSeconds: orUndefined(Schema.Number, positiveNumber)
}).pipe(Schema.encodeKeys({
  webhookUrl: "webhook_url",
  policyBundle: "policy_bundle",
  registeredAt: "registered_at",
  leaseTimeoutSeconds: "lease_timeout_seconds"
}))

/** The Go field names of the seed stage and v0.14.0, and their current-stage names. */
const PASCAL_AGENT_KEYS: ReadonlyArray<readonly [string, string]> = [
  ["ID", "id"],
  ["WebhookURL", "webhook_url"],
  ["PolicyBundle", "policy_bundle"],
  ["RegisteredAt", "registered_at"]
]

/** An agent object in either spelling, as the current stage spells it (a snake_case member wins). */
const snakeCaseAgent = (u: unknown): unknown => {
  if (typeof u !== "object" || u === null || Array.isArray(u)) return u
  const o = u as Record<string, unknown>
  if (!PASCAL_AGENT_KEYS.some(([pascal]) => pascal in o)) return o
  const out: Record<string, unknown> = {}
  for (const [pascal, snake] of PASCAL_AGENT_KEYS) if (pascal in o) out[snake] = o[pascal]
  for (const [key, value] of Object.entries(o)) {
    if (!PASCAL_AGENT_KEYS.some(([pascal]) => pascal === key)) out[key] = value
  }
  return out
}

/**
 * A registered agent (PROTOCOL.md 11.9, PROTOCOL-CURRENT C.10). Both
 * spellings decode: the current stage's snake_case object
 * (`{"id","webhook_url","policy_bundle"?,"registered_at","lease_timeout_seconds"?}`)
 * and the Go field names of the seed stage and v0.14.0 (`ID`, `WebhookURL`,
 * `PolicyBundle`, `RegisteredAt`). Encoding writes snake_case. The older
 * kernels' `Secret` member is deliberately not decoded: it is `""` from a
 * conforming kernel, and a reference kernel that echoes it must not leak it
 * into logs. `leaseTimeoutSeconds` is the agent's own lease timeout, when it
 * registered one (current stage).
 *
 * @since 0.1.0
 * @category models
 */
export const Agent = Schema.Unknown.pipe(
  Schema.decodeTo(AgentStruct, {
    decode: SchemaGetter.transform((u: unknown) => snakeCaseAgent(u) as typeof AgentStruct.Encoded),
    encode: SchemaGetter.transform((encoded) => encoded)
  })
)

/**
 * A decoded agent.
 *
 * @since 0.1.0
 * @category models
 */
export interface Agent extends Schema.Schema.Type<typeof Agent> {}

/**
 * A live delta (PROTOCOL.md 6.6, 11.6): `{"step_id":…,"seq":…,"data":…}`.
 * Never stored by the kernel.
 *
 * @since 0.1.0
 * @category schemas
 */
export const LiveDelta = Schema.Struct({
  stepId: str,
  seq: num,
  data: str
}).pipe(Schema.encodeKeys({ stepId: "step_id" }))

/**
 * A decoded live delta.
 *
 * @since 0.1.0
 * @category models
 */
export interface LiveDelta extends Schema.Schema.Type<typeof LiveDelta> {}

/**
 * The error envelope (PROTOCOL.md 13.1): `{"code":…,"message":…}`; newer
 * kernels may add `rule_id`, and the current stage `details`
 * (PROTOCOL-CURRENT C.10), which is ignored.
 *
 * @since 0.1.0
 * @category schemas
 */
export const ErrorEnvelope = Schema.Struct({
  code: str,
  message: str,
  ruleId: nonEmpty
}).pipe(Schema.encodeKeys({ ruleId: "rule_id" }))

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
  nextCursor: orAbsent(Schema.String, (s) => s !== "")
}).pipe(Schema.encodeKeys({ nextCursor: "next_cursor" }))

/**
 * A decoded executions page.
 *
 * @since 0.1.0
 * @category models
 */
export interface ExecutionPage extends Schema.Schema.Type<typeof ExecutionPage> {}

/**
 * The answer of `GET /v0/executions/{id}/previous` (PROTOCOL-CURRENT C.4.6):
 * `{"state":…}` — the parent's stored state, else the parent's output, `null`
 * without a parent (a missing member decodes as `null`).
 *
 * @since 0.2.0
 * @category schemas
 */
export const PreviousState = Schema.Struct({
  state: json
})

/**
 * A decoded `previous` answer.
 *
 * @since 0.2.0
 * @category models
 */
export interface PreviousState extends Schema.Schema.Type<typeof PreviousState> {}

/**
 * The answer of `POST /v0/executions/{id}/suspend` (PROTOCOL-CURRENT C.5.2):
 * `{"suspended":true}` when the execution now waits (on approvals or on
 * children), `{"suspended":false}` when nothing was waiting any more.
 *
 * @since 0.2.0
 * @category schemas
 */
export const SuspendAnswer = Schema.Struct({
  suspended: Schema.Boolean
})

/**
 * A decoded `suspend` answer.
 *
 * @since 0.2.0
 * @category models
 */
export interface SuspendAnswer extends Schema.Schema.Type<typeof SuspendAnswer> {}

// ---------------------------------------------------------------------------
// Resources and forks (PROTOCOL-CURRENT C.6, C.7)
// ---------------------------------------------------------------------------

/**
 * A resource registered on an execution (PROTOCOL-CURRENT C.6.1), as
 * register answers it: its identity (`key`, `driverId`, `configuration`,
 * `coverageReuse`), checkpoint policy (`everySteps`, `onCompletion`), the seq
 * of its `resource.registered` event, its `generation` (a capture must name
 * the current one), `count` (settled affecting steps), its `binding` (absent
 * until bound), the `checkpointRef` a fork starts from (absent: the initial
 * environment) and whether a checkpoint `covered` the current generation.
 * `configuration` and `binding` are present exactly when the kernel sent
 * them.
 *
 * @since 0.2.0
 * @category schemas
 */
export const Resource = Schema.Struct({
  key: str,
  driverId: str,
  configuration: optionalJson,
  coverageReuse: orDefault(Schema.Boolean, () => false),
  everySteps: num,
  onCompletion: orDefault(Schema.Boolean, () => false),
  registeredSeq: num,
  generation: num,
  count: num,
  binding: optionalJson,
  checkpointRef: nonEmpty,
  covered: orDefault(Schema.Boolean, () => false)
}).pipe(Schema.encodeKeys({
  driverId: "driver_id",
  coverageReuse: "coverage_reuse",
  everySteps: "every_steps",
  onCompletion: "on_completion",
  registeredSeq: "registered_seq",
  checkpointRef: "checkpoint_ref"
}))

/**
 * A decoded resource.
 *
 * @since 0.2.0
 * @category models
 */
export interface Resource extends Schema.Schema.Type<typeof Resource> {}

/**
 * One resource of a fork's `restoration` (PROTOCOL-CURRENT C.7.1, C.7.2 #4):
 * the checkpoint the fork's resource starts from (`checkpointRef` and the seq
 * it covered from, `checkpointSeq`; both absent: the initial environment) and
 * whether that checkpoint covers the fork point.
 *
 * @since 0.2.0
 * @category schemas
 */
export const RestoredResource = Schema.Struct({
  checkpointRef: nonEmpty,
  checkpointSeq: omittedWhen(Schema.Number, (n) => n === 0),
  covered: orDefault(Schema.Boolean, () => false)
}).pipe(Schema.encodeKeys({ checkpointRef: "checkpoint_ref", checkpointSeq: "checkpoint_seq" }))

/**
 * A decoded restored resource.
 *
 * @since 0.2.0
 * @category models
 */
export interface RestoredResource extends Schema.Schema.Type<typeof RestoredResource> {}

/**
 * A fork's `restoration` member (PROTOCOL-CURRENT C.7.1): one
 * {@link RestoredResource} per resource key. {@link Execution} keeps the
 * member as the JSON it arrived as; decode it with {@link decodeRestoration}.
 *
 * @since 0.2.0
 * @category schemas
 */
export const Restoration = Schema.Record(Schema.String, RestoredResource)

/**
 * A decoded restoration.
 *
 * @since 0.2.0
 * @category models
 */
export type Restoration = Schema.Schema.Type<typeof Restoration>

/**
 * The restoration of a fork's execution, decoded: `{}` when the execution
 * has none (not a fork, or a fork of a source without resources), and when
 * the member is not a JSON object.
 *
 * @example
 * ```ts
 * import { NodeHttpClient } from "@effect/platform-node"
 * import { Effect, Layer } from "effect"
 * import { Client, Protocol } from "effect-rebuno"
 *
 * // Fork an execution at seq 12 and see where its workspace starts from.
 * const restoredWorkspace = (executionId: string) =>
 *   Effect.gen(function*() {
 *     const client = yield* Client.Client
 *     const fork = yield* client.fork(executionId, { atSeq: 12 })
 *     return Protocol.decodeRestoration(fork.restoration)["workspace"]
 *     // { checkpointRef: "…", checkpointSeq: 9, covered: true }
 *   }).pipe(Effect.provide(Client.layerConfig().pipe(Layer.provide(NodeHttpClient.layerUndici))))
 * ```
 *
 * @since 0.2.0
 * @category decoding
 */
export const decodeRestoration = (restoration: unknown): Restoration => {
  if (typeof restoration !== "object" || restoration === null || Array.isArray(restoration)) return {}
  const decoded = decodeRestorationResult(restoration)
  return decoded._tag === "Success" ? decoded.success : {}
}

const decodeRestorationResult = Schema.decodeUnknownResult(Restoration)

/**
 * A checkpoint of an execution as `fork-points` lists it (PROTOCOL-CURRENT
 * C.7.3): it covers the seqs `coveredSeq ≤ seq < invalidatedSeq`
 * (`invalidatedSeq` absent while it is still valid).
 *
 * @since 0.2.0
 * @category schemas
 */
export const Checkpoint = Schema.Struct({
  key: str,
  generation: num,
  checkpointRef: str,
  coveredSeq: num,
  invalidatedSeq: omittedWhen(Schema.Number, (n) => n === 0)
}).pipe(Schema.encodeKeys({
  checkpointRef: "checkpoint_ref",
  coveredSeq: "covered_seq",
  invalidatedSeq: "invalidated_seq"
}))

/**
 * A decoded checkpoint.
 *
 * @since 0.2.0
 * @category models
 */
export interface Checkpoint extends Schema.Schema.Type<typeof Checkpoint> {}

/**
 * The answer of `GET /v0/executions/{id}/fork-points` (PROTOCOL-CURRENT
 * C.7.3): the latest seq (every seq in `1..latestSeq` may be forked), the
 * resources by key with the seq they were registered at, and every
 * checkpoint. `null` lists and maps decode as empty.
 *
 * @since 0.2.0
 * @category schemas
 */
export const ForkPoints = Schema.Struct({
  latestSeq: num,
  resources: orDefault(Schema.Record(Schema.String, Schema.Number), () => ({})),
  checkpoints: list(Checkpoint)
}).pipe(Schema.encodeKeys({ latestSeq: "latest_seq" }))

/**
 * Decoded fork points.
 *
 * @since 0.2.0
 * @category models
 */
export interface ForkPoints extends Schema.Schema.Type<typeof ForkPoints> {}

/**
 * Is `seq` covered (PROTOCOL-CURRENT C.7.3): does every resource registered
 * at or before it have a checkpoint covering it? With no resources every seq
 * is covered. A fork at a covered seq restores every resource exactly as it
 * was at that seq.
 *
 * @since 0.2.0
 * @category predicates
 */
export const isCovered = (points: ForkPoints, seq: number): boolean => {
  for (const [key, registeredSeq] of Object.entries(points.resources)) {
    if (registeredSeq > seq) continue
    const covering = points.checkpoints.some((c) =>
      c.key === key && c.coveredSeq <= seq && (c.invalidatedSeq === undefined || seq < c.invalidatedSeq)
    )
    if (!covering) return false
  }
  return true
}

/**
 * The latest covered seq (see {@link isCovered}), or `undefined` when no seq
 * is: the fork point that loses the least work while restoring every
 * resource exactly.
 *
 * @since 0.2.0
 * @category predicates
 */
export const latestCoveredSeq = (points: ForkPoints): number | undefined => {
  for (let seq = points.latestSeq; seq >= 1; seq--) if (isCovered(points, seq)) return seq
  return undefined
}

/**
 * Every scope an API key can hold (PROTOCOL-CURRENT C.9.1), in the
 * specification's order. Write does not imply read; `api_keys:manage`
 * administers keys.
 *
 * @since 0.2.0
 * @category constants
 */
export const apiKeyScopes = [
  "executions:read",
  "executions:write",
  "approvals:read",
  "approvals:write",
  "agents:read",
  "agents:write",
  "policies:write",
  "api_keys:manage"
] as const

/**
 * A scope of an API key: one of {@link apiKeyScopes}.
 *
 * @since 0.2.0
 * @category models
 */
export type ApiKeyScope = typeof apiKeyScopes[number]
