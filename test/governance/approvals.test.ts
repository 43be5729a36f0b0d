/**
 * Approvals end to end (PROTOCOL.md 9, 11.8): a `require_approval` rule blocks
 * the execution; grant reruns it with every earlier step replayed; deny and
 * expiry reach the handler as `PolicyError`s; approver checks, double
 * decisions, and the other fibers of a blocked run.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import { Agent, Client, Tool } from "effect-rebuno"
import type { KernelError } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"
import { fromFirstStep, observe, payloads, until, yaml } from "./_harness.js"

const gatePolicy = yaml(
  "default_action: allow",
  "rules:",
  "  - id: gate-deploy",
  "    priority: 1",
  "    when: { target: deploy }",
  "    then:",
  "      decision: require_approval",
  "      approval_config: { approvers: [alice, bob], timeout: 5m, message: ship it? }",
  "  - { id: gate-wipe, priority: 2, when: { target: wipe }, then: { decision: require_approval } }"
)

/** An agent that prepares, then deploys (gated), and reports a denial as its output. */
const makeWorld = (id = "shipper") => {
  const count = { prepare: 0, deploy: 0, wipe: 0 }
  const prepare = Tool.make("prepare", {
    args: Schema.Struct({ version: Schema.String }),
    success: Schema.String,
    execute: ({ version }) => Effect.sync(() => (count.prepare++, `built ${version}`))
  })
  const deploy = Tool.make("deploy", {
    args: Schema.Struct({ version: Schema.String }),
    success: Schema.String,
    idempotency: "at_most_once",
    execute: ({ version }) => Effect.sync(() => (count.deploy++, `deployed ${version}`))
  })
  const agent = Agent.make({
    id,
    handler: () =>
      Effect.gen(function*() {
        const built = yield* prepare({ version: "1.2" })
        const shipped = yield* deploy({ version: "1.2" }).pipe(
          Effect.catchTag("PolicyError", (e) => Effect.succeed(`denied: ${e.reason}`))
        )
        return [built, shipped]
      })
  })
  const strict = Agent.make({
    id: `${id}-strict`,
    handler: () => Effect.andThen(prepare({ version: "1.2" }), deploy({ version: "1.2" }))
  })
  return { count, agent, strict }
}

const layerFor = (world: ReturnType<typeof makeWorld>) =>
  TestKernel.layer({
    stage: "seed",
    agents: [world.agent, world.strict],
    policies: { [world.agent.id]: gatePolicy, [world.strict.id]: gatePolicy }
  })

const ms = (timestamp: string) => Date.parse(timestamp)

