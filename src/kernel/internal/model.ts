/**
 * The vocabulary of the kernel core: its settings, the failure every operation
 * may end in, and the records it hands out (agents, executions, steps,
 * approvals, events, dispatches, decisions, leases, claims, deltas). `Core`
 * re-exports all of it; the other core modules speak in these terms.
 *
 * @since 0.1.0
 * @internal
 */
import * as Schema from "effect/Schema"
import type { ApiKeyScope, ApprovalStatus, DecisionKind, ExecutionStatus, StepStatus } from "../../Protocol.js"
import { apiKeyScopes } from "../../Protocol.js"
import type * as Policy from "../Policy.js"

/**
 * A protocol-level failure of a kernel operation: the HTTP status, the error
 * `code` and the exact `message` of the error envelope (PROTOCOL 13.2).
 *
 * @since 0.1.0
 * @category errors
 */
export class KernelFailure extends Schema.TaggedError<KernelFailure>("effect-rebuno/kernel/KernelFailure")(
  "KernelFailure",
  {
    status: Schema.Number,
    code: Schema.String,
    message: Schema.String,
    /**
     * Raw JSON text of the envelope's optional `details` member
     * (PROTOCOL-CURRENT C.10); absent in the seed and v0.14.0 envelopes.
     */
    details: Schema.optional(Schema.String)
  }
) {}

/**
 * The protocol stage a kernel speaks: `"current"` (PROTOCOL-CURRENT, the
 * default), `"seed"` (PROTOCOL.md with dispatch attempts and fencing) or
 * `"v0.14.0"` (the reference kernel v0.14.0: no attempts, no fencing, 17.A).
 *
 * @since 0.2.0
 * @category models
 */
export type Stage = "current" | "seed" | "v0.14.0"

/**
 * Every {@link Stage}, in order from newest to oldest.
 *
 * @since 0.2.0
 * @category constants
 */
export const stages: ReadonlyArray<Stage> = ["current", "seed", "v0.14.0"]

/**
 * Kernel settings. Durations in milliseconds.
 *
 * @since 0.1.0
 * @category models
 */
export interface Settings {
  /** Lease timeout of a dispatch (default 120 000). Per-agent overrides win. */
  readonly leaseTimeoutMs: number
  /** Max delivery attempts of a dispatch (default 5). */
  readonly maxAttempts: number
  /** Default approval timeout (default 900 000). */
  readonly approvalTimeoutMs: number
  /** Execution deadline; `undefined` = off (default). */
  readonly deadlineMs: number | undefined
  /**
   * The protocol stage (default `"current"`); `"v0.14.0"` emulates a kernel
   * without attempts and fencing (PROTOCOL 17.A).
   */
  readonly stage: Stage
  /** Simulate rate-limiter errors (PROTOCOL 10.5, 16.4). */
  readonly limiterError: boolean
  /** Random source in `[0, 1)` for backoff jitter. */
  readonly random: () => number
  /**
   * The judge asked by `judge` rules (PROTOCOL-CURRENT C.8.6); without one
   * they deny with reason `judge not configured` (default).
   */
  readonly judge?: Policy.Judge | undefined
}

/**
 * The default settings (PROTOCOL Appendix A).
 *
 * @since 0.1.0
 * @category constructors
 */
export const defaultSettings: Settings = {
  leaseTimeoutMs: 120_000,
  maxAttempts: 5,
  approvalTimeoutMs: 900_000,
  deadlineMs: undefined,
  stage: "current",
  limiterError: false,
  random: Math.random
}

/**
 * @since 0.1.0
 * @category models
 */
export type DispatchStatus = "pending" | "in_flight" | "failed" | "exhausted"

/**
 * What an agent publishes about itself with `PUT /v0/agents/{id}/metadata`
 * (PROTOCOL-CURRENT C.3): each member `null` when unknown; the schemas are
 * stored as compacted JSON text.
 *
 * @since 0.2.0
 * @category models
 */
export interface AgentMetadata {
  readonly description: string | null
  /** Raw JSON text of the input JSON Schema (an object), or `null`. */
  readonly inputSchemaRaw: string | null
  /** Raw JSON text of the output JSON Schema (an object), or `null`. */
  readonly outputSchemaRaw: string | null
}

