/**
 * The decision path of the current stage (PROTOCOL-CURRENT C.8): the checks a
 * new submission passes before policy (kind, `args`, declared resources), the
 * policy of an execution, `judge` rules asked between the two halves of a
 * submission, rate limits that refuse or park (`max_wait`, `step.rate_limited`),
 * token budgets, the answer for a replayed denial, and the usage of
 * `llm_call` results. `steps` calls these only when the kernel speaks the
 * current stage; the seed stage never reaches this module.
 *
 * @since 0.2.0
 * @internal
 */
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Result from "effect/Result"
import { hash } from "node:crypto"
import * as Json from "../../internal/wire/json.js"
import * as StepId from "../../StepId.js"
import * as Policy from "../Policy.js"
import * as RateLimiter from "../RateLimiter.js"
import type { StepIdentity } from "./eventLog.js"
import type { ExecState } from "./executions.js"
import { goQuote } from "./goQuote.js"
import * as Judge from "./judge.js"
import * as Lifecycle from "./lifecycle.js"
import type { AgentRecord, Decision, KernelFailure } from "./model.js"
import { validation } from "./model.js"
import * as Payload from "./payloads.js"
import type { CoreState } from "./state.js"
import type { StepState } from "./stepState.js"

// ---------------------------------------------------------------------------
// Checks before policy (C.8.1 steps 1, 5, 8)
// ---------------------------------------------------------------------------

/**
 * The step kinds of the current stage. C.15 #5 leaves open whether a kernel
 * refuses other kinds; the embedded kernel does (C.8.1 allows it), so that a
 * typo in a kind is a `400` at once instead of a step no policy rule names.
 *
 * @since 0.2.0
 * @internal
 */
export const kinds: ReadonlyArray<string> = ["tool_call", "llm_call", "local"]

/**
 * `400 validation error: unknown step kind "<kind>"` for a kind other than
 * {@link kinds}; part of decoding the submission (C.8.1 step 1), so nothing is
 * looked up or renewed before it.
 *
 * @since 0.2.0
 * @internal
 */
export const checkKind = (kind: string): KernelFailure | undefined =>
  kind === "tool_call" || kind === "llm_call" || kind === "local"
    ? undefined
    : validation("validation error: unknown step kind " + goQuote(kind))

const EMPTY_OBJECT = "{}"

/**
 * The `args_hash` of C.8.1 step 5 (§8.3): `400 validation error: invalid
 * args: …` when the text is not one JSON value (the routes' strict decoding
 * already ensures it is; in-process callers may send anything).
 *
 * @since 0.2.0
 * @internal
 */
export const argsHash = (raw: string | undefined): string | KernelFailure => {
  if (raw === undefined || raw === EMPTY_OBJECT) return StepId.argsHash(raw)
  const canonical = Json.canonicalize(raw)
  return canonical === undefined
    ? validation("validation error: invalid args: not a single JSON value")
    : hash("sha256", canonical, "hex")
}

// ---------------------------------------------------------------------------
// Policy (C.8.1 step 10, C.8.4 fixed rule ids)
// ---------------------------------------------------------------------------

const bundleError = (reason: string): Policy.PolicyResult => ({
  decision: "deny",
  ruleId: "bundle-error",
  reason,
  approval: undefined,
  rateLimit: undefined
})

const agentLookupFailed = bundleError("agent_lookup_failed")
const bundleInvalid = bundleError("policy_bundle_invalid")

/** Bundles compiled again in the other language, when the agent was registered under another stage. */
const recompiled = {
  current: new WeakMap<AgentRecord, Policy.Bundle | undefined>(),
  seed: new WeakMap<AgentRecord, Policy.Bundle | undefined>()
}

/**
 * The agent's (non-empty) bundle in the language of the current or the seed
 * stage; `undefined` when it does not compile in it.
 */
