import { NodeHttpServer } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Clock, Data, Effect, Layer, Option, Schema } from "effect"
import type { Scope } from "effect"
import { HttpClient, HttpClientRequest } from "effect/http"
import { TestClock } from "effect/testing"
import * as Agent from "../src/Agent.js"
import * as KernelClient from "../src/KernelClient.js"
import {
  Blocked,
  KernelError,
  LeaseSuperseded,
  PolicyError,
  RateLimited,
  StatusError,
  SubagentError,
  ToolError
} from "../src/RebunoError.js"
import * as Signature from "../src/Signature.js"
import * as Step from "../src/Step.js"
import * as Tool from "../src/Tool.js"
import { failureReason } from "../src/internal/run/failureReason.js"
import * as TrackedClock from "../src/testing/internal/trackedClock.js"
import * as Kernel from "effect-rebuno/kernel"
import { serve } from "./support/embedded.js"
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
    // PROTOCOL-CURRENT C.12: prose reasons of the current stage (rule reasons, the judge)
    expect(failureReason(new PolicyError({ reason: "judge not configured", ruleId: "j" }))).toBe(
      "policy_denied: judge not configured"
    )
    expect(failureReason(new PolicyError({ reason: "execution_token_budget_exceeded" }))).toBe(
      "execution_token_budget_exceeded"
    )
    // a subagent's failure is the failure of its calling step
    expect(failureReason(
      new SubagentError({
        agentId: "summarizer",
        executionId: "c1",
        reason: "subagent_cancelled",
        failureReason: "deadline_exceeded",
        target: "summarize",
        stepId: "s"
      })
    )).toBe("tool_error: summarize: subagent_cancelled: deadline_exceeded")
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

// ---------------------------------------------------------------------------
// The current stage (PROTOCOL-CURRENT)
// ---------------------------------------------------------------------------

const metadataCalls = (fake: FakeKernel) => fake.agentCalls.filter((c) => c.op === "publishMetadata")

