/**
 * The fault matrix, in-process: crashes at every kind of point, a lease that
 * lapses while the run is alive, failing webhooks, duplicate and stale
 * deliveries, and a kernel that is unreachable during each kind of call — on
 * the test kit under TestClock. Every case checks what ran how many times and
 * the final state: nothing may run more often than the protocol allows, and
 * nothing recorded may be lost.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Fiber, Layer, Random, Schema } from "effect"
import { Agent, KernelClient, Tool } from "effect-rebuno"
import type { ToolError } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"

const indeterminate = {
  message: "outcome unknown: this may already have taken effect. Check the state before continuing.",
  reason: "indeterminate"
}

interface WorldOptions {
  /** Hold every `fetch` body until this opens (after announcing itself on `started`). */
  readonly gate?: { readonly open: Deferred.Deferred<void>; readonly started: Deferred.Deferred<void> }
  /** Hold only the first `fetch` body (the first run's) until this opens. */
  readonly holdFirst?: { readonly open: Deferred.Deferred<void>; readonly started: Deferred.Deferred<void> }
  /** Hold only the second `fetch` body until this opens. */
  readonly holdSecond?: { readonly open: Deferred.Deferred<void>; readonly started: Deferred.Deferred<void> }
  /** Virtual time the `fetch` body takes. */
  readonly fetchTakes?: Duration.Input
  /** Make `fetch` fail (a ToolError recorded with step fail). */
  readonly fetchFails?: boolean
}

/**
 * An agent with a safe_to_retry `fetch` and an at_most_once `charge`, counting
 * how often each body started and finished.
 */
const makeWorld = (options: WorldOptions = {}) => {
  const started = { fetch: 0, charge: 0 }
  const finished = { fetch: 0, charge: 0 }
  const fetch = Tool.make("fetch", {
    args: Schema.Struct({ key: Schema.String }),
    success: Schema.Struct({ value: Schema.String }),
    execute: ({ key }) =>
      Effect.gen(function*() {
        started.fetch++
        const hold = options.gate ??
          (started.fetch === 1 ? options.holdFirst : started.fetch === 2 ? options.holdSecond : undefined)
        if (hold !== undefined) {
          yield* Deferred.succeed(hold.started, undefined)
          yield* Deferred.await(hold.open)
        }
        if (options.fetchTakes !== undefined) yield* Effect.sleep(options.fetchTakes)
        finished.fetch++
        if (options.fetchFails === true) return yield* Effect.fail(new Error("upstream down"))
        return { value: `value of ${key}` }
      })
  })
  const charge = Tool.make("charge", {
    args: Schema.Struct({ amount: Schema.Number }),
    success: Schema.Struct({ receipt: Schema.String }),
    idempotency: "at_most_once",
    execute: ({ amount }) =>
      Effect.sync(() => {
        started.charge++
        finished.charge++
        return { receipt: `receipt-${amount}` }
      })
  })
  const agent = Agent.make({
    id: "shop",
    input: Schema.Struct({ key: Schema.String }),
    handler: ({ key }) =>
      Effect.gen(function*() {
        const { value } = yield* fetch({ key })
        const charged = yield* charge({ amount: 10 }).pipe(
          Effect.map((r) => r.receipt),
          Effect.catchTag("ToolError", (e: ToolError) => e.indeterminate ? Effect.succeed("unknown") : Effect.fail(e))
        )
        return { value, charged }
      })
  })
  return { agent, started, finished }
}

const expectedOutput = { value: "value of k", charged: "receipt-10" }

const statuses = (run: TestKernel.RunResult) =>
  Object.fromEntries(run.steps.map((s) => [s.target, s.status] as const))

const count = (run: TestKernel.RunResult, type: string) => run.events.filter((e) => e.type === type).length

const callsOf = (run: TestKernel.RunResult, attempt: number, call?: TestKernel.CallName) =>
  run.calls.filter((c) => c.attempt === attempt && (call === undefined || c.call === call))

const at = (event: { readonly occurredAt: string }) => Date.parse(event.occurredAt)

/**
 * Every retry delay at its nominal value (the jitter draws 80 %–120 % of it
 * with the fiber's `Random`; 0.5 is the middle), so that virtual times are exact.
 */
const nominalDelays = Layer.succeed(Random.Random, { nextDoubleUnsafe: () => 0.5, nextIntUnsafe: () => 0 })

/** The kit, with retry delays at their nominal values. */
const kit = (options: TestKernel.Options<never>) => TestKernel.layer(options).pipe(Layer.provide(nominalDelays))

