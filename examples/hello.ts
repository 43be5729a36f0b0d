/**
 * The hello agent: two durable tools, drop-in compatible with the reference
 * kernel's dev manifest (agent id `hello`, webhook `POST /webhook`).
 *
 *   REBUNO_URL          kernel base URL      (default http://localhost:8080)
 *   REBUNO_AGENT_SECRET agent secret         (default hello-secret)
 *   AGENT_PORT          webhook port         (default 5000)
 *
 * Run a kernel (`npm run kernel -- dev --config examples/rebuno.dev.yaml`, or
 * the reference `rebuno dev --config examples/rebuno.v0.14.yaml`), then
 * `npx tsx examples/hello.ts`, then create an execution:
 *
 *   curl -s localhost:8080/v0/executions -d '{"agent_id":"hello","input":{"query":"hello world"}}'
 *
 * When something is off, both sides say so: with a `REBUNO_AGENT_SECRET` that
 * is not the manifest's, this agent logs every webhook it rejects (`webhook
 * request rejected (401): bad signature: … compare REBUNO_AGENT_SECRET …`) and
 * the kernel every failed delivery (`webhook delivery to agent hello failed:
 * the agent answered 401 Unauthorized …`); with no agent listening, the kernel
 * logs `connection refused (is the agent running and listening at …?)`.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Config, Effect, Layer, Redacted, Schema } from "effect"
import { Agent, KernelClient, Tool } from "effect-rebuno"
import { pathToFileURL } from "node:url"

/** Reverses a string by Unicode code points. */
export const reverse = Tool.make("reverse", {
  description: "Reverse a string.",
  args: Schema.Struct({ text: Schema.String }),
  success: Schema.Struct({ reversed: Schema.String }),
  execute: ({ text }) => Effect.succeed({ reversed: Array.from(text).reverse().join("") })
})

/** Counts whitespace-separated words. */
export const wordCount = Tool.make("word_count", {
  description: "Count words in a string.",
  args: Schema.Struct({ text: Schema.String }),
  success: Schema.Struct({ count: Schema.Number }),
  execute: ({ text }) => Effect.succeed({ count: text.split(/\s+/).filter((word) => word.length > 0).length })
})

/** The `hello` agent: `{ query }` in, `{ query, reversed, word_count }` out. */
export const hello = Agent.make({
  id: "hello",
  input: Schema.Struct({ query: Schema.String }),
  output: Schema.Struct({ query: Schema.String, reversed: Schema.String, word_count: Schema.Number }),
  handler: ({ query }) =>
    Effect.gen(function*() {
      const { reversed } = yield* reverse({ text: query })
      const { count } = yield* wordCount({ text: query })
      yield* Effect.log(`reversed=${reversed} count=${count}`)
      return { query, reversed, word_count: count }
    })
})

/** The kernel client, configured like the reference kernel's examples. */
export const KernelLive = Layer.unwrap(
  Effect.gen(function*() {
    const baseUrl = yield* Config.String("REBUNO_URL").pipe(Config.withDefault("http://localhost:8080"))
    const secret = yield* Config.Redacted("REBUNO_AGENT_SECRET").pipe(
      Config.withDefault(Redacted.make("hello-secret"))
    )
    return KernelClient.layerSocket({ baseUrl, secret })
  })
)

/** Serve the webhook on `AGENT_PORT` (default 5000). */
export const HelloLive = Layer.unwrap(
  Effect.gen(function*() {
    const port = yield* Config.Int("AGENT_PORT").pipe(Config.withDefault(5000))
    yield* Effect.log(`hello agent listening on :${port}`)
    return Agent.serve(hello, { port })
  })
).pipe(Layer.provide(KernelLive))

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  Layer.launch(HelloLive).pipe(NodeRuntime.runMain)
}
