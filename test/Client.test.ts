import { describe, expect, it } from "@effect/vitest"
import { Cause, Config, ConfigProvider, Effect, Exit, Fiber, Layer, Option, Redacted, Schema, Stream } from "effect"
import { TestClock } from "effect/testing"
import * as Agent from "../src/Agent.js"
import * as Client from "../src/Client.js"
import * as Protocol from "../src/Protocol.js"
import * as Step from "../src/Step.js"
import { makeSseParser } from "../src/internal/http/exchange.js"
import { InvalidArguments, KernelError } from "../src/RebunoError.js"
import * as TrackedClock from "../src/testing/internal/trackedClock.js"
import * as TestKernel from "../src/testing/TestKernel.js"
import { type Answer, envelope, json, makeDouble, noContent, type Recorded } from "./support/httpDouble.js"

const EXEC = "0192f1a0-0000-7000-8000-000000000000"
const EXEC2 = "0192f1a0-0000-7000-8000-000000000002"
const EXEC3 = "0192f1a0-0000-7000-8000-000000000003"
const APPROVAL = "0192f1a0-0000-7000-8000-0000000000a1"
const STEP = "cd3f" + "0".repeat(56) + "5c29"
const BASE = "http://kernel:8080"
const API_KEY = "sk-live-very-secret"

const withClient = <A, E>(
  script: (request: Recorded, index: number) => Answer,
  body: (client: Client.Client.Service, requests: ReadonlyArray<Recorded>) => Effect.Effect<A, E>,
  options: Partial<Client.Options> = {}
) => {
  const double = makeDouble(script)
  return Effect.flatMap(Client.make({ baseUrl: BASE, ...options }), (client) => body(client, double.requests)).pipe(
    Effect.provide(double.layer),
    Effect.provide(TrackedClock.layer)
  )
}

const settle = Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))

const settleUntil = (done: () => boolean) =>
  Effect.gen(function*() {
    for (let i = 0; i < 100 && !done(); i++) yield* settle
  })

/** Runs an effect to completion, moving the TestClock one second whenever it waits on a sleep. */
const driveClock = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(effect)
    for (let i = 0; i < 1000; i++) {
      if (fiber.pollUnsafe() !== undefined) break
      yield* settle
      if ((yield* TrackedClock.pendingSleeps).length > 0) yield* TestClock.adjust("1 second")
    }
    return yield* Fiber.await(fiber)
  })

const failureOf = <A, E>(exit: Exit.Exit<A, E>): E => {
  if (Exit.isSuccess(exit)) throw new Error("expected a failure")
  const reasons = exit.cause.reasons
  if (reasons.length !== 1 || !Cause.isFailReason(reasons[0]!)) {
    throw new Error(`expected a Fail cause, got ${reasons.map((r) => r._tag).join(", ")}`)
  }
  return reasons[0].error
}

const execution = (id: string, status = "running") => ({
  id,
  agent_id: "hello",
  input: null,
  status,
  created_at: "2026-08-18T19:40:54Z",
  updated_at: "2026-08-18T19:40:54Z"
})

const event = (seq: number, type = "step.succeeded") => ({
  execution_id: EXEC,
  event_seq: seq,
  type,
  payload: { n: seq },
  occurred_at: "2026-08-18T19:40:54Z"
})

const pathOf = (url: string) => url.slice(BASE.length)

describe("Client executions", () => {
  it.effect("create: POST with only the given members; no Authorization header without an API key", () =>
    withClient(
      () => json(201, execution(EXEC)),
      (client, requests) =>
        Effect.gen(function*() {
          const created = yield* client.create("hello", { query: "<hi>" }, { agentVersion: "abc" })
          yield* client.create("hello")
          yield* client.create("hello", null)
          expect(created.id).toBe(EXEC)
          expect(created.status).toBe("running")
          expect(requests.map((r) => [r.method, pathOf(r.url), r.text])).toEqual([
            ["POST", "/v0/executions", "{\"agent_id\":\"hello\",\"input\":{\"query\":\"<hi>\"},\"agent_version\":\"abc\"}"],
            ["POST", "/v0/executions", "{\"agent_id\":\"hello\"}"],
            ["POST", "/v0/executions", "{\"agent_id\":\"hello\",\"input\":null}"]
          ])
          for (const request of requests) {
            expect(request.headers["content-type"]).toBe("application/json")
            expect("authorization" in request.headers).toBe(false)
          }
        })
    ))

  it.effect("create: non-JSON input fails before anything is sent", () =>
    withClient(
      () => json(201, execution(EXEC)),
      (client, requests) =>
        Effect.gen(function*() {
          const error = failureOf(yield* Effect.exit(client.create("hello", { n: Number.NaN })))
          expect(error).toBeInstanceOf(InvalidArguments)
          expect(error).toMatchObject({ path: "$.n" })
          expect(requests).toHaveLength(0)
        })
    ))

  it.effect("create is never retried (503 and transport failure: one request each)", () =>
    withClient(
      (_, index) => (index === 0 ? envelope(503, "internal_error", "down") : "transport"),
      (client, requests) =>
        Effect.gen(function*() {
          expect(failureOf(yield* driveClock(client.create("hello", {})))).toMatchObject({ status: 503 })
          expect(requests).toHaveLength(1)
          expect(failureOf(yield* driveClock(client.create("hello", {})))).toMatchObject({ reason: { _tag: "TransportError" } })
          yield* TestClock.adjust("1 minute")
          expect(requests).toHaveLength(2)
        })
    ))

  it.effect("get is retried on a 5xx", () =>
    withClient(
      (_, index) => (index === 0 ? envelope(502, "internal_error", "bad gateway") : json(200, execution(EXEC))),
      (client, requests) =>
        Effect.gen(function*() {
          const exit = yield* driveClock(client.get(EXEC))
          expect(Exit.isSuccess(exit)).toBe(true)
          expect(requests.map((r) => [r.method, pathOf(r.url)])).toEqual([
            ["GET", `/v0/executions/${EXEC}`],
            ["GET", `/v0/executions/${EXEC}`]
          ])
        })
    ))

  it.effect("get: 404 is a Status KernelError with code and status", () =>
    withClient(
      () => envelope(404, "not_found", "not found"),
      (client) =>
        Effect.gen(function*() {
          const error = failureOf(yield* Effect.exit(client.get(EXEC)))
          expect(error).toBeInstanceOf(KernelError)
          expect(error).toMatchObject({
            reason: { _tag: "StatusError", status: 404, code: "not_found", description: "not found" },
            status: 404,
            code: "not_found"
          })
        })
    ))

  it.effect("list: query parameters, null executions and the cursor", () =>
    withClient(
      (_, index) =>
        index === 0
          ? json(200, { executions: [execution(EXEC2), execution(EXEC)], next_cursor: EXEC })
          : json(200, { executions: null }),
      (client, requests) =>
        Effect.gen(function*() {
          const first = yield* client.list({ agentId: "hello", status: "running", limit: 2 })
          expect(first.executions.map((e) => e.id)).toEqual([EXEC2, EXEC])
          expect(first.nextCursor).toBe(EXEC)
          const second = yield* client.list({ agentId: "hello", cursor: first.nextCursor })
          expect(second).toEqual({ executions: [], nextCursor: undefined })
          expect(requests.map((r) => pathOf(r.url))).toEqual([
            "/v0/executions?agent_id=hello&status=running&limit=2",
            `/v0/executions?agent_id=hello&cursor=${EXEC}`
          ])
        })
    ))

  it.effect("listAll pages through every execution", () =>
    withClient(
      (request) => {
        const url = new URL(request.url)
        switch (url.searchParams.get("cursor")) {
          case null:
            return json(200, { executions: [execution(EXEC3), execution(EXEC2)], next_cursor: EXEC2 })
          case EXEC2:
            return json(200, { executions: [execution(EXEC)], next_cursor: EXEC })
          default:
            return json(200, { executions: null })
        }
      },
      (client, requests) =>
        Effect.gen(function*() {
          const all = yield* Stream.runCollect(client.listAll({ limit: 2 }))
          expect(all.map((e) => e.id)).toEqual([EXEC3, EXEC2, EXEC])
          expect(requests.map((r) => pathOf(r.url))).toEqual([
            "/v0/executions?limit=2",
            `/v0/executions?cursor=${EXEC2}&limit=2`,
            `/v0/executions?cursor=${EXEC}&limit=2`
          ])
        })
    ))

  it.effect("cancel: POST without a body; 409 execution_terminal counts as success; 404 does not", () =>
    withClient(
      (_, index) =>
        index === 0
          ? noContent()
          : index === 1
          ? envelope(409, "execution_terminal", "execution terminal")
          : envelope(404, "not_found", "not found"),
      (client, requests) =>
        Effect.gen(function*() {
          yield* client.cancel(EXEC)
          yield* client.cancel(EXEC)
          const error = failureOf(yield* Effect.exit(client.cancel(EXEC)))
          expect(error).toMatchObject({ status: 404, code: "not_found" })
          expect(requests[0]!.method).toBe("POST")
          expect(pathOf(requests[0]!.url)).toBe(`/v0/executions/${EXEC}/cancel`)
          expect(requests[0]!.text).toBeUndefined()
        })
    ))
})

