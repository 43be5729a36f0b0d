/**
 * The step protocol of PROTOCOL.md 14.4 and 7.2, shared by `Step`, `Tool` and
 * (for submission and decision handling) the LLM wrapper: check the arguments
 * are JSON before anything is sent, submit, turn every decision into a value or
 * a typed error, run the body on `proceed`, record its outcome, and decode the
 * recorded outcome on `replay`.
 *
 * @since 0.1.0
 * @internal
 */
import { Cause, Effect, Exit, ParseResult, Schema } from "effect"
import { Execution } from "../Execution.js"
import type * as Protocol from "../Protocol.js"
import {
  Abandoned,
  Blocked,
  InvalidArguments,
  isRunSignal,
  KernelError,
  LeaseSuperseded,
  PolicyError,
  RateLimited,
  StepDecodeError,
  Terminated,
  ToolError
} from "../RebunoError.js"
import type { RunSignal } from "../RebunoError.js"
import { stringifyStrict } from "./json.js"
import { decodeRefusal, describeRecordedError, messageOf } from "./failureReason.js"
import type { StepFailureRecord } from "./runtime.js"
import { isTransportFailure } from "./http.js"

/**
 * How a step may be re-run when its earlier run died mid-body.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export type Idempotency = "safe_to_retry" | "at_most_once"

/**
 * What a step body learns about the step it runs as.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export interface StepContext {
  /** The kernel's step id: pass it to providers as an idempotency key. */
  readonly stepId: string
  readonly kind: string
  readonly target: string
  readonly idempotency: Idempotency
}

/**
 * Every error a step itself can raise (besides a typed failure).
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export type StepError =
  | PolicyError
  | RateLimited
  | Blocked
  | Terminated
  | LeaseSuperseded
  | Abandoned
  | ToolError
  | InvalidArguments
  | StepDecodeError
  | KernelError

/**
 * A submission's answer once the refusals have become errors.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export type Admission =
  | { readonly _tag: "Proceed"; readonly stepId: string }
  | {
    readonly _tag: "Replay"
    readonly stepId: string
    /** `null` when the kernel sent no result. */
    readonly result: unknown
    /** `undefined` when the kernel sent no error, or `null`. */
    readonly error: unknown
  }

/**
 * What is submitted.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export interface Submission {
  readonly kind: string
  readonly target: string
  readonly args: unknown
  readonly idempotency: Idempotency
}

const unexpected = (decision: string) =>
  new KernelError({ reason: "Decode", description: `unexpected step decision: ${decision}` })

/** Record a signal on the run and fail with it. */
const signal = <S extends RunSignal>(execution: Execution.Service, s: S): Effect.Effect<never, S> =>
  Effect.zipRight(execution.raise(s), Effect.fail(s))

/**
 * Check the arguments are JSON (nothing is sent otherwise), submit, and map the
 * decision (table 7.2). A transport failure of the submit abandons the run: a
 * submit is never retried (15.1).
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const submit = Effect.fnUntraced(function*(execution: Execution.Service, submission: Submission) {
  const args = stringifyStrict(submission.args)
  if (args._tag === "Invalid") {
    return yield* new InvalidArguments({ target: submission.target, path: args.path, reason: args.reason })
  }
  const decision = yield* execution.kernel.submitStep(execution.caller, execution.executionId, {
    kind: submission.kind,
    target: submission.target,
    argsJson: args.json,
    idempotency: submission.idempotency
  }).pipe(
    Effect.catchTags({
      KernelError: (e) =>
        isTransportFailure(e) ?
          signal(execution, new Abandoned({ reason: `step submission failed: ${e.message}` })) :
          Effect.fail(e),
      PolicyError: (e) =>
        Effect.fail(
          e.target === undefined ? new PolicyError({ ...e, target: submission.target }) : e
        )
    })
  )
  return yield* admit(execution, submission.target, decision)
})

/**
 * Map a submit decision to an admission or a typed error (table 7.2).
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const admit = (
  execution: Execution.Service,
  target: string,
  decision: Protocol.StepDecision
): Effect.Effect<Admission, StepError> => {
  switch (decision.decision) {
    case "proceed":
      return decision.stepId === undefined ?
        Effect.fail(new KernelError({ reason: "Decode", description: "proceed decision without step_id" })) :
        Effect.succeed({ _tag: "Proceed", stepId: decision.stepId })
    case "replay":
      return Effect.succeed({
        _tag: "Replay",
        stepId: decision.stepId ?? "",
        result: decision.result === undefined ? null : decision.result,
        error: decision.error === null ? undefined : decision.error
      })
    case "denied":
      return Effect.fail(
        new PolicyError({
          reason: decision.reason ?? "denied by policy",
          target,
          ...(decision.stepId === undefined ? {} : { stepId: decision.stepId })
        })
      )
    case "blocked":
    case "execution_blocked":
      return signal(
        execution,
        new Blocked({
          ...(decision.approvalId === undefined ? {} : { approvalId: decision.approvalId }),
          ...(decision.stepId === undefined ? {} : { stepId: decision.stepId })
        })
      )
    case "rate_limited":
      return Effect.fail(new RateLimited({ reason: decision.reason ?? "rate_limit_exceeded", target }))
    case "execution_terminal":
      return signal(execution, new Terminated())
    default:
      return Effect.fail(unexpected(decision.decision))
  }
}

/** Map the answer to a step complete / fail (7.2: `recorded` or informational `replay`). */
const settled = (
  execution: Execution.Service,
  decision: Protocol.StepDecision
): Effect.Effect<void, Terminated | KernelError> => {
  switch (decision.decision) {
    case "recorded":
    case "replay":
      return Effect.void
    case "execution_terminal":
      return signal(execution, new Terminated())
    default:
      return Effect.fail(unexpected(decision.decision))
  }
}

