/**
 * Property-based testing support for the bad-input suites (test/properties,
 * test/security): the run settings (a fixed seed and a bounded number of runs
 * in CI, `PROPERTY_RUNS` / `PROPERTY_SEED` for longer runs), a bridge that runs
 * a fast-check property inside an Effect test on the test's own runtime (so
 * `TestClock` and the test's services apply), a "completes without time
 * passing" check that turns a hang into a failure, and arbitraries that derive
 * bad requests from valid ones: JSON body mutations (truncation, byte flips,
 * type swaps, unknown members, non-objects, huge strings, deep nesting,
 * invalid UTF-8, oversized and aborted bodies), UUID forms, lease headers and
 * signature corruptions.
 */
import { expect } from "@effect/vitest"
import { type Context, Effect, Exit, Fiber, Layer, Redacted, Result } from "effect"
import * as fc from "fast-check"
import * as Json from "../../src/internal/wire/json.js"
import * as Uuid from "../../src/internal/wire/uuid.js"
import * as Core from "../../src/kernel/Core.js"
import * as Routes from "../../src/kernel/Routes.js"
import { KernelClient } from "../../src/KernelClient.js"
import { KernelError, StatusError } from "../../src/RebunoError.js"
import * as Signature from "../../src/Signature.js"

// ---------------------------------------------------------------------------
// Run settings
// ---------------------------------------------------------------------------

const envNumber = (name: string): number | undefined => {
  const raw = process.env[name]
  if (raw === undefined || raw.trim() === "") return undefined
  const n = Number(raw)
  return Number.isInteger(n) && n > 0 ? n : undefined
}

/** The fast-check seed: `PROPERTY_SEED`, else a fixed value so CI is reproducible. */
export const propertySeed: number = envNumber("PROPERTY_SEED") ?? 20261129

/** `PROPERTY_RUNS` when set (a long run), else the suite's CI default. */
export const propertyRuns = (ciDefault: number): number => envNumber("PROPERTY_RUNS") ?? ciDefault

/**
 * The timeout of a property test: vitest's default in CI, and room for a long
 * run when `PROPERTY_RUNS` is set.
 */
export const propertyTimeout: number | undefined = envNumber("PROPERTY_RUNS") === undefined ? undefined : 60 * 60_000

/** `PROPERTY_RUNS` scaled down for expensive suites (sockets), with a floor. */
export const scaledRuns = (ciDefault: number, divisor: number): number => {
  const long = envNumber("PROPERTY_RUNS")
  return long === undefined ? ciDefault : Math.max(ciDefault, Math.ceil(long / divisor))
}

/** What a property run did, for the long-run report. */
export interface PropertyReport {
  readonly name: string
  readonly numRuns: number
  readonly requests: number
  readonly millis: number
}

const reports: Array<PropertyReport> = []

/** Every property report of this worker so far. */
export const propertyReports = (): ReadonlyArray<PropertyReport> => reports

/**
 * Run a fast-check property whose predicate is an Effect, on the calling test's
 * runtime. A counterexample fails the effect with fast-check's report (seed,
 * path and the shrunk value), so `PROPERTY_SEED` + the printed path replay it.
 * The predicate returns how many requests it made (for the report).
 */
export const checkProperty = <T, E, R>(
  name: string,
  arbitrary: fc.Arbitrary<T>,
  predicate: (value: T) => Effect.Effect<number | void, E, R>,
  options: { readonly numRuns: number }
): Effect.Effect<PropertyReport, never, R> =>
  Effect.gen(function*() {
    const context = yield* Effect.context<R>()
    const run = Effect.runPromiseWith(context)
    let requests = 0
    const started = performance.now()
    const details = yield* Effect.promise(() =>
      fc.check(
        fc.asyncProperty(arbitrary, async (value) => {
          const n = await run(predicate(value))
          requests += typeof n === "number" ? n : 1
        }),
        { seed: propertySeed, numRuns: options.numRuns }
      )
    )
    if (details.failed) {
      const cause = details.errorInstance instanceof Error ? details.errorInstance.message : String(details.errorInstance)
      return yield* Effect.die(
        new Error(`property "${name}" failed: ${cause}\n${fc.defaultReportMessage(details)}`)
      )
    }
    const report: PropertyReport = {
      name,
      numRuns: details.numRuns,
      requests,
      millis: Math.round(performance.now() - started)
    }
    reports.push(report)
    if (process.env["PROPERTY_RUNS"] !== undefined) {
      console.log(`[property] ${name}: ${report.numRuns} runs, ${report.requests} requests, ${report.millis} ms`)
    }
    return report
  })

/**
 * Runs `effect` and requires it to finish without any clock time passing: it is
 * forked and polled while the event loop turns (I/O, promises, Web Crypto in
 * the thread pool). Under `TestClock` nothing would ever wake a request that
 * waits on time, so one that is still running after `budgetMillis` of wall
 * time is reported as a hang instead of stalling the suite.
 */
export const completes = <A, E, R>(
  effect: Effect.Effect<A, E, R>,
  budgetMillis = 10_000
): Effect.Effect<Exit.Exit<A, E>, Error, R> =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(effect)
    const deadline = performance.now() + budgetMillis
    let round = 0
    while (performance.now() < deadline) {
      const polled = fiber.pollUnsafe()
      if (polled !== undefined) return polled
      round++
      if (round < 16) yield* Effect.yieldNow
      else yield* Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, round < 64 ? 0 : 1)))
    }
    yield* Fiber.interrupt(fiber)
    return yield* Effect.fail(new Error(`request did not complete within ${budgetMillis} ms without clock time (hang)`))
  })

// ---------------------------------------------------------------------------
// JSON bodies
// ---------------------------------------------------------------------------

/** The JSON type a strictly decoded member has (PROTOCOL 2.3). */
export type FieldType = "string" | "any" | "int"

/** The members a route's body may have, with their types. */
export type FieldSpec = Readonly<Record<string, FieldType>>

/**
 * How sure a mutation is about the strict decoder's verdict: `valid` (still a
 * decodable body for the route), `invalid` (certainly `400 validation error`),
 * `unknown` (either; only the generic properties apply).
 */
export type Validity = "valid" | "invalid" | "unknown"

/** A request body after mutation. `oversized`/`aborted` are not bytes but a read outcome. */
export type MutatedBody =
  | { readonly _tag: "Bytes"; readonly bytes: Uint8Array; readonly validity: Validity; readonly kind: string }
  | { readonly _tag: "Oversized"; readonly kind: "oversized" }
  | { readonly _tag: "Aborted"; readonly kind: "aborted" }

/** A valid body as an ordered list of members (raw JSON text values). */
export type Members = ReadonlyArray<readonly [string, string]>

const encoder = new TextEncoder()

/** The cap of PROTOCOL 2.4, duplicated here on purpose (the test must not trust the constant). */
export const TEN_MIB = 10 * 1024 * 1024

export const membersText = (members: Members, ws = ""): string =>
  "{" + ws + members.map(([k, v]) => JSON.stringify(k) + ws + ":" + ws + v).join("," + ws) + ws + "}"

/** JSON texts of a wrong type for a string member (never `null`, which means `""`). */
const notAString = fc.constantFrom("0", "-1.5e3", "true", "false", "[]", "{}", "[\"a\"]", "{\"a\":1}", "1")

/** JSON texts that are not a Go `int` (never `null`, which means `0`). */
const notAnInt = fc.constantFrom(
  "\"1\"",
  "\"\"",
  "1.5",
  "1e2",
  "1.0",
  "true",
  "[]",
  "{}",
  "9223372036854775808",
  "-9223372036854775809",
  "[1]"
)

/** Any JSON value text (for `any` members and as replacement values). */
export const jsonText: fc.Arbitrary<string> = fc.oneof(
  { depthSize: "small" },
  fc.json({ depthSize: "small" }),
  fc.constantFrom("null", "{}", "[]", "\"\"", "0", "-0", "1e400", "\"<&>\\u2028\"", "\"\\ud800\"")
)

/** A top-level value that is not an object. */
const notAnObject = fc.constantFrom("null", "[]", "[{}]", "\"{}\"", "0", "true", "\"\"", "1e3")

const whitespace = fc.constantFrom(" ", "\n", "\t", "\r\n", "  \n\t")

/** Garbage that makes any JSON text invalid when appended after the value. */
const trailingGarbage = fc.constantFrom("x", "}", "]", "{}", ",", "0", "null", "\"a\"", "\u0000")

