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
 * This module is the core's public face: its records and settings, the
 * {@link KernelCore} interface and {@link make}. The transitions themselves live
 * in the kernel's internal modules, one concept each (executions and their
 * lifecycle, the dispatch queue, delivery, steps, approvals, agents, deltas).
 *
 * @since 0.1.0
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Queue from "effect/Queue"
import type * as Scope from "effect/Scope"
import * as RateLimiter from "./RateLimiter.js"
import { AgentTable } from "./internal/agents.js"
import { ApiKeyTable } from "./internal/apiKeys.js"
import { ApprovalTable } from "./internal/approvalTable.js"
import * as Approvals from "./internal/approvals.js"
import { Deltas } from "./internal/deltas.js"
import * as Delivery from "./internal/delivery.js"
import type { DeliveryCause, DeliveryRecorded } from "./internal/delivery.js"
import { DispatchQueue, snapshot as snapshotDispatch } from "./internal/dispatchQueue.js"
import { ExecutionTable } from "./internal/executions.js"
import * as Lifecycle from "./internal/lifecycle.js"
import type { CreateRequest } from "./internal/lifecycle.js"
import type {
  AgentMetadata,
  AgentRecord,
  ApiKeyRecord,
  ApprovalRecord,
  CaptureRecords,
  Claim,
  Decision,
  Delta,
  DispatchRecord,
  EventLogView,
  EventRecord,
  ExecutionPage,
  ExecutionRecord,
  ForkPoints,
  ForkRequest,
  ForkResult,
  IssuedApiKey,
  Lease,
  ResourceRecord,
  ResourceRegistration,
  Settings,
  StepRecord
} from "./internal/model.js"
import { defaultSettings, isTerminalExecution, KernelFailure, notFound } from "./internal/model.js"
import * as Forks from "./internal/forks.js"
import * as Resources from "./internal/resources.js"
import type { CoreState } from "./internal/state.js"
import { isCurrent } from "./internal/state.js"
import * as Steps from "./internal/steps.js"
import type { Submission } from "./internal/steps.js"

export {
  /**
   * @since 0.1.0
   * @category constructors
   */
  defaultSettings,
  /**
   * @since 0.1.0
   * @category errors
   */
  KernelFailure
} from "./internal/model.js"

export type {
  /**
   * @since 0.2.0
   * @category models
   */
  CreateRequest
} from "./internal/lifecycle.js"

export type {
  /**
   * @since 0.2.0
   * @category models
   */
  Submission
} from "./internal/steps.js"

export type {
  /**
   * @since 0.2.0
   * @category models
   */
  DeliveryCause,
  /**
   * @since 0.2.0
   * @category models
   */
  DeliveryRecorded
} from "./internal/delivery.js"

export type {
  /**
   * @since 0.2.0
   * @category models
   */
  AgentMetadata,
  /**
   * @since 0.1.0
   * @category models
   */
  AgentRecord,
  /**
   * @since 0.2.0
   * @category models
   */
  ApiKeyRecord,
  /**
   * @since 0.1.0
   * @category models
   */
  ApprovalRecord,
  /**
   * @since 0.1.0
   * @category models
   */
  Claim,
  /**
   * @since 0.1.0
   * @category models
   */
  Decision,
  /**
   * @since 0.1.0
   * @category models
   */
  DecisionValue,
  /**
   * @since 0.1.0
   * @category models
   */
  Delta,
  /**
   * @since 0.1.0
   * @category models
   */
  DispatchRecord,
  /**
   * @since 0.1.0
   * @category models
   */
  DispatchStatus,
  /**
   * @since 0.1.0
   * @category models
   */
  EventLogView,
  /**
   * @since 0.1.0
   * @category models
   */
  EventRecord,
  /**
   * @since 0.1.0
   * @category models
   */
  ExecutionPage,
  /**
   * @since 0.1.0
   * @category models
   */
  ExecutionRecord,
  /**
   * @since 0.2.0
   * @category models
   */
  IssuedApiKey,
  /**
   * @since 0.1.0
   * @category models
   */
  Lease,
  /**
   * @since 0.2.0
   * @category models
   */
  Scope,
  /**
   * @since 0.1.0
   * @category models
   */
  Settings,
  /**
   * @since 0.2.0
   * @category models
   */
  SpawnedBy,
  /**
   * @since 0.2.0
   * @category models
   */
  Stage,
  /**
   * @since 0.1.0
   * @category models
   */
  StepRecord,
  /**
   * @since 0.2.0
   * @category models
   */
  Capture,
  /**
   * @since 0.2.0
   * @category models
   */
  CaptureFailure,
  /**
   * @since 0.2.0
   * @category models
   */
  CaptureRecords,
  /**
   * @since 0.2.0
   * @category models
   */
  CheckpointRecord,
  /**
   * @since 0.2.0
   * @category models
   */
  ForkPoints,
  /**
   * @since 0.2.0
   * @category models
   */
  ForkRequest,
  /**
   * @since 0.2.0
   * @category models
   */
  ForkResult,
  /**
   * @since 0.2.0
   * @category models
   */
  ResourceRecord,
  /**
   * @since 0.2.0
   * @category models
   */
  ResourceRegistration,
  /**
   * @since 0.2.0
   * @category models
   */
  ResourceTouch,
  /**
   * @since 0.2.0
   * @category models
   */
  Restoration,
  /**
   * @since 0.2.0
   * @category models
   */
  StepOverride
} from "./internal/model.js"

