/**
 * A `KernelClient` that calls the embedded kernel's core directly: no bytes,
 * no signatures, the same decisions, errors and state. This is what makes the
 * test kit fast; `TestKernel.layer({ transport: "http" })` swaps in the real
 * HTTP client over in-process routes when a test wants the wire too. Like the
 * HTTP client, it retries the calls PROTOCOL.md 15.1 declares safe (reads,
 * step complete / fail, outcome posts) on transport failures — which, here,
 * only the test kit's fault injection produces — and never retries a submit.
 * It implements every call the SDK makes, the resource calls of the current
 * stage (PROTOCOL-CURRENT C.6: register, bind, checkpoints, the `resources`
 * of a submit, the captures of an outcome) included, all through the kit's
 * interceptor, so they are logged and can be crashed or faulted.
 *
 * @since 0.1.0
 * @internal
 */
import { Cause, Clock, Effect, Exit, Option, Redacted, Result, Schema } from "effect"
import type { Types } from "effect"
import * as Core from "../../kernel/Core.js"
import * as Wire from "../../kernel/Wire.js"
import type { Caller, KernelClient, Lease, StepSubmission } from "../../KernelClient.js"
import * as Protocol from "../../Protocol.js"
import { isKernelError, KernelError, LeaseSuperseded, PolicyError, StatusError, Terminated } from "../../RebunoError.js"
import * as Http from "../../internal/http/exchange.js"
import * as InProcess from "../../internal/run/inProcess.js"

/**
 * The intercepted agent → kernel calls.
 *
 * @since 0.1.0
 * @internal
 */
export type CallName =
  | "getExecution"
  | "previous"
  | "submitStep"
  | "completeStep"
  | "failStep"
  | "heartbeat"
  | "suspend"
  | "completeExecution"
  | "failExecution"
  | "registerResource"
  | "bindResource"
  | "publishCheckpoints"

/**
 * One agent → kernel call as the interceptor sees it before it is sent.
 *
 * @since 0.1.0
 * @internal
 */
export interface CallInfo {
  readonly call: CallName
  readonly agentId: string
  /** `undefined` for reads, which carry no lease. */
  readonly lease: Lease | undefined
  readonly executionId: string
  /** Complete / fail: the step named by the route. */
  readonly stepId: string | undefined
  /** Submit: what was submitted. */
  readonly submission: StepSubmission | undefined
}

/**
 * The kernel's answer to a call: a decision value (`proceed`, `replay`, …,
 * `recorded`), `ok` for an empty success, or the error code.
 *
 * @since 0.1.0
 * @internal
 */
export interface CallAnswer {
  readonly answer: string
  /** The decision's `step_id`, when it has one. */
  readonly stepId: string | undefined
}

/**
 * Hooks around every call, used for crash, stall and fault injection and for
 * the call log. `before` records the call (made at virtual time `now`) before
 * the kernel sees it and returns its id — or, when something is injected at
 * this call, an Effect that may fail with a transport error (the call never
 * reaches the kernel) or never return (the process died). `after` records the
 * kernel's answer — or returns an Effect when something is injected after the
 * kernel answered; failing there means the answer was lost on the way back.
 * `track` counts a call as in flight while an Effect of the slow path runs.
 *
 * Calls with nothing injected run synchronously, without an Effect per hook:
 * that is most of what makes the test kit fast.
 *
 * @since 0.1.0
 * @internal
 */
export interface Interceptor {
  readonly before: (info: CallInfo, now: number) => number | Effect.Effect<number, KernelError>
  readonly after: (id: number, answer: string, stepId: string | undefined) => void | Effect.Effect<void, KernelError>
  readonly track: <A, E>(effect: Effect.Effect<A, E>) => Effect.Effect<A, E>
}

/**
 * The answer of a core call, for the interceptor.
 *
 * @since 0.1.0
 * @internal
 */
