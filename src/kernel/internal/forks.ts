/**
 * Forks of the kernel core in the current stage (PROTOCOL-CURRENT C.7): a new
 * execution of the same agent and input that starts from a point of another
 * execution's log. The steps the source had settled by then are copied under
 * the fork's own step ids (§8.2 with the fork's execution id) with their
 * events, so the rerun agent replays them; each resource starts from the
 * newest checkpoint covering the fork point; the fork may run under a policy
 * bundle of its own. Everything after the fork point runs live.
 *
 * A programmatic hook (never on the wire) replaces the recorded outcome of
 * copied steps, for the test kit's "what if" tests.
 *
 * @since 0.2.0
 * @internal
 */
import * as Result from "effect/Result"
import { formatTimestamp } from "../../internal/wire/time.js"
import { stringifyStrict } from "../../internal/wire/json.js"
import * as StepId from "../../StepId.js"
import * as Policy from "../Policy.js"
import type { StepIdentity } from "./eventLog.js"
import type { CheckpointState, ExecState, OwnPolicy, ResourceState } from "./executions.js"
import { pendingRecord } from "./executions.js"
import { goQuote } from "./goQuote.js"
import * as Lifecycle from "./lifecycle.js"
import type { ForkRequest, ForkResult, Restoration, StepOverride } from "./model.js"
import { conflict, KernelFailure, notFound, validation } from "./model.js"
import * as Payload from "./payloads.js"
import * as Resources from "./resources.js"
import * as Sessions from "./sessions.js"
import type { CoreState } from "./state.js"
import { StepState } from "./stepState.js"
import * as Steps from "./steps.js"
import { compactRaw, isIndeterminateError } from "./storedJson.js"

const SETTLED_EVENTS = new Set(["step.succeeded", "step.failed", "step.denied"])

const isStepEvent = (data: string | StepIdentity): data is StepIdentity => typeof data !== "string"

const sessionTaken = (session: string): KernelFailure =>
  new KernelFailure({
    status: 409,
    code: "conflict",
    message: "conflict: session " + goQuote(session) + " already has executions"
  })

const policyForbidden = (): KernelFailure =>
  new KernelFailure({ status: 403, code: "forbidden", message: "forbidden: policy_bundle requires policies:write" })

/** An override's outcome as stored raw JSON, or `undefined` when the value is not JSON. */
const overrideOutcome = (
  override: StepOverride
): { readonly status: "succeeded" | "failed"; readonly raw: string } | undefined => {
  const isResult = "result" in override
  // Strict and iterative: a value nested as deep as the kernel accepts (10,000 levels) is recorded, and one that is
  // not JSON as it stands (`NaN`, `undefined`, a `Date` …, only possible in process) is refused, not coerced.
  const text = stringifyStrict(isResult ? override.result : override.error)
  if (text._tag === "Invalid") return undefined
  return { status: isResult ? "succeeded" : "failed", raw: compactRaw(text.json)! }
}

/** The source steps settled (`succeeded`, `failed`, `denied`) by an event with seq ≤ `atSeq` (C.7.2 step 3). */
const settledBy = (source: ExecState, atSeq: number): Set<string> => {
  const ids = new Set<string>()
  for (let i = 0; i < atSeq; i++) {
    if (!SETTLED_EVENTS.has(source.events.typeAt(i))) continue
    const { data } = source.events.dataAt(i)
    if (isStepEvent(data)) ids.add(data.stepId)
  }
  return ids
}

/** The generation a resource had at `seq`: the last one it got at or before it. */
const generationAt = (r: ResourceState, seq: number): number => {
  let generation = 0
  for (const g of r.generations) {
    if (g.seq > seq) break
    generation = g.generation
  }
  return generation
}

/**
 * The checkpoint a fork's resource starts from (C.7.2 step 4): the newest
 * covering `atSeq`, else the newest earlier one, else none.
 */
const select = (source: ExecState, key: string, atSeq: number): {
  readonly checkpoint: CheckpointState | undefined
  readonly covered: boolean
} => {
  let covering: CheckpointState | undefined
  let earlier: CheckpointState | undefined
  for (const c of source.checkpoints ?? []) {
    if (c.key !== key || c.coveredSeq > atSeq) continue
    if (c.invalidatedSeq === undefined || c.invalidatedSeq > atSeq) covering = c
    else earlier = c
  }
  return covering !== undefined ? { checkpoint: covering, covered: true } : { checkpoint: earlier, covered: false }
}

