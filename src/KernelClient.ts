/**
 * The agent's signed channel to a Rebuno kernel (PROTOCOL.md 6, 14.1, 15.1).
 *
 * Every call serialises its body once, signs those exact bytes with the agent
 * secret (`Rebuno-Signature: sha256=…`, or the optional `v1=` scheme of 17.B)
 * and sends them with `Rebuno-Agent-Id`; lease routes and the delta stream also
 * carry the run's lease (`Rebuno-Dispatch-Id`, plus `Rebuno-Dispatch-Attempt`
 * when the attempt is known). Redirects are never followed (any status ≥ 300 is
 * an error), every request has a timeout (35 s by default), and retries happen
 * only where section 15 says they are safe — never on a step submission.
 *
 * Two transports send the same bytes. On Node.js the recommended one drives
 * undici's dispatcher directly and needs nothing else:
 *
 * ```ts
 * KernelClient.layerUndiciConfig()   // REBUNO_URL, REBUNO_AGENT_SECRET
 * ```
 *
 * The other runs on any `effect/http` `HttpClient` (other runtimes, or
 * `transformClient` for proxies and logging):
 *
 * ```ts
 * KernelClient.layerConfig().pipe(Layer.provide(NodeHttpClient.layerUndici))
 * ```
 *
 * The `Config` layers read `REBUNO_URL` and `REBUNO_AGENT_SECRET` (options win
 * over the environment) and fail fast when either is missing or empty. With
 * `FetchHttpClient`, provide `FetchHttpClient.RequestInit` with
 * `{ redirect: "manual" }` so that fetch does not follow redirects itself.
 * The test kit provides an in-process implementation of the same service.
 *
 * @since 0.1.0
 */
import { NodeHttpClient } from "@effect/platform-node"
import { Clock, Config, ConfigProvider, Context, Duration, Effect, Layer, Redacted, Result, Schema } from "effect"
import { Headers, HttpClient } from "effect/http"
import * as Http from "./internal/http/exchange.js"
import * as Tracing from "./internal/http/tracing.js"
import * as Transport from "./internal/http/transport.js"
import * as Protocol from "./Protocol.js"
import { KernelError, LeaseSuperseded, PolicyError, Terminated } from "./RebunoError.js"
import * as Signature from "./Signature.js"

/**
 * A run's lease: the dispatch it was delivered for and the delivery attempt
 * (`undefined` when a v0.14.0 kernel did not send one — never invent it).
 *
 * @since 0.1.0
 * @category models
 */
export interface Lease {
  readonly dispatchId: string
  readonly attempt: number | undefined
}

/**
 * Who is calling: the agent id and, for lease routes, the run's lease.
 *
 * @since 0.1.0
 * @category models
 */
export interface Caller {
  readonly agentId: string
  readonly lease: Lease
}

/**
 * A step submission. `argsJson` is JSON text already checked to be JSON; it is
 * sent verbatim as the `args` member.
 *
 * @since 0.1.0
 * @category models
 */
export interface StepSubmission {
  readonly kind: string
  readonly target: string
  readonly argsJson: string
  readonly idempotency: "safe_to_retry" | "at_most_once"
}

/**
 * @since 0.1.0
 * @category models
 */
