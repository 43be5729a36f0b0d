/**
 * Agents and their dispatch runtime. `Agent.make` pairs an id with a handler
 * (and optional input / output / state schemas and a description); the
 * runtime turns signed webhooks from the kernel into runs (PROTOCOL.md 14.2,
 * 14.3): verify (401), parse (400), deduplicate or supersede per execution,
 * ack 200 at once, then in the background heartbeat for the whole run, fetch
 * the execution (skipping terminal ones), decode the input, run the handler
 * with the `Execution` context provided and its `Session` as second argument,
 * and report the outcome (with the new session state, PROTOCOL-CURRENT C.4.5)
 * — never for a run that recorded a signal (`Blocked`, `Terminated`,
 * `LeaseSuperseded`, `Abandoned`), even when the handler swallowed it.
 *
 * The runtime also publishes the agent's metadata — its description and the
 * JSON Schemas of its input and output — with `PUT
 * /v0/agents/{id}/metadata` (PROTOCOL-CURRENT C.3): at start-up under
 * `Agent.serve` / `Agent.layer`, else on the first verified webhook. A
 * failure is one log line and never stops the agent; after a connection
 * error or a timeout the next verified webhook tries again, after any other
 * failure (a kernel without the route answers `404`) it is not retried.
 *
 * Serve it with `Agent.serve` (Node HTTP server) or `Agent.layer` (the
 * `HttpServer` in context), mount it with `Agent.toHttpApp`, or use
 * `Agent.toWebHandler` for any `Request → Response` host.
 *
 * Every rejected webhook request is one log line (`Warning`; `Info` for an
 * unknown path or method) saying why — bad or missing signature (with a hint
 * to compare `REBUNO_AGENT_SECRET` with the kernel's manifest; the secret is
 * never logged), malformed or oversized body, unknown route — annotated with
 * `rebuno.agent_id`, `rebuno.rejected` (the reason code) and
 * `rebuno.http_status`. A run's own log lines carry `rebuno.agent_id`,
 * `rebuno.execution_id`, `rebuno.dispatch_id` and `rebuno.dispatch_attempt`.
 * For one line per entry, readable and parseable, provide one of Effect's
 * loggers: `Logger.layer([Logger.consoleLogFmt])` or
 * `Logger.layer([Logger.consoleJson])`.
 *
 * @since 0.1.0
 */
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import {
  Cause,
  Clock,
  Config,
  Context,
  Effect,
  Exit,
  FiberMap,
  identity,
  JsonSchema,
  Layer,
  Logger,
  ManagedRuntime,
  Option,
  Ref,
  References,
  Result,
  Schema,
  Scope,
  Stream,
  Tracer
} from "effect"
import { Headers, HttpBody, HttpServer, HttpServerRequest, HttpServerResponse } from "effect/http"
import type { HttpServerError } from "effect/http"
import { createServer } from "node:http"
import { Execution, fromRunState } from "./Execution.js"
import { KernelClient, OutcomeRetry } from "./KernelClient.js"
import type { Caller } from "./KernelClient.js"
import * as Protocol from "./Protocol.js"
import type * as Resource from "./Resource.js"
import { Abandoned, isRunSignal, KernelError, LeaseSuperseded, StepDecodeError } from "./RebunoError.js"
import * as Session from "./Session.js"
import * as Signature from "./Signature.js"
import { decodeRefusal, failureReason, inputInvalid } from "./internal/run/failureReason.js"
import { stringifyStrict } from "./internal/wire/json.js"
import { issueMessages } from "./internal/run/run.js"
import * as Resources from "./internal/run/resources.js"
import * as ReplayLog from "./internal/run/replayLog.js"
import { makeRunState } from "./internal/run/runtime.js"
import * as Tracing from "./internal/http/tracing.js"
import type { RunState } from "./internal/run/runtime.js"
import { CurrentRetryBudget, isTransportFailure, retryTransport } from "./internal/http/exchange.js"
import type { RetryBudget } from "./internal/http/exchange.js"
import * as Heartbeats from "./internal/run/heartbeats.js"

/**
 * An agent: its id, its handler and optional schemas for its input, output
 * and session state. `R` is what the handler needs besides `Execution`; `S`
 * is the type of its session state (`unknown` without a `state` Schema).
 *
 * @since 0.1.0
 * @category models
 */
export interface Agent<In, A, E, R, S = any> {
  readonly id: string
  /**
   * What the agent does, published with its metadata (PROTOCOL-CURRENT C.3).
   *
   * @since 0.2.0
   */
  readonly description: string | undefined
  /** Decodes the execution's input (its decoding services are part of `R`). */
  readonly inputSchema: Schema.Decoder<In, R> | undefined
  /** Encodes the handler's value (its encoding services are part of `R`). */
  readonly outputSchema: Schema.Codec<A, unknown, unknown, R> | undefined
  /**
   * Decodes the previous session state and encodes the new one (its services
   * are part of `R`).
   *
   * @since 0.2.0
   */
  readonly stateSchema: Schema.Codec<S, unknown, R, R> | undefined
  /**
   * The resources every run registers and opens before the handler runs
   * (PROTOCOL-CURRENT C.6.8); their drivers are part of `R`. Absent or empty:
   * none.
   *
   * @since 0.2.0
   */
  readonly resources?: ReadonlyArray<Resource.Any> | undefined
  /**
   * What happens to the handler's log lines while a run replays (see
   * {@link ReplayLogging}); absent: the fiber's {@link ReplayLogging}.
   *
   * @since 0.2.0
   */
  readonly replayLogging?: ReplayLogging | undefined
  readonly handler: (
    input: In,
    session: Session.Session<S>
  ) => Effect.Effect<A | Session.WithState<A, S>, E, R | Execution>
}