describe("crashes", () => {
  it.effect("before a step's body (after submit answered proceed): the body runs once, in the redelivery", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, { crash: { call: "submitStep", index: 0, when: "after" } })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      expect(world.started).toEqual({ fetch: 1, charge: 1 })
      expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "succeeded" })
      const lost = callsOf(run, 1, "submitStep")
      expect(lost.map((c) => [c.answer, c.delivered, c.injected])).toEqual([["proceed", false, "crash"]])
      // the orphaned executing step is proceeded again (safe_to_retry), with the same id
      expect(callsOf(run, 2, "submitStep")[0]).toMatchObject({ answer: "proceed", stepId: lost[0]!.stepId })
      expect(run.deliveries).toBe(2)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
  })

  it.effect("before an at_most_once body: it never runs, the replay reports an indeterminate outcome", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, { crash: { call: "submitStep", index: 1, when: "after" } })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual({ value: "value of k", charged: "unknown" })
      expect(world.started).toEqual({ fetch: 1, charge: 0 })
      expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "failed" })
      expect(run.steps.find((s) => s.target === "charge")?.error).toEqual(indeterminate)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
  })

  it.effect("during the body (the process dies mid-body): the interrupted body runs again", () =>
    Effect.gen(function*() {
      const hold = { open: yield* Deferred.make<void>(), started: yield* Deferred.make<void>() }
      const world = makeWorld({ holdFirst: hold })
      return yield* Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const id = yield* kernel.create(world.agent.id, { key: "k" })
        const settling = yield* Effect.forkChild(kernel.settle(id))
        yield* Deferred.await(hold.started)
        yield* kernel.restart(world.agent.id)
        const run = yield* Fiber.join(settling)
        expect(run.status).toBe("completed")
        expect(run.output).toEqual(expectedOutput)
        expect(world.started).toEqual({ fetch: 2, charge: 1 })
        expect(world.finished).toEqual({ fetch: 1, charge: 1 })
        expect(callsOf(run, 1, "completeStep")).toEqual([])
        expect(count(run, "step.succeeded")).toBe(2)
      }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
    }))

  it.effect("after the body, before recording: a safe body runs again; an at_most_once one does not", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const safe = yield* kernel.run(world.agent, { key: "k" }, {
        crash: { call: "completeStep", index: 0, when: "before" }
      })
      expect(safe.output).toEqual(expectedOutput)
      expect(world.started).toEqual({ fetch: 2, charge: 1 })
      expect(statuses(safe)).toEqual({ fetch: "succeeded", charge: "succeeded" })

      const once = yield* kernel.run(world.agent, { key: "k" }, {
        crash: { call: "completeStep", index: 1, when: "before" }
      })
      expect(once.status).toBe("completed")
      expect(once.output).toEqual({ value: "value of k", charged: "unknown" })
      expect(world.started).toEqual({ fetch: 3, charge: 2 })
      expect(statuses(once)).toEqual({ fetch: "succeeded", charge: "failed" })
      // the recorded fetch replayed; the charge ran once and was never recorded as a success
      expect(callsOf(once, 2, "submitStep").map((c) => c.answer)).toEqual(["replay", "replay"])
      expect(count(once, "step.succeeded")).toBe(1)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
  })

  it.effect("before reporting the outcome: everything replays, nothing runs again", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        crash: { call: "completeExecution", index: 0, when: "before" }
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      expect(world.started).toEqual({ fetch: 1, charge: 1 })
      expect(callsOf(run, 2, "submitStep").map((c) => c.answer)).toEqual(["replay", "replay"])
      expect(callsOf(run, 2, "completeStep")).toEqual([])
      expect(count(run, "execution.completed")).toBe(1)
      expect(count(run, "step.succeeded")).toBe(2)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
  })
})

