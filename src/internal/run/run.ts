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
import { Cause, Context, Duration, Effect, Formatter, identity, Option, Pull, Result, Schedule, Schema, SchemaIssue } from "effect"
import type { SchemaAST } from "effect"
import { Execution } from "../../Execution.js"
import type * as Protocol from "../../Protocol.js"
import {
  Abandoned,
  Blocked,
  DecodeError,
  InvalidArguments,
  isRunSignal,
  KernelError,
  LeaseSuperseded,
  PolicyError,
  RateLimited,
  StepDecodeError,
  Terminated,
  ToolError
} from "../../RebunoError.js"
import type { RunSignal } from "../../RebunoError.js"
import type { CheckpointRecords, KernelClient, StepSubmission } from "../../KernelClient.js"
import * as Codec from "../wire/codec.js"
import * as InProcess from "./inProcess.js"
import * as Tracing from "../http/tracing.js"
import { stringifyStrict } from "../wire/json.js"
import { decodeRefusal, describeRecordedError, messageOf, stepErrorRecord } from "./failureReason.js"
import { withinLease } from "./runtime.js"
import type { LeaseClock, StepFailureRecord } from "./runtime.js"
import { isTransportFailure } from "../http/exchange.js"
import * as Resources from "./resources.js"
import * as ReplayLog from "./replayLog.js"
import * as Suspension from "./suspension.js"

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
 * Every error a step itself can raise (besides a typed failure). A body that
 * meets a resource whose fork checkpoint is gone fails the step and raises
 * that `CheckpointUnavailable` (PROTOCOL-CURRENT C.6.8 #7).
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
  | Resources.CheckpointUnavailable

/**
 * A submission's answer once the refusals have become errors.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export type Admission =
  | {
    readonly _tag: "Proceed"
    readonly stepId: string
    /** The resources to capture after the body (PROTOCOL-CURRENT C.6.4); absent when none is due. */
    readonly due?: ReadonlyArray<Protocol.StepResource> | undefined
  }
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
  /** The keys of the resources the body may change (PROTOCOL-CURRENT C.6.4). */
  readonly resources?: ReadonlyArray<string> | undefined
}

const unexpected = (decision: string) =>
  new KernelError({ reason: new DecodeError({ description: `unexpected step decision: ${decision}` }) })

/**
 * The `Blocked` signal of a `blocked` / `execution_blocked` decision: with its
 * approval id, or with its reason (rate-limit parking, C.8.3).
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const blockedBy = (decision: Protocol.StepDecision): Blocked =>
  new Blocked({
    ...(decision.approvalId === undefined ? {} : { approvalId: decision.approvalId }),
    ...(decision.stepId === undefined ? {} : { stepId: decision.stepId }),
    ...(decision.approvalId !== undefined || decision.reason === undefined ? {} : { reason: decision.reason })
  })

/**
 * Record a signal on the run and fail with it.
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const signal = <S extends RunSignal>(execution: Execution.Service, s: S): Effect.Effect<never, S> =>
  Effect.andThen(execution.raise(s), Effect.fail(s))

/** The submission as sent, or why it cannot be: its arguments are not JSON (nothing is sent then). */
const prepare = (submission: Submission): StepSubmission | InvalidArguments => {
  const args = stringifyStrict(submission.args)
  if (args._tag === "Invalid") {
    return new InvalidArguments({ target: submission.target, path: args.path, reason: args.reason })
  }
  const resources = submission.resources
  return resources === undefined || resources.length === 0
    ? { kind: submission.kind, target: submission.target, argsJson: args.json, idempotency: submission.idempotency }
    : { kind: submission.kind, target: submission.target, argsJson: args.json, idempotency: submission.idempotency, resources }
}

/**
 * A submit that failed: a transport failure abandons the run (a submit is never
 * retried, 15.1); the kernel's signals are recorded on the run.
 */
const submitFailed = (execution: Execution.Service, target: string, e: SubmitError): Effect.Effect<never, StepError> =>
  e instanceof KernelError && isTransportFailure(e)
    ? signal(execution, new Abandoned({ reason: `step submission failed: ${e.message}` }))
    : e instanceof PolicyError && e.target === undefined
    ? Effect.fail(withTarget(e, target))
    : isAnswerSignal(e)
    ? signal(execution, e)
    : Effect.fail(e)

type SubmitError = KernelError | LeaseSuperseded | Terminated | PolicyError

/** A policy error the kernel answered for a submit, with the step's target. */
const withTarget = (e: PolicyError, target: string): PolicyError =>
  new PolicyError({
    reason: e.reason,
    ...(e.ruleId === undefined ? {} : { ruleId: e.ruleId }),
    ...(e.stepId === undefined ? {} : { stepId: e.stepId }),
    target
  })

