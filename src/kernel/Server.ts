/**
 * Serves the kernel routes over HTTP with `effect/http` on Node. The adapter reads
 * the raw request body itself (enforcing the 10 MiB cap while reading, so an
 * oversized upload is never buffered), passes every header value through so
 * duplicate headers stay visible to the `v1` signature checks, and writes the
 * route's response byte for byte: JSON and the plain-text 404 with their exact
 * content types, `204`/`405` with no content type at all, and the SSE stream
 * with its headers flushed at once.
 *
 * The hot agent routes — step submit, complete and fail, two requests per
 * step — take a shorter way on {@link layer}'s server: a Node listener in
 * front of `effect/http` reads their body and answers them synchronously
 * (`Routes.Handlers.handleSync`) with the same bytes, status and headers,
 * without a fiber or the platform's request and response objects; any request
 * it declines goes on to the `effect/http` handler with the body it read.
 *
 * @since 0.1.0
 */
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as HttpServer from "effect/http/HttpServer"
import type * as HttpServerError from "effect/http/HttpServerError"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import * as Layer from "effect/Layer"
import type * as Redacted from "effect/Redacted"
import * as Stream from "effect/Stream"
import * as Http from "node:http"
import type * as Net from "node:net"
import type * as Core from "./Core.js"
import * as GoHttp from "./internal/goHttp.js"
import * as Routes from "./Routes.js"

/**
 * Options of {@link layer}.
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /**
   * Interface to bind: `127.0.0.1` (this machine only) when absent; `""` or
   * `0.0.0.0` for every interface (other machines, containers).
   */
  readonly host?: string | undefined
  /** Port to bind; `0` picks a free port (read it back with `HttpServer.address`). */
  readonly port: number
  readonly core: Core.KernelCore
  /** Bearer token; dev mode when absent. */
  readonly apiToken?: Redacted.Redacted<string> | undefined
}

/**
 * The interface the kernel binds by default: the loopback interface, so a dev
 * kernel (which has no authentication unless given a token) is reachable from
 * this machine only.
 *
 * @since 0.2.0
 * @category constants
 */
export const defaultHost = "127.0.0.1"

const encoder = new TextEncoder()

type NodeSource = Http.IncomingMessage

const nodeSource = (request: HttpServerRequest.HttpServerRequest): NodeSource | undefined => {
  try {
    const source = NodeHttpServerRequest.toIncomingMessage(request) as unknown
    return source instanceof Http.IncomingMessage ? source : undefined
  } catch {
    return undefined
  }
}

/** Whether a Node request declares (`Content-Length`) a body over the cap. */
const declaresOverCap = (source: NodeSource): boolean => {
  const declared = Number(source.headers["content-length"])
  return Number.isFinite(declared) && declared > Routes.maxBodyBytes
}

/** Reads a Node request body, failing as soon as it grows past the cap. */
const readNodeBody = (source: NodeSource): Effect.Effect<Uint8Array, Routes.BodyTooLarge | Routes.BodyReadError> =>
  Effect.callback<Uint8Array, Routes.BodyTooLarge | Routes.BodyReadError>((resume) => {
    // A request whose connection is gone sends no more events: nothing to wait for.
    if ((source.destroyed || source.errored !== null) && !source.readableEnded) {
      resume(Effect.fail(new Routes.BodyReadError({ cause: source.errored ?? new Error("request aborted") })))
      return
    }
    if (declaresOverCap(source)) {
      source.resume()
      resume(Effect.fail(new Routes.BodyTooLarge()))
      return
    }
    const chunks: Array<Buffer> = []
    let size = 0
    const cleanup = () => {
      source.off("data", onData)
      source.off("end", onEnd)
      source.off("error", onError)
      source.off("aborted", onAborted)
    }
    const onData = (chunk: Buffer) => {
      size += chunk.length
      if (size > Routes.maxBodyBytes) {
        cleanup()
        chunks.length = 0
        // Discard the rest so the response can still be written.
        source.resume()
        resume(Effect.fail(new Routes.BodyTooLarge()))
        return
      }
      chunks.push(chunk)
    }
    const onEnd = () => {
      cleanup()
      const all = Buffer.concat(chunks, size)
      resume(Effect.succeed(new Uint8Array(all.buffer, all.byteOffset, all.byteLength)))
    }
    const onError = (cause: unknown) => {
      cleanup()
      resume(Effect.fail(new Routes.BodyReadError({ cause })))
    }
    const onAborted = () => onError(new Error("request aborted"))
    if (source.readableEnded) {
      resume(Effect.succeed(new Uint8Array(0)))
      return
    }
    source.on("data", onData)
    source.on("end", onEnd)
    source.on("error", onError)
    source.on("aborted", onAborted)
    return Effect.sync(cleanup)
  })

