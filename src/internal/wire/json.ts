/**
 * Hand-written JSON text processing for the wire protocol: the canonical JSON of
 * step identity (PROTOCOL 8.3), the echo re-encoding of stored raw values (2.8),
 * strict top-level object decoding for kernel request bodies (2.3), Go-style string
 * quoting, and a strict serialiser for SDK values. Everything here works on JSON
 * *text* and keeps number literals verbatim, which `JSON.parse` cannot do. These
 * functions run on every step in the kernel, so they scan with `charCodeAt` and
 * build output from slices of the input rather than per-character concatenation.
 *
 * The parsers share module-level scanning state; they never call user code, so
 * they cannot be re-entered while running.
 *
 * @since 0.1.0
 */

// ---------------------------------------------------------------------------
// Escape tables
// ---------------------------------------------------------------------------

const HEX = "0123456789abcdef"

/** Go `encoding/json` (HTML-escaping) output for ASCII characters that need escaping. */
const ASCII_ESCAPES: ReadonlyArray<string | undefined> = (() => {
  const table: Array<string | undefined> = new Array(128).fill(undefined)
  for (let c = 0; c < 0x20; c++) {
    table[c] = "\\u00" + HEX[c >> 4] + HEX[c & 0xf]
  }
  table[0x08] = "\\b"
  table[0x0c] = "\\f"
  table[0x0a] = "\\n"
  table[0x0d] = "\\r"
  table[0x09] = "\\t"
  table[0x22] = "\\\""
  table[0x5c] = "\\\\"
  table[0x3c] = "\\u003c"
  table[0x3e] = "\\u003e"
  table[0x26] = "\\u0026"
  return table
})()

const REPLACEMENT = "\ufffd"
const MAX_DEPTH = 10_000

const isHighSurrogate = (c: number): boolean => c >= 0xd800 && c <= 0xdbff
const isLowSurrogate = (c: number): boolean => c >= 0xdc00 && c <= 0xdfff

/** Escape written by Go's compactor for a raw `<`, `>`, `&`, U+2028 or U+2029. */
const htmlEscape = (c: number): string =>
  c === 0x2028 ? "\\u2028" : c === 0x2029 ? "\\u2029" : (ASCII_ESCAPES[c] as string)

const PLAIN = 0
const QUOTE = 1
const BACKSLASH = 2
const CONTROL = 3
const HTML = 4

/** Class of each ASCII character inside a JSON string. */
const ASCII_CLASS: Uint8Array = (() => {
  const table = new Uint8Array(128)
  for (let c = 0; c < 0x20; c++) table[c] = CONTROL
  table[0x22] = QUOTE
  table[0x5c] = BACKSLASH
  table[0x3c] = HTML
  table[0x3e] = HTML
  table[0x26] = HTML
  return table
})()

/** True for the short escapes whose decoded character Go writes back the same way. */
const isSelfCanonicalEscape = (e: number): boolean =>
  e === 0x22 || e === 0x5c || e === 0x62 || e === 0x66 || e === 0x6e || e === 0x72 || e === 0x74

// ---------------------------------------------------------------------------
// Shared scanning state
// ---------------------------------------------------------------------------

let src = ""
let len = 0
let pos = 0
/** Set by `readString`: the raw text of the string just read is already its canonical quoted form. */
let stringClean = false
/** Output chunks of `compact`; `undefined` when only validating. */
let chunks: Array<string> | undefined
let segStart = 0

const begin = (text: string, compacting: boolean): void => {
  src = text
  len = text.length
  pos = 0
  chunks = compacting ? [] : undefined
  segStart = 0
}

const end = (): void => {
  src = ""
  len = 0
  chunks = undefined
}

/** Skips JSON whitespace; while compacting, the skipped run is cut out of the output. */
const skipWs = (): void => {
  let p = pos
  while (p < len) {
    const c = src.charCodeAt(p)
    if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) p++
    else break
  }
  if (p !== pos) {
    if (chunks !== undefined) {
      if (pos > segStart) chunks.push(src.slice(segStart, pos))
      segStart = p
    }
    pos = p
  }
}

const isDigit = (c: number): boolean => c >= 0x30 && c <= 0x39

