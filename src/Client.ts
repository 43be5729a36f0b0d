/**
 * The Rebuno client for backends and operators (PROTOCOL.md 11, 14.9, 15.2):
 * create, read, list and cancel executions (with sessions, idempotency keys and
 * subagent bindings, PROTOCOL-CURRENT C.4, C.5); fork an execution and read
 * its fork points (C.7); read an execution's previous state; read events page by page or follow them as a `Stream` until the
 * execution ends; watch live deltas over SSE; read steps; list and decide
 * approvals; administer agents, their policy bundles (and test a bundle
 * without storing it, C.8.6) and scoped API keys (C.9.2).
 *
 * Requests carry `Authorization: Bearer <apiKey>` when an API key is configured
 * (option, else `REBUNO_API_KEY`) and no `Authorization` header otherwise (a dev
 * kernel needs none). Every request has a timeout (35 s by default). Calls that
 * PROTOCOL.md 15.2 declares safe are retried with backoff on transport failures
 * (connection errors, timeouts, `5xx`); creating an execution never is, since a
 * retry could create a second one. Answers are decoded with the `Protocol`
 * schemas; errors are `KernelError`s carrying the kernel's `code` and HTTP
 * status.
 *
 * ```ts
 * import { NodeHttpClient } from "@effect/platform-node"
 * import { Layer } from "effect"
 * import { Client } from "effect-rebuno"
 *
 * const ClientLive = Client.layerConfig().pipe(Layer.provide(NodeHttpClient.layerUndici))
 * ```
 *
 * @since 0.1.0
 */
import {
  Config,
  ConfigProvider,
  Context,
  Duration,
  Effect,
  Layer,
  Option,
  Redacted,
  Result,
  Schema,
  SchemaGetter,
  Stream
} from "effect"
import { HttpBody, HttpClient, HttpClientRequest } from "effect/http"
import * as Http from "./internal/http/exchange.js"
import { stringifyStrict } from "./internal/wire/json.js"
import * as Path from "./internal/wire/path.js"
import * as Protocol from "./Protocol.js"
import { InvalidArguments, KernelError } from "./RebunoError.js"

/**
 * Filters and paging of {@link Client.Service.list}.
 *
 * @since 0.1.0
 * @category models
 */
export interface ListOptions {
  /** Only executions of this agent. */
  readonly agentId?: string | undefined
  /** Only executions of this session, exactly (PROTOCOL-CURRENT C.4.7; current-stage kernels). */
  readonly session?: string | undefined
  /** Only executions in this status. */
  readonly status?: Protocol.ExecutionStatus | (string & {}) | undefined
  /** The `nextCursor` of the previous page, exactly as received. */
  readonly cursor?: string | undefined
  /** Page size (the kernel's default is 50, its maximum 200). */
  readonly limit?: number | undefined
}

/**
 * Options of {@link Client.Service.events}.
 *
 * @since 0.1.0
 * @category models
 */
export interface EventsOptions {
  /** Only events with a greater `event_seq` (default 0: from the start). */
  readonly afterSeq?: number | undefined
  /** Page size (default 100, the kernel's maximum is 1000). */
  readonly limit?: number | undefined
}

/**
 * Options of {@link Client.Service.follow}.
 *
 * @since 0.1.0
 * @category models
 */
export interface FollowOptions extends EventsOptions {
  /** How long to wait between polls once caught up (default 500 ms, on Effect's clock). */
  readonly pollInterval?: Duration.Input | undefined
}

/**
 * A human decision on an approval.
 *
 * @since 0.1.0
 * @category models
 */
export interface ApprovalDecision {
  /** Who decides; must be one of the approval's approvers when it lists any. */
  readonly decidedBy: string
  readonly rationale?: string | undefined
}

/**
 * An agent registration (`POST /v0/agents`).
 *
 * @since 0.1.0
 * @category models
 */
export interface AgentRegistration {
  readonly id: string
  readonly webhookUrl: string
  readonly secret: Redacted.Redacted<string> | string
  /**
   * The agent's lease timeout in seconds (PROTOCOL-CURRENT C.10; the kernel
   * ignores values under 10). Sent only when given: kernels before the current
   * stage refuse the member with `400 validation_error`.
   *
   * @since 0.2.0
   */
  readonly leaseTimeoutSeconds?: number | undefined
}

/**
 * The step of a parent execution that a child execution is bound to
 * (PROTOCOL-CURRENT C.5.1): the child settles that step when it ends.
 *
 * @since 0.2.0
 * @category models
 */
export interface SpawnedBy {
  readonly executionId: string
  readonly stepId: string
}

/**
 * Options of {@link Client.Service.create}. Every member is omitted from the
 * request when absent or empty.
 *
 * - `session`, `idempotencyKey`, `parentExecutionId` and `spawnedBy` are
 *   members of the current stage (PROTOCOL-CURRENT C.4.1, C.5.1); older kernels
 *   refuse them with `400 validation_error`.
 * - `agentVersion` is a member of the seed stage and v0.14.0 only: a
 *   current-stage kernel decodes the create body strictly and answers
 *   `400 validation_error` to it (C.10, C.13). Leave it out unless the kernel
 *   is an older one.
 *
 * @since 0.2.0
 * @category models
 */
export interface CreateOptions {
  /**
   * The session label (at most 256 bytes, not blank): executions of one session
   * run one at a time, oldest first, and each reads the state its predecessor
   * left (C.4.3, C.4.4).
   */
  readonly session?: string | undefined
  /**
   * Create at most one execution per agent for this key: a repeated create
   * answers the execution that already has it (C.4.1 step 4). With a key (or a
   * `spawnedBy`, whose step id becomes the key) the create is retried on
   * transport failures, since a repeat cannot create a second execution.
   */
  readonly idempotencyKey?: string | undefined
  /** An explicit parent: a `completed` execution of the same agent, whose state `previous` reads (C.4.1 step 5). */
  readonly parentExecutionId?: string | undefined
  /** Bind the new execution as a child of this executing step (C.5.1). */
  readonly spawnedBy?: SpawnedBy | undefined
  /**
   * The agent version label of older kernels (seed stage, v0.14.0). **Never
   * send it to a current-stage kernel**: it answers `400 validation_error`.
   */
  readonly agentVersion?: string | undefined
}

