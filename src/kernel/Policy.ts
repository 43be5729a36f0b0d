/**
 * Policy bundles of the dev kernel: parsing and validating the YAML bundle an
 * agent is registered with, and evaluating it for each new step. The bundle
 * language follows the kernel's stage:
 *
 * - **seed** and **v0.14.0** (PROTOCOL 10): decoding follows the reference
 *   kernel's YAML decoder (Go `yaml.v3` into typed structs): unknown keys are
 *   ignored, rules are ordered by a unique `priority`, globs are Go
 *   `path.Match`.
 * - **current** (PROTOCOL-CURRENT C.8.6): unknown keys anywhere are rejected,
 *   rules are evaluated in file order (no `priority`), rule ids are unique,
 *   `*` and `?` also match `/` and malformed globs are rejected, and rules may
 *   carry `rate_limit.max_wait`, a token `budget` and a `judge` decision.
 *
 * In both, type mismatches reject the bundle, durations must be Go duration
 * strings, string fields take any scalar as written, regexes are RE2 (via
 * `re2js`), and argument values are compared in their Go `%v` form.
 *
 * @since 0.1.0
 */
import * as Result from "effect/Result"
import { hash } from "node:crypto"
import { RE2JS } from "re2js"
import { type Document, isAlias, isMap, isScalar, isSeq, parseAllDocuments, type Scalar, type YAMLMap, type YAMLSeq } from "yaml"
import * as Duration from "./internal/duration.js"
import * as Glob from "./internal/glob.js"
import * as GoFormat from "./internal/goFormat.js"
import type { JudgedDecision, JudgeOptions } from "./internal/judge.js"
import type { Stage } from "./internal/model.js"
import * as TargetGlob from "./internal/targetGlob.js"

export {
  /**
   * Scores how likely each decision is right for a proposed step (C.8.6).
   *
   * @since 0.2.0
   * @category judge
   */
  decide as judgeDecide,
  /**
   * A judge that failed to answer.
   *
   * @since 0.2.0
   * @category judge
   */
  JudgeError,
  /**
   * The outcome of a `judge` rule on a kernel without a judge: deny,
   * `judge not configured` (C.8.6).
   *
   * @since 0.2.0
   * @category judge
   */
  notConfigured as judgeNotConfigured,
  /**
   * A judge asking a chat model of any OpenAI-compatible endpoint.
   *
   * @since 0.2.0
   * @category judge
   */
  openAiJudge
} from "./internal/judge.js"

export type {
  /**
   * A judge: the kernel's `judge` setting.
   *
   * @since 0.2.0
   * @category judge
   */
  Judge,
  /**
   * The decisions a judge scores.
   *
   * @since 0.2.0
   * @category judge
   */
  JudgedDecision,
  /**
   * A `judge` rule's options.
   *
   * @since 0.2.0
   * @category judge
   */
  JudgeOptions,
  /**
   * What a judge is asked about.
   *
   * @since 0.2.0
   * @category judge
   */
  JudgeRequest,
  /**
   * A judge's scores.
   *
   * @since 0.2.0
   * @category judge
   */
  JudgeScores,
  /**
   * Options of `openAiJudge`.
   *
   * @since 0.2.0
   * @category judge
   */
  OpenAiJudgeOptions
} from "./internal/judge.js"

// ---------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------

/**
 * The decisions a rule may give (10.2); `judge` only in the current stage's
 * language (C.8.6). The dev kernel rejects any other value at load time
 * (deliberate difference 16.3 #7).
 *
 * @since 0.1.0
 * @category models
 */
export type Decision = "allow" | "deny" | "require_approval" | "judge"

/**
 * `then.rate_limit` of a rule (10.5). Active only when `maxCalls > 0` and
 * `windowMs > 0`. `perWhat` and `onLimiterError` are kept as written (`""`
 * when absent); see `RateLimiter.bucketKey` for how `perWhat` is read.
 *
 * @since 0.1.0
 * @category models
 */
export interface RateLimit {
  readonly maxCalls: number
  readonly windowMs: number
  readonly perWhat: string
  readonly onLimiterError: string
  /**
   * Current stage only (C.8.3): how long a refused step may park the
   * execution; absent or `0` refuses at once.
   */
  readonly maxWaitMs?: number | undefined
}

/**
 * `then.budget` of a rule (current stage, C.8.5): once the tokens recorded on
 * the execution's (or session's) steps reach `maxTokens`, an `allow` of the
 * rule becomes `onExceed` with reason `execution_token_budget_exceeded`.
 *
 * @since 0.2.0
 * @category models
 */
export interface Budget {
  readonly maxTokens: number
  readonly scope: "execution" | "session"
  readonly onExceed: "deny" | "require_approval"
}

/**
 * `then.approval_config` of a rule. `approvers` is `null` when absent
 * (anyone may decide); an explicitly empty list stays `[]`. `timeoutMs` 0
 * means the kernel default.
 *
 * @since 0.1.0
 * @category models
 */
export interface ApprovalConfig {
  readonly approvers: ReadonlyArray<string> | null
  readonly timeoutMs: number
  readonly message: string
}

/**
 * One `arguments` predicate of a rule (10.4). Empty constraints are "no
 * constraint"; at least one is non-empty in a loaded bundle.
 *
 * @since 0.1.0
 * @category models
 */
export interface ArgumentPredicate {
  readonly equals: string
  readonly contains: string
  readonly oneOf: ReadonlyArray<string>
  readonly regex: string
  /** The compiled `regex`; `undefined` when `regex` is empty. */
  readonly compiled: RE2JS | undefined
}

/**
 * The `when` of a rule. Empty strings, empty lists and an empty `arguments`
 * map are absent conditions.
 *
 * @since 0.1.0
 * @category models
 */
export interface Condition {
  readonly target: string
  readonly targets: ReadonlyArray<string>
  readonly agentId: string
  readonly agentIds: ReadonlyArray<string>
  readonly stepKind: string
  readonly arguments: ReadonlyMap<string, ArgumentPredicate>
  /**
   * Current stage only: `target` and `targets` compiled with the current
   * glob rules (C.8.6); absent in seed bundles, which match with `path.Match`.
   */
  readonly matchTarget?: ((target: string) => boolean) | undefined
}

/**
 * The `then` of a rule. `rateLimit` is `undefined` when the rule has no
 * `rate_limit` block; `approval` carries the defaults when the rule has no
 * `approval_config`.
 *
 * @since 0.1.0
 * @category models
 */
export interface Outcome {
  readonly decision: Decision
  readonly reason: string
  readonly approval: ApprovalConfig
  readonly rateLimit: RateLimit | undefined
  /** Current stage only: the rule's token budget (C.8.5). */
  readonly budget?: Budget | undefined
  /** Current stage only: the options of a `judge` decision (C.8.6). */
  readonly judge?: JudgeOptions | undefined
}