/** Reads a body through the generic platform API (non-Node servers). */
const readGenericBody = (
  request: HttpServerRequest.HttpServerRequest
): Effect.Effect<Uint8Array, Routes.BodyTooLarge | Routes.BodyReadError> =>
  Stream.runFold(
    request.stream.pipe(Stream.mapError((cause) => new Routes.BodyReadError({ cause }))),
    (): { readonly chunks: Array<Uint8Array>; size: number } => ({ chunks: [], size: 0 }),
    (acc, chunk) => {
      acc.chunks.push(chunk)
      acc.size += chunk.length
      return acc
    }
  ).pipe(
    Effect.flatMap(({ chunks, size }) => {
      if (size > Routes.maxBodyBytes) return Effect.fail(new Routes.BodyTooLarge())
      const out = new Uint8Array(size)
      let offset = 0
      for (const chunk of chunks) {
        out.set(chunk, offset)
        offset += chunk.length
      }
      return Effect.succeed(out)
    })
  )

/** The largest request head the kernel reads, as the reference kernel (Go's default): 1 MiB. */
const maxHeaderBytes = 1024 * 1024

/**
 * Converts a platform request to the routes' request model.
 *
 * @since 0.1.0
 * @category conversions
 */
export const toKernelRequest = (request: HttpServerRequest.HttpServerRequest): Routes.KernelRequest => {
  const source = nodeSource(request)
  const distinct = source?.headersDistinct
  const headers = (name: string): ReadonlyArray<string> => {
    const key = name.toLowerCase()
    if (distinct !== undefined) return distinct[key] ?? []
    const value = request.headers[key]
    return value === undefined ? [] : [value]
  }
  const read = source === undefined ? undefined : bodiesRead.get(source)
  return {
    method: request.method,
    url: source?.url ?? request.url,
    headers,
    body: read ?? (source !== undefined ? readNodeBody(source) : readGenericBody(request))
  }
}

/** Bodies the synchronous path read before handing its request on to the general one. */
const bodiesRead = new WeakMap<NodeSource, Uint8Array>()

/** Largest body the synchronous path reads (a step outcome or submission is far smaller). */
const maxSyncBodyBytes = 256 * 1024

/**
 * Whether a request may be one of the hot step routes (see
 * `Routes.Handlers.handleSync`): an HTTP/1 `POST` under `/v0/executions/`
 * ending in `/steps`, `/complete` or `/fail` with a small declared body.
 */
const syncCandidate = (source: NodeSource): boolean => {
  if (source.method !== "POST" || source.httpVersionMajor !== 1) return false
  const url = source.url ?? ""
  if (!url.startsWith("/v0/executions/")) return false
  if (!url.endsWith("/steps") && !url.endsWith("/complete") && !url.endsWith("/fail")) return false
  const raw = source.rawHeaders
  const length = rawValues(raw, "content-length")
  if (length.length !== 1 || rawValues(raw, "transfer-encoding").length > 0) return false
  const n = Number(length[0])
  return Number.isInteger(n) && n >= 0 && n <= maxSyncBodyBytes
}

/**
 * Every value of a header in a Node request's `rawHeaders`, in order — what
 * `headersDistinct` holds for it — without building the header objects.
 */
const rawValues = (raw: ReadonlyArray<string>, key: string): ReadonlyArray<string> => {
  let out: Array<string> | undefined
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!
    if (name.length === key.length && (name === key || name.toLowerCase() === key)) (out ??= []).push(raw[i + 1]!)
  }
  return out ?? noValues
}

const noValues: ReadonlyArray<string> = []

