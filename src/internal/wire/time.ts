/**
 * Timestamp formatting for the wire (PROTOCOL 2.6): RFC 3339 in UTC with a `Z`
 * suffix, the fractional seconds trimmed of trailing zeros and omitted when zero.
 * The kernel keeps time in epoch milliseconds, so at most three fraction digits
 * appear.
 *
 * @since 0.1.0
 */

/**
 * Formats epoch milliseconds as an RFC 3339 UTC timestamp:
 * `2026-08-18T19:40:54.12Z` for 120 ms, `2026-08-18T19:40:54Z` for a whole second.
 * Fractional milliseconds are rounded down; a value outside the range of `Date`
 * (or not finite) formats as the Unix epoch rather than throwing.
 *
 * @since 0.1.0
 * @category formatting
 */
export const formatTimestamp = (ms: number): string => {
  const date = new Date(Number.isFinite(ms) ? Math.floor(ms) : 0)
  const iso = Number.isNaN(date.getTime()) ? "1970-01-01T00:00:00.000Z" : date.toISOString()
  // iso ends with ".sssZ"; the year part may be longer than 4 digits.
  const dot = iso.length - 5
  let fracEnd = iso.length - 1
  while (fracEnd > dot + 1 && iso.charCodeAt(fracEnd - 1) === 0x30) fracEnd--
  return fracEnd === dot + 1 ? iso.slice(0, dot) + "Z" : iso.slice(0, fracEnd) + "Z"
}
