import { describe, expect, it } from "@effect/vitest"
import * as fc from "fast-check"
import { readFileSync } from "node:fs"
import * as Json from "../../../src/internal/wire/json.js"

const stepVectors = (JSON.parse(
  readFileSync(new URL("../../../../shared/fixtures/step-ids.json", import.meta.url), "utf8")
) as { readonly vectors: ReadonlyArray<{ readonly raw_args: string | null; readonly canonical: string }> }).vectors

describe("canonicalize", () => {
  it("maps every fixture raw_args to its canonical text", () => {
    for (const v of stepVectors) {
      if (v.raw_args !== null) expect(Json.canonicalize(v.raw_args)).toBe(v.canonical)
    }
  })

  it("keeps number literals verbatim", () => {
    expect(Json.canonicalize(`[1.0, 1e3, 1E+3, -0, 0.10, 12345678901234567890123]`)).toBe(
      `[1.0,1e3,1E+3,-0,0.10,12345678901234567890123]`
    )
  })

  it("sorts keys by code point, not UTF-16 code unit", () => {
    expect(Json.canonicalize(`{"\u{1F600}":1,"\uff41":2,"\ue000":3,"a":4}`)).toBe(
      `{"a":4,"\ue000":3,"\uff41":2,"\u{1F600}":1}`
    )
    expect(Json.canonicalize(`{"ab":1,"a":2,"":3}`)).toBe(`{"":3,"a":2,"ab":1}`)
  })

  it("lets the last duplicate win, at every depth", () => {
    expect(Json.canonicalize(`{"a":1,"b":0,"a":{"x":1,"x":2}}`)).toBe(`{"a":{"x":2},"b":0}`)
  })

  it("decodes surrogate escapes like Go", () => {
    expect(Json.canonicalize(`"\\ud83d\\ude00"`)).toBe(`"\u{1F600}"`)
    expect(Json.canonicalize(`"\\ud800"`)).toBe(`"\ufffd"`)
    expect(Json.canonicalize(`"\\udc00\\ud800x"`)).toBe(`"\ufffd\ufffdx"`)
    // A high surrogate followed by another high one: the first is replaced, the second re-examined.
    expect(Json.canonicalize(`"\\ud83d\\ud83d\\ude00"`)).toBe(`"\ufffd\u{1F600}"`)
    expect(Json.canonicalize(`"\\ud83dA"`)).toBe(`"\ufffdA"`)
    // Raw lone surrogates in the JS string behave as invalid UTF-8 would.
    expect(Json.canonicalize(`"a\ud800b"`)).toBe(`"a\ufffdb"`)
  })

  it("escapes with Go's table", () => {
    expect(Json.canonicalize(`"\\u0000\\u001f\\b\\f\\n\\r\\t\\"\\\\\\/\\u007f\\u00e9<>&\u2028\u2029"`)).toBe(
      `"\\u0000\\u001f\\b\\f\\n\\r\\t\\"\\\\/\u007f\u00e9\\u003c\\u003e\\u0026\\u2028\\u2029"`
    )
  })

  it("rejects invalid JSON", () => {
    for (
      const bad of [
        "",
        "   ",
        "{",
        "[1,]",
        "{\"a\":1,}",
        "{\"a\" 1}",
        "{a:1}",
        "01",
        "1.",
        ".5",
        "-",
        "1e",
        "+1",
        "NaN",
        "tru",
        "nul",
        "\"abc",
        "\"\\x\"",
        "\"\\u12g4\"",
        "\"a\nb\"",
        "\"\t\"",
        "1 2",
        "{} x",
        "[] []",
        "'a'"
      ]
    ) {
      expect(Json.canonicalize(bad), bad).toBeUndefined()
    }
  })

  it("accepts surrounding whitespace", () => {
    expect(Json.canonicalize(" \t\r\n{ } \n")).toBe("{}")
  })

  it("agrees with JSON.parse on structure (property)", () => {
    fc.assert(
      fc.property(fc.jsonValue(), (value) => {
        const text = JSON.stringify(value, null, 1)
        const canonical = Json.canonicalize(text)
        expect(canonical).toBeDefined()
        expect(JSON.parse(canonical!)).toEqual(JSON.parse(text))
        expect(Json.canonicalize(canonical!)).toBe(canonical)
      })
    )
  })

  it("re-escapes strings however they were written (property)", () => {
    // Encode every UTF-16 unit either raw (when JSON allows) or as a \uXXXX escape in either case.
    const encode = (s: string, choices: ReadonlyArray<number>): string => {
      let out = "\""
      for (let i = 0; i < s.length; i++) {
        const c = s.charCodeAt(i)
        const choice = choices[i % choices.length]!
        const hex = c.toString(16).padStart(4, "0")
        // Surrogates are always escaped: an escaped half next to a raw half never pairs (Go sees bytes).
        const rawAllowed = c >= 0x20 && c !== 0x22 && c !== 0x5c && (c < 0xd800 || c > 0xdfff)
        if (choice === 0 && rawAllowed) out += s[i]
        else if (choice === 1) out += "\\u" + hex.toUpperCase()
        else out += "\\u" + hex
      }
      return out + "\""
    }
    fc.assert(
      fc.property(
        fc.string({ unit: "binary" }),
        fc.array(fc.integer({ min: 0, max: 2 }), { minLength: 1 }),
        (s, choices) => {
          const expected = Json.quoteString(s)
          expect(Json.canonicalize(encode(s, choices))).toBe(expected)
          expect(Json.canonicalize(JSON.stringify(s))).toBe(expected)
          expect(Json.canonicalize(`{${JSON.stringify(s)}:0}`)).toBe(`{${expected}:0}`)
        }
      )
    )
  })

  it("survives deep nesting without throwing", () => {
    expect(Json.canonicalize("[".repeat(200) + "]".repeat(200))).toBe("[".repeat(200) + "]".repeat(200))
    expect(Json.canonicalize("[".repeat(200_000) + "]".repeat(200_000))).toBeUndefined()
  })
})

