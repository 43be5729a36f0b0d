/**
 * Steps in the kernel core: the submit algorithm (PROTOCOL 7.3; C.8.1 in the
 * current stage) with step identity and per-dispatch occurrence counters
 * (8.2, 8.4), the answer for an existing step (7.4, C.8.2), policy and rate
 * limits for a new one and how it is recorded (7.5, C.8.3–C.8.6), and
 * settling a step as succeeded or failed (6.4, 6.5; `usage`, C.8.5). The
 * current stage's decision path lives in `decisions`.
 *
 * @since 0.1.0
 * @internal
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as StepId from "../../StepId.js"
import * as Policy from "../Policy.js"
import * as RateLimiter from "../RateLimiter.js"
import * as Approvals from "./approvals.js"
import * as Decisions from "./decisions.js"
import type { DispatchState } from "./dispatchQueue.js"
import type { ExecState } from "./executions.js"
import { flat } from "./flat.js"
import type { CaptureRecords, Decision, DecisionValue, Lease, StepRecord } from "./model.js"
import {
  isTerminalExecution,
  isTerminalStep,
  KernelFailure,
  leaseSuperseded,
  notFound,
  validation
} from "./model.js"
import * as Payload from "./payloads.js"
import * as Resources from "./resources.js"
import type { CoreState } from "./state.js"
import { compatMode, isCurrent } from "./state.js"
import { StepState } from "./stepState.js"
import { compactRaw, deniedReason, isIndeterminateError } from "./storedJson.js"
import * as Usage from "./usage.js"

/**
 * A step submission as the routes decode it (7.3). `argsRaw` is the raw text
 * of `args` (absent = `undefined`).
 *
 * @since 0.1.0
 */
export interface Submission {
  readonly kind: string
  readonly target: string
  readonly argsRaw: string | undefined
  readonly idempotency: string
  /** Declared resource keys (current stage, PROTOCOL-CURRENT C.6.4); absent = none. */
  readonly resources?: ReadonlyArray<string> | undefined
}

const counterKey = (kind: string, target: string, argsHash: string): string =>
  flat(kind.length + ":" + kind + target.length + ":" + target + argsHash)

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

const withStepId = (decision: DecisionValue, stepId: string): Decision => ({ decision, stepId })

/** `proceed`, with the resources the start touched (PROTOCOL-CURRENT C.6.4) when any. */
const proceedWith = (stepId: string, resources: Decision["resources"] | undefined): Decision =>
  resources === undefined ? { decision: "proceed", stepId } : { decision: "proceed", stepId, resources }

/**
 * The payload options of a decision event (`step.allowed`,
 * `step.awaiting_approval`): the rule, and in the current stage its reason
 * and the bundle's hash (C.8.4). A current-stage result is passed as it is —
 * it carries exactly those three of the options — so that the event of every
 * step allowed by the same result keeps no object of its own.
 */
const decisionOptions = (result: Policy.PolicyResult, current: boolean): Payload.StepPayloadOptions =>
  current ? result : { ruleId: result.ruleId }

/**
 * Mark a step's counter key as having an unknown outcome (7.3 step 10).
 *
 * @since 0.2.0
 * @internal
 */
export const markIndeterminate = (ex: ExecState, step: StepState): void => {
  ;(ex.indeterminate ??= new Set()).add(counterKey(step.kind, step.target, step.argsHash))
}

/** Record a new step, next in the execution's order. */
const addStep = (ex: ExecState, d: DispatchState, step: StepState): void => {
  ex.steps.set(step.stepId, step)
  ex.order.push(step)
  d.counters.cursor = ex.order.length
}

/** 7.4: answer for an existing step. */
const replayExisting = (
  state: CoreState,
  ex: ExecState,
  step: StepState,
  idempotency: string,
  now: number
): Decision => {
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
      const approvalId = state.approvals.pendingFor(step.stepId)
      return approvalId === undefined
        ? withStepId("blocked", step.stepId)
        : { decision: "blocked", stepId: step.stepId, approvalId }
    }
    case "allowed":
    case "proposed": {
      step.set("executing", step.resultRaw, step.errorRaw, now, step.completedAtMs)
      if (ex.resources === undefined) {
        ex.events.pushStep("step.executing", now, step)
        return withStepId("proceed", step.stepId)
      }
      // PROTOCOL-CURRENT C.6.4: an approved or proposed step starts now
      return proceedWith(step.stepId, Resources.begin(ex, step, now, true))
    }
    case "executing":
      if (idempotency === "at_most_once") {
        step.set("failed", step.resultRaw, Payload.indeterminateError, step.startedAtMs, now)
        ex.events.pushStep("step.failed", now, step, { error: Payload.indeterminateError })
        markIndeterminate(ex, step)
        Resources.count(ex, step)
        return { decision: "replay", stepId: step.stepId, errorRaw: Payload.indeterminateError }
      }
      // C.6.4: an orphaned step re-run; `step.executing` again only when it touches resources
      if (ex.resources !== undefined) return proceedWith(step.stepId, Resources.begin(ex, step, now, false))
      return withStepId("proceed", step.stepId)
    case "denied":
      return isCurrent(state)
        ? Decisions.deniedReplay(step)
        : { decision: "denied", stepId: step.stepId, reason: deniedReason(step.errorRaw) }
    default:
      return withStepId("proceed", step.stepId)
  }
}

