import { describe, expect, it } from "@effect/vitest"
import { Result } from "effect"
import * as Policy from "../../src/kernel/Policy.js"
import * as RateLimiter from "../../src/kernel/RateLimiter.js"

/** Bundles here are in the seed stage's language (PROTOCOL 10.2); the current one is tested in Policy and Decisions. */
const SEED = { stage: "seed" } as const

const limit = (maxCalls: number, windowMs: number, perWhat = ""): Policy.RateLimit => ({
  maxCalls,
  windowMs,
  perWhat,
  onLimiterError: ""
})

/** Takes `n` tokens at `nowMs` and returns how many were granted. */
const takeMany = (limiter: RateLimiter.RateLimiter, key: string, l: Policy.RateLimit, nowMs: number, n: number) => {
  let granted = 0
  for (let i = 0; i < n; i++) if (limiter.take(key, l, nowMs)) granted++
  return granted
}

describe("RateLimiter.bucketKey (10.5)", () => {
  it("scopes by agent, globally, or by execution", () => {
    expect(RateLimiter.bucketKey("r", "agent", "ag", "ex")).toBe("r:agent:ag")
    expect(RateLimiter.bucketKey("r", "global", "ag", "ex")).toBe("r:global")
    expect(RateLimiter.bucketKey("r", "execution", "ag", "ex")).toBe("r:exec:ex")
    expect(RateLimiter.bucketKey("r", "", "ag", "ex")).toBe("r:exec:ex")
    expect(RateLimiter.bucketKey("r", "tenant", "ag", "ex")).toBe("r:exec:ex")
    expect(RateLimiter.bucketKey("r", "Agent", "ag", "ex")).toBe("r:exec:ex")
  })
})

describe("the current stage's scopes and estimates (C.8.3)", () => {
  it("per_what session keys by the session; an execution outside a session is its own scope", () => {
    expect(RateLimiter.bucketKey("r", "session", "ag", "ex", "chat:1")).toBe("r:session:chat:1")
    expect(RateLimiter.bucketKey("r", "session", "ag", "ex", "")).toBe("r:exec:ex")
    expect(RateLimiter.bucketKey("r", "session", "ag", "ex")).toBe("r:exec:ex")
    // the seed stage passes no session: unchanged keys
    expect(RateLimiter.bucketKey("r", "agent", "ag", "ex", "chat:1")).toBe("r:agent:ag")
  })

  it("tryTake answers 0 for a token, else the wait until the bucket holds one (nothing consumed)", () => {
    const limiter = RateLimiter.make()
    const perMinute = limit(2, 60_000)
    expect(limiter.tryTake("k", perMinute, 0)).toBe(0)
    expect(limiter.tryTake("k", perMinute, 0)).toBe(0)
    // empty: one token refills in window / max_calls
    expect(limiter.tryTake("k", perMinute, 0)).toBe(30_000)
    expect(limiter.tryTake("k", perMinute, 10_000)).toBe(20_000)
    // the estimate is exact: at that time a token is there
    expect(limiter.tryTake("k", perMinute, 29_999)).toBe(1)
    expect(limiter.tryTake("k", perMinute, 30_000)).toBe(0)
    expect(limiter.take("k", perMinute, 30_000)).toBe(false)
    // an inactive limit always grants and keeps no state
    expect(limiter.tryTake("k", limit(0, 60_000), 30_000)).toBe(0)
  })

  it("estimates survive awkward windows (the refill arithmetic itself is checked)", () => {
    const limiter = RateLimiter.make()
    const odd = limit(3, 1_000)
    let at = 0
    let refused = 0
    while (at < 5_000) {
      const wait = limiter.tryTake("odd", odd, at)
      if (wait > 0) {
        refused++
        if (wait > 1) expect(limiter.tryTake("odd", odd, at + wait - 1)).toBeGreaterThan(0)
        expect(limiter.tryTake("odd", odd, at + wait)).toBe(0)
        at += wait
      }
      at += 7
    }
    expect(refused).toBeGreaterThan(10)
    // a clock that went backwards: the wait runs from the refill point
    const back = RateLimiter.make()
    const once = limit(1, 1_000)
    expect(back.tryTake("b", once, 5_000)).toBe(0)
    expect(back.tryTake("b", once, 4_000)).toBe(2_000)
    expect(back.tryTake("b", once, 6_000)).toBe(0)
  })
})

describe("RateLimiter.isActive", () => {
  it("needs max_calls > 0 and window > 0", () => {
    expect(RateLimiter.isActive(limit(1, 1))).toBe(true)
    expect(RateLimiter.isActive(limit(0, 60_000))).toBe(false)
    expect(RateLimiter.isActive(limit(-1, 60_000))).toBe(false)
    expect(RateLimiter.isActive(limit(5, 0))).toBe(false)
    expect(RateLimiter.isActive(limit(5, -60_000))).toBe(false)
    expect(RateLimiter.isActive(undefined)).toBe(false)
  })
})

