/**
 * Glob matching for policy `target` / `targets` (PROTOCOL 10.4): Go's
 * `path.Match` on Unicode code points, preceded by the reference kernel's
 * exact-equality shortcut. `*` and `?` never match `/`; classes take ranges
 * and `^` negation; `\` escapes. A malformed pattern never matches.
 *
 * @since 0.1.0
 * @internal
 */

type Chars = ReadonlyArray<string>

const BAD = Symbol("bad pattern")
type Bad = typeof BAD

const codePoint = (c: string): number => c.codePointAt(0)!

/** Splits off the next run of stars and the following star-free chunk. */
const scanChunk = (pattern: Chars): { readonly star: boolean; readonly chunk: Chars; readonly rest: Chars } => {
  let start = 0
  while (start < pattern.length && pattern[start] === "*") start++
  const star = start > 0
  let inRange = false
  for (let i = start; i < pattern.length; i++) {
    switch (pattern[i]) {
      case "\\":
        if (i + 1 < pattern.length) i++
        break
      case "[":
        inRange = true
        break
      case "]":
        inRange = false
        break
      case "*":
        if (!inRange) return { star, chunk: pattern.slice(start, i), rest: pattern.slice(i) }
    }
  }
  return { star, chunk: pattern.slice(start), rest: [] }
}

/** A possibly escaped character inside a class, with what follows it. */
const getEsc = (chunk: Chars, at: number): { readonly char: number; readonly next: number } | Bad => {
  if (at >= chunk.length || chunk[at] === "-" || chunk[at] === "]") return BAD
  let i = at
  if (chunk[i] === "\\") {
    i++
    if (i >= chunk.length) return BAD
  }
  const char = codePoint(chunk[i]!)
  // a class must be closed after every range item
  if (i + 1 >= chunk.length) return BAD
  return { char, next: i + 1 }
}

/**
 * Matches a star-free chunk against the start of `s`. Like Go, the whole
 * chunk is parsed even after a mismatch, so malformation is always reported.
 */
const matchChunk = (chunk: Chars, s: Chars, from: number): number | undefined | Bad => {
  let failed = false
  let pos = from
  let c = 0
  while (c < chunk.length) {
    if (!failed && pos >= s.length) failed = true
    switch (chunk[c]) {
      case "[": {
        let r = 0
        if (!failed) r = codePoint(s[pos++]!)
        c++
        let negated = false
        if (c < chunk.length && chunk[c] === "^") {
          negated = true
          c++
        }
        let matched = false
        let ranges = 0
        for (;;) {
          if (c < chunk.length && chunk[c] === "]" && ranges > 0) {
            c++
            break
          }
          const lo = getEsc(chunk, c)
          if (lo === BAD) return BAD
          let hi = lo
          if (chunk[lo.next] === "-") {
            const upper = getEsc(chunk, lo.next + 1)
            if (upper === BAD) return BAD
            hi = upper
          }
          c = hi.next
          if (lo.char <= r && r <= hi.char) matched = true
          ranges++
        }
        if (matched === negated) failed = true
        break
      }
      case "?":
        if (!failed) {
          if (s[pos] === "/") failed = true
          pos++
        }
        c++
        break
      default: {
        // a backslash makes the next character literal; a trailing one is malformed
        if (chunk[c] === "\\") {
          c++
          if (c >= chunk.length) return BAD
        }
        if (!failed) {
          if (chunk[c] !== s[pos]) failed = true
          pos++
        }
        c++
      }
    }
  }
  return failed ? undefined : pos
}

/**
 * Go's `path.Match(pattern, name)`: `true`/`false`, or `undefined` when the
 * pattern is malformed (`ErrBadPattern`).
 *
 * @since 0.1.0
 * @category matching
 */
export const pathMatch = (pattern: string, name: string): boolean | undefined => {
  let rest: Chars = Array.from(pattern)
  const s: Chars = Array.from(name)
  let pos = 0
  outer: while (rest.length > 0) {
    const scanned = scanChunk(rest)
    rest = scanned.rest
    const { star, chunk } = scanned
    if (star && chunk.length === 0) {
      // trailing star: the rest of the name, unless it crosses a '/'
      return !s.slice(pos).includes("/")
    }
    const here = matchChunk(chunk, s, pos)
    if (here !== BAD && here !== undefined && (here === s.length || rest.length > 0)) {
      pos = here
      continue
    }
    if (here === BAD) return undefined
    if (star) {
      for (let i = pos; i < s.length && s[i] !== "/"; i++) {
        const skipped = matchChunk(chunk, s, i + 1)
        if (skipped === BAD) return undefined
        if (skipped !== undefined) {
          if (rest.length === 0 && skipped < s.length) continue
          pos = skipped
          continue outer
        }
      }
    }
    // no match: still report a malformed remainder as an error, like Go
    while (rest.length > 0) {
      const next = scanChunk(rest)
      rest = next.rest
      if (matchChunk(next.chunk, [], 0) === BAD) return undefined
    }
    return false
  }
  return pos === s.length
}

/**
 * Policy glob match (PROTOCOL 10.4): exact equality first, then
 * {@link pathMatch}; a malformed pattern matches nothing else.
 *
 * @since 0.1.0
 * @category matching
 */
export const match = (pattern: string, value: string): boolean =>
  pattern === value || pathMatch(pattern, value) === true
