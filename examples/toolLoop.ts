/**
 * A multi-turn LLM tool loop that survives a crash.
 *
 * The agent answers a question with Effect's AI toolkit: `LanguageModel.generateText`
 * with a toolkit of two durable tools (`search`, `fetch_page`) made by
 * `AiToolkit.make`, against an OpenAI-compatible model (a scripted local one,
 * over real HTTP). Every model call is an `llm_call` step (the provider's
 * `HttpClient` goes through `Llm.transformClient`), every tool call a
 * `tool_call` step.
 *
 * Midway — while `fetch_page` runs — the agent's process dies. The kernel
 * redelivers once the lease lapses; the new run walks the loop from the top,
 * but the two model answers and the search it already had come from the
 * kernel's record: the model gets 3 requests in all, not 5, and the search
 * runs once. Everything runs in this process (embedded kernel, model, agent):
 *
 *   npx tsx examples/toolLoop.ts
 */
import { NodeHttpClient, NodeHttpServer, NodeRuntime } from "@effect/platform-node"
import { Console, Context, Deferred, Effect, Exit, Layer, Redacted, Schema, Scope } from "effect"
import { LanguageModel, Prompt } from "effect/ai"
import { FetchHttpClient, HttpServer } from "effect/http"
import { Agent, AiToolkit, Client, Execution, KernelClient, Llm, Tool } from "effect-rebuno"
import * as Kernel from "effect-rebuno/kernel"
import { createServer } from "node:http"
import { pathToFileURL } from "node:url"
import * as OpenAiChat from "./support/openAiChat.js"
import * as ScriptedModel from "./support/scriptedModel.js"

const MODEL = "gpt-4o-mini"
const SECRET = "tool-loop-secret"

const color = (code: number) => (s: string) => process.stdout.isTTY ? `\x1b[${code}m${s}\x1b[0m` : s
const dim = color(2)
const bold = color(1)
const green = color(32)
const red = color(31)

/** What a run of the example shows (the test checks it). */
export interface Summary {
  readonly status: string
  readonly output: unknown
  /** Requests the model really got. */
  readonly providerCalls: number
  /** How often each tool body started. */
  readonly bodies: Readonly<Record<string, number>>
  /** The recorded steps: kind, target, status. */
  readonly steps: ReadonlyArray<readonly [string, string, string]>
  readonly deliveries: number
}

export interface Options {
  /** The kernel's lease timeout: how long the crash takes to be noticed (default 3 s). */
  readonly leaseTimeoutMs?: number | undefined
  /** Where the timeline goes (default the console). */
  readonly log?: ((line: string) => void) | undefined
}

/** The model's script: search, fetch the first hit, answer from the page. */
const script: ScriptedModel.Script = (request) => {
  const results = ScriptedModel.toolResults(request)
  if (results.length === 0) return { toolCalls: [{ name: "search", arguments: { query: ScriptedModel.question(request) } }] }
  if (results.length === 1) {
    const hits = JSON.parse(results[0]!) as ReadonlyArray<string>
    return { toolCalls: [{ name: "fetch_page", arguments: { url: hits[0] } }] }
  }
  const page = JSON.parse(results[1]!) as { readonly text: string }
  return { text: `From what I read: ${page.text}` }
}

