/**
 * Target globs of the current stage's policy language (PROTOCOL-CURRENT
 * C.8.6): `*` matches any run of characters and `?` any one character — both
 * also match `/`, unlike the seed stage's Go `path.Match` (PROTOCOL 10.4) —
 * `[…]` is a class with ranges and `^` negation, `\` escapes the next
 * character. A malformed pattern (unclosed `[`, an empty class, a dangling
 * `-`, a trailing `\`) is an error at load time instead of a glob that never
 * matches. Matching runs on Unicode code points in O(pattern × value) time
 * (no backtracking blow-up), after the reference kernel's exact-equality
 * shortcut.
 *
 * @since 0.2.0
 * @internal
 */
import * as Result from "effect/Result"

type Token =
  | { readonly _tag: "star" }
  | { readonly _tag: "any" }
  | { readonly _tag: "char"; readonly char: number }
  | { readonly _tag: "class"; readonly negated: boolean; readonly ranges: ReadonlyArray<readonly [number, number]> }

const STAR: Token = { _tag: "star" }
const ANY: Token = { _tag: "any" }

/**
 * Parses a glob into tokens; the failure says what is malformed.
 */
const tokenize = (pattern: string): Result.Result<ReadonlyArray<Token>, string> => {
  const chars = Array.from(pattern, (c) => c.codePointAt(0)!)
  const tokens: Array<Token> = []
  const BACKSLASH = 0x5c
  const DASH = 0x2d
  const CLOSE = 0x5d
  let i = 0
  while (i < chars.length) {
    const c = chars[i]!
    if (c === 0x2a) {
      // consecutive stars are one
      if (tokens[tokens.length - 1] !== STAR) tokens.push(STAR)
      i++
    } else if (c === 0x3f) {
      tokens.push(ANY)
      i++
    } else if (c === BACKSLASH) {
      if (i + 1 >= chars.length) return Result.fail("trailing backslash")
      tokens.push({ _tag: "char", char: chars[i + 1]! })
      i += 2
    } else if (c === 0x5b) {
      i++
      let negated = false
      if (chars[i] === 0x5e) {
        negated = true
        i++
      }
      const ranges: Array<readonly [number, number]> = []
      // one class item: a character (escaped or not), never an unescaped `-` or `]`
      const item = (): number | undefined => {
        const x = chars[i]
        if (x === undefined || x === DASH || x === CLOSE) return undefined
        if (x === BACKSLASH) {
          const escaped = chars[i + 1]
          if (escaped === undefined) return undefined
          i += 2
          return escaped
        }
        i++
        return x
      }
      for (;;) {
        if (i >= chars.length) return Result.fail("unclosed character class")
        if (chars[i] === CLOSE && ranges.length > 0) {
          i++
          break
        }
        const lo = item()
        if (lo === undefined) {
          return Result.fail(chars[i] === CLOSE ? "empty character class" : "malformed character class")
        }
        let hi = lo
        if (chars[i] === DASH) {
          i++
          const upper = item()
          if (upper === undefined) return Result.fail("malformed character range")
          hi = upper
        }
        ranges.push([lo, hi])
      }
      tokens.push({ _tag: "class", negated, ranges })
    } else {
      tokens.push({ _tag: "char", char: c })
      i++
    }
  }
  return Result.succeed(tokens)
}

const matchesOne = (token: Token, char: number): boolean => {
  switch (token._tag) {
    case "any":
      return true
    case "char":
      return token.char === char
    case "class": {
      let inside = false
      for (const [lo, hi] of token.ranges) {
        if (lo <= char && char <= hi) {
          inside = true
          break
        }
      }
      return inside !== token.negated
    }
    default:
      return false
  }
}

/** Wildcard matching with one backtrack point (the last star): O(tokens × chars). */
const matchTokens = (tokens: ReadonlyArray<Token>, value: string): boolean => {
  const chars = Array.from(value, (c) => c.codePointAt(0)!)
  let t = 0
  let v = 0
  let starAt = -1
  let resumeAt = 0
  while (v < chars.length) {
    const token = tokens[t]
    if (token !== undefined && token._tag !== "star" && matchesOne(token, chars[v]!)) {
      t++
      v++
    } else if (token !== undefined && token._tag === "star") {
      starAt = t++
      resumeAt = v
    } else if (starAt >= 0) {
      t = starAt + 1
      v = ++resumeAt
    } else {
      return false
    }
  }
  while (t < tokens.length && tokens[t]!._tag === "star") t++
  return t === tokens.length
}

/**
 * Compiles a target glob: the matcher, or why the pattern is malformed.
 *
 * @since 0.2.0
 * @internal
 */
export const compile = (pattern: string): Result.Result<(value: string) => boolean, string> =>
  Result.map(tokenize(pattern), (tokens) => (value: string) => value === pattern || matchTokens(tokens, value))
