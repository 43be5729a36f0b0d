/**
 * The synchronous path of the step routes (`Routes.makeHandlers(…).handleSync`
 * and the server's listener in front of `effect/http`): it answers only an
 * authentic, well-formed submit or step outcome — exactly as the general path
 * would — and declines everything else without changing anything, so that
 * the general path answers from the start; over HTTP its answers carry the
 * general path's bytes and headers, and a declined request keeps its body.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Effect } from "effect"
import * as Net from "node:net"
import * as Kernel from "../../src/kernel/index.js"
import * as Routes from "../../src/kernel/Routes.js"
import * as Signature from "../../src/Signature.js"
import type { HeaderInput } from "../support/currentRoutes.js"
import { harness, request, running, SECRET, SUBMIT, UNAUTHORIZED, VALIDATION } from "../support/currentRoutes.js"

const decoder = new TextDecoder()
const ATTEMPT = "Rebuno-Dispatch-Attempt"
const EXTRA_MEMBER = SUBMIT.slice(0, -1) + ",\"x\":1}"

/** A `v1=`-signed request of agent `hello` (or signed with `secret`), its lease headers signed. */
const signed = (
  method: string,
  url: string,
  body: string,
  lease: Readonly<Record<string, string>>,
  extra: HeaderInput = {},
  secret = SECRET,
  agentId = "hello"
) =>
  Effect.gen(function*() {
    const timestamp = String(Math.floor((yield* Clock.currentTimeMillis) / 1000))
    const signature = yield* Signature.signV1(secret, {
      method,
      target: url,
      timestamp,
      dispatchId: lease["Rebuno-Dispatch-Id"] ?? "",
      dispatchAttempt: lease["Rebuno-Dispatch-Attempt"] ?? "",
      body
    })
    return request(method, url, {
      body,
      headers: {
        "Rebuno-Agent-Id": agentId,
        "Rebuno-Timestamp": timestamp,
        "Rebuno-Signature": signature,
        ...lease,
        ...extra
      }
    })
  })

const bodyText = (res: Routes.KernelResponse | undefined): string =>
  res === undefined ? "<declined>" : typeof res.body === "string" ? res.body : decoder.decode(res.body as Uint8Array)

