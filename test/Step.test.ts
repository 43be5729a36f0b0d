import { describe, expect, it } from "@effect/vitest"
import { Data, Deferred, Effect, Fiber, Option, Schedule, Schema } from "effect"
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
import { failureReason } from "../src/internal/run/failureReason.js"
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

  it.effect("a result that is not JSON is a StepDecodeError naming where; nothing is recorded", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const error = yield* Effect.flip(
        Step.run("x", Effect.succeed({ total: NaN })).pipe(inRun(fake))
      )
      expect(error).toBeInstanceOf(StepDecodeError)
      expect(error.message).toMatch(/^x: result is not JSON at \$\.total: /)
      // The failure reason says what it is: an agent bug, not a failed tool.
      expect(failureReason(error)).toMatch(/^agent_error: StepDecodeError: x: result is not JSON at \$\.total: /)
      expect(fake.ops("completeStep")).toHaveLength(0)
      expect(fake.ops("failStep")).toHaveLength(0)
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

describe("undeclared failures keep their tag (issue 13)", () => {
  class Overloaded extends Schema.TaggedError<Overloaded>()("Overloaded", { region: Schema.String }) {}
  class Busy extends Data.TaggedError("Busy")<{ readonly message: string }> {}

  it.effect("the recorded error, the ToolError and the failure reason name the tag, now and on replay", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const step = Step.make({
        kind: "tool_call",
        target: "order",
        body: () => Effect.fail(new Overloaded({ region: "eu" }))
      })
      const first = (yield* Effect.flip(inRun(fake, run1)(step))) as ToolError
      expect(fake.ops("failStep").map((c) => JSON.parse(c.json!))).toEqual([
        { message: "Overloaded: {\"region\":\"eu\"}", _tag: "Overloaded" }
      ])
      expect(first).toBeInstanceOf(ToolError)
      expect(first.message).toBe("order: Overloaded: {\"region\":\"eu\"}")
      expect(failureReason(first)).toBe("tool_error: order: Overloaded: {\"region\":\"eu\"}")
      const second = (yield* Effect.flip(inRun(fake, run2)(step))) as ToolError
      expect(second.message).toBe(first.message)
      expect((second.error as { readonly _tag: string })._tag).toBe("Overloaded")
    }))

  it.effect("a tagged error with a message: '<Tag>: <message>'; a plain Error stays '<message>'", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const busy = yield* Effect.flip(Step.run("a", Effect.fail(new Busy({ message: "try later" }))).pipe(inRun(fake)))
      const plain = yield* Effect.flip(Step.run("b", Effect.fail(new Error("smtp down"))).pipe(inRun(fake)))
      expect(busy.message).toBe("a: Busy: try later")
      expect(plain.message).toBe("b: smtp down")
      expect(fake.ops("failStep").map((c) => c.json)).toEqual([
        "{\"message\":\"Busy: try later\",\"_tag\":\"Busy\"}",
        "{\"message\":\"smtp down\"}"
      ])
    }))
})

