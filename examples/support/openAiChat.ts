/**
 * A small Effect-native `LanguageModel` for OpenAI-compatible chat-completions
 * endpoints, built on `effect/http` the way Effect's provider clients are: the
 * `HttpClient` from context, the API URL and bearer token on every request, a
 * `transformClient` hook (where `Llm.transformClient` goes, so that every model
 * call is an `llm_call` step), then only 2xx answers accepted.
 *
 * It speaks what a tool loop needs: system / user / assistant / tool messages,
 * function tools with their JSON Schemas, `tool_choice`, tool calls in the
 * answer, the finish reason and token usage. A real application would use a
 * provider package; this one keeps the examples and tests self-contained.
 *
 * An error answer fails with an `AiError` whose description is the answer's
 * body, so `Llm.liftRefusals` finds a kernel refusal behind it.
 */
import { Effect, flow, Layer, Redacted, Schema, Stream } from "effect"
import { AiError, LanguageModel, Prompt, Tool } from "effect/ai"
import type { Response } from "effect/ai"
import { HttpClient, HttpClientRequest } from "effect/http"

export interface Options {
  /** Base URL including `/v1`. */
  readonly apiUrl: string
  readonly apiKey: Redacted.Redacted<string>
  readonly model: string
  /** Applied to the provider's client, e.g. `Llm.transformClient`. */
  readonly transformClient?: ((client: HttpClient.HttpClient) => HttpClient.HttpClient) | undefined
}

const ToolCall = Schema.Struct({
  id: Schema.String,
  function: Schema.Struct({ name: Schema.String, arguments: Schema.String })
})

const Completion = Schema.Struct({
  id: Schema.optional(Schema.String),
  model: Schema.optional(Schema.String),
  choices: Schema.Array(Schema.Struct({
    message: Schema.Struct({
      content: Schema.optional(Schema.NullOr(Schema.String)),
      tool_calls: Schema.optional(Schema.NullOr(Schema.Array(ToolCall)))
    }),
    finish_reason: Schema.optional(Schema.NullOr(Schema.String))
  })),
  usage: Schema.optional(Schema.Struct({
    prompt_tokens: Schema.optional(Schema.Number),
    completion_tokens: Schema.optional(Schema.Number)
  }))
})
const decodeCompletion = Schema.decodeUnknownEffect(Schema.fromJsonString(Completion))

type ChatMessage = Record<string, unknown>

/** The prompt as chat-completions messages. */
const toMessages = (prompt: Prompt.Prompt): ReadonlyArray<ChatMessage> => {
  const messages: Array<ChatMessage> = []
  for (const message of prompt.content) {
    switch (message.role) {
      case "system":
        messages.push({ role: "system", content: message.content })
        break
      case "user":
        messages.push({
          role: "user",
          content: message.content.map((part) => part.type === "text" ? part.text : `[${part.mediaType}]`).join("")
        })
        break
      case "assistant": {
        const text = message.content.flatMap((part) => part.type === "text" ? [part.text] : []).join("")
        const calls = message.content.flatMap((part) =>
          part.type === "tool-call" && !part.providerExecuted
            ? [{ id: part.id, type: "function", function: { name: part.name, arguments: JSON.stringify(part.params) } }]
            : []
        )
        messages.push({ role: "assistant", content: text === "" ? null : text, ...(calls.length > 0 ? { tool_calls: calls } : {}) })
        break
      }
      case "tool":
        for (const part of message.content) {
          if (part.type !== "tool-result") continue
          messages.push({
            role: "tool",
            tool_call_id: part.id,
            content: typeof part.result === "string" ? part.result : JSON.stringify(part.result)
          })
        }
        break
    }
  }
  return messages
}

const toolChoiceOf = (choice: LanguageModel.ProviderOptions["toolChoice"]): unknown => {
  if (typeof choice === "string") return choice
  if ("tool" in choice) return { type: "function", function: { name: choice.tool } }
  return choice.mode ?? "auto"
}

