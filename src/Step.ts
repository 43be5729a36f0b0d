/**
 * Steps: the durable unit of an agent. A step is an Effect that first submits
 * itself to the kernel and runs its body only on `proceed`; on `replay` it
 * returns the recorded outcome without running the body, and every other
 * decision is a typed error (`PolicyError`, `RateLimited`) or a run signal
 * (`Blocked`, `Terminated`). Results are encoded with an optional `Schema`
 * before they are recorded and decoded with it on replay; with a `failure`
 * schema, expected failures of the body are recorded too and come back as the
 * same typed failure on replay. `Step.run` records local non-determinism, and
 * `Step.now`, `Step.random` and `Step.uuid` cover the usual cases.
 *
 * @since 0.1.0
 */
import { Clock, Effect, Random, Schema } from "effect"
import type { Execution } from "./Execution.js"
import * as internal from "./internal/run/run.js"

/**
 * `safe_to_retry` (default): a body whose earlier run died is run again.
 * `at_most_once`: it is reported as indeterminate instead (a `ToolError` with
 * `indeterminate === true`).
 *
 * @since 0.1.0
 * @category models
 */
export type Idempotency = internal.Idempotency

/**
 * What a step body learns about its step. Pass `stepId` to providers that take
 * an idempotency key: a `safe_to_retry` step whose earlier run died mid-body is
 * run again with the same id.
 *
 * @since 0.1.0
 * @category models
 */
export type StepContext = internal.StepContext

/**
 * Every error a step raises by itself (a typed failure comes on top).
 *
 * @since 0.1.0
 * @category models
 */
export type StepError = internal.StepError

/**
 * The options of {@link make}.
 *
 * - `args`: the step's arguments, JSON only (default `{}`); they identify the
 *   step, so anything non-deterministic must not be in them.
 * - `success`: encodes the result before it is recorded and decodes it on
 *   replay (without it the value is recorded as is and replayed as parsed JSON).
 * - `failure`: body failures that are instances of this schema are recorded as
 *   `{"message":…,"failure":<encoded>}` and re-raised as themselves, now and on
 *   replay. Every other failure is recorded as `{"message":…}` and raised as a
 *   `ToolError`.
 *
 * @since 0.1.0
 * @category models
 */
export interface Options<A, E, R, I = A, RS = never, F = never, FI = never, RF = never>
  extends internal.StepOptions<A, E, R, I, RS, F, FI, RF>
{}

/**
 * The core primitive: submit a step, then run the body (`proceed`) or return
 * the recorded outcome (`replay`), recording the body's outcome with
 * `complete` / `fail` (PROTOCOL.md 14.4).
 *
 * Signals and policy / rate-limit errors raised inside the body propagate as
 * they are and record nothing; an unknown decision fails with a `KernelError`
 * (a `DecodeError` reason: `unexpected step decision: <value>`).
 *
 * @example
 * ```ts
 * const charge = Step.make({
 *   kind: "tool_call",
 *   target: "charge",
 *   args: { amount: 10 },
 *   idempotency: "at_most_once",
 *   success: Schema.Struct({ id: Schema.String }),
 *   body: ({ stepId }) => payments.charge(10, { idempotencyKey: stepId })
 * })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = <A, E = never, R = never, I = A, RS = never, F = never, FI = never, RF = never>(
  options: Options<A, E, R, I, RS, F, FI, RF>
): Effect.Effect<A, StepError | F, R | RS | RF | Execution> =>
  internal.tracedStep(
    "Step.make",
    { attributes: { "rebuno.step.kind": options.kind, "rebuno.step.target": options.target } },
    (execution) => internal.runStepIn(execution, options)
  )

/**
 * The body of a local step: an Effect, or a function of the step context.
 *
 * @since 0.1.0
 * @category models
 */
export type Body<A, E, R> = Effect.Effect<A, E, R> | ((context: StepContext) => Effect.Effect<A, E, R>)

/**
 * The options of {@link run}.
 *
 * @since 0.1.0
 * @category models
 */
export interface RunOptions<A = unknown, I = A, RS = never, F = never, FI = never, RF = never> {
  /** JSON arguments identifying the step (default `{}`). */
  readonly args?: unknown
  readonly idempotency?: Idempotency | undefined
  readonly success?: Schema.Codec<A, I, RS, RS> | undefined
  readonly failure?: Schema.Codec<F, FI, RF, RF> | undefined
}