describe("approvals", () => {
  it.effect("require_approval blocks: execution blocked, one pending approval with approvers, message and timeout", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const run = yield* kernel.run(world.agent)
      expect(run.status).toBe("blocked")
      expect(run.execution.status).toBe("blocked")
      expect(run.approvals).toHaveLength(1)
      const approval = run.approvals[0]!
      const gated = run.steps.find((s) => s.target === "deploy")!
      expect(gated.status).toBe("awaiting_approval")
      expect(approval).toMatchObject({
        stepId: gated.stepId,
        executionId: run.executionId,
        status: "pending",
        approvers: ["alice", "bob"],
        message: "ship it?",
        decidedBy: "",
        decidedAt: "",
        rationale: ""
      })
      expect(ms(approval.timeoutAt) - ms(approval.createdAt)).toBe(5 * 60_000)
      // the client sees the same pending approval
      expect((yield* client.listApprovals()).map((a) => a.id)).toEqual([approval.id])
      expect(yield* client.getApproval(approval.id)).toEqual(approval)
      // the run's dispatch was released: nothing is due or in flight
      expect((yield* kernel.core.dispatches(run.executionId)).map((d) => d.status)).toEqual(["exhausted"])
      expect(world.count).toEqual({ prepare: 1, deploy: 0, wipe: 0 })
      expect(payloads(run.events, "approval.requested")).toEqual([
        { approval_id: approval.id, execution_id: run.executionId, status: "pending", step_id: gated.stepId }
      ])
    }).pipe(Effect.provide(layerFor(world)))
  })

  it.effect("without approval_config: anyone may decide (approvers null) and the timeout is the kernel default 15m", () => {
    const count = { wiped: 0 }
    const wipe = Tool.make("wipe", {
      args: Schema.Struct({}),
      success: Schema.Null,
      execute: () => Effect.sync(() => (count.wiped++, null))
    })
    const agent = Agent.make({ id: "wiper", handler: () => wipe({}) })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const run = yield* kernel.run(agent)
      const approval = run.approvals[0]!
      expect(approval.approvers).toEqual([])
      expect(approval.message).toBe("")
      expect(ms(approval.timeoutAt) - ms(approval.createdAt)).toBe(15 * 60_000)
      yield* client.grantApproval(approval.id, { decidedBy: "" })
      const done = yield* kernel.settle(run.executionId)
      expect(done.status).toBe("completed")
      expect(count.wiped).toBe(1)
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [agent], policies: { wiper: gatePolicy } })))
  })

  it.effect("grant → the rerun replays earlier steps (bodies not re-run) and the gated step proceeds once", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const blocked = yield* kernel.run(world.agent)
      const approval = blocked.approvals[0]!
      yield* client.grantApproval(approval.id, { decidedBy: "bob", rationale: "looks good" })
      const done = yield* kernel.settle(blocked.executionId)
      expect(done.status).toBe("completed")
      expect(done.output).toEqual(["built 1.2", "deployed 1.2"])
      expect(world.count).toEqual({ prepare: 1, deploy: 1, wipe: 0 })
      expect(done.deliveries).toBe(2)
      expect(done.approvals).toEqual([])
      expect(yield* client.getApproval(approval.id)).toMatchObject({
        status: "granted",
        decidedBy: "bob",
        rationale: "looks good"
      })
      const gated = done.steps.find((s) => s.target === "deploy")!
      expect(gated).toMatchObject({ status: "succeeded", result: "deployed 1.2", idempotency: "at_most_once" })
      // granted steps proceed even for at_most_once; the new dispatch is attempt 1
      const acked = payloads(done.events, "dispatch.acked")
      expect(acked.map((p) => p.attempt)).toEqual([1, 1])
      expect(new Set(acked.map((p) => p.dispatch_id)).size).toBe(2)
    }).pipe(Effect.provide(layerFor(world)))
  })

  it.effect("deny with a rationale → the handler sees PolicyError with reason = rationale; the run continues", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const blocked = yield* kernel.run(world.agent)
      yield* client.denyApproval(blocked.approvals[0]!.id, { decidedBy: "alice", rationale: "not on a friday" })
      const done = yield* kernel.settle(blocked.executionId)
      expect(done.status).toBe("completed")
      expect(done.output).toEqual(["built 1.2", "denied: not on a friday"])
      expect(world.count).toEqual({ prepare: 1, deploy: 0, wipe: 0 })
      expect(done.steps.find((s) => s.target === "deploy")).toMatchObject({
        status: "denied",
        error: { reason: "not on a friday" }
      })
      expect(yield* client.getApproval(blocked.approvals[0]!.id)).toMatchObject({
        status: "denied",
        decidedBy: "alice",
        rationale: "not on a friday"
      })
    }).pipe(Effect.provide(layerFor(world)))
  })

  it.effect("deny without a rationale → PolicyError approval_denied; unhandled, the run fails with approval_denied", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const handled = yield* kernel.run(world.agent)
      yield* kernel.deny(handled.approvals[0]!.id, { decidedBy: "bob" })
      expect((yield* kernel.settle(handled.executionId)).output).toEqual(["built 1.2", "denied: approval_denied"])

      const unhandled = yield* kernel.run(world.strict)
      yield* kernel.deny(unhandled.approvals[0]!.id, { decidedBy: "alice" })
      const failed = yield* kernel.settle(unhandled.executionId)
      expect(failed.status).toBe("failed")
      expect(failed.failureReason).toBe("approval_denied")
      expect(world.count.deploy).toBe(0)
    }).pipe(Effect.provide(layerFor(world)))
  })

  it.effect("expiry after the approval timeout (TestClock) → PolicyError approval_timeout", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const blocked = yield* kernel.run(world.agent)
      const approval = blocked.approvals[0]!
      yield* TestClock.adjust(Duration.seconds(4 * 60 + 59))
      expect(yield* kernel.expireApprovals).toBe(0)
      yield* TestClock.adjust(Duration.seconds(2))
      expect(yield* kernel.expireApprovals).toBe(1)
      expect(yield* client.getApproval(approval.id)).toMatchObject({ status: "expired", rationale: "timeout" })
      expect(yield* client.listApprovals()).toEqual([])
      const done = yield* kernel.settle(blocked.executionId)
      expect(done.status).toBe("completed")
      expect(done.output).toEqual(["built 1.2", "denied: approval_timeout"])
      expect(world.count).toEqual({ prepare: 1, deploy: 0, wipe: 0 })
      // too late to decide
      const late = yield* Effect.flip(client.grantApproval(approval.id, { decidedBy: "alice" }))
      expect([late.status, late.code]).toEqual([409, "conflict"])
    }).pipe(Effect.provide(layerFor(world)))
  })

  it.effect("expiry through the dispatcher tick; unhandled, the run fails with approval_timeout", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const blocked = yield* kernel.run(world.strict)
      yield* TestClock.adjust(Duration.minutes(5))
      // settle ticks the dispatcher, whose tick runs the expiry sweep
      const done = yield* kernel.settle(blocked.executionId)
      expect(done.status).toBe("failed")
      expect(done.failureReason).toBe("approval_timeout")
      expect(done.steps.find((s) => s.target === "deploy")!.error).toEqual({ reason: "approval_timeout" })
    }).pipe(Effect.provide(layerFor(world)))
  })

  it.effect("a non-approver gets 403 with the exact message; deciding twice is 409 conflict", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const blocked = yield* kernel.run(world.agent)
      const id = blocked.approvals[0]!.id
      const forbidden = (decidedBy: string) => Effect.flip(client.grantApproval(id, { decidedBy }))
      const carol: KernelError = yield* forbidden("carol")
      expect([carol.status, carol.code, carol.reason.description]).toEqual([
        403,
        "forbidden",
        "forbidden: \"carol\" is not an approver for this approval"
      ])
      // exact and case-sensitive; "" never matches a non-empty list; names are rendered escaped
      expect((yield* forbidden("Alice")).reason.description).toBe("forbidden: \"Alice\" is not an approver for this approval")
      expect((yield* forbidden("")).reason.description).toBe("forbidden: \"\" is not an approver for this approval")
      expect((yield* forbidden("a\"b<")).reason.description).toBe(
        "forbidden: \"a\\\"b<\" is not an approver for this approval"
      )
      const denyByCarol = yield* Effect.flip(client.denyApproval(id, { decidedBy: "carol", rationale: "no" }))
      expect(denyByCarol.status).toBe(403)
      // still pending after refusals
      expect((yield* client.getApproval(id)).status).toBe("pending")

      yield* client.grantApproval(id, { decidedBy: "alice" })
      const twice = yield* Effect.flip(client.grantApproval(id, { decidedBy: "alice" }))
      expect([twice.status, twice.code, twice.reason.description]).toEqual([409, "conflict", "conflict"])
      const thenDeny = yield* Effect.flip(client.denyApproval(id, { decidedBy: "bob" }))
      expect([thenDeny.status, thenDeny.code]).toEqual([409, "conflict"])
      // conflict is checked before the approver
      const strangerLate = yield* forbidden("carol")
      expect(strangerLate.status).toBe(409)
      const unknown = yield* Effect.flip(client.grantApproval("0192f1a0-0000-7000-8000-000000000000", { decidedBy: "alice" }))
      expect([unknown.status, unknown.code]).toEqual([404, "not_found"])
    }).pipe(Effect.provide(layerFor(world)))
  })
})