describe("agent metadata (PROTOCOL-CURRENT C.3)", () => {
  const described = Agent.make({
    id: "agent",
    description: "Answers questions",
    input: Schema.Struct({ prompt: Schema.String, limit: Schema.optionalKey(Schema.Finite) }),
    output: Schema.Struct({ answer: Schema.String }),
    handler: ({ prompt }) => Effect.succeed({ answer: prompt })
  })

  it("metadataOf: the description and the JSON Schemas of the input and output as sent; null when absent", () => {
    expect(Agent.metadataOf(described)).toEqual({
      description: "Answers questions",
      inputSchema: {
        $schema: "https://json-schema.org/draft/2020-12/schema",
        type: "object",
        properties: { prompt: { type: "string" }, limit: { type: "number" } },
        required: ["prompt"],
        // the input decoder ignores excess properties, and says so
        additionalProperties: true
      },
      outputSchema: {
        $schema: "https://json-schema.org/draft/2020-12/schema",
        type: "object",
        properties: { answer: { type: "string" } },
        required: ["answer"],
        additionalProperties: true
      }
    })
    expect(Agent.metadataOf(Agent.make({ id: "raw", handler: () => Effect.void }))).toEqual({
      description: null,
      inputSchema: null,
      outputSchema: null
    })
    // the encoded side: a date travels as a string
    const dated = Agent.metadataOf(Agent.make({ id: "d", output: Schema.DateFromString, handler: () => Effect.succeed(new Date()) }))
    expect(dated.outputSchema).toMatchObject({ type: "string" })
  })

  test("published once, on the first verified webhook; not for bad signatures or bodies", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { prompt: "hi" })
      const rt = yield* setup(described, fake)
      const body = encoder.encode(notice({ attempt: 1 }))
      expect(yield* rt.handleWebhook({ body, signature: "sha256=00" })).toBe(401)
      expect(yield* deliver(rt, "not json")).toBe(400)
      yield* Effect.yieldNow
      expect(metadataCalls(fake)).toHaveLength(0)
      expect(yield* deliver(rt, notice({ attempt: 1 }))).toBe(200)
      yield* rt.awaitIdle
      expect(yield* deliver(rt, notice({ dispatch: D2, attempt: 1 }))).toBe(200)
      yield* rt.awaitIdle
      expect(metadataCalls(fake).map((c) => [c.reason, JSON.parse(c.json!)])).toEqual([[
        "agent",
        {
          description: "Answers questions",
          input_schema: Agent.metadataOf(described).inputSchema,
          output_schema: Agent.metadataOf(described).outputSchema
        }
      ]])
      expect(fake.ops("completeExecution")).toHaveLength(1)
    }))

  test("a connection error or timeout is retried on the next verified webhook; then it is done", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { prompt: "hi" })
      fake.onPublishMetadata = (n) => n === 1 ? Effect.fail(FakeKernel.transport("publish")) : Effect.void
      const rt = yield* setup(described, fake)
      for (const dispatch of [D1, D2, "d3"]) {
        yield* deliver(rt, notice({ dispatch, attempt: 1 }))
        yield* rt.awaitIdle
        yield* Effect.yieldNow
      }
      expect(metadataCalls(fake)).toHaveLength(2)
    }))

  for (const [status, code] of [[404, "internal_error"], [500, "internal_error"], [403, "forbidden"]] as const) {
    test(`an error answer (${status}) is logged and never retried`, () =>
      Effect.gen(function*() {
        const fake = new FakeKernel()
        fake.onPublishMetadata = () =>
          Effect.fail(new KernelError({ reason: new StatusError({ status, code, description: "404 page not found" }) }))
        const rt = yield* setup(described, fake)
        for (const execution of ["e1", "e2", "e3"]) {
          fake.addExecution(execution, { prompt: "hi" })
          yield* deliver(rt, notice({ execution, attempt: 1 }))
          yield* rt.awaitIdle
        }
        expect(metadataCalls(fake)).toHaveLength(1)
        // never fatal: every run completed
        expect(fake.ops("completeExecution")).toHaveLength(3)
      }))
  }

  test("a publication that hangs never holds up a run", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { prompt: "hi" })
      fake.onPublishMetadata = () => Effect.never
      const rt = yield* setup(described, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.ops("completeExecution")).toHaveLength(1)
      expect(metadataCalls(fake)).toHaveLength(1)
    }))

  test("a KernelClient without publishMetadata (written for 0.1) is fine", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { prompt: "hi" })
      const { publishMetadata: _, observeWebhook: __, ...older } = fake.service
      const rt = yield* Agent.runtime(described).pipe(Effect.provide(Layer.succeed(KernelClient.KernelClient, older)))
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.ops("completeExecution")).toHaveLength(1)
    }))

  test("Agent.layer publishes at start-up, before any webhook", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      yield* Layer.launch(Agent.layer(described).pipe(Layer.provide(fake.layer))).pipe(Effect.forkScoped)
      yield* until(() => metadataCalls(fake).length === 1)
      expect(fake.calls).toHaveLength(0)
    }).pipe(Effect.provide(NodeHttpServer.layerTest)), 20_000)
})

describe("the stage hint (PROTOCOL-CURRENT C.13)", () => {
  test("every verified webhook is shown to the client (a missing dispatch_attempt means v0.14.0)", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const rt = yield* setup(Agent.make({ id: "agent", handler: () => Effect.void }), fake)
      yield* rt.handleWebhook({ body: encoder.encode(notice()), signature: "sha256=00" })
      yield* deliver(rt, notice())
      yield* rt.awaitIdle
      yield* deliver(rt, notice({ dispatch: D2, attempt: 2, lease: 30 }))
      yield* rt.awaitIdle
      expect(fake.agentCalls.filter((c) => c.op === "observeWebhook").map((c) => c.notice)).toEqual([
        { executionId: EXEC, dispatchId: D1, dispatchAttempt: undefined, leaseTimeoutSeconds: undefined },
        { executionId: EXEC, dispatchId: D2, dispatchAttempt: 2, leaseTimeoutSeconds: 30 }
      ])
    }))
})

