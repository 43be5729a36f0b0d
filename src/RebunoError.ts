/**
 * The error family of effect-rebuno.
 *
 * Every outcome of a step decision that is not "run the body" or "here is the
 * recorded value" is a typed error in the `E` channel, so agents recover with
 * `Effect.catchTag`. Four of them are *signals* rather than failures:
 * `Blocked`, `Terminated`, `LeaseSuperseded` and `Abandoned` stop the run
 * without reporting an outcome to the kernel (PROTOCOL.md 14.3).
 *
 * A failed call to the kernel is one {@link KernelError} whose `reason` says
 * what went wrong ({@link TransportError}, {@link StatusError} or
 * {@link DecodeError}); branch on it with
 * `Effect.catchReason("KernelError", "StatusError", f)`.
 *
 * @since 0.1.0
 */
import { Predicate, Schema } from "effect"

/**
 * The mark every effect-rebuno error carries. A string, so that the guards in
 * this module hold across two copies of the package.
 *
 * @since 0.2.0
 * @category type ids
 */
export const TypeId = "~effect-rebuno/RebunoError" as const

/**
 * @since 0.2.0
 * @category type ids
 */
export type TypeId = typeof TypeId

/**
 * The kernel refused a step (a `denied` decision, or a `policy_denied` error
 * envelope). `reason` is the decision's reason, or `"denied by policy"` when
 * the kernel gave none.
 *
 * @since 0.1.0
 * @category errors
 */
export class PolicyError extends Schema.TaggedError<PolicyError>("effect-rebuno/PolicyError")("PolicyError", {
  reason: Schema.String,
  ruleId: Schema.optional(Schema.String),
  stepId: Schema.optional(Schema.String),
  target: Schema.optional(Schema.String)
}) {
  /** @since 0.2.0 */
  readonly [TypeId]: TypeId = TypeId
  override get message(): string {
    return this.reason
  }
}

/**
 * The kernel refused a step because a rate limit was exhausted
 * (`rate_limit_exceeded`) or the limiter failed closed
 * (`rate_limiter_unavailable`). Nothing was recorded.
 *
 * @since 0.1.0
 * @category errors
 */
export class RateLimited extends Schema.TaggedError<RateLimited>("effect-rebuno/RateLimited")("RateLimited", {
  reason: Schema.String,
  target: Schema.optional(Schema.String)
}) {
  /** @since 0.2.0 */
  readonly [TypeId]: TypeId = TypeId
  override get message(): string {
    return this.reason
  }
}

/**
 * Signal: the execution waits, and this run must end without an outcome
 * (`blocked` or `execution_blocked`). The run unwinds and posts nothing; the
 * kernel redelivers once the wait is over. It waits for
 *
 * - a human approval (`approvalId` is set);
 * - a rate limit (`reason` `rate_limit_exceeded`, no approval id): the
 *   execution was parked and stays running (PROTOCOL-CURRENT C.8.3);
 * - its subagents (`reason` `awaiting_steps`): the run suspended the
 *   execution (C.5.2).
 *
 * @since 0.1.0
 * @category signals
 */
export class Blocked extends Schema.TaggedError<Blocked>("effect-rebuno/Blocked")("Blocked", {
  approvalId: Schema.optional(Schema.String),
  stepId: Schema.optional(Schema.String),
  /** @since 0.2.0 */
  reason: Schema.optional(Schema.String)
}) {
  /** @since 0.2.0 */
  readonly [TypeId]: TypeId = TypeId
  override get message(): string {
    if (this.approvalId !== undefined) return `execution blocked awaiting approval ${this.approvalId}`
    switch (this.reason) {
      case undefined:
        return "execution blocked awaiting approval"
      case "rate_limit_exceeded":
        return "execution parked by a rate limit (rate_limit_exceeded)"
      case "awaiting_steps":
        return "execution suspended awaiting its subagents"
      default:
        return `execution blocked: ${this.reason}`
    }
  }
}

/**
 * Signal: the execution is terminal (completed, failed or cancelled). The run
 * unwinds silently.
 *
 * @since 0.1.0
 * @category signals
 */
export class Terminated extends Schema.TaggedError<Terminated>("effect-rebuno/Terminated")("Terminated", {}) {
  /** @since 0.2.0 */
  readonly [TypeId]: TypeId = TypeId
  override get message(): string {
    return "execution terminal"
  }
}

/**
 * Signal: this run's lease `(dispatch_id, dispatch_attempt)` is no longer the
 * current one (a newer delivery took over, or the execution blocked). The run
 * writes nothing more.
 *
 * @since 0.1.0
 * @category signals
 */
export class LeaseSuperseded extends Schema.TaggedError<LeaseSuperseded>("effect-rebuno/LeaseSuperseded")(
  "LeaseSuperseded",
  {}
) {
  /** @since 0.2.0 */
  readonly [TypeId]: TypeId = TypeId
  override get message(): string {
    return "dispatch lease superseded"
  }
}