/**
 * A validated rule. Its `rule_id` is always its `id`. In a current-stage
 * bundle `priority` is the rule's position in the file.
 *
 * @since 0.1.0
 * @category models
 */
export interface Rule {
  readonly id: string
  readonly priority: number
  readonly when: Condition
  readonly then: Outcome
}

/**
 * A validated bundle. `rules` are in evaluation order: by ascending (unique)
 * priority in the seed language, in file order in the current one.
 * `defaultAction` is kept as written: only `"allow"` allows.
 *
 * @since 0.1.0
 * @category models
 */
export interface Bundle {
  readonly defaultAction: string
  readonly rules: ReadonlyArray<Rule>
  /**
   * Set for bundles in the current stage's language only: the lowercase hex
   * SHA-256 of the YAML text, recorded as `policy_hash` (C.8.4).
   */
  readonly policyHash?: string | undefined
}

/**
 * What policy is evaluated for (7.3 step 11): the execution's agent id, the
 * submitted kind and target, and the raw `args` JSON text (absent when the
 * member was not sent).
 *
 * @since 0.1.0
 * @category models
 */
export interface PolicyInput {
  readonly agentId: string
  readonly kind: string
  readonly target: string
  readonly argsRaw: string | undefined
}

/**
 * The result of evaluating a policy. `approval` and `rateLimit` are only
 * set for results that come from a rule.
 *
 * @since 0.1.0
 * @category models
 */
export interface PolicyResult {
  /** `allow`, `deny` or `require_approval` (or `judge`, current stage). */
  readonly decision: string
  readonly ruleId: string
  /** The rule's reason as written; `""` when it has none. */
  readonly reason: string
  readonly approval: ApprovalConfig | undefined
  readonly rateLimit: RateLimit | undefined
  /** Current stage: the deciding bundle's {@link Bundle.policyHash}. */
  readonly policyHash?: string | undefined
  /** Current stage: the rule's token budget. */
  readonly budget?: Budget | undefined
  /** Current stage: the options of a `judge` rule. */
  readonly judge?: JudgeOptions | undefined
}

// ---------------------------------------------------------------------------
// Fixed results
// ---------------------------------------------------------------------------

/**
 * The result for an agent without a bundle (10.1): `allow`, rule id
 * `permissive`, no reason, no rate limit.
 *
 * @since 0.1.0
 * @category constants
 */
export const permissive: PolicyResult = {
  decision: "allow",
  ruleId: "permissive",
  reason: "",
  approval: undefined,
  rateLimit: undefined
}

/**
 * The result for an unmatched `local` step, whatever the default (10.3).
 *
 * @since 0.1.0
 * @category constants
 */
export const localStep: PolicyResult = {
  decision: "allow",
  ruleId: "local",
  reason: "local step",
  approval: undefined,
  rateLimit: undefined
}

/**
 * The result when no rule matched and `default_action` is `allow`.
 *
 * @since 0.1.0
 * @category constants
 */
export const defaultAllow: PolicyResult = {
  decision: "allow",
  ruleId: "default",
  reason: "default allow",
  approval: undefined,
  rateLimit: undefined
}

/**
 * The result when no rule matched and `default_action` is anything but
 * `allow` (including absent).
 *
 * @since 0.1.0
 * @category constants
 */
export const defaultDeny: PolicyResult = {
  decision: "deny",
  ruleId: "default",
  reason: "no explicit allow rule matched",
  approval: undefined,
  rateLimit: undefined
}

// ---------------------------------------------------------------------------
// YAML decoding (the reference decodes with gopkg.in/yaml.v3 into structs)
// ---------------------------------------------------------------------------

/** How yaml.v3 resolves a plain scalar (resolve.go), for the types that matter here. */
type Resolved =
  | { readonly tag: "null" }
  | { readonly tag: "bool" }
  | { readonly tag: "int"; readonly value: bigint }
  | { readonly tag: "float"; readonly value: number }
  | { readonly tag: "str" }

const STR: Resolved = { tag: "str" }
const NULL: Resolved = { tag: "null" }
const BOOL: Resolved = { tag: "bool" }

const yamlStyleFloat = /^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$/
const goFloatFromDot = /^\.[0-9]+([eE][-+]?[0-9]+)?$/
const digitsOf: Readonly<Record<number, RegExp>> = { 2: /^[01]+$/, 8: /^[0-7]+$/, 10: /^[0-9]+$/, 16: /^[0-9a-fA-F]+$/ }

/** Go `strconv.ParseInt(s, 0, 64)` / `ParseUint` without the range check. */
const goParseInteger = (text: string, allowSign: boolean): bigint | undefined => {
  let s = text
  let negative = false
  if (s.startsWith("+") || s.startsWith("-")) {
    if (!allowSign) return undefined
    negative = s[0] === "-"
    s = s.slice(1)
  }
  let base = 10
  if (s.length >= 2 && s[0] === "0") {
    const prefix = s[1]!.toLowerCase()
    if (prefix === "x") {
      base = 16
      s = s.slice(2)
    } else if (prefix === "o") {
      base = 8
      s = s.slice(2)
    } else if (prefix === "b") {
      base = 2
      s = s.slice(2)
    } else {
      base = 8
      s = s.slice(1)
    }
  }
  if (!digitsOf[base]!.test(s)) return undefined
  const magnitude = base === 10 ? BigInt(s) : BigInt((base === 16 ? "0x" : base === 8 ? "0o" : "0b") + s)
  return negative ? -magnitude : magnitude
}

const INT64_MIN = -(1n << 63n)
const INT64_MAX = (1n << 63n) - 1n
const UINT64_MAX = (1n << 64n) - 1n

const resolvePlain = (text: string): Resolved => {
  switch (text) {
    case "":
    case "~":
    case "null":
    case "Null":
    case "NULL":
      return NULL
    case "true":
    case "True":
    case "TRUE":
    case "false":
    case "False":
    case "FALSE":
      return BOOL
    case ".nan":
    case ".NaN":
    case ".NAN":
      return { tag: "float", value: NaN }
    case ".inf":
    case ".Inf":
    case ".INF":
    case "+.inf":
    case "+.Inf":
    case "+.INF":
      return { tag: "float", value: Infinity }
    case "-.inf":
    case "-.Inf":
    case "-.INF":
      return { tag: "float", value: -Infinity }
  }
  const first = text[0]!
  if (first === ".") {
    return goFloatFromDot.test(text) ? { tag: "float", value: Number(text) } : STR
  }
  if (!(first === "+" || first === "-" || (first >= "0" && first <= "9"))) return STR
  const plain = text.replaceAll("_", "")
  const signed = goParseInteger(plain, true)
  if (signed !== undefined && signed >= INT64_MIN && signed <= INT64_MAX) return { tag: "int", value: signed }
  const unsigned = goParseInteger(plain, false)
  if (unsigned !== undefined && unsigned <= UINT64_MAX) return { tag: "int", value: unsigned }
  if (yamlStyleFloat.test(plain)) return { tag: "float", value: Number(plain) }
  return STR
}

