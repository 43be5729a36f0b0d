/**
 * `Kernel.layerConfig` (issue 13): the embedded kernel's settings from
 * `Config`, as `effect-rebuno dev` reads them, with explicit options on top.
 */
import { describe, expect, it } from "@effect/vitest"
import { Config, ConfigProvider, Context, Effect, Layer } from "effect"
import * as Kernel from "effect-rebuno/kernel"
import { freePort } from "../support/pythonSdk.js"

const withEnv = (env: Record<string, string>) =>
  Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromUnknown(env))

const build = (options?: Kernel.StartOptions) =>
  Effect.map(Layer.build(Kernel.layerConfig(options)), Context.get(Kernel.EmbeddedKernel))

describe("Kernel.layerConfig", () => {
  it.live("reads REBUNO_* like the dev command: listen address, lease, stage, bearer token", () =>
    Effect.gen(function*() {
      const port = yield* freePort
      const kernel = yield* build().pipe(withEnv({
        REBUNO_LISTEN_ADDR: `127.0.0.1:${port}`,
        REBUNO_DISPATCH_LEASE_TIMEOUT: "30s",
        REBUNO_DISPATCH_MAX_ATTEMPTS: "2",
        REBUNO_STAGE: "seed",
        REBUNO_API_TOKEN: "s3cret"
      }))
      expect(kernel.url).toBe(`http://127.0.0.1:${port}`)
      expect(kernel.core.settings.leaseTimeoutMs).toBe(30_000)
      expect(kernel.core.settings.maxAttempts).toBe(2)
      expect(kernel.core.settings.stage).toBe("seed")
      const status = (token?: string) =>
        Effect.promise(() =>
          fetch(`${kernel.url}/v0/executions`, {
            headers: token === undefined ? {} : { authorization: `Bearer ${token}` },
            signal: AbortSignal.timeout(5_000)
          }).then((response) => response.status)
        )
      expect(yield* status()).toBe(401)
      expect(yield* status("s3cret")).toBe(200)
    }))

  it.live("explicit options win over the environment; the defaults are the dev command's", () =>
    Effect.gen(function*() {
      const kernel = yield* build({ port: 0, settings: { leaseTimeoutMs: 5_000 } }).pipe(withEnv({
        REBUNO_LISTEN_ADDR: "127.0.0.1:1",
        REBUNO_DISPATCH_LEASE_TIMEOUT: "30s"
      }))
      expect(kernel.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/)
      expect(kernel.url).not.toBe("http://127.0.0.1:1")
      expect(kernel.core.settings.leaseTimeoutMs).toBe(5_000)
      expect(kernel.core.settings.stage).toBe("current")
      expect(kernel.core.settings.maxAttempts).toBe(Kernel.Config.defaults.maxAttempts)
    }))

  it.effect("an invalid variable is a ConfigError naming it", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(build({ port: 0 }).pipe(withEnv({ REBUNO_DISPATCH_LEASE_TIMEOUT: "soon" })))
      expect(error).toBeInstanceOf(Config.ConfigError)
      expect(String(error)).toContain("REBUNO_DISPATCH_LEASE_TIMEOUT")
    }))
})
