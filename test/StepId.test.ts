import { describe, expect, it } from "@effect/vitest"
import { createHash } from "node:crypto"
import { readFileSync } from "node:fs"
import * as StepId from "../src/StepId.js"

interface Vector {
  readonly name: string
  readonly execution_id: string
  readonly kind: string
  readonly target: string
  readonly raw_args: string | null
  readonly occurrence: number
  readonly canonical: string
  readonly canonical_hex: string
  readonly preimage: string
  readonly args_hash: string
  readonly step_id: string
}

const vectors: ReadonlyArray<Vector> = (JSON.parse(
  readFileSync(new URL("../../shared/fixtures/step-ids.json", import.meta.url), "utf8")
) as { readonly vectors: ReadonlyArray<Vector> }).vectors

describe("StepId", () => {
  it("has all 32 fixture vectors", () => {
    expect(vectors.length).toBe(32)
  })

  describe.each(vectors.map((v) => [v.name, v] as const))("vector %s", (_, v) => {
    const raw = v.raw_args ?? undefined
    const fields = {
      executionId: v.execution_id,
      kind: v.kind,
      target: v.target,
      argsHash: v.args_hash,
      occurrence: v.occurrence
    }

    it("canonical JSON", () => {
      const canonical = StepId.canonicalJson(raw)
      expect(canonical).toBe(v.canonical)
      expect(Buffer.from(canonical, "utf8").toString("hex")).toBe(v.canonical_hex)
    })

    it("args hash", () => {
      expect(StepId.argsHash(raw)).toBe(v.args_hash)
    })

    it("preimage", () => {
      expect(StepId.preimage(fields)).toBe(v.preimage)
    })

    it("step id", () => {
      expect(StepId.make(fields)).toBe(v.step_id)
      expect(StepId.make({ ...fields, argsHash: StepId.argsHash(raw) })).toBe(v.step_id)
    })
  })

  it("the hash of {} (computed once) is the computed one", () => {
    const direct = (raw: string) => createHash("sha256").update(StepId.canonicalJson(raw), "utf8").digest("hex")
    expect(StepId.argsHash("{}")).toBe(direct("{}"))
    expect(StepId.argsHash("{ }")).toBe(direct("{}"))
  })

  it("absent and explicit null args hash the same", () => {
    expect(StepId.argsHash(undefined)).toBe(StepId.argsHash("null"))
    expect(StepId.argsHash(" null ")).toBe(StepId.argsHash("null"))
  })

  it("whitespace does not change the hash, number text does", () => {
    expect(StepId.argsHash(`{ "a" : 1 }`)).toBe(StepId.argsHash(`{"a":1}`))
    expect(StepId.argsHash(`{"a":1.0}`)).not.toBe(StepId.argsHash(`{"a":1}`))
  })

  it("invalid raw args are hashed as-is", () => {
    expect(StepId.canonicalJson("{oops")).toBe("{oops")
  })

  it("occurrence changes the id", () => {
    const base = { executionId: vectors[0]!.execution_id, kind: "k", target: "t", argsHash: StepId.argsHash("{}") }
    expect(StepId.make({ ...base, occurrence: 0 })).not.toBe(StepId.make({ ...base, occurrence: 1 }))
    expect(StepId.make({ ...base, occurrence: 0 })).toMatch(/^[0-9a-f]{64}$/)
  })
})
