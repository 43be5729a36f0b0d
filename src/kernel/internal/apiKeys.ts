/**
 * Scoped API keys of the kernel core (PROTOCOL-CURRENT C.9): the token format
 * `rbk_<key id>.<43 characters of unpadded base64url>`, the SHA-256 that is the
 * only thing stored of it, creation with the validation of C.9.2, listing
 * (revoked keys included), rotation, revocation, and the bearer lookup of
 * C.9.1 step 4.
 *
 * @since 0.2.0
 * @internal
 */
import { hash } from "node:crypto"
import { parseUuid, uuidv7 } from "../../internal/wire/uuid.js"
import { trimSpace } from "./goFormat.js"
import { goQuote } from "./goQuote.js"
import type { ApiKeyRecord, IssuedApiKey, KernelFailure, Scope } from "./model.js"
import { conflict, notFound, scopes as knownScopes, validation } from "./model.js"

const TOKEN_PREFIX = "rbk_"
const SECRET_BYTES = 32
const SECRET_CHARS = 43
const BASE64URL = /^[A-Za-z0-9_-]{43}$/
const utf8 = new TextEncoder()

/**
 * The lowercase hex SHA-256 of a whole token: what the kernel stores
 * (PROTOCOL-CURRENT C.9.1 step 4; the `api_key` vector of C.14).
 *
 * @since 0.2.0
 * @internal
 */
export const hashToken = (token: string): string => hash("sha256", token, "hex")

/**
 * The token of key `id` with the given 32 secret bytes:
 * `rbk_<id>.<unpadded base64url of the bytes>` (43 characters).
 *
 * @since 0.2.0
 * @internal
 */
export const formatToken = (id: string, secret: Uint8Array): string =>
  TOKEN_PREFIX + id + "." + Buffer.from(secret.buffer, secret.byteOffset, secret.byteLength).toString("base64url")

/**
 * The key id of a well-formed token (C.9.1 step 4: `rbk_`, a UUID, `.`, 43
 * base64url characters), canonical lowercase; `undefined` otherwise.
 *
 * @since 0.2.0
 * @internal
 */
export const parseToken = (token: string): string | undefined => {
  if (!token.startsWith(TOKEN_PREFIX)) return undefined
  const dot = token.lastIndexOf(".")
  if (dot < 0 || token.length - dot - 1 !== SECRET_CHARS) return undefined
  if (!BASE64URL.test(token.slice(dot + 1))) return undefined
  return parseUuid(token.slice(TOKEN_PREFIX.length, dot))
}

const NAME_AND_SCOPES = "validation error: name and scopes are required"

const isScope = (s: string): s is Scope => (knownScopes as ReadonlyArray<string>).includes(s)

/**
 * Validates a create body (C.9.2): `name` trimmed to 1–200 bytes and a
 * non-empty `scopes` list, then every scope known. Scopes come back sorted and
 * de-duplicated.
 *
 * @since 0.2.0
 * @internal
 */
export const validateKey = (
  name: string,
  scopes: ReadonlyArray<string>
): { readonly name: string; readonly scopes: ReadonlyArray<Scope> } | KernelFailure => {
  const trimmed = trimSpace(name)
  const bytes = utf8.encode(trimmed).length
  if (bytes < 1 || bytes > 200 || scopes.length === 0) return validation(NAME_AND_SCOPES)
  for (const s of scopes) {
    if (!isScope(s)) return validation("validation error: unknown scope " + goQuote(s))
  }
  const sorted = Array.from(new Set(scopes as ReadonlyArray<Scope>)).sort()
  return { name: trimmed, scopes: sorted }
}

const defaultRandomBytes = (n: number): Uint8Array => globalThis.crypto.getRandomValues(new Uint8Array(n))

/**
 * @since 0.2.0
 * @internal
 */
export class ApiKeyTable {
  private readonly byId = new Map<string, ApiKeyRecord>()

  constructor(private readonly randomBytes: (n: number) => Uint8Array = defaultRandomBytes) {}

  /** C.9.2 create: validated, stored with the token's hash; the token is returned once. */
  create(name: string, scopes: ReadonlyArray<string>, now: number): IssuedApiKey | KernelFailure {
    const valid = validateKey(name, scopes)
    if (!("scopes" in valid)) return valid
    let id: string
    do id = uuidv7(now)
    while (this.byId.has(id))
    const token = formatToken(id, this.randomBytes(SECRET_BYTES))
    const key: ApiKeyRecord = {
      id,
      name: valid.name,
      scopes: valid.scopes,
      createdAtMs: now,
      revokedAtMs: undefined,
      tokenHash: hashToken(token)
    }
    this.byId.set(id, key)
    return { key, token }
  }

  /** Every key, revoked ones included, oldest first. */
  list(): ReadonlyArray<ApiKeyRecord> {
    return Array.from(this.byId.values()).sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
  }

  get(id: string): ApiKeyRecord | undefined {
    return this.byId.get(id)
  }

  /** C.9.2 rotate: a new token for the same key; `404` unknown, `409 conflict` revoked. */
  rotate(id: string): IssuedApiKey | KernelFailure {
    const existing = this.byId.get(id)
    if (existing === undefined) return notFound()
    if (existing.revokedAtMs !== undefined) return conflict()
    const token = formatToken(id, this.randomBytes(SECRET_BYTES))
    const key: ApiKeyRecord = { ...existing, tokenHash: hashToken(token) }
    this.byId.set(id, key)
    return { key, token }
  }

  /** C.9.2 delete: revokes the key (kept in the list); repeatable, unknown ids included. */
  revoke(id: string, now: number): void {
    const existing = this.byId.get(id)
    if (existing === undefined || existing.revokedAtMs !== undefined) return
    this.byId.set(id, { ...existing, revokedAtMs: now })
  }

  /**
   * C.9.1 step 4: the live key a bearer token names, when the token is well
   * formed, the key exists, is not revoked and the token's SHA-256 matches.
   */
  authenticate(token: string): ApiKeyRecord | undefined {
    const id = parseToken(token)
    if (id === undefined) return undefined
    const key = this.byId.get(id)
    if (key === undefined || key.revokedAtMs !== undefined) return undefined
    return timingSafeHexEqual(key.tokenHash, hashToken(token)) ? key : undefined
  }
}

const timingSafeHexEqual = (a: string, b: string): boolean => {
  if (a.length !== b.length) return false
  let diff = 0
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i)
  return diff === 0
}
