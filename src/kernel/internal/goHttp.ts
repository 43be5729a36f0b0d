/**
 * The answers Go's `net/http` server (with the chi router of the reference
 * kernel) gives to requests it refuses before, or instead of, a route: the
 * checks of Go's `readRequest` and `conn.serve` in their order, the global
 * `OPTIONS *` handler, and chi's `405` for a method it does not know. The
 * embedded kernel's Node server runs them on every request its parser
 * accepted ({@link verdict}) and, on a request Node's parser refused, on the
 * bytes it received ({@link verdictOfHead}), so that both kernels answer the
 * same malformed request with the same status and body.
 *
 * @since 0.2.0
 * @internal
 */
import * as Path from "../../internal/wire/path.js"

/**
 * What Go answers a request with, when not a route:
 * - `Fatal`: an error `conn.serve` writes itself before closing the
 *   connection (`text/plain`, no length, the body up to the close);
 * - `Empty`: a handler's empty answer with `Content-Length: 0` (the
 *   connection stays open) — chi's `405` for an unknown method, the `200` of
 *   `OPTIONS *`;
 * - `Route`: none of those; the request reaches its route.
 *
 * @since 0.2.0
 * @internal
 */
export type Verdict = Refusal | { readonly _tag: "Route" }

/**
 * A {@link Verdict} other than `Route`: an answer in place of the route's.
 *
 * @since 0.2.0
 * @internal
 */
export type Refusal =
  | { readonly _tag: "Fatal"; readonly status: number; readonly reason: string; readonly body: string }
  | { readonly _tag: "Empty"; readonly status: number; readonly reason: string }

const fatal = (status: number, reason: string, body: string = `${status} ${reason}`): Refusal => ({
  _tag: "Fatal",
  status,
  reason,
  body
})

/** Go's plain `400`: any parse error of `readRequest` that is not a `statusError`. */
export const badRequest: Refusal = fatal(400, "Bad Request")

/** A `statusError` of `net/http`: the text goes in the status line and the body. */
const statusError = (status: number, text: string, detail: string): Refusal =>
  fatal(status, `${text}: ${detail}`, `${status} ${text}: ${detail}`)

const unsupportedTransferEncoding: Verdict = fatal(501, "Not Implemented", "Unsupported transfer encoding")
const versionNotSupported = statusError(505, "HTTP Version Not Supported", "unsupported protocol version")
const missingHost = statusError(400, "Bad Request", "missing required Host header")
const malformedHost = statusError(400, "Bad Request", "malformed Host header")
const invalidHeaderName = statusError(400, "Bad Request", "invalid header name")

/** Go's answer to a request head over `MaxHeaderBytes` (1 MiB). */
export const headerTooLarge: Refusal = fatal(431, "Request Header Fields Too Large")

const methodNotAllowed: Verdict = { _tag: "Empty", status: 405, reason: "Method Not Allowed" }
const optionsStar: Verdict = { _tag: "Empty", status: 200, reason: "OK" }
const route: Verdict = { _tag: "Route" }

