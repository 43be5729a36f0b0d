import { describe, expect, it } from "@effect/vitest"
import { Effect, Schedule, Schema } from "effect"
import * as Agent from "../src/Agent.js"
import * as Execution from "../src/Execution.js"
import { InvalidArguments, PolicyError, ToolError } from "../src/RebunoError.js"
import * as Step from "../src/Step.js"
import * as Tool from "../src/Tool.js"
import { TestKernel } from "../src/testing/index.js"
import { FakeKernel } from "./support/FakeKernel.js"

const EXEC = "0192f1a0-0000-7000-8000-000000000000"
const run1: Execution.RunOptions = { agentId: "agent", executionId: EXEC, dispatchId: "d1", dispatchAttempt: 1 }
const run2: Execution.RunOptions = { agentId: "agent", executionId: EXEC, dispatchId: "d1", dispatchAttempt: 2 }

const inRun = (fake: FakeKernel, options: Execution.RunOptions = run1) => <A, E>(self: Effect.Effect<A, E, Execution.Execution>) =>
  self.pipe(Effect.provide(Execution.layer(options)), Effect.provide(fake.layer))

const search = Tool.make("search", {
  description: "Search the web",
  args: Schema.Struct({ query: Schema.String, limit: Schema.NumberFromString }),
  success: Schema.Array(Schema.String),
  execute: ({ query, limit }) => Effect.succeed(Array.from({ length: limit }, (_, i) => `${query} #${i}`))
})

describe("Tool.make", () => {
  it.effect("records a tool_call step with the encoded arguments and returns the result", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const hits = yield* inRun(fake)(search({ query: "effect", limit: 2 }))
      expect(hits).toEqual(["effect #0", "effect #1"])
      expect(fake.ops("submitStep")[0]!.submission).toEqual({
        kind: "tool_call",
        target: "search",
        argsJson: "{\"query\":\"effect\",\"limit\":\"2\"}",
        idempotency: "safe_to_retry"
      })
      expect(fake.ops("completeStep")[0]!.json).toBe("[\"effect #0\",\"effect #1\"]")
    }))

  it.effect("replays the recorded result without executing again", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      let executed = 0
      const counted = Tool.make("counted", {
        args: Schema.Struct({ n: Schema.Number }),
        success: Schema.Number,
        execute: ({ n }) => Effect.sync(() => ++executed + n)
      })
      const first = yield* inRun(fake, run1)(counted({ n: 10 }))
      const second = yield* inRun(fake, run2)(counted({ n: 10 }))
      expect([first, second, executed]).toEqual([11, 11, 1])
    }))

  it.effect("carries its name, description, schemas, idempotency and JSON Schema", () =>
    Effect.sync(() => {
      expect(search.name).toBe("search")
      expect(search.description).toBe("Search the web")
      expect(search.idempotency).toBe("safe_to_retry")
      expect(search.jsonSchema).toMatchObject({
        type: "object",
        required: ["query", "limit"],
        properties: { query: { type: "string" } }
      })
      const once = Tool.make("pay", {
        args: Schema.Struct({}),
        success: Schema.Null,
        idempotency: "at_most_once",
        execute: () => Effect.succeed(null)
      })
      expect(once.idempotency).toBe("at_most_once")
      expect(once.description).toBeUndefined()
    }))

  it.effect("sends at_most_once when declared", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const pay = Tool.make("pay", {
        args: Schema.Struct({ cents: Schema.Number }),
        success: Schema.Null,
        idempotency: "at_most_once",
        execute: () => Effect.succeed(null)
      })
      yield* inRun(fake)(pay({ cents: 5 }))
      expect(fake.ops("submitStep")[0]!.submission!.idempotency).toBe("at_most_once")
    }))

  it.effect("arguments that do not encode fail with InvalidArguments; nothing is sent", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const error = yield* Effect.flip(inRun(fake)(search({ query: 1 as unknown as string, limit: 1 })))
      expect(error).toBeInstanceOf(InvalidArguments)
      expect(error).toMatchObject({ target: "search", path: "$.query" })
      const loose = Tool.make("loose", { args: Schema.Unknown, success: Schema.Unknown, execute: () => Effect.succeed(1) })
      expect(yield* Effect.flip(inRun(fake)(loose({ x: 1n })))).toBeInstanceOf(InvalidArguments)
      const nan = yield* Effect.flip(inRun(fake)(loose({ x: NaN })))
      expect(nan).toMatchObject({ target: "loose", path: "$.x" })
      expect(fake.calls).toHaveLength(0)
    }))

  it.effect("an execute failure is recorded and raised as ToolError", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const send = Tool.make("send_email", {
        args: Schema.Struct({ to: Schema.String }),
        success: Schema.Void,
        execute: () => Effect.fail(new Error("boom"))
      })
      const error = yield* Effect.flip(inRun(fake)(send({ to: "a@b" })))
      expect(error).toBeInstanceOf(ToolError)
      expect(error.message).toBe("send_email: boom")
      expect(fake.ops("failStep")[0]!.json).toBe("{\"message\":\"boom\"}")
    }))

  it.effect("a typed failure survives replay", () =>
    Effect.gen(function*() {
      class NotFound extends Schema.TaggedError<NotFound>()("NotFound", { id: Schema.Number }) {}
      const fake = new FakeKernel()
      const lookup = Tool.make("lookup", {
        args: Schema.Struct({ id: Schema.Number }),
        success: Schema.String,
        failure: NotFound,
        execute: ({ id }) => Effect.fail(new NotFound({ id }))
      })
      const program = lookup({ id: 7 }).pipe(Effect.catchTag("NotFound", (e) => Effect.succeed(`missing ${e.id}`)))
      expect(yield* inRun(fake, run1)(program)).toBe("missing 7")
      expect(yield* inRun(fake, run2)(program)).toBe("missing 7")
      expect(fake.ops("failStep")).toHaveLength(1)
    }))
})

