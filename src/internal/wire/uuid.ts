/**
 * UUIDv7 generation and UUID parsing (PROTOCOL 2.5). Execution, dispatch and
 * approval ids are UUIDv7 in canonical lowercase form; ids made by one process are
 * strictly increasing, even when many are made at the same (virtual) millisecond,
 * so listing by id descending lists newest first. Incoming ids are accepted in the
 * four forms the reference kernel accepts and normalised to canonical lowercase.
 *
 * @since 0.1.0
 */

const HEX_BYTE: ReadonlyArray<string> = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, "0"))

const defaultRandomBytes = (n: number): Uint8Array => globalThis.crypto.getRandomValues(new Uint8Array(n))

/** Random bytes drawn 10 at a time from a pool refilled 2,560 bytes at once (one `getRandomValues` per 256 ids). */
const POOL_BYTES = 2_560
const pool = new Uint8Array(POOL_BYTES)
let poolOffset = POOL_BYTES

const pooledRandom10 = (): Uint8Array => {
  if (poolOffset + 10 > POOL_BYTES) {
    globalThis.crypto.getRandomValues(pool)
    poolOffset = 0
  }
  const start = poolOffset
  poolOffset += 10
  return pool.subarray(start, start + 10)
}

const MAX_TIMESTAMP = 2 ** 48 - 1

/** Last timestamp and 12-bit sequence (rand_a) handed out by this process. */
let lastMs = -1
let lastSeq = 0

/**
 * A new UUIDv7 (RFC 9562) in canonical lowercase form, with `nowMs` as its
 * 48-bit Unix-millisecond timestamp.
 *
 * Ids from one process are strictly increasing: at a new millisecond the 12-bit
 * `rand_a` field starts at a random value below 2048; when `nowMs` is not after the
 * last id's timestamp (same millisecond, or a clock that went back) the field is
 * the previous one plus one, and when it overflows the timestamp of the last id is
 * bumped by one millisecond. The remaining 62 bits are random.
 *
 * @since 0.1.0
 * @category uuid
 */
export const uuidv7 = (nowMs: number, randomBytes: (n: number) => Uint8Array = defaultRandomBytes): string => {
  // The default source is pooled; the bytes are read before anything else can draw from the pool.
  const rnd = randomBytes === defaultRandomBytes ? pooledRandom10() : randomBytes(10)
  let ms = Number.isFinite(nowMs) ? Math.min(Math.max(Math.floor(nowMs), 0), MAX_TIMESTAMP) : 0
  let seq: number
  if (ms > lastMs) {
    seq = ((rnd[0]! & 0x07) << 8) | rnd[1]!
  } else {
    ms = lastMs
    seq = lastSeq + 1
    if (seq > 0xfff) {
      ms = Math.min(lastMs + 1, MAX_TIMESTAMP)
      seq = 0
    }
  }
  lastMs = ms
  lastSeq = seq
  const high = Math.floor(ms / 0x1000000) // top 24 bits
  const low = ms % 0x1000000 // bottom 24 bits
  return (
    HEX_BYTE[(high >>> 16) & 0xff]! +
    HEX_BYTE[(high >>> 8) & 0xff]! +
    HEX_BYTE[high & 0xff]! +
    HEX_BYTE[(low >>> 16) & 0xff]! +
    "-" +
    HEX_BYTE[(low >>> 8) & 0xff]! +
    HEX_BYTE[low & 0xff]! +
    "-" +
    HEX_BYTE[0x70 | (seq >>> 8)]! +
    HEX_BYTE[seq & 0xff]! +
    "-" +
    HEX_BYTE[0x80 | (rnd[2]! & 0x3f)]! +
    HEX_BYTE[rnd[3]!]! +
    "-" +
    HEX_BYTE[rnd[4]!]! +
    HEX_BYTE[rnd[5]!]! +
    HEX_BYTE[rnd[6]!]! +
    HEX_BYTE[rnd[7]!]! +
    HEX_BYTE[rnd[8]!]! +
    HEX_BYTE[rnd[9]!]!
  )
}

const isHexDigit = (c: number): boolean =>
  (c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66) || (c >= 0x41 && c <= 0x46)

/** Canonical lowercase form of a 36-character `8-4-4-4-12` string, or undefined. */
const parseCanonical = (s: string): string | undefined => {
  if (s.length !== 36) return undefined
  for (let i = 0; i < 36; i++) {
    const c = s.charCodeAt(i)
    if (i === 8 || i === 13 || i === 18 || i === 23) {
      if (c !== 0x2d) return undefined
    } else if (!isHexDigit(c)) {
      return undefined
    }
  }
  return s.toLowerCase()
}

/**
 * Parses a UUID in any of the forms the reference kernel accepts — canonical
 * `8-4-4-4-12` hex in any letter case, `{…}`-braced, `urn:uuid:`-prefixed (prefix
 * in any case), or 32 bare hex digits — and returns the canonical lowercase form.
 * Version and variant are not checked (the nil UUID parses).
 *
 * For example, `parseUuid("{0192F1A0-0000-7000-8000-000000000000}")` is
 * `"0192f1a0-0000-7000-8000-000000000000"`.
 *
 * @since 0.1.0
 * @category uuid
 */
export const parseUuid = (s: string): string | undefined => {
  switch (s.length) {
    case 36:
      return parseCanonical(s)
    case 38:
      return s.charCodeAt(0) === 0x7b && s.charCodeAt(37) === 0x7d ? parseCanonical(s.slice(1, 37)) : undefined
    case 45:
      return s.slice(0, 9).toLowerCase() === "urn:uuid:" ? parseCanonical(s.slice(9)) : undefined
    case 32: {
      for (let i = 0; i < 32; i++) {
        if (!isHexDigit(s.charCodeAt(i))) return undefined
      }
      const h = s.toLowerCase()
      return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`
    }
    default:
      return undefined
  }
}
