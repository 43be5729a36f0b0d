/**
 * examples/toolLoop.ts end to end over real HTTP (embedded kernel, scripted
 * model, the agent's webhook): the loop crashes while a tool runs, is
 * redelivered once the lease lapses, and finishes with the model asked 3 times
 * for 3 turns and the search run once.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { main } from "../../examples/toolLoop.js"

describe("examples/toolLoop.ts", () => {
  it.live("crashes mid-loop and resumes by replay: no model request or finished tool is repeated", () =>
    Effect.gen(function*() {
      const lines: Array<string> = []
      const summary = yield* main({ leaseTimeoutMs: 1_500, log: (line) => lines.push(line) })
      expect(summary.status).toBe("completed")
      expect(summary.output).toEqual({
        answer: "From what I read: each step is recorded once and replayed after a crash."
      })
      expect(summary.deliveries).toBe(2)
      expect(summary.providerCalls).toBe(3)
      expect(summary.bodies).toEqual({ search: 1, fetch_page: 2 })
      expect(summary.steps).toEqual([
        ["llm_call", "gpt-4o-mini", "succeeded"],
        ["tool_call", "search", "succeeded"],
        ["llm_call", "gpt-4o-mini", "succeeded"],
        ["tool_call", "fetch_page", "succeeded"],
        ["llm_call", "gpt-4o-mini", "succeeded"]
      ])
      // the timeline: two runs from the top, the second walking turns 1 and 2 without a request
      const text = lines.join("\n")
      expect(lines.filter((l) => l.includes("starts from the top"))).toHaveLength(2)
      expect(lines.filter((l) => l.includes("got request #"))).toHaveLength(3)
      expect(text).toContain("💥 the agent process died while fetching the page")
      const afterCrash = lines.slice(lines.findIndex((l) => l.includes("💥")))
      const secondRun = afterCrash.slice(afterCrash.findIndex((l) => l.includes("starts from the top")))
      expect(secondRun.filter((l) => l.includes("handler") && l.includes("turn"))).toHaveLength(3)
      expect(secondRun.filter((l) => l.includes("got request #"))).toEqual([expect.stringContaining("got request #3")])
    }).pipe(Effect.scoped), 60_000)
})
