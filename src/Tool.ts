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
import { Effect, JSONSchema, Schema } from "effect"
import type { Execution } from "./Execution.js"
import { InvalidArguments, PolicyError } from "./RebunoError.js"
import * as Codec from "./internal/codec.js"
import * as internal from "./internal/run.js"
import type * as Tracing from "./internal/tracing.js"
import type { Idempotency, StepContext, StepError } from "./Step.js"

/**
 * A durable tool: call it with its arguments to get an Effect.
 *
 * @since 0.1.0
 * @category models
 */
export interface Tool<
  Args extends Schema.Schema.Any,
  Success extends Schema.Schema.Any,
  Failure extends Schema.Schema.All = typeof Schema.Never,
  R = never
> {
  (args: Schema.Schema.Type<Args>): Effect.Effect<
    Schema.Schema.Type<Success>,
    StepError | Schema.Schema.Type<Failure>,
    | R
    | Execution
    | Schema.Schema.Context<Args>
    | Schema.Schema.Context<Success>
    | Schema.Schema.Context<Failure>
  >
  /** The tool name: the step `target` and the name policies match. */
  readonly name: string
  readonly description: string | undefined
  readonly argsSchema: Args
  readonly successSchema: Success
  readonly failureSchema: Failure | undefined
  /** JSON Schema of the arguments (computed on first access). */
  readonly jsonSchema: JSONSchema.JsonSchema7Root
  readonly idempotency: Idempotency
}

/**
 * The options of {@link make}.
 *
 * @since 0.1.0
 * @category models
 */
export interface Options<
  Args extends Schema.Schema.Any,
  Success extends Schema.Schema.Any,
  Failure extends Schema.Schema.All,
  R
> {
  readonly args: Args
  readonly success: Success
  /** Failures of `execute` that are instances of this schema survive replay as themselves. */
  readonly failure?: Failure | undefined
  readonly idempotency?: Idempotency | undefined
  readonly description?: string | undefined
  readonly execute: (
    args: Schema.Schema.Type<Args>,
    context: StepContext
  ) => Effect.Effect<Schema.Schema.Type<Success>, unknown, R>
}

const build = <
  Args extends Schema.Schema.Any,
  Success extends Schema.Schema.Any,
  Failure extends Schema.Schema.All,
  R
>(name: string, options: Options<Args, Success, Failure, R>): Tool<Args, Success, Failure, R> => {
  const idempotency = options.idempotency ?? "safe_to_retry"
  const step = (execution: Execution["Type"], args: Schema.Schema.Type<Args>, encodedArgs: unknown) =>
    internal.runStepIn(execution, {
      kind: "tool_call",
      target: name,
      args: encodedArgs,
      idempotency,
      success: options.success as Schema.Schema<Schema.Schema.Type<Success>, unknown, unknown>,
      failure: options.failure as Schema.Schema<Schema.Schema.Type<Failure>, unknown, unknown> | undefined,
      body: (context) => options.execute(args, context)
    })
  const spanOptions: Tracing.SpanOptions = { attributes: { "rebuno.tool": name } }
  const call = (args: Schema.Schema.Type<Args>) =>
    internal.tracedStep("Tool.call", spanOptions, (execution) => {
      const quick = Codec.encodeSync(options.args, args)
      return quick !== undefined
        ? step(execution, args, quick.value)
        : Schema.encode(options.args)(args).pipe(
          Effect.catchAll((error) => {
            const issue = internal.firstIssue(error)
            return Effect.fail(new InvalidArguments({ target: name, path: issue.path, reason: issue.message }))
          }),
          Effect.flatMap((encodedArgs) => step(execution, args, encodedArgs))
        )
    })
  let jsonSchema: JSONSchema.JsonSchema7Root | undefined
  return Object.defineProperties(call, {
    name: { value: name, enumerable: true },
    description: { value: options.description, enumerable: true },
    argsSchema: { value: options.args, enumerable: true },
    successSchema: { value: options.success, enumerable: true },
    failureSchema: { value: options.failure, enumerable: true },
    idempotency: { value: idempotency, enumerable: true },
    jsonSchema: {
      enumerable: true,
      get: () => (jsonSchema ??= JSONSchema.make(options.args))
    }
  }) as unknown as Tool<Args, Success, Failure, R>
}

/**
 * Define a tool. Each call validates and encodes the arguments with `args`
 * (failing with `InvalidArguments` before anything is sent), submits a
 * `tool_call` step named `name`, and on `proceed` runs `execute` with the
 * arguments and the step context (its `stepId` is a good provider idempotency
 * key). The result is encoded with `success` when recorded and decoded with it
 * on replay. A failure of `execute` is recorded and raised as a `ToolError`,
 * unless it is an instance of `failure`, which survives replay as itself.
 *
 * @example
 * ```ts
 * const search = Tool.make("search", {
 *   args: Schema.Struct({ query: Schema.String }),
 *   success: Schema.Array(Schema.String),
 *   execute: ({ query }) => Effect.succeed([`result for ${query}`])
 * })
 * const hits = yield* search({ query: "effect" })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = <
  Args extends Schema.Schema.Any,
  Success extends Schema.Schema.Any,
  R = never,
  Failure extends Schema.Schema.All = typeof Schema.Never
>(name: string, options: Options<Args, Success, Failure, R>): Tool<Args, Success, Failure, R> =>
  build(name, options)

/**
 * The options of {@link wrap}.
 *
 * @since 0.1.0
 * @category models
 */
export interface WrapOptions<
  Args extends Schema.Schema.Any,
  Success extends Schema.Schema.Any,
  Failure extends Schema.Schema.All
> {
  readonly args: Args
  readonly success: Success
  readonly failure?: Failure | undefined
  readonly idempotency?: Idempotency | undefined
  readonly description?: string | undefined
}

/**
 * Define a tool from a Promise-returning function. A rejection is recorded with
 * the rejection's message and raised as a `ToolError` (or, when it is an
 * instance of `failure`, as itself).
 *
 * @since 0.1.0
 * @category constructors
 */
export const wrap = <
  Args extends Schema.Schema.Any,
  Success extends Schema.Schema.Any,
  Failure extends Schema.Schema.All = typeof Schema.Never
>(
  name: string,
  fn: (args: Schema.Schema.Type<Args>, context: StepContext) => Promise<Schema.Schema.Type<Success>>,
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
  Args extends Schema.Schema.Any,
  Success extends Schema.Schema.Any,
  Failure extends Schema.Schema.All,
  R
>(
  tool: Tool<Args, Success, Failure, R>
): Tool<Args, Schema.Union<[Success, typeof Schema.String]>, Failure, R> => {
  const call = (args: Schema.Schema.Type<Args>) =>
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
    successSchema: { value: Schema.Union(tool.successSchema, Schema.String), enumerable: true },
    failureSchema: { value: tool.failureSchema, enumerable: true },
    idempotency: { value: tool.idempotency, enumerable: true },
    jsonSchema: { enumerable: true, get: () => tool.jsonSchema }
  }) as unknown as Tool<Args, Schema.Union<[Success, typeof Schema.String]>, Failure, R>
}
