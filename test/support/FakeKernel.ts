/**
 * A scripted, in-memory `KernelClient.Service` for the SDK tests: it records
 * every call (with the Clock time), keeps a tiny model of executions and steps
 * (so that a second run replays what the first recorded), fences leases on
 * demand, and lets a test script the next submit answers or override any call.
 */
import { Clock, Effect, Layer, Redacted } from "effect"
import type { Caller, Lease, StepSubmission } from "../../src/KernelClient.js"
import { KernelClient } from "../../src/KernelClient.js"
import * as Protocol from "../../src/Protocol.js"
import { KernelError, LeaseSuperseded, PolicyError, StatusError, Terminated, TransportError } from "../../src/RebunoError.js"

export type Op =
  | "getExecution"
  | "submitStep"
  | "completeStep"
  | "failStep"
  | "publishDelta"
  | "heartbeat"
  | "completeExecution"
  | "failExecution"

export interface Call {
  readonly op: Op
  readonly at: number
  readonly executionId: string
  readonly lease: Lease | undefined
  readonly submission?: StepSubmission
  readonly stepId?: string
  readonly json?: string | undefined
  readonly reason?: string
}

export type SubmitAnswer =
  | Protocol.StepDecision
  | KernelError
  | LeaseSuperseded
  | Terminated
  | PolicyError

export interface StepRecord {
  readonly stepId: string
  readonly kind: string
  readonly target: string
  readonly argsJson: string
  status: "executing" | "succeeded" | "failed"
  result?: unknown
  error?: unknown
}

export interface ExecutionRecord {
  status: string
  input: unknown
  output?: string | undefined
  failureReason?: string
}

export const SECRET = "test-secret"

const transport = (what: string) =>
  new KernelError({ reason: new TransportError({ description: `${what}: connection reset` }) })

const notFound = () => new KernelError({ reason: new StatusError({ status: 404, code: "not_found", description: "not found" }) })

export class FakeKernel {
  readonly calls: Array<Call> = []
  readonly executions = new Map<string, ExecutionRecord>()
  readonly steps = new Map<string, StepRecord>()
  /** Answers for the next submits, used before the step model. */
  readonly script: Array<SubmitAnswer> = []
  /** Leases (`dispatchId:attempt`) that the kernel refuses with lease_superseded. */
  readonly fenced = new Set<string>()
  /** Policy for new steps; default allow. */
  policy: (s: StepSubmission) => Protocol.StepDecision | undefined = () => undefined
  /** Overrides. */
  onComplete: ((stepId: string) => Effect.Effect<Protocol.StepDecision, KernelError | LeaseSuperseded | Terminated>) | undefined
  onFail: ((stepId: string) => Effect.Effect<Protocol.StepDecision, KernelError | LeaseSuperseded | Terminated>) | undefined
  onHeartbeat: ((count: number) => Effect.Effect<void, KernelError | LeaseSuperseded>) | undefined
  getExecutionError: KernelError | undefined
  private counters = new Map<string, number>()
  private nextStep = 0

  addExecution(id: string, input: unknown, status = "running"): this {
    this.executions.set(id, { status, input })
    return this
  }

  ops(op?: Op): ReadonlyArray<Call> {
    return op === undefined ? this.calls : this.calls.filter((c) => c.op === op)
  }

  private record(call: Omit<Call, "at">): Effect.Effect<void> {
    return Effect.map(Clock.currentTimeMillis, (at) => {
      this.calls.push({ ...call, at })
    })
  }

  private isFenced(lease: Lease): boolean {
    return this.fenced.has(`${lease.dispatchId}:${lease.attempt}`)
  }

  private terminal(executionId: string): boolean {
    const e = this.executions.get(executionId)
    return e !== undefined && Protocol.isTerminalStatus(e.status)
  }

  private failWith(caller: Caller, executionId: string, stepId: string, errorJson: string) {
    return Effect.gen({ self: this }, function*() {
      yield* this.record({ op: "failStep", executionId, lease: caller.lease, stepId, json: errorJson })
      if (this.onFail !== undefined) return yield* this.onFail(stepId)
      return yield* this.settle(executionId, stepId, caller.lease, (step) => {
        step.status = "failed"
        step.error = JSON.parse(errorJson)
      })
    })
  }

