/**
 * UTF-8 decoding as Go's `encoding/json` does it (PROTOCOL 8.3 step 2): every
 * byte that does not start or continue a valid sequence becomes one U+FFFD —
 * where the WHATWG decoder (`TextDecoder`) replaces a whole maximal invalid
 * subpart with a single one. `a E2 82 b` decodes to `a\uFFFD\uFFFDb`, as in Go,
 * so step ids of such input match the reference kernel's. A byte order mark
 * stays in the text (U+FEFF), where JSON parsing refuses it.
 *
 * @since 0.2.0
 * @internal
 */

const strict = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true })

/**
 * The text of `bytes`, with one U+FFFD per invalid byte (Go's
 * `utf8.DecodeRune`: an invalid sequence consumes one byte).
 *
 * @since 0.2.0
 * @internal
 */
export const decodeUtf8 = (bytes: Uint8Array): string => {
  try {
    return strict.decode(bytes)
  } catch {
    return decodeLossy(bytes)
  }
}

/** `b` is a continuation byte within [lo, hi]. */
const within = (b: number | undefined, lo: number, hi: number): boolean => b !== undefined && b >= lo && b <= hi

/** The length of the valid sequence starting at `i`, or 0 when the byte there starts none. */
const sequenceLength = (bytes: Uint8Array, i: number): number => {
  const b0 = bytes[i]!
  if (b0 < 0x80) return 1
  if (b0 < 0xc2) return 0
  const b1 = bytes[i + 1]
  if (b0 < 0xe0) return within(b1, 0x80, 0xbf) ? 2 : 0
  if (b0 < 0xf0) {
    // E0: no overlong forms; ED: no surrogates.
    const ok = b0 === 0xe0 ? within(b1, 0xa0, 0xbf) : b0 === 0xed ? within(b1, 0x80, 0x9f) : within(b1, 0x80, 0xbf)
    return ok && within(bytes[i + 2], 0x80, 0xbf) ? 3 : 0
  }
  if (b0 < 0xf5) {
    // F0: no overlong forms; F4: nothing above U+10FFFF.
    const ok = b0 === 0xf0 ? within(b1, 0x90, 0xbf) : b0 === 0xf4 ? within(b1, 0x80, 0x8f) : within(b1, 0x80, 0xbf)
    return ok && within(bytes[i + 2], 0x80, 0xbf) && within(bytes[i + 3], 0x80, 0xbf) ? 4 : 0
  }
  return 0
}

const decodeLossy = (bytes: Uint8Array): string => {
  let out = ""
  let start = 0
  let i = 0
  while (i < bytes.length) {
    const n = sequenceLength(bytes, i)
    if (n > 0) {
      i += n
      continue
    }
    // Valid bytes up to here in one piece, then the replacement for this one byte.
    out += strict.decode(bytes.subarray(start, i)) + "\ufffd"
    i += 1
    start = i
  }
  return out + strict.decode(bytes.subarray(start))
}
