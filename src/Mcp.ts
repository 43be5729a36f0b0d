/**
 * MCP tools as durable tools (PROTOCOL-CURRENT C.11): every tool of an MCP
 * server becomes a {@link Tool.Tool} whose calls are `tool_call` steps,
 * wrapped the way the official SDKs wrap them — same step target, arguments,
 * recorded result and denial text — so that a run replays an MCP call from the
 * kernel's record instead of calling the server again, and policy governs MCP
 * tools like any other tool.
 *
 * {@link tools} lists the tools of a connected `effect/ai` `McpClient` (the
 * stdio or Streamable HTTP transport of Effect's own MCP client) and wraps
 * each; {@link wrap} wraps one descriptor around any MCP invocation you bring
 * (`wrapMcpTool` of the official SDKs). The result is an ordinary `Tool`:
 * call it inside a handler, or hand it to an LLM tool loop through
 * `AiToolkit`.
 *
 * @since 0.2.0
 */
import { Effect, JsonSchema, Predicate, Schema } from "effect"
import type { Duration } from "effect"
import type { McpClient, McpClientError } from "effect/ai"
import { McpSchema } from "effect/ai"
import type { Idempotency } from "./Step.js"
import * as Tool from "./Tool.js"

/**
 * The arguments of an MCP tool: a JSON object, as the model produced it.
 * Members whose value is `null` or `undefined` are removed before the call
 * (C.11).
 *
 * @since 0.2.0
 * @category schemas
 */
export const Arguments: Schema.$Record<Schema.String, Schema.Unknown> = Schema.Record(Schema.String, Schema.Unknown)

/**
 * A wrapped MCP tool: a {@link Tool.Tool} whose step target is the prefixed
 * name, with the server's own name and input JSON Schema.
 *
 * - `name`: the step target and the name the model sees, `<prefix>_<name>`
 *   with a prefix, else the server's name;
 * - `mcpName`: the name the server knows (what the MCP call receives);
 * - `jsonSchema` and `inputSchema`: the server's input JSON Schema, as given;
 * - the success is whatever the result shape gives (see {@link toResult}),
 *   or the denial text.
 *
 * @since 0.2.0
 * @category models
 */
export interface McpTool<R = never> extends Tool.Tool<typeof Arguments, typeof Schema.Unknown, typeof Schema.Never, R> {
  readonly [TypeId]: TypeId
  readonly mcpName: string
  readonly inputSchema: JsonSchema.JsonSchema
}

/**
 * The mark of a wrapped MCP tool (a string, so that the guard holds across two
 * copies of the package).
 *
 * @since 0.2.0
 * @category type ids
 */
export const TypeId = "~effect-rebuno/McpTool" as const

/**
 * @since 0.2.0
 * @category type ids
 */
export type TypeId = typeof TypeId

/**
 * Whether a value is a wrapped MCP tool.
 *
 * @since 0.2.0
 * @category guards
 */
export const isMcpTool = (u: unknown): u is McpTool<unknown> => Predicate.hasProperty(u, TypeId)

/**
 * What {@link wrap} reads of an MCP tool descriptor: `name`, `description`
 * and `inputSchema` (an `effect/ai` `McpSchema.Tool`, or the JSON of a
 * `tools/list` entry).
 *
 * @since 0.2.0
 * @category models
 */
export interface Descriptor {
  readonly name: string
  readonly description?: string | undefined
  readonly inputSchema?: unknown
}

/**
 * The options shared by {@link wrap} and {@link tools}.
 *
 * @since 0.2.0
 * @category models
 */
export interface Options<Raw = unknown> {
  /** Namespace of the step target: `<prefix>_<name>` (default none: the server's name). */
  readonly prefix?: string | undefined
  /** `safe_to_retry` (default) for reads; `at_most_once` for writes that must not run again on resume. */
  readonly idempotency?: Idempotency | undefined
  /** Map the raw result to what is recorded and returned (default {@link toResult}). */
  readonly toResult?: ((raw: Raw) => unknown) | undefined
}

/**
 * The options of {@link wrap}: {@link Options} plus the MCP invocation.
 *
 * @since 0.2.0
 * @category models
 */
export interface WrapOptions<E, R> extends Options {
  /**
   * Call the tool on the server: it receives the server's (unprefixed) name
   * and the recorded arguments. A failure is recorded and raised as a
   * `ToolError`.
   */
  readonly call: (name: string, args: Readonly<Record<string, unknown>>) => Effect.Effect<unknown, E, R>
}

