import { describe, expect, it } from "@effect/vitest"
import { Clock, Effect, Schema } from "effect"
import { Agent, Client, Step, Tool } from "effect-rebuno"
import type { ToolError } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"

/** A visible side effect per tool, so tests can count how often a body really ran. */
const makeWorld = () => {
  const calls: Array<string> = []
  const reverse = Tool.make("reverse", {
    args: Schema.Struct({ text: Schema.String }),
    success: Schema.Struct({ reversed: Schema.String }),
    execute: ({ text }) =>
      Effect.sync(() => {
        calls.push(`reverse:${text}`)
        return { reversed: [...text].reverse().join("") }
      })
  })
  const wordCount = Tool.make("word_count", {
    args: Schema.Struct({ text: Schema.String }),
    success: Schema.Struct({ count: Schema.Number }),
    execute: ({ text }) =>
      Effect.sync(() => {
        calls.push(`word_count:${text}`)
        return { count: text.split(/\s+/).filter(Boolean).length }
      })
  })
  const hello = Agent.make({
    id: "hello",
    input: Schema.Struct({ query: Schema.String }),
    handler: ({ query }) =>
      Effect.gen(function*() {
        const { reversed } = yield* reverse({ text: query })
        const { count } = yield* wordCount({ text: query })
        return { query, reversed, word_count: count }
      })
  })
  return { calls, hello, reverse, wordCount }
}

const types = (run: TestKernel.RunResult) => run.events.map((e) => e.type)

