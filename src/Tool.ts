/**
 * Tools: named, schema-typed functions whose every call is a durable
 * `tool_call` step. `Tool.make` turns an Effect-returning `execute` into a
 * function from arguments to an Effect that submits the call to the kernel,
 * runs `execute` only on `proceed`, and replays the recorded result otherwise.
 * The arguments schema validates and encodes the arguments (the encoded form is
 * what the kernel sees and hashes into the step id) and is exported as JSON
 * Schema for LLM frameworks. `Tool.wrap` does the same for Promise-returning
 * functions, and `Tool.denialAsText` turns a policy denial into the text an LLM
 * tool loop expects.
 *
 * @since 0.1.0
 */
import { Effect, JsonSchema, Schema } from "effect"
import type { Schedule } from "effect"
import type { Execution } from "./Execution.js"
import type * as Resource from "./Resource.js"
import { InvalidArguments, PolicyError } from "./RebunoError.js"
import type { ToolError } from "./RebunoError.js"
import * as Codec from "./internal/wire/codec.js"
import * as internal from "./internal/run/run.js"
import type * as Tracing from "./internal/http/tracing.js"
import type { Idempotency, StepContext, StepError } from "./Step.js"

/**
 * A durable tool: call it with its arguments to get an Effect.
 *
 * @since 0.1.0
 * @category models
 */
export interface Tool<
  Args extends Schema.Top,
  Success extends Schema.Top,
  Failure extends Schema.Top = Schema.Never,
  R = never
> {
  (args: Args["Type"]): Effect.Effect<
    Success["Type"],
    StepError | Failure["Type"],
    | R
    | Execution
    | Args["EncodingServices"]
    | Success["DecodingServices"]
    | Success["EncodingServices"]
    | Failure["DecodingServices"]
    | Failure["EncodingServices"]
  >
  /** The tool name: the step `target` and the name policies match. */
  readonly name: string
  readonly description: string | undefined
  readonly argsSchema: Args
  readonly successSchema: Success
  readonly failureSchema: Failure | undefined
  /**
   * JSON Schema (draft-07) of the arguments as encoded, computed on first
   * access: a root with `$schema`, and `$defs` when the schema has definitions.
   *
   * In Effect 4 `Schema.Number` also encodes `NaN` and the infinities, as the
   * strings `"NaN"`, `"Infinity"` and `"-Infinity"`, so its JSON Schema is an
   * `anyOf` of a number and those strings; use `Schema.Finite` (or `Schema.Int`)
   * for arguments an LLM should see as a plain `{"type":"number"}`.
   */
  readonly jsonSchema: JsonSchema.JsonSchema
  readonly idempotency: Idempotency
}

/**
 * The options of {@link make}.
 *
 * @since 0.1.0
 * @category models
 */
export interface Options<
  Args extends Schema.Top,
  Success extends Schema.Top,
  Failure extends Schema.Top,
  R
> {
  readonly args: Args
  readonly success: Success
  /** Failures of `execute` that are instances of this schema survive replay as themselves. */
  readonly failure?: Failure | undefined
  readonly idempotency?: Idempotency | undefined
  readonly description?: string | undefined
  /**
   * The resources `execute` may change (PROTOCOL-CURRENT C.6.4): declared
   * resources or their keys; see `Resource`.
   *
   * @since 0.2.0
   */
  readonly resources?: ReadonlyArray<Resource.Any | string> | undefined
  /**
   * Retry a failed call on this schedule, fed with its failures (the
   * `ToolError`, or the typed failure): each attempt is a `tool_call` step of
   * its own, recorded with its attempt number, and a replay follows the
   * recorded attempts without sleeping through the backoff (see
   * `Step.RunOptions.retry`).
   *
   * @since 0.2.0
   */
  readonly retry?: Schedule.Schedule<unknown, ToolError | Failure["Type"]> | undefined
  readonly execute: (
    args: Args["Type"],
    context: StepContext
  ) => Effect.Effect<Success["Type"], unknown, R>
}

/** A schema as the step path uses it (its services are tracked by {@link Tool}'s type). */
type AnyCodec<A> = Schema.Codec<A, unknown, unknown, unknown>

/**
 * The JSON Schema of `schema` (as `effect/ai` derives a tool's parameters),
 * laid out as Effect 3's `JSONSchema.make` laid it out (the form LLM tool APIs
 * take): a draft-07 root with `$schema`, closed objects
 * (`additionalProperties: false`), definitions under `$defs` and referenced as
 * `#/$defs/<name>`.
 */