/**
 * Define an agent.
 *
 * - `input`: without it the handler gets the raw JSON input; with it, an input
 *   that does not decode fails the execution with
 *   `input_invalid: <issues joined by "; ">` before the handler runs.
 * - `output`: the handler's value is encoded with it before it is posted.
 * - `state`: the type of the agent's session state (PROTOCOL-CURRENT C.4):
 *   the handler's second argument, a {@link Session.Session}, reads the
 *   previous state decoded with it (`yield* session.previous`), and a handler
 *   that returns `session.withState(output, state)` stores `state`, encoded
 *   with it, for the next execution of the session.
 * - `description`: what the agent does; published with the JSON Schemas of
 *   `input` and `output` as the agent's metadata (PROTOCOL-CURRENT C.3).
 * - `resources`: the {@link Resource.Resource}s of the agent (PROTOCOL-CURRENT
 *   C.6): every run registers them and opens, creates (restored from a fork's
 *   checkpoint) or binds them before the handler runs, and checkpoints them by
 *   their policies. Their driver services become part of the agent's
 *   requirements. A kernel error while setting them up fails the execution;
 *   a driver that cannot create or open one fails `yield* resource.handle`.
 * - `replayLogging`: what happens to the handler's log lines while a run
 *   replays: `"suppress"`, `"mark"` or `"all"` (see {@link ReplayLogging};
 *   the default is the fiber's `ReplayLogging`, `"suppress"`).
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
 *   description: "Searches the web for a prompt",
 *   input: Schema.Struct({ prompt: Schema.String }),
 *   handler: ({ prompt }) => search({ query: prompt })
 * })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = <
  In = unknown,
  A = void,
  E = never,
  R = never,
  RI = never,
  RO = never,
  S = unknown,
  RS = never,
  const Res extends ReadonlyArray<Resource.Any> = readonly []
>(
  options: {
    readonly id: string
    /** @since 0.2.0 */
    readonly description?: string | undefined
    readonly input?: Schema.Decoder<In, RI> | undefined
    readonly output?: Schema.Codec<A, unknown, unknown, RO> | undefined
    /** @since 0.2.0 */
    readonly state?: Schema.Codec<S, unknown, RS, RS> | undefined
    /** @since 0.2.0 */
    readonly resources?: Res | undefined
    /** @since 0.2.0 */
    readonly replayLogging?: ReplayLogging | undefined
    readonly handler: (input: In, session: Session.Session<S>) => Effect.Effect<A | Session.WithState<A, S>, E, R>
  }
): Agent<In, A, E, Exclude<R, Execution> | RI | RO | RS | Resource.Services<Res>, S> => ({
  id: options.id,
  description: options.description,
  inputSchema: options.input,
  outputSchema: options.output,
  stateSchema: options.state,
  ...(options.resources === undefined || options.resources.length === 0 ? {} : { resources: options.resources }),
  ...(options.replayLogging === undefined ? {} : { replayLogging: options.replayLogging }),
  handler: options.handler as Agent<
    In,
    A,
    E,
    Exclude<R, Execution> | RI | RO | RS | Resource.Services<Res>,
    S
  >["handler"]
})

/**
 * A webhook delivery as the runtime sees it: the raw body bytes and the
 * `Rebuno-Signature` header.
 *
 * @since 0.1.0
 * @category models
 */
export interface WebhookRequest {
  readonly body: Uint8Array
  readonly signature: string | null | undefined
}

/**
 * The dispatch runtime of one agent in this process.
 *
 * @since 0.1.0
 * @category models
 */
export interface AgentRuntime {
  readonly agentId: string
  /**
   * Handle one webhook delivery and return the HTTP status to answer with:
   * `401` (bad signature), `400` (bad body) or `200` (accepted or duplicate).
   * An accepted run continues in the background. A rejection is logged with
   * its reason.
   */
  readonly handleWebhook: (request: WebhookRequest) => Effect.Effect<number>
  /**
   * Publish the agent's metadata (PROTOCOL-CURRENT C.3) in the background,
   * unless it is published, being published, or was refused for good. Every
   * verified webhook calls it; `Agent.serve` and `Agent.layer` also call it
   * at start-up.
   *
   * @since 0.2.0
   */
  readonly publishMetadata: Effect.Effect<void>
  /** The number of runs in progress. */
  readonly activeRuns: Effect.Effect<number>
  /** Wait until no run is in progress. */
  readonly awaitIdle: Effect.Effect<void>
}

/**
 * The heartbeat interval of PROTOCOL.md 5.8, in whole milliseconds:
 * `min(lease × 1000 / 3, 30 000)` rounded down, at least 1 000, and 30 000
 * when the lease timeout is unknown.
 *
 * @since 0.1.0
 * @category runtime
 */
export const heartbeatIntervalMillis = (leaseTimeoutSeconds: number | undefined): number =>
  leaseTimeoutSeconds === undefined || !(leaseTimeoutSeconds > 0) ?
    30_000 :
    Math.max(1_000, Math.min(Math.floor((leaseTimeoutSeconds * 1_000) / 3), 30_000))

interface ActiveRun {
  readonly dispatchId: string
  readonly attempt: number | undefined
  readonly state: RunState
}

const utf8 = new TextDecoder("utf-8", { fatal: true })

const decodeBody = (body: Uint8Array): string | undefined => {
  try {
    return utf8.decode(body)
  } catch {
    return undefined
  }
}

/** 14.2 step 3: is the incoming delivery a duplicate (or stale) of the active run? */
const isDuplicate = (active: ActiveRun, notice: Protocol.WebhookNotice): boolean =>
  active.dispatchId === notice.dispatchId &&
  (notice.dispatchAttempt === undefined || active.attempt === undefined || notice.dispatchAttempt <= active.attempt)

/**
 * Create the dispatch runtime of an agent. Runs are forked into a `FiberMap`
 * owned by the current `Scope`: closing it interrupts every run in progress.
 *
 * @since 0.1.0
 * @category runtime
 */
