/**
 * `effect-rebuno/kernel`: the embedded, in-memory Rebuno kernel. The modules
 * are exported as namespaces (`Core`, `Routes`, `Server`, `Dispatcher`,
 * `Manifest`, `Config`, `Policy`, `Wire`), and {@link start} / {@link layer}
 * run a complete kernel — core, manifest, delivery loop and HTTP server — in a
 * `Scope`, reporting the URL it actually listens on.
 *
 * @since 0.1.0
 */
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import * as NodePath from "@effect/platform-node/NodePath"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as HttpServer from "effect/http/HttpServer"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as NetAddress from "effect/net/NetAddress"
import type * as Redacted from "effect/Redacted"
import * as KernelConfig from "./Config.js"
import * as Core from "./Core.js"
import * as Dispatcher from "./Dispatcher.js"
import * as Manifest from "./Manifest.js"
import * as Policy from "./Policy.js"
import * as Server from "./Server.js"

/**
 * @since 0.1.0
 */
export * as Config from "./Config.js"
/**
 * @since 0.1.0
 */
export * as Core from "./Core.js"
/**
 * @since 0.1.0
 */
export * as Dispatcher from "./Dispatcher.js"
/**
 * @since 0.1.0
 */
export * as Manifest from "./Manifest.js"
/**
 * @since 0.1.0
 */
export * as Policy from "./Policy.js"
/**
 * @since 0.1.0
 */
export * as Routes from "./Routes.js"
/**
 * @since 0.1.0
 */
export * as Server from "./Server.js"
/**
 * @since 0.1.0
 */
export * as Wire from "./Wire.js"

/**
 * Options of {@link start}.
 *
 * @since 0.1.0
 * @category models
 */
export interface StartOptions {
  /**
   * Interface to bind: `127.0.0.1` by default (this machine only); `0.0.0.0`
   * or `""` for every interface (agents on other machines or in containers).
   */
  readonly host?: string | undefined
  /** Port to bind (default `0`: a free port). */
  readonly port?: number | undefined
  /** Path of a dev manifest (PROTOCOL 4.2) to load before serving. */
  readonly manifest?: string | undefined
  /** Core settings (lease timeout, max attempts, stage, …). */
  readonly settings?: Partial<Core.Settings> | undefined
  /**
   * The protocol stage: `"current"` (default, PROTOCOL-CURRENT), `"seed"` or
   * `"v0.14.0"` (the reference kernel v0.14.0). Wins over `settings.stage`.
   */
  readonly stage?: Core.Stage | undefined
  /** Dispatcher options (concurrency, webhook timeout, custom delivery, …). */
  readonly dispatcher?: Dispatcher.Options | undefined
  /** Bearer token of the client/admin routes; dev mode when absent. */
  readonly apiToken?: Redacted.Redacted<string> | undefined
}

/**
 * A running embedded kernel.
 *
 * @since 0.1.0
 * @category models
 */
export interface RunningKernel {
  /** Base URL, e.g. `http://127.0.0.1:53211` (no trailing slash). */
  readonly url: string
  readonly core: Core.KernelCore
  readonly dispatcher: Dispatcher.Dispatcher
  /** Agents registered from the manifest, in file order. */
  readonly agents: ReadonlyArray<Manifest.ManifestAgent>
}

/**
 * The running kernel as a service (see {@link layer}).
 *
 * @since 0.1.0
 * @category tags
 */
export class EmbeddedKernel extends Context.Service<EmbeddedKernel, RunningKernel>()(
  "effect-rebuno/kernel/EmbeddedKernel"
) {}

/**
 * The URL of a bound address; wildcard hosts are reported as `localhost`.
 *
 * @since 0.1.0
 * @category utils
 */
export const formatUrl = (address: NetAddress.SocketAddress): string => {
  if (address._tag === "UnixPathAddress") return `http+unix://${encodeURIComponent(address.path)}`
  const hostname = NetAddress.formatHost(address)
  const host = hostname === "0.0.0.0" || hostname === "::" || hostname === ""
    ? "localhost"
    : hostname.includes(":")
    ? `[${hostname}]`
    : hostname
  return `http://${host}:${address.port}`
}

/**
 * Starts a complete kernel in the current scope: creates the core, registers
 * the manifest's agents, forks the delivery loop and binds the HTTP server.
 * Everything stops when the scope closes.
 *
 * @since 0.1.0
 * @category constructors
 */
export const start = Effect.fn("Kernel.start")(function*(options: StartOptions = {}) {
  const core = yield* Core.make(
    options.stage === undefined ? options.settings : { ...options.settings, stage: options.stage }
  )
  const agents = options.manifest === undefined
    ? []
    : yield* Manifest.loadInto(core, options.manifest).pipe(
      Effect.provide(Layer.merge(NodeFileSystem.layer, NodePath.layer))
    )
  const dispatcher = yield* Dispatcher.make(core, options.dispatcher)
  const context = yield* Layer.build(Server.layer({
    host: options.host ?? Server.defaultHost,
    port: options.port ?? 0,
    core,
    apiToken: options.apiToken
  }))
  const server = Context.get(context, HttpServer.HttpServer)
  const running: RunningKernel = { url: formatUrl(server.address), core, dispatcher, agents }
  return running
})