/**
 * Execution, step and approval statuses are the wire's (shared with the SDK).
 *
 * @since 0.1.0
 * @category models
 */
export type { ApprovalStatus, ExecutionStatus, StepStatus } from "../Protocol.js"

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
  /** Replace some settings (test hooks: `limiterError`, `stage`, …). */
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
  /** {@link getAgent} as a plain lookup (`undefined` when unknown), for in-process callers on a hot path. */
  readonly unsafeGetAgent: (id: string) => AgentRecord | undefined
  /** Sorted by id (byte order). */
  readonly listAgents: () => Effect.Effect<ReadonlyArray<AgentRecord>>
  readonly deleteAgent: (id: string) => Effect.Effect<void>
  /** PROTOCOL 11.10: validation (400) before the agent lookup (404); `""` removes. */
  readonly loadPolicy: (agentId: string, bundle: string) => Effect.Effect<void, KernelFailure>
  /**
   * PROTOCOL-CURRENT C.3.3: store the metadata an agent published (replacing
   * any earlier one); `404` for an unknown agent. Read it back on
   * {@link AgentRecord.metadata}.
   */
  readonly setAgentMetadata: (agentId: string, metadata: AgentMetadata) => Effect.Effect<void, KernelFailure>

  /**
   * PROTOCOL-CURRENT C.9.2: a new scoped API key; `400` for a blank name, no
   * scopes or an unknown scope. The token is returned only here and by
   * {@link rotateApiKey}.
   */
  readonly createApiKey: (
    k: { readonly name: string; readonly scopes: ReadonlyArray<string> }
  ) => Effect.Effect<IssuedApiKey, KernelFailure>
  /** Every API key, revoked ones included, oldest first. */
  readonly listApiKeys: () => Effect.Effect<ReadonlyArray<ApiKeyRecord>>
  /** A new token for a key; `404` unknown, `409 conflict` revoked. */
  readonly rotateApiKey: (id: string) => Effect.Effect<IssuedApiKey, KernelFailure>
  /** Revoke a key (it stays listed); repeatable. */
  readonly revokeApiKey: (id: string) => Effect.Effect<void>
  /** PROTOCOL-CURRENT C.9.1 step 4: the live key a bearer token names, if any. */
  readonly authenticateApiKey: (token: string) => Effect.Effect<ApiKeyRecord | undefined>

  /**
   * PROTOCOL 11.1. `id` (optional, test hook) creates the execution with a given
   * canonical id (`409 conflict` when taken).
   *
   * In the current stage (PROTOCOL-CURRENT C.4.1, C.5.1) `session`,
   * `idempotencyKey`, `parentExecutionId` and `spawnedBy` are honoured, with
   * their checks in the specified order: an execution of the agent that
   * already has the key is answered as it is now; a session execution may
   * stay `pending` until its session is free (C.4.4). The older stages
   * ignore them.
   */
  readonly createExecution: (r: CreateRequest) => Effect.Effect<ExecutionRecord, KernelFailure>
  readonly getExecution: (id: string) => Effect.Effect<ExecutionRecord, KernelFailure>
  /** {@link getExecution} as a plain lookup (`undefined` when unknown), for in-process callers on a hot path. */
  readonly unsafeGetExecution: (id: string) => ExecutionRecord | undefined
  /**
   * The earliest deadline (epoch millis) of an execution not yet terminal,
   * `undefined` when none has one; a plain read, for in-process callers (the
   * test kit's virtual time moves straight to the deadline sweep that is due).
   */
  readonly unsafeEarliestDeadline: () => number | undefined
  readonly listExecutions: (q: {
    readonly agentId: string
    readonly status: string
    readonly cursor: string | undefined
    readonly limit: number
    /** PROTOCOL-CURRENT C.4.7: exact session (`""` or absent = any). */
    readonly session?: string | undefined
  }) => Effect.Effect<ExecutionPage>
  /**
   * PROTOCOL 11.4; in the current stage a terminal execution is `409 conflict`
   * (PROTOCOL-CURRENT C.10) and the execution's children are cancelled too (C.5.3).
   */
  readonly cancelExecution: (id: string) => Effect.Effect<void, KernelFailure>
  /**
   * PROTOCOL-CURRENT C.4.6: the `state` `GET …/previous` answers, as raw JSON
   * text — the parent's stored state, else its output, else `null`. `404`
   * when unknown.
   */
  readonly previousState: (id: string) => Effect.Effect<string, KernelFailure>
  /**
   * PROTOCOL-CURRENT C.5.2: suspend a run that waits on its steps. `404`
   * unknown, `409 execution_terminal`, `409 lease_superseded` (the lease is
   * renewed); `true` when the execution blocked, `false` (nothing written)
   * when nothing waits.
   */
  readonly suspendExecution: (id: string, lease: Lease) => Effect.Effect<boolean, KernelFailure>
  /**
   * PROTOCOL-CURRENT C.4.4 sweep: every free session starts its oldest
   * pending execution; returns how many started.
   */
  readonly admitSessions: () => Effect.Effect<number>
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
  /**
   * {@link listSteps} as a plain function and without its sort: copies of the
   * execution's steps in the order they were first submitted (empty for an
   * unknown execution), for in-process callers that order them themselves.
   *
   * @since 0.2.0
   */
  readonly unsafeStepsInOrder: (id: string) => ReadonlyArray<StepRecord>

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

  /**
   * PROTOCOL 7.3 (PROTOCOL-CURRENT C.8.1 in the current stage). `argsRaw` is
   * the raw text of `args` (absent = `undefined`); `resources` the declared
   * resource keys (current stage, C.6.4). A `judge` rule asks the configured
   * judge between two atomic halves of the submission.
   */
  readonly submitStep: (
    executionId: string,
    lease: Lease,
    s: Submission
  ) => Effect.Effect<Decision, KernelFailure>
  /**
   * PROTOCOL 6.4. In the current stage the `captures` sent with the outcome
   * are recorded (PROTOCOL-CURRENT C.6.5; refusals never fail the call) and
   * the step counts against the resources it declared.
   */
  readonly completeStep: (
    executionId: string,
    stepId: string,
    lease: Lease,
    resultRaw: string | undefined,
    captures?: CaptureRecords | undefined
  ) => Effect.Effect<Decision, KernelFailure>
  /** PROTOCOL 6.5; `captures` as for {@link completeStep}. */
  readonly failStep: (
    executionId: string,
    stepId: string,
    lease: Lease,
    errorRaw: string | undefined,
    captures?: CaptureRecords | undefined
  ) => Effect.Effect<Decision, KernelFailure>
  /**
   * {@link submitStep} as a plain function of the current time (epoch ms), for
   * in-process callers on a hot path (the test kit's direct client): the same
   * state change and answer, without an Effect around it. A `judge` rule runs
   * the judge synchronously here; a judge that needs to wait (a real HTTP
   * call) gives the rule's fallback, `judge unavailable: …`, so callers with a
   * configured judge should use {@link submitStep}.
   */
  readonly unsafeSubmitStep: (
    now: number,
    executionId: string,
    lease: Lease,
    s: Submission
  ) => Decision | KernelFailure
  /** {@link completeStep} (`succeeded`) or {@link failStep} (`failed`) as a plain function of the current time. */
  readonly unsafeSettleStep: (
    now: number,
    executionId: string,
    stepId: string,
    lease: Lease,
    outcome: "succeeded" | "failed",
    raw: string | undefined,
    captures?: CaptureRecords | undefined
  ) => Decision | KernelFailure
  readonly heartbeat: (executionId: string, lease: Lease) => Effect.Effect<void, KernelFailure>
  /**
   * PROTOCOL 6.8. `stateRaw` (PROTOCOL-CURRENT C.4.5), when given and not
   * `null`, is stored for {@link previousState} and shown nowhere else.
   */
  readonly completeExecution: (
    executionId: string,
    lease: Lease,
    outputRaw: string | undefined,
    stateRaw?: string | undefined
  ) => Effect.Effect<void, KernelFailure>
  readonly failExecution: (executionId: string, lease: Lease, error: string) => Effect.Effect<void, KernelFailure>

  /**
   * PROTOCOL-CURRENT C.6.2: register a resource on a running execution (the
   * lease renewed), or read an existing one back. The member checks come
   * first (`400`), then `404`, `409 execution_terminal`, `409
   * lease_superseded`; an existing key registered with another driver,
   * configuration or `coverage_reuse` is `409 conflict`.
   */
  readonly registerResource: (
    executionId: string,
    lease: Lease,
    registration: ResourceRegistration
  ) => Effect.Effect<ResourceRecord, KernelFailure>
  /**
   * PROTOCOL-CURRENT C.6.3: bind a resource to a JSON locator (`bindingRaw`,
   * raw JSON). Binding again to canonically equal JSON writes nothing; to
   * other JSON is `409 conflict`; an unknown key `404`.
   */
  readonly bindResource: (
    executionId: string,
    key: string,
    lease: Lease,
    bindingRaw: string | undefined
  ) => Effect.Effect<void, KernelFailure>
  /**
   * PROTOCOL-CURRENT C.6.6: record captures outside a step outcome (a
   * baseline after registration, the completion checkpoint), covering from
   * the execution's latest seq.
   */
  readonly publishCheckpoints: (
    executionId: string,
    lease: Lease,
    records: CaptureRecords
  ) => Effect.Effect<void, KernelFailure>
  /** The resources of an execution, in registration order (C.6.1); `404` when unknown. */
  readonly listResources: (executionId: string) => Effect.Effect<ReadonlyArray<ResourceRecord>, KernelFailure>
  /**
   * PROTOCOL-CURRENT C.7.1, C.7.2: fork an execution at `atSeq`. The copied
   * steps replay in the fork, everything after runs live under the fork's
   * policy. Checks in order: `404`; session `400`/`409`; `at_seq` `400`; a
   * `policyBundle` without `mayWritePolicies` `403` or that does not compile
   * `400`. The programmatic `overrides` (test kit "what if" tests, never on
   * the wire) replace the recorded outcome of copied steps, by source step id.
   *
   * @example
   * ```ts
   * import { Effect, Schema } from "effect"
   * import { Agent, Tool } from "effect-rebuno"
   * import { TestKernel } from "effect-rebuno/testing"
   *
   * const charge = Tool.make("charge", {
   *   args: Schema.Struct({ amount: Schema.Number }),
   *   success: Schema.Struct({ id: Schema.String }),
   *   execute: () => Effect.succeed({ id: "ch_1" })
   * })
   *
   * const checkout = Agent.make({
   *   id: "checkout",
   *   handler: () => Effect.map(charge({ amount: 10 }), ({ id }) => ({ charged: id }))
   * })
   *
   * const program = Effect.gen(function*() {
   *   const kernel = yield* TestKernel.TestKernel
   *   const source = yield* kernel.run(checkout)
   *   const chargeStepId = source.steps[0]!.stepId
   *   const { latestSeq } = yield* kernel.core.forkPoints(source.executionId)
   *   // the fork replays "charge" as if it had failed
   *   const { execution } = yield* kernel.core.fork(source.executionId, {
   *     atSeq: latestSeq,
   *     overrides: { [chargeStepId]: { error: { message: "card declined" } } }
   *   })
   *   const fork = yield* kernel.settle(execution.id)
   *   return fork.failureReason // "tool_error: charge: card declined"
   * }).pipe(Effect.provide(TestKernel.layer({ agents: [checkout] })))
   * ```
   */
  readonly fork: (sourceId: string, request: ForkRequest) => Effect.Effect<ForkResult, KernelFailure>
  /** PROTOCOL-CURRENT C.7.3: the points an execution may be forked at; `404` when unknown. */
  readonly forkPoints: (executionId: string) => Effect.Effect<ForkPoints, KernelFailure>

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
  /**
   * 5.4 step 6, fenced on `(dispatch_id, attempt)` (not in compat mode). The
   * cause of a failed delivery goes on `dispatch.failed` as `error` (current
   * stage); the answer says what was recorded.
   */
  readonly recordDelivery: (
    claim: Claim,
    ok: boolean,
    cause?: DeliveryCause | undefined
  ) => Effect.Effect<DeliveryRecorded>
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