describe("retry (issue 13)", () => {
  /** A body that fails `failures` times, then succeeds with the number of tries. */
  const flaky = (failures: number) => {
    let tries = 0
    return {
      get tries() {
        return tries
      },
      body: Effect.suspend(() => ++tries <= failures ? Effect.fail(new Error(`down ${tries}`)) : Effect.succeed(tries))
    }
  }

  /** Let forked fibers run (bounded) and tell whether `fiber` is done without moving the clock. */
  const settledWithoutTime = <A, E>(fiber: Fiber.Fiber<A, E>) =>
    Effect.gen(function*() {
      for (let i = 0; i < 50 && fiber.pollUnsafe() === undefined; i++) yield* Effect.yieldNow
      return fiber.pollUnsafe() !== undefined
    })

  it.effect("each attempt is a step; failed ones record their number and retry time; the backoff is slept", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const body = flaky(2)
      const step = Step.run("quote", body.body, { success: Schema.Number, retry: Schedule.exponential("1 second") })
      const fiber = yield* Effect.forkChild(inRun(fake, run1)(step))
      expect(yield* settledWithoutTime(fiber)).toBe(false)
      expect(body.tries).toBe(1)
      yield* TestClock.adjust("999 millis")
      expect(body.tries).toBe(1)
      yield* TestClock.adjust("1 milli")
      expect(body.tries).toBe(2)
      yield* TestClock.adjust("2 seconds")
      expect(yield* Fiber.join(fiber)).toBe(3)
      expect(fake.ops("submitStep").map((c) => [c.submission!.kind, c.submission!.target, c.submission!.argsJson]))
        .toEqual([["local", "quote", "{}"], ["local", "quote", "{}"], ["local", "quote", "{}"]])
      expect(fake.ops("failStep").map((c) => JSON.parse(c.json!))).toEqual([
        { message: "down 1", attempt: 1, retry_at_ms: 1_000 },
        { message: "down 2", attempt: 2, retry_at_ms: 3_000 }
      ])
      expect(fake.ops("completeStep").map((c) => c.json)).toEqual(["3"])
      expect(new Set(fake.ops("submitStep").map((c) => c.at))).toEqual(new Set([0, 1_000, 3_000]))
    }))

  it.effect("a replay follows the recorded attempts without sleeping and without running the body", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const body = flaky(2)
      const step = Step.run("quote", body.body, { success: Schema.Number, retry: Schedule.exponential("1 second") })
      const first = yield* Effect.forkChild(inRun(fake, run1)(step))
      yield* TestClock.adjust("3 seconds")
      expect(yield* Fiber.join(first)).toBe(3)
      const replayed = yield* Effect.forkChild(inRun(fake, run2)(step))
      // No time passes: a replay that slept through the backoff again would not finish.
      expect(yield* settledWithoutTime(replayed)).toBe(true)
      expect(yield* Fiber.join(replayed)).toBe(3)
      expect(body.tries).toBe(3)
      expect(fake.ops("submitStep")).toHaveLength(6)
      expect(fake.ops("failStep")).toHaveLength(2)
    }))

  it.effect("exhausted: the last failure is raised and recorded without a retry time; a replay raises it too", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const body = flaky(10)
      const step = Step.run("quote", body.body, { retry: Schedule.spaced("1 second").pipe(Schedule.upTo({ times: 1 })) })
      const first = yield* Effect.forkChild(Effect.flip(inRun(fake, run1)(step)))
      yield* TestClock.adjust("1 second")
      const error = (yield* Fiber.join(first)) as ToolError
      expect(error).toBeInstanceOf(ToolError)
      expect(error.message).toBe("quote: down 2")
      expect(error.error).toEqual({ message: "down 2", attempt: 2 })
      expect(body.tries).toBe(2)
      const again = (yield* Effect.flip(inRun(fake, run2)(step))) as ToolError
      expect(again.message).toBe("quote: down 2")
      expect(body.tries).toBe(2)
    }))

  it.effect("a crash during the backoff: the re-run sleeps only what is left of it", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const body = flaky(1)
      const step = Step.run("quote", body.body, { success: Schema.Number, retry: Schedule.spaced("10 seconds") })
      const crashed = yield* Effect.forkChild(inRun(fake, run1)(step))
      yield* TestClock.adjust("4 seconds")
      yield* Fiber.interrupt(crashed)
      const rerun = yield* Effect.forkChild(inRun(fake, run2)(step))
      expect(yield* settledWithoutTime(rerun)).toBe(false)
      yield* TestClock.adjust("5999 millis")
      expect(body.tries).toBe(1)
      yield* TestClock.adjust("1 milli")
      expect(yield* Fiber.join(rerun)).toBe(2)
      expect(fake.ops("submitStep").map((c) => c.at)).toEqual([0, 4_000, 10_000])
    }))

  it.effect("typed failures feed the schedule and are recorded with their attempt; denials are not retried", () =>
    Effect.gen(function*() {
      class OutOfStock extends Schema.TaggedError<OutOfStock>()("OutOfStock", { sku: Schema.String }) {}
      const fake = new FakeKernel()
      let tries = 0
      const step = Step.make({
        kind: "tool_call",
        target: "order",
        failure: OutOfStock,
        retry: Schedule.recurs(3).pipe(Schedule.while(({ input }) => (input as OutOfStock).sku !== "B")),
        body: () => Effect.fail(new OutOfStock({ sku: ++tries === 1 ? "A" : "B" }))
      })
      const error = yield* Effect.flip(inRun(fake)(step))
      expect(error).toBeInstanceOf(OutOfStock)
      expect((error as OutOfStock).sku).toBe("B")
      expect(fake.ops("failStep").map((c) => JSON.parse(c.json!))).toEqual([
        { message: "", failure: { _tag: "OutOfStock", sku: "A" }, attempt: 1, retry_at_ms: 0 },
        { message: "", failure: { _tag: "OutOfStock", sku: "B" }, attempt: 2 }
      ])

      const denied = new FakeKernel()
      denied.script.push({ decision: "denied", stepId: "s", reason: "no" })
      const refused = yield* Effect.flip(
        Step.run("x", Effect.succeed(1), { retry: Schedule.recurs(5) }).pipe(inRun(denied))
      )
      expect(refused).toBeInstanceOf(PolicyError)
      expect(denied.ops("submitStep")).toHaveLength(1)
    }))

  it.effect("without retry nothing changes: one step, the error object without attempt", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      yield* Effect.flip(Step.run("x", Effect.fail(new Error("no"))).pipe(inRun(fake)))
      expect(fake.ops("failStep").map((c) => c.json)).toEqual(["{\"message\":\"no\"}"])
    }))
})

