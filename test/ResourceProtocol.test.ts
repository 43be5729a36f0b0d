/**
 * The wire models of resources and forks (PROTOCOL-CURRENT C.6, C.7) in
 * `Protocol`: the `resources` of a step decision (the hand-written decoder
 * of the hot path and the schema agree), the resource object, the request
 * bodies, and the restoration of a fork.
 */
import { describe, expect, it } from "@effect/vitest"
import { Schema } from "effect"
import * as Protocol from "../src/Protocol.js"

const STEP = "a".repeat(64)
const decode = <S extends Schema.Top & { readonly DecodingServices: never }>(schema: S, u: unknown) =>
  Schema.decodeUnknownSync(schema)(u)

describe("Protocol: resources on a decision (C.6.4)", () => {
  it("the touched resources, `due` false when omitted; absent when none", () => {
    const wire = {
      decision: "proceed",
      step_id: STEP,
      resources: [{ key: "workspace", generation: 5, due: true }, { key: "db", generation: 3 }]
    }
    const expected = {
      decision: "proceed",
      stepId: STEP,
      resources: [{ key: "workspace", generation: 5, due: true }, { key: "db", generation: 3, due: false }]
    }
    expect(Protocol.decodeStepDecision(wire)).toEqual(expected)
    expect(decode(Protocol.StepDecision, wire)).toEqual(expected)
    for (const resources of [[], null, undefined]) {
      const bare = { decision: "proceed", step_id: STEP, ...(resources === undefined ? {} : { resources }) }
      expect(Protocol.decodeStepDecision(bare)).toEqual({ decision: "proceed", stepId: STEP })
      expect(decode(Protocol.StepDecision, bare)).toEqual({ decision: "proceed", stepId: STEP })
    }
  })

  it("the hot-path decoder leaves out malformed entries instead of failing the step", () => {
    expect(
      Protocol.decodeStepDecision({
        decision: "proceed",
        step_id: STEP,
        resources: [1, null, { generation: 2 }, { key: "" }, { key: "ok", generation: "x", due: "yes" }]
      })
    ).toEqual({ decision: "proceed", stepId: STEP, resources: [{ key: "ok", generation: 0, due: false }] })
    expect(Protocol.decodeStepDecision({ decision: "proceed", step_id: STEP, resources: "workspace" })).toEqual({
      decision: "proceed",
      stepId: STEP
    })
  })
})

describe("Protocol: resource objects and bodies (C.6.1–C.6.6)", () => {
  it("a resource object decodes leniently; binding and configuration present exactly when sent", () => {
    expect(decode(Protocol.Resource, { key: "w", driver_id: "d", binding: null })).toEqual({
      key: "w",
      driverId: "d",
      coverageReuse: false,
      everySteps: 0,
      onCompletion: false,
      registeredSeq: 0,
      generation: 0,
      count: 0,
      binding: null,
      covered: false
    })
  })

  it("the request bodies decode what the SDK sends", () => {
    expect(decode(Protocol.SubmitStepBody, { kind: "local", target: "t", args: {}, idempotency: "safe_to_retry", resources: ["w"] }))
      .toEqual({ kind: "local", target: "t", args: {}, idempotency: "safe_to_retry", resources: ["w"] })
    expect(
      decode(Protocol.CompleteStepBody, {
        result: 1,
        captures: [{ key: "w", generation: 5, checkpoint_ref: "s" }],
        capture_failures: [{ key: "d", generation: 3, error: "e" }]
      })
    ).toEqual({
      result: 1,
      captures: [{ key: "w", generation: 5, checkpointRef: "s" }],
      captureFailures: [{ key: "d", generation: 3, error: "e" }]
    })
    expect(decode(Protocol.FailStepBody, { error: { message: "x" } })).toEqual({ error: { message: "x" } })
    expect(
      decode(Protocol.RegisterResourceBody, {
        key: "w",
        driver_id: "d",
        configuration: null,
        coverage_reuse: false,
        every_steps: 1,
        on_completion: true
      })
    ).toEqual({ key: "w", driverId: "d", configuration: null, coverageReuse: false, everySteps: 1, onCompletion: true })
    expect(decode(Protocol.BindResourceBody, { binding: { id: 1 } })).toEqual({ binding: { id: 1 } })
    expect(decode(Protocol.CheckpointsBody, {})).toEqual({})
    expect(decode(Protocol.ForkBody, { at_seq: 3, policy_bundle: "x" })).toEqual({ atSeq: 3, policyBundle: "x" })
  })
})