export const runtime = <In, A, E, R>(
  agent: Agent<In, A, E, R>
): Effect.Effect<AgentRuntime, never, Scope.Scope | KernelClient | R> =>
  Effect.gen(function*() {
    const kernel = yield* KernelClient
    // Runs must not inherit the caller's Scope: they get their own (see below).
    const context = Context.omit(Scope.Scope)(yield* Effect.context<KernelClient | R>()) as Context.Context<
      KernelClient | R
    >
    const runs = yield* FiberMap.make<string, void, never>()
    // One timer for the heartbeats of every run (not a fiber per run).
    const heartbeats = yield* Heartbeats.make
    const active = new Map<string, ActiveRun>()
    const publishMetadata = yield* metadataPublisher(agent, kernel)
    // How the runs ride out a kernel outage (issue 13), as configured where the runtime is built.
    const retry = yield* OutcomeRetry
    // Whether spans started in a run are observed (not under Effect's built-in tracer).
    const recording = Tracing.isRecording(Context.get(context, Tracer.Tracer), Context.get(context, References.TracerEnabled))

    const handleWebhook = (request: WebhookRequest): Effect.Effect<number> =>
      Effect.gen(function*() {
        const verified = yield* Signature.verify(kernel.secret, request.body, request.signature)
        if (!verified) return yield* rejectedSignature(agent.id, request.signature)
        const text = decodeBody(request.body)
        const notice = text === undefined ? undefined : Protocol.decodeWebhookNotice(text)
        if (notice === undefined) {
          return yield* logRejected(
            agent.id,
            400,
            "malformed_body",
            text === undefined ? "the body is not UTF-8" : malformedNotice
          )
        }
        if (kernel.observeWebhook !== undefined) yield* kernel.observeWebhook(notice)
        yield* publishMetadata
        const caller: Caller = {
          agentId: agent.id,
          lease: { dispatchId: notice.dispatchId, attempt: notice.dispatchAttempt }
        }
        const state = yield* makeRunState(kernel, caller, notice.executionId, {
          leaseTimeoutSeconds: notice.leaseTimeoutSeconds,
          retry
        })
        const previous = yield* Effect.sync(() => {
          const current = active.get(notice.executionId)
          if (current !== undefined && isDuplicate(current, notice)) return "duplicate" as const
          active.set(notice.executionId, {
            dispatchId: notice.dispatchId,
            attempt: notice.dispatchAttempt,
            state
          })
          return current
        })
        const logAttributes = { ...Tracing.runAttributes(notice), "rebuno.agent_id": agent.id }
        if (previous === "duplicate") {
          yield* Effect.logDebug("duplicate webhook ignored").pipe(Effect.annotateLogs(logAttributes))
          return 200
        }
        if (previous !== undefined) {
          yield* Effect.logDebug("superseding the active run").pipe(Effect.annotateLogs(logAttributes))
          yield* previous.state.raise(new LeaseSuperseded())
        }
        const forget = Effect.sync(() => {
          if (active.get(notice.executionId)?.state === state) active.delete(notice.executionId)
        })
        const program = Effect.andThen(Effect.yieldNow, runOnce(agent, state, notice, heartbeats)).pipe(
          // Each run owns its scope (for handlers that acquire resources).
          Effect.scoped,
          Effect.ensuring(Effect.andThen(state.close, forget)),
          Effect.catchCause((cause) =>
            interruptedOnly(cause) ? Effect.void : Effect.logError("run failed unexpectedly", cause)
          ),
          Effect.annotateLogs(logAttributes),
          recording ? Effect.annotateSpans(Tracing.runAttributes(notice)) : identity
        )
        // The run's fiber starts on the spot (it yields first, so that the webhook is answered
        // before the run makes its first call) with the runtime's context: not the webhook
        // request's, which it would otherwise copy and keep for as long as it runs. Only the
        // span it was delivered in is carried over, when spans are recorded.
        const fiber = yield* Effect.withFiber((parent) => {
          // The runtime is closing: as `FiberMap.run` does, start nothing.
          if (runs.state._tag === "Closed") return Effect.interrupt
          const span = recording ? Context.getOption(parent.context, Tracer.ParentSpan) : Option.none()
          const started = Effect.runForkWith(
            Option.isSome(span) ? Context.add(context, Tracer.ParentSpan, span.value) : context
          )(program)
          FiberMap.setUnsafe(runs, notice.executionId, started)
          return Effect.succeed(started)
        })
        // A signal that stops the run (lease lost, abandoned, superseded) interrupts this fiber.
        state.attach(fiber)
        return 200
      }).pipe(Tracing.withSpan("Agent.handleWebhook", { attributes: { "rebuno.agent_id": agent.id } }))

    return {
      agentId: agent.id,
      handleWebhook,
      publishMetadata,
      activeRuns: FiberMap.size(runs),
      awaitIdle: FiberMap.awaitEmpty(runs)
    }
  })

/** The JSON Schema of a schema (draft 2020-12, `$defs` when it has definitions), or `null` when it has none. */
const jsonSchemaOf = (schema: Schema.Top | undefined): unknown => {
  if (schema === undefined) return null
  try {
    const document = Schema.toJsonSchemaDocument(schema)
    const definitions = Object.keys(document.definitions).length === 0 ? {} : { $defs: document.definitions }
    return { $schema: JsonSchema.META_SCHEMA_URI_DRAFT_2020_12, ...document.schema, ...definitions }
  } catch {
    // A schema with no JSON Schema form (a declaration without one): publish none.
    return null
  }
}

/**
 * The agent's metadata (PROTOCOL-CURRENT C.3.1): its description and the JSON
 * Schemas of its input and output as sent (their encoded side).
 *
 * @since 0.2.0
 * @category runtime
 */
export const metadataOf = (agent: Agent<any, any, any, any>): Protocol.AgentMetadataBody => ({
  description: agent.description ?? null,
  inputSchema: jsonSchemaOf(agent.inputSchema),
  outputSchema: jsonSchemaOf(agent.outputSchema)
})

/**
 * `publishMetadata` of a runtime (PROTOCOL-CURRENT C.3.2): one attempt at a
 * time in the background; after a transport failure (connection error,
 * timeout) the next call tries again, after anything else — success or an
 * error answer — it is never sent again. A failure is one log line.
 */
