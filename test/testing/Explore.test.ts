import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { createHash } from "node:crypto"
import { Agent, Execution, Step, Tool } from "effect-rebuno"
import type { ToolError } from "effect-rebuno"
import { Explore, TestKernel } from "effect-rebuno/testing"
import { deployer } from "../../examples/approval.js"
import { hello as exampleHello } from "../../examples/hello.js"

/** The hello example's agent, with a count of every body execution. */
const makeHello = () => {
  const bodies: Record<string, number> = {}
  const count = (name: string) => (bodies[name] = (bodies[name] ?? 0) + 1)
  const reverse = Tool.make("reverse", {
    args: Schema.Struct({ text: Schema.String }),
    success: Schema.Struct({ reversed: Schema.String }),
    execute: ({ text }) => Effect.sync(() => (count("reverse"), { reversed: [...text].reverse().join("") }))
  })
  const wordCount = Tool.make("word_count", {
    args: Schema.Struct({ text: Schema.String }),
    success: Schema.Struct({ count: Schema.Number }),
    execute: ({ text }) => Effect.sync(() => (count("word_count"), { count: text.split(/\s+/).filter(Boolean).length }))
  })
  const agent = Agent.make({
    id: "hello",
    input: Schema.Struct({ query: Schema.String }),
    handler: ({ query }) =>
      Effect.gen(function*() {
        const { reversed } = yield* reverse({ text: query })
        const { count } = yield* wordCount({ text: query })
        return { query, reversed, word_count: count }
      })
  })
  return { agent, bodies }
}

/** Charges a card at most once; an unknown outcome is reported, not retried. */
const makeCheckout = (onIndeterminate: () => string = () => "unknown") => {
  let charges = 0
  const chargeCard = Tool.make("charge_card", {
    args: Schema.Struct({ amount: Schema.Number }),
    success: Schema.Struct({ receipt: Schema.String }),
    idempotency: "at_most_once",
    execute: ({ amount }) => Effect.sync(() => (charges++, { receipt: `r-${amount}` }))
  })
  const sendReceipt = Tool.make("send_receipt", {
    args: Schema.Struct({ receipt: Schema.String }),
    success: Schema.Boolean,
    execute: () => Effect.succeed(true)
  })
  const agent = Agent.make({
    id: "checkout",
    input: Schema.Struct({ amount: Schema.Number }),
    handler: ({ amount }) =>
      Effect.gen(function*() {
        const startedAt = yield* Step.now
        const charged = yield* chargeCard({ amount }).pipe(
          Effect.map(({ receipt }) => receipt),
          Effect.catchTag("ToolError", (e: ToolError) =>
            e.indeterminate ? Effect.succeed(onIndeterminate()) : Effect.fail(e))
        )
        const sent = yield* sendReceipt({ receipt: charged })
        return { startedAt, charged, sent }
      })
  })
  return { agent, charges: () => charges }
}

/** Puts the wall clock into a tool's arguments: the step id changes on every replay. */
const makeNonDeterministic = () => {
  const search = Tool.make("search", {
    args: Schema.Struct({ query: Schema.String, at: Schema.Number }),
    success: Schema.String,
    execute: ({ query }) => Effect.succeed(`results for ${query}`)
  })
  // reads something outside the recorded steps that changes between runs (a wall clock would, but two runs
  // can fall in the same millisecond on a fast kit: a counter always differs)
  let reads = 0
  return Agent.make({
    id: "clocky",
    input: Schema.Struct({ query: Schema.String }),
    handler: ({ query }) => search({ query, at: Date.now() * 1000 + ++reads })
  })
}

