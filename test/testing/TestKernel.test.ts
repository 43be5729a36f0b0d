import { describe, expect, expectTypeOf, it } from "@effect/vitest"
import { Clock, Effect, Option, Schema } from "effect"
import { Agent, Client, Step, Subagent, Tool } from "effect-rebuno"
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
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [world.hello], policies: { hello: policy } })))
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
      Effect.provide(TestKernel.layer({ stage: "seed", agents: [agents.mixed, agents.gated], transport, policies: { mixed: policy, gated: policy } }))
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
        "StepDecodeError",
        "InvalidArguments"
      ])
      expect(direct.crashed.status).toBe("blocked")
      expect(direct.granted.status).toBe("completed")
      expect(direct.granted.output).toBe(11)
      expect(direct.crashed.calls.some((c) => c[7] === "replay")).toBe(true)
      expect(direct).toEqual(http)
    }))
})

/**
 * The current stage in-process (PROTOCOL-CURRENT): sessions, subagents,
 * rate-limit parking and scoped API keys, all on virtual time.
 */
describe("TestKernel: the current stage", () => {
  const History = Schema.Array(Schema.String)

  /** A chat agent that keeps its history as session state and takes 10 virtual seconds per turn. */
  const makeChat = () => {
    const load = { active: 0, max: 0 }
    const chat = Agent.make({
      id: "chat",
      input: Schema.Struct({ message: Schema.String }),
      state: History,
      handler: ({ message }, session) =>
        Effect.gen(function*() {
          const history = Option.getOrElse(yield* session.previous, () => [])
          load.active++
          load.max = Math.max(load.max, load.active)
          yield* Effect.sleep("10 seconds").pipe(Effect.ensuring(Effect.sync(() => load.active--)))
          const next = [...history, message]
          return session.withState({ turns: next.length, last: message }, next)
        })
    })
    return { chat, load }
  }

  it.effect("executions of one session run one at a time, each starting from the state the previous one left", () => {
    const { chat, load } = makeChat()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const start = yield* Clock.currentTimeMillis
      const ids: Array<string> = []
      for (const message of ["a", "b", "c"]) ids.push(yield* kernel.create("chat", { message }, { session: "chat:u1" }))
      expect((yield* Effect.forEach(ids, kernel.execution)).map((e) => e.status)).toEqual(["running", "pending", "pending"])
      const last = yield* kernel.settle(ids[2]!)
      expect(last.status).toBe("completed")
      expect(last.output).toEqual({ turns: 3, last: "c" })
      const executions = yield* Effect.forEach(ids, kernel.execution)
      expect(executions.map((e) => [e.status, e.session, e.parentExecutionId])).toEqual([
        ["completed", "chat:u1", undefined],
        ["completed", "chat:u1", ids[0]],
        ["completed", "chat:u1", ids[1]]
      ])
      expect(executions.map((e) => e.output)).toEqual([{ turns: 1, last: "a" }, { turns: 2, last: "b" }, {
        turns: 3,
        last: "c"
      }])
      // One at a time: three 10 s turns take 30 s of virtual time, never two at once.
      expect(load.max).toBe(1)
      expect((yield* Clock.currentTimeMillis) - start).toBeGreaterThanOrEqual(30_000)
      // What `previous` reads: the stored state, which is in no event and no execution JSON.
      expect(yield* client.previous(ids[2]!)).toEqual(["a", "b"])
      expect(yield* client.previous(ids[0]!)).toBeNull()
      // The second execution was created pending, and started once the first had completed.
      const second = yield* kernel.events(ids[1]!)
      expect(second.slice(0, 2).map((e) => [e.type, e.payload])).toEqual([
        ["execution.created", { execution_id: ids[1], status: "pending", session: "chat:u1" }],
        ["execution.started", {
          execution_id: ids[1],
          status: "running",
          session: "chat:u1",
          parent_execution_id: ids[0]
        }]
      ])
      const firstCompleted = (yield* kernel.events(ids[0]!)).find((e) => e.type === "execution.completed")!
      expect(Date.parse(second[1]!.occurredAt)).toBeGreaterThanOrEqual(Date.parse(firstCompleted.occurredAt))
      // The session's listing.
      const page = yield* client.list({ session: "chat:u1" })
      expect(page.executions.map((e) => e.id).sort()).toEqual([...ids].sort())
    }).pipe(Effect.provide(TestKernel.layer({ agents: [chat] })))
  })

  it.effect("run with a session continues it; other sessions run side by side", () => {
    const { chat, load } = makeChat()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const first = yield* kernel.run(chat, { message: "hi" }, { session: "s1" })
      const second = yield* kernel.run(chat, { message: "again" }, { session: "s1" })
      expect([first.output, second.output]).toEqual([{ turns: 1, last: "hi" }, { turns: 2, last: "again" }])
      expect(second.execution.parentExecutionId).toBe(first.executionId)
      load.max = 0
      const x = yield* kernel.create("chat", { message: "x" }, { session: "s2" })
      const y = yield* kernel.create("chat", { message: "y" }, { session: "s3" })
      expect((yield* kernel.execution(y)).status).toBe("running")
      yield* kernel.settle(x)
      expect((yield* kernel.settle(y)).output).toEqual({ turns: 1, last: "y" })
      expect(load.max).toBe(2)
      // An idempotent create answers the first execution and runs nothing new.
      const keyed = yield* kernel.run(chat, { message: "k" }, { session: "s4", idempotencyKey: "k-1" })
      const again = yield* kernel.run(chat, { message: "other" }, { session: "s4", idempotencyKey: "k-1" })
      expect(again.executionId).toBe(keyed.executionId)
      expect(again.output).toEqual({ turns: 1, last: "k" })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [chat] })))
  })

  it.effect("settling a pending execution whose session waits on an approval stops there, without moving time", () => {
    const deploy = Tool.make("deploy", { args: Schema.Struct({}), success: Schema.String, execute: () => Effect.succeed("done") })
    const agent = Agent.make({ id: "deployer", handler: () => deploy({}) })
    const policy = "default_action: allow\nrules:\n  - { id: gate, when: { target: deploy }, then: { decision: require_approval } }\n"
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const first = yield* kernel.create("deployer", {}, { session: "ops" })
      const second = yield* kernel.create("deployer", {}, { session: "ops" })
      const start = yield* Clock.currentTimeMillis
      const waiting = yield* kernel.settle(second)
      expect(waiting.status).toBe("pending")
      expect((yield* kernel.execution(first)).status).toBe("blocked")
      expect((yield* Clock.currentTimeMillis) - start).toBeLessThan(60_000)
      const approval = yield* TestKernel.pendingApproval(first)
      yield* kernel.grant(approval.id)
      const done = yield* kernel.settle(second)
      expect(done.status).toBe("blocked")
      expect((yield* kernel.execution(first)).status).toBe("completed")
      expect(done.execution.parentExecutionId).toBe(first)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent], policies: { deployer: policy } })))
  })

  it.effect("a result's calls, steps and events are those of the moment it settled, read later or not", () => {
    const deploy = Tool.make("deploy", { args: Schema.Struct({}), success: Schema.String, execute: () => Effect.succeed("done") })
    const agent = Agent.make({ id: "deployer", handler: () => deploy({}) })
    const policy = "default_action: allow\nrules:\n  - { id: gate, when: { target: deploy }, then: { decision: require_approval } }\n"
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const blocked = yield* kernel.run(agent)
      expect(blocked.status).toBe("blocked")
      yield* kernel.grant(blocked.approvals[0]!.id)
      const done = yield* kernel.settle(blocked.executionId)
      expect(done.status).toBe("completed")
      // Read only now, after the execution moved on: still what the first settle saw.
      expect(blocked.calls.map((c) => [c.call, c.answer, c.delivered])).toEqual([
        ["getExecution", "ok", true],
        ["submitStep", "blocked", true]
      ])
      expect(blocked.calls[1]).toMatchObject({ kind: "tool_call", target: "deploy", argsJson: "{}" })
      expect(blocked.steps.map((s) => s.status)).toEqual(["awaiting_approval"])
      expect(done.calls.slice(0, 2)).toEqual(blocked.calls)
      expect(done.calls.map((c) => c.call)).toContain("completeExecution")
      expect(done.steps.map((s) => s.status)).toEqual(["succeeded"])
      expect(done.events.length).toBeGreaterThan(blocked.events.length)
      expect(yield* kernel.calls(blocked.executionId)).toEqual(done.calls)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent], policies: { deployer: policy } })))
  })

  it.effect("a long run: every call is logged in order, and a fault deep into the run hits its call", () => {
    const noop = Tool.make("noop", {
      args: Schema.Struct({ i: Schema.Number }),
      success: Schema.Number,
      execute: ({ i }) => Effect.succeed(i)
    })
    const agent = Agent.make({
      id: "long",
      handler: () =>
        Effect.gen(function*() {
          let sum = 0
          for (let i = 0; i < 700; i++) sum += yield* noop({ i })
          return sum
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent, {}, { faults: [{ call: "completeStep", index: 650, when: "after" }] })
      expect(run.status).toBe("completed")
      expect(run.output).toBe((699 * 700) / 2)
      const calls = run.calls
      expect(calls.map((c) => c.seq)).toEqual(calls.map((_, i) => i))
      const submits = calls.filter((c) => c.call === "submitStep")
      expect(submits.map((c) => c.index)).toEqual(submits.map((_, i) => i))
      expect(submits[600]).toMatchObject({ kind: "tool_call", target: "noop", argsJson: "{\"i\":600}", answer: "proceed" })
      // The 651st complete lost its answer; the retry (the next complete call) got through.
      const completes = calls.filter((c) => c.call === "completeStep")
      expect(completes.length).toBe(701)
      expect(completes[650]).toMatchObject({ injected: "fault", reached: true, delivered: false, answer: "recorded" })
      expect(completes[651]).toMatchObject({ stepId: completes[650]!.stepId, delivered: true, injected: undefined })
      expect(yield* kernel.calls()).toEqual(calls)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent] })))
  })

  it.effect("a session execution of a seed-stage kit: no sessions, previous is a KernelError", () => {
    const { chat } = makeChat()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(chat, { message: "hi" }, { session: "ignored" })
      expect(run.status).toBe("failed")
      expect(run.execution.session).toBeUndefined()
      expect(run.failureReason).toMatch(/^agent_error: KernelError/)
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [chat] })))
  })

  const Summary = Schema.Struct({ summary: Schema.String })
  const summarize = Subagent.make({
    agentId: "summarizer",
    input: Schema.Struct({ text: Schema.String }),
    output: Summary
  })
  const makeFamily = () => {
    const childRuns: Array<string> = []
    const summarizer = Agent.make({
      id: "summarizer",
      input: Schema.Struct({ text: Schema.String }),
      output: Summary,
      handler: ({ text }) =>
        Effect.gen(function*() {
          childRuns.push(text)
          if (text === "boom") return yield* Effect.fail(new Error("cannot summarise"))
          yield* Effect.sleep("5 seconds")
          return { summary: text.slice(0, 3) }
        })
    })
    const researcher = Agent.make({
      id: "researcher",
      input: Schema.Struct({ documents: Schema.Array(Schema.String) }),
      handler: ({ documents }) =>
        Effect.forEach(
          documents,
          (text) =>
            summarize({ text }).pipe(
              Effect.map((s) => s.summary),
              Effect.catchTag("SubagentError", (e) => Effect.succeed(`failed: ${e.reason}: ${e.failureReason}`))
            ),
          { concurrency: "unbounded" }
        )
    })
    return { childRuns, researcher, summarizer }
  }

  it.effect("a subagent call: the parent suspends, the children run, the parent resumes with their outputs", () => {
    const family = makeFamily()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* Client.Client
      const run = yield* kernel.run(family.researcher, { documents: ["hello", "world"] })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(["hel", "wor"])
      expect(run.deliveries).toBe(2)
      // Each child ran once; the parent's second run replayed their outcomes.
      expect(family.childRuns.sort()).toEqual(["hello", "world"])
      const blocked = run.events.filter((e) => e.type === "execution.blocked" || e.type === "execution.resumed")
      expect(blocked.map((e) => [e.type, e.payload])).toEqual([
        ["execution.blocked", { execution_id: run.executionId, status: "blocked", reason: "awaiting_steps" }],
        ["execution.resumed", { execution_id: run.executionId, status: "running" }]
      ])
      expect(run.steps.map((s) => [s.kind, s.target, s.status, s.result])).toEqual(
        expect.arrayContaining([
          ["tool_call", "summarizer", "succeeded", { summary: "hel" }],
          ["tool_call", "summarizer", "succeeded", { summary: "wor" }]
        ])
      )
      const children = (yield* client.list({ agentId: "summarizer" })).executions
      expect(children).toHaveLength(2)
      for (const child of children) {
        expect(child.status).toBe("completed")
        expect(child.spawnedBy?.executionId).toBe(run.executionId)
        expect(run.steps.map((s) => s.stepId)).toContain(child.spawnedBy?.stepId)
        expect(child.idempotencyKey).toBe(child.spawnedBy?.stepId)
      }
    }).pipe(Effect.provide(TestKernel.layer({ agents: [family.researcher, family.summarizer] })))
  })

  it.effect("a failed child is a typed SubagentError in the parent, with the child's failure reason", () => {
    const family = makeFamily()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(family.researcher, { documents: ["boom", "fine"] })
      expect(run.status).toBe("completed")
      expect(run.output).toEqual(["failed: subagent_failed: agent_error: Error: cannot summarise", "fin"])
      const failedStep = run.steps.find((s) => s.status === "failed")!
      expect(failedStep.error).toMatchObject({ reason: "subagent_failed", failure_reason: "agent_error: Error: cannot summarise" })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [family.researcher, family.summarizer], transport: "http" })))
  })

  it.effect("a parent whose child waits on an approval settles blocked; granting the child's approval finishes both", () => {
    const family = makeFamily()
    const policy = "default_action: allow\nrules:\n  - { id: gate, when: { target: \"*\" }, then: { decision: require_approval } }\n"
    const gatedChild = Agent.make({
      id: "summarizer",
      input: Schema.Struct({ text: Schema.String }),
      output: Summary,
      handler: ({ text }) => Step.run("review", Effect.succeed({ summary: text.toUpperCase() }))
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const start = yield* Clock.currentTimeMillis
      const blocked = yield* kernel.run(family.researcher, { documents: ["abc"] })
      expect(blocked.status).toBe("blocked")
      expect(blocked.approvals).toEqual([])
      expect((yield* Clock.currentTimeMillis) - start).toBeLessThan(60_000)
      const approvals = yield* kernel.approvals()
      expect(approvals).toHaveLength(1)
      yield* kernel.grant(approvals[0]!.id)
      const done = yield* kernel.settle(blocked.executionId)
      expect([done.status, done.output]).toEqual(["completed", ["ABC"]])
    }).pipe(Effect.provide(TestKernel.layer({
      agents: [family.researcher, gatedChild],
      policies: { summarizer: policy }
    })))
  })

  it.effect("rate-limit parking: the run ends, virtual time moves to the redelivery, the step then proceeds", () => {
    const pinged: Array<number> = []
    const ping = Tool.make("ping", {
      args: Schema.Struct({ n: Schema.Number }),
      success: Schema.Number,
      execute: ({ n }) => Effect.sync(() => (pinged.push(n), n))
    })
    const agent = Agent.make({
      id: "pinger",
      handler: () => Effect.forEach([1, 2], (n) => ping({ n }))
    })
    const policy = [
      "default_action: allow",
      "rules:",
      "  - id: slow-pings",
      "    when: { target: ping }",
      "    then:",
      "      decision: allow",
      "      rate_limit: { max_calls: 1, window: 1m, max_wait: 5m }"
    ].join("\n")
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const start = yield* Clock.currentTimeMillis
      const run = yield* kernel.run(agent)
      expect(run.status).toBe("completed")
      expect(run.output).toEqual([1, 2])
      expect(pinged).toEqual([1, 2])
      expect(run.deliveries).toBe(2)
      const elapsed = (yield* Clock.currentTimeMillis) - start
      // The wait is window / max_calls (the jitter source is pinned to 0), on the 250 ms tick grid.
      expect(elapsed).toBe(60_000)
      // The execution never blocked: it stayed running and was redelivered after the wait.
      expect(types(run)).toEqual([
        "execution.created",
        "execution.started",
        "dispatch.queued",
        "dispatch.acked",
        "step.proposed",
        "step.allowed",
        "step.executing",
        "step.succeeded",
        "step.rate_limited",
        "dispatch.queued",
        "dispatch.acked",
        "step.proposed",
        "step.allowed",
        "step.executing",
        "step.succeeded",
        "execution.completed"
      ])
      const parked = run.events[8]!
      const retried = run.events[11]!
      expect(parked.payload).toEqual({
        step_id: (retried.payload as { step_id: string }).step_id,
        step_type: "tool_call",
        target: "ping",
        rule_id: "slow-pings",
        error: { reason: "rate_limit_exceeded", rule_id: "slow-pings" }
      })
      expect(Date.parse(run.events[10]!.occurredAt) - Date.parse(parked.occurredAt)).toBe(60_000)
      const submits = run.calls.filter((c) => c.call === "submitStep").map((c) => `${c.target}:${c.answer}`)
      expect(submits).toEqual(["ping:proceed", "ping:blocked", "ping:replay", "ping:proceed"])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent], policies: { pinger: policy }, settings: { random: () => 0 } })))
  })

  it.effect("the direct and HTTP transports agree on sessions, subagents and parking (previous and suspend calls included)", () => {
    const childless = (error: unknown) =>
      typeof error === "object" && error !== null && "execution_id" in error ? { ...error, execution_id: "<child>" } : error
    const observe = (transport: "direct" | "http") => {
      const { chat } = makeChat()
      const family = makeFamily()
      const ping = Tool.make("ping", {
        args: Schema.Struct({ n: Schema.Number }),
        success: Schema.Number,
        execute: ({ n }) => Effect.succeed(n)
      })
      const pinger = Agent.make({ id: "pinger", handler: () => Effect.forEach([1, 2], (n) => ping({ n })) })
      const policy = "rules:\n  - { id: slow, when: { target: ping }, then: { decision: allow, rate_limit: { max_calls: 1, window: 1m, max_wait: 5m } } }\ndefault_action: allow\n"
      const view = (run: TestKernel.RunResult) => ({
        status: run.status,
        output: run.output,
        deliveries: run.deliveries,
        // A child's execution id differs from run to run: only its presence is compared.
        steps: run.steps.map((s) => [s.kind, s.target, s.status, s.result, childless(s.error)]).sort((a, b) =>
          JSON.stringify(a) < JSON.stringify(b) ? -1 : 1
        ),
        events: run.events.map((e) => e.type),
        calls: run.calls.map((c) => [c.call, c.target, c.index, c.attempt, c.reached, c.answer, c.delivered])
      })
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const first = yield* kernel.run(chat, { message: "a" }, { session: "s" })
        const second = yield* kernel.run(chat, { message: "b" }, { session: "s" })
        const parent = yield* kernel.run(family.researcher, { documents: ["boom", "fine"] })
        const parked = yield* kernel.run(pinger)
        return { first: view(first), second: view(second), parent: view(parent), parked: view(parked) }
      }).pipe(Effect.provide(TestKernel.layer({
        agents: [chat, family.researcher, family.summarizer, pinger],
        policies: { pinger: policy },
        settings: { random: () => 0 },
        transport
      })))
    }
    return Effect.gen(function*() {
      const direct = yield* observe("direct")
      const http = yield* observe("http")
      expect(direct.second.output).toEqual({ turns: 2, last: "b" })
      expect(direct.second.calls.map((c) => c[0])).toEqual(["getExecution", "previous", "completeExecution"])
      expect(direct.parent.calls.map((c) => `${c[0]}:${c[5]}`)).toEqual([
        "getExecution:ok",
        "submitStep:proceed",
        "submitStep:proceed",
        "suspend:ok",
        "getExecution:ok",
        "submitStep:replay",
        "submitStep:replay",
        "completeExecution:ok"
      ])
      expect(direct.parked.deliveries).toBe(2)
      expect(direct).toEqual(http)
    })
  })

  for (const transport of ["direct", "http"] as const) {
    it.effect(`the agent's metadata is published on its first delivery (transport: ${transport})`, () => {
      const agent = Agent.make({
        id: "described",
        description: "Echoes a prompt",
        input: Schema.Struct({ prompt: Schema.String }),
        output: Schema.String,
        handler: ({ prompt }) => Effect.succeed(prompt)
      })
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        expect((yield* kernel.core.getAgent("described")).metadata).toBeUndefined()
        const run = yield* kernel.run(agent, { prompt: "hi" })
        expect(run.output).toBe("hi")
        const metadata = (yield* kernel.core.getAgent("described")).metadata!
        expect(metadata.description).toBe("Echoes a prompt")
        expect(JSON.parse(metadata.inputSchemaRaw!)).toMatchObject({
          type: "object",
          properties: { prompt: { type: "string" } },
          required: ["prompt"]
        })
        expect(JSON.parse(metadata.outputSchemaRaw!)).toMatchObject({ type: "string" })
        // Not an execution's call: the call log does not list it.
        expect(run.calls.map((c) => c.call)).toEqual(["getExecution", "completeExecution"])
      }).pipe(Effect.provide(TestKernel.layer({ agents: [agent], transport })))
    })

    it.effect(`a seed-stage kit has no metadata route: the agent runs on (transport: ${transport})`, () => {
      const agent = Agent.make({ id: "described", description: "Echoes", handler: () => Effect.succeed("ok") })
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const run = yield* kernel.run(agent)
        expect(run.status).toBe("completed")
        expect((yield* kernel.core.getAgent("described")).metadata).toBeUndefined()
      }).pipe(Effect.provide(TestKernel.layer({ agents: [agent], transport, stage: "seed" })))
    })
  }

  it.effect("the dispatcher polls every 250 ms: delivery backoff lands on the second (the seed stage's 2 s grid rounds it)", () =>
    Effect.gen(function*() {
      const at = (e: { readonly occurredAt: string }) => Date.parse(e.occurredAt)
      const kernel = yield* TestKernel.TestKernel
      yield* kernel.core.registerAgent({ id: "ghost", webhookUrl: "http://ghost.invalid/webhook", secret: "s" })
      const run = yield* kernel.run("ghost", {})
      expect([run.status, run.failureReason]).toEqual(["failed", "dispatch_exhausted"])
      const tail = run.events.slice(3)
      expect(tail.map((e) => e.type)).toEqual([
        "dispatch.failed",
        "dispatch.failed",
        "dispatch.failed",
        "dispatch.failed",
        "dispatch.failed",
        "execution.failed"
      ])
      // backoff 1 s, 2 s, 4 s, 8 s (no jitter)
      expect(tail.map((e) => at(e) - at(tail[0]!))).toEqual([0, 1_000, 3_000, 7_000, 15_000, 15_000])
    }).pipe(Effect.provide(TestKernel.layer({ settings: { random: () => 0 } }))))

  it.effect("a failed delivery records the cause the kernel's HTTP deliverer gives (DeliveryError on dispatch.failed)", () => {
    const { hello } = makeWorld()
    const causes = (run: TestKernel.RunResult) =>
      run.events.filter((e) => e.type === "dispatch.failed").map((e) => (e.payload as { readonly error?: unknown }).error)
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      // An injected webhook failure is a 500 answer.
      yield* kernel.failWebhooks("hello", { times: 1 })
      const retried = yield* kernel.run(hello, { query: "a b" })
      expect(retried.status).toBe("completed")
      expect(causes(retried)).toEqual([
        { message: "the agent answered 500 Internal Server Error", reason: "http_status", status: 500 }
      ])
      // The agent's own answer: with another secret than the agent's, it rejects the signature.
      const registered = yield* kernel.core.getAgent("hello")
      yield* kernel.core.registerAgent({ id: "hello", webhookUrl: registered.webhookUrl, secret: "not-the-agent's" })
      const rejected = yield* kernel.run(hello, { query: "a b" })
      expect([rejected.status, rejected.failureReason]).toEqual(["failed", "dispatch_exhausted"])
      expect(causes(rejected)[0]).toEqual({
        message: "the agent answered 401 Unauthorized",
        reason: "http_status",
        status: 401
      })
      // An agent no process serves: nothing listens at its webhook URL.
      yield* kernel.core.registerAgent({ id: "ghost", webhookUrl: "http://ghost.invalid/webhook", secret: "s" })
      const ghost = yield* kernel.run("ghost", {})
      expect(new Set(causes(ghost).map((c) => JSON.stringify(c)))).toEqual(
        new Set([JSON.stringify({ message: "connection refused", reason: "connection_refused" })])
      )
    }).pipe(Effect.provide(TestKernel.layer({ agents: [hello], settings: { random: () => 0 } })))
  })

  it.effect("API keys: the kit's Client has full access with the bootstrap token; a key's client has its scopes", () => {
    const { chat } = makeChat()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const admin = yield* Client.Client
      const run = yield* kernel.run(chat, { message: "hi" })
      const key = yield* admin.createApiKey({ name: "reader", scopes: ["executions:read"] })
      expect(key.scopes).toEqual(["executions:read"])
      const reader = yield* kernel.client({ apiKey: key.token })
      expect((yield* reader.get(run.executionId)).status).toBe("completed")
      const forbidden = yield* Effect.flip(reader.create("chat", { message: "no" }))
      expect(forbidden).toMatchObject({ status: 403, code: "forbidden" })
      const anonymous = yield* kernel.client()
      expect(yield* Effect.flip(anonymous.get(run.executionId))).toMatchObject({ status: 401, code: "unauthorized" })
      const rotated = yield* admin.rotateApiKey(key.id)
      expect(yield* Effect.flip(reader.get(run.executionId))).toMatchObject({ status: 401 })
      const renewed = yield* kernel.client({ apiKey: rotated.token })
      expect((yield* renewed.get(run.executionId)).id).toBe(run.executionId)
      yield* admin.deleteApiKey(key.id)
      expect(yield* Effect.flip(renewed.get(run.executionId))).toMatchObject({ status: 401 })
      expect((yield* admin.listApiKeys()).map((k) => [k.name, k.revokedAt !== undefined])).toEqual([["reader", true]])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [chat], apiToken: "bootstrap-token" })))
  })

  it.effect("API keys without a bootstrap token: the kit stays open, a key is still checked", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const admin = yield* Client.Client
      const key = yield* admin.createApiKey({ name: "approver", scopes: ["approvals:read"] })
      const approver = yield* kernel.client({ apiKey: key.token })
      expect(yield* approver.listApprovals()).toEqual([])
      expect(yield* Effect.flip(approver.listAgents())).toMatchObject({ status: 403 })
      expect(yield* Effect.flip((yield* kernel.client({ apiKey: "rbk_nope" })).listApprovals())).toMatchObject({
        status: 401
      })
    }).pipe(Effect.provide(TestKernel.layer())))
})

