/**
 * The kernel client's socket transport: a small HTTP/1.1 client on Node's
 * own sockets (`node:net`, `node:tls`) that does exactly what the kernel
 * client needs and nothing else — one request at a time per keep-alive
 * connection, a bounded pool, whole answers read into a string.
 *
 * Why not a library: a keep-alive round trip to a local kernel costs the
 * agent about 100 µs of CPU through undici's handler interface, of which
 * about a third is undici's own request bookkeeping, header validation and
 * parser callbacks; a step is two round trips. Here a request is one buffer
 * written with one `write`, and an answer is parsed from the bytes as they
 * arrive (a status line, a few headers, a `content-length` or chunked body).
 *
 * The bytes sent are those undici sends for the same request — request line,
 * `host`, `connection: keep-alive`, the request's headers in order, then
 * `content-length` (`0` for a `POST`/`PUT` without a body) — and the failures
 * read the same (`request failed: …`, `reading the response failed: …`,
 * `other side closed`).
 *
 * @since 0.2.0
 * @internal
 */
import type { Duration } from "effect"
import { Effect } from "effect"
import * as Net from "node:net"
import * as Tls from "node:tls"
import type { KernelError } from "../../RebunoError.js"
import type { Deadline, Deadlines } from "./deadlines.js"
import type { BaseUrl, Reply } from "./exchange.js"
import { timeoutError } from "./exchange.js"
import type { Send, WireRequest } from "./transport.js"
import { failure, withDeadlines } from "./transport.js"

/**
 * How long an idle connection is reused when the server does not say
 * (`keep-alive: timeout=N`): 4 s, undici's default.
 */
const DEFAULT_IDLE_MILLIS = 4_000

/** How much sooner than the server's `keep-alive: timeout` an idle connection is dropped. */
const IDLE_MARGIN_MILLIS = 1_000

/** The longest idle reuse whatever the server says: 10 minutes. */
const MAX_IDLE_MILLIS = 600_000

/** The largest response head accepted (status line and headers). */
const MAX_HEAD_BYTES = 64 * 1024

/** Characters a header value may hold (undici's rule: visible latin-1, space and tab). */
const INVALID_HEADER_VALUE = /[^\t\x20-\x7e\x80-\xff]/

/** Characters a request target may hold (undici's rule). */
const INVALID_PATH = /[^\u0021-\u00ff]/

const STATUS_LINE = /^HTTP\/1\.([01]) (\d{3})(?: |$)/

const CRLF_CRLF = Buffer.from("\r\n\r\n", "latin1")

const READING = "reading the response failed"

/**
 * A bounded pool of keep-alive connections to one origin, and the transport
 * over it. `close` destroys every connection and fails the requests still
 * waiting or in flight.
 *
 * @internal
 */
export interface SocketTransport {
  readonly send: Send
  readonly close: () => void
}

/**
 * The socket transport for `base` (an `http:` or `https:` URL) with at most
 * `connections` connections, each request within `timeout`.
 *
 * @internal
 */
export const make = (base: BaseUrl, timeout: Duration.Duration, connections: number): SocketTransport => {
  const pool = new Pool(new URL(base.url), Math.max(1, Math.floor(connections)))
  const prefix = base.pathname
  return {
    send: withDeadlines(timeout, (request, deadlines) => exchange(pool, prefix, request, deadlines)),
    close: () => pool.close()
  }
}

/** One request through the pool, failing with the timeout error once its deadline (if any) has passed. */
const exchange = (
  pool: Pool,
  prefix: string,
  request: WireRequest,
  deadlines: Deadlines | undefined
): Effect.Effect<Reply, KernelError> =>
  Effect.callback<Reply, KernelError>((resume) => {
    const bytes = encode(pool.host, prefix, request)
    if (typeof bytes === "string") {
      resume(Effect.fail(failure("request failed", new Error(bytes))))
      return
    }
    const pending = new Pending(bytes, resume, deadlines)
    pool.send(pending)
    return Effect.sync(() => pending.cancel())
  })

/**
 * The request's bytes as undici writes them, or the reason it cannot be sent
 * (a header value or path with characters HTTP does not allow).
 */
