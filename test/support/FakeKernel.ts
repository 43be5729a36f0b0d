/**
 * A scripted, in-memory `KernelClient.Service` for the SDK tests: it records
 * every call (with the Clock time), keeps a tiny model of executions and steps
 * (so that a second run replays what the first recorded), fences leases on
 * demand, and lets a test script the next submit answers or override any call.
 */
import { Clock, Effect, Layer, Redacted, Schema } from "effect"
import * as Client from "../../src/Client.js"
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
  | "previous"
  | "getStep"
  | "suspend"
  | "publishMetadata"
  | "observeWebhook"

/** A child execution created through {@link FakeKernel.client}. */
export interface ChildRecord {
  readonly executionId: string
  readonly agentId: string
  readonly input: unknown
  readonly options: Client.CreateOptions | undefined
}

export interface Call {
  readonly op: Op
  readonly at: number
  readonly executionId: string
  readonly lease: Lease | undefined
  readonly submission?: StepSubmission
  readonly stepId?: string
  readonly json?: string | undefined
  readonly reason?: string
  /** The session state sent with complete execution (PROTOCOL-CURRENT C.4.5), when any. */
  readonly state?: string | undefined
  readonly notice?: Protocol.WebhookNotice
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
  state?: string | undefined
  session?: string | undefined
  parentExecutionId?: string | undefined
  /** What `GET …/previous` answers as `state` (default `null`). */
  previous?: unknown
}

export const SECRET = "test-secret"

const transport = (what: string) =>
  new KernelError({ reason: new TransportError({ description: `${what}: connection reset` }) })

const notFound = () => new KernelError({ reason: new StatusError({ status: 404, code: "not_found", description: "not found" }) })

export class FakeKernel {
  /** The calls made for runs. */
  readonly calls: Array<Call> = []
  /** The calls the runtime makes for the agent itself: `observeWebhook`, `publishMetadata`. */
  readonly agentCalls: Array<Call> = []
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
  onSuspend: ((count: number) => Effect.Effect<boolean, KernelError | LeaseSuperseded | Terminated>) | undefined
  onPublishMetadata: ((count: number) => Effect.Effect<void, KernelError>) | undefined
  onPrevious: ((executionId: string) => Effect.Effect<unknown, KernelError>) | undefined
  onCreate: ((child: ChildRecord) => Effect.Effect<void, KernelError>) | undefined
  /** Child executions by the parent step they are bound to. */
  readonly children = new Map<string, ChildRecord>()
  readonly created: Array<ChildRecord> = []
  private counters = new Map<string, number>()
  private nextStep = 0
  private nextChild = 0

  addExecution(id: string, input: unknown, status = "running", extra: Partial<ExecutionRecord> = {}): this {
    this.executions.set(id, { status, input, ...extra })
    return this
  }

  /** The step with this id. */
  step(stepId: string): StepRecord | undefined {
    return [...this.steps.values()].find((s) => s.stepId === stepId)
  }

  /**
   * Settle the step a child is bound to as the kernel does when the child ends
   * (PROTOCOL-CURRENT C.5.3): its output, or the error of a failed / cancelled child.
   */
  settleChild(
    childId: string,
    outcome: { readonly output: unknown } | { readonly failed: string } | { readonly cancelled: string }
  ): void {
    const binding = [...this.children.entries()].find(([, child]) => child.executionId === childId)
    if (binding === undefined) throw new Error(`no child ${childId}`)
    const step = this.step(binding[0])!
    if ("output" in outcome) {
      step.status = "succeeded"
      step.result = outcome.output
    } else {
      step.status = "failed"
      step.error = "failed" in outcome
        ? { execution_id: childId, failure_reason: outcome.failed, reason: "subagent_failed" }
        : { execution_id: childId, failure_reason: outcome.cancelled, reason: "subagent_cancelled" }
    }
  }

  /**
   * A `Client` whose `create` binds a child to the parent step like the kernel
   * (PROTOCOL-CURRENT C.5.1); every other call dies.
   */
  get client(): Client.Client.Service {
    const create: Client.Client.Service["create"] = (agentId, input, options) =>
      Effect.gen({ self: this }, function*() {
        const bound = options?.spawnedBy === undefined ? undefined : this.children.get(options.spawnedBy.stepId)
        const child: ChildRecord = bound ?? { executionId: `child-${this.nextChild++}`, agentId, input, options }
        this.created.push(child)
        if (this.onCreate !== undefined) yield* this.onCreate(child)
        if (options?.spawnedBy !== undefined) this.children.set(options.spawnedBy.stepId, child)
        return {
          id: child.executionId,
          agentId,
          agentVersion: "",
          input,
          status: "running",
          failureReason: "",
          createdAt: "",
          updatedAt: "",
          deadlineAt: "",
          ...(options?.spawnedBy === undefined ? {} : { spawnedBy: options.spawnedBy })
        } satisfies Protocol.Execution
      })
    return new Proxy({ create } as unknown as Client.Client.Service, {
      get: (target, key) =>
        key in target ? (target as any)[key] : () => Effect.die(new Error(`FakeKernel.client: ${String(key)}`))
    })
  }