describe("compact", () => {
  it("removes whitespace and keeps order, duplicates and number text (2.8)", () => {
    expect(Json.compact(`{ "b" : 1.0 , "a" : [ 1e3 , -0 ] , "b" : 2 }`)).toBe(`{"b":1.0,"a":[1e3,-0],"b":2}`)
  })

  it("escapes raw <, >, &, U+2028 and U+2029 inside strings", () => {
    expect(Json.compact(`{"html":"<b>&amp;</b>","ls":"a\u2028b\u2029c"}`)).toBe(
      `{"html":"\\u003cb\\u003e\\u0026amp;\\u003c/b\\u003e","ls":"a\\u2028b\\u2029c"}`
    )
  })

  it("keeps existing escapes and non-ASCII as written", () => {
    const raw = `{"s":"\\u00e9\\/\\ud800 é 😀 \\n \\u003C"}`
    expect(Json.compact(raw)).toBe(raw)
  })

  it("keeps whitespace inside strings", () => {
    expect(Json.compact(`[ "a b" ,\n"\\t c" ]`)).toBe(`["a b","\\t c"]`)
  })

  it("returns compact input unchanged", () => {
    const raw = `{"a":[1,2,{"b":null}],"c":"d"}`
    expect(Json.compact(raw)).toBe(raw)
    expect(Json.compact(" 42 ")).toBe("42")
    expect(Json.compact(`"<"`)).toBe(`"\\u003c"`)
  })

  it("rejects invalid JSON and trailing data", () => {
    for (const bad of ["", "{", "[1 2]", "{\"a\":1} {}", "01", "\"\\q\"", "\"\u0001\"", "null x"]) {
      expect(Json.compact(bad), bad).toBeUndefined()
    }
  })

  it("is idempotent and preserves meaning (property)", () => {
    fc.assert(
      fc.property(fc.jsonValue(), (value) => {
        const text = JSON.stringify(value, null, 2)
        const once = Json.compact(text)
        expect(once).toBeDefined()
        expect(Json.compact(once!)).toBe(once)
        expect(JSON.parse(once!)).toEqual(JSON.parse(text))
      })
    )
  })
})