describe("Tool.wrap", () => {
  it.effect("wraps a Promise-returning function", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const reverse = Tool.wrap("reverse", async ({ text }: { readonly text: string }) => ({ reversed: [...text].reverse().join("") }), {
        args: Schema.Struct({ text: Schema.String }),
        success: Schema.Struct({ reversed: Schema.String })
      })
      expect(yield* inRun(fake)(reverse({ text: "héllo" }))).toEqual({ reversed: "olléh" })
    }))

  it.effect("a rejection is recorded with its message and raised as ToolError", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const flaky = Tool.wrap("flaky", () => Promise.reject(new Error("upstream 503")), {
        args: Schema.Struct({}),
        success: Schema.Null
      })
      const error = yield* Effect.flip(inRun(fake)(flaky({})))
      expect(error).toBeInstanceOf(ToolError)
      expect(error.message).toBe("flaky: upstream 503")
      expect(fake.ops("failStep")[0]!.json).toBe("{\"message\":\"upstream 503\"}")
    }))
})

describe("Tool.denialAsText", () => {
  it.effect("turns the tool's own denial into '<name> not allowed. reason: <reason>'", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.script.push({ decision: "denied", stepId: "s1", reason: "no_search" }, { decision: "denied", stepId: "s2" })
      const lenient = Tool.denialAsText(search)
      expect(lenient.name).toBe("search")
      expect(yield* inRun(fake)(lenient({ query: "x", limit: 1 }))).toBe("search not allowed. reason: no_search")
      expect(yield* inRun(fake)(lenient({ query: "x", limit: 1 }))).toBe("search not allowed. reason: denied by policy")
    }))

  it.effect("leaves nested denials and other errors alone", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.policy = (s) => s.target === "inner" ? { decision: "denied", reason: "inner_denied" } : undefined
      const inner = Tool.make("inner", { args: Schema.Struct({}), success: Schema.Number, execute: () => Effect.succeed(1) })
      const outer = Tool.denialAsText(Tool.make("outer", {
        args: Schema.Struct({}),
        success: Schema.Number,
        execute: () => inner({})
      }))
      const error = yield* Effect.flip(inRun(fake)(outer({})))
      expect(error).toBeInstanceOf(PolicyError)
      expect((error as PolicyError).reason).toBe("inner_denied")
    }))

  it("denialText", () => {
    expect(Tool.denialText("t", undefined)).toBe("t not allowed. reason: denied by policy")
    expect(Tool.denialText("t", "approval_timeout")).toBe("t not allowed. reason: approval_timeout")
  })
})

