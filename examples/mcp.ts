/**
 * MCP tools as durable steps: the reference filesystem MCP server, over
 * stdio with Effect's own MCP client, gives an LLM tool loop its tools.
 *
 * `Mcp.tools(client, { prefix: "fs" })` wraps every tool of the server as it
 * is listed (`fs_read_text_file`, `fs_write_file`, …): each call the model asks
 * for is a `tool_call` step with the arguments it chose (nulls removed) and the
 * result it was shown, so a redelivered run replays it instead of calling the
 * server again. A policy makes the notes read-only: the write is denied, and
 * the model reads the denial as the tool's result —
 * `fs_write_file not allowed. reason: …` — instead of the run failing.
 *
 * Everything runs in this process (embedded kernel, a scripted
 * OpenAI-compatible model, the agent, the MCP server as a child process):
 *
 *   npx tsx examples/mcp.ts
 */
import { NodeHttpClient, NodeHttpServer, NodeRuntime, NodeServices } from "@effect/platform-node"
import { Console, Context, Effect, Layer, Redacted, Schema } from "effect"
import { LanguageModel, McpClient, McpProtocol, Prompt } from "effect/ai"
import { FetchHttpClient, HttpServer } from "effect/http"
import { ChildProcess } from "effect/process"
import { Agent, AiToolkit, Client, KernelClient, Llm, Mcp } from "effect-rebuno"
import * as Kernel from "effect-rebuno/kernel"
import { mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs"
import { createServer } from "node:http"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import type { Scope } from "effect"
import * as OpenAiChat from "./support/openAiChat.js"
import * as ScriptedModel from "./support/scriptedModel.js"

const SECRET = "librarian-secret"
/** The agent's webhook port (default: any free one). */
const AGENT_PORT = Number(process.env["AGENT_PORT"] ?? 0)

const color = (code: number) => (s: string) => process.stdout.isTTY ? `\x1b[${code}m${s}\x1b[0m` : s
const dim = color(2)
const bold = color(1)
const green = color(32)

/** The filesystem MCP server on `dir`, as a connected client for the life of the scope. */
const filesystemServer = (dir: string): Layer.Layer<McpClient.McpClient, unknown> =>
  McpClient.layerStdio({
    name: "effect-rebuno-example",
    version: "0.2.0",
    protocol: McpProtocol.v2025_11_25,
    command: ChildProcess.make(process.execPath, [
      createRequire(import.meta.url).resolve("@modelcontextprotocol/server-filesystem/dist/index.js"),
      dir
    ])
  }).pipe(Layer.provide(NodeServices.layer))

/** The notes are read-only; everything else is allowed (the current policy language). */
const POLICY = `default_action: allow
rules:
  - id: read-only-notes
    when:
      target: fs_write_file
    then:
      decision: deny
      reason: the notes are read-only
`

/** The model: list the notes, then read the first and try to write a summary, then answer. */
const script = (dir: string): ScriptedModel.Script => (request) => {
  const results = ScriptedModel.toolResults(request)
  if (results.length === 0) return { toolCalls: [{ name: "fs_list_directory", arguments: { path: dir } }] }
  if (results.length === 1) {
    const first = /\[FILE\] ([^\s"\\]+)/.exec(results[0]!)?.[1] ?? "todo.md"
    return {
      toolCalls: [
        { name: "fs_read_text_file", arguments: { path: join(dir, first), head: null } },
        { name: "fs_write_file", arguments: { path: join(dir, "SUMMARY.md"), content: "summary" } }
      ]
    }
  }
  const read = JSON.parse(results[1]!) as { readonly content: string }
  return { text: `The notes say: ${read.content.trim()} (I could not save a summary: ${results[2]})` }
}

export interface Summary {
  readonly status: string
  readonly output: unknown
  readonly steps: ReadonlyArray<{ readonly kind: string; readonly target: string; readonly status: string; readonly args: unknown; readonly result: unknown }>
  /** What the model was sent back after its second turn. */
  readonly toolMessages: ReadonlyArray<string>
  readonly summaryWritten: boolean
}

export const main = (options: { readonly log?: ((line: string) => void) | undefined } = {}): Effect.Effect<
  Summary,
  unknown,
  Scope.Scope
> =>
  Effect.gen(function*() {
    const log = options.log ?? ((line: string) => console.log(line))
    const say = (line: string) => Effect.sync(() => log(line))

    const dir = yield* Effect.acquireRelease(
      Effect.sync(() => realpathSync(mkdtempSync(join(tmpdir(), "rebuno-notes-")))),
      (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
    )
    writeFileSync(join(dir, "todo.md"), "ship the MCP example\n")
    yield* say(bold("\nMCP tools as durable steps: the filesystem server in an LLM tool loop"))
    yield* say(`    notes in ${dir}`)

    // The MCP server, and its tools as durable tools.
    const mcp = Context.get(yield* Layer.build(filesystemServer(dir)), McpClient.McpClient)
    const fsTools = yield* Mcp.tools(mcp, { prefix: "fs" })
    yield* say(`    ${fsTools.length} MCP tools: ${fsTools.map((t) => t.name).join(", ")}`)
    const { layer: toolkitLayer, toolkit } = AiToolkit.make(...fsTools)

    const model = yield* ScriptedModel.scoped(script(dir))
    const LanguageModelLive = OpenAiChat.layer({
      apiUrl: model.url,
      apiKey: Redacted.make("sk-local"),
      model: "gpt-4o-mini",
      transformClient: Llm.transformClient
    }).pipe(Layer.provide(FetchHttpClient.layer))

    const librarian = Agent.make({
      id: "librarian",
      input: Schema.Struct({ question: Schema.String }),
      handler: ({ question }) =>
        Effect.gen(function*() {
          let prompt = Prompt.make(question)
          while (true) {
            const response = yield* LanguageModel.generateText({ prompt, toolkit })
            // the read and the write run concurrently: hand their results back in call order
            prompt = Prompt.concat(prompt, Prompt.fromResponseParts(AiToolkit.inCallOrder(response.content)))
            if (response.finishReason !== "tool-calls") return { answer: response.text }
          }
        }).pipe(Effect.provide(Layer.merge(toolkitLayer, LanguageModelLive)))
    })

    // The kernel, the policy, the agent.
    const kernel = yield* Kernel.start({ port: 0 })
    const client = Context.get(
      yield* Layer.build(Client.layer({ baseUrl: kernel.url }).pipe(Layer.provide(NodeHttpClient.layerUndici))),
      Client.Client
    )
    // Registered before it starts (as a manifest would), so that it can publish its metadata.
    yield* client.registerAgent({ id: "librarian", webhookUrl: "http://127.0.0.1:9/webhook", secret: SECRET })
    const served = yield* Layer.build(
      Agent.layer(librarian).pipe(
        Layer.provideMerge(NodeHttpServer.layer(() => createServer(), { port: AGENT_PORT, host: "127.0.0.1" })),
        Layer.provide(KernelClient.layerSocket({ baseUrl: kernel.url, secret: SECRET }))
      )
    )
    const address = Context.get(served, HttpServer.HttpServer).address
    const port = address._tag === "UnixPathAddress" ? AGENT_PORT : address.port
    yield* client.registerAgent({ id: "librarian", webhookUrl: `http://127.0.0.1:${port}/webhook`, secret: SECRET })
    yield* client.loadPolicy("librarian", POLICY)
    yield* say(`    policy: ${dim("fs_write_file → deny (the notes are read-only), everything else allowed")}`)

    const created = yield* client.create("librarian", { question: "What is in my notes? Save a summary." })
    let done = yield* client.get(created.id)
    while (done.status !== "completed" && done.status !== "failed" && done.status !== "cancelled") {
      yield* Effect.sleep("50 millis")
      done = yield* client.get(created.id)
    }
    yield* say(`    ${green("✓")} ${done.status}: ${JSON.stringify(done.output)}`)

    // In the order they were proposed (a denied step never started).
    const events = yield* client.events(created.id, { limit: 1000 })
    const proposed = events.flatMap((e) =>
      e.type === "step.proposed" ? [(e.payload as { readonly step_id?: string } | null)?.step_id] : []
    )
    const steps = [...(yield* client.listSteps(created.id))].sort((a, b) =>
      proposed.indexOf(a.stepId) - proposed.indexOf(b.stepId)
    )
    yield* say(`    ${dim("the steps the kernel recorded:")}`)
    for (const step of steps) {
      const detail = step.kind === "llm_call"
        ? dim(`(a request of ${(step.args as { messages: ReadonlyArray<unknown> }).messages.length} message(s))`)
        : `${JSON.stringify(step.args)} → ${step.status === "succeeded" ? JSON.stringify(step.result) : step.status}`
      yield* say(`      ${step.kind.padEnd(9)} ${step.target.padEnd(18)} ${detail}`)
    }
    const toolMessages = (model.requests[2]?.messages ?? []).flatMap((m) =>
      m.role === "tool" && m.content !== undefined && m.content !== null ? [m.content] : []
    )
    yield* say(`    ${dim("what the model was shown for its last turn:")}`)
    for (const message of toolMessages) yield* say(`      tool → ${message}`)
    let summaryWritten = true
    try {
      readFileSync(join(dir, "SUMMARY.md"))
    } catch {
      summaryWritten = false
    }
    yield* say(`    SUMMARY.md written: ${bold(String(summaryWritten))}`)
    return {
      status: done.status,
      output: done.output,
      steps: steps.map((s) => ({ kind: s.kind, target: s.target, status: s.status, args: s.args, result: s.result })),
      toolMessages,
      summaryWritten
    }
  })

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().pipe(
    Effect.scoped,
    Effect.andThen(Console.log("")),
    NodeRuntime.runMain
  )
}
