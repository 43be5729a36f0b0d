/**
 * Durable tools as the tools of Effect's AI toolkit (`effect/ai` `Tool` and
 * `Toolkit`): an LLM tool loop built with `LanguageModel.generateText` (or
 * `Chat`) over this toolkit records every tool call the model asks for as a
 * `tool_call` step. Model calls are recorded by the provider's `HttpClient`
 * (`Llm.transformClient` / `Llm.layerHttpClient`) as `llm_call` steps, so a
 * re-delivered run replays the whole loop — model answers and tool results —
 * without calling the provider or the tools again, up to where it stopped.
 *
 * Effect separates a tool's definition from its handler; a durable
 * {@link Tool.Tool} has both, so {@link make} derives the definition and calls
 * the tool as the handler:
 *
 * - parameters: the tool's `argsSchema` (an MCP tool advertises the server's
 *   JSON Schema as it is, as `McpClient.toolkit` does);
 * - success: the tool's `successSchema`, or the denial text (see below);
 * - failure: every step error ({@link StepErrorSchema}) and the tool's own
 *   `failureSchema`, with failure mode `"error"`: a run signal (`Blocked`,
 *   `Terminated`, …) reaches `generateText`'s caller typed and unwinds the run;
 * - `dependencies: [Execution]`: a model call with these tools outside a run is
 *   a type error, as calling a tool is;
 * - the `Idempotent` annotation says whether the tool is `safe_to_retry`.
 *
 * A denied call gives the model `<name> not allowed. reason: <reason>` as the
 * tool's result (PROTOCOL.md 14.6: the model sees the denial), unless
 * `denials: "error"` is chosen.
 *
 * @since 0.2.0
 */
import { Effect, Layer, Schema } from "effect"
import { Tool as AiTool, Toolkit } from "effect/ai"
import type { Response } from "effect/ai"
import { Execution } from "./Execution.js"
import * as Mcp from "./Mcp.js"
import { CheckpointUnavailable } from "./Resource.js"
import {
  Abandoned,
  Blocked,
  InvalidArguments,
  KernelError,
  LeaseSuperseded,
  PolicyError,
  RateLimited,
  StepDecodeError,
  Terminated,
  ToolError
} from "./RebunoError.js"
import * as Tool from "./Tool.js"

/**
 * Every error a durable tool call raises by itself (`Step.StepError`), as a
 * schema: the failure of each toolkit tool.
 *
 * @since 0.2.0
 * @category schemas
 */
export const StepErrorSchema = Schema.Union([
  PolicyError,
  RateLimited,
  Blocked,
  Terminated,
  LeaseSuperseded,
  Abandoned,
  ToolError,
  InvalidArguments,
  StepDecodeError,
  KernelError,
  CheckpointUnavailable
])

/**
 * Any durable tool.
 *
 * @since 0.2.0
 * @category models
 */
export type AnyTool = Tool.Tool<any, any, any, any>

/**
 * What a denied call gives the model: `"text"` (default) the denial text as the
 * tool's result; `"error"` a `PolicyError` out of `generateText`.
 *
 * @since 0.2.0
 * @category models
 */
export type Denials = "text" | "error"

/**
 * The options of {@link make} / {@link makeWith} and {@link toAiTool}.
 *
 * @since 0.2.0
 * @category models
 */
export interface Options<D extends Denials = "text"> {
  readonly denials?: D | undefined
}

type ArgsOf<T> = T extends Tool.Tool<infer A, any, any, any> ? A : never
type SuccessOf<T> = T extends Tool.Tool<any, infer S, any, any> ? S : never
type FailureOf<T> = T extends Tool.Tool<any, any, infer F, any> ? F : never

/**
 * The services a tool's calls need besides `Execution`: the toolkit's layer
 * requires them.
 *
 * @since 0.2.0
 * @category models
 */
export type Services<T> = T extends (args: any) => Effect.Effect<any, any, infer R> ? Exclude<R, Execution> : never

/**
 * The `effect/ai` tool derived from a durable tool.
 *
 * @since 0.2.0
 * @category models
 */
export type AiToolOf<T extends AnyTool, D extends Denials = "text"> = AiTool.Tool<
  string,
  {
    readonly parameters: ArgsOf<T>
    readonly success: D extends "error" ? SuccessOf<T> : Schema.Union<readonly [SuccessOf<T>, Schema.String]>
    readonly failure: Schema.Union<readonly [typeof StepErrorSchema, FailureOf<T>]>
    readonly failureMode: "error"
  },
  Execution
>

/**
 * The toolkit's tools by name.
 *
 * @since 0.2.0
 * @category models
 */
