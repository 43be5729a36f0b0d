/**
 * Security properties of the signatures (PROTOCOL 3.1–3.3, 3.5, 17.B), tested
 * by behaviour — no timing measurements:
 *
 * - comparisons look at the whole value: a mismatch at any single position,
 *   any truncation or extension, a different length that only adds `\0`, a
 *   case change of the hex, all fail; equal values pass (`timingSafeEqual`,
 *   `Signature.verify`, `Signature.verifyV1`, the kernel's bearer check and its
 *   `sha256=` agent check);
 * - the `v1=` freshness window of the embedded kernel is ±300 s inclusive on
 *   Effect's clock, whole seconds (301 s off is refused, also with a
 *   sub-second clock), and only base-10 integer timestamps count;
 * - a `v1=` signature binds method, target, timestamp and lease headers.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { TestClock } from "effect/testing"
import * as fc from "fast-check"
import * as Core from "../../src/kernel/Core.js"
import * as Routes from "../../src/kernel/Routes.js"
import * as Signature from "../../src/Signature.js"
import { checkProperty, propertyRuns, propertyTimeout } from "../support/arbitraries.js"

const SECRET = "security-secret"
const encoder = new TextEncoder()

/** Every single-position change of `s` (to a different character of the same class). */
const everyFlip = (s: string): ReadonlyArray<string> =>
  [...s].map((c, i) => s.slice(0, i) + (c === "0" ? "1" : c === "a" ? "b" : c === "=" ? "-" : "0") + s.slice(i + 1))

describe("constant-time, whole-value comparisons", () => {
  it("timingSafeEqual is string equality (property)", () =>
    fc.assert(
      fc.property(fc.string({ unit: "grapheme", maxLength: 40 }), fc.string({ unit: "grapheme", maxLength: 40 }), (a, b) => {
        expect(Signature.timingSafeEqual(a, b)).toBe(a === b)
        expect(Signature.timingSafeEqual(a, a)).toBe(true)
      }),
      { seed: 20261129, numRuns: propertyRuns(500) }
    ))

  it("timingSafeEqual: a difference at any position, or in length only, is unequal", () => {
    const value = "sha256=" + "0123456789abcdef".repeat(4)
    for (const flipped of everyFlip(value)) expect(Signature.timingSafeEqual(value, flipped)).toBe(false)
    for (let n = 0; n < value.length; n++) {
      expect(Signature.timingSafeEqual(value, value.slice(0, n))).toBe(false)
      expect(Signature.timingSafeEqual(value.slice(0, n), value)).toBe(false)
    }
    // Lengths that differ only by characters whose code is 0 must not compare equal.
    expect(Signature.timingSafeEqual("ab", "ab\u0000")).toBe(false)
    expect(Signature.timingSafeEqual("", "\u0000")).toBe(false)
    expect(Signature.timingSafeEqual("", "")).toBe(true)
  })

  it.effect("Signature.verify compares the whole header value", () =>
    Effect.gen(function*() {
      const body = encoder.encode("{\"execution_id\":\"e\",\"dispatch_id\":\"d\"}")
      const good = yield* Signature.sign(SECRET, body)
      expect(yield* Signature.verify(SECRET, body, good)).toBe(true)
      expect(yield* Signature.verify(Redacted.make(SECRET), body, good)).toBe(true)
      const wrong: Array<string | null | undefined> = [
        ...everyFlip(good),
        good.slice(0, -1),
        good + "0",
        good + " ",
        " " + good,
        good.toUpperCase(),
        "sha256=" + good.slice(7).toUpperCase(),
        "SHA256=" + good.slice(7),
        good.slice(7),
        "v1=" + good.slice(7),
        "sha256=",
        "",
        null,
        undefined,
        yield* Signature.sign(SECRET + " ", body),
        yield* Signature.sign(SECRET, new Uint8Array([...body, 0x20]))
      ]
      for (let n = 0; n < good.length; n++) wrong.push(good.slice(0, n))
      for (const header of wrong) expect(yield* Signature.verify(SECRET, body, header)).toBe(false)
    }))

  it.effect("Signature.verify: equal-length and different-length wrong signatures are false (property)", () =>
    Effect.gen(function*() {
      yield* checkProperty(
        "verify rejects every other header value",
        fc.tuple(fc.uint8Array({ maxLength: 64 }), fc.string({ maxLength: 80 }), fc.nat(), fc.integer({ min: 0, max: 15 })),
        ([body, junk, position, nibble]) =>
          Effect.gen(function*() {
            const good = yield* Signature.sign(SECRET, body)
            // Same length, one hex digit changed somewhere.
            const at = 7 + (position % 64)
            const digit = nibble.toString(16)
            const sameLength = good.slice(0, at) + digit + good.slice(at + 1)
            expect(yield* Signature.verify(SECRET, body, sameLength)).toBe(sameLength === good)
            // Anything else.
            expect(yield* Signature.verify(SECRET, body, junk)).toBe(junk === good)
            expect(yield* Signature.verify(SECRET, body, good + junk)).toBe(junk === "")
          }),
        { numRuns: propertyRuns(300) }
      )
    }), propertyTimeout)

  it.effect("Signature.verifyV1 compares the whole value too", () =>
    Effect.gen(function*() {
      const req: Signature.V1Request = {
        method: "POST",
        target: "/v0/executions/x/heartbeat",
        timestamp: "1700000000",
        dispatchId: "01920000-0000-7000-8000-000000000001",
        dispatchAttempt: "3",
        body: ""
      }
      const good = yield* Signature.signV1(SECRET, req)
      expect(yield* Signature.verifyV1(SECRET, req, good, 1_700_000_000)).toBe(true)
      for (const flipped of everyFlip(good)) expect(yield* Signature.verifyV1(SECRET, req, flipped, 1_700_000_000)).toBe(false)
      for (const other of [good + "0", good.slice(0, -1), good.toUpperCase(), "sha256=" + good.slice(3), ""]) {
        expect(yield* Signature.verifyV1(SECRET, req, other, 1_700_000_000)).toBe(false)
      }
    }))
})

