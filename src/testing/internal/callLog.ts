/**
 * The test kit's log of agent → kernel calls: one entry per call, what the
 * kernel answered and what reached the agent, counted per run (lease) and per
 * kind so that crash points and faults can name "the `index`-th call of that
 * kind in the run". Entries are read as {@link KernelCall} snapshots.
 *
 * A run logs two calls per step and a kit keeps them all, so the log stores
 * them column by column — eight slots per call, no object — and hands out a
 * {@link CallRecord} view only where a call is looked at as a whole (fault
 * injection, the snapshots).
 *
 * @since 0.2.0
 * @internal
 */
import type * as Core from "../../kernel/Core.js"
import type { Lease, StepSubmission } from "../../KernelClient.js"
import type { KernelCall } from "../TestKernel.js"
import type { CallInfo, CallName } from "./directClient.js"

/** The run a call belongs to: one object per lease (or per execution, for its reads), shared by its calls. */
interface Run {
  readonly executionId: string
  readonly lease: Lease | undefined
  /** The run's key (its lease, or the execution's reads). */
  readonly key: string
}

/** The calls, in the order of {@link CallCounts}; a call is stored as its index here. */
const CALLS: ReadonlyArray<CallName> = [
  "getExecution",
  "previous",
  "submitStep",
  "completeStep",
  "failStep",
  "heartbeat",
  "suspend",
  "completeExecution",
  "failExecution",
  "registerResource",
  "bindResource",
  "publishCheckpoints"
]
const CALL_CODES = new Map(CALLS.map((call, code) => [call, code]))
const INJECTED: ReadonlyArray<"crash" | "lapse" | "fault" | undefined> = [undefined, "crash", "lapse", "fault"]

// The state of a call, in one number: its call, four flags and what was injected.
const CALL_BITS = 0b1111
const PENDING = 1 << 4
const REACHED = 1 << 5
const DELIVERED = 1 << 6
const LOSE_ANSWER = 1 << 7
const INJECTED_SHIFT = 8

// The slots of a call.
const STATE = 0
const RUN = 1
const INDEX = 2
const AT_MS = 3
const STEP_ID = 4
const SUBMISSION = 5
const ANSWER = 6
const ANSWER_SEQ = 7
const STRIDE = 8

// The slots are kept in chunks: the first grows as an array does (a short log
// costs what an array costs); later ones are allocated whole, never copied.
const CHUNK_BITS = 12
const CHUNK = 1 << CHUNK_BITS
const IN_CHUNK = CHUNK - 1

/**
 * One call in the log, as a view over its slots: the call as the direct
 * client described it, plus what happened to it. What the call's step was
 * (kind, target, idempotency of a complete or fail) is looked up when the
 * log is read: a step's identity never changes.
 *
 * @since 0.2.0
 * @internal
 */
