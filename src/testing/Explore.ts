/**
 * Crash exploration and determinism checks for agents, on the test kit.
 * `Explore.crashes` runs an agent once without interruption to learn its
 * sequence of kernel calls, then re-runs it in a fresh execution for every
 * step boundary with a crash injected there (before and after each submit,
 * before and after each step complete / fail, before the outcome post), plus
 * one run whose lease lapses mid-run while the old run stays alive. Each run
 * must end like the uninterrupted one, no `at_most_once` body may run twice,
 * no recorded outcome may be lost, the replay must submit the same steps, and a
 * fenced run must write nothing. `Explore.determinism` replays a finished run
 * and reports the first step whose identity (kind, target, arguments) changed.
 *
 * Every run is a new execution, so the ids the kernel makes for it differ
 * from the uninterrupted run's: its execution id, its step ids (which
 * include the execution id) and its dispatch ids.
 * An agent that passes a step id to a provider as an idempotency key (as it
 * should) and reports what came back would differ on every run; so before
 * comparing, each run's ids — in outputs, failure reasons and step arguments,
 * whole or as a run of at least 8 hex digits cut from one — are replaced by
 * the uninterrupted run's ids for the same thing (a step: the same kind,
 * target, arguments and occurrence). A value the kit cannot map, such as a
 * hash of a step id, is left out of the comparison with `ignore` (paths like
 * `$.receipt.token` or `$.items[*].id`) or rewritten with `normalize`.
 *
 * The kit counts step bodies from the kernel's side: a body starts when the
 * agent receives `proceed` for its step. Side effects of the bodies themselves
 * are the caller's: every exploration run executes them again, so bodies
 * should be idempotent or count their effects for the test to check.
 *
 * @example
 * ```ts
 * import { expect, it } from "@effect/vitest"
 * import { Effect, Schema } from "effect"
 * import { Agent, Tool } from "effect-rebuno"
 * import { Explore, TestKernel } from "effect-rebuno/testing"
 *
 * const reverse = Tool.make("reverse", {
 *   args: Schema.Struct({ text: Schema.String }),
 *   success: Schema.Struct({ reversed: Schema.String }),
 *   execute: ({ text }) => Effect.succeed({ reversed: Array.from(text).reverse().join("") })
 * })
 *
 * const wordCount = Tool.make("word_count", {
 *   args: Schema.Struct({ text: Schema.String }),
 *   success: Schema.Struct({ count: Schema.Number }),
 *   execute: ({ text }) => Effect.succeed({ count: text.split(/\s+/).filter((word) => word !== "").length })
 * })
 *
 * const hello = Agent.make({
 *   id: "hello",
 *   input: Schema.Struct({ query: Schema.String }),
 *   output: Schema.Struct({ query: Schema.String, reversed: Schema.String, word_count: Schema.Number }),
 *   handler: ({ query }) =>
 *     Effect.gen(function*() {
 *       const { reversed } = yield* reverse({ text: query })
 *       const { count } = yield* wordCount({ text: query })
 *       return { query, reversed, word_count: count }
 *     })
 * })
 *
 * it.effect("survives a crash anywhere", () =>
 *   Effect.gen(function*() {
 *     const report = yield* Explore.crashes(hello, { query: "a b" })
 *     expect(report.points.length).toBe(10)
 *     yield* Explore.determinism(hello, { query: "a b" })
 *   }).pipe(Effect.provide(TestKernel.layer({ agents: [hello] }))))
 * ```
 *
 * @since 0.1.0
 */
import { Duration, Effect, Schema } from "effect"
import type * as Agent from "../Agent.js"
import type * as Core from "../kernel/Core.js"
import type * as Protocol from "../Protocol.js"
import { canonicalJson } from "../StepId.js"
import { TestKernel } from "./TestKernel.js"
import type { CrashPoint, KernelCall, RunResult, RunStep, StepCallName } from "./TestKernel.js"

const CrashPointSchema: Schema.Codec<CrashPoint> = Schema.Union([
  Schema.Struct({ afterSteps: Schema.Number }),
  Schema.Struct({
    call: Schema.Literals([
      "submitStep",
      "completeStep",
      "failStep",
      "completeExecution",
      "failExecution",
      "registerResource",
      "bindResource",
      "publishCheckpoints"
    ]),
    index: Schema.Number,
    when: Schema.Literals(["before", "after"])
  })
])

/**
 * A step's identity as the kernel hashes it: kind, target and arguments.
 *
 * @since 0.1.0
 * @category models
 */
export const StepIdentity = Schema.Struct({
  kind: Schema.String,
  target: Schema.String,
  /** The arguments (parsed JSON). */
  args: Schema.Unknown
})

/**
 * @since 0.1.0
 * @category models
 */
export type StepIdentity = typeof StepIdentity.Type

/**
 * Crash exploration found a point where the agent does not survive a crash (or
 * a lease lapse). The message names the point and what went wrong, e.g.
 * `crash before completeStep #1 (step "charge_card"): output differed: expected {…} got {…}`;
 * `point` reproduces it: `kernel.run(agent, input, { crash: point })` (or
 * `{ lapse: point }` when `mode` is `"lapse"`), with `recovery: "immediate"`
 * unless the exploration used `"lease"`.
 *
 * @since 0.1.0
 * @category errors
 */
