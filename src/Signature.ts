/**
 * HMAC-SHA256 signatures of the Rebuno protocol (PROTOCOL 3 and 17.B): the
 * `sha256=` body signature used by agent → kernel requests and kernel → agent
 * webhooks, and the optional `v1=` request signature that also binds method,
 * target, time and lease. Built on Web Crypto, so it runs on any modern runtime;
 * imported keys are cached per secret, and every comparison is constant time over
 * the whole header value.
 *
 * @since 0.1.0
 */
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"

/**
 * An HMAC secret, plain or redacted; it is used as its UTF-8 bytes.
 *
 * @since 0.1.0
 * @category models
 */
export type Secret = Redacted.Redacted<string> | string

/**
 * What a `v1=` request signature covers (PROTOCOL 17.B). `dispatchId` and
 * `dispatchAttempt` are the header values as sent, `""` when not sent.
 *
 * @since 0.1.0
 * @category models
 */
export interface V1Request {
  /** Method as sent, e.g. `GET`, `POST`. */
  readonly method: string
  /** Path plus `?` and raw query exactly as on the request line (`url.pathname + url.search`). */
  readonly target: string
  /** `Rebuno-Timestamp` value: decimal Unix seconds. */
  readonly timestamp: string
  /** `Rebuno-Dispatch-Id` value, or `""`. */
  readonly dispatchId: string
  /** `Rebuno-Dispatch-Attempt` value, or `""`. */
  readonly dispatchAttempt: string
  /** Raw body bytes (a string is signed as its UTF-8 bytes); empty for GET and heartbeat. */
  readonly body: Uint8Array | string
}

/**
 * Half-width of the `v1` freshness window, in seconds (inclusive).
 *
 * @since 0.1.0
 * @category constants
 */
export const v1WindowSeconds = 300

const encoder = new TextEncoder()

const HEX_BYTE: ReadonlyArray<string> = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, "0"))

const toHex = (buffer: ArrayBuffer): string => {
  const bytes = new Uint8Array(buffer)
  let out = ""
  for (let i = 0; i < bytes.length; i++) out += HEX_BYTE[bytes[i]!]!
  return out
}

const secretText = (secret: Secret): string => (typeof secret === "string" ? secret : Redacted.value(secret))

const toBytes = (body: Uint8Array | string): Uint8Array<ArrayBuffer> =>
  typeof body === "string"
    ? encoder.encode(body)
    : body.buffer instanceof ArrayBuffer
    ? (body as Uint8Array<ArrayBuffer>)
    : new Uint8Array(body)

const MAX_CACHED_KEYS = 1024
const keyCache = new Map<string, Promise<CryptoKey>>()

const hmacKey = (secret: string): Promise<CryptoKey> => {
  let key = keyCache.get(secret)
  if (key === undefined) {
    if (keyCache.size >= MAX_CACHED_KEYS) keyCache.clear()
    // Web Crypto refuses zero-length HMAC keys, but HMAC pads every key shorter
    // than the block with zeros, so the empty secret is the one-zero-byte key
    // (what Go's hmac.New([]byte("")) computes).
    const raw = secret === "" ? new Uint8Array(1) : encoder.encode(secret)
    key = globalThis.crypto.subtle.importKey(
      "raw",
      raw,
      { name: "HMAC", hash: "SHA-256" },
      false,
      ["sign"]
    )
    keyCache.set(secret, key)
    key.catch(() => keyCache.delete(secret))
  }
  return key
}

interface NodeHmac {
  update(data: Uint8Array | string): NodeHmac
  digest(encoding: "hex"): string
}

/**
 * node:crypto's `createHmac` where the runtime offers it through
 * `process.getBuiltinModule` (Node ≥ 20.16, Deno, Bun), found without a static
 * import so that the module still loads anywhere. A synchronous HMAC costs a
 * fraction of a Web Crypto `subtle.sign` job (a promise and a thread-pool round
 * trip per call), which matters on every request an agent sends.
 */
const nodeCrypto: {
  readonly createHmac: (algorithm: "sha256", key: unknown) => NodeHmac
  readonly createSecretKey: ((key: Uint8Array) => unknown) | undefined
} | undefined = (() => {
  try {
    const proc = (globalThis as { readonly process?: { readonly getBuiltinModule?: (id: string) => unknown } }).process
    const crypto = typeof proc?.getBuiltinModule === "function"
      ? proc.getBuiltinModule("node:crypto") as { readonly createHmac?: unknown; readonly createSecretKey?: unknown } | undefined
      : undefined
    if (typeof crypto?.createHmac !== "function") return undefined
    return {
      createHmac: crypto.createHmac as (algorithm: "sha256", key: unknown) => NodeHmac,
      createSecretKey: typeof crypto.createSecretKey === "function"
        ? crypto.createSecretKey as (key: Uint8Array) => unknown
        : undefined
    }
  } catch {
    return undefined
  }
})()

