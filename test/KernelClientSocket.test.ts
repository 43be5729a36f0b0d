/**
 * What `KernelClient.layerSocket` does itself, having no HTTP library under
 * it (the behaviour it shares with the undici transport is tested side by side
 * in `KernelClientTransports.test.ts`): keep-alive reuse and when it stops,
 * the pool's bound, the framings of an answer (content-length, chunked,
 * close-delimited, HTTP/1.0, interim 1xx, answers cut at every byte), malformed
 * answers as typed transport errors, header injection refused before anything
 * is sent, idle connections not keeping the process alive, the pool closed
 * with its layer, and `https:` base URLs over TLS.
 *
 * The servers here are raw `node:net` servers, so that each test decides
 * every byte of the answer.
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, Context, Effect, Exit, Fiber, Layer, Option, Redacted, Scope } from "effect"
import { execFileSync } from "node:child_process"
import * as Fs from "node:fs"
import * as Https from "node:https"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Tls from "node:tls"
import * as KernelClient from "../src/KernelClient.js"
import { KernelError } from "../src/RebunoError.js"
import { pause, waitUntil } from "./support/realTime.js"
import { caller, EXEC, EXECUTION_WIRE, SECRET, STEP } from "./support/kernelClientFixtures.js"

// ---------------------------------------------------------------------------
// A raw server
// ---------------------------------------------------------------------------

interface RawRequest {
  readonly head: string
  readonly body: string
  /** Which connection (0, 1, …) it arrived on. */
  readonly connection: number
}

/** Answer one request: write bytes (or not) on the socket. */
type Answer = (socket: Net.Socket, request: RawRequest, index: number) => void

interface RawServer {
  url: string
  readonly requests: Array<RawRequest>
  /** Connections accepted so far. */
  readonly connections: () => number
  /** Connections open now. */
  readonly open: () => number
  /** The most connections open at once. */
  readonly peak: () => number
  /** Every received byte, in order, per connection. */
  readonly raw: Array<string>
  answer: Answer
}

/**
 * A `node:net` server on 127.0.0.1 that reads requests (head, then a
 * `content-length` body) and lets `answer` write the reply. It and its
 * sockets are `unref`'d, so that they never keep the process alive.
 */