/**
 * Signal: the run gave up after a call whose outcome is unknown and that is not
 * safe to retry (a step submission), or after retries ran out. The run stops
 * heartbeating so that the kernel redelivers after the lease lapses.
 *
 * @since 0.1.0
 * @category signals
 */
export class Abandoned extends Schema.TaggedError<Abandoned>("effect-rebuno/Abandoned")("Abandoned", {
  reason: Schema.String
}) {
  /** @since 0.2.0 */
  readonly [TypeId]: TypeId = TypeId
  override get message(): string {
    return `run abandoned: ${this.reason}`
  }
}

/**
 * A step's body failed, now or in a recorded earlier run. `error` is the
 * recorded error object (JSON); `message` starts with `<toolId>: `.
 *
 * @since 0.1.0
 * @category errors
 */
export class ToolError extends Schema.TaggedError<ToolError>("effect-rebuno/ToolError")("ToolError", {
  toolId: Schema.String,
  stepId: Schema.String,
  error: Schema.Unknown,
  retryable: Schema.Boolean,
  text: Schema.String
}) {
  /** @since 0.2.0 */
  readonly [TypeId]: TypeId = TypeId
  override get message(): string {
    return this.text
  }
  /**
   * `true` when the kernel could not know whether an `at_most_once` step took
   * effect (its earlier run died mid-body).
   */
  get indeterminate(): boolean {
    return typeof this.error === "object" && this.error !== null &&
      (this.error as { readonly reason?: unknown }).reason === "indeterminate"
  }
}

/**
 * A subagent's execution ended without output (PROTOCOL-CURRENT C.5.3): it
 * failed (`reason` `subagent_failed`) or was cancelled (`subagent_cancelled`).
 * `executionId` is the child execution and `failureReason` its
 * `failure_reason`; `target` and `stepId` name the calling step, whose
 * recorded error this is (so a replay raises the same error).
 *
 * @since 0.2.0
 * @category errors
 */
export class SubagentError extends Schema.TaggedError<SubagentError>("effect-rebuno/SubagentError")("SubagentError", {
  agentId: Schema.String,
  executionId: Schema.String,
  reason: Schema.String,
  failureReason: Schema.String,
  target: Schema.String,
  stepId: Schema.String
}) {
  /** @since 0.2.0 */
  readonly [TypeId]: TypeId = TypeId
  /** `true` when the child was cancelled rather than failed. */
  get cancelled(): boolean {
    return this.reason === "subagent_cancelled"
  }
  override get message(): string {
    return this.failureReason === ""
      ? `${this.target}: ${this.reason}`
      : `${this.target}: ${this.reason}: ${this.failureReason}`
  }
}

// ---------------------------------------------------------------------------
// KernelError and its reasons
// ---------------------------------------------------------------------------

/**
 * The kernel could not be reached, or its answer could not be read: a
 * connection error, a reset, a timeout. The caller cannot know whether the
 * kernel processed the request (PROTOCOL.md 15). The request is deliberately
 * not kept: its headers carry credentials.
 *
 * @since 0.2.0
 * @category kernel errors
 */
export class TransportError extends Schema.TaggedError<TransportError>("effect-rebuno/KernelError/TransportError")(
  "TransportError",
  {
    description: Schema.String,
    cause: Schema.optional(Schema.Defect())
  }
) {
  /** A transport failure is always worth another try of a call that is safe to repeat. */
  get isRetryable(): boolean {
    return true
  }
  override get message(): string {
    return `Transport: ${this.description}`
  }
}

/**
 * The kernel answered with an error status (PROTOCOL.md 13): `status` is the
 * HTTP status and `code` the envelope's code (`internal_error` when the body
 * had none).
 *
 * @since 0.2.0
 * @category kernel errors
 */
export class StatusError extends Schema.TaggedError<StatusError>("effect-rebuno/KernelError/StatusError")(
  "StatusError",
  {
    status: Schema.Number,
    code: Schema.optional(Schema.String),
    description: Schema.String
  }
) {
  /** A `5xx` answer leaves the outcome unknown (PROTOCOL.md 15); anything else is final. */
  get isRetryable(): boolean {
    return this.status >= 500
  }
  override get message(): string {
    return this.code === undefined
      ? `Status ${this.status}: ${this.description}`
      : `Status ${this.status} ${this.code}: ${this.description}`
  }
}

/**
 * The kernel answered, but not with what the protocol says it answers: a body
 * that is not JSON, does not match its schema, or an unknown step decision.
 *
 * @since 0.2.0
 * @category kernel errors
 */
export class DecodeError extends Schema.TaggedError<DecodeError>("effect-rebuno/KernelError/DecodeError")(
  "DecodeError",
  {
    status: Schema.optional(Schema.Number),
    description: Schema.String
  }
) {
  /** Asking again gets the same answer. */
  get isRetryable(): boolean {
    return false
  }
  override get message(): string {
    return this.status === undefined
      ? `Decode: ${this.description}`
      : `Decode ${this.status}: ${this.description}`
  }
}

/**
 * Why a call to the kernel failed.
 *
 * @since 0.2.0
 * @category kernel errors
 */
export type KernelErrorReason = TransportError | StatusError | DecodeError

