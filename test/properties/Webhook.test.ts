/**
 * Property-based bad input against the agent's webhook receiver (PROTOCOL 3.5,
 * 14.2), through `Agent.runtime(agent).handleWebhook` and through
 * `Agent.toWebHandler`. Webhook bodies are derived from a valid one by
 * mutation (the generic JSON mutations plus webhook-specific member values) and
 * signed correctly, with the pre-mutation body (stale), or with a corrupted
 * signature. Properties:
 *
 * - any signature that is not exactly `sha256=` + the lowercase hex HMAC of the
 *   received bytes is `401`, and nothing else happens (no kernel call);
 * - a correctly signed body that is not an acceptable notice (14.2 step 2) is
 *   `400`, and nothing else happens;
 * - anything else is `200` (a new run or a duplicate); over HTTP, a body over
 *   `Agent.maxWebhookBodyBytes` is `401` before any of this;
 * - each delivery completes without clock time passing, never dies, and the
 *   receiver keeps working afterwards.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Layer } from "effect"
import * as fc from "fast-check"
import * as Agent from "../../src/Agent.js"
import * as Signature from "../../src/Signature.js"
import * as TestLogs from "../support/logging.js"
import {
  checkProperty,
  completes,
  membersText,
  propertyRuns,
  propertyTimeout,
  signatureMode,
  stubKernel,
  webhookDelivery,
  webhookMembers,
  webhookPlan
} from "../support/arbitraries.js"

const SECRET = "webhook-prop-secret"
const encoder = new TextEncoder()

let handlerRuns = 0
const agent = Agent.make({ id: "prop-agent", handler: () => Effect.sync(() => void handlerRuns++) })

const uuid = fc.uuid({ version: 7 })

describe("property: bad webhooks to the agent", () => {
  it.effect("handleWebhook: 401 for any bad signature, 400 for a signed bad body, 200 otherwise", () =>
    Effect.gen(function*() {
      const kernel = stubKernel(SECRET)
      const rt = yield* Agent.runtime(agent).pipe(Effect.provide(kernel.layer))
      yield* checkProperty(
        "agent webhook (handleWebhook)",
        fc.array(fc.tuple(uuid, uuid, fc.integer({ min: 1, max: 5 }), webhookPlan, signatureMode), {
          minLength: 1,
          maxLength: 3
        }),
        (deliveries) =>
          Effect.gen(function*() {
            for (const [executionId, dispatchId, attempt, plan, mode] of deliveries) {
              const d = yield* webhookDelivery(SECRET, executionId, dispatchId, attempt, plan, mode)
              const before = kernel.calls.length
              const exit = yield* completes(rt.handleWebhook({ body: d.bytes, signature: d.signature }))
              if (Exit.isFailure(exit)) return yield* Effect.die(new Error(`${d.description}: handleWebhook died`))
              if (exit.value !== d.expected) {
                return yield* Effect.die(new Error(`${d.description}: got ${exit.value}, expected ${d.expected}`))
              }
              // Let an accepted run go its way (the stub kernel stops it at once).
              const idle = yield* completes(rt.awaitIdle)
              if (Exit.isFailure(idle)) return yield* Effect.die(new Error("runs did not end"))
              if (d.expected !== 200 && kernel.calls.length !== before) {
                return yield* Effect.die(new Error(`${d.description}: a rejected webhook reached the kernel`))
              }
            }
            return deliveries.length
          }),
        { numRuns: propertyRuns(300) }
      )
      // Still serving: a valid delivery starts a run that asks the kernel for its execution.
      const body = encoder.encode(membersText(webhookMembers("0192f1a0-0000-7000-8000-00000000aaaa", "d", 1)))
      const before = kernel.calls.length
      expect(yield* rt.handleWebhook({ body, signature: yield* Signature.sign(SECRET, body) })).toBe(200)
      yield* rt.awaitIdle
      expect(kernel.calls.slice(before)).toEqual(["getExecution 0192f1a0-0000-7000-8000-00000000aaaa"])
      expect(yield* rt.activeRuns).toBe(0)
      expect(handlerRuns).toBe(0)
    }), propertyTimeout)

  it.effect("toWebHandler: the same verdicts through Request → Response", () =>
    Effect.gen(function*() {
      const kernel = stubKernel(SECRET)
      const web = Agent.toWebHandler(agent, Layer.merge(kernel.layer, TestLogs.layer))
      yield* Effect.addFinalizer(() => Effect.promise(() => web.dispose()))
      yield* checkProperty(
        "agent webhook (toWebHandler)",
        fc.tuple(uuid, uuid, fc.integer({ min: 1, max: 5 }), webhookPlan, signatureMode),
        ([executionId, dispatchId, attempt, plan, mode]) =>
          Effect.gen(function*() {
            const d = yield* webhookDelivery(SECRET, executionId, dispatchId, attempt, plan, mode)
            const headers: Record<string, string> = { "content-type": "application/json" }
            if (d.signature !== undefined) headers["rebuno-signature"] = d.signature
            const request = new Request("http://agent.test/webhook", { method: "POST", headers, body: new Uint8Array(d.bytes) })
            const exit = yield* completes(Effect.promise(() => web.handler(request)))
            if (Exit.isFailure(exit)) return yield* Effect.die(new Error(`${d.description}: handler did not answer`))
            const response = exit.value
            // The HTTP adapters refuse bodies over the cap before anything else.
            const expected = d.bytes.length > Agent.maxWebhookBodyBytes ? 401 : d.expected
            if (response.status !== expected) {
              return yield* Effect.die(new Error(`${d.description}: got ${response.status}, expected ${expected}`))
            }
            if ((yield* Effect.promise(() => response.text())) !== "") {
              return yield* Effect.die(new Error(`${d.description}: the answer must have an empty body`))
            }
            return 1
          }),
        { numRuns: propertyRuns(150) }
      )
    }), propertyTimeout)
})
