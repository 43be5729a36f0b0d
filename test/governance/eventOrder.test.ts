/**
 * The event log of the common flows, exactly as PROTOCOL.md 12.3 lists them,
 * from `execution.created` to the end: happy path (one tool, one LLM call),
 * denial, approval granted / denied / expired, and cancel with a pending
 * approval, with an executing step, and with both. Sequence numbers are dense
 * from 1 in every case.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import { Agent, Llm, Tool } from "effect-rebuno"
import type { Protocol } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"
import { observe, payloads, types, until, yaml } from "./_harness.js"

const created = ["execution.created", "execution.started", "dispatch.queued", "dispatch.acked"]
const allowedStep = ["step.proposed", "step.allowed", "step.executing", "step.succeeded"]
const blocking = ["step.proposed", "step.awaiting_approval", "approval.requested", "execution.blocked"]

const expectDense = (events: ReadonlyArray<Protocol.Event>) =>
  expect(events.map((e) => e.eventSeq)).toEqual(events.map((_, i) => i + 1))

const search = Tool.make("search", {
  args: Schema.Struct({ q: Schema.String }),
  success: Schema.Array(Schema.String),
  execute: ({ q }) => Effect.succeed([`hit for ${q}`])
})

const deploy = Tool.make("deploy", {
  args: Schema.Struct({}),
  success: Schema.String,
  execute: () => Effect.succeed("deployed")
})

/** A provider `fetch` that answers a chat completion. */
const provider: Llm.Fetch = () =>
  Promise.resolve(
    new Response(JSON.stringify({ choices: [{ message: { role: "assistant", content: "summary" } }] }), {
      status: 200,
      headers: { "content-type": "application/json" }
    })
  )

const happy = Agent.make({
  id: "happy",
  handler: () =>
    Effect.gen(function*() {
      const hits = yield* search({ q: "effect" })
      const fetch = yield* Llm.makeFetch({ fetch: provider })
      const response = yield* Effect.promise(() =>
        fetch("https://llm.example/v1/chat/completions", {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: "gpt-test", messages: [{ role: "user", content: hits.join() }] })
        }).then((r) => r.json())
      )
      return (response as any).choices[0].message.content as string
    })
})

const shipper = Agent.make({
  id: "shipper",
  handler: () =>
    Effect.gen(function*() {
      yield* search({ q: "status" })
      return yield* deploy({}).pipe(Effect.catchTag("PolicyError", (e) => Effect.succeed(e.reason)))
    })
})

const policies = {
  happy: yaml(
    "default_action: deny",
    "rules:",
    "  - { id: tools, priority: 1, when: { step_kind: tool_call, target: search }, then: { decision: allow } }",
    "  - { id: models, priority: 2, when: { step_kind: llm_call }, then: { decision: allow } }"
  ),
  shipper: yaml(
    "default_action: allow",
    "rules:",
    "  - { id: gate, when: { target: deploy }, then: { decision: require_approval, approval_config: { timeout: 1m } } }"
  ),
  denied: yaml(
    "default_action: allow",
    "rules:",
    "  - { id: no-search, when: { target: search }, then: { decision: deny, reason: search is offline } }"
  )
}

const denied = Agent.make({ id: "denied", handler: () => search({ q: "x" }) })

const layer = TestKernel.layer({ stage: "seed", agents: [happy, shipper, denied], policies })

