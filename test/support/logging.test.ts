/**
 * The test logger (test/support/logging.ts): what a test provokes on purpose
 * is captured instead of printed, and stays readable by the test.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { afterEach, vi } from "vitest"
import * as TestLogs from "./logging.js"

describe("TestLogs", () => {
  afterEach(() => {
    vi.restoreAllMocks()
  })

  it.live("a live test's warnings go to the console without it, to the buffer with it", () =>
    Effect.gen(function*() {
      const printed = vi.spyOn(console, "log").mockImplementation(() => {})
      yield* Effect.logWarning("printed: no test logger here")
      expect(printed).toHaveBeenCalledTimes(1)
      expect(TestLogs.lines()).toEqual([])

      yield* Effect.logWarning("webhook delivery failed", { attempt: 1 }).pipe(
        Effect.annotateLogs("rebuno.agent_id", "broken"),
        Effect.provide(TestLogs.layer)
      )
      expect(printed).toHaveBeenCalledTimes(1)
      expect(TestLogs.lines()).toHaveLength(1)
      expect(TestLogs.lines()[0]).toMatch(/level=WARN .*message="webhook delivery failed"/)
      expect(TestLogs.lines()[0]).toContain("rebuno.agent_id=broken")
    }))

  it.live("forked fibers log through it too, and each test starts with an empty buffer", () =>
    Effect.gen(function*() {
      expect(TestLogs.lines()).toEqual([])
      const printed = vi.spyOn(console, "log").mockImplementation(() => {})
      yield* Effect.forkChild(Effect.logWarning("from a background fiber")).pipe(
        Effect.flatMap(Fiber.join),
        Effect.provide(TestLogs.layer)
      )
      expect(printed).not.toHaveBeenCalled()
      expect(TestLogs.lines().map((l) => l.includes("from a background fiber"))).toEqual([true])
    }))
})
