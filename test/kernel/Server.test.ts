import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Fiber, Layer, Redacted } from "effect"
import { HttpServer } from "effect/http"
import { TestConsole } from "effect/testing"
import * as Fs from "node:fs"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Signature from "../../src/Signature.js"
import * as Kernel from "../../src/kernel/index.js"
import { accepts, externalAddress } from "../support/network.js"

interface RawResponse {
  readonly status: number
  readonly headers: Http.IncomingHttpHeaders
  readonly body: Buffer
}

/** A raw `node:http` request: exact status, headers and body bytes. */
const raw = (
  base: string,
  method: string,
  path: string,
  options: { readonly headers?: Http.OutgoingHttpHeaders; readonly body?: string | Buffer } = {}
) =>
  Effect.callback<RawResponse, Error>((resume) => {
    const req = Http.request(base + path, { method, headers: options.headers ?? {}, agent: false }, (res) => {
      const chunks: Array<Buffer> = []
      res.on("data", (c: Buffer) => chunks.push(c))
      res.on("end", () => resume(Effect.succeed({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) })))
      res.on("error", (e) => resume(Effect.fail(e)))
    })
    req.on("error", (e) => resume(Effect.fail(e)))
    req.end(options.body)
  })

const start = (options: Kernel.StartOptions = {}) =>
  Kernel.start({ port: 0, dispatcher: { deliver: () => Effect.succeed(true) }, ...options })

const portOf = (url: string) => Number(new URL(url).port)