describe("parseObjectMembers", () => {
  it("returns decoded names and exact value text", () => {
    const members = Json.parseObjectMembers(` {"kind" : "tool_call", "args": { "q" : [1, 2.0] }, "n": null}\n`)
    expect(members).toBeDefined()
    expect([...members!.entries()].sort()).toEqual([
      ["args", `{ "q" : [1, 2.0] }`],
      ["kind", `"tool_call"`],
      ["n", "null"]
    ])
  })

  it("lets the last duplicate win", () => {
    expect(Json.parseObjectMembers(`{"a":1,"a":"two"}`)?.get("a")).toBe(`"two"`)
  })

  it("decodes escaped names", () => {
    const members = Json.parseObjectMembers(`{"\\u006bind":1,"\\ud800":2}`)
    expect(members?.get("kind")).toBe("1")
    expect(members?.get("\ufffd")).toBe("2")
  })

  it("accepts the empty object", () => {
    expect(Json.parseObjectMembers("{}")?.size).toBe(0)
    expect(Json.parseObjectMembers(" { } ")?.size).toBe(0)
  })

  it("rejects non-objects, invalid JSON and trailing data", () => {
    for (
      const bad of [
        "",
        " ",
        "null",
        "[]",
        "\"x\"",
        "1",
        "{",
        "{\"a\":}",
        "{\"a\":1,}",
        "{\"a\":[1,]}",
        "{\"a\":1}x",
        "{\"a\":1}{}",
        "{\"a\":1} null",
        "{\"a\":01}"
      ]
    ) {
      expect(Json.parseObjectMembers(bad), bad).toBeUndefined()
    }
  })
})

describe("parseString", () => {
  it("decodes one JSON string", () => {
    expect(Json.parseString(`"caf\\u00e9"`)).toBe("café")
    expect(Json.parseString(` "\\ud800" `)).toBe("\ufffd")
    expect(Json.parseString(`"a"x`)).toBeUndefined()
    expect(Json.parseString(`1`)).toBeUndefined()
  })
})

describe("quoteString", () => {
  it("escapes with Go's HTML-escaping table", () => {
    expect(Json.quoteString("plain é 😀 /")).toBe(`"plain é 😀 /"`)
    expect(Json.quoteString("a<b>&\"\\\u0001\u001f\b\f\n\r\t\u007f\u2028\u2029")).toBe(
      `"a\\u003cb\\u003e\\u0026\\"\\\\\\u0001\\u001f\\b\\f\\n\\r\\t\u007f\\u2028\\u2029"`
    )
  })

  it("replaces lone surrogates", () => {
    expect(Json.quoteString("a\ud800b\udc00\u{1F600}")).toBe(`"a\ufffdb\ufffd\u{1F600}"`)
  })

  it("round-trips through JSON.parse for well-formed strings (property)", () => {
    fc.assert(
      fc.property(fc.string({ unit: "grapheme" }), (s) => {
        expect(JSON.parse(Json.quoteString(s))).toBe(s)
      })
    )
  })
})