export declare namespace KernelClient {
  /**
   * The agent → kernel calls. Errors follow PROTOCOL.md 13.3: `409
   * execution_terminal` is `Terminated`, `409 lease_superseded` is
   * `LeaseSuperseded`, `policy_denied` is `PolicyError` (on submit), and
   * everything else is a `KernelError` whose `reason` is a `TransportError`
   * (connection failures and timeouts), a `StatusError` (with the HTTP status
   * and the kernel's code) or a `DecodeError` (an unreadable answer). Where a
   * method's error type does not list a signal, that code arrives as a
   * `StatusError`. Decisions are returned as they are (a `200
   * {"decision":"execution_terminal"}` is a decision, not an error);
   * interpreting them is the caller's job.
   *
   * @since 0.1.0
   * @category models
   */
  export interface Service {
    /** The agent secret: signs requests and verifies webhooks. */
    readonly secret: Redacted.Redacted<string>
    /** `GET /v0/executions/{id}` (retried on transport failures). */
    readonly getExecution: (
      caller: { readonly agentId: string },
      executionId: string
    ) => Effect.Effect<Protocol.Execution, KernelError>
    /** `POST /v0/executions/{id}/steps` — never retried. */
    readonly submitStep: (
      caller: Caller,
      executionId: string,
      submission: StepSubmission
    ) => Effect.Effect<Protocol.StepDecision, KernelError | LeaseSuperseded | Terminated | PolicyError>
    /** `POST …/steps/{step_id}/complete` with `{"result":<resultJson>}` (retried). */
    readonly completeStep: (
      caller: Caller,
      executionId: string,
      stepId: string,
      resultJson: string
    ) => Effect.Effect<Protocol.StepDecision, KernelError | LeaseSuperseded | Terminated>
    /** `POST …/steps/{step_id}/fail` with `{"error":{"message":<message>}}` (retried). */
    readonly failStep: (
      caller: Caller,
      executionId: string,
      stepId: string,
      message: string
    ) => Effect.Effect<Protocol.StepDecision, KernelError | LeaseSuperseded | Terminated>
    /**
     * `POST …/steps/{step_id}/fail` with `{"error":<errorJson>}` (retried). `errorJson`
     * is the JSON text of an object with a `message` (typed failures add members).
     */
    readonly failStepJson: (
      caller: Caller,
      executionId: string,
      stepId: string,
      errorJson: string
    ) => Effect.Effect<Protocol.StepDecision, KernelError | LeaseSuperseded | Terminated>
    /** `POST …/steps/{step_id}/stream` — best effort, never fails, never retried. */
    readonly publishDelta: (
      caller: Caller,
      executionId: string,
      stepId: string,
      seq: number,
      data: string
    ) => Effect.Effect<void>
    /** `POST /v0/executions/{id}/heartbeat` (empty signed body, not retried). */
    readonly heartbeat: (caller: Caller, executionId: string) => Effect.Effect<void, KernelError | LeaseSuperseded>
    /** `POST /v0/executions/{id}/complete` (retried); `409 execution_terminal` counts as done. */
    readonly completeExecution: (
      caller: Caller,
      executionId: string,
      outputJson: string | undefined
    ) => Effect.Effect<void, KernelError | LeaseSuperseded>
    /** `POST /v0/executions/{id}/fail` with `{"error":<reason>}` (retried); `409 execution_terminal` counts as done. */
    readonly failExecution: (
      caller: Caller,
      executionId: string,
      reason: string
    ) => Effect.Effect<void, KernelError | LeaseSuperseded>
  }
}

/**
 * The agent → kernel client service.
 *
 * @since 0.1.0
 * @category services
 */
export class KernelClient extends Context.Service<KernelClient, KernelClient.Service>()("effect-rebuno/KernelClient") {}

/**
 * Options of the HTTP kernel client.
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** Kernel base URL; trailing `/` characters are stripped; may contain a path prefix. */
  readonly baseUrl: string
  /** The agent secret (required, non-empty). */
  readonly secret: Redacted.Redacted<string> | string
  /** Per-request timeout (default 35 seconds). */
  readonly timeout?: Duration.Input | undefined
  /** Request signature scheme: `sha256` (default, PROTOCOL.md 3.2) or `v1` (17.B). */
  readonly signing?: "sha256" | "v1" | undefined
  /**
   * Customise the HTTP client (tracing, proxies, logging). Requests reach it
   * already signed: a transform must not change the method, URL or body.
   */
  readonly transformClient?: ((client: HttpClient.HttpClient) => HttpClient.HttpClient) | undefined
}

/**
 * The default per-request timeout (PROTOCOL.md 14.1).
 *
 * @since 0.1.0
 * @category constants
 */
export const defaultTimeout: Duration.Duration = Duration.seconds(35)

/**
 * Is this error a transport failure in the sense of PROTOCOL.md 15 (connection
 * error, timeout, unreadable answer or a `5xx` status)? After a transport
 * failure of a step submission the outcome is unknown and the run must be
 * abandoned, not retried.
 *
 * @since 0.1.0
 * @category predicates
 */