/** A YAML node after alias resolution, as the struct decoder sees it. */
type View =
  | { readonly kind: "null" }
  | { readonly kind: "scalar"; readonly text: string; readonly resolved: Resolved }
  | { readonly kind: "map"; readonly node: YAMLMap }
  | { readonly kind: "seq"; readonly node: YAMLSeq }
  | { readonly kind: "error" }

const STR_TAG = "tag:yaml.org,2002:str"

/** Where a value sits, for messages: `rule "x"` + `then.rate_limit.window`. */
interface Loc {
  readonly label: string
  readonly path: string
}

const at = (loc: Loc, key: string): Loc => ({ label: loc.label, path: loc.path === "" ? key : `${loc.path}.${key}` })
const atIndex = (loc: Loc, index: number): Loc => ({ label: loc.label, path: `${loc.path}[${index}]` })

interface Decoder {
  readonly doc: Document.Parsed
  readonly errors: Array<string>
  aliasBudget: number
  /** Current-stage decoding: unknown keys are errors (C.8.6). */
  readonly strict?: boolean
}

const report = (d: Decoder, loc: Loc, problem: string): void => {
  d.errors.push([loc.label, loc.path, problem].filter((part) => part !== "").join(": "))
}

const describe = (v: View): string => {
  switch (v.kind) {
    case "map":
      return "a map"
    case "seq":
      return "a list"
    case "scalar":
      return v.resolved.tag === "str" ? GoFormat.quote(v.text) : v.text
    default:
      return "nothing"
  }
}

const view = (d: Decoder, loc: Loc, node: unknown): View => {
  let current = node
  while (isAlias(current)) {
    if (--d.aliasBudget < 0) {
      report(d, loc, "too many alias expansions")
      return { kind: "error" }
    }
    const target = current.resolve(d.doc)
    if (target === undefined) {
      report(d, loc, `unknown anchor ${GoFormat.quote(current.source)} referenced`)
      return { kind: "error" }
    }
    current = target
  }
  if (current === null || current === undefined) return { kind: "null" }
  if (isScalar(current)) {
    const scalar = current as Scalar
    const text = typeof scalar.source === "string" ? scalar.source : String(scalar.value ?? "")
    const quoted = scalar.type !== undefined && scalar.type !== "PLAIN"
    const resolved = quoted || scalar.tag === STR_TAG ? STR : resolvePlain(text)
    return resolved.tag === "null" ? { kind: "null" } : { kind: "scalar", text, resolved }
  }
  if (isMap(current)) return { kind: "map", node: current as YAMLMap }
  if (isSeq(current)) return { kind: "seq", node: current as YAMLSeq }
  report(d, loc, "unsupported YAML node")
  return { kind: "error" }
}

interface Entry {
  readonly key: string
  readonly value: unknown
}

const isMergeKey = (key: unknown): boolean =>
  isScalar(key) && (key.type === undefined || key.type === "PLAIN") && key.source === "<<"

/** The entries of a mapping in document order, with `<<` merges applied (explicit keys win). */
const entriesOf = (d: Decoder, loc: Loc, node: YAMLMap, depth = 0): ReadonlyArray<Entry> => {
  const entries: Array<Entry> = []
  const merges: Array<unknown> = []
  for (const pair of node.items) {
    if (isMergeKey(pair.key)) {
      merges.push(pair.value)
      continue
    }
    const key = view(d, loc, pair.key)
    switch (key.kind) {
      case "scalar":
        entries.push({ key: key.text, value: pair.value })
        break
      case "map":
      case "seq":
        report(d, loc, `mapping key must be a scalar, got ${describe(key)}`)
        break
      default:
        // null keys are skipped by the reference decoder
        break
    }
  }
  if (merges.length === 0) return entries
  if (depth > 32) {
    report(d, loc, "merge keys nested too deeply")
    return entries
  }
  const seen = new Set(entries.map((e) => e.key))
  const mergeFrom = (source: View): void => {
    if (source.kind !== "map") {
      if (source.kind !== "error") report(d, loc, `merge value must be a map, got ${describe(source)}`)
      return
    }
    for (const entry of entriesOf(d, loc, source.node, depth + 1)) {
      if (seen.has(entry.key)) continue
      seen.add(entry.key)
      entries.push(entry)
    }
  }
  for (const merge of merges) {
    const source = view(d, loc, merge)
    if (source.kind === "seq") {
      for (const item of source.node.items) mergeFrom(view(d, loc, item))
    } else {
      mergeFrom(source)
    }
  }
  return entries
}

/** A string field: any scalar as written; null → `""`. */
const decodeString = (d: Decoder, loc: Loc, node: unknown): string => {
  const v = view(d, loc, node)
  if (v.kind === "scalar") return v.text
  if (v.kind === "map" || v.kind === "seq") report(d, loc, `expected a string, got ${describe(v)}`)
  return ""
}

/** An `int` field: YAML integers, and floats truncated toward zero (as yaml.v3 does). */
const decodeInt = (d: Decoder, loc: Loc, node: unknown): number => {
  const v = view(d, loc, node)
  if (v.kind === "null" || v.kind === "error") return 0
  if (v.kind === "scalar") {
    const r = v.resolved
    if (r.tag === "int" && r.value >= INT64_MIN && r.value <= INT64_MAX) return Number(r.value)
    if (r.tag === "float" && Number.isFinite(r.value) && r.value >= -(2 ** 63) && r.value < 2 ** 63) {
      return Math.trunc(r.value) + 0
    }
  }
  report(d, loc, `expected an integer, got ${describe(v)}`)
  return 0
}

/** A `time.Duration` field: only a string in Go duration syntax; a bare number is an error. */
const decodeDuration = (d: Decoder, loc: Loc, node: unknown): number => {
  const v = view(d, loc, node)
  if (v.kind === "null" || v.kind === "error") return 0
  if (v.kind === "scalar") {
    if (v.resolved.tag === "str") {
      const ms = Duration.parseMillis(v.text)
      if (ms !== undefined) return ms
      report(d, loc, `invalid duration ${GoFormat.quote(v.text)}`)
      return 0
    }
    if (v.resolved.tag === "int" || v.resolved.tag === "float") {
      report(d, loc, `invalid duration ${v.text} (a bare number; write a duration string with a unit, e.g. "${v.text}s")`)
      return 0
    }
  }
  report(d, loc, `expected a duration string, got ${describe(v)}`)
  return 0
}