/**
 * A Node `request` listener answering the hot step routes synchronously once
 * their body is read — with the bytes, status and headers the general path
 * writes for a JSON answer — and handing every other request (and every hot
 * one the synchronous path declines, with its body) to `general`.
 */
const syncListener = (
  handlers: Routes.Handlers,
  now: () => number,
  general: (request: Http.IncomingMessage, response: Http.ServerResponse) => void
) =>
(request: Http.IncomingMessage, response: Http.ServerResponse): void => {
  if (!syncCandidate(request)) return general(request, response)
  const chunks: Array<Buffer> = []
  let size = 0
  // Set once the request ended or failed: later events are ignored (cheaper than removing the listeners).
  let settled = false
  const onData = (chunk: Buffer) => {
    chunks.push(chunk)
    size += chunk.length
  }
  // The request failed before its end: the client went away (a reset, or the connection closed
  // mid-body). Nobody is left to answer, and handing the request on would leave the general path
  // waiting for a body that never comes.
  const onGone = () => {
    settled = true
  }
  const onEnd = () => {
    if (settled) return
    settled = true
    const all = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size)
    const body = new Uint8Array(all.buffer, all.byteOffset, all.byteLength)
    let answer: Routes.KernelResponse | undefined
    try {
      const raw = request.rawHeaders
      answer = handlers.handleSync({
        method: "POST",
        url: request.url ?? "",
        headers: (name) => rawValues(raw, name.toLowerCase()),
        body
      }, now())
    } catch {
      answer = undefined
    }
    // Declined (nothing changed): the general path answers from the start. An answer is never
    // handed on — the request may have changed the kernel — and is always a JSON body.
    if (answer === undefined || typeof answer.body !== "string") {
      bodiesRead.set(request, body)
      return general(request, response)
    }
    writeText(response, answer.status, answer.headers, answer.body)
  }
  request.on("data", onData)
  request.on("end", onEnd)
  request.on("error", onGone)
  request.on("close", onGone)
}

/**
 * Writes a complete text response: the route's headers in their order, then
 * `content-length`, then the body. A string body goes out with the head in one
 * write (Node joins them), where a `Buffer` would take a second chunk.
 */
const writeText = (
  response: Http.ServerResponse,
  status: number,
  headers: Readonly<Record<string, string>>,
  body: string
): void => {
  const head: Array<string> = []
  for (const name in headers) head.push(name, headers[name]!)
  head.push("content-length", String(Buffer.byteLength(body, "utf8")))
  response.writeHead(status, head)
  response.end(body, "utf8")
}

/**
 * Converts a routes response to a platform response, adding no headers of its
 * own (a body-less response gets no content type).
 *
 * @since 0.1.0
 * @category conversions
 */
export const toServerResponse = (
  response: Routes.KernelResponse,
  request?: HttpServerRequest.HttpServerRequest
): HttpServerResponse.HttpServerResponse => {
  const headers: Record<string, string> = {}
  let contentType: string | undefined
  for (const [name, value] of Object.entries(response.headers)) {
    if (name.toLowerCase() === "content-type") contentType = value
    else headers[name] = value
  }
  const body = response.body
  if (typeof body === "string" || body instanceof Uint8Array) {
    const bytes = typeof body === "string" ? encoder.encode(body) : body
    if (bytes.length === 0 && contentType === undefined) {
      return HttpServerResponse.empty({ status: response.status, headers })
    }
    return HttpServerResponse.uint8Array(bytes, {
      status: response.status,
      headers,
      ...(contentType !== undefined ? { contentType } : {})
    })
  }
  const nodeResponse = request === undefined ? undefined : nodeResponseOf(request)
  // Routes emit an empty chunk once the stream is live: flush the headers then.
  const stream = body.pipe(
    Stream.tap((chunk) =>
      chunk.length === 0 && nodeResponse !== undefined
        ? Effect.sync(() => nodeResponse.flushHeaders())
        : Effect.void
    ),
    Stream.filter((chunk) => chunk.length > 0)
  )
  return HttpServerResponse.stream(stream, {
    status: response.status,
    headers,
    ...(contentType !== undefined ? { contentType } : {})
  })
}