const jsonSchemaOf = (schema: Schema.Top): JsonSchema.JsonSchema => {
  const document = JsonSchema.toDocumentDraft07(Schema.toJsonSchemaDocument(schema, { onExcessProperty: "error" }))
  const root = { $schema: JsonSchema.META_SCHEMA_URI_DRAFT_07 }
  const names = Object.keys(document.definitions)
  if (names.length === 0) return { ...root, ...document.schema }
  const $defs: Record<string, unknown> = {}
  for (const name of names) $defs[name] = definitionsAsDefs(document.definitions[name])
  return { ...root, $defs, ...(definitionsAsDefs(document.schema) as JsonSchema.JsonSchema) }
}

/** A draft-07 schema with its `#/definitions/…` references turned into `#/$defs/…`. */
const definitionsAsDefs = (json: unknown): unknown => {
  if (Array.isArray(json)) return json.map(definitionsAsDefs)
  if (typeof json !== "object" || json === null) return json
  const out: Record<string, unknown> = {}
  for (const [key, value] of Object.entries(json)) {
    out[key] = key === "$ref" && typeof value === "string" && value.startsWith("#/definitions/")
      ? `#/$defs/${value.slice("#/definitions/".length)}`
      : definitionsAsDefs(value)
  }
  return out
}

const build = <
  Args extends Schema.Top,
  Success extends Schema.Top,
  Failure extends Schema.Top,
  R
>(name: string, options: Options<Args, Success, Failure, R>): Tool<Args, Success, Failure, R> => {
  const idempotency = options.idempotency ?? "safe_to_retry"
  const argsSchema = options.args as unknown as AnyCodec<Args["Type"]>
  const step = (execution: Execution.Service, args: Args["Type"], encodedArgs: unknown) =>
    internal.runStepIn(execution, {
      kind: "tool_call",
      target: name,
      args: encodedArgs,
      idempotency,
      success: options.success as unknown as AnyCodec<Success["Type"]>,
      failure: options.failure as unknown as AnyCodec<Failure["Type"]> | undefined,
      resources: options.resources,
      retry: options.retry,
      body: (context) => options.execute(args, context)
    })
  const invalid = (error: Schema.SchemaError) => {
    const issue = internal.firstIssue(error)
    return Effect.fail(new InvalidArguments({ target: name, path: issue.path, reason: issue.message }))
  }
  const spanOptions: Tracing.SpanOptions = { attributes: { "rebuno.tool": name } }
  const call = (args: Args["Type"]) =>
    internal.tracedStep("Tool.call", spanOptions, (execution) => {
      const quick = Codec.encodeSync(argsSchema, args)
      return quick !== undefined
        ? step(execution, args, quick.value)
        : Schema.encodeEffect(argsSchema)(args, { reportInput: true }).pipe(
          Effect.catch(invalid),
          Effect.flatMap((encodedArgs) => step(execution, args, encodedArgs))
        )
    })
  let jsonSchema: JsonSchema.JsonSchema | undefined
  return Object.defineProperties(call, {
    name: { value: name, enumerable: true },
    description: { value: options.description, enumerable: true },
    argsSchema: { value: options.args, enumerable: true },
    successSchema: { value: options.success, enumerable: true },
    failureSchema: { value: options.failure, enumerable: true },
    idempotency: { value: idempotency, enumerable: true },
    jsonSchema: {
      enumerable: true,
      get: () => (jsonSchema ??= jsonSchemaOf(options.args))
    }
  }) as unknown as Tool<Args, Success, Failure, R>
}