/** Scans a number literal at `pos` (JSON grammar, as strict as Go's scanner). */
const scanNumber = (): boolean => {
  let p = pos
  if (src.charCodeAt(p) === 0x2d) p++
  let c = src.charCodeAt(p)
  if (c === 0x30) {
    p++
  } else if (c >= 0x31 && c <= 0x39) {
    p++
    while (isDigit(src.charCodeAt(p))) p++
  } else {
    return false
  }
  if (src.charCodeAt(p) === 0x2e) {
    p++
    if (!isDigit(src.charCodeAt(p))) return false
    p++
    while (isDigit(src.charCodeAt(p))) p++
  }
  c = src.charCodeAt(p)
  if (c === 0x65 || c === 0x45) {
    p++
    c = src.charCodeAt(p)
    if (c === 0x2b || c === 0x2d) p++
    if (!isDigit(src.charCodeAt(p))) return false
    p++
    while (isDigit(src.charCodeAt(p))) p++
  }
  pos = p
  return true
}

const scanLiteral = (word: string): boolean => {
  if (src.startsWith(word, pos)) {
    pos += word.length
    return true
  }
  return false
}

/**
 * The items of the array or object whose opening bracket is at `pos`, through
 * its closing one (`close`): `item` reads the item at `pos` (for an object, a
 * whole member) and whitespace around items is skipped here. False when the
 * text is not a well-formed container.
 */
const scanItems = (close: number, item: (index: number) => boolean): boolean => {
  pos++
  skipWs()
  if (src.charCodeAt(pos) === close) {
    pos++
    return true
  }
  for (let index = 0;; index++) {
    if (!item(index)) return false
    skipWs()
    const d = src.charCodeAt(pos)
    pos++
    if (d === close) return true
    if (d !== 0x2c) return false
    skipWs()
  }
}

/** The `:` after an object key, with the whitespace around it. */
const scanColon = (): boolean => {
  skipWs()
  if (src.charCodeAt(pos) !== 0x3a) return false
  pos++
  skipWs()
  return true
}

/**
 * Reads `text` as exactly one value (whitespace around it allowed): `read`
 * scans it from `pos`, `result` is the answer once all of `text` was consumed.
 * `compacting` records whitespace cuts for `compact`.
 */
const whole = <A>(text: string, read: () => boolean, result: () => A, compacting = false): A | undefined => {
  begin(text, compacting)
  try {
    skipWs()
    if (pos >= len || !read()) return undefined
    skipWs()
    return pos === len ? result() : undefined
  } finally {
    end()
  }
}

const hexValue = (c: number): number => {
  if (c >= 0x30 && c <= 0x39) return c - 0x30
  if (c >= 0x61 && c <= 0x66) return c - 0x57
  if (c >= 0x41 && c <= 0x46) return c - 0x37
  return -1
}

/** The 4 hex digits at `p` as a number, or -1. */
const hex4 = (p: number): number => {
  if (p + 4 > len) return -1
  const a = hexValue(src.charCodeAt(p))
  const b = hexValue(src.charCodeAt(p + 1))
  const c = hexValue(src.charCodeAt(p + 2))
  const d = hexValue(src.charCodeAt(p + 3))
  if ((a | b | c | d) < 0) return -1
  return (a << 12) | (b << 8) | (c << 4) | d
}

/**
 * Reads and decodes the string starting at `pos` (which holds `"`), following Go's
 * decoder: escapes decoded, lone surrogates (escaped or raw) become U+FFFD, a valid
 * escaped pair becomes one astral character. Sets `stringClean`.
 */