describe("stringifyStrict", () => {
  it("serialises JSON values with JSON.stringify", () => {
    const value = { a: [1, "x", null, true, { b: -2.5 }], c: {} }
    expect(Json.stringifyStrict(value)).toEqual({ _tag: "Ok", json: JSON.stringify(value) })
    expect(Json.stringifyStrict(Object.assign(Object.create(null), { a: 1 }))).toEqual({ _tag: "Ok", json: `{"a":1}` })
    const shared = { x: 1 }
    expect(Json.stringifyStrict([shared, shared])).toEqual({ _tag: "Ok", json: `[{"x":1},{"x":1}]` })
  })

  const invalid = (value: unknown) => {
    const result = Json.stringifyStrict(value)
    if (result._tag !== "Invalid") throw new Error(`expected Invalid, got ${result.json}`)
    return result
  }

  it("rejects non-finite numbers with their path", () => {
    expect(invalid({ a: [1, NaN] })).toMatchObject({ path: "$.a[1]", reason: expect.stringContaining("NaN") })
    expect(invalid(Infinity)).toMatchObject({ path: "$", reason: expect.stringContaining("Infinity") })
    expect(invalid({ x: { y: -Infinity } })).toMatchObject({ path: "$.x.y" })
  })

  it("rejects undefined, functions, symbols and bigints", () => {
    expect(invalid(undefined)).toMatchObject({ path: "$", reason: expect.stringContaining("undefined") })
    expect(invalid({ a: undefined })).toMatchObject({ path: "$.a" })
    expect(invalid([1, undefined])).toMatchObject({ path: "$[1]" })
    // eslint-disable-next-line no-sparse-arrays
    expect(invalid([1, , 3])).toMatchObject({ path: "$[1]" })
    expect(invalid({ a: [{ b: () => 1 }] })).toMatchObject({ path: "$.a[0].b", reason: expect.stringContaining("function") })
    expect(invalid({ s: Symbol("x") })).toMatchObject({ path: "$.s", reason: expect.stringContaining("symbol") })
    expect(invalid({ "my key": [0, 1n] })).toMatchObject({ path: `$["my key"][1]`, reason: expect.stringContaining("bigint") })
  })

  it("rejects cycles", () => {
    const a: Record<string, unknown> = { list: [] }
    ;(a["list"] as Array<unknown>).push(a)
    expect(invalid(a)).toMatchObject({ path: "$.list[0]", reason: "circular reference" })
  })

  it("rejects non-plain objects", () => {
    class Point {
      constructor(readonly x: number) {}
    }
    expect(invalid({ when: new Date(0) })).toMatchObject({ path: "$.when", reason: expect.stringContaining("Date") })
    expect(invalid([new Map()])).toMatchObject({ path: "$[0]", reason: expect.stringContaining("Map") })
    expect(invalid(new Set())).toMatchObject({ path: "$", reason: expect.stringContaining("Set") })
    expect(invalid({ p: new Point(1) })).toMatchObject({ path: "$.p", reason: expect.stringContaining("Point") })
    expect(invalid({ s: new String("x") })).toMatchObject({ path: "$.s" })
    expect(invalid(new Uint8Array(2))).toMatchObject({ path: "$" })
    expect(invalid({ toJSON: () => "x" })).toMatchObject({ path: "$.toJSON" })
  })
})

// ---------------------------------------------------------------------------
// Deep nesting: Go's decoder takes up to 10,000 nested arrays and objects.
// ---------------------------------------------------------------------------

/** Runs `f` from `frames` recursive calls deep, as a route handler far down a stack would. */
const fromDeepStack = <A>(frames: number, f: () => A): A => frames === 0 ? f() : fromDeepStack(frames - 1, f)

/** `depth` nested containers around `"<"`, written with whitespace, with their compact and canonical forms. */
const nested = (depth: number, shape: "array" | "object" | "mixed") => {
  let text = `"<"`
  let compacted = `"\\u003c"`
  let canonical = compacted
  for (let i = 0; i < depth; i++) {
    if (shape === "array" || (shape === "mixed" && i % 2 === 0)) {
      text = `[ 1 ,\n${text} ]`
      compacted = `[1,${compacted}]`
      canonical = `[1,${canonical}]`
    } else {
      // Out of order, and a duplicate the last member overrides.
      text = `{ "z" : 0 , "a" : null, "a" : ${text} }`
      compacted = `{"z":0,"a":null,"a":${compacted}}`
      canonical = `{"a":${canonical},"z":0}`
    }
  }
  return { text, compacted, canonical }
}