const metadataPublisher = (
  agent: Agent<any, any, any, any>,
  kernel: KernelClient.Service
): Effect.Effect<Effect.Effect<void>, never, Scope.Scope> =>
  Effect.map(Effect.scope, (scope) => {
    let state: "pending" | "publishing" | "settled" = "pending"
    const attempt = Effect.suspend((): Effect.Effect<void> => {
      const publish = kernel.publishMetadata
      if (publish === undefined) {
        state = "settled"
        return Effect.logDebug("this KernelClient does not publish agent metadata")
      }
      return publish(agent.id, metadataOf(agent)).pipe(
        Effect.matchEffect({
          onSuccess: () => {
            state = "settled"
            return Effect.logDebug("agent metadata published")
          },
          onFailure: (error) => {
            if (isTransportFailure(error) && error.reason._tag === "TransportError") {
              state = "pending"
              return Effect.logWarning("publishing agent metadata failed; the next webhook tries again", error)
            }
            state = "settled"
            return error.status === 404
              ? Effect.logInfo("the kernel does not take agent metadata (404); not sent again")
              : error.status === 401
              // At start-up, the first sign of a secret the kernel does not share (issue 13).
              ? Effect.logWarning(
                `the kernel refused this agent's signature (401 unauthorized) when publishing its metadata: ` +
                  `compare REBUNO_AGENT_SECRET (the agent's secret) with the secret of agent "${agent.id}" in the ` +
                  `kernel's manifest, and check that the agent is registered; not sent again`
              )
              : Effect.logWarning("publishing agent metadata failed; not sent again", error)
          }
        }),
        Effect.annotateLogs({ "rebuno.agent_id": agent.id })
      )
    })
    return Effect.suspend(() => {
      if (state !== "pending") return Effect.void
      state = "publishing"
      return Effect.asVoid(Effect.forkIn(attempt, scope))
    })
  })

/**
 * One heartbeat of a run (5.8), started by the runtime's heartbeat timer
 * every interval. Only `lease_superseded` stops the run. A beat that meets a
 * transport failure is retried with the outcome calls' backoff (at most one
 * interval apart) while the lease can still be valid, so that the lease is
 * renewed as soon as the kernel is back (issue 13); a successful beat renews
 * the run's lease clock. Built when the beat is due: a parked run holds none.
 */
const heartbeat = (state: RunState, intervalMillis: number): Effect.Effect<void> => {
  const lease = state.lease
  const budget: RetryBudget = {
    baseMillis: lease.budget.baseMillis,
    capMillis: Math.min(lease.budget.capMillis, intervalMillis),
    deadline: (firstFailureMillis) => lease.budget.deadline(firstFailureMillis)
  }
  return retryTransport(state.client.heartbeat(state.caller, state.executionId)).pipe(
    Effect.provideService(CurrentRetryBudget, budget),
    Effect.andThen(Clock.currentTimeMillis),
    Effect.map((now) => lease.renewed(now)),
    Effect.catch((error) =>
      error._tag === "LeaseSuperseded" ?
        Effect.flatMap(Ref.get(state.finishing), (finishing) => finishing ? Effect.void : state.raise(error)) :
        Effect.logDebug("heartbeat failed", error)
    )
  )
}

/**
 * One run, heartbeating from its start until it has ended (its outcome
 * posted, or interrupted).
 */
const runOnce = <In, A, E, R, S>(
  agent: Agent<In, A, E, R, S>,
  state: RunState,
  notice: Protocol.WebhookNotice,
  heartbeats: Heartbeats.Heartbeats
): Effect.Effect<void, never, R> => {
  const intervalMillis = heartbeatIntervalMillis(notice.leaseTimeoutSeconds)
  return Effect.flatMap(
    heartbeats.start(intervalMillis, () => heartbeat(state, intervalMillis)),
    (beating) => Effect.ensuring(runHandler(agent, state, notice), beating.stop)
  )
}

/** One run (14.3 steps 2–6). */
const runHandler = <In, A, E, R, S>(
  agent: Agent<In, A, E, R, S>,
  state: RunState,
  notice: Protocol.WebhookNotice
): Effect.Effect<void, never, R> =>
  Effect.gen(function*() {
    const fetched = yield* Effect.result(state.client.getExecution({ agentId: agent.id }, notice.executionId))
    if (Result.isFailure(fetched)) {
      const error = fetched.failure
      if (isTransportFailure(error)) {
        yield* state.raise(new Abandoned({ reason: `cannot read the execution: ${error.message}` }))
      } else if (error._tag === "KernelError" && error.status === 404) {
        yield* Effect.logWarning("execution not found; run stopped")
      } else if (error._tag !== "LeaseSuperseded") {
        yield* Effect.logWarning("cannot read the execution; run stopped", error)
      }
      return
    }
    const execution = fetched.success
    if (Protocol.isTerminalStatus(execution.status)) return
    let input: In
    if (agent.inputSchema === undefined) {
      input = execution.input as In
    } else {
      const decoded = yield* Effect.result(
        Schema.decodeUnknownEffect(agent.inputSchema, { errors: "all", reportInput: true })(execution.input)
      )
      if (Result.isFailure(decoded)) {
        yield* Ref.set(state.finishing, true)
        yield* post(
          state.client.failExecution(state.caller, notice.executionId, inputInvalid(issueMessages(decoded.failure)))
        )
        return
      }
      input = decoded.success
    }
    const service = fromRunState(state, {
      agentId: agent.id,
      executionId: notice.executionId,
      dispatchId: notice.dispatchId,
      dispatchAttempt: notice.dispatchAttempt,
      leaseTimeoutSeconds: notice.leaseTimeoutSeconds,
      input: execution.input
    })
    const session = Session.make({
      id: execution.session,
      parentExecutionId: execution.parentExecutionId,
      previous: readPrevious(agent, state, yield* Effect.context<R>())
    })
    const handler = Effect.provideService(agent.handler(input, session), Execution, service)
    const resources = agent.resources
    const exit = yield* Effect.exit(replayAware(
      agent,
      state,
      resources === undefined || resources.length === 0
        ? handler
        // PROTOCOL-CURRENT C.6.8: set the resources up around the handler, checkpoint them after it.
        : Resources.around(state, resources, handler) as Effect.Effect<A | Session.WithState<A, S>, unknown, R>
    ))
    yield* report(agent, state, exit)
  })