/** node:crypto `KeyObject`s per secret, so that each HMAC does not prepare the key again. */
const nodeKeyCache = new Map<string, unknown>()

const nodeKey = (secret: string): unknown => {
  let key = nodeKeyCache.get(secret)
  if (key === undefined) {
    key = secret
    if (secret !== "" && nodeCrypto?.createSecretKey !== undefined) {
      try {
        key = nodeCrypto.createSecretKey(encoder.encode(secret))
      } catch {
        key = secret
      }
    }
    if (nodeKeyCache.size >= MAX_CACHED_KEYS) nodeKeyCache.clear()
    nodeKeyCache.set(secret, key)
  }
  return key
}

/** Web Crypto HMAC-SHA256 (the portable path; also used where node:crypto is absent). */
const webCryptoHmacHex = (secret: Secret, message: Uint8Array<ArrayBuffer>): Effect.Effect<string> =>
  Effect.promise(async () => {
    const key = await hmacKey(secretText(secret))
    return toHex(await globalThis.crypto.subtle.sign("HMAC", key, message))
  })

// HMAC pads every key shorter than the block with zeros, so node:crypto's empty
// key computes the same value as Go's hmac.New([]byte("")) and the one-zero-byte
// Web Crypto key above.
const hmacHex = (secret: Secret, message: Uint8Array<ArrayBuffer>): Effect.Effect<string> =>
  nodeCrypto === undefined || useWebCrypto
    ? webCryptoHmacHex(secret, message)
    : Effect.sync(() => nodeCrypto.createHmac("sha256", nodeKey(secretText(secret))).update(message).digest("hex"))

/**
 * The HMAC of `head` (as UTF-8) followed by `body`. node:crypto hashes the two
 * parts in turn, so the message is never assembled (nor the head encoded
 * separately) on the path every request takes.
 */
const hmacHexOf = (secret: Secret, head: string, body: Uint8Array | string): Effect.Effect<string> =>
  nodeCrypto === undefined || useWebCrypto
    ? webCryptoHmacHex(secret, concatMessage(head, body))
    : Effect.sync(() => {
      const hmac = nodeCrypto.createHmac("sha256", nodeKey(secretText(secret))).update(head)
      return (body.length === 0 ? hmac : hmac.update(body)).digest("hex")
    })

let useWebCrypto = false

/**
 * The `sha256=` signature of a body computed on the spot, or `undefined` where
 * only Web Crypto is available (then use {@link sign}).
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const signSync = (secret: Secret, body: Uint8Array | string): string | undefined =>
  nodeCrypto === undefined || useWebCrypto
    ? undefined
    : "sha256=" + nodeCrypto.createHmac("sha256", nodeKey(secretText(secret))).update(body).digest("hex")

/**
 * The `v1=` signature of a request computed on the spot, or `undefined` where
 * only Web Crypto is available (then use {@link signV1}).
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const signV1Sync = (secret: Secret, req: V1Request): string | undefined => {
  if (nodeCrypto === undefined || useWebCrypto) return undefined
  const hmac = nodeCrypto.createHmac("sha256", nodeKey(secretText(secret))).update(v1Head(req))
  return "v1=" + (req.body.length === 0 ? hmac : hmac.update(req.body)).digest("hex")
}

/**
 * Forces the Web Crypto implementation even where node:crypto is available
 * (tests of the portable path; both compute the same values).
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const unsafeForceWebCrypto = (force: boolean): void => {
  useWebCrypto = force
}

/**
 * Compares two strings in time that depends only on their lengths, never on where
 * they differ. Strings of different lengths are compared over the longer length
 * and then reported unequal.
 *
 * @since 0.1.0
 * @category comparison
 */
export const timingSafeEqual = (a: string, b: string): boolean => {
  const n = a.length > b.length ? a.length : b.length
  let diff = a.length ^ b.length
  for (let i = 0; i < n; i++) {
    // Out-of-range charCodeAt is NaN, which `| 0` turns into 0.
    diff |= (a.charCodeAt(i) | 0) ^ (b.charCodeAt(i) | 0)
  }
  return diff === 0
}