describe("Explore.crashes", () => {
  it.effect("the hello agent survives a crash at every step boundary and a lease lapse", () => {
    const hello = makeHello()
    return Effect.gen(function*() {
      const report = yield* Explore.crashes(hello.agent, { query: "hello durable world" })
      expect(report.baseline.status).toBe("completed")
      // before/after each of 2 submits and 2 completes, before the outcome post, plus the lapse
      expect(report.points.map((p) => p.description)).toEqual([
        "crash before submitStep #0 (step \"reverse\")",
        "crash after submitStep #0 (step \"reverse\")",
        "crash before completeStep #0 (step \"reverse\")",
        "crash after completeStep #0 (step \"reverse\")",
        "crash before submitStep #1 (step \"word_count\")",
        "crash after submitStep #1 (step \"word_count\")",
        "crash before completeStep #1 (step \"word_count\")",
        "crash after completeStep #1 (step \"word_count\")",
        "crash before completeExecution #0 (the outcome post)",
        "lease lapse before completeStep #1 (step \"word_count\")"
      ])
      expect(report.runs).toBe(11)
      for (const point of report.points) {
        expect(point.verdict).toBe("same")
        expect(point.output).toEqual({ query: "hello durable world", reversed: "dlrow elbarud olleh", word_count: 3 })
      }
      // a crash between proceed and complete re-runs the (safe) body once more
      const rerun = report.points.find((p) => p.description.startsWith("crash before completeStep #0"))!
      expect(rerun.bodyRuns.find((b) => b.target === "reverse")?.runs).toBe(2)
      const replayed = report.points.find((p) => p.description.startsWith("crash before completeExecution"))!
      expect(replayed.bodyRuns.map((b) => b.runs)).toEqual([1, 1])
      expect(replayed.deliveries).toBe(2)
      // 11 executions; the crashes between proceed and complete and the lapse re-ran one body each
      expect(hello.bodies).toEqual({ reverse: 11 + 1, word_count: 11 + 2 })

      yield* Explore.determinism(hello.agent, { query: "hello durable world" })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [hello.agent] })))
  })

  it.effect("an at_most_once charge never runs twice; Step.now replays its recorded time", () => {
    const checkout = makeCheckout()
    return Effect.gen(function*() {
      const report = yield* Explore.crashes(checkout.agent, { amount: 42 })
      const baseline = report.baseline.output as { startedAt: number }
      expect(report.baseline.output).toEqual({ startedAt: baseline.startedAt, charged: "r-42", sent: true })
      expect(report.points).toHaveLength(14)
      const inWindow = report.points.filter((p) => p.verdict === "indeterminate")
      expect(inWindow.map((p) => p.description)).toEqual([
        "crash after submitStep #1 (step \"charge_card\")",
        "crash before completeStep #1 (step \"charge_card\")"
      ])
      for (const point of inWindow) {
        expect(point.output).toEqual({ startedAt: baseline.startedAt, charged: "unknown", sent: true })
        expect(point.bodyRuns.find((b) => b.target === "charge_card")?.runs ?? 0).toBeLessThanOrEqual(1)
      }
      for (const point of report.points.filter((p) => p.verdict === "same")) {
        expect(point.output).toEqual(report.baseline.output)
      }
      // one charge per execution (1 + 14), except "after submit", where the proceed was lost
      expect(checkout.charges()).toBe(14)

      yield* Explore.determinism(checkout.agent, { amount: 42 })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [checkout.agent] })))
  })

  it.effect("with recovery: lease, time moves on and a normalize hook makes the outputs comparable", () => {
    const checkout = makeCheckout()
    return Effect.gen(function*() {
      const strict = yield* Effect.flip(Explore.crashes(checkout.agent, { amount: 7 }, { recovery: "lease" }))
      expect(strict.message).toMatch(
        /^crash before submitStep #0 \(step "now"\): output differed: expected \{"charged":"r-7","sent":true,"startedAt":\d+\} got \{"charged":"r-7","sent":true,"startedAt":\d+\}$/
      )
      const report = yield* Explore.crashes(checkout.agent, { amount: 7 }, {
        recovery: "lease",
        normalize: (output) => ({ ...(output as object), startedAt: "…" })
      })
      expect(report.points).toHaveLength(14)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [checkout.agent] })))
  })

  it.effect("catches a non-deterministic agent, by exploration and by the determinism check", () => {
    const agent = makeNonDeterministic()
    return Effect.gen(function*() {
      const error = yield* Effect.flip(Explore.determinism(agent, { query: "q" }))
      expect(error._tag).toBe("DeterminismError")
      expect(error.message).toMatch(
        /^the replay diverged from the original run at submit #0 \(tool_call "search"\): arguments differ: \$\.at: \d+ → \d+$/
      )
      if (error._tag === "DeterminismError") {
        expect(error.index).toBe(0)
        expect(error.differences).toHaveLength(1)
        expect(error.expected?.target).toBe("search")
      }

      const explored = yield* Effect.flip(Explore.crashes(agent, { query: "q" }))
      expect(explored._tag).toBe("CrashExplorationError")
      expect(explored.message).toMatch(
        /^crash (before|after) \w+ #\d+ \(.*\): the replay diverged from the uninterrupted run at submit #0 \(tool_call "search"\): arguments differ: \$\.at: \d+ → \d+$/
      )
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent] })))
  })

  it.effect("reports an agent that handles an indeterminate outcome differently each time", () => {
    let seen = 0
    // deliberately broken: the reaction to "outcome unknown" depends on a global counter
    const checkout = makeCheckout(() => (++seen % 2 === 1 ? "unknown" : "assumed charged"))
    return Effect.gen(function*() {
      const error = yield* Effect.flip(Explore.crashes(checkout.agent, { amount: 5 }))
      expect(error._tag).toBe("CrashExplorationError")
      if (error._tag !== "CrashExplorationError") return
      expect(error.message).toMatch(/^crash before completeStep #1 \(step "charge_card"\): output differed: /)
      expect(error.message).toContain("\"charged\":\"unknown\"")
      expect(error.message).toContain("\"charged\":\"assumed charged\"")
      expect(error.message).toContain(
        "(compared with crash after submitStep #1 (step \"charge_card\"), inside the same at_most_once step \"charge_card\""
      )
      expect(error.point).toEqual({ call: "completeStep", index: 1, when: "before" })

      // the point reproduces the failure on its own
      const kernel = yield* TestKernel.TestKernel
      const charged = checkout.charges()
      const again = yield* kernel.run(checkout.agent, { amount: 5 }, { crash: error.point!, recovery: "immediate" })
      expect(again.crashed).toBe(true)
      expect(again.steps.find((s) => s.target === "charge_card")?.error).toMatchObject({ reason: "indeterminate" })
      // the body ran (once) before the crash; the replay did not run it again
      expect(checkout.charges()).toBe(charged + 1)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [checkout.agent] })))
  })

  it.effect("reports an agent whose replay takes another path", () => {
    let runs = 0
    const step = Tool.make("step", {
      args: Schema.Struct({ n: Schema.Number }),
      success: Schema.Number,
      execute: ({ n }) => Effect.succeed(n)
    })
    // deliberately broken: a process-wide counter leaks into the arguments
    const agent = Agent.make({
      id: "counter",
      handler: () =>
        Effect.gen(function*() {
          const a = yield* step({ n: 1 })
          const b = yield* step({ n: ++runs > 1 ? 3 : 2 })
          return a + b
        })
    })
    return Effect.gen(function*() {
      const error = yield* Effect.flip(Explore.crashes(agent, {}))
      expect(error.message).toBe(
        "crash before submitStep #0 (step \"step\"): output differed: expected 3 got 4"
      )
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent] })))
  })

  it.effect("the examples' agents: hello, and the deployer without its approval policy", () =>
    Effect.gen(function*() {
      const helloReport = yield* Explore.crashes(exampleHello, { query: "hello world" })
      expect(helloReport.points).toHaveLength(10)
      expect(helloReport.baseline.output).toEqual({ query: "hello world", reversed: "dlrow olleh", word_count: 2 })
      yield* Explore.determinism(exampleHello, { query: "hello world" })

      const report = yield* Explore.crashes(deployer, { service: "billing" })
      // 4 steps (2 of them at_most_once deploys) and the outcome post, plus the lapse
      expect(report.points).toHaveLength(4 * 4 + 1 + 1)
      expect(report.points.filter((p) => p.verdict === "indeterminate").map((p) => p.description)).toEqual([
        "crash after submitStep #1 (step \"deploy\")",
        "crash before completeStep #1 (step \"deploy\")",
        "crash after submitStep #2 (step \"deploy\")",
        "crash before completeStep #2 (step \"deploy\")"
      ])
      // the deployer does not handle an unknown deploy outcome: the execution fails, the same way each time
      for (const point of report.points.filter((p) => p.verdict === "indeterminate")) {
        expect(point.status).toBe("failed")
        expect(point.failureReason).toBe(
          "tool_error: deploy: outcome unknown: this may already have taken effect. Check the state before continuing."
        )
      }
      yield* Explore.determinism(deployer, { service: "billing" })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [exampleHello, deployer] }))))

  it.effect("explores over the exact wire too (transport: http)", () => {
    const hello = makeHello()
    return Effect.gen(function*() {
      const report = yield* Explore.crashes(hello.agent, { query: "a b" })
      expect(report.points).toHaveLength(10)
      expect(report.points.every((p) => p.verdict === "same")).toBe(true)
      const checked = yield* Explore.determinism(hello.agent, { query: "a b" })
      expect(checked.steps).toEqual([
        { kind: "tool_call", target: "reverse", args: { text: "a b" } },
        { kind: "tool_call", target: "word_count", args: { text: "a b" } }
      ])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [hello.agent], transport: "http" })))
  })

  it.effect("refuses an agent that blocks on an approval without a human", () => {
    const hello = makeHello()
    const policy = [
      "default_action: allow",
      "rules:",
      "  - id: gate",
      "    when: { target: word_count }",
      "    then: { decision: require_approval }"
    ].join("\n")
    return Effect.gen(function*() {
      const error = yield* Effect.flip(Explore.crashes(hello.agent, { query: "x" }))
      expect(error.message).toBe(
        "the uninterrupted run: ended blocked on an approval; crash exploration needs a run that finishes on its own"
      )
    }).pipe(Effect.provide(TestKernel.layer({ agents: [hello.agent], policies: { hello: policy } })))
  })
})

