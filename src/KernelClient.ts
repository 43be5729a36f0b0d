/**
 * The agent's signed channel to a Rebuno kernel (PROTOCOL.md 6, 14.1, 15.1;
 * PROTOCOL-CURRENT C.2–C.6).
 *
 * Every call serialises its body once, signs those exact bytes with the agent
 * secret and sends them with `Rebuno-Agent-Id`; lease routes and the delta
 * stream also carry the run's lease (`Rebuno-Dispatch-Id`, plus
 * `Rebuno-Dispatch-Attempt` when the attempt is known). Redirects are never
 * followed (any status ≥ 300 is an error), every request has a timeout (35 s
 * by default), and retries happen only where section 15 says they are safe —
 * never on a step submission.
 *
 * **Stages and signatures.** A current-stage kernel accepts only `v1=`
 * request signatures (PROTOCOL.md 17.B, PROTOCOL-CURRENT C.2.1); the seed
 * stage and the reference kernel v0.14.0 verify the body-only `sha256=`
 * signature. The `stage` option (`REBUNO_STAGE` for the `Config` layers)
 * picks the scheme: `"current"` signs `v1=`, `"seed"` and `"v0.14.0"` sign
 * `sha256=`, and the default `"auto"` signs `v1=` and falls back to
 * `sha256=` for the life of the client when it meets an older kernel
 * (C.13): a webhook without `dispatch_attempt`, or a `401` to the run's
 * first read (`GET /v0/executions/{id}`, which is safe to repeat) that the
 * other scheme gets through. The older `signing` option pins a scheme and
 * wins over `stage`.
 *
 * Three transports send the same bytes. On Node.js the recommended one runs
 * on Node's own sockets with a minimal HTTP/1.1 client and needs nothing else:
 *
 * ```ts
 * KernelClient.layerSocketConfig()   // REBUNO_URL, REBUNO_AGENT_SECRET
 * ```
 *
 * `layerUndiciConfig()` drives undici's dispatcher directly instead. The third
 * runs on any `effect/http` `HttpClient` (other runtimes, or
 * `transformClient` for proxies and logging):
 *
 * ```ts
 * KernelClient.layerConfig().pipe(Layer.provide(NodeHttpClient.layerUndici))
 * ```
 *
 * The `Config` layers read `REBUNO_URL`, `REBUNO_AGENT_SECRET` and the
 * optional `REBUNO_STAGE` (options win over the environment) and fail fast
 * when a required value is missing or empty, or the stage is unknown. With
 * `FetchHttpClient`, provide `FetchHttpClient.RequestInit` with
 * `{ redirect: "manual" }` so that fetch does not follow redirects itself.
 * The test kit provides an in-process implementation of the same service.
 *
 * @since 0.1.0
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { Clock, Config, ConfigProvider, Context, Duration, Effect, Layer, Redacted, References, Result, Schema, Tracer } from "effect"
import type { Fiber, Scope } from "effect"
import { Headers, HttpClient } from "effect/http"
import * as Http from "./internal/http/exchange.js"
import * as SocketTransport from "./internal/http/socket.js"
import * as Tracing from "./internal/http/tracing.js"
import * as Transport from "./internal/http/transport.js"
import * as Path from "./internal/wire/path.js"
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
  /**
   * The keys of the registered resources the step's body may change
   * (PROTOCOL-CURRENT C.6.4), sent as `"resources":[…]` after
   * `idempotency` when non-empty; absent or empty sends no member (the bytes
   * of a step without declarations are those of the seed stage).
   *
   * @since 0.2.0
   */
  readonly resources?: ReadonlyArray<string> | undefined
}

/**
 * A resource registration (PROTOCOL-CURRENT C.6.2): sent as
 * `{"key","driver_id","configuration","coverage_reuse","every_steps","on_completion"}`.
 * `configurationJson` is JSON text already checked to be JSON (`null` is sent
 * when absent).
 *
 * @since 0.2.0
 * @category models
 */
export interface ResourceRegistration {
  readonly key: string
  readonly driverId: string
  readonly configurationJson?: string | undefined
  readonly coverageReuse: boolean
  /** Capture after every `everySteps` affecting steps; `0` disables checkpointing. */
  readonly everySteps: number
  readonly onCompletion: boolean
}

/**
 * Checkpoints captured by the agent (PROTOCOL-CURRENT C.6.5, C.6.6): sent
 * with a step outcome or on their own, as `"captures":[…]` and
 * `"capture_failures":[…]`, each only when non-empty.
 *
 * @since 0.2.0
 * @category models
 */
export interface CheckpointRecords {
  readonly captures?: ReadonlyArray<Protocol.Capture> | undefined
  readonly captureFailures?: ReadonlyArray<Protocol.CaptureFailure> | undefined
}

/**
 * Which protocol stage the client speaks (PROTOCOL-CURRENT C.13):
 *
 * - `"auto"` (default): sign `v1=`, and fall back to `sha256=` once an older
 *   kernel shows itself (a webhook without `dispatch_attempt`, or a `401` to
 *   the run's first read that a `sha256=` signature gets through);
 * - `"current"`: sign `v1=` only (C.2.1);
 * - `"seed"`, `"v0.14.0"`: sign the body-only `sha256=` (PROTOCOL.md 3.2).
 *
 * @since 0.2.0
 * @category models
 */
export type Stage = "auto" | "current" | "seed" | "v0.14.0"

