/**
 * Agents and their dispatch runtime. `Agent.make` pairs an id with a handler
 * (and optional input / output schemas); the runtime turns signed webhooks
 * from the kernel into runs (PROTOCOL.md 14.2, 14.3): verify (401), parse (400),
 * deduplicate or supersede per execution, ack 200 at once, then in the
 * background heartbeat for the whole run, fetch the execution (skipping
 * terminal ones), decode the input, run the handler with the `Execution`
 * context provided, and report the outcome — never for a run that recorded a
 * signal (`Blocked`, `Terminated`, `LeaseSuperseded`, `Abandoned`), even when
 * the handler swallowed it. Serve it with `Agent.serve` (Node HTTP server) or
 * `Agent.layer` (the `HttpServer` in context), mount it with `Agent.toHttpApp`,
 * or use `Agent.toWebHandler` for any `Request → Response` host.
 *
 * @since 0.1.0
 */
import { NodeHttpServer } from "@effect/platform-node"
import {
  Cause,
  Context,
  Effect,
  Exit,
  FiberMap,
  Layer,
  ManagedRuntime,
  Option,
  Ref,
  Result,
  Schema,
  Scope,
  Stream
} from "effect"
import { Headers, HttpBody, HttpServer, HttpServerRequest, HttpServerResponse } from "effect/http"
import type { HttpServerError } from "effect/http"
import { createServer } from "node:http"
import { Execution, fromRunState } from "./Execution.js"
import { KernelClient } from "./KernelClient.js"
import type { Caller } from "./KernelClient.js"
import * as Protocol from "./Protocol.js"
import { Abandoned, isRunSignal, KernelError, LeaseSuperseded } from "./RebunoError.js"
import * as Signature from "./Signature.js"
import { decodeRefusal, failureReason, inputInvalid } from "./internal/run/failureReason.js"
import { stringifyStrict } from "./internal/wire/json.js"
import { issueMessages } from "./internal/run/run.js"
import { makeRunState } from "./internal/run/runtime.js"
import * as Tracing from "./internal/http/tracing.js"
import type { RunState } from "./internal/run/runtime.js"
import { isTransportFailure } from "./internal/http/exchange.js"

/**
 * An agent: its id, its handler and optional schemas for its input and output.
 * `R` is what the handler needs besides `Execution`.
 *
 * @since 0.1.0
 * @category models
 */
export interface Agent<In, A, E, R> {
  readonly id: string
  /** Decodes the execution's input (its decoding services are part of `R`). */
  readonly inputSchema: Schema.Decoder<In, R> | undefined
  /** Encodes the handler's value (its encoding services are part of `R`). */
  readonly outputSchema: Schema.Codec<A, unknown, unknown, R> | undefined
  readonly handler: (input: In) => Effect.Effect<A, E, R | Execution>
}

/**
 * Define an agent. Without an `input` schema the handler gets the raw JSON
 * input; with one, an input that does not decode fails the execution with
 * `input_invalid: <issues joined by "; ">` before the handler runs. With an
 * `output` schema the handler's value is encoded before it is posted.
 *
 * @example
 * ```ts
 * const researcher = Agent.make({
 *   id: "researcher",
 *   input: Schema.Struct({ prompt: Schema.String }),
 *   handler: ({ prompt }) => search({ query: prompt })
 * })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = <In = unknown, A = void, E = never, R = never, RI = never, RO = never>(
  options: {
    readonly id: string
    readonly input?: Schema.Decoder<In, RI> | undefined
    readonly output?: Schema.Codec<A, unknown, unknown, RO> | undefined
    readonly handler: (input: In) => Effect.Effect<A, E, R>
  }
): Agent<In, A, E, Exclude<R, Execution> | RI | RO> => ({
  id: options.id,
  inputSchema: options.input,
  outputSchema: options.output,
  handler: options.handler as (input: In) => Effect.Effect<A, E, Exclude<R, Execution> | RI | RO | Execution>
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
   * An accepted run continues in the background.
   */
  readonly handleWebhook: (request: WebhookRequest) => Effect.Effect<number>
  /** The number of runs in progress. */
  readonly activeRuns: Effect.Effect<number>
  /** Wait until no run is in progress. */
  readonly awaitIdle: Effect.Effect<void>
}

