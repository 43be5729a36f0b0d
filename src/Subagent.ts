/**
 * Subagents: a typed call of another agent as a durable step
 * (PROTOCOL-CURRENT C.5). `Subagent.make` describes the other agent — its id
 * and the Schemas of its input and output — and gives a function from input
 * to an Effect that
 *
 * 1. submits a `tool_call` step (target: the agent id, args: the encoded
 *    input) — policy governs it like any tool call;
 * 2. on `proceed`, creates the child execution bound to that step
 *    (`spawned_by`) with the `Client` in context (it needs the
 *    `executions:write` scope);
 * 3. suspends the running execution (`POST …/suspend`) once every step in
 *    flight waits on a child or has ended — one suspend for all the subagent
 *    calls that run concurrently — and ends the run quietly: the kernel
 *    redelivers the parent once its children have settled;
 * 4. on the redelivered run, replays: the child's output, decoded with the
 *    output Schema, or a {@link SubagentError} with the child's execution id
 *    and failure reason.
 *
 * When the child has already settled by the time the run suspends
 * (`{"suspended":false}`), the call reads the step and returns at once.
 *
 * **Example** (A researcher that delegates summaries)
 *
 * ```ts
 * import { Effect, Schema } from "effect"
 * import { Agent, Subagent } from "effect-rebuno"
 *
 * const summarize = Subagent.make({
 *   agentId: "summarizer",
 *   input: Schema.Struct({ text: Schema.String }),
 *   output: Schema.Struct({ summary: Schema.String })
 * })
 *
 * const researcher = Agent.make({
 *   id: "researcher",
 *   input: Schema.Struct({ documents: Schema.Array(Schema.String) }),
 *   handler: ({ documents }) =>
 *     // one child per document, one suspension for them all
 *     Effect.forEach(documents, (text) => summarize({ text }), { concurrency: "unbounded" }).pipe(
 *       Effect.catchTag("SubagentError", (e) => Effect.fail(new Error(`child ${e.executionId} failed: ${e.failureReason}`)))
 *     )
 * })
 * ```
 *
 * Serve the researcher with a `Client` in context, e.g.
 * `Client.layerConfig()` (`REBUNO_URL`, `REBUNO_API_KEY`); the test kit
 * provides one.
 *
 * **Gotchas**
 *
 * - A subagent call is a step: calling it inside another step's body (a
 *   tool's `execute`) records two steps, and the enclosing one waits for the
 *   child like the call does.
 * - The child's `session`, when given, must not be the parent's session
 *   (`400`, C.5.1).
 * - Kernels before the current stage do not know `spawned_by`: the create
 *   answers `400` and the step fails with a `ToolError`.
 *
 * @since 0.2.0
 */
import { Effect, Schema } from "effect"
import * as Client from "./Client.js"
import type { Execution } from "./Execution.js"
import * as internal from "./internal/run/run.js"
import * as Engine from "./internal/run/subagent.js"
import * as Suspension from "./internal/run/suspension.js"
import * as Codec from "./internal/wire/codec.js"
import { InvalidArguments, StepDecodeError } from "./RebunoError.js"
import type { SubagentError } from "./RebunoError.js"
import type { StepError } from "./Step.js"

/**
 * A call of another agent: call it with the agent's input to get an Effect of
 * its output.
 *
 * @since 0.2.0
 * @category models
 */
export interface Subagent<Input extends Schema.Top, Output extends Schema.Top> {
  (input: Input["Type"], options?: CallOptions): Effect.Effect<
    Output["Type"],
    StepError | SubagentError,
    | Execution
    | Client.Client
    | Input["EncodingServices"]
    | Output["DecodingServices"]
  >
  /** The other agent's id. */
  readonly agentId: string
  /** The step target (the agent id unless renamed). */
  readonly target: string
  readonly inputSchema: Input
  readonly outputSchema: Output
}

/**
 * Options of one call.
 *
 * @since 0.2.0
 * @category models
 */
export interface CallOptions {
  /**
   * The child's session label: children started with the same session
   * continue one conversation (PROTOCOL-CURRENT C.4). Not the parent's own
   * session. It is not part of the step's identity.
   */
  readonly session?: string | undefined
}

/**
 * The options of {@link make}.
 *
 * @since 0.2.0
 * @category models
 */
export interface Options<Input extends Schema.Top, Output extends Schema.Top> {
  /** The id of the agent to call. */
  readonly agentId: string
  /** Encodes the child's input (what the step records as `args` and the child gets). */
  readonly input: Input
  /** Decodes the child's output, live and on replay. */
  readonly output: Output
  /** The step's target, which policies match (default: `agentId`). */
  readonly target?: string | undefined
  /** The session of every call without its own `session` option. */
  readonly session?: string | undefined
}

/**
 * Describe a call of another agent. See the module documentation for what a
 * call does.
 *
 * @since 0.2.0
 * @category constructors
 */
export const make = <Input extends Schema.Top, Output extends Schema.Top>(
  options: Options<Input, Output>
): Subagent<Input, Output> => {
  // From now on the runs of this process count their steps in flight (see `suspension.ts`).
  Suspension.enable()
  const target = options.target ?? options.agentId
  const inputSchema = options.input as unknown as Schema.Codec<unknown, unknown, unknown, unknown>
  const outputSchema = options.output as unknown as Schema.Codec<Output["Type"], unknown, unknown, unknown>
  const decode = (output: unknown): Effect.Effect<Output["Type"], StepDecodeError> => {
    const quick = Codec.decodeSync(outputSchema, output)
    if (quick !== undefined) return Effect.succeed(quick.value)
    return Schema.decodeUnknownEffect(outputSchema)(output, { reportInput: true }).pipe(
      Effect.mapError((e) =>
        new StepDecodeError({ target, stepId: "", description: `subagent output does not decode: ${e.message}` })
      )
    ) as Effect.Effect<Output["Type"], StepDecodeError>
  }
  const invalid = (error: Schema.SchemaError) => {
    const issue = internal.firstIssue(error)
    return Effect.fail(new InvalidArguments({ target, path: issue.path, reason: issue.message }))
  }
  const call = (input: Input["Type"], callOptions?: CallOptions) =>
    internal.tracedStep(
      "Subagent.call",
      { attributes: { "rebuno.step.kind": "tool_call", "rebuno.step.target": target, "rebuno.subagent": options.agentId } },
      (execution) =>
        Effect.flatMap(
          Effect.catch(Schema.encodeEffect(inputSchema)(input, { reportInput: true }), invalid),
          (encoded) =>
            Client.Client.use((client) =>
              Engine.run(execution, client, {
                agentId: options.agentId,
                target,
                input: encoded === undefined ? null : encoded,
                session: callOptions?.session ?? options.session,
                decode
              }))
        )
    )
  return Object.defineProperties(call, {
    agentId: { value: options.agentId, enumerable: true },
    target: { value: target, enumerable: true },
    inputSchema: { value: options.input, enumerable: true },
    outputSchema: { value: options.output, enumerable: true }
  }) as unknown as Subagent<Input, Output>
}