/**
 * The `Rebuno-Signature` value of a body (PROTOCOL 3.2, 3.5):
 * `sha256=` + lowercase hex HMAC-SHA256(secret, body bytes).
 *
 * @example
 * ```ts
 * import { Console, Effect } from "effect"
 * import { Signature } from "effect-rebuno"
 *
 * const program = Effect.gen(function*() {
 *   const header = yield* Signature.sign("hello-secret", "")
 *   yield* Console.log(header) // sha256=1da6af7253b037edb9d9bd6b9618bd15b98c72a795629e4aa38ecfc138c71703
 *   yield* Console.log(yield* Signature.verify("hello-secret", "", header)) // true
 * })
 * ```
 *
 * @since 0.1.0
 * @category signing
 */
export const sign = (secret: Secret, body: Uint8Array | string): Effect.Effect<string> =>
  Effect.map(hmacHex(secret, toBytes(body)), (hex) => "sha256=" + hex)

/**
 * Checks a `sha256=` signature header against the body: the expected value is
 * compared with the whole header value in constant time, so uppercase hex, a
 * missing prefix or any other scheme fails.
 *
 * @since 0.1.0
 * @category verifying
 */
export const verify = (
  secret: Secret,
  body: Uint8Array | string,
  header: string | null | undefined
): Effect.Effect<boolean> =>
  typeof header !== "string" || header.length === 0
    ? Effect.succeed(false)
    : Effect.map(sign(secret, body), (expected) => timingSafeEqual(expected, header))

/**
 * {@link verify} computed on the spot: `undefined` where only Web Crypto is
 * available (then use {@link verify}).
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const verifySync = (
  secret: Secret,
  body: Uint8Array | string,
  header: string | null | undefined
): boolean | undefined => {
  if (typeof header !== "string" || header.length === 0) return false
  const expected = signSync(secret, body)
  return expected === undefined ? undefined : timingSafeEqual(expected, header)
}

const v1Head = (req: V1Request): string =>
  "rebuno-request-v1\n" +
  req.method + "\n" +
  req.target + "\n" +
  req.timestamp + "\n" +
  req.dispatchId + "\n" +
  req.dispatchAttempt + "\n"

const concatMessage = (head: string, body: Uint8Array | string): Uint8Array<ArrayBuffer> => {
  const headBytes = encoder.encode(head)
  const bodyBytes = typeof body === "string" ? encoder.encode(body) : body
  if (bodyBytes.length === 0) return headBytes
  const message = new Uint8Array(headBytes.length + bodyBytes.length)
  message.set(headBytes, 0)
  message.set(bodyBytes, headBytes.length)
  return message
}

/**
 * The `v1=` request signature (PROTOCOL 17.B): `v1=` + lowercase hex
 * HMAC-SHA256(secret, message), where the message is `rebuno-request-v1`, method,
 * target, timestamp, dispatch id and dispatch attempt, each followed by LF, then
 * the raw body.
 *
 * @since 0.1.0
 * @category signing
 */
export const signV1 = (secret: Secret, req: V1Request): Effect.Effect<string> =>
  Effect.map(hmacHexOf(secret, v1Head(req), req.body), (hex) => "v1=" + hex)

const hasLineBreak = (s: string): boolean => s.includes("\n") || s.includes("\r")

const DECIMAL = /^[+-]?[0-9]+$/

/**
 * Checks a `v1=` signature: the header values must not contain CR or LF, the
 * timestamp must be a base-10 integer within {@link v1WindowSeconds} of
 * `nowSeconds` (inclusive on both sides), and the recomputed signature must equal
 * the whole `signature` value (constant-time comparison).
 *
 * @since 0.1.0
 * @category verifying
 */
export const verifyV1 = (
  secret: Secret,
  req: V1Request,
  signature: string,
  nowSeconds: number
): Effect.Effect<boolean> =>
  v1Admissible(req, nowSeconds)
    ? Effect.map(signV1(secret, req), (expected) => timingSafeEqual(expected, signature))
    : Effect.succeed(false)

/**
 * {@link verifyV1} computed on the spot: `undefined` where only Web Crypto is
 * available (then use {@link verifyV1}).
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const verifyV1Sync = (
  secret: Secret,
  req: V1Request,
  signature: string,
  nowSeconds: number
): boolean | undefined => {
  if (!v1Admissible(req, nowSeconds)) return false
  const expected = signV1Sync(secret, req)
  return expected === undefined ? undefined : timingSafeEqual(expected, signature)
}

/** The checks of {@link verifyV1} before the HMAC: no line breaks, a decimal timestamp within the window. */
const v1Admissible = (req: V1Request, nowSeconds: number): boolean => {
  if (hasLineBreak(req.timestamp) || hasLineBreak(req.dispatchId) || hasLineBreak(req.dispatchAttempt)) return false
  if (!DECIMAL.test(req.timestamp)) return false
  const timestamp = Number(req.timestamp)
  return timestamp >= nowSeconds - v1WindowSeconds && timestamp <= nowSeconds + v1WindowSeconds
}