const bundleIn = (agent: AgentRecord, language: "current" | "seed"): Policy.Bundle | undefined => {
  const policy = agent.policy
  if (policy !== undefined && (policy.policyHash !== undefined) === (language === "current")) return policy
  const cache = recompiled[language]
  if (cache.has(agent)) return cache.get(agent)
  const parsed = Policy.parseBundle(agent.policyBundle, { stage: language })
  const bundle = Result.isSuccess(parsed) ? parsed.success : undefined
  cache.set(agent, bundle)
  return bundle
}

/**
 * The seed stage's policy result for an agent whose bundle was stored in the
 * current language (the stage was switched at run time): the bundle compiled
 * again in the seed language, or `bundle-error` / `policy_bundle_invalid`
 * (PROTOCOL 10.1) when it does not compile there.
 *
 * @since 0.2.0
 * @internal
 */
export const evaluateSeedStale = (agent: AgentRecord, input: Policy.PolicyInput): Policy.PolicyResult => {
  const bundle = bundleIn(agent, "seed")
  return bundle === undefined ? bundleInvalid : Policy.evaluate(bundle, input)
}

/**
 * The policy result for a new step (C.8.1 step 10, C.8.4): the execution's
 * own bundle when it has one (a fork's, C.7.2 step 1); else `permissive`
 * without an agent bundle, the agent's bundle otherwise. A bundle stored under
 * another stage is compiled again in the current language, and one that does
 * not compile denies with rule id `bundle-error` and reason
 * `policy_bundle_invalid`; an agent that is gone denies with
 * `agent_lookup_failed`.
 *
 * @since 0.2.0
 * @internal
 */
export const evaluate = (
  state: CoreState,
  ex: ExecState,
  kind: string,
  target: string,
  argsRaw: string | undefined
): Policy.PolicyResult => {
  const own = ex.policy
  if (own !== undefined) return Policy.evaluate(own.bundle, { agentId: ex.record.agentId, kind, target, argsRaw })
  const agent = state.agents.get(ex.record.agentId)
  if (agent === undefined) return agentLookupFailed
  if (agent.policyBundle === "") return Policy.permissive
  const bundle = bundleIn(agent, "current")
  if (bundle === undefined) return bundleInvalid
  return Policy.evaluate(bundle, { agentId: ex.record.agentId, kind, target, argsRaw })
}

// ---------------------------------------------------------------------------
// Judge rules (C.8.6)
// ---------------------------------------------------------------------------

/**
 * A submission stopped at a `judge` rule: ask the judge, then submit again
 * with the {@link Judged} outcome. Nothing but the lease renewal happened.
 *
 * @since 0.2.0
 * @internal
 */
export class JudgeCall {
  readonly _tag = "JudgeCall"
  constructor(
    readonly stepId: string,
    readonly options: Judge.JudgeOptions,
    readonly request: Judge.JudgeRequest
  ) {}
}

/**
 * A judge's outcome for one step and rule, carried into the second half of
 * the submission.
 *
 * @since 0.2.0
 * @internal
 */
export interface Judged {
  readonly stepId: string
  readonly ruleId: string
  readonly outcome: Judge.JudgeOutcome
}

/**
 * A `judge` result turned into an ordinary one (C.8.6): denied with
 * `judge not configured` without a judge; the judged outcome when this step
 * and rule were judged; otherwise a {@link JudgeCall}.
 *
 * @since 0.2.0
 * @internal
 */
export const resolveJudge = (
  state: CoreState,
  ex: ExecState,
  stepId: string,
  kind: string,
  target: string,
  argsRaw: string | undefined,
  result: Policy.PolicyResult,
  judged: Judged | undefined
): Policy.PolicyResult | JudgeCall => {
  const options = result.judge!
  let outcome: Judge.JudgeOutcome
  if (judged !== undefined && judged.stepId === stepId && judged.ruleId === result.ruleId) {
    outcome = judged.outcome
  } else if (state.settings.judge === undefined) {
    outcome = Judge.notConfigured
  } else {
    return new JudgeCall(stepId, options, {
      executionId: ex.record.id,
      agentId: ex.record.agentId,
      kind,
      target,
      argsRaw,
      instructions: options.instructions,
      ruleId: result.ruleId
    })
  }
  return { ...result, decision: outcome.decision, reason: outcome.reason, judge: undefined }
}