describe("RunResult: steps in call order, a typed output, no empty failure reason", () => {
  const letters = ["h", "g", "f", "e", "d", "c", "b", "a"]
  /** Eight steps one after the other: their ids sort in no particular order. */
  const makeSpeller = () => {
    const say = Tool.make("say", {
      args: Schema.Struct({ letter: Schema.String }),
      success: Schema.String,
      execute: ({ letter }) => Effect.succeed(letter)
    })
    return Agent.make({
      id: "speller",
      output: Schema.Struct({ word: Schema.String }),
      handler: () => Effect.map(Effect.forEach(letters, (letter) => say({ letter })), (said) => ({ word: said.join("") }))
    })
  }

  it.effect("steps come in the order they were first submitted, each with its sequence, the same on every run", () => {
    const speller = makeSpeller()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const first = yield* kernel.run(speller)
      expect(first.steps.map((s) => [s.sequence, s.args])).toEqual(letters.map((letter, i) => [i, { letter }]))
      // a second execution, and one that crashed mid-run and replayed: the same order
      const again = yield* kernel.run(speller)
      const crashed = yield* kernel.run(speller, undefined, { crash: { afterSteps: 3 } })
      expect(crashed.crashed).toBe(true)
      for (const run of [again, crashed]) {
        expect(run.steps.map((s) => [s.sequence, s.target, s.args])).toEqual(
          first.steps.map((s) => [s.sequence, s.target, s.args])
        )
      }
      // the kernel's own listing stays sorted by step id
      const listed = yield* kernel.steps(first.executionId)
      expect(listed.map((s) => s.stepId)).toEqual(first.steps.map((s) => s.stepId).sort())
    }).pipe(Effect.provide(TestKernel.layer({ agents: [speller] })))
  })

  it.effect("concurrent steps: the order the kernel saw their first submissions", () => {
    const wait = Tool.make("wait", {
      args: Schema.Struct({ ms: Schema.Number }),
      success: Schema.Number,
      execute: ({ ms }) => Effect.as(Effect.sleep(ms), ms)
    })
    const agent = Agent.make({
      id: "fan-out",
      handler: () =>
        Effect.gen(function*() {
          // the first three start together; the last one after the slowest
          yield* Effect.all([wait({ ms: 30 }), wait({ ms: 10 }), wait({ ms: 20 })], { concurrency: "unbounded" })
          return yield* wait({ ms: 1 })
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent)
      const proposed = run.events.filter((e) => e.type === "step.proposed").map((e) =>
        (e.payload as { step_id: string }).step_id
      )
      expect(run.steps.map((s) => s.stepId)).toEqual(proposed)
      expect(run.steps.map((s) => s.sequence)).toEqual([0, 1, 2, 3])
      expect(run.steps[3]!.args).toEqual({ ms: 1 })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent] })))
  })

  it.effect("kernel.run types the output by the agent and decodes it with the agent's output Schema", () => {
    const speller = makeSpeller()
    // an output Schema whose encoding is not the value: a number sent as a string
    const counter = Agent.make({
      id: "counter",
      output: Schema.Struct({ total: Schema.NumberFromString }),
      handler: () => Effect.succeed({ total: 42 })
    })
    const untyped = Agent.make({ id: "untyped", handler: () => Effect.succeed({ n: 1 }) })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const spelled = yield* kernel.run(speller)
      expectTypeOf(spelled.output).toEqualTypeOf<{ readonly word: string } | undefined>()
      expect(spelled.output?.word).toBe(letters.join(""))

      const counted = yield* kernel.run(counter)
      expectTypeOf(counted.output).toEqualTypeOf<{ readonly total: number } | undefined>()
      expect(counted.output).toEqual({ total: 42 })
      // the JSON as recorded
      expect(counted.execution.output).toEqual({ total: "42" })

      const inferred = yield* kernel.run(untyped)
      expectTypeOf(inferred.output).toEqualTypeOf<{ n: number } | undefined>()
      expect(inferred.output).toEqual({ n: 1 })

      // by id: the parsed JSON, unknown
      const byId = yield* kernel.run("counter")
      expectTypeOf(byId.output).toEqualTypeOf<unknown>()
      expect(byId.output).toEqual({ total: "42" })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [speller, counter, untyped] })))
  })

  it.effect("failureReason is absent when there is none, present when the execution failed", () => {
    const speller = makeSpeller()
    const failing = Agent.make({ id: "failing", handler: () => Effect.fail(new Error("boom")) })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const done = yield* kernel.run(speller)
      expect(done.status).toBe("completed")
      expect("failureReason" in done).toBe(false)
      expect(done.failureReason).toBeUndefined()
      const failed = yield* kernel.run(failing)
      expect([failed.status, failed.failureReason]).toEqual(["failed", "agent_error: Error: boom"])
      expect(failed.output).toBeUndefined()
    }).pipe(Effect.provide(TestKernel.layer({ agents: [speller, failing] })))
  })
})