describe("Client events", () => {
  it.effect("events: after_seq and limit, null → []", () =>
    withClient(
      (_, index) => (index === 0 ? json(200, [event(1), event(2)]) : json(200, null)),
      (client, requests) =>
        Effect.gen(function*() {
          const page = yield* client.events(EXEC)
          expect(page.map((e) => e.eventSeq)).toEqual([1, 2])
          expect(page[0]!.payload).toEqual({ n: 1 })
          expect(yield* client.events(EXEC, { afterSeq: 2, limit: 10 })).toEqual([])
          expect(requests.map((r) => pathOf(r.url))).toEqual([
            `/v0/executions/${EXEC}/events?after_seq=0&limit=100`,
            `/v0/executions/${EXEC}/events?after_seq=2&limit=10`
          ])
        })
    ))

  it.effect("follow polls after the last seq and ends after the final events of a terminal execution", () => {
    let polls = 0
    return withClient(
      (request) => {
        const url = new URL(request.url)
        if (url.pathname.endsWith("/events")) {
          const after = Number(url.searchParams.get("after_seq"))
          const stored = polls < 2 ? [1, 2, 3] : [1, 2, 3, 4, 5]
          return json(200, stored.filter((n) => n > after).map((n) => event(n)) || null)
        }
        polls++
        return json(200, execution(EXEC, polls < 2 ? "running" : "completed"))
      },
      (client, requests) =>
        Effect.gen(function*() {
          const fiber = yield* Effect.forkChild(Stream.runCollect(client.follow(EXEC)))
          yield* settleUntil(() => requests.length === 2)
          expect(requests.map((r) => pathOf(r.url))).toEqual([
            `/v0/executions/${EXEC}`,
            `/v0/executions/${EXEC}/events?after_seq=0&limit=100`
          ])
          yield* settleUntil(() => false)
          expect(requests).toHaveLength(2)
          // Nothing happens until the poll interval has passed on the virtual clock.
          yield* TestClock.adjust("499 millis")
          yield* settle
          expect(requests).toHaveLength(2)
          yield* TestClock.adjust("1 millis")
          const events = yield* Fiber.join(fiber)
          expect(events.map((e) => e.eventSeq)).toEqual([1, 2, 3, 4, 5])
          expect(requests.map((r) => pathOf(r.url))).toEqual([
            `/v0/executions/${EXEC}`,
            `/v0/executions/${EXEC}/events?after_seq=0&limit=100`,
            `/v0/executions/${EXEC}`,
            `/v0/executions/${EXEC}/events?after_seq=3&limit=100`,
            `/v0/executions/${EXEC}/events?after_seq=5&limit=100`
          ])
        })
    )
  })

  it.effect("follow drains full pages without waiting and honours afterSeq and pollInterval", () =>
    withClient(
      (request) => {
        const url = new URL(request.url)
        if (!url.pathname.endsWith("/events")) return json(200, execution(EXEC, "cancelled"))
        const after = Number(url.searchParams.get("after_seq"))
        const limit = Number(url.searchParams.get("limit"))
        const all = [1, 2, 3, 4, 5, 6, 7].filter((n) => n > after).slice(0, limit)
        return json(200, all.length === 0 ? null : all.map((n) => event(n)))
      },
      (client, requests) =>
        Effect.gen(function*() {
          const events = yield* Stream.runCollect(client.follow(EXEC, { afterSeq: 1, limit: 2, pollInterval: "1 hour" }))
          expect(events.map((e) => e.eventSeq)).toEqual([2, 3, 4, 5, 6, 7])
          expect(requests.filter((r) => !r.url.includes("/events"))).toHaveLength(1)
        })
    ))

  it.effect("follow surfaces errors", () =>
    withClient(
      () => envelope(404, "not_found", "not found"),
      (client) =>
        Effect.gen(function*() {
          const exit = yield* Effect.exit(Stream.runCollect(client.follow(EXEC)))
          expect(failureOf(exit)).toMatchObject({ status: 404 })
        })
    ))
})