const readString = (): string | undefined => {
  const text = src
  const n = len
  const start = pos + 1
  let p = start
  let clean = true
  for (;;) {
    if (p >= n) return undefined
    const c = text.charCodeAt(p)
    if (c < 0x80) {
      const k = ASCII_CLASS[c]
      if (k === PLAIN) {
        p++
        continue
      }
      if (k === QUOTE) {
        pos = p + 1
        stringClean = clean
        return text.slice(start, p)
      }
      if (k === BACKSLASH) break
      if (k === CONTROL) return undefined
      clean = false
    } else if (c === 0x2028 || c === 0x2029) {
      clean = false
    } else if (c >= 0xd800 && c <= 0xdfff) {
      if (isHighSurrogate(c) && isLowSurrogate(text.charCodeAt(p + 1))) {
        p += 2
        continue
      }
      break // a raw lone surrogate: decode it on the slow path
    }
    p++
  }
  // Slow path: escapes or raw lone surrogates.
  const parts: Array<string> = []
  let seg = start
  for (;;) {
    if (p >= len) return undefined
    const c = src.charCodeAt(p)
    if (c === 0x22) {
      if (p > seg) parts.push(src.slice(seg, p))
      pos = p + 1
      stringClean = false
      return parts.join("")
    }
    if (c === 0x5c) {
      if (p > seg) parts.push(src.slice(seg, p))
      const e = src.charCodeAt(p + 1)
      switch (e) {
        case 0x22:
          parts.push("\"")
          p += 2
          break
        case 0x5c:
          parts.push("\\")
          p += 2
          break
        case 0x2f:
          parts.push("/")
          p += 2
          break
        case 0x62:
          parts.push("\b")
          p += 2
          break
        case 0x66:
          parts.push("\f")
          p += 2
          break
        case 0x6e:
          parts.push("\n")
          p += 2
          break
        case 0x72:
          parts.push("\r")
          p += 2
          break
        case 0x74:
          parts.push("\t")
          p += 2
          break
        case 0x75: {
          const u = hex4(p + 2)
          if (u < 0) return undefined
          if (u >= 0xd800 && u <= 0xdfff) {
            if (isHighSurrogate(u) && src.charCodeAt(p + 6) === 0x5c && src.charCodeAt(p + 7) === 0x75) {
              const u2 = hex4(p + 8)
              if (isLowSurrogate(u2)) {
                parts.push(String.fromCharCode(u, u2))
                p += 12
                break
              }
            }
            parts.push(REPLACEMENT)
          } else {
            parts.push(String.fromCharCode(u))
          }
          p += 6
          break
        }
        default:
          return undefined
      }
      seg = p
      continue
    }
    if (c < 0x20) return undefined
    if (c >= 0xd800 && c <= 0xdfff) {
      if (isHighSurrogate(c) && isLowSurrogate(src.charCodeAt(p + 1))) {
        p += 2
        continue
      }
      if (p > seg) parts.push(src.slice(seg, p))
      parts.push(REPLACEMENT)
      p++
      seg = p
      continue
    }
    p++
  }
}

// ---------------------------------------------------------------------------
// Validating walk (used by compact and parseObjectMembers)
// ---------------------------------------------------------------------------

/** Validates the string at `pos`; while compacting, escapes raw `<>&` U+2028 U+2029. */
const walkString = (): boolean => {
  const text = src
  const n = len
  let p = pos + 1
  for (;;) {
    if (p >= n) return false
    const c = text.charCodeAt(p)
    if (c < 0x80) {
      const k = ASCII_CLASS[c]
      if (k === PLAIN) {
        p++
        continue
      }
      if (k === QUOTE) {
        pos = p + 1
        return true
      }
      if (k === BACKSLASH) {
        const e = text.charCodeAt(p + 1)
        if (e === 0x75) {
          if (hex4(p + 2) < 0) return false
          p += 6
        } else if (isSelfCanonicalEscape(e) || e === 0x2f) {
          p += 2
        } else {
          return false
        }
        continue
      }
      if (k === CONTROL) return false
    } else if (c !== 0x2028 && c !== 0x2029) {
      p++
      continue
    }
    // A raw `<`, `>`, `&`, U+2028 or U+2029.
    if (chunks !== undefined) {
      if (p > segStart) chunks.push(text.slice(segStart, p))
      chunks.push(htmlEscape(c))
      segStart = p + 1
    }
    p++
  }
}

/** Validates the scalar at `pos`, whose first character is `c`. */
const walkScalar = (c: number): boolean => {
  switch (c) {
    case 0x22:
      return walkString()
    case 0x74:
      return scanLiteral("true")
    case 0x66:
      return scanLiteral("false")
    case 0x6e:
      return scanLiteral("null")
    default:
      return scanNumber()
  }
}

/** A well-formed object key at `pos` and the `:` after it. */
const walkKey = (): boolean => src.charCodeAt(pos) === 0x22 && walkString() && scanColon()

/**
 * Closing bracket (`]` or `}`) of each container {@link walkValue} has entered
 * and not yet left, innermost last; shared, as `walkValue` is never re-entered.
 */
const openClosers = new Uint8Array(MAX_DEPTH)

/**
 * Validates the value at `pos` (nested `depth` containers deep), and compacts it
 * when `chunks` is set. Iterative, so that any nesting up to {@link MAX_DEPTH}
 * works whatever the caller's stack: the containers entered and not yet closed
 * are counted in `open`, with their closers in `openClosers`.
 */
const walkValue = (depth: number): boolean => {
  let open = 0
  for (;;) {
    // A value starts at `pos`: read a scalar, or enter a container and go on to its first item.
    const c = src.charCodeAt(pos)
    if (c === 0x7b || c === 0x5b) { // { [
      if (depth + open >= MAX_DEPTH) return false
      const close = c + 2 // } ]
      pos++
      skipWs()
      if (src.charCodeAt(pos) === close) {
        pos++ // empty: a complete value
      } else {
        openClosers[open++] = close
        if (c === 0x7b && !walkKey()) return false
        continue
      }
    } else if (!walkScalar(c)) {
      return false
    }
    // A value ended: after it comes `,` and the next item (with its key in an
    // object), or the closer of its container, which ends that container too.
    for (;;) {
      if (open === 0) return true
      skipWs()
      const d = src.charCodeAt(pos)
      pos++
      if (d === 0x2c) {
        skipWs()
        if (openClosers[open - 1] === 0x7d && !walkKey()) return false
        break
      }
      if (d !== openClosers[open - 1]) return false
      open--
    }
  }
}