const judgedOf = (call: JudgeCall, outcome: Judge.JudgeOutcome): Judged => ({
  stepId: call.stepId,
  ruleId: call.request.ruleId,
  outcome
})

const defectText = (cause: Cause.Cause<unknown>): string => {
  const defect = Cause.findDefect(cause)
  if (Result.isSuccess(defect)) {
    const value = defect.success
    return value instanceof Error ? value.message : String(value)
  }
  return "interrupted"
}

/**
 * Asks the configured judge (C.8.6): its scores decide, and any failure —
 * an error, a defect — gives the rule's fallback, `judge unavailable: <error>`.
 *
 * @since 0.2.0
 * @internal
 */
export const ask = (state: CoreState, call: JudgeCall): Effect.Effect<Judged> => {
  const judge = state.settings.judge
  if (judge === undefined) return Effect.succeed(judgedOf(call, Judge.notConfigured))
  return judge.ask(call.request).pipe(
    Effect.map((scores) => judgedOf(call, Judge.decide(call.options, scores))),
    Effect.catchCause((cause) => {
      const error = Cause.findErrorOption(cause)
      const text = Option.isSome(error) ? error.value.message : defectText(cause)
      return Effect.succeed(judgedOf(call, Judge.unavailable(call.options, text)))
    })
  )
}

/**
 * {@link ask} for the synchronous submit path (the test kit's direct
 * client): a judge that answers at once decides; one that must wait gives
 * the fallback.
 *
 * @since 0.2.0
 * @internal
 */
export const askNow = (state: CoreState, call: JudgeCall): Judged => {
  const exit = Effect.runSyncExit(ask(state, call))
  return Exit.isSuccess(exit)
    ? exit.value
    : judgedOf(call, Judge.unavailable(call.options, "the judge did not answer synchronously"))
}

// ---------------------------------------------------------------------------
// Rate limits (C.8.3)
// ---------------------------------------------------------------------------

/** Executions with a `step.rate_limited` event: they never park (again). */
const rateLimited = new WeakSet<ExecState>()

const PARKED: Decision = { decision: "blocked", reason: "rate_limit_exceeded" }
const REFUSED: Decision = { decision: "rate_limited", reason: "rate_limit_exceeded" }
const UNAVAILABLE: Decision = { decision: "rate_limited", reason: "rate_limiter_unavailable" }

const appendRateLimited = (ex: ExecState, step: StepIdentity, ruleId: string, reason: string, now: number): void => {
  rateLimited.add(ex)
  ex.events.pushStep("step.rate_limited", now, step, { error: Payload.denialError(reason, ruleId), ruleId })
}

/**
 * The rate limit of a policy result (C.8.3); `undefined` lets the step
 * through. Over the limit the step is **refused** — `step.rate_limited`, no
 * step, `{"decision":"rate_limited","reason":"rate_limit_exceeded"}` — when
 * the rule has no `max_wait`, the execution already has a `step.rate_limited`
 * event, or the limiter's estimate exceeds `max_wait`. Otherwise it **parks**:
 * the same event, the execution's dispatches retired, a new dispatch due after
 * the estimate plus a uniform jitter in `[0, estimate/2]` (capped at
 * `max_wait`), and `{"decision":"blocked","reason":"rate_limit_exceeded"}`;
 * the execution stays `running`. A (simulated) limiter error lets the step
 * through unless `on_limiter_error: deny`, which refuses with reason
 * `rate_limiter_unavailable`.
 *
 * @since 0.2.0
 * @internal
 */