const nodeResponseOf = (request: HttpServerRequest.HttpServerRequest): Http.ServerResponse | undefined => {
  try {
    const response = NodeHttpServerRequest.toServerResponse(request) as unknown
    return response instanceof Http.ServerResponse ? response : undefined
  } catch {
    return undefined
  }
}

/**
 * The kernel as an `HttpEffect`: a handler that reads the `HttpServerRequest`
 * from its context and never fails.
 *
 * @since 0.1.0
 * @category constructors
 */
export const makeHttpEffect = (
  core: Core.KernelCore,
  options: Routes.Options = {}
): Effect.Effect<HttpServerResponse.HttpServerResponse, never, HttpServerRequest.HttpServerRequest> =>
  httpEffectOf(Routes.make(core, options))

const httpEffectOf = (
  handle: (req: Routes.KernelRequest) => Effect.Effect<Routes.KernelResponse>
): Effect.Effect<HttpServerResponse.HttpServerResponse, never, HttpServerRequest.HttpServerRequest> =>
  Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
    Effect.map(handle(toKernelRequest(request)), (response) => toServerResponse(response, request)))

/**
 * Puts {@link syncListener} in front of the `request` listener `effect/http`
 * registered on the server (the only one), with the `Clock` of the layer.
 * Removed again when the layer is released.
 */
const installSyncPath = (server: Http.Server, handlers: Routes.Handlers) =>
  Layer.effectDiscard(Effect.gen(function*() {
    const listeners = server.listeners("request")
    if (listeners.length !== 1) return
    const general = listeners[0] as (request: Http.IncomingMessage, response: Http.ServerResponse) => void
    const clock = yield* Clock.Clock
    const listener = syncListener(handlers, () => clock.currentTimeMillisUnsafe(), general)
    // `Expect: 100-continue`: the platform's listener acknowledges only when its own body stream is
    // read, which the kernel never uses, so the client would wait for a `100` that never comes
    // (RFC 9110 10.1.1). Acknowledge at once — unless the declared body is over the cap, which is
    // answered at once instead — and go on as for any request.
    const continued = server.listeners("checkContinue") as Array<
      (request: Http.IncomingMessage, response: Http.ServerResponse) => void
    >
    const onContinue = (request: Http.IncomingMessage, response: Http.ServerResponse): void => {
      // Go refuses the request before reading its body (so before any `100`).
      if (refused(request, response)) return
      if (!declaresOverCap(request)) response.writeContinue()
      listener(request, response)
    }
    const onRequest = (request: Http.IncomingMessage, response: Http.ServerResponse): void => {
      if (!refused(request, response)) listener(request, response)
    }
    server.off("request", general)
    server.on("request", onRequest)
    for (const f of continued) server.off("checkContinue", f)
    server.on("checkContinue", onContinue)
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        server.off("request", onRequest)
        server.on("request", general)
        server.off("checkContinue", onContinue)
        for (const f of continued) server.on("checkContinue", f)
      })
    )
  }))

/**
 * What the reference kernel (Go's `net/http` and chi) answers a request
 * Node's parser accepted, before its route (see `internal/goHttp`). An
 * HTTP/0.9 request line (no version, so no headers) is one Go cannot parse.
 */
const requestVerdict = (request: Http.IncomingMessage): GoHttp.Verdict =>
  request.httpVersionMajor === 0 && request.rawHeaders.length === 0
    ? GoHttp.badRequest
    : GoHttp.verdict(
      request.method ?? "",
      request.url ?? "",
      request.httpVersionMajor,
      request.httpVersionMinor,
      request.rawHeaders
    )

/**
 * Answers a request the reference kernel refuses before its route, as Go
 * does — `true` when it did: a connection error as `conn.serve` writes it (no
 * `Date`, no length: the body runs to the close, and the connection closes),
 * or an empty answer with `Content-Length: 0` (chi's `405` for a method it
 * does not route, the `200` of `OPTIONS *`).
 */
const refused = (request: Http.IncomingMessage, response: Http.ServerResponse): boolean => {
  const verdict = requestVerdict(request)
  if (verdict._tag === "Route") return false
  writeVerdict(response, verdict)
  return true
}