// ---------------------------------------------------------------------------
// Canonical JSON (8.3)
// ---------------------------------------------------------------------------

/** Orders strings by Unicode code point (= UTF-8 byte order), not UTF-16 code unit. */
const compareCodePoints = (a: string, b: string): number => {
  const n = a.length < b.length ? a.length : b.length
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i)
    const y = b.charCodeAt(i)
    if (x !== y) {
      if (x >= 0xd800 && y >= 0xd800) {
        // Surrogates (astral characters) sort after U+E000..U+FFFF.
        const fx = x >= 0xe000 ? x - 0x800 : x + 0x2000
        const fy = y >= 0xe000 ? y - 0x800 : y + 0x2000
        return fx - fy
      }
      return x - y
    }
  }
  return a.length - b.length
}

/**
 * Reads the string at `pos` and returns its canonical quoted form directly from
 * the raw text (decode + Go re-escape in one pass), copying runs that need no
 * change. Escapes whose canonical form is identical to the input are kept in place.
 */
const canonString = (): string | undefined => {
  const text = src
  const n = len
  const start = pos
  let p = start + 1
  let out = ""
  let seg = start
  for (;;) {
    if (p >= n) return undefined
    const c = text.charCodeAt(p)
    if (c < 0x80) {
      const k = ASCII_CLASS[c]
      if (k === PLAIN) {
        p++
        continue
      }
      if (k === QUOTE) {
        pos = p + 1
        return seg === start ? text.slice(start, pos) : out + text.slice(seg, pos)
      }
      if (k === CONTROL) return undefined
      if (k === HTML) {
        out += text.slice(seg, p) + ASCII_ESCAPES[c]
        p++
        seg = p
        continue
      }
      // Backslash.
      const e = text.charCodeAt(p + 1)
      if (isSelfCanonicalEscape(e)) {
        p += 2
        continue
      }
      if (e === 0x2f) {
        out += text.slice(seg, p) + "/"
        p += 2
        seg = p
        continue
      }
      if (e !== 0x75) return undefined
      const u = hex4(p + 2)
      if (u < 0) return undefined
      let rep: string
      let consumed = 6
      if (u < 0x80) {
        rep = ASCII_ESCAPES[u] ?? String.fromCharCode(u)
      } else if (u === 0x2028 || u === 0x2029) {
        rep = htmlEscape(u)
      } else if (u >= 0xd800 && u <= 0xdfff) {
        rep = REPLACEMENT
        if (isHighSurrogate(u) && text.charCodeAt(p + 6) === 0x5c && text.charCodeAt(p + 7) === 0x75) {
          const u2 = hex4(p + 8)
          if (isLowSurrogate(u2)) {
            rep = String.fromCharCode(u, u2)
            consumed = 12
          }
        }
      } else {
        rep = String.fromCharCode(u)
      }
      // `\u0001`, `\u003c`, `\u2028` … are already canonical when written in lowercase.
      if (rep.length !== 6 || !text.startsWith(rep, p)) {
        out += text.slice(seg, p) + rep
        seg = p + consumed
      }
      p += consumed
      continue
    }
    if (c === 0x2028 || c === 0x2029) {
      out += text.slice(seg, p) + htmlEscape(c)
      p++
      seg = p
    } else if (c >= 0xd800 && c <= 0xdfff) {
      if (isHighSurrogate(c) && isLowSurrogate(text.charCodeAt(p + 1))) {
        p += 2
        continue
      }
      out += text.slice(seg, p) + REPLACEMENT
      p++
      seg = p
    } else {
      p++
    }
  }
}

/** The members of an object written out of order or with duplicate keys: the last duplicate wins, keys sorted. */
const sortedMembers = (keys: ReadonlyArray<string>, members: ReadonlyArray<string>): string => {
  const byKey = new Map<string, string>()
  for (let i = 0; i < keys.length; i++) byKey.set(keys[i]!, members[i]!)
  const distinct = Array.from(byKey.keys()).sort(compareCodePoints)
  let out = ""
  for (let i = 0; i < distinct.length; i++) {
    if (i > 0) out += ","
    out += byKey.get(distinct[i]!)!
  }
  return out
}