/** The methods chi routes (its `methodMap`); any other gets `405` before routing. */
const chiMethods: ReadonlySet<string> = new Set([
  "CONNECT",
  "DELETE",
  "GET",
  "HEAD",
  "OPTIONS",
  "PATCH",
  "POST",
  "PUT",
  "QUERY",
  "TRACE"
])

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/
/** Go's `httpguts.ValidHostHeader` byte set. */
const HOST = /^[0-9A-Za-z!$%&'()*+,\-.:;=[\]_~]*$/
/** A `%` not followed by two hex digits: `url.ParseRequestURI` refuses such a path. */
const BAD_ESCAPE = /%(?![0-9A-Fa-f]{2})/
const CTL = /[\x00-\x1f\x7f]/
const SCHEME = /^[A-Za-z][A-Za-z0-9+.-]*:/

/** `url.ParseRequestURI` (for the checks Go makes; Node's parser already refuses most). */
const validRequestUri = (method: string, raw: string): boolean => {
  if (raw === "" || CTL.test(raw)) return false
  if (raw === "*") return true
  // `CONNECT host:port`: the authority alone.
  if (method === "CONNECT" && !raw.startsWith("/")) return !BAD_ESCAPE.test(raw)
  let rest = raw
  const scheme = SCHEME.exec(rest)
  if (scheme === null && rest.startsWith(":")) return false
  if (scheme !== null) rest = rest.slice(scheme[0].length)
  const q = rest.indexOf("?")
  if (q >= 0) rest = rest.slice(0, q)
  if (!rest.startsWith("/")) return scheme !== null
  if (scheme !== null && rest.startsWith("//")) {
    const slash = rest.indexOf("/", 2)
    rest = slash < 0 ? "" : rest.slice(slash)
  }
  return !BAD_ESCAPE.test(rest)
}

/**
 * What Go answers a request its parser read — `method`, `target` and version
 * as in the request line, `rawHeaders` as Node's (name, value, name, value…,
 * values trimmed) — before its route: the checks of `readRequest`,
 * `conn.readRequest` and `serverHandler` in Go's order, then chi's method
 * check. Node's parser has refused what Go's header parsing refuses; this
 * function makes the checks that come after (and that Node does not make).
 *
 * @since 0.2.0
 * @internal
 */
export const verdict = (
  method: string,
  target: string,
  major: number,
  minor: number,
  rawHeaders: ReadonlyArray<string>
): Verdict => {
  if (!validRequestUri(method, target)) return badRequest
  let hosts = 0
  let host = ""
  let encodings = 0
  let encoding = ""
  let spacedName = false
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!
    if (name.length === 4 && name.toLowerCase() === "host") {
      hosts++
      host = rawHeaders[i + 1]!
    } else if (name.length === 17 && name.toLowerCase() === "transfer-encoding") {
      encodings++
      encoding = rawHeaders[i + 1]!
    } else if (name.includes(" ")) {
      spacedName = true
    }
  }
  if (hosts > 1) return badRequest // "too many Host headers"
  // Transfer-Encoding: exactly one field, `chunked`; ignored before HTTP/1.1.
  if (encodings > 0 && (major > 1 || (major === 1 && minor >= 1))) {
    // Go's 501 also for `chunked` followed by another coding (the connection closes: nothing is smuggled).
    if (encodings !== 1 || encoding.toLowerCase() !== "chunked") return unsupportedTransferEncoding
  }
  const h2Preface = method === "PRI" && target === "*" && major === 2 && minor === 0 && rawHeaders.length === 0
  if (major !== 1 && !h2Preface) return versionNotSupported
  if ((major > 1 || minor >= 1) && hosts === 0 && !h2Preface && method !== "CONNECT") return missingHost
  if (hosts === 1 && !HOST.test(host)) return malformedHost
  if (spacedName) return invalidHeaderName
  if (method === "OPTIONS" && target === "*") return optionsStar
  return chiMethods.has(method) ? route : methodNotAllowed
}

/** Go's `ParseHTTPVersion`. */
const parseVersion = (proto: string): readonly [number, number] | undefined => {
  if (proto === "HTTP/1.1") return [1, 1]
  if (proto === "HTTP/1.0") return [1, 0]
  const m = /^HTTP\/([0-9])\.([0-9])$/.exec(proto)
  return m === null ? undefined : [Number(m[1]), Number(m[2])]
}

/** textproto's header value bytes: VCHAR, SP, HTAB and obs-text. */
const BAD_VALUE = /[\x00-\x08\x0a-\x1f\x7f]/
/** textproto's header name bytes (a space is accepted here and refused later as an invalid name). */
const NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z ]+$/

/**
 * What Go answers a request head given as the bytes received — for a request
 * Node's parser refused. `undefined` when the bytes hold no complete head
 * (from its first byte to the empty line) to judge; `Route` when Go would
 * have served it (Node refuses more than Go: obs-fold, bare LF,
 * `Content-Length` with `Transfer-Encoding`, …).
 *
 * @since 0.2.0
 * @internal
 */