/**
 * `POST /v0/executions/{id}/fork` (C.7.1, C.7.2), its checks in order: the
 * source (`404`), the session label (`400`) and whether it is taken (`409`),
 * `at_seq` within `1..latest` (`400`), a policy bundle only with
 * `policies:write` (`403`) and only one that compiles (`400`); then the
 * programmatic overrides (`400` for a step that is not copied or a value
 * that is not JSON) and the test id hook (`409`). Nothing is written before
 * every check passed.
 *
 * The fork is created `pending` with `execution.created` and
 * `execution.forked`; the copied steps and their events, the source's
 * `resource.registered`/`resource.initialized` events up to the fork point,
 * then each resource's `resource.initialized` and its copied checkpoints
 * (`resource.checkpointed`, seqs mapped into the fork's log); then it starts
 * now, or — with a session — is admitted like any session execution.
 *
 * @since 0.2.0
 * @internal
 */
export const fork = (state: CoreState, sourceId: string, r: ForkRequest, now: number): ForkResult | KernelFailure => {
  const executions = state.executions
  const source = executions.byId.get(sourceId)
  if (source === undefined) return notFound()
  let session: string | undefined
  if (r.session !== undefined && r.session !== "") {
    if (!Sessions.isLabel(r.session)) return Sessions.badLabel("session")
    if (executions.sessions.has(r.session)) return sessionTaken(r.session)
    session = r.session
  }
  const latest = source.events.length
  const atSeq = r.atSeq
  if (!Number.isInteger(atSeq) || atSeq < 1 || atSeq > latest) {
    return validation("validation error: at_seq must be between 1 and " + latest)
  }
  let policy: OwnPolicy | undefined = source.policy
  const bundleText = r.policyBundle ?? ""
  if (bundleText !== "") {
    if (r.mayWritePolicies === false) return policyForbidden()
    const parsed = Policy.parseBundle(bundleText, { stage: "current" })
    if (Result.isFailure(parsed)) return validation("validation error: invalid policy bundle: " + parsed.failure)
    policy = { text: bundleText, bundle: parsed.success }
  }
  const copied = settledBy(source, atSeq)
  const overrides = new Map<string, { readonly status: "succeeded" | "failed"; readonly raw: string }>()
  if (r.overrides !== undefined) {
    for (const [stepId, override] of Object.entries(r.overrides)) {
      if (!copied.has(stepId)) {
        return validation("validation error: overrides name a step that is not copied: " + goQuote(stepId))
      }
      const outcome = overrideOutcome(override)
      if (outcome === undefined) return validation("validation error: override of " + goQuote(stepId) + " is not JSON")
      overrides.set(stepId, outcome)
    }
  }
  const id = executions.idFor(r.id, now)
  if (id === undefined) return conflict()

  // Where each resource starts from (step 4), known before anything is written.
  const forked: Array<{
    readonly source: ResourceState
    readonly checkpoint: CheckpointState | undefined
    readonly covered: boolean
  }> = []
  if (source.resources !== undefined) {
    for (const res of source.resources.values()) {
      if (res.registeredSeq > atSeq) continue
      forked.push({ source: res, ...select(source, res.key, atSeq) })
    }
  }
  const restoration: Array<Restoration> | undefined = forked.length === 0 ? undefined : forked
    .map((f) => ({
      key: f.source.key,
      checkpointRef: f.checkpoint?.checkpointRef,
      checkpointSeq: f.checkpoint?.coveredSeq,
      covered: f.covered
    }))
    .sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0))

  // 1. the execution
  let record = pendingRecord(
    id,
    { agentId: source.record.agentId, agentVersion: undefined, inputRaw: source.record.inputRaw },
    now,
    state.settings.deadlineMs
  )
  if (session !== undefined) record = { ...record, session }
  if (source.record.parentExecutionId !== undefined) {
    record = { ...record, parentExecutionId: source.record.parentExecutionId }
  }
  record = { ...record, forkedFrom: source.record.id, forkSeq: atSeq }
  const ex = executions.add(record)
  ex.policy = policy

  // 2. its first events
  ex.events.push(
    "execution.created",
    Payload.executionPayload(id, "pending", {
      deadlineAt: record.deadlineAtMs === undefined ? undefined : formatTimestamp(record.deadlineAtMs),
      session
    }),
    now
  )
  ex.events.push(
    "execution.forked",
    Payload.executionForkedPayload(
      source.record.id,
      atSeq,
      bundleText !== "",
      restoration === undefined ? undefined : Payload.restorationJson(restoration)
    ),
    now
  )

  // 3. the copied steps, in the source's order, under the fork's step ids
  const renamed = new Map<string, StepState>()
  for (const step of source.order) {
    if (!copied.has(step.stepId)) continue
    const copy = new StepState(
      StepId.make({
        executionId: id,
        kind: step.kind,
        target: step.target,
        argsHash: step.argsHash,
        occurrence: step.occurrence
      }),
      id,
      step.kind,
      step.target,
      step.argsHash,
      step.occurrence,
      step.idempotency,
      step.argsRaw,
      step.submittedArgsRaw,
      ex.order.length
    )
    const override = overrides.get(step.stepId)
    if (override === undefined) {
      copy.set(step.status, step.resultRaw, step.errorRaw, step.startedAtMs, step.completedAtMs)
      copy.usage = step.usage
    } else if (override.status === "succeeded") {
      copy.set("succeeded", override.raw, undefined, step.startedAtMs, step.completedAtMs)
    } else {
      copy.set("failed", undefined, override.raw, step.startedAtMs, step.completedAtMs)
    }
    copy.resources = step.resources
    ex.steps.set(copy.stepId, copy)
    ex.order.push(copy)
    if (copy.status === "failed" && isIndeterminateError(copy.errorRaw)) Steps.markIndeterminate(ex, copy)
    renamed.set(step.stepId, copy)
  }
  // …with their events and the resource events, in source order; `forkSeqOf[s]`
  // is the fork's seq of the last event copied at or before source seq `s`
  const forkSeqOf: Array<number> = [ex.events.length]
  for (let i = 0; i < atSeq; i++) {
    const type = source.events.typeAt(i)
    const { data, options } = source.events.dataAt(i)
    if (isStepEvent(data)) {
      const copy = renamed.get(data.stepId)
      if (copy !== undefined && type.startsWith("step.")) {
        const override = overrides.get(data.stepId)
        if (override !== undefined && SETTLED_EVENTS.has(type)) {
          if (override.status === "succeeded") ex.events.pushStep("step.succeeded", now, copy)
          else ex.events.pushStep("step.failed", now, copy, { error: override.raw })
        } else {
          ex.events.pushStep(type, now, copy, options)
        }
      }
    } else if (type === "resource.registered" || type === "resource.initialized") {
      ex.events.push(type, data, now)
    }
    forkSeqOf.push(ex.events.length)
  }
  const mapSeq = (seq: number): number => forkSeqOf[Math.min(seq, atSeq)]!

  // 4. the resources, from their selected checkpoints
  for (const f of forked) {
    const res = f.source
    const generation = generationAt(res, atSeq) + (f.covered ? 0 : 1)
    let count = 0
    for (const copy of ex.order) {
      if (copy.status !== "denied" && copy.resources !== undefined && copy.resources.includes(res.key)) count++
    }
    const checkpointRef = f.checkpoint?.checkpointRef
    const created = Resources.redeclared(res, ex.events.length + 1, {
      generation,
      count,
      bindingRaw: undefined,
      bindingCanonical: undefined,
      checkpointRef
    })
    ;(ex.resources ??= new Map()).set(res.key, created)
    ex.events.push("resource.initialized", Payload.resourceInitializedPayload(res.key, generation, checkpointRef), now)
    for (const c of source.checkpoints ?? []) {
      if (c.key !== res.key || c.coveredSeq > atSeq) continue
      const coveredSeq = mapSeq(c.coveredSeq)
      ;(ex.checkpoints ??= []).push({
        key: c.key,
        generation: c.generation,
        checkpointRef: c.checkpointRef,
        coveredSeq,
        invalidatedSeq: c.invalidatedSeq === undefined || c.invalidatedSeq > atSeq ? undefined : mapSeq(c.invalidatedSeq)
      })
      ex.events.push(
        "resource.checkpointed",
        Payload.resourceCheckpointedPayload(c.key, c.generation, c.checkpointRef, coveredSeq),
        now
      )
    }
  }

  // 5. start now, or wait for the session like any session execution
  if (session === undefined) Lifecycle.start(state, ex, now)
  else Lifecycle.admit(state, session, now)
  return { execution: ex.record, restoration }
}
