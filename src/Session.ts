/**
 * Sessions and their state (PROTOCOL-CURRENT C.4). Executions created with the
 * same `session` label run one at a time, oldest first, and each starts from
 * the state its predecessor left: the kernel makes the session's last
 * completed execution (of the same agent) the new one's parent, and
 * `GET /v0/executions/{id}/previous` answers the parent's stored `state` —
 * or its output when it stored none, `null` without a parent.
 *
 * An agent declares the type of its state with the `state` Schema of
 * `Agent.make`, and its handler gets a {@link Session} typed by it as its
 * second argument: `yield* session.previous` reads the previous state
 * (decoded with the Schema; `Option.none()` when there is none), and
 * returning `session.withState(output, next)` completes the execution with
 * `output` and stores `next` (encoded with the Schema) for the next execution
 * of the session. A state of another type, or an output that does not match
 * the agent's, is a type error.
 *
 * **Example** (A chat agent that keeps its history)
 *
 * ```ts
 * import { Effect, Option, Schema } from "effect"
 * import { Agent } from "effect-rebuno"
 *
 * const History = Schema.Array(Schema.String)
 *
 * const chat = Agent.make({
 *   id: "chat",
 *   input: Schema.Struct({ message: Schema.String }),
 *   state: History,
 *   handler: ({ message }, session) =>
 *     Effect.gen(function*() {
 *       const history = Option.getOrElse(yield* session.previous, () => [])
 *       const next = [...history, message]
 *       return session.withState({ turns: next.length }, next)
 *     })
 * })
 * ```
 *
 * Create the executions with `Client.create(agentId, input, { session })`.
 *
 * @since 0.2.0
 */
import { Option, Predicate } from "effect"
import type { Effect } from "effect"
import type { KernelError, LeaseSuperseded, StepDecodeError } from "./RebunoError.js"

/**
 * The mark of a {@link WithState} value.
 *
 * @since 0.2.0
 * @category type ids
 */
export const TypeId = "~effect-rebuno/Session/WithState" as const

/**
 * @since 0.2.0
 * @category type ids
 */
export type TypeId = typeof TypeId

/**
 * A handler's answer that carries new session state besides the output: the
 * execution completes with `output` and `state` is stored for the next
 * execution of the session (`POST …/complete` with `{"output":…,"state":…}`,
 * PROTOCOL-CURRENT C.4.5). Make one with {@link Session.withState}.
 *
 * @since 0.2.0
 * @category models
 */
export interface WithState<out A, out S> {
  readonly [TypeId]: TypeId
  readonly output: A
  readonly state: S
}

/**
 * The errors of reading the previous state: the kernel call failed (`404`
 * or `403`, a kernel that has no `previous` route, a transport failure), the
 * run has stopped, or the state does not decode with the agent's `state`
 * Schema (a `StepDecodeError` with target `previous`).
 *
 * @since 0.2.0
 * @category models
 */
export type PreviousError = KernelError | LeaseSuperseded | StepDecodeError

/**
 * The session of the running execution, typed by the agent's state `S` (the
 * raw JSON, `unknown`, when the agent declares no `state` Schema). The
 * dispatch runtime passes it to the handler as its second argument.
 *
 * @since 0.2.0
 * @category models
 */
export interface Session<S> {
  /** The execution's session label, if it has one. */
  readonly id: Option.Option<string>
  /**
   * The execution whose state {@link previous} reads (the session's last
   * completed execution when this one started, or an explicit parent), if any.
   */
  readonly parentExecutionId: Option.Option<string>
  /**
   * The previous state: `GET /v0/executions/{id}/previous` (PROTOCOL-CURRENT
   * C.4.6), decoded with the agent's `state` Schema; `Option.none()` when the
   * kernel answers `null` (no parent, or a parent with neither state nor
   * output). Each evaluation asks the kernel. A kernel without sessions
   * (seed stage, v0.14.0) answers `404`: a `KernelError`.
   */
  readonly previous: Effect.Effect<Option.Option<S>, PreviousError>
  /**
   * The handler's answer with new state: the execution completes with
   * `output` and stores `state`.
   */
  withState<A>(output: A, state: S): WithState<A, S>
}

/**
 * Is this value a {@link WithState} answer?
 *
 * @since 0.2.0
 * @category guards
 */
export const isWithState = (u: unknown): u is WithState<unknown, unknown> => Predicate.hasProperty(u, TypeId)

/**
 * Build a {@link WithState} answer. Handlers use their session's
 * `withState`, which ties the state to the agent's state type.
 *
 * @since 0.2.0
 * @category constructors
 * @internal
 */
export const makeWithState = <A, S>(output: A, state: S): WithState<A, S> => ({ [TypeId]: TypeId, output, state })

/**
 * Build the session object of a run (used by the dispatch runtime).
 *
 * @since 0.2.0
 * @category constructors
 * @internal
 */
export const make = <S>(options: {
  readonly id: string | undefined
  readonly parentExecutionId: string | undefined
  readonly previous: Effect.Effect<Option.Option<S>, PreviousError>
}): Session<S> => ({
  id: Option.fromNullishOr(options.id),
  parentExecutionId: Option.fromNullishOr(options.parentExecutionId),
  previous: options.previous,
  withState: makeWithState
})