/** A `[]string` field: `null` when absent/null; null items are dropped (as yaml.v3 does). */
const decodeStringList = (d: Decoder, loc: Loc, node: unknown): ReadonlyArray<string> | null => {
  const v = view(d, loc, node)
  if (v.kind === "null" || v.kind === "error") return null
  if (v.kind !== "seq") {
    report(d, loc, `expected a list, got ${describe(v)}`)
    return null
  }
  const out: Array<string> = []
  v.node.items.forEach((item, index) => {
    const element = view(d, atIndex(loc, index), item)
    if (element.kind === "scalar") out.push(element.text)
    else if (element.kind === "map" || element.kind === "seq") {
      report(d, atIndex(loc, index), `expected a string, got ${describe(element)}`)
    }
  })
  return out
}

/** A struct field: its entries, or `undefined` when absent/null (or wrong, after reporting). */
const decodeStruct = (d: Decoder, loc: Loc, node: unknown): ReadonlyArray<Entry> | undefined => {
  const v = view(d, loc, node)
  if (v.kind === "map") return entriesOf(d, loc, v.node)
  if (v.kind === "scalar" || v.kind === "seq") report(d, loc, `expected a map, got ${describe(v)}`)
  return undefined
}

/** How one key of a struct decodes: into which field, with which decoder. */
type FieldOf<A> = { readonly [K in keyof A]: readonly [K, (d: Decoder, loc: Loc, node: unknown) => A[K]] }[keyof A]

/** The message for a key the current stage's language does not know (C.8.6). */
const unknownKey = (key: string): string =>
  key === "priority"
    ? `unknown key "priority" (rules are evaluated in file order; remove priority and order the rules instead)`
    : `unknown key ${GoFormat.quote(key)}`

/**
 * A struct's fields from its entries: each known key decoded into its field
 * (unknown keys ignored, as the reference's decoder does — or reported, when
 * decoding the current stage's language), the rest defaults.
 */
const fieldsFrom = <A extends object>(
  d: Decoder,
  loc: Loc,
  entries: ReadonlyArray<Entry>,
  defaults: A,
  fields: { readonly [key: string]: FieldOf<A> }
): A => {
  const out: { -readonly [K in keyof A]: A[K] } = { ...defaults }
  for (const e of entries) {
    if (!Object.prototype.hasOwnProperty.call(fields, e.key)) {
      if (d.strict === true) report(d, loc, unknownKey(e.key))
      continue
    }
    const [name, decode] = fields[e.key]!
    out[name] = decode(d, at(loc, e.key), e.value)
  }
  return out
}

/** A struct (see {@link fieldsFrom}); `undefined`, reported unless null, when the node is not a map. */
const decodeFields = <A extends object>(
  d: Decoder,
  loc: Loc,
  node: unknown,
  defaults: A,
  fields: { readonly [key: string]: FieldOf<A> }
): A | undefined => {
  const entries = decodeStruct(d, loc, node)
  return entries === undefined ? undefined : fieldsFrom(d, loc, entries, defaults, fields)
}

/** A list of strings; absent or null → `[]`. */
const decodeStrings = (d: Decoder, loc: Loc, node: unknown): ReadonlyArray<string> => decodeStringList(d, loc, node) ?? []

interface RawPredicate {
  readonly equals: string
  readonly contains: string
  readonly oneOf: ReadonlyArray<string>
  readonly regex: string
}

const noPredicate: RawPredicate = { equals: "", contains: "", oneOf: [], regex: "" }

const decodePredicate = (d: Decoder, loc: Loc, node: unknown): RawPredicate =>
  decodeFields(d, loc, node, noPredicate, {
    equals: ["equals", decodeString],
    contains: ["contains", decodeString],
    one_of: ["oneOf", decodeStrings],
    regex: ["regex", decodeString]
  }) ?? noPredicate

interface RawCondition {
  readonly target: string
  readonly targets: ReadonlyArray<string>
  readonly agentId: string
  readonly agentIds: ReadonlyArray<string>
  readonly stepKind: string
  readonly arguments: ReadonlyArray<readonly [string, RawPredicate]>
}

const emptyCondition: RawCondition = { target: "", targets: [], agentId: "", agentIds: [], stepKind: "", arguments: [] }

const decodeArguments = (
  d: Decoder,
  loc: Loc,
  node: unknown
): ReadonlyArray<readonly [string, RawPredicate]> => {
  const args = new Map<string, RawPredicate>()
  for (const arg of decodeStruct(d, loc, node) ?? []) args.set(arg.key, decodePredicate(d, at(loc, arg.key), arg.value))
  return [...args]
}

const decodeCondition = (d: Decoder, loc: Loc, node: unknown): RawCondition =>
  decodeFields(d, loc, node, emptyCondition, {
    target: ["target", decodeString],
    targets: ["targets", decodeStrings],
    agent_id: ["agentId", decodeString],
    agent_ids: ["agentIds", decodeStrings],
    step_kind: ["stepKind", decodeString],
    arguments: ["arguments", decodeArguments]
  }) ?? emptyCondition

const noApproval: ApprovalConfig = { approvers: null, timeoutMs: 0, message: "" }

const decodeApproval = (d: Decoder, loc: Loc, node: unknown): ApprovalConfig =>
  decodeFields(d, loc, node, noApproval, {
    approvers: ["approvers", decodeStringList],
    timeout: ["timeoutMs", decodeDuration],
    message: ["message", decodeString]
  }) ?? noApproval

const noRateLimit: RateLimit = { maxCalls: 0, windowMs: 0, perWhat: "", onLimiterError: "" }

const decodeRateLimit = (d: Decoder, loc: Loc, node: unknown): RateLimit | undefined =>
  decodeFields(d, loc, node, noRateLimit, {
    max_calls: ["maxCalls", decodeInt],
    window: ["windowMs", decodeDuration],
    per_what: ["perWhat", decodeString],
    on_limiter_error: ["onLimiterError", decodeString]
  })

interface RawOutcome {
  readonly decision: string
  readonly reason: string
  readonly approval: ApprovalConfig
  readonly rateLimit: RateLimit | undefined
}

const emptyOutcome: RawOutcome = { decision: "", reason: "", approval: noApproval, rateLimit: undefined }

const decodeOutcome = (d: Decoder, loc: Loc, node: unknown): RawOutcome =>
  decodeFields(d, loc, node, emptyOutcome, {
    decision: ["decision", decodeString],
    reason: ["reason", decodeString],
    approval_config: ["approval", decodeApproval],
    rate_limit: ["rateLimit", decodeRateLimit]
  }) ?? emptyOutcome

interface RawRule {
  readonly id: string
  readonly priority: number
  readonly when: RawCondition
  readonly then: RawOutcome
}