/**
 * A registered agent (PROTOCOL 4.1).
 *
 * @since 0.1.0
 * @category models
 */
export interface AgentRecord {
  readonly id: string
  readonly webhookUrl: string
  readonly secret: string
  /** Raw YAML text; `""` = no policy. */
  readonly policyBundle: string
  /** The parsed bundle; `undefined` when `policyBundle` is empty. */
  readonly policy: Policy.Bundle | undefined
  readonly registeredAtMs: number
  /** Per-agent lease timeout (manifest `lease_timeout_seconds` ≥ 10). */
  readonly leaseTimeoutMs: number | undefined
  /**
   * The metadata the agent published (PROTOCOL-CURRENT C.3); `undefined`
   * until it does. Kept when the agent is registered again.
   */
  readonly metadata?: AgentMetadata | undefined
}

/**
 * A scope of an API key (PROTOCOL-CURRENT C.9.1).
 *
 * @since 0.2.0
 * @category models
 */
export type Scope = ApiKeyScope

/**
 * Every {@link Scope} (PROTOCOL-CURRENT C.9.1).
 *
 * @since 0.2.0
 * @category constants
 */
export const scopes: ReadonlyArray<Scope> = apiKeyScopes

/**
 * A scoped API key (PROTOCOL-CURRENT C.9.2). Only the SHA-256 of its token
 * is kept; the token itself is shown once, on create and rotate.
 *
 * @since 0.2.0
 * @category models
 */
export interface ApiKeyRecord {
  /** A UUID, the `<key id>` of the token. */
  readonly id: string
  readonly name: string
  /** Sorted, without duplicates. */
  readonly scopes: ReadonlyArray<Scope>
  readonly createdAtMs: number
  readonly revokedAtMs: number | undefined
  /** Lowercase hex SHA-256 of the whole token. */
  readonly tokenHash: string
}

/**
 * An API key with its token, as create and rotate answer it.
 *
 * @since 0.2.0
 * @category models
 */
export interface IssuedApiKey {
  readonly key: ApiKeyRecord
  /** `rbk_<key id>.<43 characters of unpadded base64url>`. */
  readonly token: string
}

/**
 * An execution. Raw JSON members are stored compacted (PROTOCOL 2.8).
 *
 * @since 0.1.0
 * @category models
 */
export interface ExecutionRecord {
  readonly id: string
  readonly agentId: string
  readonly agentVersion: string | undefined
  readonly inputRaw: string | undefined
  readonly status: ExecutionStatus
  readonly outputRaw: string | undefined
  /** `""` when none. */
  readonly failureReason: string
  readonly createdAtMs: number
  readonly updatedAtMs: number
  readonly deadlineAtMs: number | undefined
  /** The session label (PROTOCOL-CURRENT C.4); absent when none. */
  readonly session?: string | undefined
  /** The explicit parent, or the session head it started after (C.4.3). */
  readonly parentExecutionId?: string | undefined
  /** The idempotency key of its create (C.4.1); absent when none. */
  readonly idempotencyKey?: string | undefined
  /** The parent step that created it as a subagent (C.5.1). */
  readonly spawnedBy?: SpawnedBy | undefined
  /** The execution it was forked from (PROTOCOL-CURRENT C.7.2); absent when not a fork. */
  readonly forkedFrom?: string | undefined
  /** The source seq it was forked at (C.7.1 `at_seq`); absent when not a fork. */
  readonly forkSeq?: number | undefined
}

/**
 * The parent execution and step a subagent was created by (PROTOCOL-CURRENT C.5.1).
 *
 * @since 0.2.0
 * @category models
 */
export interface SpawnedBy {
  readonly executionId: string
  readonly stepId: string
}

/**
 * A recorded step (PROTOCOL 11.12).
 *
 * @since 0.1.0
 * @category models
 */
export interface StepRecord {
  readonly stepId: string
  readonly executionId: string
  readonly kind: string
  readonly target: string
  readonly argsHash: string
  readonly occurrence: number
  readonly status: StepStatus
  readonly idempotency: string
  readonly argsRaw: string | undefined
  readonly resultRaw: string | undefined
  readonly errorRaw: string | undefined
  readonly startedAtMs?: number | undefined
  readonly completedAtMs?: number | undefined
}

