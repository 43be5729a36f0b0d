/**
 * The in-memory state machine of the embedded Rebuno kernel: agents, executions,
 * dispatches (attempts, leases with RENEW/CHECK fencing, reclaim, backoff,
 * exhaustion), steps with per-dispatch occurrence counters, approvals, the
 * per-execution event log and live-delta fan-out. Every operation is an `Effect`
 * that reads Effect's `Clock` once and then runs synchronously, so each one is
 * atomic with respect to every other (PROTOCOL 7.3 step 3). The HTTP routes, the
 * dispatcher and the test kit sit on top of this module; JSON encoding of records
 * lives in `Wire`.
 *
 * @since 0.1.0
 */
import type { ApprovalStatus, DecisionKind, ExecutionStatus, StepStatus } from "../Protocol.js"
import { Clock, Data, Effect, Either, Queue } from "effect"
import type { Scope } from "effect"
import { compact } from "../internal/json.js"
import { uuidv7 } from "../internal/uuid.js"
import { formatTimestamp } from "../internal/time.js"
import * as StepId from "../StepId.js"
import * as Policy from "./Policy.js"
import * as RateLimiter from "./RateLimiter.js"
import { Counters } from "./internal/counters.js"
import { EventLog } from "./internal/eventLog.js"
import { flat } from "./internal/flat.js"
import * as Heap from "./internal/heap.js"
import { goQuote } from "./internal/goQuote.js"
import * as Payload from "./internal/payloads.js"

// ---------------------------------------------------------------------------
// Errors and settings
// ---------------------------------------------------------------------------

/**
 * A protocol-level failure of a kernel operation: the HTTP status, the error
 * `code` and the exact `message` of the error envelope (PROTOCOL 13.2).
 *
 * @since 0.1.0
 * @category errors
 */
export class KernelFailure extends Data.TaggedError("KernelFailure")<{
  readonly status: number
  readonly code: string
  readonly message: string
}> {}

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
  /** `"v0.14.0"` emulates a kernel without attempts and fencing (PROTOCOL 17.A). */
  readonly compat: "target" | "v0.14.0"
  /** Simulate rate-limiter errors (PROTOCOL 10.5, 16.4). */
  readonly limiterError: boolean
  /** Random source in `[0, 1)` for backoff jitter. */
  readonly random: () => number
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
  compat: "target",
  limiterError: false,
  random: Math.random
}

// ---------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------

/**
 * Execution, step and approval statuses are the wire's (shared with the SDK).
 *
 * @since 0.1.0
 * @category models
 */
export type { ApprovalStatus, ExecutionStatus, StepStatus } from "../Protocol.js"

/**
 * @since 0.1.0
 * @category models
 */
export type DispatchStatus = "pending" | "in_flight" | "failed" | "exhausted"

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

/**
 * The kernel core. Ids passed in are canonical lowercase (the routes parse them).
 * List limits are clamped here (PROTOCOL 11.3, 11.5), so callers pass the parsed
 * numbers (`0` or `NaN` for absent/unparseable).
 *
 * @since 0.1.0
 * @category models
 */
export interface KernelCore {
  /** The current settings. */
  readonly settings: Settings
  /** Replace some settings (test hooks: `limiterError`, `compat`, …). */
  readonly updateSettings: (patch: Partial<Settings>) => Effect.Effect<void>

  /**
   * Upsert an agent. A non-empty `policyBundle` is validated; an invalid one fails
   * with `400 validation_error` and the message
   * `agent "<id>": invalid policy bundle: <detail>` (the manifest wording, 4.2).
   */
  readonly registerAgent: (a: {
    readonly id: string
    readonly webhookUrl: string
    readonly secret: string
    readonly policyBundle?: string | undefined
    readonly leaseTimeoutSeconds?: number | undefined
  }) => Effect.Effect<AgentRecord, KernelFailure>
  readonly getAgent: (id: string) => Effect.Effect<AgentRecord, KernelFailure>
  /** Sorted by id (byte order). */
  readonly listAgents: () => Effect.Effect<ReadonlyArray<AgentRecord>>
  readonly deleteAgent: (id: string) => Effect.Effect<void>
  /** PROTOCOL 11.10: validation (400) before the agent lookup (404); `""` removes. */
  readonly loadPolicy: (agentId: string, bundle: string) => Effect.Effect<void, KernelFailure>

  /**
   * PROTOCOL 11.1. `id` (optional, test hook) creates the execution with a given
   * canonical id (`409 conflict` when taken).
   */
  readonly createExecution: (r: {
    readonly agentId: string
    readonly inputRaw: string | undefined
    readonly agentVersion: string | undefined
    readonly id?: string | undefined
  }) => Effect.Effect<ExecutionRecord, KernelFailure>
  readonly getExecution: (id: string) => Effect.Effect<ExecutionRecord, KernelFailure>
  readonly listExecutions: (q: {
    readonly agentId: string
    readonly status: string
    readonly cursor: string | undefined
    readonly limit: number
  }) => Effect.Effect<ExecutionPage>
  readonly cancelExecution: (id: string) => Effect.Effect<void, KernelFailure>
  /** Events with `seq > afterSeq`, ascending; empty for an unknown execution. */
  readonly listEvents: (id: string, afterSeq: number, limit: number) => Effect.Effect<ReadonlyArray<EventRecord>>
  /** The whole event log of an execution (test kit / observation; no paging). */
  readonly eventLog: (id: string) => Effect.Effect<ReadonlyArray<EventRecord>>
  /**
   * The event log itself, for in-process callers that keep a snapshot cheaply:
   * the log only grows, so its `length` now and a later `slice(0, length)` are
   * the events of this moment. `undefined` for an unknown execution.
   */
  readonly unsafeEventLog: (id: string) => EventLogView | undefined
  /** Sorted by `step_id`; empty for an unknown execution. */
  readonly listSteps: (id: string, terminalOnly: boolean) => Effect.Effect<ReadonlyArray<StepRecord>>
  /** `404` unless the step exists **and** belongs to execution `id` (16.3 #4). */
  readonly getStep: (id: string, stepId: string) => Effect.Effect<StepRecord, KernelFailure>
  /**
   * {@link getStep} as a plain lookup (`undefined` when unknown), for in-process
   * callers on a hot path. It is the step's current state, not a copy: read it
   * at once, do not keep it.
   */
  readonly unsafeGetStep: (id: string, stepId: string) => StepRecord | undefined