export type ToolsOf<Tools extends ReadonlyArray<AnyTool>, D extends Denials = "text"> = Record<
  string,
  AiToolOf<Tools[number], D>
>

/**
 * A toolkit and the layer of its handlers: pass `toolkit` to
 * `LanguageModel.generateText` (or `Chat`) and provide `layer` to the program.
 *
 * @since 0.2.0
 * @category models
 */
export interface AiToolkit<Tools extends ReadonlyArray<AnyTool>, D extends Denials = "text"> {
  readonly toolkit: Toolkit.Toolkit<ToolsOf<Tools, D>>
  readonly layer: Layer.Layer<AiTool.HandlersFor<ToolsOf<Tools, D>>, never, Services<Tools[number]>>
  /** The durable tools, in the order given. */
  readonly tools: Tools
}

/**
 * The `effect/ai` definition of a durable tool (see the module comment). Use
 * {@link make} to get a toolkit with handlers; this is for composing your own.
 *
 * @since 0.2.0
 * @category constructors
 */
export const toAiTool = <T extends AnyTool, D extends Denials = "text">(
  tool: T,
  options?: Options<D>
): AiToolOf<T, D> => {
  const text = (options?.denials ?? "text") === "text"
  const success: Schema.Top = text ? Schema.Union([tool.successSchema, Schema.String]) : tool.successSchema
  const failure = tool.failureSchema === undefined
    ? StepErrorSchema
    : Schema.Union([StepErrorSchema, tool.failureSchema as Schema.Top])
  const defined = Mcp.isMcpTool(tool)
    // The server's JSON Schema as it is; no local validation (`McpClient.toolkit` does the same).
    ? AiTool.dynamic(tool.name, {
      description: tool.description,
      parameters: tool.inputSchema,
      success,
      failure,
      failureMode: "error"
    }).annotate(AiTool.Strict, false)
    : AiTool.make(tool.name, {
      description: tool.description,
      parameters: tool.argsSchema as Schema.Top,
      success,
      failure,
      failureMode: "error"
    })
  return defined
    .addDependency(Execution)
    .annotate(AiTool.Idempotent, tool.idempotency === "safe_to_retry") as unknown as AiToolOf<T, D>
}

const handlerOf = (tool: AnyTool, denials: Denials) => {
  const call = denials === "text" ? Tool.denialAsText(tool) : tool
  return (params: unknown) => call(params) as Effect.Effect<unknown, unknown, unknown>
}

const build = <Tools extends ReadonlyArray<AnyTool>, D extends Denials>(
  tools: Tools,
  options: Options<D> | undefined
): AiToolkit<Tools, D> => {
  const denials = options?.denials ?? "text"
  const seen = new Set<string>()
  const handlers: Record<string, (params: unknown) => Effect.Effect<unknown, unknown, unknown>> = {}
  for (const tool of tools) {
    if (seen.has(tool.name)) throw new Error(`AiToolkit.make: two tools are named ${JSON.stringify(tool.name)}`)
    seen.add(tool.name)
    handlers[tool.name] = handlerOf(tool, denials)
  }
  const toolkit = Toolkit.make(...tools.map((tool) => toAiTool(tool, options))) as unknown as Toolkit.Toolkit<
    ToolsOf<Tools, D>
  >
  // The handlers run in the caller's context (the run's `Execution`) merged
  // with the context the layer was built in (the tools' other services).
  const layer = Layer.effectContext(
    (toolkit as unknown as Toolkit.Toolkit<Record<string, AiTool.Any>>).toHandlers(handlers as never)
  ) as unknown as Layer.Layer<AiTool.HandlersFor<ToolsOf<Tools, D>>, never, Services<Tools[number]>>
  return { toolkit, layer, tools }
}

