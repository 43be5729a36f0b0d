import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Option, Schema } from "effect"
import { TestClock } from "effect/testing"
import * as Execution from "../src/Execution.js"
import {
  Abandoned,
  Blocked,
  InvalidArguments,
  KernelError,
  LeaseSuperseded,
  PolicyError,
  RateLimited,
  StatusError,
  StepDecodeError,
  Terminated,
  ToolError
} from "../src/RebunoError.js"
import * as Step from "../src/Step.js"
import { FakeKernel } from "./support/FakeKernel.js"

const EXEC = "0192f1a0-0000-7000-8000-000000000000"

const run1: Execution.RunOptions = { agentId: "agent", executionId: EXEC, dispatchId: "d1", dispatchAttempt: 1 }
const run2: Execution.RunOptions = { agentId: "agent", executionId: EXEC, dispatchId: "d1", dispatchAttempt: 2 }

const inRun = (fake: FakeKernel, options: Execution.RunOptions = run1) => <A, E>(self: Effect.Effect<A, E, Execution.Execution>) =>
  self.pipe(Effect.provide(Execution.layer(options)), Effect.provide(fake.layer))

const counter = () => {
  let n = 0
  return { get count() { return n }, bump: <A>(a: A) => Effect.sync(() => { n++; return a }) }
}