/**
 * The default result shape of the official SDKs (C.11), reading object keys
 * as the TypeScript SDK does:
 *
 * 1. the raw result's `structuredContent` (or `structured_content`) when
 *    present;
 * 2. else, when it has a `content` array, the texts of its blocks — a block of
 *    type `text` gives its `text`, any other block its JSON text — one block →
 *    that string, several → joined with `\n`, none → `""`;
 * 3. else the raw value.
 *
 * **Gotchas**
 *
 * A result the server marks `isError: true` is shaped the same way, as the
 * official SDKs do: its text is what the model sees and what is recorded.
 * Pass your own `toResult` to treat it differently.
 *
 * @example
 * ```ts
 * import { Mcp } from "effect-rebuno"
 *
 * Mcp.toResult({ content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] }) // "a\nb"
 * Mcp.toResult({ content: [], structuredContent: { n: 1 } }) // { n: 1 }
 * ```
 *
 * @since 0.2.0
 * @category results
 */
export const toResult = (raw: unknown): unknown => {
  if (typeof raw !== "object" || raw === null) return raw
  const record = raw as Record<string, unknown>
  const structured = record["structuredContent"] ?? record["structured_content"]
  if (structured !== undefined && structured !== null) return structured
  const content = record["content"]
  if (!Array.isArray(content)) return raw
  const texts = content.map((block: unknown) =>
    Predicate.isObject(block) && (block as { readonly type?: unknown }).type === "text" &&
      typeof (block as { readonly text?: unknown }).text === "string"
      ? (block as { readonly text: string }).text
      : JSON.stringify(block)
  )
  return texts.length === 1 ? texts[0] : texts.join("\n")
}

/**
 * The arguments with every member whose value is `null` or `undefined`
 * removed (models often fill optional fields with `null`, which MCP servers
 * reject). Anything but a plain object is returned as is (and then refused as
 * `InvalidArguments`).
 *
 * @since 0.2.0
 * @category arguments
 */
export const stripNullish = (args: unknown): unknown => {
  if (typeof args !== "object" || args === null || Array.isArray(args)) return args
  const out: Record<string, unknown> = {}
  for (const [key, value] of Object.entries(args)) {
    if (value !== null && value !== undefined) out[key] = value
  }
  return out
}

/**
 * The step target of an MCP tool: `<prefix>_<name>` with a non-empty prefix,
 * else `name`.
 *
 * @since 0.2.0
 * @category naming
 */
export const target = (name: string, prefix?: string | undefined): string =>
  prefix === undefined || prefix === "" ? name : `${prefix}_${name}`

const inputSchemaOf = (descriptor: Descriptor): JsonSchema.JsonSchema =>
  Predicate.isObject(descriptor.inputSchema) ? descriptor.inputSchema as JsonSchema.JsonSchema : {}

/**
 * Wrap one MCP tool descriptor around your MCP invocation (`wrapMcpTool` of
 * the official SDKs, C.11). Each call of the returned tool:
 *
 * - removes the `null` / `undefined` members of the arguments — the result is
 *   both the step's recorded `args` (its identity) and what `call` receives;
 * - submits a `tool_call` step whose target is `<prefix>_<name>` (or `name`),
 *   with the given idempotency;
 * - on `proceed` runs `call(name, args)` with the server's own name and
 *   records `toResult(raw)` (default {@link toResult}); on `replay` returns
 *   the recorded result without calling the server;
 * - when the kernel denies it, returns `<target> not allowed. reason:
 *   <reason>` instead of failing, so that the model sees the denial
 *   (`Tool.denialAsText`). Other step errors and signals fail as usual.
 *
 * @example
 * ```ts
 * import { Effect, Schema } from "effect"
 * import { Agent, Mcp } from "effect-rebuno"
 *
 * // a client of another MCP SDK, e.g. the `Client` of @modelcontextprotocol/sdk
 * declare const sdkClient: {
 *   callTool(request: { name: string; arguments?: Record<string, unknown> }): Promise<unknown>
 * }
 *
 * const echo = Mcp.wrap({ name: "echo", inputSchema: { type: "object" } }, {
 *   prefix: "demo",
 *   call: (name, args) => Effect.tryPromise(() => sdkClient.callTool({ name, arguments: args }))
 * })
 *
 * const echoer = Agent.make({
 *   id: "echoer",
 *   input: Schema.Struct({ message: Schema.String }),
 *   handler: ({ message }) => echo({ message }) // a tool_call step, target "demo_echo"
 * })
 * ```
 *
 * @since 0.2.0
 * @category constructors
 */
