import { NodeHttpServer } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Clock, Data, Effect, Layer, Schema } from "effect"
import type { Scope } from "effect"
import { HttpClient, HttpClientRequest } from "effect/http"
import { TestClock } from "effect/testing"
import * as Agent from "../src/Agent.js"
import { Blocked, LeaseSuperseded, PolicyError, RateLimited, ToolError } from "../src/RebunoError.js"
import * as Signature from "../src/Signature.js"
import * as Step from "../src/Step.js"
import * as Tool from "../src/Tool.js"
import { failureReason } from "../src/internal/run/failureReason.js"
import * as TrackedClock from "../src/testing/internal/trackedClock.js"
import { FakeKernel, SECRET } from "./support/FakeKernel.js"

const EXEC = "0192f1a0-0000-7000-8000-000000000000"
const D1 = "0192f1a0-0000-7000-8000-0000000000d1"
const D2 = "0192f1a0-0000-7000-8000-0000000000d2"

const encoder = new TextEncoder()

const notice = (o: {
  readonly dispatch?: string
  readonly attempt?: number
  readonly lease?: number
  readonly execution?: string
} = {}) =>
  JSON.stringify({
    execution_id: o.execution ?? EXEC,
    dispatch_id: o.dispatch ?? D1,
    ...(o.attempt === undefined ? {} : { dispatch_attempt: o.attempt }),
    ...(o.lease === undefined ? {} : { lease_timeout_seconds: o.lease })
  })

const deliver = (rt: Agent.AgentRuntime, body: string | Uint8Array) =>
  Effect.gen(function*() {
    const bytes = typeof body === "string" ? encoder.encode(body) : body
    const signature = yield* Signature.sign(SECRET, bytes)
    return yield* rt.handleWebhook({ body: bytes, signature })
  })

/** Let background fibers run until `done` holds (bounded). */
const until = (done: () => boolean) =>
  Effect.gen(function*() {
    for (let i = 0; i < 200 && !done(); i++) yield* Effect.yieldNow
    expect(done()).toBe(true)
  })

/** Let background fibers run until `n` sleeps are in flight (needs the TrackedClock, see `test`). */
const sleeping = (n = 1) =>
  Effect.gen(function*() {
    for (let i = 0; i < 200; i++) {
      if ((yield* TrackedClock.pendingSleeps).length >= n) return
      yield* Effect.yieldNow
    }
    throw new Error("no sleep registered")
  })

/** `it.effect` on a TestClock that records its sleeps in flight (for `sleeping`). */
const test = <A, E>(name: string, self: () => Effect.Effect<A, E, Scope.Scope>, timeout?: number) =>
  it.effect(name, () => TrackedClock.tracked(self()), timeout)

const echo = Tool.make("echo", {
  args: Schema.Struct({ text: Schema.String }),
  success: Schema.String,
  execute: ({ text }) => Effect.succeed(text)
})

const setup = <In, A, E, R extends never>(agent: Agent.Agent<In, A, E, R>, fake: FakeKernel) =>
  Agent.runtime(agent).pipe(Effect.provide(fake.layer))

