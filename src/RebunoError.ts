/**
 * The error family of effect-rebuno.
 *
 * Every outcome of a step decision that is not "run the body" or "here is the
 * recorded value" is a typed error in the `E` channel, so agents recover with
 * `Effect.catchTag`. Three of them are *signals* rather than failures:
 * `Blocked`, `Terminated` and `LeaseSuperseded` (plus `Abandoned`) stop the run
 * without reporting an outcome to the kernel (PROTOCOL.md 14.3).
 *
 * @since 0.1.0
 */
import { Schema } from "effect"

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
  override get message(): string {
    return this.reason
  }
}

/**
 * Signal: the execution is waiting for a human approval (`blocked` or
 * `execution_blocked`). The run unwinds and posts no outcome; the kernel
 * redelivers once the approval is decided.
 *
 * @since 0.1.0
 * @category signals
 */
export class Blocked extends Schema.TaggedError<Blocked>("effect-rebuno/Blocked")("Blocked", {
  approvalId: Schema.optional(Schema.String),
  stepId: Schema.optional(Schema.String)
}) {
  override get message(): string {
    return this.approvalId === undefined
      ? "execution blocked awaiting approval"
      : `execution blocked awaiting approval ${this.approvalId}`
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
 * A call to the kernel failed: the transport (connection, timeout, 5xx), an
 * error answer (`Status`, carrying the kernel's `code` and HTTP status), or an
 * answer that could not be decoded.
 *
 * @since 0.1.0
 * @category errors
 */
export class KernelError extends Schema.TaggedError<KernelError>("effect-rebuno/KernelError")("KernelError", {
  reason: Schema.Literal("Transport", "Status", "Decode"),
  status: Schema.optional(Schema.Number),
  code: Schema.optional(Schema.String),
  description: Schema.String,
  cause: Schema.optional(Schema.Defect)
}) {
  override get message(): string {
    const prefix = this.status === undefined ? this.reason : `${this.reason} ${this.status}`
    return this.code === undefined ? `${prefix}: ${this.description}` : `${prefix} ${this.code}: ${this.description}`
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

/**
 * Is this value one of the run-stopping signals?
 *
 * @since 0.1.0
 * @category refinements
 */
export const isRunSignal = (u: unknown): u is RunSignal =>
  u instanceof Blocked || u instanceof Terminated || u instanceof LeaseSuperseded || u instanceof Abandoned