/**
 * Define a tool. Each call validates and encodes the arguments with `args`
 * (failing with `InvalidArguments` before anything is sent), submits a
 * `tool_call` step named `name`, and on `proceed` runs `execute` with the
 * arguments and the step context (its `stepId` is a good provider idempotency
 * key). The result is encoded with `success` when recorded and decoded with it
 * on replay. A failure of `execute` is recorded and raised as a `ToolError`
 * (a tagged error keeps its tag in the recorded error and the message:
 * `<name>: <Tag>: …`), unless it is an instance of `failure`, which survives
 * replay as itself. A `Resource.CheckpointUnavailable` (the body read the
 * handle of a resource whose fork checkpoint is gone) fails the step too but
 * is raised as itself, now and on replay: catch it around the call, or the
 * execution fails with `agent_error: CheckpointUnavailable: …` (PROTOCOL-CURRENT
 * C.6.8 #7). With `retry`, failed calls are retried on that schedule, each
 * attempt recorded.
 *
 * @example
 * ```ts
 * import { Effect, Schema } from "effect"
 * import { Agent, Tool } from "effect-rebuno"
 *
 * const search = Tool.make("search", {
 *   args: Schema.Struct({ query: Schema.String }),
 *   success: Schema.Array(Schema.String),
 *   execute: ({ query }) => Effect.succeed([`result for ${query}`])
 * })
 *
 * const researcher = Agent.make({
 *   id: "researcher",
 *   input: Schema.Struct({ prompt: Schema.String }),
 *   handler: ({ prompt }) =>
 *     Effect.gen(function*() {
 *       const hits = yield* search({ query: prompt }) // a tool_call step "search"
 *       return { hits }
 *     })
 * })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = <
  Args extends Schema.Top,
  Success extends Schema.Top,
  R = never,
  Failure extends Schema.Top = Schema.Never
>(name: string, options: Options<Args, Success, Failure, R>): Tool<Args, Success, Failure, R> =>
  build(name, options)

/**
 * The options of {@link wrap}: those of {@link make} but `execute` (the
 * Promise-returning function is `wrap`'s own argument); `retry` retries
 * rejected calls, each attempt recorded.
 *
 * @since 0.1.0
 * @category models
 */
export interface WrapOptions<
  Args extends Schema.Top,
  Success extends Schema.Top,
  Failure extends Schema.Top
> extends Omit<Options<Args, Success, Failure, never>, "execute"> {}

/**
 * Define a tool from a Promise-returning function. A rejection is recorded with
 * the rejection's message and raised as a `ToolError` (or, when it is an
 * instance of `failure`, as itself).
 *
 * @since 0.1.0
 * @category constructors
 */
export const wrap = <
  Args extends Schema.Top,
  Success extends Schema.Top,
  Failure extends Schema.Top = Schema.Never
>(
  name: string,
  fn: (args: Args["Type"], context: StepContext) => Promise<Success["Type"]>,
  options: WrapOptions<Args, Success, Failure>
): Tool<Args, Success, Failure> =>
  build(name, {
    ...options,
    execute: (args, context) =>
      Effect.tryPromise({
        try: () => fn(args, context),
        catch: (cause) => cause
      })
  })

/**
 * The text a denied tool returns to an LLM under {@link denialAsText}
 * (PROTOCOL.md 14.6): `<name> not allowed. reason: <reason>`.
 *
 * @since 0.1.0
 * @category denials
 */
export const denialText = (name: string, reason: string | undefined): string =>
  `${name} not allowed. reason: ${reason === undefined || reason === "" ? "denied by policy" : reason}`

/**
 * A tool whose own policy denial becomes its result: instead of failing with
 * `PolicyError`, a denied call succeeds with `<name> not allowed. reason:
 * <reason>`, so that the model sees the denial (PROTOCOL.md 14.6). Denials of
 * nested steps inside the tool still fail.
 *
 * @since 0.1.0
 * @category denials
 */
export const denialAsText = <
  Args extends Schema.Top,
  Success extends Schema.Top,
  Failure extends Schema.Top,
  R
>(
  tool: Tool<Args, Success, Failure, R>
): Tool<Args, Schema.Union<readonly [Success, Schema.String]>, Failure, R> => {
  const call = (args: Args["Type"]) =>
    tool(args).pipe(
      Effect.catchIf(
        (e): e is PolicyError => e instanceof PolicyError && e.target === tool.name,
        (e) => Effect.succeed(denialText(tool.name, e.reason))
      )
    )
  return Object.defineProperties(call, {
    name: { value: tool.name, enumerable: true },
    description: { value: tool.description, enumerable: true },
    argsSchema: { value: tool.argsSchema, enumerable: true },
    successSchema: { value: Schema.Union([tool.successSchema, Schema.String]), enumerable: true },
    failureSchema: { value: tool.failureSchema, enumerable: true },
    idempotency: { value: tool.idempotency, enumerable: true },
    jsonSchema: { enumerable: true, get: () => tool.jsonSchema }
  }) as unknown as Tool<Args, Schema.Union<readonly [Success, Schema.String]>, Failure, R>
}