// ---------------------------------------------------------------------------
// Through the kernel's routes
// ---------------------------------------------------------------------------

const headersOf = (record: Readonly<Record<string, string | ReadonlyArray<string>>>) => {
  const map = new Map<string, ReadonlyArray<string>>()
  for (const [k, v] of Object.entries(record)) map.set(k.toLowerCase(), typeof v === "string" ? [v] : v)
  return (name: string) => map.get(name.toLowerCase()) ?? []
}

const kernel = (options: Routes.Options = {}, stage: Core.Stage = "seed") =>
  Effect.gen(function*() {
    const core = yield* Core.make({ stage })
    yield* core.registerAgent({ id: "hello", webhookUrl: "http://agent.invalid/webhook", secret: SECRET })
    const execution = yield* core.createExecution({ agentId: "hello", inputRaw: "{}", agentVersion: undefined })
    const [claim] = yield* core.claimDue(10)
    const handle = Routes.make(core, options)
    const send = (method: string, url: string, headers: Readonly<Record<string, string | ReadonlyArray<string>>>, body = "") =>
      handle({ method, url, headers: headersOf(headers), body: encoder.encode(body) })
    return { core, send, id: execution.id, lease: claim! }
  })

describe("the kernel's credential checks compare whole values", () => {
  it.effect("bearer token: any other value of any length is 401", () =>
    Effect.gen(function*() {
      const token = "0123456789abcdef0123456789abcdef"
      const k = yield* kernel({ apiToken: Redacted.make(token) })
      const status = (authorization: string) =>
        Effect.map(k.send("GET", "/v0/agents", { authorization }), (res) => res.status)
      expect(yield* status("Bearer " + token)).toBe(200)
      for (const flipped of everyFlip(token)) expect(yield* status("Bearer " + flipped)).toBe(401)
      for (let n = 0; n < token.length; n++) expect(yield* status("Bearer " + token.slice(0, n))).toBe(401)
      expect(yield* status("Bearer " + token + "0")).toBe(401)
      expect(yield* status("Bearer " + token + "\u0000")).toBe(401)
      expect(yield* status("Bearer " + token.toUpperCase())).toBe(401)
    }))

  it.effect("sha256= agent signature: any other value of any length is 401", () =>
    Effect.gen(function*() {
      const k = yield* kernel()
      const url = `/v0/executions/${k.id}`
      const good = yield* Signature.sign(SECRET, "")
      const status = (signature: string) =>
        Effect.map(k.send("GET", url, { "rebuno-agent-id": "hello", "rebuno-signature": signature }), (res) => res.status)
      expect(yield* status(good)).toBe(200)
      for (const flipped of everyFlip(good)) expect(yield* status(flipped)).toBe(401)
      for (let n = 1; n < good.length; n++) expect(yield* status(good.slice(0, n))).toBe(401)
      expect(yield* status(good + "0")).toBe(401)
      expect(yield* status("sha256=" + good.slice(7).toUpperCase())).toBe(401)
    }))

  it.effect("current stage: even the right sha256= agent signature is 401 (PROTOCOL-CURRENT C.2.1)", () =>
    Effect.gen(function*() {
      const k = yield* kernel({}, "current")
      const url = `/v0/executions/${k.id}`
      const res = yield* k.send("GET", url, { "rebuno-agent-id": "hello", "rebuno-signature": yield* Signature.sign(SECRET, "") })
      expect(res.status).toBe(401)
      expect(res.body).toBe("{\"code\":\"unauthorized\",\"message\":\"unauthorized\"}\n")
    }))
})