/**
 * An approval (PROTOCOL 9, 11.12).
 *
 * @since 0.1.0
 * @category models
 */
export interface ApprovalRecord {
  readonly id: string
  readonly stepId: string
  readonly executionId: string
  readonly status: ApprovalStatus
  /** `null` when the rule set none; `[]` stays `[]`. */
  readonly approvers: ReadonlyArray<string> | null
  readonly message: string
  readonly timeoutAtMs: number
  /** `""` when not decided. */
  readonly decidedBy: string
  readonly decidedAtMs?: number | undefined
  /** `""` when none. */
  readonly rationale: string
  readonly createdAtMs: number
}

/**
 * One event of an execution's log. `payload` is JSON text with sorted keys.
 *
 * @since 0.1.0
 * @category models
 */
export interface EventRecord {
  readonly executionId: string
  readonly seq: number
  readonly type: string
  readonly payload: string
  readonly occurredAtMs: number
}

/**
 * Read access to an execution's event log, which only grows.
 *
 * @since 0.1.0
 * @category models
 */
export interface EventLogView {
  /** The number of events so far (the last one's `seq`). */
  readonly length: number
  /** The events with index in `[from, to)`, i.e. seq `from + 1` to `to`. */
  readonly slice: (from: number, to?: number) => Array<EventRecord>
}

/**
 * A snapshot of a dispatch (PROTOCOL 5.1).
 *
 * @since 0.1.0
 * @category models
 */
export interface DispatchRecord {
  readonly id: string
  readonly executionId: string
  readonly status: DispatchStatus
  readonly attempt: number
  readonly maxAttempts: number
  readonly nextAttemptAtMs: number
  readonly lockedAtMs: number | undefined
}

/**
 * @since 0.1.0
 * @category models
 */
export type DecisionValue = DecisionKind

/**
 * A registered resource a starting step touched (PROTOCOL-CURRENT C.6.4): its
 * new generation, and whether the step's body should capture it afterwards
 * (`due`, only for a resource the step declared).
 *
 * @since 0.2.0
 * @category models
 */
export interface ResourceTouch {
  readonly key: string
  readonly generation: number
  readonly due: boolean
}

/**
 * A step decision (PROTOCOL 7.1). Optional members are absent when empty;
 * `resultRaw`/`errorRaw` are present exactly when a value is stored.
 *
 * @since 0.1.0
 * @category models
 */
export interface Decision {
  readonly decision: DecisionValue
  readonly stepId?: string
  readonly resultRaw?: string
  readonly errorRaw?: string
  readonly approvalId?: string
  readonly reason?: string
  /** PROTOCOL-CURRENT C.8.4: the deciding rule of a `denied` answer (current stage only). */
  readonly ruleId?: string
  /** PROTOCOL-CURRENT C.6.4: the resources a `proceed` touched; absent when none. */
  readonly resources?: ReadonlyArray<ResourceTouch>
}

// ---------------------------------------------------------------------------
// Resources and forks (PROTOCOL-CURRENT C.6, C.7)
// ---------------------------------------------------------------------------

/**
 * A resource registered on an execution (PROTOCOL-CURRENT C.6.1), as the
 * register route answers it. Raw JSON members are stored compacted.
 *
 * @since 0.2.0
 * @category models
 */
export interface ResourceRecord {
  /** `^[A-Za-z0-9_.-]{1,128}$`. */
  readonly key: string
  readonly driverId: string
  /** Raw JSON of the driver's configuration; `undefined` when none (absent or `null`). */
  readonly configurationRaw: string | undefined
  readonly coverageReuse: boolean
  /** Capture after every N affecting steps; `0` = checkpointing off. */
  readonly everySteps: number
  readonly onCompletion: boolean
  /** Seq of its `resource.registered` (or, in a fork, `resource.initialized`) event. */
  readonly registeredSeq: number
  /** Version counter; a capture must name the current one. */
  readonly generation: number
  /** Settled affecting steps (C.6.5). */
  readonly count: number
  /** Raw JSON of its binding (C.6.3); `undefined` until bound. */
  readonly bindingRaw: string | undefined
  /** The checkpoint a fork starts from; `undefined` = the initial environment. */
  readonly checkpointRef: string | undefined
  /** A checkpoint that is not invalidated exists for the current generation. */
  readonly covered: boolean
}

