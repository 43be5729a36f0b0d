/**
 * Go formatting rules the policy engine must reproduce: `%v` of a value
 * decoded from JSON (PROTOCOL 10.4, used for argument predicates), `%q` for
 * identifiers in validation messages, and Go's byte-wise (code point) string
 * order used when `%v` prints map keys; and Go's `strings.TrimSpace`, which
 * the kernel's validations use.
 *
 * @since 0.1.0
 * @internal
 */
import { goQuote } from "./goQuote.js"

/**
 * Go's `%v` of a `float64`: shortest round-trip digits, exponent form
 * `d[.ddd]e±XX` when the decimal exponent is < -4 or >= 6, plain otherwise.
 *
 * @since 0.1.0
 * @category formatting
 */
export const formatFloat = (x: number): string => {
  if (Number.isNaN(x)) return "NaN"
  if (x === Infinity) return "+Inf"
  if (x === -Infinity) return "-Inf"
  if (x === 0) return Object.is(x, -0) ? "-0" : "0"
  const exponential = x.toExponential()
  const at = exponential.indexOf("e")
  const mantissa = exponential.slice(0, at)
  const exponent = Number(exponential.slice(at + 1))
  if (exponent < -4 || exponent >= 6) {
    return `${mantissa}e${exponent < 0 ? "-" : "+"}${String(Math.abs(exponent)).padStart(2, "0")}`
  }
  return String(x)
}

/**
 * Orders strings by Unicode code point (Go compares UTF-8 bytes, which gives
 * the same order; JavaScript's default compares UTF-16 code units).
 *
 * @since 0.1.0
 * @category ordering
 */
export const compareCodePoints = (a: string, b: string): number => {
  const n = Math.min(a.length, b.length)
  for (let i = 0; i < n; i++) {
    const x = a.codePointAt(i)!
    const y = b.codePointAt(i)!
    if (x !== y) return x - y
    if (x > 0xffff) i++
  }
  return a.length - b.length
}

/**
 * Go's `%v` of a value produced by decoding JSON into `any`: strings as is,
 * `<nil>`, `true`/`false`, numbers as {@link formatFloat}, arrays as
 * `[a b]`, objects as `map[k:v ...]` with keys in sorted order.
 *
 * @since 0.1.0
 * @category formatting
 */
export const formatValue = (value: unknown): string => {
  // Iterative, as arguments may nest up to the decoder's 10,000 levels: `open`
  // holds the arrays and maps being written, innermost last, with their items
  // (a map's as sorted `[key, value]` entries) and the index of the next one.
  const open: Array<{ readonly items: ReadonlyArray<unknown>; readonly isMap: boolean; index: number }> = []
  let out = ""
  let current = value
  for (;;) {
    if (Array.isArray(current)) {
      out += "["
      open.push({ items: current, isMap: false, index: 0 })
    } else if (typeof current === "object" && current !== null) {
      const entries = current instanceof Map
        ? [...(current as ReadonlyMap<string, unknown>).entries()]
        : Object.entries(current as Record<string, unknown>)
      entries.sort(([a], [b]) => compareCodePoints(a, b))
      out += "map["
      open.push({ items: entries, isMap: true, index: 0 })
    } else {
      out += formatScalar(current)
    }
    // Go on to the next item of the innermost open container, closing those that are done.
    for (;;) {
      if (open.length === 0) return out
      const frame = open[open.length - 1]!
      if (frame.index < frame.items.length) {
        if (frame.index > 0) out += " "
        const item = frame.items[frame.index++]
        if (frame.isMap) {
          const [key, member] = item as readonly [string, unknown]
          out += key + ":"
          current = member
        } else {
          current = item
        }
        break
      }
      out += "]"
      open.pop()
    }
  }
}

const formatScalar = (value: unknown): string => {
  if (value === null || value === undefined) return "<nil>"
  switch (typeof value) {
    case "string":
      return value
    case "boolean":
      return value ? "true" : "false"
    case "number":
      return formatFloat(value)
    default:
      return String(value)
  }
}

/**
 * Go's `%q` (`strconv.Quote`) of a string: double quotes, backslash escapes
 * for quotes, backslashes, control and non-printable characters (one
 * definition for the kernel: `goQuote`).
 *
 * @since 0.1.0
 * @category formatting
 */
export const quote: (s: string) => string = goQuote

/**
 * Go's `unicode.IsSpace` for a UTF-16 code unit: what `strings.TrimSpace`
 * removes. Unlike JavaScript's `String.prototype.trim` it includes U+0085
 * (NEL) and excludes U+FEFF (the byte order mark).
 *
 * @since 0.2.0
 * @category strings
 */
export const isSpace = (c: number): boolean =>
  (c >= 0x09 && c <= 0x0d) || c === 0x20 || c === 0x85 || c === 0xa0 || c === 0x1680 ||
  (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f || c === 0x3000

/**
 * Go's `strings.TrimSpace`: `s` without leading and trailing {@link isSpace}
 * characters.
 *
 * @since 0.2.0
 * @category strings
 */
export const trimSpace = (s: string): string => {
  let start = 0
  let end = s.length
  while (start < end && isSpace(s.charCodeAt(start))) start++
  while (end > start && isSpace(s.charCodeAt(end - 1))) end--
  return s.slice(start, end)
}