export const isTransportFailure: (error: unknown) => boolean = Http.isTransportFailure

// ---------------------------------------------------------------------------
// Implementation
// ---------------------------------------------------------------------------

const encoder = new TextEncoder()
const EMPTY = new Uint8Array(0)

const H_CONTENT_TYPE = "content-type"
const H_AGENT_ID = "rebuno-agent-id"
const H_SIGNATURE = "rebuno-signature"
const H_DISPATCH_ID = "rebuno-dispatch-id"
const H_DISPATCH_ATTEMPT = "rebuno-dispatch-attempt"
const H_TIMESTAMP = "rebuno-timestamp"
const JSON_TYPE = "application/json"

/** An error answer on a route that declares no signals. */
const plainFailure = (failure: Http.ApiFailure): KernelError => Http.statusError(failure)

/** An error answer on a lease route without step outcome (heartbeat, complete / fail execution). */
const leaseFailure = (failure: Http.ApiFailure): KernelError | LeaseSuperseded =>
  failure.code === "lease_superseded" ? new LeaseSuperseded() : Http.statusError(failure)

/** An error answer on complete / fail step. */
const stepFailure = (failure: Http.ApiFailure): KernelError | LeaseSuperseded | Terminated =>
  failure.code === "execution_terminal"
    ? new Terminated()
    : failure.code === "lease_superseded"
    ? new LeaseSuperseded()
    : Http.statusError(failure)

/** An error answer on submit. */
const submitFailure = (failure: Http.ApiFailure): KernelError | LeaseSuperseded | Terminated | PolicyError =>
  failure.code === "policy_denied"
    ? new PolicyError({
      reason: failure.message === "" ? "denied by policy" : failure.message,
      ...(failure.ruleId === undefined ? {} : { ruleId: failure.ruleId })
    })
    : stepFailure(failure)

const decodeDecision = (reply: Http.Reply): Effect.Effect<Protocol.StepDecision, KernelError> => {
  const parsed = Http.parseJson(reply.text)
  if (Result.isFailure(parsed)) {
    return Effect.fail(Http.decodeError(reply.status, `step decision is not JSON: ${parsed.failure}`))
  }
  const decision = Protocol.decodeStepDecision(parsed.success)
  return decision === undefined
    ? Effect.fail(Http.decodeError(reply.status, "step decision has no decision member"))
    : Effect.succeed(decision)
}

const decodeExecution = Http.jsonDecoder(Protocol.Execution)

const invalid = (path: string, message: string): Effect.Effect<never, Config.ConfigError> =>
  Effect.fail(new Config.ConfigError(new ConfigProvider.SourceError({ message: `${path} ${message}` })))

/** Options with the values every transport needs, checked. */
interface Resolved {
  readonly base: Http.BaseUrl
  readonly secret: Redacted.Redacted<string>
  readonly timeout: Duration.Duration
  readonly v1: boolean
}

const resolve = (options: Options | UndiciOptions): Effect.Effect<Resolved, Config.ConfigError> => {
  const base = Http.normalizeBaseUrl(options.baseUrl)
  if (Result.isFailure(base)) return invalid("baseUrl", base.failure)
  const secret = Redacted.isRedacted(options.secret) ? options.secret : Redacted.make(options.secret)
  if (Redacted.value(secret) === "") return invalid("secret", "must not be empty")
  return Effect.succeed({
    base: base.success,
    secret,
    timeout: options.timeout === undefined ? defaultTimeout : Duration.fromInputUnsafe(options.timeout),
    v1: options.signing === "v1"
  })
}