export const wrap = <E = never, R = never>(descriptor: Descriptor, options: WrapOptions<E, R>): McpTool<R> => {
  const name = descriptor.name
  const stepTarget = target(name, options.prefix)
  const shape = options.toResult ?? toResult
  const inputSchema = inputSchemaOf(descriptor)
  const inner = Tool.make(stepTarget, {
    args: Arguments,
    success: Schema.Unknown,
    idempotency: options.idempotency,
    description: descriptor.description,
    execute: (args) => Effect.map(options.call(name, args), shape)
  })
  const lenient = Tool.denialAsText(inner)
  const call = (args: Readonly<Record<string, unknown>>) =>
    Effect.suspend(() => lenient(stripNullish(args) as Readonly<Record<string, unknown>>))
  return Object.defineProperties(call, {
    [TypeId]: { value: TypeId },
    name: { value: stepTarget, enumerable: true },
    mcpName: { value: name, enumerable: true },
    description: { value: descriptor.description, enumerable: true },
    argsSchema: { value: Arguments, enumerable: true },
    successSchema: { value: Schema.Unknown, enumerable: true },
    failureSchema: { value: undefined, enumerable: true },
    idempotency: { value: inner.idempotency, enumerable: true },
    inputSchema: { value: inputSchema, enumerable: true },
    jsonSchema: { value: inputSchema, enumerable: true }
  }) as unknown as McpTool<R>
}

/**
 * Wrap several descriptors with the same options (`wrapMcpTools`).
 *
 * @since 0.2.0
 * @category constructors
 */
export const wrapAll = <E = never, R = never>(
  descriptors: Iterable<Descriptor>,
  options: WrapOptions<E, R>
): ReadonlyArray<McpTool<R>> => Array.from(descriptors, (descriptor) => wrap(descriptor, options))

/**
 * The options of {@link tools} and {@link fromClient}: the raw result
 * `toResult` receives is the server's `CallToolResult` as JSON (its wire form:
 * image data stays Base64 text).
 *
 * @since 0.2.0
 * @category models
 */
export interface ClientOptions extends Options<typeof McpSchema.CallToolResult.Encoded> {
  /** Give up on a server call after this long (default: no deadline). A timeout fails the step. */
  readonly timeout?: Duration.Input | undefined
}

const encodeResult = Schema.encodeUnknownEffect(McpSchema.CallToolResult)

/**
 * Wrap one tool of a connected `effect/ai` `McpClient` (see {@link wrap}
 * for what a call does). The call goes through `client.callTool`; the result
 * is turned back into its JSON form before it is shaped, so that a non-text
 * block reads as it came over the wire.
 *
 * @since 0.2.0
 * @category constructors
 */
export const fromClient = (
  client: McpClient.McpClient,
  descriptor: McpSchema.Tool,
  options?: ClientOptions
): McpTool =>
  wrap(descriptor, {
    prefix: options?.prefix,
    idempotency: options?.idempotency,
    toResult: options?.toResult as ((raw: unknown) => unknown) | undefined,
    call: (_name, args) =>
      client.callTool(
        { tool: descriptor, arguments: args },
        options?.timeout === undefined ? undefined : { timeout: options.timeout }
      ).pipe(Effect.flatMap(encodeResult))
  })

/**
 * List the tools of a connected `effect/ai` `McpClient` and wrap each as a
 * durable tool (see {@link wrap}). Listing happens now, outside any step;
 * build the tools once (at start-up, or per run) and call them inside runs.
 *
 * **Example** (The filesystem MCP server over stdio)
 *
 * ```ts
 * import { NodeRuntime, NodeServices } from "@effect/platform-node"
 * import { Effect, Layer, Schema } from "effect"
 * import { McpClient, McpProtocol } from "effect/ai"
 * import { ChildProcess } from "effect/process"
 * import { Agent, KernelClient, Mcp } from "effect-rebuno"
 *
 * const FilesystemMcp = McpClient.layerStdio({
 *   name: "my-agent", version: "1.0.0", protocol: McpProtocol.v2025_11_25,
 *   command: ChildProcess.make("npx", ["-y", "@modelcontextprotocol/server-filesystem", "/srv/notes"])
 * }).pipe(Layer.provide(NodeServices.layer)) // the child process spawner
 *
 * // the tools are listed once, at start-up; the server process lives as long as the agent
 * const NotesAgent = Layer.unwrap(Effect.gen(function*() {
 *   const fsTools = yield* Effect.flatMap(McpClient.McpClient, (client) => Mcp.tools(client, { prefix: "fs" }))
 *   const read = fsTools.find((tool) => tool.name === "fs_read_text_file")!
 *   const notes = Agent.make({
 *     id: "notes",
 *     input: Schema.Struct({ path: Schema.String }),
 *     handler: ({ path }) => read({ path }) // inside a run: a tool_call step "fs_read_text_file"
 *   })
 *   return Agent.serve(notes, { port: 5000 })
 * })).pipe(Layer.provide(FilesystemMcp))
 *
 * NotesAgent.pipe(Layer.provide(KernelClient.layerSocketConfig()), Layer.launch, NodeRuntime.runMain)
 * ```
 *
 * @since 0.2.0
 * @category constructors
 */
export const tools = (
  client: McpClient.McpClient,
  options?: ClientOptions
): Effect.Effect<ReadonlyArray<McpTool>, McpClientError.McpClientError> =>
  Effect.map(client.listTools(), (descriptors) => descriptors.map((descriptor) => fromClient(client, descriptor, options)))