/** Bytes that are not UTF-8 (lone continuation, truncated sequences, overlong forms, surrogates). */
const invalidUtf8 = fc.constantFrom(
  [0xff],
  [0x80],
  [0xc3],
  [0xe2, 0x82],
  [0xc0, 0xaf],
  [0xed, 0xa0, 0x80],
  [0xf4, 0x90, 0x80, 0x80],
  [0xfe, 0xfe, 0xff, 0xff]
)

export type BodyPlan =
  | { readonly kind: "none" }
  | { readonly kind: "whitespace"; readonly ws: string }
  | { readonly kind: "reorder"; readonly seed: number }
  | { readonly kind: "nullMember"; readonly index: number }
  | { readonly kind: "dropMember"; readonly index: number }
  | { readonly kind: "duplicateMember"; readonly index: number }
  | { readonly kind: "unknownMember"; readonly name: string; readonly value: string }
  | { readonly kind: "typeSwap"; readonly index: number; readonly notString: string; readonly notInt: string }
  | { readonly kind: "anyValue"; readonly index: number; readonly value: string }
  | { readonly kind: "truncate"; readonly fraction: number }
  | { readonly kind: "nonObject"; readonly value: string }
  | { readonly kind: "empty" }
  | { readonly kind: "trailing"; readonly garbage: string }
  | { readonly kind: "byteFlips"; readonly flips: ReadonlyArray<readonly [number, number]> }
  | { readonly kind: "invalidUtf8"; readonly at: number; readonly bytes: ReadonlyArray<number> }
  | { readonly kind: "hugeString"; readonly index: number; readonly length: number; readonly char: string }
  | { readonly kind: "deepNesting"; readonly index: number; readonly depth: number; readonly open: "[" | "{\"a\":" }
  | { readonly kind: "oversized" }
  | { readonly kind: "aborted" }

/**
 * A body mutation plan. Applied to a route's valid body with
 * {@link applyBodyPlan}; rare plans (oversized, aborted) have a low weight.
 */
export const bodyPlan: fc.Arbitrary<BodyPlan> = fc.oneof(
  { weight: 6, arbitrary: fc.constant({ kind: "none" } as const) },
  { weight: 2, arbitrary: whitespace.map((ws) => ({ kind: "whitespace", ws } as const)) },
  { weight: 1, arbitrary: fc.nat().map((seed) => ({ kind: "reorder", seed } as const)) },
  { weight: 2, arbitrary: fc.nat().map((index) => ({ kind: "nullMember", index } as const)) },
  { weight: 2, arbitrary: fc.nat().map((index) => ({ kind: "dropMember", index } as const)) },
  { weight: 1, arbitrary: fc.nat().map((index) => ({ kind: "duplicateMember", index } as const)) },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("unknownMember" as const),
      name: fc.oneof(
        fc.constantFrom("extra", "KIND", "Target", "session", "policy_bundle", "details", "__proto__", "", "kind "),
        fc.string({ maxLength: 8 })
      ),
      value: jsonText
    })
  },
  {
    weight: 4,
    arbitrary: fc.record({ kind: fc.constant("typeSwap" as const), index: fc.nat(), notString: notAString, notInt: notAnInt })
  },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("anyValue" as const), index: fc.nat(), value: jsonText }) },
  {
    weight: 4,
    arbitrary: fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }).map((fraction) =>
      ({ kind: "truncate", fraction } as const)
    )
  },
  { weight: 2, arbitrary: notAnObject.map((value) => ({ kind: "nonObject", value } as const)) },
  { weight: 1, arbitrary: fc.constant({ kind: "empty" } as const) },
  { weight: 2, arbitrary: trailingGarbage.map((garbage) => ({ kind: "trailing", garbage } as const)) },
  {
    weight: 3,
    arbitrary: fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { minLength: 1, maxLength: 4 }).map((
      flips
    ) => ({ kind: "byteFlips", flips } as const))
  },
  {
    weight: 2,
    arbitrary: fc.record({ kind: fc.constant("invalidUtf8" as const), at: fc.nat(), bytes: invalidUtf8 })
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("hugeString" as const),
      index: fc.nat(),
      length: fc.constantFrom(7_000, 7_001, 70_000, 300_000),
      char: fc.constantFrom("a", "é", "<", "\\n", "🙂")
    })
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("deepNesting" as const),
      index: fc.nat(),
      depth: fc.constantFrom(64, 1_000, 9_999, 10_001, 100_000),
      open: fc.constantFrom("[" as const, "{\"a\":" as const)
    })
  },
  { weight: 1, arbitrary: fc.constant({ kind: "oversized" } as const) },
  { weight: 1, arbitrary: fc.constant({ kind: "aborted" } as const) }
)

const pick = <A>(items: ReadonlyArray<A>, index: number): A | undefined =>
  items.length === 0 ? undefined : items[index % items.length]

const bytes = (text: string, validity: Validity, kind: string): MutatedBody => ({
  _tag: "Bytes",
  bytes: encoder.encode(text),
  validity,
  kind
})

const closeNesting = (open: "[" | "{\"a\":", depth: number): string =>
  (open === "[" ? "[".repeat(depth) : "{\"a\":".repeat(depth)) + "1" + (open === "[" ? "]" : "}").repeat(depth)

/**
 * Apply a plan to a valid body (`members` of a route with `spec`). A route
 * without a body has `members = []` and `spec = {}`; its body is then only
 * signed, never decoded, and validity is meaningless.
 */
export const applyBodyPlan = (members: Members, spec: FieldSpec, plan: BodyPlan): MutatedBody => {
  const base = membersText(members)
  const typed = members.filter(([k]) => spec[k] === "string" || spec[k] === "int")
  const anyMembers = members.filter(([k]) => spec[k] === "any")
  const replace = (name: string, value: string): Members => members.map(([k, v]) => [k, k === name ? value : v] as const)
  switch (plan.kind) {
    case "none":
      return bytes(base, "valid", plan.kind)
    case "whitespace":
      return bytes(plan.ws + membersText(members, plan.ws) + plan.ws, "valid", plan.kind)
    case "reorder": {
      const shuffled = [...members]
      let s = plan.seed
      for (let i = shuffled.length - 1; i > 0; i--) {
        s = (s * 1103515245 + 12345) % 2147483648
        const j = s % (i + 1)
        ;[shuffled[i], shuffled[j]] = [shuffled[j]!, shuffled[i]!]
      }
      return bytes(membersText(shuffled), "valid", plan.kind)
    }
    case "nullMember": {
      const member = pick(members, plan.index)
      return member === undefined
        ? bytes(base, "valid", plan.kind)
        : bytes(membersText(replace(member[0], "null")), "valid", plan.kind)
    }
    case "dropMember": {
      const member = pick(members, plan.index)
      return bytes(membersText(members.filter((m) => m !== member)), "valid", plan.kind)
    }
    case "duplicateMember": {
      const member = pick(members, plan.index)
      // The first occurrence is garbage of the right type; the last one wins (2.3).
      if (member === undefined) return bytes(base, "valid", plan.kind)
      const decoy = spec[member[0]] === "int" ? "7" : spec[member[0]] === "string" ? "\"decoy\"" : "{\"decoy\":true}"
      return bytes(membersText([[member[0], decoy], ...members]), "valid", plan.kind)
    }
    case "unknownMember": {
      const known = Object.prototype.hasOwnProperty.call(spec, plan.name)
      const text = membersText([...members, [plan.name, plan.value]])
      // A generated name may happen to be a real member; then nothing is certain.
      return bytes(text, known ? "unknown" : "invalid", plan.kind)
    }
    case "typeSwap": {
      const member = pick(typed, plan.index)
      if (member === undefined) return bytes(base, "valid", "none")
      const value = spec[member[0]] === "int" ? plan.notInt : plan.notString
      return bytes(membersText(replace(member[0], value)), "invalid", plan.kind)
    }
    case "anyValue": {
      const member = pick(anyMembers, plan.index)
      if (member === undefined) return bytes(base, "valid", "none")
      return bytes(membersText(replace(member[0], plan.value)), "valid", plan.kind)
    }
    case "truncate": {
      // A strict prefix of a minimal object text is never a complete JSON object.
      const cut = Math.floor(plan.fraction * base.length)
      return bytes(base.slice(0, cut), "invalid", plan.kind)
    }
    case "nonObject":
      return bytes(plan.value, "invalid", plan.kind)
    case "empty":
      return bytes("", "invalid", plan.kind)
    case "trailing":
      return bytes(base + plan.garbage, "invalid", plan.kind)
    case "byteFlips": {
      const out = encoder.encode(base)
      for (const [at, value] of plan.flips) {
        if (out.length > 0) out[at % out.length] = value
      }
      return { _tag: "Bytes", bytes: out, validity: "unknown", kind: plan.kind }
    }
    case "invalidUtf8": {
      const raw = encoder.encode(base)
      const at = raw.length === 0 ? 0 : plan.at % (raw.length + 1)
      const out = new Uint8Array(raw.length + plan.bytes.length)
      out.set(raw.subarray(0, at), 0)
      out.set(plan.bytes, at)
      out.set(raw.subarray(at), at + plan.bytes.length)
      return { _tag: "Bytes", bytes: out, validity: "unknown", kind: plan.kind }
    }
    case "hugeString": {
      const member = pick(members.filter(([k]) => spec[k] !== "int"), plan.index)
      if (member === undefined) return bytes(base, "valid", "none")
      const value = "\"" + plan.char.repeat(plan.length) + "\""
      return bytes(membersText(replace(member[0], value)), "unknown", plan.kind)
    }
    case "deepNesting": {
      const member = pick(members, plan.index)
      if (member === undefined) return bytes(base, "valid", "none")
      const value = closeNesting(plan.open, plan.depth)
      return bytes(
        membersText(replace(member[0], value)),
        spec[member[0]] === "any" ? "unknown" : "invalid",
        plan.kind
      )
    }
    case "oversized":
      return { _tag: "Oversized", kind: "oversized" }
    case "aborted":
      return { _tag: "Aborted", kind: "aborted" }
  }
}

