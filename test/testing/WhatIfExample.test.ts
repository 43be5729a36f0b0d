/**
 * examples/whatIf.ts: the recorded run and its three "what if" forks, as the
 * example prints them — and which tool bodies really ran.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { demo, ran } from "../../examples/whatIf.js"

describe("examples/whatIf.ts", () => {
  it.effect("forks answer what if: another policy, another recorded result, a recorded failure", () =>
    Effect.gen(function*() {
      ran.length = 0
      const { failed, larger, paused, source } = yield* demo
      const steps = (run: typeof source) => run.steps.map((s) => [s.target, s.status])
      expect(source.output).toEqual({ order: "A-1", outcome: "refunded 40" })
      expect(paused.output).toEqual({ order: "A-1", outcome: "refund refused: refunds are paused" })
      expect(steps(paused)).toEqual([["lookup_order", "succeeded"], ["refund", "denied"], ["notify", "succeeded"]])
      expect(larger.output).toEqual({ order: "A-1", outcome: "escalated" })
      expect(larger.steps[0]!.result).toEqual({ amount: 250 })
      expect(steps(larger)).toEqual([["lookup_order", "succeeded"], ["notify", "succeeded"]])
      expect(failed.status).toBe("failed")
      expect(failed.failureReason).toBe("tool_error: lookup_order: order not found")
      expect(steps(failed)).toEqual([["lookup_order", "failed"]])
      // the lookup and the refund ran once, in the recorded run; each fork ran only what came after its fork point
      expect(ran).toEqual([
        "lookup_order A-1",
        "refund A-1 40",
        "notify \"order A-1: refunded 40\"",
        "notify \"order A-1: refund refused: refunds are paused\"",
        "notify \"order A-1: a refund of 250 needs a second look\""
      ])
    }))
})