/**
 * Options of {@link Client.Service.fork} (PROTOCOL-CURRENT C.7.1).
 *
 * - `atSeq`: the fork point, an event seq of the source (`1..latest`): the
 *   fork copies the steps settled by then and restores each resource from
 *   the checkpoint covering it ({@link Protocol.latestCoveredSeq} finds the
 *   latest seq where every resource is covered).
 * - `session`: the fork's session label (it must have no executions yet);
 *   omitted when absent or empty.
 * - `policyBundle`: a policy bundle (YAML) for the fork only, instead of the
 *   source's; needs the `policies:write` scope. Omitted when absent or empty.
 *
 * @since 0.2.0
 * @category models
 */
export interface ForkOptions {
  readonly atSeq: number
  readonly session?: string | undefined
  readonly policyBundle?: string | undefined
}

/**
 * A scope of an API key (PROTOCOL-CURRENT C.9.1): see
 * `Protocol.apiKeyScopes`. Write does not imply read; `api_keys:manage`
 * administers keys.
 *
 * @since 0.2.0
 * @category models
 */
export type ApiKeyScope = Protocol.ApiKeyScope

/** A string member: absent or `null` decodes as `""` (PROTOCOL.md 11.12 leniency). */
const lenientString = Schema.optionalKey(Schema.NullOr(Schema.String)).pipe(
  Schema.decodeTo(Schema.String, {
    decode: SchemaGetter.transformOptional((o: Option.Option<string | null>) =>
      Option.orElseSome(Option.filter(o, (s): s is string => s !== null), () => "")
    ),
    encode: SchemaGetter.required()
  })
)

/** A string member omitted when empty: absent, `null` and `""` decode as absent. */
const nonEmptyString = Schema.optionalKey(Schema.NullOr(Schema.String)).pipe(
  Schema.decodeTo(Schema.optionalKey(Schema.String), {
    decode: SchemaGetter.transformOptional((o: Option.Option<string | null>) =>
      Option.filter(o, (s): s is string => s !== null && s !== "")
    ),
    encode: SchemaGetter.transformOptional((o: Option.Option<string>) => o)
  })
)

/** A list of strings: absent or `null` decodes as `[]`. */
const lenientStrings = Schema.optionalKey(Schema.NullOr(Schema.Array(Schema.String))).pipe(
  Schema.decodeTo(Schema.Array(Schema.String), {
    decode: SchemaGetter.transformOptional((o: Option.Option<ReadonlyArray<string> | null>) =>
      Option.orElseSome(Option.filter(o, (l): l is ReadonlyArray<string> => l !== null), () => [])
    ),
    encode: SchemaGetter.required()
  })
)

/**
 * An API key as listed (`GET /v0/api-keys`, PROTOCOL-CURRENT C.9.2):
 * `{"id","name","scopes","created_at"[,"revoked_at"]}`. Decoded leniently like
 * the `Protocol` objects: unknown members are ignored, missing strings are
 * `""`, `revokedAt` is absent while the key is live. The token is never listed.
 *
 * @since 0.2.0
 * @category schemas
 */
export const ApiKey = Schema.Struct({
  id: lenientString,
  name: lenientString,
  scopes: lenientStrings,
  createdAt: lenientString,
  revokedAt: nonEmptyString
}).pipe(Schema.encodeKeys({ createdAt: "created_at", revokedAt: "revoked_at" }))

/**
 * A decoded API key.
 *
 * @since 0.2.0
 * @category models
 */
export interface ApiKey extends Schema.Schema.Type<typeof ApiKey> {}

/**
 * The answer of create and rotate (PROTOCOL-CURRENT C.9.2): the key and its
 * token, `rbk_<id>.<secret>`, which the kernel shows only this once. The token
 * is decoded straight into a `Redacted`, so logging the key never prints it.
 *
 * @since 0.2.0
 * @category schemas
 */
export const ApiKeyWithToken = Schema.Struct({
  id: lenientString,
  name: lenientString,
  scopes: lenientStrings,
  createdAt: lenientString,
  token: Schema.RedactedFromValue(Schema.String)
}).pipe(Schema.encodeKeys({ createdAt: "created_at" }))

/**
 * A decoded API key with its token.
 *
 * @since 0.2.0
 * @category models
 */
export interface ApiKeyWithToken extends Schema.Schema.Type<typeof ApiKeyWithToken> {}

/**
 * A new API key (`POST /v0/api-keys`): a name (1–200 bytes once trimmed) and
 * at least one scope.
 *
 * @since 0.2.0
 * @category models
 */
export interface ApiKeyRequest {
  readonly name: string
  readonly scopes: ReadonlyArray<ApiKeyScope | (string & {})>
}

/**
 * A decision a policy rule gives (PROTOCOL-CURRENT C.8.6).
 *
 * @since 0.2.0
 * @category models
 */
export type PolicyDecision = "allow" | "deny" | "require_approval" | "judge"

/**
 * One case of {@link Client.Service.testPolicy}: a step to evaluate and,
 * optionally, what the bundle should decide for it. `args` must be JSON
 * (default `{}`); `kind` defaults to `tool_call` and `agentId` to the agent
 * tested.
 *
 * @since 0.2.0
 * @category models
 */
export interface PolicyTestCase {
  readonly name?: string | undefined
  readonly kind?: "tool_call" | "llm_call" | "local" | (string & {}) | undefined
  readonly target: string
  readonly args?: unknown
  readonly agentId?: string | undefined
  /** The decision the bundle should give. */
  readonly expect?: PolicyDecision | undefined
  /** The id of the rule that should decide (or `default`, `local`, `permissive`). */
  readonly expectRule?: string | undefined
}