describe("webhook handling", () => {
  const agent = Agent.make({ id: "agent", handler: () => Effect.succeed({ ok: true }) })

  test("401 on a bad or missing signature, nothing else happens", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const rt = yield* setup(agent, fake)
      const body = encoder.encode(notice({ attempt: 1 }))
      const good = yield* Signature.sign(SECRET, body)
      expect(yield* rt.handleWebhook({ body, signature: null })).toBe(401)
      expect(yield* rt.handleWebhook({ body, signature: good.toUpperCase() })).toBe(401)
      expect(yield* rt.handleWebhook({ body, signature: yield* Signature.sign("other", body) })).toBe(401)
      expect(yield* rt.handleWebhook({ body, signature: good.slice("sha256=".length) })).toBe(401)
      yield* Effect.yieldNow
      expect(fake.calls).toHaveLength(0)
    }))

  test("400 on a body that is not an acceptable notice", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const rt = yield* setup(agent, fake)
      const bad: ReadonlyArray<string | Uint8Array> = [
        "",
        "not json",
        "[]",
        "null",
        "{}",
        JSON.stringify({ execution_id: "", dispatch_id: D1 }),
        JSON.stringify({ execution_id: EXEC }),
        JSON.stringify({ execution_id: EXEC, dispatch_id: 5 }),
        JSON.stringify({ execution_id: EXEC, dispatch_id: D1, dispatch_attempt: 0 }),
        JSON.stringify({ execution_id: EXEC, dispatch_id: D1, dispatch_attempt: 1.5 }),
        JSON.stringify({ execution_id: EXEC, dispatch_id: D1, dispatch_attempt: "1" }),
        new Uint8Array([0x7b, 0xff, 0x7d])
      ]
      for (const body of bad) expect(yield* deliver(rt, body)).toBe(400)
      yield* Effect.yieldNow
      expect(fake.calls).toHaveLength(0)
    }))

  test("200 at once, then the run completes in the background", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { prompt: "hi" })
      const researcher = Agent.make({
        id: "researcher",
        input: Schema.Struct({ prompt: Schema.String }),
        handler: ({ prompt }) => echo({ text: prompt }).pipe(Effect.map((reply) => ({ reply })))
      })
      const rt = yield* setup(researcher, fake)
      expect(yield* deliver(rt, notice({ attempt: 1, lease: 120 }))).toBe(200)
      expect(fake.calls).toHaveLength(0)
      yield* rt.awaitIdle
      expect(fake.calls.map((c) => c.op)).toEqual(["getExecution", "submitStep", "completeStep", "completeExecution"])
      expect(fake.ops("completeExecution")[0]).toMatchObject({
        json: "{\"reply\":\"hi\"}",
        lease: { dispatchId: D1, attempt: 1 }
      })
      expect(fake.executions.get(EXEC)!.status).toBe("completed")
    }))

  test("accepts a v0.14.0 notice (no attempt, no lease timeout) and never invents an attempt", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const rt = yield* setup(agent, fake)
      expect(yield* deliver(rt, JSON.stringify({ dispatch_id: D1, execution_id: EXEC, extra: [1] }))).toBe(200)
      yield* rt.awaitIdle
      expect(fake.ops("completeExecution")[0]!.lease).toEqual({ dispatchId: D1, attempt: undefined })
    }))

  test("a duplicate or stale delivery of the active run is ignored", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const slow = Agent.make({ id: "agent", handler: () => Effect.sleep("1 minute") })
      const rt = yield* setup(slow, fake)
      expect(yield* deliver(rt, notice({ attempt: 2, lease: 120 }))).toBe(200)
      yield* sleeping(2)
      expect(yield* deliver(rt, notice({ attempt: 2, lease: 120 }))).toBe(200)
      expect(yield* deliver(rt, notice({ attempt: 1, lease: 120 }))).toBe(200)
      expect(yield* deliver(rt, notice({ lease: 120 }))).toBe(200)
      yield* Effect.yieldNow
      expect(fake.ops("getExecution")).toHaveLength(1)
      expect(yield* rt.activeRuns).toBe(1)
      yield* TestClock.adjust("1 minute")
      yield* rt.awaitIdle
      expect(fake.ops("completeExecution")).toHaveLength(1)
    }))

  test("a delivery with unknown attempt duplicates an active run with a known one", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const slow = Agent.make({ id: "agent", handler: () => Effect.sleep("1 minute") })
      const rt = yield* setup(slow, fake)
      yield* deliver(rt, notice())
      yield* sleeping(2)
      yield* deliver(rt, notice({ attempt: 3 }))
      yield* Effect.yieldNow
      expect(fake.ops("getExecution")).toHaveLength(1)
    }))

  for (const [title, next] of [
    ["a higher attempt", { attempt: 2, lease: 120 }],
    ["a different dispatch", { dispatch: D2, attempt: 1, lease: 120 }]
  ] as const) {
    test(`${title} supersedes the active run, which writes nothing more`, () =>
      Effect.gen(function*() {
        const fake = new FakeKernel().addExecution(EXEC, {})
        const slowTool = Tool.make("slow", {
          args: Schema.Struct({}),
          success: Schema.String,
          execute: () => Effect.as(Effect.sleep("10 seconds"), "done")
        })
        const slow = Agent.make({ id: "agent", handler: () => slowTool({}) })
        const rt = yield* setup(slow, fake)
        yield* deliver(rt, notice({ attempt: 1, lease: 120 }))
        yield* sleeping(2) // heartbeat + tool body
        expect(fake.ops("submitStep")).toHaveLength(1)
        const mark = fake.calls.length
        expect(yield* deliver(rt, notice(next))).toBe(200)
        yield* sleeping(2)
        yield* TestClock.adjust("10 seconds")
        yield* rt.awaitIdle
        const later = fake.calls.slice(mark)
        const oldLease = (c: { readonly lease?: { readonly dispatchId: string; readonly attempt: number | undefined } | undefined }) =>
          c.lease?.dispatchId === D1 && c.lease.attempt === 1
        expect(later.filter(oldLease)).toEqual([])
        expect(fake.ops("completeExecution")).toHaveLength(1)
        expect(fake.ops("completeExecution")[0]!.json).toBe("\"done\"")
        expect(fake.ops("getExecution")).toHaveLength(2)
      }))
  }

  test("a terminal execution is skipped silently", () =>
    Effect.gen(function*() {
      for (const status of ["completed", "failed", "cancelled"]) {
        const fake = new FakeKernel().addExecution(EXEC, {}, status)
        let ran = false
        const rt = yield* setup(Agent.make({ id: "agent", handler: () => Effect.sync(() => { ran = true }) }), fake)
        yield* deliver(rt, notice({ attempt: 1 }))
        yield* rt.awaitIdle
        expect(fake.calls.map((c) => c.op)).toEqual(["getExecution"])
        expect(ran).toBe(false)
      }
    }))

  test("an unknown execution (404) stops the run", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const rt = yield* setup(agent, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.calls.map((c) => c.op)).toEqual(["getExecution"])
    }))

  test("a transport failure reading the execution abandons the run: nothing posted, no heartbeats", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      fake.getExecutionError = FakeKernel.transport("get")
      const rt = yield* setup(agent, fake)
      yield* deliver(rt, notice({ attempt: 1, lease: 3 }))
      yield* rt.awaitIdle
      yield* TestClock.adjust("1 minute")
      expect(fake.calls.map((c) => c.op)).toEqual(["getExecution"])
    }))
})