/** A body just over the 10 MiB cap (zero bytes: cheap to allocate). */
export const oversizedBody = (): Uint8Array => new Uint8Array(TEN_MIB + 1)

// ---------------------------------------------------------------------------
// UUIDs, lease headers, signatures
// ---------------------------------------------------------------------------

/** Another spelling of a canonical UUID that the kernel must (or should) accept (2.5). */
export type UuidForm = "canonical" | "upper" | "mixed" | "braced" | "urn" | "bare"

export const uuidForm: fc.Arbitrary<UuidForm> = fc.constantFrom("canonical", "upper", "mixed", "braced", "urn", "bare")

export const spellUuid = (uuid: string, form: UuidForm): string => {
  switch (form) {
    case "canonical":
      return uuid
    case "upper":
      return uuid.toUpperCase()
    case "mixed":
      return [...uuid].map((c, i) => (i % 2 === 0 ? c.toUpperCase() : c)).join("")
    case "braced":
      return "{" + uuid + "}"
    case "urn":
      return "urn:uuid:" + uuid
    case "bare":
      return uuid.replaceAll("-", "")
  }
}

/** Strings that are not UUIDs in any accepted form (plus a few near misses). */
export const notAUuid: fc.Arbitrary<string> = fc.oneof(
  fc.constantFrom(
    "alpha",
    "0192f1a0-0000-7000-8000-00000000000",
    "0192f1a0-0000-7000-8000-0000000000000",
    "0192f1a0-0000-7000-8000-00000000000g",
    "0192f1a000007000800000000000000",
    "0192f1a0_0000_7000_8000_000000000000",
    "{0192f1a0-0000-7000-8000-000000000000",
    "urn:uuid:{0192f1a0-0000-7000-8000-000000000000}",
    " 0192f1a0-0000-7000-8000-000000000000",
    "0192f1a0-0000-7000-8000-000000000000 ",
    "..",
    "%00",
    "-",
    "x".repeat(4096)
  ),
  fc.string({ minLength: 1, maxLength: 40 }).filter((s) => !/^[0-9a-fA-F-{}:urnid]+$/.test(s))
)

/** A `Rebuno-Dispatch-Attempt` value; `undefined` = header absent. */
export const attemptHeader: fc.Arbitrary<string | undefined> = fc.oneof(
  { weight: 6, arbitrary: fc.constant("<current>") },
  {
    weight: 4,
    arbitrary: fc.constantFrom(
      undefined,
      "",
      "0",
      "-1",
      "+1",
      "01",
      "1.0",
      "1e0",
      " 1",
      "1 ",
      "abc",
      "2",
      "99",
      "9223372036854775807",
      "9223372036854775808",
      "0x1"
    )
  }
)

/** How the `Rebuno-Signature` header is built at send time. */
export type SignatureMode =
  | "correct"
  | "stale"
  | "flipLast"
  | "flipFirstHex"
  | "truncated"
  | "extended"
  | "uppercase"
  | "wrongSecret"
  | "noPrefix"
  | "otherScheme"
  | "prefixOnly"
  | "v1Garbage"
  | "empty"
  | "missing"

export const signatureMode: fc.Arbitrary<SignatureMode> = fc.oneof(
  { weight: 12, arbitrary: fc.constant("correct" as const) },
  {
    weight: 10,
    arbitrary: fc.constantFrom(
      "stale" as const,
      "flipLast" as const,
      "flipFirstHex" as const,
      "truncated" as const,
      "extended" as const,
      "uppercase" as const,
      "wrongSecret" as const,
      "noPrefix" as const,
      "otherScheme" as const,
      "prefixOnly" as const,
      "v1Garbage" as const,
      "empty" as const,
      "missing" as const
    )
  }
)

const flipHex = (c: string): string => (c === "0" ? "1" : "0")

/**
 * Corrupt a correct `sha256=` signature per `mode`. `correct` and `stale` are
 * resolved by the caller (stale = the signature of the body before mutation).
 */
export const corruptSignature = (correct: string, mode: SignatureMode, wrongSecretSignature: string): string | undefined => {
  switch (mode) {
    case "correct":
    case "stale":
      return correct
    case "flipLast":
      return correct.slice(0, -1) + flipHex(correct.slice(-1))
    case "flipFirstHex":
      return "sha256=" + flipHex(correct.charAt(7)) + correct.slice(8)
    case "truncated":
      return correct.slice(0, -2)
    case "extended":
      return correct + "0"
    case "uppercase":
      return "sha256=" + correct.slice(7).toUpperCase()
    case "wrongSecret":
      return wrongSecretSignature
    case "noPrefix":
      return correct.slice(7)
    case "otherScheme":
      return "sha1=" + correct.slice(7)
    case "prefixOnly":
      return "sha256="
    case "v1Garbage":
      return "v1=" + correct.slice(7)
    case "empty":
      return ""
    case "missing":
      return undefined
  }
}

/** Go's `strconv.Atoi` acceptance, as the protocol states it for the attempt header (6.0). */
export const isGoInt = (s: string): boolean => {
  if (!/^[+-]?[0-9]+$/.test(s)) return false
  const n = BigInt(s)
  return n <= 9223372036854775807n && n >= -9223372036854775808n
}

// ---------------------------------------------------------------------------
// Kernel requests: the route table of PROTOCOL 2.1, a seeded kernel, request
// plans derived from valid requests, and the oracle that judges each answer
// ---------------------------------------------------------------------------

export const KERNEL_SECRET = "prop-secret"
export const KERNEL_TOKEN = "prop-token"
export const KERNEL_AGENT = "hello"
const JSON_TYPE = "application/json; charset=utf-8"
const decoder = new TextDecoder()

export const POLICY = `
default_action: allow
rules:
  - id: gate
    priority: 1
    when: { target: send_email }
    then:
      decision: require_approval
      approval_config: { approvers: [alice], message: "check the mail" }
  - id: nope
    priority: 2
    when: { target: rm }
    then: { decision: deny }
`

// ---------------------------------------------------------------------------
// The route table of PROTOCOL 2.1, with the statuses each route may answer
// ---------------------------------------------------------------------------

type Auth = "none" | "bearer" | "agent" | "dual"

export interface RouteSpec {
  readonly method: string
  readonly path: string
  readonly auth: Auth
  /** Members of a strictly decoded body (2.3); absent = no body is decoded. */
  readonly spec?: FieldSpec
  readonly lease?: boolean
  readonly statuses: ReadonlyArray<number>
  /** `{id}` is parsed as a UUID (executions and approvals). */
  readonly uuidId?: boolean
}