export const main = (options: Options = {}): Effect.Effect<Summary, unknown, import("effect").Scope.Scope> =>
  Effect.gen(function*() {
    const log = options.log ?? ((line: string) => console.log(line))
    const say = (line: string) => Effect.sync(() => log(line))
    const bodies: Record<string, number> = { search: 0, fetch_page: 0 }
    /** Completed by fetch_page the first time it runs: then the "process" is killed. */
    let crashNow: Deferred.Deferred<void> | undefined = yield* Deferred.make<void>()

    // --- the tools and the loop ------------------------------------------------
    const search = Tool.make("search", {
      description: "Search the web; returns result URLs.",
      args: Schema.Struct({ query: Schema.String }),
      success: Schema.Array(Schema.String),
      execute: ({ query }) =>
        Effect.andThen(
          Effect.sync(() => bodies.search!++),
          Effect.as(say(`      ${dim("body")}  search(${JSON.stringify(query)})`), [
            "https://docs.example/durable-steps",
            "https://blog.example/replay"
          ])
        )
    })
    const fetchPage = Tool.make("fetch_page", {
      description: "Fetch a web page; returns its title and text.",
      args: Schema.Struct({ url: Schema.String }),
      success: Schema.Struct({ title: Schema.String, text: Schema.String }),
      execute: ({ url }) =>
        Effect.gen(function*() {
          bodies.fetch_page!++
          yield* say(`      ${dim("body")}  fetch_page(${url})`)
          if (crashNow !== undefined) {
            yield* Deferred.succeed(crashNow, undefined)
            return yield* Effect.never
          }
          return { title: "Durable steps", text: "each step is recorded once and replayed after a crash." }
        })
    })
    const { layer: toolkitLayer, toolkit } = AiToolkit.make(search, fetchPage)

    const model = yield* ScriptedModel.scoped((request) => {
      const reply = script(request)
      log(`      ${dim("provider")} got request #${model.calls} ${
        "text" in reply ? "→ answers" : `→ asks for ${reply.toolCalls.map((c) => c.name).join(", ")}`
      }`)
      return reply
    })
    const LanguageModelLive = OpenAiChat.layer({
      apiUrl: model.url,
      apiKey: Redacted.make("sk-local"),
      model: MODEL,
      transformClient: Llm.transformClient // every model call is an llm_call step
    }).pipe(Layer.provide(FetchHttpClient.layer))

    const researcher = Agent.make({
      id: "researcher",
      input: Schema.Struct({ question: Schema.String }),
      handler: ({ question }) =>
        Effect.gen(function*() {
          const execution = yield* Execution.Execution
          yield* say(`    ${bold("▶ run")} dispatch attempt ${execution.dispatchAttempt ?? "?"} starts from the top`)
          let prompt = Prompt.make(question)
          for (let turn = 1; turn <= 5; turn++) {
            const response = yield* LanguageModel.generateText({ prompt, toolkit })
            const calls = response.toolCalls.map((call) => call.name)
            yield* say(`    ${dim("handler")}  turn ${turn}: ${calls.length > 0 ? `the model asked for ${calls.join(", ")}` : "the model answered"}`)
            prompt = Prompt.concat(prompt, Prompt.fromResponseParts(AiToolkit.inCallOrder(response.content)))
            if (response.finishReason !== "tool-calls") return { answer: response.text }
          }
          return { answer: "(gave up)" }
        }).pipe(Effect.provide(Layer.merge(toolkitLayer, LanguageModelLive)))
    })

    // --- the kernel, the agent's "process", the crash --------------------------
    const kernel = yield* Kernel.start({ port: 0, settings: { leaseTimeoutMs: options.leaseTimeoutMs ?? 3_000 } })
    const client = Context.get(
      yield* Layer.build(Client.layer({ baseUrl: kernel.url }).pipe(Layer.provide(NodeHttpClient.layerUndici))),
      Client.Client
    )
    const serve = (port: number) =>
      Effect.gen(function*() {
        // A child scope of the program: closing it is the process dying.
        const scope = yield* Scope.fork(yield* Effect.scope, "sequential")
        const context = yield* Layer.buildWithScope(
          Agent.layer(researcher).pipe(
            Layer.provideMerge(NodeHttpServer.layer(() => createServer(), { port, host: "127.0.0.1" })),
            Layer.provide(KernelClient.layerSocket({ baseUrl: kernel.url, secret: SECRET }))
          ),
          scope
        )
        const address = Context.get(context, HttpServer.HttpServer).address
        const bound = address._tag === "UnixPathAddress" ? port : address.port
        return { port: bound, url: `http://127.0.0.1:${bound}/webhook`, kill: Scope.close(scope, Exit.void) }
      })

    yield* say(bold("\nA tool loop on effect/ai, crashed mid-loop and resumed by replay"))
    // Registered before it starts (as a manifest would), so that it can publish its metadata.
    yield* client.registerAgent({ id: "researcher", webhookUrl: "http://127.0.0.1:9/webhook", secret: SECRET })
    const first = yield* serve(0)
    yield* client.registerAgent({ id: "researcher", webhookUrl: first.url, secret: SECRET })
    const created = yield* client.create("researcher", { question: "What does a durable step do?" })
    yield* say(`    created execution ${created.id}`)

    yield* Deferred.await(crashNow)
    crashNow = undefined
    yield* first.kill
    yield* say(`    ${red("💥 the agent process died while fetching the page")} ${dim("(no outcome posted, heartbeats stopped)")}`)
    yield* serve(first.port)
    yield* say(`    agent process restarted; waiting for the lease to lapse…`)
    yield* say(dim(`    (a turn the kernel already recorded prints no provider request and no tool body: it is replayed)`))

    let done = yield* client.get(created.id)
    while (done.status !== "completed" && done.status !== "failed" && done.status !== "cancelled") {
      yield* Effect.sleep("50 millis")
      done = yield* client.get(created.id)
    }
    yield* say(`    ${done.status === "completed" ? green("✓") : red("✗")} ${done.status}: ${JSON.stringify(done.output)}`)

    const steps = yield* client.listSteps(created.id)
    const events = yield* client.events(created.id, { limit: 1000 })
    yield* say(`    ${dim("the kernel's record, in order:")}`)
    for (const event of events) {
      if (!event.type.startsWith("step.") && !event.type.startsWith("execution.") && !event.type.startsWith("dispatch.")) continue
      const payload = (event.payload ?? {}) as Record<string, unknown>
      const step = steps.find((s) => s.stepId === payload["step_id"])
      const what = step === undefined ? "" : `${step.kind.padEnd(9)} ${step.target}`
      yield* say(`      ${String(event.eventSeq).padStart(3)}  ${event.type.padEnd(20)} ${what}`)
    }
    const proposedAt = (stepId: string) =>
      events.find((e) => e.type === "step.proposed" && (e.payload as { readonly step_id?: string } | null)?.step_id === stepId)
        ?.eventSeq ?? Number.MAX_SAFE_INTEGER
    const summary: Summary = {
      status: done.status,
      output: done.output,
      providerCalls: model.calls,
      bodies: { ...bodies },
      // In the order they were proposed (startedAt has millisecond resolution: two steps can share it).
      steps: [...steps]
        .sort((a, b) => proposedAt(a.stepId) - proposedAt(b.stepId))
        .map((s) => [s.kind, s.target, s.status] as const),
      deliveries: events.filter((e) => e.type === "dispatch.acked").length
    }
    yield* say(
      `    the model got ${bold(String(summary.providerCalls))} requests for 3 turns over 2 runs; ` +
        `search ran ${bold(String(bodies.search))} time, fetch_page started ${bold(String(bodies.fetch_page))} times ` +
        `(the first died with the process)`
    )
    return summary
  })

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().pipe(
    Effect.tap((summary) => summary.status === "completed" ? Effect.void : Effect.die(new Error(summary.status))),
    Effect.scoped,
    Effect.andThen(Console.log("")),
    NodeRuntime.runMain
  )
}