  /** Pending approvals only, oldest first (11.8). */
  readonly listApprovals: () => Effect.Effect<ReadonlyArray<ApprovalRecord>>
  readonly getApproval: (id: string) => Effect.Effect<ApprovalRecord, KernelFailure>
  readonly grantApproval: (
    id: string,
    d: { readonly decidedBy: string; readonly rationale: string }
  ) => Effect.Effect<void, KernelFailure>
  readonly denyApproval: (
    id: string,
    d: { readonly decidedBy: string; readonly rationale: string }
  ) => Effect.Effect<void, KernelFailure>

  /** PROTOCOL 7.3. `argsRaw` is the raw text of `args` (absent = `undefined`). */
  readonly submitStep: (
    executionId: string,
    lease: Lease,
    s: { readonly kind: string; readonly target: string; readonly argsRaw: string | undefined; readonly idempotency: string }
  ) => Effect.Effect<Decision, KernelFailure>
  readonly completeStep: (
    executionId: string,
    stepId: string,
    lease: Lease,
    resultRaw: string | undefined
  ) => Effect.Effect<Decision, KernelFailure>
  readonly failStep: (
    executionId: string,
    stepId: string,
    lease: Lease,
    errorRaw: string | undefined
  ) => Effect.Effect<Decision, KernelFailure>
  /**
   * {@link submitStep} as a plain function of the current time (epoch ms), for
   * in-process callers on a hot path (the test kit's direct client): the same
   * state change and answer, without an Effect around it.
   */
  readonly unsafeSubmitStep: (
    now: number,
    executionId: string,
    lease: Lease,
    s: { readonly kind: string; readonly target: string; readonly argsRaw: string | undefined; readonly idempotency: string }
  ) => Decision | KernelFailure
  /** {@link completeStep} (`succeeded`) or {@link failStep} (`failed`) as a plain function of the current time. */
  readonly unsafeSettleStep: (
    now: number,
    executionId: string,
    stepId: string,
    lease: Lease,
    outcome: "succeeded" | "failed",
    raw: string | undefined
  ) => Decision | KernelFailure
  readonly heartbeat: (executionId: string, lease: Lease) => Effect.Effect<void, KernelFailure>
  readonly completeExecution: (
    executionId: string,
    lease: Lease,
    outputRaw: string | undefined
  ) => Effect.Effect<void, KernelFailure>
  readonly failExecution: (executionId: string, lease: Lease, error: string) => Effect.Effect<void, KernelFailure>

  /** Fan a delta out to the execution's subscribers (drops when a buffer is full). */
  readonly publishDelta: (executionId: string, d: Delta) => Effect.Effect<void>
  /** A 64-delta dropping buffer, unsubscribed when the scope closes. */
  readonly subscribeDeltas: (executionId: string) => Effect.Effect<Queue.Dequeue<Delta>, never, Scope.Scope>

  /** 5.3 step 1: reclaim in-flight dispatches whose lease lapsed. Returns how many. */
  readonly reclaimStale: () => Effect.Effect<number>
  /** Test hook: reclaim every in-flight dispatch now, whatever its lease. */
  readonly expireLeases: () => Effect.Effect<number>
  /**
   * 5.3 step 2 plus the pre-delivery checks of 5.4 (terminal → `dispatch.discarded`;
   * attempt > max → `dispatch_exhausted`; missing agent → stays in flight). Only
   * deliverable claims are returned; `limit` bounds the dispatches claimed.
   */
  readonly claimDue: (limit: number) => Effect.Effect<ReadonlyArray<Claim>>
  /** 5.4 step 6, fenced on `(dispatch_id, attempt)` (not in compat mode). */
  readonly recordDelivery: (claim: Claim, ok: boolean) => Effect.Effect<void>
  /** 9.4 sweep; returns the number expired. */
  readonly expireApprovals: () => Effect.Effect<number>
  /** 11.1 deadline sweep; returns the number cancelled. */
  readonly cancelPastDeadline: () => Effect.Effect<number>
  /**
   * Completes once a dispatch has been enqueued since the last time it completed
   * (at most one wake-up is buffered), so the dispatcher can tick at once.
   */
  readonly enqueued: Effect.Effect<void>

  /** Snapshots of the dispatches (of one execution, or all). */
  readonly dispatches: (executionId?: string) => Effect.Effect<ReadonlyArray<DispatchRecord>>
}

// ---------------------------------------------------------------------------
// Failures
// ---------------------------------------------------------------------------

const notFound = (): KernelFailure => new KernelFailure({ status: 404, code: "not_found", message: "not found" })
const leaseSuperseded = (): KernelFailure =>
  new KernelFailure({ status: 409, code: "lease_superseded", message: "dispatch lease superseded" })
const executionTerminal = (): KernelFailure =>
  new KernelFailure({ status: 409, code: "execution_terminal", message: "execution terminal" })
const conflict = (): KernelFailure => new KernelFailure({ status: 409, code: "conflict", message: "conflict" })
const validation = (message: string): KernelFailure =>
  new KernelFailure({ status: 400, code: "validation_error", message })

// ---------------------------------------------------------------------------
// Internal state
// ---------------------------------------------------------------------------

interface DispatchState {
  readonly id: string
  readonly executionId: string
  status: DispatchStatus
  attempt: number
  readonly maxAttempts: number
  nextAttemptAtMs: number
  lockedAtMs: number | undefined
  /** The lease timeout group the dispatch is in while `in_flight`. */
  leaseTimeoutMs: number
  /** Occurrence counters (8.4) and the cursor in the execution's step order. */
  readonly counters: Counters
  /** Bumped whenever the dispatch is (re)scheduled or leaves the claimable set. */
  version: number
}

interface DueEntry {
  readonly at: number
  readonly seq: number
  readonly dispatch: DispatchState
  readonly version: number
}

interface ExecState {
  record: ExecutionRecord
  readonly events: EventLog
  readonly steps: Map<string, StepState>
  /** The steps in the order they were first submitted. */
  readonly order: Array<StepState>
  readonly dispatches: Array<DispatchState>
  /** Approval ids, oldest first. */
  readonly approvals: Array<string>
  /** Counter keys of steps failed with reason `indeterminate` (7.3 step 10). */
  indeterminate: Set<string> | undefined
}

const isTerminalExecution = (status: ExecutionStatus): boolean =>
  status === "completed" || status === "failed" || status === "cancelled"

const isTerminalStep = (status: StepStatus): boolean =>
  status === "succeeded" || status === "failed" || status === "denied" || status === "cancelled"

/**
 * A step as the core keeps it: one object for the step's whole life, updated in
 * place. Readers get {@link StepState.snapshot}s, which do not change.
 */