/**
 * A container {@link canonValue} has entered and not yet closed. An array keeps
 * its canonical text so far; an object keeps its keys and members in the order
 * written (members as canonical `"key":value` text), whether they came sorted
 * and without duplicates, and the key whose value is being read.
 */
interface CanonFrame {
  readonly isObject: boolean
  /** Array: `[` and the items so far, comma-separated. */
  text: string
  keys: Array<string> | undefined
  members: Array<string> | undefined
  sorted: boolean
  /** Object: the decoded key awaiting its value, and its canonical quoted form. */
  key: string
  quotedKey: string
}

/** Reads the object key at `pos` and the `:` after it into `frame`. */
const canonKey = (frame: CanonFrame): boolean => {
  if (src.charCodeAt(pos) !== 0x22) return false
  const keyStart = pos
  const key = readString()
  if (key === undefined) return false
  frame.key = key
  frame.quotedKey = stringClean ? src.slice(keyStart, pos) : quoteString(key)
  return scanColon()
}

/** The canonical text of the scalar at `pos`. */
const canonScalar = (c: number): string | undefined => {
  switch (c) {
    case 0x22:
      return canonString()
    case 0x74:
      return scanLiteral("true") ? "true" : undefined
    case 0x66:
      return scanLiteral("false") ? "false" : undefined
    case 0x6e:
      return scanLiteral("null") ? "null" : undefined
    default: {
      const start = pos
      return scanNumber() ? src.slice(start, pos) : undefined
    }
  }
}

/**
 * The canonical text of the value at `pos`. Iterative, so that any nesting up
 * to {@link MAX_DEPTH} works whatever the caller's stack: `frame` is the
 * innermost container entered and not yet closed, `outer` the ones around it
 * (outermost first), `depth` their number. Empty containers never get a frame.
 */
const canonValue = (): string | undefined => {
  let frame: CanonFrame | undefined
  const outer: Array<CanonFrame> = []
  let depth = 0
  for (;;) {
    // A value starts at `pos`: read a scalar, or enter a container and go on to its first item.
    let value: string | undefined
    const c = src.charCodeAt(pos)
    if (c === 0x7b || c === 0x5b) { // { [
      if (depth >= MAX_DEPTH) return undefined
      const isObject = c === 0x7b
      pos++
      skipWs()
      if (src.charCodeAt(pos) === c + 2) { // } ]
        pos++
        value = isObject ? "{}" : "[]"
      } else {
        if (frame !== undefined) outer.push(frame)
        frame = { isObject, text: "[", keys: undefined, members: undefined, sorted: true, key: "", quotedKey: "" }
        depth++
        if (isObject && !canonKey(frame)) return undefined
        continue
      }
    } else {
      value = canonScalar(c)
      if (value === undefined) return undefined
    }
    // A value ended: add it to its container; then comes `,` and the next item
    // (read its key in an object), or the closer, which ends the container,
    // whose text is in turn the value ended in the container around it.
    for (;;) {
      if (frame === undefined) return value
      if (frame.isObject) {
        // Members written in sorted order with no duplicate (the common case) are
        // joined as they are; otherwise the last duplicate wins and the keys are sorted.
        const member: string = frame.quotedKey + ":" + value
        if (frame.keys === undefined || frame.members === undefined) {
          frame.keys = [frame.key]
          frame.members = [member]
        } else {
          if (frame.sorted && compareCodePoints(frame.keys[frame.keys.length - 1]!, frame.key) >= 0) {
            frame.sorted = false
          }
          frame.keys.push(frame.key)
          frame.members.push(member)
        }
      } else {
        frame.text += frame.text.length === 1 ? value : "," + value
      }
      skipWs()
      const d = src.charCodeAt(pos)
      pos++
      if (d === 0x2c) {
        skipWs()
        if (frame.isObject && !canonKey(frame)) return undefined
        break
      }
      if (frame.isObject) {
        if (d !== 0x7d) return undefined
        const members: Array<string> = frame.members!
        value = frame.sorted ?
          (members.length === 1 ? "{" + members[0]! + "}" : "{" + members.join(",") + "}") :
          "{" + sortedMembers(frame.keys!, members) + "}"
      } else {
        if (d !== 0x5d) return undefined
        value = frame.text + "]"
      }
      frame = outer.pop()
      depth--
    }
  }
}

/**
 * Canonical JSON of PROTOCOL 8.3 from raw JSON text: no whitespace, object keys
 * sorted by code point (UTF-8 byte order) with the last duplicate winning, number
 * literals verbatim, strings re-escaped with Go's HTML-escaping table.
 *
 * Returns `undefined` when `raw` is not exactly one JSON value (surrounding
 * whitespace allowed).
 *
 * For example, the text `{"b": 1.0, "a": "<x>", "b": 2}` canonicalises to
 * the text `{"a":"\u003cx\u003e","b":2}`.
 *
 * @since 0.1.0
 * @category canonical
 */
