/**
 * Durable tools in Effect's AI toolkit: a tool loop built with
 * `LanguageModel.generateText` records every model call (`llm_call`, through
 * `Llm.transformClient` on the provider's client) and every tool call
 * (`tool_call`), replays both after a crash, lets policy deny a tool (the model
 * gets the denial as text) and hold one for approval (the run signal unwinds
 * `generateText`). The kernel is the test kit's, under TestClock; the model is
 * the scripted OpenAI-compatible model served as an in-process `HttpClient`,
 * spoken to by the small Effect-native `LanguageModel` of the examples.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer, Redacted, Schema } from "effect"
import { LanguageModel, Prompt, Response, Tool as AiTool } from "effect/ai"
import { HttpClient } from "effect/http"
import { Agent, AiToolkit, Llm, Mcp, Tool } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"
import * as OpenAiChat from "../examples/support/openAiChat.js"
import * as ScriptedModel from "../examples/support/scriptedModel.js"

const MODEL = "gpt-test"

/** Search, then fetch the first hit, then answer with what the page said (or with whatever the last tool said). */
const researchScript: ScriptedModel.Script = (request) => {
  const results = ScriptedModel.toolResults(request)
  if (results.length === 0) {
    return { toolCalls: [{ name: "search", arguments: { query: ScriptedModel.question(request) } }] }
  }
  if (results.length === 1) {
    let hits: unknown
    try {
      hits = JSON.parse(results[0]!)
    } catch {
      return { text: `Answer: ${results[0]}` }
    }
    return { toolCalls: [{ name: "fetch_page", arguments: { url: (hits as ReadonlyArray<string>)[0] } }] }
  }
  return { text: `Answer: ${results[1]}` }
}

const makeWorld = (options?: { readonly denials?: AiToolkit.Denials; readonly failFetch?: boolean }) => {
  const executed: Array<string> = []
  const search = Tool.make("search", {
    description: "Search the web.",
    args: Schema.Struct({ query: Schema.String }),
    success: Schema.Array(Schema.String),
    execute: ({ query }) =>
      Effect.sync(() => {
        executed.push(`search:${query}`)
        return [`https://example.com/${encodeURIComponent(query)}`, "https://example.org/other"]
      })
  })
  const fetchPage = Tool.make("fetch_page", {
    description: "Fetch a web page.",
    args: Schema.Struct({ url: Schema.String }),
    success: Schema.Struct({ title: Schema.String, text: Schema.String }),
    idempotency: "at_most_once",
    execute: ({ url }) =>
      Effect.suspend(() => {
        executed.push(`fetch_page:${url}`)
        return options?.failFetch === true
          ? Effect.fail(new Error("connection reset"))
          : Effect.succeed({ title: "Durable steps", text: "A step is recorded once and replayed after a crash." })
      })
  })
  const model = ScriptedModel.httpClient(researchScript)
  const kit = options?.denials === "error"
    ? AiToolkit.makeWith({ denials: "error" })(search, fetchPage)
    : AiToolkit.make(search, fetchPage)
  const LanguageModelLive = OpenAiChat.layer({
    apiUrl: "http://model.test/v1",
    apiKey: Redacted.make("sk-test"),
    model: MODEL,
    transformClient: Llm.transformClient
  }).pipe(Layer.provide(Layer.succeed(HttpClient.HttpClient, model.client)))

  /** The tool loop: ask, run the tools the model asks for, feed the results back, until it answers. */
  const answer = (question: string) =>
    Effect.gen(function*() {
      let prompt = Prompt.make(question)
      for (let turn = 0; turn < 6; turn++) {
        const response = yield* LanguageModel.generateText({ prompt, toolkit: kit.toolkit })
        prompt = Prompt.concat(prompt, Prompt.fromResponseParts(AiToolkit.inCallOrder(response.content)))
        if (response.finishReason !== "tool-calls") return response.text
      }
      return "too many turns"
    }).pipe(Effect.provide(Layer.merge(kit.layer, LanguageModelLive)))

  const agent = Agent.make({
    id: "researcher",
    input: Schema.Struct({ question: Schema.String }),
    handler: ({ question }) =>
      answer(question).pipe(
        Llm.liftRefusals,
        Effect.catchTag("PolicyError", (e) => Effect.succeed(`denied: ${e.target ?? ""}: ${e.reason}`)),
        Effect.catchTag("ToolError", (e) => Effect.succeed(`tool failed: ${e.message}`))
      )
  })
  return { agent, executed, fetchPage, kit, LanguageModelLive, model, search }
}

const QUESTION = "durable steps"
const PAGE = "{\"title\":\"Durable steps\",\"text\":\"A step is recorded once and replayed after a crash.\"}"

const submits = (run: TestKernel.RunResult) =>
  run.calls.filter((c) => c.call === "submitStep").map((c) => [c.attempt, c.kind, c.target, c.answer])