const writeVerdict = (response: Http.ServerResponse, verdict: GoHttp.Refusal): void => {
  if (verdict._tag === "Fatal") {
    response.sendDate = false
    response.useChunkedEncodingByDefault = false
    response.writeHead(verdict.status, verdict.reason, [
      "Content-Type",
      "text/plain; charset=utf-8",
      "Connection",
      "close"
    ])
    response.end(verdict.body, "latin1")
  } else {
    response.writeHead(verdict.status, verdict.reason, ["Content-Length", "0"])
    response.end()
  }
}

/** How long a connection refused by the parser stays half-closed before it is dropped (Go waits 500 ms). */
const lingerMillis = 500

/** Connections the `clientError` listener already answered (later parse errors on them are ignored). */
const answered = new WeakSet<Net.Socket>()

/**
 * Writes `bytes` (if any) and closes the connection: a FIN after the bytes,
 * so a client still sending can read the answer, then the socket dropped
 * after {@link lingerMillis} whatever the client does.
 */
const hangUp = (socket: Net.Socket, bytes?: string): void => {
  answered.add(socket)
  if (!socket.writable) {
    socket.destroy()
    return
  }
  if (bytes === undefined) socket.end()
  else socket.end(bytes, "latin1")
  setTimeout(() => socket.destroy(), lingerMillis).unref()
}

/** A response of Node's server, as the socket holds it (`_httpMessage`) while it is being answered. */
type InFlight = Http.ServerResponse & { readonly req?: Http.IncomingMessage }

const inFlightOf = (socket: Net.Socket): InFlight | undefined =>
  (socket as Net.Socket & { _httpMessage?: InFlight | null })._httpMessage ?? undefined

/**
 * Runs `then` once the answers of the requests already read on `socket` are
 * written — Node attaches each queued answer to the socket in turn when the
 * one before it finishes — or never, if the connection closes first. When one
 * of them ends the connection (its request said `Connection: close`, or
 * HTTP/1.0), runs `last` instead: nothing after it was to be read.
 */
const afterInFlight = (socket: Net.Socket, then: () => void, last: () => void): void => {
  const current = inFlightOf(socket)
  if (current === undefined) return then()
  const ends = endsConnection(current.req)
  if (current.writableFinished) return ends ? last() : then()
  current.once("finish", () => (ends ? last() : afterInFlight(socket, then, last)))
}

/** Whether the client asked for the connection to end after this request (`Connection: close`, or HTTP/1.0 without keep-alive). */
const endsConnection = (request: Http.IncomingMessage | undefined): boolean => {
  if (request === undefined) return false
  const connection = (request.headers.connection ?? "").toLowerCase()
  if (/(^|[\s,])close($|[\s,])/.test(connection)) return true
  return request.httpVersionMajor === 1 && request.httpVersionMinor === 0 && !connection.includes("keep-alive")
}

/**
 * Node's `clientError` (its parser refused the bytes of a request): answers
 * as Go would have answered the head received (`internal/goHttp`), then
 * closes the connection. Requests read before it on the connection
 * (pipelined) are answered first, as Go answers them in order. A request
 * whose own body failed to parse (a framing error) gets Node's answer —
 * `400`, or nothing when its answer has begun; a reset or an unwritable
 * connection none.
 */
const onClientError = (err: Error & { code?: string; rawPacket?: Buffer }, socket: Net.Socket): void => {
  if (answered.has(socket)) return
  answered.add(socket)
  if (err.code === "ECONNRESET" || !socket.writable) {
    socket.destroy()
    return
  }
  const inFlight = inFlightOf(socket)
  if (inFlight !== undefined && inFlight.req !== undefined && !inFlight.req.complete) {
    return hangUp(socket, inFlight.headersSent ? undefined : GoHttp.rawResponse(GoHttp.badRequest))
  }
  const answer = refusalOf(err)
  afterInFlight(socket, () => hangUp(socket, answer), () => hangUp(socket))
}