describe("a lease that lapses while the run is alive", () => {
  it.effect("the stalled run is fenced when it wakes up; the new attempt replays", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        lapse: { call: "completeStep", index: 0, when: "before" }
      })
      expect(run.lapsed).toBe(true)
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      expect(world.started).toEqual({ fetch: 2, charge: 1 })
      // the old attempt's step complete reached the kernel only after the lapse, and was refused
      const old = callsOf(run, 1).filter((c) => c.call !== "heartbeat" && c.call !== "getExecution")
      expect(old.map((c) => [c.call, c.answer])).toEqual([
        ["submitStep", "proceed"],
        ["completeStep", "lease_superseded"]
      ])
      // the old attempt stopped: nothing of it after the fence, heartbeats included
      const fence = old[1]!
      expect(callsOf(run, 1).filter((c) => c.seq >= fence.answerSeq!)).toEqual([])
      expect(count(run, "step.succeeded")).toBe(2)
      // the redelivery came after the lease timeout (120 s) on virtual time, on the next tick
      const acks = run.events.filter((e) => e.type === "dispatch.acked")
      expect(acks).toHaveLength(2)
      const gap = at(acks[1]!) - at(acks[0]!)
      expect(gap).toBeGreaterThan(120_000)
      expect(gap).toBeLessThanOrEqual(122_000)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
  })

  it.effect("a zombie worker held mid-body: its next heartbeat is fenced, it stops and writes nothing", () =>
    Effect.gen(function*() {
      const first = { open: yield* Deferred.make<void>(), started: yield* Deferred.make<void>() }
      const world = makeWorld({ holdFirst: first })
      return yield* Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const id = yield* kernel.create(world.agent.id, { key: "k" })
        yield* kernel.tick
        yield* Deferred.await(first.started)
        // the worker is cut off (it keeps running), its lease lapses, the kernel redelivers elsewhere
        yield* kernel.partition(world.agent.id)
        expect(yield* kernel.expireLeases).toBe(1)
        yield* kernel.tick
        const run = yield* kernel.settle(id)
        expect(run.status).toBe("completed")
        expect(run.output).toEqual(expectedOutput)
        // the zombie's heartbeat (30 s in) was refused: it stopped, its body was interrupted
        const zombie = callsOf(run, 1)
        expect(zombie.map((c) => [c.call, c.answer])).toEqual([
          ["submitStep", "proceed"],
          ["heartbeat", "lease_superseded"]
        ])
        expect(yield* kernel.activeRuns).toBe(0)
        yield* Deferred.succeed(first.open, undefined)
        yield* kernel.settle(id)
        expect(world.started).toEqual({ fetch: 2, charge: 1 })
        expect(world.finished).toEqual({ fetch: 1, charge: 1 })
        expect((yield* kernel.calls(id)).filter((c) => c.attempt === 1)).toHaveLength(2)
        expect(run.steps.map((s) => s.status)).toEqual(["succeeded", "succeeded"])
        expect(count(run, "step.succeeded")).toBe(2)
      }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
    }))

  it.effect("a zombie that wakes up while the new attempt is running gets lease_superseded", () =>
    Effect.gen(function*() {
      const gate = { open: yield* Deferred.make<void>(), started: yield* Deferred.make<void>() }
      const first = { open: yield* Deferred.make<void>(), started: yield* Deferred.make<void>() }
      let bodies = 0
      const hold = { open: gate.open, started: gate.started }
      // the first body waits on `first`, the second on `gate`
      const world = makeWorld({
        get gate() {
          return bodies++ === 0 ? first : hold
        }
      } as WorldOptions)
      return yield* Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const id = yield* kernel.create(world.agent.id, { key: "k" })
        yield* kernel.tick
        yield* Deferred.await(first.started)
        yield* kernel.partition(world.agent.id)
        yield* kernel.expireLeases
        yield* kernel.tick
        yield* Deferred.await(gate.started)
        // both bodies are in flight; the zombie finishes first
        yield* Deferred.succeed(first.open, undefined)
        yield* Effect.repeat(Effect.yieldNow, { times: 20 })
        yield* Deferred.succeed(gate.open, undefined)
        const run = yield* kernel.settle(id)
        expect(run.status).toBe("completed")
        expect(run.output).toEqual(expectedOutput)
        const zombie = callsOf(run, 1)
        expect(zombie.map((c) => [c.call, c.answer])).toEqual([
          ["submitStep", "proceed"],
          ["completeStep", "lease_superseded"]
        ])
        expect(world.finished).toEqual({ fetch: 2, charge: 1 })
        expect(count(run, "step.succeeded")).toBe(2)
        expect(count(run, "execution.completed")).toBe(1)
      }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
    }))

  it.effect.each([["submit", "between"], ["complete", "inside"]] as const)(
    "a zombie's refused %s stops it there, even under a handler that catches everything",
    ([call, where]) =>
    Effect.gen(function*() {
      // Each run waits until its gate opens: between its two steps, or inside the first one's body.
      const gates = [
        { open: yield* Deferred.make<void>(), reached: yield* Deferred.make<void>() },
        { open: yield* Deferred.make<void>(), reached: yield* Deferred.make<void>() }
      ] as const
      let runs = 0
      const hold = Effect.suspend(() => {
        const gate = gates[runs++]
        return gate === undefined ? Effect.void : Effect.andThen(Deferred.succeed(gate.reached, undefined), Deferred.await(gate.open))
      })
      const step = (name: string) =>
        Tool.make(name, {
          args: Schema.Struct({}),
          success: Schema.String,
          execute: () => Effect.as(name === "first" && where === "inside" ? hold : Effect.void, name)
        })
      const [first, second] = [step("first"), step("second")]
      const seen: Array<string> = []
      const agent = Agent.make({
        id: "swallower",
        handler: () =>
          Effect.gen(function*() {
            const a = yield* first({})
            if (where === "between") yield* hold
            const b = yield* second({})
            return `${a} ${b}`
          }).pipe(Effect.catch((e) => Effect.sync(() => (seen.push(e._tag), "swallowed"))))
      })
      return yield* Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const id = yield* kernel.create(agent.id, {})
        yield* kernel.tick
        yield* Deferred.await(gates[0].reached)
        yield* kernel.partition(agent.id)
        yield* kernel.expireLeases
        yield* kernel.tick
        yield* Deferred.await(gates[1].reached)
        // The zombie wakes up while the new attempt holds the lease: its next call is
        // refused (lease_superseded), which stops the run before its handler sees it.
        yield* Deferred.succeed(gates[0].open, undefined)
        const refused = Effect.map(
          kernel.calls(id),
          (calls) => calls.some((c) => c.attempt === 1 && c.answer === "lease_superseded")
        )
        for (let i = 0; i < 200 && !(yield* refused); i++) yield* Effect.yieldNow
        // Time for the zombie to go on (were it not stopped: catch, return, post its outcome).
        yield* Effect.repeat(Effect.yieldNow, { times: 100 })
        yield* Deferred.succeed(gates[1].open, undefined)
        const run = yield* kernel.settle(id)
        expect(run.output).toBe("first second")
        expect(seen).toEqual([])
        const zombie = callsOf(run, 1).filter((c) => c.call !== "heartbeat")
        expect(zombie.map((c) => [c.call, c.target, c.answer])).toEqual(
          call === "submit" ?
            [
              ["submitStep", "first", "proceed"],
              ["completeStep", "first", "recorded"],
              ["submitStep", "second", "lease_superseded"]
            ] :
            [["submitStep", "first", "proceed"], ["completeStep", "first", "lease_superseded"]]
        )
      }).pipe(Effect.provide(TestKernel.layer({ agents: [agent] })))
    }))

  it.effect("in the same process, the newer delivery supersedes the run: its body is interrupted", () =>
    Effect.gen(function*() {
      const first = { open: yield* Deferred.make<void>(), started: yield* Deferred.make<void>() }
      const world = makeWorld({ holdFirst: first })
      return yield* Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const id = yield* kernel.create(world.agent.id, { key: "k" })
        yield* kernel.tick
        yield* Deferred.await(first.started)
        yield* kernel.expireLeases
        yield* kernel.tick
        yield* Deferred.succeed(first.open, undefined)
        const run = yield* kernel.settle(id)
        expect(run.status).toBe("completed")
        expect(world.started).toEqual({ fetch: 2, charge: 1 })
        expect(world.finished).toEqual({ fetch: 1, charge: 1 })
        expect(run.output).toEqual(expectedOutput)
        expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "succeeded" })
        expect(callsOf(run, 1).map((c) => c.call)).toEqual(["submitStep"])
        expect(run.deliveries).toBe(2)
      }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
    }))
})