describe("the other fibers of a blocked run", () => {
  it.effect("a sibling mid-body completes its step (CHECK passes), then its next submit is lease_superseded; nothing is reported", () => {
    const started = Deferred.makeUnsafe<void>()
    const release = Deferred.makeUnsafe<void>()
    const ran: Array<string> = []
    const tool = (name: string, body: Effect.Effect<void> = Effect.void) =>
      Tool.make(name, {
        args: Schema.Struct({}),
        success: Schema.String,
        execute: () => Effect.andThen(body, Effect.sync(() => (ran.push(name), name)))
      })
    const gated = tool("deploy")
    const slow = tool("fetch", Effect.andThen(Deferred.succeed(started, undefined), Deferred.await(release)))
    const after = tool("summarise")
    const agent = Agent.make({
      id: "parallel",
      handler: () =>
        Effect.all([
          Effect.andThen(slow({}), after({})),
          // submitted once the sibling is mid-body
          Effect.andThen(Deferred.await(started), gated({}))
        ], { concurrency: 2, mode: "result" }).pipe(
          Effect.map((results) => results.map((r) => (r._tag === "Success" ? r.success : r.failure._tag)))
        )
    })
    return Effect.gen(function*() {
      const observed = yield* observe(agent, { policy: gatePolicy })
      const { kit } = observed
      const id = (yield* kit.core.createExecution({ agentId: agent.id, inputRaw: "{}", agentVersion: undefined })).id
      yield* observed.tick
      yield* Deferred.await(started)
      yield* until("the execution to block", Effect.map(kit.execution(id), (e) => e.status === "blocked"))
      expect((yield* kit.core.dispatches(id)).map((d) => d.status)).toEqual(["exhausted"])

      yield* Deferred.succeed(release, undefined)
      yield* observed.idle
      expect(observed.log.map((c) => `${c.call}:${c.target ?? ""}:${c.outcome}`)).toEqual([
        "submitStep:fetch:proceed",
        "submitStep:deploy:blocked",
        // the released lease does not stop the sibling's own complete (CHECK ignores the release) …
        "completeStep::recorded",
        // … but its next submit is fenced: 409 lease_superseded, and the run stops without reporting
        "submitStep:summarise:LeaseSuperseded"
      ])
      expect(observed.posts()).toEqual([])
      expect(ran).toEqual(["fetch"])
      const steps = yield* kit.steps(id)
      expect(steps.map((s) => `${s.target}:${s.status}`).sort()).toEqual(["deploy:awaiting_approval", "fetch:succeeded"])
      expect((yield* kit.execution(id)).status).toBe("blocked")
      const events = yield* kit.events(id)
      expect(events.map((e) => e.type)).not.toContain("execution.completed")
      expect(events.map((e) => e.type)).not.toContain("execution.failed")

      // the grant reruns the handler: fetch replays, deploy proceeds, summarise runs
      const approval = (yield* kit.approvals(id))[0]!
      yield* kit.grant(approval.id, { decidedBy: "alice" })
      yield* observed.tick
      yield* observed.idle
      expect(yield* kit.execution(id)).toMatchObject({ status: "completed", output: ["summarise", "deploy"] })
      expect(ran.sort()).toEqual(["deploy", "fetch", "summarise"])
      expect(fromFirstStep(yield* kit.events(id)).filter((t) => t === "step.succeeded")).toHaveLength(3)
    }).pipe(Effect.scoped, Effect.provide(TestKernel.layer({ stage: "seed" })))
  })
})