describe("Step.make", () => {
  it.effect("proceed runs the body, completes with the encoded result and returns it", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const value = yield* Step.make({
        kind: "tool_call",
        target: "search",
        args: { query: "hi" },
        body: () => Effect.succeed({ hits: 3 })
      }).pipe(inRun(fake))
      expect(value).toEqual({ hits: 3 })
      const [submit] = fake.ops("submitStep")
      expect(submit!.submission).toEqual({ kind: "tool_call", target: "search", argsJson: "{\"query\":\"hi\"}", idempotency: "safe_to_retry" })
      expect(submit!.lease).toEqual({ dispatchId: "d1", attempt: 1 })
      expect(fake.ops("completeStep").map((c) => [c.stepId, c.json])).toEqual([["step-0", "{\"hits\":3}"]])
    }))

  it.effect("exposes the step id to the body", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const seen = yield* Step.make({ kind: "tool_call", target: "t", body: ({ stepId }) => Effect.succeed(stepId) }).pipe(inRun(fake))
      expect(seen).toBe("step-0")
    }))

  it.effect("records undefined as null and sends {} args by default", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      yield* Step.make({ kind: "local", target: "noop", body: () => Effect.void }).pipe(inRun(fake))
      expect(fake.ops("submitStep")[0]!.submission!.argsJson).toBe("{}")
      expect(fake.ops("completeStep")[0]!.json).toBe("null")
    }))

  it.effect("replay returns the recorded value without running the body", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const body = counter()
      const step = Step.make({
        kind: "tool_call",
        target: "search",
        args: { q: 1 },
        success: Schema.Struct({ at: Schema.DateFromString }),
        body: () => body.bump({ at: new Date("2026-01-01T00:00:00.000Z") })
      })
      const first = yield* inRun(fake, run1)(step)
      const second = yield* inRun(fake, run2)(step)
      expect(body.count).toBe(1)
      expect(second).toEqual(first)
      expect(second.at).toBeInstanceOf(Date)
      expect(fake.ops("completeStep")[0]!.json).toBe("{\"at\":\"2026-01-01T00:00:00.000Z\"}")
      expect(fake.ops("completeStep")).toHaveLength(1)
    }))

  it.effect("replay without a result returns null", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.script.push({ decision: "replay", stepId: "s" })
      const value = yield* Step.make({ kind: "local", target: "x", body: () => Effect.succeed(1) }).pipe(inRun(fake))
      expect(value).toBeNull()
    }))

  it.effect("a recorded result that no longer decodes is a StepDecodeError", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.script.push({ decision: "replay", stepId: "s", result: "nope" })
      const error = yield* Effect.flip(
        Step.make({ kind: "local", target: "x", success: Schema.Number, body: () => Effect.succeed(1) }).pipe(inRun(fake))
      )
      expect(error).toBeInstanceOf(StepDecodeError)
    }))

  it.effect("denied → PolicyError with the reason, or 'denied by policy'", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.script.push({ decision: "denied", stepId: "s1", reason: "no_email" }, { decision: "denied", stepId: "s2" })
      const step = Step.make({ kind: "tool_call", target: "email", body: () => Effect.succeed(1) })
      const a = yield* Effect.flip(inRun(fake)(step))
      const b = yield* Effect.flip(inRun(fake)(step))
      expect(a).toBeInstanceOf(PolicyError)
      expect(a).toMatchObject({ reason: "no_email", stepId: "s1", target: "email" })
      expect((b as PolicyError).reason).toBe("denied by policy")
      expect(fake.ops("completeStep")).toHaveLength(0)
    }))

  it.effect("rate_limited → RateLimited with the reason (default rate_limit_exceeded)", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.script.push({ decision: "rate_limited", reason: "rate_limiter_unavailable" }, { decision: "rate_limited" })
      const step = Step.make({ kind: "tool_call", target: "t", body: () => Effect.succeed(1) })
      const a = yield* Effect.flip(inRun(fake)(step))
      const b = yield* Effect.flip(inRun(fake)(step))
      expect(a).toBeInstanceOf(RateLimited)
      expect((a as RateLimited).reason).toBe("rate_limiter_unavailable")
      expect((b as RateLimited).reason).toBe("rate_limit_exceeded")
    }))

  it.effect("blocked and execution_blocked → Blocked, recorded on the run", () =>
    Effect.gen(function*() {
      for (const decision of [{ decision: "blocked", stepId: "s", approvalId: "ap-1" }, { decision: "execution_blocked" }]) {
        const fake = new FakeKernel()
        fake.script.push(decision)
        const [error, signal] = yield* Effect.gen(function*() {
          const error = yield* Effect.flip(Step.make({ kind: "tool_call", target: "t", body: () => Effect.succeed(1) }))
          return [error, yield* Execution.signal] as const
        }).pipe(inRun(fake))
        expect(error).toBeInstanceOf(Blocked)
        expect(Option.getOrUndefined(signal)).toBeInstanceOf(Blocked)
        if (decision.approvalId !== undefined) expect((error as Blocked).approvalId).toBe("ap-1")
      }
    }))

  it.effect("execution_terminal → Terminated, recorded on the run", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.script.push({ decision: "execution_terminal" })
      const [error, signal] = yield* Effect.gen(function*() {
        const error = yield* Effect.flip(Step.make({ kind: "tool_call", target: "t", body: () => Effect.succeed(1) }))
        return [error, yield* Execution.signal] as const
      }).pipe(inRun(fake))
      expect(error).toBeInstanceOf(Terminated)
      expect(Option.isSome(signal)).toBe(true)
    }))

  it.effect("an unknown decision is a KernelError 'unexpected step decision: <value>'", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.script.push({ decision: "maybe", stepId: "s" })
      const error = yield* Effect.flip(Step.make({ kind: "tool_call", target: "t", body: () => Effect.succeed(1) }).pipe(inRun(fake)))
      expect(error).toBeInstanceOf(KernelError)
      expect((error as KernelError).reason._tag).toBe("DecodeError")
      expect((error as KernelError).reason.description).toBe("unexpected step decision: maybe")
    }))

  it.effect("replay with an error → ToolError '<target>: message' carrying the error", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.script.push(
        { decision: "replay", stepId: "s1", error: { message: "boom" } },
        { decision: "replay", stepId: "s2", error: { reason: "policy_denied" } },
        { decision: "replay", stepId: "s3", error: { code: 7 } },
        { decision: "replay", stepId: "s4", error: null, result: 5 }
      )
      const body = counter()
      const step = Step.make({ kind: "tool_call", target: "send", body: () => body.bump(0) })
      const a = (yield* Effect.flip(inRun(fake)(step))) as ToolError
      const b = (yield* Effect.flip(inRun(fake)(step))) as ToolError
      const c = (yield* Effect.flip(inRun(fake)(step))) as ToolError
      const d = yield* inRun(fake)(step)
      expect(a).toBeInstanceOf(ToolError)
      expect(a.message).toBe("send: boom")
      expect(a).toMatchObject({ toolId: "send", stepId: "s1", retryable: false, error: { message: "boom" } })
      expect(b.message).toBe("send: policy_denied")
      expect(c.message).toBe("send: {\"code\":7}")
      expect(d).toBe(5)
      expect(body.count).toBe(0)
    }))

  it.effect("an indeterminate at_most_once step is a ToolError with indeterminate === true", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const step = Step.make({
        kind: "tool_call",
        target: "charge",
        idempotency: "at_most_once",
        body: () => Effect.never
      })
      // the first run dies mid-body: the step stays executing
      yield* Effect.forkChild(inRun(fake, run1)(step))
      yield* Effect.yieldNow
      const error = (yield* Effect.flip(inRun(fake, run2)(step))) as ToolError
      expect(error).toBeInstanceOf(ToolError)
      expect(error.indeterminate).toBe(true)
      expect(error.message).toMatch(/^charge: outcome unknown/)
    }))

  it.effect("a failing body is recorded with fail and raised as ToolError; replay raises the same", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const step = Step.make({ kind: "tool_call", target: "send", body: () => Effect.fail(new Error("smtp down")) })
      const first = (yield* Effect.flip(inRun(fake, run1)(step))) as ToolError
      expect(fake.ops("failStep").map((c) => c.json)).toEqual(["{\"message\":\"smtp down\"}"])
      expect(first.message).toBe("send: smtp down")
      const second = (yield* Effect.flip(inRun(fake, run2)(step))) as ToolError
      expect(second.message).toBe(first.message)
      expect(second.error).toEqual(first.error)
    }))

  it.effect("a defect in the body is recorded and raised as ToolError", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const error = yield* Effect.flip(
        Step.make({ kind: "local", target: "x", body: () => Effect.sync(() => { throw new TypeError("bad") }) }).pipe(inRun(fake))
      )
      expect(error).toBeInstanceOf(ToolError)
      expect(fake.ops("failStep")[0]!.json).toBe("{\"message\":\"bad\"}")
    }))

  it.effect("fail-step error answers are swallowed; LeaseSuperseded propagates; lost answers abandon", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.onFail = () =>
        Effect.fail(new KernelError({ reason: new StatusError({ status: 400, code: "validation_error", description: "x" }) }))
      const step = Step.make({ kind: "local", target: "x", body: () => Effect.fail("nope") })
      expect(yield* Effect.flip(inRun(fake)(step))).toBeInstanceOf(ToolError)
      fake.onFail = () => Effect.fail(new LeaseSuperseded())
      expect(yield* Effect.flip(inRun(fake)(step))).toBeInstanceOf(LeaseSuperseded)
      // PROTOCOL.md 15.1: retries exhausted on a step fail → abandon, never leave the step unrecorded and go on
      fake.onFail = () => Effect.fail(FakeKernel.transport("fail"))
      expect(yield* Effect.flip(inRun(fake)(step))).toBeInstanceOf(Abandoned)
    }))

  it.effect("a typed failure is recorded and survives replay", () =>
    Effect.gen(function*() {
      class OutOfStock extends Schema.TaggedError<OutOfStock>()("OutOfStock", { sku: Schema.String }) {}
      const fake = new FakeKernel()
      const body = counter()
      const step = Step.make({
        kind: "tool_call",
        target: "order",
        success: Schema.String,
        failure: OutOfStock,
        body: () => Effect.andThen(body.bump(0), Effect.fail(new OutOfStock({ sku: "A-1" })))
      })
      const first = yield* Effect.flip(inRun(fake, run1)(step))
      expect(first).toBeInstanceOf(OutOfStock)
      const recorded = JSON.parse(fake.ops("failStep")[0]!.json!)
      expect(recorded.failure).toEqual({ _tag: "OutOfStock", sku: "A-1" })
      expect(typeof recorded.message).toBe("string")
      const second = yield* Effect.flip(inRun(fake, run2)(step))
      expect(second).toBeInstanceOf(OutOfStock)
      expect((second as OutOfStock).sku).toBe("A-1")
      expect(body.count).toBe(1)
    }))

  it.effect("signals and policy errors from nested steps propagate without recording", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.policy = (s) => s.target === "inner" ? { decision: "denied", reason: "nope" } : undefined
      const inner = Step.make({ kind: "tool_call", target: "inner", body: () => Effect.succeed(1) })
      const outer = Step.make({ kind: "tool_call", target: "outer", body: () => inner })
      const error = yield* Effect.flip(inRun(fake)(outer))
      expect(error).toBeInstanceOf(PolicyError)
      expect((error as PolicyError).target).toBe("inner")
      expect(fake.ops("failStep")).toHaveLength(0)
      expect(fake.ops("completeStep")).toHaveLength(0)

      const fake2 = new FakeKernel()
      fake2.policy = (s) => s.target === "inner" ? { decision: "blocked", approvalId: "a" } : undefined
      expect(yield* Effect.flip(inRun(fake2)(outer))).toBeInstanceOf(Blocked)
      expect(fake2.ops("failStep")).toHaveLength(0)
    }))

  it.effect("non-JSON arguments fail with InvalidArguments and nothing is submitted", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const cycle: Record<string, unknown> = {}
      cycle["self"] = cycle
      const bad: ReadonlyArray<unknown> = [
        { n: NaN },
        { n: Infinity },
        { n: -Infinity },
        { n: 10n },
        { f: () => 1 },
        cycle,
        [undefined]
      ]
      for (const args of bad) {
        const error = yield* Effect.flip(Step.make({ kind: "tool_call", target: "t", args, body: () => Effect.succeed(1) }).pipe(inRun(fake)))
        expect(error).toBeInstanceOf(InvalidArguments)
        expect((error as InvalidArguments).target).toBe("t")
      }
      expect(fake.calls).toHaveLength(0)
    }))

  it.effect("a submit transport failure abandons the run: Abandoned, run stopped, client refuses", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.script.push(FakeKernel.transport("submit"))
      const result = yield* Effect.gen(function*() {
        const error = yield* Effect.flip(Step.make({ kind: "tool_call", target: "t", body: () => Effect.succeed(1) }))
        const exec = yield* Execution.Execution
        const stopped = yield* Deferred.isDone(exec.stopped)
        const again = yield* Effect.flip(Step.make({ kind: "tool_call", target: "t", body: () => Effect.succeed(1) }))
        return { error, stopped, again, signal: yield* Execution.signal }
      }).pipe(inRun(fake))
      expect(result.error).toBeInstanceOf(Abandoned)
      expect(result.stopped).toBe(true)
      expect(result.again).toBeInstanceOf(LeaseSuperseded)
      expect(Option.getOrUndefined(result.signal)).toBeInstanceOf(Abandoned)
      expect(fake.ops("submitStep")).toHaveLength(1)
    }))

  it.effect("a complete transport failure (after the client's retries) abandons the run", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.onComplete = () => Effect.fail(FakeKernel.transport("complete"))
      const error = yield* Effect.flip(Step.make({ kind: "local", target: "x", body: () => Effect.succeed(1) }).pipe(inRun(fake)))
      expect(error).toBeInstanceOf(Abandoned)
    }))

  it.effect("execution_terminal from complete → Terminated", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.onComplete = () => Effect.succeed({ decision: "execution_terminal" })
      const error = yield* Effect.flip(Step.make({ kind: "local", target: "x", body: () => Effect.succeed(1) }).pipe(inRun(fake)))
      expect(error).toBeInstanceOf(Terminated)
    }))

  it.effect("a result that is not JSON is recorded as a failure and raised as ToolError", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const error = yield* Effect.flip(Step.make({ kind: "local", target: "x", body: () => Effect.succeed(NaN) }).pipe(inRun(fake)))
      expect(error).toBeInstanceOf(ToolError)
      expect(fake.ops("completeStep")).toHaveLength(0)
      expect(JSON.parse(fake.ops("failStep")[0]!.json!).message).toMatch(/not JSON/)
    }))
})