/**
 * The heartbeat interval of PROTOCOL.md 5.8, in milliseconds:
 * `min(lease × 1000 / 3, 30 000)`, at least 1 000, and 30 000 when the lease
 * timeout is unknown.
 *
 * @since 0.1.0
 * @category runtime
 */
export const heartbeatIntervalMillis = (leaseTimeoutSeconds: number | undefined): number =>
  leaseTimeoutSeconds === undefined || !(leaseTimeoutSeconds > 0) ?
    30_000 :
    Math.max(1_000, Math.min((leaseTimeoutSeconds * 1_000) / 3, 30_000))

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
    const active = new Map<string, ActiveRun>()

    const handleWebhook = (request: WebhookRequest): Effect.Effect<number> =>
      Effect.gen(function*() {
        const verified = yield* Signature.verify(kernel.secret, request.body, request.signature)
        if (!verified) return 401
        const text = decodeBody(request.body)
        const notice = text === undefined ? undefined : Protocol.decodeWebhookNotice(text)
        if (notice === undefined) return 400
        const caller: Caller = {
          agentId: agent.id,
          lease: { dispatchId: notice.dispatchId, attempt: notice.dispatchAttempt }
        }
        const state = yield* makeRunState(kernel, caller, notice.executionId)
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
        if (previous === "duplicate") {
          yield* Effect.logDebug("duplicate webhook ignored")
          return 200
        }
        if (previous !== undefined) {
          yield* Effect.logDebug("superseding the active run")
          yield* previous.state.raise(new LeaseSuperseded())
        }
        const forget = Effect.sync(() => {
          if (active.get(notice.executionId)?.state === state) active.delete(notice.executionId)
        })
        const runAttributes = Tracing.runAttributes(notice)
        const fiber = yield* FiberMap.run(
          runs,
          notice.executionId,
          // FiberMap.run starts the fiber on the spot: yield first, so that the webhook is
          // answered (and acknowledged) before the run makes its first call.
          Effect.andThen(Effect.yieldNow, runOnce(agent, state, notice)).pipe(
            // Each run owns its scope: its heartbeat stops when the run ends or is interrupted.
            Effect.scoped,
            Effect.ensuring(Effect.andThen(state.close, forget)),
            Effect.catchCause((cause) =>
              interruptedOnly(cause) ? Effect.void : Effect.logError("run failed unexpectedly", cause)
            ),
            Effect.annotateLogs(runAttributes),
            Effect.annotateSpans(runAttributes),
            Effect.provideContext(context)
          )
        )
        // A signal that stops the run (lease lost, abandoned, superseded) interrupts this fiber.
        state.attach(fiber)
        return 200
      }).pipe(Tracing.withSpan("Agent.handleWebhook", { attributes: { "rebuno.agent_id": agent.id } }))

    return {
      agentId: agent.id,
      handleWebhook,
      activeRuns: FiberMap.size(runs),
      awaitIdle: FiberMap.awaitEmpty(runs)
    }
  })

/** The heartbeat fiber of a run (5.8). Only `lease_superseded` stops the run. */
const heartbeat = (state: RunState, intervalMillis: number): Effect.Effect<never> =>
  Effect.sleep(intervalMillis).pipe(
    Effect.andThen(
      state.client.heartbeat(state.caller, state.executionId).pipe(
        Effect.catch((error) =>
          error._tag === "LeaseSuperseded" ?
            Effect.flatMap(Ref.get(state.finishing), (finishing) => finishing ? Effect.void : state.raise(error)) :
            Effect.logDebug("heartbeat failed", error)
        )
      )
    ),
    Effect.forever
  )

/** One run (14.3 steps 2–6). */
const runOnce = <In, A, E, R>(
  agent: Agent<In, A, E, R>,
  state: RunState,
  notice: Protocol.WebhookNotice
): Effect.Effect<void, never, R> =>
  Effect.gen(function*() {
    yield* Effect.forkScoped(heartbeat(state, heartbeatIntervalMillis(notice.leaseTimeoutSeconds)))
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
    const exit = yield* Effect.exit(Effect.provideService(agent.handler(input), Execution, service))
    yield* report(agent, state, exit)
  }).pipe(Effect.scoped)