describe("sessions and state (PROTOCOL-CURRENT C.4)", () => {
  const History = Schema.Array(Schema.String)
  const chat = Agent.make({
    id: "chat",
    input: Schema.Struct({ message: Schema.String }),
    output: Schema.Struct({ turns: Schema.Number }),
    state: History,
    handler: ({ message }, session) =>
      Effect.gen(function*() {
        const history = Option.getOrElse(yield* session.previous, () => [])
        const next = [...history, message]
        return session.withState({ turns: next.length }, next)
      })
  })

  test("the previous state is decoded with the state Schema; the new state is sent with the output", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { message: "c" }, "running", { previous: ["a", "b"] })
      const rt = yield* setup(chat, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.ops().map((c) => c.op)).toEqual(["getExecution", "previous", "completeExecution"])
      const completed = fake.ops("completeExecution")[0]!
      expect(completed.json).toBe("{\"turns\":3}")
      expect(completed.state).toBe("[\"a\",\"b\",\"c\"]")
    }))

  test("no previous state (null) is Option.none()", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { message: "first" })
      const rt = yield* setup(chat, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.ops("completeExecution")[0]).toMatchObject({ json: "{\"turns\":1}", state: "[\"first\"]" })
    }))

  test("the state is encoded with the Schema; a plain output sends no state; a null state is not sent", () =>
    Effect.gen(function*() {
      const Counter = Schema.NumberFromString
      const counter = Agent.make({
        id: "counter",
        state: Schema.NullOr(Counter),
        handler: (input: unknown, session) =>
          Effect.gen(function*() {
            const previous = yield* session.previous
            if (input === "plain") return "no state"
            if (input === "null") return session.withState("null state", null)
            const count = Option.getOrElse(previous, () => 0) ?? 0
            return session.withState(String(count), count + 1)
          })
      })
      const cases = [["count", "41", "\"41\"", "\"42\""], ["plain", null, "\"no state\"", undefined], [
        "null",
        null,
        "\"null state\"",
        undefined
      ]] as const
      for (const [input, previous, output, state] of cases) {
        const fake = new FakeKernel().addExecution(EXEC, input, "running", { previous })
        const rt = yield* setup(counter, fake)
        yield* deliver(rt, notice({ attempt: 1 }))
        yield* rt.awaitIdle
        const completed = fake.ops("completeExecution")
        expect(completed).toHaveLength(1)
        expect(completed[0]!.json).toBe(output)
        expect(completed[0]!.state).toBe(state)
      }
    }))

  test("a previous state that does not decode fails the execution (unless the handler catches it)", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { message: "c" }, "running", { previous: { not: "a list" } })
      const rt = yield* setup(chat, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.ops("failExecution")[0]!.reason).toMatch(
        /^agent_error: StepDecodeError: previous: previous state does not decode: /
      )
    }))

  test("previous answered 404 (a kernel without sessions) is a KernelError in the handler", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { message: "c" })
      fake.onPrevious = () =>
        Effect.fail(new KernelError({ reason: new StatusError({ status: 404, code: "internal_error", description: "404 page not found" }) }))
      const rt = yield* setup(chat, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.ops("failExecution")[0]!.reason).toBe(
        "agent_error: KernelError: Status 404 internal_error: 404 page not found"
      )
    }))

  test("a state that is not JSON fails the execution; nothing is completed", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, null)
      const rt = yield* setup(
        Agent.make({ id: "agent", handler: (_, session) => Effect.succeed(session.withState("out", { n: NaN })) }),
        fake
      )
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.ops("completeExecution")).toHaveLength(0)
      expect(fake.ops("failExecution")[0]!.reason).toMatch(/^agent_error: TypeError: state is not JSON at \$\.n/)
    }))

  test("the session label and parent come from the execution; without a state Schema the state is raw JSON", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, null, "running", {
        session: "chat:u42",
        parentExecutionId: "parent-1",
        previous: { raw: [1] }
      })
      const seen: Array<unknown> = []
      const raw = Agent.make({
        id: "agent",
        handler: (_, session) =>
          Effect.gen(function*() {
            seen.push(session.id, session.parentExecutionId, yield* session.previous)
            return session.withState(null, { raw: [1, 2] })
          })
      })
      const rt = yield* setup(raw, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(seen).toEqual([Option.some("chat:u42"), Option.some("parent-1"), Option.some({ raw: [1] })])
      expect(fake.ops("completeExecution")[0]).toMatchObject({ json: "null", state: "{\"raw\":[1,2]}" })
    }))

  test("a run that recorded a signal posts neither output nor state", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { message: "c" })
      fake.script.push({ decision: "blocked", stepId: "s", approvalId: "a1" })
      const blocked = Agent.make({
        id: "chat",
        state: History,
        handler: (_input, session) =>
          echo({ text: "x" }).pipe(Effect.ignore, Effect.as(session.withState("out", ["s"])))
      })
      const rt = yield* setup(blocked, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(fake.ops("completeExecution")).toHaveLength(0)
      expect(fake.ops("failExecution")).toHaveLength(0)
    }))
})

