/**
 * A short seeded chaos soak (test/support/soak.ts; `npm run soak` runs it for
 * minutes): `examples/hello.ts` and the embedded kernel as real processes, on
 * stages `current` and `v0.14.0`, with executions created throughout, both
 * directions of traffic going through chaos proxies, and the agent SIGKILLed
 * or SIGTERMed and restarted. Every execution must complete exactly once with
 * DESIGN's output, each step recorded once, and the kernel must stay clean.
 */
import { describe, expect, it } from "vitest"
import { formatSummary, runSoak } from "../support/soak.js"

const SEED = 20261206

describe("chaos soak (short)", () => {
  it("every execution completes exactly once through kills and cut connections", async () => {
    const summary = await runSoak({
      durationMs: 8_000,
      seed: SEED,
      stages: ["current", "v0.14.0"],
      rate: 4,
      chaosEveryMs: [1500, 3000],
      leaseTimeout: "2s",
      dispatchTimeout: "2s",
      settleTimeoutMs: 60_000
    })
    const text = formatSummary(summary)
    if (process.env["SOAK_VERBOSE"] !== undefined) console.log(text)
    expect(summary.violations, text).toEqual([])
    for (const lane of summary.lanes) {
      expect(lane.executions, text).toBeGreaterThan(10)
      expect(lane.completed, text).toBe(lane.executions)
      expect(lane.sigkills + lane.sigterms + lane.cutAlls + lane.partitions, text).toBeGreaterThan(0)
    }
  }, 120_000)
})
