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
import * as NetAddress from "effect/net/NetAddress"
import type * as Redacted from "effect/Redacted"
import * as Core from "./Core.js"
import * as Dispatcher from "./Dispatcher.js"
import * as Manifest from "./Manifest.js"
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
  /** Interface to bind (default `127.0.0.1`; `""` = every interface). */
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
    host: options.host ?? "127.0.0.1",
    port: options.port ?? 0,
    core,
    apiToken: options.apiToken
  }))
  const server = Context.get(context, HttpServer.HttpServer)
  const running: RunningKernel = { url: formatUrl(server.address), core, dispatcher, agents }
  return running
})

/**
 * {@link start} as a layer providing {@link EmbeddedKernel}.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: StartOptions = {}) => Layer.effect(EmbeddedKernel, start(options))
