/**
 * A step as the kernel core keeps it (PROTOCOL 11.12): one mutable object for
 * the step's whole life, updated in place as the step moves through its
 * statuses. Readers outside the core get {@link StepState.snapshot}s.
 *
 * @since 0.1.0
 * @internal
 */
import type { StepStatus } from "../../Protocol.js"
import type { StepRecord } from "./model.js"

/**
 * A step as the core keeps it: one object for the step's whole life, updated in
 * place. Readers get {@link StepState.snapshot}s, which do not change.
 *
 * @since 0.1.0
 * @internal
 */
export class StepState {
  constructor(
    readonly stepId: string,
    readonly executionId: string,
    readonly kind: string,
    readonly target: string,
    readonly argsHash: string,
    readonly occurrence: number,
    readonly idempotency: string,
    /** Stored compacted (2.8). */
    readonly argsRaw: string | undefined,
    /** The text as first submitted (the same string when already compact). */
    readonly submittedArgsRaw: string | undefined,
    /** Index in the execution's step order. */
    readonly position: number
  ) {}
  status: StepStatus = "proposed"
  resultRaw: string | undefined = undefined
  errorRaw: string | undefined = undefined
  startedAtMs: number | undefined = undefined
  completedAtMs: number | undefined = undefined
  /** Tokens recorded on a succeeded `llm_call` step (PROTOCOL-CURRENT C.8.5), summed by budgets. */
  usage: { readonly inputTokens: number; readonly outputTokens: number } | undefined = undefined
  /**
   * The registered resources it declared and may change (PROTOCOL-CURRENT
   * C.6.4), in registration order; `undefined` for none (and for `llm_call`).
   * Counted when it settles and read as its writers (C.6.5).
   */
  resources: ReadonlyArray<string> | undefined = undefined

  /** Its status and outcome from now on. */
  set(
    status: StepStatus,
    resultRaw: string | undefined,
    errorRaw: string | undefined,
    startedAtMs: number | undefined,
    completedAtMs: number | undefined
  ): void {
    this.status = status
    this.resultRaw = resultRaw
    this.errorRaw = errorRaw
    this.startedAtMs = startedAtMs
    this.completedAtMs = completedAtMs
  }

  snapshot(): StepRecord {
    return {
      stepId: this.stepId,
      executionId: this.executionId,
      kind: this.kind,
      target: this.target,
      argsHash: this.argsHash,
      occurrence: this.occurrence,
      status: this.status,
      idempotency: this.idempotency,
      argsRaw: this.argsRaw,
      resultRaw: this.resultRaw,
      errorRaw: this.errorRaw,
      startedAtMs: this.startedAtMs,
      completedAtMs: this.completedAtMs
    }
  }
}
