/**
 * Every refusal as the handler sees it (PROTOCOL.md 7.2, 7.6, 14.5, 14.6):
 * `PolicyError`, `RateLimited` and `Blocked` through `Effect.catchTag`, the
 * exact failure reasons posted when they are not handled, `Tool.denialAsText`,
 * and the suspension backstop.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { Agent, Step, Tool } from "effect-rebuno"
import type { Blocked, PolicyError, RateLimited } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"
import { observe, payloads, yaml } from "./_harness.js"

const makeTools = () => {
  const ran: Array<string> = []
  const tool = (name: string) =>
    Tool.make(name, {
      args: Schema.Struct({ n: Schema.Number }),
      success: Schema.Struct({ ok: Schema.Boolean }),
      execute: () => Effect.sync(() => (ran.push(name), { ok: true }))
    })
  return { ran, search: tool("search"), shell: tool("shell"), deploy: tool("deploy") }
}

const policy = yaml(
  "default_action: allow",
  "rules:",
  "  - { id: no-shell, priority: 1, when: { target: shell }, then: { decision: deny, reason: shell is off } }",
  "  - { id: silent, priority: 2, when: { target: search }, then: { decision: deny } }",
  "  - id: limited",
  "    priority: 3",
  "    when: { target: deploy }",
  "    then: { decision: allow, rate_limit: { max_calls: 1, window: 1h } }"
)

describe("refusals as typed errors", () => {
  it.effect("PolicyError carries the rule's reason, the step id and the target (the kernel sends no rule id)", () => {
    const tools = makeTools()
    const agent = Agent.make({
      id: "catcher",
      handler: () =>
        tools.shell({ n: 1 }).pipe(
          Effect.as<unknown>("ran"),
          Effect.catchTag("PolicyError", (e: PolicyError) =>
            Effect.succeed({ tag: e._tag, reason: e.reason, ruleId: e.ruleId ?? null, stepId: e.stepId, target: e.target }))
        )
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent)
      expect(run.status).toBe("completed")
      const step = run.steps[0]!
      expect(run.output).toEqual({ tag: "PolicyError", reason: "shell is off", ruleId: null, stepId: step.stepId, target: "shell" })
      expect(step.status).toBe("denied")
      expect(step.error).toEqual({ reason: "shell is off", rule_id: "no-shell" })
      expect(tools.ran).toEqual([])
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [agent], policies: { catcher: policy } })))
  })

  it.effect("an unhandled denial fails the execution with policy_denied: <reason>", () => {
    const tools = makeTools()
    const agent = Agent.make({ id: "plain", handler: () => tools.shell({ n: 1 }) })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent)
      expect(run.status).toBe("failed")
      expect(run.failureReason).toBe("policy_denied: shell is off")
      expect(payloads(run.events, "execution.failed")).toEqual([
        { execution_id: run.executionId, reason: "policy_denied: shell is off", status: "failed" }
      ])
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [agent], policies: { plain: policy } })))
  })

  it.effect("a reason that looks like a token (^[a-z0-9_]+$) is posted as is, without the policy_denied: prefix", () => {
    const tools = makeTools()
    const agent = Agent.make({ id: "plain", handler: () => tools.shell({ n: 1 }) })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent)
      expect(run.failureReason).toBe("maintenance_window")
    }).pipe(Effect.provide(TestKernel.layer({
      stage: "seed",
      agents: [agent],
      policies: { plain: yaml("rules:", "  - { id: m, when: { target: shell }, then: { decision: deny, reason: maintenance_window } }") }
    })))
  })

  it.effect("a rule without reason: fresh denial says 'denied by policy', stored and replayed reason is policy_denied", () => {
    const tools = makeTools()
    const catching = Agent.make({
      id: "catching",
      handler: () =>
        tools.search({ n: 1 }).pipe(
          Effect.as("ran"),
          Effect.catchTag("PolicyError", (e) => Effect.succeed(e.reason))
        )
    })
    const plain = Agent.make({ id: "plain", handler: () => tools.search({ n: 1 }) })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const unhandled = yield* kernel.run(plain)
      expect(unhandled.status).toBe("failed")
      expect(unhandled.failureReason).toBe("policy_denied: denied by policy")
      expect(unhandled.steps[0]!.error).toEqual({ reason: "policy_denied", rule_id: "silent" })
      expect(payloads(unhandled.events, "step.denied")[0]).toEqual({
        error: { reason: "policy_denied", rule_id: "silent" },
        rule_id: "silent",
        step_id: unhandled.steps[0]!.stepId,
        step_type: "tool_call",
        target: "search"
      })

      // first run: fresh denial (no reason on the wire); it dies before posting its outcome, and the
      // redelivered run gets the stored denial replayed with reason "policy_denied"
      const replayed = yield* kernel.run(catching, undefined, {
        crash: { call: "completeExecution", index: 0, when: "before" }
      })
      expect(replayed.status).toBe("completed")
      expect(replayed.deliveries).toBe(2)
      expect(replayed.output).toBe("policy_denied")
      const fresh = yield* kernel.run(catching)
      expect(fresh.output).toBe("denied by policy")
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [plain, catching], policies: { plain: policy, catching: policy } })))
  })

  it.effect("a replayed denial without reason fails an unhandled run with the token policy_denied", () => {
    const tools = makeTools()
    const agent = Agent.make({ id: "plain", handler: () => tools.search({ n: 1 }) })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent, undefined, { crash: { call: "failExecution", index: 0, when: "before" } })
      expect(run.status).toBe("failed")
      expect(run.failureReason).toBe("policy_denied")
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [agent], policies: { plain: policy } })))
  })

  it.effect("default deny fails an unhandled run with policy_denied: no explicit allow rule matched", () => {
    const tools = makeTools()
    const agent = Agent.make({ id: "plain", handler: () => tools.deploy({ n: 1 }) })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent)
      expect(run.failureReason).toBe("policy_denied: no explicit allow rule matched")
      expect(run.steps[0]!.error).toEqual({ reason: "no explicit allow rule matched", rule_id: "default" })
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [agent], policies: { plain: "default_action: deny\n" } })))
  })

  it.effect("RateLimited carries the reason; unhandled it fails the run with rate_limit_exceeded", () => {
    const tools = makeTools()
    const catching = Agent.make({
      id: "catching",
      handler: () =>
        Effect.gen(function*() {
          yield* tools.deploy({ n: 1 })
          return yield* tools.deploy({ n: 2 }).pipe(
            Effect.as<unknown>("ran"),
            Effect.catchTag("RateLimited", (e: RateLimited) =>
              Effect.succeed({ tag: e._tag, reason: e.reason, target: e.target }))
          )
        })
    })
    const plain = Agent.make({
      id: "plain",
      handler: () => Effect.andThen(tools.deploy({ n: 1 }), tools.deploy({ n: 2 }))
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const caught = yield* kernel.run(catching)
      expect(caught.output).toEqual({ tag: "RateLimited", reason: "rate_limit_exceeded", target: "deploy" })
      const failed = yield* kernel.run(plain)
      expect(failed.status).toBe("failed")
      expect(failed.failureReason).toBe("rate_limit_exceeded")
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [catching, plain], policies: { catching: policy, plain: policy } })))
  })

  it.effect("Tool.denialAsText hands the model '<name> not allowed. reason: <reason>' instead of failing", () => {
    const tools = makeTools()
    const shell = Tool.denialAsText(tools.shell)
    const search = Tool.denialAsText(tools.search)
    const deploy = Tool.denialAsText(tools.deploy)
    const agent = Agent.make({
      id: "llm-loop",
      handler: () =>
        Effect.gen(function*() {
          const a = yield* shell({ n: 1 })
          const b = yield* search({ n: 1 })
          const c = yield* deploy({ n: 1 })
          return [a, b, c]
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent)
      expect(run.status).toBe("completed")
      expect(run.output).toEqual([
        "shell not allowed. reason: shell is off",
        "search not allowed. reason: denied by policy",
        { ok: true }
      ])
      expect(tools.ran).toEqual(["deploy"])
      expect(shell.name).toBe("shell")
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [agent], policies: { "llm-loop": policy } })))
  })

  it.effect("denials of local steps still raise PolicyError (14.6)", () => {
    const agent = Agent.make({ id: "local", handler: () => Step.run("roll", Effect.succeed(4)) })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent)
      expect(run.status).toBe("failed")
      expect(run.failureReason).toBe("policy_denied: no dice")
    }).pipe(Effect.provide(TestKernel.layer({
      stage: "seed",
      agents: [agent],
      policies: { local: yaml("rules:", "  - { id: dice, when: { target: roll }, then: { decision: deny, reason: no dice } }") }
    })))
  })
})

describe("the same refusals over the signed wire (transport: http)", () => {
  it.effect("denied (with and without reason), rate_limited and blocked decode to the same typed errors", () => {
    const tools = makeTools()
    const agent = Agent.make({
      id: "wire",
      handler: () =>
        Effect.forEach(
          [tools.shell({ n: 1 }), tools.search({ n: 1 }), tools.deploy({ n: 1 }), tools.deploy({ n: 2 }), tools.search({ n: 2 })],
          (call) =>
            call.pipe(
              Effect.as("ran"),
              Effect.catchTags({
                PolicyError: (e) => Effect.succeed(`PolicyError: ${e.reason} (${e.target})`),
                RateLimited: (e) => Effect.succeed(`RateLimited: ${e.reason} (${e.target})`)
              })
            )
        )
    })
    const gated = Agent.make({
      id: "gated",
      handler: () => tools.deploy({ n: 9 }).pipe(Effect.catchTag("Blocked", (e) => Effect.succeed(e.approvalId ?? "none")))
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent)
      expect(run.output).toEqual([
        "PolicyError: shell is off (shell)",
        "PolicyError: denied by policy (search)",
        "ran",
        "RateLimited: rate_limit_exceeded (deploy)",
        "PolicyError: denied by policy (search)"
      ])
      const blocked = yield* kernel.run(gated)
      expect(blocked.status).toBe("blocked")
      expect(blocked.approvals.map((a) => a.id)).toHaveLength(1)
    }).pipe(Effect.provide(TestKernel.layer({
      stage: "seed",
      agents: [agent, gated],
      transport: "http",
      policies: {
        wire: policy,
        gated: yaml("rules:", "  - { id: g, when: { target: deploy }, then: { decision: require_approval } }")
      }
    })))
  })
})

describe("Blocked and the suspension backstop", () => {
  const gate = yaml(
    "default_action: allow",
    "rules:",
    "  - { id: gate, when: { target: deploy }, then: { decision: require_approval } }"
  )

  it.effect("a handler that catches Blocked and returns a value posts nothing; the run stays blocked", () => {
    const tools = makeTools()
    const seen: Array<Blocked> = []
    const agent = Agent.make({
      id: "swallower",
      handler: () =>
        tools.deploy({ n: 1 }).pipe(
          Effect.as("deployed"),
          Effect.catchTag("Blocked", (e) => Effect.sync(() => (seen.push(e), "swallowed")))
        )
    })
    return Effect.gen(function*() {
      const observed = yield* observe(agent, { policy: gate })
      const id = (yield* observed.kit.core.createExecution({ agentId: agent.id, inputRaw: "{}", agentVersion: undefined })).id
      yield* observed.tick
      yield* observed.idle
      const approvals = yield* observed.kit.approvals(id)
      expect(approvals).toHaveLength(1)
      expect(seen).toHaveLength(1)
      expect(seen[0]!._tag).toBe("Blocked")
      expect(seen[0]!.approvalId).toBe(approvals[0]!.id)
      expect(seen[0]!.stepId).toBe(approvals[0]!.stepId)
      // nothing posted: no complete, no fail
      expect(observed.posts()).toEqual([])
      expect(observed.log.map((c) => `${c.call}:${c.outcome}`)).toEqual(["submitStep:blocked"])
      const execution = yield* observed.kit.execution(id)
      expect(execution.status).toBe("blocked")
      const events = yield* observed.kit.events(id)
      expect(events.map((e) => e.type)).not.toContain("execution.completed")
      expect(events.at(-1)!.type).toBe("execution.blocked")

      // once granted, the rerun proceeds and completes normally
      yield* observed.kit.grant(approvals[0]!.id)
      yield* observed.tick
      yield* observed.idle
      expect(observed.posts()).toEqual([
        { call: "completeExecution", target: undefined, outcome: "ok", detail: "\"deployed\"" }
      ])
      expect((yield* observed.kit.execution(id)).status).toBe("completed")
      expect(tools.ran).toEqual(["deploy"])
    }).pipe(Effect.scoped, Effect.provide(TestKernel.layer({ stage: "seed" })))
  })
})
