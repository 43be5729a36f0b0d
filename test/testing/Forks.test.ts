import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { Agent, Client, Protocol, Tool } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"

/**
 * A shop that looks an order up, refunds it (at most once) and notifies the
 * customer; every body records that it ran, so a test sees which steps ran
 * live and which replayed.
 */
const makeShop = () => {
  const ran: Array<string> = []
  const lookup = Tool.make("lookup_order", {
    args: Schema.Struct({ order: Schema.String }),
    success: Schema.Struct({ amount: Schema.Number }),
    execute: ({ order }) => Effect.sync(() => (ran.push(`lookup:${order}`), { amount: 40 }))
  })
  const refund = Tool.make("refund", {
    args: Schema.Struct({ order: Schema.String, amount: Schema.Number }),
    success: Schema.Struct({ refunded: Schema.Number }),
    idempotency: "at_most_once",
    execute: ({ amount }) => Effect.sync(() => (ran.push(`refund:${amount}`), { refunded: amount }))
  })
  const notify = Tool.make("notify", {
    args: Schema.Struct({ text: Schema.String }),
    success: Schema.Boolean,
    execute: ({ text }) => Effect.sync(() => (ran.push(`notify:${text}`), true))
  })
  const shop = Agent.make({
    id: "shop",
    input: Schema.Struct({ order: Schema.String }),
    output: Schema.Struct({ order: Schema.String, outcome: Schema.String }),
    handler: ({ order }) =>
      Effect.gen(function*() {
        const { amount } = yield* lookup({ order })
        const outcome = yield* refund({ order, amount }).pipe(
          Effect.map(({ refunded }) => `refunded ${refunded}`),
          Effect.catchTag("PolicyError", (e) => Effect.succeed(`refund refused: ${e.reason}`))
        )
        yield* notify({ text: outcome })
        return { order, outcome }
      })
  })
  return { ran, shop }
}

const denyRefunds = [
  "default_action: allow",
  "rules:",
  "  - id: no-refunds",
  "    when: { target: refund }",
  "    then: { decision: deny, reason: refunds are paused }"
].join("\n")

const steps = (run: TestKernel.RunResult) => run.steps.map((s) => [s.target, s.status])
const submits = (run: TestKernel.RunResult) =>
  run.calls.filter((c) => c.call === "submitStep").map((c) => [c.target, c.answer])

