/**
 * "What if" testing with the test kit (PROTOCOL-CURRENT C.7): run an agent
 * once, then fork the recorded execution and change one thing — the policy,
 * or what a step returned — and see what the agent does on the new branch.
 * The steps before the fork point replay from the record (their bodies do
 * not run again); everything after runs live.
 *
 * The `refunds` agent looks an order up, refunds it (at most once) and
 * notifies the customer. Three questions, each answered by a fork:
 *
 *   1. What if refunds had been paused by policy when it ran?
 *   2. What if the lookup had found a larger amount?
 *   3. What if the lookup had failed?
 *
 *   npx tsx examples/whatIf.ts
 *
 * Everything runs in this process on the test kit, on a `TestClock`.
 */
import { Console, Effect, Schema } from "effect"
import { Agent, Tool } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"
import { TestClock } from "effect/testing"
import { pathToFileURL } from "node:url"

/** What the tools' bodies did, in order: replayed steps do not show up here. */
export const ran: Array<string> = []

const lookupOrder = Tool.make("lookup_order", {
  description: "Find an order and the amount paid.",
  args: Schema.Struct({ order: Schema.String }),
  success: Schema.Struct({ amount: Schema.Number }),
  execute: ({ order }) => Effect.sync(() => (ran.push(`lookup_order ${order}`), { amount: 40 }))
})

const refund = Tool.make("refund", {
  description: "Refund an amount to the customer's card.",
  args: Schema.Struct({ order: Schema.String, amount: Schema.Number }),
  success: Schema.Struct({ refunded: Schema.Number }),
  idempotency: "at_most_once",
  execute: ({ amount, order }) => Effect.sync(() => (ran.push(`refund ${order} ${amount}`), { refunded: amount }))
})

const notify = Tool.make("notify", {
  description: "Tell the customer.",
  args: Schema.Struct({ text: Schema.String }),
  success: Schema.Boolean,
  execute: ({ text }) => Effect.sync(() => (ran.push(`notify "${text}"`), true))
})

/** Refunds an order, unless the policy refuses; refunds above 100 need a second look. */
export const refunds = Agent.make({
  id: "refunds",
  input: Schema.Struct({ order: Schema.String }),
  output: Schema.Struct({ order: Schema.String, outcome: Schema.String }),
  handler: ({ order }) =>
    Effect.gen(function*() {
      const { amount } = yield* lookupOrder({ order })
      if (amount > 100) {
        yield* notify({ text: `order ${order}: a refund of ${amount} needs a second look` })
        return { order, outcome: "escalated" }
      }
      const outcome = yield* refund({ order, amount }).pipe(
        Effect.map(({ refunded }) => `refunded ${refunded}`),
        Effect.catchTag("PolicyError", (e) => Effect.succeed(`refund refused: ${e.reason}`))
      )
      yield* notify({ text: `order ${order}: ${outcome}` })
      return { order, outcome }
    })
})

/** A policy bundle that pauses refunds. */
export const pauseRefunds = [
  "default_action: allow",
  "rules:",
  "  - id: pause-refunds",
  "    when: { target: refund }",
  "    then: { decision: deny, reason: refunds are paused }"
].join("\n")

/** The source run and the three forks, as the test kit reports them. */
export const demo = Effect.gen(function*() {
  const kernel = yield* TestKernel.TestKernel
  const source = yield* kernel.run(refunds, { order: "A-1" })

  // 1. From step 1 (the refund) on, under a policy that pauses refunds: the lookup replays.
  const paused = yield* kernel.fork(source, { atStep: 1, policy: pauseRefunds })
  // 2. The lookup replays 250 instead of 40: the agent takes the other branch, live.
  const larger = yield* kernel.fork(source, { atStep: 1, override: { lookup_order: { result: { amount: 250 } } } })
  // 3. The lookup replays a failure instead: the fork fails as the agent would have.
  const failed = yield* kernel.fork(source, { atStep: 1, override: { lookup_order: { error: "order not found" } } })
  return { source, paused, larger, failed }
}).pipe(Effect.provide(TestKernel.layer({ agents: [refunds] })), Effect.provide(TestClock.layer()))

const main = Effect.gen(function*() {
  const { failed, larger, paused, source } = yield* demo
  const show = (title: string, run: TestKernel.RunResult<{ readonly outcome: string }>) =>
    Effect.gen(function*() {
      yield* Console.log(`\n${title}`)
      yield* Console.log(`  ${run.status}: ${run.output?.outcome ?? run.failureReason}`)
      for (const step of run.steps) yield* Console.log(`  step ${step.sequence} ${step.target}: ${step.status}`)
    })
  yield* show("the recorded run", source)
  yield* show("what if refunds had been paused (fork at step 1, another policy)", paused)
  yield* show("what if the lookup had found 250 (fork at step 1, another recorded result)", larger)
  yield* show("what if the lookup had failed (fork at step 1, a recorded failure)", failed)
  yield* Console.log(`\nbodies that ran, in order:\n  ${ran.join("\n  ")}`)
})

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  Effect.runPromise(main)
}
