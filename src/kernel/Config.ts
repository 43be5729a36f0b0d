/**
 * Settings of the embedded kernel read with Effect's `Config`: the reference
 * kernel's `REBUNO_*` environment variables (PROTOCOL 16.1) with Go-syntax
 * durations, plus the dev kernel's optional bearer token and protocol stage
 * (`REBUNO_STAGE`). The CLI layers its
 * flags over these; programs embedding the kernel can read them with a custom
 * `ConfigProvider`.
 *
 * @since 0.1.0
 */
import * as Config from "effect/Config"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Redacted from "effect/Redacted"
import { parseMillis } from "./internal/duration.js"
import type { Stage } from "./internal/model.js"
import { stages } from "./internal/model.js"

/**
 * A parsed listen address (`host:port`, `:port`, `[v6]:port`). `host` is
 * `undefined` when the address names no host (listen on every interface).
 *
 * @since 0.1.0
 * @category models
 */
export interface ListenAddress {
  readonly host: string | undefined
  readonly port: number
}

/**
 * Everything the CLI and `start` need to run a kernel.
 *
 * @since 0.1.0
 * @category models
 */
export interface KernelConfig {
  readonly listen: Option.Option<ListenAddress>
  readonly maxAttempts: number
  readonly dispatchTimeoutMs: number
  readonly concurrency: number
  readonly leaseTimeoutMs: number
  readonly approvalTimeoutMs: number
  readonly deadlineMs: number | undefined
  readonly deadlineCheckIntervalMs: number
  readonly apiToken: Option.Option<Redacted.Redacted<string>>
  /** The protocol stage (default `"current"`). */
  readonly stage: Stage
  /**
   * The OpenAI-compatible judge asked by `judge` rules (PROTOCOL-CURRENT
   * C.8.6), when `REBUNO_JUDGE_URL` is set; without it they deny with
   * `judge not configured`. Pass it to `Policy.openAiJudge` for the kernel's
   * `judge` setting.
   */
  readonly judge: Option.Option<JudgeConfig>
}

/**
 * Where the kernel's judge is (PROTOCOL-CURRENT C.8.6): the options of
 * `Policy.openAiJudge`.
 *
 * @since 0.2.0
 * @category models
 */
export interface JudgeConfig {
  /** Base URL of an OpenAI-compatible API, e.g. `https://api.openai.com/v1`. */
  readonly url: string
  readonly model: string
  readonly apiKey: Redacted.Redacted<string> | undefined
  readonly timeoutMs: number
}

/**
 * Defaults of PROTOCOL 16.1 / Appendix A.
 *
 * @since 0.1.0
 * @category constants
 */
export const defaults = {
  port: 8080,
  host: "127.0.0.1",
  maxAttempts: 5,
  dispatchTimeoutMs: 30_000,
  concurrency: 8,
  leaseTimeoutMs: 120_000,
  approvalTimeoutMs: 900_000,
  deadlineCheckIntervalMs: 30_000,
  stage: "current",
  judgeModel: "gpt-4o-mini",
  judgeTimeoutMs: 10_000
} as const

/**
 * Parses `host:port` the way Go's `net.SplitHostPort` does (IPv6 in brackets).
 *
 * @since 0.1.0
 * @category parsing
 */
export const parseListenAddress = (s: string): ListenAddress | undefined => {
  const colon = s.lastIndexOf(":")
  if (colon < 0) return undefined
  let host = s.slice(0, colon)
  const portText = s.slice(colon + 1)
  if (!/^\d{1,5}$/.test(portText)) return undefined
  const port = Number(portText)
  if (port > 65535) return undefined
  if (host.startsWith("[")) {
    if (!host.endsWith("]")) return undefined
    host = host.slice(1, -1)
  } else if (host.includes(":")) {
    return undefined
  }
  return { host: host === "" ? undefined : host, port }
}

/** A value that is present but invalid: a config error that no default recovers. */
const invalid = (name: string, message: string): Effect.Effect<never, Config.ConfigError> =>
  Effect.fail(
    new Config.ConfigError(new ConfigProvider.SourceError({ message: `Invalid data at ${name}: ${message}` }))
  )

/**
 * A Go-syntax duration (`90s`, `2m`, `1h30m`) in milliseconds.
 *
 * @since 0.1.0
 * @category config
 */
export const duration = (name: string): Config.Config<number> =>
  Config.String(name).pipe(
    Config.mapEffect((text) => {
      const ms = parseMillis(text.trim())
      return ms === undefined || ms < 0 ? invalid(name, `invalid duration ${JSON.stringify(text)}`) : Effect.succeed(ms)
    })
  )

/** An integer as Effect 3's `Config.integer` read it (`Number(text)`), then checked to be > 0. */
const positiveInt = (name: string): Config.Config<number> =>
  Config.String(name).pipe(
    Config.mapEffect((text) => {
      const n = Number(text)
      if (!Number.isInteger(n)) return invalid(name, `Expected an integer value but received ${text}`)
      return n > 0 ? Effect.succeed(n) : invalid(name, "must be greater than 0")
    })
  )