describe("Client live deltas (SSE)", () => {
  const sse = (chunks: ReadonlyArray<string>, status = 200) => {
    const encoder = new TextEncoder()
    return new Response(
      new ReadableStream<Uint8Array>({
        start(controller) {
          for (const chunk of chunks) controller.enqueue(encoder.encode(chunk))
          controller.close()
        }
      }),
      { status, headers: { "content-type": "text/event-stream" } }
    )
  }

  it.effect("parses data events split across chunks and mid-line, with CRLF; ignores comments and other fields", () =>
    withClient(
      () =>
        sse([
          ": keep-alive\n\n",
          `data: {"step_id":"${STEP}","se`,
          `q":0,"data":"hel"}\n`,
          "\ndata: {\"step_id\":\"s2\",\"seq\":1,\"data\":\"\u00e9\u20ac",
          "\ud83d\ude42\\u003c\"}\r",
          "\n\r\n",
          "event: ignored\nid: 3\ndata:{\"step_id\":\"s2\",\"seq\":2,\"data\":\"\"}\n\n",
          "data: {\"step_id\":\"s2\",\"seq\":3,\"data\":\"unterminated\"}\n"
        ]),
      (client, requests) =>
        Effect.gen(function*() {
          const deltas = yield* Stream.runCollect(client.deltas(EXEC))
          expect(deltas).toEqual([
            { stepId: STEP, seq: 0, data: "hel" },
            { stepId: "s2", seq: 1, data: "é€🙂<" },
            { stepId: "s2", seq: 2, data: "" }
          ])
          expect(requests[0]!.method).toBe("GET")
          expect(pathOf(requests[0]!.url)).toBe(`/v0/executions/${EXEC}/stream`)
          expect(requests[0]!.headers["accept"]).toBe("text/event-stream")
        })
    ))

  it.effect("byte chunks split inside a UTF-8 sequence", () => {
    const bytes = new TextEncoder().encode(`data: {"step_id":"a","seq":0,"data":"€"}\n\n`)
    const cut = bytes.indexOf(0xe2) + 1
    return withClient(
      () =>
        new Response(
          new ReadableStream<Uint8Array>({
            start(controller) {
              controller.enqueue(bytes.slice(0, cut))
              controller.enqueue(bytes.slice(cut))
              controller.close()
            }
          }),
          { status: 200 }
        ),
      (client) =>
        Effect.gen(function*() {
          const deltas = yield* Stream.runCollect(client.deltas(EXEC))
          expect(deltas).toEqual([{ stepId: "a", seq: 0, data: "€" }])
        })
    )
  })

  it.effect("an error answer fails the stream with the mapped error", () =>
    withClient(
      () => envelope(400, "validation_error", "validation error"),
      (client) =>
        Effect.gen(function*() {
          const exit = yield* Effect.exit(Stream.runCollect(client.deltas("not-a-uuid")))
          expect(failureOf(exit)).toMatchObject({
            reason: { _tag: "StatusError", status: 400, code: "validation_error" },
            status: 400,
            code: "validation_error"
          })
        })
    ))

  it.effect("a non-JSON data line fails the stream with a Decode error", () =>
    withClient(
      () => sse(["data: nope\n\n"]),
      (client) =>
        Effect.gen(function*() {
          const exit = yield* Effect.exit(Stream.runCollect(client.deltas(EXEC)))
          expect(failureOf(exit)).toMatchObject({ reason: { _tag: "DecodeError" } })
        })
    ))

  it("the parser joins multi-line data and handles CR, LF and CRLF line ends", () => {
    const parser = makeSseParser()
    const out = [
      ...parser.feed("\ufeffdata: a\r\ndata:b\rdata:  c\n"),
      ...parser.feed("\r"),
      ...parser.feed("\n"),
      ...parser.feed(": comment\n\n\n"),
      ...parser.feed("data\n\n"),
      ...parser.feed("retry: 5\n\n")
    ]
    expect(out).toEqual(["a\nb\n c", ""])
  })
})

describe("Client steps, approvals, agents, policies", () => {
  it.effect("listSteps / getStep", () =>
    withClient(
      (request) =>
        request.url.endsWith("/steps")
          ? json(200, null)
          : request.url.endsWith("?status=terminal")
          ? json(200, [{ step_id: STEP, status: "succeeded", result: { ok: true } }])
          : json(200, { step_id: STEP, status: "executing", occurrence: 1 }),
      (client, requests) =>
        Effect.gen(function*() {
          expect(yield* client.listSteps(EXEC)).toEqual([])
          const terminal = yield* client.listSteps(EXEC, { status: "terminal" })
          expect(terminal.map((s) => [s.stepId, s.status, s.result])).toEqual([[STEP, "succeeded", { ok: true }]])
          const step = yield* client.getStep(EXEC, STEP)
          expect(step.occurrence).toBe(1)
          expect(requests.map((r) => pathOf(r.url))).toEqual([
            `/v0/executions/${EXEC}/steps`,
            `/v0/executions/${EXEC}/steps?status=terminal`,
            `/v0/executions/${EXEC}/steps/${STEP}`
          ])
        })
    ))

  it.effect("approvals: list (null → []), get, grant and deny bodies", () =>
    withClient(
      (request) =>
        request.url.endsWith("/approvals")
          ? json(200, null)
          : request.method === "GET"
          ? json(200, { id: APPROVAL, status: "pending", approvers: ["alice"], step_id: STEP })
          : noContent(),
      (client, requests) =>
        Effect.gen(function*() {
          expect(yield* client.listApprovals()).toEqual([])
          const approval = yield* client.getApproval(APPROVAL)
          expect(approval.approvers).toEqual(["alice"])
          yield* client.grantApproval(APPROVAL, { decidedBy: "alice" })
          yield* client.denyApproval(APPROVAL, { decidedBy: "bob", rationale: "too risky" })
          expect(requests.map((r) => [r.method, pathOf(r.url), r.text])).toEqual([
            ["GET", "/v0/approvals", undefined],
            ["GET", `/v0/approvals/${APPROVAL}`, undefined],
            ["POST", `/v0/approvals/${APPROVAL}/grant`, "{\"decided_by\":\"alice\"}"],
            ["POST", `/v0/approvals/${APPROVAL}/deny`, "{\"decided_by\":\"bob\",\"rationale\":\"too risky\"}"]
          ])
        })
    ))

  it.effect("grant: a 409 conflict after a lost answer is confirmed with GET and counts as success", () =>
    withClient(
      (request, index) =>
        index === 0
          ? "transport"
          : request.method === "POST"
          ? envelope(409, "conflict", "conflict")
          : json(200, { id: APPROVAL, status: "granted", decided_by: "alice" }),
      (client, requests) =>
        Effect.gen(function*() {
          expect(yield* driveClock(client.grantApproval(APPROVAL, { decidedBy: "alice" }))).toEqual(Exit.void)
          expect(requests.map((r) => r.method)).toEqual(["POST", "POST", "GET"])
        })
    ))

  it.effect("grant: a plain 409 conflict (no earlier lost answer) is an error", () =>
    withClient(
      () => envelope(409, "conflict", "conflict"),
      (client, requests) =>
        Effect.gen(function*() {
          const error = failureOf(yield* Effect.exit(client.grantApproval(APPROVAL, { decidedBy: "alice" })))
          expect(error).toMatchObject({ status: 409, code: "conflict" })
          expect(requests).toHaveLength(1)
        })
    ))

  it.effect("agents: register (secret sent, never decoded back), list, get, delete; loadPolicy", () =>
    withClient(
      (request) => {
        const path = pathOf(request.url)
        if (path === "/v0/agents" && request.method === "POST") {
          return json(201, {
            ID: "hello",
            WebhookURL: "http://localhost:5000/webhook",
            Secret: "hello-secret",
            PolicyBundle: "",
            RegisteredAt: "0001-01-01T00:00:00Z"
          })
        }
        if (path === "/v0/agents") return json(200, [{ ID: "a" }, { ID: "b" }])
        if (path.startsWith("/v0/agents/") && request.method === "GET") {
          return json(200, { ID: "my agent", PolicyBundle: "default_action: deny\n" })
        }
        if (path.startsWith("/v0/policies/")) {
          return request.text === "{\"bundle\":\"bad\"}"
            ? envelope(400, "validation_error", "load policy bundle: validation error: invalid policy bundle: x")
            : noContent()
        }
        return noContent()
      },
      (client, requests) =>
        Effect.gen(function*() {
          const agent = yield* client.registerAgent({
            id: "hello",
            webhookUrl: "http://localhost:5000/webhook",
            secret: Redacted.make("hello-secret")
          })
          expect(agent.id).toBe("hello")
          expect(JSON.stringify(agent)).not.toContain("hello-secret")
          expect((yield* client.listAgents()).map((a) => a.id)).toEqual(["a", "b"])
          expect((yield* client.getAgent("my agent")).policyBundle).toBe("default_action: deny\n")
          yield* client.deleteAgent("my agent")
          yield* client.loadPolicy("my agent", "default_action: deny\n")
          const error = failureOf(yield* Effect.exit(client.loadPolicy("hello", "bad")))
          expect(error).toMatchObject({
            status: 400,
            code: "validation_error",
            reason: {
              _tag: "StatusError",
              description: "load policy bundle: validation error: invalid policy bundle: x"
            }
          })
          expect(requests.map((r) => [r.method, pathOf(r.url), r.text])).toEqual([
            [
              "POST",
              "/v0/agents",
              "{\"id\":\"hello\",\"webhook_url\":\"http://localhost:5000/webhook\",\"secret\":\"hello-secret\"}"
            ],
            ["GET", "/v0/agents", undefined],
            ["GET", "/v0/agents/my%20agent", undefined],
            ["DELETE", "/v0/agents/my%20agent", undefined],
            ["POST", "/v0/policies/my%20agent", "{\"bundle\":\"default_action: deny\\n\"}"],
            ["POST", "/v0/policies/hello", "{\"bundle\":\"bad\"}"]
          ])
        })
    ))
})

