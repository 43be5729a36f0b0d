/**
 * Path escaping as Go's `net/url` does it. The reference kernel (Go's
 * `net/http` and chi) routes on the decoded path only when the path as sent
 * is the canonical escaping of it — otherwise on the path as sent, escapes and
 * all (`URL.RawPath`). So a client must send a path segment in exactly that
 * canonical form for the kernel to see the value it meant, and the embedded
 * kernel must route the way Go does.
 *
 * @since 0.2.0
 * @internal
 */

/** The characters Go leaves as they are in a path (`shouldEscape(c, encodePath)` false), `/` aside. */
const SAFE = /^[A-Za-z0-9\-_.~$&+,:;=@]$/

const encoder = new TextEncoder()

const escapeChar = (ch: string): string => {
  let out = ""
  for (const b of encoder.encode(ch)) out += "%" + (b < 16 ? "0" : "") + b.toString(16).toUpperCase()
  return out
}

/**
 * Go's `escape(s, encodePath)` of a path or part of one: `/` kept (it
 * separates segments), every character Go escapes as `%XX` of its UTF-8
 * bytes, upper-case hex.
 *
 * @since 0.2.0
 * @internal
 */
export const escapePath = (s: string): string => {
  let out = ""
  for (const ch of s) out += ch === "/" || SAFE.test(ch) ? ch : escapeChar(ch)
  return out
}

/**
 * One path segment for a request to the kernel: {@link escapePath}, with `/`
 * escaped too (a value holding `/` cannot be one segment otherwise). Ids,
 * agent ids and resource keys reach the kernel exactly as given whenever they
 * hold no `/`.
 *
 * @since 0.2.0
 * @internal
 */
export const segment = (s: string): string => {
  let out = ""
  for (const ch of s) out += SAFE.test(ch) ? ch : escapeChar(ch)
  return out
}