export const answerOf = (exit: Exit.Exit<unknown, Core.KernelFailure>): CallAnswer => {
  if (Exit.isFailure(exit)) {
    const failure = Cause.findErrorOption(exit.cause)
    return { answer: Option.isNone(failure) ? "interrupted" : failure.value.code, stepId: undefined }
  }
  return answerOfValue(exit.value)
}

const answerOfValue = (value: unknown): CallAnswer => {
  if (value instanceof KernelFailureClass) return { answer: value.code, stepId: undefined }
  const decision = value as Partial<Core.Decision> | undefined
  if (decision !== undefined && decision !== null && typeof decision === "object" && typeof decision.decision === "string") {
    return { answer: decision.decision, stepId: decision.stepId }
  }
  return { answer: "ok", stepId: undefined }
}

const KernelFailureClass = Core.KernelFailure

const statusError = (f: Core.KernelFailure): KernelError =>
  new KernelError({ reason: new StatusError({ status: f.status, code: f.code, description: f.message }) })

const signalOr = (f: Core.KernelFailure): LeaseSuperseded | Terminated | KernelError =>
  f.code === "lease_superseded"
    ? new LeaseSuperseded()
    : f.code === "execution_terminal"
    ? new Terminated()
    : statusError(f)

const submitFailure = (f: Core.KernelFailure): PolicyError | LeaseSuperseded | Terminated | KernelError =>
  f.code === "policy_denied" ? new PolicyError({ reason: f.message }) : signalOr(f)

const leaseOr = (f: Core.KernelFailure): LeaseSuperseded | KernelError =>
  f.code === "lease_superseded" ? new LeaseSuperseded() : statusError(f)

/** Map kernel failures; injected transport errors pass through. */
const mapFailure = <E>(f: (failure: Core.KernelFailure) => E) => (e: Core.KernelFailure | KernelError): E | KernelError =>
  isKernelError(e) ? e : f(e)

const parseRaw = (raw: string): unknown => JSON.parse(raw)

const toDecision = (d: Core.Decision): Protocol.StepDecision => {
  // Most answers (`proceed`, `recorded`) are already in the client's shape.
  if (
    d.resultRaw === undefined && d.errorRaw === undefined && d.approvalId === undefined && d.reason === undefined &&
    d.ruleId === undefined
  ) {
    return d
  }
  const out: Types.Mutable<Protocol.StepDecision> = { decision: d.decision }
  if (d.stepId !== undefined) out.stepId = d.stepId
  if (d.resultRaw !== undefined) out.result = parseRaw(d.resultRaw)
  if (d.errorRaw !== undefined) out.error = parseRaw(d.errorRaw)
  if (d.approvalId !== undefined) out.approvalId = d.approvalId
  if (d.reason !== undefined && d.reason !== "") out.reason = d.reason
  // PROTOCOL-CURRENT C.8.4: the deciding rule of a denial, as `PolicyError.ruleId`.
  if (d.ruleId !== undefined && d.ruleId !== "") out.ruleId = d.ruleId
  // PROTOCOL-CURRENT C.6.4: the resources a `proceed` touched.
  if (d.resources !== undefined && d.resources.length > 0) out.resources = d.resources
  return out
}

/**
 * Decode a core record through its exact wire encoding, so in-process callers
 * see precisely what an HTTP client would.
 *
 * @since 0.1.0
 * @internal
 */
export const fromWire = <A, I>(schema: Schema.Codec<A, I>, text: string): A =>
  Schema.decodeUnknownSync(schema)(JSON.parse(text))

/** The submission as the core takes it: always the same shape, no declared resources as `undefined`. */
const toCore = (s: StepSubmission) => ({
  kind: s.kind,
  target: s.target,
  argsRaw: s.argsJson,
  idempotency: s.idempotency,
  resources: s.resources === undefined || s.resources.length === 0 ? undefined : s.resources
})

const toExecution = (r: Core.ExecutionRecord): Protocol.Execution =>
  fromWire(Protocol.Execution, Wire.encodeExecution(r))