class StepState {
  constructor(
    readonly stepId: string,
    readonly executionId: string,
    readonly kind: string,
    readonly target: string,
    readonly argsHash: string,
    readonly occurrence: number,
    readonly idempotency: string,
    /** Stored compacted (2.8). */
    readonly argsRaw: string | undefined,
    /** The text as first submitted (the same string when already compact). */
    readonly submittedArgsRaw: string | undefined,
    /** Index in the execution's step order. */
    readonly position: number
  ) {}
  status: StepStatus = "proposed"
  resultRaw: string | undefined = undefined
  errorRaw: string | undefined = undefined
  startedAtMs: number | undefined = undefined
  completedAtMs: number | undefined = undefined

  /** Its status and outcome from now on. */
  set(
    status: StepStatus,
    resultRaw: string | undefined,
    errorRaw: string | undefined,
    startedAtMs: number | undefined,
    completedAtMs: number | undefined
  ): void {
    this.status = status
    this.resultRaw = resultRaw
    this.errorRaw = errorRaw
    this.startedAtMs = startedAtMs
    this.completedAtMs = completedAtMs
  }

  snapshot(): StepRecord {
    return {
      stepId: this.stepId,
      executionId: this.executionId,
      kind: this.kind,
      target: this.target,
      argsHash: this.argsHash,
      occurrence: this.occurrence,
      status: this.status,
      idempotency: this.idempotency,
      argsRaw: this.argsRaw,
      resultRaw: this.resultRaw,
      errorRaw: this.errorRaw,
      startedAtMs: this.startedAtMs,
      completedAtMs: this.completedAtMs
    }
  }
}

const counterKey = (kind: string, target: string, argsHash: string): string =>
  flat(kind.length + ":" + kind + target.length + ":" + target + argsHash)

/**
 * Characters whose absence makes valid JSON text its own compact form: no
 * whitespace to drop, nothing to HTML-escape, no escape sequence to re-encode.
 * SDK bodies (`JSON.stringify` of plain data) usually pass, which skips a parse.
 */
const mayChangeWhenCompacted = /[\s<>&\\\u2028\u2029\ud800-\udfff]/

const compactRaw = (raw: string | undefined): string | undefined =>
  raw === undefined ? undefined : flat(mayChangeWhenCompacted.test(raw) ? (compact(raw) ?? raw) : raw)

/** Whether a stored error JSON has the top-level string member `"reason":"indeterminate"`. */
const isIndeterminateError = (raw: string | undefined): boolean => {
  if (raw === undefined || !raw.includes("indeterminate")) return false
  try {
    const value: unknown = JSON.parse(raw)
    return typeof value === "object" && value !== null && !Array.isArray(value) &&
      (value as { readonly reason?: unknown }).reason === "indeterminate"
  } catch {
    return false
  }
}

/** The `reason` of a stored denial error, or `policy_denied` (7.4). */
const deniedReason = (raw: string | undefined): string => {
  if (raw !== undefined) {
    try {
      const value: unknown = JSON.parse(raw)
      if (typeof value === "object" && value !== null && !Array.isArray(value)) {
        const reason = (value as { readonly reason?: unknown }).reason
        if (typeof reason === "string" && reason !== "") return reason
      }
    } catch {
      // fall through
    }
  }
  return "policy_denied"
}

const utf8 = new TextEncoder()
const compareBytes = (a: string, b: string): number => {
  const x = utf8.encode(a)
  const y = utf8.encode(b)
  const n = Math.min(x.length, y.length)
  for (let i = 0; i < n; i++) {
    if (x[i] !== y[i]) return x[i]! - y[i]!
  }
  return x.length - y.length
}

const indeterminateRetry: Policy.PolicyResult = {
  decision: "deny",
  ruleId: "__indeterminate_retry",
  reason: "prior attempt outcome unknown; retry refused",
  approval: undefined,
  rateLimit: undefined
}

const agentLookupFailed: Policy.PolicyResult = {
  decision: "deny",
  ruleId: "bundle-error",
  reason: "agent_lookup_failed",
  approval: undefined,
  rateLimit: undefined
}

const EXECUTION_TERMINAL: Decision = { decision: "execution_terminal" }
const EXECUTION_BLOCKED: Decision = { decision: "execution_blocked" }
const RECORDED: Decision = { decision: "recorded" }
const REPLAY_EMPTY: Decision = { decision: "replay" }
const RATE_LIMITED: Decision = { decision: "rate_limited", reason: "rate_limit_exceeded" }
const LIMITER_UNAVAILABLE: Decision = { decision: "rate_limited", reason: "rate_limiter_unavailable" }

const snapshotDispatch = (d: DispatchState): DispatchRecord => ({
  id: d.id,
  executionId: d.executionId,
  status: d.status,
  attempt: d.attempt,
  maxAttempts: d.maxAttempts,
  nextAttemptAtMs: d.nextAttemptAtMs,
  lockedAtMs: d.lockedAtMs
})

/** Lower bound: first index whose id is ≥ `id`. */
const lowerBound = (ids: ReadonlyArray<string>, id: string): number => {
  let lo = 0
  let hi = ids.length
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if (ids[mid]! < id) lo = mid + 1
    else hi = mid
  }
  return lo
}

const clampLimit = (limit: number, fallback: number, max: number): number =>
  !Number.isFinite(limit) || limit <= 0 ? fallback : limit > max ? max : Math.floor(limit)

/** Backoff before the next attempt after attempt `n` failed (5.4). */
const backoffMs = (n: number, random: () => number): number => {
  const base = Math.min(2 ** (n - 1) * 1000, 30_000)
  return base + Math.floor(random() * 0.25 * base)
}

// ---------------------------------------------------------------------------
// make
// ---------------------------------------------------------------------------

