/**
 * Go `time.ParseDuration` for policy bundles (PROTOCOL 10.2): an optional
 * sign, then one or more `<decimal number><unit>` groups with units `ns`,
 * `us` / `µs` / `μs`, `ms`, `s`, `m`, `h`, or the string `0` alone. Overflow
 * rules and the float arithmetic of fractions follow Go's implementation, so
 * a duration that Go accepts parses to the same number of nanoseconds here.
 *
 * @since 0.1.0
 * @internal
 */

const MAX_UINT63 = 1n << 63n
const MAX_INT64 = MAX_UINT63 - 1n

const units: ReadonlyMap<string, bigint> = new Map([
  ["ns", 1n],
  ["us", 1_000n],
  ["\u00b5s", 1_000n], // MICRO SIGN
  ["\u03bcs", 1_000n], // GREEK SMALL LETTER MU
  ["ms", 1_000_000n],
  ["s", 1_000_000_000n],
  ["m", 60_000_000_000n],
  ["h", 3_600_000_000_000n]
])

const isDigit = (c: string | undefined): boolean => c !== undefined && c >= "0" && c <= "9"

/**
 * Parses a Go duration string into nanoseconds; `undefined` when Go's
 * `time.ParseDuration` would return an error.
 *
 * @since 0.1.0
 * @category parsing
 */
export const parseNanos = (text: string): bigint | undefined => {
  let s = text
  let negative = false
  if (s.startsWith("-") || s.startsWith("+")) {
    negative = s[0] === "-"
    s = s.slice(1)
  }
  if (s === "0") return 0n
  if (s === "") return undefined
  let total = 0n
  while (s !== "") {
    if (!(s[0] === "." || isDigit(s[0]))) return undefined
    // leading integer
    let i = 0
    let whole = 0n
    while (i < s.length && isDigit(s[i])) {
      if (whole > MAX_UINT63 / 10n) return undefined
      whole = whole * 10n + BigInt(s.charCodeAt(i) - 48)
      if (whole > MAX_UINT63) return undefined
      i++
    }
    const sawWhole = i > 0
    s = s.slice(i)
    // optional fraction; digits past the precision are ignored, as in Go
    let fraction = 0n
    let scale = 1
    let sawFraction = false
    if (s.startsWith(".")) {
      s = s.slice(1)
      let j = 0
      let overflow = false
      while (j < s.length && isDigit(s[j])) {
        if (!overflow) {
          if (fraction > MAX_INT64 / 10n) {
            overflow = true
          } else {
            const next = fraction * 10n + BigInt(s.charCodeAt(j) - 48)
            if (next > MAX_UINT63) {
              overflow = true
            } else {
              fraction = next
              scale *= 10
            }
          }
        }
        j++
      }
      sawFraction = j > 0
      s = s.slice(j)
    }
    if (!sawWhole && !sawFraction) return undefined
    // unit: everything up to the next digit or '.'
    let k = 0
    while (k < s.length && !(s[k] === "." || isDigit(s[k]))) k++
    if (k === 0) return undefined
    const unit = units.get(s.slice(0, k))
    if (unit === undefined) return undefined
    s = s.slice(k)
    if (whole > MAX_UINT63 / unit) return undefined
    let value = whole * unit
    if (fraction > 0n) {
      // Go computes the fractional part in float64; do the same for identical results
      value += BigInt(Math.trunc(Number(fraction) * (Number(unit) / scale)))
      if (value > MAX_UINT63) return undefined
    }
    total += value
    if (total > MAX_UINT63) return undefined
  }
  if (negative) return -total
  if (total > MAX_INT64) return undefined
  return total
}

/**
 * Parses a Go duration string into milliseconds (fractional for sub-millisecond
 * parts); `undefined` when the string is not a valid Go duration.
 *
 * @since 0.1.0
 * @category parsing
 */
export const parseMillis = (text: string): number | undefined => {
  const nanos = parseNanos(text)
  return nanos === undefined ? undefined : Number(nanos) / 1e6
}