describe("v1= freshness window of the embedded kernel (17.B)", () => {
  const NOW = 1_700_000_000

  const v1Request = (k: Effect.Success<ReturnType<typeof kernel>>, timestamp: string, extra: Record<string, string | ReadonlyArray<string>> = {}) =>
    Effect.gen(function*() {
      const target = `/v0/executions/${k.id}/heartbeat`
      const signature = yield* Signature.signV1(SECRET, {
        method: "POST",
        target,
        timestamp,
        dispatchId: k.lease.dispatchId,
        dispatchAttempt: String(k.lease.attempt),
        body: ""
      })
      const res = yield* k.send("POST", target, {
        "rebuno-agent-id": "hello",
        "rebuno-signature": signature,
        "rebuno-timestamp": timestamp,
        "rebuno-dispatch-id": k.lease.dispatchId,
        "rebuno-dispatch-attempt": String(k.lease.attempt),
        ...extra
      })
      return res.status
    })

  it.effect("accepted iff |now − timestamp| ≤ 300 s (property over offsets and sub-second clocks)", () =>
    Effect.gen(function*() {
      const k = yield* kernel()
      yield* checkProperty(
        "v1 window",
        fc.tuple(
          fc.oneof(fc.integer({ min: -310, max: 310 }), fc.integer({ min: -100_000, max: 100_000 })),
          fc.integer({ min: 0, max: 999 })
        ),
        ([offset, millis]) =>
          Effect.gen(function*() {
            yield* TestClock.setTime(NOW * 1000 + millis)
            const status = yield* v1Request(k, String(NOW + offset))
            expect(status).toBe(Math.abs(offset) <= 300 ? 204 : 401)
          }),
        { numRuns: propertyRuns(200) }
      )
    }), propertyTimeout)

  it.effect("the edges: ±300 accepted, ±301 refused, also at .999 s", () =>
    Effect.gen(function*() {
      const k = yield* kernel()
      for (const millis of [0, 1, 500, 999]) {
        yield* TestClock.setTime(NOW * 1000 + millis)
        expect(yield* v1Request(k, String(NOW - 300))).toBe(204)
        expect(yield* v1Request(k, String(NOW + 300))).toBe(204)
        expect(yield* v1Request(k, String(NOW - 301))).toBe(401)
        expect(yield* v1Request(k, String(NOW + 301))).toBe(401)
      }
    }))

  it.effect("only a base-10 integer timestamp, sent once, without line breaks", () =>
    Effect.gen(function*() {
      const k = yield* kernel()
      yield* TestClock.setTime(NOW * 1000)
      for (const bad of [`${NOW}.0`, `${NOW}e0`, "1.7e9", "0x6553f100", "", "-", `${NOW}\n`, `\r${NOW}`, "９"]) {
        expect(yield* v1Request(k, bad)).toBe(401)
      }
      // leading zeros and an explicit sign are still base-10 integers
      expect(yield* v1Request(k, `0${NOW}`)).toBe(204)
      expect(yield* v1Request(k, `+${NOW}`)).toBe(204)
      // duplicated headers are refused
      expect(yield* v1Request(k, String(NOW), { "rebuno-timestamp": [String(NOW), String(NOW)] })).toBe(401)
      expect(
        yield* v1Request(k, String(NOW), {
          "rebuno-dispatch-id": [k.lease.dispatchId, k.lease.dispatchId]
        })
      ).toBe(401)
    }))

  it.effect("a v1 signature binds method, target, timestamp and lease", () =>
    Effect.gen(function*() {
      const k = yield* kernel()
      yield* TestClock.setTime(NOW * 1000)
      const target = `/v0/executions/${k.id}/heartbeat`
      const base: Signature.V1Request = {
        method: "POST",
        target,
        timestamp: String(NOW),
        dispatchId: k.lease.dispatchId,
        dispatchAttempt: String(k.lease.attempt),
        body: ""
      }
      const send = (signed: Signature.V1Request, sent: Signature.V1Request) =>
        Effect.gen(function*() {
          const signature = yield* Signature.signV1(SECRET, signed)
          const res = yield* k.send(sent.method, sent.target, {
            "rebuno-agent-id": "hello",
            "rebuno-signature": signature,
            "rebuno-timestamp": sent.timestamp,
            "rebuno-dispatch-id": sent.dispatchId,
            "rebuno-dispatch-attempt": sent.dispatchAttempt
          }, typeof sent.body === "string" ? sent.body : "")
          return res.status
        })
      expect(yield* send(base, base)).toBe(204)
      expect(yield* send({ ...base, target: target + "?x=1" }, base)).toBe(401)
      expect(yield* send(base, { ...base, target: target + "?x=1" })).toBe(401)
      expect(yield* send({ ...base, timestamp: String(NOW - 1) }, base)).toBe(401)
      expect(yield* send({ ...base, dispatchAttempt: "2" }, base)).toBe(401)
      expect(yield* send({ ...base, dispatchId: "" }, base)).toBe(401)
      expect(yield* send({ ...base, body: " " }, base)).toBe(401)
      expect(yield* send({ ...base, method: "GET" }, base)).toBe(401)
    }))
})
