/**
 * The dev kernel's in-memory rate limiter (PROTOCOL 10.5): one token bucket
 * per key, with capacity `max_calls`, starting full and refilling
 * continuously at `max_calls` tokens per `window`. Time is passed in by the
 * caller (the kernel reads `Clock` once per operation), so the limiter is a
 * plain synchronous object and fully deterministic. It never errors; the
 * kernel simulates limiter errors itself when asked to.
 *
 * @since 0.1.0
 */
import type { RateLimit } from "./Policy.js"

/**
 * A set of token buckets.
 *
 * @since 0.1.0
 * @category models
 */
export interface RateLimiter {
  /**
   * Takes one token from the bucket `key` under `limit` at `nowMs`: `true`
   * when allowed (a token was consumed), `false` when refused (nothing is
   * consumed). An inactive limit ({@link isActive}) always allows and keeps
   * no state.
   */
  take(key: string, limit: RateLimit, nowMs: number): boolean
  /**
   * {@link take} with the limiter's estimate (PROTOCOL-CURRENT C.8.3): `0`
   * when a token was consumed, otherwise the milliseconds until the bucket
   * holds one again (nothing is consumed).
   */
  tryTake(key: string, limit: RateLimit, nowMs: number): number
}

/**
 * Whether a rate limit applies: `max_calls > 0` and `window > 0`.
 *
 * @since 0.1.0
 * @category predicates
 */
export const isActive = (limit: RateLimit | undefined): limit is RateLimit =>
  limit !== undefined && limit.maxCalls > 0 && limit.windowMs > 0

/**
 * The bucket key of a rule's rate limit (10.5): `<rule_id>:agent:<agent_id>`
 * for `per_what: agent`, `<rule_id>:global` for `global`, and
 * `<rule_id>:exec:<execution_id>` for `execution`, absent or anything else.
 * Rules with the same id share buckets. The current stage adds `session`
 * (C.8.3): `<rule_id>:session:<session>` when a `session` is passed, else the
 * execution's bucket (an execution outside any session is its own scope).
 *
 * @since 0.1.0
 * @category keys
 */
export const bucketKey = (
  ruleId: string,
  perWhat: string,
  agentId: string,
  executionId: string,
  session?: string | undefined
): string => {
  switch (perWhat) {
    case "agent":
      return `${ruleId}:agent:${agentId}`
    case "global":
      return `${ruleId}:global`
    case "session":
      if (session !== undefined && session !== "") return `${ruleId}:session:${session}`
      return `${ruleId}:exec:${executionId}`
    default:
      return `${ruleId}:exec:${executionId}`
  }
}

/**
 * Options of {@link make}.
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /**
   * Buckets untouched for longer than this (and longer than their window, so
   * they would be full again) may be dropped. Default: one hour.
   */
  readonly retentionMs?: number
}

interface Bucket {
  tokens: number
  lastMs: number
  windowMs: number
}

const SWEEP_EVERY = 1024

/**
 * Creates an empty rate limiter.
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (options: Options = {}): RateLimiter => {
  const retentionMs = options.retentionMs ?? 3_600_000
  const buckets = new Map<string, Bucket>()
  let takes = 0

  const sweep = (nowMs: number): void => {
    for (const [key, bucket] of buckets) {
      const idle = nowMs - bucket.lastMs
      if (idle > retentionMs && idle >= bucket.windowMs) buckets.delete(key)
    }
  }

  /** Takes a token: `0`, or the milliseconds until one is available. */
  const tryTake = (key: string, limit: RateLimit, nowMs: number): number => {
    if (!isActive(limit)) return 0
    if (++takes % SWEEP_EVERY === 0) sweep(nowMs)
    const capacity = limit.maxCalls
    let bucket = buckets.get(key)
    if (bucket === undefined) {
      bucket = { tokens: capacity, lastMs: nowMs, windowMs: limit.windowMs }
      buckets.set(key, bucket)
    } else {
      const elapsed = Math.max(0, nowMs - bucket.lastMs)
      bucket.tokens = Math.min(capacity, bucket.tokens + (capacity * elapsed) / limit.windowMs)
      // a clock that went backwards does not move the refill point back
      bucket.lastMs = Math.max(bucket.lastMs, nowMs)
      bucket.windowMs = limit.windowMs
    }
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1
      return 0
    }
    // Continuous refill of max_calls tokens per window, from the refill point
    // (later than `nowMs` only when the clock went backwards). The estimate is
    // checked with the refill arithmetic itself, so a call made then finds a token.
    const tokens = bucket.tokens
    const ahead = bucket.lastMs - nowMs
    let refill = Math.max(1, Math.ceil(((1 - tokens) * limit.windowMs) / capacity - 1e-6))
    while (Math.min(capacity, tokens + (capacity * refill) / limit.windowMs) < 1) refill++
    return ahead + refill
  }

  return {
    take: (key, limit, nowMs) => tryTake(key, limit, nowMs) === 0,
    tryTake
  }
}