/**
 * The stages {@link Stage} names, for validation.
 *
 * @since 0.2.0
 * @category constants
 */
export const stages: ReadonlyArray<Stage> = ["auto", "current", "seed", "v0.14.0"]

/**
 * A request signature scheme: `v1=` (PROTOCOL.md 17.B) or the body-only
 * `sha256=` (3.2).
 *
 * @since 0.2.0
 * @category models
 */
export type SigningScheme = "v1" | "sha256"

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
   * The calls marked "retried" retry transport failures three times (100,
   * 200, 400 ms); inside a run, the step and execution outcomes retry for as
   * long as the run's lease can be valid instead (see {@link OutcomeRetry}).
   *
   * @since 0.1.0
   * @category models
   */
  export interface Service {
    /** The agent secret: signs requests and verifies webhooks. */
    readonly secret: Redacted.Redacted<string>
    /**
     * The request signature scheme in use now (it changes once when `"auto"`
     * falls back to `sha256=`, PROTOCOL-CURRENT C.13).
     *
     * Optional, like every call added in 0.2.0, so that kernel clients written
     * for 0.1 still type-check; the HTTP clients and the test kit have them all.
     *
     * @since 0.2.0
     */
    readonly signingScheme?: Effect.Effect<SigningScheme> | undefined
    /**
     * Learn the kernel's stage from a verified webhook (PROTOCOL-CURRENT
     * C.13): under `"auto"`, a webhook without `dispatch_attempt` comes from a
     * v0.14.0 kernel, and the client signs `sha256=` from then on — unless a
     * `v1=`-signed request has already got through (a current kernel always
     * sends the attempt, so such a notice proves nothing). The dispatch
     * runtime calls it for every webhook whose signature verifies.
     *
     * @since 0.2.0
     */
    readonly observeWebhook?: ((notice: Protocol.WebhookNotice) => Effect.Effect<void>) | undefined
    /**
     * `GET /v0/executions/{id}/previous` (PROTOCOL-CURRENT C.4.6): the `state`
     * member of the answer, as JSON — the parent's stored state, else its
     * output, `null` without a parent. Retried on transport failures.
     *
     * @since 0.2.0
     */
    readonly previous?:
      | ((caller: { readonly agentId: string }, executionId: string) => Effect.Effect<unknown, KernelError>)
      | undefined
    /**
     * `GET /v0/executions/{id}/steps/{step_id}`, agent-signed (a dual route,
     * PROTOCOL-CURRENT C.2.1). Retried on transport failures.
     *
     * @since 0.2.0
     */
    readonly getStep?:
      | ((
        caller: { readonly agentId: string },
        executionId: string,
        stepId: string
      ) => Effect.Effect<Protocol.Step, KernelError>)
      | undefined
    /**
     * `POST /v0/executions/{id}/suspend` with the lease and an empty body
     * (PROTOCOL-CURRENT C.5.2): `true` when the execution now waits on its
     * children or approvals (the run must end quietly), `false` when nothing
     * waits any more. `409 lease_superseded` is `LeaseSuperseded`, `409
     * execution_terminal` is `Terminated`. Retried on transport failures (a
     * repeat of a suspend that got through answers `lease_superseded`).
     *
     * @since 0.2.0
     */
    readonly suspend?:
      | ((caller: Caller, executionId: string) => Effect.Effect<boolean, KernelError | LeaseSuperseded | Terminated>)
      | undefined
    /**
     * `PUT /v0/agents/{agent_id}/metadata` (PROTOCOL-CURRENT C.3): the agent's
     * description and the JSON Schemas of its input and output, signed as the
     * agent, without lease headers. One try; any `2xx` is success. Kernels
     * without the route answer `404`.
     *
     * @since 0.2.0
     */
    readonly publishMetadata?:
      | ((agentId: string, metadata: Protocol.AgentMetadataBody) => Effect.Effect<void, KernelError>)
      | undefined
    /**
     * `POST /v0/executions/{id}/resources` with the lease (PROTOCOL-CURRENT
     * C.6.2): register a resource, or read the current object of one already
     * registered. `409 lease_superseded` is `LeaseSuperseded`, `409
     * execution_terminal` is `Terminated`; a registration that differs from
     * the stored one is a `409 conflict` `StatusError`. Retried on transport
     * failures (a repeat answers the object again).
     *
     * @since 0.2.0
     */
    readonly registerResource?:
      | ((
        caller: Caller,
        executionId: string,
        registration: ResourceRegistration
      ) => Effect.Effect<Protocol.Resource, KernelError | LeaseSuperseded | Terminated>)
      | undefined
    /**
     * `POST /v0/executions/{id}/resources/{key}/binding` with the lease and
     * `{"binding":<bindingJson>}` (PROTOCOL-CURRENT C.6.3); `204`. Errors as
     * for {@link registerResource}; retried on transport failures (a repeat
     * of an equal binding answers `204`).
     *
     * @since 0.2.0
     */
    readonly bindResource?:
      | ((
        caller: Caller,
        executionId: string,
        key: string,
        bindingJson: string
      ) => Effect.Effect<void, KernelError | LeaseSuperseded | Terminated>)
      | undefined
    /**
     * `POST /v0/executions/{id}/resources/checkpoints` with the lease and the
     * records (PROTOCOL-CURRENT C.6.6): a baseline or completion checkpoint;
     * `204`. Refused captures are recorded as events, never as errors. Errors
     * as for {@link registerResource}; retried on transport failures.
     *
     * @since 0.2.0
     */
    readonly publishCheckpoints?:
      | ((
        caller: Caller,
        executionId: string,
        records: CheckpointRecords
      ) => Effect.Effect<void, KernelError | LeaseSuperseded | Terminated>)
      | undefined
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
    /**
     * `POST …/steps/{step_id}/complete` with `{"result":<resultJson>}` (retried).
     * `records` (since 0.2.0) adds the captures of the resources due after the
     * body (PROTOCOL-CURRENT C.6.5).
     */
    readonly completeStep: (
      caller: Caller,
      executionId: string,
      stepId: string,
      resultJson: string,
      records?: CheckpointRecords | undefined
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
     * `records` (since 0.2.0) adds the captures of the resources due after the
     * body (PROTOCOL-CURRENT C.6.5).
     */
    readonly failStepJson: (
      caller: Caller,
      executionId: string,
      stepId: string,
      errorJson: string,
      records?: CheckpointRecords | undefined
    ) => Effect.Effect<Protocol.StepDecision, KernelError | LeaseSuperseded | Terminated>
    /** `POST …/steps/{step_id}/stream` — best effort, never fails, never retried. */
    readonly publishDelta: (
      caller: Caller,
      executionId: string,
      stepId: string,
      seq: number,
      data: string
    ) => Effect.Effect<void>
    /**
     * `POST /v0/executions/{id}/heartbeat` (empty signed body, not retried
     * here: the dispatch runtime retries a failed beat while the lease can be
     * valid, see {@link OutcomeRetry}).
     */
    readonly heartbeat: (caller: Caller, executionId: string) => Effect.Effect<void, KernelError | LeaseSuperseded>
    /**
     * `POST /v0/executions/{id}/complete` with `{"output":<outputJson>}` (`{}`
     * without output) and, when `stateJson` is given, `"state":<stateJson>`
     * (PROTOCOL-CURRENT C.4.5; the state of a session execution). Retried;
     * `409 execution_terminal` counts as done.
     */
    readonly completeExecution: (
      caller: Caller,
      executionId: string,
      outputJson: string | undefined,
      stateJson?: string | undefined
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
  /**
   * The protocol stage to speak (default `"auto"`): see {@link Stage}.
   *
   * @since 0.2.0
   */
  readonly stage?: Stage | undefined
  /**
   * Pin the request signature scheme: `sha256` (PROTOCOL.md 3.2) or `v1`
   * (17.B). When given it wins over `stage`, and no fallback happens.
   */
  readonly signing?: SigningScheme | undefined
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

/**
 * How a run rides out a kernel outage: the retry budget of its outcome calls
 * (step complete and fail, execution complete and fail) and of its heartbeat.
 *
 * After a transport failure (connection refused or reset, timeout, `5xx`)
 * such a call is retried with a capped exponential backoff — `baseDelay`,
 * doubling, at most `maxDelay`, each delay drawn from 80 %–120 % of its
 * nominal value — for as long as the run's lease can still be valid: until
 * `lease_timeout_seconds` (from the webhook; 120 s when the kernel sends
 * none) after the lease's last renewal (the delivery, a submit, a
 * heartbeat), and at most `maxElapsed` after the call first failed (one
 * lease timeout when unset). Then the run gives up as before: a step outcome
 * that cannot be recorded abandons the run, the kernel redelivers it once
 * the lease lapses. A `lease_superseded` or `execution_terminal` answer
 * stops the retries at once. A step submit is never retried (PROTOCOL.md
 * 15.1), and reads keep their three short retries (100, 200, 400 ms).
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
 * // Retry every 0.5–2 s, for at most 30 s, whatever the lease allows.
 * Agent.serve(researcher, { port: 5000 }).pipe(
 *   Layer.provide(KernelClient.layerSocketConfig()),
 *   Layer.provide(Layer.succeed(KernelClient.OutcomeRetry, {
 *     baseDelay: "500 millis",
 *     maxDelay: "2 seconds",
 *     maxElapsed: "30 seconds"
 *   })),
 *   Layer.launch,
 *   NodeRuntime.runMain
 * )
 * ```
 *
 * @since 0.2.0
 * @category references
 */
export interface OutcomeRetrySettings {
  /** The first retry's delay (default 100 ms). */
  readonly baseDelay: Duration.Input
  /** The longest delay between two tries (default 5 s). */
  readonly maxDelay: Duration.Input
  /**
   * The longest a call keeps retrying after its first failure; the lease
   * bound applies too. Default (`undefined`): one lease timeout.
   */
  readonly maxElapsed?: Duration.Input | undefined
}

/**
 * The defaults of {@link OutcomeRetry}: 100 ms doubling to at most 5 s, for
 * as long as the lease can be valid.
 *
 * @since 0.2.0
 * @category references
 */
export const defaultOutcomeRetry: OutcomeRetrySettings = { baseDelay: "100 millis", maxDelay: "5 seconds" }

/**
 * The {@link OutcomeRetrySettings} of the runs started in its scope (read
 * when the agent's runtime is built): provide it with `Layer.succeed` next to
 * the `KernelClient` layer, or with `Effect.provideService`.
 *
 * @since 0.2.0
 * @category references
 */
export const OutcomeRetry: Context.Reference<OutcomeRetrySettings> = Context.Reference<OutcomeRetrySettings>(
  "effect-rebuno/KernelClient/OutcomeRetry",
  { defaultValue: () => defaultOutcomeRetry }
)

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
const decodeStep = Http.jsonDecoder(Protocol.Step)
const decodePrevious = Http.jsonDecoder(Protocol.PreviousState)
const decodeSuspend = Http.jsonDecoder(Protocol.SuspendAnswer)
const decodeResource = Http.jsonDecoder(Protocol.Resource)

/** A `401` answer: a signature the kernel did not accept. */
const isUnauthorized = (error: KernelError): boolean => error.status === 401

const invalid = (path: string, message: string): Effect.Effect<never, Config.ConfigError> =>
  Effect.fail(new Config.ConfigError(new ConfigProvider.SourceError({ message: `${path} ${message}` })))

/** Options with the values every transport needs, checked. */
interface Resolved {
  readonly base: Http.BaseUrl
  readonly secret: Redacted.Redacted<string>
  readonly timeout: Duration.Duration
  /** The scheme the client starts with. */
  readonly scheme: SigningScheme
  /** Whether the client may fall back to `sha256=` (stage `"auto"`, no pinned `signing`). */
  readonly detect: boolean
}

/** The scheme a stage starts with. */
const schemeOf = (stage: Stage): SigningScheme => stage === "seed" || stage === "v0.14.0" ? "sha256" : "v1"

const resolve = (options: Options | UndiciOptions): Effect.Effect<Resolved, Config.ConfigError> => {
  const base = Http.normalizeBaseUrl(options.baseUrl)
  if (Result.isFailure(base)) return invalid("baseUrl", base.failure)
  const secret = Redacted.isRedacted(options.secret) ? options.secret : Redacted.make(options.secret)
  if (Redacted.value(secret) === "") return invalid("secret", "must not be empty")
  const stage = options.stage ?? "auto"
  if (!stages.includes(stage)) return invalid("stage", `must be one of ${stages.join(", ")}`)
  const connections = "connections" in options ? options.connections : undefined
  if (connections !== undefined && !(Number.isInteger(connections) && connections >= 1)) {
    return invalid("connections", "must be a whole number of at least 1")
  }
  return Effect.succeed({
    base: base.success,
    secret,
    timeout: options.timeout === undefined ? defaultTimeout : Duration.fromInputUnsafe(options.timeout),
    scheme: options.signing ?? schemeOf(stage),
    detect: options.signing === undefined && stage === "auto"
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
export interface UndiciOptions extends Omit<Options, "transformClient"> {
  /**
   * The most connections {@link layerUndici}'s undici `Agent` (or
   * {@link layerSocket}'s pool) opens to the kernel (default
   * {@link defaultConnections}). Unbounded, an agent that
   * releases thousands of parked runs at once opens thousands of sockets, and
   * undici's scan for a free one grows with their number: 10,000 runs released
   * together took over 150 s and missed heartbeats, against 8.4 s and none
   * with 64. A whole number of at least 1, else a `ConfigError`. Ignored by
   * {@link makeUndici}, which uses the dispatcher it is given.
   */
  readonly connections?: number | undefined
}

/**
 * The default of {@link UndiciOptions.connections}: 64 connections to the kernel.
 *
 * @since 0.2.0
 * @category layers
 */
export const defaultConnections = 64

const undiciDispatcher = (options: Partial<UndiciOptions> | undefined) =>
  NodeHttpClient.layerDispatcherOptions({ connections: options?.connections ?? defaultConnections })

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

/**
 * Options of the socket kernel client ({@link makeSocket}, {@link layerSocket}):
 * those of {@link UndiciOptions}, `connections` bounding its own pool.
 *
 * @since 0.2.0
 * @category models
 */
export type SocketOptions = UndiciOptions

/**
 * Build the kernel client on Node.js sockets (`node:net`, `node:tls` for an
 * `https:` base URL) with a minimal HTTP/1.1 client of its own: a pool of at
 * most `connections` keep-alive connections (default
 * {@link defaultConnections}), one request at a time on each, closed when the
 * scope ends. The same requests, bytes, signatures, timeouts, retries and
 * errors as {@link makeUndici}, for about a quarter less of the agent's CPU
 * per step (no HTTP library in between: a request is one buffer and one
 * write, an answer is parsed as its bytes arrive). Idle connections are
 * reused for 4 s, or up to a second less than the kernel's
 * `keep-alive: timeout`, and never keep the process alive.
 *
 * @since 0.2.0
 * @category constructors
 */
export const makeSocket: (
  options: SocketOptions
) => Effect.Effect<KernelClient.Service, Config.ConfigError, Scope.Scope> = Effect.fnUntraced(
  function*(options: SocketOptions) {
    const resolved = yield* resolve(options)
    const transport = yield* Effect.acquireRelease(
      Effect.sync(() =>
        SocketTransport.make(resolved.base, resolved.timeout, options.connections ?? defaultConnections)
      ),
      (transport) => Effect.sync(transport.close)
    )
    return makeService(resolved, transport.send)
  }
)

const makeService = (resolved: Resolved, transport: Transport.Send): KernelClient.Service => {
  const { base, detect, secret } = resolved
  const basePath = base.pathname
  /** The scheme in use; under `"auto"` it changes when an older kernel shows itself (C.13). */
  let scheme: SigningScheme = resolved.scheme
  /**
   * Whether a `v1=`-signed request got an answer other than `401`: the kernel
   * is then a current one, and a webhook without `dispatch_attempt` (which a
   * current kernel never sends) is no evidence of an older one.
   */
  let v1Accepted = false

  const switchTo = (next: SigningScheme, evidence: string): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (scheme === next) return Effect.void
      scheme = next
      return Effect.logInfo(`kernel stage detected (${evidence}): signing requests with ${next}= from now on`)
    })

  /** A signed request: its headers in the order every transport sends them. */
  const signedRequest = (
    method: "GET" | "POST" | "PUT",
    path: string,
    agentId: string,
    lease: Lease | undefined,
    attempt: string,
    body: Uint8Array | undefined,
    signature: string,
    timestamp: string | undefined
  ): Transport.WireRequest => {
    const headers: Record<string, string> = {
      [H_CONTENT_TYPE]: JSON_TYPE,
      [H_AGENT_ID]: agentId,
      [H_SIGNATURE]: signature
    }
    if (timestamp !== undefined) headers[H_TIMESTAMP] = timestamp
    if (lease !== undefined) {
      headers[H_DISPATCH_ID] = lease.dispatchId
      if (attempt !== "") headers[H_DISPATCH_ATTEMPT] = attempt
    }
    return { method, path, headers, body }
  }

  /** The `dispatch_attempt` a request carries: the lease's, or "" without one. */
  const attemptOf = (lease: Lease | undefined): string =>
    lease === undefined || lease.attempt === undefined ? "" : String(lease.attempt)

  /** What a `v1=` signature covers (17.B): method, target, timestamp, dispatch id and attempt, body. */
  const v1Input = (
    method: "GET" | "POST" | "PUT",
    path: string,
    lease: Lease | undefined,
    attempt: string,
    body: Uint8Array | undefined,
    timestamp: string
  ) => ({
    method,
    target: basePath + path,
    timestamp,
    dispatchId: lease === undefined ? "" : lease.dispatchId,
    dispatchAttempt: attempt,
    body: body ?? EMPTY
  })

  /**
   * Sign and build one request at the fiber's time (a fresh `v1` timestamp
   * for each try) where the HMAC can be computed on the spot (node:crypto);
   * `undefined` where only Web Crypto is available (then {@link build}).
   */
  const buildNow = (
    method: "GET" | "POST" | "PUT",
    path: string,
    agentId: string,
    lease: Lease | undefined,
    body: Uint8Array | undefined,
    signing: SigningScheme,
    fiber: Fiber.Fiber<unknown, unknown>
  ): Transport.WireRequest | undefined => {
    const attempt = attemptOf(lease)
    if (signing === "sha256") {
      const signed = Signature.signSync(secret, body ?? EMPTY)
      return signed === undefined
        ? undefined
        : signedRequest(method, path, agentId, lease, attempt, body, signed, undefined)
    }
    const timestamp = String(Math.floor(fiber.getRef(Clock.Clock).currentTimeMillisUnsafe() / 1000))
    const signed = Signature.signV1Sync(secret, v1Input(method, path, lease, attempt, body, timestamp))
    return signed === undefined
      ? undefined
      : signedRequest(method, path, agentId, lease, attempt, body, signed, timestamp)
  }

  /** Sign and build one request with Web Crypto (where node:crypto is absent). */
  const build = (
    method: "GET" | "POST" | "PUT",
    path: string,
    agentId: string,
    lease: Lease | undefined,
    body: Uint8Array | undefined,
    signing: SigningScheme
  ): Effect.Effect<Transport.WireRequest> => {
    const attempt = attemptOf(lease)
    if (signing === "sha256") {
      return Effect.map(
        Signature.sign(secret, body ?? EMPTY),
        (signature) => signedRequest(method, path, agentId, lease, attempt, body, signature, undefined)
      )
    }
    return Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const timestamp = String(Math.floor(now / 1000))
      return Effect.map(
        Signature.signV1(secret, v1Input(method, path, lease, attempt, body, timestamp)),
        (signature) => signedRequest(method, path, agentId, lease, attempt, body, signature, timestamp)
      )
    })
  }

  /**
   * One exchange: build, send within the timeout, and split success (< 300)
   * from error answers. Signed with the current scheme unless `signing` is given.
   */
  const exchange = <A, E>(
    method: "GET" | "POST" | "PUT",
    path: string,
    agentId: string,
    lease: Lease | undefined,
    body: Uint8Array | undefined,
    onSuccess: (reply: Http.Reply) => Effect.Effect<A, KernelError>,
    onFailure: (failure: Http.ApiFailure) => Effect.Effect<A, E>,
    signing?: SigningScheme
  ): Effect.Effect<A, KernelError | E> =>
    Effect.withFiber((fiber) => {
      const using = signing ?? scheme
      const request = buildNow(method, path, agentId, lease, body, using, fiber)
      const sent = request === undefined
        ? Effect.flatMap(build(method, path, agentId, lease, body, using), transport)
        : transport(request)
      return Effect.flatMap(
        sent,
        (reply): Effect.Effect<A, KernelError | E> => {
          if (using === "v1" && reply.status !== 401) v1Accepted = true
          return reply.status < 300 ? onSuccess(reply) : onFailure(Http.apiFailure(reply))
        }
      )
    })

  /** The call's span; its name and attributes are built only when spans are recorded. */
  const span = (name: string, executionId: string, stepId?: string) =>
  <A, E>(self: Effect.Effect<A, E>): Effect.Effect<A, E> =>
    Effect.withFiber((fiber) =>
      Tracing.isRecording(fiber.getRef(Tracer.Tracer), fiber.getRef(References.TracerEnabled))
        ? Tracing.withSpanIn(fiber, `KernelClient.${name}`, {
          kind: "client",
          attributes: stepId === undefined
            ? { "rebuno.execution_id": executionId }
            : { "rebuno.execution_id": executionId, "rebuno.step_id": stepId }
        }, self)
        : self
    )

  const fail = <E>(f: (failure: Http.ApiFailure) => E) => (failure: Http.ApiFailure) => Effect.fail(f(failure))
  const unit = () => Effect.void
  /** Complete / fail execution: a `409 execution_terminal` means an earlier try (or a cancel) got there first. */
  const outcomeFailure = (failure: Http.ApiFailure): Effect.Effect<void, KernelError | LeaseSuperseded> =>
    failure.code === "execution_terminal" ? Effect.void : Effect.fail(leaseFailure(failure))

  // Ids are UUIDs and hex digests, which encoding leaves alone; anything else is
  // percent-encoded so that every transport sends the same path.
  let lastExecutionId = ""
  let lastExecutionPath = "/v0/executions/"
  /** A run calls with the same execution id step after step: its path is kept. */
  const executionPath = (executionId: string) => {
    if (executionId !== lastExecutionId) {
      lastExecutionPath = "/v0/executions/" + Path.segment(executionId)
      lastExecutionId = executionId
    }
    return lastExecutionPath
  }
  const stepPath = (executionId: string, stepId: string) =>
    executionPath(executionId) + "/steps/" + Path.segment(stepId)

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

  const failStepJson: KernelClient.Service["failStepJson"] = (caller, executionId, stepId, errorJson, records) =>
    postStepOutcome(
      "fail",
      caller,
      executionId,
      stepId,
      () => "{\"error\":" + errorJson + (records === undefined ? "" : recordsMembers(records)) + "}"
    )

  /** A resource route: lease-fenced, retried on transport failures (a repeat is harmless, C.6.2–C.6.6). */
  const resourceCall = <A>(
    name: string,
    caller: Caller,
    executionId: string,
    path: string,
    body: () => string,
    onSuccess: (reply: Http.Reply) => Effect.Effect<A, KernelError>
  ) =>
    Effect.suspend(() =>
      exchange(
        "POST",
        executionPath(executionId) + path,
        caller.agentId,
        caller.lease,
        encoder.encode(body()),
        onSuccess,
        fail(stepFailure)
      ).pipe(Http.retryTransport)
    ).pipe(span(name, executionId))

  /** `GET /v0/executions/{id}` signed with `signing` (the current scheme when absent). */
  const readExecution = (agentId: string, executionId: string, signing?: SigningScheme) =>
    exchange(
      "GET",
      executionPath(executionId),
      agentId,
      undefined,
      undefined,
      decodeExecution,
      fail(plainFailure),
      signing
    ).pipe(Http.retryTransport)

  /**
   * The run's first read under `"auto"` (C.13): a `401` may mean the kernel
   * speaks the other scheme. The read is safe to repeat, so it is repeated
   * once with the other scheme; only when that gets through does the client
   * switch (a wrong secret or a skewed clock keeps the scheme and the `401`).
   */
  const readExecutionDetecting = (agentId: string, executionId: string) =>
    Effect.suspend(() => {
      const tried = scheme
      const other: SigningScheme = tried === "v1" ? "sha256" : "v1"
      return Effect.catchIf(
        readExecution(agentId, executionId, tried),
        isUnauthorized,
        (unauthorized) =>
          readExecution(agentId, executionId, other).pipe(
            Effect.tap(() => switchTo(other, `a ${tried}= signature got 401, a ${other}= one did not`)),
            Effect.catchIf(isUnauthorized, () => Effect.fail(unauthorized))
          )
      )
    })

  return KernelClient.of({
    secret,
    signingScheme: Effect.sync(() => scheme),
    observeWebhook: (notice) =>
      detect && !v1Accepted && notice.dispatchAttempt === undefined ?
        switchTo("sha256", "a webhook without dispatch_attempt") :
        Effect.void,
    getExecution: (caller, executionId) =>
      (detect ? readExecutionDetecting(caller.agentId, executionId) : readExecution(caller.agentId, executionId)).pipe(
        span("getExecution", executionId)
      ),
    previous: (caller, executionId) =>
      exchange(
        "GET",
        executionPath(executionId) + "/previous",
        caller.agentId,
        undefined,
        undefined,
        decodePrevious,
        fail(plainFailure)
      ).pipe(
        Effect.map((answer) => answer.state),
        Http.retryTransport,
        span("previous", executionId)
      ),
    getStep: (caller, executionId, stepId) =>
      exchange(
        "GET",
        stepPath(executionId, stepId),
        caller.agentId,
        undefined,
        undefined,
        decodeStep,
        fail(plainFailure)
      ).pipe(Http.retryTransport, span("getStep", executionId, stepId)),
    suspend: (caller, executionId) =>
      exchange(
        "POST",
        executionPath(executionId) + "/suspend",
        caller.agentId,
        caller.lease,
        EMPTY,
        decodeSuspend,
        fail(stepFailure)
      ).pipe(
        Effect.map((answer) => answer.suspended),
        Http.retryTransport,
        span("suspend", executionId)
      ),
    publishMetadata: (agentId, metadata) =>
      Effect.suspend(() =>
        exchange(
          "PUT",
          "/v0/agents/" + Path.segment(agentId) + "/metadata",
          agentId,
          undefined,
          encoder.encode(
            "{\"description\":" + JSON.stringify(metadata.description) +
              ",\"input_schema\":" + jsonOrNull(metadata.inputSchema) +
              ",\"output_schema\":" + jsonOrNull(metadata.outputSchema) + "}"
          ),
          unit,
          fail(plainFailure)
        )
      ).pipe(
        Tracing.withSpan("KernelClient.publishMetadata", { kind: "client", attributes: { "rebuno.agent_id": agentId } })
      ),
    submitStep: (caller, executionId, submission) =>
      Effect.suspend(() => {
        const resources = submission.resources
        const body = encoder.encode(
          "{\"kind\":" + JSON.stringify(submission.kind) +
            ",\"target\":" + JSON.stringify(submission.target) +
            ",\"args\":" + submission.argsJson +
            ",\"idempotency\":" + JSON.stringify(submission.idempotency) +
            (resources === undefined || resources.length === 0 ? "" : ",\"resources\":" + JSON.stringify(resources)) +
            "}"
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
    completeStep: (caller, executionId, stepId, resultJson, records) =>
      postStepOutcome(
        "complete",
        caller,
        executionId,
        stepId,
        () => "{\"result\":" + resultJson + (records === undefined ? "" : recordsMembers(records)) + "}"
      ),
    failStep: (caller, executionId, stepId, message) =>
      failStepJson(caller, executionId, stepId, "{\"message\":" + JSON.stringify(message) + "}"),
    failStepJson,
    registerResource: (caller, executionId, registration) =>
      resourceCall(
        "registerResource",
        caller,
        executionId,
        "/resources",
        () => registrationBody(registration),
        decodeResource
      ),
    bindResource: (caller, executionId, key, bindingJson) =>
      resourceCall(
        "bindResource",
        caller,
        executionId,
        "/resources/" + Path.segment(key) + "/binding",
        () => "{\"binding\":" + bindingJson + "}",
        unit
      ),
    publishCheckpoints: (caller, executionId, records) =>
      resourceCall(
        "publishCheckpoints",
        caller,
        executionId,
        "/resources/checkpoints",
        () => "{" + recordsMembers(records).slice(1) + "}",
        unit
      ),
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
    completeExecution: (caller, executionId, outputJson, stateJson) =>
      Effect.suspend(() =>
        exchange(
          "POST",
          executionPath(executionId) + "/complete",
          caller.agentId,
          caller.lease,
          encoder.encode(completeExecutionBody(outputJson, stateJson)),
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
 * The `,"captures":[…],"capture_failures":[…]` members of a step outcome or
 * checkpoints body (PROTOCOL-CURRENT C.6.5), each omitted when empty; `""`
 * when both are.
 */
const recordsMembers = (records: CheckpointRecords): string => {
  let out = ""
  const captures = records.captures
  if (captures !== undefined && captures.length > 0) {
    out += ",\"captures\":[" + captures.map((c) =>
      "{\"key\":" + JSON.stringify(c.key) +
      ",\"generation\":" + JSON.stringify(c.generation) +
      ",\"checkpoint_ref\":" + JSON.stringify(c.checkpointRef) + "}"
    ).join(",") + "]"
  }
  const failures = records.captureFailures
  if (failures !== undefined && failures.length > 0) {
    out += ",\"capture_failures\":[" + failures.map((f) =>
      "{\"key\":" + JSON.stringify(f.key) +
      ",\"generation\":" + JSON.stringify(f.generation) +
      ",\"error\":" + JSON.stringify(f.error) + "}"
    ).join(",") + "]"
  }
  return out
}

/** The register body (PROTOCOL-CURRENT C.6.2), every member present, in the Python SDK's order. */
const registrationBody = (r: ResourceRegistration): string =>
  "{\"key\":" + JSON.stringify(r.key) +
  ",\"driver_id\":" + JSON.stringify(r.driverId) +
  ",\"configuration\":" + (r.configurationJson ?? "null") +
  ",\"coverage_reuse\":" + (r.coverageReuse ? "true" : "false") +
  ",\"every_steps\":" + JSON.stringify(r.everySteps) +
  ",\"on_completion\":" + (r.onCompletion ? "true" : "false") + "}"

/** A JSON value's text, `null` for `undefined` (metadata members are always present). */
const jsonOrNull = (value: unknown): string => JSON.stringify(value === undefined ? null : value) ?? "null"

/** `{"output":…[,"state":…]}`; `{}` (or `{"state":…}`) without output (6.8, PROTOCOL-CURRENT C.4.5). */
const completeExecutionBody = (outputJson: string | undefined, stateJson: string | undefined): string =>
  outputJson === undefined
    ? (stateJson === undefined ? "{}" : "{\"state\":" + stateJson + "}")
    : stateJson === undefined
    ? "{\"output\":" + outputJson + "}"
    : "{\"output\":" + outputJson + ",\"state\":" + stateJson + "}"

/**
 * The HTTP kernel client as a Layer.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options): Layer.Layer<KernelClient, Config.ConfigError, HttpClient.HttpClient> =>
  Layer.effect(KernelClient, make(options))

/**
 * The HTTP kernel client configured from the environment: `REBUNO_URL`,
 * `REBUNO_AGENT_SECRET` (read with `Config`, the secret straight into a
 * `Redacted`) and the optional `REBUNO_STAGE` ({@link Stage}, default
 * `auto`). Options given here win over the environment. Fails with a
 * `ConfigError` when a required value is missing or empty, or the stage is
 * not one of the four.
 *
 * @example
 * ```ts
 * import { NodeHttpClient } from "@effect/platform-node"
 * import { Layer } from "effect"
 * import { KernelClient } from "effect-rebuno"
 *
 * // REBUNO_URL, REBUNO_AGENT_SECRET and REBUNO_STAGE (optional)
 * const KernelClientLive = KernelClient.layerConfig().pipe(Layer.provide(NodeHttpClient.layerUndici))
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

/**
 * The base URL, secret and stage: from the options when given, else
 * `REBUNO_URL`, `REBUNO_AGENT_SECRET` and `REBUNO_STAGE` (optional, default
 * `auto`; any other value than a {@link Stage} fails).
 */
const readConfig = (
  options: Partial<UndiciOptions> | undefined
): Effect.Effect<
  { readonly baseUrl: string; readonly secret: Redacted.Redacted<string> | string; readonly stage: Stage },
  Config.ConfigError
> =>
  Effect.gen(function*() {
    const baseUrl = options?.baseUrl ?? (yield* Config.NonEmptyString("REBUNO_URL"))
    const secret = options?.secret ?? (yield* secretConfig)
    const stage = options?.stage ?? (yield* stageConfig)
    return { baseUrl, secret, stage }
  })

/** `REBUNO_STAGE`: one of {@link stages}, `auto` when unset. */
const stageConfig: Config.Config<Stage> = Config.Literals(stages, "REBUNO_STAGE").pipe(Config.withDefault("auto"))

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
 * keep-alive undici `Agent` that is closed when the layer's scope ends. It
 * needs no `HttpClient`; {@link layerSocket} does the same with less CPU.
 *
 * @example
 * ```ts
 * import { NodeRuntime } from "@effect/platform-node"
 * import { Effect, Layer, Redacted, Schema } from "effect"
 * import { Agent, KernelClient } from "effect-rebuno"
 *
 * const researcher = Agent.make({
 *   id: "researcher",
 *   input: Schema.Struct({ prompt: Schema.String }),
 *   handler: ({ prompt }) => Effect.succeed({ answer: `no results for ${prompt}` })
 * })
 *
 * Agent.serve(researcher, { port: 5000 }).pipe(
 *   Layer.provide(KernelClient.layerUndici({
 *     baseUrl: "http://localhost:8080",
 *     secret: Redacted.make("hello-secret") // the agent's secret in the kernel's manifest
 *   })),
 *   Layer.launch,
 *   NodeRuntime.runMain
 * )
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layerUndici = (options: UndiciOptions): Layer.Layer<KernelClient, Config.ConfigError> =>
  Layer.effect(KernelClient, makeUndici(options)).pipe(Layer.provide(undiciDispatcher(options)))

/**
 * {@link layerUndici} configured like {@link layerConfig}: `REBUNO_URL`,
 * `REBUNO_AGENT_SECRET` and `REBUNO_STAGE`, options winning over the
 * environment.
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
  ).pipe(Layer.provide(undiciDispatcher(options)))

/**
 * The kernel client on Node.js sockets (see {@link makeSocket}): the fastest
 * client on Node.js, with its own pool of keep-alive connections, closed when
 * the layer's scope ends. It needs no `HttpClient` and no HTTP library.
 *
 * @example
 * ```ts
 * import { NodeRuntime } from "@effect/platform-node"
 * import { Effect, Layer, Redacted, Schema } from "effect"
 * import { Agent, KernelClient } from "effect-rebuno"
 *
 * const researcher = Agent.make({
 *   id: "researcher",
 *   input: Schema.Struct({ prompt: Schema.String }),
 *   handler: ({ prompt }) => Effect.succeed({ answer: `no results for ${prompt}` })
 * })
 *
 * Agent.serve(researcher, { port: 5000 }).pipe(
 *   Layer.provide(KernelClient.layerSocket({
 *     baseUrl: "http://localhost:8080",
 *     secret: Redacted.make("hello-secret") // the agent's secret in the kernel's manifest
 *   })),
 *   Layer.launch,
 *   NodeRuntime.runMain
 * )
 * ```
 *
 * @since 0.2.0
 * @category layers
 */
export const layerSocket = (options: SocketOptions): Layer.Layer<KernelClient, Config.ConfigError> =>
  Layer.effect(KernelClient, makeSocket(options))

/**
 * {@link layerSocket} configured like {@link layerConfig}: `REBUNO_URL`,
 * `REBUNO_AGENT_SECRET` and `REBUNO_STAGE`, options winning over the
 * environment.
 *
 * @since 0.2.0
 * @category layers
 */
export const layerSocketConfig = (
  options?: Partial<SocketOptions>
): Layer.Layer<KernelClient, Config.ConfigError> =>
  Layer.effect(
    KernelClient,
    Effect.flatMap(readConfig(options), (resolved) => makeSocket({ ...options, ...resolved }))
  )
