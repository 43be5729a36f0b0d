/**
 * MCP tools (PROTOCOL-CURRENT C.11) against real MCP servers from the registry,
 * started over stdio with Effect's own MCP client: the reference "filesystem"
 * server (on a temporary directory) and the reference "everything" server. The
 * kernel is the test kit's, under TestClock (settled with `runReal`, which waits
 * for the server's answers). The only decorator is a counter
 * around the real client, so that a test can say how often the server was
 * called.
 */
import { NodeServices } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Redacted, Schema, Scope } from "effect"
import { LanguageModel, McpClient, McpProtocol, Prompt } from "effect/ai"
import { HttpClient } from "effect/http"
import { ChildProcess } from "effect/process"
import { Agent, AiToolkit, Llm, Mcp, Step, ToolError } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"
import { mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import * as OpenAiChat from "../examples/support/openAiChat.js"
import * as ScriptedModel from "../examples/support/scriptedModel.js"
import { registerAndRunReal } from "./support/realIo.js"

// ---------------------------------------------------------------------------
// The servers
// ---------------------------------------------------------------------------

const serverScript = (pkg: string) =>
  fileURLToPath(new URL(`../node_modules/@modelcontextprotocol/${pkg}/dist/index.js`, import.meta.url))

const stdioClient = (pkg: string, args: ReadonlyArray<string>) =>
  Effect.map(
    Layer.build(
      McpClient.layerStdio({
        name: "effect-rebuno-tests",
        version: "0.0.0",
        protocol: McpProtocol.v2025_11_25,
        command: ChildProcess.make(process.execPath, [serverScript(pkg), ...args])
      }).pipe(Layer.provide(NodeServices.layer))
    ),
    (context) => Context.get(context, McpClient.McpClient)
  )

/** The real clients of both servers, and the directory the filesystem server may touch. */
class Servers extends Context.Service<Servers, {
  readonly dir: string
  readonly filesystem: McpClient.McpClient
  readonly everything: McpClient.McpClient
}>()("test/Mcp/Servers") {}

const ServersLive = Layer.effect(
  Servers,
  Effect.gen(function*() {
    const dir = yield* Effect.acquireRelease(
      Effect.sync(() => realpathSync(mkdtempSync(join(tmpdir(), "rebuno-mcp-")))),
      (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
    )
    const [filesystem, everything] = yield* Effect.all([
      stdioClient("server-filesystem", [dir]),
      stdioClient("server-everything", [])
    ], { concurrency: 2 })
    return { dir, filesystem, everything }
  })
)

/** The real client, counting the `tools/call` requests it sends (name and arguments). */
const counting = (client: McpClient.McpClient) => {
  const calls: Array<{ readonly name: string; readonly arguments: unknown }> = []
  const callTool = ((params: Parameters<McpClient.McpClient["callTool"]>[0], options?: { readonly timeout?: never }) =>
    Effect.suspend(() => {
      calls.push({ name: params.tool.name, arguments: params.arguments })
      return client.callTool(params, options)
    })) as McpClient.McpClient["callTool"]
  return { client: { ...client, callTool } as McpClient.McpClient, calls }
}

const toolNamed = (tools: ReadonlyArray<Mcp.McpTool>, name: string): Mcp.McpTool => {
  const found = tools.find((tool) => tool.name === name)
  if (found === undefined) throw new Error(`no tool ${name} in ${tools.map((t) => t.name).join(", ")}`)
  return found
}

const Input = Schema.Struct({ path: Schema.String })

/** A policy that denies writes through the filesystem server. */
const READ_ONLY_FS = [
  "default_action: allow",
  "rules:",
  "  - id: read-only-fs",
  "    when:",
  "      target: fs_write_file",
  "    then:",
  "      decision: deny",
  "      reason: the notes are read-only"
].join("\n")

// ---------------------------------------------------------------------------

describe("Mcp (pure parts)", () => {
  it("toResult: structuredContent, else the texts of the blocks, else the raw value", () => {
    expect(Mcp.toResult({ content: [{ type: "text", text: "x" }], structuredContent: { n: 1 } })).toEqual({ n: 1 })
    expect(Mcp.toResult({ structured_content: [1] })).toEqual([1])
    expect(Mcp.toResult({ content: [{ type: "text", text: "only" }] })).toBe("only")
    expect(Mcp.toResult({ content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] })).toBe("a\nb")
    expect(Mcp.toResult({ content: [] })).toBe("")
    expect(Mcp.toResult({ content: [{ type: "image", data: "AAE=", mimeType: "image/png" }] })).toBe(
      "{\"type\":\"image\",\"data\":\"AAE=\",\"mimeType\":\"image/png\"}"
    )
    expect(Mcp.toResult({ content: [{ type: "text", text: "a" }], structuredContent: null })).toBe("a")
    expect(Mcp.toResult({ other: 1 })).toEqual({ other: 1 })
    expect(Mcp.toResult("plain")).toBe("plain")
    expect(Mcp.toResult(null)).toBe(null)
  })

  it("stripNullish removes null and undefined members only; target prefixes with an underscore", () => {
    expect(Mcp.stripNullish({ a: 1, b: null, c: undefined, d: false, e: 0, f: "", g: { h: null } })).toEqual({
      a: 1,
      d: false,
      e: 0,
      f: "",
      g: { h: null }
    })
    expect(Mcp.stripNullish([null])).toEqual([null])
    expect(Mcp.target("read", "fs")).toBe("fs_read")
    expect(Mcp.target("read", "")).toBe("read")
    expect(Mcp.target("read")).toBe("read")
  })
})

it.layer(ServersLive, { timeout: 60_000 })("Mcp against real MCP servers", (it) => {
  it.effect("wraps every tool of the server: prefixed target, server name, description, input JSON Schema", () =>
    Effect.gen(function*() {
      const { filesystem } = yield* Servers
      const descriptors = yield* filesystem.listTools()
      const prefixed = yield* Mcp.tools(filesystem, { prefix: "fs" })
      expect(prefixed.map((t) => t.name)).toEqual(descriptors.map((d) => `fs_${d.name}`))
      const read = toolNamed(prefixed, "fs_read_text_file")
      const descriptor = descriptors.find((d) => d.name === "read_text_file")!
      expect(read.mcpName).toBe("read_text_file")
      expect(read.description).toBe(descriptor.description)
      expect(read.jsonSchema).toEqual(descriptor.inputSchema)
      expect(read.inputSchema).toEqual(descriptor.inputSchema)
      expect(read.idempotency).toBe("safe_to_retry")
      expect(Mcp.isMcpTool(read)).toBe(true)
      const bare = yield* Mcp.tools(filesystem, { idempotency: "at_most_once" })
      expect(bare.map((t) => t.name)).toEqual(descriptors.map((d) => d.name))
      expect(bare.every((t) => t.idempotency === "at_most_once")).toBe(true)
    }))

  it.effect("a call is a tool_call step: prefixed target, arguments without nulls (recorded and sent), the shaped result", () =>
    Effect.gen(function*() {
      const { dir, filesystem } = yield* Servers
      const path = join(dir, "notes.txt")
      writeFileSync(path, "first line\nsecond line\n")
      const { calls, client } = counting(filesystem)
      const read = toolNamed(yield* Mcp.tools(client, { prefix: "fs" }), "fs_read_text_file")
      const agent = Agent.make({
        id: "reader",
        input: Input,
        handler: ({ path }) => read({ path, head: null, tail: undefined })
      })
      const run = yield* registerAndRunReal(agent, { path })
      expect(run.status).toBe("completed")
      // the filesystem server answers structuredContent: that is the result
      expect(run.output).toEqual({ content: "first line\nsecond line\n" })
      expect(run.steps.map((s) => [s.kind, s.target, s.status, s.idempotency])).toEqual([
        ["tool_call", "fs_read_text_file", "succeeded", "safe_to_retry"]
      ])
      expect(run.steps[0]!.args).toEqual({ path })
      expect(run.steps[0]!.result).toEqual({ content: "first line\nsecond line\n" })
      // the server got the same object, under its own name
      expect(calls).toEqual([{ name: "read_text_file", arguments: { path } }])
    }).pipe(Effect.provide(TestKernel.layer())))

  it.effect("content blocks: one text → that string, several → joined with \\n, a non-text block → its JSON text", () =>
    Effect.gen(function*() {
      const { everything } = yield* Servers
      const tools = yield* Mcp.tools(everything)
      const echo = toolNamed(tools, "echo")
      const links = toolNamed(tools, "get-resource-links")
      const image = toolNamed(tools, "get-tiny-image")
      const agent = Agent.make({
        id: "shapes",
        handler: () =>
          Effect.all({
            echo: echo({ message: "héllo" }),
            links: links({ count: 2 }),
            image: image({})
          })
      })
      const run = yield* registerAndRunReal(agent, {})
      expect(run.status).toBe("completed")
      const output = run.output as { echo: string; links: string; image: string }
      expect(output.echo).toBe("Echo: héllo")
      const linkLines = output.links.split("\n")
      expect(linkLines).toHaveLength(3)
      expect(linkLines[0]).toBe("Here are 2 resource links to resources available in this server:")
      expect(JSON.parse(linkLines[1]!)).toMatchObject({ type: "resource_link", uri: "demo://resource/dynamic/blob/1" })
      const [caption, block] = output.image.split("\n")
      expect(caption).toBe("Here's the image you requested:")
      // the block as it came over the wire: the image data is Base64 text
      const parsed = JSON.parse(block!) as { type: string; data: string; mimeType: string }
      expect(parsed.type).toBe("image")
      expect(parsed.mimeType).toBe("image/png")
      expect(Buffer.from(parsed.data, "base64").subarray(1, 4).toString("latin1")).toBe("PNG")
      // what was returned is what was recorded
      const byTarget = Object.fromEntries(run.steps.map((s) => [s.target, s.result]))
      expect(byTarget).toEqual({ echo: output.echo, "get-resource-links": output.links, "get-tiny-image": output.image })
    }).pipe(Effect.provide(TestKernel.layer())))

  it.effect("replay does not call the server: the file changed on disk, the replayed read is the recorded one", () =>
    Effect.gen(function*() {
      const { dir, filesystem } = yield* Servers
      const path = join(dir, "replay.txt")
      writeFileSync(path, "as recorded")
      const { calls, client } = counting(filesystem)
      const read = toolNamed(yield* Mcp.tools(client, { prefix: "fs" }), "fs_read_text_file")
      const agent = Agent.make({
        id: "replayer",
        input: Input,
        handler: ({ path }) =>
          Effect.gen(function*() {
            const before = yield* read({ path })
            // a local step changes the file behind the server's back
            yield* Step.run("edit", Effect.sync(() => writeFileSync(path, "changed on disk")))
            const after = yield* read({ path })
            return { before, after }
          })
      })
      // the process dies once the read and the edit are recorded
      const run = yield* registerAndRunReal(agent, { path }, { crash: { afterSteps: 2 } })
      expect(run.status).toBe("completed")
      expect(run.crashed).toBe(true)
      expect(run.deliveries).toBe(2)
      // the first read was replayed from the record although the file now says otherwise
      expect(run.output).toEqual({ before: { content: "as recorded" }, after: { content: "changed on disk" } })
      expect(readFileSync(path, "utf8")).toBe("changed on disk")
      // two reads reached the server: the first (before the crash) and the second (after it), never a re-read
      expect(calls.map((c) => c.name)).toEqual(["read_text_file", "read_text_file"])
      const submits = run.calls.filter((c) => c.call === "submitStep" && c.target === "fs_read_text_file")
      expect(submits.map((c) => [c.attempt, c.answer])).toEqual([[1, "proceed"], [2, "replay"], [2, "proceed"]])
    }).pipe(Effect.provide(TestKernel.layer())))

  it.effect("policy denies an MCP tool: the tool returns the denial text, the step is denied, the server is not called", () =>
    Effect.gen(function*() {
      const { dir, filesystem } = yield* Servers
      const path = join(dir, "denied.txt")
      const { calls, client } = counting(filesystem)
      const tools = yield* Mcp.tools(client, { prefix: "fs", idempotency: "at_most_once" })
      const write = toolNamed(tools, "fs_write_file")
      const agent = Agent.make({
        id: "writer",
        input: Input,
        handler: ({ path }) => write({ path, content: "should not exist" })
      })
      const run = yield* registerAndRunReal(agent, { path }, { policy: READ_ONLY_FS })
      expect(run.status).toBe("completed")
      expect(run.output).toBe("fs_write_file not allowed. reason: the notes are read-only")
      expect(run.steps.map((s) => [s.target, s.status])).toEqual([["fs_write_file", "denied"]])
      expect(calls).toEqual([])
      expect(() => readFileSync(path)).toThrow()
    }).pipe(Effect.provide(TestKernel.layer())))

  it.effect("in an LLM tool loop: the model calls MCP tools, a denied one reaches it as the tool's result text", () =>
    Effect.gen(function*() {
      const { dir, filesystem } = yield* Servers
      const path = join(dir, "loop.txt")
      writeFileSync(path, "the plan: ship it")
      const { calls, client } = counting(filesystem)
      const kit = AiToolkit.make(...(yield* Mcp.tools(client, { prefix: "fs" })))
      // one turn asks for a read and a write at once; the next answers with what the tools said
      const model = ScriptedModel.httpClient((request) => {
        const results = ScriptedModel.toolResults(request)
        return results.length === 0
          ? {
            toolCalls: [
              { name: "fs_read_text_file", arguments: { path, head: null } },
              { name: "fs_write_file", arguments: { path, content: "overwritten" } }
            ]
          }
          : { text: results.join(" | ") }
      })
      const LanguageModelLive = OpenAiChat.layer({
        apiUrl: "http://model.test/v1",
        apiKey: Redacted.make("sk-test"),
        model: "gpt-test",
        transformClient: Llm.transformClient
      }).pipe(Layer.provide(Layer.succeed(HttpClient.HttpClient, model.client)))
      const agent = Agent.make({
        id: "mcp-loop",
        handler: () =>
          Effect.gen(function*() {
            let prompt = Prompt.make("What is the plan? Then replace it.")
            while (true) {
              const response = yield* LanguageModel.generateText({ prompt, toolkit: kit.toolkit })
              // the two calls run concurrently: their results go back in call order
              prompt = Prompt.concat(prompt, Prompt.fromResponseParts(AiToolkit.inCallOrder(response.content)))
              if (response.finishReason !== "tool-calls") return response.text
            }
          }).pipe(Effect.provide(Layer.merge(kit.layer, LanguageModelLive)))
      })
      const run = yield* registerAndRunReal(agent, {}, { policy: READ_ONLY_FS })
      expect(run.status).toBe("completed")
      const denial = "fs_write_file not allowed. reason: the notes are read-only"
      // what the model was sent back: the read's structured result, and the denial as text
      const toolMessages = model.requests[1]!.messages.filter((m) => m.role === "tool")
      expect(toolMessages).toEqual([
        { role: "tool", tool_call_id: "call_0_0", content: "{\"content\":\"the plan: ship it\"}" },
        { role: "tool", tool_call_id: "call_0_1", content: denial }
      ])
      expect(run.output).toBe(`{"content":"the plan: ship it"} | ${denial}`)
      expect(run.steps.map((s) => [s.kind, s.target, s.status]).sort()).toEqual([
        ["llm_call", "gpt-test", "succeeded"],
        ["llm_call", "gpt-test", "succeeded"],
        ["tool_call", "fs_read_text_file", "succeeded"],
        ["tool_call", "fs_write_file", "denied"]
      ])
      // the server saw the read only (null members removed), and the file is untouched
      expect(calls).toEqual([{ name: "read_text_file", arguments: { path } }])
      expect(readFileSync(path, "utf8")).toBe("the plan: ship it")
    }).pipe(Effect.provide(TestKernel.layer())))

  it.effect("a result the server marks isError is recorded as its text; a server gone is a ToolError, replayed as one", () =>
    Effect.gen(function*() {
      const { dir, filesystem } = yield* Servers
      const missing = join(dir, "missing.txt")
      const read = toolNamed(yield* Mcp.tools(filesystem), "read_text_file")
      // a second server that dies: its client is closed before the run
      const scope = yield* Scope.make()
      const doomed = yield* stdioClient("server-filesystem", [dir]).pipe(Scope.provide(scope))
      const list = toolNamed(yield* Mcp.tools(doomed), "list_directory")
      yield* Scope.close(scope, Exit.void)
      const agent = Agent.make({
        id: "errors",
        input: Input,
        handler: ({ path }) =>
          Effect.gen(function*() {
            const text = yield* read({ path })
            const failure = yield* Effect.flip(list({ path: dir }))
            return { text, failure: failure._tag, message: failure.message }
          })
      })
      const run = yield* registerAndRunReal(agent, { path: missing }, { crash: { afterSteps: 2 } })
      expect(run.status).toBe("completed")
      expect(run.deliveries).toBe(2)
      const output = run.output as { text: string; failure: string; message: string }
      expect(output.text).toMatch(/^ENOENT: no such file or directory/)
      expect(output.failure).toBe("ToolError")
      expect(output.message).toMatch(/^list_directory: /)
      const step = (target: string) => run.steps.find((s) => s.target === target)!
      expect([step("read_text_file").status, step("list_directory").status]).toEqual(["succeeded", "failed"])
      expect(step("read_text_file").result).toBe(output.text)
      expect(step("list_directory").error).toMatchObject({ message: output.message.slice("list_directory: ".length) })
      const submits = run.calls.filter((c) => c.call === "submitStep")
      expect(submits.map((c) => [c.attempt, c.target, c.answer])).toEqual([
        [1, "read_text_file", "proceed"],
        [1, "list_directory", "proceed"],
        [2, "read_text_file", "replay"],
        [2, "list_directory", "replay"]
      ])
    }).pipe(Effect.provide(TestKernel.layer())))

  it.effect("wrap: any MCP invocation, a custom result shape, arguments that are not JSON refused before anything is sent", () =>
    Effect.gen(function*() {
      const { everything } = yield* Servers
      const descriptors = yield* everything.listTools()
      const sum = descriptors.find((d) => d.name === "get-sum")!
      const sent: Array<unknown> = []
      const add = Mcp.wrap(sum, {
        prefix: "calc",
        call: (name, args) =>
          Effect.suspend(() => {
            sent.push({ name, args })
            return everything.callTool({ tool: { ...sum, name }, arguments: args })
          }),
        toResult: (raw) => ({ text: (raw as { content: ReadonlyArray<{ text: string }> }).content[0]!.text })
      })
      expect(add.name).toBe("calc_get-sum")
      const agent = Agent.make({
        id: "calc",
        handler: () =>
          Effect.gen(function*() {
            const ok = yield* add({ a: 2, b: 3 })
            const invalid = yield* Effect.flip(add({ a: 1n, b: 1 }))
            return { ok, invalid: invalid._tag }
          })
      })
      const run = yield* registerAndRunReal(agent, {})
      expect(run.status).toBe("completed")
      expect(run.output).toEqual({ ok: { text: "The sum of 2 and 3 is 5." }, invalid: "InvalidArguments" })
      expect(sent).toEqual([{ name: "get-sum", args: { a: 2, b: 3 } }])
      expect(run.steps.map((s) => [s.target, s.args, s.result])).toEqual([
        ["calc_get-sum", { a: 2, b: 3 }, { text: "The sum of 2 and 3 is 5." }]
      ])
    }).pipe(Effect.provide(TestKernel.layer())))

  it.effect("outside a run an MCP tool is a type error, like every tool", () =>
    Effect.gen(function*() {
      const { filesystem } = yield* Servers
      const [first] = yield* Mcp.tools(filesystem)
      const call = () =>
        // @ts-expect-error Execution is missing from the context
        Effect.runPromise(first!({}))
      expect(typeof call).toBe("function")
      expect(ToolError).toBeDefined()
    }))
})