/**
 * Schema of {@link KernelErrorReason}.
 *
 * @since 0.2.0
 * @category kernel errors
 */
export const KernelErrorReason: Schema.Union<[typeof TransportError, typeof StatusError, typeof DecodeError]> = Schema
  .Union([TransportError, StatusError, DecodeError])

/**
 * A call to the kernel failed. `reason` says how: {@link TransportError}
 * (connection, timeout), {@link StatusError} (an error answer, with the HTTP
 * status and the kernel's code) or {@link DecodeError} (an answer that could
 * not be decoded). `message`, `isRetryable`, `status` and `code` delegate to
 * the reason.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Client } from "effect-rebuno"
 *
 * const program = Effect.gen(function*() {
 *   const client = yield* Client.Client
 *   return yield* client.get("missing")
 * }).pipe(
 *   Effect.catchReason("KernelError", "StatusError", (e) =>
 *     e.status === 404 ? Effect.succeed(undefined) : Effect.fail(e))
 * )
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export class KernelError extends Schema.TaggedError<KernelError>("effect-rebuno/KernelError")("KernelError", {
  reason: KernelErrorReason
}) {
  /** @since 0.2.0 */
  readonly [TypeId]: TypeId = TypeId
  override readonly cause = this.reason
  /** The HTTP status of the answer, when there was one. */
  get status(): number | undefined {
    return this.reason._tag === "TransportError" ? undefined : this.reason.status
  }
  /** The kernel's error code, for a {@link StatusError}. */
  get code(): string | undefined {
    return this.reason._tag === "StatusError" ? this.reason.code : undefined
  }
  /** `true` when the outcome of the call is unknown (PROTOCOL.md 15). */
  get isRetryable(): boolean {
    return this.reason.isRetryable
  }
  override get message(): string {
    return this.reason.message
  }
}

/**
 * Step arguments (or a result) are not JSON: `NaN`, `Infinity`, `undefined`,
 * functions, bigints, cycles or class instances. Raised before anything is
 * sent, because the kernel hashes the JSON text into the step id.
 *
 * @since 0.1.0
 * @category errors
 */
export class InvalidArguments extends Schema.TaggedError<InvalidArguments>("effect-rebuno/InvalidArguments")(
  "InvalidArguments",
  {
    target: Schema.String,
    path: Schema.String,
    reason: Schema.String
  }
) {
  /** @since 0.2.0 */
  readonly [TypeId]: TypeId = TypeId
  override get message(): string {
    return `${this.target}: arguments are not JSON at ${this.path}: ${this.reason}`
  }
}

/**
 * A recorded or fresh value could not be encoded or decoded with the step's
 * Schema (for example a replayed result from an older version of a tool).
 *
 * @since 0.1.0
 * @category errors
 */
export class StepDecodeError extends Schema.TaggedError<StepDecodeError>("effect-rebuno/StepDecodeError")(
  "StepDecodeError",
  {
    target: Schema.String,
    stepId: Schema.String,
    description: Schema.String
  }
) {
  /** @since 0.2.0 */
  readonly [TypeId]: TypeId = TypeId
  override get message(): string {
    return `${this.target}: ${this.description}`
  }
}

/**
 * A request signature did not verify.
 *
 * @since 0.1.0
 * @category errors
 */
export class SignatureError extends Schema.TaggedError<SignatureError>("effect-rebuno/SignatureError")(
  "SignatureError",
  { description: Schema.String }
) {
  /** @since 0.2.0 */
  readonly [TypeId]: TypeId = TypeId
  override get message(): string {
    return this.description
  }
}

/**
 * The signals that stop a run without reporting an outcome.
 *
 * @since 0.1.0
 * @category models
 */
export type RunSignal = Blocked | Terminated | LeaseSuperseded | Abandoned

/**
 * Every error effect-rebuno raises.
 *
 * @since 0.1.0
 * @category models
 */
export type RebunoError =
  | PolicyError
  | RateLimited
  | Blocked
  | Terminated
  | LeaseSuperseded
  | Abandoned
  | ToolError
  | KernelError
  | InvalidArguments
  | StepDecodeError
  | SignatureError
  | SubagentError

/**
 * Is this value an effect-rebuno error (from any copy of the package)?
 *
 * @since 0.2.0
 * @category refinements
 */
export const isRebunoError = (u: unknown): u is RebunoError => Predicate.hasProperty(u, TypeId)

const SIGNAL_TAGS: ReadonlySet<string> = new Set(["Blocked", "Terminated", "LeaseSuperseded", "Abandoned"])

/**
 * Is this value one of the run-stopping signals?
 *
 * @since 0.1.0
 * @category refinements
 */
export const isRunSignal = (u: unknown): u is RunSignal => isRebunoError(u) && SIGNAL_TAGS.has(u._tag)

/**
 * Is this value a {@link KernelError} (from any copy of the package)?
 *
 * @since 0.2.0
 * @category refinements
 */
export const isKernelError = (u: unknown): u is KernelError => isRebunoError(u) && u._tag === "KernelError"