  /** The scripted service. */
  readonly service: KernelClient.Service = {
    secret: Redacted.make(SECRET),
    getExecution: (_caller, executionId) =>
      Effect.gen({ self: this }, function*() {
        yield* this.record({ op: "getExecution", executionId, lease: undefined })
        if (this.getExecutionError !== undefined) return yield* Effect.fail(this.getExecutionError)
        const e = this.executions.get(executionId)
        if (e === undefined) return yield* notFound()
        const execution: Protocol.Execution = {
          id: executionId,
          agentId: "agent",
          agentVersion: "",
          input: e.input,
          status: e.status,
          failureReason: e.failureReason ?? "",
          createdAt: "",
          updatedAt: "",
          deadlineAt: ""
        }
        return execution
      }),
    submitStep: (caller: Caller, executionId, submission) =>
      Effect.gen({ self: this }, function*() {
        yield* this.record({ op: "submitStep", executionId, lease: caller.lease, submission })
        const scripted = this.script.shift()
        if (scripted !== undefined) {
          if (scripted instanceof KernelError) return yield* Effect.fail(scripted)
          if (scripted instanceof LeaseSuperseded) return yield* Effect.fail(scripted)
          if (scripted instanceof Terminated) return yield* Effect.fail(scripted)
          if (scripted instanceof PolicyError) return yield* Effect.fail(scripted)
          return scripted
        }
        if (this.terminal(executionId)) return { decision: "execution_terminal" }
        if (this.isFenced(caller.lease)) return yield* new LeaseSuperseded()
        const leaseKey = `${executionId}|${caller.lease.dispatchId}|${caller.lease.attempt}`
        const base = `${executionId}|${submission.kind}|${submission.target}|${submission.argsJson}`
        const counterKey = `${leaseKey}|${base}`
        const occurrence = this.counters.get(counterKey) ?? 0
        this.counters.set(counterKey, occurrence + 1)
        const key = `${base}|${occurrence}`
        const existing = this.steps.get(key)
        if (existing !== undefined) {
          if (existing.status === "succeeded") {
            return existing.result === undefined ?
              { decision: "replay", stepId: existing.stepId } :
              { decision: "replay", stepId: existing.stepId, result: existing.result }
          }
          if (existing.status === "failed") {
            return { decision: "replay", stepId: existing.stepId, error: existing.error }
          }
          if (submission.idempotency === "at_most_once") {
            existing.status = "failed"
            existing.error = {
              message: "outcome unknown: this may already have taken effect. Check the state before continuing.",
              reason: "indeterminate"
            }
            return { decision: "replay", stepId: existing.stepId, error: existing.error }
          }
          return { decision: "proceed", stepId: existing.stepId }
        }
        const stepId = `step-${this.nextStep++}`
        const policy = this.policy(submission)
        if (policy !== undefined) {
          return policy.stepId === undefined && policy.decision !== "rate_limited" ? { ...policy, stepId } : policy
        }
        this.steps.set(key, {
          stepId,
          kind: submission.kind,
          target: submission.target,
          argsJson: submission.argsJson,
          status: "executing"
        })
        return { decision: "proceed", stepId }
      }),
    completeStep: (caller, executionId, stepId, resultJson) =>
      Effect.gen({ self: this }, function*() {
        yield* this.record({ op: "completeStep", executionId, lease: caller.lease, stepId, json: resultJson })
        if (this.onComplete !== undefined) return yield* this.onComplete(stepId)
        return yield* this.settle(executionId, stepId, caller.lease, (step) => {
          step.status = "succeeded"
          step.result = JSON.parse(resultJson)
        })
      }),
    failStep: (caller, executionId, stepId, message) =>
      this.failWith(caller, executionId, stepId, JSON.stringify({ message })),
    failStepJson: (caller: Caller, executionId: string, stepId: string, errorJson: string) =>
      this.failWith(caller, executionId, stepId, errorJson),
    publishDelta: (caller, executionId, stepId, _seq, data) =>
      this.record({ op: "publishDelta", executionId, lease: caller.lease, stepId, json: data }),
    heartbeat: (caller, executionId) =>
      Effect.gen({ self: this }, function*() {
        yield* this.record({ op: "heartbeat", executionId, lease: caller.lease })
        if (this.onHeartbeat !== undefined) {
          return yield* this.onHeartbeat(this.ops("heartbeat").length)
        }
        if (this.isFenced(caller.lease) || this.terminal(executionId)) return yield* new LeaseSuperseded()
      }),
    completeExecution: (caller, executionId, outputJson) =>
      Effect.gen({ self: this }, function*() {
        yield* this.record({ op: "completeExecution", executionId, lease: caller.lease, json: outputJson })
        if (this.terminal(executionId)) return
        if (this.isFenced(caller.lease)) return yield* new LeaseSuperseded()
        const e = this.executions.get(executionId)
        if (e !== undefined) {
          e.status = "completed"
          e.output = outputJson
        }
      }),
    failExecution: (caller, executionId, reason) =>
      Effect.gen({ self: this }, function*() {
        yield* this.record({ op: "failExecution", executionId, lease: caller.lease, reason })
        if (this.terminal(executionId)) return
        if (this.isFenced(caller.lease)) return yield* new LeaseSuperseded()
        const e = this.executions.get(executionId)
        if (e !== undefined) {
          e.status = "failed"
          e.failureReason = reason
        }
      })
  }

  private settle(
    executionId: string,
    stepId: string,
    lease: Lease,
    apply: (step: StepRecord) => void
  ): Effect.Effect<Protocol.StepDecision, LeaseSuperseded | KernelError> {
    if (this.terminal(executionId)) return Effect.succeed({ decision: "execution_terminal" })
    const step = [...this.steps.values()].find((s) => s.stepId === stepId)
    if (step === undefined) {
      return Effect.fail(notFound())
    }
    if (step.status !== "executing") return Effect.succeed({ decision: "replay" })
    if (this.isFenced(lease)) return Effect.fail(new LeaseSuperseded())
    apply(step)
    return Effect.succeed({ decision: "recorded" })
  }

  get layer(): Layer.Layer<KernelClient> {
    return Layer.succeed(KernelClient, this.service)
  }

  static transport = transport
}