/**
 * Build the HTTP kernel client from options, on an `HttpClient`. Fails with a
 * `ConfigError` when the base URL or the secret is missing or unusable.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: (
  options: Options
) => Effect.Effect<KernelClient.Service, Config.ConfigError, HttpClient.HttpClient> = Effect.fnUntraced(
  function*(options: Options) {
    const resolved = yield* resolve(options)
    const httpClient = yield* HttpClient.HttpClient
    const transformed = options.transformClient === undefined ? httpClient : options.transformClient(httpClient)
    // The sha256= scheme signs only the body, so the signature of the empty body
    // authorises every GET and heartbeat of this agent: keep it out of the
    // request-header attributes of the HTTP client's spans (and of logged requests).
    const client = HttpClient.transform(transformed, (effect) =>
      Effect.withFiber((fiber) =>
        Effect.provideService(effect, Headers.CurrentRedactedNames, [
          ...fiber.getRef(Headers.CurrentRedactedNames),
          H_SIGNATURE
        ])
      ))
    return makeService(resolved, Transport.fromHttpClient(client, resolved.base, resolved.timeout))
  }
)

/**
 * Options of the undici kernel client: those of {@link Options} without
 * `transformClient` (there is no `HttpClient` to transform).
 *
 * @since 0.1.0
 * @category models
 */
export type UndiciOptions = Omit<Options, "transformClient">

/**
 * Build the kernel client directly on an undici `Dispatcher` (Node.js): the
 * same requests, signatures, timeouts, retries and errors as {@link make}, but
 * each call goes through the dispatcher's handler interface with no
 * `HttpClient` request and response objects, streams or promises in between —
 * about half the client-side CPU of a round trip. Every call is still traced
 * as a `KernelClient.*` span; there is no nested `http.client` span.
 *
 * @since 0.1.0
 * @category constructors
 */
export const makeUndici: (
  options: UndiciOptions
) => Effect.Effect<KernelClient.Service, Config.ConfigError, NodeHttpClient.Dispatcher> = Effect.fnUntraced(
  function*(options: UndiciOptions) {
    const resolved = yield* resolve(options)
    const dispatcher = yield* NodeHttpClient.Dispatcher
    return makeService(resolved, Transport.fromDispatcher(dispatcher, resolved.base, resolved.timeout))
  }
)

