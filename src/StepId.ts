/**
 * Step identity (PROTOCOL 8): the kernel derives every step's id from the
 * execution, the effect's kind and target, the canonical JSON of its arguments and
 * an occurrence counter. The SDK never sends step ids, but the algorithm is public
 * so ids can be predicted and the dev kernel can reproduce the reference bit for bit.
 *
 * @since 0.1.0
 */
import { hash } from "node:crypto"
import * as Json from "./internal/wire/json.js"

// One-shot `crypto.hash` is several times cheaper than a `createHash` object per call;
// the kernel hashes twice on every step submission.
const sha256Hex = (text: string): string => hash("sha256", text, "hex")

const utf8Length = (text: string): number => Buffer.byteLength(text, "utf8")

/**
 * The fields a step id is derived from.
 *
 * @since 0.1.0
 * @category models
 */
export interface Fields {
  /** Canonical lowercase hyphenated UUID of the execution (36 characters). */
  readonly executionId: string
  /** Step kind as submitted (`tool_call`, `llm_call`, `local`, …), after JSON decoding. */
  readonly kind: string
  /** Step target as submitted, after JSON decoding. */
  readonly target: string
  /** {@link argsHash} of the submitted `args`. */
  readonly argsHash: string
  /** Occurrence counter (8.4), a non-negative integer. */
  readonly occurrence: number
}

/**
 * Canonical JSON (PROTOCOL 8.3) of the raw `args` text as received: `"null"` when
 * the member is absent (`undefined`). Text that is not exactly one JSON value is
 * returned unchanged (the kernel only canonicalises text that already parsed).
 *
 * @example
 * ```ts
 * import { StepId } from "effect-rebuno"
 *
 * StepId.canonicalJson(`{"query": "hello world", "limit": 10}`) // `{"limit":10,"query":"hello world"}`
 * ```
 *
 * @since 0.1.0
 * @category canonical
 */
export const canonicalJson = (raw: string | undefined): string =>
  raw === undefined ? "null" : (Json.canonicalize(raw) ?? raw)

/**
 * Lowercase hex SHA-256 of the UTF-8 bytes of {@link canonicalJson}.
 *
 * @since 0.1.0
 * @category hashing
 */
export const argsHash = (raw: string | undefined): string =>
  raw === EMPTY_OBJECT ? EMPTY_OBJECT_HASH : sha256Hex(canonicalJson(raw))

/** `Step.now`, `Step.random` and `Step.uuid` submit `{}`: its hash is computed once. */
const EMPTY_OBJECT = "{}"
const EMPTY_OBJECT_HASH = sha256Hex(EMPTY_OBJECT)

/**
 * The length-prefixed string hashed into a step id: for each of execution id,
 * kind, target, args hash and decimal occurrence, its UTF-8 byte length in decimal,
 * `:`, then the field itself.
 *
 * @example
 * ```ts
 * import { StepId } from "effect-rebuno"
 *
 * StepId.preimage({
 *   executionId: "0192f1a0-0000-7000-8000-000000000000",
 *   kind: "tool_call",
 *   target: "café", // 4 characters, 5 UTF-8 bytes
 *   argsHash: StepId.argsHash(`{"query": "hello"}`),
 *   occurrence: 10
 * })
 * // "36:0192f1a0-0000-7000-8000-0000000000009:tool_call5:café64:96780c03…2535c5cc2:10"
 * ```
 *
 * @since 0.1.0
 * @category hashing
 */
export const preimage = (fields: Fields): string => {
  const occurrence = String(fields.occurrence)
  return (
    utf8Length(fields.executionId) + ":" + fields.executionId +
    utf8Length(fields.kind) + ":" + fields.kind +
    utf8Length(fields.target) + ":" + fields.target +
    utf8Length(fields.argsHash) + ":" + fields.argsHash +
    occurrence.length + ":" + occurrence
  )
}

/**
 * The step id: lowercase hex SHA-256 of the UTF-8 bytes of {@link preimage}.
 * The execution id is used as given; pass the canonical lowercase form.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (fields: Fields): string => sha256Hex(preimage(fields))
