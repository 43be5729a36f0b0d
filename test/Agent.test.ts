import { NodeHttpServer } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Clock, Config, ConfigProvider, Data, Effect, Layer, Logger, Option, References, Schema } from "effect"
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
import { TestKernel } from "../src/testing/index.js"
import { failureReason } from "../src/internal/run/failureReason.js"
import * as TrackedClock from "../src/testing/internal/trackedClock.js"
import * as Kernel from "effect-rebuno/kernel"
import { serve } from "./support/embedded.js"
import { FakeKernel, SECRET } from "./support/FakeKernel.js"
import * as TestLogs from "./support/logging.js"
import { freePort } from "./support/pythonSdk.js"

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
      expect(Agent.heartbeatIntervalMillis(47)).toBe(15_666) // whole milliseconds
      expect(Agent.heartbeatIntervalMillis(0.3)).toBe(1_000)
    }))

  test("many runs at once, on two intervals, each beat on time; a run's beats stop when it ends", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const ids = Array.from({ length: 40 }, (_, i) => `0192f1a0-0000-7000-8000-${String(i).padStart(12, "0")}`)
      for (const id of ids) fake.addExecution(id, {})
      // The even runs beat every 10 s (lease 30 s), the odd ones every 30 s (lease 120 s).
      const rt = yield* setup(Agent.make({ id: "agent", handler: () => Effect.sleep("65 seconds") }), fake)
      const start = yield* Clock.currentTimeMillis
      for (const [i, id] of ids.entries()) {
        yield* deliver(rt, notice({ execution: id, attempt: 1, lease: i % 2 === 0 ? 30 : 120 }))
        // The second half starts 5 s later.
        if (i === ids.length / 2 - 1) {
          yield* sleeping(2)
          yield* TestClock.adjust("5 seconds")
        }
      }
      yield* sleeping(2)
      yield* TestClock.adjust("65 seconds")
      yield* rt.awaitIdle
      for (const [i, id] of ids.entries()) {
        const offset = i < ids.length / 2 ? 0 : 5_000
        // The handler ends at 65 s after its start: the last beat is the one before.
        const expected = i % 2 === 0 ? [10_000, 20_000, 30_000, 40_000, 50_000, 60_000] : [30_000, 60_000]
        const beats = fake.ops("heartbeat").filter((c) => c.executionId === id).map((c) => c.at - start - offset)
        expect(beats).toEqual(expected)
      }
      const total = fake.ops("heartbeat").length
      yield* TestClock.adjust("5 minutes")
      expect(fake.ops("heartbeat")).toHaveLength(total)
      expect(fake.ops("completeExecution")).toHaveLength(ids.length)
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
      // the beat at 10 s is retried with backoff until the lease cannot be valid (30 s), then
      // one beat per interval (40 … 90 s); the failures never stop the run (issue 13)
      expect(fake.ops("heartbeat").length).toBeGreaterThan(9)
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
      const web = Agent.toWebHandler(hello, Layer.merge(fake.layer, TestLogs.layer))
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
// What a rejected webhook tells (issue 13)
// ---------------------------------------------------------------------------

/** Every log entry, and the rejected webhooks among them. */
const captureLogs = () => {
  const { layer, lines } = TestLogs.captureLogs()
  const rejections = () =>
    lines.filter((l) => l.message.startsWith("webhook request rejected")).map((l) => ({
      level: l.level,
      message: l.message,
      reason: l.annotations["rebuno.rejected"],
      status: l.annotations["rebuno.http_status"],
      agentId: l.annotations["rebuno.agent_id"]
    }))
  return { lines, layer, rejections }
}

describe("rejected webhooks are logged with their reason", () => {
  const agent = Agent.make({ id: "researcher", handler: () => Effect.succeed("hi") })
  const malformed = "webhook request rejected (400): the body is not a Rebuno webhook (a JSON object with " +
    "execution_id and dispatch_id strings and, when present, a positive integer dispatch_attempt)"

  it.effect("a bad signature names the secret to compare, never the secret; missing signature and bad bodies say so", () => {
    const capture = captureLogs()
    return Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const rt = yield* setup(agent, fake)
      const body = encoder.encode(notice({ attempt: 1 }))
      const wrongSecret = "a-different-secret"
      expect(yield* rt.handleWebhook({ body, signature: yield* Signature.sign(wrongSecret, body) })).toBe(401)
      expect(yield* rt.handleWebhook({ body, signature: undefined })).toBe(401)
      expect(yield* deliver(rt, new Uint8Array([0x7b, 0xff, 0x7d]))).toBe(400)
      expect(yield* deliver(rt, "{\"execution_id\":\"x\"}")).toBe(400)
      expect(capture.rejections()).toEqual([
        {
          level: "Warn",
          message: "webhook request rejected (401): bad signature: the kernel signed this webhook with another secret " +
            "than this agent's; compare REBUNO_AGENT_SECRET (the agent's secret) with the secret of agent " +
            "\"researcher\" in the kernel's manifest",
          reason: "bad_signature",
          status: 401,
          agentId: "researcher"
        },
        {
          level: "Warn",
          message: "webhook request rejected (401): no Rebuno-Signature header (is the sender a Rebuno kernel?)",
          reason: "missing_signature",
          status: 401,
          agentId: "researcher"
        },
        {
          level: "Warn",
          message: "webhook request rejected (400): the body is not UTF-8",
          reason: "malformed_body",
          status: 400,
          agentId: "researcher"
        },
        { level: "Warn", message: malformed, reason: "malformed_body", status: 400, agentId: "researcher" }
      ])
      // Neither the agent's secret nor the one the webhook was signed with appears anywhere in the logs.
      const everything = JSON.stringify(capture.lines)
      expect(everything).not.toContain(SECRET)
      expect(everything).not.toContain(wrongSecret)
      // An accepted webhook adds no rejection; the run's lines carry its identity.
      capture.lines.length = 0
      expect(yield* deliver(rt, notice({ attempt: 1 }))).toBe(200)
      yield* until(() => fake.ops("completeExecution").length === 1)
      expect(capture.rejections()).toEqual([])
    }).pipe(Effect.provide(capture.layer))
  })

  it.effect("a run's log lines carry the agent, execution, dispatch and attempt", () => {
    const capture = captureLogs()
    return Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const chatty = Agent.make({ id: "chatty", handler: () => Effect.logInfo("working") })
      const rt = yield* setup(chatty, fake)
      expect(yield* deliver(rt, notice({ attempt: 3 }))).toBe(200)
      yield* until(() => fake.ops("completeExecution").length === 1)
      const working = capture.lines.find((l) => l.message === "working")
      expect(working?.annotations).toMatchObject({
        "rebuno.agent_id": "chatty",
        "rebuno.execution_id": EXEC,
        "rebuno.dispatch_id": D1,
        "rebuno.dispatch_attempt": "3"
      })
    }).pipe(Effect.provide(capture.layer))
  })

  it.effect("over HTTP: an unknown route (info), an oversized body and a bad signature", () => {
    const capture = captureLogs()
    return Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      yield* Layer.launch(Agent.layer(agent).pipe(Layer.provide(fake.layer))).pipe(Effect.forkScoped)
      yield* Effect.yieldNow
      const client = yield* HttpClient.HttpClient
      const post = (path: string, body: string | Uint8Array, signature: string) =>
        client.execute(
          HttpClientRequest.post(path).pipe(
            HttpClientRequest.setHeader("rebuno-signature", signature),
            typeof body === "string"
              ? HttpClientRequest.bodyText(body, "application/json")
              : HttpClientRequest.bodyUint8Array(body, "application/json")
          )
        ).pipe(Effect.map((r) => r.status))
      expect(yield* client.get("/webhook").pipe(Effect.map((r) => r.status))).toBe(404)
      expect(yield* post("/hook", notice(), "sha256=00")).toBe(404)
      expect(yield* post("/webhook", new Uint8Array(Agent.maxWebhookBodyBytes + 1), "sha256=00")).toBe(401)
      expect(yield* post("/webhook", notice(), "sha256=00")).toBe(401)
      expect(capture.rejections().map((r) => [r.level, r.message, r.reason, r.status])).toEqual([
        [
          "Info",
          "webhook request rejected (404): no webhook at GET /webhook (this agent serves POST /webhook)",
          "unknown_route",
          404
        ],
        [
          "Info",
          "webhook request rejected (404): no webhook at POST /hook (this agent serves POST /webhook)",
          "unknown_route",
          404
        ],
        [
          "Warn",
          "webhook request rejected (401): the body is larger than 1048576 bytes (a webhook is about 200)",
          "body_too_large",
          401
        ],
        ["Warn", expect.stringContaining("webhook request rejected (401): bad signature"), "bad_signature", 401]
      ])
    }).pipe(Effect.provide(NodeHttpServer.layerTest), Effect.provide(capture.layer))
  }, 20_000)

  it.effect("the lines are silenced by the log level", () => {
    const capture = captureLogs()
    return Effect.gen(function*() {
      const rt = yield* setup(agent, new FakeKernel())
      expect(yield* rt.handleWebhook({ body: encoder.encode(notice()), signature: "sha256=00" })).toBe(401)
      expect(yield* deliver(rt, "[]")).toBe(400)
      expect(capture.lines).toEqual([])
    }).pipe(Effect.provideService(References.MinimumLogLevel, "Error"), Effect.provide(capture.layer))
  })

  it.live("Agent.toWebHandler logs its rejections with the layer's logger", () => {
    const capture = captureLogs()
    return Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const web = Agent.toWebHandler(agent, Layer.merge(fake.layer, capture.layer))
      const request = (body: string, headers: Record<string, string>) =>
        new Request("http://agent.local/webhook", { method: "POST", body, headers })
      const tooLarge = yield* Effect.promise(() =>
        web.handler(request("{}", { "content-length": String(Agent.maxWebhookBodyBytes + 1) }))
      )
      expect(tooLarge.status).toBe(401)
      const unsigned = yield* Effect.promise(() => web.handler(request(notice(), {})))
      expect(unsigned.status).toBe(401)
      expect(capture.rejections().map((r) => [r.reason, r.status, r.agentId])).toEqual([
        ["body_too_large", 401, "researcher"],
        ["missing_signature", 401, "researcher"]
      ])
      yield* Effect.promise(() => web.dispose())
    })
  })
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

  it.effect("a 401 (the kernel does not share the agent's secret) is logged with what to compare, once", () => {
    const capture = captureLogs()
    return Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.onPublishMetadata = () =>
        Effect.fail(
          new KernelError({ reason: new StatusError({ status: 401, code: "unauthorized", description: "unauthorized" }) })
        )
      const rt = yield* setup(described, fake)
      yield* rt.publishMetadata
      yield* until(() => metadataCalls(fake).length === 1)
      yield* Effect.yieldNow
      yield* rt.publishMetadata
      expect(capture.lines.filter((l) => l.level === "Warn").map((l) => [l.message, l.annotations["rebuno.agent_id"]]))
        .toEqual([[
          "the kernel refused this agent's signature (401 unauthorized) when publishing its metadata: compare " +
          "REBUNO_AGENT_SECRET (the agent's secret) with the secret of agent \"agent\" in the kernel's manifest, and " +
          "check that the agent is registered; not sent again",
          "agent"
        ]])
      expect(JSON.stringify(capture.lines)).not.toContain(SECRET)
    }).pipe(Effect.provide(capture.layer))
  })

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

  it.live("a wrong agent secret: the kernel and the agent both say so, neither shows a secret (issue 13)", () => {
    const capture = captureLogs()
    return Effect.gen(function*() {
      const kernel = yield* Kernel.start({ port: 0, settings: { maxAttempts: 1 } })
      const hello = Agent.make({ id: "hello", handler: () => Effect.succeed("hi") })
      const webhookUrl = yield* serve(hello, kernel.url, "the-agents-secret")
      // The kernel's manifest holds another secret than the agent's REBUNO_AGENT_SECRET.
      yield* kernel.core.registerAgent({ id: "hello", webhookUrl, secret: "the-kernels-secret" })
      const { id } = yield* kernel.core.createExecution({ agentId: "hello", inputRaw: "{}", agentVersion: undefined })
      let status = ""
      for (let i = 0; i < 300 && status !== "failed"; i++) {
        status = (yield* kernel.core.getExecution(id)).status
        if (status !== "failed") yield* Effect.sleep("10 millis")
      }
      expect((yield* kernel.core.getExecution(id)).failureReason).toBe("dispatch_exhausted")
      const messages = capture.lines.map((l) => `${l.level} ${l.message}`)
      expect(messages).toContain(
        "Warn webhook request rejected (401): bad signature: the kernel signed this webhook with another secret than " +
          "this agent's; compare REBUNO_AGENT_SECRET (the agent's secret) with the secret of agent \"hello\" in the kernel's manifest"
      )
      expect(messages).toContain(
        "Warn webhook delivery to agent hello failed: the agent answered 401 Unauthorized (the agent rejected the " +
          "signature: compare the agent's REBUNO_AGENT_SECRET with this agent's secret in the kernel's manifest); " +
          "attempt 1 of 1, the last"
      )
      const everything = JSON.stringify(capture.lines)
      expect(everything).not.toContain("the-agents-secret")
      expect(everything).not.toContain("the-kernels-secret")
    }).pipe(Effect.scoped, Effect.provide(capture.layer))
  }, 30_000)
})