describe("deep nesting", () => {
  const shapes = ["array", "object", "mixed"] as const

  it.each(shapes)("accepts %s nesting up to 10,000 levels, from any stack depth", (shape) => {
    const { canonical, compacted, text } = nested(10_000, shape)
    for (const frames of [0, 5_000]) {
      expect(fromDeepStack(frames, () => Json.canonicalize(text))).toBe(canonical)
      expect(fromDeepStack(frames, () => Json.compact(text))).toBe(compacted)
      expect(fromDeepStack(frames, () => Json.canonicalize(canonical))).toBe(canonical)
      expect(fromDeepStack(frames, () => Json.compact(compacted))).toBe(compacted)
    }
  })

  it.each(shapes)("refuses %s nesting of 10,001 and 100,000 levels without throwing, from any stack depth", (shape) => {
    for (const depth of [10_001, 100_000]) {
      const { compacted, text } = nested(depth, shape)
      for (const frames of [0, 5_000]) {
        for (const t of [text, compacted]) {
          expect(fromDeepStack(frames, () => Json.canonicalize(t))).toBeUndefined()
          expect(fromDeepStack(frames, () => Json.compact(t))).toBeUndefined()
        }
      }
    }
  })

  it("counts the top-level object of a body as a level", () => {
    for (const frames of [0, 5_000]) {
      const ok = nested(9_999, "mixed")
      const members = fromDeepStack(frames, () => Json.parseObjectMembers(`{"agent_id":"a","input":${ok.text}}`))
      expect(members?.get("input")).toBe(ok.text)
      const tooDeep = nested(10_000, "mixed")
      expect(fromDeepStack(frames, () => Json.parseObjectMembers(`{"input":${tooDeep.text}}`))).toBeUndefined()
      const huge = "[".repeat(100_000) + "]".repeat(100_000)
      expect(fromDeepStack(frames, () => Json.parseObjectMembers(`{"input":${huge}}`))).toBeUndefined()
    }
  })

  it("the example body of 9,998 nested arrays is a valid request body", () => {
    const body = `{"agent_id":"a","input":` + "[".repeat(9_998) + "]".repeat(9_998) + `}`
    expect(Json.parseObjectMembers(body)?.get("input")).toBe("[".repeat(9_998) + "]".repeat(9_998))
    expect(Json.compact(body)).toBe(body)
    expect(Json.canonicalize(body)).toBe(body)
  })

  it("stringifyStrict serialises values up to 10,000 levels and refuses deeper ones, from any stack depth", () => {
    const value = (depth: number, shape: "array" | "object" | "mixed"): unknown => {
      let v: unknown = "<"
      for (let i = 0; i < depth; i++) {
        v = shape === "array" || (shape === "mixed" && i % 2 === 0) ? [1, v] : { z: 0, a: v }
      }
      return v
    }
    const expected = (depth: number, shape: "array" | "object" | "mixed"): string => {
      let text = `"<"`
      for (let i = 0; i < depth; i++) {
        text = shape === "array" || (shape === "mixed" && i % 2 === 0) ? `[1,${text}]` : `{"z":0,"a":${text}}`
      }
      return text
    }
    for (const shape of shapes) {
      for (const frames of [0, 5_000]) {
        expect(fromDeepStack(frames, () => Json.stringifyStrict(value(10_000, shape)))).toEqual({
          _tag: "Ok",
          json: expected(10_000, shape)
        })
        for (const depth of [10_001, 100_000]) {
          const result = fromDeepStack(frames, () => Json.stringifyStrict(value(depth, shape)))
          expect(result).toMatchObject({ _tag: "Invalid", reason: expect.stringContaining("exceeded max depth") })
          if (result._tag === "Invalid") expect(result.path.length).toBeGreaterThan(10_000)
        }
      }
    }
  })

  it("stringifyStrict reports the path of an invalid value deeper than the quick check", () => {
    let value: unknown = { bad: [1, undefined] }
    for (let i = 0; i < 100; i++) value = [value]
    expect(Json.stringifyStrict(value)).toEqual({
      _tag: "Invalid",
      reason: "undefined is not a JSON value",
      path: "$" + "[0]".repeat(100) + ".bad[1]"
    })
    const cycle: Array<unknown> = []
    let inner: Array<unknown> = cycle
    for (let i = 0; i < 100; i++) inner = (inner[0] = [])
    inner.push(cycle)
    expect(Json.stringifyStrict(cycle)).toMatchObject({ reason: "circular reference", path: "$" + "[0]".repeat(101) })
  })
})

// ---------------------------------------------------------------------------
// Random JSON written with whitespace and duplicate keys, against a model
// ---------------------------------------------------------------------------

/** Orders keys by code point (UTF-8 byte order), as 8.3 does. */
const byCodePoint = (a: string, b: string): number => Buffer.compare(Buffer.from(a), Buffer.from(b))

/** The canonical text of a JSON value (8.3), from its meaning; numbers as `JSON.stringify` wrote them. */
const canonicalModel = (value: unknown): string => {
  if (typeof value === "string") return Json.quoteString(value)
  if (Array.isArray(value)) return "[" + value.map(canonicalModel).join(",") + "]"
  if (typeof value === "object" && value !== null) {
    const record = value as Record<string, unknown>
    return "{" +
      Object.keys(record).sort(byCodePoint).map((k) => Json.quoteString(k) + ":" + canonicalModel(record[k])).join(",") +
      "}"
  }
  return JSON.stringify(value)
}