describe("webhooks", () => {
  it.effect("an agent that is not served: backoff, then dispatch_exhausted after the 5th attempt", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      yield* kernel.core.registerAgent({ id: "ghost", webhookUrl: "http://ghost.invalid/webhook", secret: "s" })
      const run = yield* kernel.run("ghost", {})
      expect(run.status).toBe("failed")
      expect(run.failureReason).toBe("dispatch_exhausted")
      const tail = run.events.slice(3)
      expect(tail.map((e) => [e.type, (e.payload as { attempt?: number }).attempt])).toEqual([
        ["dispatch.failed", 1],
        ["dispatch.failed", 2],
        ["dispatch.failed", 3],
        ["dispatch.failed", 4],
        ["dispatch.failed", 5],
        ["execution.failed", undefined]
      ])
      expect((tail[5]!.payload as { reason: string }).reason).toBe("dispatch_exhausted")
      // backoff 1 s, 2 s, 4 s, 8 s (no jitter), quantised by the 2 s tick
      const t0 = at(tail[0]!)
      expect(tail.map((e) => at(e) - t0)).toEqual([0, 2_000, 4_000, 8_000, 16_000, 16_000])
      expect(run.deliveries).toBe(0)
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", settings: { random: () => 0 } }))))

  it.effect("a runtime answering 500 twice: retried, then delivered on the 3rd attempt", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      yield* kernel.failWebhooks(world.agent.id, { times: 2 })
      const run = yield* kernel.run(world.agent, { key: "k" })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      const dispatch = run.events.filter((e) => e.type.startsWith("dispatch.") && e.type !== "dispatch.queued")
      expect(dispatch.map((e) => [e.type, (e.payload as { attempt: number }).attempt, at(e) - at(dispatch[0]!)]))
        .toEqual([["dispatch.failed", 1, 0], ["dispatch.failed", 2, 2_000], ["dispatch.acked", 3, 4_000]])
      expect(run.deliveries).toBe(1)
      expect(world.started).toEqual({ fetch: 1, charge: 1 })
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [world.agent], settings: { random: () => 0 } })))
  })

  it.effect("a runtime that always fails exhausts the dispatch; the handler never runs", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      yield* kernel.failWebhooks(world.agent.id)
      const run = yield* kernel.run(world.agent, { key: "k" })
      expect(run.status).toBe("failed")
      expect(run.failureReason).toBe("dispatch_exhausted")
      expect(count(run, "dispatch.failed")).toBe(5)
      expect(world.started).toEqual({ fetch: 0, charge: 0 })
      expect(run.calls).toEqual([])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
  })

  it.effect("duplicate and stale deliveries are ignored: no second run", () =>
    Effect.gen(function*() {
      const gate = { open: yield* Deferred.make<void>(), started: yield* Deferred.make<void>() }
      const world = makeWorld({ gate })
      return yield* Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const id = yield* kernel.create(world.agent.id, { key: "k" })
        const reads = Effect.map(kernel.calls(id), (calls) => calls.filter((c) => c.call === "getExecution").length)
        yield* kernel.tick
        yield* Deferred.await(gate.started)
        expect(yield* reads).toBe(1)

        // the same attempt again: a duplicate
        expect(yield* kernel.webhook(id, { attempt: 1 })).toBe(200)
        expect(yield* kernel.activeRuns).toBe(1)
        expect(yield* reads).toBe(1)

        // attempt 2 supersedes attempt 1; then attempt 1 arrives late: stale
        yield* kernel.expireLeases
        yield* kernel.tick
        yield* Effect.repeat(Effect.yieldNow, { times: 20 })
        expect(yield* reads).toBe(2)
        expect(yield* kernel.webhook(id, { attempt: 1 })).toBe(200)
        expect(yield* kernel.webhook(id, { attempt: 2 })).toBe(200)
        expect(yield* reads).toBe(2)
        expect(yield* kernel.activeRuns).toBe(1)

        yield* Deferred.succeed(gate.open, undefined)
        const run = yield* kernel.settle(id)
        expect(run.status).toBe("completed")
        expect(run.output).toEqual(expectedOutput)
        expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "succeeded" })
        expect(world.started).toEqual({ fetch: 2, charge: 1 })
        expect(world.finished).toEqual({ fetch: 1, charge: 1 })

        // after the end, a replayed webhook starts a run that sees a terminal execution and stops
        expect(yield* kernel.webhook(id, { attempt: 2 })).toBe(200)
        yield* kernel.settle(id)
        expect(yield* reads).toBe(3)
        const calls = yield* kernel.calls(id)
        expect(calls.filter((c) => c.call === "submitStep")).toHaveLength(3)
        expect(world.started).toEqual({ fetch: 2, charge: 1 })
        expect(run.deliveries).toBe(2)
      }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
    }))
})