const encode = (host: string, prefix: string, request: WireRequest): Buffer | string => {
  const path = prefix + request.path
  if (INVALID_PATH.test(path)) return "invalid request path"
  let head = request.method + " " + path + " HTTP/1.1\r\nhost: " + host + "\r\nconnection: keep-alive\r\n"
  const headers = request.headers
  for (const name in headers) {
    const value = headers[name]!
    if (INVALID_HEADER_VALUE.test(value)) return `invalid ${name} header`
    head += name + ": " + value + "\r\n"
  }
  const body = request.body
  if (body !== undefined) head += "content-length: " + body.length + "\r\n\r\n"
  else head += request.method === "GET" ? "\r\n" : "content-length: 0\r\n\r\n"
  if (body === undefined || body.length === 0) return Buffer.from(head, "latin1")
  const bytes = Buffer.allocUnsafe(head.length + body.length)
  bytes.write(head, 0, "latin1")
  bytes.set(body, head.length)
  return bytes
}

/** A request waiting for, or on, a connection; settled once. */
class Pending {
  settled = false
  connection: Connection | undefined = undefined
  private readonly deadline: Deadline | undefined

  constructor(
    readonly bytes: Buffer,
    private readonly resume: (effect: Effect.Effect<Reply, KernelError>) => void,
    private readonly deadlines: Deadlines | undefined
  ) {
    this.deadline = deadlines === undefined ? undefined : deadlines.add(this.onTimeout)
  }

  succeed(status: number, text: string): void {
    if (this.settle()) this.resume(Effect.succeed({ status, text }))
  }

  fail(prefix: string, error: unknown): void {
    if (this.settle()) this.resume(Effect.fail(failure(prefix, error)))
  }

  /** Interrupted: forget the answer; a connection in the middle of this exchange cannot be reused. */
  cancel(): void {
    if (!this.settle()) return
    const connection = this.connection
    if (connection !== undefined) connection.abort(this)
  }

  private readonly onTimeout = (): void => {
    if (!this.settle()) return
    this.resume(Effect.fail(timeoutError(this.deadlines!.timeout)))
    const connection = this.connection
    if (connection !== undefined) connection.abort(this)
  }

  private settle(): boolean {
    if (this.settled) return false
    this.settled = true
    if (this.deadline !== undefined) this.deadlines!.remove(this.deadline)
    return true
  }
}

/** The connections to one origin: reused most recent first, at most `max` open, requests queued beyond. */
class Pool {
  readonly host: string
  private readonly hostname: string
  private readonly port: number
  private readonly tls: boolean
  private readonly idle: Array<Connection> = []
  private readonly queue: Array<Pending> = []
  /** The connections with an exchange on them (destroyed by {@link close}). */
  readonly busy = new Set<Connection>()
  private open = 0
  private closed = false

  constructor(url: URL, private readonly max: number) {
    this.host = url.host
    this.tls = url.protocol === "https:"
    this.hostname = url.hostname.startsWith("[") ? url.hostname.slice(1, -1) : url.hostname
    this.port = url.port === "" ? (this.tls ? 443 : 80) : Number(url.port)
  }

  send(pending: Pending): void {
    if (this.closed) return pending.fail("request failed", new Error("the kernel client is closed"))
    const idle = this.idle
    if (idle.length > 0) {
      const now = performance.now()
      let connection: Connection | undefined
      while ((connection = idle.pop()) !== undefined) {
        if (connection.reusable(now)) return connection.start(pending)
        connection.destroy()
      }
    }
    if (this.open < this.max) return this.connect().start(pending)
    this.queue.push(pending)
  }

  /** A connection finished an exchange and may be reused. */
  release(connection: Connection): void {
    const next = this.next()
    if (next !== undefined) return connection.start(next)
    connection.park()
    this.idle.push(connection)
  }

  /** A connection is gone (closed, failed, destroyed): make room for a waiting request. */
  remove(connection: Connection): void {
    this.open--
    const at = this.idle.indexOf(connection)
    if (at >= 0) this.idle.splice(at, 1)
    if (this.closed || this.open >= this.max) return
    const next = this.next()
    if (next !== undefined) this.connect().start(next)
  }

  close(): void {
    if (this.closed) return
    this.closed = true
    for (const pending of this.queue.splice(0)) pending.fail("request failed", new Error("the kernel client is closed"))
    for (const connection of this.idle.splice(0)) connection.destroy()
    for (const connection of [...this.busy]) connection.broken("request failed", "the kernel client is closed")
  }

  private next(): Pending | undefined {
    let next: Pending | undefined
    while ((next = this.queue.shift()) !== undefined) {
      if (!next.settled) return next
    }
    return undefined
  }

  private connect(): Connection {
    this.open++
    const socket = this.tls
      ? Tls.connect({
        host: this.hostname,
        port: this.port,
        ALPNProtocols: ["http/1.1"],
        ...(Net.isIP(this.hostname) === 0 ? { servername: this.hostname } : {})
      })
      : Net.connect({ host: this.hostname, port: this.port })
    return new Connection(this, socket)
  }
}