describe("Client: the current stage (PROTOCOL-CURRENT C.4, C.5, C.9.2, C.10)", () => {
  const SESSION_EXEC = { ...execution(EXEC, "pending"), session: "chat:u42", idempotency_key: "k-1" }
  const KEY_ID = "01920000-0000-7000-8000-0000000000aa"
  const TOKEN = "rbk_01920000-0000-7000-8000-0000000000aa.AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"

  it.effect("create: session, idempotency key, parent and spawned_by in the body; empty members omitted", () =>
    withClient(
      () => json(201, SESSION_EXEC),
      (client, requests) =>
        Effect.gen(function*() {
          yield* client.create("hello", { q: 1 }, {
            session: "chat:u42",
            idempotencyKey: "k-1",
            parentExecutionId: EXEC2,
            spawnedBy: { executionId: EXEC3, stepId: STEP }
          })
          yield* client.create("hello", undefined, { session: "", idempotencyKey: "", parentExecutionId: "", agentVersion: "" })
          yield* client.create("hello", null, { session: "s" })
          expect(requests.map((r) => r.text)).toEqual([
            `{"agent_id":"hello","input":{"q":1},"session":"chat:u42","parent_execution_id":"${EXEC2}",` +
            `"idempotency_key":"k-1","spawned_by":{"execution_id":"${EXEC3}","step_id":"${STEP}"}}`,
            "{\"agent_id\":\"hello\"}",
            "{\"agent_id\":\"hello\",\"input\":null,\"session\":\"s\"}"
          ])
          for (const text of requests.map((r) => r.text)) expect(text).not.toContain("agent_version")
        })
    ))

  it.effect("create: agent_version only when asked for (older kernels); a current kernel's 400 is a StatusError", () =>
    withClient(
      (request) =>
        request.text!.includes("agent_version")
          ? envelope(400, "validation_error", "validation error: json: unknown field \"agent_version\"")
          : json(201, execution(EXEC)),
      (client, requests) =>
        Effect.gen(function*() {
          const error = failureOf(yield* Effect.exit(client.create("hello", {}, { agentVersion: "v1" })))
          expect(error).toBeInstanceOf(KernelError)
          expect(error).toMatchObject({ reason: { _tag: "StatusError", status: 400, code: "validation_error" } })
          expect(requests[0]!.text).toBe("{\"agent_id\":\"hello\",\"input\":{},\"agent_version\":\"v1\"}")
          expect(requests).toHaveLength(1)
        })
    ))

  it.effect("create: the answer's session members decode (pending execution of a busy session)", () =>
    withClient(
      () => json(201, SESSION_EXEC),
      (client) =>
        Effect.gen(function*() {
          const created = yield* client.create("hello", {}, { session: "chat:u42", idempotencyKey: "k-1" })
          expect(created.status).toBe("pending")
          expect(created.id).toBe(EXEC)
        })
    ))

  it.effect("create with an idempotency key (or spawned_by) is retried on transport failures; without one it is not", () =>
    withClient(
      (_, index) => (index % 2 === 0 ? "transport" : json(201, execution(EXEC))),
      (client, requests) =>
        Effect.gen(function*() {
          expect(Exit.isSuccess(yield* driveClock(client.create("hello", {}, { idempotencyKey: "k-1" })))).toBe(true)
          expect(requests).toHaveLength(2)
          expect(requests[0]!.text).toBe(requests[1]!.text)
          expect(
            Exit.isSuccess(yield* driveClock(client.create("hello", {}, { spawnedBy: { executionId: EXEC2, stepId: STEP } })))
          ).toBe(true)
          expect(requests).toHaveLength(4)
          const error = failureOf(yield* driveClock(client.create("hello", {}, { session: "s" })))
          expect(error).toMatchObject({ reason: { _tag: "TransportError" } })
          yield* TestClock.adjust("1 minute")
          expect(requests).toHaveLength(5)
        })
    ))

  it.effect("previous: GET …/previous returns the state as is; null without a parent; errors are StatusErrors", () =>
    withClient(
      (_, index) =>
        index === 0
          ? json(200, { state: { messages: ["hi"] } })
          : index === 1
          ? json(200, { state: null })
          : index === 2
          ? envelope(502, "internal_error", "bad gateway")
          : index === 3
          ? json(200, { state: 7 })
          : envelope(403, "forbidden", "forbidden"),
      (client, requests) =>
        Effect.gen(function*() {
          expect(yield* client.previous(EXEC)).toEqual({ messages: ["hi"] })
          expect(yield* client.previous(EXEC)).toBeNull()
          const retried = yield* driveClock(client.previous(EXEC))
          expect(retried).toEqual(Exit.succeed(7))
          const error = failureOf(yield* Effect.exit(client.previous(EXEC)))
          expect(error).toMatchObject({ reason: { _tag: "StatusError", status: 403, code: "forbidden" } })
          expect(requests.map((r) => [r.method, pathOf(r.url), r.text])).toEqual(
            Array.from({ length: 5 }, () => ["GET", `/v0/executions/${EXEC}/previous`, undefined])
          )
        }),
      { apiKey: Redacted.make(API_KEY) }
    ))

  it.effect("list: the session filter", () =>
    withClient(
      () => json(200, { executions: [SESSION_EXEC] }),
      (client, requests) =>
        Effect.gen(function*() {
          const page = yield* client.list({ agentId: "hello", session: "chat:u42 c7", status: "pending" })
          expect(page.executions.map((e) => e.id)).toEqual([EXEC])
          yield* Stream.runCollect(client.listAll({ session: "s" }))
          expect(requests.map((r) => pathOf(r.url))).toEqual([
            "/v0/executions?agent_id=hello&session=chat%3Au42%20c7&status=pending",
            "/v0/executions?session=s"
          ])
        })
    ))

  it.effect("cancel: 409 conflict of a current kernel is a typed StatusError; 409 execution_terminal still counts as done", () =>
    withClient(
      (_, index) =>
        index === 0
          ? envelope(409, "conflict", "conflict: execution is already terminal")
          : envelope(409, "execution_terminal", "execution terminal"),
      (client, requests) =>
        Effect.gen(function*() {
          const error = failureOf(yield* Effect.exit(client.cancel(EXEC)))
          expect(error).toBeInstanceOf(KernelError)
          expect(error).toMatchObject({
            status: 409,
            code: "conflict",
            reason: { _tag: "StatusError", description: "conflict: execution is already terminal" }
          })
          yield* client.cancel(EXEC)
          expect(requests).toHaveLength(2)
        })
    ))

  it.effect("cancel: a 409 conflict after a try lost in transit is that try's success when the execution reads cancelled", () =>
    withClient(
      (request, index) => {
        if (request.method === "GET") return json(200, execution(EXEC, index < 4 ? "cancelled" : "completed"))
        return index === 0 || index === 3 ? "transport" : envelope(409, "conflict", "conflict: execution is already terminal")
      },
      (client, requests) =>
        Effect.gen(function*() {
          expect(yield* driveClock(client.cancel(EXEC))).toEqual(Exit.void)
          expect(requests.map((r) => [r.method, pathOf(r.url)])).toEqual([
            ["POST", `/v0/executions/${EXEC}/cancel`],
            ["POST", `/v0/executions/${EXEC}/cancel`],
            ["GET", `/v0/executions/${EXEC}`]
          ])
          // Lost, then conflict, but the execution completed on its own: the conflict stands.
          const error = failureOf(yield* driveClock(client.cancel(EXEC)))
          expect(error).toMatchObject({ status: 409, code: "conflict" })
        })
    ))

  it.effect("API keys: create (token as Redacted), list (revoked included), rotate, delete — bodies and paths", () =>
    withClient(
      (request) => {
        const path = pathOf(request.url)
        if (path === "/v0/api-keys" && request.method === "POST") {
          return new Response(
            JSON.stringify({
              id: KEY_ID,
              name: "reader",
              scopes: ["executions:read"],
              created_at: "2026-08-18T19:40:54Z",
              token: TOKEN
            }),
            { status: 201, headers: { "content-type": "application/json", "cache-control": "no-store" } }
          )
        }
        if (path === "/v0/api-keys") {
          return json(200, [
            { id: KEY_ID, name: "reader", scopes: ["executions:read"], created_at: "2026-08-18T19:40:54Z" },
            {
              id: EXEC3,
              name: "old",
              scopes: null,
              created_at: "2026-08-18T19:40:54Z",
              revoked_at: "2026-08-19T00:00:00Z",
              extra: 1
            }
          ])
        }
        if (path.endsWith("/rotate")) {
          return json(200, {
            id: KEY_ID,
            name: "reader",
            scopes: ["executions:read"],
            created_at: "2026-08-18T19:40:54Z",
            token: "rbk_new"
          })
        }
        return noContent()
      },
      (client, requests) =>
        Effect.gen(function*() {
          const created = yield* client.createApiKey({ name: "reader", scopes: ["executions:read"] })
          expect(created).toMatchObject({
            id: KEY_ID,
            name: "reader",
            scopes: ["executions:read"],
            createdAt: "2026-08-18T19:40:54Z"
          })
          expect(Redacted.isRedacted(created.token)).toBe(true)
          expect(Redacted.value(created.token)).toBe(TOKEN)
          expect(JSON.stringify(created)).not.toContain(TOKEN)
          expect(String(created.token)).not.toContain(TOKEN)
          const keys = yield* client.listApiKeys()
          expect(keys).toEqual([
            { id: KEY_ID, name: "reader", scopes: ["executions:read"], createdAt: "2026-08-18T19:40:54Z" },
            { id: EXEC3, name: "old", scopes: [], createdAt: "2026-08-18T19:40:54Z", revokedAt: "2026-08-19T00:00:00Z" }
          ])
          const rotated = yield* client.rotateApiKey(KEY_ID)
          expect(rotated.id).toBe(KEY_ID)
          expect(Redacted.value(rotated.token)).toBe("rbk_new")
          yield* client.deleteApiKey(KEY_ID)
          expect(requests.map((r) => [r.method, pathOf(r.url), r.text])).toEqual([
            ["POST", "/v0/api-keys", "{\"name\":\"reader\",\"scopes\":[\"executions:read\"]}"],
            ["GET", "/v0/api-keys", undefined],
            ["POST", `/v0/api-keys/${KEY_ID}/rotate`, undefined],
            ["DELETE", `/v0/api-keys/${KEY_ID}`, undefined]
          ])
        })
    ))

  it.effect("API keys: errors are typed StatusErrors; create is never retried, list / rotate / delete are", () =>
    withClient(
      (request, index) => {
        if (index === 0) return envelope(400, "validation_error", "validation error: unknown scope \"root\"")
        if (index === 1) return envelope(409, "conflict", "conflict")
        if (index === 2) return envelope(403, "forbidden", "forbidden")
        if (request.method === "POST" && pathOf(request.url) === "/v0/api-keys") return "transport"
        return index % 2 === 0 ? "transport" : request.method === "GET" ? json(200, null) : noContent()
      },
      (client, requests) =>
        Effect.gen(function*() {
          expect(failureOf(yield* Effect.exit(client.createApiKey({ name: "x", scopes: ["root"] })))).toMatchObject({
            reason: { _tag: "StatusError", status: 400, code: "validation_error" }
          })
          expect(failureOf(yield* Effect.exit(client.rotateApiKey(KEY_ID)))).toMatchObject({ status: 409, code: "conflict" })
          expect(failureOf(yield* Effect.exit(client.listApiKeys()))).toMatchObject({ status: 403, code: "forbidden" })
          expect(failureOf(yield* driveClock(client.createApiKey({ name: "x", scopes: ["executions:read"] }))))
            .toMatchObject({ reason: { _tag: "TransportError" } })
          expect(requests).toHaveLength(4)
          expect(yield* driveClock(client.listApiKeys())).toEqual(Exit.succeed([]))
          expect(yield* driveClock(client.deleteApiKey(KEY_ID))).toEqual(Exit.void)
          expect(requests).toHaveLength(8)
        })
    ))

  it.effect("registerAgent: lease_timeout_seconds only when given", () =>
    withClient(
      () => json(201, { id: "hello", webhook_url: "http://a/webhook", registered_at: "2026-08-18T19:40:54Z" }),
      (client, requests) =>
        Effect.gen(function*() {
          yield* client.registerAgent({ id: "hello", webhookUrl: "http://a/webhook", secret: "s", leaseTimeoutSeconds: 60 })
          expect(requests[0]!.text).toBe(
            "{\"id\":\"hello\",\"webhook_url\":\"http://a/webhook\",\"secret\":\"s\",\"lease_timeout_seconds\":60}"
          )
        })
    ))
})