const policyFor = (target: string, then: ReadonlyArray<string>) =>
  [
    "default_action: allow",
    "rules:",
    "  - id: the-rule",
    "    when:",
    `      target: ${target}`,
    "    then:",
    ...then.map((line) => `      ${line}`)
  ].join("\n")

describe("AiToolkit.toAiTool", () => {
  it("derives the effect/ai definition: name, description, parameters, idempotency", () => {
    const { fetchPage, kit, search } = makeWorld()
    const tool = AiToolkit.toAiTool(search)
    expect(tool.name).toBe("search")
    expect(tool.description).toBe("Search the web.")
    expect(tool.failureMode).toBe("error")
    expect(AiTool.getJsonSchema(tool)).toMatchObject({
      type: "object",
      properties: { query: { type: "string" } },
      required: ["query"]
    })
    expect(Context.get(tool.annotations, AiTool.Idempotent)).toBe(true)
    expect(Context.get(AiToolkit.toAiTool(fetchPage).annotations, AiTool.Idempotent)).toBe(false)
    expect(Object.keys(kit.toolkit.tools)).toEqual(["search", "fetch_page"])
    expect(kit.tools).toEqual([search, fetchPage])
  })

  it("an MCP tool advertises the server's JSON Schema as it is, not strict", () => {
    const inputSchema = { type: "object", properties: { path: { type: "string" } }, required: ["path"] }
    const read = Mcp.wrap({ name: "read_text_file", description: "Read a file.", inputSchema }, {
      prefix: "fs",
      call: () => Effect.succeed({ content: [] })
    })
    const tool = AiToolkit.toAiTool(read)
    expect(tool.name).toBe("fs_read_text_file")
    expect(AiTool.isDynamic(tool)).toBe(true)
    expect(AiTool.getJsonSchema(tool)).toEqual(inputSchema)
    expect(AiTool.getStrictMode(tool)).toBe(false)
  })

  it("inCallOrder puts the tool results in the order of their calls and leaves every other part in place", () => {
    const call = (id: string) => Response.makePart("tool-call", { id, name: "t", params: {}, providerExecuted: false })
    const result = (id: string) =>
      Response.makePart("tool-result", {
        id,
        name: "t",
        isFailure: false,
        result: id,
        encodedResult: id,
        providerExecuted: false,
        preliminary: false
      })
    const text = Response.makePart("text", { text: "thinking" })
    const parts = [text, call("a"), call("b"), call("c"), result("c"), result("a"), result("b")]
    const ordered = AiToolkit.inCallOrder(parts)
    expect(ordered.map((p) => p.type === "text" ? "text" : `${p.type}:${(p as { id: string }).id}`)).toEqual([
      "text",
      "tool-call:a",
      "tool-call:b",
      "tool-call:c",
      "tool-result:a",
      "tool-result:b",
      "tool-result:c"
    ])
    // the input is left as it was
    expect(parts.map((p) => (p as { id?: string }).id)).toEqual([undefined, "a", "b", "c", "c", "a", "b"])
  })

  it("two tools with one name are refused", () => {
    const { search } = makeWorld()
    expect(() => AiToolkit.make(search, search)).toThrow(/two tools are named "search"/)
  })
})

