/**
 * "What if" forks in the test kit (PROTOCOL-CURRENT C.7): where a fork of a
 * settled execution starts (a step in call order, an event seq, or the
 * latest seq where every resource is covered), which copied steps get
 * another recorded outcome (by source step id or by target), and how the
 * fork is made — through the core, or through `POST …/fork` and
 * `GET …/fork-points` over the kit's in-process `Client` when the kit's
 * transport is `"http"`. The overrides are a programmatic hook of the core,
 * never on the wire: a fork with overrides is made through the core on both
 * transports.
 *
 * @since 0.2.0
 * @internal
 */
import { Effect } from "effect"
import type * as Client from "../../Client.js"
import * as Core from "../../kernel/Core.js"
import * as Wire from "../../kernel/Wire.js"
import * as Protocol from "../../Protocol.js"
import type { KernelError } from "../../RebunoError.js"
import type { ForkOptions, StepOverride } from "../TestKernel.js"
import { fromWire } from "./directClient.js"

/** The events that settle a step: the steps a fork copies are those settled by the fork point (C.7.2 step 3). */
const SETTLED = new Set(["step.succeeded", "step.failed", "step.denied"])

const invalid = (message: string): Core.KernelFailure =>
  new Core.KernelFailure({ status: 400, code: "validation_error", message: "validation error: " + message })

/**
 * Forks are routes of the current stage only: older stages answer a
 * plain-text `404 page not found`, which a client reads as code
 * `internal_error` (PROTOCOL-CURRENT C.13) — as over HTTP.
 *
 * @since 0.2.0
 * @internal
 */
export const currentStageOnly = (core: Core.KernelCore): Effect.Effect<void, Core.KernelFailure> =>
  Effect.suspend(() =>
    core.settings.stage === "current"
      ? Effect.void
      : Effect.fail(new Core.KernelFailure({ status: 404, code: "internal_error", message: "404 page not found" }))
  )

/** A step event's `step_id` (payloads are JSON text). */
const stepIdOf = (event: Core.EventRecord): string | undefined => {
  const stepId = (JSON.parse(event.payload) as { readonly step_id?: unknown }).step_id
  return typeof stepId === "string" ? stepId : undefined
}

/**
 * A `KernelError` of the kit's `Client` as the core's failure: the same
 * status, code and message the kernel answered, so both transports fail
 * alike. A transport failure cannot happen in-process; it is a defect.
 *
 * @since 0.2.0
 * @internal
 */
export const toFailure = (error: KernelError): Effect.Effect<never, Core.KernelFailure> =>
  error.reason._tag === "StatusError"
    ? Effect.fail(
      new Core.KernelFailure({
        status: error.reason.status,
        code: error.reason.code ?? "internal_error",
        message: error.reason.description
      })
    )
    : Effect.die(error)

/**
 * The fork points of an execution as a client reads them (C.7.3): through
 * the core, decoded through the wire encoding, or over `GET …/fork-points`.
 *
 * @since 0.2.0
 * @internal
 */
export const forkPoints = (
  core: Core.KernelCore,
  client: Client.Client.Service | undefined,
  executionId: string
): Effect.Effect<Protocol.ForkPoints, Core.KernelFailure> =>
  client === undefined
    ? Effect.andThen(
      currentStageOnly(core),
      Effect.map(core.forkPoints(executionId), (points) => fromWire(Protocol.ForkPoints, Wire.encodeForkPoints(points)))
    )
    : Effect.catch(client.forkPoints(executionId), toFailure)

/**
 * The source seq a fork starts at:
 *
 * - `atStep: k` — just before the `k`-th step (0-based, call order: the
 *   order of the steps' first `step.*` events) was first submitted, so the
 *   steps before it that had settled are copied and it runs live; `k` equal
 *   to the number of steps forks at the latest seq;
 * - `atSeq: n` — that seq; `"latestCovered"` the latest seq at which every
 *   resource is covered by a checkpoint (C.7.3);
 * - neither — the latest seq (every settled step is copied).
 *
 * @since 0.2.0
 * @internal
 */