describe("replay-aware logging (issue 13)", () => {
  /** A logger keeping each line's message and whether it is marked as replayed. */
  const captureMessages = () => {
    const lines: Array<string> = []
    const logger = Logger.make<unknown, void>((options) => {
      const parts: ReadonlyArray<unknown> = Array.isArray(options.message) ? options.message : [options.message]
      const marked = options.fiber.getRef(References.CurrentLogAnnotations)["rebuno.replaying"] === true
      lines.push(`${marked ? "[replaying] " : ""}${parts.map(String).join(" ")}`)
    })
    return { lines, layer: Logger.layer([logger]) }
  }

  const loggingAgent = (replayLogging?: Agent.ReplayLogging) => {
    const lookup = Tool.make("lookup", {
      args: Schema.Struct({ q: Schema.String }),
      success: Schema.String,
      execute: ({ q }) => Effect.as(Effect.log(`looking up ${q}`), q.toUpperCase())
    })
    return Agent.make({
      id: "logger",
      ...(replayLogging === undefined ? {} : { replayLogging }),
      handler: () =>
        Effect.gen(function*() {
          yield* Effect.log("start")
          const a = yield* lookup({ q: "a" })
          yield* Effect.log(`got ${a}`)
          const b = yield* lookup({ q: "b" })
          yield* Effect.log(`got ${b}`)
          return a + b
        })
    })
  }

  const crashRun = (agent: Agent.Agent<unknown, string, unknown, never>) =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      // The crash comes once the first lookup is recorded: the re-run replays it, then runs the second.
      const run = yield* kernel.run(agent, {}, { crash: { afterSteps: 1 } })
      expect(run.status).toBe("completed")
      expect(run.deliveries).toBe(2)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent] })))

  it.effect("suppress (the default): a re-run does not repeat the lines of the steps it replays", () => {
    const capture = captureMessages()
    return crashRun(loggingAgent()).pipe(
      Effect.provide(capture.layer),
      Effect.andThen(Effect.sync(() =>
        // "got A" came after the crash in the first run, and in the replaying stretch of the
        // re-run (before its first proceed): by the definition it is a replayed line.
        expect(capture.lines).toEqual(["start", "looking up a", "looking up b", "got B"])
      ))
    )
  })

  it.effect("mark: the replayed lines are written with rebuno.replaying=true", () => {
    const capture = captureMessages()
    return crashRun(loggingAgent("mark")).pipe(
      Effect.provide(capture.layer),
      Effect.andThen(Effect.sync(() =>
        expect(capture.lines).toEqual([
          "start",
          "looking up a",
          "[replaying] start",
          "[replaying] got A",
          "looking up b",
          "got B"
        ])
      ))
    )
  })

  it.effect("all (or Agent.ReplayLogging): every line, replayed or not, as before", () => {
    const capture = captureMessages()
    return crashRun(loggingAgent()).pipe(
      Effect.provideService(Agent.ReplayLogging, "all"),
      Effect.provide(capture.layer),
      Effect.andThen(Effect.sync(() =>
        expect(capture.lines).toEqual(["start", "looking up a", "start", "got A", "looking up b", "got B"])
      ))
    )
  })

  it.effect("a first run writes its lines (held only until its first decision); a run without steps too", () => {
    const capture = captureMessages()
    const quiet = Agent.make({ id: "quiet", handler: () => Effect.log("no steps here") })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      expect((yield* kernel.run(quiet, {})).status).toBe("completed")
      expect((yield* kernel.run(loggingAgent(), {})).status).toBe("completed")
    }).pipe(
      Effect.provide(TestKernel.layer({ agents: [quiet, loggingAgent()] })),
      Effect.provide(capture.layer),
      Effect.andThen(Effect.sync(() =>
        expect(capture.lines).toEqual(["no steps here", "start", "looking up a", "got A", "looking up b", "got B"])
      ))
    )
  })
})

