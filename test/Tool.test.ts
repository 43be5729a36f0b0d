import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import * as Execution from "../src/Execution.js"
import { InvalidArguments, PolicyError, ToolError } from "../src/RebunoError.js"
import * as Tool from "../src/Tool.js"
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