/**
 * Create an empty kernel core.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (options?: Partial<Settings>): Effect.Effect<KernelCore> =>
  Effect.map(Queue.dropping<void>(1), (signal) => makeWith(options, signal))

const makeWith = (options: Partial<Settings> | undefined, signal: Queue.Queue<void>): KernelCore => {
  let settings: Settings = { ...defaultSettings, ...options }

  const agents = new Map<string, AgentRecord>()
  const executions = new Map<string, ExecState>()
  /** Execution ids ascending (UUIDv7 ⇒ creation order), for listing only. */
  const executionIds: Array<string> = []
  const dispatchesById = new Map<string, DispatchState>()
  const due = Heap.make<DueEntry>((a, b) => a.at < b.at || (a.at === b.at && a.seq < b.seq))
  let dueSeq = 0
  /** In-flight dispatches grouped by lease timeout; each group ordered by `lockedAtMs`. */
  const inFlight = new Map<number, Map<string, DispatchState>>()
  const approvals = new Map<string, ApprovalRecord>()
  /** Pending approval ids, oldest first. */
  const pendingApprovals = new Set<string>()
  const pendingApprovalByStep = new Map<string, string>()
  /** Non-terminal executions with a deadline. */
  const deadlines = new Map<string, ExecState>()
  const subscribers = new Map<string, Set<Queue.Queue<Delta>>>()
  const limiter = RateLimiter.make()

  const compatMode = (): boolean => settings.compat === "v0.14.0"

  // -- effect plumbing ------------------------------------------------------

  const atomic = <A>(f: (now: number) => A | KernelFailure): Effect.Effect<A, KernelFailure> =>
    Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const result = f(now)
      return result instanceof KernelFailure ? Effect.fail(result) : Effect.succeed(result)
    })

  const atomicTotal = <A>(f: (now: number) => A): Effect.Effect<A> => Effect.map(Clock.currentTimeMillis, f)

  const read = <A>(f: () => A | KernelFailure): Effect.Effect<A, KernelFailure> =>
    Effect.suspend(() => {
      const result = f()
      return result instanceof KernelFailure ? Effect.fail(result) : Effect.succeed(result)
    })

  // -- events ---------------------------------------------------------------

  const emit = (ex: ExecState, type: string, payload: string, now: number): void => {
    ex.events.push(type, payload, now)
  }

  /** A step event: its payload is rendered when first read (most are never read). */
  const emitStep = (
    ex: ExecState,
    type: string,
    now: number,
    step: StepState,
    options?: Payload.StepPayloadOptions
  ): void => {
    ex.events.pushStep(type, now, step, options)
  }

  // -- dispatches -----------------------------------------------------------

  const schedule = (d: DispatchState): void => {
    d.version++
    due.push({ at: d.nextAttemptAtMs, seq: dueSeq++, dispatch: d, version: d.version })
  }

  const addInFlight = (d: DispatchState): void => {
    let group = inFlight.get(d.leaseTimeoutMs)
    if (group === undefined) {
      group = new Map()
      inFlight.set(d.leaseTimeoutMs, group)
    }
    group.set(d.id, d)
  }

  const removeInFlight = (d: DispatchState): void => {
    inFlight.get(d.leaseTimeoutMs)?.delete(d.id)
  }

  const renew = (d: DispatchState, now: number): void => {
    // Renewed already at this instant: every later entry of its group was locked at `now` too.
    if (d.lockedAtMs === now) return
    d.lockedAtMs = now
    const group = inFlight.get(d.leaseTimeoutMs)
    if (group !== undefined) {
      // Re-insert so each group stays ordered by lockedAtMs.
      group.delete(d.id)
      group.set(d.id, d)
    }
  }

  /** v0.14.0: submit and heartbeat touch every in-flight dispatch of the execution. */
  const touchAll = (ex: ExecState, now: number): void => {
    for (const d of ex.dispatches) if (d.status === "in_flight") renew(d, now)
  }

  const enqueueDispatch = (ex: ExecState, now: number): void => {
    const d: DispatchState = {
      id: uuidv7(now),
      executionId: ex.record.id,
      status: "pending",
      attempt: 0,
      maxAttempts: settings.maxAttempts,
      nextAttemptAtMs: now,
      lockedAtMs: undefined,
      leaseTimeoutMs: settings.leaseTimeoutMs,
      counters: new Counters(),
      version: 0
    }
    dispatchesById.set(d.id, d)
    ex.dispatches.push(d)
    schedule(d)
    emit(ex, "dispatch.queued", Payload.dispatchPayload(0, d.id, ex.record.id, "pending"), now)
    signal.unsafeOffer(undefined)
  }

  const exhaust = (d: DispatchState): void => {
    if (d.status === "in_flight") removeInFlight(d)
    d.status = "exhausted"
    d.lockedAtMs = undefined
    d.version++
    // A v0.14.0 kernel keeps counting on a retired dispatch (17.A); keep its counters there.
    if (!compatMode()) d.counters.clear()
  }

  const release = (ex: ExecState): void => {
    for (const d of ex.dispatches) if (d.status !== "exhausted") exhaust(d)
  }

  /** RENEW (5.6): exists, belongs, same attempt, in flight → `locked_at = now`. */
  const renewLease = (executionId: string, lease: Lease, now: number): DispatchState | undefined => {
    const d = dispatchesById.get(lease.dispatchId)
    if (
      d === undefined || d.executionId !== executionId || d.attempt !== lease.attempt || d.status !== "in_flight"
    ) return undefined
    renew(d, now)
    return d
  }

  /** CHECK (5.6): exists, belongs, same attempt. */
  const checkLease = (executionId: string, lease: Lease): boolean => {
    const d = dispatchesById.get(lease.dispatchId)
    return d !== undefined && d.executionId === executionId && d.attempt === lease.attempt
  }

  // -- executions -----------------------------------------------------------

  const setStatus = (
    ex: ExecState,
    status: ExecutionStatus,
    now: number,
    outputRaw: string | undefined = ex.record.outputRaw,
    failureReason: string = ex.record.failureReason
  ): void => {
    const r = ex.record
    ex.record = {
      id: r.id,
      agentId: r.agentId,
      agentVersion: r.agentVersion,
      inputRaw: r.inputRaw,
      status,
      outputRaw,
      failureReason,
      createdAtMs: r.createdAtMs,
      updatedAtMs: now,
      deadlineAtMs: r.deadlineAtMs
    }
    if (isTerminalExecution(status)) deadlines.delete(ex.record.id)
  }

  const failInternal = (ex: ExecState, reason: string, now: number): void => {
    emit(ex, "execution.failed", Payload.executionPayload(ex.record.id, "failed", { reason }), now)
    setStatus(ex, "failed", now, ex.record.outputRaw, reason)
    release(ex)
  }

  const cancelInternal = (ex: ExecState, now: number): void => {
    const executionId = ex.record.id
    emit(
      ex,
      "execution.cancelled",
      Payload.executionPayload(executionId, "cancelled", { reason: "client_cancelled" }),
      now
    )
    setStatus(ex, "cancelled", now, ex.record.outputRaw, "client_cancelled")
    release(ex)
    const cancelledError = Payload.reasonError("execution_cancelled")
    for (const approvalId of ex.approvals) {
      const approval = approvals.get(approvalId)!
      if (approval.status !== "pending") continue
      const step = ex.steps.get(approval.stepId)!
      emit(
        ex,
        "approval.expired",
        Payload.approvalPayload(approval.id, executionId, approval.stepId, "expired", {
          rationale: "execution_cancelled",
          keepRationale: true
        }),
        now
      )
      emitStep(ex, "step.denied", now, step, { error: cancelledError, omitEmptyTarget: true })
      settleApproval(approval, { status: "expired", decidedAtMs: now, rationale: "execution_cancelled" })
      step.set("denied", step.resultRaw, cancelledError, step.startedAtMs, now)
    }
    for (const step of ex.steps.values()) {
      if (step.status !== "executing") continue
      emitStep(ex, "step.cancelled", now, step, { error: cancelledError })
      step.set("cancelled", step.resultRaw, cancelledError, step.startedAtMs, now)
    }
  }

  // -- approvals ------------------------------------------------------------

  const settleApproval = (
    approval: ApprovalRecord,
    patch: {
      readonly status: ApprovalStatus
      readonly decidedAtMs: number
      readonly rationale: string
      readonly decidedBy?: string
    }
  ): void => {
    approvals.set(approval.id, { ...approval, ...patch })
    pendingApprovals.delete(approval.id)
    if (pendingApprovalByStep.get(approval.stepId) === approval.id) pendingApprovalByStep.delete(approval.stepId)
  }

  /** Human denial or expiry: the step is denied, the execution resumes (9.3, 9.4). */
  const resumeDenied = (
    ex: ExecState,
    approval: ApprovalRecord,
    eventType: "approval.denied" | "approval.expired",
    decidedBy: string,
    rationale: string,
    stepReason: string,
    now: number
  ): void => {
    const step = ex.steps.get(approval.stepId)!
    const error = Payload.reasonError(stepReason)
    const status = eventType === "approval.denied" ? "denied" : "expired"
    emit(
      ex,
      eventType,
      Payload.approvalPayload(approval.id, ex.record.id, approval.stepId, status, {
        decidedBy,
        rationale,
        keepRationale: status === "expired"
      }),
      now
    )
    emitStep(ex, "step.denied", now, step, { error, omitEmptyTarget: true })
    settleApproval(
      approval,
      status === "denied" ? { status, decidedAtMs: now, rationale, decidedBy } : { status, decidedAtMs: now, rationale }
    )
    step.set("denied", step.resultRaw, error, step.startedAtMs, now)
    resume(ex, now)
  }

  const resume = (ex: ExecState, now: number): void => {
    // Only reachable for a terminal execution in v0.14.0 mode (a blocked execution
    // completed without a lease check); a finished execution is not revived.
    if (isTerminalExecution(ex.record.status)) return
    emit(ex, "execution.resumed", Payload.executionPayload(ex.record.id, "running"), now)
    setStatus(ex, "running", now)
    enqueueDispatch(ex, now)
  }

  const decide = (
    kind: "grant" | "deny",
    id: string,
    d: { readonly decidedBy: string; readonly rationale: string },
    now: number
  ): void | KernelFailure => {
    const approval = approvals.get(id)
    if (approval === undefined) return notFound()
    if (approval.status !== "pending") return conflict()
    if (approval.approvers !== null && approval.approvers.length > 0 && !approval.approvers.includes(d.decidedBy)) {
      return new KernelFailure({
        status: 403,
        code: "forbidden",
        message: "forbidden: " + goQuote(d.decidedBy) + " is not an approver for this approval"
      })
    }
    const ex = executions.get(approval.executionId)!
    if (kind === "deny") {
      resumeDenied(ex, approval, "approval.denied", d.decidedBy, d.rationale, d.rationale || "approval_denied", now)
      return
    }
    const step = ex.steps.get(approval.stepId)!
    emit(
      ex,
      "approval.granted",
      Payload.approvalPayload(approval.id, ex.record.id, approval.stepId, "granted", {
        decidedBy: d.decidedBy,
        rationale: d.rationale
      }),
      now
    )
    emitStep(ex, "step.allowed", now, step)
    settleApproval(approval, { status: "granted", decidedAtMs: now, rationale: d.rationale, decidedBy: d.decidedBy })
    step.set("allowed", step.resultRaw, step.errorRaw, step.startedAtMs, step.completedAtMs)
    resume(ex, now)
  }

  // -- steps ----------------------------------------------------------------

  const withStepId = (decision: DecisionValue, stepId: string): Decision => ({ decision, stepId })

  /** Record a new step, next in the execution's order. */
  const addStep = (ex: ExecState, d: DispatchState, step: StepState): void => {
    ex.steps.set(step.stepId, step)
    ex.order.push(step)
    d.counters.cursor = ex.order.length
  }

  /** 7.4: answer for an existing step. */
  const replayExisting = (ex: ExecState, step: StepState, idempotency: string, now: number): Decision => {
    switch (step.status) {
      case "succeeded":
        return step.resultRaw === undefined
          ? withStepId("replay", step.stepId)
          : { decision: "replay", stepId: step.stepId, resultRaw: step.resultRaw }
      case "failed":
        return step.errorRaw === undefined
          ? withStepId("replay", step.stepId)
          : { decision: "replay", stepId: step.stepId, errorRaw: step.errorRaw }
      case "awaiting_approval": {
        const approvalId = pendingApprovalByStep.get(step.stepId)
        return approvalId === undefined
          ? withStepId("blocked", step.stepId)
          : { decision: "blocked", stepId: step.stepId, approvalId }
      }
      case "allowed":
      case "proposed":
        step.set("executing", step.resultRaw, step.errorRaw, now, step.completedAtMs)
        emitStep(ex, "step.executing", now, step)
        return withStepId("proceed", step.stepId)
      case "executing":
        if (idempotency === "at_most_once") {
          step.set("failed", step.resultRaw, Payload.indeterminateError, step.startedAtMs, now)
          emitStep(ex, "step.failed", now, step, { error: Payload.indeterminateError })
          ;(ex.indeterminate ??= new Set()).add(counterKey(step.kind, step.target, step.argsHash))
          return { decision: "replay", stepId: step.stepId, errorRaw: Payload.indeterminateError }
        }
        return withStepId("proceed", step.stepId)
      case "denied":
        return { decision: "denied", stepId: step.stepId, reason: deniedReason(step.errorRaw) }
      default:
        return withStepId("proceed", step.stepId)
    }
  }

  const submit = (
    now: number,
    executionId: string,
    lease: Lease,
    s: { readonly kind: string; readonly target: string; readonly argsRaw: string | undefined; readonly idempotency: string }
  ): Decision | KernelFailure => {
    const idempotency = s.idempotency === "" ? "safe_to_retry" : s.idempotency
    const compat = compatMode()
    const ex = executions.get(executionId)
    if (compat && ex !== undefined) touchAll(ex, now)
    if (ex === undefined) return notFound()
    if (isTerminalExecution(ex.record.status)) return EXECUTION_TERMINAL
    let d: DispatchState | undefined
    if (compat) {
      d = dispatchesById.get(lease.dispatchId)
      if (d === undefined) return validation("validation error: unknown dispatch_id")
      if (d.executionId !== executionId) return validation("validation error: dispatch_id belongs to another execution")
    } else {
      d = renewLease(executionId, lease, now)
      if (d === undefined) return leaseSuperseded()
    }

    // A run that replays submits its recorded steps again, in order: when this
    // submission is the expected step's text again, that step's hash (and, at the
    // same occurrence, its id) is this one's, and nothing needs hashing.
    const expected = ex.order[d.counters.cursor]
    const same = expected !== undefined && expected.submittedArgsRaw === s.argsRaw && expected.kind === s.kind &&
      expected.target === s.target
    const argsHash = same ? expected.argsHash : StepId.argsHash(s.argsRaw)
    const counter = d.counters.counter(s.kind, s.target, argsHash)
    const occurrence = counter.last + 1
    const stepId = same && expected.occurrence === occurrence
      ? expected.stepId
      : StepId.make({ executionId, kind: s.kind, target: s.target, argsHash, occurrence })

    const existing = same && expected.stepId === stepId ? expected : ex.steps.get(stepId)
    if (existing !== undefined) {
      const decision = replayExisting(ex, existing, idempotency, now)
      counter.last = occurrence
      d.counters.cursor = existing.position + 1
      return decision
    }
    if (ex.record.status === "blocked") return EXECUTION_BLOCKED

    let result: Policy.PolicyResult
    if (idempotency === "at_most_once" && ex.indeterminate?.has(counterKey(s.kind, s.target, argsHash)) === true) {
      result = indeterminateRetry
    } else {
      const agent = agents.get(ex.record.agentId)
      result = agent === undefined ? agentLookupFailed : Policy.evaluate(agent.policy, {
        agentId: ex.record.agentId,
        kind: s.kind,
        target: s.target,
        argsRaw: s.argsRaw
      })
    }

    const limit = result.rateLimit
    if (limit !== undefined && limit.maxCalls > 0 && limit.windowMs > 0) {
      if (settings.limiterError) {
        if (limit.onLimiterError === "deny") return LIMITER_UNAVAILABLE
      } else if (
        !limiter.take(RateLimiter.bucketKey(result.ruleId, limit.perWhat, ex.record.agentId, executionId), limit, now)
      ) {
        return RATE_LIMITED
      }
    }

    const argsRaw = compactRaw(s.argsRaw)
    const created = new StepState(
      stepId,
      executionId,
      s.kind,
      s.target,
      argsHash,
      occurrence,
      idempotency,
      argsRaw,
      s.argsRaw,
      ex.order.length
    )
    let decision: Decision
    switch (result.decision) {
      case "allow": {
        created.set("executing", undefined, undefined, now, undefined)
        addStep(ex, d, created)
        emitStep(ex, "step.proposed", now, created)
        emitStep(ex, "step.allowed", now, created, { ruleId: result.ruleId })
        emitStep(ex, "step.executing", now, created)
        decision = withStepId("proceed", stepId)
        break
      }
      case "deny": {
        const error = Payload.denialError(result.reason || "policy_denied", result.ruleId)
        created.set("denied", undefined, error, undefined, now)
        addStep(ex, d, created)
        emitStep(ex, "step.proposed", now, created)
        emitStep(ex, "step.denied", now, created, { error, ruleId: result.ruleId, omitEmptyTarget: true })
        decision = result.reason === ""
          ? withStepId("denied", stepId)
          : { decision: "denied", stepId, reason: result.reason }
        break
      }
      case "require_approval": {
        const config = result.approval
        const timeoutMs = config !== undefined && config.timeoutMs > 0 ? config.timeoutMs : settings.approvalTimeoutMs
        const approval: ApprovalRecord = {
          id: uuidv7(now),
          stepId,
          executionId,
          status: "pending",
          approvers: config?.approvers ?? null,
          message: config?.message ?? "",
          timeoutAtMs: now + timeoutMs,
          decidedBy: "",
          rationale: "",
          createdAtMs: now
        }
        created.set("awaiting_approval", undefined, undefined, undefined, undefined)
        addStep(ex, d, created)
        approvals.set(approval.id, approval)
        pendingApprovals.add(approval.id)
        pendingApprovalByStep.set(stepId, approval.id)
        ex.approvals.push(approval.id)
        emitStep(ex, "step.proposed", now, created)
        emitStep(ex, "step.awaiting_approval", now, created, { ruleId: result.ruleId })
        emit(ex, "approval.requested", Payload.approvalPayload(approval.id, executionId, stepId, "pending"), now)
        emit(ex, "execution.blocked", Payload.executionPayload(executionId, "blocked"), now)
        setStatus(ex, "blocked", now)
        release(ex)
        decision = { decision: "blocked", stepId, approvalId: approval.id }
        break
      }
      default:
        return new KernelFailure({
          status: 500,
          code: "internal_error",
          message: "unknown policy decision: " + result.decision
        })
    }
    counter.last = occurrence
    return decision
  }

  const settleStep: KernelCore["unsafeSettleStep"] = (now, executionId, stepId, lease, outcome, raw) => {
    const ex = executions.get(executionId)
    const step = ex?.steps.get(stepId)
    if (ex === undefined || step === undefined) return notFound()
    if (isTerminalExecution(ex.record.status)) return EXECUTION_TERMINAL
    if (isTerminalStep(step.status)) {
      const stored = outcome === "succeeded" ? step.resultRaw : step.errorRaw
      if (stored === undefined) return REPLAY_EMPTY
      return outcome === "succeeded"
        ? { decision: "replay", resultRaw: stored }
        : { decision: "replay", errorRaw: stored }
    }
    if (!compatMode() && !checkLease(executionId, lease)) return leaseSuperseded()
    const value = compactRaw(raw)
    if (outcome === "succeeded") {
      step.set("succeeded", value, step.errorRaw, step.startedAtMs, now)
      emitStep(ex, "step.succeeded", now, step)
    } else {
      step.set("failed", step.resultRaw, value, step.startedAtMs, now)
      emitStep(ex, "step.failed", now, step, { error: value })
      if (isIndeterminateError(value)) {
        ;(ex.indeterminate ??= new Set()).add(counterKey(step.kind, step.target, step.argsHash))
      }
    }
    return RECORDED
  }

  const finish = (
    now: number,
    executionId: string,
    lease: Lease,
    outcome: { readonly _tag: "completed"; readonly outputRaw: string | undefined } | {
      readonly _tag: "failed"
      readonly reason: string
    }
  ): void | KernelFailure => {
    const ex = executions.get(executionId)
    if (ex === undefined) return notFound()
    if (isTerminalExecution(ex.record.status)) return executionTerminal()
    if (!compatMode() && renewLease(executionId, lease, now) === undefined) return leaseSuperseded()
    if (outcome._tag === "failed") {
      failInternal(ex, outcome.reason, now)
      return
    }
    const output = compactRaw(outcome.outputRaw)
    emit(ex, "execution.completed", Payload.executionPayload(executionId, "completed", { output }), now)
    setStatus(ex, "completed", now, output)
    release(ex)
  }

  // -- dispatcher -----------------------------------------------------------

  const reclaim = (d: DispatchState, now: number): void => {
    removeInFlight(d)
    d.status = "pending"
    d.lockedAtMs = undefined
    d.nextAttemptAtMs = now
    schedule(d)
  }

  const claimDue = (limit: number, now: number): ReadonlyArray<Claim> => {
    const claims: Array<Claim> = []
    let claimed = 0
    while (claimed < limit) {
      const top = due.peek()
      if (top === undefined) break
      const d = top.dispatch
      if (top.version !== d.version || (d.status !== "pending" && d.status !== "failed")) {
        due.pop()
        continue
      }
      if (top.at > now) break
      due.pop()
      claimed++
      const ex = executions.get(d.executionId)
      const agent = ex === undefined ? undefined : agents.get(ex.record.agentId)
      d.counters.clear()
      d.attempt += 1
      d.status = "in_flight"
      d.lockedAtMs = now
      d.version++
      d.leaseTimeoutMs = agent?.leaseTimeoutMs ?? settings.leaseTimeoutMs
      addInFlight(d)
      if (ex === undefined) continue
      if (isTerminalExecution(ex.record.status)) {
        emit(ex, "dispatch.discarded", Payload.dispatchPayload(d.attempt, d.id, d.executionId, "exhausted"), now)
        exhaust(d)
        continue
      }
      if (d.attempt > d.maxAttempts) {
        failInternal(ex, "dispatch_exhausted", now)
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

  const recordDelivery = (claim: Claim, ok: boolean, now: number): void => {
    const d = dispatchesById.get(claim.dispatchId)
    if (d === undefined) return
    const compat = compatMode()
    if (!compat && (d.status !== "in_flight" || d.attempt !== claim.attempt)) return
    const ex = executions.get(d.executionId)
    if (ex === undefined) return
    const n = claim.attempt
    if (ok) {
      emit(ex, "dispatch.acked", Payload.dispatchPayload(n, d.id, d.executionId, "acked"), now)
      return
    }
    emit(ex, "dispatch.failed", Payload.dispatchPayload(n, d.id, d.executionId, "failed"), now)
    if (n >= d.maxAttempts) {
      if (!isTerminalExecution(ex.record.status)) failInternal(ex, "dispatch_exhausted", now)
      return
    }
    if (d.status === "in_flight") removeInFlight(d)
    d.status = "failed"
    d.lockedAtMs = undefined
    d.nextAttemptAtMs = now + backoffMs(n, settings.random)
    schedule(d)
  }

  // -- the service ----------------------------------------------------------

  const core: KernelCore = {
    get settings() {
      return settings
    },
    updateSettings: (patch) =>
      Effect.sync(() => {
        settings = { ...settings, ...patch }
      }),

    registerAgent: (a) =>
      atomic((now) => {
        let policy: Policy.Bundle | undefined
        const bundle = a.policyBundle ?? ""
        if (bundle !== "") {
          const parsed = Policy.parseBundle(bundle)
          if (Either.isLeft(parsed)) {
            return validation("agent " + goQuote(a.id) + ": invalid policy bundle: " + parsed.left)
          }
          policy = parsed.right
        }
        const record: AgentRecord = {
          id: a.id,
          webhookUrl: a.webhookUrl,
          secret: a.secret,
          policyBundle: bundle,
          policy,
          registeredAtMs: now,
          leaseTimeoutMs: a.leaseTimeoutSeconds !== undefined && a.leaseTimeoutSeconds >= 10
            ? a.leaseTimeoutSeconds * 1000
            : undefined
        }
        agents.set(a.id, record)
        return record
      }),
    getAgent: (id) => read(() => agents.get(id) ?? notFound()),
    listAgents: () => Effect.sync(() => Array.from(agents.values()).sort((a, b) => compareBytes(a.id, b.id))),
    deleteAgent: (id) =>
      Effect.sync(() => {
        agents.delete(id)
      }),
    loadPolicy: (agentId, bundle) =>
      read(() => {
        let policy: Policy.Bundle | undefined
        if (bundle !== "") {
          const parsed = Policy.parseBundle(bundle)
          if (Either.isLeft(parsed)) {
            return validation("load policy bundle: validation error: invalid policy bundle: " + parsed.left)
          }
          policy = parsed.right
        }
        const agent = agents.get(agentId)
        if (agent === undefined) {
          return new KernelFailure({ status: 404, code: "not_found", message: "load policy bundle: not found" })
        }
        agents.set(agentId, { ...agent, policyBundle: bundle, policy })
      }),

    createExecution: (r) =>
      atomic((now) => {
        if (!agents.has(r.agentId)) return notFound()
        let id = r.id
        if (id !== undefined) {
          if (executions.has(id)) return conflict()
        } else {
          do id = uuidv7(now)
          while (executions.has(id))
        }
        const deadlineAtMs = settings.deadlineMs === undefined ? undefined : now + settings.deadlineMs
        const ex: ExecState = {
          record: {
            id,
            agentId: r.agentId,
            agentVersion: r.agentVersion,
            inputRaw: compactRaw(r.inputRaw),
            status: "pending",
            outputRaw: undefined,
            failureReason: "",
            createdAtMs: now,
            updatedAtMs: now,
            deadlineAtMs
          },
          events: new EventLog(id),
          steps: new Map(),
          order: [],
          dispatches: [],
          approvals: [],
          indeterminate: undefined
        }
        executions.set(id, ex)
        const at = lowerBound(executionIds, id)
        if (at === executionIds.length) executionIds.push(id)
        else executionIds.splice(at, 0, id)
        const deadlineAt = deadlineAtMs === undefined ? undefined : formatTimestamp(deadlineAtMs)
        emit(ex, "execution.created", Payload.executionPayload(id, "pending", { deadlineAt }), now)
        emit(ex, "execution.started", Payload.executionPayload(id, "running", { deadlineAt }), now)
        setStatus(ex, "running", now)
        if (deadlineAtMs !== undefined) deadlines.set(id, ex)
        enqueueDispatch(ex, now)
        return ex.record
      }),
    getExecution: (id) => read(() => executions.get(id)?.record ?? notFound()),
    listExecutions: (q) =>
      Effect.sync(() => {
        const limit = clampLimit(q.limit, 50, 200)
        let index = q.cursor === undefined ? executionIds.length : lowerBound(executionIds, q.cursor.toLowerCase())
        const page: Array<ExecutionRecord> = []
        let nextCursor: string | undefined
        while (--index >= 0) {
          const record = executions.get(executionIds[index]!)!.record
          if (q.agentId !== "" && record.agentId !== q.agentId) continue
          if (q.status !== "" && record.status !== q.status) continue
          if (page.length === limit) {
            nextCursor = page[page.length - 1]!.id
            break
          }
          page.push(record)
        }
        return { executions: page, nextCursor }
      }),
    cancelExecution: (id) =>
      atomic((now) => {
        const ex = executions.get(id)
        if (ex === undefined) return notFound()
        if (isTerminalExecution(ex.record.status)) return executionTerminal()
        cancelInternal(ex, now)
      }),
    listEvents: (id, afterSeq, limit) =>
      Effect.sync(() => {
        const ex = executions.get(id)
        if (ex === undefined) return []
        const from = Number.isFinite(afterSeq) && afterSeq > 0 ? Math.floor(afterSeq) : 0
        return ex.events.slice(from, from + clampLimit(limit, 100, 1000))
      }),
    eventLog: (id) => Effect.sync(() => executions.get(id)?.events.slice(0) ?? []),
    listSteps: (id, terminalOnly) =>
      Effect.sync(() => {
        const ex = executions.get(id)
        if (ex === undefined) return []
        const steps: Array<StepRecord> = []
        for (const step of ex.steps.values()) {
          if (!terminalOnly || isTerminalStep(step.status)) steps.push(step.snapshot())
        }
        return steps.sort((a, b) => (a.stepId < b.stepId ? -1 : a.stepId > b.stepId ? 1 : 0))
      }),
    getStep: (id, stepId) => read(() => executions.get(id)?.steps.get(stepId)?.snapshot() ?? notFound()),
    unsafeGetStep: (id, stepId) => executions.get(id)?.steps.get(stepId),
    unsafeEventLog: (id) => executions.get(id)?.events,

    listApprovals: () =>
      Effect.sync(() => {
        const pending: Array<ApprovalRecord> = []
        for (const id of pendingApprovals) pending.push(approvals.get(id)!)
        return pending.sort((a, b) => a.createdAtMs - b.createdAtMs)
      }),
    getApproval: (id) => read(() => approvals.get(id) ?? notFound()),
    grantApproval: (id, d) => atomic((now) => decide("grant", id, d, now)),
    denyApproval: (id, d) => atomic((now) => decide("deny", id, d, now)),

    submitStep: (executionId, lease, s) => atomic((now) => submit(now, executionId, lease, s)),
    unsafeSubmitStep: submit,
    unsafeSettleStep: settleStep,
    completeStep: (executionId, stepId, lease, resultRaw) =>
      atomic((now) => settleStep(now, executionId, stepId, lease, "succeeded", resultRaw)),
    failStep: (executionId, stepId, lease, errorRaw) =>
      atomic((now) => settleStep(now, executionId, stepId, lease, "failed", errorRaw)),
    heartbeat: (executionId, lease) =>
      atomic((now) => {
        if (compatMode()) {
          const ex = executions.get(executionId)
          if (ex !== undefined) touchAll(ex, now)
          return
        }
        if (renewLease(executionId, lease, now) === undefined) return leaseSuperseded()
      }),
    completeExecution: (executionId, lease, outputRaw) =>
      atomic((now) => finish(now, executionId, lease, { _tag: "completed", outputRaw })),
    failExecution: (executionId, lease, error) =>
      atomic((now) => finish(now, executionId, lease, { _tag: "failed", reason: error })),

    publishDelta: (executionId, d) =>
      Effect.sync(() => {
        const queues = subscribers.get(executionId)
        if (queues === undefined) return
        for (const queue of queues) queue.unsafeOffer(d)
      }),
    subscribeDeltas: (executionId) =>
      Effect.acquireRelease(
        Effect.flatMap(Queue.dropping<Delta>(64), (queue) =>
          Effect.sync(() => {
            let queues = subscribers.get(executionId)
            if (queues === undefined) {
              queues = new Set()
              subscribers.set(executionId, queues)
            }
            queues.add(queue)
            return queue
          })),
        (queue) =>
          Effect.suspend(() => {
            const queues = subscribers.get(executionId)
            if (queues !== undefined) {
              queues.delete(queue)
              if (queues.size === 0) subscribers.delete(executionId)
            }
            return Queue.shutdown(queue)
          })
      ),

    reclaimStale: () =>
      atomicTotal((now) => {
        let count = 0
        for (const [timeoutMs, group] of inFlight) {
          for (const d of group.values()) {
            if (d.lockedAtMs! >= now - timeoutMs) break
            reclaim(d, now)
            count++
          }
        }
        return count
      }),
    expireLeases: () =>
      atomicTotal((now) => {
        let count = 0
        for (const group of inFlight.values()) {
          for (const d of group.values()) {
            reclaim(d, now)
            count++
          }
        }
        return count
      }),
    claimDue: (limit) => atomicTotal((now) => claimDue(limit, now)),
    recordDelivery: (claim, ok) => atomicTotal((now) => recordDelivery(claim, ok, now)),
    expireApprovals: () =>
      atomicTotal((now) => {
        let count = 0
        for (const id of pendingApprovals) {
          const approval = approvals.get(id)!
          if (approval.timeoutAtMs > now) continue
          const ex = executions.get(approval.executionId)!
          resumeDenied(ex, approval, "approval.expired", "", "timeout", "approval_timeout", now)
          count++
        }
        return count
      }),
    cancelPastDeadline: () =>
      atomicTotal((now) => {
        let count = 0
        for (const ex of deadlines.values()) {
          if (isTerminalExecution(ex.record.status)) {
            deadlines.delete(ex.record.id)
          } else if (ex.record.deadlineAtMs !== undefined && ex.record.deadlineAtMs <= now) {
            cancelInternal(ex, now)
            count++
          }
        }
        return count
      }),
    enqueued: Effect.asVoid(Queue.take(signal)),

    dispatches: (executionId) =>
      Effect.sync(() => {
        if (executionId === undefined) return Array.from(dispatchesById.values(), snapshotDispatch)
        return executions.get(executionId)?.dispatches.map(snapshotDispatch) ?? []
      })
  }
  return core
}