/**
 * What happens to a handler's log lines while its run is *replaying* —
 * re-executing steps an earlier run recorded, from the start of the run until
 * its first `proceed` decision (issue 13; Temporal and Restate do the same):
 *
 * - `"suppress"` (default): they are dropped, so a re-run after a crash or an
 *   approval does not repeat the lines of the steps it replays;
 * - `"mark"`: they are written with the log annotation `rebuno.replaying=true`;
 * - `"all"`: they are written as usual.
 *
 * **Details**
 *
 * It wraps the loggers of the handler's fiber (loggers the handler installs
 * itself are not wrapped); the runtime's lines outside the handler (delivery,
 * outcome, heartbeat) are not touched. Until its first `replay` or `proceed`
 * decision (of a step, an LLM call or a subagent) a run cannot know
 * whether it replays, so the lines of that stretch are held back (with their
 * time, annotations and spans) and written, dropped or marked once it knows —
 * and written when the handler ends without either (up to 1 000 lines: past
 * that the run counts as live). The first `proceed` makes the run live for
 * good; lines inside a step body that runs are never replayed lines. Lines
 * between the last replayed step and the first new one belong to the
 * replaying stretch too, even when the earlier run died before writing them.
 *
 * **Gotchas**
 *
 * A run resumed after an approval whose first step is the approved one gets
 * `proceed` for it at once, so it counts as live: its lines before that step
 * are written again.
 *
 * **Example** (Marking instead of dropping)
 *
 * ```ts
 * import { NodeRuntime } from "@effect/platform-node"
 * import { Effect, Layer, Logger, Schema } from "effect"
 * import { Agent, KernelClient, Step } from "effect-rebuno"
 *
 * const researcher = Agent.make({
 *   id: "researcher",
 *   input: Schema.Struct({ prompt: Schema.String }),
 *   handler: ({ prompt }) =>
 *     Effect.gen(function*() {
 *       const startedAt = yield* Step.now
 *       // written on every run; on a re-run that replays `now`, with "rebuno.replaying": true
 *       yield* Effect.logInfo(`researching ${prompt}`)
 *       return { prompt, startedAt }
 *     })
 * })
 *
 * Agent.serve(researcher, { port: 5000 }).pipe(
 *   Layer.provide(KernelClient.layerSocketConfig()), // REBUNO_URL, REBUNO_AGENT_SECRET
 *   Layer.provide(Layer.succeed(Agent.ReplayLogging, "mark")),
 *   Layer.provide(Logger.layer([Logger.consoleJson])), // one JSON line per entry, with its annotations
 *   Layer.launch,
 *   NodeRuntime.runMain
 * )
 * ```
 *
 * @since 0.2.0
 * @category logging
 */
export type ReplayLogging = ReplayLog.Mode

/**
 * The {@link ReplayLogging} of the runs an agent runtime starts (read where
 * the runtime runs them); an agent's own `replayLogging` option wins.
 *
 * @since 0.2.0
 * @category logging
 */
export const ReplayLogging: Context.Reference<ReplayLogging> = Context.Reference<ReplayLogging>(
  "effect-rebuno/Agent/ReplayLogging",
  { defaultValue: () => "suppress" }
)

/** The handler of a run, its loggers behind the run's replay tracker (see {@link ReplayLogging}). */
const replayAware = <A, E, R>(
  agent: { readonly replayLogging?: ReplayLogging | undefined },
  state: RunState,
  handler: Effect.Effect<A, E, R>
): Effect.Effect<A, E, R> =>
  Effect.withFiber((fiber) => {
    const mode = agent.replayLogging ?? fiber.getRef(ReplayLogging)
    if (mode === "all") return handler
    const tracker = ReplayLog.track(state.client, mode)
    return handler.pipe(
      Effect.provideService(Logger.CurrentLoggers, ReplayLog.wrapLoggers(tracker, fiber.getRef(Logger.CurrentLoggers))),
      Effect.ensuring(Effect.sync(() => tracker.end()))
    )
  })

/**
 * `session.previous` of a run: `GET …/previous` (PROTOCOL-CURRENT C.4.6), the
 * state decoded with the agent's `state` Schema; `null` is `Option.none()`.
 */
const readPrevious = <In, A, E, R, S>(
  agent: Agent<In, A, E, R, S>,
  state: RunState,
  context: Context.Context<R>
): Effect.Effect<Option.Option<S>, Session.PreviousError> =>
  Effect.suspend(() => {
    const previous = state.client.previous
    if (previous === undefined) {
      return Effect.die(new Error("the KernelClient in use cannot read the previous state (it has no `previous` call)"))
    }
    return Effect.flatMap(
      previous({ agentId: agent.id }, state.executionId),
      (json): Effect.Effect<Option.Option<S>, Session.PreviousError> => {
        if (json === null) return Effect.succeed(Option.none())
        const schema = agent.stateSchema
        if (schema === undefined) return Effect.succeed(Option.some(json as S))
        return Schema.decodeUnknownEffect(schema)(json, { reportInput: true }).pipe(
          Effect.map(Option.some),
          Effect.mapError((error) =>
            new StepDecodeError({
              target: "previous",
              stepId: "",
              description: `previous state does not decode: ${error.message}`
            })
          ),
          Effect.provideContext(context)
        )
      }
    )
  })

/** An outcome post: `lease_superseded` means done; other failures are logged. */
const post = (call: Effect.Effect<void, KernelError | LeaseSuperseded>): Effect.Effect<void> =>
  Effect.catch(call, (error) =>
    error._tag === "LeaseSuperseded" ? Effect.void : Effect.logWarning("cannot post the outcome", error))

/** Interrupted, and nothing else (an empty cause counts: nothing failed). */
const interruptedOnly = (cause: Cause.Cause<unknown>): boolean => cause.reasons.every(Cause.isInterruptReason)