/**
 * A toolkit of durable tools, and the layer of its handlers. Each tool call the
 * model asks for is a call of the durable tool: a `tool_call` step, replayed on
 * re-delivery, governed by policy; a denied call gives the model the denial
 * text.
 *
 * **Gotchas**
 *
 * - Tool names must be unique (it throws otherwise); they are the step targets.
 * - Record the model calls too: give the provider's client
 *   `Llm.transformClient` (or provide `Llm.layerHttpClient` under it), so that
 *   a replayed loop sends the same requests and gets the recorded answers.
 * - Keep the conversation the same on replay. `generateText` runs the tool
 *   calls of one answer concurrently (its `concurrency` option, default
 *   unbounded) and returns their results in the order they finish; a replay
 *   finishes them in another order, and the next model request — whose body is
 *   the `llm_call` step's identity — would differ, so it would be sent to the
 *   provider again instead of replayed. Build the next prompt from
 *   {@link inCallOrder}`(response.content)`, or pass `concurrency: 1` (needed
 *   with `Chat`, which appends the parts itself).
 *
 * **Example** (A tool loop whose every call is a step)
 *
 * ```ts
 * import { Effect, Layer, Schema } from "effect"
 * import { LanguageModel, Prompt } from "effect/ai"
 * import { Agent, AiToolkit, Tool } from "effect-rebuno"
 *
 * const search = Tool.make("search", {
 *   description: "Search the web; returns result URLs.",
 *   args: Schema.Struct({ query: Schema.String }),
 *   success: Schema.Array(Schema.String),
 *   execute: ({ query }) => Effect.succeed([`https://example.com/search?q=${encodeURIComponent(query)}`])
 * })
 * const fetchPage = Tool.make("fetch_page", {
 *   description: "Fetch a web page; returns its text.",
 *   args: Schema.Struct({ url: Schema.String }),
 *   success: Schema.String,
 *   execute: ({ url }) => Effect.tryPromise(() => fetch(url).then((response) => response.text()))
 * })
 *
 * // your provider's LanguageModel, its HttpClient through Llm.transformClient (model calls are steps too)
 * declare const LanguageModelLive: Layer.Layer<LanguageModel.LanguageModel>
 *
 * const { toolkit, layer } = AiToolkit.make(search, fetchPage)
 *
 * const answer = (question: string) =>
 *   Effect.gen(function*() {
 *     let prompt = Prompt.make(question)
 *     while (true) {
 *       // an llm_call step, then a tool_call step per tool call the model asks for
 *       const response = yield* LanguageModel.generateText({ prompt, toolkit })
 *       prompt = Prompt.concat(prompt, Prompt.fromResponseParts(AiToolkit.inCallOrder(response.content)))
 *       if (response.finishReason !== "tool-calls") return response.text
 *     }
 *   })
 *
 * const researcher = Agent.make({
 *   id: "researcher",
 *   input: Schema.Struct({ question: Schema.String }),
 *   handler: ({ question }) => answer(question).pipe(Effect.provide(Layer.merge(layer, LanguageModelLive)))
 * })
 * ```
 *
 * @since 0.2.0
 * @category constructors
 */
export const make = <const Tools extends ReadonlyArray<AnyTool>>(...tools: Tools): AiToolkit<Tools> =>
  build(tools, undefined)

/**
 * {@link make} with options: `denials: "error"` lets a denial fail
 * `generateText` with `PolicyError` instead of answering the model.
 *
 * @since 0.2.0
 * @category constructors
 */
export const makeWith = <D extends Denials>(options: Options<D>) =>
<const Tools extends ReadonlyArray<AnyTool>>(...tools: Tools): AiToolkit<Tools, D> => build(tools, options)

/**
 * The parts of a response with the tool results in the order of their tool
 * calls (every other part stays where it is). Concurrent tool calls finish in
 * any order, and a replay finishes them in another one; building the next
 * prompt from the parts in call order keeps the next model request — the
 * identity of its `llm_call` step — the same, so it is replayed rather than
 * sent again.
 *
 * @example
 * ```ts
 * import { Effect, Schema } from "effect"
 * import { LanguageModel, Prompt } from "effect/ai"
 * import { AiToolkit, Tool } from "effect-rebuno"
 *
 * const search = Tool.make("search", {
 *   description: "Search the web.",
 *   args: Schema.Struct({ query: Schema.String }),
 *   success: Schema.Array(Schema.String),
 *   execute: ({ query }) => Effect.succeed([`result for ${query}`])
 * })
 *
 * const { layer, toolkit } = AiToolkit.make(search)
 *
 * const answer = (question: string) =>
 *   Effect.gen(function*() {
 *     let prompt = Prompt.make(question)
 *     while (true) {
 *       const response = yield* LanguageModel.generateText({ prompt, toolkit })
 *       prompt = Prompt.concat(prompt, Prompt.fromResponseParts(AiToolkit.inCallOrder(response.content)))
 *       if (response.finishReason !== "tool-calls") return response.text
 *     }
 *   }).pipe(Effect.provide(layer))
 * ```
 *
 * @since 0.2.0
 * @category prompts
 */
export const inCallOrder = <P extends Response.AnyPart>(parts: ReadonlyArray<P>): Array<P> => {
  const order = new Map<string, number>()
  for (const part of parts) if (part.type === "tool-call" && !order.has(part.id)) order.set(part.id, order.size)
  const rank = (part: P) => order.get((part as { readonly id: string }).id) ?? order.size
  const results = parts.filter((part) => part.type === "tool-result").sort((a, b) => rank(a) - rank(b))
  let next = 0
  return parts.map((part) => part.type === "tool-result" ? results[next++]! : part)
}