/**
 * Check the arguments are JSON (nothing is sent otherwise), submit, and map the
 * decision (table 7.2).
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const submit = (
  execution: Execution.Service,
  submission: Submission
): Effect.Effect<Admission, StepError> => {
  const prepared = prepare(submission)
  if (prepared instanceof InvalidArguments) return Effect.fail(prepared)
  return submitted(
    execution,
    submission.target,
    callKernel(execution, (kernel) => kernel.submitStep(execution.caller, execution.executionId, prepared))
  )
}

/** The admission a submit call ends in; an answered submit renewed the lease (PROTOCOL.md 5.7). */
const submitted = (
  execution: Execution.Service,
  target: string,
  call: Effect.Effect<Protocol.StepDecision, SubmitError>
): Effect.Effect<Admission, StepError> =>
  Effect.matchEffect(call, {
    onFailure: (e) => submitFailed(execution, target, e),
    onSuccess: (decision) => {
      const lease = leaseOf(execution)
      return lease === undefined
        ? admit(execution, target, decision)
        : Effect.withFiber((fiber) => {
          renewedBy(lease, decision, InProcess.nowOf(fiber))
          return admit(execution, target, decision)
        })
    }
  })

/** The run's lease clock, when its kernel client is the run's own (see `runtime.ts`). */
const leaseOf = (execution: Execution.Service): LeaseClock | undefined => execution.kernel.unguarded?.lease

/** A submit answered at `now` renewed the lease, unless the execution was terminal (no lease check, 7.3 step 5). */
const renewedBy = (lease: LeaseClock, decision: Protocol.StepDecision, now: number): void => {
  if (decision.decision !== "execution_terminal") lease.renewed(now)
}

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
  const admitted = admission(execution, target, decision)
  return Effect.isEffect(admitted) ? admitted : Effect.succeed(admitted)
}

/** A `proceed` that touched resources: the due ones are captured after the body (C.6.4, C.6.5). */
const proceedWith = (stepId: string, resources: ReadonlyArray<Protocol.StepResource>): Admission => {
  const due = resources.filter((r) => r.due)
  return due.length === 0 ? { _tag: "Proceed", stepId } : { _tag: "Proceed", stepId, due }
}

/** {@link admit}, with the admission as a plain value. */
const admission = (
  execution: Execution.Service,
  target: string,
  decision: Protocol.StepDecision
): Admission | Effect.Effect<never, StepError> => {
  ReplayLog.decided(execution.kernel, decision.decision)
  switch (decision.decision) {
    case "proceed":
      return decision.stepId === undefined ?
        Effect.fail(new KernelError({ reason: new DecodeError({ description: "proceed decision without step_id" }) })) :
        decision.resources === undefined ?
        { _tag: "Proceed", stepId: decision.stepId } :
        proceedWith(decision.stepId, decision.resources)
    case "replay":
      return {
        _tag: "Replay",
        stepId: decision.stepId ?? "",
        result: decision.result === undefined ? null : decision.result,
        error: decision.error === null ? undefined : decision.error
      }
    case "denied":
      return Effect.fail(
        new PolicyError({
          reason: decision.reason ?? "denied by policy",
          target,
          ...(decision.ruleId === undefined ? {} : { ruleId: decision.ruleId }),
          ...(decision.stepId === undefined ? {} : { stepId: decision.stepId })
        })
      )
    case "blocked":
    case "execution_blocked":
      // Without an approval id, `blocked` is rate-limit parking (PROTOCOL-CURRENT C.8.3): the
      // execution stays running and is redelivered after the wait; the run ends quietly alike.
      return signal(execution, blockedBy(decision))
    case "rate_limited":
      return Effect.fail(new RateLimited({ reason: decision.reason ?? "rate_limit_exceeded", target }))
    case "execution_terminal":
      return signal(execution, new Terminated())
    default:
      return Effect.fail(unexpected(decision.decision))
  }
}

/**
 * Map the answer to a step complete / fail (7.2: `recorded` or informational
 * `replay`): `undefined` when the outcome is recorded, else the error.
 */
const settled = (
  execution: Execution.Service,
  decision: Protocol.StepDecision
): Effect.Effect<never, Terminated | KernelError> | undefined => {
  switch (decision.decision) {
    case "recorded":
    case "replay":
      return undefined
    case "execution_terminal":
      return signal(execution, new Terminated())
    default:
      return Effect.fail(unexpected(decision.decision))
  }
}

/** A signal the kernel answers with; recorded on the run (as the guarded client would). */
const isAnswerSignal = (e: unknown): e is LeaseSuperseded | Terminated =>
  e instanceof LeaseSuperseded || e instanceof Terminated

/**
 * Call the kernel from the step path: through the run's unguarded client when it
 * has one (refusing once the run has stopped; the caller records the signals the
 * kernel answers), else through the guarded one.
 */