describe("abandoning", () => {
  test("a submit transport failure abandons the run: no outcome, heartbeats stop", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const rt = yield* setup(
        Agent.make({
          id: "agent",
          handler: () =>
            Effect.sleep("15 seconds").pipe(
              Effect.andThen(echo({ text: "x" })),
              Effect.catch(() => Effect.succeed("swallowed"))
            )
        }),
        fake
      )
      fake.script.push(FakeKernel.transport("submit"))
      yield* deliver(rt, notice({ attempt: 1, lease: 30 }))
      yield* sleeping(2)
      yield* TestClock.adjust("15 seconds")
      yield* rt.awaitIdle
      yield* TestClock.adjust("5 minutes")
      expect(fake.calls.map((c) => c.op)).toEqual(["getExecution", "heartbeat", "submitStep"])
    }))
})

describe("input and output", () => {
  test("an input that does not decode fails the execution with input_invalid", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { prompt: 1 })
      let ran = false
      const typed = Agent.make({
        id: "agent",
        input: Schema.Struct({ prompt: Schema.String, limit: Schema.Number }),
        handler: () => Effect.sync(() => { ran = true })
      })
      const rt = yield* setup(typed, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(ran).toBe(false)
      expect(fake.ops("failExecution").map((c) => c.reason)).toEqual([
        "input_invalid: prompt: Expected string, actual 1; limit: is missing"
      ])
    }))

  test("the output is encoded with the output schema; no value posts {}", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, null)
      const dated = Agent.make({
        id: "agent",
        output: Schema.Struct({ at: Schema.DateFromString }),
        handler: () => Effect.succeed({ at: new Date("2026-01-02T03:04:05.000Z") })
      })
      const rt = yield* setup(dated, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.ops("completeExecution")[0]!.json).toBe("{\"at\":\"2026-01-02T03:04:05.000Z\"}")

      const fake2 = new FakeKernel().addExecution(EXEC, null)
      const rt2 = yield* setup(Agent.make({ id: "agent", handler: () => Effect.void }), fake2)
      yield* deliver(rt2, notice({ attempt: 1 }))
      yield* rt2.awaitIdle
      expect(fake2.ops("completeExecution")).toHaveLength(1)
      expect(fake2.ops("completeExecution")[0]!.json).toBeUndefined()
    }))

  test("an output that is not JSON fails the execution", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, null)
      const rt = yield* setup(Agent.make({ id: "agent", handler: () => Effect.succeed({ n: NaN }) }), fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.ops("failExecution")[0]!.reason).toMatch(/^agent_error: TypeError: output is not JSON at \$\.n/)
    }))
})

