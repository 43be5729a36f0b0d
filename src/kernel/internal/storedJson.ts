/**
 * Raw JSON as the kernel core stores it and reads it back: values are kept
 * compacted (PROTOCOL 2.8), and two answers depend on what a stored step
 * error says — its `reason` on a replayed denial (7.4) and whether it marks
 * the outcome as unknown (`indeterminate`, 7.3 step 10).
 *
 * @since 0.1.0
 * @internal
 */
import { compact } from "../../internal/wire/json.js"
import { flat } from "./flat.js"

/**
 * Characters whose absence makes valid JSON text its own compact form: no
 * whitespace to drop, nothing to HTML-escape, no escape sequence to re-encode.
 * SDK bodies (`JSON.stringify` of plain data) usually pass, which skips a parse.
 */
const mayChangeWhenCompacted = /[\s<>&\\\u2028\u2029\ud800-\udfff]/

/**
 * The stored form of a raw JSON member: compacted and HTML-escaped (2.8);
 * `undefined` stays absent.
 *
 * @since 0.1.0
 * @internal
 */
export const compactRaw = (raw: string | undefined): string | undefined =>
  raw === undefined ? undefined : flat(mayChangeWhenCompacted.test(raw) ? (compact(raw) ?? raw) : raw)

/**
 * Whether a stored error JSON has the top-level string member `"reason":"indeterminate"`.
 *
 * @since 0.1.0
 * @internal
 */
export const isIndeterminateError = (raw: string | undefined): boolean => {
  if (raw === undefined || !raw.includes("indeterminate")) return false
  try {
    const value: unknown = JSON.parse(raw)
    return typeof value === "object" && value !== null && !Array.isArray(value) &&
      (value as { readonly reason?: unknown }).reason === "indeterminate"
  } catch {
    return false
  }
}

/**
 * The `reason` of a stored denial error, or `policy_denied` (7.4).
 *
 * @since 0.1.0
 * @internal
 */
export const deniedReason = (raw: string | undefined): string => {
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