/**
 * Pays with the step id as the provider's idempotency key (as the README
 * recommends) and reports what the provider answered: the output carries
 * values made from step ids, the execution id and the dispatch id, which
 * differ from one execution to the next.
 */
const makeIdempotentBilling = (options?: { readonly leak?: () => number }) => {
  const charges: Array<string> = []
  const charge = Tool.make("charge", {
    args: Schema.Struct({ amount: Schema.Number }),
    success: Schema.Struct({ receipt: Schema.String, key: Schema.String }),
    idempotency: "at_most_once",
    execute: ({ amount }, { stepId }) =>
      Effect.sync(() => {
        charges.push(stepId)
        // a provider that answers with a receipt number cut from the key
        return { receipt: `rcpt_${stepId.slice(0, 12)}_${amount}`, key: stepId }
      })
  })
  const notify = Tool.make("notify", {
    args: Schema.Struct({ receipt: Schema.String }),
    success: Schema.String,
    execute: ({ receipt }, { stepId }) => Effect.succeed(`sent ${receipt} (message ${stepId})`)
  })
  const agent = Agent.make({
    id: "billing",
    input: Schema.Struct({ amount: Schema.Number }),
    handler: ({ amount }) =>
      Effect.gen(function*() {
        const { dispatchId, executionId } = yield* Execution.Execution
        const charged = yield* charge({ amount })
        // the next step's arguments carry the first step's id
        const sent = yield* notify({ receipt: charged.receipt })
        const now = yield* Step.now
        return {
          order: `${executionId}/${charged.key}`,
          charged,
          sent,
          byKey: { [charged.key]: amount },
          ...(options?.leak === undefined ? {} : { leak: options.leak() }),
          now,
          // the delivery that finished the execution
          dispatch: dispatchId
        }
      })
  })
  return { agent, charges }
}