const runImpl = <A, E, R, I, RS, F, FI, RF>(
  name: string,
  body: Body<A, E, R>,
  options: RunOptions<A, I, RS, F, FI, RF> | undefined
): Effect.Effect<A, StepError | F, R | RS | RF | Execution> =>
  internal.tracedStep("Step.run", { attributes: { "rebuno.step.target": name } }, (execution) =>
    internal.runStepIn(execution, {
      kind: "local",
      target: name,
      args: options?.args,
      idempotency: options?.idempotency,
      success: options?.success,
      failure: options?.failure,
      body: typeof body === "function" ? body : () => body
    }))

/**
 * A local step (`kind: "local"`, `target` = `name`): records the outcome of
 * `body` the first time and replays it afterwards. Use it for anything
 * non-deterministic the agent's control flow depends on. Unmatched local steps
 * are allowed by policy even under deny-by-default.
 *
 * Data-first `Step.run(name, body, options?)` or data-last
 * `body.pipe(Step.run(name, options?))`.
 *
 * @example
 * ```ts
 * const pick = Step.run("pick-region", Effect.sync(() => regions[Math.floor(Math.random() * 3)]), {
 *   success: Schema.String
 * })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const run: {
  (name: string, options?: {
    readonly args?: unknown
    readonly idempotency?: Idempotency | undefined
  }): <A, E, R>(body: Body<A, E, R>) => Effect.Effect<A, StepError, R | Execution>
  <A, I, RS, F = never, FI = never, RF = never>(
    name: string,
    options: RunOptions<A, I, RS, F, FI, RF> & { readonly success: Schema.Codec<A, I, RS, RS> }
  ): <E, R>(body: Body<A, E, R>) => Effect.Effect<A, StepError | F, R | RS | RF | Execution>
  <F, FI, RF>(
    name: string,
    options: RunOptions<unknown, unknown, never, F, FI, RF> & { readonly failure: Schema.Codec<F, FI, RF, RF> }
  ): <A, E, R>(body: Body<A, E, R>) => Effect.Effect<A, StepError | F, R | RF | Execution>
  <A, E, R, I = A, RS = never, F = never, FI = never, RF = never>(
    name: string,
    body: Body<A, E, R>,
    options?: RunOptions<A, I, RS, F, FI, RF>
  ): Effect.Effect<A, StepError | F, R | RS | RF | Execution>
} = function(this: unknown, ...args: ReadonlyArray<unknown>) {
  const name = args[0] as string
  const second = args[1]
  if (Effect.isEffect(second) || typeof second === "function") {
    return runImpl(name, second as Body<unknown, unknown, unknown>, args[2] as RunOptions | undefined)
  }
  return (body: Body<unknown, unknown, unknown>) => runImpl(name, body, second as RunOptions | undefined)
} as any

/**
 * The current time in epoch milliseconds (from Effect's `Clock`), recorded as
 * the local step `now` and replayed afterwards.
 *
 * @since 0.1.0
 * @category non-determinism
 */
export const now: Effect.Effect<number, StepError, Execution> = runImpl("now", Clock.currentTimeMillis, {
  success: Schema.Number
})

/**
 * A random double in `[0, 1)` (from Effect's `Random`), recorded as the local
 * step `random` and replayed afterwards.
 *
 * @since 0.1.0
 * @category non-determinism
 */
export const random: Effect.Effect<number, StepError, Execution> = runImpl("random", Random.next, {
  success: Schema.Number
})

const HEX: ReadonlyArray<string> = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, "0"))

/** A version 4 UUID from Effect's `Random` (so tests can seed it). */
const uuidV4: Effect.Effect<string> = Effect.gen(function*() {
  const bytes: Array<number> = []
  for (let i = 0; i < 16; i++) bytes.push(yield* Random.nextIntBetween(0, 256, { halfOpen: true }))
  bytes[6] = (bytes[6]! & 0x0f) | 0x40
  bytes[8] = (bytes[8]! & 0x3f) | 0x80
  const hex = bytes.map((b) => HEX[b]!)
  return `${hex.slice(0, 4).join("")}-${hex.slice(4, 6).join("")}-${hex.slice(6, 8).join("")}-${
    hex.slice(8, 10).join("")
  }-${hex.slice(10, 16).join("")}`
})

/**
 * A random version 4 UUID string, recorded as the local step `uuid` and
 * replayed afterwards.
 *
 * @since 0.1.0
 * @category non-determinism
 */
export const uuid: Effect.Effect<string, StepError, Execution> = runImpl("uuid", uuidV4, { success: Schema.String })
