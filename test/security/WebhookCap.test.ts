/**
 * The agent's webhook receivers cap the body they read (`Agent.maxWebhookBodyBytes`,
 * 1 MiB; a webhook is about 200 bytes): a larger body — declared in
 * `Content-Length` or only found while streaming — cannot be verified, so it
 * is answered `401` with an empty body (PROTOCOL 3.5) before any signature
 * work, even when its signature is right, and the handler never runs. A body
 * at the cap is read and judged as usual. Covered for `Agent.toWebHandler` and
 * `Agent.toHttpApp` here, and for `Agent.serve` over a socket in
 * test/properties/Socket.test.ts.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { HttpServerRequest } from "effect/http"
import * as Agent from "../../src/Agent.js"
import * as Signature from "../../src/Signature.js"
import { membersText, stubKernel, webhookMembers } from "../support/arbitraries.js"
import * as TestLogs from "../support/logging.js"

const SECRET = "cap-secret"
const CAP = Agent.maxWebhookBodyBytes

const agent = Agent.make({ id: "cap-agent", handler: () => Effect.void })

/** A valid webhook notice padded with trailing whitespace to `size` bytes. */
const padded = (size: number): Uint8Array<ArrayBuffer> => {
  const notice = new TextEncoder().encode(membersText(webhookMembers("0192f1a0-0000-7000-8000-0000000000ee", "d", 1)))
  const out = new Uint8Array(size).fill(0x20)
  out.set(notice, 0)
  return out
}

/** A body that arrives in chunks, with no length known up front. */
const streamed = (bytes: Uint8Array, chunk = 64 * 1024): ReadableStream<Uint8Array> => {
  let offset = 0
  return new ReadableStream({
    pull(controller) {
      if (offset >= bytes.length) return controller.close()
      controller.enqueue(bytes.slice(offset, offset + chunk))
      offset += chunk
    }
  })
}

/** Waits (bounded, on the event loop) until background runs have reached the kernel. */
const reads = (calls: ReadonlyArray<string>, n: number) =>
  Effect.gen(function*() {
    const count = () => calls.filter((c) => c.startsWith("getExecution")).length
    for (let i = 0; i < 500 && count() < n; i++) yield* Effect.promise(() => new Promise((r) => setTimeout(r, 1)))
    return count()
  })

const webRequest = (
  body: Uint8Array<ArrayBuffer> | ReadableStream<Uint8Array>,
  headers: Record<string, string>
): Request =>
  new Request("http://agent.test/webhook", {
    method: "POST",
    headers,
    body,
    ...(body instanceof ReadableStream ? { duplex: "half" } : {})
  } as RequestInit)

describe("webhook body cap", () => {
  it("the cap is 1 MiB", () => {
    expect(CAP).toBe(1024 * 1024)
  })

  it.effect("toWebHandler: 401 over the cap (declared or streamed), judged as usual at the cap", () =>
    Effect.gen(function*() {
      const kernel = stubKernel(SECRET)
      const web = Agent.toWebHandler(agent, Layer.merge(kernel.layer, TestLogs.layer))
      yield* Effect.addFinalizer(() => Effect.promise(() => web.dispose()))
      const call = (request: Request) => Effect.promise(() => web.handler(request))

      const over = padded(CAP + 1)
      const overSignature = yield* Signature.sign(SECRET, over)
      const declared = yield* call(webRequest(over, { "rebuno-signature": overSignature, "content-length": String(over.length) }))
      expect(declared.status).toBe(401)
      expect(yield* Effect.promise(() => declared.text())).toBe("")
      // A lying Content-Length does not matter: counted while reading.
      const lying = yield* call(webRequest(streamed(over), { "rebuno-signature": overSignature }))
      expect(lying.status).toBe(401)
      const huge = yield* call(webRequest(streamed(new Uint8Array(20 * CAP)), { "rebuno-signature": "sha256=00" }))
      expect(huge.status).toBe(401)

      // At the cap: read, verified and accepted.
      const atCap = padded(CAP)
      const accepted = yield* call(webRequest(streamed(atCap), { "rebuno-signature": yield* Signature.sign(SECRET, atCap) }))
      expect(accepted.status).toBe(200)
      const unsigned = yield* call(webRequest(atCap, { "rebuno-signature": "sha256=00" }))
      expect(unsigned.status).toBe(401)
      // Nothing over the cap reached the kernel; the accepted one did (one read).
      expect(yield* reads(kernel.calls, 1)).toBe(1)
    }))

  it.effect("toHttpApp: 401 over the cap (declared or streamed)", () =>
    Effect.gen(function*() {
      const kernel = stubKernel(SECRET)
      const app = yield* Agent.toHttpApp(agent).pipe(Effect.provide(kernel.layer))
      const call = (request: Request) =>
        app.pipe(Effect.provideService(HttpServerRequest.HttpServerRequest, HttpServerRequest.fromWeb(request)))

      const over = padded(CAP + 1)
      const signature = yield* Signature.sign(SECRET, over)
      expect((yield* call(webRequest(over, { "rebuno-signature": signature, "content-length": String(over.length) }))).status)
        .toBe(401)
      expect((yield* call(webRequest(streamed(over), { "rebuno-signature": signature }))).status).toBe(401)
      const atCap = padded(CAP)
      expect((yield* call(webRequest(streamed(atCap), { "rebuno-signature": yield* Signature.sign(SECRET, atCap) }))).status)
        .toBe(200)
      expect((yield* call(webRequest(atCap, { "rebuno-signature": "sha256=00" }))).status).toBe(401)
      expect(yield* reads(kernel.calls, 1)).toBe(1)
    }))
})
