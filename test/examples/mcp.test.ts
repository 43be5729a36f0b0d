/**
 * examples/mcp.ts end to end: the filesystem MCP server over stdio, its tools
 * in an LLM tool loop on the embedded kernel over real HTTP, a policy that
 * denies the write — which the model reads as the tool's result.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, References } from "effect"
import { main } from "../../examples/mcp.js"

describe("examples/mcp.ts", () => {
  it.live("MCP calls are recorded steps; the denied write reaches the model as text and writes nothing", () =>
    Effect.gen(function*() {
      const lines: Array<string> = []
      const summary = yield* main({ log: (line) => lines.push(line) })
      const denial = "fs_write_file not allowed. reason: the notes are read-only"
      expect(summary.status).toBe("completed")
      expect(summary.output).toEqual({ answer: `The notes say: ship the MCP example (I could not save a summary: ${denial})` })
      expect(summary.steps.map((s) => [s.kind, s.target, s.status])).toEqual([
        ["llm_call", "gpt-4o-mini", "succeeded"],
        ["tool_call", "fs_list_directory", "succeeded"],
        ["llm_call", "gpt-4o-mini", "succeeded"],
        ["tool_call", "fs_read_text_file", "succeeded"],
        ["tool_call", "fs_write_file", "denied"],
        ["llm_call", "gpt-4o-mini", "succeeded"]
      ])
      const read = summary.steps.find((s) => s.target === "fs_read_text_file")!
      expect(Object.keys(read.args as object)).toEqual(["path"]) // the model's `head: null` was removed
      expect(read.result).toEqual({ content: "ship the MCP example\n" })
      expect(summary.toolMessages.at(-1)).toBe(denial)
      expect(summary.summaryWritten).toBe(false)
      expect(lines.join("\n")).toContain(`tool → ${denial}`)
    }).pipe(Effect.scoped, Effect.provideService(References.MinimumLogLevel, "Error")), 60_000)
})