const callKernel = <A, E>(
  execution: Execution.Service,
  call: (kernel: Pick<KernelClient.Service, "submitStep" | "completeStep">) => Effect.Effect<A, E>
): Effect.Effect<A, E | LeaseSuperseded> => {
  const direct = execution.kernel.unguarded
  if (direct === undefined) return call(execution.kernel)
  return direct.isStopped() ? Effect.fail(new LeaseSuperseded()) : call(direct.kernel)
}

/**
 * `POST …/complete`, then succeed with `value`. Transport failures are retried
 * while the run's lease can still be valid; one left after that abandons the
 * run (15.1).
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const complete = <A>(
  execution: Execution.Service,
  stepId: string,
  resultJson: string,
  value: A,
  capturing?: Effect.Effect<CheckpointRecords> | undefined
): Effect.Effect<A, LeaseSuperseded | Terminated | KernelError | Abandoned> => {
  if (capturing !== undefined) {
    // PROTOCOL-CURRENT C.6.5: the captures of the due resources go with the outcome.
    return Effect.flatMap(capturing, (records) =>
      completed(
        execution,
        withinLease(
          leaseOf(execution),
          callKernel(execution, (kernel) =>
            kernel.completeStep(execution.caller, execution.executionId, stepId, resultJson, records))
        ),
        value
      ))
  }
  const inProcess = inProcessSteps(execution)
  if (inProcess !== undefined) {
    return Effect.withFiber((fiber) => {
      const answer = inProcess.isStopped()
        ? Result.fail(new LeaseSuperseded())
        : inProcess.steps.completeStep(
          InProcess.nowOf(fiber),
          execution.caller,
          execution.executionId,
          stepId,
          resultJson
        )
      if (!Result.isResult(answer)) return completed(execution, withinLease(inProcess.lease, answer), value)
      return Result.isFailure(answer)
        ? completeFailed(execution, answer.failure)
        : (settled(execution, answer.success) ?? Effect.succeed(value))
    })
  }
  return completed(
    execution,
    withinLease(
      leaseOf(execution),
      callKernel(execution, (kernel) => kernel.completeStep(execution.caller, execution.executionId, stepId, resultJson))
    ),
    value
  )
}

const completed = <A>(
  execution: Execution.Service,
  call: Effect.Effect<Protocol.StepDecision, KernelError | LeaseSuperseded | Terminated>,
  value: A
): Effect.Effect<A, LeaseSuperseded | Terminated | KernelError | Abandoned> =>
  Effect.matchEffect(call, {
    onFailure: (e) => completeFailed(execution, e),
    onSuccess: (decision): Effect.Effect<A, Terminated | KernelError> => settled(execution, decision) ?? Effect.succeed(value)
  })

const completeFailed = (
  execution: Execution.Service,
  e: KernelError | LeaseSuperseded | Terminated
): Effect.Effect<never, LeaseSuperseded | Terminated | KernelError | Abandoned> =>
  e instanceof KernelError && isTransportFailure(e)
    ? signal(execution, new Abandoned({ reason: `step complete failed: ${e.message}` }))
    : isAnswerSignal(e)
    ? signal(execution, e)
    : Effect.fail(e)

/** The run's in-process step calls, when its kernel client has them (see `inProcess.ts`). */
const inProcessSteps = (
  execution: Execution.Service
): {
  readonly isStopped: () => boolean
  readonly steps: InProcess.InProcessSteps
  readonly lease: LeaseClock | undefined
} | undefined => {
  const direct = execution.kernel.unguarded
  if (direct === undefined) return undefined
  const steps = InProcess.stepsOf(direct.kernel)
  return steps === undefined ? undefined : { isStopped: direct.isStopped, steps, lease: direct.lease }
}

/**
 * `POST …/fail` with the error object. Error answers are swallowed (14.4),
 * except the run signals (LeaseSuperseded, Terminated); a transport failure that
 * outlived the retries (made while the lease can be valid) abandons the run
 * (15.1), because carrying on would leave the step `executing` with no outcome
 * ever recorded.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const fail = (
  execution: Execution.Service,
  stepId: string,
  error: StepFailureRecord,
  capturing?: Effect.Effect<CheckpointRecords> | undefined
): Effect.Effect<void, LeaseSuperseded | Terminated | Abandoned> =>
  (capturing === undefined
    ? execution.kernel.failStepWith(execution.caller, execution.executionId, stepId, error)
    : Effect.flatMap(
      capturing,
      (records) => execution.kernel.failStepWith(execution.caller, execution.executionId, stepId, error, records)
    )).pipe(
    Effect.flatMap((decision) => settled(execution, decision) ?? Effect.void),
    Effect.catchTag("KernelError", (e) =>
      isTransportFailure(e)
        ? signal(execution, new Abandoned({ reason: `step fail failed: ${e.message}` }))
        : Effect.void)
  )

/**
 * A schema failure: the error of `Schema.decode*` / `Schema.encode*`, or its
 * issue (`SchemaParser`).
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export type SchemaFailure = Schema.SchemaError | SchemaIssue.Issue

const issueOf = (failure: SchemaFailure): SchemaIssue.Issue =>
  Schema.isSchemaError(failure) ? failure.issue : failure

/** `Expected <what>`, with `, actual <input>` when the issue reports its input (Effect 3's wording). */
const expectedMessage = (expected: string, issue: SchemaIssue.Issue): string =>
  SchemaIssue.hasInput(issue)
    ? `Expected ${expected}, actual ${Formatter.format(issue.input)}`
    : `Expected ${expected}`

