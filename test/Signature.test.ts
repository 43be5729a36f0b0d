import { describe, expect, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { readFileSync } from "node:fs"
import * as Signature from "../src/Signature.js"

const fixture = <A>(name: string): A =>
  JSON.parse(readFileSync(new URL(`../../shared/fixtures/${name}`, import.meta.url), "utf8")) as A

interface BodyVector {
  readonly name: string
  readonly secret: string
  readonly body: string
  readonly body_hex: string
  readonly signature: string
}

interface V1Vector {
  readonly name: string
  readonly secret: string
  readonly method: string
  readonly target: string
  readonly body: string
  readonly timestamp: string
  readonly dispatch_id: string
  readonly dispatch_attempt: string
  readonly signature: string
}

const bodyVectors = fixture<{ readonly vectors: ReadonlyArray<BodyVector> }>("webhook-signatures.json").vectors

const v1Vectors: ReadonlyArray<V1Vector> = [
  ...fixture<ReadonlyArray<V1Vector>>("request-signatures-v1.json"),
  // PROTOCOL 17.B, the vector that is not in the file.
  {
    name: "submit step (17.B text)",
    secret: "test-secret",
    method: "POST",
    target: "/v0/executions/018f3a2b-4c5d-7e6f-8a9b-0c1d2e3f4a5b/steps",
    body:
      `{"kind":"tool_call","target":"send_email","args":{"to":"ops@example.com"},"idempotency":"safe_to_retry"}`,
    timestamp: "1700000000",
    dispatch_id: "01920000-0000-7000-8000-000000000001",
    dispatch_attempt: "3",
    signature: "v1=017dff4039ba40e90d3d8d566fdf51db427672f92d45ef41b738672238ea0058"
  }
]

const toRequest = (v: V1Vector): Signature.V1Request => ({
  method: v.method,
  target: v.target,
  timestamp: v.timestamp,
  dispatchId: v.dispatch_id,
  dispatchAttempt: v.dispatch_attempt,
  body: v.body
})

describe("Signature sha256=", () => {
  it("has the 10 fixture vectors", () => {
    expect(bodyVectors.length).toBe(10)
  })

  describe.each(bodyVectors.map((v) => [v.name, v] as const))("vector %s", (_, v) => {
    it.effect("signs the body text and the body bytes", () =>
      Effect.gen(function*() {
        expect(Buffer.from(v.body, "utf8").toString("hex")).toBe(v.body_hex)
        expect(yield* Signature.sign(v.secret, v.body)).toBe(v.signature)
        expect(yield* Signature.sign(Redacted.make(v.secret), Buffer.from(v.body_hex, "hex"))).toBe(v.signature)
      }))

    it.effect("verifies", () =>
      Effect.gen(function*() {
        expect(yield* Signature.verify(v.secret, v.body, v.signature)).toBe(true)
        expect(yield* Signature.verify(Redacted.make(v.secret), new TextEncoder().encode(v.body), v.signature)).toBe(
          true
        )
      }))

    it.effect("rejects a tampered body, uppercase hex, another secret and a wrong prefix", () =>
      Effect.gen(function*() {
        expect(yield* Signature.verify(v.secret, v.body + " ", v.signature)).toBe(false)
        expect(yield* Signature.verify(v.secret, v.body, "sha256=" + v.signature.slice(7).toUpperCase())).toBe(false)
        expect(yield* Signature.verify(v.secret + "x", v.body, v.signature)).toBe(false)
        expect(yield* Signature.verify(v.secret, v.body, "v1=" + v.signature.slice(7))).toBe(false)
        expect(yield* Signature.verify(v.secret, v.body, v.signature.slice(7))).toBe(false)
        expect(yield* Signature.verify(v.secret, v.body, v.signature + "0")).toBe(false)
      }))
  })

  it.effect("rejects a missing or empty header", () =>
    Effect.gen(function*() {
      expect(yield* Signature.verify("hello-secret", "", undefined)).toBe(false)
      expect(yield* Signature.verify("hello-secret", "", null)).toBe(false)
      expect(yield* Signature.verify("hello-secret", "", "")).toBe(false)
    }))

  it.effect("matches the worked value of PROTOCOL 3.2", () =>
    Effect.gen(function*() {
      expect(yield* Signature.sign("hello-secret", new Uint8Array())).toBe(
        "sha256=1da6af7253b037edb9d9bd6b9618bd15b98c72a795629e4aa38ecfc138c71703"
      )
    }))
})

describe("Signature v1=", () => {
  it("has the 3 fixture vectors plus the 17.B one", () => {
    expect(v1Vectors.length).toBe(4)
  })

  describe.each(v1Vectors.map((v) => [v.name, v] as const))("vector %s", (_, v) => {
    const req = toRequest(v)
    const ts = Number(v.timestamp)

    it.effect("signs", () =>
      Effect.gen(function*() {
        expect(yield* Signature.signV1(v.secret, req)).toBe(v.signature)
        expect(yield* Signature.signV1(Redacted.make(v.secret), { ...req, body: new TextEncoder().encode(v.body) }))
          .toBe(v.signature)
      }))

    it.effect("verifies inside the inclusive ±300 s window", () =>
      Effect.gen(function*() {
        expect(yield* Signature.verifyV1(v.secret, req, v.signature, ts)).toBe(true)
        expect(yield* Signature.verifyV1(v.secret, req, v.signature, ts + 300)).toBe(true)
        expect(yield* Signature.verifyV1(v.secret, req, v.signature, ts - 300)).toBe(true)
      }))

    it.effect("fails 301 s off", () =>
      Effect.gen(function*() {
        expect(yield* Signature.verifyV1(v.secret, req, v.signature, ts + 301)).toBe(false)
        expect(yield* Signature.verifyV1(v.secret, req, v.signature, ts - 301)).toBe(false)
      }))

    it.effect("fails when anything signed changes", () =>
      Effect.gen(function*() {
        const at = (r: Signature.V1Request, sig = v.signature) => Signature.verifyV1(v.secret, r, sig, ts)
        expect(yield* at({ ...req, method: req.method === "GET" ? "POST" : "GET" })).toBe(false)
        expect(yield* at({ ...req, target: req.target + "?" })).toBe(false)
        expect(yield* at({ ...req, body: v.body + "x" })).toBe(false)
        expect(yield* at({ ...req, dispatchAttempt: "4" })).toBe(false)
        expect(yield* at({ ...req, dispatchId: "" === req.dispatchId ? "x" : "" })).toBe(false)
        expect(yield* at({ ...req, timestamp: String(ts + 1) })).toBe(false)
        expect(yield* at(req, "v1=" + v.signature.slice(3).toUpperCase())).toBe(false)
        expect(yield* at(req, "sha256=" + v.signature.slice(3))).toBe(false)
        expect(yield* Signature.verifyV1(v.secret + "!", req, v.signature, ts)).toBe(false)
      }))
  })

  it.effect("rejects a non-integer timestamp and header values with line breaks", () =>
    Effect.gen(function*() {
      const v = v1Vectors[1]!
      const req = toRequest(v)
      for (const timestamp of ["", "1700000000.0", "1e9", " 1700000000", "0x65"]) {
        const signature = yield* Signature.signV1(v.secret, { ...req, timestamp })
        expect(yield* Signature.verifyV1(v.secret, { ...req, timestamp }, signature, 1700000000)).toBe(false)
      }
      for (const patch of [{ dispatchId: "a\nb" }, { dispatchAttempt: "3\r" }]) {
        const r = { ...req, ...patch }
        const signature = yield* Signature.signV1(v.secret, r)
        expect(yield* Signature.verifyV1(v.secret, r, signature, 1700000000)).toBe(false)
      }
    }))
})

describe("Signature: the current stage's vectors (PROTOCOL-CURRENT C.14)", () => {
  interface CurrentVector extends V1Vector {
    readonly body_sha256: string
  }
  const current = fixture<{
    readonly check_docs_vector: string
    readonly v1_requests: ReadonlyArray<CurrentVector>
    readonly webhook: { readonly secret: string; readonly body: string; readonly signature: string }
  }>("current-vectors.json")

  it("has the 8 v1 vectors of the new routes", () => {
    expect(current.v1_requests.map((v) => v.name)).toEqual([
      "metadata_put",
      "submit_python_sdk_resources_empty",
      "suspend",
      "previous_get",
      "register_resource",
      "bind_resource",
      "complete_with_state",
      "complete_step_with_captures"
    ])
  })

  it.effect.each(current.v1_requests.map((v) => [v.name, v] as const))("%s signs and verifies", ([, v]) =>
    Effect.gen(function*() {
      const req = toRequest(v)
      expect(yield* Signature.signV1(v.secret, req)).toBe(v.signature)
      expect(yield* Signature.verifyV1(v.secret, req, v.signature, Number(v.timestamp))).toBe(true)
      // A current-stage kernel builds only the v1 message: the body-only scheme never matches (C.2.1).
      expect(yield* Signature.sign(v.secret, v.body)).not.toBe("sha256=" + v.signature.slice("v1=".length))
    }))

  it.effect("the documentation's submit vector is the 17.B one", () =>
    Effect.sync(() => expect(current.check_docs_vector).toBe(v1Vectors[v1Vectors.length - 1]!.signature)))

  it.effect("the current-stage webhook (with dispatch_attempt and lease_timeout_seconds) keeps sha256=", () =>
    Effect.gen(function*() {
      const { body, secret, signature } = current.webhook
      expect(yield* Signature.sign(secret, body)).toBe(signature)
      expect(yield* Signature.verify(secret, new TextEncoder().encode(body), signature)).toBe(true)
    }))
})

describe("timingSafeEqual", () => {
  it("compares whole values", () => {
    expect(Signature.timingSafeEqual("", "")).toBe(true)
    expect(Signature.timingSafeEqual("abc", "abc")).toBe(true)
    expect(Signature.timingSafeEqual("abc", "abd")).toBe(false)
    expect(Signature.timingSafeEqual("abc", "ab")).toBe(false)
    expect(Signature.timingSafeEqual("ab", "abc")).toBe(false)
    expect(Signature.timingSafeEqual("", "a")).toBe(false)
    expect(Signature.timingSafeEqual("a\u0000", "a")).toBe(false)
    expect(Signature.timingSafeEqual("é", "e")).toBe(false)
  })
})

describe("Signature on the portable Web Crypto path", () => {
  // node:crypto is used where the runtime has it; the Web Crypto implementation
  // (other runtimes) must compute exactly the same values.
  it.effect("signs and verifies every fixture vector, the empty secret included", () =>
    Effect.gen(function*() {
      Signature.unsafeForceWebCrypto(true)
      try {
        for (const v of bodyVectors) {
          expect(yield* Signature.sign(v.secret, v.body)).toBe(v.signature)
          expect(yield* Signature.verify(v.secret, v.body, v.signature)).toBe(true)
        }
        for (const v of v1Vectors) {
          expect(yield* Signature.signV1(v.secret, toRequest(v))).toBe(v.signature)
        }
        const viaWebCrypto = yield* Signature.sign("", "{}")
        Signature.unsafeForceWebCrypto(false)
        expect(yield* Signature.sign("", "{}")).toBe(viaWebCrypto)
      } finally {
        Signature.unsafeForceWebCrypto(false)
      }
    }))
})