describe("AiToolkit in a tool loop", () => {
  it.effect("every model call is an llm_call step and every tool call a tool_call step, in order", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { question: QUESTION })
      expect(run.status).toBe("completed")
      expect(run.output).toBe(`Answer: ${PAGE}`)
      expect(submits(run)).toEqual([
        [1, "llm_call", MODEL, "proceed"],
        [1, "tool_call", "search", "proceed"],
        [1, "llm_call", MODEL, "proceed"],
        [1, "tool_call", "fetch_page", "proceed"],
        [1, "llm_call", MODEL, "proceed"]
      ])
      expect(world.model.calls).toBe(3)
      expect(world.executed).toEqual([
        "search:durable steps",
        "fetch_page:https://example.com/durable%20steps"
      ])
      // a model call's step args are the request body the provider got; its tools are advertised
      const llmSteps = run.steps.filter((s) => s.kind === "llm_call")
      expect(llmSteps.map((s) => s.args)).toEqual(expect.arrayContaining(world.model.requests as Array<unknown>))
      expect(world.model.requests[0]!.tools!.map((t) => t.function.name)).toEqual(["search", "fetch_page"])
      // the tool steps: the arguments the model chose, the results it was shown
      const search = run.steps.find((s) => s.target === "search")!
      expect(search.args).toEqual({ query: QUESTION })
      expect(search.result).toEqual(["https://example.com/durable%20steps", "https://example.org/other"])
      expect(ScriptedModel.toolResults(world.model.requests[2]!)).toEqual([JSON.stringify(search.result), PAGE])
      expect(run.steps.find((s) => s.target === "fetch_page")!.idempotency).toBe("at_most_once")
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
  })

  it.effect("a crash mid-loop resumes by replay: model answers and tool results come from the record", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      // the process dies once the first answer, the search and the second answer are recorded,
      // as it asks for the page
      const run = yield* kernel.run(world.agent, { question: QUESTION }, {
        crash: { call: "submitStep", index: 3, when: "before" }
      })
      expect(run.status).toBe("completed")
      expect(run.crashed).toBe(true)
      expect(run.deliveries).toBe(2)
      expect(run.output).toBe(`Answer: ${PAGE}`)
      expect(submits(run)).toEqual([
        [1, "llm_call", MODEL, "proceed"],
        [1, "tool_call", "search", "proceed"],
        [1, "llm_call", MODEL, "proceed"],
        [1, "tool_call", "fetch_page", undefined], // the process died here: the kernel never saw it
        [2, "llm_call", MODEL, "replay"],
        [2, "tool_call", "search", "replay"],
        [2, "llm_call", MODEL, "replay"],
        [2, "tool_call", "fetch_page", "proceed"],
        [2, "llm_call", MODEL, "proceed"]
      ])
      // nothing was sent or run twice
      expect(world.model.calls).toBe(3)
      expect(world.executed).toEqual([
        "search:durable steps",
        "fetch_page:https://example.com/durable%20steps"
      ])
      expect(run.steps).toHaveLength(5)
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
  })

  it.effect("a denied tool call reaches the model as the tool's result text; the tool does not run", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { question: QUESTION })
      expect(run.status).toBe("completed")
      const denial = "fetch_page not allowed. reason: no browsing today"
      expect(run.output).toBe(`Answer: ${denial}`)
      // what the model was sent on its third turn
      const lastRequest = world.model.requests[2]!
      expect(lastRequest.messages.at(-1)).toEqual({ role: "tool", tool_call_id: "call_1_0", content: denial })
      expect(run.steps.find((s) => s.target === "fetch_page")!.status).toBe("denied")
      expect(world.executed).toEqual(["search:durable steps"])
    }).pipe(Effect.provide(TestKernel.layer({
      agents: [world.agent],
      policies: { researcher: policyFor("fetch_page", ["decision: deny", "reason: no browsing today"]) }
    })))
  })

  it.effect("denials: \"error\" fails generateText with the PolicyError instead", () => {
    const world = makeWorld({ denials: "error" })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { question: QUESTION })
      expect(run.status).toBe("completed")
      expect(run.output).toBe("denied: fetch_page: no browsing today")
      expect(world.model.calls).toBe(2)
    }).pipe(Effect.provide(TestKernel.layer({
      agents: [world.agent],
      policies: { researcher: policyFor("fetch_page", ["decision: deny", "reason: no browsing today"]) }
    })))
  })

  it.effect("a denied model call: the refusal is answered without calling the model, and liftRefusals makes it a PolicyError", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { question: QUESTION })
      expect(run.status).toBe("completed")
      expect(run.output).toBe("denied: : models are off")
      expect(world.model.calls).toBe(0)
    }).pipe(Effect.provide(TestKernel.layer({
      agents: [world.agent],
      policies: { researcher: policyFor(MODEL, ["decision: deny", "reason: models are off"]) }
    })))
  })

  it.effect("a tool held for approval blocks the run from inside generateText; after the grant the loop resumes by replay", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const blocked = yield* kernel.run(world.agent, { question: QUESTION })
      expect(blocked.status).toBe("blocked")
      expect(blocked.approvals).toHaveLength(1)
      expect(world.model.calls).toBe(2)
      expect(world.executed).toEqual(["search:durable steps"])
      yield* kernel.grant(blocked.approvals[0]!.id, { decidedBy: "alice" })
      const run = yield* kernel.settle(blocked.executionId)
      expect(run.status).toBe("completed")
      expect(run.output).toBe(`Answer: ${PAGE}`)
      expect(world.model.calls).toBe(3)
      expect(world.executed).toEqual([
        "search:durable steps",
        "fetch_page:https://example.com/durable%20steps"
      ])
    }).pipe(Effect.provide(TestKernel.layer({
      agents: [world.agent],
      policies: {
        researcher: policyFor("fetch_page", [
          "decision: require_approval",
          "reason: fetching needs a human",
          "approval_config:",
          "  approvers: [alice]",
          "  timeout: 10m"
        ])
      }
    })))
  })

  it.effect("a failing tool's ToolError reaches generateText's caller typed", () => {
    const world = makeWorld({ failFetch: true })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.agent, { question: QUESTION })
      expect(run.status).toBe("completed")
      expect(run.output).toBe("tool failed: fetch_page: connection reset")
      expect(run.steps.find((s) => s.target === "fetch_page")!.status).toBe("failed")
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.agent] })))
  })

  it("a model call with these tools outside a run is a type error", () => {
    const world = makeWorld()
    const program = LanguageModel.generateText({ prompt: "hi", toolkit: world.kit.toolkit }).pipe(
      Effect.provide(Layer.merge(world.kit.layer, world.LanguageModelLive))
    )
    const call = () =>
      // @ts-expect-error Execution is missing from the context
      Effect.runPromise(program)
    expect(typeof call).toBe("function")
  })
})