/** 14.5: map the handler's outcome to a kernel call, applying the suspension backstop. */
const report = <In, A, E, R, S>(
  agent: Agent<In, A, E, R, S>,
  state: RunState,
  exit: Exit.Exit<A | Session.WithState<A, S>, E>
): Effect.Effect<void, never, R> =>
  Effect.gen(function*() {
    if (Exit.isFailure(exit) && interruptedOnly(exit.cause)) return
    if (Exit.isFailure(exit)) {
      const failure = Cause.findErrorOption(exit.cause)
      const error: unknown = Option.isSome(failure) ? failure.value : Cause.squash(exit.cause)
      const refusal = isRunSignal(error) ? error : decodeRefusal(error)
      if (refusal !== undefined && isRunSignal(refusal)) yield* state.raise(refusal)
      if (Option.isSome(yield* Ref.get(state.signal))) return
      yield* Ref.set(state.finishing, true)
      yield* post(state.client.failExecution(state.caller, state.executionId, failureReason(refusal ?? error)))
      return
    }
    if (Option.isSome(yield* Ref.get(state.signal))) return
    yield* Ref.set(state.finishing, true)
    const value = exit.value
    const withState = Session.isWithState(value)
    const output = yield* encodeOutput(agent, withState ? value.output as A : value)
    const stored = withState ? yield* encodeState(agent, value.state) : undefined
    const failed = output._tag === "Fail" ? output : stored?._tag === "Fail" ? stored : undefined
    yield* post(
      failed === undefined ?
        state.client.completeExecution(
          state.caller,
          state.executionId,
          output._tag === "Ok" ? output.json : undefined,
          stored?._tag === "Ok" ? stored.json : undefined
        ) :
        state.client.failExecution(state.caller, state.executionId, failed.reason)
    )
  })

type Encoded = { readonly _tag: "Ok"; readonly json: string | undefined } | {
  readonly _tag: "Fail"
  readonly reason: string
}

/** The JSON text of an encoded value (`undefined` for none), or the failure reason when it is not JSON. */
const encoded = (what: string) => (value: unknown): Encoded => {
  if (value === undefined) return { _tag: "Ok", json: undefined }
  const checked = stringifyStrict(value)
  return checked._tag === "Ok" ?
    { _tag: "Ok", json: checked.json } :
    { _tag: "Fail", reason: `agent_error: TypeError: ${what} is not JSON at ${checked.path}: ${checked.reason}` }
}

const encodeOutput = <In, A, E, R, S>(
  agent: Agent<In, A, E, R, S>,
  value: A
): Effect.Effect<Encoded, never, R> =>
  (agent.outputSchema === undefined ? Effect.succeed<unknown>(value) : Schema.encodeEffect(agent.outputSchema)(value)).pipe(
    Effect.map(encoded("output")),
    Effect.catch((error) => Effect.succeed({ _tag: "Fail", reason: failureReason(error) } as const))
  )

/**
 * The session state to store (PROTOCOL-CURRENT C.4.5), encoded with the
 * agent's `state` Schema; a state that encodes to `null` is not sent (as the
 * Python SDK omits `None`): the kernel would not store it anyway.
 */
const encodeState = <In, A, E, R, S>(
  agent: Agent<In, A, E, R, S>,
  value: unknown
): Effect.Effect<Encoded, never, R> =>
  (agent.stateSchema === undefined ? Effect.succeed<unknown>(value) : Schema.encodeEffect(agent.stateSchema)(value as S)).pipe(
    Effect.map((state) => encoded("state")(state === null ? undefined : state)),
    Effect.catch((error) => Effect.succeed({ _tag: "Fail", reason: failureReason(error) } as const))
  )

/**
 * A webhook handler: an HTTP effect that reads the current
 * `HttpServerRequest` and answers it (every answer bodiless, `Content-Length: 0`).
 *
 * @since 0.2.0
 * @category http
 */
export type HttpApp = Effect.Effect<HttpServerResponse.HttpServerResponse, never, HttpServerRequest.HttpServerRequest>

/**
 * The webhook handler as an HTTP effect, to mount on a router. Building it
 * creates the runtime in the current `Scope`.
 *
 * **Example** (Mounting the webhook on an `HttpRouter`)
 *
 * ```ts
 * import { NodeHttpServer, NodeRuntime } from "@effect/platform-node"
 * import { Effect, Layer, Schema } from "effect"
 * import { HttpRouter, HttpServerResponse } from "effect/http"
 * import { Agent, KernelClient } from "effect-rebuno"
 * import { createServer } from "node:http"
 *
 * const researcher = Agent.make({
 *   id: "researcher",
 *   input: Schema.Struct({ prompt: Schema.String }),
 *   handler: ({ prompt }) => Effect.succeed({ answer: `no results for ${prompt}` })
 * })
 *
 * // the runtime lives as long as the layer
 * const WebhookRoute = Layer.unwrap(
 *   Effect.map(Agent.toHttpApp(researcher), (app) => HttpRouter.add("POST", "/webhook", app))
 * )
 * const HealthRoute = HttpRouter.add("GET", "/health", HttpServerResponse.text("ok"))
 *
 * // POST /webhook and GET /health on one server, port 5000
 * HttpRouter.serve(Layer.mergeAll(WebhookRoute, HealthRoute)).pipe(
 *   Layer.provide(NodeHttpServer.layer(createServer, { port: 5000 })),
 *   Layer.provide(KernelClient.layerSocketConfig()), // REBUNO_URL, REBUNO_AGENT_SECRET
 *   Layer.launch,
 *   NodeRuntime.runMain
 * )
 * ```
 *
 * @since 0.1.0
 * @category http
 */
export const toHttpApp = <In, A, E, R>(
  agent: Agent<In, A, E, R>
): Effect.Effect<HttpApp, never, Scope.Scope | KernelClient | R> => Effect.map(runtime(agent), httpAppFor)

/**
 * The largest webhook body the HTTP adapters read: 1 MiB (a webhook is about
 * 200 bytes). A larger body cannot be verified, so it is answered `401` with
 * an empty body like every webhook that fails verification (PROTOCOL 3.5; the
 * kernel answers its own over-cap agent requests the same way, 2.4), logged
 * as `body_too_large`, and never buffered whole: an unauthenticated client
 * cannot make the agent hold arbitrary amounts of memory before the signature
 * check.
 *
 * @since 0.1.0
 * @category http
 */
export const maxWebhookBodyBytes = 1024 * 1024