export class CrashExplorationError extends Schema.TaggedError<CrashExplorationError>(
  "effect-rebuno/testing/CrashExplorationError"
)("CrashExplorationError", {
  agentId: Schema.String,
  /** `"baseline"` when the uninterrupted run itself is unusable. */
  mode: Schema.Literals(["crash", "lapse", "baseline"]),
  point: Schema.optional(CrashPointSchema),
  /** The point in words, e.g. `crash before completeStep #1 (step "charge_card")`. */
  description: Schema.String,
  reason: Schema.String,
  /** The execution of the failing run. */
  executionId: Schema.String
}) {
  override get message(): string {
    return `${this.description}: ${this.reason}`
  }
}

/**
 * A replay submitted a different step than the original run at the same
 * position: the agent is not deterministic, so its recorded steps do not
 * line up on replay (they re-run instead of replaying).
 *
 * @since 0.1.0
 * @category errors
 */
export class DeterminismError extends Schema.TaggedError<DeterminismError>("effect-rebuno/testing/DeterminismError")(
  "DeterminismError",
  {
    agentId: Schema.String,
    executionId: Schema.String,
    /** The position (0-based) of the first differing submit; `undefined` when the run never replayed. */
    index: Schema.optional(Schema.Number),
    expected: Schema.optional(StepIdentity),
    actual: Schema.optional(StepIdentity),
    /** Path-level differences of the arguments, e.g. `$.query: "a" → "b"`. */
    differences: Schema.Array(Schema.String),
    reason: Schema.String
  }
) {
  override get message(): string {
    return this.reason
  }
}

/**
 * Options of {@link crashes}.
 *
 * @since 0.1.0
 * @category models
 */
export interface CrashesOptions {
  /**
   * How a crashed run's lease lapses: `"immediate"` (default) so the replay runs
   * at the same virtual time as the uninterrupted run did (outputs that carry
   * `Step.now` stay comparable), or `"lease"` after the lease timeout, as in
   * production.
   */
  readonly recovery?: "immediate" | "lease" | undefined
  /**
   * The lease-lapse run: `true` (default) at a point chosen mid-run (before the
   * outcome of the last `safe_to_retry` step is recorded), a point of your own,
   * or `false` for none.
   */
  readonly lapse?: boolean | CrashPoint | undefined
  /**
   * Map outputs before comparing them (e.g. to drop a timestamp). It gets
   * the recorded output (JSON) with the run's execution-specific ids
   * already replaced by the uninterrupted run's and the `ignore` paths left
   * out.
   */
  readonly normalize?: ((output: unknown) => unknown) | undefined
  /**
   * Parts of the output left out of the comparison, as paths in the
   * notation of the kit's messages: `$.token`, `$.receipt["key-id"]`,
   * `$.items[0].id`, `$.items[*].id` (`*`: every key or index), or `$` for
   * the whole output. For values made from execution-specific ids that the
   * kit cannot map back (a hash of a step id, a provider's own id), or that
   * legitimately change from run to run.
   *
   * @since 0.2.0
   */
  readonly ignore?: ReadonlyArray<string> | undefined
  /** Virtual-time limit of each run (default 1 hour). */
  readonly timeout?: Duration.Input | undefined
}

/**
 * How often a step's body started in a run.
 *
 * @since 0.1.0
 * @category models
 */
export interface BodyRuns {
  readonly stepId: string
  readonly kind: string
  readonly target: string
  readonly idempotency: "safe_to_retry" | "at_most_once"
  readonly runs: number
}

/**
 * The outcome of one explored point.
 *
 * @since 0.1.0
 * @category models
 */
export interface PointReport {
  readonly mode: "crash" | "lapse"
  readonly point: CrashPoint
  readonly description: string
  readonly executionId: string
  readonly status: Protocol.ExecutionStatus
  /** The recorded output (JSON), with this run's own ids. */
  readonly output: unknown
  /** Absent when the run has none. */
  readonly failureReason?: string | undefined
  readonly deliveries: number
  /**
   * `"same"`: same status and output as the uninterrupted run. `"indeterminate"`:
   * the point lies inside an `at_most_once` step (after its `proceed`, before its
   * outcome was recorded), so the replay saw an indeterminate `ToolError`; such
   * points are compared with each other instead.
   */
  readonly verdict: "same" | "indeterminate"
  readonly bodyRuns: ReadonlyArray<BodyRuns>
}

/**
 * What {@link crashes} explored.
 *
 * @since 0.1.0
 * @category models
 */
export interface CrashReport {
  readonly agentId: string
  readonly baseline: {
    readonly executionId: string
    readonly status: Protocol.ExecutionStatus
    /** The recorded output (JSON). */
    readonly output: unknown
    /** Absent when the run has none. */
    readonly failureReason?: string | undefined
    readonly calls: ReadonlyArray<KernelCall>
  }
  readonly points: ReadonlyArray<PointReport>
  /** Executions run, the uninterrupted one included. */
  readonly runs: number
}

/**
 * What {@link determinism} checked.
 *
 * @since 0.1.0
 * @category models
 */