export const ROUTES: ReadonlyArray<RouteSpec> = [
  {
    method: "POST",
    path: "/v0/executions",
    auth: "bearer",
    spec: { agent_id: "string", input: "any", agent_version: "string" },
    statuses: [201, 400, 401, 404]
  },
  { method: "GET", path: "/v0/executions", auth: "bearer", statuses: [200, 400, 401] },
  { method: "GET", path: "/v0/executions/{id}", auth: "dual", uuidId: true, statuses: [200, 400, 401, 404] },
  { method: "GET", path: "/v0/executions/{id}/events", auth: "bearer", uuidId: true, statuses: [200, 400, 401] },
  { method: "GET", path: "/v0/executions/{id}/stream", auth: "bearer", uuidId: true, statuses: [200, 400, 401] },
  {
    method: "POST",
    path: "/v0/executions/{id}/cancel",
    auth: "bearer",
    uuidId: true,
    statuses: [204, 400, 401, 404, 409]
  },
  { method: "GET", path: "/v0/executions/{id}/steps", auth: "dual", uuidId: true, statuses: [200, 400, 401] },
  {
    method: "GET",
    path: "/v0/executions/{id}/steps/{step_id}",
    auth: "dual",
    uuidId: true,
    statuses: [200, 400, 401, 404]
  },
  {
    method: "POST",
    path: "/v0/executions/{id}/steps",
    auth: "agent",
    uuidId: true,
    lease: true,
    spec: { kind: "string", target: "string", args: "any", idempotency: "string" },
    statuses: [200, 400, 401, 404, 409]
  },
  {
    method: "POST",
    path: "/v0/executions/{id}/steps/{step_id}/complete",
    auth: "agent",
    uuidId: true,
    lease: true,
    spec: { result: "any" },
    statuses: [200, 400, 401, 404, 409]
  },
  {
    method: "POST",
    path: "/v0/executions/{id}/steps/{step_id}/fail",
    auth: "agent",
    uuidId: true,
    lease: true,
    spec: { error: "any" },
    statuses: [200, 400, 401, 404, 409]
  },
  {
    method: "POST",
    path: "/v0/executions/{id}/steps/{step_id}/stream",
    auth: "agent",
    uuidId: true,
    spec: { seq: "int", data: "string" },
    statuses: [204, 400, 401]
  },
  {
    method: "POST",
    path: "/v0/executions/{id}/heartbeat",
    auth: "agent",
    uuidId: true,
    lease: true,
    statuses: [204, 400, 401, 409]
  },
  {
    method: "POST",
    path: "/v0/executions/{id}/complete",
    auth: "agent",
    uuidId: true,
    lease: true,
    spec: { output: "any" },
    statuses: [204, 400, 401, 404, 409]
  },
  {
    method: "POST",
    path: "/v0/executions/{id}/fail",
    auth: "agent",
    uuidId: true,
    lease: true,
    spec: { error: "string" },
    statuses: [204, 400, 401, 404, 409]
  },
  {
    method: "POST",
    path: "/v0/agents",
    auth: "bearer",
    spec: { id: "string", webhook_url: "string", secret: "string" },
    statuses: [201, 400, 401]
  },
  { method: "GET", path: "/v0/agents", auth: "bearer", statuses: [200, 401] },
  { method: "GET", path: "/v0/agents/{agent}", auth: "bearer", statuses: [200, 401, 404] },
  { method: "DELETE", path: "/v0/agents/{agent}", auth: "bearer", statuses: [204, 401] },
  {
    method: "POST",
    path: "/v0/policies/{agent}",
    auth: "bearer",
    spec: { bundle: "string" },
    statuses: [204, 400, 401, 404]
  },
  { method: "GET", path: "/v0/approvals", auth: "bearer", statuses: [200, 401] },
  { method: "GET", path: "/v0/approvals/{approval}", auth: "bearer", uuidId: true, statuses: [200, 400, 401, 404] },
  {
    method: "POST",
    path: "/v0/approvals/{approval}/grant",
    auth: "bearer",
    uuidId: true,
    spec: { decided_by: "string", rationale: "string" },
    statuses: [204, 400, 401, 403, 404, 409]
  },
  {
    method: "POST",
    path: "/v0/approvals/{approval}/deny",
    auth: "bearer",
    uuidId: true,
    spec: { decided_by: "string", rationale: "string" },
    statuses: [204, 400, 401, 403, 404, 409]
  },
  { method: "GET", path: "/v0/health", auth: "none", statuses: [200] },
  { method: "GET", path: "/v0/ready", auth: "none", statuses: [200] },
  { method: "GET", path: "/metrics", auth: "none", statuses: [200] }
]

export type Match =
  | { readonly _tag: "Route"; readonly route: RouteSpec; readonly params: Readonly<Record<string, string>> }
  | { readonly _tag: "MethodNotAllowed" }
  | { readonly _tag: "NotFound" }

const decodeSegment = (s: string): string => {
  try {
    return decodeURIComponent(s)
  } catch {
    return s
  }
}

const splitUrl = (url: string): { readonly path: string; readonly query: string } => {
  const noHash = url.split("#")[0]!
  const q = noHash.indexOf("?")
  return q < 0 ? { path: noHash, query: "" } : { path: noHash.slice(0, q), query: noHash.slice(q + 1) }
}

/** The oracle's own router over the 2.1 table (segment-wise, percent-decoded after splitting). */
export const matchRoute = (method: string, url: string): Match => {
  const segments = splitUrl(url).path.split("/").map(decodeSegment)
  let pathKnown = false
  for (const route of ROUTES) {
    const pattern = route.path.split("/")
    if (pattern.length !== segments.length) continue
    const params: Record<string, string> = {}
    let ok = true
    for (let i = 0; i < pattern.length && ok; i++) {
      const p = pattern[i]!
      const s = segments[i]!
      if (p.startsWith("{")) {
        if (s === "") ok = false
        else params[p.slice(1, -1)] = s
      } else if (p !== s) ok = false
    }
    if (!ok) continue
    pathKnown = true
    if (route.method === method) return { _tag: "Route", route, params }
  }
  return pathKnown ? { _tag: "MethodNotAllowed" } : { _tag: "NotFound" }
}

// ---------------------------------------------------------------------------
// The seeded kernel
// ---------------------------------------------------------------------------

export type Target = "running" | "blocked" | "terminal" | "unknown"

export interface World {
  readonly core: Core.KernelCore
  readonly handle: (req: Routes.KernelRequest) => Effect.Effect<Routes.KernelResponse>
  readonly tokenMode: boolean
  readonly secret: string
  /** Requests go over a real socket: build only what survives HTTP/1.1 framing (see {@link build}). */
  readonly socket: boolean
  readonly ids: Readonly<Record<Target, string>>
  readonly leases: Readonly<Record<Target, Core.Lease>>
  readonly stepId: string
  readonly approvalId: string
}

/** Agent secrets: the empty one (HMAC pads it), non-ASCII, and longer than the HMAC block. */
export const secretArb = fc.constantFrom(KERNEL_SECRET, KERNEL_SECRET, "", "sécret-🙂", "k".repeat(100))

/**
 * Seed a kernel and answer requests in-process with `Routes.make`. The seed
 * stage: the properties check its statuses and `sha256=` signatures.
 */
export const seed = (tokenMode: boolean, secret: string): Effect.Effect<World> =>
  Effect.flatMap(Core.make({ stage: "seed" }), (core) =>
    seedCore(core, {
      tokenMode,
      secret,
      socket: false,
      handle: Routes.make(core, tokenMode ? { apiToken: Redacted.make(KERNEL_TOKEN) } : {})
    }))

/**
 * Seed a kernel core: agent `hello` (with a policy that gates `send_email`), a
 * running execution with an executing step, one blocked on a pending approval
 * and a completed one, each with its claimed lease.
 */
