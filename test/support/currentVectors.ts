/**
 * The C.14 vectors of the current stage (`shared/fixtures/current-vectors.json`),
 * typed, and the v1 request vectors replayed as the Python SDK sent them on a
 * kernel of their own.
 */
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { readFileSync } from "node:fs"
import * as Core from "../../src/kernel/Core.js"
import * as Routes from "../../src/kernel/Routes.js"
import { type HeaderInput, LEASE_SUPERSEDED, request } from "./currentRoutes.js"

export interface V1Vector {
  readonly name: string
  readonly method: string
  readonly target: string
  readonly dispatch_id: string
  readonly dispatch_attempt: string
  readonly body: string
  readonly signature: string
  readonly secret: string
  readonly timestamp: string
}

export const vectors = JSON.parse(
  readFileSync(new URL("../../../shared/fixtures/current-vectors.json", import.meta.url), "utf8")
) as {
  readonly v1_requests: ReadonlyArray<V1Vector>
  readonly resource_configuration_fingerprint: { readonly canonical: string; readonly sha256: string }
  readonly fork_rename: {
    readonly kind: string
    readonly target: string
    readonly occurrence: number
    readonly args_canonical: string
    readonly args_hash: string
    readonly source_execution_id: string
    readonly source_step_id: string
    readonly fork_execution_id: string
    readonly fork_step_id: string
  }
  readonly api_key: { readonly token: string; readonly secret_part_length: number; readonly stored_sha256: string }
}

/** The v1 request vector named `name`. */
export const v1Vector = (name: string): V1Vector => vectors.v1_requests.find((v) => v.name === name)!

/** The execution id the v1 vectors' targets name. */
export const VECTOR_EXECUTION = "018f3a2b-4c5d-7e6f-8a9b-0c1d2e3f4a5b"

/** The vector's request as the Python SDK sends it (`test-agent`, lease headers when it has them). */
export const vectorRequest = (v: V1Vector, headers: HeaderInput = {}): Routes.KernelRequest =>
  request(v.method, v.target, {
    body: v.body,
    headers: {
      ...headers,
      "Rebuno-Agent-Id": "test-agent",
      "Rebuno-Timestamp": v.timestamp,
      "Rebuno-Signature": v.signature,
      ...(v.dispatch_id === "" ? {} : { "Rebuno-Dispatch-Id": v.dispatch_id, "Rebuno-Dispatch-Attempt": v.dispatch_attempt })
    }
  })

/**
 * A current-stage kernel with `test-agent` (the vector's secret) and a running
 * execution {@link VECTOR_EXECUTION} — its dispatch claimed when `claimed`, by
 * this kernel, so the vector's lease is not the live one — with the clock at
 * the vector's timestamp.
 */
export const vectorKernel = (v: V1Vector, options: { readonly claimed: boolean }) =>
  Effect.gen(function*() {
    const core = yield* Core.make({ stage: "current" })
    yield* core.registerAgent({ id: "test-agent", webhookUrl: "http://localhost:5000/webhook", secret: v.secret })
    yield* core.createExecution({
      agentId: "test-agent",
      inputRaw: undefined,
      agentVersion: undefined,
      id: VECTOR_EXECUTION
    })
    if (options.claimed) yield* core.claimDue(10)
    yield* TestClock.setTime(Number(v.timestamp) * 1000)
    return { core, handle: Routes.make(core), id: VECTOR_EXECUTION }
  })

/**
 * The vector on {@link vectorKernel} with the dispatch claimed: signed right,
 * but its lease is not this kernel's, so 409 `lease_superseded` and nothing
 * written. Answers the kernel for further checks.
 */
export const expectVectorLeaseSuperseded = (v: V1Vector) =>
  Effect.gen(function*() {
    const kernel = yield* vectorKernel(v, { claimed: true })
    const before = yield* kernel.core.eventLog(kernel.id)
    const res = yield* kernel.handle(vectorRequest(v))
    expect(res.status).toBe(409)
    expect(res.body).toBe(LEASE_SUPERSEDED)
    expect(yield* kernel.core.eventLog(kernel.id)).toEqual(before)
    return kernel
  })