/** Where a connection is in reading an answer. */
const enum Read {
  /** No exchange: any byte is a protocol error. */
  Idle,
  /** Reading the status line and headers. */
  Head,
  /** A body of `remaining` bytes. */
  Length,
  /** A chunk-size line. */
  ChunkSize,
  /** `remaining` bytes of chunk data. */
  ChunkData,
  /** The CRLF after chunk data. */
  ChunkEnd,
  /** Trailer lines up to the empty one. */
  Trailers,
  /** A body that ends when the server closes the connection. */
  UntilClose
}

/** One keep-alive connection, and the parser of the answers arriving on it. */
class Connection {
  private pending: Pending | undefined = undefined
  private state = Read.Idle
  private buffered: Buffer | undefined = undefined
  private status = 0
  private keepAlive = true
  private idleMillis = DEFAULT_IDLE_MILLIS
  private remaining = 0
  private chunks: Array<Buffer> = []
  private responded = false
  private idleUntil = 0
  private error: Error | undefined = undefined
  private gone = false

  constructor(private readonly pool: Pool, private readonly socket: Net.Socket) {
    socket.setNoDelay(true)
    socket.setKeepAlive(true, 60_000)
    socket.on("data", this.onData)
    socket.on("error", this.onError)
    socket.on("close", this.onClose)
  }

  reusable(now: number): boolean {
    return !this.gone && now < this.idleUntil && this.socket.writable
  }

  start(pending: Pending): void {
    this.pending = pending
    pending.connection = this
    this.pool.busy.add(this)
    this.state = Read.Head
    this.status = 0
    this.responded = false
    this.keepAlive = true
    this.socket.ref()
    this.socket.write(pending.bytes)
  }

  /** Back in the pool: reusable until the idle limit, and not keeping the process alive. */
  park(): void {
    this.idleUntil = performance.now() + this.idleMillis
    this.socket.unref()
  }

  /** The exchange on this connection was given up: drop the connection. */
  abort(pending: Pending): void {
    if (this.pending === pending) this.destroy()
  }

  destroy(): void {
    this.pending = undefined
    this.socket.destroy()
    this.forget()
  }

  private forget(): void {
    if (this.gone) return
    this.gone = true
    this.state = Read.Idle
    this.buffered = undefined
    this.chunks = []
    this.pool.busy.delete(this)
    this.pool.remove(this)
  }

  private readonly onError = (error: Error): void => {
    this.error ??= error
  }

  private readonly onClose = (): void => {
    const pending = this.pending
    this.pending = undefined
    if (pending !== undefined) {
      if (this.state === Read.UntilClose && this.error === undefined) {
        const text = this.text()
        this.forget()
        return pending.succeed(this.status, text)
      }
      this.forget()
      return pending.fail(
        this.responded ? "reading the response failed" : "request failed",
        this.error ?? new Error("other side closed")
      )
    }
    this.forget()
  }

  private readonly onData = (data: Buffer): void => {
    if (this.state === Read.Idle) return this.destroy()
    this.responded = true
    const buffer = this.buffered === undefined ? data : Buffer.concat([this.buffered, data])
    this.buffered = undefined
    let at = 0
    while (at < buffer.length || this.state === Read.Length && this.remaining === 0) {
      switch (this.state) {
        case Read.Head: {
          const end = buffer.indexOf(CRLF_CRLF, at)
          if (end < 0) {
            if (buffer.length - at > MAX_HEAD_BYTES) return this.broken(READING, "response head too large")
            this.buffered = at === 0 ? buffer : buffer.subarray(at)
            return
          }
          const problem = this.head(buffer.toString("latin1", at, end))
          if (problem !== undefined) return this.broken(READING, problem)
          at = end + 4
          break
        }
        case Read.Length: {
          const take = Math.min(this.remaining, buffer.length - at)
          if (take > 0) {
            this.chunks.push(buffer.subarray(at, at + take))
            this.remaining -= take
            at += take
          }
          if (this.remaining === 0) return this.finish(buffer, at)
          break
        }
        case Read.ChunkSize: {
          const end = buffer.indexOf("\r\n", at, "latin1")
          if (end < 0) return this.keep(buffer, at)
          const line = buffer.toString("latin1", at, end)
          const semicolon = line.indexOf(";")
          const size = semicolon < 0 ? line.trim() : line.slice(0, semicolon).trim()
          if (!/^[0-9a-fA-F]{1,8}$/.test(size)) return this.broken(READING, "invalid chunk size")
          this.remaining = parseInt(size, 16)
          this.state = this.remaining === 0 ? Read.Trailers : Read.ChunkData
          at = end + 2
          break
        }
        case Read.ChunkData: {
          const take = Math.min(this.remaining, buffer.length - at)
          this.chunks.push(buffer.subarray(at, at + take))
          this.remaining -= take
          at += take
          if (this.remaining === 0) this.state = Read.ChunkEnd
          break
        }
        case Read.ChunkEnd: {
          if (buffer.length - at < 2) return this.keep(buffer, at)
          if (buffer[at] !== 13 || buffer[at + 1] !== 10) return this.broken(READING, "invalid chunk end")
          at += 2
          this.state = Read.ChunkSize
          break
        }
        case Read.Trailers: {
          const end = buffer.indexOf("\r\n", at, "latin1")
          if (end < 0) return this.keep(buffer, at)
          const empty = end === at
          at = end + 2
          if (empty) return this.finish(buffer, at)
          break
        }
        case Read.UntilClose: {
          this.chunks.push(at === 0 ? buffer : buffer.subarray(at))
          return
        }
        default:
          return this.destroy()
      }
    }
  }

