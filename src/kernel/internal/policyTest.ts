/**
 * The policy test of the current stage, `POST /v0/policies/{agent_id}/test`
 * (PROTOCOL-CURRENT C.8.6): a bundle evaluated against cases, or against the
 * recorded steps of an execution, without storing it. The protocol names the
 * route but gives no body; the format here is the embedded kernel's own
 * (README "Testing a policy bundle"):
 *
 * - request: `{"bundle":"<yaml>","cases":[…]}` or
 *   `{"bundle":"<yaml>","execution_id":"<id>"}`, exactly one of the two;
 * - a case: `{"name"?,"kind"? (default tool_call),"target" (required),
 *   "args"? (default {}),"agent_id"? (default the path's),"expect"?,
 *   "expect_rule"?}`, unknown keys rejected;
 * - answer: `{"passed","results":[{"name","kind","target","decision",
 *   "rule_id","reason"[,"rate_limit"][,"budget"][,"expect"][,"expect_rule"],
 *   "passed"}],"unreached_rules":[…]}`.
 *
 * Evaluation is {@link Policy.evaluate} alone: no judge is asked (a `judge`
 * rule answers `judge`), no rate limit or budget is counted or consumed.
 *
 * @since 0.2.0
 * @internal
 */
import * as Json from "../../internal/wire/json.js"
import * as Policy from "../Policy.js"
import * as RateLimiter from "../RateLimiter.js"
import { kinds } from "./decisions.js"
import { goQuote } from "./goQuote.js"
import type { EventRecord, KernelFailure } from "./model.js"
import { validation } from "./model.js"

/**
 * The decisions a case may expect (those a rule may give, C.8.6).
 *
 * @since 0.2.0
 * @internal
 */
export const decisions: ReadonlyArray<string> = ["allow", "deny", "require_approval", "judge"]

/**
 * One case: what is evaluated and what is expected.
 *
 * @since 0.2.0
 * @internal
 */
export interface TestCase {
  readonly name: string
  readonly kind: string
  readonly target: string
  /** The raw JSON text of `args`. */
  readonly argsRaw: string
  readonly agentId: string
  readonly expect?: string | undefined
  readonly expectRule?: string | undefined
  /**
   * A case replayed from an execution: a `judge` decision of the rule that
   * decided the recorded step matches the recorded decision (the judge is not
   * asked again).
   */
  readonly replayed?: boolean | undefined
}

/**
 * The outcome of one case.
 *
 * @since 0.2.0
 * @internal
 */
export interface CaseResult {
  readonly testCase: TestCase
  readonly result: Policy.PolicyResult
  readonly passed: boolean
}

/**
 * The outcome of a run.
 *
 * @since 0.2.0
 * @internal
 */
export interface Report {
  readonly passed: boolean
  readonly results: ReadonlyArray<CaseResult>
  /** The ids of the bundle's rules no case reached, in file order. */
  readonly unreachedRules: ReadonlyArray<string>
}

// ---------------------------------------------------------------------------
// Bundle
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------

const CASE_KEYS = ["name", "kind", "target", "args", "agent_id", "expect", "expect_rule"]

const caseError = (index: number, problem: string): KernelFailure =>
  validation(`validation error: cases[${index}]: ${problem}`)

/** A string member: `null` or absent is `""`; anything else but a string is `undefined`. */
const stringMember = (raw: string | undefined): string | undefined =>
  raw === undefined || raw === "null" ? "" : Json.parseString(raw)

/**
 * The `cases` member: a JSON array of case objects, each decoded strictly
 * (unknown keys, wrong types, an empty `target`, an unknown `kind` or
 * `expect` are a `400 validation error: cases[<i>]: …`).
 *
 * @since 0.2.0
 * @internal
 */
export const decodeCases = (raw: string, pathAgentId: string): ReadonlyArray<TestCase> | KernelFailure => {
  const items = Json.parseArrayElements(raw)
  if (items === undefined) return validation("validation error: cases must be a list of objects")
  const out: Array<TestCase> = []
  for (let i = 0; i < items.length; i++) {
    const members = Json.parseObjectMembers(items[i]!)
    if (members === undefined) return caseError(i, "not an object")
    for (const key of members.keys()) {
      if (!CASE_KEYS.includes(key)) return caseError(i, "unknown key " + goQuote(key))
    }
    const strings: Record<string, string> = {}
    for (const key of ["name", "kind", "target", "agent_id", "expect", "expect_rule"]) {
      const value = stringMember(members.get(key))
      if (value === undefined) return caseError(i, key + " must be a string")
      strings[key] = value
    }
    const kind = strings.kind === "" ? "tool_call" : strings.kind!
    if (!kinds.includes(kind)) return caseError(i, "unknown step kind " + goQuote(kind))
    if (strings.target === "") return caseError(i, "target is required")
    const expect = strings.expect!
    if (expect !== "" && !decisions.includes(expect)) return caseError(i, "unknown decision " + goQuote(expect))
    const args = members.get("args")
    out.push({
      name: strings.name === "" ? `cases[${i}]` : strings.name!,
      kind,
      target: strings.target!,
      argsRaw: args === undefined ? "{}" : Json.compact(args) ?? args,
      agentId: strings.agent_id === "" ? pathAgentId : strings.agent_id!,
      expect: expect === "" ? undefined : expect,
      expectRule: strings.expect_rule === "" ? undefined : strings.expect_rule
    })
  }
  return out
}

// ---------------------------------------------------------------------------
// Replay
// ---------------------------------------------------------------------------

/** The decision event types of a new step and the decision each records. */
const recordedDecision: Readonly<Record<string, string>> = {
  "step.allowed": "allow",
  "step.denied": "deny",
  "step.awaiting_approval": "require_approval"
}