/**
 * What an agent registers (PROTOCOL-CURRENT C.6.2).
 *
 * @since 0.2.0
 * @category models
 */
export interface ResourceRegistration {
  readonly key: string
  readonly driverId: string
  /** Raw JSON; `undefined` or `null` = none. */
  readonly configurationRaw?: string | undefined
  readonly coverageReuse?: boolean | undefined
  /** `0` (default) disables checkpointing; negative is a `400`. */
  readonly everySteps?: number | undefined
  /** Default: `true` with a positive `everySteps`, else `false`. */
  readonly onCompletion?: boolean | undefined
}

/**
 * A capture an agent reports (PROTOCOL-CURRENT C.6.5).
 *
 * @since 0.2.0
 * @category models
 */
export interface Capture {
  readonly key: string
  readonly generation: number
  readonly checkpointRef: string
}

/**
 * A capture that failed on the agent's side (PROTOCOL-CURRENT C.6.5).
 *
 * @since 0.2.0
 * @category models
 */
export interface CaptureFailure {
  readonly key: string
  readonly generation: number
  readonly error: string
}

/**
 * The captures reported with a step outcome or on
 * `POST …/resources/checkpoints` (PROTOCOL-CURRENT C.6.5, C.6.6).
 *
 * @since 0.2.0
 * @category models
 */
export interface CaptureRecords {
  readonly captures?: ReadonlyArray<Capture> | undefined
  readonly captureFailures?: ReadonlyArray<CaptureFailure> | undefined
}

/**
 * A stored checkpoint (PROTOCOL-CURRENT C.6.7): it covers the seqs
 * `coveredSeq ≤ seq < invalidatedSeq` (open-ended while `invalidatedSeq` is
 * `undefined`).
 *
 * @since 0.2.0
 * @category models
 */
export interface CheckpointRecord {
  readonly key: string
  readonly generation: number
  readonly checkpointRef: string
  readonly coveredSeq: number
  readonly invalidatedSeq: number | undefined
}

/**
 * What `GET …/fork-points` answers (PROTOCOL-CURRENT C.7.3).
 *
 * @since 0.2.0
 * @category models
 */
export interface ForkPoints {
  readonly latestSeq: number
  /** Each resource with its `registeredSeq`, in registration order. */
  readonly resources: ReadonlyArray<{ readonly key: string; readonly registeredSeq: number }>
  /** Every checkpoint, oldest first. */
  readonly checkpoints: ReadonlyArray<CheckpointRecord>
}

/**
 * Where a fork's resource starts from (PROTOCOL-CURRENT C.7.2 step 4): the
 * newest checkpoint covering the fork point, else the newest earlier one
 * (`covered: false`), else none (the initial environment).
 *
 * @since 0.2.0
 * @category models
 */
export interface Restoration {
  readonly key: string
  readonly checkpointRef: string | undefined
  /** The selected checkpoint's `coveredSeq` in the source's log. */
  readonly checkpointSeq: number | undefined
  /** Whether a checkpoint covers the fork point. */
  readonly covered: boolean
}

/**
 * A replacement for a copied step's recorded outcome in a fork (test kit
 * "what if" tests; never on the wire): the step replays `result` (as
 * `succeeded`) or `error` (as `failed`) instead of what the source recorded.
 * Values must be JSON.
 *
 * @since 0.2.0
 * @category models
 */
export type StepOverride = { readonly result: unknown } | { readonly error: unknown }

/**
 * A fork request (PROTOCOL-CURRENT C.7.1), plus the programmatic hooks.
 *
 * @since 0.2.0
 * @category models
 */