describe("rate-limit parking (PROTOCOL-CURRENT C.8.3)", () => {
  test("blocked without approval_id ends the run quietly (Blocked with the reason); the execution stays as it is", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      fake.script.push({ decision: "blocked", reason: "rate_limit_exceeded" })
      let caught: unknown
      const agent = Agent.make({
        id: "agent",
        handler: () => echo({ text: "x" }).pipe(Effect.tapError((e) => Effect.sync(() => { caught = e })))
      })
      const rt = yield* setup(agent, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(caught).toBeInstanceOf(Blocked)
      expect(caught).toMatchObject({ reason: "rate_limit_exceeded" })
      expect((caught as Blocked).approvalId).toBeUndefined()
      expect((caught as Blocked).message).toBe("execution parked by a rate limit (rate_limit_exceeded)")
      expect(fake.ops().map((c) => c.op)).toEqual(["getExecution", "submitStep"])
      expect(fake.executions.get(EXEC)!.status).toBe("running")
    }))

  test("a denial carries the decision's rule_id (C.8.4)", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      fake.script.push({ decision: "denied", stepId: "s1", reason: "no email", ruleId: "block-email" })
      let caught: unknown
      const agent = Agent.make({
        id: "agent",
        handler: () => echo({ text: "x" }).pipe(Effect.tapError((e) => Effect.sync(() => { caught = e })))
      })
      const rt = yield* setup(agent, fake)
      yield* deliver(rt, notice({ attempt: 1 }))
      yield* rt.awaitIdle
      expect(caught).toMatchObject({ _tag: "PolicyError", reason: "no email", ruleId: "block-email", stepId: "s1" })
      expect(fake.ops("failExecution")[0]!.reason).toBe("policy_denied: no email")
    }))
})

describe("over HTTP on the embedded kernel (current stage)", () => {
  it.live("Agent.layer publishes the metadata at start-up; the kernel stores it (C.3)", () =>
    Effect.gen(function*() {
      const kernel = yield* Kernel.start({ port: 0 })
      const described = Agent.make({
        id: "described",
        description: "Answers questions",
        input: Schema.Struct({ prompt: Schema.String }),
        handler: ({ prompt }) => Effect.succeed(prompt)
      })
      yield* serve(described, kernel.url, "described-secret")
      let metadata: unknown
      for (let i = 0; i < 200 && metadata === undefined; i++) {
        metadata = (yield* kernel.core.getAgent("described")).metadata
        if (metadata === undefined) yield* Effect.sleep("10 millis")
      }
      expect(metadata).toMatchObject({ description: "Answers questions", outputSchemaRaw: null })
      expect(JSON.parse((metadata as { inputSchemaRaw: string }).inputSchemaRaw)).toEqual(
        Agent.metadataOf(described).inputSchema
      )
    }).pipe(Effect.scoped), 30_000)
})