export class CallRecord {
  constructor(private readonly log: CallLog, readonly seq: number) {}
  get call(): CallName {
    return CALLS[this.log.state(this.seq) & CALL_BITS]!
  }
  get executionId(): string {
    return this.log.run(this.seq).executionId
  }
  get lease(): Lease | undefined {
    return this.log.run(this.seq).lease
  }
  /** The run's key (its lease, or the execution's reads). */
  get key(): string {
    return this.log.run(this.seq).key
  }
  /** The index of this call among the calls of its kind in the run (0-based). */
  get index(): number {
    return this.log.slot(this.seq, INDEX) as number
  }
  get atMs(): number {
    return this.log.slot(this.seq, AT_MS) as number
  }
  /** The step named by the route, or the one the submit's answer named. */
  get stepId(): string | undefined {
    return this.log.slot(this.seq, STEP_ID) as string | undefined
  }
  /**
   * What a submit sent. Dropped once the answer names a step recorded with
   * exactly these fields, which the log then reads from the step instead.
   */
  get submission(): StepSubmission | undefined {
    return this.log.slot(this.seq, SUBMISSION) as StepSubmission | undefined
  }
  get answer(): string | undefined {
    return this.log.slot(this.seq, ANSWER) as string | undefined
  }
  get answerSeq(): number | undefined {
    return this.log.slot(this.seq, ANSWER_SEQ) as number | undefined
  }
  get injected(): "crash" | "lapse" | "fault" | undefined {
    return INJECTED[this.log.state(this.seq) >>> INJECTED_SHIFT]
  }
  set injected(value: "crash" | "lapse" | "fault" | undefined) {
    const state = this.log.state(this.seq) & ((1 << INJECTED_SHIFT) - 1)
    this.log.setState(this.seq, state | (INJECTED.indexOf(value) << INJECTED_SHIFT))
  }
  /** Sent and not yet answered (nor lost before reaching the kernel). */
  get pending(): boolean {
    return (this.log.state(this.seq) & PENDING) !== 0
  }
  set pending(value: boolean) {
    this.flag(PENDING, value)
  }
  /** The kernel processed the call. */
  get reached(): boolean {
    return (this.log.state(this.seq) & REACHED) !== 0
  }
  /** The answer reached the agent. */
  get delivered(): boolean {
    return (this.log.state(this.seq) & DELIVERED) !== 0
  }
  set delivered(value: boolean) {
    this.flag(DELIVERED, value)
  }
  /** Lose the answer (fault `after`). */
  get loseAnswer(): boolean {
    return (this.log.state(this.seq) & LOSE_ANSWER) !== 0
  }
  set loseAnswer(value: boolean) {
    this.flag(LOSE_ANSWER, value)
  }
  private flag(bit: number, value: boolean): void {
    const state = this.log.state(this.seq)
    this.log.setState(this.seq, value ? state | bit : state & ~bit)
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

/** The run of each lease object (a run passes the same one to every call). */
const leaseRuns = new WeakMap<Lease, Run>()

const idempotencyOf = (step: Core.StepRecord | undefined): "safe_to_retry" | "at_most_once" | undefined =>
  step === undefined ? undefined : step.idempotency === "at_most_once" ? "at_most_once" : "safe_to_retry"

/**
 * Whether the step records exactly what the submission sent (its arguments as
 * sent when they were compact already), so that a submit's entry can read
 * them from the step and keep nothing of its own.
 */
const recordsSubmission = (step: Core.StepRecord | undefined, submission: StepSubmission): boolean =>
  step !== undefined && step.argsRaw === submission.argsJson && step.kind === submission.kind &&
  step.target === submission.target && step.idempotency === submission.idempotency

/**
 * The call log of one kit.
 *
 * @since 0.2.0
 * @internal
 */
export class CallLog {
  private readonly chunks: Array<Array<unknown>> = [[]]
  private length = 0
  private readonly byExecution = new Map<string, Array<number>>()
  private readonly counts = new Map<string, CallCounts>()
  private readonly readRuns = new Map<string, Run>()
  /** The execution whose calls were logged last (a run makes many calls in a row). */
  private last: { readonly executionId: string; readonly calls: Array<number> } | undefined = undefined

  constructor(private readonly core: Core.KernelCore) {}

  /** Log a call made at virtual time `now`; returns its `seq`. */
  append(info: CallInfo, now: number): number {
    const run = this.runOf(info)
    const seq = this.length++
    const state = CALL_CODES.get(info.call)! | PENDING
    const index = this.count(info.call, run.key)
    const base = seq * STRIDE
    if (base < CHUNK) {
      this.chunks[0]!.push(state, run, index, now, info.stepId, info.submission, undefined, undefined)
    } else {
      if ((base & IN_CHUNK) === 0) this.chunks.push(new Array<unknown>(CHUNK))
      const chunk = this.chunks[base >>> CHUNK_BITS]!
      const at = base & IN_CHUNK
      chunk[at + STATE] = state
      chunk[at + RUN] = run
      chunk[at + INDEX] = index
      chunk[at + AT_MS] = now
      chunk[at + STEP_ID] = info.stepId
      chunk[at + SUBMISSION] = info.submission
      chunk[at + ANSWER] = undefined
      chunk[at + ANSWER_SEQ] = undefined
    }
    this.executionLog(info.executionId).push(seq)
    return seq
  }

  /** The call logged under `seq`. */
  get(seq: number): CallRecord | undefined {
    return seq >= 0 && seq < this.length ? new CallRecord(this, seq) : undefined
  }

  /** The length of the log. */
  get size(): number {
    return this.length
  }

  /** Whether the call under `seq` was sent and is not answered yet (`false` for an unknown `seq`). */
  isPending(seq: number): boolean {
    return seq >= 0 && seq < this.length && (this.state(seq) & PENDING) !== 0
  }

  /** Whether the answer to the call under `seq` is to be lost (fault `after`). */
  losesAnswer(seq: number): boolean {
    return (this.state(seq) & LOSE_ANSWER) !== 0
  }

  /** The execution of the call under `seq`. */
  executionIdOf(seq: number): string {
    return this.run(seq).executionId
  }

  /** The run key of the call under `seq`. */
  keyOf(seq: number): string {
    return this.run(seq).key
  }

  /** How many calls of each kind the run with this key has made. */
  countsOf(key: string): CallCounts | undefined {
    return this.counts.get(key)
  }

  /**
   * The kernel answered the call under `seq` (`stepId`: the step its
   * decision named); the answer reached the agent when `delivered`.
   */
  answered(seq: number, answer: string, stepId: string | undefined, delivered: boolean): void {
    const base = seq * STRIDE
    const chunk = this.chunks[base >>> CHUNK_BITS]!
    const at = base & IN_CHUNK
    if (chunk[at + STEP_ID] === undefined && stepId !== undefined) chunk[at + STEP_ID] = stepId
    chunk[at + ANSWER] = answer
    chunk[at + ANSWER_SEQ] = this.length
    const state = chunk[at + STATE] as number
    chunk[at + STATE] = (state & ~(PENDING | DELIVERED)) | REACHED | (delivered ? DELIVERED : 0)
    const submission = chunk[at + SUBMISSION] as StepSubmission | undefined
    if (
      submission !== undefined && stepId !== undefined &&
      recordsSubmission(this.core.unsafeGetStep((chunk[at + RUN] as Run).executionId, stepId), submission)
    ) {
      chunk[at + SUBMISSION] = undefined
    }
  }

  /** The calls so far (all executions, or one), in order. */
  calls(executionId?: string): ReadonlyArray<KernelCall> {
    if (executionId !== undefined) return (this.byExecution.get(executionId) ?? []).map((seq) => this.snapshot(seq))
    const out: Array<KernelCall> = []
    for (let seq = 0; seq < this.length; seq++) out.push(this.snapshot(seq))
    return out
  }

  /**
   * The calls of an execution as they are now, read when first asked for
   * (most tests never read them): the calls logged so far, snapshotted at
   * once when one of them may still change (in flight, or touched by an
   * injected crash, lapse or fault).
   */
  callsNow(executionId: string): () => ReadonlyArray<KernelCall> {
    const seqs = this.byExecution.get(executionId)
    if (seqs === undefined) return () => []
    const count = seqs.length
    for (let i = 0; i < count; i++) {
      if ((this.state(seqs[i]!) & ~CALL_BITS) !== (REACHED | DELIVERED)) {
        const now = seqs.map((seq) => this.snapshot(seq))
        return () => now
      }
    }
    return () => seqs.slice(0, count).map((seq) => this.snapshot(seq))
  }

  /** @internal A slot of the call under `seq`. */
  slot(seq: number, field: number): unknown {
    const i = seq * STRIDE + field
    return this.chunks[i >>> CHUNK_BITS]![i & IN_CHUNK]
  }

  /** @internal The state number of the call under `seq`. */
  state(seq: number): number {
    return this.slot(seq, STATE) as number
  }

  /** @internal */
  setState(seq: number, state: number): void {
    const i = seq * STRIDE + STATE
    this.chunks[i >>> CHUNK_BITS]![i & IN_CHUNK] = state
  }

  /** @internal The run of the call under `seq`. */
  run(seq: number): Run {
    return this.slot(seq, RUN) as Run
  }

  private snapshot(seq: number): KernelCall {
    const r = new CallRecord(this, seq)
    const submission = r.submission
    const stepId = r.stepId
    if (submission !== undefined || stepId === undefined) {
      return entry(r, submission?.kind, submission?.target, submission?.argsJson, submission?.idempotency)
    }
    // A complete or fail names its step by the route; a submit without its submission, by its answer.
    const call = r.call
    const step = call === "completeStep" || call === "failStep" || call === "submitStep"
      ? this.core.unsafeGetStep(r.executionId, stepId)
      : undefined
    if (call === "submitStep" && step !== undefined) {
      return entry(r, step.kind, step.target, step.argsRaw, idempotencyOf(step))
    }
    return entry(r, step?.kind, step?.target, undefined, idempotencyOf(step))
  }

  /** The run of a call: per lease object, or the execution's reads. */
  private runOf(info: CallInfo): Run {
    const lease = info.lease
    if (lease === undefined) {
      let run = this.readRuns.get(info.executionId)
      if (run === undefined) {
        run = { executionId: info.executionId, lease: undefined, key: `${info.executionId}/read` }
        this.readRuns.set(info.executionId, run)
      }
      return run
    }
    const known = leaseRuns.get(lease)
    if (known !== undefined && known.executionId === info.executionId) return known
    const run: Run = {
      executionId: info.executionId,
      lease,
      key: `${info.executionId}/${lease.dispatchId}/${lease.attempt ?? "?"}`
    }
    leaseRuns.set(lease, run)
    return run
  }

  private count(call: CallName, key: string): number {
    let counts = this.counts.get(key)
    if (counts === undefined) {
      counts = noCalls()
      this.counts.set(key, counts)
    }
    return counts[call]++
  }

  private executionLog(executionId: string): Array<number> {
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

const entry = (
  r: CallRecord,
  kind: string | undefined,
  target: string | undefined,
  argsJson: string | undefined,
  idempotency: "safe_to_retry" | "at_most_once" | undefined
): KernelCall => ({
  seq: r.seq,
  call: r.call,
  executionId: r.executionId,
  dispatchId: r.lease?.dispatchId,
  attempt: r.lease?.attempt,
  index: r.index,
  stepId: r.stepId,
  kind,
  target,
  argsJson,
  idempotency,
  atMs: r.atMs,
  reached: r.reached,
  answer: r.answer,
  answerSeq: r.answerSeq,
  delivered: r.delivered,
  injected: r.injected
})