describe("the synchronous step path", () => {
  it.effect("answers an authentic submit and outcome as the general path does, and declines the rest unchanged", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const handlers = Routes.makeHandlers(h.core)
      const run = yield* running(h)
      const base = "/v0/executions/" + run.id
      const now = yield* Clock.currentTimeMillis
      const eventCount = () => Effect.map(h.core.eventLog(run.id), (events) => events.length)

      // Declined: nothing recorded, and the general path gives the usual error.
      const declined: ReadonlyArray<readonly [string, Routes.KernelRequest, number]> = [
        ["a bad signature", yield* signed("POST", base + "/steps", SUBMIT, run.lease, {}, "wrong-secret"), 401],
        ["an unknown agent", yield* signed("POST", base + "/steps", SUBMIT, run.lease, {}, SECRET, "nobody"), 401],
        [
          "a duplicated timestamp",
          yield* signed("POST", base + "/steps", SUBMIT, run.lease, { "Rebuno-Timestamp": ["1", "2"] }),
          401
        ],
        ["an extra member", yield* signed("POST", base + "/steps", EXTRA_MEMBER, run.lease), 400],
        ["an unknown kind", yield* signed("POST", base + "/steps", SUBMIT.replace("tool_call", "tool"), run.lease), 400],
        ["a bad attempt", yield* signed("POST", base + "/steps", SUBMIT, { ...run.lease, [ATTEMPT]: "0" }), 400],
        ["a bad execution id", yield* signed("POST", "/v0/executions/nope/steps", SUBMIT, run.lease), 400],
        ["a query", yield* signed("POST", base + "/steps?x=1", SUBMIT, run.lease), 200],
        // a `-` escaped for nothing: Go routes on the path as sent, whose id does not parse
        ["an escaped path", yield* signed("POST", base.replace("-", "%2D") + "/steps", SUBMIT, run.lease), 400],
        ["another route", yield* signed("POST", base + "/heartbeat", "", run.lease), 204]
      ]
      for (const [what, req, status] of declined) {
        const before = yield* eventCount()
        expect(handlers.handleSync(req, now), what).toBeUndefined()
        expect(yield* eventCount(), what).toBe(before)
        const general = yield* handlers.handle(req)
        expect(general.status, what).toBe(status)
        if (status === 401) expect(bodyText(general), what).toBe(UNAUTHORIZED)
        if (what === "an extra member") expect(bodyText(general), what).toBe(VALIDATION)
      }
      // An execution of another agent: the general path's 403.
      const others = yield* running(h, "other")
      const foreign = yield* signed("POST", "/v0/executions/" + others.id + "/steps", SUBMIT, others.lease)
      expect(handlers.handleSync(foreign, now)).toBeUndefined()
      expect((yield* handlers.handle(foreign)).status).toBe(403)

      // Answered: the core's answers (a refusal included), counted on /metrics.
      const submit = yield* signed("POST", base + "/steps", SUBMIT.replace("hello", "sync"), run.lease)
      const proceed = handlers.handleSync(submit, now)
      expect(proceed?.status).toBe(200)
      expect(proceed?.headers).toEqual({ "content-type": "application/json; charset=utf-8" })
      const stepId = JSON.parse(bodyText(proceed)).step_id as string
      expect(bodyText(proceed)).toBe(`{"decision":"proceed","step_id":"${stepId}"}\n`)
      const result = "{\"result\":{\"ok\":true}}"
      const complete = yield* signed("POST", `${base}/steps/${stepId}/complete`, result, run.lease)
      expect(bodyText(handlers.handleSync(complete, now))).toBe("{\"decision\":\"recorded\"}\n")
      const fail = yield* signed("POST", `${base}/steps/${stepId}/fail`, "{\"error\":{\"message\":\"x\"}}", run.lease)
      // the general path answers a settled step the same way
      const failAnswer = handlers.handleSync(fail, now)
      expect(failAnswer?.status).toBe(200)
      expect(bodyText(failAnswer)).toBe("{\"decision\":\"replay\"}\n")
      const stale = yield* signed("POST", base + "/steps", SUBMIT, { ...run.lease, [ATTEMPT]: "9" })
      const superseded = handlers.handleSync(stale, now)
      expect(superseded?.status).toBe(409)
      expect(bodyText(superseded)).toBe(bodyText(yield* handlers.handle(stale)))
      const metrics = yield* handlers.handle(request("GET", "/metrics"))
      expect(bodyText(metrics)).toContain("rebuno_dev_kernel_http_requests_total")
    }))

  it.effect("leaves a submission to the general path when a judge is configured", () =>
    Effect.gen(function*() {
      const h = yield* harness({}, {
        judge: { ask: () => Effect.die("not asked") } as unknown as Kernel.Core.Settings["judge"]
      })
      const run = yield* running(h)
      const req = yield* signed("POST", "/v0/executions/" + run.id + "/steps", SUBMIT, run.lease)
      expect(Routes.makeHandlers(h.core).handleSync(req, yield* Clock.currentTimeMillis)).toBeUndefined()
    }))
})

/** One raw HTTP/1.1 exchange on a fresh connection: the answer's bytes as text. */
const exchange = (port: number, head: string, body: string) =>
  Effect.callback<string>((resume) => {
    const socket = Net.connect(port, "127.0.0.1", () => socket.write(head + body))
    let out = ""
    socket.on("data", (chunk) => {
      out += chunk.toString("utf8")
      const end = out.indexOf("\r\n\r\n")
      const length = /content-length: (\d+)/i.exec(out)
      if (end >= 0 && (length === null || Buffer.byteLength(out.slice(end + 4)) >= Number(length[1]))) {
        socket.destroy()
        resume(Effect.succeed(out.replace(/\r\nDate: [^\r]*/, "\r\nDate: X")))
      }
    })
    return Effect.sync(() => socket.destroy())
  })

