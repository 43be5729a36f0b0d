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
import { Clock, Duration, Effect, Random, Schema } from "effect"
import type { Schedule } from "effect"
import type { Execution } from "./Execution.js"
import type { ToolError } from "./RebunoError.js"
import type * as Resource from "./Resource.js"
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
 *   `ToolError`; a tagged error keeps its tag there
 *   (`{"message":"<Tag>: <message or fields>","_tag":"<Tag>"}`). A
 *   `Resource.CheckpointUnavailable` (a fork's checkpoint is gone) is
 *   recorded that way too but raised as itself, now and on replay, so that
 *   uncaught it fails the execution as it would from the handler
 *   (`agent_error: CheckpointUnavailable: …`, PROTOCOL-CURRENT C.6.8 #7).
 * - `retry` (since 0.2.0): a `Schedule` fed with the body's failures (the
 *   `ToolError`, or the typed failure); see {@link RunOptions.retry}.
 * - `resources` (since 0.2.0): the declared resources (or their keys) the
 *   body may change (PROTOCOL-CURRENT C.6.4). The kernel counts the step
 *   towards their checkpoint policy, and the ones it names as due are
 *   captured right after the body; see `Resource`.
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
 * they are and record nothing; a `Resource.CheckpointUnavailable` fails the
 * step and propagates as it is; an unknown decision fails with a `KernelError`
 * (a `DecodeError` reason: `unexpected step decision: <value>`).
 *
 * @example
 * ```ts
 * import { Effect, Schema } from "effect"
 * import { Step } from "effect-rebuno"
 *
 * // a payment provider's client that deduplicates requests by idempotency key
 * const payments = {
 *   charge: (amount: number, options: { readonly idempotencyKey: string }) =>
 *     Effect.succeed({ id: `ch_${options.idempotencyKey.slice(0, 12)}`, amount })
 * }
 *
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
  /**
   * The resources the body may change (PROTOCOL-CURRENT C.6.4); see {@link Options}.
   *
   * @since 0.2.0
   */
  readonly resources?: ReadonlyArray<Resource.Any | string> | undefined
  /**
   * Retry a failed body on this schedule, fed with its failures (the
   * `ToolError`, or the typed failure). Each attempt is a step of its own with
   * the same kind, target and arguments (the kernel numbers them like
   * identical calls, PROTOCOL.md 8.4), and a failed attempt records its number
   * and, when it is retried, when: `{"message":…,"attempt":1,"retry_at_ms":…}`.
   * A replay follows the recorded attempts without asking the schedule again
   * and without sleeping through the backoff (only until a recorded retry time
   * that is still ahead, after a crash during the backoff). Denials, signals
   * and results that are not JSON are not retried.
   *
   * **Example** (Three tries, 1 s apart and doubling)
   *
   * ```ts
   * import { Effect, Schedule, Schema } from "effect"
   * import { Agent, Step } from "effect-rebuno"
   *
   * const fetchQuote = Effect.tryPromise({
   *   try: async () => {
   *     const response = await fetch("https://quotes.example.com/eur-usd")
   *     if (!response.ok) throw new Error(`quote service answered ${response.status}`)
   *     return (await response.json()) as { readonly rate: number }
   *   },
   *   catch: (cause) => new Error(`no quote: ${cause}`) // the message recorded with each failed try
   * })
   *
   * const trader = Agent.make({
   *   id: "trader",
   *   handler: () =>
   *     // tries at 0 s, 1 s and 3 s, each a local step "quote"; the third failure fails the run
   *     Step.run("quote", fetchQuote, {
   *       success: Schema.Struct({ rate: Schema.Number }),
   *       retry: Schedule.exponential("1 second").pipe(Schedule.upTo({ times: 2 }))
   *     })
   * })
   * ```
   *
   * @since 0.2.0
   */
  readonly retry?: Schedule.Schedule<unknown, ToolError | F> | undefined
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
      resources: options?.resources,
      retry: options?.retry,
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
 * import { Effect, Schema } from "effect"
 * import { Step } from "effect-rebuno"
 *
 * const regions = ["eu-west-1", "us-east-1", "ap-south-1"]
 *
 * // random the first time, the recorded region on every replay
 * const pick = Step.run("pick-region", Effect.sync(() => regions[Math.floor(Math.random() * regions.length)]), {
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
    readonly resources?: ReadonlyArray<Resource.Any | string> | undefined
    /** @since 0.2.0 */
    readonly retry?: Schedule.Schedule<unknown, ToolError> | undefined
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

/** Sleep until `deadline` (epoch milliseconds on the fiber's `Clock`); not at all once it has passed. */
const sleepUntilDeadline = (deadline: number): Effect.Effect<void> =>
  Effect.flatMap(Clock.currentTimeMillis, (now) => deadline > now ? Effect.sleep(Duration.millis(deadline - now)) : Effect.void)

/**
 * A durable sleep: the deadline (now + `duration`, on Effect's `Clock`) is
 * recorded once as the local step `sleep` (arguments
 * `{"duration_ms":<millis>}`, result the deadline in epoch milliseconds), then
 * the run sleeps until it. A re-run — after a crash, a lease loss or an
 * approval — replays the deadline and sleeps only what is left of it, or not
 * at all once it has passed.
 *
 * **Details**
 *
 * The kernel has no timers: the run stays in flight for the whole sleep, and
 * its heartbeat keeps the lease (PROTOCOL.md 5.8). Under the test kit,
 * virtual time skips to the deadline; for a sleep past an hour, give
 * `kernel.run` a longer `timeout` (after 1 hour of virtual time by default it
 * returns the execution still running, with `timedOut: true`).
 *
 * **Example** (Wait a day before following up)
 *
 * ```ts
 * import { Effect, Schema } from "effect"
 * import { Agent, Step, Tool } from "effect-rebuno"
 *
 * // your email service
 * declare const mailer: { send(message: { to: string; subject: string }): Promise<void> }
 *
 * const sendEmail = Tool.make("send_email", {
 *   args: Schema.Struct({ to: Schema.String, subject: Schema.String }),
 *   success: Schema.Null,
 *   idempotency: "at_most_once",
 *   execute: (message) => Effect.as(Effect.tryPromise(() => mailer.send(message)), null)
 * })
 *
 * const onboarding = Agent.make({
 *   id: "onboarding",
 *   input: Schema.Struct({ to: Schema.String }),
 *   handler: ({ to }) =>
 *     Effect.gen(function*() {
 *       yield* sendEmail({ to, subject: "Welcome!" })
 *       // a re-run after a crash does not send the welcome again and sleeps only what is left
 *       yield* Step.sleep("1 day")
 *       yield* sendEmail({ to, subject: "How is it going?" })
 *     })
 * })
 * ```
 *
 * @since 0.2.0
 * @category time
 */
export const sleep = (duration: Duration.Input): Effect.Effect<void, StepError, Execution> => {
  const millis = Duration.toMillis(duration)
  return Effect.flatMap(
    runImpl("sleep", Effect.map(Clock.currentTimeMillis, (now) => now + millis), {
      args: { duration_ms: millis },
      success: Schema.Number
    }),
    sleepUntilDeadline
  )
}

/**
 * A durable sleep until `epochMillis` (on Effect's `Clock`): the deadline is
 * recorded once as the local step `sleep` (arguments `{"until_ms":<epochMillis>}`),
 * then the run sleeps until it; a re-run sleeps only what is left. The
 * deadline is part of the step's arguments, so it must itself be
 * deterministic (a constant, or computed from a recorded step such as
 * {@link now}).
 *
 * @since 0.2.0
 * @category time
 */
export const sleepUntil = (epochMillis: number): Effect.Effect<void, StepError, Execution> =>
  Effect.flatMap(
    runImpl("sleep", Effect.succeed(epochMillis), { args: { until_ms: epochMillis }, success: Schema.Number }),
    sleepUntilDeadline
  )