export const seedCore = (
  core: Core.KernelCore,
  options: {
    readonly tokenMode: boolean
    readonly secret: string
    readonly socket: boolean
    readonly handle: (req: Routes.KernelRequest) => Effect.Effect<Routes.KernelResponse>
  }
): Effect.Effect<World> =>
  Effect.gen(function*() {
    const { secret, tokenMode } = options
    yield* core.registerAgent({ id: KERNEL_AGENT, webhookUrl: "http://agent.invalid/webhook", secret, policyBundle: POLICY })
    const create = (input: string) => core.createExecution({ agentId: KERNEL_AGENT, inputRaw: input, agentVersion: undefined })
    const running = yield* create("{\"q\":1}")
    const blocked = yield* create("{\"q\":2}")
    const terminal = yield* create("{\"q\":3}")
    const claims = yield* core.claimDue(100)
    const leaseOf = (id: string): Core.Lease => {
      const claim = claims.find((c) => c.executionId === id)!
      return { dispatchId: claim.dispatchId, attempt: claim.attempt }
    }
    const step = yield* core.submitStep(running.id, leaseOf(running.id), {
      kind: "tool_call",
      target: "web",
      argsRaw: "{\"q\":\"x\"}",
      idempotency: ""
    })
    const gated = yield* core.submitStep(blocked.id, leaseOf(blocked.id), {
      kind: "tool_call",
      target: "send_email",
      argsRaw: "{\"to\":\"ops\"}",
      idempotency: ""
    })
    yield* core.completeExecution(terminal.id, leaseOf(terminal.id), "{\"ok\":true}")
    const unknown = Uuid.uuidv7(1_000)
    const world: World = {
      core,
      handle: options.handle,
      tokenMode,
      secret,
      socket: options.socket,
      ids: { running: running.id, blocked: blocked.id, terminal: terminal.id, unknown },
      leases: {
        running: leaseOf(running.id),
        blocked: leaseOf(blocked.id),
        terminal: leaseOf(terminal.id),
        unknown: { dispatchId: Uuid.uuidv7(2_000), attempt: 1 }
      },
      stepId: step.stepId!,
      approvalId: gated.approvalId!
    }
    return world
  }).pipe(Effect.orDie)

/** The valid body of a route, as members. */
export const validMembers = (route: RouteSpec, secret: string): Members => {
  switch (route.path) {
    case "/v0/executions":
      return [["agent_id", "\"hello\""], ["input", "{\"q\":\"x\"}"], ["agent_version", "\"v1\""]]
    case "/v0/executions/{id}/steps":
      return [["kind", "\"tool_call\""], ["target", "\"search\""], ["args", "{\"q\":\"y\"}"], [
        "idempotency",
        "\"safe_to_retry\""
      ]]
    case "/v0/executions/{id}/steps/{step_id}/complete":
      return [["result", "{\"r\":1}"]]
    case "/v0/executions/{id}/steps/{step_id}/fail":
      return [["error", "{\"message\":\"boom\"}"]]
    case "/v0/executions/{id}/steps/{step_id}/stream":
      return [["seq", "0"], ["data", "\"delta\""]]
    case "/v0/executions/{id}/complete":
      return [["output", "{\"done\":true}"]]
    case "/v0/executions/{id}/fail":
      return [["error", "\"agent_error: boom\""]]
    case "/v0/agents":
      return [["id", "\"hello\""], ["webhook_url", "\"http://agent.invalid/webhook\""], ["secret", JSON.stringify(secret)]]
    case "/v0/policies/{agent}":
      return [["bundle", JSON.stringify(POLICY)]]
    case "/v0/approvals/{approval}/grant":
    case "/v0/approvals/{approval}/deny":
      return [["decided_by", "\"alice\""], ["rationale", "\"ok\""]]
    default:
      return []
  }
}

// ---------------------------------------------------------------------------
// Request plans
// ---------------------------------------------------------------------------

type IdPlan =
  | { readonly kind: "target"; readonly target: Target; readonly form: UuidForm }
  | { readonly kind: "invalid"; readonly text: string }
  | { readonly kind: "nil" }

type StepIdPlan = "existing" | "upper" | "random" | "garbage"
type AgentPlan = "hello" | "nobody" | "garbage" | "encoded"
type AgentIdHeader = "hello" | "missing" | "empty" | "nobody" | "HELLO" | "dupFirstBad" | "dupFirstGood"
type BearerPlan = "correct" | "missing" | "lower" | "doubleSpace" | "trailing" | "upperToken" | "wrong" | "basic" | "dupFirstBad" | "dupFirstGood"
type LeaseIdPlan =
  | { readonly kind: "own"; readonly form: UuidForm }
  | { readonly kind: "other"; readonly target: Target }
  | { readonly kind: "nil" }
  | { readonly kind: "missing" }
  | { readonly kind: "empty" }
  | { readonly kind: "invalid"; readonly text: string }
type PathPlan = "none" | "trailingSlash" | "extraSegment" | "upperV0" | "doubleSlash" | "prefix" | "badPercent" | "fragment"

export interface RequestPlan {
  readonly route: RouteSpec
  readonly method: string | undefined
  readonly id: IdPlan
  readonly stepId: StepIdPlan
  readonly agent: AgentPlan
  readonly approval: IdPlan
  readonly path: PathPlan
  readonly query: ReadonlyArray<readonly [string, string]>
  readonly body: BodyPlan
  readonly lazyBody: boolean
  readonly agentPath: boolean
  readonly agentId: AgentIdHeader
  readonly signature: SignatureMode
  readonly duplicateSignature: boolean
  readonly bearer: BearerPlan
  readonly leaseId: LeaseIdPlan
  readonly attempt: string | undefined
}

const target = fc.constantFrom<Target>("running", "running", "blocked", "terminal", "unknown")

const idPlan: fc.Arbitrary<IdPlan> = fc.oneof(
  { weight: 8, arbitrary: fc.record({ kind: fc.constant("target" as const), target, form: uuidForm }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("invalid" as const), text: notAUuid }) },
  { weight: 1, arbitrary: fc.constant({ kind: "nil" } as const) }
)

const queryPair = fc.tuple(
  fc.constantFrom("limit", "cursor", "agent_id", "status", "after_seq", "x"),
  fc.oneof(
    fc.constantFrom("", "5", "0", "-1", "201", "abc", "1.5", "terminal", "hello", "running", "%zz", "9999999999999999999999"),
    fc.constantFrom("0192f1a0-0000-7000-8000-000000000000", "{0192F1A0-0000-7000-8000-000000000000}", "nope"),
    fc.string({ maxLength: 6 })
  )
)

export const requestPlan: fc.Arbitrary<RequestPlan> = fc.record({
  route: fc.constantFrom(...ROUTES),
  method: fc.option(fc.constantFrom("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "post", ""), {
    freq: 8
  }),
  id: idPlan,
  stepId: fc.constantFrom<StepIdPlan>("existing", "existing", "upper", "random", "garbage"),
  agent: fc.constantFrom<AgentPlan>("hello", "hello", "nobody", "garbage", "encoded"),
  approval: idPlan,
  path: fc.oneof(
    { weight: 12, arbitrary: fc.constant<PathPlan>("none") },
    {
      weight: 2,
      arbitrary: fc.constantFrom<PathPlan>(
        "trailingSlash",
        "extraSegment",
        "upperV0",
        "doubleSlash",
        "prefix",
        "badPercent",
        "fragment"
      )
    }
  ),
  query: fc.array(queryPair, { maxLength: 3 }),
  body: bodyPlan,
  lazyBody: fc.boolean(),
  agentPath: fc.boolean(),
  agentId: fc.oneof(
    { weight: 10, arbitrary: fc.constant<AgentIdHeader>("hello") },
    {
      weight: 3,
      arbitrary: fc.constantFrom<AgentIdHeader>("missing", "empty", "nobody", "HELLO", "dupFirstBad", "dupFirstGood")
    }
  ),
  signature: signatureMode,
  duplicateSignature: fc.boolean(),
  bearer: fc.oneof(
    { weight: 10, arbitrary: fc.constant<BearerPlan>("correct") },
    {
      weight: 3,
      arbitrary: fc.constantFrom<BearerPlan>(
        "missing",
        "lower",
        "doubleSpace",
        "trailing",
        "upperToken",
        "wrong",
        "basic",
        "dupFirstBad",
        "dupFirstGood"
      )
    }
  ),
  leaseId: fc.oneof(
    { weight: 10, arbitrary: fc.record({ kind: fc.constant("own" as const), form: uuidForm }) },
    {
      weight: 4,
      arbitrary: fc.oneof(
        fc.record({ kind: fc.constant("other" as const), target }),
        fc.constant({ kind: "nil" } as const),
        fc.constant({ kind: "missing" } as const),
        fc.constant({ kind: "empty" } as const),
        fc.record({ kind: fc.constant("invalid" as const), text: notAUuid })
      )
    }
  ),
  attempt: attemptHeader
})

// ---------------------------------------------------------------------------
// Building a request from a plan
// ---------------------------------------------------------------------------

const NIL = "00000000-0000-0000-0000-000000000000"