describe("the synchronous step path over HTTP", () => {
  it.live("writes the general path's head for a JSON answer, and a declined request keeps its body", () =>
    Effect.gen(function*() {
      const kernel = yield* Kernel.start({
        port: 0,
        dispatcher: { background: false, deliver: () => Effect.succeed(true) }
      })
      const port = Number(new URL(kernel.url).port)
      yield* kernel.core.registerAgent({ id: "hello", webhookUrl: "http://127.0.0.1:1/webhook", secret: SECRET })
      const created = yield* kernel.core.createExecution({ agentId: "hello", inputRaw: "{}", agentVersion: undefined })
      const [claim] = yield* kernel.core.claimDue(1)
      const lease = { "Rebuno-Dispatch-Id": claim!.dispatchId, "Rebuno-Dispatch-Attempt": String(claim!.attempt) }
      const base = "/v0/executions/" + created.id
      const send = (method: string, url: string, body: string) =>
        Effect.gen(function*() {
          const req = yield* signed(method, url, body, lease)
          const names = ["Rebuno-Agent-Id", "Rebuno-Timestamp", "Rebuno-Signature", "Rebuno-Dispatch-Id", ATTEMPT]
          const head = `${method} ${url} HTTP/1.1\r\nHost: kernel\r\n` +
            names.map((name) => `${name}: ${req.headers(name)[0]}\r\n`).join("") +
            `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n`
          return yield* exchange(port, head, body)
        })
      const jsonHead = (status: string, length: number) =>
        `HTTP/1.1 ${status}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${length}\r\n` +
        "Date: X\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n"

      // the synchronous path
      const proceed = yield* send("POST", base + "/steps", SUBMIT)
      const body = proceed.slice(proceed.indexOf("\r\n\r\n") + 4)
      expect(proceed).toBe(jsonHead("200 OK", Buffer.byteLength(body)) + body)
      expect(body).toMatch(/^\{"decision":"proceed","step_id":"[0-9a-f]{64}"\}\n$/)
      // the general path (a GET): the same head
      const read = yield* send("GET", base, "")
      const upToLength = read.indexOf("content-length")
      expect(read.slice(0, upToLength)).toBe(jsonHead("200 OK", 0).slice(0, upToLength))
      // declined (an extra member) with a valid signature: the general path verifies the same body, then 400
      const rejected = yield* send("POST", base + "/steps", EXTRA_MEMBER)
      expect(rejected).toBe(jsonHead("400 Bad Request", VALIDATION.length) + VALIDATION)
    }).pipe(Effect.scoped))
})

describe("the synchronous signature checks", () => {
  it.effect("agree with the effectful ones, and defer to them where only Web Crypto is available", () =>
    Effect.gen(function*() {
      const body = "{\"result\":{\"ok\":true}}"
      const req = {
        method: "POST",
        target: "/v0/executions/x/steps",
        timestamp: "1700000000",
        dispatchId: "d",
        dispatchAttempt: "1",
        body
      }
      const v1 = yield* Signature.signV1(SECRET, req)
      const sha = yield* Signature.sign(SECRET, body)
      const cases: ReadonlyArray<readonly [string, number]> = [
        [v1, 1700000000],
        [v1, 1700000000 + Signature.v1WindowSeconds],
        [v1, 1700000001 + Signature.v1WindowSeconds],
        [v1.toUpperCase(), 1700000000],
        ["v1=", 1700000000]
      ]
      for (const [signature, now] of cases) {
        expect(Signature.verifyV1Sync(SECRET, req, signature, now)).toBe(
          yield* Signature.verifyV1(SECRET, req, signature, now)
        )
      }
      expect(Signature.verifyV1Sync(SECRET, { ...req, timestamp: "17e8" }, v1, 1700000000)).toBe(false)
      expect(Signature.verifyV1Sync(SECRET, { ...req, dispatchId: "d\n" }, v1, 1700000000)).toBe(false)
      for (const header of [sha, sha.toUpperCase(), "", undefined]) {
        expect(Signature.verifySync(SECRET, body, header)).toBe(yield* Signature.verify(SECRET, body, header))
      }
      Signature.unsafeForceWebCrypto(true)
      try {
        expect(Signature.verifyV1Sync(SECRET, req, v1, 1700000000)).toBeUndefined()
        expect(Signature.verifySync(SECRET, body, sha)).toBeUndefined()
      } finally {
        Signature.unsafeForceWebCrypto(false)
      }
    }))
})