const emptyRule: RawRule = { id: "", priority: 0, when: emptyCondition, then: emptyOutcome }

const decodeRule = (d: Decoder, index: number, node: unknown): RawRule | undefined => {
  const fallback: Loc = { label: `rules[${index}]`, path: "" }
  const v = view(d, fallback, node)
  if (v.kind === "null" || v.kind === "error") return undefined // yaml.v3 drops null list items
  if (v.kind !== "map") {
    report(d, fallback, `expected a map, got ${describe(v)}`)
    return undefined
  }
  const entries = entriesOf(d, fallback, v.node)
  // label messages with the rule's id when it has a usable one
  let loc = fallback
  const idEntry = entries.find((e) => e.key === "id")
  if (idEntry !== undefined) {
    const idView = view({ ...d, errors: [] }, fallback, idEntry.value)
    if (idView.kind === "scalar" && idView.text !== "") loc = { label: `rule ${GoFormat.quote(idView.text)}`, path: "" }
  }
  return fieldsFrom(d, loc, entries, emptyRule, {
    id: ["id", decodeString],
    priority: ["priority", decodeInt],
    when: ["when", decodeCondition],
    then: ["then", decodeOutcome]
  })
}

interface RawBundle {
  readonly defaultAction: string
  readonly rules: ReadonlyArray<RawRule>
}

const decodeBundle = (d: Decoder, root: unknown): RawBundle => {
  const top: Loc = { label: "", path: "" }
  const v = view(d, { label: "bundle", path: "" }, root)
  if (v.kind === "null" || v.kind === "error") return { defaultAction: "", rules: [] }
  if (v.kind !== "map") {
    report(d, { label: "bundle", path: "" }, `expected a map, got ${describe(v)}`)
    return { defaultAction: "", rules: [] }
  }
  let defaultAction = ""
  const rules: Array<RawRule> = []
  for (const e of entriesOf(d, top, v.node)) {
    switch (e.key) {
      case "default_action":
        defaultAction = decodeString(d, at(top, e.key), e.value)
        break
      case "rules": {
        const list = view(d, at(top, e.key), e.value)
        if (list.kind === "seq") {
          list.node.items.forEach((item, index) => {
            const rule = decodeRule(d, index, item)
            if (rule !== undefined) rules.push(rule)
          })
        } else if (list.kind === "map" || list.kind === "scalar") {
          report(d, at(top, e.key), `expected a list, got ${describe(list)}`)
        }
        break
      }
    }
  }
  return { defaultAction, rules }
}

/** The first line of a `yaml` package error, without its code frame. */
const yamlErrorText = (message: string): string => {
  const line = message.split("\n")[0] ?? message
  return `yaml: ${line.replace(/:$/, "")}`
}

// ---------------------------------------------------------------------------
// Validation (10.2 load-time checks, in the reference's order)
// ---------------------------------------------------------------------------

const isDecision = (s: string): s is Decision => s === "allow" || s === "deny" || s === "require_approval"

const validate = (raw: RawBundle): Result.Result<Bundle, string> => {
  const seen = new Map<number, string>()
  for (const rule of raw.rules) {
    if (rule.id === "") return Result.fail("rule missing id")
    const previous = seen.get(rule.priority)
    if (previous !== undefined) {
      return Result.fail(
        `duplicate priority ${rule.priority} used by ${GoFormat.quote(previous)} and ${GoFormat.quote(rule.id)}`
      )
    }
    seen.set(rule.priority, rule.id)
  }
  const sorted = [...raw.rules].sort((a, b) => a.priority - b.priority)
  const rules: Array<Rule> = []
  for (const rule of sorted) {
    const id = GoFormat.quote(rule.id)
    const args = new Map<string, ArgumentPredicate>()
    for (const [key, p] of rule.when.arguments) {
      if (p.equals === "" && p.contains === "" && p.regex === "" && p.oneOf.length === 0) {
        return Result.fail(
          `rule ${id} argument ${GoFormat.quote(key)} has no constraint (equals/contains/one_of/regex); an empty predicate matches any value`
        )
      }
      let compiled: RE2JS | undefined = undefined
      if (p.regex !== "") {
        try {
          compiled = RE2JS.compile(p.regex)
        } catch (error) {
          const detail = error instanceof Error ? error.message : String(error)
          return Result.fail(`rule ${id} argument ${GoFormat.quote(key)} invalid regex: ${detail}`)
        }
      }
      args.set(key, { ...p, compiled })
    }
    const decision = rule.then.decision
    if (!isDecision(decision)) {
      return Result.fail(
        decision === ""
          ? `rule ${id}: then.decision is required (allow, deny or require_approval)`
          : `rule ${id}: unknown policy decision ${GoFormat.quote(decision)} (want allow, deny or require_approval)`
      )
    }
    rules.push({
      id: rule.id,
      priority: rule.priority,
      when: { ...rule.when, arguments: args },
      then: { ...rule.then, decision }
    })
  }
  return Result.succeed({ defaultAction: raw.defaultAction, rules })
}

// ---------------------------------------------------------------------------
// The current stage's language (PROTOCOL-CURRENT C.8.6)
// ---------------------------------------------------------------------------

/** A float field (YAML integers and floats); `undefined` when absent or null. */
const decodeFloat = (d: Decoder, loc: Loc, node: unknown): number | undefined => {
  const v = view(d, loc, node)
  if (v.kind === "null" || v.kind === "error") return undefined
  if (v.kind === "scalar") {
    const r = v.resolved
    if (r.tag === "int") return Number(r.value)
    if (r.tag === "float") return r.value
  }
  report(d, loc, `expected a number, got ${describe(v)}`)
  return undefined
}

const noRateLimitCurrent: RateLimit = { maxCalls: 0, windowMs: 0, perWhat: "", onLimiterError: "", maxWaitMs: 0 }

const decodeRateLimitCurrent = (d: Decoder, loc: Loc, node: unknown): RateLimit | undefined =>
  decodeFields(d, loc, node, noRateLimitCurrent, {
    max_calls: ["maxCalls", decodeInt],
    window: ["windowMs", decodeDuration],
    per_what: ["perWhat", decodeString],
    max_wait: ["maxWaitMs", decodeDuration],
    on_limiter_error: ["onLimiterError", decodeString]
  })

interface RawBudget {
  readonly maxTokens: number
  readonly scope: string
  readonly onExceed: string
}

const noBudget: RawBudget = { maxTokens: 0, scope: "", onExceed: "" }

const decodeBudget = (d: Decoder, loc: Loc, node: unknown): RawBudget | undefined =>
  decodeFields(d, loc, node, noBudget, {
    max_tokens: ["maxTokens", decodeInt],
    scope: ["scope", decodeString],
    on_exceed: ["onExceed", decodeString]
  })