const idText = (world: World, plan: IdPlan, kind: "execution" | "approval"): string => {
  switch (plan.kind) {
    case "target":
      return spellUuid(
        kind === "approval" && plan.target === "blocked" ? world.approvalId : world.ids[plan.target],
        plan.form
      )
    case "invalid":
      return plan.text
    case "nil":
      return NIL
  }
}

/** Which execution a plan's lease and `{id}` point at. */
const idTarget = (plan: IdPlan): Target => (plan.kind === "target" ? plan.target : "unknown")

/**
 * A path segment escaped as Go's `net/url` escapes a path (what stays as is:
 * letters, digits, `-_.~$&+,/:;=@`): the reference kernel routes on the
 * decoded path only when the path as sent is this canonical form.
 */
const goPathEscape = (s: string): string =>
  Array.from(s).map((ch) =>
    /^[A-Za-z0-9\-_.~$&+,/:;=@]$/.test(ch)
      ? ch
      : Array.from(new TextEncoder().encode(ch)).map((b) => "%" + b.toString(16).toUpperCase().padStart(2, "0")).join("")
  ).join("")

const buildUrl = (world: World, plan: RequestPlan): string => {
  const route = plan.route
  let path = route.path
    .replace("{id}", goPathEscape(idText(world, plan.id, "execution")))
    .replace("{approval}", goPathEscape(idText(world, plan.approval, "approval")))
    .replace(
      "{step_id}",
      plan.stepId === "existing"
        ? world.stepId
        : plan.stepId === "upper"
        ? world.stepId.toUpperCase()
        : plan.stepId === "random"
        ? "ab".repeat(32)
        : encodeURIComponent("../" + "z".repeat(3))
    )
    .replace(
      "{agent}",
      plan.agent === "hello"
        ? "hello"
        : plan.agent === "nobody"
        ? "nobody"
        : plan.agent === "garbage"
        ? encodeURIComponent("a/b?c#d é")
        : "%68%65%6c%6c%6f" // "hello", percent-encoded
    )
  switch (plan.path) {
    case "none":
      break
    case "trailingSlash":
      path += "/"
      break
    case "extraSegment":
      path += "/x"
      break
    case "upperV0":
      path = path.replace("/v0/", "/V0/")
      break
    case "doubleSlash":
      path = "/" + path
      break
    case "prefix":
      path = "/api" + path
      break
    case "badPercent":
      path += "%zz"
      break
    case "fragment":
      path += "#frag"
      break
  }
  if (plan.query.length > 0 && plan.path !== "fragment") {
    path += "?" + plan.query.map(([k, v]) => k + "=" + v).join("&")
  }
  return path
}

/** Percent-encode what an HTTP/1.1 request line cannot carry (as UTF-8). */
const socketSafeUrl = (url: string): string =>
  url.replace(/[^\x21-\x7e]/gu, (c) => [...Buffer.from(c, "utf8")].map((b) => "%" + b.toString(16).toUpperCase().padStart(2, "0")).join(""))

export interface Built {
  readonly route: RouteSpec
  readonly request: Routes.KernelRequest
  readonly headers: ReadonlyMap<string, ReadonlyArray<string>>
  readonly body: MutatedBody
  readonly method: string
  readonly url: string
}

export const build = (world: World, plan: RequestPlan) =>
  Effect.gen(function*() {
    const route = plan.route
    const planned = plan.method ?? route.method
    // Over a socket Node's client upper-cases methods, sends "" as GET and a HEAD
    // answer has no body: use methods that arrive as written.
    const method = !world.socket ? planned : planned === "" || planned === "HEAD" ? "PATCH" : planned.toUpperCase()
    const url = world.socket ? socketSafeUrl(buildUrl(world, plan)) : buildUrl(world, plan)
    const members = validMembers(route, world.secret)
    const spec = route.spec ?? {}
    const body: MutatedBody = route.spec === undefined && plan.body.kind === "none"
      ? { _tag: "Bytes", bytes: new Uint8Array(0), validity: "valid", kind: "none" }
      : applyBodyPlan(members, spec, plan.body)
    const bytes = body._tag === "Bytes" ? body.bytes : new Uint8Array(0)
    const headers = new Map<string, Array<string>>()
    const add = (name: string, raw: string | undefined) => {
      if (raw === undefined) return
      // HTTP/1.1 strips optional whitespace around header values and forbids
      // control characters: over a socket, send what the server will see.
      const value = world.socket ? (/[^\t\x20-\x7e\x80-\xff]/.test(raw) ? "invalid" : raw.trim()) : raw
      const list = headers.get(name) ?? []
      list.push(value)
      headers.set(name, list)
    }
    add("content-type", "application/json")

    // Agent headers: always on agent routes, on dual routes when the plan takes the agent path,
    // and now and then on bearer routes (where they must be ignored).
    const sendsAgentHeaders = route.auth === "agent" || plan.agentPath
    if (sendsAgentHeaders) {
      switch (plan.agentId) {
        case "hello":
          add("rebuno-agent-id", KERNEL_AGENT)
          break
        case "missing":
          break
        case "empty":
          add("rebuno-agent-id", "")
          break
        case "nobody":
          add("rebuno-agent-id", "nobody")
          break
        case "HELLO":
          add("rebuno-agent-id", "HELLO")
          break
        case "dupFirstBad":
          add("rebuno-agent-id", "nobody")
          add("rebuno-agent-id", KERNEL_AGENT)
          break
        case "dupFirstGood":
          add("rebuno-agent-id", KERNEL_AGENT)
          add("rebuno-agent-id", "nobody")
          break
      }
      const record = yield* Effect.result(world.core.getAgent(KERNEL_AGENT))
      const secret = Result.isSuccess(record) ? record.success.secret : world.secret
      const signedBytes = plan.signature === "stale"
        ? encoder.encode(members.length === 0 ? "" : membersText(members))
        : body._tag === "Bytes"
        ? bytes
        : new Uint8Array(0)
      const correct = yield* Signature.sign(secret, signedBytes)
      const wrong = yield* Signature.sign(secret + "x", signedBytes)
      add("rebuno-signature", corruptSignature(correct, plan.signature, wrong))
      // A second value is ignored by the sha256= scheme (only the first counts).
      if (plan.duplicateSignature) add("rebuno-signature", "sha256=" + "0".repeat(64))
    }

    if (world.tokenMode || plan.bearer !== "correct") {
      switch (plan.bearer) {
        case "correct":
          add("authorization", "Bearer " + KERNEL_TOKEN)
          break
        case "missing":
          break
        case "lower":
          add("authorization", "bearer " + KERNEL_TOKEN)
          break
        case "doubleSpace":
          add("authorization", "Bearer  " + KERNEL_TOKEN)
          break
        case "trailing":
          add("authorization", "Bearer " + KERNEL_TOKEN + " ")
          break
        case "upperToken":
          add("authorization", "Bearer " + KERNEL_TOKEN.toUpperCase())
          break
        case "wrong":
          add("authorization", "Bearer wrong")
          break
        case "basic":
          add("authorization", "Basic " + Buffer.from("u:" + KERNEL_TOKEN).toString("base64"))
          break
        case "dupFirstBad":
          add("authorization", "Bearer wrong")
          add("authorization", "Bearer " + KERNEL_TOKEN)
          break
        case "dupFirstGood":
          add("authorization", "Bearer " + KERNEL_TOKEN)
          add("authorization", "Bearer wrong")
          break
      }
    }

    const leaseTarget = idTarget(plan.id)
    const own = world.leases[leaseTarget]
    switch (plan.leaseId.kind) {
      case "own":
        add("rebuno-dispatch-id", spellUuid(own.dispatchId, plan.leaseId.form))
        break
      case "other":
        add("rebuno-dispatch-id", world.leases[plan.leaseId.target].dispatchId)
        break
      case "nil":
        add("rebuno-dispatch-id", NIL)
        break
      case "missing":
        break
      case "empty":
        add("rebuno-dispatch-id", "")
        break
      case "invalid":
        add("rebuno-dispatch-id", plan.leaseId.text)
        break
    }
    add("rebuno-dispatch-attempt", plan.attempt === "<current>" ? String(own.attempt) : plan.attempt)

    const requestBody: Routes.KernelRequest["body"] = body._tag === "Oversized"
      ? (plan.lazyBody ? Effect.fail(new Routes.BodyTooLarge()) : oversizedBody())
      : body._tag === "Aborted"
      ? Effect.fail(new Routes.BodyReadError({ cause: new Error("connection reset by peer") }))
      : plan.lazyBody
      ? Effect.succeed(bytes)
      : bytes
    const request: Routes.KernelRequest = {
      method,
      url,
      headers: (name) => headers.get(name.toLowerCase()) ?? [],
      body: requestBody
    }
    return { route, request, headers, body, method, url } satisfies Built
  })