/**
 * The leaf messages of the issues we render, worded as Effect 3's
 * `ArrayFormatter` worded them: they end up in failure reasons and step errors
 * sent to the kernel (`input_invalid: prompt: Expected string, actual 1`).
 * Decode or encode with `{ reportInput: true }` to get the `actual` part.
 */
const leafHook: SchemaIssue.LeafHook = (issue) => {
  const message = SchemaIssue.defaultLeafHook(issue)
  switch (issue._tag) {
    case "MissingKey":
      return message === "Missing key" ? "is missing" : message
    case "UnexpectedKey":
      return message === "Expected no excess property" || message.startsWith("Unexpected key with value ")
        ? "is unexpected"
        : message
    case "Forbidden":
      return message === "Forbidden operation" ? "is forbidden" : message
    case "InvalidType":
    case "InvalidValue": {
      if (!SchemaIssue.hasInput(issue)) return message
      const got = `, got ${Formatter.format(issue.input)}`
      return message.startsWith("Expected ") && message.endsWith(got)
        ? `${message.slice(0, -got.length)}, actual ${Formatter.format(issue.input)}`
        : message
    }
    default:
      return message
  }
}

const checkExpected = (check: SchemaAST.Check<any>): string => {
  const expected = check.annotations?.expected
  if (typeof expected === "string") return expected
  return check._tag === "Filter" ? "<filter>" : check.checks.map(checkExpected).join(" & ")
}

/** A failed check, worded as {@link leafHook} words the leaves. */
const checkHook: SchemaIssue.CheckHook = (issue) => {
  const message = SchemaIssue.defaultCheckHook(issue)
  if (message !== undefined || issue.issue._tag !== "InvalidValue") return message
  const expected = issue.issue.annotations?.expected
  return typeof expected === "string"
    ? expectedMessage(expected, issue.issue)
    : expectedMessage(checkExpected(issue.filter), issue)
}

const formatter = SchemaIssue.makeFormatterStandardSchemaV1({ leafHook, checkHook })

const defaultFormatter = SchemaIssue.makeFormatterDefault()

type PathSegment = PropertyKey | { readonly key: PropertyKey }

const segmentKey = (segment: PathSegment): PropertyKey =>
  typeof segment === "object" && segment !== null ? segment.key : segment

const issuesOf = (failure: SchemaFailure) => formatter(issueOf(failure)).issues

/**
 * Render a Schema failure's first issue as `(path, message)`, the path in the
 * `$.a[0]` notation of `stringifyStrict`.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const firstIssue = (failure: SchemaFailure): { readonly path: string; readonly message: string } => {
  const issue = issuesOf(failure)[0]
  if (issue === undefined) return { path: "$", message: defaultFormatter(issueOf(failure)) }
  return { path: renderPath(issue.path ?? []), message: issue.message }
}

/**
 * Every issue of a Schema failure as `path: message` (path omitted at the root).
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const issueMessages = (failure: SchemaFailure): ReadonlyArray<string> =>
  issuesOf(failure).map((issue) =>
    issue.path === undefined || issue.path.length === 0
      ? issue.message
      : `${issue.path.map((segment) => String(segmentKey(segment))).join(".")}: ${issue.message}`
  )

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/

const renderPath = (path: ReadonlyArray<PathSegment>): string => {
  let out = "$"
  for (const s of path) {
    const segment = segmentKey(s)
    if (typeof segment === "number") out += `[${segment}]`
    else if (typeof segment === "string" && IDENTIFIER.test(segment)) out += `.${segment}`
    else out += `[${JSON.stringify(String(segment))}]`
  }
  return out
}

/**
 * The options of one step. `success` encodes the result before it is recorded
 * and decodes it on replay; `failure` does the same for a typed failure (so
 * each needs both its decoding and its encoding services: `RS`, `RF`).
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
  readonly success?: Schema.Codec<A, I, RS, RS> | undefined
  readonly failure?: Schema.Codec<F, FI, RF, RF> | undefined
  /**
   * The resources the body may change (PROTOCOL-CURRENT C.6.4): declared
   * resources or their keys.
   *
   * @since 0.2.0
   */
  readonly resources?: ReadonlyArray<{ readonly key: string } | string> | undefined
  /**
   * Retry a failed body on this schedule (see {@link retrying}): each attempt
   * is its own step, the decision to retry is recorded with the failure, and a
   * replay follows the recorded attempts without sleeping through the backoff.
   *
   * @since 0.2.0
   */
  readonly retry?: Schedule.Schedule<unknown, ToolError | F> | undefined
  readonly body: (context: StepContext) => Effect.Effect<A, E, R>
}