/** A declared `Content-Length` over the cap (absent or unparseable: not known yet). */
const declaredTooLarge = (contentLength: string | null | undefined): boolean => {
  if (contentLength === null || contentLength === undefined) return false
  const n = Number(contentLength)
  return Number.isFinite(n) && n > maxWebhookBodyBytes
}

/** Read a body stream, stopping as soon as it grows past the cap. */
const readCapped = <E>(
  stream: Stream.Stream<Uint8Array, E>
): Effect.Effect<Uint8Array | "tooLarge" | "unreadable"> => {
  let size = 0
  const chunks: Array<Uint8Array> = []
  return Stream.runForEachWhile(stream, (chunk) =>
    Effect.sync(() => {
      size += chunk.length
      if (size > maxWebhookBodyBytes) return false
      chunks.push(chunk)
      return true
    })).pipe(
      Effect.map(() => {
        if (size > maxWebhookBodyBytes) return "tooLarge" as const
        const out = new Uint8Array(size)
        let offset = 0
        for (const chunk of chunks) {
          out.set(chunk, offset)
          offset += chunk.length
        }
        return out
      }),
      Effect.catchCause(() => Effect.succeed(size > maxWebhookBodyBytes ? "tooLarge" as const : "unreadable" as const))
    )
}

/** An answer with no body, framed by `Content-Length: 0` (not an empty chunked body). */
const bodiless = (status: number): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.empty({ status, headers: NO_BODY })

const NO_BODY = Headers.fromInput({ "content-length": "0" })

/**
 * The `401` of a declared oversized body, which is left unread: bodiless and
 * framed by `Content-Length: 0` like every answer, but carried as an empty
 * stream. On Node, `@effect/platform-node` 4 adds `connection: close` to a
 * bodiless answer that leaves more than 256 KiB of the request body unread; a
 * streamed one keeps the headers every webhook answer has
 * (`Connection: keep-alive`). The body has no content type, so none is sent.
 */
const tooLargeUnread = (): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.setBody(
    bodiless(401),
    new HttpBody.Stream(Stream.empty, undefined as unknown as string, 0)
  )

/**
 * Logs a rejected webhook request (one line, `Warning`, or `Info` for a
 * request to an unknown route) with its status and reason code as
 * annotations, and answers the status.
 */
const logRejected = (
  agentId: string,
  status: number,
  reason: "bad_signature" | "missing_signature" | "malformed_body" | "body_too_large" | "unreadable_body" | "unknown_route",
  why: string
): Effect.Effect<number> => {
  const message = `webhook request rejected (${status}): ${why}`
  return (reason === "unknown_route" ? Effect.logInfo(message) : Effect.logWarning(message)).pipe(
    Effect.annotateLogs({ "rebuno.agent_id": agentId, "rebuno.rejected": reason, "rebuno.http_status": status }),
    Effect.as(status)
  )
}

const malformedNotice =
  "the body is not a Rebuno webhook (a JSON object with execution_id and dispatch_id strings and, when present, " +
  "a positive integer dispatch_attempt)"

/**
 * The `401` of a webhook whose signature does not verify, with a hint at the
 * usual cause: the agent and the kernel do not share the secret. The secret
 * itself is never logged.
 */
const rejectedSignature = (agentId: string, header: string | null | undefined): Effect.Effect<number> =>
  typeof header !== "string" || header.length === 0
    ? logRejected(agentId, 401, "missing_signature", "no Rebuno-Signature header (is the sender a Rebuno kernel?)")
    : logRejected(
      agentId,
      401,
      "bad_signature",
      `bad signature: the kernel signed this webhook with another secret than this agent's; compare ` +
        `REBUNO_AGENT_SECRET (the agent's secret) with the secret of agent "${agentId}" in the kernel's manifest`
    )

const tooLargeWhy = `the body is larger than ${maxWebhookBodyBytes} bytes (a webhook is about 200)`

const httpAppFor = (rt: AgentRuntime): HttpApp =>
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    if (declaredTooLarge(request.headers["content-length"])) {
      yield* logRejected(rt.agentId, 401, "body_too_large", tooLargeWhy)
      return tooLargeUnread()
    }
    const body = yield* readCapped(request.stream)
    if (body === "tooLarge") return bodiless(yield* logRejected(rt.agentId, 401, "body_too_large", tooLargeWhy))
    if (body === "unreadable") {
      return bodiless(yield* logRejected(rt.agentId, 401, "unreadable_body", "the body could not be read"))
    }
    const status = yield* rt.handleWebhook({ body, signature: request.headers["rebuno-signature"] })
    return bodiless(status)
  })

/**
 * Options of {@link layer} and {@link serve}.
 *
 * @since 0.1.0
 * @category http
 */
export interface ServeOptions {
  /** The webhook path (default `/webhook`); every other path or method gets `404`. */
  readonly path?: string | undefined
}

/**
 * Serve the webhook on the `HttpServer` in context: `POST` on exactly `path`
 * (default `/webhook`); `404` for anything else.
 *
 * @since 0.1.0
 * @category http
 */
export const layer = <In, A, E, R>(
  agent: Agent<In, A, E, R>,
  options?: ServeOptions
): Layer.Layer<never, never, HttpServer.HttpServer | KernelClient | R> =>
  Layer.effectDiscard(
    Effect.gen(function*() {
      const path = options?.path ?? "/webhook"
      const rt = yield* runtime(agent)
      const app = httpAppFor(rt)
      // Start-up publication of the metadata (PROTOCOL-CURRENT C.3.2), in the background.
      yield* rt.publishMetadata
      const routed = Effect.gen(function*() {
        const request = yield* HttpServerRequest.HttpServerRequest
        const queryAt = request.url.indexOf("?")
        const pathname = queryAt === -1 ? request.url : request.url.slice(0, queryAt)
        if (request.method !== "POST" || pathname !== path) {
          const shown = pathname.length > 200 ? pathname.slice(0, 200) + "…" : pathname
          return bodiless(
            yield* logRejected(
              rt.agentId,
              404,
              "unknown_route",
              `no webhook at ${request.method} ${shown} (this agent serves POST ${path})`
            )
          )
        }
        return yield* app
      })
      yield* HttpServer.serveEffect(routed)
    })
  )