describe("TestKernel forks", () => {
  it.effect("what if the policy had denied a step: the fork runs it under its own policy", () => {
    const world = makeShop()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const source = yield* kernel.run(world.shop, { order: "A-1" })
      expect(source.output).toEqual({ order: "A-1", outcome: "refunded 40" })
      expect(world.ran).toEqual(["lookup:A-1", "refund:40", "notify:refunded 40"])

      const fork = yield* kernel.fork(source, { atStep: 1, policy: denyRefunds })
      expect(fork.status).toBe("completed")
      // typed by the agent's output Schema, as `kernel.run` is
      const outcome: string | undefined = fork.output?.outcome
      expect(outcome).toBe("refund refused: refunds are paused")
      expect(steps(fork)).toEqual([["lookup_order", "succeeded"], ["refund", "denied"], ["notify", "succeeded"]])
      // the lookup replayed (its body did not run again); the refund never ran in the fork
      expect(world.ran).toEqual([
        "lookup:A-1",
        "refund:40",
        "notify:refunded 40",
        "notify:refund refused: refunds are paused"
      ])
      expect(submits(fork)).toEqual([["lookup_order", "replay"], ["refund", "denied"], ["notify", "proceed"]])
      expect(fork.execution.forkedFrom).toBe(source.executionId)
      const refundProposed = source.events.filter((e) => e.type === "step.proposed")[1]!.eventSeq
      expect(fork.execution.forkSeq).toBe(refundProposed - 1)
      const forked = fork.events.find((e) => e.type === "execution.forked")!
      expect(forked.payload).toEqual({
        source_execution_id: source.executionId,
        fork_seq: fork.execution.forkSeq,
        policy_override: true
      })
      // the source is untouched
      const again = yield* kernel.execution(source.executionId)
      expect(again.output).toEqual({ order: "A-1", outcome: "refunded 40" })

      // a fork of the fork runs under the fork's bundle (PROTOCOL-CURRENT C.7.2 step 1)
      const second = yield* kernel.fork(fork, { atStep: 1 })
      expect(second.output).toEqual({ order: "A-1", outcome: "refund refused: refunds are paused" })
      expect(second.execution.forkedFrom).toBe(fork.executionId)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.shop] })))
  })

  it.effect("what if a step had recorded another result: the fork follows it", () => {
    const world = makeShop()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const source = yield* kernel.run(world.shop, { order: "A-2" })
      world.ran.length = 0

      // by target: the lookup replays `{ amount: 0 }`, so the refund (other args) runs live
      const free = yield* kernel.fork(source, { atStep: 1, override: { lookup_order: { result: { amount: 0 } } } })
      expect(free.output).toEqual({ order: "A-2", outcome: "refunded 0" })
      expect(world.ran).toEqual(["refund:0", "notify:refunded 0"])
      expect(free.steps[0]!.result).toEqual({ amount: 0 })
      // the fork's log records the replaced outcome
      const succeeded = free.events.filter((e) => e.type === "step.succeeded")[0]!
      expect((succeeded.payload as any).step_id).toBe(free.steps[0]!.stepId)
      world.ran.length = 0

      // by step id, with everything copied: only what the changed result leads to runs live
      const lookupId = source.steps[0]!.stepId
      const failed = yield* kernel.fork(source, { override: { [lookupId]: { error: "order not found" } } })
      expect(failed.status).toBe("failed")
      expect(failed.failureReason).toContain("lookup_order: order not found")
      expect(failed.steps[0]!.status).toBe("failed")
      expect(failed.steps[0]!.error).toEqual({ message: "order not found" })
      expect(world.ran).toEqual([])

      // the source's recorded results are untouched
      const sourceSteps = yield* kernel.steps(source.executionId)
      expect(sourceSteps.find((s) => s.target === "lookup_order")!.result).toEqual({ amount: 40 })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.shop] })))
  })

  it.effect("a fork at step k replays the steps before k and runs the rest live, at_most_once included", () => {
    const world = makeShop()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const source = yield* kernel.run(world.shop, { order: "A-3" })
      world.ran.length = 0

      const atNotify = yield* kernel.fork(source, { atStep: 2 })
      expect(submits(atNotify)).toEqual([["lookup_order", "replay"], ["refund", "replay"], ["notify", "proceed"]])
      expect(world.ran).toEqual(["notify:refunded 40"])
      world.ran.length = 0

      // the at_most_once refund runs again in a fork from before it (PROTOCOL-CURRENT C.7.2)
      const atRefund = yield* kernel.fork(source, { atStep: 1 })
      expect(submits(atRefund)).toEqual([["lookup_order", "replay"], ["refund", "proceed"], ["notify", "proceed"]])
      expect(world.ran).toEqual(["refund:40", "notify:refunded 40"])
      world.ran.length = 0

      // at step 0 everything runs live; at the number of steps (or with no point) everything replays
      yield* kernel.fork(source, { atStep: 0 })
      expect(world.ran).toEqual(["lookup:A-3", "refund:40", "notify:refunded 40"])
      world.ran.length = 0
      const atEnd = yield* kernel.fork(source, { atStep: 3 })
      const latest = yield* kernel.fork(source)
      expect(world.ran).toEqual([])
      expect(atEnd.execution.forkSeq).toBe(source.events.length)
      expect(latest.execution.forkSeq).toBe(source.events.length)
      expect(submits(latest).map(([, answer]) => answer)).toEqual(["replay", "replay", "replay"])

      // atStep k forks just before step k was first proposed
      const proposed = source.events.filter((e) => e.type === "step.proposed").map((e) => e.eventSeq)
      expect(atRefund.execution.forkSeq).toBe(proposed[1]! - 1)
      expect(atNotify.execution.forkSeq).toBe(proposed[2]! - 1)
      // the copied steps keep their results under the fork's own step ids
      expect(atNotify.steps.map((s) => s.result)).toEqual([{ amount: 40 }, { refunded: 40 }, true])
      expect(atNotify.steps.every((s, i) => s.stepId !== source.steps[i]!.stepId)).toBe(true)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.shop] })))
  })

  it.effect("atSeq forks at an event: the steps settled by then are copied", () => {
    const world = makeShop()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const source = yield* kernel.run(world.shop, { order: "A-4" })
      world.ran.length = 0
      // the seq at which the refund settled: lookup and refund are copied
      const refundSettled = source.events.filter((e) => e.type === "step.succeeded")[1]!.eventSeq
      const fork = yield* kernel.fork(source, { atSeq: refundSettled })
      expect(fork.execution.forkSeq).toBe(refundSettled)
      expect(submits(fork)).toEqual([["lookup_order", "replay"], ["refund", "replay"], ["notify", "proceed"]])
      // one seq earlier the refund was executing, not settled: it runs live
      world.ran.length = 0
      const before = yield* kernel.fork(source, { atSeq: refundSettled - 1 })
      expect(submits(before)).toEqual([["lookup_order", "replay"], ["refund", "proceed"], ["notify", "proceed"]])
      expect(world.ran).toEqual(["refund:40", "notify:refunded 40"])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.shop] })))
  })

  it.effect("fork points: the latest seq, no resources, no checkpoints", () => {
    const world = makeShop()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const source = yield* kernel.run(world.shop, { order: "A-5" })
      const points = yield* kernel.forkPoints(source.executionId)
      expect(points).toEqual({ latestSeq: source.events.length, resources: {}, checkpoints: [] })
      // with no resources every seq is covered: "latestCovered" is the latest seq
      expect(Protocol.latestCoveredSeq(points)).toBe(source.events.length)
      const fork = yield* kernel.fork(source, { atSeq: "latestCovered" })
      expect(fork.execution.forkSeq).toBe(source.events.length)
      expect(fork.restoration).toBeUndefined()
      const missing = yield* Effect.flip(kernel.forkPoints("0193a9f2-0000-7000-8000-000000000000"))
      expect([missing.status, missing.code]).toEqual([404, "not_found"])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.shop] })))
  })

  for (const transport of ["direct", "http"] as const) {
    it.effect(`bad forks fail as the route does, with nothing forked (${transport})`, () => {
      const world = makeShop()
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const client = yield* Client.Client
        const source = yield* kernel.run(world.shop, { order: "A-6" })
        const count = () => Effect.map(client.list({ agentId: "shop" }), (page) => page.executions.length)
        const before = yield* count()
        const latest = source.events.length
        const failure = (options: TestKernel.ForkOptions, id = source.executionId) =>
          Effect.map(Effect.flip(kernel.fork(id, options)), (f) => [f.status, f.code, f.message])
        expect(yield* failure({ atSeq: 0 })).toEqual([
          400,
          "validation_error",
          `validation error: at_seq must be between 1 and ${latest}`
        ])
        expect(yield* failure({ atSeq: latest + 1 })).toEqual([
          400,
          "validation_error",
          `validation error: at_seq must be between 1 and ${latest}`
        ])
        expect(yield* failure({ atSeq: 2.5 })).toEqual([
          400,
          "validation_error",
          `validation error: at_seq must be between 1 and ${latest}`
        ])
        expect(yield* failure({ atStep: 4 })).toEqual([
          400,
          "validation_error",
          "validation error: atStep must be between 0 and 3"
        ])
        expect(yield* failure({ atStep: 1, atSeq: 3 } as any)).toEqual([
          400,
          "validation_error",
          "validation error: atStep and atSeq are exclusive"
        ])
        expect(yield* failure({ atStep: 1, override: { notify: { result: false } } })).toEqual([
          400,
          "validation_error",
          "validation error: override \"notify\" names no step the fork copies (copied targets: \"lookup_order\")"
        ])
        const badBundle = yield* failure({ policy: "rules: [" })
        expect(badBundle.slice(0, 2)).toEqual([400, "validation_error"])
        expect(badBundle[2]).toMatch(/^validation error: invalid policy bundle: /)
        expect(yield* failure({}, "0193a9f2-0000-7000-8000-000000000000")).toEqual([404, "not_found", "not found"])
        expect(yield* count()).toBe(before)
      }).pipe(Effect.provide(TestKernel.layer({ agents: [world.shop], transport })))
    })
  }

  for (const transport of ["direct", "http"] as const) {
    it.effect(`a seed-stage kit has no forks: 404 page not found, as over HTTP (${transport})`, () => {
      const world = makeShop()
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const source = yield* kernel.run(world.shop, { order: "S-1" })
        for (const failure of [
          yield* Effect.flip(kernel.fork(source)),
          yield* Effect.flip(kernel.forkPoints(source.executionId))
        ]) {
          expect([failure.status, failure.code]).toEqual([404, "internal_error"])
        }
      }).pipe(Effect.provide(TestKernel.layer({ agents: [world.shop], transport, stage: "seed" })))
    })
  }

  it.effect("both transports fork alike: direct calls and POST …/fork over the kit's Client", () =>
    Effect.gen(function*() {
      const scenario = (transport: "direct" | "http") => {
        const world = makeShop()
        return Effect.gen(function*() {
          const kernel = yield* TestKernel.TestKernel
          const source = yield* kernel.run(world.shop, { order: "B-1" })
          const denied = yield* kernel.fork(source, { atStep: 1, policy: denyRefunds })
          const changed = yield* kernel.fork(source, { atStep: 2, override: { refund: { result: { refunded: 7 } } } })
          const points = yield* kernel.forkPoints(denied.executionId)
          const view = (run: TestKernel.RunResult) => ({
            status: run.status,
            output: run.output,
            forkSeq: run.execution.forkSeq,
            steps: run.steps.map((s) => [s.sequence, s.kind, s.target, s.status, s.result ?? null, s.error ?? null]),
            events: run.events.map((e) => [e.eventSeq, e.type]),
            submits: submits(run)
          })
          return { denied: view(denied), changed: view(changed), points, ran: world.ran }
        }).pipe(Effect.provide(TestKernel.layer({ agents: [world.shop], transport })))
      }
      const direct = yield* scenario("direct")
      const http = yield* scenario("http")
      expect(http).toEqual(direct)
      expect(direct.changed.output).toEqual({ order: "B-1", outcome: "refunded 7" })
      expect(direct.denied.output).toEqual({ order: "B-1", outcome: "refund refused: refunds are paused" })
    }))

  it.effect("a fork in a session, and a fork given by id (untyped output)", () => {
    const world = makeShop()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const source = yield* kernel.run(world.shop, { order: "C-1" })
      const fork = yield* kernel.fork(source.executionId, { atStep: 2, session: "what-if" })
      expect(fork.status).toBe("completed")
      expect(fork.execution.session).toBe("what-if")
      const output: unknown = fork.output
      expect(output).toEqual({ order: "C-1", outcome: "refunded 40" })
      const taken = yield* Effect.flip(kernel.fork(source, { session: "what-if" }))
      expect([taken.status, taken.code, taken.message]).toEqual([
        409,
        "conflict",
        "conflict: session \"what-if\" already has executions"
      ])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.shop] })))
  })

  it.effect("a fork's run takes the run's faults: a crash in the fork replays its live steps", () => {
    const world = makeShop()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const source = yield* kernel.run(world.shop, { order: "D-1" })
      world.ran.length = 0
      const fork = yield* kernel.fork(source, { atStep: 1, crash: { afterSteps: 1 } })
      expect(fork.crashed).toBe(true)
      expect(fork.deliveries).toBe(2)
      expect(fork.output).toEqual({ order: "D-1", outcome: "refunded 40" })
      // the refund ran once in the fork, before the crash; the redelivery replayed it
      expect(world.ran).toEqual(["refund:40", "notify:refunded 40"])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.shop] })))
  })
})