export interface DeterminismReport {
  readonly executionId: string
  /** The steps the original run submitted, in order; the replay submitted the same. */
  readonly steps: ReadonlyArray<StepIdentity>
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const stepCalls: ReadonlySet<string> = new Set<StepCallName>([
  "submitStep",
  "completeStep",
  "failStep",
  "completeExecution",
  "failExecution"
])

const isOutcomeCall = (call: string): boolean => call === "completeExecution" || call === "failExecution"

const MAX_SHOWN = 120

const show = (value: unknown): string => {
  if (value === undefined) return "(absent)"
  const text = stableStringify(value)
  return text.length > MAX_SHOWN ? text.slice(0, MAX_SHOWN - 1) + "…" : text
}

/** JSON with sorted keys, for comparisons and messages. */
const stableStringify = (value: unknown): string => {
  if (value === undefined) return "undefined"
  if (value === null || typeof value !== "object") return JSON.stringify(value) ?? String(value)
  if (Array.isArray(value)) return "[" + value.map(stableStringify).join(",") + "]"
  const record = value as Record<string, unknown>
  return "{" +
    Object.keys(record).sort().filter((k) => record[k] !== undefined).map((k) =>
      JSON.stringify(k) + ":" + stableStringify(record[k])
    ).join(",") + "}"
}

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/

const child = (path: string, key: string | number): string =>
  typeof key === "number" ? `${path}[${key}]` : IDENTIFIER.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`

/**
 * Path-level differences between two JSON values, e.g. `$.query: "a" → "b"`.
 *
 * @since 0.1.0
 * @category helpers
 */
export const jsonDiff = (expected: unknown, actual: unknown, limit = 8): ReadonlyArray<string> => {
  const out: Array<string> = []
  const walk = (a: unknown, b: unknown, path: string): void => {
    if (out.length >= limit) return
    const bothObjects = typeof a === "object" && a !== null && typeof b === "object" && b !== null
    if (bothObjects && Array.isArray(a) === Array.isArray(b)) {
      if (Array.isArray(a) && Array.isArray(b)) {
        for (let i = 0; i < Math.max(a.length, b.length); i++) {
          walk(i < a.length ? a[i] : undefined, i < b.length ? b[i] : undefined, child(path, i))
        }
        return
      }
      const ra = a as Record<string, unknown>
      const rb = b as Record<string, unknown>
      const keys = Array.from(new Set([...Object.keys(ra), ...Object.keys(rb)])).sort()
      for (const key of keys) walk(ra[key], rb[key], child(path, key))
      return
    }
    if (stableStringify(a) !== stableStringify(b)) out.push(`${path}: ${show(a)} → ${show(b)}`)
  }
  walk(expected, actual, "$")
  return out
}

// ---------------------------------------------------------------------------
// Execution-specific ids
// ---------------------------------------------------------------------------

/** The shortest run of hex digits taken for a piece of an id. */
const MIN_FRAGMENT = 8

const HEX_RUN = /[0-9a-f]{8,}/g
const HEX_WINDOW = /^[0-9a-f]{8}$/

const escapeRegExp = (text: string): string => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")

/**
 * Ids of one execution mapped to another's: replaces each id — whole, or a
 * run of at least {@link MIN_FRAGMENT} hex digits cut from one (a prefix as a
 * receipt number, …) — by its counterpart, in text and in JSON values (keys
 * included).
 */
class IdMap {
  private readonly pairs = new Map<string, string>()
  /** Every window of {@link MIN_FRAGMENT} hex digits of a mapped id: the id and the window's offset. */
  private readonly windows = new Map<string, { readonly id: string; readonly offset: number }>()
  private whole: RegExp | undefined

  set(from: string, to: string): void {
    if (from === to || from.length !== to.length || this.pairs.has(from)) return
    this.pairs.set(from, to)
    this.whole = undefined
    for (let k = 0; k + MIN_FRAGMENT <= from.length; k++) {
      const window = from.slice(k, k + MIN_FRAGMENT)
      if (HEX_WINDOW.test(window) && !this.windows.has(window)) this.windows.set(window, { id: from, offset: k })
    }
  }

  text(text: string): string {
    if (this.pairs.size === 0) return text
    this.whole ??= new RegExp(
      Array.from(this.pairs.keys()).sort((a, b) => b.length - a.length).map(escapeRegExp).join("|"),
      "g"
    )
    return text.replace(this.whole, (id) => this.pairs.get(id)!).replace(HEX_RUN, (run) => this.fragments(run))
  }

  /** A run of hex digits with every piece of a mapped id in it replaced. */
  private fragments(run: string): string {
    let out = ""
    let i = 0
    while (i < run.length) {
      const hit = i + MIN_FRAGMENT <= run.length ? this.windows.get(run.slice(i, i + MIN_FRAGMENT)) : undefined
      if (hit === undefined) {
        out += run[i]
        i++
        continue
      }
      let length = MIN_FRAGMENT
      while (
        i + length < run.length && hit.offset + length < hit.id.length &&
        run[i + length] === hit.id[hit.offset + length]
      ) length++
      out += this.pairs.get(hit.id)!.slice(hit.offset, hit.offset + length)
      i += length
    }
    return out
  }

  /** The value with ids mapped; the same value when nothing changed. */
  value(value: unknown): unknown {
    if (this.pairs.size === 0) return value
    if (typeof value === "string") return this.text(value)
    if (Array.isArray(value)) {
      const mapped = value.map((v) => this.value(v))
      return mapped.some((v, i) => v !== value[i]) ? mapped : value
    }
    if (typeof value === "object" && value !== null) {
      let changed = false
      const out: Record<string, unknown> = {}
      for (const [key, v] of Object.entries(value)) {
        const k = this.text(key)
        const m = this.value(v)
        if (k !== key || m !== v) changed = true
        out[k] = m
      }
      return changed ? out : value
    }
    return value
  }
}

/** The ids an execution made for itself. */
interface RunIds {
  readonly executionId: string
  /** In call order. */
  readonly steps: ReadonlyArray<RunStep>
  /** In the order the runs first used them. */
  readonly dispatchIds: ReadonlyArray<string>
}

const runIdsOf = (result: RunResult): RunIds => ({
  executionId: result.executionId,
  steps: result.steps,
  dispatchIds: Array.from(new Set(result.calls.flatMap((c) => c.dispatchId === undefined ? [] : [c.dispatchId])))
})

const stepKey = (step: RunStep, args: unknown): string =>
  `${step.kind}\u0000${step.target}\u0000${stableStringify(args)}\u0000${step.occurrence}`

/**
 * The ids of `from` mapped onto those of `to`: the execution id; each step to
 * the step of the same kind, target, arguments (their ids mapped first, so a
 * step whose arguments carry an earlier step's id still matches) and
 * occurrence; dispatch ids in order (the last to the last).
 */
const mapIds = (to: RunIds, from: RunIds): IdMap => {
  const ids = new IdMap()
  ids.set(from.executionId, to.executionId)
  const last = to.dispatchIds.length - 1
  if (last >= 0) {
    from.dispatchIds.forEach((id, i) =>
      ids.set(id, to.dispatchIds[i === from.dispatchIds.length - 1 ? last : Math.min(i, last)]!)
    )
  }
  const byKey = new Map(to.steps.map((s) => [stepKey(s, s.args), s.stepId] as const))
  for (const step of from.steps) {
    const match = byKey.get(stepKey(step, ids.value(step.args)))
    if (match !== undefined) ids.set(step.stepId, match)
  }
  return ids
}

// ---------------------------------------------------------------------------
// Ignored paths
// ---------------------------------------------------------------------------

const ANY: unique symbol = Symbol("any")
type Segment = string | number | typeof ANY

const SEGMENT = /^(?:\.([A-Za-z_$][A-Za-z0-9_$]*)|\.\*|\[(\d+)\]|\[\*\]|\[("(?:[^"\\]|\\.)*")\])/

/** `$.a["b c"][0][*].d` as segments, or `undefined` when it is not such a path. */
const parsePath = (path: string): ReadonlyArray<Segment> | undefined => {
  if (!path.startsWith("$")) return undefined
  const segments: Array<Segment> = []
  let rest = path.slice(1)
  while (rest.length > 0) {
    const m = SEGMENT.exec(rest)
    if (m === null) return undefined
    if (m[1] !== undefined) segments.push(m[1])
    else if (m[2] !== undefined) segments.push(Number(m[2]))
    else if (m[3] !== undefined) {
      try {
        segments.push(JSON.parse(m[3]) as string)
      } catch {
        return undefined
      }
    } else segments.push(ANY)
    rest = rest.slice(m[0].length)
  }
  return segments
}

const IGNORED = "(ignored)"

/** The value without what `path` selects: object members are left out, array elements become `"(ignored)"`. */
const withoutPath = (value: unknown, path: ReadonlyArray<Segment>): unknown => {
  if (path.length === 0) return IGNORED
  if (typeof value !== "object" || value === null) return value
  const [segment, ...rest] = path
  if (Array.isArray(value)) {
    if (typeof segment === "string") return value
    return value.map((v, i) => segment === ANY || segment === i ? withoutPath(v, rest) : v)
  }
  const out: Record<string, unknown> = {}
  for (const [key, v] of Object.entries(value)) {
    if (segment !== ANY && segment !== key) {
      out[key] = v
      continue
    }
    if (rest.length > 0) out[key] = withoutPath(v, rest)
  }
  return out
}

const parseArgs = (json: string | undefined): unknown => {
  if (json === undefined) return null
  try {
    return JSON.parse(json)
  } catch {
    return json
  }
}

interface Submitted {
  readonly identity: StepIdentity
  readonly canonical: string
}

/** The submits of some calls, their arguments' ids mapped by `ids` when given. */
const submitsOf = (calls: ReadonlyArray<KernelCall>, ids?: IdMap): ReadonlyArray<Submitted> =>
  calls.filter((c) => c.call === "submitStep").map((c) => {
    const args = parseArgs(c.argsJson)
    const mapped = ids === undefined ? args : ids.value(args)
    return {
      identity: { kind: c.kind ?? "", target: c.target ?? "", args: mapped },
      canonical: `${c.kind}\u0000${c.target}\u0000${
        canonicalJson(mapped === args ? c.argsJson : JSON.stringify(mapped))
      }`
    }
  })

const describeIdentity = (s: StepIdentity): string => `${s.kind} "${s.target}" ${show(s.args)}`

interface Divergence {
  readonly index: number
  readonly expected: StepIdentity | undefined
  readonly actual: StepIdentity | undefined
  readonly differences: ReadonlyArray<string>
  readonly text: string
}

/** The first position where two submit sequences differ. */
const diverge = (expected: ReadonlyArray<Submitted>, actual: ReadonlyArray<Submitted>): Divergence | undefined => {
  for (let i = 0; i < Math.max(expected.length, actual.length); i++) {
    const e = expected[i]
    const a = actual[i]
    if (e !== undefined && a !== undefined && e.canonical === a.canonical) continue
    if (e !== undefined && a !== undefined) {
      if (e.identity.kind !== a.identity.kind || e.identity.target !== a.identity.target) {
        return {
          index: i,
          expected: e.identity,
          actual: a.identity,
          differences: [],
          text: `submit #${i}: expected ${describeIdentity(e.identity)}, the replay submitted ${
            describeIdentity(a.identity)
          }`
        }
      }
      const differences = jsonDiff(e.identity.args, a.identity.args)
      return {
        index: i,
        expected: e.identity,
        actual: a.identity,
        differences,
        text: `submit #${i} (${e.identity.kind} "${e.identity.target}"): arguments differ: ${differences.join("; ")}`
      }
    }
    if (e !== undefined) {
      return {
        index: i,
        expected: e.identity,
        actual: undefined,
        differences: [],
        text: `the replay stopped after ${i} submit${i === 1 ? "" : "s"}; the original went on with ${
          describeIdentity(e.identity)
        }`
      }
    }
    return {
      index: i,
      expected: undefined,
      actual: a!.identity,
      differences: [],
      text: `the replay submitted ${describeIdentity(a!.identity)} after the original's last step`
    }
  }
  return undefined
}