const isPropagated = (e: unknown): e is RunSignal | PolicyError | RateLimited =>
  isRunSignal(e) || e instanceof PolicyError || e instanceof RateLimited

/**
 * A step in a span: the execution context is read from the running fiber (a
 * missing one is a defect, as `yield* Execution` would be) and the span is made
 * only when a tracer records it (see `tracing.ts`).
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const tracedStep = <A, E, R>(
  spanName: string,
  spanOptions: Tracing.SpanOptions,
  step: (execution: Execution.Service) => Effect.Effect<A, E, R>
): Effect.Effect<A, E, R | Execution> =>
  Effect.withFiber<A, E, R | Execution>((fiber) =>
    Tracing.withSpanIn(fiber, spanName, spanOptions, step(Context.getUnsafe(fiber.context, Execution)))
  )

/**
 * The whole step, in a run whose execution context is at hand: submit →
 * decision → run or replay → complete / fail.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const runStepIn = <A, E, R, I, RS, F, FI, RF>(
  execution: Execution.Service,
  options: StepOptions<A, E, R, I, RS, F, FI, RF>
): Effect.Effect<A, StepError | F, R | RS | RF> => {
  const suspension = execution.suspension
  const step = suspension === undefined || !Suspension.isEnabled()
    ? runSteps(execution, options)
    : inFlight(suspension, runSteps(execution, options))
  // Tool calls and local steps run one at a time while the run has resources (C.6.8 #4); a step
  // waiting for its turn is not in flight yet, so that a subagent's suspension does not wait for it.
  return Resources.isEnabled() && options.kind !== "llm_call" ? Resources.exclusive(step) : step
}

/** The keys of a step's declared resources, `undefined` when it declares none. */
const resourceKeys = (
  resources: ReadonlyArray<{ readonly key: string } | string> | undefined
): ReadonlyArray<string> | undefined =>
  resources === undefined || resources.length === 0
    ? undefined
    : resources.map((r) => typeof r === "string" ? r : r.key)

/**
 * Count `step` as in flight for the run's suspension (PROTOCOL-CURRENT C.5.4
 * #2) while it runs — unless it runs inside another step's body, which counts
 * for it.
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const inFlight = <A, E, R>(
  suspension: Suspension.Suspension,
  step: Effect.Effect<A, E, R>
): Effect.Effect<A, E, R> =>
  Effect.withFiber((fiber) => {
    if (fiber.getRef(Suspension.InStepBody)) return step
    suspension.enter()
    return Effect.onExit(step, () => suspension.exit)
  })

/** The step, or its attempts when it has a `retry` schedule. */
const runSteps = <A, E, R, I, RS, F, FI, RF>(
  execution: Execution.Service,
  options: StepOptions<A, E, R, I, RS, F, FI, RF>
): Effect.Effect<A, StepError | F, R | RS | RF> =>
  options.retry === undefined ? runStep(execution, options) : retrying(execution, options, options.retry)

/**
 * The attempt a step runs as, under a `retry` schedule: its number (from 1),
 * the schedule's decision for a live failure (the epoch milliseconds of the
 * retry, or `undefined` to give up), and the schedule's bookkeeping for a
 * replayed failure that was retried.
 */
interface Attempts {
  readonly attempt: number
  readonly decide: (error: unknown) => Effect.Effect<number | undefined>
  readonly replayed: (error: unknown) => Effect.Effect<void>
}

const AttemptsKey: unique symbol = Symbol.for("effect-rebuno/internal/run/Attempts")

const attemptsOf = (options: object): Attempts | undefined =>
  (options as { readonly [AttemptsKey]?: Attempts })[AttemptsKey]

/** The options of one attempt. */
const withAttempts = <O extends object>(options: O, attempts: Attempts): O =>
  ({ ...options, [AttemptsKey]: attempts }) as O

/** A failed attempt that is retried at `at` (epoch milliseconds): never leaves {@link retrying}. */
class RetryAt {
  constructor(readonly at: number) {}
}

/**
 * A recorded failure raised on replay — unless it was retried (its record has
 * `retry_at_ms`): then the schedule is told, and the next attempt follows.
 */