/** Rule ids the kernel records for denials no bundle decided (7.3 step 10). */
const notFromPolicy = new Set(["__indeterminate_retry"])

interface Proposed {
  readonly stepId: string
  readonly kind: string
  readonly target: string
  decision?: string
  ruleId?: string
}

const parsePayload = (payload: string): Record<string, unknown> | undefined => {
  try {
    const value: unknown = JSON.parse(payload)
    return typeof value === "object" && value !== null && !Array.isArray(value)
      ? value as Record<string, unknown>
      : undefined
  } catch {
    return undefined
  }
}

const str = (value: unknown): string => typeof value === "string" ? value : ""

/**
 * The cases of an execution replay: every step proposed in its event log, in
 * order, with the decision and rule id recorded when it was submitted (its
 * first `step.allowed`, `step.denied` or `step.awaiting_approval` event, so a
 * later approval does not count) as `expect` and `expect_rule`. A step whose
 * `allow` a token budget turned around (`execution_token_budget_exceeded`)
 * expects the rule's `allow`; denials the bundle did not decide
 * (`__indeterminate_retry`) are left out. Each case is named by its step id
 * and evaluated for the execution's agent with the step's recorded `args`.
 *
 * @since 0.2.0
 * @internal
 */
export const replayCases = (
  events: ReadonlyArray<EventRecord>,
  agentId: string,
  argsOf: (stepId: string) => string | undefined
): ReadonlyArray<TestCase> => {
  const order: Array<Proposed> = []
  const byId = new Map<string, Proposed>()
  for (const event of events) {
    if (event.type === "step.proposed") {
      const payload = parsePayload(event.payload)
      if (payload === undefined) continue
      const stepId = str(payload.step_id)
      if (byId.has(stepId)) continue
      const proposed: Proposed = { stepId, kind: str(payload.step_type), target: str(payload.target) }
      order.push(proposed)
      byId.set(stepId, proposed)
      continue
    }
    const decision = recordedDecision[event.type]
    if (decision === undefined) continue
    const payload = parsePayload(event.payload)
    if (payload === undefined) continue
    const proposed = byId.get(str(payload.step_id))
    if (proposed === undefined || proposed.decision !== undefined) continue
    const error = typeof payload.error === "object" && payload.error !== null
      ? payload.error as Record<string, unknown>
      : {}
    const reason = str(payload.reason) || str(error.reason)
    proposed.decision = reason === "execution_token_budget_exceeded" ? "allow" : decision
    proposed.ruleId = str(payload.rule_id) || str(error.rule_id)
  }
  const out: Array<TestCase> = []
  for (const step of order) {
    if (step.decision === undefined || notFromPolicy.has(step.ruleId ?? "")) continue
    out.push({
      name: step.stepId,
      kind: step.kind,
      target: step.target,
      argsRaw: argsOf(step.stepId) ?? "{}",
      agentId,
      expect: step.decision,
      expectRule: step.ruleId === "" ? undefined : step.ruleId,
      replayed: true
    })
  }
  return out
}

// ---------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------

/**
 * Evaluates every case with {@link Policy.evaluate} (no judge, no rate limit
 * or budget counted): a case passes when its `expect` and `expect_rule`, as
 * far as given, are the evaluation's decision and rule id. The run passes
 * when every case does.
 *
 * @since 0.2.0
 * @internal
 */
export const run = (bundle: Policy.Bundle | undefined, cases: ReadonlyArray<TestCase>): Report => {
  const reached = new Set<string>()
  const results: Array<CaseResult> = []
  let passed = true
  for (const testCase of cases) {
    const result = Policy.evaluate(bundle, {
      agentId: testCase.agentId,
      kind: testCase.kind,
      target: testCase.target,
      argsRaw: testCase.argsRaw
    })
    reached.add(result.ruleId)
    const decisionOk = testCase.expect === undefined || testCase.expect === result.decision ||
      (testCase.replayed === true && result.decision === "judge" && result.ruleId === testCase.expectRule)
    const ruleOk = testCase.expectRule === undefined || testCase.expectRule === result.ruleId
    const ok = decisionOk && ruleOk
    if (!ok) passed = false
    results.push({ testCase, result, passed: ok })
  }
  const unreachedRules = (bundle?.rules ?? []).map((rule) => rule.id).filter((id) => !reached.has(id))
  return { passed, results, unreachedRules }
}

const list = <A>(items: ReadonlyArray<A>, encode: (a: A) => string): string => "[" + items.map(encode).join(",") + "]"

const encodeResult = (r: CaseResult): string => {
  const c = r.testCase
  let out = "{\"name\":" + Json.quoteString(c.name) + ",\"kind\":" + Json.quoteString(c.kind) + ",\"target\":" +
    Json.quoteString(c.target) + ",\"decision\":" + Json.quoteString(r.result.decision) + ",\"rule_id\":" +
    Json.quoteString(r.result.ruleId) + ",\"reason\":" + Json.quoteString(r.result.reason)
  if (RateLimiter.isActive(r.result.rateLimit)) out += ",\"rate_limit\":true"
  if (r.result.budget !== undefined) out += ",\"budget\":true"
  if (c.expect !== undefined) out += ",\"expect\":" + Json.quoteString(c.expect)
  if (c.expectRule !== undefined) out += ",\"expect_rule\":" + Json.quoteString(c.expectRule)
  return out + ",\"passed\":" + r.passed + "}"
}

/**
 * The answer of a run (without the trailing newline the routes add). Empty
 * lists are `[]`.
 *
 * @since 0.2.0
 * @internal
 */
export const encodeReport = (report: Report): string =>
  "{\"passed\":" + report.passed + ",\"results\":" + list(report.results, encodeResult) + ",\"unreached_rules\":" +
  list(report.unreachedRules, Json.quoteString) + "}"