// ---------------------------------------------------------------------------
// The oracle
// ---------------------------------------------------------------------------

/** The code/message pairs of PROTOCOL 13.2, by status. */
const envelopeOk = (status: number, code: string, message: string): boolean => {
  switch (code) {
    case "validation_error":
      return status === 400 && (
        message === "validation error" ||
        message === "validation error: bad or missing Rebuno-Dispatch-Id" ||
        message === "validation error: bad or missing Rebuno-Dispatch-Attempt" ||
        message.startsWith("load policy bundle: validation error: invalid policy bundle: ")
      )
    case "unauthorized":
      return status === 401 && message === "unauthorized"
    case "forbidden":
      return status === 403 && /^forbidden: ".*" is not an approver for this approval$/s.test(message)
    case "not_found":
      return status === 404 && (message === "not found" || message === "load policy bundle: not found")
    case "conflict":
      return status === 409 && message === "conflict"
    case "execution_terminal":
      return status === 409 && message === "execution terminal"
    case "lease_superseded":
      return status === 409 && message === "dispatch lease superseded"
    default:
      return false
  }
}

const VALIDATION = "{\"code\":\"validation_error\",\"message\":\"validation error\"}\n"
const UNAUTHORIZED = "{\"code\":\"unauthorized\",\"message\":\"unauthorized\"}\n"
const BAD_DISPATCH_ID =
  "{\"code\":\"validation_error\",\"message\":\"validation error: bad or missing Rebuno-Dispatch-Id\"}\n"
const BAD_ATTEMPT =
  "{\"code\":\"validation_error\",\"message\":\"validation error: bad or missing Rebuno-Dispatch-Attempt\"}\n"

export const textOf = (res: Routes.KernelResponse): string | undefined =>
  typeof res.body === "string" ? res.body : res.body instanceof Uint8Array ? decoder.decode(res.body) : undefined

const first = (built: Built, name: string): string => built.headers.get(name)?.[0] ?? ""

/** Checks one answer; returns a description of the first violation, or undefined. */
export const verdict = (world: World, built: Built, res: Routes.KernelResponse, agentSecret: string | undefined, expectedSignature: string) => {
  const fail = (what: string) =>
    `${built.method} ${built.url} [body ${built.body.kind}] → ${res.status} ${JSON.stringify(textOf(res)?.slice(0, 200))}: ${what}; headers ${JSON.stringify([...built.headers])}`
  if (res.status >= 500) return fail("5xx")
  const text = textOf(res)
  const type = res.headers["content-type"]
  const match = matchRoute(built.method, built.url)

  if (match._tag === "NotFound") {
    if (res.status !== 404 || text !== "404 page not found\n" || type !== "text/plain; charset=utf-8") {
      return fail("expected the plain-text routing 404")
    }
    return undefined
  }
  if (match._tag === "MethodNotAllowed") {
    if (res.status !== 405 || text !== "" || type !== undefined) return fail("expected an empty 405")
    return undefined
  }
  const route = match.route
  // A changed method or path can land on another route, for which the body's validity is unknown.
  const validity = route === built.route && built.body._tag === "Bytes" ? built.body.validity : "unknown"
  if (!route.statuses.includes(res.status)) return fail(`status not in ${route.statuses.join("/")}`)

  // Exact bodies.
  if (res.status === 204) {
    if (text !== "" || type !== undefined) return fail("204 must have no body and no content type")
  } else if (route.path.endsWith("/stream") && route.method === "GET" && res.status === 200) {
    if (type !== "text/event-stream") return fail("SSE content type")
  } else if (route.path === "/metrics") {
    if (!type?.startsWith("text/plain")) return fail("metrics content type")
  } else {
    if (type !== JSON_TYPE) return fail(`content type ${type}`)
    if (text === undefined || !text.endsWith("\n") || text.slice(0, -1).includes("\n")) {
      return fail("JSON body must be one line ending in exactly one \\n")
    }
    let parsed: unknown
    try {
      parsed = JSON.parse(text)
    } catch {
      return fail("body is not JSON")
    }
    if (res.status >= 400) {
      const o = parsed as Record<string, unknown>
      if (typeof o !== "object" || o === null || Object.keys(o).join(",") !== "code,message") {
        return fail("error envelope must be exactly {code,message}")
      }
      const code = o["code"]
      const message = o["message"]
      if (typeof code !== "string" || typeof message !== "string") return fail("envelope member types")
      if (text !== "{\"code\":" + Json.quoteString(code) + ",\"message\":" + Json.quoteString(message) + "}\n") {
        return fail("envelope bytes are not the exact encoding")
      }
      if (!envelopeOk(res.status, code, message)) return fail(`code/message ${code}/${message} not in 13.2`)
    }
  }

  // Check order where the outcome is certain.
  const agentPath = route.auth === "agent" ||
    (route.auth === "dual" && (first(built, "rebuno-agent-id") !== "" || first(built, "rebuno-signature") !== ""))
  const bodyOk = built.body._tag === "Bytes"
  const idInvalid = route.uuidId === true &&
    Uuid.parseUuid(match.params["id"] ?? match.params["approval"] ?? "") === undefined
  if (agentPath) {
    const authOk = first(built, "rebuno-agent-id") === KERNEL_AGENT && agentSecret !== undefined &&
      bodyOk && first(built, "rebuno-signature") === expectedSignature
    if (!authOk) return res.status === 401 && text === UNAUTHORIZED ? undefined : fail("expected 401 (agent auth)")
    if (res.status === 401) return fail("a correctly signed request must not be 401")
    if (idInvalid) return text === VALIDATION ? undefined : fail("expected 400 for a non-UUID {id}")
    if (route.spec !== undefined && validity === "invalid") {
      return text === VALIDATION ? undefined : fail("expected 400 for an undecodable body")
    }
    if (route.lease === true && (route.spec === undefined || validity === "valid")) {
      const rawId = first(built, "rebuno-dispatch-id")
      const parsedId = rawId === "" ? undefined : Uuid.parseUuid(rawId)
      if (parsedId === undefined || parsedId === NIL) {
        return text === BAD_DISPATCH_ID ? undefined : fail("expected the bad dispatch id 400")
      }
      const attempt = first(built, "rebuno-dispatch-attempt")
      if (!isGoInt(attempt) || BigInt(attempt) <= 0n) {
        return text === BAD_ATTEMPT ? undefined : fail("expected the bad attempt 400")
      }
      if (res.status === 400) return fail("valid body and lease headers must pass the HTTP checks")
    }
    return undefined
  }
  if (route.auth === "none") return undefined
  // Bearer path (dev mode passes everything).
  const bearerOk = !world.tokenMode || first(built, "authorization") === "Bearer " + KERNEL_TOKEN
  if (!bearerOk) return res.status === 401 && text === UNAUTHORIZED ? undefined : fail("expected 401 (bearer)")
  if (res.status === 401) return fail("bearer route answered 401 with a good token")
  if (idInvalid) return text === VALIDATION ? undefined : fail("expected 400 for a non-UUID {id}")
  if (route.spec !== undefined && (!bodyOk || validity === "invalid")) {
    return text === VALIDATION ? undefined : fail("expected 400 for an undecodable, oversized or unreadable body")
  }
  return undefined
}

/** Events of every execution are dense from 1; statuses are known values. */
export const invariants = (world: World) =>
  Effect.gen(function*() {
    const page = yield* world.core.listExecutions({ agentId: "", status: "", cursor: undefined, limit: 1_000 })
    for (const execution of page.executions) {
      expect(["pending", "running", "blocked", "completed", "failed", "cancelled"]).toContain(execution.status)
      const events = yield* world.core.eventLog(execution.id)
      expect(events.map((e) => e.seq)).toEqual(events.map((_, i) => i + 1))
      for (const event of events) expect(() => JSON.parse(event.payload)).not.toThrow()
    }
  })

export const send = (world: World, request: Routes.KernelRequest) =>
  Effect.flatMap(completes(world.handle(request)), (exit) =>
    Exit.isSuccess(exit) ? Effect.succeed(exit.value) : Effect.die(new Error("routes failed: " + String(exit.cause))))