/** A string token as written and as compacted (2.8: raw `<>&` U+2028 U+2029 escaped, nothing else changed). */
const stringToken = (s: string) => {
  const written = JSON.stringify(s)
  return { written, compacted: written.replace(/[<>&\u2028\u2029]/g, (c) => Json.quoteString(c).slice(1, -1)) }
}

/**
 * `value` written with the whitespace `ws` chooses between tokens and, where
 * `dup` says so, an earlier duplicate of an object member (which the later one
 * overrides), with the text compaction must give.
 */
const writeJson = (value: unknown, ws: () => string, dup: () => boolean): { text: string; compacted: string } => {
  if (typeof value === "string") {
    const { compacted, written } = stringToken(value)
    return { text: written, compacted }
  }
  if (Array.isArray(value)) {
    const items = value.map((item) => writeJson(item, ws, dup))
    return {
      text: "[" + ws() + items.map((i) => i.text).join(ws() + "," + ws()) + ws() + "]",
      compacted: "[" + items.map((i) => i.compacted).join(",") + "]"
    }
  }
  if (typeof value === "object" && value !== null) {
    const members: Array<{ text: string; compacted: string }> = []
    for (const [key, member] of Object.entries(value)) {
      const k = stringToken(key)
      if (dup()) members.push({ text: k.written + ws() + ":" + ws() + "[ 0 ]", compacted: k.compacted + ":[0]" })
      const v = writeJson(member, ws, dup)
      members.push({ text: k.written + ws() + ":" + ws() + v.text, compacted: k.compacted + ":" + v.compacted })
    }
    return {
      text: "{" + ws() + members.map((m) => m.text).join(ws() + "," + ws()) + ws() + "}",
      compacted: "{" + members.map((m) => m.compacted).join(",") + "}"
    }
  }
  const text = JSON.stringify(value)
  return { text, compacted: text }
}

describe("canonicalize and compact against a model (property)", () => {
  const whitespace = fc.array(fc.constantFrom("", "", "", " ", "\n", "\t", "\r\n  "), { minLength: 64, maxLength: 64 })
  const flags = fc.array(fc.boolean(), { minLength: 16, maxLength: 16 })
  const cycle = <A>(xs: ReadonlyArray<A>) => {
    let i = 0
    return () => xs[i++ % xs.length]!
  }
  const value = fc.oneof(
    fc.jsonValue(),
    fc.json().map((text) => JSON.parse(text) as unknown),
    fc.jsonValue({ depthSize: "large", maxDepth: 30 }),
    fc.string({ unit: "binary" }).map((s) => ({ [s.slice(0, 3)]: s, "<&>": [s] }))
  )
  // Wrapped in up to 200 containers, past the depth where recursion would show.
  const wrapped = fc.tuple(value, fc.array(fc.constantFrom("array", "object"), { maxLength: 200 })).map(
    ([inner, wrappers]) =>
      wrappers.reduce<unknown>((v, w, i) => (w === "array" ? [v, i] : { [`k${i % 7}`]: v, b: i }), inner)
  )

  it("gives the canonical and compact forms of random JSON written with whitespace and duplicate keys", () => {
    fc.assert(
      fc.property(wrapped, whitespace, flags, (v, ws, dups) => {
        const { compacted, text } = writeJson(v, cycle(ws), cycle(dups))
        const canonical = canonicalModel(v)
        expect(Json.canonicalize(text)).toBe(canonical)
        expect(Json.canonicalize(compacted)).toBe(canonical)
        expect(Json.compact(text)).toBe(compacted)
        expect(Json.compact(compacted)).toBe(compacted)
        if (typeof v === "object" && v !== null && !Array.isArray(v)) {
          expect(Json.parseObjectMembers(text)).toBeDefined()
        }
      }),
      { numRuns: 300 }
    )
  })

  it("stringifyStrict writes what JSON.stringify writes, at any depth (property)", () => {
    fc.assert(
      fc.property(wrapped, (v) => {
        expect(Json.stringifyStrict(v)).toEqual({ _tag: "Ok", json: JSON.stringify(v) })
      }),
      { numRuns: 300 }
    )
  })
})