const makeService = (resolved: Resolved, transport: Transport.Send): KernelClient.Service => {
  const { base, secret, v1 } = resolved
  const basePath = base.pathname

  /** Sign and build one request; runs again for each retry (a fresh `v1` timestamp). */
  const build = (
    method: "GET" | "POST",
    path: string,
    agentId: string,
    lease: Lease | undefined,
    body: Uint8Array | undefined
  ): Effect.Effect<Transport.WireRequest> => {
    const dispatchId = lease === undefined ? "" : lease.dispatchId
    const attempt = lease === undefined || lease.attempt === undefined ? "" : String(lease.attempt)
    const finish = (signature: string, timestamp: string | undefined): Transport.WireRequest => {
      const headers: Record<string, string> = {
        [H_CONTENT_TYPE]: JSON_TYPE,
        [H_AGENT_ID]: agentId,
        [H_SIGNATURE]: signature
      }
      if (timestamp !== undefined) headers[H_TIMESTAMP] = timestamp
      if (lease !== undefined) {
        headers[H_DISPATCH_ID] = dispatchId
        if (attempt !== "") headers[H_DISPATCH_ATTEMPT] = attempt
      }
      return { method, path, headers, body }
    }
    if (!v1) return Effect.map(Signature.sign(secret, body ?? EMPTY), (signature) => finish(signature, undefined))
    return Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const timestamp = String(Math.floor(now / 1000))
      return Effect.map(
        Signature.signV1(secret, {
          method,
          target: basePath + path,
          timestamp,
          dispatchId,
          dispatchAttempt: attempt,
          body: body ?? EMPTY
        }),
        (signature) => finish(signature, timestamp)
      )
    })
  }

  /** One exchange: build, send within the timeout, and split success (< 300) from error answers. */
  const exchange = <A, E>(
    method: "GET" | "POST",
    path: string,
    agentId: string,
    lease: Lease | undefined,
    body: Uint8Array | undefined,
    onSuccess: (reply: Http.Reply) => Effect.Effect<A, KernelError>,
    onFailure: (failure: Http.ApiFailure) => Effect.Effect<A, E>
  ): Effect.Effect<A, KernelError | E> =>
    build(method, path, agentId, lease, body).pipe(
      Effect.flatMap(transport),
      Effect.flatMap((reply): Effect.Effect<A, KernelError | E> =>
        reply.status < 300 ? onSuccess(reply) : onFailure(Http.apiFailure(reply))
      )
    )

  const span = (name: string, executionId: string, stepId?: string) =>
    Tracing.withSpan(`KernelClient.${name}`, {
      kind: "client",
      attributes: stepId === undefined
        ? { "rebuno.execution_id": executionId }
        : { "rebuno.execution_id": executionId, "rebuno.step_id": stepId }
    })

  const fail = <E>(f: (failure: Http.ApiFailure) => E) => (failure: Http.ApiFailure) => Effect.fail(f(failure))
  const unit = () => Effect.void
  /** Complete / fail execution: a `409 execution_terminal` means an earlier try (or a cancel) got there first. */
  const outcomeFailure = (failure: Http.ApiFailure): Effect.Effect<void, KernelError | LeaseSuperseded> =>
    failure.code === "execution_terminal" ? Effect.void : Effect.fail(leaseFailure(failure))

  // Ids are UUIDs and hex digests, which encoding leaves alone; anything else is
  // percent-encoded so that every transport sends the same path.
  const executionPath = (executionId: string) => "/v0/executions/" + encodeURIComponent(executionId)
  const stepPath = (executionId: string, stepId: string) =>
    executionPath(executionId) + "/steps/" + encodeURIComponent(stepId)

  /** Complete or fail a step: both are idempotent on the kernel, so both retry transport failures. */
  const postStepOutcome = (
    outcome: "complete" | "fail",
    caller: Caller,
    executionId: string,
    stepId: string,
    body: () => string
  ) =>
    Effect.suspend(() =>
      exchange(
        "POST",
        stepPath(executionId, stepId) + "/" + outcome,
        caller.agentId,
        caller.lease,
        encoder.encode(body()),
        decodeDecision,
        fail(stepFailure)
      ).pipe(Http.retryTransport)
    ).pipe(span(outcome === "complete" ? "completeStep" : "failStep", executionId, stepId))

  const failStepJson: KernelClient.Service["failStepJson"] = (caller, executionId, stepId, errorJson) =>
    postStepOutcome("fail", caller, executionId, stepId, () => "{\"error\":" + errorJson + "}")

  return KernelClient.of({
    secret,
    getExecution: (caller, executionId) =>
      exchange(
        "GET",
        executionPath(executionId),
        caller.agentId,
        undefined,
        undefined,
        decodeExecution,
        fail(plainFailure)
      ).pipe(Http.retryTransport, span("getExecution", executionId)),
    submitStep: (caller, executionId, submission) =>
      Effect.suspend(() => {
        const body = encoder.encode(
          "{\"kind\":" + JSON.stringify(submission.kind) +
            ",\"target\":" + JSON.stringify(submission.target) +
            ",\"args\":" + submission.argsJson +
            ",\"idempotency\":" + JSON.stringify(submission.idempotency) + "}"
        )
        return exchange(
          "POST",
          executionPath(executionId) + "/steps",
          caller.agentId,
          caller.lease,
          body,
          decodeDecision,
          fail(submitFailure)
        )
      }).pipe(span("submitStep", executionId)),
    completeStep: (caller, executionId, stepId, resultJson) =>
      postStepOutcome("complete", caller, executionId, stepId, () => "{\"result\":" + resultJson + "}"),
    failStep: (caller, executionId, stepId, message) =>
      failStepJson(caller, executionId, stepId, "{\"message\":" + JSON.stringify(message) + "}"),
    failStepJson,
    publishDelta: (caller, executionId, stepId, seq, data) =>
      Effect.suspend(() =>
        exchange(
          "POST",
          stepPath(executionId, stepId) + "/stream",
          caller.agentId,
          caller.lease,
          encoder.encode("{\"seq\":" + seq + ",\"data\":" + JSON.stringify(data) + "}"),
          unit,
          fail(plainFailure)
        )
      ).pipe(Effect.ignore, span("publishDelta", executionId, stepId)),
    heartbeat: (caller, executionId) =>
      exchange(
        "POST",
        executionPath(executionId) + "/heartbeat",
        caller.agentId,
        caller.lease,
        EMPTY,
        unit,
        fail(leaseFailure)
      ).pipe(span("heartbeat", executionId)),
    completeExecution: (caller, executionId, outputJson) =>
      Effect.suspend(() =>
        exchange(
          "POST",
          executionPath(executionId) + "/complete",
          caller.agentId,
          caller.lease,
          encoder.encode(outputJson === undefined ? "{}" : "{\"output\":" + outputJson + "}"),
          unit,
          outcomeFailure
        ).pipe(Http.retryTransport)
      ).pipe(span("completeExecution", executionId)),
    failExecution: (caller, executionId, reason) =>
      Effect.suspend(() =>
        exchange(
          "POST",
          executionPath(executionId) + "/fail",
          caller.agentId,
          caller.lease,
          encoder.encode("{\"error\":" + JSON.stringify(reason) + "}"),
          unit,
          outcomeFailure
        ).pipe(Http.retryTransport)
      ).pipe(span("failExecution", executionId))
  })
}

