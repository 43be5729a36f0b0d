/**
 * Resources and checkpoints of the kernel core in the current stage
 * (PROTOCOL-CURRENT C.6): registering a resource on an execution (C.6.2),
 * binding it (C.6.3), the resources a step declares and what starting it
 * touches — generations, `due`, invalidated checkpoints (C.6.4) —, the
 * captures reported with a step outcome or on their own (C.6.5, C.6.6),
 * counting settled steps, and the resources a session execution inherits from
 * its parent (C.6.7). The kernel keeps only bindings, checkpoint references
 * and coverage; the contents stay with the agent's driver.
 *
 * @since 0.2.0
 * @internal
 */
import { hash } from "node:crypto"
import * as Json from "../../internal/wire/json.js"
import type { CheckpointState, ExecState, ResourceState } from "./executions.js"
import { goQuote } from "./goQuote.js"
import type {
  CaptureRecords,
  CheckpointRecord,
  ForkPoints,
  Lease,
  ResourceRecord,
  ResourceRegistration,
  ResourceTouch
} from "./model.js"
import {
  executionTerminal,
  isTerminalExecution,
  KernelFailure,
  leaseSuperseded,
  notFound,
  validation
} from "./model.js"
import * as Payload from "./payloads.js"
import type { CoreState } from "./state.js"
import type { StepState } from "./stepState.js"
import { compactRaw } from "./storedJson.js"

// ---------------------------------------------------------------------------
// Checks (C.6.2, C.6.3, C.6.4)
// ---------------------------------------------------------------------------

const KEY = /^[A-Za-z0-9_.-]{1,128}$/

/**
 * Whether `key` is a valid resource key, `^[A-Za-z0-9_.-]{1,128}$` (C.6.1).
 *
 * @since 0.2.0
 * @internal
 */
export const isKey = (key: string): boolean => KEY.test(key)

/** SHA-256 of the canonical configuration; `null` stands for none (absent or JSON `null`). */
const fingerprintOf = (canonical: string | undefined): string => hash("sha256", canonical ?? "null", "hex")

/** The canonical JSON of a configuration (`undefined` for none), or the `400` of C.6.2. */
const canonicalConfiguration = (raw: string | undefined): string | undefined | KernelFailure => {
  if (raw === undefined || raw === "null") return undefined
  const canonical = Json.canonicalize(raw)
  if (canonical !== undefined) return canonical
  let detail = "nested too deeply"
  try {
    JSON.parse(raw)
  } catch (e) {
    detail = e instanceof Error ? e.message : String(e)
  }
  return validation("validation error: invalid configuration: " + detail)
}

/**
 * The member checks of a registration, in the order of C.6.2: `key`,
 * `driver_id`, `every_steps`, `configuration`. They come before any lookup
 * (the routes run them before the ownership check).
 *
 * @since 0.2.0
 * @internal
 */
export const checkRegistration = (r: ResourceRegistration): KernelFailure | undefined => {
  if (!isKey(r.key)) return validation("validation error: key must match ^[A-Za-z0-9_.-]{1,128}$")
  if (r.driverId === "") return validation("validation error: driver_id is required")
  if ((r.everySteps ?? 0) < 0) return validation("validation error: every_steps must be positive")
  const canonical = canonicalConfiguration(r.configurationRaw)
  return canonical instanceof KernelFailure ? canonical : undefined
}

/**
 * The body check of C.6.3: a missing or `null` binding is
 * `400 validation error: binding is required` (before any lookup).
 *
 * @since 0.2.0
 * @internal
 */
export const checkBinding = (bindingRaw: string | undefined): KernelFailure | undefined =>
  bindingRaw === undefined || bindingRaw === "null" ? validation("validation error: binding is required") : undefined

/**
 * The resources a new step declares (C.6.4, C.8.1 step 8): `undefined` for
 * none (an `llm_call`'s declaration is ignored), else the declared keys in
 * registration order, or `400 validation error: unknown resource "<key>"`
 * for the first key that is not registered on the execution.
 *
 * @since 0.2.0
 * @internal
 */