export const canonicalize = (raw: string): string | undefined => {
  let out: string | undefined
  return whole(raw, () => (out = canonValue()) !== undefined, () => out!)
}

// ---------------------------------------------------------------------------
// Echo re-encoding (2.8)
// ---------------------------------------------------------------------------

/**
 * The echo re-encoding of PROTOCOL 2.8 (Go's `json.Compact` with HTML escaping):
 * insignificant whitespace removed, raw `<`, `>`, `&`, U+2028 and U+2029 inside
 * strings escaped as `\u003c`, `\u003e`, `\u0026`, `\u2028`, `\u2029`; everything
 * else — key order, duplicate keys, number literals, existing escapes — kept as
 * written. Returns the input itself when nothing changes.
 *
 * Returns `undefined` when `raw` is not exactly one JSON value.
 *
 * For example, the text `{ "b" : 1.0, "a":"<", "b":2 }` compacts to the
 * text `{"b":1.0,"a":"\u003c","b":2}`.
 *
 * @since 0.1.0
 * @category echo
 */
export const compact = (raw: string): string | undefined =>
  whole(raw, () => walkValue(0), () => {
    if (segStart === 0 && chunks!.length === 0) return raw
    if (segStart < len) chunks!.push(raw.slice(segStart, len))
    return chunks!.length === 1 ? chunks![0]! : chunks!.join("")
  }, true)

// ---------------------------------------------------------------------------
// Strict top-level object decoding (2.3)
// ---------------------------------------------------------------------------

/**
 * Strict top-level decoding of a kernel request body (PROTOCOL 2.3): `text` must
 * be exactly one JSON object, optionally surrounded by whitespace. Returns each
 * member's decoded name mapped to the exact source text of its value (not
 * re-encoded); with duplicate names the last occurrence wins. Nested values are
 * fully validated.
 *
 * Returns `undefined` when `text` is empty, not valid JSON, not an object, or
 * followed by anything but whitespace.
 *
 * For example, the text `{"kind":"tool_call", "args": {"q": 1}}` gives the
 * map `kind` → `"tool_call"`, `args` → `{"q": 1}` (values as source text).
 *
 * @since 0.1.0
 * @category decoding
 */
export const parseObjectMembers = (text: string): ReadonlyMap<string, string> | undefined => {
  const members = new Map<string, string>()
  return whole(
    text,
    () =>
      src.charCodeAt(pos) === 0x7b &&
      scanItems(0x7d, () => {
        if (src.charCodeAt(pos) !== 0x22) return false
        const key = readString()
        if (key === undefined || !scanColon()) return false
        const valueStart = pos
        if (!walkValue(1)) return false
        members.set(key, src.slice(valueStart, pos))
        return true
      }),
    () => members
  )
}

/**
 * Strict decoding of a JSON array given as raw text: `text` must be exactly
 * one JSON array, optionally surrounded by whitespace. Returns each element's
 * exact source text (not re-encoded, so `1.0` stays `1.0` for a strict
 * integer check), in order. Nested values are fully validated.
 *
 * Returns `undefined` when `text` is not valid JSON, not an array, or
 * followed by anything but whitespace.
 *
 * @since 0.2.0
 * @category decoding
 */
export const parseArrayElements = (text: string): ReadonlyArray<string> | undefined => {
  const elements: Array<string> = []
  return whole(
    text,
    () =>
      src.charCodeAt(pos) === 0x5b &&
      scanItems(0x5d, () => {
        const valueStart = pos
        if (!walkValue(1)) return false
        elements.push(src.slice(valueStart, pos))
        return true
      }),
    () => elements
  )
}

/**
 * Decodes raw JSON text that must be exactly one JSON string (surrounding
 * whitespace allowed), with the decoding rules of PROTOCOL 8.3: escapes decoded,
 * lone surrogates become U+FFFD, valid escaped pairs combine. Use it for string
 * fields whose decoded value matters bit for bit (a step's `kind` and `target`,
 * 8.2), where `JSON.parse` would keep lone surrogates.
 *
 * Returns `undefined` when `raw` is not a single JSON string.
 *
 * @since 0.1.0
 * @category decoding
 */
export const parseString = (raw: string): string | undefined => {
  let out: string | undefined
  return whole(raw, () => src.charCodeAt(pos) === 0x22 && (out = readString()) !== undefined, () => out!)
}