const attemptsOf = (calls: ReadonlyArray<KernelCall>): ReadonlyArray<number> =>
  Array.from(new Set(calls.flatMap((c) => c.attempt === undefined ? [] : [c.attempt]))).sort((a, b) => a - b)

const ofAttempt = (calls: ReadonlyArray<KernelCall>, attempt: number | undefined): ReadonlyArray<KernelCall> =>
  calls.filter((c) => c.attempt === attempt && c.dispatchId !== undefined)

const isTerminal = (status: string): boolean => status === "completed" || status === "failed" || status === "cancelled"

/** Register the agent unless the kernel already knows it. */
const ensureRegistered = <R>(
  kernel: TestKernel.Service,
  agent: Agent.Agent<any, any, any, R>
): Effect.Effect<void, Core.KernelFailure, R> =>
  Effect.catch(kernel.core.getAgent(agent.id), () => kernel.register(agent)).pipe(Effect.asVoid)

const labelOf = (call: KernelCall | undefined, fallback: string): string =>
  call === undefined ?
    fallback :
    isOutcomeCall(call.call) ?
    "the outcome post" :
    `step "${call.target ?? "?"}"`

const describePoint = (mode: "crash" | "lapse", point: CrashPoint, call: KernelCall | undefined): string => {
  const what = mode === "crash" ? "crash" : "lease lapse"
  if ("afterSteps" in point) return `${what} after ${point.afterSteps} recorded step outcome(s)`
  return `${what} ${point.when} ${point.call} #${point.index} (${labelOf(call, "?")})`
}

