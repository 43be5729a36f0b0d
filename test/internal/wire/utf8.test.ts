import { describe, expect, it } from "@effect/vitest"
import * as fc from "fast-check"
import { decodeUtf8 } from "../../../src/internal/wire/utf8.js"

/** Bytes and what Go's `encoding/json` decodes them to inside a string (go1.26, computed once). */
const goCases: ReadonlyArray<readonly [string, string]> = [
  ["61e28262", "a\ufffd\ufffdb"], // a truncated 3-byte sequence: one U+FFFD per byte (WHATWG gives one)
  ["c080", "\ufffd\ufffd"], // overlong
  ["eda080", "\ufffd\ufffd\ufffd"], // an encoded surrogate
  ["f4908080", "\ufffd\ufffd\ufffd\ufffd"], // above U+10FFFF
  ["80", "\ufffd"], // a lone continuation byte
  ["f09f98", "\ufffd\ufffd\ufffd"], // a truncated 4-byte sequence
  ["f09f9880", "\u{1f600}"],
  ["e08080", "\ufffd\ufffd\ufffd"],
  ["efbbbf78", "\ufeffx"], // a byte order mark stays
  ["fffe7a", "\ufffd\ufffdz"],
  ["c3a9c3", "\u00e9\ufffd"],
  ["f888808080", "\ufffd\ufffd\ufffd\ufffd\ufffd"]
]

/** U+FFFD's own encoding, which may be in the input already. */
const REPLACEMENT = Buffer.from([0xef, 0xbf, 0xbd])

describe("decodeUtf8", () => {
  it.each(goCases)("%s decodes as Go decodes it", (hex, expected) => {
    expect(decodeUtf8(Buffer.from(hex, "hex"))).toBe(expected)
  })

  it("valid UTF-8 decodes as TextDecoder does, BOM included", () => {
    const decoder = new TextDecoder("utf-8", { ignoreBOM: true })
    fc.assert(fc.property(fc.string({ unit: "grapheme" }), (text) => {
      const bytes = new TextEncoder().encode("\ufeff" + text)
      expect(decodeUtf8(bytes)).toBe(decoder.decode(bytes))
    }))
  })

  it("any bytes: one U+FFFD per byte that no valid sequence covers, the valid sequences kept", () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => {
      const text = decodeUtf8(bytes)
      // Re-encoding gives back every valid sequence, and EF BF BD (3 bytes) for each replaced byte.
      const replaced = [...text].filter((c) => c === "\ufffd").length
      let genuine = 0
      for (let at = Buffer.from(bytes).indexOf(REPLACEMENT); at >= 0; at = Buffer.from(bytes).indexOf(REPLACEMENT, at + 3)) {
        genuine++
      }
      expect(new TextEncoder().encode(text).length).toBe(bytes.length + 2 * (replaced - genuine))
    }))
  })
})