interface RawJudge {
  readonly instructions: string
  readonly threshold: number | undefined
  readonly fallback: string
}

const noJudge: RawJudge = { instructions: "", threshold: undefined, fallback: "" }

const decodeJudge = (d: Decoder, loc: Loc, node: unknown): RawJudge | undefined =>
  decodeFields(d, loc, node, noJudge, {
    instructions: ["instructions", decodeString],
    threshold: ["threshold", decodeFloat],
    fallback: ["fallback", decodeString]
  })

interface RawOutcomeCurrent extends RawOutcome {
  readonly budget: RawBudget | undefined
  readonly judge: RawJudge | undefined
}

const emptyOutcomeCurrent: RawOutcomeCurrent = { ...emptyOutcome, budget: undefined, judge: undefined }

const decodeOutcomeCurrent = (d: Decoder, loc: Loc, node: unknown): RawOutcomeCurrent =>
  decodeFields(d, loc, node, emptyOutcomeCurrent, {
    decision: ["decision", decodeString],
    reason: ["reason", decodeString],
    approval_config: ["approval", decodeApproval],
    rate_limit: ["rateLimit", decodeRateLimitCurrent],
    budget: ["budget", decodeBudget],
    judge: ["judge", decodeJudge]
  }) ?? emptyOutcomeCurrent

interface RawRuleCurrent {
  readonly index: number
  readonly id: string
  readonly when: RawCondition
  readonly then: RawOutcomeCurrent
}

const decodeRuleCurrent = (d: Decoder, index: number, node: unknown): RawRuleCurrent | undefined => {
  const fallback: Loc = { label: `rules[${index}]`, path: "" }
  const v = view(d, fallback, node)
  if (v.kind === "error") return undefined
  if (v.kind !== "map") {
    report(d, fallback, `expected a map, got ${describe(v)}`)
    return undefined
  }
  const entries = entriesOf(d, fallback, v.node)
  let loc = fallback
  const idEntry = entries.find((e) => e.key === "id")
  if (idEntry !== undefined) {
    const idView = view({ ...d, errors: [] }, fallback, idEntry.value)
    if (idView.kind === "scalar" && idView.text !== "") loc = { label: `rule ${GoFormat.quote(idView.text)}`, path: "" }
  }
  const rule = fieldsFrom(d, loc, entries, { id: "", when: emptyCondition, then: emptyOutcomeCurrent }, {
    id: ["id", decodeString],
    when: ["when", decodeCondition],
    then: ["then", decodeOutcomeCurrent]
  })
  return { index, ...rule }
}

const decodeBundleCurrent = (
  d: Decoder,
  root: unknown
): { readonly defaultAction: string; readonly rules: ReadonlyArray<RawRuleCurrent> } => {
  const top: Loc = { label: "", path: "" }
  const v = view(d, { label: "bundle", path: "" }, root)
  if (v.kind === "null" || v.kind === "error") return { defaultAction: "", rules: [] }
  if (v.kind !== "map") {
    report(d, { label: "bundle", path: "" }, `expected a map, got ${describe(v)}`)
    return { defaultAction: "", rules: [] }
  }
  let defaultAction = ""
  const rules: Array<RawRuleCurrent> = []
  for (const e of entriesOf(d, top, v.node)) {
    switch (e.key) {
      case "default_action":
        defaultAction = decodeString(d, at(top, e.key), e.value)
        break
      case "rules": {
        const list = view(d, at(top, e.key), e.value)
        if (list.kind === "seq") {
          list.node.items.forEach((item, index) => {
            const rule = decodeRuleCurrent(d, index, item)
            if (rule !== undefined) rules.push(rule)
          })
        } else if (list.kind === "map" || list.kind === "scalar") {
          report(d, at(top, e.key), `expected a list, got ${describe(list)}`)
        }
        break
      }
      default:
        report(d, { label: "bundle", path: "" }, unknownKey(e.key))
    }
  }
  return { defaultAction, rules }
}

const oneOf = (value: string, allowed: ReadonlyArray<string>): boolean => value === "" || allowed.includes(value)

const listed = (values: ReadonlyArray<string>): string =>
  values.slice(0, -1).join(", ") + " or " + values[values.length - 1]

const isJudgedDecision = (s: string): s is JudgedDecision => s === "allow" || s === "deny" || s === "require_approval"

/** The predicates of `when.arguments`, checked and compiled (10.2 checks 4–5). */
const compileArguments = (
  id: string,
  raw: RawCondition["arguments"]
): Result.Result<ReadonlyMap<string, ArgumentPredicate>, string> => {
  const args = new Map<string, ArgumentPredicate>()
  for (const [key, p] of raw) {
    if (p.equals === "" && p.contains === "" && p.regex === "" && p.oneOf.length === 0) {
      return Result.fail(
        `rule ${id} argument ${GoFormat.quote(key)} has no constraint (equals/contains/one_of/regex); an empty predicate matches any value`
      )
    }
    let compiled: RE2JS | undefined = undefined
    if (p.regex !== "") {
      try {
        compiled = RE2JS.compile(p.regex)
      } catch (error) {
        const detail = error instanceof Error ? error.message : String(error)
        return Result.fail(`rule ${id} argument ${GoFormat.quote(key)} invalid regex: ${detail}`)
      }
    }
    args.set(key, { ...p, compiled })
  }
  return Result.succeed(args)
}

/** `target` and `targets` of a current-stage rule as one matcher; malformed globs are errors. */
const compileTargets = (
  id: string,
  when: RawCondition
): Result.Result<((target: string) => boolean) | undefined, string> => {
  let single: ((target: string) => boolean) | undefined
  if (when.target !== "") {
    const compiled = TargetGlob.compile(when.target)
    if (Result.isFailure(compiled)) {
      return Result.fail(`rule ${id}: when.target: malformed glob ${GoFormat.quote(when.target)}: ${compiled.failure}`)
    }
    single = compiled.success
  }
  const any: Array<(target: string) => boolean> = []
  for (const [index, pattern] of when.targets.entries()) {
    const compiled = TargetGlob.compile(pattern)
    if (Result.isFailure(compiled)) {
      return Result.fail(
        `rule ${id}: when.targets[${index}]: malformed glob ${GoFormat.quote(pattern)}: ${compiled.failure}`
      )
    }
    any.push(compiled.success)
  }
  if (single === undefined && any.length === 0) return Result.succeed(undefined)
  return Result.succeed((target) =>
    (single === undefined || single(target)) && (any.length === 0 || any.some((match) => match(target)))
  )
}