describe("event order (PROTOCOL.md 12.3)", () => {
  it.effect("happy path: one allowed tool, one LLM call", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(happy)
      expect(run.status).toBe("completed")
      expect(run.output).toBe("summary")
      expect(types(run.events)).toEqual([...created, ...allowedStep, ...allowedStep, "execution.completed"])
      expectDense(run.events)
      expect(run.events.filter((e) => e.type === "step.proposed").map((e) => e.payload)).toEqual([
        expect.objectContaining({ step_type: "tool_call", target: "search" }),
        expect.objectContaining({ step_type: "llm_call", target: "gpt-test" })
      ])
      expect(payloads(run.events, "step.allowed").map((p) => p.rule_id)).toEqual(["tools", "models"])
      expect(payloads(run.events, "execution.completed")).toEqual([
        { execution_id: run.executionId, output: "summary", status: "completed" }
      ])
    }).pipe(Effect.provide(layer)))

  it.effect("denied by policy: step.proposed, step.denied; then the handler's failure", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(denied)
      expect(types(run.events)).toEqual([...created, "step.proposed", "step.denied", "execution.failed"])
      expectDense(run.events)
      expect(payloads(run.events, "step.denied")[0]).toMatchObject({
        error: { reason: "search is offline", rule_id: "no-search" },
        rule_id: "no-search"
      })
      expect(payloads(run.events, "execution.failed")).toEqual([
        { execution_id: run.executionId, reason: "policy_denied: search is offline", status: "failed" }
      ])
    }).pipe(Effect.provide(layer)))

  it.effect("approval granted", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const blocked = yield* kernel.run(shipper)
      expect(types(blocked.events)).toEqual([...created, ...allowedStep, ...blocking])
      yield* kernel.grant(blocked.approvals[0]!.id, { decidedBy: "ops", rationale: "ok" })
      const done = yield* kernel.settle(blocked.executionId)
      expect(types(done.events)).toEqual([
        ...created,
        ...allowedStep,
        ...blocking,
        "approval.granted",
        "step.allowed",
        "execution.resumed",
        "dispatch.queued",
        "dispatch.acked",
        // replays write nothing; the gated step executes
        "step.executing",
        "step.succeeded",
        "execution.completed"
      ])
      expectDense(done.events)
      const gatedId = blocked.approvals[0]!.stepId
      expect(payloads(done.events, "approval.granted")[0]).toEqual({
        approval_id: blocked.approvals[0]!.id,
        decided_by: "ops",
        execution_id: done.executionId,
        rationale: "ok",
        status: "granted",
        step_id: gatedId
      })
      // the grant's step.allowed has no rule_id
      expect(payloads(done.events, "step.allowed")[1]).toEqual({ step_id: gatedId, step_type: "tool_call", target: "deploy" })
      expect(payloads(done.events, "dispatch.queued")[1]).toMatchObject({ attempt: 0, status: "pending" })
      expect(payloads(done.events, "execution.resumed")).toEqual([{ execution_id: done.executionId, status: "running" }])
    }).pipe(Effect.provide(layer)))

  it.effect("approval denied", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const blocked = yield* kernel.run(shipper)
      yield* kernel.deny(blocked.approvals[0]!.id, { decidedBy: "ops" })
      const done = yield* kernel.settle(blocked.executionId)
      expect(done.output).toBe("approval_denied")
      expect(types(done.events)).toEqual([
        ...created,
        ...allowedStep,
        ...blocking,
        "approval.denied",
        "step.denied",
        "execution.resumed",
        "dispatch.queued",
        "dispatch.acked",
        "execution.completed"
      ])
      expectDense(done.events)
      // a human denial: the stored error only, no rule_id
      expect(payloads(done.events, "step.denied")).toEqual([
        {
          error: { reason: "approval_denied" },
          step_id: blocked.approvals[0]!.stepId,
          step_type: "tool_call",
          target: "deploy"
        }
      ])
    }).pipe(Effect.provide(layer)))

  it.effect("approval expired", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const blocked = yield* kernel.run(shipper)
      yield* TestClock.adjust(Duration.minutes(1))
      expect(yield* kernel.expireApprovals).toBe(1)
      const done = yield* kernel.settle(blocked.executionId)
      expect(done.output).toBe("approval_timeout")
      expect(types(done.events)).toEqual([
        ...created,
        ...allowedStep,
        ...blocking,
        "approval.expired",
        "step.denied",
        "execution.resumed",
        "dispatch.queued",
        "dispatch.acked",
        "execution.completed"
      ])
      expectDense(done.events)
      expect(payloads(done.events, "approval.expired")[0]).toMatchObject({ rationale: "timeout", status: "expired" })
      expect(payloads(done.events, "step.denied")[0]).toMatchObject({ error: { reason: "approval_timeout" } })
    }).pipe(Effect.provide(layer)))

  it.effect("cancel with a pending approval: execution.cancelled, approval.expired, step.denied", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const blocked = yield* kernel.run(shipper)
      yield* kernel.cancel(blocked.executionId)
      const done = yield* kernel.settle(blocked.executionId)
      expect(types(done.events)).toEqual([
        ...created,
        ...allowedStep,
        ...blocking,
        "execution.cancelled",
        "approval.expired",
        "step.denied"
      ])
      expectDense(done.events)
      expect(payloads(done.events, "execution.cancelled")).toEqual([
        { execution_id: done.executionId, reason: "client_cancelled", status: "cancelled" }
      ])
      expect(payloads(done.events, "step.denied")).toEqual([
        {
          error: { reason: "execution_cancelled" },
          step_id: blocked.approvals[0]!.stepId,
          step_type: "tool_call",
          target: "deploy"
        }
      ])
    }).pipe(Effect.provide(layer)))

  const makeParallel = () => {
    const started = Deferred.makeUnsafe<void>()
    const slow = Tool.make("slow", {
      args: Schema.Struct({}),
      success: Schema.String,
      execute: () => Effect.andThen(Deferred.succeed(started, undefined), Effect.never)
    })
    const gated = Tool.make("deploy", { args: Schema.Struct({}), success: Schema.String, execute: () => Effect.succeed("d") })
    const agent = (withApproval: boolean) =>
      Agent.make({
        id: withApproval ? "both" : "executing",
        handler: () =>
          withApproval ?
            Effect.asVoid(Effect.all([slow({}), Effect.andThen(Deferred.await(started), gated({}))], { concurrency: 2 })) :
            Effect.asVoid(slow({}))
      })
    return { started, agent }
  }

  it.effect("cancel with an executing step: execution.cancelled, step.cancelled", () => {
    const { agent, started } = makeParallel()
    return Effect.gen(function*() {
      const observed = yield* observe(agent(false))
      const id = (yield* observed.kit.core.createExecution({ agentId: "executing", inputRaw: undefined, agentVersion: undefined }))
        .id
      yield* observed.tick
      yield* Deferred.await(started)
      yield* observed.kit.cancel(id)
      const events = yield* observed.kit.events(id)
      expect(types(events)).toEqual([
        ...created,
        "step.proposed",
        "step.allowed",
        "step.executing",
        "execution.cancelled",
        "step.cancelled"
      ])
      expectDense(events)
      expect(payloads(events, "step.cancelled")).toEqual([
        {
          error: { reason: "execution_cancelled" },
          step_id: (yield* observed.kit.steps(id))[0]!.stepId,
          step_type: "tool_call",
          target: "slow"
        }
      ])
    }).pipe(Effect.scoped, Effect.provide(TestKernel.layer({ stage: "seed" })))
  })

  it.effect("cancel with both: execution.cancelled, then per pending approval approval.expired + step.denied, then step.cancelled", () => {
    const { agent, started } = makeParallel()
    return Effect.gen(function*() {
      const observed = yield* observe(agent(true), {
        policy: yaml("rules:", "  - { id: gate, when: { target: deploy }, then: { decision: require_approval } }", "default_action: allow")
      })
      const id = (yield* observed.kit.core.createExecution({ agentId: "both", inputRaw: undefined, agentVersion: undefined })).id
      yield* observed.tick
      yield* Deferred.await(started)
      yield* until("the execution to block", Effect.map(observed.kit.execution(id), (e) => e.status === "blocked"))
      yield* observed.kit.cancel(id)
      const events = yield* observed.kit.events(id)
      expect(types(events)).toEqual([
        ...created,
        "step.proposed",
        "step.allowed",
        "step.executing",
        ...blocking,
        "execution.cancelled",
        "approval.expired",
        "step.denied",
        "step.cancelled"
      ])
      expectDense(events)
      const steps = yield* observed.kit.steps(id)
      expect(steps.map((s) => `${s.target}:${s.status}`).sort()).toEqual(["deploy:denied", "slow:cancelled"])
    }).pipe(Effect.scoped, Effect.provide(TestKernel.layer({ stage: "seed" })))
  })
})