describe("Client configuration", () => {
  it.effect("sends Authorization: Bearer only when an API key is configured, and never leaks it", () =>
    withClient(
      (_, index) => (index === 0 ? json(200, execution(EXEC)) : "transport"),
      (client, requests) =>
        Effect.gen(function*() {
          yield* client.get(EXEC)
          expect(requests[0]!.headers["authorization"]).toBe(`Bearer ${API_KEY}`)
          const error = failureOf(yield* driveClock(client.get(EXEC)))
          expect(error.message).not.toContain(API_KEY)
          expect(String(error)).not.toContain(API_KEY)
          expect(JSON.stringify(error)).not.toContain(API_KEY)
        }),
      { apiKey: Redacted.make(API_KEY) }
    ))

  it.effect("base URL prefix and trailing slashes", () =>
    withClient(
      () => json(200, null),
      (client, requests) =>
        Effect.gen(function*() {
          yield* client.listApprovals()
          expect(requests[0]!.url).toBe("http://kernel:8080/prefix/v0/approvals")
        }),
      { baseUrl: "http://kernel:8080/prefix//" }
    ))

  it.effect("timeouts: a silent kernel gives a Transport error after the configured timeout", () =>
    withClient(
      () => "never",
      (client, requests) =>
        Effect.gen(function*() {
          const fiber = yield* Effect.forkChild(client.create("hello"))
          yield* settleUntil(() => requests.length === 1)
          yield* TestClock.adjust("5 seconds")
          const error = failureOf(yield* Fiber.await(fiber))
          expect(error).toMatchObject({ _tag: "KernelError", reason: { _tag: "TransportError" } })
          expect(requests).toHaveLength(1)
        }),
      { timeout: "5 seconds" }
    ))

  const getVia = (layer: Layer.Layer<Client.Client, unknown>, env: ReadonlyArray<readonly [string, string]>) =>
    Client.Client.use((client) => client.listApprovals()).pipe(
      Effect.provide(layer),
      Effect.provideService(
        ConfigProvider.ConfigProvider,
        ConfigProvider.fromUnknown(Object.fromEntries(env), { preserveEmptyStrings: true })
      ),
      Effect.exit
    )

  it.effect("layerConfig: REBUNO_URL required, REBUNO_API_KEY optional", () =>
    Effect.gen(function*() {
      const double = makeDouble(() => json(200, null))
      const layer = Client.layerConfig().pipe(Layer.provide(double.layer))
      expect(Exit.isSuccess(yield* getVia(layer, [["REBUNO_URL", "http://env:1"]]))).toBe(true)
      expect(double.requests[0]!.url).toBe("http://env:1/v0/approvals")
      expect("authorization" in double.requests[0]!.headers).toBe(false)
      expect(Exit.isSuccess(yield* getVia(layer, [["REBUNO_URL", "http://env:1"], ["REBUNO_API_KEY", ""]]))).toBe(
        true
      )
      expect("authorization" in double.requests[1]!.headers).toBe(false)
      expect(
        Exit.isSuccess(yield* getVia(layer, [["REBUNO_URL", "http://env:1"], ["REBUNO_API_KEY", API_KEY]]))
      ).toBe(true)
      expect(double.requests[2]!.headers["authorization"]).toBe(`Bearer ${API_KEY}`)
      expect(Exit.isFailure(yield* getVia(layer, []))).toBe(true)
      expect(double.requests).toHaveLength(3)
    }))

  it.effect("fromEnv reads REBUNO_API_KEY as a Redacted that prints nothing", () =>
    Effect.gen(function*() {
      const settings = yield* Config.unwrap(Client.fromEnv).pipe(
        Effect.provideService(
          ConfigProvider.ConfigProvider,
          ConfigProvider.fromUnknown({ REBUNO_URL: "http://env:1", REBUNO_API_KEY: API_KEY })
        )
      )
      expect(Redacted.isRedacted(settings.apiKey)).toBe(true)
      expect(Redacted.value(settings.apiKey!)).toBe(API_KEY)
      expect(String(settings.apiKey)).not.toContain(API_KEY)
      expect(JSON.stringify(settings)).not.toContain(API_KEY)
    }))

  it.effect("layer: options, and a bad base URL fails fast", () =>
    Effect.gen(function*() {
      const double = makeDouble(() => json(200, null))
      const ok = Client.layer({ baseUrl: "https://k.example/", apiKey: "k" }).pipe(Layer.provide(double.layer))
      expect(Exit.isSuccess(yield* getVia(ok, []))).toBe(true)
      expect(double.requests[0]!.url).toBe("https://k.example/v0/approvals")
      expect(double.requests[0]!.headers["authorization"]).toBe("Bearer k")
      const bad = Client.layer({ baseUrl: "" }).pipe(Layer.provide(double.layer))
      expect(Exit.isFailure(yield* getVia(bad, []))).toBe(true)
    }))
})