describe.each(["direct", "http"] as const)("the kernel unreachable (%s transport)", (transport) => {
  it.effect("during a submit, after the kernel recorded it: the run abandons; the redelivery proceeds it", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "submitStep", index: 0, when: "after" }]
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      // exactly one submit reached the kernel, and it was not retried
      const submits = callsOf(run, 1, "submitStep")
      expect(submits.map((c) => [c.reached, c.answer, c.delivered, c.injected])).toEqual([
        [true, "proceed", false, "fault"]
      ])
      // the abandoned run made no call after the fault: no heartbeat kept its lease alive
      expect(callsOf(run, 1).filter((c) => c.seq > submits[0]!.seq)).toEqual([])
      // the lease lapsed after 120 s; the redelivery proceeded the orphaned step: the body ran once
      const redelivered = callsOf(run, 2, "submitStep")[0]!
      expect(redelivered).toMatchObject({ answer: "proceed", stepId: submits[0]!.stepId })
      expect(redelivered.atMs - submits[0]!.atMs).toBeGreaterThan(120_000)
      expect(redelivered.atMs - submits[0]!.atMs).toBeLessThanOrEqual(122_000)
      expect(world.started).toEqual({ fetch: 1, charge: 1 })
      expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "succeeded" })
      expect(run.steps).toHaveLength(2)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent], transport })))
  })

  it.effect("during a submit, before the kernel saw it: abandoned, nothing recorded, redelivered", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "submitStep", index: 1, when: "before" }]
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      expect(callsOf(run, 1, "submitStep").map((c) => [c.target, c.reached])).toEqual([["fetch", true], [
        "charge",
        false
      ]])
      expect(callsOf(run, 2, "submitStep").map((c) => [c.target, c.answer])).toEqual([["fetch", "replay"], [
        "charge",
        "proceed"
      ]])
      expect(world.started).toEqual({ fetch: 1, charge: 1 })
      expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "succeeded" })
      expect(run.deliveries).toBe(2)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent], transport })))
  })

  it.effect("during a step complete: retried with backoff (100, 200, 400 ms) and recorded once", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "completeStep", index: 0, when: "before", times: 3 }]
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "succeeded" })
      expect(run.deliveries).toBe(1)
      const completes = callsOf(run, 1, "completeStep").filter((c) => c.target === "fetch")
      expect(completes.map((c) => [c.reached, c.answer])).toEqual([
        [false, undefined],
        [false, undefined],
        [false, undefined],
        [true, "recorded"]
      ])
      expect(completes.map((c) => c.atMs - completes[0]!.atMs)).toEqual([0, 100, 300, 700])
      expect(world.started).toEqual({ fetch: 1, charge: 1 })
      expect(count(run, "step.succeeded")).toBe(2)
    }).pipe(Effect.provide(kit({ agents: [world.agent], transport })))
  })

  it.effect("during a step complete whose answer is lost: the retry is answered replay, nothing recorded twice", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "completeStep", index: 0, when: "after", times: 2 }]
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      expect(callsOf(run, 1, "completeStep").filter((c) => c.target === "fetch").map((c) => [c.answer, c.delivered]))
        .toEqual([["recorded", false], ["replay", false], ["replay", true]])
      expect(count(run, "step.succeeded")).toBe(2)
      expect(world.started).toEqual({ fetch: 1, charge: 1 })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent], transport })))
  })

  it.effect("during a step complete, failing for one lease timeout while heartbeats get through: abandoned; the safe body runs again, the charge once", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "completeStep", index: 0, when: "before", times: 1_000 }]
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      // the beats renew the lease, but no call retries longer than one lease timeout (120 s) after its first failure
      const completes = callsOf(run, 1, "completeStep")
      expect(completes.every((c) => !c.reached)).toBe(true)
      expect(completes.map((c) => c.atMs - completes[0]!.atMs).slice(0, 8)).toEqual([
        0,
        100,
        300,
        700,
        1_500,
        3_100,
        6_300,
        11_300
      ])
      expect(completes.at(-1)!.atMs - completes[0]!.atMs).toBe(120_000)
      expect(callsOf(run, 1, "heartbeat").map((c) => c.answer)).toEqual(["ok", "ok", "ok", "ok"])
      // then the run abandons: nothing more of it, and the lease lapses
      expect(callsOf(run, 1).filter((c) => c.seq > completes.at(-1)!.seq && c.call !== "heartbeat")).toEqual([])
      expect(callsOf(run, 1, "submitStep")).toHaveLength(1)
      expect(world.started).toEqual({ fetch: 2, charge: 1 })
      expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "succeeded" })
      expect(count(run, "step.succeeded")).toBe(2)
      expect(run.deliveries).toBe(2)
    }).pipe(Effect.provide(kit({ agents: [world.agent], transport })))
  })

  it.effect("during a step fail: retried, the failure recorded once", () => {
    const world = makeWorld({ fetchFails: true })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "failStep", index: 0, when: "before", times: 2 }]
      })
      expect(run.status).toBe("failed")
      expect(run.failureReason).toBe("tool_error: fetch: upstream down")
      expect(callsOf(run, 1, "failStep").map((c) => c.answer)).toEqual([undefined, undefined, "recorded"])
      expect(run.steps.map((s) => [s.target, s.status, s.error])).toEqual([
        ["fetch", "failed", { message: "upstream down" }]
      ])
      expect(world.started).toEqual({ fetch: 1, charge: 0 })
      expect(run.deliveries).toBe(1)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent], transport })))
  })

  it.effect("during heartbeats: a failed beat is retried with backoff and renews the lease", () => {
    // The body ends just after a beat, not on it: Effect 4's TestClock wakes
    // sleeps due at the same instant one by one in the order they were made, so a
    // body ending exactly on a beat would finish the run before that beat fires.
    const world = makeWorld({ fetchTakes: "151 seconds" })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "heartbeat", index: 0, when: "before", times: 2 }]
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "succeeded" })
      // beats every 30 s (lease 120 s / 3, at most 30 s): the first beat and its first retry are
      // lost, the second retry (300 ms later) renews the lease, and the beats go on from there
      expect(run.deliveries).toBe(1)
      const beats = callsOf(run, 1, "heartbeat")
      expect(beats.map((c) => [c.atMs - beats[0]!.atMs, c.reached, c.answer])).toEqual([
        [0, false, undefined],
        [100, false, undefined],
        [300, true, "ok"],
        [30_300, true, "ok"],
        [60_300, true, "ok"],
        [90_300, true, "ok"],
        [120_300, true, "ok"]
      ])
      expect(world.started).toEqual({ fetch: 1, charge: 1 })
    }).pipe(Effect.provide(kit({ agents: [world.agent], transport })))
  })

  it.effect("during every heartbeat: the lease lapses and the redelivery supersedes the run", () => {
    const world = makeWorld({ fetchTakes: "200 seconds" })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "heartbeat", index: 0, when: "before", times: 100 }]
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      expect(run.deliveries).toBe(2)
      expect(world.started).toEqual({ fetch: 2, charge: 1 })
      expect(world.finished).toEqual({ fetch: 1, charge: 1 })
      // the first run never wrote its step outcome
      expect(callsOf(run, 1, "completeStep")).toEqual([])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent], transport })))
  })

  it.effect("during the outcome post, answer lost: the retry gets execution_terminal, taken as success", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "completeExecution", index: 0, when: "after" }]
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      expect(callsOf(run, 1, "completeExecution").map((c) => c.answer)).toEqual(["ok", "execution_terminal"])
      expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "succeeded" })
      expect(world.started).toEqual({ fetch: 1, charge: 1 })
      expect(count(run, "execution.completed")).toBe(1)
      expect(run.deliveries).toBe(1)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent], transport })))
  })

  it.effect("reading the execution: retried; when retries run out the run is abandoned and redelivered", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const retried = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "getExecution", when: "before", times: 3 }]
      })
      expect(retried.status).toBe("completed")
      expect(retried.output).toEqual(expectedOutput)
      expect(retried.deliveries).toBe(1)
      expect(retried.calls.filter((c) => c.call === "getExecution").map((c) => c.reached)).toEqual([
        false,
        false,
        false,
        true
      ])

      const abandoned = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "getExecution", when: "before", times: 4 }]
      })
      expect(abandoned.status).toBe("completed")
      expect(abandoned.output).toEqual(expectedOutput)
      expect(statuses(abandoned)).toEqual({ fetch: "succeeded", charge: "succeeded" })
      expect(abandoned.deliveries).toBe(2)
      expect(callsOf(abandoned, 1)).toEqual([])
      expect(world.started).toEqual({ fetch: 2, charge: 2 })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent], transport })))
  })
})