/** A whole valid flow after the bad input: the kernel still serves and its state is usable. */
export const validFlow = (world: World) =>
  Effect.gen(function*() {
    const auth = world.tokenMode ? { authorization: ["Bearer " + KERNEL_TOKEN] } : {}
    const plain = (method: string, url: string, body = "", extra: Record<string, ReadonlyArray<string>> = {}) => {
      const headers: Record<string, ReadonlyArray<string>> = { ...auth, ...extra }
      return send(world, {
        method,
        url,
        headers: (name) => headers[name.toLowerCase()] ?? [],
        body: encoder.encode(body)
      })
    }
    const health = yield* plain("GET", "/v0/health")
    expect(textOf(health)).toBe("{\"status\":\"ok\"}\n")
    const agentId = "probe"
    const registered = yield* plain(
      "POST",
      "/v0/agents",
      JSON.stringify({ id: agentId, webhook_url: "http://probe.invalid/webhook", secret: "probe-secret" })
    )
    expect(registered.status).toBe(201)
    const created = yield* plain("POST", "/v0/executions", JSON.stringify({ agent_id: agentId, input: { n: 1 } }))
    expect(created.status).toBe(201)
    const id = JSON.parse(textOf(created)!).id as string
    const claim = (yield* world.core.claimDue(1_000)).find((c) => c.executionId === id)!
    const signed = (url: string, body: string) =>
      Effect.flatMap(Signature.sign("probe-secret", body), (signature) =>
        plain("POST", url, body, {
          "rebuno-agent-id": [agentId],
          "rebuno-signature": [signature],
          "rebuno-dispatch-id": [claim.dispatchId],
          "rebuno-dispatch-attempt": [String(claim.attempt)]
        }))
    const submitted = yield* signed(`/v0/executions/${id}/steps`, "{\"kind\":\"tool_call\",\"target\":\"t\",\"args\":{}}")
    expect(submitted.status).toBe(200)
    const decision = JSON.parse(textOf(submitted)!)
    expect(decision.decision).toBe("proceed")
    const completed = yield* signed(`/v0/executions/${id}/steps/${decision.step_id}/complete`, "{\"result\":1}")
    expect(textOf(completed)).toBe("{\"decision\":\"recorded\"}\n")
    const done = yield* signed(`/v0/executions/${id}/complete`, "{\"output\":{\"ok\":true}}")
    expect(done.status).toBe(204)
    const read = yield* plain("GET", `/v0/executions/${id}`)
    expect(JSON.parse(textOf(read)!).status).toBe("completed")
    return 7
  })

const strictUtf8 = new TextDecoder("utf-8", { fatal: true })

// ---------------------------------------------------------------------------
// Webhook bodies (PROTOCOL 5.5) and the receiver's verdict (3.5, 14.2)
// ---------------------------------------------------------------------------

export const WEBHOOK_SPEC: FieldSpec = {
  execution_id: "string",
  dispatch_id: "string",
  dispatch_attempt: "int",
  lease_timeout_seconds: "any"
}

export const webhookMembers = (executionId: string, dispatchId: string, attempt: number): Members => [
  ["execution_id", JSON.stringify(executionId)],
  ["dispatch_id", JSON.stringify(dispatchId)],
  ["dispatch_attempt", String(attempt)],
  ["lease_timeout_seconds", "120"]
]

export type WebhookPlan =
  | { readonly _tag: "Generic"; readonly plan: BodyPlan }
  | { readonly _tag: "Member"; readonly name: string; readonly value: string | undefined }

export const memberValues: Readonly<Record<string, ReadonlyArray<string | undefined>>> = {
  execution_id: [undefined, "\"\"", "1", "null", "{}", "[]", "\"x\"", "\"\\u0000\"", "true"],
  dispatch_id: [undefined, "\"\"", "0", "null", "{\"a\":1}", "\"../../etc\"", "false"],
  dispatch_attempt: [
    undefined,
    "0",
    "-1",
    "1.5",
    "1.0",
    "\"1\"",
    "null",
    "true",
    "1e400",
    "2",
    "9007199254740993",
    "[]",
    "1e0"
  ],
  lease_timeout_seconds: [undefined, "\"x\"", "-1", "0", "null", "1e400", "0.5", "{}", "1e-300"]
}

export const webhookPlan: fc.Arbitrary<WebhookPlan> = fc.oneof(
  { weight: 3, arbitrary: bodyPlan.map((plan) => ({ _tag: "Generic", plan } as const)) },
  {
    weight: 2,
    arbitrary: fc.constantFrom(...Object.keys(memberValues)).chain((name) =>
      fc.constantFrom(...memberValues[name]!).map((value) => ({ _tag: "Member", name, value } as const))
    )
  }
)

export const webhookBytes = (members: Members, plan: WebhookPlan): Uint8Array | "oversized" | "aborted" => {
  if (plan._tag === "Member") {
    const changed = plan.value === undefined
      ? members.filter(([k]) => k !== plan.name)
      : members.map(([k, v]) => [k, k === plan.name ? plan.value! : v] as const)
    return encoder.encode(membersText(changed))
  }
  const mutated = applyBodyPlan(members, WEBHOOK_SPEC, plan.plan)
  return mutated._tag === "Bytes" ? mutated.bytes : mutated._tag === "Oversized" ? "oversized" : "aborted"
}

/** The oracle of 14.2 step 2, written from the protocol text. */
export const acceptable = (bytes: Uint8Array): boolean => {
  let value: unknown
  try {
    value = JSON.parse(strictUtf8.decode(bytes))
  } catch {
    return false
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return false
  const o = value as Record<string, unknown>
  const nonEmpty = (v: unknown) => typeof v === "string" && v !== ""
  if (!nonEmpty(o["execution_id"]) || !nonEmpty(o["dispatch_id"])) return false
  const attempt = o["dispatch_attempt"]
  // Absent (v0.14.0) or a positive integer; `null` is neither (14.2 step 2).
  if (attempt === undefined) return true
  return typeof attempt === "number" && Number.isInteger(attempt) && attempt > 0
}

export interface WebhookDelivery {
  readonly bytes: Uint8Array
  readonly signature: string | undefined
  readonly expected: 200 | 400 | 401
  readonly description: string
}

export const webhookDelivery = (
  secret: string,
  executionId: string,
  dispatchId: string,
  attempt: number,
  plan: WebhookPlan,
  mode: SignatureMode
) =>
  Effect.gen(function*() {
    const members = webhookMembers(executionId, dispatchId, attempt)
    const produced = webhookBytes(members, plan)
    // The webhook receiver gets bytes; an oversized or unreadable body is tested over HTTP.
    const bytes = typeof produced === "string" ? encoder.encode(membersText(members)) : produced
    const signed = mode === "stale" ? encoder.encode(membersText(members)) : bytes
    const correct = yield* Signature.sign(secret, signed)
    const wrong = yield* Signature.sign(secret + "!", signed)
    const signature = corruptSignature(correct, mode, wrong)
    const valid = signature === (yield* Signature.sign(secret, bytes))
    const expected = !valid ? 401 : acceptable(bytes) ? 200 : 400
    const description = `${JSON.stringify(plan)} / ${mode}`
    return { bytes, signature, expected, description } satisfies WebhookDelivery
  })

/** A kernel that answers every read with `404` and must see nothing else. */
export const stubKernel = (secret: string) => {
  const calls: Array<string> = []
  const unexpected = (op: string) =>
    Effect.sync(() => {
      calls.push(op)
    }).pipe(Effect.andThen(Effect.die(new Error(`unexpected kernel call ${op}`))))
  const service: Context.Service.Shape<typeof KernelClient> = {
    secret: Redacted.make(secret),
    getExecution: (_caller, executionId) =>
      Effect.sync(() => calls.push("getExecution " + executionId)).pipe(
        Effect.andThen(
          Effect.fail(
            new KernelError({ reason: new StatusError({ status: 404, code: "not_found", description: "not found" }) })
          )
        )
      ),
    submitStep: () => unexpected("submitStep"),
    completeStep: () => unexpected("completeStep"),
    failStep: () => unexpected("failStep"),
    failStepJson: () => unexpected("failStepJson"),
    publishDelta: () => Effect.void,
    heartbeat: () => Effect.sync(() => void calls.push("heartbeat")),
    completeExecution: () => unexpected("completeExecution"),
    failExecution: () => unexpected("failExecution")
  }
  return { calls, service, layer: Layer.succeed(KernelClient, service) }
}