describe("Step.run", () => {
  it.effect("records a local step, data-first and data-last", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const a = yield* Step.run("pick", Effect.succeed("x"), { args: { n: 1 } }).pipe(inRun(fake))
      const b = yield* Effect.succeed(2).pipe(Step.run("count")).pipe(inRun(fake))
      const c = yield* Step.run("ctx", ({ stepId }) => Effect.succeed(stepId)).pipe(inRun(fake))
      const d = yield* Effect.succeed(3).pipe(Step.run("typed", { success: Schema.Number })).pipe(inRun(fake))
      expect([a, b, c, d]).toEqual(["x", 2, "step-2", 3])
      expect(fake.ops("submitStep").map((s) => [s.submission!.kind, s.submission!.target, s.submission!.argsJson])).toEqual([
        ["local", "pick", "{\"n\":1}"],
        ["local", "count", "{}"],
        ["local", "ctx", "{}"],
        ["local", "typed", "{}"]
      ])
    }))

  it.effect("a denied local step raises PolicyError", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.script.push({ decision: "denied", stepId: "s" })
      expect(yield* Effect.flip(Step.run("x", Effect.succeed(1)).pipe(inRun(fake)))).toBeInstanceOf(PolicyError)
    }))
})

describe("Step.now / random / uuid", () => {
  it.effect("now records the Clock time once and replays it", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      yield* TestClock.setTime(1_000)
      const first = yield* inRun(fake, run1)(Step.now)
      yield* TestClock.adjust("1 hour")
      const second = yield* inRun(fake, run2)(Step.now)
      expect(first).toBe(1_000)
      expect(second).toBe(1_000)
      const submit = fake.ops("submitStep")[0]!.submission!
      expect([submit.kind, submit.target, submit.argsJson]).toEqual(["local", "now", "{}"])
    }))

  it.effect("random records a double in [0, 1) and replays it", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const first = yield* inRun(fake, run1)(Step.random)
      const second = yield* inRun(fake, run2)(Step.random)
      expect(first).toBeGreaterThanOrEqual(0)
      expect(first).toBeLessThan(1)
      expect(second).toBe(first)
      expect(fake.ops("completeStep")).toHaveLength(1)
    }))

  it.effect("uuid records a v4 UUID and replays it", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const first = yield* inRun(fake, run1)(Step.uuid)
      const second = yield* inRun(fake, run2)(Step.uuid)
      expect(first).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
      expect(second).toBe(first)
    }))
})