/**
 * A protocol stage: `current`, `seed` or `v0.14.0` (surrounding whitespace
 * ignored); anything else is a `ConfigError` naming the accepted values.
 *
 * @since 0.2.0
 * @category config
 */
export const stage = (name: string): Config.Config<Stage> =>
  Config.String(name).pipe(
    Config.mapEffect((text) => {
      const value = text.trim()
      const found = stages.find((s) => s === value)
      return found === undefined
        ? invalid(name, `invalid stage ${JSON.stringify(text)} (expected one of: ${stages.join(", ")})`)
        : Effect.succeed(found)
    })
  )

const listenAddress: Config.Config<ListenAddress> = Config.String("REBUNO_LISTEN_ADDR").pipe(
  Config.mapEffect((text) => {
    const parsed = parseListenAddress(text.trim())
    return parsed === undefined
      ? invalid("REBUNO_LISTEN_ADDR", `invalid listen address ${JSON.stringify(text)}`)
      : Effect.succeed(parsed)
  })
)

/**
 * The kernel configuration from `REBUNO_*` variables:
 * `REBUNO_LISTEN_ADDR`, `REBUNO_DISPATCH_MAX_ATTEMPTS`, `REBUNO_DISPATCH_TIMEOUT`,
 * `REBUNO_DISPATCH_CONCURRENCY`, `REBUNO_DISPATCH_LEASE_TIMEOUT`,
 * `REBUNO_APPROVAL_TIMEOUT`, `REBUNO_DEADLINE_TIMEOUT` (off when unset or `0`),
 * `REBUNO_DEADLINE_CHECK_INTERVAL`, the optional bearer token
 * `REBUNO_API_TOKEN` (dev mode when unset or empty), the protocol stage
 * `REBUNO_STAGE` (`current` by default, `seed` or `v0.14.0`), and the judge of
 * `judge` rules: `REBUNO_JUDGE_URL` (off when unset or empty),
 * `REBUNO_JUDGE_MODEL` (default `gpt-4o-mini`), `REBUNO_JUDGE_API_KEY`
 * (optional) and `REBUNO_JUDGE_TIMEOUT` (default `10s`).
 *
 * @since 0.1.0
 * @category config
 */
export const kernelConfig: Config.Config<KernelConfig> = Config.all({
  listen: Config.option(listenAddress),
  maxAttempts: positiveInt("REBUNO_DISPATCH_MAX_ATTEMPTS").pipe(Config.withDefault(defaults.maxAttempts)),
  dispatchTimeoutMs: duration("REBUNO_DISPATCH_TIMEOUT").pipe(Config.withDefault(defaults.dispatchTimeoutMs)),
  concurrency: positiveInt("REBUNO_DISPATCH_CONCURRENCY").pipe(Config.withDefault(defaults.concurrency)),
  leaseTimeoutMs: duration("REBUNO_DISPATCH_LEASE_TIMEOUT").pipe(Config.withDefault(defaults.leaseTimeoutMs)),
  approvalTimeoutMs: duration("REBUNO_APPROVAL_TIMEOUT").pipe(Config.withDefault(defaults.approvalTimeoutMs)),
  deadlineMs: Config.option(duration("REBUNO_DEADLINE_TIMEOUT")).pipe(
    Config.map((o) => Option.isSome(o) && o.value > 0 ? o.value : undefined)
  ),
  deadlineCheckIntervalMs: duration("REBUNO_DEADLINE_CHECK_INTERVAL").pipe(
    Config.withDefault(defaults.deadlineCheckIntervalMs)
  ),
  apiToken: Config.option(Config.String("REBUNO_API_TOKEN")).pipe(
    Config.map((token) => Option.map(Option.filter(token, (text) => text !== ""), Redacted.make))
  ),
  stage: stage("REBUNO_STAGE").pipe(Config.withDefault<Stage>(defaults.stage)),
  judge: Config.all({
    url: Config.option(Config.String("REBUNO_JUDGE_URL")),
    model: Config.String("REBUNO_JUDGE_MODEL").pipe(Config.withDefault(defaults.judgeModel)),
    apiKey: Config.option(Config.String("REBUNO_JUDGE_API_KEY")),
    timeoutMs: duration("REBUNO_JUDGE_TIMEOUT").pipe(Config.withDefault(defaults.judgeTimeoutMs))
  }).pipe(
    Config.map(({ apiKey, model, timeoutMs, url }) =>
      Option.map(Option.filter(url, (text) => text.trim() !== ""), (text): JudgeConfig => ({
        url: text.trim(),
        model,
        apiKey: Option.getOrUndefined(Option.map(Option.filter(apiKey, (key) => key !== ""), Redacted.make)),
        timeoutMs
      }))
    )
  )
})