describe("TestKernel", () => {
  it.effect("runs an agent end to end in-process", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.hello, { query: "hello durable world" })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual({ query: "hello durable world", reversed: "dlrow elbarud olleh", word_count: 3 })
      expect(run.steps.map((s) => [s.kind, s.target, s.status])).toEqual(
        expect.arrayContaining([["tool_call", "reverse", "succeeded"], ["tool_call", "word_count", "succeeded"]])
      )
      expect(types(run)).toEqual([
        "execution.created",
        "execution.started",
        "dispatch.queued",
        "dispatch.acked",
        "step.proposed",
        "step.allowed",
        "step.executing",
        "step.succeeded",
        "step.proposed",
        "step.allowed",
        "step.executing",
        "step.succeeded",
        "execution.completed"
      ])
      expect(world.calls).toEqual(["reverse:hello durable world", "word_count:hello durable world"])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.hello] })))
  })

  it.effect("resumes a crashed run by replay: each side effect ran once", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.hello, { query: "a b" }, { crash: { afterSteps: 1 } })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual({ query: "a b", reversed: "b a", word_count: 2 })
      expect(run.deliveries).toBe(2)
      expect(world.calls).toEqual(["reverse:a b", "word_count:a b"])
      // the redelivery is the same dispatch with attempt 2, after the lease lapsed
      const acks = run.events.filter((e) => e.type === "dispatch.acked").map((e) => (e.payload as any).attempt)
      expect(acks).toEqual([1, 2])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.hello] })))
  })

  it.effect("two identical calls make two steps that replay in order", () => {
    let counter = 0
    const next = Tool.make("next", {
      args: Schema.Struct({}),
      success: Schema.Number,
      execute: () => Effect.sync(() => ++counter)
    })
    const agent = Agent.make({
      id: "twice",
      handler: () =>
        Effect.gen(function*() {
          const a = yield* next({})
          const b = yield* next({})
          return [a, b]
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent, {}, { crash: { afterSteps: 2 } })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual([1, 2])
      expect(counter).toBe(2)
      expect(run.steps.map((s) => s.occurrence).sort()).toEqual([0, 1])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent] })))
  })

  it.effect("an orphaned at_most_once step comes back as an indeterminate ToolError", () => {
    let sent = 0
    const sendEmail = Tool.make("send_email", {
      args: Schema.Struct({ to: Schema.String }),
      success: Schema.Struct({ ok: Schema.Boolean }),
      idempotency: "at_most_once",
      execute: () => Effect.sync(() => (sent++, { ok: true }))
    })
    const agent = Agent.make({
      id: "mailer",
      handler: () =>
        sendEmail({ to: "ops@example.com" }).pipe(
          Effect.map(() => "sent"),
          Effect.catchTag("ToolError", (e: ToolError) => Effect.succeed(e.indeterminate ? "unknown" : "failed"))
        )
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      // the body ran, then the process died before the outcome was recorded
      const run = yield* kernel.run(agent, {}, { crash: { call: "completeStep", index: 0, when: "before" } })
      expect(sent).toBe(1)
      expect(run.status).toBe("completed")
      expect(run.output).toBe("unknown")
      expect(run.steps[0]?.status).toBe("failed")
      expect(run.steps[0]?.error).toEqual({
        message: "outcome unknown: this may already have taken effect. Check the state before continuing.",
        reason: "indeterminate"
      })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent] })))
  })

  it.effect("holds a step for approval, then grants it through the client", () => {
    const world = makeWorld()
    const policy = [
      "default_action: allow",
      "rules:",
      "  - id: gate-counts",
      "    priority: 1",
      "    when: { target: word_count }",
      "    then:",
      "      decision: require_approval",
      "      approval_config: { approvers: [alice] }"
    ].join("\n")
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const blocked = yield* kernel.run(world.hello, { query: "x y" })
      expect(blocked.status).toBe("blocked")
      expect(blocked.approvals).toHaveLength(1)
      const approval = blocked.approvals[0]!
      expect(approval.approvers).toEqual(["alice"])
      const forbidden = yield* Effect.flip(client.grantApproval(approval.id, { decidedBy: "bob" }))
      expect(forbidden.status).toBe(403)
      yield* client.grantApproval(approval.id, { decidedBy: "alice", rationale: "ok" })
      const done = yield* kernel.settle(blocked.executionId)
      expect(done.status).toBe("completed")
      expect(done.output).toEqual({ query: "x y", reversed: "y x", word_count: 2 })
      expect(world.calls).toEqual(["reverse:x y", "word_count:x y"])
      const twice = yield* Effect.flip(client.grantApproval(approval.id, { decidedBy: "alice" }))
      expect(twice.status).toBe(409)
      expect(types(done).slice(4)).toEqual([
        "step.proposed",
        "step.allowed",
        "step.executing",
        "step.succeeded",
        "step.proposed",
        "step.awaiting_approval",
        "approval.requested",
        "execution.blocked",
        "approval.granted",
        "step.allowed",
        "execution.resumed",
        "dispatch.queued",
        "dispatch.acked",
        "step.executing",
        "step.succeeded",
        "execution.completed"
      ])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.hello], policies: { hello: policy } })))
  })

  it.effect("a denied step fails the execution with policy_denied: <reason>", () => {
    const world = makeWorld()
    const policy = [
      "default_action: allow",
      "rules:",
      "  - id: no-reverse",
      "    when: { target: reverse }",
      "    then: { decision: deny, reason: not today }"
    ].join("\n")
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.hello, { query: "x" })
      expect(run.status).toBe("failed")
      expect(run.failureReason).toBe("policy_denied: not today")
      expect(world.calls).toEqual([])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.hello], policies: { hello: policy } })))
  })

  it.effect("speaks the exact wire in-process with transport: http", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.hello, { query: "wire check" })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual({ query: "wire check", reversed: "kcehc eriw", word_count: 2 })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.hello], transport: "http" })))
  })

  it.effect("local steps replay their recorded value", () => {
    const seen: Array<number> = []
    const agent = Agent.make({
      id: "clock",
      handler: () =>
        Effect.gen(function*() {
          const t = yield* Step.now
          seen.push(t)
          const r = yield* Step.random
          yield* Step.run("noop", Effect.void)
          return { t, r }
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent, {}, { crash: { afterSteps: 2 } })
      expect(run.status).toBe("completed")
      expect(seen).toHaveLength(2)
      // the second run starts after the lease lapsed (virtual minutes later), yet sees the recorded time
      expect(seen[0]).toBe(seen[1])
      expect((run.output as any).t).toBe(seen[0])
      expect(run.deliveries).toBe(2)
      expect(run.steps.filter((s) => s.kind === "local").map((s) => s.target).sort()).toEqual(["noop", "now", "random"])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent] })))
  })

  it.effect("settling moves virtual time straight to a run's next sleep, off the 2 s tick grid", () => {
    const agent = Agent.make({
      id: "sleeper",
      handler: () =>
        Effect.gen(function*() {
          const before = yield* Clock.currentTimeMillis
          yield* Effect.sleep("7 seconds")
          return (yield* Clock.currentTimeMillis) - before
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const start = yield* Clock.currentTimeMillis
      const run = yield* kernel.run(agent)
      expect(run.status).toBe("completed")
      expect(run.output).toBe(7000)
      expect((yield* Clock.currentTimeMillis) - start).toBe(7000)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent] })))
  })
})

/**
 * The direct client answers step calls in-process (no Effect per call) unless
 * something is injected; over `transport: "http"` every call is a request.
 * Users must not be able to tell them apart: the same runs, steps, events and
 * call log, whatever the step's answer.
 */