/** An outcome post: `lease_superseded` means done; other failures are logged. */
const post = (call: Effect.Effect<void, KernelError | LeaseSuperseded>): Effect.Effect<void> =>
  Effect.catch(call, (error) =>
    error._tag === "LeaseSuperseded" ? Effect.void : Effect.logWarning("cannot post the outcome", error))

/** Interrupted, and nothing else (an empty cause counts: nothing failed). */
const interruptedOnly = (cause: Cause.Cause<unknown>): boolean => cause.reasons.every(Cause.isInterruptReason)

/** 14.5: map the handler's outcome to a kernel call, applying the suspension backstop. */
const report = <In, A, E, R>(
  agent: Agent<In, A, E, R>,
  state: RunState,
  exit: Exit.Exit<A, E>
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
    const encoded = yield* encodeOutput(agent, exit.value)
    yield* post(
      encoded._tag === "Ok" ?
        state.client.completeExecution(state.caller, state.executionId, encoded.json) :
        state.client.failExecution(state.caller, state.executionId, encoded.reason)
    )
  })

const encodeOutput = <In, A, E, R>(
  agent: Agent<In, A, E, R>,
  value: A
): Effect.Effect<{ readonly _tag: "Ok"; readonly json: string | undefined } | { readonly _tag: "Fail"; readonly reason: string }, never, R> =>
  (agent.outputSchema === undefined ? Effect.succeed<unknown>(value) : Schema.encodeEffect(agent.outputSchema)(value)).pipe(
    Effect.map((output) => {
      if (output === undefined) return { _tag: "Ok", json: undefined } as const
      const checked = stringifyStrict(output)
      return checked._tag === "Ok" ?
        { _tag: "Ok", json: checked.json } as const :
        { _tag: "Fail", reason: `agent_error: TypeError: output is not JSON at ${checked.path}: ${checked.reason}` } as const
    }),
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
 * const WebhookRoute = Layer.unwrap(
 *   Effect.map(Agent.toHttpApp(researcher), (app) => HttpRouter.add("POST", "/webhook", app))
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
 * 200 bytes). A larger body is answered `413` with an empty body and is never
 * buffered whole, so an unauthenticated client cannot make the agent hold
 * arbitrary amounts of memory before the signature check.
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
 * The `413` of a declared oversized body, which is left unread: bodiless and
 * framed by `Content-Length: 0` like every answer, but carried as an empty
 * stream. On Node, `@effect/platform-node` 4 adds `connection: close` to a
 * bodiless answer that leaves more than 256 KiB of the request body unread; a
 * streamed one keeps the headers every webhook answer has
 * (`Connection: keep-alive`). The body has no content type, so none is sent.
 */
const tooLargeUnread = (): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.setBody(
    bodiless(413),
    new HttpBody.Stream(Stream.empty, undefined as unknown as string, 0)
  )

const httpAppFor = (rt: AgentRuntime): HttpApp =>
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    if (declaredTooLarge(request.headers["content-length"])) return tooLargeUnread()
    const body = yield* readCapped(request.stream)
    if (body === "tooLarge") return bodiless(413)
    if (body === "unreadable") return bodiless(401)
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
      const app = yield* toHttpApp(agent)
      const routed = Effect.gen(function*() {
        const request = yield* HttpServerRequest.HttpServerRequest
        const queryAt = request.url.indexOf("?")
        const pathname = queryAt === -1 ? request.url : request.url.slice(0, queryAt)
        if (request.method !== "POST" || pathname !== path) return bodiless(404)
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
 * Agent.serve(researcher, { port: 5000 }).pipe(
 *   Layer.provide(KernelClient.layerUndiciConfig()), Layer.launch, NodeRuntime.runMain)
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
  const managed = ManagedRuntime.make(Layer.provide(Layer.effect(RuntimeTag, runtime(agent)), layer))
  const handler = (request: Request): Promise<Response> => {
    if (declaredTooLarge(request.headers.get("content-length"))) {
      return request.body === null
        ? Promise.resolve(new Response(null, { status: 413 }))
        : request.body.cancel().then(() => new Response(null, { status: 413 }), () => new Response(null, { status: 413 }))
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
        ? new Response(null, { status: 413 })
        : body === "unreadable"
        ? new Response(null, { status: 401 })
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