describe("Server", () => {
  it.live("binds the loopback interface unless told otherwise; \"\" and 0.0.0.0 listen on every interface", () =>
    Effect.gen(function*() {
      const core = yield* Kernel.Core.make()
      const bound = (host?: string) =>
        Effect.map(
          Layer.build(Kernel.Server.layer({ port: 0, core, ...(host === undefined ? {} : { host }) })),
          (context) => Kernel.formatUrl(Context.get(context, HttpServer.HttpServer).address)
        )
      // formatUrl shows a wildcard address as localhost
      expect(yield* bound()).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/)
      expect(yield* bound("")).toMatch(/^http:\/\/localhost:\d+$/)

      const local = yield* start()
      expect(local.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/)
      const exposed = yield* start({ host: "0.0.0.0" })
      expect(exposed.url).toMatch(/^http:\/\/localhost:\d+$/)
      if (externalAddress !== undefined) {
        // Other machines reach the kernel only when it is exposed.
        expect(yield* accepts(externalAddress, portOf(local.url))).toBe(false)
        expect(yield* accepts(externalAddress, portOf(exposed.url))).toBe(true)
      }
      expect(yield* accepts("127.0.0.1", portOf(local.url))).toBe(true)
    }))

  it.live("Kernel.layerLogger: the delivery loop's lines, one per entry on stderr, as logfmt or JSON", () =>
    Effect.gen(function*() {
      for (const format of Kernel.logFormats) {
        const lines = yield* Effect.scoped(Effect.gen(function*() {
          const kernel = yield* Kernel.start({ port: 0, settings: { maxAttempts: 1 } })
          yield* kernel.core.registerAgent({ id: "a", webhookUrl: "http://127.0.0.1:1/webhook", secret: "s" })
          const { id } = yield* kernel.core.createExecution({ agentId: "a", inputRaw: "{}", agentVersion: undefined })
          // The background loop delivers (and fails) on its own.
          for (let i = 0; i < 300 && (yield* kernel.core.getExecution(id)).status !== "failed"; i++) {
            yield* Effect.sleep("10 millis")
          }
          return (yield* TestConsole.errorLines).map(String)
        })).pipe(Effect.provide(Kernel.layerLogger(format)), Effect.provide(TestConsole.layer))
        expect(lines).toHaveLength(2)
        for (const line of lines) expect(line).not.toContain("\n")
        if (format === "json") {
          expect(lines.map((l) => JSON.parse(l).level)).toEqual(["WARN", "ERROR"])
          expect(JSON.parse(lines[0]!).annotations).toMatchObject({ "rebuno.agent_id": "a", "rebuno.error": "connection_refused" })
        } else {
          expect(lines[0]).toMatch(/^timestamp=\S+ level=WARN fiber=#\d+ message="webhook delivery to agent a failed: connection refused/)
          expect(lines[1]).toMatch(/ level=ERROR .*dispatch_exhausted/)
        }
      }
    }))

  it.live("serves exact JSON bytes on a real socket", () =>
    Effect.gen(function*() {
      const kernel = yield* start()
      expect(kernel.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/)
      const res = yield* raw(kernel.url, "GET", "/v0/health")
      expect(res.status).toBe(200)
      expect(res.headers["content-type"]).toBe("application/json; charset=utf-8")
      expect(res.headers["content-length"]).toBe("16")
      expect(res.body.toString("utf8")).toBe("{\"status\":\"ok\"}\n")
    }))

  it.live("routing errors: 404 text/plain, 405 and 204 without content type", () =>
    Effect.gen(function*() {
      const { url } = yield* start()
      const notFound = yield* raw(url, "GET", "/v0/unknown")
      expect(notFound.status).toBe(404)
      expect(notFound.headers["content-type"]).toBe("text/plain; charset=utf-8")
      expect(notFound.body.toString("utf8")).toBe("404 page not found\n")

      const notAllowed = yield* raw(url, "PATCH", "/v0/executions")
      expect(notAllowed.status).toBe(405)
      expect(notAllowed.headers["content-type"]).toBeUndefined()
      expect(notAllowed.body.length).toBe(0)

      const deleted = yield* raw(url, "DELETE", "/v0/agents/nobody")
      expect(deleted.status).toBe(204)
      expect(deleted.headers["content-type"]).toBeUndefined()
      expect(deleted.body.length).toBe(0)
    }))

  it.live("bearer token when configured", () =>
    Effect.gen(function*() {
      const { url } = yield* start({ apiToken: Redacted.make("tok") })
      const denied = yield* raw(url, "GET", "/v0/agents")
      expect(denied.status).toBe(401)
      expect(denied.body.toString()).toBe("{\"code\":\"unauthorized\",\"message\":\"unauthorized\"}\n")
      const ok = yield* raw(url, "GET", "/v0/agents", { headers: { authorization: "Bearer tok" } })
      expect(ok.body.toString()).toBe("[]\n")
    }))

  it.live("body cap over HTTP: 400 on bearer routes, 401 on agent routes", () =>
    Effect.gen(function*() {
      const { url, core } = yield* start()
      yield* core.registerAgent({ id: "a", webhookUrl: "", secret: "s" })
      const big = Buffer.alloc(10 * 1024 * 1024 + 1, 0x20)
      const create = yield* raw(url, "POST", "/v0/executions", { body: big })
      expect(create.status).toBe(400)
      expect(create.body.toString()).toBe("{\"code\":\"validation_error\",\"message\":\"validation error\"}\n")
      const signature = yield* Signature.sign("s", big)
      const agent = yield* raw(url, "POST", "/v0/executions/0192f1a0-0000-7000-8000-000000000000/complete", {
        body: big,
        headers: { "rebuno-agent-id": "a", "rebuno-signature": signature }
      })
      expect(agent.status).toBe(401)
      // the server keeps working afterwards
      expect((yield* raw(url, "GET", "/v0/ready")).status).toBe(200)
    }))

  it.live("SSE: headers flushed at once, frames as published", () =>
    Effect.gen(function*() {
      const { url, core } = yield* start()
      const id = "0192f1a0-0000-7000-8000-000000000000"
      const received = yield* Effect.callback<{ res: Http.IncomingMessage; req: Http.ClientRequest }, Error>(
        (resume) => {
          const req = Http.get(url + `/v0/executions/${id}/stream`, { agent: false }, (res) => {
            resume(Effect.succeed({ res, req }))
          })
          req.on("error", (e) => resume(Effect.fail(e)))
        }
      ).pipe(Effect.timeout("3 seconds"))
      const { res, req } = received
      yield* Effect.addFinalizer(() => Effect.sync(() => req.destroy()))
      expect(res.statusCode).toBe(200)
      expect(res.headers["content-type"]).toBe("text/event-stream")
      expect(res.headers["cache-control"]).toBe("no-cache")
      expect(res.headers["connection"]).toBe("keep-alive")
      const frame = Effect.callback<string>((resume) => {
        res.once("data", (chunk: Buffer) => resume(Effect.succeed(chunk.toString("utf8"))))
      })
      const next = yield* Effect.forkChild(frame)
      yield* core.publishDelta(id, { stepId: "s", seq: 3, data: "a&b" })
      expect(yield* Fiber.join(next)).toBe("data: {\"step_id\":\"s\",\"seq\":3,\"data\":\"a\\u0026b\"}\n\n")
    }))

  it.live("current stage end to end: v1= signed agent calls over a real socket; sha256= is 401", () =>
    Effect.gen(function*() {
      const webhooks: Array<string> = []
      const kernel = yield* start({
        dispatcher: {
          deliver: (_claim, body) =>
            Effect.sync(() => {
              webhooks.push(body)
              return true
            })
        }
      })
      expect(kernel.core.settings.stage).toBe("current")
      yield* kernel.core.registerAgent({ id: "hello", webhookUrl: "http://127.0.0.1:9/webhook", secret: "hello-secret" })
      const created = yield* raw(kernel.url, "POST", "/v0/executions", { body: "{\"agent_id\":\"hello\",\"input\":{}}" })
      expect(created.status).toBe(201)
      const id = JSON.parse(created.body.toString()).id as string
      for (let i = 0; i < 200 && webhooks.length === 0; i++) yield* Effect.sleep("10 millis")
      const webhook = JSON.parse(webhooks[0]!)
      expect(webhook).toMatchObject({ execution_id: id, dispatch_attempt: 1, lease_timeout_seconds: 120 })
      const signed = (method: string, path: string, body: string) =>
        Effect.gen(function*() {
          const timestamp = String(Math.floor(Date.now() / 1000))
          const signature = yield* Signature.signV1("hello-secret", {
            method,
            target: path,
            timestamp,
            dispatchId: webhook.dispatch_id,
            dispatchAttempt: "1",
            body
          })
          return {
            "rebuno-agent-id": "hello",
            "rebuno-timestamp": timestamp,
            "rebuno-dispatch-id": webhook.dispatch_id,
            "rebuno-dispatch-attempt": "1",
            "rebuno-signature": signature
          }
        })
      const beatPath = `/v0/executions/${id}/heartbeat`
      const old = yield* raw(kernel.url, "POST", beatPath, {
        headers: {
          "rebuno-agent-id": "hello",
          "rebuno-dispatch-id": webhook.dispatch_id,
          "rebuno-dispatch-attempt": "1",
          "rebuno-signature": yield* Signature.sign("hello-secret", "")
        }
      })
      expect(old.status).toBe(401)
      expect(old.body.toString()).toBe("{\"code\":\"unauthorized\",\"message\":\"unauthorized\"}\n")
      expect((yield* raw(kernel.url, "POST", beatPath, { headers: yield* signed("POST", beatPath, "") })).status).toBe(204)
      const completePath = `/v0/executions/${id}/complete`
      const output = "{\"output\":{\"ok\":true}}"
      const done = yield* raw(kernel.url, "POST", completePath, {
        body: output,
        headers: { ...(yield* signed("POST", completePath, output)), "content-type": "application/json" }
      })
      expect(done.status).toBe(204)
      const execution = JSON.parse((yield* raw(kernel.url, "GET", `/v0/executions/${id}`)).body.toString())
      expect(execution).toMatchObject({ status: "completed", output: { ok: true } })
    }))

  it.live("end to end: manifest, HTTP webhook, signed agent calls", () =>
    Effect.gen(function*() {
      // a minimal agent: verifies the webhook, answers 200, then heartbeats and completes
      const webhooks: Array<{ body: string; signature: string | undefined }> = []
      const agentServer = yield* Effect.acquireRelease(
        Effect.callback<Http.Server>((resume) => {
          const server = Http.createServer((req, res) => {
            let body = ""
            req.on("data", (c) => (body += c))
            req.on("end", () => {
              webhooks.push({ body, signature: req.headers["rebuno-signature"] as string | undefined })
              res.writeHead(200)
              res.end()
            })
          })
          server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
        }),
        (server) =>
          Effect.callback<void>((resume) => {
            server.close(() => resume(Effect.void))
          })
      )
      const port = (agentServer.address() as AddressInfo).port
      const dir = yield* Effect.acquireRelease(
        Effect.sync(() => Fs.mkdtempSync(Path.join(Os.tmpdir(), "rebuno-server-"))),
        (d) => Effect.sync(() => Fs.rmSync(d, { recursive: true, force: true }))
      )
      const manifest = Path.join(dir, "manifest.yaml")
      Fs.writeFileSync(
        manifest,
        `agents:\n  - id: hello\n    webhook_url: http://127.0.0.1:${port}/webhook\n    secret: hello-secret\n`
      )
      const kernel = yield* Kernel.start({ port: 0, manifest, stage: "seed" })
      expect(kernel.agents.map((a) => a.id)).toEqual(["hello"])

      const created = yield* raw(kernel.url, "POST", "/v0/executions", {
        body: "{\"agent_id\":\"hello\",\"input\":{\"query\":\"hi\"}}"
      })
      expect(created.status).toBe(201)
      const id = JSON.parse(created.body.toString()).id as string

      // delivered at once on enqueue (no 2 s wait)
      for (let i = 0; i < 200 && webhooks.length === 0; i++) yield* Effect.sleep("10 millis")
      expect(webhooks).toHaveLength(1)
      const webhook = JSON.parse(webhooks[0]!.body)
      expect(webhooks[0]!.signature).toBe(yield* Signature.sign("hello-secret", webhooks[0]!.body))
      expect(webhook).toMatchObject({ execution_id: id, dispatch_attempt: 1, lease_timeout_seconds: 120 })

      const lease = {
        "rebuno-agent-id": "hello",
        "rebuno-dispatch-id": webhook.dispatch_id,
        "rebuno-dispatch-attempt": "1"
      }
      const beat = yield* raw(kernel.url, "POST", `/v0/executions/${id}/heartbeat`, {
        headers: { ...lease, "rebuno-signature": yield* Signature.sign("hello-secret", "") }
      })
      expect(beat.status).toBe(204)
      const output = "{\"output\":{\"ok\":true}}"
      const done = yield* raw(kernel.url, "POST", `/v0/executions/${id}/complete`, {
        body: output,
        headers: { ...lease, "content-type": "application/json", "rebuno-signature": yield* Signature.sign("hello-secret", output) }
      })
      expect(done.status).toBe(204)
      const execution = JSON.parse((yield* raw(kernel.url, "GET", `/v0/executions/${id}`)).body.toString())
      expect(execution).toMatchObject({ status: "completed", output: { ok: true } })
    }))
})