/**
 * What {@link Client.Service.testPolicy} evaluates a bundle against: cases,
 * or the recorded steps of one of the agent's executions (each expecting
 * the decision and rule recorded when it was submitted).
 *
 * @since 0.2.0
 * @category models
 */
export type PolicyTestRequest =
  | { readonly bundle: string; readonly cases: ReadonlyArray<PolicyTestCase> }
  | { readonly bundle: string; readonly executionId: string }

const optionalFlag = Schema.optionalKey(Schema.NullOr(Schema.Boolean)).pipe(
  Schema.decodeTo(Schema.Boolean, {
    decode: SchemaGetter.transformOptional((o: Option.Option<boolean | null>) =>
      Option.orElseSome(Option.filter(o, (b): b is boolean => b !== null), () => false)
    ),
    encode: SchemaGetter.required()
  })
)

/**
 * One result of a policy test: the case, the bundle's decision, rule id and
 * reason, whether the deciding rule has a rate limit or a token budget (not
 * counted by a test), what was expected (when given) and whether it held.
 *
 * @since 0.2.0
 * @category schemas
 */
export const PolicyTestCaseResult = Schema.Struct({
  name: lenientString,
  kind: lenientString,
  target: lenientString,
  decision: lenientString,
  ruleId: lenientString,
  reason: lenientString,
  rateLimit: optionalFlag,
  budget: optionalFlag,
  expect: nonEmptyString,
  expectRule: nonEmptyString,
  passed: Schema.Boolean
}).pipe(Schema.encodeKeys({ ruleId: "rule_id", rateLimit: "rate_limit", expectRule: "expect_rule" }))

/**
 * A decoded result of a policy test case.
 *
 * @since 0.2.0
 * @category models
 */
export interface PolicyTestCaseResult extends Schema.Schema.Type<typeof PolicyTestCaseResult> {}

/**
 * The answer of `POST /v0/policies/{agent_id}/test` (the embedded kernel's
 * format; PROTOCOL-CURRENT C.8.6 names the route only): whether every case
 * passed, the results in case order, and the ids of the bundle's rules no
 * case reached, in file order.
 *
 * @since 0.2.0
 * @category schemas
 */
export const PolicyTestResult = Schema.Struct({
  passed: Schema.Boolean,
  results: Protocol.NullableList(PolicyTestCaseResult),
  unreachedRules: lenientStrings
}).pipe(Schema.encodeKeys({ unreachedRules: "unreached_rules" }))

/**
 * A decoded policy test answer.
 *
 * @since 0.2.0
 * @category models
 */
export interface PolicyTestResult extends Schema.Schema.Type<typeof PolicyTestResult> {}

/**
 * @since 0.1.0
 * @category models
 */