/**
 * PROTOCOL 7.3, in its exact order: execution, lease (RENEW; the v0.14.0
 * checks in compat mode), step identity, an existing step (7.4), a blocked
 * execution, policy, rate limit, and recording the new step (7.5).
 *
 * The current stage follows C.8.1 instead: the kind is checked with the
 * body, `args` must canonicalise, declared resources are checked for a new
 * step, the policy may be a `judge` rule, a rate limit may park the
 * execution, a token budget may turn an `allow` around, and every decision
 * event carries its reason and `policy_hash`. A `judge` rule stops the
 * submission before anything is recorded ({@link Decisions.JudgeCall}); it is
 * submitted again with the judge's outcome (`judged`).
 */
const submitWith = (
  state: CoreState,
  now: number,
  executionId: string,
  lease: Lease,
  s: Submission,
  judged: Decisions.Judged | undefined
): Decision | KernelFailure | Decisions.JudgeCall => {
  const idempotency = s.idempotency === "" ? "safe_to_retry" : s.idempotency
  const current = isCurrent(state)
  if (current) {
    const badKind = Decisions.checkKind(s.kind)
    if (badKind !== undefined) return badKind
  }
  const compat = compatMode(state)
  const ex = state.executions.byId.get(executionId)
  if (compat && ex !== undefined) state.dispatches.touchAll(ex.dispatches, now)
  if (ex === undefined) return notFound()
  if (isTerminalExecution(ex.record.status)) return EXECUTION_TERMINAL
  let d: DispatchState | undefined
  if (compat) {
    d = state.dispatches.byId.get(lease.dispatchId)
    if (d === undefined) return validation("validation error: unknown dispatch_id")
    if (d.executionId !== executionId) return validation("validation error: dispatch_id belongs to another execution")
  } else {
    d = state.dispatches.renewLease(executionId, lease, now)
    if (d === undefined) return leaseSuperseded()
  }

  // A run that replays submits its recorded steps again, in order: when this
  // submission is the expected step's text again, that step's hash (and, at the
  // same occurrence, its id) is this one's, and nothing needs hashing.
  const expected = ex.order[d.counters.cursor]
  const same = expected !== undefined && expected.submittedArgsRaw === s.argsRaw && expected.kind === s.kind &&
    expected.target === s.target
  let argsHash: string
  if (same) argsHash = expected.argsHash
  else if (current) {
    const checked = Decisions.argsHash(s.argsRaw)
    if (checked instanceof KernelFailure) return checked
    argsHash = checked
  } else argsHash = StepId.argsHash(s.argsRaw)
  const occurrence = d.counters.last(s.kind, s.target, argsHash) + 1
  const stepId = same && expected.occurrence === occurrence
    ? expected.stepId
    : StepId.make({ executionId, kind: s.kind, target: s.target, argsHash, occurrence })

  const existing = same && expected.stepId === stepId ? expected : ex.steps.get(stepId)
  if (existing !== undefined) {
    const decision = replayExisting(state, ex, existing, idempotency, now)
    d.counters.consume(existing)
    d.counters.cursor = existing.position + 1
    return decision
  }
  if (ex.record.status === "blocked") return EXECUTION_BLOCKED
  let declared: ReadonlyArray<string> | undefined
  if (current && s.resources !== undefined && s.resources.length > 0) {
    const checked = Resources.declared(ex, s.kind, s.resources)
    if (checked instanceof KernelFailure) return checked
    declared = checked
  }

  let result: Policy.PolicyResult
  if (idempotency === "at_most_once" && ex.indeterminate?.has(counterKey(s.kind, s.target, argsHash)) === true) {
    result = indeterminateRetry
  } else if (current) {
    result = Decisions.evaluate(state, ex, s.kind, s.target, s.argsRaw)
    if (result.decision === "judge") {
      const judgedResult = Decisions.resolveJudge(state, ex, stepId, s.kind, s.target, s.argsRaw, result, judged)
      if (judgedResult instanceof Decisions.JudgeCall) return judgedResult
      result = judgedResult
    }
  } else {
    const agent = state.agents.get(ex.record.agentId)
    const input = { agentId: ex.record.agentId, kind: s.kind, target: s.target, argsRaw: s.argsRaw }
    result = agent === undefined
      ? agentLookupFailed
      : agent.policy?.policyHash === undefined
      ? Policy.evaluate(agent.policy, input)
      : Decisions.evaluateSeedStale(agent, input)
  }

  const limit = result.rateLimit
  if (current) {
    if (RateLimiter.isActive(limit)) {
      const limited = Decisions.rateLimit(state, ex, { stepId, kind: s.kind, target: s.target }, result, now)
      if (limited !== undefined) return limited
    }
    result = Decisions.applyBudget(state, ex, result)
  } else if (limit !== undefined && limit.maxCalls > 0 && limit.windowMs > 0) {
    if (state.settings.limiterError) {
      if (limit.onLimiterError === "deny") return LIMITER_UNAVAILABLE
    } else if (
      !state.limiter.take(
        RateLimiter.bucketKey(result.ruleId, limit.perWhat, ex.record.agentId, executionId),
        limit,
        now
      )
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
  if (declared !== undefined) created.resources = declared
  let decision: Decision
  switch (result.decision) {
    case "allow": {
      created.set("executing", undefined, undefined, now, undefined)
      addStep(ex, d, created)
      ex.events.pushStep("step.proposed", now, created)
      ex.events.pushStep("step.allowed", now, created, decisionOptions(result, current))
      if (ex.resources === undefined) {
        ex.events.pushStep("step.executing", now, created)
        decision = withStepId("proceed", stepId)
      } else {
        decision = proceedWith(stepId, Resources.begin(ex, created, now, true))
      }
      break
    }
    case "deny": {
      const reason = result.reason || "policy_denied"
      const error = Payload.denialError(reason, result.ruleId)
      created.set("denied", undefined, error, undefined, now)
      addStep(ex, d, created)
      ex.events.pushStep("step.proposed", now, created)
      if (current) {
        // C.8.4: the answer always carries the reason and the rule
        ex.events.pushStep("step.denied", now, created, { error, ruleId: result.ruleId, policyHash: result.policyHash })
        decision = { decision: "denied", stepId, reason, ruleId: result.ruleId }
        break
      }
      ex.events.pushStep("step.denied", now, created, { error, ruleId: result.ruleId, omitEmptyTarget: true })
      decision = result.reason === ""
        ? withStepId("denied", stepId)
        : { decision: "denied", stepId, reason: result.reason }
      break
    }
    case "require_approval": {
      created.set("awaiting_approval", undefined, undefined, undefined, undefined)
      addStep(ex, d, created)
      ex.events.pushStep("step.proposed", now, created)
      ex.events.pushStep("step.awaiting_approval", now, created, decisionOptions(result, current))
      const approval = Approvals.request(state, ex, stepId, result.approval, now)
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
  d.counters.consume(created)
  return decision
}

const judgeLoopFailure = (): KernelFailure =>
  new KernelFailure({ status: 500, code: "internal_error", message: "internal error" })

/**
 * PROTOCOL 7.3 (C.8.1 in the current stage) as one synchronous transition.
 * A `judge` rule asks the configured judge synchronously
 * ({@link Decisions.askNow}): a judge that must wait gives the rule's fallback.
 *
 * @since 0.1.0
 * @internal
 */
export const submit = (
  state: CoreState,
  now: number,
  executionId: string,
  lease: Lease,
  s: Submission
): Decision | KernelFailure => {
  const answer = submitWith(state, now, executionId, lease, s, undefined)
  if (!(answer instanceof Decisions.JudgeCall)) return answer
  const again = submitWith(state, now, executionId, lease, s, Decisions.askNow(state, answer))
  return again instanceof Decisions.JudgeCall ? judgeLoopFailure() : again
}

/** A judge is asked at most this many times for one submission (the policy may change meanwhile). */
const MAX_JUDGEMENTS = 3

/**
 * {@link submit} as an Effect, each half atomic at the time it runs: a
 * `judge` rule (C.8.6) stops the first half before anything is recorded, the
 * judge is asked without holding the core, and the submission runs again
 * with its outcome — all checks included, since the execution may have moved
 * meanwhile. Without a `judge` rule this is one transition, like
 * {@link submit}.
 *
 * @since 0.2.0
 * @internal
 */
export const submitEffect = (
  state: CoreState,
  executionId: string,
  lease: Lease,
  s: Submission
): Effect.Effect<Decision, KernelFailure> => {
  const attempt = (judged: Decisions.Judged | undefined, round: number): Effect.Effect<Decision, KernelFailure> =>
    Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const answer = submitWith(state, now, executionId, lease, s, judged)
      if (answer instanceof KernelFailure) return Effect.fail(answer)
      if (!(answer instanceof Decisions.JudgeCall)) return Effect.succeed(answer)
      if (round >= MAX_JUDGEMENTS) return Effect.fail(judgeLoopFailure())
      return Effect.flatMap(Decisions.ask(state, answer), (outcome) => attempt(outcome, round + 1))
    })
  return attempt(undefined, 0)
}

const cannotRecord = (status: string): KernelFailure =>
  new KernelFailure({ status: 409, code: "conflict", message: "conflict: cannot record outcome for step in status " + status })

/**
 * 6.4 / 6.5: settle an executing step as `succeeded` (storing `raw` as its
 * result) or `failed` (as its error); a settled step replays what it stored.
 * The lease is CHECKed, not renewed (not in compat mode). In the current
 * stage a step that is neither settled nor `executing` is `409 conflict`,
 * and a recorded outcome counts against the step's resources and records
 * the `captures` sent with it (PROTOCOL-CURRENT C.6.5; a replayed answer
 * records nothing).
 *
 * @since 0.1.0
 * @internal
 */
export const settle = (
  state: CoreState,
  now: number,
  executionId: string,
  stepId: string,
  lease: Lease,
  outcome: "succeeded" | "failed",
  raw: string | undefined,
  captures?: CaptureRecords | undefined
): Decision | KernelFailure => {
  const ex = state.executions.byId.get(executionId)
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
  if (!compatMode(state) && !state.dispatches.checkLease(executionId, lease)) return leaseSuperseded()
  // PROTOCOL-CURRENT C.8.7: only an executing step takes an outcome.
  if (step.status !== "executing" && isCurrent(state)) return cannotRecord(step.status)
  const value = compactRaw(raw)
  if (outcome === "succeeded") {
    step.set("succeeded", value, step.errorRaw, step.startedAtMs, now)
    // C.8.5: the tokens of an LLM call go on the event and the step
    const usage = step.kind === "llm_call" && isCurrent(state) ? Usage.extract(value) : undefined
    if (usage === undefined) {
      ex.events.pushStep("step.succeeded", now, step)
    } else {
      step.usage = usage
      ex.events.pushStep("step.succeeded", now, step, { usage: Usage.toJson(usage) })
    }
  } else {
    step.set("failed", step.resultRaw, value, step.startedAtMs, now)
    ex.events.pushStep("step.failed", now, step, { error: value })
    if (isIndeterminateError(value)) markIndeterminate(ex, step)
  }
  // PROTOCOL-CURRENT C.6.5: the step counts against its resources; then the captures
  if (ex.resources !== undefined) Resources.count(ex, step)
  if (captures !== undefined) Resources.recordCaptures(ex, captures, ex.events.length, now)
  return RECORDED
}

/**
 * The steps of an execution sorted by `step_id` (terminal ones only, if
 * asked); empty for an unknown execution.
 *
 * @since 0.1.0
 * @internal
 */
export const list = (state: CoreState, executionId: string, terminalOnly: boolean): ReadonlyArray<StepRecord> => {
  const ex = state.executions.byId.get(executionId)
  if (ex === undefined) return []
  const steps: Array<StepRecord> = []
  for (const step of ex.steps.values()) {
    if (!terminalOnly || isTerminalStep(step.status)) steps.push(step.snapshot())
  }
  return steps.sort((a, b) => (a.stepId < b.stepId ? -1 : a.stepId > b.stepId ? 1 : 0))
}

/**
 * Copies of the steps of an execution in the order they were first
 * submitted; empty for an unknown execution.
 *
 * @since 0.2.0
 * @internal
 */
export const inOrder = (state: CoreState, executionId: string): ReadonlyArray<StepRecord> =>
  state.executions.byId.get(executionId)?.order.map((step) => step.snapshot()) ?? []
