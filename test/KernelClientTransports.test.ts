/**
 * The transports of `KernelClient` that drive their own connections — undici
 * (`makeUndici`, `layerUndici`, `layerUndiciConfig`) and Node's sockets
 * (`makeSocket`, `layerSocket`, `layerSocketConfig`) — over real loopback
 * HTTP, side by side: a `node:http` server started by each test records what
 * arrives on the wire and answers from a script.
 *
 * - wire equality with the `HttpClient` transport (`layer` on
 *   `NodeHttpClient.layerUndici`): same method, path (with a base-URL prefix),
 *   body bytes and `rebuno-*` / content headers, valid signatures;
 * - answers: decisions, 204, the error envelopes of PROTOCOL.md 13.3, redirects
 *   not followed, undecodable bodies;
 * - transport failures (refused, socket destroyed), retries of the outcome
 *   calls only (never submit), timeouts on the live clock and under
 *   `TestClock`, interruption aborting the request;
 * - `layerUndiciConfig`, `layerSocketConfig` and the environment;
 * - what only the socket transport does itself (it has no HTTP library under
 *   it): keep-alive reuse and its limits, the pool's bound, chunked and
 *   close-delimited bodies, answers cut at every byte, malformed answers,
 *   header injection refused, the pool closed with its layer.
 */
import { NodeHttpClient } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Cause, Config, ConfigProvider, Context, Effect, Exit, Fiber, Layer, Option, Redacted, type Scope } from "effect"
import { TestClock } from "effect/testing"
import * as Http from "node:http"
import * as Net from "node:net"
import * as Client from "../src/Client.js"
import * as KernelClient from "../src/KernelClient.js"
import { KernelError, LeaseSuperseded, PolicyError, Terminated } from "../src/RebunoError.js"
import {
  caller,
  DISPATCH,
  EMPTY_SIGNATURE,
  EXEC,
  EXECUTION_WIRE,
  SECRET,
  STEP,
  SUBMIT_SIGNATURE
} from "./support/kernelClientFixtures.js"
import { pause, waitUntil } from "./support/realTime.js"
import * as Signature from "../src/Signature.js"

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

const submission: KernelClient.StepSubmission = {
  kind: "tool_call",
  target: "web_search",
  argsJson: "{\"query\":\"hello\"}",
  idempotency: "safe_to_retry"
}
const SUBMIT_BODY =
  "{\"kind\":\"tool_call\",\"target\":\"web_search\",\"args\":{\"query\":\"hello\"},\"idempotency\":\"safe_to_retry\"}"
const EXECUTION = EXECUTION_WIRE

// ---------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------

interface Received {
  readonly method: string
  /** The request target exactly as on the request line. */
  readonly path: string
  readonly headers: Http.IncomingHttpHeaders
  readonly body: Buffer
  /** Wall time (ms) the whole request had arrived. */
  readonly at: number
}

type Handler = (request: Received, index: number, res: Http.ServerResponse) => void

interface TestServer {
  /** `http://127.0.0.1:PORT` (no trailing slash). */
  readonly url: string
  readonly received: Array<Received>
  /** Indexes of requests whose connection closed before their answer was written. */
  readonly aborted: Array<number>
  /** Replace the script (the next requests are answered by it). */
  setHandler(handler: Handler): void
  /** Forget the recorded requests. */
  reset(): void
}