/** The bytes Go answers the request Node's parser refused with. */
const refusalOf = (err: Error & { code?: string; rawPacket?: Buffer }): string => {
  switch (err.code) {
    case "HPE_HEADER_OVERFLOW":
      return GoHttp.rawResponse(GoHttp.headerTooLarge)
    case "ERR_HTTP_REQUEST_TIMEOUT":
      // Node's own answer (the reference kernel sets no read timeout).
      return "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n"
  }
  const verdict = err.rawPacket === undefined ? undefined : GoHttp.verdictOfHeads(err.rawPacket)
  // Go would serve it (Node's parser is stricter: obs-fold, bare LF, `Content-Length` with
  // `Transfer-Encoding`…) or no whole head arrived: Go's plain 400.
  return GoHttp.rawResponse(verdict === undefined || verdict._tag === "Route" ? GoHttp.badRequest : verdict)
}

/**
 * An `Expect` other than `100-continue`: Go's `417` with `Connection: close`
 * (after its request checks; chi's `405` comes later, so the `417` wins).
 */
const onExpectation = (request: Http.IncomingMessage, response: Http.ServerResponse): void => {
  const verdict = requestVerdict(request)
  if (verdict._tag === "Fatal") return writeVerdict(response, verdict)
  response.writeHead(417, ["Connection", "close", "Content-Length", "0"])
  response.end()
}

/**
 * `CONNECT`, which Node hands over with the raw connection: answered as the
 * reference kernel does — its checks, then its routes (chi routes `CONNECT`
 * like any method: `405` on a known path, `404` elsewhere) — and the
 * connection closed.
 */
const onConnect = (handlers: Routes.Handlers) => (request: Http.IncomingMessage, socket: Net.Socket): void => {
  socket.on("error", () => socket.destroy())
  const verdict = requestVerdict(request)
  if (verdict._tag !== "Route") return hangUp(socket, GoHttp.rawResponse(verdict))
  const raw = request.rawHeaders
  Effect.runFork(
    handlers.handle({
      method: "CONNECT",
      url: request.url ?? "",
      headers: (name) => rawValues(raw, name.toLowerCase()),
      body: new Uint8Array(0)
    }).pipe(Effect.map((response) => {
      const body = typeof response.body === "string"
        ? Buffer.from(response.body, "utf8")
        : response.body instanceof Uint8Array
        ? Buffer.from(response.body)
        : Buffer.alloc(0)
      let head = `HTTP/1.1 ${response.status} ${Http.STATUS_CODES[response.status] ?? ""}\r\n`
      for (const name in response.headers) head += `${name}: ${response.headers[name]}\r\n`
      head += `Date: ${new Date().toUTCString()}\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`
      hangUp(socket, head + body.toString("latin1"))
    }))
  )
}

/**
 * Serves the kernel on `host:port` with Node's HTTP server — on the loopback
 * interface unless `host` says otherwise. The layer also
 * provides `HttpServer` so callers can read the bound address. Closing it
 * drops open connections first (SSE streams never end by themselves, and the
 * server's graceful shutdown would wait for them), then stops listening.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options): Layer.Layer<HttpServer.HttpServer, HttpServerError.ServeError> =>
  Layer.unwrap(Effect.sync(() => {
    // Request heads up to 1 MiB, as Go's `http.DefaultMaxHeaderBytes` (Node's default is 16 KiB).
    // The reference kernel's missing-Host answer is its own (`requestVerdict`), not Node's.
    const server = Http.createServer({ maxHeaderSize: maxHeaderBytes, requireHostHeader: false })
    const handlers = Routes.makeHandlers(options.core, { apiToken: options.apiToken })
    // Requests Node's parser refuses, `CONNECT` and unknown expectations: answered as Go does.
    server.on("clientError", onClientError)
    server.on("connect", onConnect(handlers))
    server.on("checkExpectation", onExpectation)
    // Built last, so released first: before `serve` stops and the server closes.
    const closeConnections = Layer.effectDiscard(
      Effect.addFinalizer(() => Effect.sync(() => server.closeAllConnections()))
    )
    return closeConnections.pipe(
      Layer.provideMerge(installSyncPath(server, handlers)),
      Layer.provideMerge(HttpServer.serve(httpEffectOf(handlers.handle))),
      Layer.provideMerge(
        NodeHttpServer.layerServer(() => server, {
          port: options.port,
          ...(options.host === undefined ? { host: defaultHost } : options.host !== "" ? { host: options.host } : {})
        })
      )
    )
  }))
