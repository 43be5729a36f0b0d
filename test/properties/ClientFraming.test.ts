/**
 * The socket transport's answer parser (`KernelClient.layerSocket`) against
 * every way HTTP/1.1 may frame an answer, over a real loopback socket: any
 * JSON value as the execution's input, framed by `content-length` (any header
 * case), chunked (any chunk sizes, with extensions and trailers) or by closing
 * the connection, after any number of interim 1xx answers, and written in
 * pieces cut at arbitrary bytes — each piece in its own turn of the event
 * loop, so that the parser meets a boundary inside the status line, a header,
 * a chunk-size line, a CRLF or a multi-byte character. Every answer must decode
 * to exactly the value sent, and the connection must be reused exactly when
 * the framing allows it.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import * as fc from "fast-check"
import * as Net from "node:net"
import * as KernelClient from "../../src/KernelClient.js"
import { checkProperty, propertyRuns, propertyTimeout } from "../support/arbitraries.js"
import { EXEC, EXECUTION_WIRE, SECRET } from "../support/kernelClientFixtures.js"

/** How one answer is put on the wire. */
type Framing =
  | { readonly _tag: "length"; readonly header: string }
  | { readonly _tag: "chunked"; readonly sizes: ReadonlyArray<number>; readonly extension: boolean; readonly trailer: boolean }
  | { readonly _tag: "close" }

interface Plan {
  readonly input: unknown
  readonly framing: Framing
  /** Interim answers (100, 102, 103) before the real one. */
  readonly interim: ReadonlyArray<100 | 102 | 103>
  /** Sizes of the pieces the answer is written in (cycled). */
  readonly cuts: ReadonlyArray<number>
}

const framingArb: fc.Arbitrary<Framing> = fc.oneof(
  fc.record({
    _tag: fc.constant("length" as const),
    header: fc.constantFrom("content-length", "Content-Length", "CONTENT-LENGTH")
  }),
  fc.record({
    _tag: fc.constant("chunked" as const),
    sizes: fc.array(fc.integer({ min: 1, max: 300 }), { minLength: 1, maxLength: 6 }),
    extension: fc.boolean(),
    trailer: fc.boolean()
  }),
  fc.record({ _tag: fc.constant("close" as const) })
)

const planArb: fc.Arbitrary<Plan> = fc.record({
  input: fc.jsonValue(),
  framing: framingArb,
  interim: fc.array(fc.constantFrom(100 as const, 102 as const, 103 as const), { maxLength: 2 }),
  cuts: fc.array(fc.integer({ min: 1, max: 64 }), { minLength: 1, maxLength: 5 })
})

/** The bytes of the answer `plan` describes. */
const answerBytes = (plan: Plan): Buffer => {
  const body = Buffer.from(JSON.stringify({ ...EXECUTION_WIRE, input: plan.input }))
  const parts: Array<Buffer> = plan.interim.map((code) => Buffer.from(`HTTP/1.1 ${code} Interim\r\nx-interim: ${code}\r\n\r\n`))
  const head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
  const framing = plan.framing
  switch (framing._tag) {
    case "length":
      parts.push(Buffer.from(`${head}${framing.header}: ${body.length}\r\n\r\n`), body)
      break
    case "close":
      parts.push(Buffer.from(`${head}connection: close\r\n\r\n`), body)
      break
    case "chunked": {
      parts.push(Buffer.from(`${head}transfer-encoding: chunked\r\n\r\n`))
      let at = 0
      let i = 0
      while (at < body.length) {
        const size = Math.min(framing.sizes[i++ % framing.sizes.length]!, body.length - at)
        parts.push(Buffer.from(size.toString(16) + (framing.extension ? ";name=value" : "") + "\r\n"))
        parts.push(body.subarray(at, at + size), Buffer.from("\r\n"))
        at += size
      }
      parts.push(Buffer.from(framing.trailer ? "0\r\nx-checksum: none\r\n\r\n" : "0\r\n\r\n"))
    }
  }
  return Buffer.concat(parts)
}

/** Write `bytes` in pieces of the sizes in `cuts` (cycled), one piece per turn of the event loop. */
const dribble = (socket: Net.Socket, bytes: Buffer, cuts: ReadonlyArray<number>, end: boolean): void => {
  let at = 0
  let i = 0
  const next = (): void => {
    if (socket.destroyed) return
    if (at >= bytes.length) {
      if (end) socket.end()
      return
    }
    const size = cuts[i++ % cuts.length]!
    socket.write(bytes.subarray(at, at + size))
    at += size
    setImmediate(next)
  }
  next()
}

/** A raw server answering each request with the current plan; counts connections. */
const planServer = Effect.acquireRelease(
  Effect.callback<{ server: Net.Server; url: string; state: { plan: Plan | undefined; connections: number } }>(
    (resume) => {
      const state: { plan: Plan | undefined; connections: number } = { plan: undefined, connections: 0 }
      const server = Net.createServer((socket) => {
        state.connections++
        socket.on("error", () => {})
        let pending = Buffer.alloc(0)
        socket.on("data", (data: Buffer) => {
          pending = Buffer.concat([pending, data])
          const end = pending.indexOf("\r\n\r\n")
          if (end < 0) return
          // GET requests only: no body to wait for.
          pending = pending.subarray(end + 4)
          const plan = state.plan!
          dribble(socket, answerBytes(plan), plan.cuts, plan.framing._tag === "close")
        })
      })
      server.listen(0, "127.0.0.1", () =>
        resume(Effect.succeed({
          server,
          url: `http://127.0.0.1:${(server.address() as Net.AddressInfo).port}`,
          state
        })))
    }
  ),
  ({ server }) => Effect.callback<void>((resume) => void server.close(() => resume(Effect.void)))
)

describe("KernelClient.layerSocket: answer framing (property)", () => {
  it.live("any JSON input, framed any way, cut anywhere, decodes exactly; reuse only when the framing allows", () =>
    Effect.gen(function*() {
      const { state, url } = yield* planServer
      const context = yield* Layer.build(
        KernelClient.layerSocket({ baseUrl: url, secret: Redacted.make(SECRET), stage: "seed", connections: 1 })
      )
      const client = Context.get(context, KernelClient.KernelClient)
      let reusable = false
      yield* checkProperty("socket answer framing", planArb, (plan) =>
        Effect.gen(function*() {
          state.plan = plan
          const before = state.connections
          const execution = yield* client.getExecution({ agentId: "hello" }, EXEC)
          expect(JSON.stringify(execution.input)).toBe(JSON.stringify(plan.input))
          expect(execution.id).toBe(EXEC)
          // A new connection exactly when the previous answer closed its connection (or at the first request).
          expect(state.connections - before).toBe(reusable ? 0 : 1)
          reusable = plan.framing._tag !== "close"
        }), { numRuns: propertyRuns(150) })
    }), propertyTimeout)
})