export const verdictOfHead = (bytes: Uint8Array): Verdict | undefined => {
  const text = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("latin1")
  // textproto lines end at LF, a CR before it dropped.
  const lines: Array<string> = []
  let offset = 0
  for (;;) {
    const lf = text.indexOf("\n", offset)
    if (lf < 0) return undefined
    const line = text.slice(offset, lf > offset && text[lf - 1] === "\r" ? lf - 1 : lf)
    offset = lf + 1
    if (line === "" && lines.length > 0) break
    lines.push(line)
  }
  const first = lines[0]!
  const sp1 = first.indexOf(" ")
  const sp2 = sp1 < 0 ? -1 : first.indexOf(" ", sp1 + 1)
  if (sp2 < 0) return badRequest // "malformed HTTP request"
  const method = first.slice(0, sp1)
  const target = first.slice(sp1 + 1, sp2)
  if (!TOKEN.test(method)) return badRequest // "invalid method"
  const version = parseVersion(first.slice(sp2 + 1))
  if (version === undefined) return badRequest // "malformed HTTP version"
  if (!validRequestUri(method, target)) return badRequest
  const headers: Array<string> = []
  const fields = lines.slice(1)
  if (fields.length > 0 && (fields[0]!.startsWith(" ") || fields[0]!.startsWith("\t"))) return badRequest
  for (let i = 0; i < fields.length; i++) {
    let line = fields[i]!
    // obs-fold: continuation lines join the field with one space.
    while (i + 1 < fields.length && (fields[i + 1]!.startsWith(" ") || fields[i + 1]!.startsWith("\t"))) {
      line = line.replace(/[ \t]+$/, "") + " " + fields[++i]!.replace(/^[ \t]+/, "")
    }
    const colon = line.indexOf(":")
    if (colon < 0) return badRequest
    const name = line.slice(0, colon)
    const value = line.slice(colon + 1)
    if (!NAME.test(name) || BAD_VALUE.test(value)) return badRequest
    headers.push(name, value.replace(/^[ \t]+|[ \t]+$/g, ""))
  }
  // Content-Length: duplicates must agree; one decimal number in int64.
  const lengths: Array<string> = []
  for (let i = 0; i < headers.length; i += 2) {
    if (headers[i]!.toLowerCase() === "content-length") lengths.push(headers[i + 1]!)
  }
  const v = verdict(method, target, version[0], version[1], headers)
  // The checks before the Content-Length one (URI, Host count, Transfer-Encoding) come first.
  if (v._tag === "Fatal" && (v === badRequest || v === unsupportedTransferEncoding)) return v
  if (lengths.length > 0) {
    if (lengths.some((l) => l !== lengths[0])) return badRequest
    if (!/^[0-9]+$/.test(lengths[0]!) || BigInt(lengths[0]!) > 0x7fffffffffffffffn) return badRequest
  }
  return v
}

/**
 * {@link verdictOfHead} for bytes that may hold several pipelined requests:
 * the verdict of the first head Go would not serve, skipping each served
 * request's `Content-Length` body. `undefined` when none is complete, or a
 * body's framing cannot be followed (chunked).
 *
 * @since 0.2.0
 * @internal
 */
export const verdictOfHeads = (bytes: Uint8Array): Verdict | undefined => {
  const buffer = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  let offset = 0
  while (offset < buffer.length) {
    const head = buffer.subarray(offset)
    const v = verdictOfHead(head)
    if (v === undefined || v._tag !== "Route") return v
    const text = head.toString("latin1")
    const crlf = text.indexOf("\r\n\r\n")
    const lf = text.indexOf("\n\n")
    const end = crlf >= 0 && (lf < 0 || crlf + 1 <= lf) ? crlf + 4 : lf + 2
    const fields = text.slice(0, end)
    if (/\ntransfer-encoding:/i.test(fields)) return undefined
    const length = /\ncontent-length:[ \t]*([0-9]+)/i.exec(fields)
    offset += end + (length === null ? 0 : Number(length[1]))
  }
  return undefined
}

/**
 * The bytes Go writes for a verdict straight on the connection: a `Fatal`
 * one as `conn.serve` writes it; an `Empty` one as a handler's answer (its
 * `Date`, `Content-Length: 0`) with `Connection: close` (Node's parser is done
 * with the connection).
 *
 * @since 0.2.0
 * @internal
 */
export const rawResponse = (v: Refusal): string =>
  v._tag === "Fatal"
    ? `HTTP/1.1 ${v.status} ${v.reason}\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n${v.body}`
    : `HTTP/1.1 ${v.status} ${v.reason}\r\nDate: ${new Date().toUTCString()}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`

const decodeSegment = (s: string): string => {
  try {
    return decodeURIComponent(s)
  } catch {
    return s
  }
}

/**
 * The path segments chi routes a request on, from the path as sent: Go
 * decodes the path and keeps the raw form (`URL.RawPath`) when the raw form
 * is not the canonical escaping of the decoded one; chi then routes — and
 * reads its parameters — on the raw form. So `/v0/agents/a%20b` routes as
 * `a b`, but `/v0/%68ealth` (an `h` escaped for nothing) is not
 * `/v0/health`, and `/v0/agents/caf%c3%a9` (lower-case hex) names `caf%c3%a9`.
 *
 * @since 0.2.0
 * @internal
 */
export const routedSegments = (path: string): ReadonlyArray<string> => {
  const raw = path.split("/")
  if (!path.includes("%")) return raw
  const decoded = raw.map(decodeSegment)
  for (let i = 0; i < raw.length; i++) if (Path.escapePath(decoded[i]!) !== raw[i]) return raw
  return decoded
}