// ---------------------------------------------------------------------------
// Quoting
// ---------------------------------------------------------------------------

/**
 * The JSON text of a JS string as Go's `encoding/json` writes it with HTML
 * escaping (the table of PROTOCOL 8.3): `"` `\` and control characters escaped
 * (`\b \f \n \r \t`, otherwise `\u00xx` lowercase), `<` `>` `&` U+2028 U+2029 as
 * `\u` escapes, everything else raw. A lone surrogate is written as U+FFFD.
 *
 * For example, the string `a<b>` followed by U+0001 is written as the text
 * `"a\u003cb\u003e\u0001"`.
 *
 * @since 0.1.0
 * @category encoding
 */
export const quoteString = (s: string): string => {
  const n = s.length
  let i = 0
  for (; i < n; i++) {
    const c = s.charCodeAt(i)
    if (c < 0x80) {
      if (ASCII_ESCAPES[c] !== undefined) break
    } else if (c === 0x2028 || c === 0x2029) {
      break
    } else if (c >= 0xd800 && c <= 0xdfff) {
      if (isHighSurrogate(c) && isLowSurrogate(s.charCodeAt(i + 1))) i++
      else break
    }
  }
  if (i === n) return "\"" + s + "\""
  let out = "\""
  let seg = 0
  for (; i < n; i++) {
    const c = s.charCodeAt(i)
    let rep: string | undefined
    if (c < 0x80) {
      rep = ASCII_ESCAPES[c]
    } else if (c === 0x2028 || c === 0x2029) {
      rep = htmlEscape(c)
    } else if (c >= 0xd800 && c <= 0xdfff) {
      if (isHighSurrogate(c) && isLowSurrogate(s.charCodeAt(i + 1))) {
        i++
        continue
      }
      rep = REPLACEMENT
    }
    if (rep !== undefined) {
      if (i > seg) out += s.slice(seg, i)
      out += rep
      seg = i + 1
    }
  }
  if (seg < n) out += s.slice(seg)
  return out + "\""
}

// ---------------------------------------------------------------------------
// Strict serialisation
// ---------------------------------------------------------------------------

/**
 * Result of {@link stringifyStrict}: the JSON text, or why the value is not JSON
 * and where (a JSONPath such as `$.a[2].b`).
 *
 * @since 0.1.0
 * @category encoding
 */
export type StrictResult =
  | { readonly _tag: "Ok"; readonly json: string }
  | { readonly _tag: "Invalid"; readonly reason: string; readonly path: string }

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/

const renderPath = (segments: ReadonlyArray<string | number>): string => {
  let out = "$"
  for (const seg of segments) {
    if (typeof seg === "number") out += "[" + seg + "]"
    else if (IDENTIFIER.test(seg)) out += "." + seg
    else out += "[" + JSON.stringify(seg) + "]"
  }
  return out
}

const describeObject = (value: object): string => {
  const ctor = (value as { readonly constructor?: unknown }).constructor
  const name = typeof ctor === "function" && typeof ctor.name === "string" && ctor.name !== "" ? ctor.name : "object"
  return `${name} is not a plain object or array`
}

const isPlainPrototype = (proto: unknown): boolean => proto === null || Object.getPrototypeOf(proto) === null

/** Nesting beyond which {@link isPlainJson} gives up (cycles end up here too). */
const QUICK_DEPTH = 64

/**
 * The quick check of {@link stringifyStrict}: is `value` JSON as it stands, and
 * no deeper than {@link QUICK_DEPTH}? Allocates nothing; `false` sends the
 * caller to {@link writeJson}, which finds the reason and its path. Its
 * recursion is bounded by `QUICK_DEPTH`, and so is that of `JSON.stringify`
 * on the values it passes.
 */
const isPlainJson = (value: unknown, depth: number): boolean => {
  switch (typeof value) {
    case "string":
    case "boolean":
      return true
    case "number":
      return Number.isFinite(value)
    case "object":
      break
    default:
      return false
  }
  if (value === null) return true
  if (depth >= QUICK_DEPTH) return false
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      if (!isPlainJson(value[i], depth + 1)) return false
    }
    return true
  }
  if (!isPlainPrototype(Object.getPrototypeOf(value))) return false
  const record = value as Record<string, unknown>
  for (const key of Object.keys(record)) {
    if (!isPlainJson(record[key], depth + 1)) return false
  }
  return true
}

/** Why a value that is not an object is not JSON; `undefined` for a string, boolean or finite number. */
const scalarReason = (value: unknown): string | undefined => {
  switch (typeof value) {
    case "number":
      return Number.isFinite(value) ? undefined : `${value} is not a JSON number`
    case "undefined":
      return "undefined is not a JSON value"
    case "function":
      return "a function is not a JSON value"
    case "symbol":
      return "a symbol is not a JSON value"
    case "bigint":
      return "a bigint is not a JSON value"
    default:
      return undefined
  }
}

