/**
 * A durable LLM call with the official `openai` client.
 *
 * The handler gives the client `fetch: yield* Llm.makeFetch()`, so each chat
 * completion becomes an `llm_call` step: recorded the first time, replayed
 * without calling the provider when the kernel redelivers the run, and subject
 * to policy like any tool call (a denial surfaces as `PolicyError`).
 *
 * Everything runs in this process — the embedded kernel, a local
 * OpenAI-compatible fake provider and the agent:
 *
 *   npx tsx examples/llm.ts
 *
 * Set OPENAI_API_KEY (and optionally OPENAI_BASE_URL, OPENAI_MODEL) to talk to a
 * real provider instead of the fake.
 */
import { NodeHttpClient, NodeRuntime } from "@effect/platform-node"
import { Console, Effect, Layer, Schema } from "effect"
import OpenAI from "openai"
import { Agent, Client, KernelClient, Llm, Protocol } from "effect-rebuno"
import * as Kernel from "effect-rebuno/kernel"
import * as FakeOpenAi from "../test/support/fakeOpenAi.js"

const SECRET = "assistant-secret"
const AGENT_PORT = Number(process.env["AGENT_PORT"] ?? 5002)

interface Provider {
  readonly baseURL: string
  readonly apiKey: string
  readonly model: string
}

const assistant = (provider: Provider) =>
  Agent.make({
    id: "assistant",
    input: Schema.Struct({ question: Schema.String }),
    handler: ({ question }) =>
      Effect.gen(function*() {
        // A fetch bound to this run: the client's requests become llm_call steps.
        const openai = new OpenAI({ baseURL: provider.baseURL, apiKey: provider.apiKey, fetch: yield* Llm.makeFetch() })
        const completion = yield* Effect.tryPromise(() =>
          openai.chat.completions.create({ model: provider.model, messages: [{ role: "user", content: question }] })
        ).pipe(Llm.liftRefusals) // a refusal (403 / 429) becomes PolicyError, RateLimited, Blocked, …
        return { answer: completion.choices[0]?.message.content ?? "" }
      })
  })

const main = Effect.gen(function*() {
  const apiKey = process.env["OPENAI_API_KEY"]
  const fake = apiKey === undefined
    ? yield* FakeOpenAi.scoped({ reply: "A durable step is recorded once and replayed after a crash." })
    : undefined
  const provider: Provider = fake === undefined
    ? {
      baseURL: process.env["OPENAI_BASE_URL"] ?? "https://api.openai.com/v1",
      apiKey: apiKey!,
      model: process.env["OPENAI_MODEL"] ?? "gpt-4o-mini"
    }
    : { baseURL: fake.url, apiKey: "sk-fake", model: "gpt-4o-mini" }

  const kernel = yield* Kernel.start()
  yield* Console.log(`kernel on ${kernel.url}`)
  const client = yield* Client.make({ baseUrl: kernel.url })
  yield* client.registerAgent({
    id: "assistant",
    webhookUrl: `http://127.0.0.1:${AGENT_PORT}/webhook`,
    secret: SECRET
  })
  yield* Layer.build(
    Agent.serve(assistant(provider), { port: AGENT_PORT, host: "127.0.0.1" }).pipe(
      Layer.provide(KernelClient.layer({ baseUrl: kernel.url, secret: SECRET }))
    )
  )

  const created = yield* client.create("assistant", { question: "What does a durable step do?" })
  const done = yield* client.get(created.id).pipe(
    Effect.delay("100 millis"),
    Effect.repeat({ until: (e) => Protocol.isTerminalStatus(e.status) })
  )
  yield* Console.log(`execution ${done.status}:`, done.output)
  for (const step of yield* client.listSteps(created.id)) {
    yield* Console.log(`  step ${step.kind} ${step.target}: ${step.status}`)
  }
  if (fake !== undefined) yield* Console.log(`provider calls: ${fake.calls}`)
})

main.pipe(Effect.scoped, Effect.provide(NodeHttpClient.layerUndici), NodeRuntime.runMain)