export declare namespace Client {
  /**
   * The client calls (PROTOCOL.md 14.9).
   *
   * @since 0.1.0
   * @category models
   */
  export interface Service {
    /**
     * `POST /v0/executions`; `input` is omitted when `undefined` and must be
     * JSON (`InvalidArguments` otherwise, before anything is sent). The
     * options (session, idempotency key, parent, subagent binding) are sent
     * only when given and non-empty ({@link CreateOptions}). Not retried —
     * a retry could create a second execution — unless an idempotency key
     * (or `spawnedBy`) makes a repeat safe.
     */
    readonly create: (
      agentId: string,
      input?: unknown,
      options?: CreateOptions
    ) => Effect.Effect<Protocol.Execution, KernelError | InvalidArguments>
    /** `GET /v0/executions/{id}`. */
    readonly get: (executionId: string) => Effect.Effect<Protocol.Execution, KernelError>
    /**
     * `GET /v0/executions/{id}/previous` (PROTOCOL-CURRENT C.4.6): the state
     * the execution starts from — its parent's stored `state`, else the
     * parent's `output`, `null` without a parent. Current-stage kernels only
     * (older ones answer `404`).
     *
     * @since 0.2.0
     */
    readonly previous: (executionId: string) => Effect.Effect<unknown, KernelError>
    /**
     * `POST /v0/executions/{id}/fork` (PROTOCOL-CURRENT C.7.1, scope
     * `executions:write`): a new execution of the same agent and input that
     * replays the source's steps up to `atSeq` and runs live from there, under
     * its own policy when `policyBundle` is given. Answers the new execution
     * (`forkedFrom`, `forkSeq`, and `restoration` when the source had
     * resources — decode it with {@link Protocol.decodeRestoration}); it is
     * `running`, or `pending` when its session did not admit it yet. Sends
     * `{"at_seq":…}` plus the non-empty options. Never retried: a retry could
     * create a second fork.
     *
     * @since 0.2.0
     */
    readonly fork: (executionId: string, options: ForkOptions) => Effect.Effect<Protocol.Execution, KernelError>
    /**
     * `GET /v0/executions/{id}/fork-points` (PROTOCOL-CURRENT C.7.3, scope
     * `executions:read`): the latest seq, the resources with the seq they were
     * registered at, and every checkpoint with the seqs it covers.
     *
     * @since 0.2.0
     */
    readonly forkPoints: (executionId: string) => Effect.Effect<Protocol.ForkPoints, KernelError>
    /** One page of `GET /v0/executions` (newest first). */
    readonly list: (options?: ListOptions) => Effect.Effect<Protocol.ExecutionPage, KernelError>
    /** Every execution matching the filters, fetching page after page as the stream is pulled. */
    readonly listAll: (options?: ListOptions) => Stream.Stream<Protocol.Execution, KernelError>
    /**
     * `POST /v0/executions/{id}/cancel`.
     *
     * Cancelling an execution that is already terminal is an error on a
     * current-stage kernel: `409 conflict` (PROTOCOL-CURRENT C.10), a
     * `KernelError` with a `StatusError` reason — unless an earlier try of
     * this call was lost in transit and the execution now reads `cancelled`
     * (that try's success). Seed and v0.14.0 kernels answer
     * `409 execution_terminal`, which counts as done, as it always has.
     */
    readonly cancel: (executionId: string) => Effect.Effect<void, KernelError>
    /** One page of `GET /v0/executions/{id}/events` (ascending `eventSeq`). */
    readonly events: (
      executionId: string,
      options?: EventsOptions
    ) => Effect.Effect<ReadonlyArray<Protocol.Event>, KernelError>
    /**
     * Every event of the execution after `afterSeq`, polling until the
     * execution is terminal; the stream ends after its final events.
     */
    readonly follow: (executionId: string, options?: FollowOptions) => Stream.Stream<Protocol.Event, KernelError>
    /**
     * Live deltas over SSE (`GET /v0/executions/{id}/stream`). The kernel keeps
     * no buffer and never ends the stream: interrupt it (or `Stream.take`) to
     * stop. Not reconnected automatically.
     */
    readonly deltas: (executionId: string) => Stream.Stream<Protocol.LiveDelta, KernelError>
    /** `GET /v0/executions/{id}/steps` (sorted by step id); `terminal` keeps only terminal steps. */
    readonly listSteps: (
      executionId: string,
      options?: { readonly status?: "terminal" | undefined }
    ) => Effect.Effect<ReadonlyArray<Protocol.Step>, KernelError>
    /** `GET /v0/executions/{id}/steps/{step_id}`. */
    readonly getStep: (executionId: string, stepId: string) => Effect.Effect<Protocol.Step, KernelError>
    /** `GET /v0/approvals`: pending approvals, oldest first. */
    readonly listApprovals: () => Effect.Effect<ReadonlyArray<Protocol.Approval>, KernelError>
    /** `GET /v0/approvals/{id}`. */
    readonly getApproval: (approvalId: string) => Effect.Effect<Protocol.Approval, KernelError>
    /** `POST /v0/approvals/{id}/grant`. */
    readonly grantApproval: (approvalId: string, decision: ApprovalDecision) => Effect.Effect<void, KernelError>
    /** `POST /v0/approvals/{id}/deny`. */
    readonly denyApproval: (approvalId: string, decision: ApprovalDecision) => Effect.Effect<void, KernelError>
    /** `POST /v0/agents` (upsert; drops a loaded policy bundle). */
    readonly registerAgent: (registration: AgentRegistration) => Effect.Effect<Protocol.Agent, KernelError>
    /** `GET /v0/agents`. */
    readonly listAgents: () => Effect.Effect<ReadonlyArray<Protocol.Agent>, KernelError>
    /** `GET /v0/agents/{id}`. */
    readonly getAgent: (agentId: string) => Effect.Effect<Protocol.Agent, KernelError>
    /** `DELETE /v0/agents/{id}` (also succeeds for an unknown id). */
    readonly deleteAgent: (agentId: string) => Effect.Effect<void, KernelError>
    /** `POST /v0/policies/{agent_id}` with the raw YAML bundle; `""` removes the policy. */
    readonly loadPolicy: (agentId: string, bundle: string) => Effect.Effect<void, KernelError>
    /**
     * `POST /v0/policies/{agent_id}/test` (PROTOCOL-CURRENT C.8.6, scopes
     * `policies:write` and `executions:read`): evaluates a bundle against
     * cases, or against the recorded steps of one of the agent's executions,
     * without storing it — the agent's policy is untouched. A bad bundle is
     * the `400` loading it gives. Evaluation is the bundle's rules alone: no
     * judge is asked (a `judge` rule answers `judge`), no rate limit or
     * budget is counted. A case's `args` must be JSON (`InvalidArguments`
     * otherwise, before anything is sent). Current-stage embedded kernels
     * only; the body format is this SDK's and kernel's own.
     *
     * ```ts
     * import { Effect } from "effect"
     * import { Client } from "effect-rebuno"
     *
     * const program = Effect.gen(function*() {
     *   const client = yield* Client.Client
     *   const report = yield* client.testPolicy("hello", {
     *     bundle: "default_action: deny\nrules:\n  - id: search\n" +
     *       "    when: { target: web_search }\n    then: { decision: allow }\n",
     *     cases: [
     *       { name: "search is allowed", target: "web_search", args: { query: "hi" }, expect: "allow" },
     *       { target: "send_email", expect: "deny", expectRule: "default" }
     *     ]
     *   })
     *   if (!report.passed) yield* Effect.logWarning(report.results.filter((r) => !r.passed))
     *   return report.unreachedRules
     * })
     * ```
     *
     * @since 0.2.0
     */
    readonly testPolicy: (
      agentId: string,
      request: PolicyTestRequest
    ) => Effect.Effect<PolicyTestResult, KernelError | InvalidArguments>
    /**
     * `POST /v0/api-keys` (PROTOCOL-CURRENT C.9.2, scope `api_keys:manage`):
     * a new key and its token, shown only this once. Never retried (a retry
     * could create a second key).
     *
     * @since 0.2.0
     */
    readonly createApiKey: (request: ApiKeyRequest) => Effect.Effect<ApiKeyWithToken, KernelError>
    /**
     * `GET /v0/api-keys`: every key, revoked ones included (with `revokedAt`).
     *
     * @since 0.2.0
     */
    readonly listApiKeys: () => Effect.Effect<ReadonlyArray<ApiKey>, KernelError>
    /**
     * `POST /v0/api-keys/{id}/rotate`: the same key with a new token (the old
     * token stops working). A revoked key is `409 conflict`, an unknown one
     * `404`. Retried on transport failures: a repeat only rotates again, and
     * the token answered last is the valid one.
     *
     * @since 0.2.0
     */
    readonly rotateApiKey: (keyId: string) => Effect.Effect<ApiKeyWithToken, KernelError>
    /**
     * `DELETE /v0/api-keys/{id}`: revoke the key (`204`, repeatable).
     *
     * @since 0.2.0
     */
    readonly deleteApiKey: (keyId: string) => Effect.Effect<void, KernelError>
  }
}

/**
 * The client service.
 *
 * @since 0.1.0
 * @category services
 */
export class Client extends Context.Service<Client, Client.Service>()("effect-rebuno/Client") {}

