/**
 * The test kit's log of agent → kernel calls: one record per call, what the
 * kernel answered and what reached the agent, counted per run (lease) and per
 * kind so that crash points and faults can name "the `index`-th call of that
 * kind in the run". Records are read as {@link KernelCall} snapshots.
 *
 * @since 0.2.0
 * @internal
 */
import type * as Core from "../../kernel/Core.js"
import type { Lease } from "../../KernelClient.js"
import type { KernelCall } from "../TestKernel.js"
import type { CallInfo, CallName } from "./directClient.js"

/**
 * One call in the log: the call as the direct client described it, plus what
 * happened to it. What the call's step was (kind, target, idempotency of a
 * complete or fail) is looked up when the log is read: a step's identity
 * never changes.
 *
 * @since 0.2.0
 * @internal
 */
export class CallRecord {
  answer: string | undefined = undefined
  answerSeq: number | undefined = undefined
  /** The step named by the route, or the one the submit's answer named. */
  stepId: string | undefined
  reached = false
  delivered = false
  injected: "crash" | "lapse" | "fault" | undefined = undefined
  /** Lose the answer (fault `after`). */
  loseAnswer = false
  /** Sent and not yet answered (nor lost before reaching the kernel). */
  pending = true
  constructor(
    readonly seq: number,
    readonly info: CallInfo,
    /** The index of this call among the calls of its kind in the run (0-based). */
    readonly index: number,
    readonly atMs: number,
    /** The run's key (its lease, or the execution's reads). */
    readonly key: string
  ) {
    this.stepId = info.stepId
  }
  get call(): CallName {
    return this.info.call
  }
  get executionId(): string {
    return this.info.executionId
  }
}

/**
 * How many calls of each kind a run has made.
 *
 * @since 0.2.0
 * @internal
 */
export type CallCounts = Record<CallName, number>

const noCalls = (): CallCounts => ({
  getExecution: 0,
  previous: 0,
  submitStep: 0,
  completeStep: 0,
  failStep: 0,
  heartbeat: 0,
  suspend: 0,
  completeExecution: 0,
  failExecution: 0,
  registerResource: 0,
  bindResource: 0,
  publishCheckpoints: 0
})

const leaseKeys = new WeakMap<Lease, { readonly executionId: string; readonly key: string }>()

/** The key of a run's calls; kept per lease object (a run passes the same one to every call). */
const leaseKey = (executionId: string, lease: Lease): string => {
  const known = leaseKeys.get(lease)
  if (known !== undefined && known.executionId === executionId) return known.key
  const key = `${executionId}/${lease.dispatchId}/${lease.attempt ?? "?"}`
  leaseKeys.set(lease, { executionId, key })
  return key
}

const idempotencyOf = (step: Core.StepRecord | undefined): "safe_to_retry" | "at_most_once" | undefined =>
  step === undefined ? undefined : step.idempotency === "at_most_once" ? "at_most_once" : "safe_to_retry"

const snapshot = (core: Core.KernelCore, r: CallRecord): KernelCall => {
  const submission = r.info.submission
  const step = submission !== undefined || r.info.stepId === undefined
    ? undefined
    : core.unsafeGetStep(r.executionId, r.info.stepId)
  return {
    seq: r.seq,
    call: r.call,
    executionId: r.executionId,
    dispatchId: r.info.lease?.dispatchId,
    attempt: r.info.lease?.attempt,
    index: r.index,
    stepId: r.stepId,
    kind: submission?.kind ?? step?.kind,
    target: submission?.target ?? step?.target,
    argsJson: submission?.argsJson,
    idempotency: submission?.idempotency ?? idempotencyOf(step),
    atMs: r.atMs,
    reached: r.reached,
    answer: r.answer,
    answerSeq: r.answerSeq,
    delivered: r.delivered,
    injected: r.injected
  }
}

/**
 * The call log of one kit.
 *
 * @since 0.2.0
 * @internal
 */
export class CallLog {
  private readonly records: Array<CallRecord> = []
  private readonly byExecution = new Map<string, Array<CallRecord>>()
  private readonly counts = new Map<string, CallCounts>()
  /** The execution whose calls were logged last (a run makes many calls in a row). */
  private last: { readonly executionId: string; readonly calls: Array<CallRecord> } | undefined = undefined

  constructor(private readonly core: Core.KernelCore) {}

  /** Log a call made at virtual time `now`. */
  append(info: CallInfo, now: number): CallRecord {
    const key = info.lease === undefined ? `${info.executionId}/read` : leaseKey(info.executionId, info.lease)
    const record = new CallRecord(this.records.length, info, this.count(info.call, key), now, key)
    this.records.push(record)
    this.executionLog(info.executionId).push(record)
    return record
  }

  /** The call logged under `seq`. */
  get(seq: number): CallRecord | undefined {
    return this.records[seq]
  }

  /** The length of the log. */
  get size(): number {
    return this.records.length
  }

  /** How many calls of each kind the run with this key has made. */
  countsOf(key: string): CallCounts | undefined {
    return this.counts.get(key)
  }

  /** The calls so far (all executions, or one), in order. */
  calls(executionId?: string): ReadonlyArray<KernelCall> {
    const records = executionId === undefined ? this.records : (this.byExecution.get(executionId) ?? [])
    return records.map((r) => snapshot(this.core, r))
  }

  private count(call: CallName, key: string): number {
    let counts = this.counts.get(key)
    if (counts === undefined) {
      counts = noCalls()
      this.counts.set(key, counts)
    }
    return counts[call]++
  }

  private executionLog(executionId: string): Array<CallRecord> {
    if (this.last !== undefined && this.last.executionId === executionId) return this.last.calls
    let calls = this.byExecution.get(executionId)
    if (calls === undefined) {
      calls = []
      this.byExecution.set(executionId, calls)
    }
    this.last = { executionId, calls }
    return calls
  }
}