/** How many times each step's body started, and which starts the protocol forbids. */
const bodyRunsOf = (calls: ReadonlyArray<KernelCall>): {
  readonly runs: ReadonlyArray<BodyRuns>
  readonly violation: string | undefined
} => {
  const runs = new Map<string, { readonly call: KernelCall; attempts: Array<number | undefined> }>()
  const recorded = new Set<string>()
  let violation: string | undefined
  for (const c of calls) {
    if (c.stepId === undefined) continue
    if ((c.call === "completeStep" || c.call === "failStep") && c.reached && c.answer === "recorded") {
      recorded.add(c.stepId)
      continue
    }
    if (c.call !== "submitStep" || c.answer !== "proceed" || !c.delivered) continue
    const entry = runs.get(c.stepId)
    if (entry === undefined) {
      runs.set(c.stepId, { call: c, attempts: [c.attempt] })
      continue
    }
    entry.attempts.push(c.attempt)
    if (violation !== undefined) continue
    const name = `${c.idempotency ?? "safe_to_retry"} step "${c.target}"`
    if (c.idempotency === "at_most_once") {
      violation = `${name} ran its body ${entry.attempts.length} times`
    } else if (recorded.has(c.stepId)) {
      violation = `${name} ran its body again after its outcome was recorded`
    } else if (entry.attempts.filter((a) => a === c.attempt).length > 1) {
      violation = `${name} ran its body twice in the same run (attempt ${c.attempt})`
    }
  }
  return {
    runs: Array.from(runs, ([stepId, { attempts, call }]) => ({
      stepId,
      kind: call.kind ?? "",
      target: call.target ?? "",
      idempotency: call.idempotency ?? "safe_to_retry",
      runs: attempts.length
    })),
    violation
  }
}

// ---------------------------------------------------------------------------
// Crash exploration
// ---------------------------------------------------------------------------

interface Planned {
  readonly mode: "crash" | "lapse"
  readonly point: Extract<CrashPoint, { readonly call: StepCallName }>
  readonly call: KernelCall
  /** The `at_most_once` steps in flight at this point (key of the comparison group). */
  readonly window: string | undefined
  readonly windowLabel: string | undefined
}

/** Every step boundary of the uninterrupted run, with the `at_most_once` steps in flight there. */
const planPoints = (calls: ReadonlyArray<KernelCall>): ReadonlyArray<Planned> => {
  const planned: Array<Planned> = []
  const open = new Map<string, string>()
  const windowOf = (): { readonly window: string | undefined; readonly windowLabel: string | undefined } =>
    open.size === 0 ?
      { window: undefined, windowLabel: undefined } :
      {
        window: Array.from(open.keys()).sort().join(","),
        windowLabel: Array.from(open.values()).map((t) => `"${t}"`).join(", ")
      }
  for (const call of calls) {
    if (!stepCalls.has(call.call)) continue
    const name = call.call as StepCallName
    planned.push({ mode: "crash", point: { call: name, index: call.index, when: "before" }, call, ...windowOf() })
    if (call.stepId !== undefined) {
      if (name === "submitStep" && call.answer === "proceed" && call.idempotency === "at_most_once") {
        open.set(call.stepId, call.target ?? "?")
      } else if ((name === "completeStep" || name === "failStep") && call.answer === "recorded") {
        open.delete(call.stepId)
      }
    }
    if (!isOutcomeCall(name)) {
      planned.push({ mode: "crash", point: { call: name, index: call.index, when: "after" }, call, ...windowOf() })
    }
  }
  return planned
}