/** An array or object {@link writeJson} has entered and not yet closed. */
interface WriteFrame {
  readonly value: object
  /** An object's keys (`Object.keys`, the order `JSON.stringify` uses); `undefined` for an array. */
  readonly keys: ReadonlyArray<string> | undefined
  /** The number of items or members written so far. */
  index: number
}

/**
 * The slow path of {@link stringifyStrict}: checks `root` as a whole and writes
 * the text `JSON.stringify` would write for it. Iterative, since the values
 * that get here may be nested far deeper than `JSON.stringify` can recurse
 * (a few thousand levels, fewer in a deep caller): `open` holds the containers
 * entered and not yet closed, innermost last, and `segments[k]` is the index
 * or key, within `open[k]`, of the value being visited — its JSONPath.
 */
const writeJson = (root: unknown): StrictResult => {
  const open: Array<WriteFrame> = []
  const segments: Array<string | number> = []
  const ancestors = new Set<object>()
  let out = ""
  let value = root
  for (;;) {
    // Write `value`, or enter it when it is a non-empty container.
    let reason: string | undefined
    if (typeof value === "string" || typeof value === "number") {
      reason = scalarReason(value)
      if (reason === undefined) out += JSON.stringify(value)
    } else if (typeof value === "boolean") {
      out += value ? "true" : "false"
    } else if (value === null) {
      out += "null"
    } else if (typeof value !== "object") {
      reason = scalarReason(value)
    } else if (ancestors.has(value)) {
      reason = "circular reference"
    } else if (!Array.isArray(value) && !isPlainPrototype(Object.getPrototypeOf(value))) {
      reason = describeObject(value)
    } else if (open.length >= MAX_DEPTH) {
      reason = `exceeded max depth (${MAX_DEPTH} nested arrays and objects)`
    } else {
      const keys = Array.isArray(value) ? undefined : Object.keys(value)
      out += keys === undefined ? "[" : "{"
      ancestors.add(value)
      open.push({ value, keys, index: 0 })
    }
    if (reason !== undefined) return { _tag: "Invalid", reason, path: renderPath(segments) }
    // Go on to the next item of the innermost open container, closing those that are done.
    for (;;) {
      if (open.length === 0) return { _tag: "Ok", json: out }
      const frame = open[open.length - 1]!
      segments.length = open.length - 1
      const i = frame.index++
      if (frame.keys === undefined) {
        const array = frame.value as ReadonlyArray<unknown>
        if (i < array.length) {
          if (i > 0) out += ","
          segments.push(i)
          value = array[i]
          break
        }
        out += "]"
      } else {
        if (i < frame.keys.length) {
          const key = frame.keys[i]!
          out += (i > 0 ? "," : "") + JSON.stringify(key) + ":"
          segments.push(key)
          value = (frame.value as Record<string, unknown>)[key]
          break
        }
        out += "}"
      }
      ancestors.delete(frame.value)
      open.pop()
    }
  }
}

/**
 * Serialises a JS value with `JSON.stringify`, but only when the value is JSON as
 * it stands, so nothing is silently changed or dropped: `NaN`, `±Infinity`,
 * `undefined` (anywhere, including object members), functions, symbols, bigints,
 * cycles and objects that are neither arrays nor plain objects (`Date`, `Map`,
 * class instances, boxed primitives, objects with `toJSON` …) are rejected with a
 * reason and the JSONPath of the offending value. Symbol-keyed and non-enumerable
 * properties are ignored, as `JSON.stringify` ignores them. Nesting deeper than
 * 10,000 arrays and objects is rejected too (the kernel's limit, as Go's);
 * anything up to that is serialised whatever the depth of the caller's stack.
 *
 * For example, `stringifyStrict({ a: [1, NaN] })` is
 * `{ _tag: "Invalid", reason: "NaN is not a JSON number", path: "$.a[1]" }`.
 *
 * @since 0.1.0
 * @category encoding
 */
export const stringifyStrict = (value: unknown): StrictResult => {
  try {
    if (isPlainJson(value, 0)) return { _tag: "Ok", json: JSON.stringify(value) }
    // Not JSON, or deeper than the quick check goes: walk it again, tracking the path and cycles.
    return writeJson(value)
  } catch {
    // A getter or proxy trap threw.
    return { _tag: "Invalid", reason: "value cannot be serialised (a getter or proxy trap threw)", path: "$" }
  }
}