describe("typing", () => {
  it("calling a tool outside a run is a type error", () => {
    const call = () =>
      // @ts-expect-error Execution is missing from the context
      Effect.runPromise(search({ query: "x", limit: 1 }))
    expect(typeof call).toBe("function")
  })
})

describe("issue 13 papercuts on the test kit", () => {
  class CardDeclined extends Schema.TaggedError<CardDeclined>()("CardDeclined", { code: Schema.String }) {}

  it.effect("an undeclared tagged failure reaches the failure reason with its tag", () => {
    const charge = Tool.make("charge", {
      args: Schema.Struct({ cents: Schema.Number }),
      success: Schema.String,
      execute: () => Effect.fail(new CardDeclined({ code: "insufficient_funds" }))
    })
    const shop = Agent.make({ id: "shop", handler: () => charge({ cents: 100 }) })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(shop, {})
      expect(run.status).toBe("failed")
      expect(run.failureReason).toBe("tool_error: charge: CardDeclined: {\"code\":\"insufficient_funds\"}")
      expect(run.steps.map((s) => s.error)).toEqual([
        { message: "CardDeclined: {\"code\":\"insufficient_funds\"}", _tag: "CardDeclined" }
      ])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [shop] })))
  })

  it.effect("retry: every attempt is a recorded step; after a crash the re-run replays them without sleeping", () => {
    let tries = 0
    const quote = Tool.make("quote", {
      args: Schema.Struct({ symbol: Schema.String }),
      success: Schema.Number,
      retry: Schedule.exponential("10 seconds"),
      execute: () => Effect.suspend(() => ++tries < 3 ? Effect.fail(new Error(`busy ${tries}`)) : Effect.succeed(42))
    })
    const trader = Agent.make({
      id: "trader",
      handler: () =>
        Effect.gen(function*() {
          const price = yield* quote({ symbol: "EFCT" })
          return yield* Step.run("after", Effect.succeed(price))
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      // The crash comes after the third attempt is recorded: the re-run replays all three.
      const run = yield* kernel.run(trader, {}, { crash: { afterSteps: 3 } })
      expect(run.status).toBe("completed")
      expect(run.output).toBe(42)
      expect(tries).toBe(3)
      expect(run.deliveries).toBe(2)
      const attempts = run.steps.filter((s) => s.target === "quote")
      expect(attempts.map((s) => [s.status, s.occurrence])).toEqual(
        expect.arrayContaining([["failed", 0], ["failed", 1], ["succeeded", 2]])
      )
      expect(attempts.map((s) => (s.error as { readonly attempt?: number } | undefined)?.attempt).sort()).toEqual([
        1,
        2,
        undefined
      ])
      const submits = run.calls.filter((c) => c.call === "submitStep" && c.target === "quote")
      const first = submits.filter((c) => c.attempt === 1).map((c) => c.atMs)
      const second = submits.filter((c) => c.attempt === 2).map((c) => c.atMs)
      // The first run slept through the backoff (10 s, then 20 s) ...
      expect(first[1]! - first[0]!).toBe(10_000)
      expect(first[2]! - first[1]!).toBe(20_000)
      // ... the re-run replayed the three attempts at once.
      expect(second).toHaveLength(3)
      expect(new Set(second).size).toBe(1)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [trader] })))
  })

  it.effect("Step.sleep: a crash mid-sleep, and the re-run sleeps only the remainder", () => {
    let reminded = 0
    const followUp = Agent.make({
      id: "follow-up",
      handler: () =>
        Effect.gen(function*() {
          yield* Step.sleep("1 hour")
          yield* Step.run("remind", Effect.sync(() => ++reminded))
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(followUp, {}, { crash: { afterSteps: 1 } })
      expect(run.status).toBe("completed")
      expect(run.deliveries).toBe(2)
      expect(reminded).toBe(1)
      const sleep = run.steps.find((s) => s.target === "sleep")!
      const deadline = sleep.result as number
      const remind = run.calls.find((c) => c.call === "submitStep" && c.target === "remind")!
      // Woken at the recorded deadline, not an hour after the re-run started.
      expect(remind.atMs).toBe(deadline)
      expect(remind.attempt).toBe(2)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [followUp] })))
  })
})