/** The default lease-lapse point: before the outcome of the last `safe_to_retry` step is recorded. */
const chooseLapse = (planned: ReadonlyArray<Planned>): Planned | undefined => {
  const befores = planned.filter((p) => p.point.when === "before")
  const safeOutcome = befores.filter((p) =>
    (p.point.call === "completeStep" || p.point.call === "failStep") && p.call.idempotency !== "at_most_once" &&
    p.window === undefined
  )
  const chosen = safeOutcome[safeOutcome.length - 1] ?? befores.find((p) => isOutcomeCall(p.point.call))
  return chosen === undefined ? undefined : { ...chosen, mode: "lapse" }
}

/**
 * A run's outcome as compared: ids mapped to the uninterrupted run's, the
 * `ignore` paths left out and `normalize` applied (to a completed run's output).
 */
interface Outcome {
  readonly status: string
  readonly output: unknown
  readonly failureReason: string
}

const outcomeText = (r: Outcome) =>
  r.status === "completed" ?
    `completed with ${show(r.output)}` :
    r.failureReason === "" ?
    r.status :
    `${r.status} (${JSON.stringify(r.failureReason)})`

/** Why two outcomes differ, or `undefined` when they match. */
const compareOutcome = (expected: Outcome, actual: Outcome): string | undefined => {
  if (expected.status !== actual.status) {
    return `status differed: expected ${outcomeText(expected)}, got ${outcomeText(actual)}`
  }
  if (actual.status === "completed") {
    const e = expected.output
    const a = actual.output
    if (stableStringify(e) !== stableStringify(a)) {
      const shown = `output differed: expected ${show(e)} got ${show(a)}`
      // the values were cut short: say where they differ
      const cut = stableStringify(e).length > MAX_SHOWN || stableStringify(a).length > MAX_SHOWN
      return cut ? `${shown}; differences: ${jsonDiff(e, a, 4).join("; ")}` : shown
    }
  } else if (expected.failureReason !== actual.failureReason) {
    return `failure reason differed: expected ${JSON.stringify(expected.failureReason)} got ${
      JSON.stringify(actual.failureReason)
    }`
  }
  return undefined
}

/**
 * Run an agent once without interruption, then once per step boundary with a
 * crash injected there, plus once with a lease lapse mid-run while the old run
 * stays alive; fail with a {@link CrashExplorationError} naming the first point
 * where the agent does not survive. Needs the {@link TestKernel} (the agent is
 * registered if it is not yet); every run is a fresh execution.
 *
 * Checked at every point: the crash was reached (the run took the same path);
 * no `at_most_once` body started twice and no `safe_to_retry` body started again
 * after its outcome was recorded; every outcome recorded before the crash is
 * still there; the replay submitted the same steps as the uninterrupted run;
 * and the run ended with the same status and output (failure reason) — except
 * inside an `at_most_once` step, where the replay sees an indeterminate
 * `ToolError` and all the points of that step must agree with each other. The
 * lease-lapse run also checks the old attempt was fenced: after the lapse it
 * recorded nothing and stopped.
 *
 * Outputs, failure reasons and step arguments are compared modulo the ids
 * each execution makes for itself: a run's execution id, step ids and
 * dispatch ids (whole, or a run of at least 8 hex digits cut from one) are
 * read as the uninterrupted run's for the same thing before comparing, so an
 * agent that passes `stepId` to a provider as an idempotency key and reports
 * the answer passes. Leave values the kit cannot map (a hash of a step id)
 * out with `ignore`; `normalize` rewrites what is left.
 *
 * @example
 * ```ts
 * import { it } from "@effect/vitest"
 * import { Effect, Schema } from "effect"
 * import { Agent, Tool } from "effect-rebuno"
 * import { Explore, TestKernel } from "effect-rebuno/testing"
 * import { createHash } from "node:crypto"
 *
 * const charge = Tool.make("charge", {
 *   args: Schema.Struct({ amount: Schema.Number }),
 *   success: Schema.Struct({ token: Schema.String }),
 *   idempotency: "at_most_once",
 *   // the provider's receipt carries a hash of the idempotency key (the step id)
 *   execute: (_, { stepId }) => Effect.succeed({ token: createHash("sha256").update(stepId).digest("hex") })
 * })
 *
 * const checkout = Agent.make({
 *   id: "checkout",
 *   input: Schema.Struct({ amount: Schema.Number }),
 *   handler: ({ amount }) => Effect.map(charge({ amount }), (receipt) => ({ amount, receipt }))
 * })
 *
 * it.effect("checkout survives a crash anywhere", () =>
 *   Effect.gen(function*() {
 *     // the receipt's token is a hash of the step id: compare everything else
 *     yield* Explore.crashes(checkout, { amount: 10 }, { ignore: ["$.receipt.token"] })
 *   }).pipe(Effect.provide(TestKernel.layer({ agents: [checkout] }))))
 * ```
 *
 * @since 0.1.0
 * @category exploration
 */