/**
 * `POST …/complete`. Transport failures left after the client's retries
 * abandon the run (15.1).
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const complete = (
  execution: Execution.Service,
  stepId: string,
  resultJson: string
): Effect.Effect<void, LeaseSuperseded | Terminated | KernelError | Abandoned> =>
  execution.kernel.completeStep(execution.caller, execution.executionId, stepId, resultJson).pipe(
    Effect.flatMap((decision) => settled(execution, decision)),
    Effect.catchIf(
      (e): e is KernelError => isTransportFailure(e),
      (e) => signal(execution, new Abandoned({ reason: `step complete failed: ${e.message}` }))
    )
  )

/**
 * `POST …/fail` with the error object. Error answers are swallowed (14.4),
 * except the run signals (LeaseSuperseded, Terminated); a transport failure that
 * outlived the client's retries abandons the run (15.1), because carrying on
 * would leave the step `executing` with no outcome ever recorded.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const fail = (
  execution: Execution.Service,
  stepId: string,
  error: StepFailureRecord
): Effect.Effect<void, LeaseSuperseded | Terminated | Abandoned> =>
  execution.kernel.failStepWith(execution.caller, execution.executionId, stepId, error).pipe(
    Effect.flatMap((decision) => settled(execution, decision)),
    Effect.catchIf(
      (e): e is KernelError => e instanceof KernelError,
      (e) =>
        isTransportFailure(e)
          ? signal(execution, new Abandoned({ reason: `step fail failed: ${e.message}` }))
          : Effect.void
    )
  )

/**
 * Render a Schema parse error's first issue as `(path, message)`, the path in
 * the `$.a[0]` notation of `stringifyStrict`.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const firstIssue = (error: ParseResult.ParseError): { readonly path: string; readonly message: string } => {
  const issues = ParseResult.ArrayFormatter.formatErrorSync(error)
  const issue = issues[0]
  if (issue === undefined) return { path: "$", message: error.message }
  return { path: renderPath(issue.path), message: issue.message }
}

/**
 * Every issue of a parse error as `path: message` (path omitted at the root).
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const issueMessages = (error: ParseResult.ParseError): ReadonlyArray<string> =>
  ParseResult.ArrayFormatter.formatErrorSync(error).map((issue) =>
    issue.path.length === 0 ? issue.message : `${issue.path.map(String).join(".")}: ${issue.message}`
  )

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/

const renderPath = (path: ReadonlyArray<PropertyKey>): string => {
  let out = "$"
  for (const segment of path) {
    if (typeof segment === "number") out += `[${segment}]`
    else if (typeof segment === "string" && IDENTIFIER.test(segment)) out += `.${segment}`
    else out += `[${JSON.stringify(String(segment))}]`
  }
  return out
}

/**
 * The options of one step.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export interface StepOptions<A, E, R, I, RS, F, FI, RF> {
  readonly kind: string
  readonly target: string
  readonly args?: unknown
  readonly idempotency?: Idempotency | undefined
  readonly success?: Schema.Schema<A, I, RS> | undefined
  readonly failure?: Schema.Schema<F, FI, RF> | undefined
  readonly body: (context: StepContext) => Effect.Effect<A, E, R>
}

const isPropagated = (e: unknown): e is RunSignal | PolicyError | RateLimited =>
  isRunSignal(e) || e instanceof PolicyError || e instanceof RateLimited

/**
 * The whole step: submit → decision → run or replay → complete / fail.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const runStep = <A, E, R, I, RS, F, FI, RF>(
  options: StepOptions<A, E, R, I, RS, F, FI, RF>
): Effect.Effect<A, StepError | F, R | RS | RF | Execution> =>
  Effect.gen(function*() {
    const execution = yield* Execution
    const idempotency = options.idempotency ?? "safe_to_retry"
    const admission = yield* submit(execution, {
      kind: options.kind,
      target: options.target,
      args: options.args === undefined ? {} : options.args,
      idempotency
    })
    if (admission._tag === "Replay") {
      return yield* replay(options, admission)
    }
    const { stepId } = admission
    const exit = yield* Effect.exit(
      Effect.suspend(() => options.body({ stepId, kind: options.kind, target: options.target, idempotency }))
    )
    if (Exit.isSuccess(exit)) {
      const encoded = yield* encodeResult(options.success, exit.value)
      if (encoded._tag === "Ok") {
        yield* complete(execution, stepId, encoded.json)
        return exit.value
      }
      return yield* recordFailure(execution, options.target, stepId, encoded.message)
    }
    return yield* bodyFailed(execution, options, stepId, exit.cause)
  })

type Encoded = { readonly _tag: "Ok"; readonly json: string } | { readonly _tag: "Invalid"; readonly message: string }

const encodeResult = <A, I, RS>(
  schema: Schema.Schema<A, I, RS> | undefined,
  value: A
): Effect.Effect<Encoded, never, RS> => {
  const encoded: Effect.Effect<unknown, ParseResult.ParseError, RS> = schema === undefined ?
    Effect.succeed(value) :
    Schema.encode(schema)(value)
  return Effect.match(encoded, {
    onFailure: (error): Encoded => ({ _tag: "Invalid", message: `result does not encode: ${error.message}` }),
    onSuccess: (output): Encoded => {
      const checked = stringifyStrict(output === undefined ? null : output)
      return checked._tag === "Ok" ?
        checked :
        { _tag: "Invalid", message: `result is not JSON at ${checked.path}: ${checked.reason}` }
    }
  })
}

/** Fail the step with `{"message": …}` and raise the ToolError a replay would raise. */
const recordFailure = (
  execution: Execution.Service,
  target: string,
  stepId: string,
  message: string
): Effect.Effect<never, ToolError | LeaseSuperseded | Terminated | Abandoned> => {
  const error = { message }
  return Effect.zipRight(
    fail(execution, stepId, error),
    Effect.fail(new ToolError({ toolId: target, stepId, error, retryable: false, text: `${target}: ${message}` }))
  )
}