/**
 * How the kernel's log lines look. Both write one line per entry:
 *
 * - `text`: [logfmt](https://brandur.org/logfmt), Effect's `Logger.formatLogFmt`:
 *   `timestamp=… level=WARN fiber=#12 message="webhook delivery to agent hello failed: connection refused …" rebuno.agent_id=hello …`
 * - `json`: one JSON object, Effect's `Logger.formatJson`:
 *   `{"message":"…","level":"WARN","timestamp":"…","annotations":{"rebuno.agent_id":"hello",…},"spans":{},"fiberId":"#12"}`
 *
 * @since 0.2.0
 * @category logging
 */
export type LogFormat = "text" | "json"

/**
 * The accepted {@link LogFormat}s.
 *
 * @since 0.2.0
 * @category logging
 */
export const logFormats: ReadonlyArray<LogFormat> = ["text", "json"]

/**
 * A logger writing each entry as one line in the given {@link LogFormat} to
 * standard error (`console.error` of the current `Console`), as
 * `effect-rebuno dev` does. Entries below the fiber's `MinimumLogLevel` are
 * dropped before they reach it.
 *
 * @since 0.2.0
 * @category logging
 */
export const logger = (format: LogFormat): Logger.Logger<unknown, void> =>
  Logger.withConsoleError(format === "json" ? Logger.formatJson : Logger.formatLogFmt)

/**
 * A layer replacing the loggers with {@link logger}.
 *
 * **Example** (An embedded kernel logging JSON lines at `Debug` and above)
 *
 * ```ts
 * import { NodeRuntime } from "@effect/platform-node"
 * import { Layer, References } from "effect"
 * import * as Kernel from "effect-rebuno/kernel"
 *
 * // on 127.0.0.1:8080, as `effect-rebuno dev --port 8080 --log-format json --log-level debug`
 * const KernelLive = Kernel.layer({ port: 8080 }).pipe(
 *   Layer.provide(Kernel.layerLogger("json")),
 *   Layer.provide(Layer.succeed(References.MinimumLogLevel, "Debug"))
 * )
 *
 * KernelLive.pipe(Layer.launch, NodeRuntime.runMain)
 * ```
 *
 * @since 0.2.0
 * @category logging
 */
export const layerLogger = (format: LogFormat): Layer.Layer<never> => Logger.layer([logger(format)])

/**
 * {@link start} as a layer providing {@link EmbeddedKernel}.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: StartOptions = {}) => Layer.effect(EmbeddedKernel, start(options))

/**
 * The {@link StartOptions} of a kernel configured as `effect-rebuno dev` is by
 * its environment ({@link KernelConfig.kernelConfig}: `REBUNO_LISTEN_ADDR`
 * (default `127.0.0.1:8080`), `REBUNO_DISPATCH_*`, `REBUNO_APPROVAL_TIMEOUT`,
 * `REBUNO_DEADLINE_*`, `REBUNO_API_TOKEN`, `REBUNO_STAGE`, `REBUNO_JUDGE_*`),
 * with `options` on top: an option given here wins over the environment (as
 * the CLI's flags do), and `settings` / `dispatcher` are merged key by key.
 *
 * @since 0.2.0
 * @category constructors
 */
export const startOptionsFromConfig = (env: KernelConfig.KernelConfig, options: StartOptions = {}): StartOptions => {
  const listen = env.listen._tag === "Some" ? env.listen.value : undefined
  return {
    ...options,
    host: options.host ?? (listen === undefined ? KernelConfig.defaults.host : listen.host ?? ""),
    port: options.port ?? listen?.port ?? KernelConfig.defaults.port,
    settings: {
      leaseTimeoutMs: env.leaseTimeoutMs,
      maxAttempts: env.maxAttempts,
      approvalTimeoutMs: env.approvalTimeoutMs,
      deadlineMs: env.deadlineMs,
      ...(env.judge._tag === "Some" ? { judge: Policy.openAiJudge(env.judge.value) } : {}),
      ...options.settings
    },
    dispatcher: {
      timeoutMs: env.dispatchTimeoutMs,
      concurrency: env.concurrency,
      deadlineCheckIntervalMs: env.deadlineCheckIntervalMs,
      ...options.dispatcher
    },
    stage: options.stage ?? options.settings?.stage ?? env.stage,
    apiToken: options.apiToken ?? (env.apiToken._tag === "Some" ? env.apiToken.value : undefined)
  }
}

/**
 * {@link layer} configured from `Config` as `effect-rebuno dev` is (see
 * {@link startOptionsFromConfig}); `options` win over the environment. A
 * variable that is set but invalid fails the layer with a `ConfigError`.
 *
 * **Example** (An embedded kernel configured by its environment)
 *
 * ```ts
 * import { NodeRuntime } from "@effect/platform-node"
 * import { Layer } from "effect"
 * import * as Kernel from "effect-rebuno/kernel"
 *
 * // REBUNO_LISTEN_ADDR=127.0.0.1:8080 REBUNO_DISPATCH_LEASE_TIMEOUT=30s npx tsx kernel.ts
 * const KernelLive = Kernel.layerConfig({ manifest: "rebuno.dev.yaml" })
 *
 * KernelLive.pipe(Layer.launch, NodeRuntime.runMain)
 * ```
 *
 * @since 0.2.0
 * @category layers
 */
export const layerConfig = (options: StartOptions = {}) =>
  Layer.effect(
    EmbeddedKernel,
    Effect.gen(function*() {
      return yield* start(startOptionsFromConfig(yield* KernelConfig.kernelConfig, options))
    })
  )