export const declared = (
  ex: ExecState,
  kind: string,
  keys: ReadonlyArray<string> | undefined
): ReadonlyArray<string> | undefined | KernelFailure => {
  if (keys === undefined || keys.length === 0 || kind === "llm_call") return undefined
  const resources = ex.resources
  for (const key of keys) {
    if (resources?.has(key) !== true) return validation("validation error: unknown resource " + goQuote(key))
  }
  const affected: Array<string> = []
  for (const key of resources!.keys()) if (keys.includes(key)) affected.push(key)
  return affected
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

const isCovered = (ex: ExecState, r: ResourceState): boolean => {
  const checkpoints = ex.checkpoints
  if (checkpoints === undefined) return false
  for (const c of checkpoints) {
    if (c.key === r.key && c.generation === r.generation && c.invalidatedSeq === undefined) return true
  }
  return false
}

/**
 * A resource as the register route answers it (C.6.1).
 *
 * @since 0.2.0
 * @internal
 */
export const toRecord = (ex: ExecState, r: ResourceState): ResourceRecord => ({
  key: r.key,
  driverId: r.driverId,
  configurationRaw: r.configurationRaw,
  coverageReuse: r.coverageReuse,
  everySteps: r.everySteps,
  onCompletion: r.onCompletion,
  registeredSeq: r.registeredSeq,
  generation: r.generation,
  count: r.count,
  bindingRaw: r.bindingRaw,
  checkpointRef: r.checkpointRef,
  covered: isCovered(ex, r)
})

const toCheckpoint = (c: CheckpointState): CheckpointRecord => ({
  key: c.key,
  generation: c.generation,
  checkpointRef: c.checkpointRef,
  coveredSeq: c.coveredSeq,
  invalidatedSeq: c.invalidatedSeq
})

/**
 * The resources of an execution in registration order; `404` when unknown.
 *
 * @since 0.2.0
 * @internal
 */
export const list = (state: CoreState, executionId: string): ReadonlyArray<ResourceRecord> | KernelFailure => {
  const ex = state.executions.byId.get(executionId)
  if (ex === undefined) return notFound()
  const out: Array<ResourceRecord> = []
  if (ex.resources !== undefined) for (const r of ex.resources.values()) out.push(toRecord(ex, r))
  return out
}

/**
 * `GET …/fork-points` (C.7.3): the latest seq, each resource's
 * `registered_seq` and every checkpoint; `404` when unknown.
 *
 * @since 0.2.0
 * @internal
 */
export const forkPoints = (state: CoreState, executionId: string): ForkPoints | KernelFailure => {
  const ex = state.executions.byId.get(executionId)
  if (ex === undefined) return notFound()
  const resources: Array<{ readonly key: string; readonly registeredSeq: number }> = []
  if (ex.resources !== undefined) {
    for (const r of ex.resources.values()) resources.push({ key: r.key, registeredSeq: r.registeredSeq })
  }
  return {
    latestSeq: ex.events.length,
    resources,
    checkpoints: ex.checkpoints === undefined ? [] : ex.checkpoints.map(toCheckpoint)
  }
}

// ---------------------------------------------------------------------------
// The agent routes (C.6.2, C.6.3, C.6.6)
// ---------------------------------------------------------------------------

/** 404 unknown, 409 terminal, the lease renewed (409 lease_superseded): the checks every resource route shares. */
const leased = (state: CoreState, executionId: string, lease: Lease, now: number): ExecState | KernelFailure => {
  const ex = state.executions.byId.get(executionId)
  if (ex === undefined) return notFound()
  if (isTerminalExecution(ex.record.status)) return executionTerminal()
  if (state.dispatches.renewLease(executionId, lease, now) === undefined) return leaseSuperseded()
  return ex
}

const registeredConflict = (key: string): KernelFailure =>
  new KernelFailure({
    status: 409,
    code: "conflict",
    message: "conflict: resource " + goQuote(key) +
      " is registered with another driver, configuration, or coverage_reuse"
  })

/** Append `resource.registered` for the resource's identity and policy as they are now. */
const appendRegistered = (ex: ExecState, r: ResourceState, now: number): void => {
  ex.events.push("resource.registered", Payload.resourceRegisteredPayload(r), now)
}

/**
 * `POST …/resources` (C.6.2), after the member checks: a new key is stored
 * with generation 0 and count 0 (`resource.registered`); an existing key must
 * have the same driver, configuration (canonical JSON, hashed) and
 * `coverage_reuse`, else `409 conflict`, and answers as it is now. An existing
 * key whose checkpointing is off is switched on by a positive `every_steps`
 * (a new `resource.registered`); an enabled policy is never changed.
 *
 * @since 0.2.0
 * @internal
 */
export const register = (
  state: CoreState,
  executionId: string,
  lease: Lease,
  r: ResourceRegistration,
  now: number
): ResourceRecord | KernelFailure => {
  const bad = checkRegistration(r)
  if (bad !== undefined) return bad
  const ex = leased(state, executionId, lease, now)
  if (ex instanceof KernelFailure) return ex
  const canonical = canonicalConfiguration(r.configurationRaw) as string | undefined
  const fingerprint = fingerprintOf(canonical)
  const coverageReuse = r.coverageReuse ?? false
  const everySteps = r.everySteps ?? 0
  const onCompletion = r.onCompletion ?? everySteps > 0
  const resources = ex.resources ??= new Map()
  const existing = resources.get(r.key)
  if (existing === undefined) {
    const created: ResourceState = {
      key: r.key,
      driverId: r.driverId,
      configurationRaw: canonical === undefined ? undefined : compactRaw(r.configurationRaw),
      fingerprint,
      coverageReuse,
      everySteps,
      onCompletion,
      registeredSeq: ex.events.length + 1,
      generation: 0,
      count: 0,
      bindingRaw: undefined,
      bindingCanonical: undefined,
      checkpointRef: undefined,
      generations: [{ seq: ex.events.length + 1, generation: 0 }]
    }
    resources.set(r.key, created)
    appendRegistered(ex, created, now)
    return toRecord(ex, created)
  }
  if (
    existing.driverId !== r.driverId || existing.fingerprint !== fingerprint ||
    existing.coverageReuse !== coverageReuse
  ) {
    return registeredConflict(r.key)
  }
  if (existing.everySteps === 0 && everySteps > 0) {
    existing.everySteps = everySteps
    existing.onCompletion = onCompletion
    appendRegistered(ex, existing, now)
  }
  return toRecord(ex, existing)
}

/**
 * `POST …/resources/{key}/binding` (C.6.3), after the body check: unknown key
 * `404`; bound to canonically equal JSON: nothing written; bound to other JSON
 * `409 conflict`; else stored with `resource.bound`.
 *
 * @since 0.2.0
 * @internal
 */
export const bind = (
  state: CoreState,
  executionId: string,
  key: string,
  lease: Lease,
  bindingRaw: string | undefined,
  now: number
): void | KernelFailure => {
  const bad = checkBinding(bindingRaw)
  if (bad !== undefined) return bad
  const ex = leased(state, executionId, lease, now)
  if (ex instanceof KernelFailure) return ex
  const r = ex.resources?.get(key)
  if (r === undefined) return notFound()
  const canonical = Json.canonicalize(bindingRaw!)
  if (canonical === undefined) return validation("validation error: binding is required")
  if (r.bindingCanonical !== undefined) {
    if (r.bindingCanonical === canonical) return
    return new KernelFailure({
      status: 409,
      code: "conflict",
      message: "conflict: resource " + goQuote(key) + " is already bound"
    })
  }
  r.bindingRaw = compactRaw(bindingRaw)
  r.bindingCanonical = canonical
  ex.events.push("resource.bound", Payload.resourceBoundPayload(key, r.bindingRaw!), now)
}

/**
 * `POST …/resources/checkpoints` (C.6.6): the captures recorded as on a step
 * outcome, covering from the execution's latest seq.
 *
 * @since 0.2.0
 * @internal
 */
export const publish = (
  state: CoreState,
  executionId: string,
  lease: Lease,
  records: CaptureRecords,
  now: number
): void | KernelFailure => {
  const ex = leased(state, executionId, lease, now)
  if (ex instanceof KernelFailure) return ex
  recordCaptures(ex, records, ex.events.length, now)
}

// ---------------------------------------------------------------------------
// Steps (C.6.4, C.6.5)
// ---------------------------------------------------------------------------

/** Whether an `executing` step (other than the one settling) declares `key`. */
const writersActive = (ex: ExecState, key: string): boolean => {
  for (const step of ex.order) {
    if (step.status === "executing" && step.resources !== undefined && step.resources.includes(key)) return true
  }
  return false
}

/**
 * C.6.5 steps 2–3: each capture failure → `resource.checkpoint_failed`; each
 * capture, in order, refused with `resource.checkpoint_failed` and the first
 * of `unknown_resource`, `missing_checkpoint_ref`, `duplicate_capture`,
 * `stale_generation`, `writers_active`, or stored as a checkpoint covering
 * from `coveredSeq` with `resource.checkpointed`. Refusals never fail the
 * request.
 *
 * @since 0.2.0
 * @internal
 */
export const recordCaptures = (ex: ExecState, records: CaptureRecords, coveredSeq: number, now: number): void => {
  const failures = records.captureFailures
  if (failures !== undefined) {
    for (const f of failures) {
      ex.events.push("resource.checkpoint_failed", Payload.resourceCheckpointFailedPayload(f.key, f.generation, f.error), now)
    }
  }
  const captures = records.captures
  if (captures === undefined || captures.length === 0) return
  const accepted = new Set<string>()
  for (const c of captures) {
    const r = ex.resources?.get(c.key)
    const refusal = r === undefined
      ? "unknown_resource"
      : c.checkpointRef === ""
      ? "missing_checkpoint_ref"
      : accepted.has(c.key)
      ? "duplicate_capture"
      : c.generation !== r.generation
      ? "stale_generation"
      : writersActive(ex, c.key)
      ? "writers_active"
      : undefined
    if (refusal !== undefined) {
      ex.events.push(
        "resource.checkpoint_failed",
        Payload.resourceCheckpointFailedPayload(c.key, c.generation, refusal),
        now
      )
      continue
    }
    accepted.add(c.key)
    ;(ex.checkpoints ??= []).push({
      key: c.key,
      generation: c.generation,
      checkpointRef: c.checkpointRef,
      coveredSeq,
      invalidatedSeq: undefined
    })
    ex.events.push(
      "resource.checkpointed",
      Payload.resourceCheckpointedPayload(c.key, c.generation, c.checkpointRef, coveredSeq),
      now
    )
  }
}

/**
 * A step starts (C.6.4): over every registered resource, one the step does
 * not declare and that has `coverage_reuse` is skipped; every other one gets
 * `generation + 1`, and a declared one is `due` when its next count is a
 * multiple of `every_steps` (never with checkpointing off). Appends
 * `step.executing` — with `resources` (the declared keys, when any) and
 * `generations` (every touched key) — when anything was touched or `always`,
 * and invalidates every open checkpoint of a touched key at that event's seq.
 * Answers the touched resources, `undefined` when none.
 *
 * @since 0.2.0
 * @internal
 */
export const begin = (
  ex: ExecState,
  step: StepState,
  now: number,
  always: boolean
): ReadonlyArray<ResourceTouch> | undefined => {
  const resources = ex.resources
  const affected = step.resources
  let touches: Array<ResourceTouch> | undefined
  let touched: Array<ResourceState> | undefined
  if (resources !== undefined) {
    for (const r of resources.values()) {
      const affects = affected !== undefined && affected.includes(r.key)
      if (!affects && r.coverageReuse) continue
      r.generation += 1
      const due = affects && r.everySteps > 0 && (r.count + 1) % r.everySteps === 0
      ;(touches ??= []).push({ key: r.key, generation: r.generation, due })
      ;(touched ??= []).push(r)
    }
  }
  if (touched === undefined) {
    if (always) ex.events.pushStep("step.executing", now, step)
    return undefined
  }
  const generations = touched.slice().sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0))
  let generationsRaw = "{"
  for (let i = 0; i < generations.length; i++) {
    const r = generations[i]!
    generationsRaw += (i > 0 ? "," : "") + Json.quoteString(r.key) + ":" + r.generation
  }
  generationsRaw += "}"
  ex.events.pushStep("step.executing", now, step, {
    generations: generationsRaw,
    resources: affected === undefined ? undefined : "[" + affected.map(Json.quoteString).join(",") + "]"
  })
  const seq = ex.events.length
  for (const r of touched) r.generations.push({ seq, generation: r.generation })
  const checkpoints = ex.checkpoints
  if (checkpoints !== undefined) {
    for (const c of checkpoints) {
      if (c.invalidatedSeq === undefined && touched.some((r) => r.key === c.key)) c.invalidatedSeq = seq
    }
  }
  return touches
}