const replayedFailure = <E>(options: object, recorded: unknown, error: E): Effect.Effect<never, E> => {
  const attempts = attemptsOf(options)
  const at = attempts === undefined || typeof recorded !== "object" || recorded === null
    ? undefined
    : (recorded as { readonly retry_at_ms?: unknown }).retry_at_ms
  if (attempts === undefined || typeof at !== "number") return Effect.fail(error)
  return Effect.andThen(attempts.replayed(error), Effect.fail(new RetryAt(at) as unknown as E))
}

/**
 * A step with a `retry` schedule: every attempt is a step of its own, with
 * the same kind, target and arguments — the kernel numbers them as it numbers
 * identical calls (PROTOCOL.md 8.4), so a replay meets them in the same order —
 * and a failed attempt records its number and, when the schedule retries it,
 * the epoch milliseconds of the retry (`{"message":…,"attempt":1,"retry_at_ms":…}`).
 * The recorded decision is what a replay follows: it does not ask the schedule
 * again (a time-based schedule could decide otherwise) and sleeps only until a
 * recorded retry time that has not passed yet — a replay long after the first
 * run does not sleep at all. Errors other than a failure of the body (denials,
 * signals, a result that is not JSON) end the attempts at once.
 */
const retrying = <A, E, R, I, RS, F, FI, RF>(
  execution: Execution.Service,
  options: StepOptions<A, E, R, I, RS, F, FI, RF>,
  schedule: Schedule.Schedule<unknown, ToolError | F>
): Effect.Effect<A, StepError | F, R | RS | RF> =>
  Effect.flatMap(Schedule.toStep(schedule), (step) => {
    const decide = (error: unknown): Effect.Effect<number | undefined> =>
      Effect.withFiber((fiber) => {
        const now = InProcess.nowOf(fiber)
        return Pull.matchEffect(step(now, error as ToolError | F), {
          onSuccess: ([, delay]) => Effect.succeed(now + Math.max(0, Math.ceil(Duration.toMillis(delay)))),
          onFailure: () => Effect.succeed(undefined),
          onDone: () => Effect.succeed(undefined)
        })
      })
    const replayed = (error: unknown): Effect.Effect<void> =>
      Effect.withFiber((fiber) => Effect.ignore(step(InProcess.nowOf(fiber), error as ToolError | F)))
    const attempt = (n: number): Effect.Effect<A, StepError | F, R | RS | RF> =>
      Effect.catch(
        runStep(execution, withAttempts(options, { attempt: n, decide, replayed })),
        (e): Effect.Effect<A, StepError | F, R | RS | RF> =>
          e instanceof RetryAt ? Effect.andThen(sleepUntil(e.at), attempt(n + 1)) : Effect.fail(e)
      )
    return attempt(1)
  })

/** Sleep until `at` (epoch milliseconds on the fiber's Clock); not at all when it has passed. */
const sleepUntil = (at: number): Effect.Effect<void> =>
  Effect.withFiber((fiber) => {
    const remaining = at - InProcess.nowOf(fiber)
    return remaining > 0 ? Effect.sleep(Duration.millis(remaining)) : Effect.void
  })

const runStep = <A, E, R, I, RS, F, FI, RF>(
  execution: Execution.Service,
  options: StepOptions<A, E, R, I, RS, F, FI, RF>
): Effect.Effect<A, StepError | F, R | RS | RF> => {
  const resources = resourceKeys(options.resources)
  const submission: Submission = {
    kind: options.kind,
    target: options.target,
    args: options.args === undefined ? {} : options.args,
    idempotency: options.idempotency ?? "safe_to_retry",
    ...(resources === undefined ? {} : { resources })
  }
  const inProcess = inProcessSteps(execution)
  if (inProcess === undefined) {
    return Effect.flatMap(submit(execution, submission), (admitted) => proceedOrReplay(execution, options, submission, admitted))
  }
  // An in-process kernel answers at once: submit as a plain call at the fiber's time.
  const prepared = prepare(submission)
  if (prepared instanceof InvalidArguments) return Effect.fail(prepared)
  return Effect.withFiber((fiber) => {
    const now = InProcess.nowOf(fiber)
    const answer = inProcess.isStopped()
      ? Result.fail(new LeaseSuperseded())
      : inProcess.steps.submitStep(now, execution.caller, execution.executionId, prepared)
    if (!Result.isResult(answer)) {
      return Effect.flatMap(
        submitted(execution, submission.target, answer),
        (admitted) => proceedOrReplay(execution, options, submission, admitted)
      )
    }
    if (Result.isFailure(answer)) return submitFailed(execution, submission.target, answer.failure)
    if (inProcess.lease !== undefined) renewedBy(inProcess.lease, answer.success, now)
    const admitted = admission(execution, submission.target, answer.success)
    return Effect.isEffect(admitted) ? admitted : proceedOrReplay(execution, options, submission, admitted)
  })
}