export interface ForkRequest {
  /** The source seq to fork at, `1..latest`. */
  readonly atSeq: number
  /** A session label for the fork (it must have no executions yet). */
  readonly session?: string | undefined
  /** YAML policy bundle the fork runs under (current-stage language). */
  readonly policyBundle?: string | undefined
  /**
   * Whether the caller holds `policies:write` (C.7.1: a `policyBundle`
   * needs it). Default `true`: in-process callers have full access.
   */
  readonly mayWritePolicies?: boolean | undefined
  /**
   * Replace the recorded outcome of copied steps, by **source** step id
   * (programmatic only). A step id that is not copied is a `400`.
   */
  readonly overrides?: Readonly<Record<string, StepOverride>> | undefined
  /** Test hook: create the fork with this canonical id (`409 conflict` when taken). */
  readonly id?: string | undefined
}

/**
 * What a fork answers (PROTOCOL-CURRENT C.7.1): the new execution and, when
 * the source had resources registered at or before the fork point, where
 * each starts from (sorted by key).
 *
 * @since 0.2.0
 * @category models
 */
export interface ForkResult {
  readonly execution: ExecutionRecord
  readonly restoration: ReadonlyArray<Restoration> | undefined
}

/**
 * The lease a run presents (PROTOCOL 5.6). `dispatchId` is canonical lowercase.
 *
 * @since 0.1.0
 * @category models
 */
export interface Lease {
  readonly dispatchId: string
  /** `undefined` only in v0.14.0 compat mode. */
  readonly attempt: number | undefined
}

/**
 * A claimed dispatch, ready to be delivered.
 *
 * @since 0.1.0
 * @category models
 */
export interface Claim {
  readonly dispatchId: string
  readonly executionId: string
  readonly attempt: number
  readonly agent: AgentRecord
  readonly leaseTimeoutSeconds: number
}

/**
 * A live delta (PROTOCOL 6.6); never stored.
 *
 * @since 0.1.0
 * @category models
 */
export interface Delta {
  readonly stepId: string
  readonly seq: number
  readonly data: string
}

/**
 * A page of executions (PROTOCOL 11.3).
 *
 * @since 0.1.0
 * @category models
 */
export interface ExecutionPage {
  readonly executions: ReadonlyArray<ExecutionRecord>
  readonly nextCursor: string | undefined
}

// ---------------------------------------------------------------------------
// Failures and terminal states
// ---------------------------------------------------------------------------

/**
 * `404 not_found` (`"not found"`).
 *
 * @since 0.1.0
 * @internal
 */
export const notFound = (): KernelFailure => new KernelFailure({ status: 404, code: "not_found", message: "not found" })

/**
 * `409 lease_superseded`: the lease presented is not the dispatch's current one (5.6).
 *
 * @since 0.1.0
 * @internal
 */
export const leaseSuperseded = (): KernelFailure =>
  new KernelFailure({ status: 409, code: "lease_superseded", message: "dispatch lease superseded" })

/**
 * `409 execution_terminal`: the execution has finished.
 *
 * @since 0.1.0
 * @internal
 */
export const executionTerminal = (): KernelFailure =>
  new KernelFailure({ status: 409, code: "execution_terminal", message: "execution terminal" })

/**
 * `403 forbidden`: a scope the principal lacks, another agent's execution or
 * metadata (PROTOCOL-CURRENT C.9).
 *
 * @since 0.2.0
 * @internal
 */
export const forbidden = (): KernelFailure =>
  new KernelFailure({ status: 403, code: "forbidden", message: "forbidden" })

/**
 * `409 conflict`: an id already taken, an approval already decided.
 *
 * @since 0.1.0
 * @internal
 */
export const conflict = (): KernelFailure => new KernelFailure({ status: 409, code: "conflict", message: "conflict" })

/**
 * `400 validation_error` with the given message.
 *
 * @since 0.1.0
 * @internal
 */
export const validation = (message: string): KernelFailure =>
  new KernelFailure({ status: 400, code: "validation_error", message })

/**
 * Whether an execution has finished: `completed`, `failed` or `cancelled`.
 *
 * @since 0.1.0
 * @internal
 */
export const isTerminalExecution = (status: ExecutionStatus): boolean =>
  status === "completed" || status === "failed" || status === "cancelled"

/**
 * Whether a step is settled: `succeeded`, `failed`, `denied` or `cancelled`.
 *
 * @since 0.1.0
 * @internal
 */
export const isTerminalStep = (status: StepStatus): boolean =>
  status === "succeeded" || status === "failed" || status === "denied" || status === "cancelled"