const finishReasonOf = (reason: string | null | undefined): Response.FinishReason => {
  switch (reason) {
    case "stop":
      return "stop"
    case "length":
      return "length"
    case "tool_calls":
      return "tool-calls"
    case "content_filter":
      return "content-filter"
    default:
      return "unknown"
  }
}

const fail = (method: string, reason: AiError.AiErrorReason) => AiError.make({ module: "OpenAiChat", method, reason })

export const make = (options: Options): Effect.Effect<LanguageModel.LanguageModel, never, HttpClient.HttpClient> =>
  Effect.gen(function*() {
    const client = (yield* HttpClient.HttpClient).pipe(
      HttpClient.mapRequest(flow(
        HttpClientRequest.prependUrl(options.apiUrl),
        HttpClientRequest.bearerToken(Redacted.value(options.apiKey)),
        HttpClientRequest.acceptJson
      )),
      options.transformClient ?? ((client) => client)
    )

    const generateText = (provider: LanguageModel.ProviderOptions) =>
      Effect.gen(function*() {
        const tools = provider.tools.map((tool) => ({
          type: "function",
          function: {
            name: tool.name,
            ...(tool.description === undefined ? {} : { description: tool.description }),
            parameters: Tool.getJsonSchema(tool)
          }
        }))
        const body = {
          model: options.model,
          messages: toMessages(provider.prompt),
          ...(tools.length > 0 ? { tools, tool_choice: toolChoiceOf(provider.toolChoice) } : {})
        }
        const response = yield* client.execute(
          HttpClientRequest.post("/chat/completions").pipe(HttpClientRequest.bodyJsonUnsafe(body))
        ).pipe(
          Effect.mapError((cause) =>
            fail("generateText", new AiError.NetworkError({
              reason: "TransportError",
              method: "POST",
              url: `${options.apiUrl}/chat/completions`,
              description: cause.message
            }))
          )
        )
        const text = yield* Effect.orElseSucceed(response.text, () => "")
        if (response.status < 200 || response.status >= 300) {
          return yield* fail("generateText", AiError.reasonFromHttpStatus({ status: response.status, description: text }))
        }
        const completion = yield* decodeCompletion(text).pipe(
          Effect.mapError((cause) =>
            fail("generateText", new AiError.InvalidResponseError({ description: cause.message }))
          )
        )
        const choice = completion.choices[0]
        const parts: Array<Response.PartEncoded> = []
        if (choice?.message.content) parts.push({ type: "text", text: choice.message.content })
        for (const call of choice?.message.tool_calls ?? []) {
          const params = yield* Effect.try({
            try: () => JSON.parse(call.function.arguments) as unknown,
            catch: () =>
              fail("generateText", new AiError.InvalidResponseError({ description: "tool call arguments are not JSON" }))
          })
          parts.push({ type: "tool-call", id: call.id, name: call.function.name, params })
        }
        parts.push({
          type: "finish",
          reason: finishReasonOf(choice?.finish_reason),
          usage: {
            inputTokens: { total: completion.usage?.prompt_tokens },
            outputTokens: { total: completion.usage?.completion_tokens }
          }
        })
        return parts
      })

    return yield* LanguageModel.make({
      generateText,
      // Not a streaming client: the whole answer, cut into stream parts.
      streamText: (provider) =>
        Stream.unwrap(Effect.map(generateText(provider), (parts) =>
          Stream.fromIterable(parts.flatMap((part): ReadonlyArray<Response.StreamPartEncoded> =>
            part.type === "text"
              ? [
                { type: "text-start", id: "0" },
                { type: "text-delta", id: "0", delta: part.text },
                { type: "text-end", id: "0" }
              ]
              : [part as Response.StreamPartEncoded]
          ))))
    })
  })

export const layer = (options: Options): Layer.Layer<LanguageModel.LanguageModel, never, HttpClient.HttpClient> =>
  Layer.effect(LanguageModel.LanguageModel, make(options))