const toStep = (r: Core.StepRecord): Protocol.Step => fromWire(Protocol.Step, Wire.encodeStep(r))

/** A JSON value as compact raw text, `null` when absent (the kernel stores schemas compacted). */
const rawOrNull = (value: unknown): string | null =>
  value === null || value === undefined ? null : JSON.stringify(value)

/**
 * Build the direct client.
 *
 * @since 0.1.0
 * @internal
 */
export const make = (
  core: Core.KernelCore,
  secret: string,
  interceptor: Interceptor
): KernelClient.Service => {
  /** Run `effect` as the call recorded under `id`, then report its answer to the interceptor. */
  const answered = <A>(
    id: number,
    effect: Effect.Effect<A, Core.KernelFailure>
  ): Effect.Effect<A, Core.KernelFailure | KernelError> =>
    Effect.flatMap(Effect.exit(effect), (exit) => {
      const answer = answerOf(exit)
      const after = interceptor.after(id, answer.answer, answer.stepId)
      return after === undefined ? exit : Effect.andThen(after, exit)
    })

  /** A call with its hooks, on Effects all the way (the slow path, and every call but the step calls). */
  const around = <A>(
    info: CallInfo,
    effect: Effect.Effect<A, Core.KernelFailure>
  ): Effect.Effect<A, Core.KernelFailure | KernelError> =>
    interceptor.track(Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const before = interceptor.before(info, now)
      return typeof before === "number" ? answered(before, effect) : Effect.flatMap(before, (id) => answered(id, effect))
    }))

  /**
   * A step call at time `now`: when nothing is injected, the hooks and the
   * kernel run as plain code and the answer is a `Result`; otherwise it is the
   * Effect of the slow path. `raw` is the outcome's JSON (complete / fail).
   */
  const stepCallAt = <E>(
    now: number,
    info: CallInfo,
    op: "submit" | "succeeded" | "failed",
    raw: string | undefined,
    onFailure: (failure: Core.KernelFailure) => E
  ): InProcess.Answer<E | KernelError> => {
    const before = interceptor.before(info, now)
    if (typeof before === "number") {
      const result = op === "submit"
        ? core.unsafeSubmitStep(now, info.executionId, info.lease!, toCore(info.submission!))
        : core.unsafeSettleStep(now, info.executionId, info.stepId!, info.lease!, op, raw)
      let after: void | Effect.Effect<void, KernelError>
      let answer: Result.Result<Protocol.StepDecision, E>
      if (result instanceof KernelFailureClass) {
        after = interceptor.after(before, result.code, undefined)
        answer = Result.fail(onFailure(result))
      } else {
        after = interceptor.after(before, result.decision, result.stepId)
        answer = Result.succeed(toDecision(result))
      }
      return after === undefined ? answer : interceptor.track(Effect.andThen(after, Effect.fromResult(answer)))
    }
    const effect = op === "submit"
      ? core.submitStep(info.executionId, info.lease!, toCore(info.submission!))
      : op === "succeeded"
      ? core.completeStep(info.executionId, info.stepId!, info.lease!, raw)
      : core.failStep(info.executionId, info.stepId!, info.lease!, raw)
    return interceptor.track(Effect.flatMap(before, (id) => answered(id, effect))).pipe(
      Effect.mapBoth({ onFailure: mapFailure(onFailure), onSuccess: toDecision })
    )
  }

  /** A step call at the fiber's current time. */
  const stepCall = <E>(
    info: CallInfo,
    op: "submit" | "succeeded" | "failed",
    raw: string | undefined,
    onFailure: (failure: Core.KernelFailure) => E
  ): Effect.Effect<Protocol.StepDecision, E | KernelError> =>
    Effect.clockWith((clock) => {
      const answer = stepCallAt(clock.currentTimeMillisUnsafe(), info, op, raw, onFailure)
      return Result.isResult(answer) ? Effect.fromResult(answer) : answer
    })

  /** One try of a step complete. */
  const completeCall = (caller: Caller, executionId: string, stepId: string, resultJson: string) =>
    stepCall(info("completeStep", caller, executionId, stepId), "succeeded", resultJson, signalOr)

  /** A step outcome with captures (PROTOCOL-CURRENT C.6.5): on the slow path, retried like the others. */
  const settleWithCaptures = (
    info: CallInfo,
    effect: Effect.Effect<Core.Decision, Core.KernelFailure>
  ): Effect.Effect<Protocol.StepDecision, KernelError | LeaseSuperseded | Terminated> =>
    Http.retryTransport(
      around(info, effect).pipe(Effect.mapBoth({ onFailure: mapFailure(signalOr), onSuccess: toDecision }))
    )

  const completeStep: KernelClient.Service["completeStep"] = (caller, executionId, stepId, resultJson, records) =>
    records === undefined
      ? Http.retryTransport(completeCall(caller, executionId, stepId, resultJson))
      : settleWithCaptures(
        info("completeStep", caller, executionId, stepId),
        core.completeStep(executionId, stepId, caller.lease, resultJson, records)
      )

  /** The same submit and complete, for callers that read the time themselves. */
  const inProcessSteps: InProcess.InProcessSteps = {
    submitStep: (now, caller, executionId, s) =>
      stepCallAt(now, info("submitStep", caller, executionId, undefined, s), "submit", undefined, submitFailure),
    completeStep: (now, caller, executionId, stepId, resultJson) => {
      const answer = stepCallAt(now, info("completeStep", caller, executionId, stepId), "succeeded", resultJson, signalOr)
      // Retries are whole calls again, as `completeStep`'s are.
      return Result.isResult(answer) ?
        answer :
        Http.retryTransport(answer, completeCall(caller, executionId, stepId, resultJson))
    }
  }

  const info = (
    call: CallName,
    caller: { readonly agentId: string; readonly lease?: Lease | undefined },
    executionId: string,
    stepId?: string,
    submission?: StepSubmission
  ): CallInfo => ({ call, agentId: caller.agentId, lease: caller.lease, executionId, stepId, submission })

  const failStepJson: KernelClient.Service["failStepJson"] = (caller, executionId, stepId, errorJson, records) =>
    records === undefined
      ? stepCall(info("failStep", caller, executionId, stepId), "failed", errorJson, signalOr).pipe(Http.retryTransport)
      : settleWithCaptures(
        info("failStep", caller, executionId, stepId),
        core.failStep(executionId, stepId, caller.lease, errorJson, records)
      )

  /** Complete / fail execution: `409 execution_terminal` means an earlier try (or a cancel) got there first. */
  const outcome = (
    info: CallInfo,
    effect: Effect.Effect<void, Core.KernelFailure>
  ): Effect.Effect<void, KernelError | LeaseSuperseded> =>
    around(info, effect).pipe(
      Effect.catchIf((f) => !isKernelError(f) && f.code === "execution_terminal", () => Effect.void),
      Effect.mapError(mapFailure(leaseOr)),
      Http.retryTransport
    )

  /**
   * A route of the current stage only: older stages have no such route and
   * answer a plain-text `404 page not found`, which a client reads as code
   * `internal_error` (PROTOCOL-CURRENT C.13) — as over HTTP.
   */
  const currentOnly = <A>(effect: Effect.Effect<A, Core.KernelFailure>): Effect.Effect<A, Core.KernelFailure> =>
    Effect.suspend(() =>
      core.settings.stage === "current"
        ? effect
        : Effect.fail(new Core.KernelFailure({ status: 404, code: "internal_error", message: "404 page not found" }))
    )

  const service: KernelClient.Service = {
    secret: Redacted.make(secret),
    getExecution: (caller, executionId) =>
      around(info("getExecution", caller, executionId), core.getExecution(executionId)).pipe(
        Effect.mapBoth({ onFailure: mapFailure(statusError), onSuccess: toExecution }),
        Http.retryTransport
      ),
    // Never retried (PROTOCOL.md 15.1).
    submitStep: (caller: Caller, executionId, s) =>
      stepCall(
        info("submitStep", caller, executionId, undefined, s),
        "submit",
        undefined,
        submitFailure
      ),
    completeStep,
    failStep: (caller, executionId, stepId, message) => failStepJson(caller, executionId, stepId, JSON.stringify({ message })),
    failStepJson,
    publishDelta: (_caller, executionId, stepId, seq, data) => core.publishDelta(executionId, { stepId, seq, data }),
    // Not retried: the next beat is the retry (PROTOCOL.md 15.1).
    heartbeat: (caller, executionId) =>
      around(info("heartbeat", caller, executionId), core.heartbeat(executionId, caller.lease)).pipe(
        Effect.mapError(mapFailure(leaseOr))
      ),
    completeExecution: (caller, executionId, outputJson, stateJson) =>
      outcome(
        info("completeExecution", caller, executionId),
        core.completeExecution(executionId, caller.lease, outputJson, stateJson)
      ),
    // PROTOCOL-CURRENT C.4.6: a read, retried like `getExecution`.
    previous: (caller, executionId) =>
      around(info("previous", caller, executionId), currentOnly(core.previousState(executionId))).pipe(
        Effect.mapBoth({ onFailure: mapFailure(statusError), onSuccess: parseRaw }),
        Http.retryTransport
      ),
    getStep: (_caller, executionId, stepId) =>
      core.getStep(executionId, stepId).pipe(Effect.mapBoth({ onFailure: statusError, onSuccess: toStep })),
    // PROTOCOL-CURRENT C.5.2: lease-fenced; retried (a repeat that got through answers lease_superseded).
    suspend: (caller, executionId) =>
      around(info("suspend", caller, executionId), currentOnly(core.suspendExecution(executionId, caller.lease))).pipe(
        Effect.mapError(mapFailure(signalOr)),
        Http.retryTransport
      ),
    // PROTOCOL-CURRENT C.3: one try; not a call of an execution, so not logged.
    publishMetadata: (agentId, metadata) =>
      currentOnly(core.setAgentMetadata(agentId, {
        description: metadata.description,
        inputSchemaRaw: rawOrNull(metadata.inputSchema),
        outputSchemaRaw: rawOrNull(metadata.outputSchema)
      })).pipe(Effect.mapError(statusError)),
    failExecution: (caller, executionId, reason) =>
      outcome(info("failExecution", caller, executionId), core.failExecution(executionId, caller.lease, reason)),
    // PROTOCOL-CURRENT C.6.2, C.6.3, C.6.6: lease-fenced resource calls, logged and open to
    // injected faults like every agent call, retried on transport failures as over HTTP.
    registerResource: (caller, executionId, r) =>
      around(
        info("registerResource", caller, executionId),
        currentOnly(core.registerResource(executionId, caller.lease, {
          key: r.key,
          driverId: r.driverId,
          configurationRaw: r.configurationJson,
          coverageReuse: r.coverageReuse,
          everySteps: r.everySteps,
          onCompletion: r.onCompletion
        }))
      ).pipe(
        Effect.mapBoth({
          onFailure: mapFailure(signalOr),
          onSuccess: (record) => fromWire(Protocol.Resource, Wire.encodeResource(record))
        }),
        Http.retryTransport
      ),
    bindResource: (caller, executionId, key, bindingJson) =>
      around(
        info("bindResource", caller, executionId),
        currentOnly(core.bindResource(executionId, key, caller.lease, bindingJson))
      ).pipe(Effect.mapError(mapFailure(signalOr)), Http.retryTransport),
    publishCheckpoints: (caller, executionId, records) =>
      around(
        info("publishCheckpoints", caller, executionId),
        currentOnly(core.publishCheckpoints(executionId, caller.lease, records))
      ).pipe(Effect.mapError(mapFailure(signalOr)), Http.retryTransport)
  }
  return InProcess.register(service, inProcessSteps)
}