  get clientLayer(): Layer.Layer<Client.Client> {
    return Layer.succeed(Client.Client, this.client)
  }

  ops(op?: Op): ReadonlyArray<Call> {
    return op === undefined ? this.calls : this.calls.filter((c) => c.op === op)
  }

  private record(call: Omit<Call, "at">): Effect.Effect<void> {
    return Effect.map(Clock.currentTimeMillis, (at) => {
      if (call.op === "observeWebhook" || call.op === "publishMetadata") this.agentCalls.push({ ...call, at })
      else this.calls.push({ ...call, at })
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
          deadlineAt: "",
          ...(e.session === undefined ? {} : { session: e.session }),
          ...(e.parentExecutionId === undefined ? {} : { parentExecutionId: e.parentExecutionId })
        }
        return execution
      }),
    observeWebhook: (notice) => this.record({ op: "observeWebhook", executionId: notice.executionId, lease: undefined, notice }),
    previous: (_caller, executionId) =>
      Effect.gen({ self: this }, function*() {
        yield* this.record({ op: "previous", executionId, lease: undefined })
        if (this.onPrevious !== undefined) return yield* this.onPrevious(executionId)
        const e = this.executions.get(executionId)
        if (e === undefined) return yield* notFound()
        return e.previous === undefined ? null : e.previous
      }),
    getStep: (_caller, executionId, stepId) =>
      Effect.gen({ self: this }, function*() {
        yield* this.record({ op: "getStep", executionId, lease: undefined, stepId })
        const step = this.step(stepId)
        if (step === undefined) return yield* notFound()
        const read: Protocol.Step = {
          stepId,
          executionId,
          kind: step.kind,
          target: step.target,
          argsHash: "",
          occurrence: 0,
          status: step.status,
          idempotency: "safe_to_retry",
          args: JSON.parse(step.argsJson),
          ...(step.result === undefined ? {} : { result: step.result }),
          ...(step.error === undefined ? {} : { error: step.error }),
          startedAt: "",
          completedAt: ""
        }
        return read
      }),
    suspend: (caller, executionId) =>
      Effect.gen({ self: this }, function*() {
        yield* this.record({ op: "suspend", executionId, lease: caller.lease })
        if (this.onSuspend !== undefined) return yield* this.onSuspend(this.ops("suspend").length)
        if (this.terminal(executionId)) return yield* new Terminated()
        if (this.isFenced(caller.lease)) return yield* new LeaseSuperseded()
        // Waiting: an executing step with a child (C.5.2); the execution blocks and the lease is retired.
        const waiting = [...this.children.keys()].some((stepId) => this.step(stepId)?.status === "executing")
        if (waiting) {
          const e = this.executions.get(executionId)
          if (e !== undefined) e.status = "blocked"
          this.fenced.add(`${caller.lease.dispatchId}:${caller.lease.attempt}`)
        }
        return waiting
      }),
    publishMetadata: (agentId, metadata) =>
      Effect.gen({ self: this }, function*() {
        yield* this.record({
          op: "publishMetadata",
          executionId: "",
          lease: undefined,
          reason: agentId,
          json: JSON.stringify(Schema.encodeSync(Protocol.AgentMetadataBody)(metadata))
        })
        if (this.onPublishMetadata !== undefined) {
          return yield* this.onPublishMetadata(this.agentCalls.filter((c) => c.op === "publishMetadata").length)
        }
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
    completeExecution: (caller, executionId, outputJson, stateJson) =>
      Effect.gen({ self: this }, function*() {
        yield* this.record({ op: "completeExecution", executionId, lease: caller.lease, json: outputJson, state: stateJson })
        if (this.terminal(executionId)) return
        if (this.isFenced(caller.lease)) return yield* new LeaseSuperseded()
        const e = this.executions.get(executionId)
        if (e !== undefined) {
          e.status = "completed"
          e.output = outputJson
          e.state = stateJson
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