/**
 * Issue 13: a kernel unreachable for a few seconds (a restart) must not lose
 * finished work. The kit's faults fail a kind of call a number of times in a
 * row; with retry delays at their nominal values (100 ms doubling to 5 s) a
 * number of failures is a span of virtual time, given in each case. Before
 * issue 13 a step outcome was tried four times over 0.7 s, then the run was
 * abandoned: the safe body ran again and the at_most_once one came back
 * `indeterminate` from the redelivery.
 */
describe.each(["direct", "http"] as const)("a kernel outage shorter than the lease (%s transport)", (transport) => {
  const failedSpan = (calls: ReadonlyArray<TestKernel.KernelCall>) => {
    const failed = calls.filter((c) => !c.reached)
    return failed.at(-1)!.atMs - failed[0]!.atMs
  }
  const noIndeterminate = (run: TestKernel.RunResult) =>
    expect(run.steps.filter((s) => s.error !== undefined && s.error !== null)).toEqual([])

  it.effect("during a body and at its step complete (30 s → 51 s): recorded, nothing runs twice, one delivery", () => {
    const world = makeWorld({ fetchTakes: "40 seconds" })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [
          // the beat at 30 s and its retries until 46.3 s; the one at 51.3 s gets through
          { call: "heartbeat", index: 0, when: "before", times: 9 },
          // the body ends at 40 s: its complete and retries until 46.3 s; the one at 51.3 s gets through
          { call: "completeStep", index: 0, when: "before", times: 7 }
        ]
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      expect(run.deliveries).toBe(1)
      expect(world.started).toEqual({ fetch: 1, charge: 1 })
      expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "succeeded" })
      noIndeterminate(run)
      const beats = callsOf(run, 1, "heartbeat")
      expect(beats.slice(0, 10).map((c) => [c.atMs, c.reached])).toEqual([
        [30_000, false],
        [30_100, false],
        [30_300, false],
        [30_700, false],
        [31_500, false],
        [33_100, false],
        [36_300, false],
        [41_300, false],
        [46_300, false],
        [51_300, true]
      ])
      const completes = callsOf(run, 1, "completeStep").filter((c) => c.target === "fetch")
      expect(completes.map((c) => [c.atMs, c.answer])).toEqual([
        [40_000, undefined],
        [40_100, undefined],
        [40_300, undefined],
        [40_700, undefined],
        [41_500, undefined],
        [43_100, undefined],
        [46_300, undefined],
        [51_300, "recorded"]
      ])
      expect(count(run, "step.succeeded")).toBe(2)
    }).pipe(Effect.provide(kit({ agents: [world.agent], transport })))
  })

  it.effect("at an at_most_once step's complete (21 s): recorded as it ran, not indeterminate", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "completeStep", index: 1, when: "before", times: 9 }]
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      expect(run.deliveries).toBe(1)
      expect(world.started).toEqual({ fetch: 1, charge: 1 })
      expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "succeeded" })
      noIndeterminate(run)
      const charges = callsOf(run, 1, "completeStep").filter((c) => c.target === "charge")
      expect(failedSpan(charges)).toBe(16_300)
      expect(charges.at(-1)).toMatchObject({ answer: "recorded", delivered: true })
      expect(charges.at(-1)!.atMs - charges[0]!.atMs).toBe(21_300)
    }).pipe(Effect.provide(kit({ agents: [world.agent], transport })))
  })

  it.effect("at a step fail and at the execution fail (16 s each): each recorded once, the body ran once", () => {
    const world = makeWorld({ fetchFails: true })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [
          { call: "failStep", index: 0, when: "before", times: 8 },
          { call: "failExecution", index: 0, when: "before", times: 8 }
        ]
      })
      expect(run.status).toBe("failed")
      expect(run.failureReason).toBe("tool_error: fetch: upstream down")
      expect(run.deliveries).toBe(1)
      expect(world.started).toEqual({ fetch: 1, charge: 0 })
      expect(run.steps.map((s) => [s.target, s.status, s.error])).toEqual([
        ["fetch", "failed", { message: "upstream down" }]
      ])
      const fails = callsOf(run, 1, "failStep")
      expect(fails.map((c) => c.answer)).toEqual([...Array(8).fill(undefined), "recorded"])
      expect(fails.at(-1)!.atMs - fails[0]!.atMs).toBe(16_300)
      const posts = callsOf(run, 1, "failExecution")
      expect(posts.map((c) => c.answer)).toEqual([...Array(8).fill(undefined), "ok"])
      expect(posts.at(-1)!.atMs - posts[0]!.atMs).toBe(16_300)
      expect(count(run, "step.failed")).toBe(1)
      expect(count(run, "execution.failed")).toBe(1)
    }).pipe(Effect.provide(kit({ agents: [world.agent], transport })))
  })

  it.effect("at the execution complete (16 s): completed by the first run, nothing replayed", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "completeExecution", index: 0, when: "before", times: 8 }]
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      expect(run.deliveries).toBe(1)
      expect(world.started).toEqual({ fetch: 1, charge: 1 })
      noIndeterminate(run)
      const posts = callsOf(run, 1, "completeExecution")
      expect(posts.map((c) => c.answer)).toEqual([...Array(8).fill(undefined), "ok"])
      expect(posts.at(-1)!.atMs - posts[0]!.atMs).toBe(16_300)
      expect(count(run, "execution.completed")).toBe(1)
      expect(callsOf(run, 2)).toEqual([])
    }).pipe(Effect.provide(kit({ agents: [world.agent], transport })))
  })

  it.effect("during heartbeats until close to the lease's end: the retried beat renews it, no redelivery", () => {
    // Lease 12 s, a beat every 4 s. A 1 s warm-up step, then a 20 s one whose submit (at 1 s)
    // is the last renewal before the outage: the lease can be valid until 13 s. The beats of
    // 4 s to 7.1 s are lost; the retry at 10.3 s renews it. Beats without retries (4, 8, 12,
    // 16 s, …) would all be lost, and the kernel would redeliver at 13 s.
    const started = { warmup: 0, work: 0 }
    const warmup = Tool.make("warmup", {
      args: Schema.Struct({}),
      success: Schema.String,
      execute: () => Effect.sync(() => void started.warmup++).pipe(Effect.andThen(Effect.sleep("1 second")), Effect.as("warm"))
    })
    const work = Tool.make("work", {
      args: Schema.Struct({}),
      success: Schema.String,
      idempotency: "at_most_once",
      execute: () => Effect.sync(() => void started.work++).pipe(Effect.andThen(Effect.sleep("20 seconds")), Effect.as("done"))
    })
    const agent = Agent.make({
      id: "steady",
      handler: () => Effect.all([warmup({}), work({})])
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent, {}, {
        faults: [{ call: "heartbeat", index: 0, when: "before", times: 6 }]
      })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(["warm", "done"])
      expect(run.deliveries).toBe(1)
      expect(started).toEqual({ warmup: 1, work: 1 })
      noIndeterminate(run)
      const beats = callsOf(run, 1, "heartbeat")
      expect(beats.map((c) => [c.atMs, c.answer])).toEqual([
        [4_000, undefined],
        [4_100, undefined],
        [4_300, undefined],
        [4_700, undefined],
        [5_500, undefined],
        [7_100, undefined],
        [10_300, "ok"],
        [14_300, "ok"],
        [18_300, "ok"]
      ])
    }).pipe(Effect.provide(kit({ agents: [agent], transport, settings: { leaseTimeoutMs: 12_000 } })))
  })
})

