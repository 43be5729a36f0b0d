/**
 * Go's `strconv.Quote` (the `%q` verb) for JavaScript strings. The reference
 * kernel renders the approver name of a `403 forbidden` message with `%q`, so the
 * dev kernel does the same to produce identical message text.
 *
 * @since 0.1.0
 * @internal
 */

const printable = /^[\p{L}\p{M}\p{N}\p{P}\p{S} ]$/u

const hex = (n: number, width: number): string => n.toString(16).padStart(width, "0")

/**
 * Quote `s` like Go's `strconv.Quote`. Lone UTF-16 surrogates are rendered as
 * U+FFFD, which is what Go's JSON decoder turns an unpaired surrogate escape into.
 *
 * @since 0.1.0
 * @internal
 */
export const goQuote = (s: string): string => {
  let out = "\""
  for (const ch of s) {
    let cp = ch.codePointAt(0)!
    if (cp >= 0xd800 && cp <= 0xdfff) cp = 0xfffd
    switch (cp) {
      case 0x22:
        out += "\\\""
        continue
      case 0x5c:
        out += "\\\\"
        continue
      case 0x07:
        out += "\\a"
        continue
      case 0x08:
        out += "\\b"
        continue
      case 0x0c:
        out += "\\f"
        continue
      case 0x0a:
        out += "\\n"
        continue
      case 0x0d:
        out += "\\r"
        continue
      case 0x09:
        out += "\\t"
        continue
      case 0x0b:
        out += "\\v"
        continue
    }
    const c = String.fromCodePoint(cp)
    if (printable.test(c)) {
      out += c
    } else if (cp < 0x20 || cp === 0x7f) {
      out += "\\x" + hex(cp, 2)
    } else if (cp < 0x10000) {
      out += "\\u" + hex(cp, 4)
    } else {
      out += "\\U" + hex(cp, 8)
    }
  }
  return out + "\""
}