/**
 * A step that started has settled — succeeded, failed, cancelled, or settled
 * by its subagent (C.6.5 step 1, C.5.3): each resource it declared counts it.
 *
 * @since 0.2.0
 * @internal
 */
export const count = (ex: ExecState, step: StepState): void => {
  const keys = step.resources
  const resources = ex.resources
  if (keys === undefined || resources === undefined) return
  for (const key of keys) {
    const r = resources.get(key)
    if (r !== undefined) r.count += 1
  }
}

// ---------------------------------------------------------------------------
// Inheritance (C.6.7)
// ---------------------------------------------------------------------------

/**
 * A resource with the declaration of `from` (key, driver, configuration,
 * coverage reuse, checkpoint policy) registered again at `seq` — in a session
 * child ({@link inherit}) or a fork — with this generation, step count,
 * binding and checkpoint.
 *
 * @since 0.2.0
 * @internal
 */
export const redeclared = (
  from: ResourceState,
  seq: number,
  at: Pick<ResourceState, "generation" | "count" | "bindingRaw" | "bindingCanonical" | "checkpointRef">
): ResourceState => ({
  key: from.key,
  driverId: from.driverId,
  configurationRaw: from.configurationRaw,
  fingerprint: from.fingerprint,
  coverageReuse: from.coverageReuse,
  everySteps: from.everySteps,
  onCompletion: from.onCompletion,
  registeredSeq: seq,
  generation: at.generation,
  count: at.count,
  bindingRaw: at.bindingRaw,
  bindingCanonical: at.bindingCanonical,
  checkpointRef: at.checkpointRef,
  generations: [{ seq, generation: at.generation }]
})

/**
 * A session execution that starts after its parent in the same session (not a
 * fork) inherits the parent's resources: the same driver, configuration,
 * `coverage_reuse`, policy and binding; generation 0, count 0, no checkpoint
 * reference; a `resource.registered` (and `resource.bound`) event each.
 *
 * @since 0.2.0
 * @internal
 */
export const inherit = (ex: ExecState, parent: ExecState, now: number): void => {
  const from = parent.resources
  if (from === undefined || from.size === 0) return
  const resources = ex.resources ??= new Map()
  for (const p of from.values()) {
    if (resources.has(p.key)) continue
    const r = redeclared(p, ex.events.length + 1, {
      generation: 0,
      count: 0,
      bindingRaw: p.bindingRaw,
      bindingCanonical: p.bindingCanonical,
      checkpointRef: undefined
    })
    resources.set(r.key, r)
    appendRegistered(ex, r, now)
    if (r.bindingRaw !== undefined) ex.events.push("resource.bound", Payload.resourceBoundPayload(r.key, r.bindingRaw), now)
  }
}
