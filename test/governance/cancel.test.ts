/**
 * Cancellation as the agent lives it (PROTOCOL.md 11.4, 9.4, 14.3): a client
 * cancels while a step is executing or an approval is pending; the kernel
 * cancels the step / expires the approval; the agent's next call answers
 * `execution_terminal` (Terminated) and the run ends without posting anything.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import { Agent, Client, Tool } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"
import { observe, payloads, until, yaml } from "./_harness.js"

const makeWorld = () => {
  const started = Deferred.makeUnsafe<void>()
  const release = Deferred.makeUnsafe<void>()
  const ran: Array<string> = []
  const seen: Array<string> = []
  const fetch = Tool.make("fetch", {
    args: Schema.Struct({ url: Schema.String }),
    success: Schema.String,
    execute: () =>
      Effect.gen(function*() {
        yield* Deferred.succeed(started, undefined)
        yield* Deferred.await(release)
        ran.push("fetch")
        return "page"
      })
  })
  const summarise = Tool.make("summarise", {
    args: Schema.Struct({}),
    success: Schema.String,
    execute: () => Effect.sync(() => (ran.push("summarise"), "summary"))
  })
  const agent = Agent.make({
    id: "reader",
    handler: () =>
      Effect.gen(function*() {
        const page = yield* fetch({ url: "https://example.com" })
        const summary = yield* summarise({})
        return { page, summary }
      }).pipe(Effect.tapError((e) => Effect.sync(() => seen.push(e._tag))))
  })
  return { started, release, ran, seen, agent }
}

const startRun = (world: ReturnType<typeof makeWorld>) =>
  Effect.gen(function*() {
    const observed = yield* observe(world.agent)
    const id = (yield* observed.kit.core.createExecution({ agentId: world.agent.id, inputRaw: "{}", agentVersion: undefined }))
      .id
    yield* observed.tick
    yield* Deferred.await(world.started)
    return { observed, id }
  })

describe("cancellation", () => {
  it.effect("mid-step: the step is cancelled, the agent's next call is execution_terminal, nothing is posted", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const { observed, id } = yield* startRun(world)
      const { kit } = observed
      const client = yield* Client.Client
      yield* client.cancel(id)

      const cancelled = yield* kit.execution(id)
      expect([cancelled.status, cancelled.failureReason]).toEqual(["cancelled", "client_cancelled"])
      const step = (yield* kit.steps(id))[0]!
      expect(step).toMatchObject({ target: "fetch", status: "cancelled", error: { reason: "execution_cancelled" } })
      expect(step.completedAt).not.toBe("")
      const eventsAtCancel = yield* kit.events(id)
      expect(eventsAtCancel.slice(-2).map((e) => e.type)).toEqual(["execution.cancelled", "step.cancelled"])

      // the body finishes after the cancel: its complete answers execution_terminal → Terminated
      yield* Deferred.succeed(world.release, undefined)
      yield* observed.idle
      expect(observed.log.map((c) => `${c.call}:${c.outcome}`)).toEqual([
        "submitStep:proceed",
        "completeStep:execution_terminal"
      ])
      expect(world.seen).toEqual(["Terminated"])
      expect(world.ran).toEqual(["fetch"])
      // the run ended silently: no complete, no fail; the kernel's record is unchanged
      expect(observed.posts()).toEqual([])
      expect(yield* kit.execution(id)).toMatchObject({ status: "cancelled", failureReason: "client_cancelled" })
      const stepAfter = (yield* kit.steps(id))[0]!
      expect(stepAfter.status).toBe("cancelled")
      expect(stepAfter.result).toBeUndefined()
      expect(yield* kit.events(id)).toEqual(eventsAtCancel)
    }).pipe(Effect.scoped, Effect.provide(TestKernel.layer({ stage: "seed" })))
  })

  it.effect("mid-step: a run still in its body stops at its next heartbeat (409 lease_superseded)", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const { observed, id } = yield* startRun(world)
      yield* observed.kit.cancel(id)
      yield* TestClock.adjust(Duration.seconds(40))
      yield* observed.idle
      // interrupted in the body: the step is never completed and no outcome is posted
      expect(world.ran).toEqual([])
      expect(observed.log.map((c) => `${c.call}:${c.outcome}`)).toEqual(["submitStep:proceed"])
      expect(observed.posts()).toEqual([])
      expect((yield* observed.kit.execution(id)).status).toBe("cancelled")
    }).pipe(Effect.scoped, Effect.provide(TestKernel.layer({ stage: "seed" })))
  })

  it.effect("a handler that goes on after Terminated gets execution_terminal again, and still posts nothing", () => {
    const started = Deferred.makeUnsafe<void>()
    const release = Deferred.makeUnsafe<void>()
    const slow = Tool.make("slow", {
      args: Schema.Struct({}),
      success: Schema.String,
      execute: () => Effect.andThen(Effect.andThen(Deferred.succeed(started, undefined), Deferred.await(release)), Effect.succeed("x"))
    })
    const next = Tool.make("next", { args: Schema.Struct({}), success: Schema.String, execute: () => Effect.succeed("y") })
    const agent = Agent.make({
      id: "stubborn",
      handler: () =>
        slow({}).pipe(
          Effect.catchTag("Terminated", () => next({})),
          Effect.catchTag("Terminated", () => Effect.succeed("swallowed"))
        )
    })
    return Effect.gen(function*() {
      const observed = yield* observe(agent)
      const id = (yield* observed.kit.core.createExecution({ agentId: agent.id, inputRaw: undefined, agentVersion: undefined })).id
      yield* observed.tick
      yield* Deferred.await(started)
      yield* observed.kit.cancel(id)
      yield* Deferred.succeed(release, undefined)
      yield* observed.idle
      expect(observed.log.map((c) => `${c.call}:${c.target ?? ""}:${c.outcome}`)).toEqual([
        "submitStep:slow:proceed",
        "completeStep::execution_terminal",
        "submitStep:next:execution_terminal"
      ])
      expect(observed.posts()).toEqual([])
      expect((yield* observed.kit.steps(id)).map((s) => s.target)).toEqual(["slow"])
    }).pipe(Effect.scoped, Effect.provide(TestKernel.layer({ stage: "seed" })))
  })

  it.effect("with a pending approval: the approval expires with execution_cancelled and no new dispatch is queued", () => {
    let deployed = 0
    const deploy = Tool.make("deploy", {
      args: Schema.Struct({}),
      success: Schema.Null,
      execute: () => Effect.sync(() => (deployed++, null))
    })
    const agent = Agent.make({ id: "shipper", handler: () => deploy({}) })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const blocked = yield* kernel.run(agent)
      const approval = blocked.approvals[0]!
      yield* client.cancel(blocked.executionId)
      const after = yield* kernel.settle(blocked.executionId)
      expect(after.status).toBe("cancelled")
      expect(after.failureReason).toBe("client_cancelled")
      expect(after.deliveries).toBe(1)
      expect(after.approvals).toEqual([])
      expect(yield* client.getApproval(approval.id)).toMatchObject({ status: "expired", rationale: "execution_cancelled" })
      expect((yield* client.getApproval(approval.id)).decidedAt).not.toBe("")
      expect(after.steps[0]).toMatchObject({ status: "denied", error: { reason: "execution_cancelled" } })
      expect((yield* kernel.core.dispatches(blocked.executionId)).map((d) => d.status)).toEqual(["exhausted"])
      expect(payloads(after.events, "approval.expired")).toEqual([
        {
          approval_id: approval.id,
          execution_id: blocked.executionId,
          rationale: "execution_cancelled",
          status: "expired",
          step_id: approval.stepId
        }
      ])
      expect(deployed).toBe(0)
      // deciding the expired approval is a conflict; cancelling again is 409 execution_terminal,
      // which the Client treats as done
      const late = yield* Effect.flip(client.grantApproval(approval.id, { decidedBy: "" }))
      expect(late.status).toBe(409)
      const again = yield* Effect.flip(kernel.cancel(blocked.executionId))
      expect([again.status, again.code, again.message]).toEqual([409, "execution_terminal", "execution terminal"])
      yield* client.cancel(blocked.executionId)
    }).pipe(Effect.provide(TestKernel.layer({
      stage: "seed",
      agents: [agent],
      policies: { shipper: yaml("rules:", "  - { id: gate, then: { decision: require_approval } }") }
    })))
  })

  it.effect("after a cancel the dispatch stays released: later ticks deliver nothing", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const { observed, id } = yield* startRun(world)
      yield* observed.kit.cancel(id)
      yield* Deferred.succeed(world.release, undefined)
      yield* observed.idle
      // a later tick delivers nothing: the cancel released every dispatch
      yield* observed.tick
      yield* until("no run", Effect.map(observed.runtime.activeRuns, (n) => n === 0))
      expect((yield* observed.kit.core.dispatches(id)).map((d) => d.status)).toEqual(["exhausted"])
      expect(observed.log.filter((c) => c.call === "submitStep")).toHaveLength(1)
    }).pipe(Effect.scoped, Effect.provide(TestKernel.layer({ stage: "seed" })))
  })
})