describe("Agent.serveConfig (issue 13)", () => {
  const agent = Agent.make({ id: "configured", handler: () => Effect.succeed("hi") })
  const withEnv = (env: Record<string, string>) =>
    Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromUnknown(env))

  it.live("serves on AGENT_PORT and AGENT_HOST", () =>
    Effect.gen(function*() {
      const port = yield* freePort
      yield* Layer.build(Agent.serveConfig(agent).pipe(Layer.provide(new FakeKernel().layer))).pipe(
        withEnv({ AGENT_PORT: String(port), AGENT_HOST: "127.0.0.1" })
      )
      const status = yield* Effect.promise(() =>
        fetch(`http://127.0.0.1:${port}/webhook`, { method: "POST", body: "{}", signal: AbortSignal.timeout(5_000) })
          .then((response) => response.status)
      )
      // Unsigned: refused by the agent listening there.
      expect(status).toBe(401)
    }).pipe(Effect.provide(TestLogs.layer)))

  it.effect("a port that is not a port is a ConfigError naming AGENT_PORT; the defaults are 5000 and 0.0.0.0", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(
        Layer.build(Agent.serveConfig(agent).pipe(Layer.provide(new FakeKernel().layer))).pipe(
          withEnv({ AGENT_PORT: "eighty" })
        )
      )
      expect(error).toBeInstanceOf(Config.ConfigError)
      expect(String(error)).toContain("AGENT_PORT")
      expect(yield* Agent.serveFromEnv.pipe(withEnv({}))).toEqual({ port: 5000, host: "0.0.0.0" })
    }))
})