/** A `node:http` server on 127.0.0.1 and an ephemeral port, closed (all connections dropped) with the scope. */
const startServer = (initial: Handler): Effect.Effect<TestServer, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.callback<{ readonly test: TestServer; readonly server: Http.Server }>((resume) => {
      let handler = initial
      const received: Array<Received> = []
      const aborted: Array<number> = []
      const server = Http.createServer((req, res) => {
        const chunks: Array<Buffer> = []
        req.on("data", (chunk: Buffer) => chunks.push(chunk))
        req.on("end", () => {
          const request: Received = {
            method: req.method ?? "",
            path: req.url ?? "",
            headers: req.headers,
            body: Buffer.concat(chunks),
            at: Date.now()
          }
          const index = received.push(request) - 1
          res.on("close", () => {
            if (!res.writableEnded) aborted.push(index)
          })
          handler(request, index, res)
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const port = (server.address() as Net.AddressInfo).port
        resume(Effect.succeed({
          server,
          test: {
            url: `http://127.0.0.1:${port}`,
            received,
            aborted,
            setHandler: (next) => {
              handler = next
            },
            reset: () => {
              received.length = 0
              aborted.length = 0
            }
          }
        }))
      })
    }),
    ({ server }) =>
      Effect.callback<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map(({ test }) => test))

const sendJson = (res: Http.ServerResponse, status: number, body: unknown) => {
  const text = JSON.stringify(body) + "\n"
  res.writeHead(status, { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(text) })
  res.end(text)
}
const sendEnvelope = (
  res: Http.ServerResponse,
  status: number,
  code: string,
  message: string,
  extra: Record<string, unknown> = {}
) => sendJson(res, status, { code, message, ...extra })
const sendText = (res: Http.ServerResponse, status: number, text: string) => {
  res.writeHead(status, { "content-type": "text/plain; charset=utf-8", "content-length": Buffer.byteLength(text) })
  res.end(text)
}
const noContent = (res: Http.ServerResponse) => {
  res.writeHead(204)
  res.end()
}
/** Drop the connection without any answer. */
const destroy = (res: Http.ServerResponse) => {
  res.socket?.destroy()
}
/** Leave the request unanswered. */
const never: Handler = () => {}

/** A port nothing listens on (bound once, then released). */
const freePort = Effect.callback<number>((resume) => {
  const probe = Net.createServer()
  probe.listen(0, "127.0.0.1", () => {
    const port = (probe.address() as Net.AddressInfo).port
    probe.close(() => resume(Effect.succeed(port)))
  })
})




// ---------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------

/** The transports that drive their own connections, tested here side by side. */
const DIRECT = ["undici", "socket"] as const
type Direct = typeof DIRECT[number]
type Transport = Direct | "httpClient"

const clientLayer = (
  transport: Transport,
  options: KernelClient.UndiciOptions
): Layer.Layer<KernelClient.KernelClient, Config.ConfigError> =>
  transport === "undici"
    ? KernelClient.layerUndici(options)
    : transport === "socket"
    ? KernelClient.layerSocket(options)
    : KernelClient.layer(options).pipe(Layer.provide(NodeHttpClient.layerUndici))

/** Build a client whose resources (its undici Agent, its sockets) live as long as the test's scope. */
const buildClient = (
  transport: Transport,
  options: Partial<KernelClient.UndiciOptions> & { readonly baseUrl: string }
) =>
  Effect.map(
    // Pinned to the seed stage (`sha256=` signatures) unless a test says otherwise.
    Layer.build(clientLayer(transport, { secret: Redacted.make(SECRET), stage: "seed", ...options })),
    (context) => Context.get(context, KernelClient.KernelClient)
  )

const direct = (transport: Direct, server: TestServer, options: Partial<KernelClient.UndiciOptions> = {}) =>
  buildClient(transport, { baseUrl: server.url, ...options })

const failureOf = <A, E>(exit: Exit.Exit<A, E>): E => {
  if (Exit.isSuccess(exit)) throw new Error(`expected a failure, got ${JSON.stringify(exit.value)}`)
  const failure = Cause.findErrorOption(exit.cause)
  if (Option.isNone(failure)) throw new Error(`expected a Fail cause, got ${Cause.pretty(exit.cause)}`)
  return failure.value
}

/** The headers both transports must agree on. */
const WIRE_HEADERS = [
  "content-type",
  "content-length",
  "transfer-encoding",
  "rebuno-agent-id",
  "rebuno-signature",
  "rebuno-timestamp",
  "rebuno-dispatch-id",
  "rebuno-dispatch-attempt"
]
const wireHeaders = (headers: Http.IncomingHttpHeaders) => {
  const out: Record<string, string> = {}
  for (const name of WIRE_HEADERS) {
    const value = headers[name]
    if (value !== undefined) out[name] = Array.isArray(value) ? value.join(", ") : value
  }
  for (const name of Object.keys(headers)) {
    if (name.startsWith("rebuno-") && !WIRE_HEADERS.includes(name)) out[name] = String(headers[name])
  }
  return out
}
const wireView = (r: Received) => ({
  method: r.method,
  path: r.path,
  body: r.body.toString("base64"),
  headers: wireHeaders(r.headers)
})

/** The kernel-like script of the wire test: every route answered as a kernel would. */
const kernelLike: Handler = (request, _index, res) => {
  const path = request.path
  if (request.method === "GET") return sendJson(res, 200, EXECUTION)
  if (path.endsWith("/steps")) return sendJson(res, 200, { decision: "proceed", step_id: STEP })
  if (path.includes("/steps/") && path.endsWith("/complete")) return sendJson(res, 200, { decision: "recorded" })
  if (path.includes("/steps/") && path.endsWith("/fail")) return sendJson(res, 200, { decision: "recorded" })
  if (path.endsWith("/stream")) return sendJson(res, 202, {})
  return noContent(res)
}

/** Every call of the service, once. */
const everyCall = (client: KernelClient.KernelClient.Service) =>
  Effect.gen(function*() {
    const execution = yield* client.getExecution({ agentId: "hello" }, EXEC)
    const submitted = yield* client.submitStep(caller, EXEC, submission)
    const completed = yield* client.completeStep(caller, EXEC, STEP, "{\"hits\":3}")
    const failed = yield* client.failStep(caller, EXEC, STEP, "boom \"quoted\" <tag> é")
    const failedJson = yield* client.failStepJson(caller, EXEC, STEP, "{\"message\":\"typed\",\"kind\":\"x\"}")
    yield* client.publishDelta(caller, EXEC, STEP, 3, "partial\ntext")
    yield* client.heartbeat({ agentId: "hello", lease: { dispatchId: DISPATCH, attempt: 12 } }, EXEC)
    yield* client.heartbeat({ agentId: "hello", lease: { dispatchId: DISPATCH, attempt: undefined } }, EXEC)
    yield* client.completeExecution(caller, EXEC, undefined)
    yield* client.completeExecution(caller, EXEC, "{\"answer\":42}")
    yield* client.failExecution(caller, EXEC, "handler crashed")
    return { execution, submitted, completed, failed, failedJson }
  })

const EXPECTED_CALLS: ReadonlyArray<readonly [method: string, route: string, body: string]> = [
  ["GET", `/v0/executions/${EXEC}`, ""],
  ["POST", `/v0/executions/${EXEC}/steps`, SUBMIT_BODY],
  ["POST", `/v0/executions/${EXEC}/steps/${STEP}/complete`, "{\"result\":{\"hits\":3}}"],
  ["POST", `/v0/executions/${EXEC}/steps/${STEP}/fail`, "{\"error\":{\"message\":\"boom \\\"quoted\\\" <tag> é\"}}"],
  ["POST", `/v0/executions/${EXEC}/steps/${STEP}/fail`, "{\"error\":{\"message\":\"typed\",\"kind\":\"x\"}}"],
  ["POST", `/v0/executions/${EXEC}/steps/${STEP}/stream`, "{\"seq\":3,\"data\":\"partial\\ntext\"}"],
  ["POST", `/v0/executions/${EXEC}/heartbeat`, ""],
  ["POST", `/v0/executions/${EXEC}/heartbeat`, ""],
  ["POST", `/v0/executions/${EXEC}/complete`, "{}"],
  ["POST", `/v0/executions/${EXEC}/complete`, "{\"output\":{\"answer\":42}}"],
  ["POST", `/v0/executions/${EXEC}/fail`, "{\"error\":\"handler crashed\"}"]
]

// ---------------------------------------------------------------------------
// Wire equality
// ---------------------------------------------------------------------------

describe.each(DIRECT)("KernelClient %s transport", (transport) => {
  describe("the wire", () => {
    it.live("every call sends the same bytes and headers as the HttpClient transport", () =>
      Effect.gen(function*() {
        const server = yield* startServer(kernelLike)
        const baseUrl = `${server.url}/prefix/`

        const viaHttpClient = yield* buildClient("httpClient", { baseUrl })
        const httpResults = yield* everyCall(viaHttpClient)
        const httpRequests = [...server.received]
        server.reset()

        const viaDirect = yield* buildClient(transport, { baseUrl })
        const undiciResults = yield* everyCall(viaDirect)
        const undiciRequests = [...server.received]

        // What this transport sent, in absolute terms.
        expect(undiciRequests.map((r) => [r.method, r.path, r.body.toString("utf8")])).toEqual(
          EXPECTED_CALLS.map(([method, route, body]) => [method, "/prefix" + route, body])
        )
        // … and exactly what the HttpClient transport sent.
        expect(undiciRequests.map(wireView)).toEqual(httpRequests.map(wireView))

        // Same answers decoded.
        expect(undiciResults).toEqual(httpResults)
        expect(undiciResults.submitted).toEqual({ decision: "proceed", stepId: STEP })
        expect(undiciResults.completed).toEqual({ decision: "recorded" })
        expect(undiciResults.execution).toMatchObject({ id: EXEC, agentId: "hello", input: { query: "hi" } })

        // Headers of individual calls.
        const [get, submit, , , , , beat12, beatUnknown] = undiciRequests
        expect(wireHeaders(get!.headers)).toEqual({
          "content-type": "application/json",
          "rebuno-agent-id": "hello",
          "rebuno-signature": EMPTY_SIGNATURE
        })
        expect(wireHeaders(submit!.headers)).toEqual({
          "content-type": "application/json",
          "content-length": String(Buffer.byteLength(SUBMIT_BODY)),
          "rebuno-agent-id": "hello",
          "rebuno-signature": SUBMIT_SIGNATURE,
          "rebuno-dispatch-id": DISPATCH,
          "rebuno-dispatch-attempt": "1"
        })
        expect(beat12!.headers["rebuno-dispatch-attempt"]).toBe("12")
        expect(beat12!.headers["rebuno-signature"]).toBe(EMPTY_SIGNATURE)
        expect(beat12!.headers["content-length"]).toBe("0")
        expect("rebuno-dispatch-attempt" in beatUnknown!.headers).toBe(false)
        expect(beatUnknown!.headers["rebuno-dispatch-id"]).toBe(DISPATCH)

        // Every signature verifies against the body bytes with the agent secret (and not another one).
        for (const request of [...undiciRequests, ...httpRequests]) {
          const header = request.headers["rebuno-signature"] as string
          expect(yield* Signature.verify(SECRET, request.body, header)).toBe(true)
          expect(yield* Signature.verify("other-secret", request.body, header)).toBe(false)
        }
      }))

    it.live("ids that are not UUIDs are percent-encoded, the same way by both transports", () =>
      Effect.gen(function*() {
        const server = yield* startServer((_request, _index, res) => noContent(res))
        const baseUrl = `${server.url}/p`
        const paths: Record<Transport, Array<string>> = { undici: [], socket: [], httpClient: [] }
        for (const each of [transport, "httpClient"] as const) {
          server.reset()
          const client = yield* buildClient(each, { baseUrl })
          for (const id of ["a b", "é", "x/../y", "q?x#y"]) {
            yield* Effect.exit(client.heartbeat(caller, id))
          }
          paths[each] = server.received.map((r) => r.path)
        }
        expect(paths[transport]).toEqual([
          "/p/v0/executions/a%20b/heartbeat",
          "/p/v0/executions/%C3%A9/heartbeat",
          "/p/v0/executions/x%2F..%2Fy/heartbeat",
          "/p/v0/executions/q%3Fx%23y/heartbeat"
        ])
        expect(paths.httpClient).toEqual(paths[transport])
      }))

    it.live("v1 signatures: same headers as the HttpClient transport, target includes the path prefix", () =>
      Effect.gen(function*() {
        const server = yield* startServer(kernelLike)
        const options = { baseUrl: `${server.url}/rebuno/api//`, signing: "v1" as const }
        const v1Lease: KernelClient.Caller = { agentId: "hello", lease: { dispatchId: DISPATCH, attempt: 3 } }
        const calls = (client: KernelClient.KernelClient.Service) =>
          Effect.gen(function*() {
            yield* client.getExecution({ agentId: "hello" }, EXEC)
            yield* client.submitStep(v1Lease, EXEC, submission)
            yield* client.heartbeat(v1Lease, EXEC)
          })
        yield* calls(yield* buildClient("httpClient", options))
        const httpRequests = [...server.received]
        server.reset()
        yield* calls(yield* buildClient(transport, options))
        const undiciRequests = [...server.received]

        expect(undiciRequests.map((r) => r.path)).toEqual([
          `/rebuno/api/v0/executions/${EXEC}`,
          `/rebuno/api/v0/executions/${EXEC}/steps`,
          `/rebuno/api/v0/executions/${EXEC}/heartbeat`
        ])
        const nowSeconds = Math.floor(Date.now() / 1000)
        for (const request of undiciRequests) {
          const signature = request.headers["rebuno-signature"] as string
          expect(signature).toMatch(/^v1=[0-9a-f]{64}$/)
          const v1Request: Signature.V1Request = {
            method: request.method,
            target: request.path,
            timestamp: request.headers["rebuno-timestamp"] as string,
            dispatchId: (request.headers["rebuno-dispatch-id"] as string | undefined) ?? "",
            dispatchAttempt: (request.headers["rebuno-dispatch-attempt"] as string | undefined) ?? "",
            body: request.body
          }
          expect(yield* Signature.verifyV1(SECRET, v1Request, signature, nowSeconds)).toBe(true)
          // The prefix is part of what is signed.
          expect(
            yield* Signature.verifyV1(SECRET, { ...v1Request, target: request.path.slice("/rebuno/api".length) }, signature, nowSeconds)
          ).toBe(false)
        }
        // Timestamps may differ by a second between the two runs; everything else is identical.
        const withoutTime = (r: Received) => {
          const view = wireView(r)
          const { "rebuno-signature": _s, "rebuno-timestamp": timestamp, ...headers } = view.headers
          expect(timestamp).toMatch(/^\d+$/)
          return { ...view, headers }
        }
        expect(undiciRequests.map(withoutTime)).toEqual(httpRequests.map(withoutTime))
      }))

    it.live("a body split into many chunks, with multi-byte characters cut between chunks, decodes intact", () =>
      Effect.gen(function*() {
        const text = "héllo 日本語 🎉 ".repeat(5_000)
        const payload = Buffer.from(JSON.stringify({ ...EXECUTION, input: { text } }))
        const server = yield* startServer((_request, _index, res) => {
          res.writeHead(200, { "content-type": "application/json" }) // chunked transfer encoding
          let offset = 0
          const pieces = [1, 7, 1000, 3, 16_384, 5]
          const next = () => {
            if (offset >= payload.length) return void res.end()
            const size = pieces[offset % pieces.length]!
            res.write(payload.subarray(offset, offset + size))
            offset += size
            if (offset % 13 === 0) setTimeout(next, 1)
            else setImmediate(next)
          }
          next()
        })
        const client = yield* direct(transport, server)
        const execution = yield* client.getExecution({ agentId: "hello" }, EXEC)
        expect(execution.input).toEqual({ text })
      }))
  })

  // ---------------------------------------------------------------------------
  // Answers
  // ---------------------------------------------------------------------------

  describe("answers", () => {
    it.live("200 decisions are decoded (proceed, replay, recorded); 204 heartbeat is success", () =>
      Effect.gen(function*() {
        const server = yield* startServer((request, _index, res) => {
          if (request.path.endsWith("/steps")) {
            return sendJson(res, 200, { decision: "replay", step_id: STEP, result: { cached: [1, 2] } })
          }
          if (request.path.endsWith("/complete")) return sendJson(res, 200, { decision: "recorded" })
          if (request.path.endsWith("/fail")) {
            return sendJson(res, 200, { decision: "replay", error: { message: "old" } })
          }
          if (request.path.endsWith("/heartbeat")) return noContent(res)
          return sendJson(res, 200, { decision: "proceed", step_id: STEP, rule_id: "r1" })
        })
        const client = yield* direct(transport, server)
        expect(yield* client.submitStep(caller, EXEC, submission)).toEqual({
          decision: "replay",
          stepId: STEP,
          result: { cached: [1, 2] }
        })
        expect(yield* client.completeStep(caller, EXEC, STEP, "1")).toEqual({ decision: "recorded" })
        expect(yield* client.failStep(caller, EXEC, STEP, "x")).toEqual({ decision: "replay", error: { message: "old" } })
        expect(yield* client.heartbeat(caller, EXEC)).toBeUndefined()
        server.setHandler((_r, _i, res) => sendJson(res, 200, { decision: "proceed", step_id: STEP, rule_id: "r1" }))
        expect(yield* client.submitStep(caller, EXEC, submission)).toEqual({ decision: "proceed", stepId: STEP, ruleId: "r1" })
        expect(server.received).toHaveLength(5)
      }))

    it.live("error envelopes map to the same errors as on the HttpClient transport", () =>
      Effect.gen(function*() {
        const answers: ReadonlyArray<(res: Http.ServerResponse) => void> = [
          (res) => sendEnvelope(res, 409, "lease_superseded", "dispatch lease superseded"),
          (res) => sendEnvelope(res, 409, "execution_terminal", "execution terminal"),
          (res) => sendEnvelope(res, 403, "policy_denied", "no emails", { rule_id: "block-email" }),
          (res) => sendEnvelope(res, 403, "policy_denied", ""),
          (res) => sendEnvelope(res, 400, "validation_error", "bad attempt"),
          (res) => sendEnvelope(res, 404, "not_found", "not found"),
          (res) => sendEnvelope(res, 418, "teapot", "short and stout"),
          (res) => sendText(res, 404, "404 page not found\n"),
          (res) => sendJson(res, 400, { message: "nope" }),
          (res) => {
            res.writeHead(405)
            res.end()
          }
        ]
        let answer = 0
        const server = yield* startServer((_request, _index, res) => answers[answer]!(res))
        const httpClient = yield* buildClient("httpClient", { baseUrl: server.url })
        const undiciClient = yield* direct(transport, server)
        const errors: Array<unknown> = []
        for (answer = 0; answer < answers.length; answer++) {
          const viaUndici = failureOf(yield* Effect.exit(undiciClient.submitStep(caller, EXEC, submission)))
          const viaHttp = failureOf(yield* Effect.exit(httpClient.submitStep(caller, EXEC, submission)))
          expect(viaUndici).toEqual(viaHttp)
          expect(Object.getPrototypeOf(viaUndici)).toBe(Object.getPrototypeOf(viaHttp))
          errors.push(viaUndici)
        }
        expect(server.received).toHaveLength(answers.length * 2)
        const [superseded, terminated, denied, deniedBare, validation, notFound, teapot, plain, codeless, empty] = errors
        expect(superseded).toBeInstanceOf(LeaseSuperseded)
        expect(terminated).toBeInstanceOf(Terminated)
        expect(denied).toBeInstanceOf(PolicyError)
        expect(denied).toMatchObject({ reason: "no emails", ruleId: "block-email" })
        expect(deniedBare).toMatchObject({ _tag: "PolicyError", reason: "denied by policy" })
        for (
          const [error, status, code, description] of [
            [validation, 400, "validation_error", "bad attempt"],
            [notFound, 404, "not_found", "not found"],
            [teapot, 418, "teapot", "short and stout"],
            [plain, 404, "internal_error", "404 page not found"],
            [codeless, 400, "internal_error", "{\"message\":\"nope\"}"],
            [empty, 405, "internal_error", "request failed"]
          ] as const
        ) {
          expect(error).toBeInstanceOf(KernelError)
          expect(error).toMatchObject({ reason: { _tag: "StatusError", status, code, description } })
          expect(KernelClient.isTransportFailure(error)).toBe(false)
        }
      }))

    it.live("lease routes: lease_superseded → LeaseSuperseded, execution_terminal on complete execution = done", () =>
      Effect.gen(function*() {
        const server = yield* startServer((request, _index, res) =>
          request.path.endsWith("/heartbeat")
            ? sendEnvelope(res, 409, "lease_superseded", "dispatch lease superseded")
            : sendEnvelope(res, 409, "execution_terminal", "execution terminal")
        )
        const client = yield* direct(transport, server)
        expect(failureOf(yield* Effect.exit(client.heartbeat(caller, EXEC)))).toBeInstanceOf(LeaseSuperseded)
        expect(yield* Effect.exit(client.completeExecution(caller, EXEC, "1"))).toEqual(Exit.void)
        expect(yield* Effect.exit(client.failExecution(caller, EXEC, "x"))).toEqual(Exit.void)
        expect(failureOf(yield* Effect.exit(client.completeStep(caller, EXEC, STEP, "1")))).toBeInstanceOf(Terminated)
        expect(server.received).toHaveLength(4)
      }))

    it.live.each([301, 302, 303, 307, 308])("a %s redirect is not followed: Status error after one request", (status) =>
      Effect.gen(function*() {
        const server = yield* startServer((request, _index, res) => {
          if (request.path === "/elsewhere") return sendJson(res, 200, { decision: "recorded" })
          res.writeHead(status, { location: "/elsewhere" })
          res.end()
        })
        const client = yield* direct(transport, server)
        const error = failureOf(yield* Effect.exit(client.completeStep(caller, EXEC, STEP, "1")))
        expect(error).toBeInstanceOf(KernelError)
        expect(error).toMatchObject({ reason: { _tag: "StatusError", status, code: "internal_error" } })
        expect(server.received.map((r) => r.path)).toEqual([`/v0/executions/${EXEC}/steps/${STEP}/complete`])
      }))

    it.live("1xx informational answers are skipped: the final answer decides", () =>
      Effect.gen(function*() {
        const server = yield* startServer((request, _index, res) => {
          if (request.path.endsWith("/complete")) res.writeEarlyHints({ link: "</x>; rel=preload" })
          else res.writeProcessing()
          setTimeout(() =>
            request.path.endsWith("/complete")
              ? sendJson(res, 200, { decision: "recorded" })
              : sendEnvelope(res, 409, "execution_terminal", "execution terminal"), 10)
        })
        const client = yield* direct(transport, server)
        expect(yield* client.completeStep(caller, EXEC, STEP, "1")).toEqual({ decision: "recorded" })
        expect(failureOf(yield* Effect.exit(client.failStep(caller, EXEC, STEP, "x")))).toBeInstanceOf(Terminated)
        expect(server.received).toHaveLength(2)
      }))

    it.live("a 200 answer that is not JSON, or has no decision, is a Decode error", () =>
      Effect.gen(function*() {
        let answer: (res: Http.ServerResponse) => void = (res) => sendText(res, 200, "<html>proxy page</html>")
        const server = yield* startServer((_request, _index, res) => answer(res))
        const client = yield* direct(transport, server)

        const notJson = failureOf(yield* Effect.exit(client.completeStep(caller, EXEC, STEP, "1")))
        expect(notJson).toBeInstanceOf(KernelError)
        expect(notJson).toMatchObject({ reason: { _tag: "DecodeError", status: 200 } })
        expect((notJson as KernelError).reason.description).toContain("not JSON")

        const execution = failureOf(yield* Effect.exit(client.getExecution({ agentId: "hello" }, EXEC)))
        expect(execution).toMatchObject({ _tag: "KernelError", reason: { _tag: "DecodeError", status: 200 } })

        answer = (res) => sendJson(res, 200, { step_id: STEP })
        const noDecision = failureOf(yield* Effect.exit(client.submitStep(caller, EXEC, submission)))
        expect(noDecision).toMatchObject({
          _tag: "KernelError",
          reason: { _tag: "DecodeError", status: 200, description: "step decision has no decision member" }
        })
        // Decode errors are not transport failures: nothing was retried.
        expect(server.received).toHaveLength(3)
      }))
  })

  // ---------------------------------------------------------------------------
  // Transport failures and retries
  // ---------------------------------------------------------------------------

  describe("transport failures", () => {
    it.live("connection refused → Transport", () =>
      Effect.gen(function*() {
        const port = yield* freePort
        const client = yield* buildClient(transport, { baseUrl: `http://127.0.0.1:${port}` })
        const error = failureOf(yield* Effect.exit(client.submitStep(caller, EXEC, submission)))
        expect(error).toBeInstanceOf(KernelError)
        expect(error).toMatchObject({ reason: { _tag: "TransportError" } })
        expect((error as KernelError).reason.description).toContain("ECONNREFUSED")
        expect(KernelClient.isTransportFailure(error)).toBe(true)
      }))

    it.live("the server dropping the connection before or in the middle of the answer → Transport", () =>
      Effect.gen(function*() {
        const server = yield* startServer((_request, index, res) => {
          if (index === 0) return destroy(res)
          // Headers and part of the body, then the connection goes away.
          res.writeHead(200, { "content-type": "application/json", "content-length": "1000" })
          res.write("{\"decision\":")
          setTimeout(() => destroy(res), 20)
        })
        const client = yield* direct(transport, server)

        const before = failureOf(yield* Effect.exit(client.submitStep(caller, EXEC, submission)))
        expect(before).toMatchObject({ _tag: "KernelError", reason: { _tag: "TransportError" } })
        expect((before as KernelError).reason.description).toMatch(/^request failed/)

        const during = failureOf(yield* Effect.exit(client.submitStep(caller, EXEC, submission)))
        expect(during).toMatchObject({ _tag: "KernelError", reason: { _tag: "TransportError" } })
        expect((during as KernelError).reason.description).toMatch(/^reading the response failed/)
        expect(KernelClient.isTransportFailure(during)).toBe(true)
        expect(server.received).toHaveLength(2)
      }))

    it.live("completeStep is retried after a dropped connection and a 503, with backoff", () =>
      Effect.gen(function*() {
        const server = yield* startServer((_request, index, res) =>
          index === 0
            ? destroy(res)
            : index === 1
            ? sendEnvelope(res, 503, "internal_error", "unavailable")
            : sendJson(res, 200, { decision: "recorded" })
        )
        const client = yield* direct(transport, server)
        expect(yield* client.completeStep(caller, EXEC, STEP, "{\"ok\":true}")).toEqual({ decision: "recorded" })
        const received = server.received
        expect(received).toHaveLength(3)
        for (const request of received) {
          expect(request.path).toBe(`/v0/executions/${EXEC}/steps/${STEP}/complete`)
          expect(request.body.toString()).toBe("{\"result\":{\"ok\":true}}")
        }
        expect(received[1]!.at - received[0]!.at).toBeGreaterThanOrEqual(90)
        expect(received[2]!.at - received[1]!.at).toBeGreaterThanOrEqual(180)
      }))

    it.live("failStep gives up after four tries with the last transport error", () =>
      Effect.gen(function*() {
        const server = yield* startServer((_request, _index, res) => destroy(res))
        const client = yield* direct(transport, server)
        const error = failureOf(yield* Effect.exit(client.failStep(caller, EXEC, STEP, "boom")))
        expect(error).toMatchObject({ _tag: "KernelError", reason: { _tag: "TransportError" } })
        expect(server.received).toHaveLength(4)
        yield* pause(150)
        expect(server.received).toHaveLength(4)
      }))

    it.live("complete / fail execution are retried; 409 execution_terminal after a lost answer = done", () =>
      Effect.gen(function*() {
        const server = yield* startServer((request, index, res) => {
          if (request.path.endsWith("/complete")) {
            return index === 0 ? destroy(res) : sendEnvelope(res, 409, "execution_terminal", "execution terminal")
          }
          return index === 2 ? sendEnvelope(res, 502, "internal_error", "bad gateway") : noContent(res)
        })
        const client = yield* direct(transport, server)
        expect(yield* Effect.exit(client.completeExecution(caller, EXEC, "{\"ok\":true}"))).toEqual(Exit.void)
        expect(yield* Effect.exit(client.failExecution(caller, EXEC, "crash"))).toEqual(Exit.void)
        expect(server.received.map((r) => r.path.slice(`/v0/executions/${EXEC}`.length))).toEqual([
          "/complete",
          "/complete",
          "/fail",
          "/fail"
        ])
      }))

    it.live("submitStep is sent exactly once after a dropped connection or a 503; 4xx and heartbeat are not retried", () =>
      Effect.gen(function*() {
        let answer: (res: Http.ServerResponse) => void = destroy
        const server = yield* startServer((_request, _index, res) => answer(res))
        const client = yield* direct(transport, server)

        const dropped = failureOf(yield* Effect.exit(client.submitStep(caller, EXEC, submission)))
        expect(dropped).toMatchObject({ _tag: "KernelError", reason: { _tag: "TransportError" } })
        yield* pause(250) // a retry would have come after 100 ms
        expect(server.received).toHaveLength(1)

        answer = (res) => sendEnvelope(res, 503, "internal_error", "unavailable")
        const unavailable = failureOf(yield* Effect.exit(client.submitStep(caller, EXEC, submission)))
        expect(unavailable).toMatchObject({ _tag: "KernelError", reason: { _tag: "StatusError", status: 503 } })
        expect(KernelClient.isTransportFailure(unavailable)).toBe(true)
        const beat = failureOf(yield* Effect.exit(client.heartbeat(caller, EXEC)))
        expect(beat).toMatchObject({ status: 503 })
        answer = (res) => sendEnvelope(res, 404, "not_found", "not found")
        expect(failureOf(yield* Effect.exit(client.completeStep(caller, EXEC, STEP, "1")))).toMatchObject({
          status: 404,
          code: "not_found"
        })
        yield* pause(250)
        expect(server.received.map((r) => r.path.slice(`/v0/executions/${EXEC}`.length))).toEqual([
          "/steps",
          "/steps",
          "/heartbeat",
          `/steps/${STEP}/complete`
        ])
      }))
  })

  // ---------------------------------------------------------------------------
  // Timeouts and interruption
  // ---------------------------------------------------------------------------

  describe("timeouts and interruption", () => {
    it.live("a request that is never answered fails after the timeout (live clock) and is aborted", () =>
      Effect.gen(function*() {
        const server = yield* startServer(never)
        const client = yield* direct(transport, server, { timeout: "200 millis" })
        const start = Date.now()
        const error = failureOf(yield* Effect.exit(client.heartbeat(caller, EXEC)))
        const elapsed = Date.now() - start
        expect(error).toBeInstanceOf(KernelError)
        expect(error).toMatchObject({ reason: { _tag: "TransportError" } })
        expect((error as KernelError).reason.description).toContain("timed out")
        expect((error as KernelError).reason.description).toContain("200")
        expect(KernelClient.isTransportFailure(error)).toBe(true)
        expect(elapsed).toBeGreaterThanOrEqual(190)
        expect(elapsed).toBeLessThan(2_000)
        expect(server.received).toHaveLength(1)
        // The request was abandoned on the wire too.
        yield* waitUntil("the server to see the request aborted", () => server.aborted.length === 1)
        expect(server.aborted).toEqual([0])
      }))

    it.effect("under TestClock the timeout follows virtual time", () =>
      Effect.gen(function*() {
        const server = yield* startServer(never)
        const client = yield* direct(transport, server, { timeout: "2 seconds" })
        const fiber = yield* Effect.forkChild(client.submitStep(caller, EXEC, submission))
        yield* waitUntil("the request to arrive", () => server.received.length === 1)
        yield* pause(50)
        // Real time passes, virtual time does not: still pending.
        expect(fiber.pollUnsafe()).toBeUndefined()
        yield* TestClock.adjust("1999 millis")
        yield* pause(20)
        expect(fiber.pollUnsafe()).toBeUndefined()
        const start = Date.now()
        yield* TestClock.adjust("1 millis")
        const error = failureOf(yield* Fiber.await(fiber))
        // Virtual time decided it, not a real 2 s timer.
        expect(Date.now() - start).toBeLessThan(1_000)
        expect(error).toBeInstanceOf(KernelError)
        expect(error).toMatchObject({ reason: { _tag: "TransportError" } })
        expect((error as KernelError).reason.description).toContain("timed out")
        yield* waitUntil("the server to see the request aborted", () => server.aborted.length === 1)
        expect(server.received).toHaveLength(1)
      }))

    it.live("interrupting a pending call aborts the request and ends the fiber promptly; the client stays usable", () =>
      Effect.gen(function*() {
        const server = yield* startServer(never)
        const client = yield* direct(transport, server)
        const fiber = yield* Effect.forkChild(client.submitStep(caller, EXEC, submission))
        yield* waitUntil("the request to arrive", () => server.received.length === 1)
        const start = Date.now()
        yield* Fiber.interrupt(fiber)
        const exit = yield* Fiber.await(fiber)
        expect(Date.now() - start).toBeLessThan(500)
        expect(Exit.hasInterrupts(exit)).toBe(true)
        yield* waitUntil("the server to see the request aborted", () => server.aborted.length === 1)
        expect(server.aborted).toEqual([0])

        server.setHandler((_request, _index, res) => sendJson(res, 200, { decision: "proceed", step_id: STEP }))
        expect(yield* client.submitStep(caller, EXEC, submission)).toEqual({ decision: "proceed", stepId: STEP })
        expect(server.received).toHaveLength(2)
      }))
  })
})

// ---------------------------------------------------------------------------
// layerUndiciConfig, layerSocketConfig
// ---------------------------------------------------------------------------

describe.each([
  { name: "layerUndiciConfig", configLayer: KernelClient.layerUndiciConfig, plainLayer: KernelClient.layerUndici },
  { name: "layerSocketConfig", configLayer: KernelClient.layerSocketConfig, plainLayer: KernelClient.layerSocket }
])("KernelClient.$name", ({ configLayer, plainLayer }) => {
    const heartbeat = Effect.flatMap(KernelClient.KernelClient, (client) => client.heartbeat(caller, EXEC))
    const env = (entries: ReadonlyArray<readonly [string, string]>) =>
      Effect.provideService(
        ConfigProvider.ConfigProvider,
        ConfigProvider.fromUnknown(Object.fromEntries(entries), { preserveEmptyStrings: true })
      )

    it.live("reads REBUNO_URL and REBUNO_AGENT_SECRET", () =>
      Effect.gen(function*() {
        const server = yield* startServer((_request, _index, res) => noContent(res))
        yield* heartbeat.pipe(
          Effect.provide(configLayer()),
          env([["REBUNO_URL", `${server.url}/env/`], ["REBUNO_AGENT_SECRET", "env-secret"], ["REBUNO_STAGE", "seed"]])
        )
        expect(server.received).toHaveLength(1)
        const request = server.received[0]!
        expect(request.path).toBe(`/env/v0/executions/${EXEC}/heartbeat`)
        expect(yield* Signature.verify("env-secret", request.body, request.headers["rebuno-signature"] as string))
          .toBe(true)
      }))

    it.live("options win over the environment", () =>
      Effect.gen(function*() {
        const server = yield* startServer((_request, _index, res) => noContent(res))
        const unused = yield* freePort
        const provider = env([
          ["REBUNO_URL", `http://127.0.0.1:${unused}/env`],
          ["REBUNO_AGENT_SECRET", "env-secret"],
          ["REBUNO_STAGE", "seed"]
        ])
        yield* heartbeat.pipe(
          Effect.provide(configLayer({ baseUrl: `${server.url}/option`, secret: "option-secret" })),
          provider
        )
        yield* heartbeat.pipe(Effect.provide(configLayer({ baseUrl: server.url })), provider)
        expect(server.received.map((r) => r.path)).toEqual([
          `/option/v0/executions/${EXEC}/heartbeat`,
          `/v0/executions/${EXEC}/heartbeat`
        ])
        const [first, second] = server.received
        expect(yield* Signature.verify("option-secret", first!.body, first!.headers["rebuno-signature"] as string))
          .toBe(true)
        expect(yield* Signature.verify("env-secret", second!.body, second!.headers["rebuno-signature"] as string))
          .toBe(true)
      }))

    it.live.each([
      ["missing secret", "REBUNO_AGENT_SECRET", [["REBUNO_URL", "http://127.0.0.1:1"]]],
      ["empty secret", "REBUNO_AGENT_SECRET", [["REBUNO_URL", "http://127.0.0.1:1"], ["REBUNO_AGENT_SECRET", ""]]],
      ["missing URL", "REBUNO_URL", [["REBUNO_AGENT_SECRET", SECRET]]],
      ["empty URL", "REBUNO_URL", [["REBUNO_URL", ""], ["REBUNO_AGENT_SECRET", SECRET]]]
    ] as const)("fails with a ConfigError: %s", ([, key, entries]) =>
      Effect.gen(function*() {
        const exit = yield* heartbeat.pipe(
          Effect.provide(configLayer()),
          env(entries),
          Effect.exit
        )
        const error = failureOf(exit)
        expect(error instanceof Config.ConfigError).toBe(true)
        expect(String(error)).toContain(key)
        expect(JSON.stringify(error)).not.toContain(SECRET)
      }))

    it.live("an unusable base URL, empty secret or connection count given as options is a ConfigError", () =>
      Effect.gen(function*() {
        for (
          const options of [
            { baseUrl: "not a url", secret: SECRET },
            { baseUrl: "ftp://127.0.0.1", secret: SECRET },
            { baseUrl: "http://127.0.0.1:1", secret: "" },
            { baseUrl: "http://127.0.0.1:1", secret: SECRET, connections: 0 },
            { baseUrl: "http://127.0.0.1:1", secret: SECRET, connections: 1.5 },
            { baseUrl: "http://127.0.0.1:1", secret: SECRET, connections: Number.NaN }
          ]
        ) {
          const exit = yield* heartbeat.pipe(Effect.provide(plainLayer(options)), Effect.exit)
          const error = failureOf(exit)
          expect(error instanceof Config.ConfigError).toBe(true)
          if ("connections" in options) expect(String(error)).toContain("connections must be a whole number")
        }
      }))
})

// ---------------------------------------------------------------------------
// The current stage (PROTOCOL-CURRENT C.2–C.5, C.13) on both transports
// ---------------------------------------------------------------------------

/** The signature of a received request, verified against its bytes (`v1=` at the time it carries). */
const verifyReceived = (request: Received, secret = SECRET) =>
  Effect.gen(function*() {
    const signature = request.headers["rebuno-signature"] as string
    if (signature.startsWith("sha256=")) return yield* Signature.verify(secret, request.body, signature)
    const timestamp = request.headers["rebuno-timestamp"] as string
    return yield* Signature.verifyV1(secret, {
      method: request.method,
      target: request.path,
      timestamp,
      dispatchId: (request.headers["rebuno-dispatch-id"] as string | undefined) ?? "",
      dispatchAttempt: (request.headers["rebuno-dispatch-attempt"] as string | undefined) ?? "",
      body: request.body
    }, signature, Number(timestamp))
  })

/** A kernel of a given stage: it lets through only one signature scheme, else `401 unauthorized`. */
const stagedKernel = (accepts: "v1=" | "sha256="): Handler => (request, index, res) =>
  (request.headers["rebuno-signature"] as string | undefined)?.startsWith(accepts) ?
    currentLike(request, index, res) :
    sendEnvelope(res, 401, "unauthorized", "unauthorized")

/** Every route of the current stage answered as a kernel would. */
const currentLike: Handler = (request, index, res) => {
  const path = request.path
  if (request.method === "PUT") return noContent(res)
  if (path.endsWith("/previous")) return sendJson(res, 200, { state: { messages: ["hi"] } })
  if (path.endsWith("/suspend")) return sendJson(res, 200, { suspended: true })
  if (request.method === "GET" && path.includes("/steps/")) {
    return sendJson(res, 200, { step_id: STEP, execution_id: EXEC, status: "succeeded", result: { summary: "s" } })
  }
  return kernelLike(request, index, res)
}

const everyCurrentCall = (client: KernelClient.KernelClient.Service) =>
  Effect.gen(function*() {
    yield* client.publishMetadata!("hello", {
      description: "Says hello",
      inputSchema: { type: "object", properties: { query: { type: "string" } } },
      outputSchema: null
    })
    const previous = yield* client.previous!({ agentId: "hello" }, EXEC)
    const step = yield* client.getStep!({ agentId: "hello" }, EXEC, STEP)
    const suspended = yield* client.suspend!(caller, EXEC)
    yield* client.completeExecution(caller, EXEC, "{\"reply\":\"hi\"}", "{\"messages\":[\"hi\"]}")
    return { previous, step: { stepId: step.stepId, status: step.status, result: step.result }, suspended }
  })

const EXPECTED_CURRENT_CALLS: ReadonlyArray<readonly [method: string, route: string, body: string]> = [
  [
    "PUT",
    "/v0/agents/hello/metadata",
    "{\"description\":\"Says hello\",\"input_schema\":{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\"}}},\"output_schema\":null}"
  ],
  ["GET", `/v0/executions/${EXEC}/previous`, ""],
  ["GET", `/v0/executions/${EXEC}/steps/${STEP}`, ""],
  ["POST", `/v0/executions/${EXEC}/suspend`, ""],
  ["POST", `/v0/executions/${EXEC}/complete`, "{\"output\":{\"reply\":\"hi\"},\"state\":{\"messages\":[\"hi\"]}}"]
]

describe("KernelClient transports: the current stage", () => {
  it.live("the new calls send the same bytes on both transports, v1= signed by default", () =>
    Effect.gen(function*() {
      const server = yield* startServer(stagedKernel("v1="))
      const baseUrl = `${server.url}/prefix`
      const viaHttpClient = yield* everyCurrentCall(yield* buildClient("httpClient", { baseUrl, stage: "auto" }))
      const httpRequests = [...server.received]
      server.reset()
      const viaUndici = yield* everyCurrentCall(yield* buildClient("undici", { baseUrl, stage: "auto" }))
      const undiciRequests = [...server.received]

      expect(undiciRequests.map((r) => [r.method, r.path, r.body.toString("utf8")])).toEqual(
        EXPECTED_CURRENT_CALLS.map(([method, route, body]) => [method, "/prefix" + route, body])
      )
      const withoutTime = (r: Received) => {
        const { "rebuno-signature": _s, "rebuno-timestamp": _t, ...headers } = wireView(r).headers
        return { ...wireView(r), headers }
      }
      expect(undiciRequests.map(withoutTime)).toEqual(httpRequests.map(withoutTime))
      expect(viaUndici).toEqual(viaHttpClient)
      expect(viaUndici).toEqual({
        previous: { messages: ["hi"] },
        step: { stepId: STEP, status: "succeeded", result: { summary: "s" } },
        suspended: true
      })
      // metadata, reads: no lease headers; suspend and complete: the lease
      expect(undiciRequests.map((r) => r.headers["rebuno-dispatch-id"])).toEqual([
        undefined,
        undefined,
        undefined,
        DISPATCH,
        DISPATCH
      ])
      for (const request of [...undiciRequests, ...httpRequests]) {
        expect((request.headers["rebuno-signature"] as string).startsWith("v1=")).toBe(true)
        expect(yield* verifyReceived(request)).toBe(true)
      }
    }))

  it.live.each(["undici", "socket", "httpClient"] as const)(
    "%s: against a v0.14.0-like kernel, auto falls back to sha256= after the first read's 401",
    (transport) =>
      Effect.gen(function*() {
        const server = yield* startServer(stagedKernel("sha256="))
        const client = yield* buildClient(transport, { baseUrl: server.url, stage: "auto" })
        const execution = yield* client.getExecution({ agentId: "hello" }, EXEC)
        expect(execution.id).toBe(EXEC)
        yield* client.submitStep(caller, EXEC, submission)
        yield* client.heartbeat(caller, EXEC)
        expect(server.received.map((r) => (r.headers["rebuno-signature"] as string).split("=")[0])).toEqual([
          "v1",
          "sha256",
          "sha256",
          "sha256"
        ])
        expect(server.received[3]!.headers["rebuno-signature"]).toBe(EMPTY_SIGNATURE)
        for (const request of server.received) expect(yield* verifyReceived(request)).toBe(true)
        expect(yield* client.signingScheme!).toBe("sha256")
      })
  )

  it.live.each(["undici", "socket", "httpClient"] as const)(
    "%s: a current-stage kernel refuses sha256= (stage seed gets 401); auto and current get through",
    (transport) =>
      Effect.gen(function*() {
        const server = yield* startServer(stagedKernel("v1="))
        const seed = yield* buildClient(transport, { baseUrl: server.url, stage: "seed" })
        expect(failureOf(yield* Effect.exit(seed.getExecution({ agentId: "hello" }, EXEC)))).toMatchObject({
          status: 401,
          code: "unauthorized"
        })
        for (const stage of ["auto", "current"] as const) {
          const client = yield* buildClient(transport, { baseUrl: server.url, stage })
          expect((yield* client.getExecution({ agentId: "hello" }, EXEC)).id).toBe(EXEC)
          expect(yield* client.signingScheme!).toBe("v1")
        }
        // seed: one request (no detection); auto and current: one each
        expect(server.received).toHaveLength(3)
      })
  )

  it.live("layerUndiciConfig reads REBUNO_STAGE", () =>
    Effect.gen(function*() {
      const server = yield* startServer((_request, _index, res) => noContent(res))
      const env = (stage: string) =>
        Effect.provideService(
          ConfigProvider.ConfigProvider,
          ConfigProvider.fromUnknown({ REBUNO_URL: server.url, REBUNO_AGENT_SECRET: SECRET, REBUNO_STAGE: stage })
        )
      const beat = Effect.flatMap(KernelClient.KernelClient, (client) => client.heartbeat(caller, EXEC))
      yield* beat.pipe(Effect.provide(KernelClient.layerUndiciConfig()), env("current"))
      yield* beat.pipe(Effect.provide(KernelClient.layerUndiciConfig()), env("v0.14.0"))
      expect(server.received.map((r) => (r.headers["rebuno-signature"] as string).split("=")[0])).toEqual([
        "v1",
        "sha256"
      ])
    }))

  // The reference kernel v0.14.0 (`rebuno dev`, e.g. on 127.0.0.1:8181): the default client meets it.
  const reference = process.env["REBUNO_REFERENCE_URL"]
  it.live.skipIf(reference === undefined)(
    "auto detects the reference kernel (REBUNO_REFERENCE_URL) on the first read",
    () =>
      Effect.gen(function*() {
        const admin = yield* buildReferenceAdmin(reference!)
        const agentId = `stage-probe-${Date.now()}`
        yield* admin.registerAgent({ id: agentId, webhookUrl: "http://127.0.0.1:9/webhook", secret: SECRET })
        const created = yield* admin.create(agentId, { probe: true })
        for (const transport of ["undici", "socket", "httpClient"] as const) {
          const client = yield* buildClient(transport, { baseUrl: reference!, stage: "auto" })
          expect(yield* client.signingScheme!).toBe("v1")
          const execution = yield* client.getExecution({ agentId }, created.id)
          expect(execution.id).toBe(created.id)
          expect(yield* client.signingScheme!).toBe("sha256")
        }
        yield* Effect.ignore(admin.cancel(created.id))
      }),
    30_000
  )
})

const buildReferenceAdmin = (baseUrl: string) =>
  Effect.map(
    Layer.build(
      Client.layer({
        baseUrl,
        ...(process.env["REBUNO_REFERENCE_TOKEN"] === undefined ? {} : { apiKey: process.env["REBUNO_REFERENCE_TOKEN"] })
      }).pipe(Layer.provide(NodeHttpClient.layerUndici))
    ),
    (context) => Context.get(context, Client.Client)
  )