/** The `then` of a current-stage rule, checked (C.8.3, C.8.5, C.8.6). */
const checkOutcome = (id: string, then: RawOutcomeCurrent): Result.Result<Outcome, string> => {
  const decision = then.decision
  if (!(isJudgedDecision(decision) || decision === "judge")) {
    return Result.fail(
      decision === ""
        ? `rule ${id}: then.decision is required (allow, deny, require_approval or judge)`
        : `rule ${id}: unknown policy decision ${GoFormat.quote(decision)} (want allow, deny, require_approval or judge)`
    )
  }
  const rate = then.rateLimit
  if (rate !== undefined) {
    const perWhat = ["execution", "session", "agent", "global"]
    if (!oneOf(rate.perWhat, perWhat)) {
      return Result.fail(
        `rule ${id}: then.rate_limit.per_what must be ${listed(perWhat)}, got ${GoFormat.quote(rate.perWhat)}`
      )
    }
    if (!oneOf(rate.onLimiterError, ["allow", "deny"])) {
      return Result.fail(
        `rule ${id}: then.rate_limit.on_limiter_error must be allow or deny, got ${GoFormat.quote(rate.onLimiterError)}`
      )
    }
    if ((rate.maxWaitMs ?? 0) < 0) return Result.fail(`rule ${id}: then.rate_limit.max_wait must not be negative`)
  }
  let budget: Budget | undefined
  if (then.budget !== undefined) {
    const b = then.budget
    if (b.maxTokens <= 0) return Result.fail(`rule ${id}: then.budget.max_tokens must be positive`)
    if (!oneOf(b.scope, ["execution", "session"])) {
      return Result.fail(`rule ${id}: then.budget.scope must be execution or session, got ${GoFormat.quote(b.scope)}`)
    }
    if (!oneOf(b.onExceed, ["deny", "require_approval"])) {
      return Result.fail(
        `rule ${id}: then.budget.on_exceed must be deny or require_approval, got ${GoFormat.quote(b.onExceed)}`
      )
    }
    budget = {
      maxTokens: b.maxTokens,
      scope: b.scope === "session" ? "session" : "execution",
      onExceed: b.onExceed === "require_approval" ? "require_approval" : "deny"
    }
  }
  let judge: JudgeOptions | undefined
  if (decision === "judge") {
    const j = then.judge ?? noJudge
    if (j.instructions.trim() === "") return Result.fail(`rule ${id}: then.judge.instructions is required`)
    const threshold = j.threshold ?? 0.6
    if (!(threshold >= 0 && threshold <= 1)) {
      return Result.fail(`rule ${id}: then.judge.threshold must be between 0 and 1`)
    }
    const fallback = j.fallback === "" ? "require_approval" : j.fallback
    if (!isJudgedDecision(fallback)) {
      return Result.fail(
        `rule ${id}: then.judge.fallback must be allow, deny or require_approval, got ${GoFormat.quote(fallback)}`
      )
    }
    judge = { instructions: j.instructions, threshold, fallback }
  } else if (then.judge !== undefined) {
    return Result.fail(`rule ${id}: then.judge is only valid with decision judge`)
  }
  return Result.succeed({
    decision,
    reason: then.reason,
    approval: then.approval,
    rateLimit: rate,
    ...(budget === undefined ? {} : { budget }),
    ...(judge === undefined ? {} : { judge })
  })
}

const validateCurrent = (
  raw: { readonly defaultAction: string; readonly rules: ReadonlyArray<RawRuleCurrent> },
  policyHash: string
): Result.Result<Bundle, string> => {
  const seen = new Set<string>()
  const rules: Array<Rule> = []
  for (const rule of raw.rules) {
    if (rule.id === "") return Result.fail(`rules[${rule.index}]: rule missing id`)
    const id = GoFormat.quote(rule.id)
    if (seen.has(rule.id)) return Result.fail(`duplicate rule id ${id} (rule ids must be unique)`)
    seen.add(rule.id)
    const args = compileArguments(id, rule.when.arguments)
    if (Result.isFailure(args)) return Result.fail(args.failure)
    const matchTarget = compileTargets(id, rule.when)
    if (Result.isFailure(matchTarget)) return Result.fail(matchTarget.failure)
    const then = checkOutcome(id, rule.then)
    if (Result.isFailure(then)) return Result.fail(then.failure)
    rules.push({
      id: rule.id,
      priority: rule.index,
      when: { ...rule.when, arguments: args.success, matchTarget: matchTarget.success },
      then: then.success
    })
  }
  return Result.succeed({ defaultAction: raw.defaultAction, rules, policyHash })
}

/**
 * Options of {@link parseBundle}.
 *
 * @since 0.2.0
 * @category parsing
 */
export interface ParseOptions {
  /**
   * The stage whose bundle language to read (default `"current"`): the
   * current stage's (C.8.6), or the seed language for `"seed"` and
   * `"v0.14.0"` (10.2).
   */
  readonly stage?: Stage | undefined
}

/**
 * Parses and validates a policy bundle in the language of a stage. On
 * failure the `Left` is the detail that follows `invalid policy bundle: ` in
 * kernel messages.
 *
 * - **current** (C.8.6, the default): e.g. `rules[0]: rule missing id`,
 *   `duplicate rule id "a" (rule ids must be unique)`,
 *   `rule "x": unknown key "priority" (…)`,
 *   `rule "x": when.target: malformed glob "[a": unclosed character class`.
 *   The bundle's `policyHash` is the SHA-256 of the text.
 * - **seed** / **v0.14.0** (10.2): e.g. `rule missing id`,
 *   `duplicate priority 0 used by "a" and "b"` or
 *   `rule "x": then.rate_limit.window: invalid duration "300"`.
 *
 * Only the first YAML document is read, as by the reference. Text without a
 * document (`""`, whitespace, comments) gives an empty bundle, which denies
 * by default; callers treat an empty bundle string as "no policy" instead.
 *
 * @since 0.1.0
 * @category parsing
 */
export const parseBundle = (yamlText: string, options?: ParseOptions): Result.Result<Bundle, string> => {
  const current = (options?.stage ?? "current") === "current"
  const empty = (): Bundle =>
    current ? { defaultAction: "", rules: [], policyHash: hash("sha256", yamlText, "hex") } : { defaultAction: "", rules: [] }
  const docs = parseAllDocuments(yamlText, { prettyErrors: true, uniqueKeys: true })
  if ("empty" in docs) {
    return docs.errors.length > 0
      ? Result.fail(yamlErrorText(docs.errors[0]!.message))
      : Result.succeed(empty())
  }
  const first = docs[0]
  if (first === undefined) return Result.succeed(empty())
  if (first.errors.length > 0) return Result.fail(yamlErrorText(first.errors[0]!.message))
  if (current) {
    const d: Decoder = { doc: first, errors: [], aliasBudget: 10_000, strict: true }
    const raw = decodeBundleCurrent(d, first.contents)
    if (d.errors.length > 0) return Result.fail(d.errors[0]!)
    return validateCurrent(raw, hash("sha256", yamlText, "hex"))
  }
  const d: Decoder = { doc: first, errors: [], aliasBudget: 10_000 }
  const raw = decodeBundle(d, first.contents)
  if (d.errors.length > 0) return Result.fail(d.errors[0]!)
  return validate(raw)
}