/**
 * Serve the webhook with a Node HTTP server on `host` (default `0.0.0.0`) and
 * `port`, at `path` (default `/webhook`).
 *
 * @example
 * ```ts
 * import { NodeRuntime } from "@effect/platform-node"
 * import { Effect, Layer, Schema } from "effect"
 * import { Agent, KernelClient } from "effect-rebuno"
 *
 * const researcher = Agent.make({
 *   id: "researcher",
 *   input: Schema.Struct({ prompt: Schema.String }),
 *   handler: ({ prompt }) => Effect.succeed({ answer: `no results for ${prompt}` })
 * })
 *
 * // POST /webhook on 0.0.0.0:5000; the kernel client from REBUNO_URL and REBUNO_AGENT_SECRET
 * Agent.serve(researcher, { port: 5000 }).pipe(
 *   Layer.provide(KernelClient.layerSocketConfig()),
 *   Layer.launch,
 *   NodeRuntime.runMain
 * )
 * ```
 *
 * @since 0.1.0
 * @category http
 */
export const serve = <In, A, E, R>(
  agent: Agent<In, A, E, R>,
  options: ServeOptions & { readonly port: number; readonly host?: string | undefined }
): Layer.Layer<never, HttpServerError.ServeError, KernelClient | R> =>
  layer(agent, options).pipe(
    Layer.provide(
      NodeHttpServer.layerServer(() => createServer(), { port: options.port, host: options.host ?? "0.0.0.0" })
    )
  )

/**
 * Where {@link serveConfig} serves: the port and the interface to bind.
 *
 * @since 0.2.0
 * @category http
 */
export interface ServeSettings {
  readonly port: number
  readonly host: string
}

/**
 * {@link ServeSettings} from the environment: `AGENT_PORT` (default `5000`)
 * and `AGENT_HOST` (default `0.0.0.0`, every interface; `127.0.0.1` for this
 * machine only).
 *
 * @since 0.2.0
 * @category http
 */
export const serveFromEnv: Config.Config<ServeSettings> = Config.all({
  port: Config.Port("AGENT_PORT").pipe(Config.withDefault(5000)),
  host: Config.String("AGENT_HOST").pipe(Config.withDefault("0.0.0.0"))
})

/**
 * {@link serve} with the port and host read from `Config` (by default
 * {@link serveFromEnv}: `AGENT_PORT`, `AGENT_HOST`). A port that is not a
 * port number is a `ConfigError` when the layer is built.
 *
 * @example
 * ```ts
 * import { NodeRuntime } from "@effect/platform-node"
 * import { Effect, Layer, Schema } from "effect"
 * import { Agent, KernelClient } from "effect-rebuno"
 *
 * const researcher = Agent.make({
 *   id: "researcher",
 *   input: Schema.Struct({ prompt: Schema.String }),
 *   handler: ({ prompt }) => Effect.succeed({ answer: `no results for ${prompt}` })
 * })
 *
 * // AGENT_PORT=5001 AGENT_HOST=127.0.0.1 npx tsx agent.ts
 * Agent.serveConfig(researcher).pipe(
 *   Layer.provide(KernelClient.layerSocketConfig()),
 *   Layer.launch,
 *   NodeRuntime.runMain
 * )
 * ```
 *
 * @since 0.2.0
 * @category http
 */
export const serveConfig = <In, A, E, R>(
  agent: Agent<In, A, E, R>,
  settings: Config.Wrap<ServeSettings> = serveFromEnv,
  options?: ServeOptions
): Layer.Layer<never, HttpServerError.ServeError | Config.ConfigError, KernelClient | R> =>
  Layer.unwrap(Effect.map(Config.unwrap(settings), (s) => serve(agent, { ...options, ...s })))

class RuntimeTag extends Context.Service<RuntimeTag, AgentRuntime>()("effect-rebuno/Agent/Runtime") {}

/**
 * A Web-standard `Request → Promise<Response>` webhook handler for any host
 * (serverless, Bun, Deno, a framework route). `layer` provides the
 * `KernelClient` and whatever else the handler needs; `dispose` interrupts the
 * runs in progress and releases the layer.
 *
 * @since 0.1.0
 * @category http
 */
export const toWebHandler = <In, A, E, R, LE>(
  agent: Agent<In, A, E, R>,
  layer: Layer.Layer<KernelClient | R, LE>
): {
  readonly handler: (request: Request) => Promise<Response>
  readonly dispose: () => Promise<void>
} => {
  // provideMerge: the layer's services (its logger, too) also apply to the webhook handling itself.
  const managed = ManagedRuntime.make(Layer.provideMerge(Layer.effect(RuntimeTag, runtime(agent)), layer))
  /** Answers a request rejected before the runtime saw it, logged with the layer's logger. */
  const rejected = (
    status: number,
    reason: "body_too_large" | "unreadable_body",
    why: string
  ): Promise<Response> =>
    managed.runPromise(logRejected(agent.id, status, reason, why)).then(
      () => new Response(null, { status }),
      () => new Response(null, { status })
    )
  const handler = (request: Request): Promise<Response> => {
    if (declaredTooLarge(request.headers.get("content-length"))) {
      const cancelled = request.body === null ? Promise.resolve() : request.body.cancel().catch(() => undefined)
      return cancelled.then(() => rejected(401, "body_too_large", tooLargeWhy))
    }
    const read = request.body === null
      ? Promise.resolve<Uint8Array | "tooLarge" | "unreadable">(new Uint8Array(0))
      : Effect.runPromise(readCapped(Stream.fromReadableStream({
        evaluate: () => request.body!,
        onError: (cause) => cause,
        releaseLockOnEnd: false
      })))
    return read.then((body) =>
      body === "tooLarge"
        ? rejected(401, "body_too_large", tooLargeWhy)
        : body === "unreadable"
        ? rejected(401, "unreadable_body", "the body could not be read")
        : managed.runPromise(
          RuntimeTag.use((rt) => rt.handleWebhook({ body, signature: request.headers.get("rebuno-signature") }))
        ).then(
          (status) => new Response(null, { status }),
          () => new Response(null, { status: 500 })
        )
    )
  }
  return { handler, dispose: () => managed.dispose() }
}