describe("Explore.crashes: outputs made from execution-specific ids", () => {
  it.effect("an agent whose output embeds step ids, the execution id and slices of them survives every crash", () => {
    const billing = makeIdempotentBilling()
    return Effect.gen(function*() {
      const report = yield* Explore.crashes(billing.agent, { amount: 12 })
      const baseline = report.baseline.output as { order: string; charged: { key: string } }
      expect(baseline.order).toBe(`${report.baseline.executionId}/${baseline.charged.key}`)
      expect(report.points.every((p) => p.verdict === "same" || p.verdict === "indeterminate")).toBe(true)
      // the points' outputs are reported as recorded: each run's own ids
      const other = report.points.find((p) => p.verdict === "same")!
      expect((other.output as { order: string }).order.startsWith(other.executionId)).toBe(true)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [billing.agent] })))
  })

  it.effect("an output that really differs after a crash still fails, with the ids mapped out of the message", () => {
    let runs = 0
    const billing = makeIdempotentBilling({ leak: () => ++runs > 1 ? 2 : 1 })
    return Effect.gen(function*() {
      const error = yield* Effect.flip(Explore.crashes(billing.agent, { amount: 12 }))
      expect(error._tag).toBe("CrashExplorationError")
      expect(error.message).toMatch(/^crash before submitStep #0 \(step "charge"\): output differed: /)
      if (error._tag !== "CrashExplorationError") return
      // the failing run's ids are shown as the uninterrupted run's: only the leak differs
      const kernel = yield* TestKernel.TestKernel
      const calls = yield* kernel.calls()
      const baselineCharge = calls.find((c) => c.call === "submitStep" && c.target === "charge")!.stepId!
      const failingCharge = calls.find((c) =>
        c.executionId === error.executionId && c.call === "submitStep" && c.target === "charge" &&
        c.stepId !== undefined
      )!.stepId!
      expect(error.reason).toMatch(/; differences: \$\.leak: 1 → 2$/)
      expect(error.reason.split(baselineCharge).length - 1).toBe(2)
      expect(error.reason).not.toContain(failingCharge.slice(0, 12))
    }).pipe(Effect.provide(TestKernel.layer({ agents: [billing.agent] })))
  })

  it.effect("a value the kit cannot map (a hash of the step id) fails until its field is declared in ignore", () => {
    const token = Tool.make("token", {
      args: Schema.Struct({ user: Schema.String }),
      success: Schema.Struct({ token: Schema.String, user: Schema.String }),
      execute: ({ user }, { stepId }) =>
        Effect.succeed({ token: createHash("sha256").update(stepId).digest("hex"), user })
    })
    const agent = Agent.make({
      id: "tokens",
      handler: () =>
        Effect.gen(function*() {
          const first = yield* token({ user: "ada" })
          const second = yield* token({ user: "bob" })
          return { users: [first, second], count: 2 }
        })
    })
    return Effect.gen(function*() {
      const strict = yield* Effect.flip(Explore.crashes(agent, {}))
      expect(strict.message).toMatch(/^crash before submitStep #0 \(step "token"\): output differed: /)

      const report = yield* Explore.crashes(agent, {}, { ignore: ["$.users[*].token"] })
      expect(report.points).toHaveLength(2 * 4 + 1 + 1)
      // an ignored field only hides that field: the rest is still compared
      const narrow = yield* Effect.flip(Explore.crashes(agent, {}, { ignore: ["$.users[0].token"] }))
      expect(narrow.message).toContain("output differed")

      const bad = yield* Effect.flip(Explore.crashes(agent, {}, { ignore: ["users.token"] }))
      expect(bad.message).toBe(
        "the ignore option: \"users.token\" is not a path like $.a.b, $.items[0].id or $.items[*].id"
      )
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent] })))
  })
})