/** After the kernel admitted the step: decode the replayed outcome, or run the body and record its outcome. */
const proceedOrReplay = <A, E, R, I, RS, F, FI, RF>(
  execution: Execution.Service,
  options: StepOptions<A, E, R, I, RS, F, FI, RF>,
  submission: Submission,
  admission: Admission
): Effect.Effect<A, StepError | F, R | RS | RF> => {
  if (admission._tag === "Replay") return replay(options, admission)
  const { due, stepId } = admission
  const body = Effect.suspend(() =>
    options.body({ stepId, kind: options.kind, target: options.target, idempotency: submission.idempotency })
  ).pipe(Suspension.isEnabled() ? Effect.provideService(Suspension.InStepBody, true) : identity)
  if (due === undefined) {
    return Effect.matchCauseEffect(body, {
      onFailure: (cause) => bodyFailed(execution, options, stepId, cause),
      onSuccess: (value) => record(execution, options, stepId, value)
    })
  }
  // Due resources are captured after the body, and the captures go with its outcome (C.6.8 #5).
  return Effect.withFiber((fiber) => {
    const capturing = Resources.capture(fiber.getRef(Resources.CurrentResources)?.byKey, due)
    return Effect.matchCauseEffect(body, {
      onFailure: (cause) => bodyFailed(execution, options, stepId, cause, capturing),
      onSuccess: (value) => record(execution, options, stepId, value, capturing)
    })
  })
}

/** Schema failures name the offending value, as Effect 3's messages did (they are recorded as step errors). */
const reportInput = { reportInput: true } as const

/** Encode a body's result and record it (or record why it cannot be). */
const record = <A, E, R, I, RS, F, FI, RF>(
  execution: Execution.Service,
  options: StepOptions<A, E, R, I, RS, F, FI, RF>,
  stepId: string,
  value: A,
  capturing?: Effect.Effect<CheckpointRecords>
): Effect.Effect<A, StepError, RS> => {
  const schema = options.success
  if (schema === undefined) return recordEncoded(execution, options.target, stepId, value, value, capturing)
  const quick = Codec.encodeSync(schema, value)
  if (quick !== undefined) return recordEncoded(execution, options.target, stepId, quick.value, value, capturing)
  return Effect.matchEffect(Schema.encodeEffect(schema)(value, reportInput), {
    onFailure: (error) =>
      recordFailure(execution, options.target, stepId, `result does not encode: ${error.message}`, capturing),
    onSuccess: (output) => recordEncoded(execution, options.target, stepId, output, value, capturing)
  })
}

const recordEncoded = <A>(
  execution: Execution.Service,
  target: string,
  stepId: string,
  output: unknown,
  value: A,
  capturing: Effect.Effect<CheckpointRecords> | undefined
): Effect.Effect<A, StepError> => {
  const checked = stringifyStrict(output === undefined ? null : output)
  // A result that is not JSON is a bug in the agent, not a failure of the body, which
  // succeeded: raise it as what it is and record nothing (the step stays `executing`:
  // a re-run runs a `safe_to_retry` body again and reports an `at_most_once` one as
  // indeterminate, which is the truth).
  return checked._tag === "Ok"
    ? complete(execution, stepId, checked.json, value, capturing)
    : Effect.fail(
      new StepDecodeError({ target, stepId, description: `result is not JSON at ${checked.path}: ${checked.reason}` })
    )
}