class MyError extends Data.TaggedError("MyError")<{ readonly message: string }> {}

describe("outcome mapping (failureReason)", () => {
  const cases: ReadonlyArray<readonly [string, Effect.Effect<never, unknown>, string]> = [
    ["token policy error", Effect.fail(new PolicyError({ reason: "approval_timeout" })), "approval_timeout"],
    ["policy error", Effect.fail(new PolicyError({ reason: "no emails allowed" })), "policy_denied: no emails allowed"],
    ["default policy error", Effect.fail(new PolicyError({ reason: "denied by policy" })), "policy_denied: denied by policy"],
    ["rate limit", Effect.fail(new RateLimited({ reason: "rate_limiter_unavailable" })), "rate_limiter_unavailable"],
    [
      "tool error",
      Effect.fail(new ToolError({ toolId: "send_email", stepId: "s", error: { message: "boom" }, retryable: false, text: "send_email: boom" })),
      "tool_error: send_email: boom"
    ],
    ["tagged error", Effect.fail(new MyError({ message: "bad thing" })), "agent_error: MyError: bad thing"],
    ["Error", Effect.fail(new Error("x")), "agent_error: Error: x"],
    ["defect", Effect.sync(() => { throw new TypeError("boom") }), "agent_error: TypeError: boom"],
    ["refusal marker", Effect.fail(new Error("403 {\"error\":{\"message\":\"rebuno_refusal: denied reason=no_llm\"}}")), "no_llm"]
  ]
  for (const [title, handler, reason] of cases) {
    test(`${title} → ${reason}`, () =>
      Effect.gen(function*() {
        const fake = new FakeKernel().addExecution(EXEC, null)
        const rt = yield* setup(Agent.make({ id: "agent", handler: () => handler }), fake)
        yield* deliver(rt, notice({ attempt: 1 }))
        yield* rt.awaitIdle
        expect(fake.ops("failExecution").map((c) => c.reason)).toEqual([reason])
        expect(fake.ops("completeExecution")).toHaveLength(0)
      }))
  }

  it("failureReason table", () => {
    expect(failureReason(new PolicyError({ reason: "policy_denied" }))).toBe("policy_denied")
    expect(failureReason(new PolicyError({ reason: "Approval Denied" }))).toBe("policy_denied: Approval Denied")
    expect(failureReason(new RateLimited({ reason: "rate_limit_exceeded" }))).toBe("rate_limit_exceeded")
    expect(failureReason(new TypeError("boom"))).toBe("agent_error: TypeError: boom")
    expect(failureReason("plain")).toBe("agent_error: Error: plain")
  })
})