describe("Step.sleep / Step.sleepUntil (issue 13)", () => {
  it.effect("records the deadline once as the local step sleep and sleeps until it", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      yield* TestClock.setTime(5_000)
      const fiber = yield* Effect.forkChild(inRun(fake)(Step.sleep("10 seconds")))
      yield* TestClock.adjust("9999 millis")
      expect(fiber.pollUnsafe()).toBeUndefined()
      yield* TestClock.adjust("1 milli")
      yield* Fiber.join(fiber)
      const submit = fake.ops("submitStep")[0]!.submission!
      expect([submit.kind, submit.target, submit.argsJson]).toEqual(["local", "sleep", "{\"duration_ms\":10000}"])
      expect(fake.ops("completeStep").map((c) => c.json)).toEqual(["15000"])
    }))

  it.effect("a crash mid-sleep: the re-run replays the deadline and sleeps only the remainder", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      let after = 0
      const program = Effect.andThen(Step.sleep("1 hour"), Effect.sync(() => after++))
      const crashed = yield* Effect.forkChild(inRun(fake, run1)(program))
      yield* TestClock.adjust("40 minutes")
      yield* Fiber.interrupt(crashed)
      const rerun = yield* Effect.forkChild(inRun(fake, run2)(program))
      yield* TestClock.adjust("19 minutes")
      expect(after).toBe(0)
      yield* TestClock.adjust("1 minute")
      yield* Fiber.join(rerun)
      expect(after).toBe(1)
      expect(fake.ops("completeStep")).toHaveLength(1)
      // A re-run after the deadline does not sleep at all.
      yield* inRun(fake, { ...run2, dispatchAttempt: 3 })(Step.sleep("1 hour"))
    }))

  it.effect("sleepUntil: the deadline is the argument; a passed deadline returns at once", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      yield* TestClock.setTime(1_000)
      const fiber = yield* Effect.forkChild(inRun(fake)(Step.sleepUntil(3_000)))
      yield* TestClock.adjust("2 seconds")
      yield* Fiber.join(fiber)
      yield* inRun(fake)(Step.sleepUntil(2_000))
      expect(fake.ops("submitStep").map((c) => c.submission!.argsJson)).toEqual([
        "{\"until_ms\":3000}",
        "{\"until_ms\":2000}"
      ])
    }))
})
