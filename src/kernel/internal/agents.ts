/**
 * The registered agents of the kernel core (PROTOCOL 4.1, 11.9, 11.10): upsert
 * with policy validation, lookup, listing in byte order, removal and policy
 * replacement.
 *
 * @since 0.1.0
 * @internal
 */
import * as Result from "effect/Result"
import * as Policy from "../Policy.js"
import { goQuote } from "./goQuote.js"
import type { AgentMetadata, AgentRecord, Stage } from "./model.js"
import { KernelFailure, notFound, validation } from "./model.js"

const utf8 = new TextEncoder()

/**
 * The longest per-agent lease a registration sets (PROTOCOL-CURRENT C.10):
 * Go's largest `time.Duration`, in whole seconds. Like values under 10, a
 * larger one is ignored (the kernel's default applies), so no answer or
 * webhook ever carries a lease that a Go kernel could not hold.
 */
const maxLeaseTimeoutSeconds = 9_223_372_036
const compareBytes = (a: string, b: string): number => {
  const x = utf8.encode(a)
  const y = utf8.encode(b)
  const n = Math.min(x.length, y.length)
  for (let i = 0; i < n; i++) {
    if (x[i] !== y[i]) return x[i]! - y[i]!
  }
  return x.length - y.length
}

/**
 * @since 0.1.0
 * @internal
 */
export class AgentTable {
  private readonly byId = new Map<string, AgentRecord>()

  /**
   * Upsert an agent. A non-empty `policyBundle` is validated in the language
   * of `stage` (PROTOCOL 10.2, PROTOCOL-CURRENT C.8.6); an invalid one fails
   * with `400 validation_error` and the message
   * `agent "<id>": invalid policy bundle: <detail>` (the manifest wording, 4.2).
   */
  register(
    a: {
      readonly id: string
      readonly webhookUrl: string
      readonly secret: string
      readonly policyBundle?: string | undefined
      readonly leaseTimeoutSeconds?: number | undefined
    },
    now: number,
    stage: Stage = "current"
  ): AgentRecord | KernelFailure {
    let policy: Policy.Bundle | undefined
    const bundle = a.policyBundle ?? ""
    if (bundle !== "") {
      const parsed = Policy.parseBundle(bundle, { stage })
      if (Result.isFailure(parsed)) {
        return validation("agent " + goQuote(a.id) + ": invalid policy bundle: " + parsed.failure)
      }
      policy = parsed.success
    }
    const record: AgentRecord = {
      id: a.id,
      webhookUrl: a.webhookUrl,
      secret: a.secret,
      policyBundle: bundle,
      policy,
      registeredAtMs: now,
      leaseTimeoutMs: a.leaseTimeoutSeconds !== undefined && a.leaseTimeoutSeconds >= 10 &&
          a.leaseTimeoutSeconds <= maxLeaseTimeoutSeconds
        ? a.leaseTimeoutSeconds * 1000
        : undefined,
      metadata: this.byId.get(a.id)?.metadata
    }
    this.byId.set(a.id, record)
    return record
  }

  /**
   * PROTOCOL-CURRENT C.3.3: store what the agent published, replacing any
   * earlier metadata; `404` for an unknown agent.
   */
  setMetadata(id: string, metadata: AgentMetadata): void | KernelFailure {
    const agent = this.byId.get(id)
    if (agent === undefined) return notFound()
    this.byId.set(id, { ...agent, metadata })
  }

  get(id: string): AgentRecord | undefined {
    return this.byId.get(id)
  }

  has(id: string): boolean {
    return this.byId.has(id)
  }

  /** Sorted by id (byte order). */
  list(): Array<AgentRecord> {
    return Array.from(this.byId.values()).sort((a, b) => compareBytes(a.id, b.id))
  }

  delete(id: string): void {
    this.byId.delete(id)
  }

  /**
   * PROTOCOL 11.10: validation (400, in the language of `stage`) before the
   * agent lookup (404); `""` removes.
   */
  loadPolicy(agentId: string, bundle: string, stage: Stage = "current"): void | KernelFailure {
    const policy = compileBundle(bundle, stage)
    if (policy instanceof KernelFailure) return policy
    const agent = this.byId.get(agentId)
    if (agent === undefined) {
      return new KernelFailure({ status: 404, code: "not_found", message: "load policy bundle: not found" })
    }
    this.byId.set(agentId, { ...agent, policyBundle: bundle, policy })
  }
}

/**
 * A policy bundle as `POST /v0/policies/{agent_id}` reads it (PROTOCOL 11.10),
 * in the language of `stage`: parsed and validated, with the route's `400`
 * for a bad one; `undefined` for `""` (no policy: every step `permissive`).
 * The policy test (C.8.6) reads its bundle the same way.
 *
 * @since 0.2.0
 * @internal
 */
export const compileBundle = (text: string, stage: Stage = "current"): Policy.Bundle | undefined | KernelFailure => {
  if (text === "") return undefined
  const parsed = Policy.parseBundle(text, { stage })
  return Result.isFailure(parsed)
    ? validation("load policy bundle: validation error: invalid policy bundle: " + parsed.failure)
    : parsed.success
}