export const crashes = <R>(
  agent: Agent.Agent<any, any, any, R>,
  input?: unknown,
  options?: CrashesOptions
): Effect.Effect<CrashReport, CrashExplorationError | Core.KernelFailure, TestKernel | R> =>
  Effect.gen(function*() {
    const kernel = yield* TestKernel
    yield* ensureRegistered(kernel, agent)
    const recovery = options?.recovery ?? "immediate"
    const normalize = options?.normalize ?? ((output: unknown) => output)
    const timeout = options?.timeout === undefined ? {} : { timeout: options.timeout }

    // by id: the outputs are compared as recorded (JSON), not decoded
    const baseline = yield* kernel.run(agent.id, input, timeout)
    const baselineError = (reason: string) =>
      new CrashExplorationError({
        agentId: agent.id,
        mode: "baseline",
        description: "the uninterrupted run",
        reason,
        executionId: baseline.executionId
      })
    const ignored: Array<ReadonlyArray<Segment>> = []
    for (const path of options?.ignore ?? []) {
      const segments = parsePath(path)
      if (segments === undefined) {
        return yield* new CrashExplorationError({
          agentId: agent.id,
          mode: "baseline",
          description: "the ignore option",
          reason: `${JSON.stringify(path)} is not a path like $.a.b, $.items[0].id or $.items[*].id`,
          executionId: baseline.executionId
        })
      }
      ignored.push(segments)
    }
    /** The run's outcome as compared, with its ids mapped by `ids` (none for the uninterrupted run). */
    const outcomeOf = (result: RunResult, ids?: IdMap): Outcome => {
      const failureReason = result.failureReason ?? ""
      if (result.status !== "completed") {
        return { status: result.status, output: result.output, failureReason: ids?.text(failureReason) ?? failureReason }
      }
      const mapped = ids === undefined ? result.output : ids.value(result.output)
      return {
        status: result.status,
        output: normalize(ignored.reduce<unknown>(withoutPath, mapped)),
        failureReason: ids?.text(failureReason) ?? failureReason
      }
    }
    if (!isTerminal(baseline.status)) {
      return yield* baselineError(
        `ended ${baseline.status}${
          baseline.status === "blocked" ? " on an approval" : ""
        }; crash exploration needs a run that finishes on its own`
      )
    }
    const firstAttempt = attemptsOf(baseline.calls)[0]
    const baselineCalls = ofAttempt(baseline.calls, firstAttempt)
    const baselineSubmits = submitsOf(baselineCalls)
    const baselineOutcome = outcomeOf(baseline)
    const baselineIds = runIdsOf(baseline)
    const planned = planPoints(baselineCalls)
    const lapse = options?.lapse === false ?
      undefined :
      options?.lapse === undefined || options.lapse === true ?
      chooseLapse(planned) :
      ((point) => {
        const found = "call" in point ?
          planned.find((p) =>
            p.point.call === point.call && p.point.index === point.index && p.point.when === point.when
          ) :
          undefined
        return found === undefined ? undefined : { ...found, mode: "lapse" as const }
      })(options.lapse)
    if (options?.lapse !== undefined && typeof options.lapse === "object" && lapse === undefined) {
      return yield* baselineError(`has no step boundary ${JSON.stringify(options.lapse)} to lapse the lease at`)
    }

    const windowOutcomes = new Map<string, { readonly description: string; readonly outcome: Outcome }>()
    const points: Array<PointReport> = []
    for (const plan of lapse === undefined ? planned : [...planned, lapse]) {
      const description = describePoint(plan.mode, plan.point, plan.call)
      const result = yield* kernel.run(agent.id, input, {
        ...timeout,
        recovery,
        ...(plan.mode === "crash" ? { crash: plan.point } : { lapse: plan.point })
      })
      // this run's ids, as the uninterrupted run's
      const ids = mapIds(baselineIds, runIdsOf(result))
      const fail = (reason: string) =>
        new CrashExplorationError({
          agentId: agent.id,
          mode: plan.mode,
          point: plan.point,
          description,
          reason,
          executionId: result.executionId
        })
      const attempts = attemptsOf(result.calls)
      const firstCalls = ofAttempt(result.calls, attempts[0])
      const lastCalls = ofAttempt(result.calls, attempts[attempts.length - 1])

      // 1. The point was reached: the run took the uninterrupted run's path.
      if (!(plan.mode === "crash" ? result.crashed : result.lapsed)) {
        const divergence = diverge(baselineSubmits, submitsOf(firstCalls, ids))
        return yield* fail(
          "the point was never reached: the run took another path than the uninterrupted run" +
            (divergence === undefined ? "" : ` (${divergence.text})`)
        )
      }

      // 2. Bodies ran no more often than the protocol allows.
      const bodies = bodyRunsOf(result.calls)
      if (bodies.violation !== undefined) return yield* fail(bodies.violation)

      // 3. Nothing recorded was lost.
      const finalSteps = new Map(result.steps.map((s) => [s.stepId, s]))
      for (const c of result.calls) {
        if ((c.call !== "completeStep" && c.call !== "failStep") || c.answer !== "recorded" || c.stepId === undefined) {
          continue
        }
        const status = finalSteps.get(c.stepId)?.status
        const expected = c.call === "completeStep" ? "succeeded" : "failed"
        if (status !== expected) {
          return yield* fail(
            `the outcome of step "${c.target}" recorded by attempt ${c.attempt} was lost: it is now ${
              status ?? "missing"
            }, not ${expected}`
          )
        }
      }

      // 4. A fenced run writes nothing after its lease lapsed, and stops.
      if (plan.mode === "lapse") {
        const lapsedAt = firstCalls.find((c) => c.injected === "lapse")
        const after = firstCalls.filter((c) =>
          lapsedAt !== undefined && (c.seq > lapsedAt.seq || (c.seq === lapsedAt.seq && plan.point.when === "before"))
        )
        const written = after.find((c) =>
          c.reached && c.call !== "getExecution" && c.call !== "previous" && c.answer !== "lease_superseded" &&
          c.answer !== "execution_terminal" && c.answer !== "replay"
        )
        if (written !== undefined) {
          return yield* fail(
            `the old attempt wrote after its lease lapsed: ${written.call} #${written.index} (${
              labelOf(written, "?")
            }) was answered ${JSON.stringify(written.answer)}`
          )
        }
        const fenced = after.find((c) => c.answer === "lease_superseded" || c.answer === "execution_terminal")
        const next = fenced?.answerSeq === undefined ? undefined : after.find((c) => c.seq >= fenced.answerSeq!)
        if (next !== undefined) {
          return yield* fail(`the old attempt kept calling the kernel after it was fenced: ${next.call} #${next.index}`)
        }
        if (attempts.length < 2) return yield* fail("the lease lapsed but the execution was never redelivered")
      }

      // 5. Same outcome (or, inside an at_most_once step, the same as that step's other points).
      if (!isTerminal(result.status)) {
        return yield* fail(`the run did not finish: it ended ${result.status} after ${result.deliveries} deliveries`)
      }
      const reran = bodies.runs.filter((b) => b.runs > 1).map((b) => `"${b.target}"`)
      const hint = reran.length === 0 ?
        "" :
        ` (the body of ${reran.join(", ")} ran again after the ${
          plan.mode
        }: make its result idempotent or normalize the output)`
      const outcome = outcomeOf(result, ids)
      if (plan.window === undefined) {
        const differs = compareOutcome(baselineOutcome, outcome)
        if (differs !== undefined) return yield* fail(differs + hint)
      } else {
        const first = windowOutcomes.get(plan.window)
        if (first === undefined) {
          windowOutcomes.set(plan.window, { description, outcome })
        } else {
          const differs = compareOutcome(first.outcome, outcome)
          if (differs !== undefined) {
            return yield* fail(
              `${differs} (compared with ${first.description}, inside the same at_most_once step ${plan.windowLabel}, where the replay sees an indeterminate ToolError)`
            )
          }
        }
      }

      // 6. The replay submitted the same steps as the uninterrupted run.
      if (plan.window === undefined) {
        const divergence = diverge(baselineSubmits, submitsOf(lastCalls, ids))
        if (divergence !== undefined) {
          return yield* fail(`the replay diverged from the uninterrupted run at ${divergence.text}${hint}`)
        }
      }

      points.push({
        mode: plan.mode,
        point: plan.point,
        description,
        executionId: result.executionId,
        status: result.status,
        output: result.output,
        ...(result.failureReason === undefined ? {} : { failureReason: result.failureReason }),
        deliveries: result.deliveries,
        verdict: plan.window === undefined ? "same" : "indeterminate",
        bodyRuns: bodies.runs
      })
    }

    return {
      agentId: agent.id,
      baseline: {
        executionId: baseline.executionId,
        status: baseline.status,
        output: baseline.output,
        ...(baseline.failureReason === undefined ? {} : { failureReason: baseline.failureReason }),
        calls: baseline.calls
      },
      points,
      runs: points.length + 1
    }
  })