describe("direct and HTTP transports", () => {
  const makeAgents = () => {
    const ran: Array<string> = []
    const tool = (name: string, execute: (n: number) => Effect.Effect<number, unknown>) =>
      Tool.make(name, {
        args: Schema.Struct({ n: Schema.Number }),
        success: Schema.Number,
        failure: Schema.TaggedError<Overdrawn>()("Overdrawn", { by: Schema.Number }),
        execute: ({ n }) => Effect.suspend(() => (ran.push(`${name}:${n}`), execute(n)))
      })
    class Overdrawn extends Schema.TaggedError<Overdrawn>()("Overdrawn", { by: Schema.Number }) {}
    const add = tool("add", (n) => Effect.succeed(n + 1))
    const fails = tool("fails", () => Effect.fail(new Error("boom")))
    const typed = tool("typed", (n) => Effect.fail(new Overdrawn({ by: n })))
    const shell = tool("shell", (n) => Effect.succeed(n))
    const limited = tool("limited", (n) => Effect.succeed(n))
    const deploy = tool("deploy", (n) => Effect.succeed(n))
    const outcome = <A, E extends { readonly _tag: string }, R>(effect: Effect.Effect<A, E, R>) =>
      effect.pipe(
        Effect.map((a) => `ok ${JSON.stringify(a)}`),
        Effect.catch((e) => Effect.succeed(`${e._tag}`))
      )
    const mixed = Agent.make({
      id: "mixed",
      handler: () =>
        Effect.gen(function*() {
          const out: Array<string> = []
          out.push(yield* outcome(add({ n: 1 })))
          out.push(yield* outcome(add({ n: 1 })))
          out.push(yield* outcome(fails({ n: 2 })))
          out.push(yield* outcome(typed({ n: 3 })))
          out.push(yield* outcome(shell({ n: 4 })))
          out.push(yield* outcome(limited({ n: 5 })))
          out.push(yield* outcome(limited({ n: 6 })))
          out.push(yield* outcome(Step.make({ kind: "local", target: "not_json", body: () => Effect.succeed(() => 1) })))
          out.push(yield* outcome(add({ n: Number.NaN })))
          return out
        })
    })
    const gated = Agent.make({
      id: "gated",
      handler: () => Effect.gen(function*() {
        const a = yield* add({ n: 10 })
        const b = yield* deploy({ n: a })
        return b
      })
    })
    return { ran, mixed, gated }
  }

  const policy = [
    "default_action: allow",
    "rules:",
    "  - { id: no-shell, priority: 1, when: { target: shell }, then: { decision: deny, reason: shell is off } }",
    "  - id: once",
    "    priority: 2",
    "    when: { target: limited }",
    "    then: { decision: allow, rate_limit: { max_calls: 1, window: 1m } }",
    "  - { id: gate, priority: 3, when: { target: deploy }, then: { decision: require_approval } }"
  ].join("\n")

  /** What a user can see of the runs, with ids and times left out. */
  const observe = (transport: "direct" | "http") => {
    const agents = makeAgents()
    const calls = (run: TestKernel.RunResult) =>
      run.calls.map((c) => [c.call, c.kind, c.target, c.argsJson, c.index, c.attempt, c.reached, c.answer, c.delivered])
    const view = (run: TestKernel.RunResult) => ({
      status: run.status,
      output: run.output,
      failureReason: run.failureReason,
      deliveries: run.deliveries,
      steps: run.steps.map((s) => [s.kind, s.target, s.status, s.occurrence, s.result, s.error]).sort((a, b) =>
        JSON.stringify(a) < JSON.stringify(b) ? -1 : 1
      ),
      events: run.events.map((e) => e.type),
      calls: calls(run)
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const mixed = yield* kernel.run(agents.mixed, {})
      // A crash after the first step outcome: the next attempt replays it.
      const crashed = yield* kernel.run(agents.gated, {}, { crash: { afterSteps: 1 } })
      yield* kernel.grant(crashed.approvals[0]!.id, { decidedBy: "ops" })
      const granted = yield* kernel.settle(crashed.executionId)
      return { mixed: view(mixed), crashed: view(crashed), granted: view(granted), ran: agents.ran }
    }).pipe(
      Effect.provide(TestKernel.layer({ agents: [agents.mixed, agents.gated], transport, policies: { mixed: policy, gated: policy } }))
    )
  }

  it.effect("the same runs, steps, events and call log", () =>
    Effect.gen(function*() {
      const direct = yield* observe("direct")
      const http = yield* observe("http")
      expect(direct.mixed.output).toEqual([
        "ok 2",
        "ok 2",
        "ToolError",
        "Overdrawn",
        "PolicyError",
        "ok 5",
        "RateLimited",
        "ToolError",
        "InvalidArguments"
      ])
      expect(direct.crashed.status).toBe("blocked")
      expect(direct.granted.status).toBe("completed")
      expect(direct.granted.output).toBe(11)
      expect(direct.crashed.calls.some((c) => c[7] === "replay")).toBe(true)
      expect(direct).toEqual(http)
    }))
})