const rawServer = (answer: Answer): Effect.Effect<RawServer, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.callback<{ readonly test: RawServer; readonly server: Net.Server; readonly sockets: Set<Net.Socket> }>(
      (resume) => {
        const sockets = new Set<Net.Socket>()
        let accepted = 0
        let peak = 0
        const test: RawServer = {
          url: "",
          requests: [],
          connections: () => accepted,
          open: () => sockets.size,
          peak: () => peak,
          raw: [],
          answer
        }
        const server = Net.createServer((socket) => {
          const connection = accepted++
          sockets.add(socket)
          peak = Math.max(peak, sockets.size)
          socket.unref()
          socket.on("close", () => sockets.delete(socket))
          socket.on("error", () => {})
          test.raw[connection] = ""
          let pending = Buffer.alloc(0)
          socket.on("data", (data: Buffer) => {
            test.raw[connection] += data.toString("latin1")
            pending = Buffer.concat([pending, data])
            for (;;) {
              const end = pending.indexOf("\r\n\r\n")
              if (end < 0) return
              const head = pending.toString("latin1", 0, end)
              const length = Number(/\r\ncontent-length: (\d+)/i.exec(head)?.[1] ?? "0")
              if (pending.length < end + 4 + length) return
              const request = { head, body: pending.toString("utf8", end + 4, end + 4 + length), connection }
              pending = pending.subarray(end + 4 + length)
              const index = test.requests.push(request) - 1
              test.answer(socket, request, index)
            }
          })
        })
        server.unref()
        server.listen(0, "127.0.0.1", () => {
          test.url = `http://127.0.0.1:${(server.address() as Net.AddressInfo).port}`
          resume(Effect.succeed({ test, server, sockets }))
        })
      }
    ),
    ({ server, sockets }) =>
      Effect.callback<void>((resume) => {
        for (const socket of sockets) socket.destroy()
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map(({ test }) => test))

const json = (body: unknown, extra = "") => {
  const text = JSON.stringify(body)
  return `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\n${extra}\r\n${text}`
}
const PROCEED = { decision: "proceed", step_id: STEP }
const proceed: Answer = (socket) => void socket.write(json(PROCEED))

const client = (url: string, options: Partial<KernelClient.SocketOptions> = {}) =>
  Effect.map(
    Layer.build(KernelClient.layerSocket({ baseUrl: url, secret: Redacted.make(SECRET), stage: "seed", ...options })),
    (context) => Context.get(context, KernelClient.KernelClient)
  )

const submission: KernelClient.StepSubmission = {
  kind: "tool_call",
  target: "web_search",
  argsJson: "{\"query\":\"hello\"}",
  idempotency: "safe_to_retry"
}
const submit = (c: KernelClient.KernelClient.Service) => c.submitStep(caller, EXEC, submission)

const failureOf = <A, E>(exit: Exit.Exit<A, E>): E => {
  if (Exit.isSuccess(exit)) throw new Error(`expected a failure, got ${JSON.stringify(exit.value)}`)
  const failure = Cause.findErrorOption(exit.cause)
  if (Option.isNone(failure)) throw new Error(`expected a Fail cause, got ${Cause.pretty(exit.cause)}`)
  return failure.value
}

/** The transport error's description of a failed call. */
const transportFailure = <A, E>(exit: Exit.Exit<A, E>): string => {
  const error = failureOf(exit)
  if (!(error instanceof KernelError)) throw new Error(`expected a KernelError, got ${String(error)}`)
  expect(error.reason._tag).toBe("TransportError")
  return error.reason.description
}


// ---------------------------------------------------------------------------
// Connections
// ---------------------------------------------------------------------------

describe("KernelClient.layerSocket: connections", () => {
  it.live("sequential calls reuse one keep-alive connection, with undici's request bytes", () =>
    Effect.gen(function*() {
      const server = yield* rawServer(proceed)
      const c = yield* client(server.url + "/base/")
      for (let i = 0; i < 20; i++) expect(yield* submit(c)).toEqual({ decision: "proceed", stepId: STEP })
      expect(server.connections()).toBe(1)
      expect(server.requests).toHaveLength(20)
      const port = new URL(server.url).port
      // Request line, host, connection, the request's headers in order, then content-length.
      expect(server.requests[0]!.head.split("\r\n")).toEqual([
        `POST /base/v0/executions/${EXEC}/steps HTTP/1.1`,
        `host: 127.0.0.1:${port}`,
        "connection: keep-alive",
        "content-type: application/json",
        "rebuno-agent-id: hello",
        expect.stringMatching(/^rebuno-signature: sha256=[0-9a-f]{64}$/),
        `rebuno-dispatch-id: ${caller.lease!.dispatchId}`,
        "rebuno-dispatch-attempt: 1",
        `content-length: ${Buffer.byteLength(server.requests[0]!.body)}`
      ])
      // A GET has no content-length; a POST without a body says 0.
      server.answer = (socket, request) =>
        void socket.write(
          request.head.startsWith("GET") ? json(EXECUTION_WIRE) : "HTTP/1.1 204 No Content\r\n\r\n"
        )
      yield* c.getExecution({ agentId: "hello" }, EXEC)
      yield* c.heartbeat(caller, EXEC)
      expect(server.requests[20]!.head).not.toContain("content-length")
      expect(server.requests[21]!.head).toContain("\r\ncontent-length: 0")
      expect(server.connections()).toBe(1)
    }))

  it.live("a host name is resolved, both address families tried: localhost reaches a server on 127.0.0.1", () =>
    Effect.gen(function*() {
      const server = yield* rawServer(proceed)
      const port = new URL(server.url).port
      const c = yield* client(`http://localhost:${port}`)
      expect(yield* submit(c)).toEqual({ decision: "proceed", stepId: STEP })
      expect(server.requests[0]!.head).toContain(`\r\nhost: localhost:${port}\r\n`)
    }))

  it.live("at most `connections` sockets; calls beyond wait their turn and all complete", () =>
    Effect.gen(function*() {
      const held: Array<Net.Socket> = []
      const server = yield* rawServer((socket) => void held.push(socket))
      const c = yield* client(server.url, { connections: 3 })
      const all = yield* Effect.forkChild(
        Effect.forEach(Array.from({ length: 12 }), () => submit(c), { concurrency: "unbounded" })
      )
      yield* waitUntil("three requests held", () => held.length === 3)
      yield* pause(50)
      expect(server.connections()).toBe(3)
      expect(server.requests).toHaveLength(3)
      // Answer whatever arrives from now on, and release the three held.
      server.answer = proceed
      for (const socket of held) socket.write(json(PROCEED))
      const results = yield* Fiber.join(all)
      expect(results).toHaveLength(12)
      expect(server.requests).toHaveLength(12)
      expect(server.connections()).toBe(3)
      expect(server.peak()).toBe(3)
    }))

  it.live("an idle connection the server closed is not used again: the next call opens a new one", () =>
    Effect.gen(function*() {
      const server = yield* rawServer((socket, _request, index) => {
        socket.write(json(PROCEED))
        // The server drops the connection 20 ms after its first answer (an idle timeout).
        if (index === 0) setTimeout(() => socket.end(), 20)
      })
      const c = yield* client(server.url)
      yield* submit(c)
      yield* pause(100)
      expect(yield* submit(c)).toEqual({ decision: "proceed", stepId: STEP })
      expect(server.connections()).toBe(2)
    }))

  it.live("the server's keep-alive: timeout=N bounds reuse (N − 1 s); without it, 4 s", () =>
    Effect.gen(function*() {
      // timeout=1: reuse for at most 0 s, so a call after any pause opens a new connection …
      const server = yield* rawServer((socket) => void socket.write(json(PROCEED, "keep-alive: timeout=1\r\n")))
      const c = yield* client(server.url)
      yield* submit(c)
      yield* pause(20)
      yield* submit(c)
      expect(server.connections()).toBe(2)
      // … without the hint, the connection is reused after the same pause.
      server.answer = proceed
      yield* submit(c)
      yield* pause(20)
      yield* submit(c)
      expect(server.connections()).toBe(3)
    }))

  it.live("`connection: close` and HTTP/1.0 answers are read, and their connection is not reused", () =>
    Effect.gen(function*() {
      const server = yield* rawServer((socket, _request, index) => {
        const text = JSON.stringify(PROCEED)
        if (index === 0) {
          socket.end(`HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: ${text.length}\r\n\r\n${text}`)
        } else if (index === 1) {
          socket.end(`HTTP/1.0 200 OK\r\ncontent-length: ${text.length}\r\n\r\n${text}`)
        } else {
          socket.write(json(PROCEED))
        }
      })
      const c = yield* client(server.url)
      for (let i = 0; i < 4; i++) expect(yield* submit(c)).toEqual({ decision: "proceed", stepId: STEP })
      expect(server.requests.map((r) => r.connection)).toEqual([0, 1, 2, 2])
    }))

  it.live("idle connections do not keep the process alive; one in use does", () =>
    Effect.gen(function*() {
      const tcpHandles = () => process.getActiveResourcesInfo().filter((name) => name === "TCPSocketWrap").length
      const before = tcpHandles()
      let hold: Net.Socket | undefined
      const server = yield* rawServer((socket, _request, index) => {
        if (index === 1) hold = socket
        else socket.write(json(PROCEED))
      })
      const c = yield* client(server.url)
      yield* submit(c)
      // Answered and idle: nothing of the client's is keeping the event loop alive.
      expect(tcpHandles()).toBe(before)
      const fiber = yield* Effect.forkChild(submit(c))
      yield* waitUntil("the second request", () => hold !== undefined)
      expect(tcpHandles()).toBe(before + 1)
      hold!.write(json(PROCEED))
      yield* Fiber.join(fiber)
      expect(tcpHandles()).toBe(before)
    }))

  it.live("when the layer's scope closes, calls in flight and waiting fail at once; later calls fail too", () =>
    Effect.gen(function*() {
      const server = yield* rawServer(() => {})
      const scope = yield* Scope.make()
      const c = yield* client(server.url, { connections: 1 }).pipe(Scope.provide(scope))
      const inFlight = yield* Effect.forkChild(Effect.exit(submit(c)))
      const waiting = yield* Effect.forkChild(Effect.exit(submit(c)))
      yield* waitUntil("the first request", () => server.requests.length === 1)
      yield* Scope.close(scope, Exit.void)
      expect(transportFailure(yield* Fiber.join(inFlight))).toMatch(/^request failed/)
      expect(transportFailure(yield* Fiber.join(waiting))).toBe("request failed: the kernel client is closed")
      expect(transportFailure(yield* Effect.exit(c.heartbeat(caller, EXEC))))
        .toBe("request failed: the kernel client is closed")
      yield* waitUntil("the connection closed", () => server.open() === 0)
    }))
})

// ---------------------------------------------------------------------------
// Answers, framed every way HTTP/1.1 allows
// ---------------------------------------------------------------------------

describe("KernelClient.layerSocket: reading answers", () => {
  const text = JSON.stringify({ ...EXECUTION_WIRE, input: { text: "héllo 日本語 🎉 ".repeat(2_000) } })
  const bytes = Buffer.from(text)

  /** Chunked: chunks of these sizes, an extension on one size line, a trailer. */
  const chunked = (sizes: ReadonlyArray<number>): Buffer => {
    const parts: Array<Buffer> = [Buffer.from("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")]
    let at = 0
    let i = 0
    while (at < bytes.length) {
      const size = Math.min(sizes[i++ % sizes.length]!, bytes.length - at)
      parts.push(Buffer.from(size.toString(16) + (i === 2 ? ";ext=1" : "") + "\r\n"))
      parts.push(bytes.subarray(at, at + size), Buffer.from("\r\n"))
      at += size
    }
    parts.push(Buffer.from("0\r\nx-trailer: yes\r\n\r\n"))
    return Buffer.concat(parts)
  }

  /** Write `data` in pieces of `size` bytes, each in its own turn of the event loop. */
  const dribble = (socket: Net.Socket, data: Buffer, size: number, end = false) => {
    let at = 0
    const next = (): void => {
      if (at >= data.length) {
        if (end) socket.end()
        return
      }
      socket.write(data.subarray(at, at + size))
      at += size
      setImmediate(next)
    }
    next()
  }

  it.live.each([
    ["content-length, in one write", (socket: Net.Socket): void => void socket.write(json(JSON.parse(text)))],
    ["chunked, chunks of 1, 7, 1000 and 16384 bytes", (socket: Net.Socket): void => void socket.write(chunked([1, 7, 1000, 16_384]))],
    ["chunked, written 3 bytes at a time", (socket: Net.Socket): void => dribble(socket, chunked([5_000]), 3)],
    [
      "content-length, written 1 byte at a time",
      (socket: Net.Socket): void => dribble(socket, Buffer.from(json(JSON.parse(text)), "utf8"), 1)
    ],
    [
      "no length: the body ends when the server closes",
      (socket: Net.Socket): void => dribble(socket, Buffer.concat([Buffer.from("HTTP/1.1 200 OK\r\n\r\n"), bytes]), 4096, true)
    ],
    [
      "interim 100 and 103 answers first",
      (socket: Net.Socket): void =>
        void socket.write("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + json(JSON.parse(text)))
    ]
  ] as const)("%s: the answer decodes intact", ([, write]) =>
    Effect.gen(function*() {
      const server = yield* rawServer((socket) => write(socket))
      const c = yield* client(server.url)
      const execution = yield* c.getExecution({ agentId: "hello" }, EXEC)
      expect(execution.input).toEqual(JSON.parse(text).input)
    }))

  it.live("error statuses keep their body for the error envelope", () =>
    Effect.gen(function*() {
      const envelope = JSON.stringify({ code: "policy_denied", message: "no", rule_id: "r9" })
      const server = yield* rawServer((socket) =>
        void socket.write(
          `HTTP/1.1 403 Forbidden\r\ntransfer-encoding: chunked\r\n\r\n${envelope.length.toString(16)}\r\n${envelope}\r\n0\r\n\r\n`
        )
      )
      const c = yield* client(server.url)
      const error = failureOf(yield* Effect.exit(submit(c)))
      expect(error).toMatchObject({ _tag: "PolicyError", ruleId: "r9" })
      // The connection stays usable after a complete error answer.
      server.answer = proceed
      expect(yield* submit(c)).toEqual({ decision: "proceed", stepId: STEP })
      expect(server.connections()).toBe(1)
    }))

  it.live.each([
    ["not HTTP at all", "SSH-2.0-OpenSSH\r\n\r\n", "reading the response failed: invalid status line"],
    [
      "a bad content-length",
      "HTTP/1.1 200 OK\r\ncontent-length: 12x\r\n\r\n{}",
      "reading the response failed: invalid content-length"
    ],
    [
      "two content-lengths that disagree",
      "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}",
      "reading the response failed: conflicting content-length"
    ],
    [
      "a bad chunk size",
      "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
      "reading the response failed: invalid chunk size"
    ],
    ["a header line without a colon", "HTTP/1.1 200 OK\r\nbroken\r\n\r\n", "reading the response failed: invalid header line"],
    ["a protocol switch", "HTTP/1.1 101 Switching Protocols\r\n\r\n", "reading the response failed: unexpected protocol switch"],
    [
      "a head larger than 64 KiB",
      "HTTP/1.1 200 OK\r\n" + "x-filler: " + "a".repeat(70_000),
      "reading the response failed: response head too large"
    ],
    ["the connection closed mid-body", "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"dec", "reading the response failed: other side closed"],
    ["the connection closed before any answer", "", "request failed: other side closed"]
  ] as const)("%s → a typed transport error, and the next call works", ([, answer, description]) =>
    Effect.gen(function*() {
      const server = yield* rawServer((socket, _request, index) => {
        if (index > 0) return void socket.write(json(PROCEED))
        socket.write(answer)
        if (description.endsWith("other side closed")) socket.end()
      })
      const c = yield* client(server.url)
      expect(transportFailure(yield* Effect.exit(submit(c)))).toBe(description)
      expect(yield* submit(c)).toEqual({ decision: "proceed", stepId: STEP })
    }))

  it.live("bytes after a complete answer: the answer is used, the connection is not", () =>
    Effect.gen(function*() {
      const server = yield* rawServer((socket) => void socket.write(json(PROCEED) + "HTTP/1.1 200 OK\r\n"))
      const c = yield* client(server.url)
      yield* submit(c)
      yield* submit(c)
      expect(server.connections()).toBe(2)
    }))
})

// ---------------------------------------------------------------------------
// Requests that must not be sent
// ---------------------------------------------------------------------------

describe("KernelClient.layerSocket: refused requests", () => {
  it.live("an agent id with CR/LF is refused before anything is written (no header injection)", () =>
    Effect.gen(function*() {
      const server = yield* rawServer(proceed)
      const c = yield* client(server.url)
      const exit = yield* Effect.exit(
        c.submitStep({ ...caller, agentId: "hello\r\nx-injected: 1" }, EXEC, submission)
      )
      expect(transportFailure(exit)).toBe("request failed: invalid rebuno-agent-id header")
      yield* pause(20)
      expect(server.raw.join("")).toBe("")
    }))
})

// ---------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------

/** A self-signed certificate for localhost and 127.0.0.1, made with the openssl CLI (undefined without it). */
const selfSigned = (): { readonly key: string; readonly cert: string } | undefined => {
  const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "rebuno-tls-"))
  try {
    execFileSync("openssl", [
      "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
      "-keyout", Path.join(dir, "key.pem"), "-out", Path.join(dir, "cert.pem"), "-days", "1",
      "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"
    ], { stdio: "ignore" })
    return {
      key: Fs.readFileSync(Path.join(dir, "key.pem"), "utf8"),
      cert: Fs.readFileSync(Path.join(dir, "cert.pem"), "utf8")
    }
  } catch {
    return undefined
  } finally {
    Fs.rmSync(dir, { recursive: true, force: true })
  }
}

const tlsMaterial = selfSigned()

describe.skipIf(tlsMaterial === undefined)("KernelClient.layerSocket: https", () => {
  const httpsServer = (names: Array<string | undefined>) =>
    Effect.acquireRelease(
      Effect.callback<Https.Server>((resume) => {
        const server = Https.createServer({ ...tlsMaterial! }, (req, res) => {
          names.push((req.socket as Tls.TLSSocket).servername || undefined)
          req.resume()
          req.on("end", () => {
            const text = JSON.stringify(PROCEED)
            res.writeHead(200, { "content-type": "application/json", "content-length": text.length }).end(text)
          })
        })
        server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
      }),
      (server) =>
        Effect.callback<void>((resume) => {
          server.closeAllConnections()
          server.close(() => resume(Effect.void))
        })
    ).pipe(Effect.map((server) => (server.address() as Net.AddressInfo).port))

  it.live("an untrusted certificate is a transport error", () =>
    Effect.gen(function*() {
      const port = yield* httpsServer([])
      const c = yield* client(`https://localhost:${port}`)
      expect(transportFailure(yield* Effect.exit(submit(c)))).toMatch(/^request failed: .*self[- ]signed/i)
    }))

  it.live("a trusted certificate: calls go through over TLS, with SNI for a host name and none for an IP", () =>
    Effect.gen(function*() {
      const defaults = Tls.getCACertificates("default")
      yield* Effect.acquireRelease(
        Effect.sync(() => Tls.setDefaultCACertificates([...defaults, tlsMaterial!.cert])),
        () => Effect.sync(() => Tls.setDefaultCACertificates(defaults))
      )
      const names: Array<string | undefined> = []
      const port = yield* httpsServer(names)
      for (const host of ["localhost", "127.0.0.1"]) {
        const c = yield* client(`https://${host}:${port}`)
        expect(yield* submit(c)).toEqual({ decision: "proceed", stepId: STEP })
        expect(yield* submit(c)).toEqual({ decision: "proceed", stepId: STEP })
      }
      expect(names).toEqual(["localhost", "localhost", undefined, undefined])
    }))
})