// ---------------------------------------------------------------------------
// Determinism
// ---------------------------------------------------------------------------

const beforeOutcome: ReadonlyArray<CrashPoint> = [
  { call: "completeExecution", index: 0, when: "before" },
  { call: "failExecution", index: 0, when: "before" }
]

/**
 * Check that an agent replays deterministically: run it, crash it just before
 * it posts its outcome, let the lease lapse (virtual time moves on by the lease
 * timeout, so unrecorded clock reads change), and compare the steps the replay
 * submits with the original run's, in order, by kind, target and canonical
 * arguments. Fails with a {@link DeterminismError} naming the first step that
 * differs and a path-level diff of its arguments, e.g.
 * `the replay diverged from the original run at submit #0 (tool_call "search"): arguments differ: $.at: 1712… → 1712…`.
 *
 * @since 0.1.0
 * @category exploration
 */
export const determinism = <R>(
  agent: Agent.Agent<any, any, any, R>,
  input?: unknown,
  options?: { readonly timeout?: Duration.Input | undefined }
): Effect.Effect<DeterminismReport, DeterminismError | Core.KernelFailure, TestKernel | R> =>
  Effect.gen(function*() {
    const kernel = yield* TestKernel
    yield* ensureRegistered(kernel, agent)
    const result = yield* kernel.run(agent.id, input, {
      crash: beforeOutcome,
      recovery: "lease",
      ...(options?.timeout === undefined ? {} : { timeout: options.timeout })
    })
    const attempts = attemptsOf(result.calls)
    const original = submitsOf(ofAttempt(result.calls, attempts[0]))
    if (!result.crashed || attempts.length < 2) {
      return yield* new DeterminismError({
        agentId: agent.id,
        executionId: result.executionId,
        differences: [],
        reason: `the run never replayed: it ended ${result.status} without posting an outcome to crash before`
      })
    }
    const replay = submitsOf(ofAttempt(result.calls, attempts[attempts.length - 1]))
    const divergence = diverge(original, replay)
    if (divergence !== undefined) {
      return yield* new DeterminismError({
        agentId: agent.id,
        executionId: result.executionId,
        index: divergence.index,
        ...(divergence.expected === undefined ? {} : { expected: divergence.expected }),
        ...(divergence.actual === undefined ? {} : { actual: divergence.actual }),
        differences: divergence.differences,
        reason: `the replay diverged from the original run at ${divergence.text}`
      })
    }
    return { executionId: result.executionId, steps: original.map((s) => s.identity) }
  })