export const resolveSeq = (
  core: Core.KernelCore,
  points: () => Effect.Effect<Protocol.ForkPoints, Core.KernelFailure>,
  sourceId: string,
  options: ForkOptions
): Effect.Effect<number, Core.KernelFailure> =>
  Effect.gen(function*() {
    yield* currentStageOnly(core)
    // The source must exist (404) before its seqs are looked at, as the route checks.
    yield* core.getExecution(sourceId)
    const log = yield* core.eventLog(sourceId)
    const { atSeq, atStep } = options
    if (atStep !== undefined && atSeq !== undefined) return yield* invalid("atStep and atSeq are exclusive")
    if (atStep !== undefined) {
      const firstSeqs: Array<number> = []
      const seen = new Set<string>()
      for (const event of log) {
        if (!event.type.startsWith("step.")) continue
        const stepId = stepIdOf(event)
        if (stepId === undefined || seen.has(stepId)) continue
        seen.add(stepId)
        firstSeqs.push(event.seq)
      }
      if (!Number.isInteger(atStep) || atStep < 0 || atStep > firstSeqs.length) {
        return yield* invalid(`atStep must be between 0 and ${firstSeqs.length}`)
      }
      return atStep === firstSeqs.length ? log.length : firstSeqs[atStep]! - 1
    }
    if (atSeq === "latestCovered") {
      const seq = Protocol.latestCoveredSeq(yield* points())
      if (seq === undefined) return yield* invalid(`no seq of ${sourceId} is covered by checkpoints`)
      return seq
    }
    // A whole number goes to the kernel as it is: it answers out-of-range seqs with its own `400`.
    // Another number would not reach the core over HTTP (the route decodes `at_seq` as an integer).
    if (atSeq !== undefined && !Number.isInteger(atSeq)) {
      return yield* invalid(`at_seq must be between 1 and ${log.length}`)
    }
    return atSeq ?? log.length
  })

/** An override as the core takes it: an `error` given as a string is recorded as the SDK records one, `{"message":…}`. */
const toCoreOverride = (override: StepOverride): Core.StepOverride =>
  "error" in override
    ? { error: typeof override.error === "string" ? { message: override.error } : override.error }
    : { result: override.result }

/**
 * The overrides by source step id: a key that is a step id of the source is
 * that step (the core refuses it when it is not copied); any other key is a
 * target and names every step with that target the fork copies — none is a
 * `400` that lists the copied steps' targets.
 *
 * @since 0.2.0
 * @internal
 */
export const resolveOverrides = (
  core: Core.KernelCore,
  sourceId: string,
  atSeq: number,
  override: Readonly<Record<string, StepOverride>> | undefined
): Effect.Effect<Readonly<Record<string, Core.StepOverride>> | undefined, Core.KernelFailure> =>
  Effect.gen(function*() {
    if (override === undefined || Object.keys(override).length === 0) return undefined
    const steps = yield* core.listSteps(sourceId, false)
    const byId = new Map(steps.map((s) => [s.stepId, s]))
    const log = yield* core.eventLog(sourceId)
    const copied = new Set<string>()
    for (const event of log) {
      if (event.seq > atSeq) break
      if (!SETTLED.has(event.type)) continue
      const stepId = stepIdOf(event)
      if (stepId !== undefined) copied.add(stepId)
    }
    const out: Record<string, Core.StepOverride> = {}
    for (const [key, value] of Object.entries(override)) {
      if (byId.has(key)) {
        out[key] = toCoreOverride(value)
        continue
      }
      const named = steps.filter((s) => s.target === key && copied.has(s.stepId))
      if (named.length === 0) {
        const targets = [...new Set(steps.filter((s) => copied.has(s.stepId)).map((s) => JSON.stringify(s.target)))]
        return yield* invalid(
          `override ${JSON.stringify(key)} names no step the fork copies (copied targets: ${
            targets.length === 0 ? "none" : targets.join(", ")
          })`
        )
      }
      for (const step of named) out[step.stepId] = toCoreOverride(value)
    }
    return out
  })

/**
 * Make the fork (C.7.1): through the core, or — on the `"http"` transport,
 * without overrides — through `POST …/fork` over the kit's `Client`. Answers
 * the fork's id and its restoration.
 *
 * @since 0.2.0
 * @internal
 */
export const create = (
  core: Core.KernelCore,
  client: Client.Client.Service | undefined,
  sourceId: string,
  request: {
    readonly atSeq: number
    readonly session: string | undefined
    readonly policyBundle: string | undefined
    readonly overrides: Readonly<Record<string, Core.StepOverride>> | undefined
  }
): Effect.Effect<{ readonly id: string; readonly restoration: Protocol.Restoration | undefined }, Core.KernelFailure> => {
  if (client === undefined || request.overrides !== undefined) {
    return Effect.map(
      core.fork(sourceId, {
        atSeq: request.atSeq,
        ...(request.session === undefined ? {} : { session: request.session }),
        ...(request.policyBundle === undefined ? {} : { policyBundle: request.policyBundle }),
        ...(request.overrides === undefined ? {} : { overrides: request.overrides })
      }),
      (result) => ({
        id: result.execution.id,
        restoration: result.restoration === undefined ?
          undefined :
          Protocol.decodeRestoration(JSON.parse(Wire.encodeRestoration(result.restoration)))
      })
    )
  }
  return client.fork(sourceId, {
    atSeq: request.atSeq,
    ...(request.session === undefined ? {} : { session: request.session }),
    ...(request.policyBundle === undefined ? {} : { policyBundle: request.policyBundle })
  }).pipe(
    Effect.map((execution) => ({
      id: execution.id,
      restoration: execution.restoration === undefined ? undefined : Protocol.decodeRestoration(execution.restoration)
    })),
    Effect.catch(toFailure)
  )
}