const bodyFailed = <A, E, R, I, RS, F, FI, RF>(
  execution: Execution.Service,
  options: StepOptions<A, E, R, I, RS, F, FI, RF>,
  stepId: string,
  cause: Cause.Cause<E>
): Effect.Effect<never, StepError | F, RF> => {
  if (Cause.isInterruptedOnly(cause)) return Effect.failCause(cause as Cause.Cause<never>)
  const failure = Cause.failureOption(cause)
  const error: unknown = failure._tag === "Some" ? failure.value : Cause.squash(cause)
  if (isPropagated(error)) return Effect.fail(error)
  const refusal = decodeRefusal(error)
  if (refusal !== undefined) {
    return isRunSignal(refusal) ? signal(execution, refusal) : Effect.fail(refusal)
  }
  const message = messageOf(error)
  const schema = options.failure
  if (failure._tag === "Some" && schema !== undefined && Schema.is(schema)(error)) {
    const typed: F = error
    const encoded: Effect.Effect<FI, ParseResult.ParseError, RF> = Schema.encode(schema)(typed)
    return Effect.matchEffect(encoded, {
      onFailure: (): Effect.Effect<never, StepError | F> => recordFailure(execution, options.target, stepId, message),
      onSuccess: (output): Effect.Effect<never, StepError | F> => {
        const record = { message, failure: output }
        return stringifyStrict(record)._tag === "Ok" ?
          Effect.zipRight(fail(execution, stepId, record), Effect.fail(typed)) :
          recordFailure(execution, options.target, stepId, message)
      }
    })
  }
  return recordFailure(execution, options.target, stepId, message)
}

const replay = <A, E, R, I, RS, F, FI, RF>(
  options: StepOptions<A, E, R, I, RS, F, FI, RF>,
  admission: Extract<Admission, { readonly _tag: "Replay" }>
): Effect.Effect<A, StepError | F, RS | RF> => {
  const { stepId } = admission
  const decodeError = (description: string) => new StepDecodeError({ target: options.target, stepId, description })
  if (admission.error !== undefined) {
    const recorded = admission.error
    const schema = options.failure
    if (
      schema !== undefined && typeof recorded === "object" && recorded !== null &&
      Object.prototype.hasOwnProperty.call(recorded, "failure")
    ) {
      return Schema.decodeUnknown(schema)((recorded as { readonly failure: unknown }).failure).pipe(
        Effect.mapError((e) => decodeError(`recorded failure does not decode: ${e.message}`)),
        Effect.flatMap((typed) => Effect.fail(typed))
      )
    }
    return Effect.fail(
      new ToolError({
        toolId: options.target,
        stepId,
        error: recorded,
        retryable: false,
        text: `${options.target}: ${describeRecordedError(recorded)}`
      })
    )
  }
  if (options.success === undefined) return Effect.succeed(admission.result as A)
  return Schema.decodeUnknown(options.success)(admission.result).pipe(
    Effect.mapError((e) => decodeError(`recorded result does not decode: ${e.message}`))
  )
}
