import { describe, expect, it } from "@effect/vitest"
import { formatTimestamp } from "../../../src/internal/wire/time.js"
import { parseUuid, uuidv7 } from "../../../src/internal/wire/uuid.js"

const CANONICAL = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/

const timestampOf = (id: string): number => parseInt(id.slice(0, 8) + id.slice(9, 13), 16)

describe("uuidv7", () => {
  it("is a canonical lowercase version-7 UUID carrying the timestamp", () => {
    const ms = Date.UTC(2030, 0, 1)
    const id = uuidv7(ms)
    expect(id).toMatch(CANONICAL)
    expect(timestampOf(id)).toBe(ms)
  })

  it("uses the given random bytes for the random bits", () => {
    const ms = Date.UTC(2031, 0, 1)
    const id = uuidv7(ms, (n) => new Uint8Array(n).fill(0xff))
    expect(id.slice(14)).toBe("77ff-bfff-ffffffffffff")
    const zero = uuidv7(ms + 1, (n) => new Uint8Array(n))
    expect(zero.slice(14)).toBe("7000-8000-000000000000")
  })

  it("is strictly increasing within one millisecond, across rand_a overflow", () => {
    const ms = Date.UTC(2032, 0, 1)
    const ids = Array.from({ length: 10_000 }, () => uuidv7(ms))
    expect(ids.every((id, i) => i === 0 || id > ids[i - 1]!)).toBe(true)
    expect(new Set(ids).size).toBe(ids.length)
    expect(timestampOf(ids[0]!)).toBe(ms)
    // Overflowing the 12-bit sequence borrows the next millisecond.
    expect(timestampOf(ids[ids.length - 1]!)).toBeGreaterThan(ms)
    expect(ids.every((id) => CANONICAL.test(id))).toBe(true)
  })

  it("stays increasing when the clock goes backwards", () => {
    const ms = Date.UTC(2033, 0, 1)
    const a = uuidv7(ms)
    const b = uuidv7(ms - 60_000)
    const c = uuidv7(0)
    expect(b > a).toBe(true)
    expect(c > b).toBe(true)
    const d = uuidv7(ms + 1_000)
    expect(d > c).toBe(true)
    expect(timestampOf(d)).toBe(ms + 1_000)
  })

  it("sorts by time across milliseconds", () => {
    const ms = Date.UTC(2034, 0, 1)
    const ids = Array.from({ length: 100 }, (_, i) => uuidv7(ms + i))
    expect([...ids].sort()).toEqual(ids)
  })
})

describe("parseUuid", () => {
  const canonical = "0192f1a0-0000-7000-8000-0000000000d1"

  it("accepts the four reference forms and returns canonical lowercase", () => {
    for (
      const form of [
        canonical,
        canonical.toUpperCase(),
        "0192F1a0-0000-7000-8000-0000000000D1",
        `{${canonical}}`,
        `{${canonical.toUpperCase()}}`,
        `urn:uuid:${canonical}`,
        `URN:UUID:${canonical.toUpperCase()}`,
        canonical.replaceAll("-", ""),
        canonical.replaceAll("-", "").toUpperCase()
      ]
    ) {
      expect(parseUuid(form), form).toBe(canonical)
    }
  })

  it("accepts the nil UUID and any version", () => {
    expect(parseUuid("00000000-0000-0000-0000-000000000000")).toBe("00000000-0000-0000-0000-000000000000")
    expect(parseUuid("6BA7B810-9DAD-11D1-80B4-00C04FD430C8")).toBe("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
  })

  it("round-trips generated ids", () => {
    const id = uuidv7(Date.UTC(2035, 0, 1))
    expect(parseUuid(id)).toBe(id)
  })

  it("rejects everything else", () => {
    for (
      const bad of [
        "",
        "alpha",
        canonical.slice(1),
        canonical + "0",
        canonical.replace("-", "_"),
        "0192f1a0-00007000-8000-0000000000d1-",
        canonical.replace("d", "g"),
        `[${canonical}]`,
        `{${canonical}`,
        `urn:uid:${canonical}x`,
        ` ${canonical}`,
        canonical.replaceAll("-", "").replace("d", "z"),
        `urn:uuid:${canonical.replaceAll("-", "")}`
      ]
    ) {
      expect(parseUuid(bad), bad).toBeUndefined()
    }
  })
})

describe("formatTimestamp", () => {
  const base = Date.UTC(2026, 7, 18, 19, 40, 54)

  it("trims trailing zeros of the fraction and omits a zero fraction (2.6)", () => {
    expect(formatTimestamp(base)).toBe("2026-08-18T19:40:54Z")
    expect(formatTimestamp(base + 100)).toBe("2026-08-18T19:40:54.1Z")
    expect(formatTimestamp(base + 120)).toBe("2026-08-18T19:40:54.12Z")
    expect(formatTimestamp(base + 123)).toBe("2026-08-18T19:40:54.123Z")
    expect(formatTimestamp(base + 5)).toBe("2026-08-18T19:40:54.005Z")
    expect(formatTimestamp(base + 120.9)).toBe("2026-08-18T19:40:54.12Z")
  })

  it("formats the epoch and rejects nothing", () => {
    expect(formatTimestamp(0)).toBe("1970-01-01T00:00:00Z")
    expect(formatTimestamp(NaN)).toBe("1970-01-01T00:00:00Z")
    expect(formatTimestamp(1e20)).toBe("1970-01-01T00:00:00Z")
  })

  it("is RFC 3339 that Date parses back", () => {
    for (const ms of [0, 1, 999, 1_700_000_000_000, 1_700_000_000_010, 4_102_444_800_000]) {
      expect(Date.parse(formatTimestamp(ms))).toBe(ms)
    }
  })
})