/**
 * Options of the HTTP client.
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** Kernel base URL; trailing `/` characters are stripped; may contain a path prefix. */
  readonly baseUrl: string
  /** API key sent as `Authorization: Bearer <apiKey>`; no header when absent. */
  readonly apiKey?: Redacted.Redacted<string> | string | undefined
  /** Per-request timeout (default 35 seconds; for `deltas`, the wait for the response headers). */
  readonly timeout?: Duration.Input | undefined
  /** Customise the HTTP client (tracing, proxies, logging). */
  readonly transformClient?: ((client: HttpClient.HttpClient) => HttpClient.HttpClient) | undefined
}

/**
 * The settings {@link layerConfig} reads with `Config`: the base URL and the
 * optional API key.
 *
 * @since 0.2.0
 * @category models
 */
export interface Settings {
  readonly baseUrl: string
  readonly apiKey: Redacted.Redacted<string> | undefined
}

/**
 * The default per-request timeout (PROTOCOL.md 4.3).
 *
 * @since 0.1.0
 * @category constants
 */
export const defaultTimeout: Duration.Duration = Duration.seconds(35)

/**
 * The default poll interval of {@link Client.Service.follow}.
 *
 * @since 0.1.0
 * @category constants
 */
export const defaultPollInterval: Duration.Duration = Duration.millis(500)

// ---------------------------------------------------------------------------
// Implementation
// ---------------------------------------------------------------------------

const decodeExecution = Http.jsonDecoder(Protocol.Execution)
const decodeExecutionPage = Http.jsonDecoder(Protocol.ExecutionPage)
const decodeEvents = Http.jsonDecoder(Protocol.NullableList(Protocol.Event))
const decodeSteps = Http.jsonDecoder(Protocol.NullableList(Protocol.Step))
const decodeStep = Http.jsonDecoder(Protocol.Step)
const decodeApprovals = Http.jsonDecoder(Protocol.NullableList(Protocol.Approval))
const decodeApproval = Http.jsonDecoder(Protocol.Approval)
const decodeAgents = Http.jsonDecoder(Protocol.NullableList(Protocol.Agent))
const decodeAgent = Http.jsonDecoder(Protocol.Agent)
const decodeLiveDelta = Schema.decodeUnknownResult(Protocol.LiveDelta)
const decodeApiKeys = Http.jsonDecoder(Protocol.NullableList(ApiKey))
const decodeApiKeyWithToken = Http.jsonDecoder(ApiKeyWithToken)
const decodePrevious = Http.jsonDecoder(Schema.Struct({ state: Schema.optionalKey(Schema.Unknown) }))
const decodeForkPoints = Http.jsonDecoder(Protocol.ForkPoints)
const decodePolicyTest = Http.jsonDecoder(PolicyTestResult)

/** The body of a policy test, or the case whose `args` are not JSON. */
const policyTestBody = (agentId: string, req: PolicyTestRequest): string | InvalidArguments => {
  const body = "{\"bundle\":" + JSON.stringify(req.bundle)
  if ("executionId" in req) return body + ",\"execution_id\":" + JSON.stringify(req.executionId) + "}"
  const cases: Array<string> = []
  for (let i = 0; i < req.cases.length; i++) {
    const c = req.cases[i]!
    let item = "{\"target\":" + JSON.stringify(c.target)
    if (c.name !== undefined) item += ",\"name\":" + JSON.stringify(c.name)
    if (c.kind !== undefined) item += ",\"kind\":" + JSON.stringify(c.kind)
    if (c.args !== undefined) {
      const encoded = stringifyStrict(c.args)
      if (encoded._tag === "Invalid") {
        const path = `cases[${i}].args` + encoded.path.slice(1)
        return new InvalidArguments({ target: agentId, path, reason: encoded.reason })
      }
      item += ",\"args\":" + encoded.json
    }
    if (c.agentId !== undefined) item += ",\"agent_id\":" + JSON.stringify(c.agentId)
    if (c.expect !== undefined) item += ",\"expect\":" + JSON.stringify(c.expect)
    if (c.expectRule !== undefined) item += ",\"expect_rule\":" + JSON.stringify(c.expectRule)
    cases.push(item + "}")
  }
  return body + ",\"cases\":[" + cases.join(",") + "]}"
}

const DEFAULT_EVENTS_PAGE = 100
const MAX_EVENTS_PAGE = 1000

/** The events page size the kernel will actually use (PROTOCOL.md 11.5). */
const clampEventsLimit = (limit: number | undefined): number =>
  limit === undefined || !(limit >= 1) ? DEFAULT_EVENTS_PAGE : Math.min(Math.floor(limit), MAX_EVENTS_PAGE)

/** A path segment as the kernel routes it (Go's canonical escaping). */
const seg = Path.segment

const nonEmpty = (s: string | undefined): s is string => s !== undefined && s !== ""

const query = (params: ReadonlyArray<readonly [string, string | number | undefined]>): string => {
  let out = ""
  for (const [key, value] of params) {
    if (value === undefined || value === "") continue
    out += (out === "" ? "?" : "&") + key + "=" + encodeURIComponent(String(value))
  }
  return out
}

const NO_STACK_TRACE = { captureStackTrace: false } as const

const invalidOption = (message: string): Config.ConfigError =>
  new Config.ConfigError(new ConfigProvider.SourceError({ message }))