describe.each(["direct", "http"] as const)("a kernel outage and the lease bound (%s transport)", (transport) => {
  it.effect("an outage longer than the lease: the run gives up when the lease cannot be valid; the kernel redelivers", () => {
    const world = makeWorld({ fetchTakes: "40 seconds" })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [
          { call: "heartbeat", index: 0, when: "before", times: 1_000 },
          { call: "completeStep", index: 0, when: "before", times: 1_000 }
        ]
      })
      // the submit at 0 s was the last renewal: the lease could be valid until 120 s
      const first = callsOf(run, 1)
      expect(first.filter((c) => c.reached).map((c) => [c.call, c.atMs])).toEqual([["submitStep", 0]])
      const completes = callsOf(run, 1, "completeStep")
      expect(completes[0]!.atMs).toBe(40_000)
      expect(completes.at(-1)!.atMs).toBe(120_000)
      expect(Math.max(...first.map((c) => c.atMs))).toBe(120_000)
      // the run abandoned: no call of it after the lease's end; the kernel redelivered
      expect(run.deliveries).toBe(2)
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(expectedOutput)
      // the unrecorded safe body ran again (the outage outlasted the lease); the charge once
      expect(world.started).toEqual({ fetch: 2, charge: 1 })
      expect(statuses(run)).toEqual({ fetch: "succeeded", charge: "succeeded" })
    }).pipe(Effect.provide(kit({ agents: [world.agent], transport })))
  })

  it.effect("a lease_superseded answer stops the retries at once", () =>
    Effect.gen(function*() {
      const second = { open: yield* Deferred.make<void>(), started: yield* Deferred.make<void>() }
      const world = makeWorld({ holdSecond: second })
      return yield* Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const id = yield* kernel.create(world.agent.id, { key: "k" })
        const settling = yield* Effect.forkChild(kernel.settle(id, {
          // six tries of the fetch complete fail; before the sixth, the run stalls and its lease
          // lapses at once: the kernel redelivers, and the new run holds the lease (its fetch
          // body waits on `second`) when the old one's seventh try arrives
          faults: [{ call: "completeStep", index: 0, when: "before", times: 6 }],
          lapse: { call: "completeStep", index: 5, when: "before" },
          recovery: "immediate"
        }))
        yield* Deferred.await(second.started)
        const oldCompletes = Effect.map(
          kernel.calls(id),
          (calls) => calls.filter((c) => c.attempt === 1 && c.call === "completeStep")
        )
        while ((yield* oldCompletes).length < 7) yield* Effect.yieldNow
        yield* Deferred.succeed(second.open, undefined)
        const run = yield* Fiber.join(settling)
        expect(run.lapsed).toBe(true)
        const completes = callsOf(run, 1, "completeStep")
        expect(completes.map((c) => c.answer)).toEqual([...Array(6).fill(undefined), "lease_superseded"])
        // nothing of the old run after that answer, though its retry budget was far from spent
        expect(callsOf(run, 1).filter((c) => c.seq >= completes.at(-1)!.answerSeq!)).toEqual([])
        expect(completes.at(-1)!.atMs).toBeLessThan(10_000)
        expect(run.status).toBe("completed")
        expect(run.output).toEqual(expectedOutput)
        expect(count(run, "step.succeeded")).toBe(2)
        expect(world.started).toEqual({ fetch: 2, charge: 1 })
        expect(run.deliveries).toBe(2)
      }).pipe(Effect.provide(kit({ agents: [world.agent], transport })))
    }))

  it.effect("the budget is configurable: KernelClient.OutcomeRetry (every 1 s, at most 3 s)", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { key: "k" }, {
        faults: [{ call: "completeStep", index: 0, when: "before", times: 1_000 }]
      })
      const completes = callsOf(run, 1, "completeStep")
      expect(completes.map((c) => c.atMs - completes[0]!.atMs)).toEqual([0, 1_000, 2_000, 3_000])
      expect(run.deliveries).toBe(2)
      expect(run.status).toBe("completed")
      expect(world.started).toEqual({ fetch: 2, charge: 1 })
    }).pipe(
      Effect.provide(
        kit({ agents: [world.agent], transport }).pipe(
          Layer.provide(
            Layer.succeed(KernelClient.OutcomeRetry, { baseDelay: "1 second", maxDelay: "1 second", maxElapsed: "3 seconds" })
          )
        )
      )
    )
  })
})