describe("heartbeats", () => {
  const slow = Agent.make({ id: "agent", handler: () => Effect.sleep("95 seconds") })

  test("every lease/3 (lease 30 s → every 10 s) for the whole run, then stop", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const rt = yield* setup(slow, fake)
      yield* deliver(rt, notice({ attempt: 1, lease: 30 }))
      yield* sleeping(2)
      yield* TestClock.adjust("30 seconds")
      expect(fake.ops("heartbeat").map((c) => c.at)).toEqual([10_000, 20_000, 30_000])
      expect(fake.ops("heartbeat")[0]!.lease).toEqual({ dispatchId: D1, attempt: 1 })
      yield* TestClock.adjust("65 seconds")
      yield* rt.awaitIdle
      expect(fake.ops("heartbeat")).toHaveLength(9)
      yield* TestClock.adjust("5 minutes")
      expect(fake.ops("heartbeat")).toHaveLength(9)
      expect(fake.ops("completeExecution")).toHaveLength(1)
    }))

  test("every 30 s when the lease is unknown or long; never under 1 s", () =>
    Effect.gen(function*() {
      for (const [lease, expected] of [[undefined, [30_000, 60_000, 90_000]], [600, [30_000, 60_000, 90_000]]] as const) {
        const fake = new FakeKernel().addExecution(EXEC, {})
        const rt = yield* setup(slow, fake)
        const start = yield* Clock.currentTimeMillis
        yield* deliver(rt, notice(lease === undefined ? { attempt: 1 } : { attempt: 1, lease }))
        yield* sleeping(2)
        yield* TestClock.adjust("95 seconds")
        yield* rt.awaitIdle
        expect(fake.ops("heartbeat").map((c) => c.at - start)).toEqual(expected)
      }
      const fake = new FakeKernel().addExecution(EXEC, {})
      const rt = yield* setup(Agent.make({ id: "agent", handler: () => Effect.sleep("3500 millis") }), fake)
      const start = yield* Clock.currentTimeMillis
      yield* deliver(rt, notice({ attempt: 1, lease: 1.5 }))
      yield* sleeping(2)
      yield* TestClock.adjust("3500 millis")
      yield* rt.awaitIdle
      expect(fake.ops("heartbeat").map((c) => c.at - start)).toEqual([1_000, 2_000, 3_000])
      expect(Agent.heartbeatIntervalMillis(undefined)).toBe(30_000)
      expect(Agent.heartbeatIntervalMillis(120)).toBe(30_000)
      expect(Agent.heartbeatIntervalMillis(30)).toBe(10_000)
      expect(Agent.heartbeatIntervalMillis(0.3)).toBe(1_000)
    }))

  test("heartbeat errors other than lease_superseded are ignored", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      fake.onHeartbeat = () => Effect.fail(FakeKernel.transport("heartbeat"))
      const rt = yield* setup(slow, fake)
      yield* deliver(rt, notice({ attempt: 1, lease: 30 }))
      yield* sleeping(2)
      yield* TestClock.adjust("95 seconds")
      yield* rt.awaitIdle
      expect(fake.ops("heartbeat")).toHaveLength(9)
      expect(fake.ops("completeExecution")).toHaveLength(1)
    }))

  test("lease_superseded from a heartbeat interrupts the handler; nothing is reported after it", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      fake.onHeartbeat = (n) => n >= 2 ? Effect.fail(new LeaseSuperseded()) : Effect.void
      let finished = false
      const rt = yield* setup(
        Agent.make({
          id: "agent",
          handler: () => Effect.sleep("25 seconds").pipe(Effect.andThen(Step.now), Effect.tap(() => Effect.sync(() => { finished = true })))
        }),
        fake
      )
      yield* deliver(rt, notice({ attempt: 1, lease: 30 }))
      yield* sleeping(2)
      yield* TestClock.adjust("20 seconds")
      yield* rt.awaitIdle
      expect(yield* rt.activeRuns).toBe(0)
      yield* TestClock.adjust("5 minutes")
      expect(finished).toBe(false)
      expect(fake.calls.map((c) => c.op)).toEqual(["getExecution", "heartbeat", "heartbeat"])
    }))
})