describe("RateLimiter.make (token buckets)", () => {
  it("starts full and refills continuously: 2 per minute", () => {
    const limiter = RateLimiter.make()
    const perMinute = limit(2, 60_000)
    expect(limiter.take("k", perMinute, 0)).toBe(true)
    expect(limiter.take("k", perMinute, 0)).toBe(true)
    expect(limiter.take("k", perMinute, 0)).toBe(false)
    expect(limiter.take("k", perMinute, 29_999)).toBe(false)
    expect(limiter.take("k", perMinute, 30_000)).toBe(true)
    expect(limiter.take("k", perMinute, 30_000)).toBe(false)
    expect(limiter.take("k", perMinute, 60_000)).toBe(true)
    // never more than the capacity, however long it was idle
    expect(takeMany(limiter, "k", perMinute, 10_000_000, 5)).toBe(2)
  })

  it("a refused call consumes nothing", () => {
    const limiter = RateLimiter.make()
    const perSecond = limit(1, 1_000)
    expect(limiter.take("k", perSecond, 0)).toBe(true)
    // refusals at 250, 500, 750 must not push the refill back
    expect(limiter.take("k", perSecond, 250)).toBe(false)
    expect(limiter.take("k", perSecond, 500)).toBe(false)
    expect(limiter.take("k", perSecond, 750)).toBe(false)
    expect(limiter.take("k", perSecond, 1_000)).toBe(true)
  })

  it("applies the latest max_calls and window on each use", () => {
    const limiter = RateLimiter.make()
    expect(takeMany(limiter, "k", limit(3, 60_000), 0, 3)).toBe(3)
    // a larger capacity does not refill by itself
    expect(limiter.take("k", limit(10, 60_000), 0)).toBe(false)
    // 10 per minute now: 6 s gives one token
    expect(limiter.take("k", limit(10, 60_000), 6_000)).toBe(true)
    // a smaller capacity clamps what is in the bucket (10 minutes would refill 9.9 tokens)
    expect(takeMany(limiter, "k", limit(1, 60_000), 600_000, 3)).toBe(1)
  })

  it("keeps buckets apart by key", () => {
    const limiter = RateLimiter.make()
    const one = limit(1, 60_000)
    expect(limiter.take("a", one, 0)).toBe(true)
    expect(limiter.take("a", one, 0)).toBe(false)
    expect(limiter.take("b", one, 0)).toBe(true)
  })

  it("does not limit or keep state for inactive limits", () => {
    const limiter = RateLimiter.make()
    expect(takeMany(limiter, "k", limit(0, 60_000), 0, 100)).toBe(100)
    expect(takeMany(limiter, "k", limit(2, 0), 0, 100)).toBe(100)
    // the bucket starts full when the limit becomes active
    expect(takeMany(limiter, "k", limit(2, 60_000), 0, 3)).toBe(2)
  })

  it("may drop long-idle buckets without changing decisions under the same limit", () => {
    const limiter = RateLimiter.make({ retentionMs: 1_000 })
    const perMinute = limit(2, 60_000)
    expect(takeMany(limiter, "idle", perMinute, 0, 2)).toBe(2)
    for (let i = 0; i < 2_048; i++) limiter.take(`other-${i}`, perMinute, 120_000)
    expect(takeMany(limiter, "idle", perMinute, 120_000, 3)).toBe(2)
  })
})

describe("rate limits with policy rules (10.5)", () => {
  const bundle = (() => {
    const result = Policy.parseBundle(`default_action: deny
rules:
  - id: search
    priority: 1
    when: { target: web_search }
    then: { decision: allow, rate_limit: { max_calls: 2, window: 1m } }
  - id: search
    priority: 2
    when: { target: web_fetch }
    then: { decision: deny, rate_limit: { max_calls: 2, window: 1m } }
  - id: per-agent
    priority: 3
    when: { target: shell }
    then: { decision: require_approval, rate_limit: { max_calls: 1, window: 1h, per_what: agent } }
  - id: everywhere
    priority: 4
    when: { target: pay }
    then: { decision: allow, rate_limit: { max_calls: 1, window: 1h, per_what: global } }
`, SEED)
    if (Result.isFailure(result)) throw new Error(result.failure)
    return result.success
  })()

  /** Evaluates and takes a token the way the kernel does (7.3 steps 11–12). */
  const submit = (limiter: RateLimiter.RateLimiter, agentId: string, executionId: string, target: string, nowMs: number) => {
    const result = Policy.evaluate(bundle, { agentId, kind: "tool_call", target, argsRaw: undefined })
    if (RateLimiter.isActive(result.rateLimit)) {
      const key = RateLimiter.bucketKey(result.ruleId, result.rateLimit.perWhat, agentId, executionId)
      if (!limiter.take(key, result.rateLimit, nowMs)) return "rate_limited"
    }
    return result.decision
  }

  it("rules with the same id share a bucket, whatever their decision (quirk)", () => {
    const limiter = RateLimiter.make()
    expect(submit(limiter, "a", "e1", "web_search", 0)).toBe("allow")
    expect(submit(limiter, "a", "e1", "web_fetch", 0)).toBe("deny")
    expect(submit(limiter, "a", "e1", "web_search", 0)).toBe("rate_limited")
    expect(submit(limiter, "a", "e1", "web_fetch", 0)).toBe("rate_limited")
    // per execution by default: another execution has its own bucket
    expect(submit(limiter, "a", "e2", "web_search", 0)).toBe("allow")
    expect(submit(limiter, "a", "e1", "web_search", 30_000)).toBe("allow")
  })

  it("per_what agent shares a bucket across the agent's executions", () => {
    const limiter = RateLimiter.make()
    expect(submit(limiter, "a", "e1", "shell", 0)).toBe("require_approval")
    expect(submit(limiter, "a", "e2", "shell", 0)).toBe("rate_limited")
    expect(submit(limiter, "b", "e3", "shell", 0)).toBe("require_approval")
  })

  it("per_what global shares a bucket across agents", () => {
    const limiter = RateLimiter.make()
    expect(submit(limiter, "a", "e1", "pay", 0)).toBe("allow")
    expect(submit(limiter, "b", "e2", "pay", 0)).toBe("rate_limited")
    expect(submit(limiter, "b", "e2", "pay", 3_600_000)).toBe("allow")
  })
})
