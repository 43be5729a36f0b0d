/**
 * Rate limits end to end (PROTOCOL.md 10.5, 7.3 step 12): the token bucket
 * refilling on the TestClock, the execution / agent / global scopes across
 * executions and agents, refusals that record nothing, limiter errors, and
 * limits on non-allow rules.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import { Agent, Tool } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"
import { makeProbe, yaml } from "./_harness.js"

const limited = (perWhat: string | undefined, extra: ReadonlyArray<string> = []) =>
  yaml(
    "default_action: allow",
    "rules:",
    "  - id: ping-limit",
    "    when: { target: ping }",
    "    then:",
    "      decision: allow",
    `      rate_limit: { max_calls: 2, window: 1m${perWhat === undefined ? "" : `, per_what: ${perWhat}`}${
      extra.length === 0 ? "" : ", " + extra.join(", ")
    } }`
  )

const pings = (n: number) => ({ calls: Array.from({ length: n }, (_, i) => ({ target: "ping", args: { i } })) })
const ok = "allow"
const limitedOut = "rate_limited: rate_limit_exceeded"

const alpha = makeProbe("alpha")
const beta = makeProbe("beta")

const outcomes = (agentId: string, n: number) =>
  Effect.flatMap(TestKernel.TestKernel, (kernel) =>
    Effect.map(kernel.run(agentId, pings(n)), (run) => {
      expect(run.status).toBe("completed")
      return run.output as ReadonlyArray<string>
    }))

describe("rate limits", () => {
  it.effect("token bucket: 2 per minute; the third call is refused; 30 s later exactly one more is allowed", () => {
    let calls = 0
    const ping = Tool.make("ping", {
      args: Schema.Struct({ i: Schema.Number }),
      success: Schema.Number,
      execute: ({ i }) => Effect.sync(() => (calls++, i))
    })
    const tryPing = (i: number) =>
      ping({ i }).pipe(
        Effect.as(ok),
        Effect.catchTag("RateLimited", (e) => Effect.succeed(`rate_limited: ${e.reason}`))
      )
    const agent = Agent.make({
      id: "pinger",
      handler: () =>
        Effect.gen(function*() {
          const first = yield* Effect.forEach([0, 1, 2], tryPing)
          // virtual time: the test kit moves the TestClock while the run only waits on it
          yield* Effect.sleep(Duration.seconds(30))
          const later = yield* Effect.forEach([3, 4], tryPing)
          return [...first, ...later]
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent)
      expect(run.output).toEqual([ok, ok, limitedOut, ok, limitedOut])
      expect(calls).toBe(3)
      // refused submissions record nothing: three steps, three proposals
      expect(run.steps.map((s) => s.args)).toEqual(expect.arrayContaining([{ i: 0 }, { i: 1 }, { i: 3 }]))
      expect(run.steps).toHaveLength(3)
      expect(run.events.filter((e) => e.type === "step.proposed")).toHaveLength(3)
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [agent], policies: { pinger: limited(undefined) } })))
  })

  it.effect("TestClock.adjust between executions refills an agent-wide bucket at max_calls per window", () =>
    Effect.gen(function*() {
      expect(yield* outcomes("alpha", 3)).toEqual([ok, ok, limitedOut])
      expect(yield* outcomes("alpha", 1)).toEqual([limitedOut])
      yield* TestClock.adjust(Duration.seconds(30))
      expect(yield* outcomes("alpha", 2)).toEqual([ok, limitedOut])
      yield* TestClock.adjust(Duration.minutes(5))
      // capacity caps the refill
      expect(yield* outcomes("alpha", 3)).toEqual([ok, ok, limitedOut])
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [alpha], policies: { alpha: limited("agent") } }))))

  it.effect("per_what: execution (default) gives every execution its own bucket", () =>
    Effect.gen(function*() {
      expect(yield* outcomes("alpha", 3)).toEqual([ok, ok, limitedOut])
      expect(yield* outcomes("alpha", 3)).toEqual([ok, ok, limitedOut])
      expect(yield* outcomes("beta", 2)).toEqual([ok, ok])
    }).pipe(Effect.provide(TestKernel.layer({
      stage: "seed",
      agents: [alpha, beta],
      policies: { alpha: limited(undefined), beta: limited("execution") }
    }))))

  it.effect("per_what: agent shares one bucket across the agent's executions, not across agents", () =>
    Effect.gen(function*() {
      expect(yield* outcomes("alpha", 1)).toEqual([ok])
      expect(yield* outcomes("alpha", 2)).toEqual([ok, limitedOut])
      expect(yield* outcomes("beta", 3)).toEqual([ok, ok, limitedOut])
    }).pipe(Effect.provide(TestKernel.layer({
      stage: "seed",
      agents: [alpha, beta],
      policies: { alpha: limited("agent"), beta: limited("agent") }
    }))))

  it.effect("per_what: global shares one bucket across agents whose rules have the same id", () =>
    Effect.gen(function*() {
      expect(yield* outcomes("alpha", 1)).toEqual([ok])
      expect(yield* outcomes("beta", 2)).toEqual([ok, limitedOut])
      expect(yield* outcomes("alpha", 1)).toEqual([limitedOut])
    }).pipe(Effect.provide(TestKernel.layer({
      stage: "seed",
      agents: [alpha, beta],
      policies: { alpha: limited("global"), beta: limited("global") }
    }))))

  it.effect("a refused submission records nothing and writes no event", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run("alpha", pings(4))
      expect(run.output).toEqual([ok, ok, limitedOut, limitedOut])
      expect(run.steps).toHaveLength(2)
      expect(run.events.map((e) => e.type)).toEqual([
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
    }).pipe(Effect.provide(TestKernel.layer({ stage: "seed", agents: [alpha], policies: { alpha: limited(undefined) } }))))

  it.effect("limits apply to deny rules too: after max_calls denials come rate_limited answers", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run("alpha", { calls: [{ target: "rm" }, { target: "rm" }, { target: "rm" }] })
      expect(run.output).toEqual(["deny: never", "rate_limited: rate_limit_exceeded", "rate_limited: rate_limit_exceeded"])
      expect(run.steps.map((s) => s.status)).toEqual(["denied"])
    }).pipe(Effect.provide(TestKernel.layer({
      stage: "seed",
      agents: [alpha],
      policies: {
        alpha: yaml(
          "rules:",
          "  - id: no-rm",
          "    when: { target: rm }",
          "    then: { decision: deny, reason: never, rate_limit: { max_calls: 1, window: 1h } }"
        )
      }
    }))))

  it.effect("a limit is active only with max_calls > 0 and window > 0", () =>
    Effect.gen(function*() {
      expect(yield* outcomes("alpha", 4)).toEqual([ok, ok, ok, ok])
      expect(yield* outcomes("beta", 4)).toEqual([ok, ok, ok, ok])
    }).pipe(Effect.provide(TestKernel.layer({
      stage: "seed",
      agents: [alpha, beta],
      policies: {
        alpha: yaml("rules:", "  - { id: r, when: { target: ping }, then: { decision: allow, rate_limit: { max_calls: 1, window: 0s } } }"),
        beta: yaml("rules:", "  - { id: r, when: { target: ping }, then: { decision: allow, rate_limit: { max_calls: 0, window: 1m } } }")
      }
    }))))

  it.effect("a failing limiter: on_limiter_error deny → rate_limiter_unavailable; allow (default) fails open", () => {
    const strict = Agent.make({
      id: "strict",
      handler: () =>
        Tool.make("ping", { args: Schema.Struct({}), success: Schema.Null, execute: () => Effect.succeed(null) })({})
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      yield* kernel.core.updateSettings({ limiterError: true })
      const failed = yield* kernel.run(strict)
      expect(failed.status).toBe("failed")
      expect(failed.failureReason).toBe("rate_limiter_unavailable")
      expect(failed.steps).toHaveLength(0)
      expect(yield* outcomes("alpha", 3)).toEqual([ok, ok, ok])
    }).pipe(Effect.provide(TestKernel.layer({
      stage: "seed",
      agents: [strict, alpha],
      policies: { strict: limited(undefined, ["on_limiter_error: deny"]), alpha: limited(undefined) }
    })))
  })
})
