/**
 * Governance end to end in the current stage (PROTOCOL-CURRENT C.8): the
 * decision's `rule_id` and reason reach `PolicyError` and the events, rules
 * decide in file order, rate limits park an execution once (it stays running
 * and is redelivered after the wait, on virtual time) and refuse after that,
 * token budgets read the `usage` of recorded LLM calls, a `judge` rule without
 * a judge denies, and approvals resume the execution only once nothing waits.
 * Every test runs over both of the kit's transports.
 */
import { describe, expect, it } from "@effect/vitest"
import { createHash } from "node:crypto"
import { Clock, Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import { Agent, Step, Tool } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"
import { makeProbe, payloads, types, yaml } from "./_harness.js"

const policyHash = (bundle: string) => createHash("sha256").update(bundle).digest("hex")

const transports = ["direct", "http"] as const

const makeTools = () => {
  const ran: Array<string> = []
  const tool = (name: string) =>
    Tool.make(name, {
      args: Schema.Struct({ n: Schema.Number }),
      success: Schema.Number,
      execute: ({ n }) => Effect.sync(() => (ran.push(`${name}:${n}`), n))
    })
  return { ran, shell: tool("shell"), sendEmail: tool("send_email"), ping: tool("ping"), deploy: tool("deploy") }
}

for (const transport of transports) {
  describe(`current-stage decisions (transport: ${transport})`, () => {
    const denyShell = yaml(
      "default_action: allow",
      "rules:",
      "  - { id: no-shell, when: { target: shell }, then: { decision: deny, reason: shell is off for today } }"
    )

    it.effect("a denial carries rule_id and the rule's prose reason: in PolicyError, the step, the events", () => {
      const tools = makeTools()
      const agent = Agent.make({
        id: "catcher",
        handler: () =>
          tools.shell({ n: 1 }).pipe(
            Effect.as("ran"),
            Effect.catchTag("PolicyError", (e) => Effect.succeed({ reason: e.reason, ruleId: e.ruleId, target: e.target }))
          )
      })
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const run = yield* kernel.run(agent)
        expect(run.status).toBe("completed")
        expect(run.output).toEqual({ reason: "shell is off for today", ruleId: "no-shell", target: "shell" })
        expect(tools.ran).toEqual([])
        const step = run.steps[0]!
        expect([step.status, step.error]).toEqual(["denied", { reason: "shell is off for today", rule_id: "no-shell" }])
        expect(types(run.events).slice(4)).toEqual(["step.proposed", "step.denied", "execution.completed"])
        expect(payloads(run.events, "step.denied")).toEqual([{
          step_id: step.stepId,
          step_type: "tool_call",
          target: "shell",
          rule_id: "no-shell",
          error: { reason: "shell is off for today", rule_id: "no-shell" },
          policy_hash: policyHash(denyShell)
        }])
        expect(run.calls.filter((c) => c.call === "submitStep").map((c) => c.answer)).toEqual(["denied"])
      }).pipe(Effect.provide(TestKernel.layer({ agents: [agent], policies: { catcher: denyShell }, transport })))
    })

    it.effect("an unhandled denial fails the run with policy_denied: <reason>; the replayed denial keeps its rule id", () => {
      const tools = makeTools()
      const agent = Agent.make({ id: "plain", handler: () => tools.shell({ n: 1 }) })
      const catching = Agent.make({
        id: "catching",
        handler: () => tools.shell({ n: 1 }).pipe(Effect.catchTag("PolicyError", (e) => Effect.succeed([e.reason, e.ruleId])))
      })
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const run = yield* kernel.run(agent)
        expect([run.status, run.failureReason]).toEqual(["failed", "policy_denied: shell is off for today"])
        // The first run dies before posting its outcome; the second gets the stored denial replayed.
        const replayed = yield* kernel.run(catching, undefined, {
          crash: { call: "completeExecution", index: 0, when: "before" }
        })
        expect(replayed.deliveries).toBe(2)
        expect(replayed.output).toEqual(["shell is off for today", "no-shell"])
        expect(replayed.calls.filter((c) => c.call === "submitStep").map((c) => c.answer)).toEqual(["denied", "denied"])
      }).pipe(Effect.provide(TestKernel.layer({
        agents: [agent, catching],
        policies: { plain: denyShell, catching: denyShell },
        transport
      })))
    })

    it.effect("rules decide in file order; the fallthrough is rule default, an unmatched local step rule local", () => {
      const policy = yaml(
        "default_action: deny",
        "rules:",
        "  - { id: no-mail, when: { target: \"send_*\" }, then: { decision: deny, reason: no mail } }",
        "  - { id: mail-ok, when: { target: send_email }, then: { decision: allow } }",
        "  - { id: deploys, when: { target: deploy }, then: { decision: allow } }"
      )
      const probe = makeProbe("probe")
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const run = yield* kernel.run(probe, {
          calls: [{ target: "send_email" }, { target: "deploy" }, { target: "shell" }, { kind: "local", target: "now" }]
        })
        expect(run.output).toEqual(["deny: no mail", "allow", "deny: no explicit allow rule matched", "allow"])
        const decided = run.events
          .filter((e) => e.type === "step.allowed" || e.type === "step.denied")
          .map((e) => `${(e.payload as any).target}:${(e.payload as any).rule_id}`)
        expect(decided).toEqual(["send_email:no-mail", "deploy:deploys", "shell:default", "now:local"])
      }).pipe(Effect.provide(TestKernel.layer({ agents: [probe], policies: { probe: policy }, transport })))
    })

    it.effect("a bundle with an unknown key (priority) is refused at load, and the agent's policy stays as it was", () => {
      const probe = makeProbe("probe")
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const refused = yield* Effect.flip(kernel.loadPolicy("probe", yaml(
          "default_action: allow",
          "rules:",
          "  - { id: a, priority: 1, when: { target: shell }, then: { decision: allow } }"
        )))
        expect([refused.status, refused.code]).toEqual([400, "validation_error"])
        const run = yield* kernel.run(probe, { calls: [{ target: "shell" }, { target: "deploy" }] })
        expect(run.output).toEqual(["deny: shell is off for today", "allow"])
      }).pipe(Effect.provide(TestKernel.layer({ agents: [probe], policies: { probe: denyShell }, transport })))
    })

    it.effect("a judge rule without a judge configured denies with reason judge not configured", () => {
      const probe = makeProbe("probe")
      const policy = yaml(
        "default_action: allow",
        "rules:",
        "  - id: ask-the-judge",
        "    when: { target: deploy }",
        "    then: { decision: judge, judge: { instructions: only safe deploys } }"
      )
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const run = yield* kernel.run(probe, { calls: [{ target: "deploy" }] })
        expect(run.output).toEqual(["deny: judge not configured"])
        expect(run.steps[0]!.error).toEqual({ reason: "judge not configured", rule_id: "ask-the-judge" })
      }).pipe(Effect.provide(TestKernel.layer({ agents: [probe], policies: { probe: policy }, transport })))
    })
  })

  describe(`current-stage rate limits and budgets (transport: ${transport})`, () => {
    const limited = (maxWait: string) =>
      yaml(
        "default_action: allow",
        "rules:",
        "  - id: ping-limit",
        "    when: { target: ping }",
        "    then:",
        "      decision: allow",
        `      rate_limit: { max_calls: 1, window: 1m, max_wait: ${maxWait} }`
      )

    const pinger = (id: string, count: number) => {
      const tools = makeTools()
      const agent = Agent.make({
        id,
        handler: () =>
          Effect.forEach(Array.from({ length: count }, (_, i) => i), (n) =>
            tools.ping({ n }).pipe(
              Effect.as("allow"),
              Effect.catchTag("RateLimited", (e) => Effect.succeed(`rate_limited: ${e.reason}`))
            ))
      })
      return { agent, tools }
    }

    it.effect("parking: the run ends with no outcome, the execution stays running, the redelivery comes after the wait", () => {
      const { agent, tools } = pinger("parker", 2)
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const id = yield* kernel.create("parker")
        // Drive by hand: one tick delivers the first run, which parks at its second step.
        yield* kernel.tick
        yield* Effect.gen(function*() {
          for (let i = 0; i < 50 && (yield* kernel.activeRuns) > 0; i++) {
            yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
          }
        })
        expect((yield* kernel.execution(id)).status).toBe("running")
        expect(tools.ran).toEqual(["ping:0"])
        const calls = yield* kernel.calls(id)
        expect(calls.map((c) => `${c.call}:${c.answer}`)).toEqual([
          "getExecution:ok",
          "submitStep:proceed",
          "completeStep:recorded",
          "submitStep:blocked"
        ])
        const dispatches = yield* kernel.core.dispatches(id)
        const now = yield* Clock.currentTimeMillis
        expect(dispatches.filter((d) => d.status === "pending").map((d) => d.nextAttemptAtMs - now)).toEqual([60_000])
        const done = yield* kernel.settle(id)
        expect(done.status).toBe("completed")
        expect(done.output).toEqual(["allow", "allow"])
        expect(tools.ran).toEqual(["ping:0", "ping:1"])
        expect(done.deliveries).toBe(2)
        expect(types(done.events)).not.toContain("execution.blocked")
        expect(payloads(done.events, "step.rate_limited")).toHaveLength(1)
      }).pipe(Effect.provide(TestKernel.layer({
        agents: [agent],
        policies: { parker: limited("5m") },
        settings: { random: () => 0 },
        transport
      })))
    })

    it.effect("an execution parks at most once: a later limit is refused as RateLimited", () => {
      const { agent, tools } = pinger("thrice", 3)
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const run = yield* kernel.run(agent)
        expect(run.status).toBe("completed")
        expect(run.output).toEqual(["allow", "allow", "rate_limited: rate_limit_exceeded"])
        expect(tools.ran).toEqual(["ping:0", "ping:1"])
        const limitedEvents = payloads(run.events, "step.rate_limited")
        expect(limitedEvents).toHaveLength(2)
        for (const payload of limitedEvents) {
          expect(payload).toMatchObject({
            target: "ping",
            rule_id: "ping-limit",
            error: { reason: "rate_limit_exceeded", rule_id: "ping-limit" }
          })
        }
        expect(run.calls.filter((c) => c.call === "submitStep").map((c) => c.answer)).toEqual([
          "proceed",
          "blocked",
          "replay",
          "proceed",
          "rate_limited"
        ])
        // The refused step left no step row.
        expect(run.steps).toHaveLength(2)
      }).pipe(Effect.provide(TestKernel.layer({
        agents: [agent],
        policies: { thrice: limited("5m") },
        settings: { random: () => 0 },
        transport
      })))
    })

    it.effect("a wait longer than max_wait is refused at once; unhandled, the run fails with rate_limit_exceeded", () => {
      const tools = makeTools()
      const agent = Agent.make({ id: "impatient", handler: () => Effect.forEach([0, 1], (n) => tools.ping({ n })) })
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const start = yield* Clock.currentTimeMillis
        const run = yield* kernel.run(agent)
        expect([run.status, run.failureReason, run.deliveries]).toEqual(["failed", "rate_limit_exceeded", 1])
        expect((yield* Clock.currentTimeMillis) - start).toBeLessThan(60_000)
        expect(payloads(run.events, "step.rate_limited")).toHaveLength(1)
      }).pipe(Effect.provide(TestKernel.layer({
        agents: [agent],
        policies: { impatient: limited("10s") },
        transport
      })))
    })

    it.effect("token budget: usage recorded on an llm_call step; once spent, the next call is denied", () => {
      const agent = Agent.make({
        id: "talker",
        handler: () =>
          Effect.forEach([0, 1], (n) =>
            Step.make({
              kind: "llm_call",
              target: "chat",
              args: { n },
              body: () => Effect.succeed({ id: `r${n}`, usage: { prompt_tokens: 80, completion_tokens: 30 } })
            }).pipe(
              Effect.as("allow"),
              Effect.catchTag("PolicyError", (e) => Effect.succeed(`deny: ${e.reason} (${e.ruleId})`))
            ))
      })
      const policy = yaml(
        "default_action: allow",
        "rules:",
        "  - { id: llm-budget, when: { step_kind: llm_call }, then: { decision: allow, budget: { max_tokens: 100 } } }"
      )
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const run = yield* kernel.run(agent)
        expect(run.output).toEqual(["allow", "deny: execution_token_budget_exceeded (llm-budget)"])
        expect(payloads(run.events, "step.succeeded")).toEqual([{
          step_id: run.steps.find((s) => s.status === "succeeded")!.stepId,
          step_type: "llm_call",
          target: "chat",
          usage: { input_tokens: 80, output_tokens: 30 }
        }])
        expect(run.steps.find((s) => s.status === "denied")!.error).toEqual({
          reason: "execution_token_budget_exceeded",
          rule_id: "llm-budget"
        })
      }).pipe(Effect.provide(TestKernel.layer({ agents: [agent], policies: { talker: policy }, transport })))
    })
  })

  describe(`current-stage approvals (transport: ${transport})`, () => {
    const policy = yaml(
      "default_action: allow",
      "rules:",
      "  - id: gate",
      "    when: { target: deploy }",
      "    then: { decision: require_approval, reason: deploys need a human, approval_config: { approvers: [ops] } }"
    )

    it.effect("require_approval: the events carry rule_id, reason and policy_hash; a grant resumes the run once", () => {
      const tools = makeTools()
      const agent = Agent.make({
        id: "shipper",
        handler: () => Effect.gen(function*() {
          const a = yield* tools.ping({ n: 1 })
          return yield* tools.deploy({ n: a + 1 })
        })
      })
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const blocked = yield* kernel.run(agent)
        expect(blocked.status).toBe("blocked")
        expect(blocked.approvals.map((a) => [a.approvers, a.status])).toEqual([[["ops"], "pending"]])
        const gated = blocked.steps.find((s) => s.target === "deploy")!
        expect(types(blocked.events).slice(8)).toEqual([
          "step.proposed",
          "step.awaiting_approval",
          "approval.requested",
          "execution.blocked"
        ])
        expect(payloads(blocked.events, "step.awaiting_approval")).toEqual([{
          step_id: gated.stepId,
          step_type: "tool_call",
          target: "deploy",
          rule_id: "gate",
          reason: "deploys need a human",
          policy_hash: policyHash(policy)
        }])
        expect(payloads(blocked.events, "execution.blocked")).toEqual([
          { execution_id: blocked.executionId, status: "blocked" }
        ])
        const submits = blocked.calls.filter((c) => c.call === "submitStep").map((c) => c.answer)
        expect(submits).toEqual(["proceed", "blocked"])
        yield* kernel.grant(blocked.approvals[0]!.id, { decidedBy: "ops" })
        const done = yield* kernel.settle(blocked.executionId)
        expect([done.status, done.output, done.deliveries]).toEqual(["completed", 2, 2])
        expect(tools.ran).toEqual(["ping:1", "deploy:2"])
        expect(types(done.events).filter((t) => t === "execution.resumed")).toHaveLength(1)
      }).pipe(Effect.provide(TestKernel.layer({ agents: [agent], policies: { shipper: policy }, transport })))
    })

    it.effect("an expired approval denies the step with approval_timeout; the handler catches it and goes on", () => {
      const tools = makeTools()
      const agent = Agent.make({
        id: "waiter",
        handler: () =>
          tools.deploy({ n: 1 }).pipe(Effect.catchTag("PolicyError", (e) => Effect.succeed([e.reason, e.ruleId ?? null])))
      })
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const blocked = yield* kernel.run(agent)
        expect(blocked.status).toBe("blocked")
        yield* TestClock.adjust("59 seconds")
        expect(yield* kernel.expireApprovals).toBe(0)
        yield* TestClock.adjust("1 second")
        // settle ticks the dispatcher, whose tick runs the expiry sweep
        const done = yield* kernel.settle(blocked.executionId)
        expect(done.status).toBe("completed")
        // The expiry records `{"reason":"approval_timeout"}` (C.8.7): the replayed denial has no rule id.
        expect(done.output).toEqual(["approval_timeout", null])
        expect(tools.ran).toEqual([])
        expect(payloads(done.events, "step.denied").map((p) => p.error)).toEqual([{ reason: "approval_timeout" }])
      }).pipe(Effect.provide(TestKernel.layer({
        agents: [agent],
        policies: { waiter: policy },
        settings: { approvalTimeoutMs: 60_000 },
        transport
      })))
    })
  })
}