/**
 * Build the HTTP client from options, on the `HttpClient` in context. Fails
 * with a `ConfigError` when the base URL is missing or unusable.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: (options: Options) => Effect.Effect<Client.Service, Config.ConfigError, HttpClient.HttpClient> =
  Effect.fnUntraced(function*(options: Options) {
    const base = Http.normalizeBaseUrl(options.baseUrl)
    if (Result.isFailure(base)) return yield* Effect.fail(invalidOption(`baseUrl ${base.failure}`))
    const baseUrl = base.success.url
    const apiKey = options.apiKey === undefined
      ? undefined
      : Redacted.isRedacted(options.apiKey)
      ? options.apiKey
      : Redacted.make(options.apiKey)
    const timeout = options.timeout === undefined ? defaultTimeout : Duration.fromInputUnsafe(options.timeout)
    const httpClient = yield* HttpClient.HttpClient
    const client = options.transformClient === undefined ? httpClient : options.transformClient(httpClient)

    const request = (
      method: "GET" | "POST" | "DELETE",
      path: string,
      body?: string
    ): HttpClientRequest.HttpClientRequest => {
      let req = HttpClientRequest.make(method)(baseUrl + path)
      if (apiKey !== undefined && Redacted.value(apiKey) !== "") req = HttpClientRequest.bearerToken(req, apiKey)
      return body === undefined ? req : HttpClientRequest.setBody(req, HttpBody.text(body, "application/json"))
    }

    /** One exchange; answers ≥ 300 become `StatusError`s unless `recover` accepts them. */
    const exchange = <A>(
      req: HttpClientRequest.HttpClientRequest,
      onSuccess: (reply: Http.Reply) => Effect.Effect<A, KernelError>,
      recover?: (failure: Http.ApiFailure) => Option.Option<A>
    ): Effect.Effect<A, KernelError> =>
      Effect.flatMap(Http.send(client, req, timeout), (reply): Effect.Effect<A, KernelError> => {
        if (reply.status < 300) return onSuccess(reply)
        const failure = Http.apiFailure(reply)
        if (recover !== undefined) {
          const recovered = recover(failure)
          if (Option.isSome(recovered)) return Effect.succeed(recovered.value)
        }
        return Effect.fail(Http.statusError(failure))
      })

    const span = (name: string, attributes?: Record<string, string>) =>
      Effect.withSpan(
        `Client.${name}`,
        attributes === undefined ? { kind: "client" } : { kind: "client", attributes },
        NO_STACK_TRACE
      )

    const unit = () => Effect.void
    const executionPath = (id: string) => "/v0/executions/" + seg(id)

    const get = (executionId: string) =>
      exchange(request("GET", executionPath(executionId)), decodeExecution).pipe(
        Http.retryTransport,
        span("get", { "rebuno.execution_id": executionId })
      )

    const list = (options?: ListOptions) =>
      exchange(
        request(
          "GET",
          "/v0/executions" + query([
            ["agent_id", options?.agentId],
            ["session", options?.session],
            ["status", options?.status],
            ["cursor", options?.cursor],
            ["limit", options?.limit]
          ])
        ),
        decodeExecutionPage
      ).pipe(Http.retryTransport, span("list"))

    const events = (executionId: string, options?: EventsOptions) =>
      exchange(
        request(
          "GET",
          executionPath(executionId) + "/events" +
            query([["after_seq", options?.afterSeq ?? 0], ["limit", options?.limit ?? DEFAULT_EVENTS_PAGE]])
        ),
        decodeEvents
      ).pipe(Http.retryTransport, span("events", { "rebuno.execution_id": executionId }))

    /**
     * Cancel. `409 execution_terminal` (seed stage, v0.14.0) counts as done. A
     * current-stage kernel answers `409 conflict` instead (PROTOCOL-CURRENT
     * C.10), which stays an error — except after a try lost in transit, when
     * the execution reading `cancelled` shows that try succeeded.
     */
    const cancel = (executionId: string) =>
      Effect.suspend(() => {
        let uncertain = false
        const attempt = exchange(
          request("POST", executionPath(executionId) + "/cancel"),
          unit,
          (failure) => failure.code === "execution_terminal" ? Option.some(undefined) : Option.none()
        ).pipe(
          Effect.tapError((e) =>
            Effect.sync(() => {
              if (Http.isTransportFailure(e)) uncertain = true
            })
          ),
          Http.retryTransport
        )
        return Effect.catchIf(
          attempt,
          (e) => uncertain && e.reason._tag === "StatusError" && e.code === "conflict",
          (e) => Effect.flatMap(get(executionId), (execution) =>
            execution.status === "cancelled" ? Effect.void : Effect.fail(e))
        )
      }).pipe(span("cancel", { "rebuno.execution_id": executionId }))

    const getApproval = (approvalId: string) =>
      exchange(request("GET", "/v0/approvals/" + seg(approvalId)), decodeApproval).pipe(
        Http.retryTransport,
        span("getApproval", { "rebuno.approval_id": approvalId })
      )

    /**
     * Grant / deny. A repeat after a lost answer gets `409 conflict`; when an
     * earlier try failed in transit, a conflict whose approval now shows the
     * requested outcome is that earlier try's success (PROTOCOL.md 15.2).
     */
    const decide = (verb: "grant" | "deny", approvalId: string, decision: ApprovalDecision) =>
      Effect.suspend(() => {
        let uncertain = false
        const body = JSON.stringify(
          decision.rationale === undefined
            ? { decided_by: decision.decidedBy }
            : { decided_by: decision.decidedBy, rationale: decision.rationale }
        )
        const attempt = exchange(request("POST", "/v0/approvals/" + seg(approvalId) + "/" + verb, body), unit).pipe(
          Effect.tapError((e) =>
            Effect.sync(() => {
              if (Http.isTransportFailure(e)) uncertain = true
            })
          ),
          Http.retryTransport
        )
        const expected = verb === "grant" ? "granted" : "denied"
        return Effect.catchIf(
          attempt,
          (e) => uncertain && e.reason._tag === "StatusError" && e.code === "conflict",
          (e) =>
            Effect.flatMap(
              getApproval(approvalId),
              (approval) => approval.status === expected && approval.decidedBy === decision.decidedBy
                ? Effect.void
                : Effect.fail(e)
            )
        )
      }).pipe(span(verb === "grant" ? "grantApproval" : "denyApproval", { "rebuno.approval_id": approvalId }))

    const follow = (executionId: string, options?: FollowOptions): Stream.Stream<Protocol.Event, KernelError> => {
      const interval = options?.pollInterval === undefined
        ? defaultPollInterval
        : Duration.fromInputUnsafe(options.pollInterval)
      const limit = clampEventsLimit(options?.limit)
      interface State {
        readonly afterSeq: number
        /** Sleep before this poll (caught up on the previous one). */
        readonly wait: boolean
        /** The execution was seen terminal: drain the remaining events, then end. */
        readonly terminal: boolean
      }
      const poll = (state: State) =>
        Effect.gen(function*() {
          if (state.wait) yield* Effect.sleep(interval)
          // Read the status before the events: once it is terminal, every event up to the end
          // is already stored, so draining after it misses nothing.
          const terminal = state.terminal || Protocol.isTerminalStatus((yield* get(executionId)).status)
          const page = yield* events(executionId, { afterSeq: state.afterSeq, limit })
          const afterSeq = page.length === 0 ? state.afterSeq : page[page.length - 1]!.eventSeq
          const next: Option.Option<State> = terminal
            ? (page.length === 0 ? Option.none() : Option.some({ afterSeq, wait: false, terminal }))
            : Option.some({ afterSeq, wait: page.length < limit, terminal })
          return [page, next] as const
        })
      return Stream.paginate<State, Protocol.Event, KernelError>(
        { afterSeq: options?.afterSeq ?? 0, wait: false, terminal: false },
        poll
      )
    }

    const liveDelta = (status: number, data: string): Effect.Effect<Protocol.LiveDelta, KernelError> => {
      const parsed = Http.parseJson(data)
      if (Result.isFailure(parsed)) {
        return Effect.fail(Http.decodeError(status, `live delta is not JSON: ${parsed.failure}`))
      }
      const delta = decodeLiveDelta(parsed.success)
      return Result.isSuccess(delta)
        ? Effect.succeed(delta.success)
        : Effect.fail(Http.decodeError(status, "live delta has an unexpected shape"))
    }

    const deltas = (executionId: string): Stream.Stream<Protocol.LiveDelta, KernelError> =>
      Stream.unwrap(
        Effect.gen(function*() {
          const req = request("GET", executionPath(executionId) + "/stream").pipe(
            HttpClientRequest.setHeader("accept", "text/event-stream")
          )
          const response = yield* client.execute(req).pipe(
            Effect.mapError(Http.transportError),
            Effect.timeoutOrElse({ duration: timeout, orElse: () => Effect.fail(Http.timeoutError(timeout)) })
          )
          if (response.status >= 300) {
            const text = yield* response.text.pipe(Effect.orElseSucceed(() => ""))
            return yield* Effect.fail(Http.statusError(Http.apiFailure({ status: response.status, text })))
          }
          const parser = Http.makeSseParser()
          return response.stream.pipe(
            Stream.mapError(Http.transportError),
            Stream.decodeText(),
            Stream.map(parser.feed),
            Stream.flattenIterable,
            Stream.mapEffect((data) => liveDelta(response.status, data))
          )
        })
      )

    return Client.of({
      create: (agentId, input, options) =>
        Effect.suspend((): Effect.Effect<Protocol.Execution, KernelError | InvalidArguments> => {
          let body = "{\"agent_id\":" + JSON.stringify(agentId)
          if (input !== undefined) {
            const encoded = stringifyStrict(input)
            if (encoded._tag === "Invalid") {
              return Effect.fail(
                new InvalidArguments({ target: agentId, path: encoded.path, reason: encoded.reason })
              )
            }
            body += ",\"input\":" + encoded.json
          }
          if (nonEmpty(options?.session)) body += ",\"session\":" + JSON.stringify(options.session)
          if (nonEmpty(options?.parentExecutionId)) {
            body += ",\"parent_execution_id\":" + JSON.stringify(options.parentExecutionId)
          }
          if (nonEmpty(options?.idempotencyKey)) {
            body += ",\"idempotency_key\":" + JSON.stringify(options.idempotencyKey)
          }
          const spawnedBy = options?.spawnedBy
          if (spawnedBy !== undefined) {
            body += ",\"spawned_by\":{\"execution_id\":" + JSON.stringify(spawnedBy.executionId) +
              ",\"step_id\":" + JSON.stringify(spawnedBy.stepId) + "}"
          }
          if (nonEmpty(options?.agentVersion)) body += ",\"agent_version\":" + JSON.stringify(options.agentVersion)
          body += "}"
          const send = exchange(request("POST", "/v0/executions", body), decodeExecution)
          // A repeat with an idempotency key answers the execution the first try created (C.4.1 step 4).
          return nonEmpty(options?.idempotencyKey) || spawnedBy !== undefined ? Http.retryTransport(send) : send
        }).pipe(span("create", { "rebuno.agent_id": agentId })),
      get,
      previous: (executionId) =>
        exchange(request("GET", executionPath(executionId) + "/previous"), decodePrevious).pipe(
          Effect.map((answer) => answer.state ?? null),
          Http.retryTransport,
          span("previous", { "rebuno.execution_id": executionId })
        ),
      fork: (executionId, options) =>
        Effect.suspend(() => {
          let body = "{\"at_seq\":" + JSON.stringify(options.atSeq)
          if (nonEmpty(options.session)) body += ",\"session\":" + JSON.stringify(options.session)
          if (nonEmpty(options.policyBundle)) body += ",\"policy_bundle\":" + JSON.stringify(options.policyBundle)
          return exchange(request("POST", executionPath(executionId) + "/fork", body + "}"), decodeExecution)
        }).pipe(span("fork", { "rebuno.execution_id": executionId })),
      forkPoints: (executionId) =>
        exchange(request("GET", executionPath(executionId) + "/fork-points"), decodeForkPoints).pipe(
          Http.retryTransport,
          span("forkPoints", { "rebuno.execution_id": executionId })
        ),
      list,
      listAll: (options) =>
        Stream.paginate<string | undefined, Protocol.Execution, KernelError>(
          options?.cursor,
          (cursor) =>
            Effect.map(list({ ...options, cursor }), (page) =>
              [
                page.executions,
                page.nextCursor === undefined ? Option.none() : Option.some(page.nextCursor)
              ] as const)
        ),
      cancel,
      events,
      follow,
      deltas,
      listSteps: (executionId, options) =>
        exchange(
          request(
            "GET",
            executionPath(executionId) + "/steps" + (options?.status === "terminal" ? "?status=terminal" : "")
          ),
          decodeSteps
        ).pipe(Http.retryTransport, span("listSteps", { "rebuno.execution_id": executionId })),
      getStep: (executionId, stepId) =>
        exchange(request("GET", executionPath(executionId) + "/steps/" + seg(stepId)), decodeStep).pipe(
          Http.retryTransport,
          span("getStep", { "rebuno.execution_id": executionId, "rebuno.step_id": stepId })
        ),
      listApprovals: () =>
        exchange(request("GET", "/v0/approvals"), decodeApprovals).pipe(Http.retryTransport, span("listApprovals")),
      getApproval,
      grantApproval: (approvalId, decision) => decide("grant", approvalId, decision),
      denyApproval: (approvalId, decision) => decide("deny", approvalId, decision),
      registerAgent: (registration) =>
        Effect.suspend(() => {
          const secret = Redacted.isRedacted(registration.secret)
            ? Redacted.value(registration.secret)
            : registration.secret
          const body = JSON.stringify(
            registration.leaseTimeoutSeconds === undefined
              ? { id: registration.id, webhook_url: registration.webhookUrl, secret }
              : {
                id: registration.id,
                webhook_url: registration.webhookUrl,
                secret,
                lease_timeout_seconds: registration.leaseTimeoutSeconds
              }
          )
          return exchange(request("POST", "/v0/agents", body), decodeAgent).pipe(Http.retryTransport)
        }).pipe(span("registerAgent", { "rebuno.agent_id": registration.id })),
      listAgents: () =>
        exchange(request("GET", "/v0/agents"), decodeAgents).pipe(Http.retryTransport, span("listAgents")),
      getAgent: (agentId) =>
        exchange(request("GET", "/v0/agents/" + seg(agentId)), decodeAgent).pipe(
          Http.retryTransport,
          span("getAgent", { "rebuno.agent_id": agentId })
        ),
      deleteAgent: (agentId) =>
        exchange(request("DELETE", "/v0/agents/" + seg(agentId)), unit).pipe(
          Http.retryTransport,
          span("deleteAgent", { "rebuno.agent_id": agentId })
        ),
      loadPolicy: (agentId, bundle) =>
        exchange(request("POST", "/v0/policies/" + seg(agentId), JSON.stringify({ bundle })), unit).pipe(
          Http.retryTransport,
          span("loadPolicy", { "rebuno.agent_id": agentId })
        ),
      testPolicy: (agentId, testRequest) =>
        Effect.suspend((): Effect.Effect<PolicyTestResult, KernelError | InvalidArguments> => {
          const body = policyTestBody(agentId, testRequest)
          if (body instanceof InvalidArguments) return Effect.fail(body)
          // Nothing is stored: a repeat is safe.
          return exchange(request("POST", "/v0/policies/" + seg(agentId) + "/test", body), decodePolicyTest).pipe(
            Http.retryTransport
          )
        }).pipe(span("testPolicy", { "rebuno.agent_id": agentId })),
      createApiKey: (keyRequest) =>
        exchange(
          request("POST", "/v0/api-keys", JSON.stringify({ name: keyRequest.name, scopes: keyRequest.scopes })),
          decodeApiKeyWithToken
        ).pipe(span("createApiKey")),
      listApiKeys: () =>
        exchange(request("GET", "/v0/api-keys"), decodeApiKeys).pipe(Http.retryTransport, span("listApiKeys")),
      rotateApiKey: (keyId) =>
        exchange(request("POST", "/v0/api-keys/" + seg(keyId) + "/rotate"), decodeApiKeyWithToken).pipe(
          Http.retryTransport,
          span("rotateApiKey", { "rebuno.api_key_id": keyId })
        ),
      deleteApiKey: (keyId) =>
        exchange(request("DELETE", "/v0/api-keys/" + seg(keyId)), unit).pipe(
          Http.retryTransport,
          span("deleteApiKey", { "rebuno.api_key_id": keyId })
        )
    })
  })