/**
 * The HTTP kernel client as a Layer.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options): Layer.Layer<KernelClient, Config.ConfigError, HttpClient.HttpClient> =>
  Layer.effect(KernelClient, make(options))

/**
 * The HTTP kernel client configured from the environment: `REBUNO_URL` and
 * `REBUNO_AGENT_SECRET` (read with `Config`, the secret straight into a
 * `Redacted`). Options given here win over the environment. Fails with a
 * `ConfigError` when a required value is missing or empty.
 *
 * @example
 * ```ts
 * KernelClient.layerConfig().pipe(Layer.provide(NodeHttpClient.layerUndici))
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layerConfig = (
  options?: Partial<Options>
): Layer.Layer<KernelClient, Config.ConfigError, HttpClient.HttpClient> =>
  Layer.effect(
    KernelClient,
    Effect.flatMap(readConfig(options), (resolved) => make({ ...options, ...resolved }))
  )

/** The base URL and secret: from the options when given, else `REBUNO_URL` and `REBUNO_AGENT_SECRET`. */
const readConfig = (
  options: Partial<UndiciOptions> | undefined
): Effect.Effect<
  { readonly baseUrl: string; readonly secret: Redacted.Redacted<string> | string },
  Config.ConfigError
> =>
  Effect.gen(function*() {
    const baseUrl = options?.baseUrl ?? (yield* Config.NonEmptyString("REBUNO_URL"))
    const secret = options?.secret ?? (yield* secretConfig)
    return { baseUrl, secret }
  })

/**
 * `REBUNO_AGENT_SECRET`, non-empty, straight into a `Redacted` (the plain
 * string never leaves `Config`). `Config.schema` reads the configured string
 * into the `Redacted` codec; a test checks the service signs with that string.
 */
const secretConfig: Config.Config<Redacted.Redacted<string>> = Config.schema(
  Schema.Redacted(Schema.NonEmptyString),
  "REBUNO_AGENT_SECRET"
)

/**
 * The kernel client on undici directly (see {@link makeUndici}), with its own
 * keep-alive undici `Agent` that is closed when the layer's scope ends. The
 * recommended production client on Node.js: it needs no `HttpClient`.
 *
 * @example
 * ```ts
 * Agent.serve(researcher, { port: 5000 }).pipe(
 *   Layer.provide(KernelClient.layerUndici({ baseUrl: "http://localhost:8080", secret })),
 *   Layer.launch,
 *   NodeRuntime.runMain
 * )
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layerUndici = (options: UndiciOptions): Layer.Layer<KernelClient, Config.ConfigError> =>
  Layer.effect(KernelClient, makeUndici(options)).pipe(Layer.provide(NodeHttpClient.layerDispatcher))

/**
 * {@link layerUndici} configured like {@link layerConfig}: `REBUNO_URL` and
 * `REBUNO_AGENT_SECRET`, options winning over the environment.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerUndiciConfig = (
  options?: Partial<UndiciOptions>
): Layer.Layer<KernelClient, Config.ConfigError> =>
  Layer.effect(
    KernelClient,
    Effect.flatMap(readConfig(options), (resolved) => makeUndici({ ...options, ...resolved }))
  ).pipe(Layer.provide(NodeHttpClient.layerDispatcher))