export const rateLimit = (
  state: CoreState,
  ex: ExecState,
  step: StepIdentity,
  result: Policy.PolicyResult,
  now: number
): Decision | undefined => {
  const limit = result.rateLimit
  if (!RateLimiter.isActive(limit)) return undefined
  if (state.settings.limiterError) {
    if (limit.onLimiterError !== "deny") return undefined
    appendRateLimited(ex, step, result.ruleId, "rate_limiter_unavailable", now)
    return UNAVAILABLE
  }
  const record = ex.record
  const key = RateLimiter.bucketKey(result.ruleId, limit.perWhat, record.agentId, record.id, record.session)
  const estimateMs = state.limiter.tryTake(key, limit, now)
  if (estimateMs === 0) return undefined
  const maxWaitMs = limit.maxWaitMs ?? 0
  const parks = maxWaitMs > 0 && !rateLimited.has(ex) && estimateMs <= maxWaitMs
  appendRateLimited(ex, step, result.ruleId, "rate_limit_exceeded", now)
  if (!parks) return REFUSED
  const waitMs = Math.min(Math.ceil(estimateMs + state.settings.random() * estimateMs / 2), maxWaitMs)
  Lifecycle.release(state, ex)
  Lifecycle.enqueueDispatch(state, ex, now, now + waitMs)
  return PARKED
}

// ---------------------------------------------------------------------------
// Token budgets (C.8.5)
// ---------------------------------------------------------------------------

const tokensOf = (ex: ExecState): number => {
  let total = 0
  for (const step of ex.order) {
    const usage = step.usage
    if (usage !== undefined) total += usage.inputTokens + usage.outputTokens
  }
  return total
}

/**
 * The token budget of an `allow` (C.8.5): once the tokens recorded on the
 * execution's steps — or on every step of its session, for `scope: session`
 * (an execution outside a session counts its own) — reach `max_tokens`, the
 * decision becomes `on_exceed` with reason `execution_token_budget_exceeded`.
 *
 * @since 0.2.0
 * @internal
 */
export const applyBudget = (state: CoreState, ex: ExecState, result: Policy.PolicyResult): Policy.PolicyResult => {
  const budget = result.budget
  if (budget === undefined || result.decision !== "allow") return result
  const session = budget.scope === "session" ? ex.record.session : undefined
  let used = 0
  if (session !== undefined) {
    for (const member of state.executions.sessions.get(session)?.members ?? [ex]) used += tokensOf(member)
  } else {
    used = tokensOf(ex)
  }
  return used < budget.maxTokens
    ? result
    : { ...result, decision: budget.onExceed, reason: "execution_token_budget_exceeded" }
}

// ---------------------------------------------------------------------------
// Answers and outcomes
// ---------------------------------------------------------------------------

/**
 * A replayed denial (C.8.2): `reason` is the recorded error's `reason`
 * (default `policy_denied`), `rule_id` its `rule_id` (absent when none, e.g.
 * a human denial).
 *
 * @since 0.2.0
 * @internal
 */
export const deniedReplay = (step: StepState): Decision => {
  let reason = "policy_denied"
  let ruleId: string | undefined
  const raw = step.errorRaw
  if (raw !== undefined) {
    try {
      const value: unknown = JSON.parse(raw)
      if (typeof value === "object" && value !== null && !Array.isArray(value)) {
        const error = value as { readonly reason?: unknown; readonly rule_id?: unknown }
        if (typeof error.reason === "string" && error.reason !== "") reason = error.reason
        if (typeof error.rule_id === "string" && error.rule_id !== "") ruleId = error.rule_id
      }
    } catch {
      // not JSON: the defaults
    }
  }
  return ruleId === undefined
    ? { decision: "denied", stepId: step.stepId, reason }
    : { decision: "denied", stepId: step.stepId, reason, ruleId }
}