/**
 * The HTTP client as a Layer, on the `HttpClient` in context.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options): Layer.Layer<Client, Config.ConfigError, HttpClient.HttpClient> =>
  Layer.effect(Client, make(options))

/**
 * The settings from the environment: `REBUNO_URL` (required, non-empty) and
 * `REBUNO_API_KEY` (optional, read as a `Redacted`; an empty value means none).
 *
 * @since 0.2.0
 * @category layers
 */
export const fromEnv: Config.Config<Settings> = Config.all({
  baseUrl: Config.NonEmptyString("REBUNO_URL"),
  apiKey: Config.option(Config.Redacted("REBUNO_API_KEY")).pipe(
    Config.map((key) => Option.getOrUndefined(Option.filter(key, (k) => Redacted.value(k) !== "")))
  )
})

/**
 * The HTTP client configured with `Config`: by default {@link fromEnv}
 * (`REBUNO_URL`, `REBUNO_API_KEY`). Pass `settings` (a `Config` per member,
 * or one `Config` of them all) to read them elsewhere; `options` gives the
 * settings a `Config` cannot hold.
 *
 * **Example** (The kernel URL from another variable, no API key)
 *
 * ```ts
 * import { NodeHttpClient } from "@effect/platform-node"
 * import { Config, Layer } from "effect"
 * import { Client } from "effect-rebuno"
 *
 * const ClientLive = Client.layerConfig({
 *   baseUrl: Config.NonEmptyString("KERNEL_URL"),
 *   apiKey: Config.succeed(undefined)
 * }, { timeout: "10 seconds" }).pipe(Layer.provide(NodeHttpClient.layerUndici))
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layerConfig = (
  settings: Config.Wrap<Settings> = fromEnv,
  options?: Omit<Options, keyof Settings> | undefined
): Layer.Layer<Client, Config.ConfigError, HttpClient.HttpClient> =>
  Layer.effect(Client, Effect.flatMap(Config.unwrap(settings), (s) => make({ ...options, ...s })))