describe("suspension backstop", () => {
  test("a handler that swallows Blocked posts no outcome", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      fake.policy = () => ({ decision: "blocked", approvalId: "ap-1" })
      const swallow = Agent.make({
        id: "agent",
        handler: () => echo({ text: "x" }).pipe(Effect.catchTag("Blocked", () => Effect.succeed("fine")))
      })
      const rt = yield* setup(swallow, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.calls.map((c) => c.op)).toEqual(["getExecution", "submitStep"])
    }))

  test("a handler that turns Terminated into another error posts no outcome", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      fake.script.push({ decision: "execution_terminal" })
      const rethrow = Agent.make({
        id: "agent",
        handler: () => echo({ text: "x" }).pipe(Effect.catch(() => Effect.fail(new Error("wrapped"))))
      })
      const rt = yield* setup(rethrow, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.calls.map((c) => c.op)).toEqual(["getExecution", "submitStep"])
    }))

  test("a handler failing with Blocked posts no outcome", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const rt = yield* setup(Agent.make({ id: "agent", handler: () => Effect.fail(new Blocked({})) }), fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.calls.map((c) => c.op)).toEqual(["getExecution"])
    }))

  test("a refusal marker for blocked posts no outcome", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const rt = yield* setup(
        Agent.make({
          id: "agent",
          handler: () => Effect.fail(new Error("provider error", { cause: new Error("rebuno_refusal: blocked") }))
        }),
        fake
      )
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.calls.map((c) => c.op)).toEqual(["getExecution"])
    }))
})

describe("HTTP", () => {
  const hello = Agent.make({ id: "agent", handler: () => Effect.succeed("hi") })

  test("Agent.layer answers 404 to anything but POST on exactly the webhook path", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      yield* Layer.launch(Agent.layer(hello).pipe(Layer.provide(fake.layer))).pipe(Effect.forkScoped)
      yield* Effect.yieldNow
      const client = yield* HttpClient.HttpClient
      const body = notice({ attempt: 1 })
      const signature = yield* Signature.sign(SECRET, body)
      const post = (path: string, sig: string) =>
        client.execute(
          HttpClientRequest.post(path).pipe(
            HttpClientRequest.setHeader("rebuno-signature", sig),
            HttpClientRequest.bodyText(body, "application/json")
          )
        ).pipe(Effect.map((r) => [r.status, r.headers["content-length"], r.headers["transfer-encoding"]]))
      // Every answer is bodiless, framed by Content-Length: 0 (not an empty chunked body).
      const bodiless = (status: number) => [status, "0", undefined]
      expect(
        yield* client.get("/webhook").pipe(Effect.map((r) => [r.status, r.headers["content-length"], r.headers["transfer-encoding"]]))
      ).toEqual(bodiless(404))
      expect(yield* post("/other", signature)).toEqual(bodiless(404))
      expect(yield* post("/webhook/extra", signature)).toEqual(bodiless(404))
      expect(yield* post("/webhook", "sha256=00")).toEqual(bodiless(401))
      expect(yield* post("/webhook", signature)).toEqual(bodiless(200))
      yield* until(() => fake.ops("completeExecution").length === 1)
    }).pipe(Effect.provide(NodeHttpServer.layerTest)), 20_000)

  it.live("Agent.toWebHandler serves Request → Response", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const web = Agent.toWebHandler(hello, fake.layer)
      const body = notice({ attempt: 1 })
      const signature = yield* Signature.sign(SECRET, body)
      const request = (sig: string) =>
        new Request("http://agent.local/webhook", { method: "POST", body, headers: { "rebuno-signature": sig } })
      const bad = yield* Effect.promise(() => web.handler(request("sha256=00")))
      expect(bad.status).toBe(401)
      const ok = yield* Effect.promise(() => web.handler(request(signature)))
      expect(ok.status).toBe(200)
      for (let i = 0; i < 50 && fake.ops("completeExecution").length === 0; i++) yield* Effect.sleep("10 millis")
      expect(fake.ops("completeExecution")[0]!.json).toBe("\"hi\"")
      yield* Effect.promise(() => web.dispose())
    }))
})
