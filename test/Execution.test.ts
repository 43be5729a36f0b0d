import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Option } from "effect"
import * as Execution from "../src/Execution.js"
import { Abandoned, Blocked, LeaseSuperseded, Terminated } from "../src/RebunoError.js"
import * as Step from "../src/Step.js"
import { FakeKernel } from "./support/FakeKernel.js"

const EXEC = "0192f1a0-0000-7000-8000-000000000000"
const options: Execution.RunOptions = {
  agentId: "agent",
  executionId: EXEC,
  dispatchId: "d1",
  dispatchAttempt: 3,
  leaseTimeoutSeconds: 120,
  input: { prompt: "hi" }
}

const inRun = (fake: FakeKernel, o: Execution.RunOptions = options) => <A, E>(self: Effect.Effect<A, E, Execution.Execution>) =>
  self.pipe(Effect.provide(Execution.layer(o)), Effect.provide(fake.layer))

describe("Execution", () => {
  it.effect("carries the run's identity, input and lease", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const exec = yield* inRun(fake)(Execution.Execution)
      expect(exec).toMatchObject({
        executionId: EXEC,
        agentId: "agent",
        dispatchId: "d1",
        dispatchAttempt: 3,
        leaseTimeoutSeconds: 120,
        input: { prompt: "hi" },
        caller: { agentId: "agent", lease: { dispatchId: "d1", attempt: 3 } }
      })
      expect(yield* inRun(fake)(Execution.executionId)).toBe(EXEC)
      const bare = yield* inRun(fake, { agentId: "a", executionId: EXEC, dispatchId: "d" })(Execution.Execution)
      expect(bare.dispatchAttempt).toBeUndefined()
      expect(bare.leaseTimeoutSeconds).toBeUndefined()
      expect(bare.input).toBeNull()
    }))

  it.effect("the backstop keeps the first signal; Blocked and Terminated do not stop the run", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const result = yield* inRun(fake)(Effect.gen(function*() {
        const exec = yield* Execution.Execution
        yield* exec.raise(new Blocked({ approvalId: "a1" }))
        yield* exec.raise(new Terminated())
        return { signal: yield* Execution.signal, stopped: yield* Deferred.isDone(exec.stopped) }
      }))
      expect(Option.getOrUndefined(result.signal)).toBeInstanceOf(Blocked)
      expect(result.stopped).toBe(false)
    }))

  for (const signal of [new LeaseSuperseded(), new Abandoned({ reason: "test" })]) {
    it.effect(`${signal._tag} stops the run: its client refuses every call without sending anything`, () =>
      Effect.gen(function*() {
        const fake = new FakeKernel().addExecution(EXEC, {})
        const result = yield* inRun(fake)(Effect.gen(function*() {
          const exec = yield* Execution.Execution
          yield* exec.raise(signal)
          const refused = yield* Effect.all([
            Effect.flip(exec.kernel.getExecution(exec.caller, EXEC)),
            Effect.flip(exec.kernel.heartbeat(exec.caller, EXEC)),
            Effect.flip(exec.kernel.completeExecution(exec.caller, EXEC, undefined)),
            Effect.flip(exec.kernel.failExecution(exec.caller, EXEC, "x")),
            Effect.flip(Step.now)
          ])
          yield* exec.kernel.publishDelta(exec.caller, EXEC, "s", 0, "x")
          return { refused, stopped: yield* Deferred.isDone(exec.stopped) }
        }))
        expect(result.stopped).toBe(true)
        for (const e of result.refused) expect(e).toBeInstanceOf(LeaseSuperseded)
        expect(fake.calls).toHaveLength(0)
      }))
  }

  it.effect("a lease_superseded answer from the kernel is recorded and stops the run", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      fake.fenced.add("d1:3")
      const result = yield* inRun(fake)(Effect.gen(function*() {
        const error = yield* Effect.flip(Step.now)
        const exec = yield* Execution.Execution
        return { error, signal: yield* Execution.signal, stopped: yield* Deferred.isDone(exec.stopped) }
      }))
      expect(result.error).toBeInstanceOf(LeaseSuperseded)
      expect(Option.getOrUndefined(result.signal)).toBeInstanceOf(LeaseSuperseded)
      expect(result.stopped).toBe(true)
    }))

  it("a step outside a run does not type-check", () => {
    const outside = () =>
      // @ts-expect-error Execution is not provided
      Effect.runPromise(Step.now)
    expect(typeof outside).toBe("function")
  })
})
