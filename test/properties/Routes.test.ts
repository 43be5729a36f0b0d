/**
 * Property-based bad input against every route of the embedded kernel
 * (PROTOCOL 2.1), in-process through `Routes.make(core)`. Requests are derived
 * from valid ones by mutation (body, path ids, method, lease headers, agent
 * id, signature, bearer token) and sent in short sequences against a seeded
 * kernel (a running execution with an executing step, one blocked on a pending
 * approval, a completed one). For every request:
 *
 * - it completes without any clock time passing (no hang) and is never a 5xx
 *   (a defect would surface as `500`);
 * - the status is one the protocol gives that route (or the routing 404/405);
 * - bodies are exact: JSON errors are exactly `{"code":…,"message":…}\n` with a
 *   code/message pair of 13.2, 204/405 have no body and no content type, the
 *   routing 404 is the plain-text page;
 * - the check order of 3.3/6.0 holds where the outcome is certain: a bad
 *   signature or agent id is `401`, then a non-UUID `{id}` is `400`, then a
 *   body that cannot decode is `400 validation error`, then bad lease headers
 *   are `400` with their own messages; bearer routes answer `401` exactly when
 *   a configured token does not match.
 *
 * After each sequence the kernel must keep serving: every execution's events
 * are still dense from 1, and a complete valid flow (register, create, submit,
 * complete step, complete execution) succeeds.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Result } from "effect"
import * as fc from "fast-check"
import * as Signature from "../../src/Signature.js"
import {
  build,
  checkProperty,
  KERNEL_AGENT,
  propertyRuns,
  propertyTimeout,
  requestPlan,
  secretArb,
  seed,
  send,
  validFlow,
  verdict,
  invariants
} from "../support/arbitraries.js"

describe("property: bad input to every kernel route (in-process)", () => {
  it.effect("never a 5xx or a hang, only protocol statuses, exact envelopes; the kernel keeps serving", () =>
    Effect.gen(function*() {
      const report = yield* checkProperty(
        "kernel routes",
        fc.record({
          tokenMode: fc.boolean(),
          secret: secretArb,
          requests: fc.array(requestPlan, { minLength: 1, maxLength: 4 })
        }),
        ({ requests, secret, tokenMode }) =>
          Effect.gen(function*() {
            const world = yield* seed(tokenMode, secret)
            for (const plan of requests) {
              const built = yield* build(world, plan)
              const record = yield* Effect.result(world.core.getAgent(KERNEL_AGENT))
              const secret = Result.isSuccess(record) ? record.success.secret : undefined
              const expected = secret === undefined || built.body._tag !== "Bytes"
                ? "<none>"
                : yield* Signature.sign(secret, built.body.bytes)
              const res = yield* send(world, built.request)
              const problem = verdict(world, built, res, secret, expected)
              if (problem !== undefined) return yield* Effect.die(new Error(problem))
            }
            yield* invariants(world)
            const probes = yield* validFlow(world)
            yield* invariants(world)
            return requests.length + probes
          }),
        { numRuns: propertyRuns(200) }
      )
      expect(report.numRuns).toBeGreaterThan(0)
    }), propertyTimeout)

  it.effect("every route answers its protocol statuses for each single mutation kind", () =>
    // A denser sweep: one request per run, every route equally likely, so rare
    // routes and mutation kinds meet each other often.
    Effect.gen(function*() {
      yield* checkProperty(
        "kernel routes (single requests)",
        fc.tuple(requestPlan, fc.boolean(), secretArb),
        ([plan, tokenMode, secret]) =>
          Effect.gen(function*() {
            const world = yield* seed(tokenMode, secret)
            const built = yield* build(world, plan)
            const expected = built.body._tag === "Bytes" ? yield* Signature.sign(secret, built.body.bytes) : "<none>"
            const res = yield* send(world, built.request)
            const problem = verdict(world, built, res, secret, expected)
            if (problem !== undefined) return yield* Effect.die(new Error(problem))
            yield* invariants(world)
            return 1
          }),
        { numRuns: propertyRuns(300) }
      )
    }), propertyTimeout)
})