describe("Client against the embedded kernel (current stage)", () => {
  const echo = Agent.make({
    id: "echo",
    input: Schema.Struct({ text: Schema.String }),
    state: Schema.Array(Schema.String),
    handler: ({ text }, session) =>
      Effect.gen(function*() {
        const seen = Option.getOrElse(yield* session.previous, () => [])
        return session.withState({ text, seen: seen.length }, [...seen, text])
      })
  })
  const kit = (stage: "current" | "seed" = "current") => TestKernel.layer({ agents: [echo], stage })

  it.effect("create with a session: pending while the session is busy; previous reads the stored state", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const first = yield* client.create("echo", { text: "a" }, { session: "chat:1" })
      const second = yield* client.create("echo", { text: "b" }, { session: "chat:1" })
      expect([first.status, first.session, second.status, second.session]).toEqual([
        "running",
        "chat:1",
        "pending",
        "chat:1"
      ])
      expect(yield* client.previous(first.id)).toBeNull()
      const done = yield* kernel.settle(second.id)
      expect(done.output).toEqual({ text: "b", seen: 1 })
      expect((yield* client.get(second.id)).parentExecutionId).toBe(first.id)
      expect(yield* client.previous(second.id)).toEqual(["a"])
      const page = yield* client.list({ session: "chat:1", status: "completed" })
      expect(page.executions.map((e) => e.id).sort()).toEqual([first.id, second.id].sort())
      expect((yield* client.list({ session: "chat:2" })).executions).toEqual([])
    }).pipe(Effect.provide(kit())))

  it.effect("idempotent create answers the first execution; bad input is a 400 and creates nothing", () =>
    Effect.gen(function*() {
      const client = yield* Client.Client
      const created = yield* client.create("echo", { text: "a" }, { idempotencyKey: "order-7" })
      const again = yield* client.create("echo", { text: "ignored" }, { idempotencyKey: "order-7" })
      expect(again.id).toBe(created.id)
      expect(again.idempotencyKey).toBe("order-7")
      const refused = [
        yield* Effect.flip(client.create("echo", {}, { agentVersion: "v1" })),
        yield* Effect.flip(client.create("echo", {}, { session: " " })),
        yield* Effect.flip(client.create("echo", {}, { spawnedBy: { executionId: created.id, stepId: "a".repeat(64) } }))
      ]
      expect(refused.map((e) => [e._tag, (e as KernelError).status, (e as KernelError).code])).toEqual([
        ["KernelError", 400, "validation_error"],
        ["KernelError", 400, "validation_error"],
        ["KernelError", 400, "validation_error"]
      ])
      expect((refused[2] as KernelError).reason.description).toBe(
        "validation error: spawned_by names no step of the parent execution"
      )
      expect((yield* client.list()).executions.map((e) => e.id)).toEqual([created.id])
    }).pipe(Effect.provide(kit())))

  it.effect("an explicit parent: previous reads its state; a parent that is not completed is 409 conflict", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const parent = yield* kernel.run(echo, { text: "root" })
      const child = yield* client.create("echo", { text: "next" }, { parentExecutionId: parent.executionId })
      expect(child.parentExecutionId).toBe(parent.executionId)
      expect(yield* client.previous(child.id)).toEqual(["root"])
      expect((yield* kernel.settle(child.id)).output).toEqual({ text: "next", seen: 1 })
      const running = yield* client.create("echo", { text: "later" })
      const refused = yield* Effect.flip(client.create("echo", {}, { parentExecutionId: running.id }))
      expect(refused).toMatchObject({
        status: 409,
        code: "conflict",
        reason: { description: "conflict: the parent must be a completed execution of the same agent" }
      })
    }).pipe(Effect.provide(kit())))

  it.effect("cancel of a terminal execution is a typed 409 conflict StatusError", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const run = yield* kernel.run(echo, { text: "a" })
      const error = yield* Effect.flip(client.cancel(run.executionId))
      expect(error).toBeInstanceOf(KernelError)
      expect(error).toMatchObject({
        status: 409,
        code: "conflict",
        reason: { _tag: "StatusError", description: "conflict: execution is already terminal" }
      })
      expect((yield* client.get(run.executionId)).status).toBe("completed")
      const pending = yield* client.create("echo", { text: "b" })
      yield* client.cancel(pending.id)
      expect((yield* client.get(pending.id)).status).toBe("cancelled")
    }).pipe(Effect.provide(kit())))

  it.effect("API keys: create, list, rotate and delete on the wire; a key's token authenticates with its scopes", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const created = yield* client.createApiKey({ name: "  ci  ", scopes: ["executions:write", "executions:read", "executions:read"] })
      expect(created).toMatchObject({ name: "ci", scopes: ["executions:read", "executions:write"] })
      expect(Redacted.value(created.token)).toMatch(new RegExp(`^rbk_${created.id}\\.[A-Za-z0-9_-]{43}$`))
      expect(JSON.stringify(created)).not.toContain(Redacted.value(created.token))
      const ci = yield* kernel.client({ apiKey: created.token })
      const execution = yield* ci.create("echo", { text: "x" })
      expect((yield* ci.get(execution.id)).id).toBe(execution.id)
      expect(yield* Effect.flip(ci.listApiKeys())).toMatchObject({ status: 403, code: "forbidden" })
      const refused = yield* Effect.flip(client.createApiKey({ name: "x", scopes: ["root"] }))
      expect(refused).toMatchObject({ status: 400, code: "validation_error" })
      expect(refused.reason.description).toBe("validation error: unknown scope \"root\"")
      const rotated = yield* client.rotateApiKey(created.id)
      expect([rotated.id, rotated.scopes]).toEqual([created.id, created.scopes])
      expect(Redacted.value(rotated.token)).not.toBe(Redacted.value(created.token))
      yield* client.deleteApiKey(created.id)
      yield* client.deleteApiKey(created.id)
      const listed = yield* client.listApiKeys()
      expect(listed).toHaveLength(1)
      expect(listed[0]).toMatchObject({ id: created.id, name: "ci", scopes: ["executions:read", "executions:write"] })
      expect(listed[0]!.revokedAt).toBeDefined()
      expect(yield* Effect.flip(client.rotateApiKey(created.id))).toMatchObject({ status: 409, code: "conflict" })
      expect(yield* Effect.flip(client.rotateApiKey("01920000-0000-7000-8000-0000000000ff"))).toMatchObject({
        status: 404,
        code: "not_found"
      })
    }).pipe(Effect.provide(kit())))

  it.effect("agents: the current kernel's snake_case agent JSON decodes; the secret never comes back", () =>
    Effect.gen(function*() {
      const client = yield* Client.Client
      const registered = yield* client.registerAgent({
        id: "remote",
        webhookUrl: "http://agent.invalid/webhook",
        secret: Redacted.make("remote-secret"),
        leaseTimeoutSeconds: 60
      })
      expect(registered).toMatchObject({ id: "remote", webhookUrl: "http://agent.invalid/webhook" })
      expect(JSON.stringify(registered)).not.toContain("remote-secret")
      expect((yield* client.listAgents()).map((a) => a.id)).toEqual(["echo", "remote"])
      yield* client.loadPolicy("remote", "default_action: deny\n")
      expect((yield* client.getAgent("remote")).policyBundle).toBe("default_action: deny\n")
    }).pipe(Effect.provide(kit())))

  it.effect("the seed stage: cancel of a terminal execution counts as done; agent_version is accepted", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const created = yield* client.create("echo", { text: "a" }, { agentVersion: "v7" })
      expect(created.agentVersion).toBe("v7")
      yield* kernel.settle(created.id)
      yield* client.cancel(created.id)
      expect(yield* Effect.flip(client.previous(created.id))).toMatchObject({ status: 404 })
    }).pipe(Effect.provide(kit("seed"))))
})