/** Runs a transition at the current time; a returned `KernelFailure` fails the effect. */
const atomic = <A>(f: (now: number) => A | KernelFailure): Effect.Effect<A, KernelFailure> =>
  Effect.flatMap(Clock.currentTimeMillis, (now) => {
    const result = f(now)
    return result instanceof KernelFailure ? Effect.fail(result) : Effect.succeed(result)
  })

/** Runs a transition that cannot fail at the current time. */
const atomicTotal = <A>(f: (now: number) => A): Effect.Effect<A> => Effect.map(Clock.currentTimeMillis, f)

/** Runs a lookup; a returned `KernelFailure` fails the effect. */
const read = <A>(f: () => A | KernelFailure): Effect.Effect<A, KernelFailure> =>
  Effect.suspend(() => {
    const result = f()
    return result instanceof KernelFailure ? Effect.fail(result) : Effect.succeed(result)
  })

const makeWith = (options: Partial<Settings> | undefined, signal: Queue.Queue<void>): KernelCore => {
  const state: CoreState = {
    settings: { ...defaultSettings, ...options },
    agents: new AgentTable(),
    executions: new ExecutionTable(),
    dispatches: new DispatchQueue(signal),
    approvals: new ApprovalTable(),
    limiter: RateLimiter.make(),
    apiKeys: new ApiKeyTable()
  }
  const { agents, approvals, dispatches, executions } = state
  const deltas = new Deltas()

  const submit: KernelCore["unsafeSubmitStep"] = (now, executionId, lease, s) =>
    Steps.submit(state, now, executionId, lease, s)
  const settleStep: KernelCore["unsafeSettleStep"] = (now, executionId, stepId, lease, outcome, raw, captures) =>
    Steps.settle(state, now, executionId, stepId, lease, outcome, raw, isCurrent(state) ? captures : undefined)

  const core: KernelCore = {
    get settings() {
      return state.settings
    },
    updateSettings: (patch) =>
      Effect.sync(() => {
        state.settings = { ...state.settings, ...patch }
      }),

    registerAgent: (a) => atomic((now) => agents.register(a, now, state.settings.stage)),
    getAgent: (id) => read(() => agents.get(id) ?? notFound()),
    unsafeGetAgent: (id) => agents.get(id),
    listAgents: () => Effect.sync(() => agents.list()),
    deleteAgent: (id) => Effect.sync(() => agents.delete(id)),
    loadPolicy: (agentId, bundle) => read(() => agents.loadPolicy(agentId, bundle, state.settings.stage)),
    setAgentMetadata: (agentId, metadata) => read(() => agents.setMetadata(agentId, metadata)),

    createApiKey: (k) => atomic((now) => state.apiKeys.create(k.name, k.scopes, now)),
    listApiKeys: () => Effect.sync(() => state.apiKeys.list()),
    rotateApiKey: (id) => read(() => state.apiKeys.rotate(id)),
    revokeApiKey: (id) => atomicTotal((now) => state.apiKeys.revoke(id, now)),
    authenticateApiKey: (token) => Effect.sync(() => state.apiKeys.authenticate(token)),

    createExecution: (r) => atomic((now) => Lifecycle.create(state, r, now)),
    getExecution: (id) => read(() => executions.byId.get(id)?.record ?? notFound()),
    unsafeGetExecution: (id) => executions.byId.get(id)?.record,
    unsafeEarliestDeadline: () => {
      let earliest: number | undefined
      for (const ex of executions.deadlines.values()) {
        const at = ex.record.deadlineAtMs
        if (at !== undefined && !isTerminalExecution(ex.record.status) && (earliest === undefined || at < earliest)) {
          earliest = at
        }
      }
      return earliest
    },
    listExecutions: (q) => Effect.sync(() => executions.list(q)),
    cancelExecution: (id) => atomic((now) => Lifecycle.cancel(state, id, now)),
    previousState: (id) => read(() => Lifecycle.previous(state, id)),
    suspendExecution: (id, lease) => atomic((now) => Lifecycle.suspend(state, id, lease, now)),
    admitSessions: () => atomicTotal((now) => Lifecycle.admitAll(state, now)),
    listEvents: (id, afterSeq, limit) => Effect.sync(() => executions.events(id, afterSeq, limit)),
    eventLog: (id) => Effect.sync(() => executions.byId.get(id)?.events.slice(0) ?? []),
    listSteps: (id, terminalOnly) => Effect.sync(() => Steps.list(state, id, terminalOnly)),
    getStep: (id, stepId) => read(() => executions.byId.get(id)?.steps.get(stepId)?.snapshot() ?? notFound()),
    unsafeGetStep: (id, stepId) => executions.byId.get(id)?.steps.get(stepId),
    unsafeStepsInOrder: (id) => Steps.inOrder(state, id),
    unsafeEventLog: (id) => executions.byId.get(id)?.events,

    listApprovals: () => Effect.sync(() => approvals.listPending()),
    getApproval: (id) => read(() => approvals.byId.get(id) ?? notFound()),
    grantApproval: (id, d) => atomic((now) => Approvals.decide(state, "grant", id, d, now)),
    denyApproval: (id, d) => atomic((now) => Approvals.decide(state, "deny", id, d, now)),

    submitStep: (executionId, lease, s) => Steps.submitEffect(state, executionId, lease, s),
    unsafeSubmitStep: submit,
    unsafeSettleStep: settleStep,
    completeStep: (executionId, stepId, lease, resultRaw, captures) =>
      atomic((now) => settleStep(now, executionId, stepId, lease, "succeeded", resultRaw, captures)),
    failStep: (executionId, stepId, lease, errorRaw, captures) =>
      atomic((now) => settleStep(now, executionId, stepId, lease, "failed", errorRaw, captures)),
    heartbeat: (executionId, lease) => atomic((now) => Lifecycle.heartbeat(state, executionId, lease, now)),
    completeExecution: (executionId, lease, outputRaw, stateRaw) =>
      atomic((now) => Lifecycle.finish(state, now, executionId, lease, { _tag: "completed", outputRaw, stateRaw })),
    failExecution: (executionId, lease, error) =>
      atomic((now) => Lifecycle.finish(state, now, executionId, lease, { _tag: "failed", reason: error })),

    registerResource: (executionId, lease, registration) =>
      atomic((now) => Resources.register(state, executionId, lease, registration, now)),
    bindResource: (executionId, key, lease, bindingRaw) =>
      atomic((now) => Resources.bind(state, executionId, key, lease, bindingRaw, now)),
    publishCheckpoints: (executionId, lease, records) =>
      atomic((now) => Resources.publish(state, executionId, lease, records, now)),
    listResources: (executionId) => read(() => Resources.list(state, executionId)),
    fork: (sourceId, request) => atomic((now) => Forks.fork(state, sourceId, request, now)),
    forkPoints: (executionId) => read(() => Resources.forkPoints(state, executionId)),

    publishDelta: (executionId, d) => Effect.sync(() => deltas.publish(executionId, d)),
    subscribeDeltas: (executionId) => deltas.subscribe(executionId),

    reclaimStale: () => atomicTotal((now) => dispatches.reclaimStale(now)),
    expireLeases: () => atomicTotal((now) => dispatches.reclaimAll(now)),
    claimDue: (limit) => atomicTotal((now) => Delivery.claimDue(state, limit, now)),
    recordDelivery: (claim, ok, cause) => atomicTotal((now) => Delivery.recordDelivery(state, claim, ok, now, cause)),
    expireApprovals: () => atomicTotal((now) => Approvals.expireDue(state, now)),
    cancelPastDeadline: () => atomicTotal((now) => Lifecycle.cancelPastDeadline(state, now)),
    enqueued: Effect.asVoid(Queue.take(signal)),

    dispatches: (executionId) =>
      Effect.sync(() => {
        if (executionId === undefined) return dispatches.snapshots()
        return executions.byId.get(executionId)?.dispatches.map(snapshotDispatch) ?? []
      })
  }
  return core
}