  /** Keep the unread bytes from `at` for the next `data` event. */
  private keep(buffer: Buffer, at: number): void {
    this.buffered = at === 0 ? buffer : buffer.subarray(at)
  }

  /**
   * Read a response head; an interim (1xx) answer is skipped. Returns why the
   * head is unusable, if it is.
   */
  private head(head: string): string | undefined {
    const status = STATUS_LINE.exec(head)
    if (status === null) return "invalid status line"
    const code = Number(status[2])
    const http10 = status[1] === "0"
    let length = -1
    let chunked = false
    let otherEncoding = false
    let close = http10
    let lineStart = head.indexOf("\r\n")
    while (lineStart >= 0) {
      const lineEnd = head.indexOf("\r\n", lineStart + 2)
      const line = head.slice(lineStart + 2, lineEnd < 0 ? head.length : lineEnd)
      lineStart = lineEnd
      const colon = line.indexOf(":")
      if (colon <= 0) return "invalid header line"
      const name = line.slice(0, colon).toLowerCase()
      switch (name) {
        case "content-length": {
          const value = line.slice(colon + 1).trim()
          if (!/^\d{1,15}$/.test(value)) return "invalid content-length"
          const n = Number(value)
          if (length >= 0 && length !== n) return "conflicting content-length"
          length = n
          break
        }
        case "transfer-encoding": {
          const codings = line.slice(colon + 1).toLowerCase().split(",")
          chunked = codings[codings.length - 1]!.trim() === "chunked"
          otherEncoding = !chunked
          break
        }
        case "connection": {
          const value = line.slice(colon + 1).toLowerCase()
          if (value.includes("close")) close = true
          else if (http10 && value.includes("keep-alive")) close = false
          break
        }
        case "keep-alive": {
          const timeout = /timeout\s*=\s*(\d+)/i.exec(line)
          if (timeout !== null) {
            this.idleMillis = Math.min(MAX_IDLE_MILLIS, Math.max(0, Number(timeout[1]) * 1000 - IDLE_MARGIN_MILLIS))
          }
          break
        }
      }
    }
    if (code < 200) {
      // 101 would switch protocols, which no kernel route does.
      if (code === 101) return "unexpected protocol switch"
      return undefined
    }
    this.status = code
    this.keepAlive = !close
    if (code === 204 || code === 304) {
      this.remaining = 0
      this.state = Read.Length
    } else if (chunked) {
      this.state = Read.ChunkSize
    } else if (otherEncoding || length < 0) {
      this.keepAlive = false
      this.state = Read.UntilClose
    } else {
      this.remaining = length
      this.state = Read.Length
    }
    return undefined
  }

  /** The answer is complete at `at`: hand the connection back (or drop it), then settle. */
  private finish(buffer: Buffer, at: number): void {
    const pending = this.pending!
    const text = this.text()
    this.pending = undefined
    this.state = Read.Idle
    this.pool.busy.delete(this)
    // Bytes after the answer, or a server that will close: do not reuse.
    if (!this.keepAlive || at < buffer.length) this.destroy()
    else this.pool.release(this)
    pending.succeed(this.status, text)
  }

  private text(): string {
    const chunks = this.chunks
    if (chunks.length === 0) return ""
    this.chunks = []
    return chunks.length === 1 ? chunks[0]!.toString("utf8") : Buffer.concat(chunks).toString("utf8")
  }

  /** Fail the exchange on this connection with `prefix: problem` and drop the connection. */
  broken(prefix: string, problem: string): void {
    const pending = this.pending
    this.destroy()
    if (pending !== undefined) pending.fail(prefix, new Error(problem))
  }
}