describe("Client forks (PROTOCOL-CURRENT C.7.1, C.7.3, C.7.4)", () => {
  const FORKED = {
    ...execution(EXEC2),
    input: { text: "a" },
    forked_from: EXEC,
    fork_seq: 9,
    restoration: { workspace: { checkpoint_ref: "snap-2", checkpoint_seq: 7, covered: true } }
  }

  it.effect("fork: POST …/fork with at_seq and only the non-empty options; the fork decoded; never retried", () =>
    withClient(
      (_, index) => index < 3 ? json(201, FORKED) : json(503, { code: "internal_error", message: "down" }),
      (client, requests) =>
        Effect.gen(function*() {
          const fork = yield* client.fork(EXEC, { atSeq: 9 })
          expect(fork).toMatchObject({ id: EXEC2, status: "running", forkedFrom: EXEC, forkSeq: 9 })
          yield* client.fork(EXEC, { atSeq: 9, session: "", policyBundle: "" })
          yield* client.fork(EXEC, { atSeq: 3, session: "what-if:1", policyBundle: "default_action: deny\n" })
          expect(requests.map((r) => [r.method, r.url, r.text])).toEqual([
            ["POST", `${BASE}/v0/executions/${EXEC}/fork`, "{\"at_seq\":9}"],
            ["POST", `${BASE}/v0/executions/${EXEC}/fork`, "{\"at_seq\":9}"],
            [
              "POST",
              `${BASE}/v0/executions/${EXEC}/fork`,
              "{\"at_seq\":3,\"session\":\"what-if:1\",\"policy_bundle\":\"default_action: deny\\n\"}"
            ]
          ])
          expect(requests[0]!.headers["content-type"]).toBe("application/json")
          const failed = failureOf(yield* Effect.exit(client.fork(EXEC, { atSeq: 9 })))
          expect(failed).toMatchObject({ _tag: "KernelError", status: 503 })
          expect(requests).toHaveLength(4)
        })
    ))

  it.effect("fork: the restoration decodes per resource; none when the member is absent or not an object", () =>
    withClient(
      () => json(201, FORKED),
      (client) =>
        Effect.gen(function*() {
          const fork = yield* client.fork(EXEC, { atSeq: 9 })
          expect(Protocol.decodeRestoration(fork.restoration)).toEqual({
            workspace: { checkpointRef: "snap-2", checkpointSeq: 7, covered: true }
          })
          expect(Protocol.decodeRestoration({ db: { covered: false } })).toEqual({ db: { covered: false } })
          expect(Protocol.decodeRestoration(undefined)).toEqual({})
          expect(Protocol.decodeRestoration([1])).toEqual({})
        })
    ))

  it.effect("forkPoints: GET …/fork-points decoded; retried after a transport failure", () =>
    withClient(
      (_, index) =>
        index === 0
          ? "transport"
          : json(200, {
            latest_seq: 14,
            resources: { workspace: 5 },
            checkpoints: [
              { key: "workspace", generation: 0, checkpoint_ref: "snap-0", covered_seq: 6, invalidated_seq: 10 },
              { key: "workspace", generation: 2, checkpoint_ref: "snap-1", covered_seq: 12 }
            ]
          }),
      (client, requests) =>
        Effect.gen(function*() {
          const points = yield* driveClock(client.forkPoints(EXEC)).pipe(Effect.flatMap((exit) => exit))
          expect(points).toEqual({
            latestSeq: 14,
            resources: { workspace: 5 },
            checkpoints: [
              { key: "workspace", generation: 0, checkpointRef: "snap-0", coveredSeq: 6, invalidatedSeq: 10 },
              { key: "workspace", generation: 2, checkpointRef: "snap-1", coveredSeq: 12 }
            ]
          })
          expect(requests.map((r) => [r.method, r.url])).toEqual([
            ["GET", `${BASE}/v0/executions/${EXEC}/fork-points`],
            ["GET", `${BASE}/v0/executions/${EXEC}/fork-points`]
          ])
          // Seqs before the registration are covered; 6–9 and 12–14 by a checkpoint; 5, 10 and 11 are not.
          expect([4, 5, 6, 9, 10, 11, 12, 14].map((seq) => Protocol.isCovered(points, seq))).toEqual([
            true,
            false,
            true,
            true,
            false,
            false,
            true,
            true
          ])
          expect(Protocol.latestCoveredSeq(points)).toBe(14)
          expect(Protocol.latestCoveredSeq({ ...points, checkpoints: [points.checkpoints[0]!] })).toBe(9)
          expect(Protocol.latestCoveredSeq({ latestSeq: 3, resources: { a: 1 }, checkpoints: [] })).toBeUndefined()
        })
    ))

  it.effect("forkPoints: empty lists and maps (and null) decode as empty", () =>
    withClient(
      (_, index) =>
        json(200, index === 0 ? { latest_seq: 3, resources: {}, checkpoints: [] } : { latest_seq: 3, resources: null, checkpoints: null }),
      (client) =>
        Effect.gen(function*() {
          for (let i = 0; i < 2; i++) {
            const points = yield* client.forkPoints(EXEC)
            expect(points).toEqual({ latestSeq: 3, resources: {}, checkpoints: [] })
            expect(Protocol.latestCoveredSeq(points)).toBe(3)
          }
        })
    ))

  describe("against the embedded kernel", () => {
    const counter = Agent.make({
      id: "counter",
      handler: () =>
        Effect.gen(function*() {
          const a = yield* Step.run("one", Effect.succeed(1))
          const b = yield* Step.run("two", Effect.succeed(2))
          return a + b
        })
    })

    it.effect("fork at a seq: the copied steps replay, the rest runs; refused forks create nothing", () =>
      Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const client = yield* Client.Client
        const source = yield* kernel.run(counter, {})
        const points = yield* client.forkPoints(source.executionId)
        expect(points.latestSeq).toBe(source.events.length)
        expect(points).toMatchObject({ resources: {}, checkpoints: [] })
        const oneDone = source.events.find((e) => e.type === "step.succeeded")!.eventSeq
        const fork = yield* client.fork(source.executionId, { atSeq: oneDone })
        expect(fork).toMatchObject({ forkedFrom: source.executionId, forkSeq: oneDone, status: "running" })
        expect(fork.restoration).toBeUndefined()
        const forked = yield* kernel.settle(fork.id)
        expect(forked.output).toBe(3)
        const refused = yield* Effect.flip(client.fork(source.executionId, { atSeq: points.latestSeq + 1 }))
        expect(refused).toMatchObject({ status: 400, code: "validation_error" })
        expect(refused.reason.description).toBe(`validation error: at_seq must be between 1 and ${points.latestSeq}`)
        expect(yield* Effect.flip(client.fork("0192f1a0-0000-7000-8000-0000000000ff", { atSeq: 1 }))).toMatchObject({
          status: 404
        })
        expect((yield* client.list()).executions).toHaveLength(2)
      }).pipe(Effect.provide(TestKernel.layer({ agents: [counter] }))))
  })
})