/**
 * Fail the step with `{"message": …}` and raise the ToolError a replay would raise.
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const recordFailure = (
  execution: Execution.Service,
  target: string,
  stepId: string,
  message: string,
  capturing?: Effect.Effect<CheckpointRecords> | undefined
): Effect.Effect<never, ToolError | LeaseSuperseded | Terminated | Abandoned> => {
  const error = { message }
  return Effect.andThen(
    fail(execution, stepId, error, capturing),
    Effect.fail(new ToolError({ toolId: target, stepId, error, retryable: false, text: `${target}: ${message}` }))
  )
}

const bodyFailed = <A, E, R, I, RS, F, FI, RF>(
  execution: Execution.Service,
  options: StepOptions<A, E, R, I, RS, F, FI, RF>,
  stepId: string,
  cause: Cause.Cause<E>,
  capturing?: Effect.Effect<CheckpointRecords>
): Effect.Effect<never, StepError | F, RF> => {
  if (Cause.hasInterruptsOnly(cause)) return Effect.failCause(cause as Cause.Cause<never>)
  const failure = Cause.findErrorOption(cause)
  const error: unknown = Option.isSome(failure) ? failure.value : Cause.squash(cause)
  if (isPropagated(error)) return Effect.fail(error)
  const refusal = decodeRefusal(error)
  if (refusal !== undefined) {
    return isRunSignal(refusal) ? signal(execution, refusal) : Effect.fail(refusal)
  }
  const attempts = attemptsOf(options)
  if (Option.isSome(failure) && error instanceof Resources.CheckpointUnavailable) {
    return checkpointUnavailable(execution, stepId, error, attempts, capturing)
  }
  const schema = options.failure
  if (Option.isSome(failure) && schema !== undefined && Schema.is(schema)(error)) {
    const typed: F = error
    const message = messageOf(error)
    return Effect.matchEffect(Schema.encodeEffect(schema)(typed), {
      onFailure: (): Effect.Effect<never, StepError | F> =>
        failedAttempt(execution, options.target, stepId, { message }, attempts, undefined, capturing),
      onSuccess: (output): Effect.Effect<never, StepError | F> => {
        const record = { message, failure: output }
        return stringifyStrict(record)._tag === "Ok" ?
          failedAttempt(execution, options.target, stepId, record, attempts, { typed }, capturing) :
          failedAttempt(execution, options.target, stepId, { message }, attempts, undefined, capturing)
      }
    })
  }
  // An undeclared failure keeps its tag (`{"message":"<Tag>: …","_tag":"<Tag>"}`).
  return failedAttempt(execution, options.target, stepId, stepErrorRecord(error), attempts, undefined, capturing)
}

/**
 * A body that met a resource whose fork checkpoint is gone (PROTOCOL-CURRENT
 * C.6.8 #7): the step ran, so it is failed — with the record any tagged error
 * gets (`{"message":"CheckpointUnavailable: …","_tag":"CheckpointUnavailable"}`,
 * numbered under a `retry` schedule, which is not asked: every attempt would
 * meet the same handle) — and the error itself leaves the step, as it would
 * have left the handler: unless the handler catches it, the execution fails
 * with `agent_error: CheckpointUnavailable: <message>`. A replay raises it
 * again (see `Resources.fromStepError`).
 */
const checkpointUnavailable = (
  execution: Execution.Service,
  stepId: string,
  error: Resources.CheckpointUnavailable,
  attempts: Attempts | undefined,
  capturing: Effect.Effect<CheckpointRecords> | undefined
): Effect.Effect<never, StepError> => {
  const record = stepErrorRecord(error)
  return Effect.andThen(
    fail(execution, stepId, attempts === undefined ? record : { ...record, attempt: attempts.attempt }, capturing),
    Effect.fail(error)
  )
}

/** The ToolError raised for a recorded error object (now, or on replay: the same text). */
const toolErrorOf = (target: string, stepId: string, error: StepFailureRecord): ToolError =>
  new ToolError({ toolId: target, stepId, error, retryable: false, text: `${target}: ${error.message}` })

/**
 * Record a failed body and raise its error (`typed`, else a ToolError) — or,
 * for a step with a `retry` schedule that retries it, record the failure with
 * its attempt number and the time of the retry (`retry_at_ms`) and fail with
 * {@link RetryAt}, which {@link retrying} turns into the next attempt.
 */
const failedAttempt = <F>(
  execution: Execution.Service,
  target: string,
  stepId: string,
  record: StepFailureRecord,
  attempts: Attempts | undefined,
  failure: { readonly typed: F } | undefined,
  capturing: Effect.Effect<CheckpointRecords> | undefined
): Effect.Effect<never, StepError | F> => {
  if (attempts === undefined) {
    return Effect.andThen(
      fail(execution, stepId, record, capturing),
      Effect.fail(failure === undefined ? toolErrorOf(target, stepId, record) : failure.typed)
    )
  }
  const numbered: StepFailureRecord = { ...record, attempt: attempts.attempt }
  const raised: ToolError | F = failure === undefined ? toolErrorOf(target, stepId, numbered) : failure.typed
  return Effect.flatMap(attempts.decide(raised), (at): Effect.Effect<never, StepError | F> =>
    at === undefined
      ? Effect.andThen(fail(execution, stepId, numbered, capturing), Effect.fail(raised))
      : Effect.andThen(
        fail(execution, stepId, { ...numbered, retry_at_ms: at }, capturing),
        Effect.fail(new RetryAt(at) as unknown as StepError)
      ))
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
      return Schema.decodeUnknownEffect(schema)((recorded as { readonly failure: unknown }).failure, reportInput).pipe(
        Effect.mapError((e) => decodeError(`recorded failure does not decode: ${e.message}`)),
        Effect.flatMap((typed) => replayedFailure(options, recorded, typed))
      )
    }
    const unavailable = Resources.fromStepError(recorded)
    if (unavailable !== undefined) return replayedFailure(options, recorded, unavailable)
    return replayedFailure(
      options,
      recorded,
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
  const quick = Codec.decodeSync(options.success, admission.result)
  if (quick !== undefined) return Effect.succeed(quick.value)
  return Schema.decodeUnknownEffect(options.success)(admission.result, reportInput).pipe(
    Effect.mapError((e) => decodeError(`recorded result does not decode: ${e.message}`))
  )
}
