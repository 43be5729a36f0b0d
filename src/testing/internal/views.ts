/**
 * What a client sees of the embedded kernel's core, as the test kit reports
 * it: executions, steps, events and approvals decoded through their exact
 * wire encoding, and the {@link RunResult} of a settled execution.
 *
 * @since 0.2.0
 * @internal
 */
import { Array as Arr, Effect } from "effect"
import type * as Core from "../../kernel/Core.js"
import * as Wire from "../../kernel/Wire.js"
import * as Protocol from "../../Protocol.js"
import type { KernelCall, RunResult, RunStep } from "../TestKernel.js"
import { fromWire } from "./directClient.js"

const decodeStep = (s: Core.StepRecord): Protocol.Step => fromWire(Protocol.Step, Wire.encodeStep(s))
const decodeEvent = (e: Core.EventRecord): Protocol.Event => fromWire(Protocol.Event, Wire.encodeEvent(e))

/** An enumerable property computed on first read and kept. */
const lazyProperty = <A>(compute: () => A): PropertyDescriptor => {
  let value: { readonly a: A } | undefined
  return {
    enumerable: true,
    get: () => (value ??= { a: compute() }).a
  }
}

/**
 * The execution as a client sees it.
 *
 * @since 0.2.0
 * @internal
 */
export const execution = (
  core: Core.KernelCore,
  executionId: string
): Effect.Effect<Protocol.Execution, Core.KernelFailure> =>
  Effect.map(core.getExecution(executionId), (r) => fromWire(Protocol.Execution, Wire.encodeExecution(r)))

/**
 * The execution's steps, sorted by step id as the kernel lists them.
 *
 * @since 0.2.0
 * @internal
 */
export const steps = (core: Core.KernelCore, executionId: string): Effect.Effect<ReadonlyArray<Protocol.Step>> =>
  Effect.map(core.listSteps(executionId, false), Arr.map(decodeStep))

/**
 * Steps in call order: by the position of each step's first `step.proposed`
 * event in the log (a fork's log carries its copied steps' events in the
 * source's order, PROTOCOL-CURRENT C.7.2), each with its 0-based `sequence`.
 * A step the log does not propose (none today) comes last, by step id.
 */
const inCallOrder = (
  records: ReadonlyArray<Core.StepRecord>,
  events: ReadonlyArray<Core.EventRecord>
): ReadonlyArray<RunStep> => {
  const position = new Map<string, number>()
  for (const event of events) {
    if (event.type !== "step.proposed") continue
    const stepId = (JSON.parse(event.payload) as { readonly step_id?: unknown }).step_id
    if (typeof stepId === "string" && !position.has(stepId)) position.set(stepId, event.seq)
  }
  const sorted = records.slice().sort((a, b) => {
    const pa = position.get(a.stepId) ?? Infinity
    const pb = position.get(b.stepId) ?? Infinity
    return pa !== pb ? pa - pb : a.stepId < b.stepId ? -1 : a.stepId > b.stepId ? 1 : 0
  })
  return sorted.map((record, sequence) => ({ ...decodeStep(record), sequence }))
}

/**
 * The execution's whole event log.
 *
 * @since 0.2.0
 * @internal
 */
export const events = (core: Core.KernelCore, executionId: string): Effect.Effect<ReadonlyArray<Protocol.Event>> =>
  Effect.map(core.eventLog(executionId), Arr.map(decodeEvent))

/**
 * Pending approvals (all executions, or one).
 *
 * @since 0.2.0
 * @internal
 */
export const approvals = (
  core: Core.KernelCore,
  executionId?: string
): Effect.Effect<ReadonlyArray<Protocol.Approval>> =>
  Effect.map(
    core.listApprovals(),
    (list) =>
      list
        .filter((a) => executionId === undefined || a.executionId === executionId)
        .map((a) => fromWire(Protocol.Approval, Wire.encodeApproval(a)))
  )

/** Every execution record matching a filter, page after page. */
const allExecutions = (
  core: Core.KernelCore,
  filter: { readonly agentId?: string; readonly session?: string }
): Effect.Effect<ReadonlyArray<Core.ExecutionRecord>> =>
  Effect.gen(function*() {
    const out: Array<Core.ExecutionRecord> = []
    let cursor: string | undefined
    while (true) {
      const page = yield* core.listExecutions({
        agentId: filter.agentId ?? "",
        status: "",
        cursor,
        limit: 200,
        ...(filter.session === undefined ? {} : { session: filter.session })
      })
      out.push(...page.executions)
      if (page.nextCursor === undefined) return out
      cursor = page.nextCursor
    }
  })

/**
 * The subagents of an execution (PROTOCOL-CURRENT C.5.1), as core records.
 *
 * @since 0.2.0
 * @internal
 */
export const children = (
  core: Core.KernelCore,
  executionId: string
): Effect.Effect<ReadonlyArray<Core.ExecutionRecord>> =>
  Effect.map(allExecutions(core, {}), (all) => all.filter((r) => r.spawnedBy?.executionId === executionId))

/**
 * The executions of a session (PROTOCOL-CURRENT C.4), as core records.
 *
 * @since 0.2.0
 * @internal
 */
export const sessionMembers = (
  core: Core.KernelCore,
  session: string
): Effect.Effect<ReadonlyArray<Core.ExecutionRecord>> =>
  Effect.map(allExecutions(core, { session }), (all) => all.filter((r) => r.session === session))

/**
 * What the kit knows of an execution's runs, beyond the core's records.
 *
 * @since 0.2.0
 * @internal
 */
export interface RunFacts {
  readonly deliveries: number
  /** The calls of the execution as they were at settling, read on first use. */
  readonly calls: () => ReadonlyArray<KernelCall>
  readonly crashed: boolean
  readonly lapsed: boolean
  readonly timedOut: boolean
}

/**
 * The execution as it is now, as a {@link RunResult}.
 *
 * @since 0.2.0
 * @internal
 */
export const runResult = (
  core: Core.KernelCore,
  executionId: string,
  facts: (executionId: string) => RunFacts
): Effect.Effect<RunResult, Core.KernelFailure> =>
  Effect.gen(function*() {
    const current = yield* execution(core, executionId)
    // Steps are copied now and events counted now (the log only grows); both
    // are decoded through the wire on first use: most tests never read them all.
    // (In submission order: `inCallOrder` sorts them completely.)
    const stepRecords = core.unsafeStepsInOrder(executionId)
    const log = core.unsafeEventLog(executionId)
    const eventCount = log?.length ?? 0
    let eventRecords: ReadonlyArray<Core.EventRecord> | undefined
    const records = () => (eventRecords ??= log?.slice(0, eventCount) ?? [])
    const { calls, ...known } = facts(executionId)
    const result: Omit<RunResult, "steps" | "events" | "calls"> = {
      executionId,
      status: current.status as Protocol.ExecutionStatus,
      output: current.output,
      // absent, not "", when there is none
      ...(current.failureReason === "" ? {} : { failureReason: current.failureReason }),
      execution: current,
      approvals: yield* approvals(core, executionId),
      ...known
    }
    return Object.defineProperties(result as RunResult, {
      steps: lazyProperty(() => inCallOrder(stepRecords, records())),
      events: lazyProperty(() => records().map(decodeEvent)),
      calls: lazyProperty(calls)
    })
  })