// ---------------------------------------------------------------------------
// Evaluation (10.3, 10.4)
// ---------------------------------------------------------------------------

const loneSurrogate = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g

/** Go's JSON decoder turns escaped lone surrogates into U+FFFD. */
const wellFormed = (s: string): string => s.replace(loneSurrogate, "\ufffd")

/**
 * Converts `JSON.parse` output to what Go decodes into `any`; not `ok` when Go
 * would fail. Iterative, as arguments may nest up to the decoder's 10,000
 * levels: a container is converted to an empty array or map at once and queued
 * with its source, and the queue is drained filling each from its source.
 */
const toGoValue = (value: unknown): { readonly ok: boolean; readonly value: unknown } => {
  const queue: Array<readonly [source: unknown, target: Array<unknown> | Map<string, unknown>]> = []
  let ok = true
  const convert = (u: unknown): unknown => {
    if (typeof u === "string") return wellFormed(u)
    if (typeof u === "number") {
      if (!Number.isFinite(u)) ok = false
      return u
    }
    if (Array.isArray(u)) {
      const items: Array<unknown> = []
      queue.push([u, items])
      return items
    }
    if (u !== null && typeof u === "object") {
      const members = new Map<string, unknown>()
      queue.push([u, members])
      return members
    }
    return u
  }
  const converted = convert(value)
  while (ok && queue.length > 0) {
    const [source, target] = queue.pop()!
    if (Array.isArray(target)) {
      for (const item of source as ReadonlyArray<unknown>) target.push(convert(item))
    } else {
      for (const [key, member] of Object.entries(source as object)) target.set(wellFormed(key), convert(member))
    }
  }
  return { ok, value: converted }
}

/** `args` as a JSON object, or `undefined` when absent, invalid, `null` or not an object. */
const parseArgs = (raw: string | undefined): ReadonlyMap<string, unknown> | undefined => {
  if (raw === undefined) return undefined
  let parsed: unknown
  try {
    parsed = JSON.parse(raw)
  } catch {
    return undefined
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) return undefined
  const converted = toGoValue(parsed)
  return converted.ok ? (converted.value as ReadonlyMap<string, unknown>) : undefined
}

const predicateHolds = (p: ArgumentPredicate, s: string): boolean =>
  (p.equals === "" || p.equals === s) &&
  (p.contains === "" || s.includes(p.contains)) &&
  (p.oneOf.length === 0 || p.oneOf.includes(s)) &&
  (p.compiled === undefined || p.compiled.matcher(s).find())

/**
 * Whether a rule's `when` holds for an input (10.4). `args` is parsed lazily,
 * at most once per evaluation.
 */
const conditionHolds = (
  when: Condition,
  input: PolicyInput,
  args: () => ReadonlyMap<string, unknown> | undefined
): boolean => {
  if (when.matchTarget !== undefined) {
    if (!when.matchTarget(input.target)) return false
  } else {
    if (when.target !== "" && !Glob.match(when.target, input.target)) return false
    if (when.targets.length > 0 && !when.targets.some((pattern) => Glob.match(pattern, input.target))) return false
  }
  if (when.agentId !== "" && when.agentId !== input.agentId) return false
  if (when.agentIds.length > 0 && !when.agentIds.includes(input.agentId)) return false
  if (when.stepKind !== "" && when.stepKind !== input.kind) return false
  if (when.arguments.size > 0) {
    const object = args()
    if (object === undefined) return false
    for (const [key, predicate] of when.arguments) {
      if (!object.has(key)) return false
      if (!predicateHolds(predicate, GoFormat.formatValue(object.get(key)))) return false
    }
  }
  return true
}

/**
 * Evaluates a policy for a new step (10.1, 10.3; C.8.6): {@link permissive}
 * without a bundle; otherwise the first rule (by ascending priority, or in
 * file order for a current-stage bundle) whose `when` holds, then
 * {@link localStep} for an unmatched `local` step, then the default
 * ({@link defaultAllow} / {@link defaultDeny}). Results from a current-stage
 * bundle carry its `policyHash` and the rule's `budget` and `judge`.
 *
 * @since 0.1.0
 * @category evaluation
 */
export const evaluate = (bundle: Bundle | undefined, input: PolicyInput): PolicyResult => {
  if (bundle === undefined) return permissive
  let parsed = false
  let args: ReadonlyMap<string, unknown> | undefined
  const lazyArgs = () => {
    if (!parsed) {
      parsed = true
      args = parseArgs(input.argsRaw)
    }
    return args
  }
  const policyHash = bundle.policyHash
  for (const rule of bundle.rules) {
    if (conditionHolds(rule.when, input, lazyArgs)) return ruleResult(rule, policyHash)
  }
  const fallthrough = input.kind === "local" ? localStep : bundle.defaultAction === "allow" ? defaultAllow : defaultDeny
  return policyHash === undefined ? fallthrough : fallthroughResult(bundle, fallthrough, policyHash)
}

// Results are immutable and every step the same rule decides gets an equal one:
// each is built once (the kernel's decision events keep the result they carry).
const ruleResults = new WeakMap<Rule, PolicyResult>()
const fallthroughResults = new WeakMap<Bundle, Map<PolicyResult, PolicyResult>>()

/** The result of a matching rule, with the bundle's hash when it has one. */
const ruleResult = (rule: Rule, policyHash: string | undefined): PolicyResult => {
  const known = ruleResults.get(rule)
  if (known !== undefined && known.policyHash === policyHash) return known
  const then = rule.then
  const result: PolicyResult = policyHash === undefined
    ? {
      decision: then.decision,
      ruleId: rule.id,
      reason: then.reason,
      approval: then.approval,
      rateLimit: then.rateLimit
    }
    : {
      decision: then.decision,
      ruleId: rule.id,
      reason: then.reason,
      approval: then.approval,
      rateLimit: then.rateLimit,
      policyHash,
      budget: then.budget,
      judge: then.judge
    }
  ruleResults.set(rule, result)
  return result
}

/** A fixed result with a current-stage bundle's hash. */
const fallthroughResult = (bundle: Bundle, fallthrough: PolicyResult, policyHash: string): PolicyResult => {
  let known = fallthroughResults.get(bundle)
  if (known === undefined) {
    known = new Map()
    fallthroughResults.set(bundle, known)
  }
  const cached = known.get(fallthrough)
  if (cached !== undefined && cached.policyHash === policyHash) return cached
  const result = { ...fallthrough, policyHash }
  known.set(fallthrough, result)
  return result
}
