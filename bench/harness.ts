/**
 * Effect-side helpers shared by the end-to-end benchmarks: serve an agent on
 * an ephemeral (or given) port over real HTTP with the real `KernelClient`
 * (on Node's sockets, as `KernelClient.layerSocket`), optionally wrapping the
 * client to observe its calls.
 *
 * @since 0.1.0
 */
import { NodeHttpClient, NodeHttpServer } from "@effect/platform-node"
import { Context, Effect, Layer } from "effect"
import { HttpServer } from "effect/http"
import type { Scope } from "effect"
import { createServer } from "node:http"
import { Agent, KernelClient } from "../src/index.js"

/**
 * Serve `agent` at `http://127.0.0.1:<port>/webhook` (port 0 = any) in the
 * current scope, talking to the kernel at `kernelUrl`. Returns the webhook URL.
 */
export const serveAgent = <In, A, E>(
  agent: Agent.Agent<In, A, E, never>,
  options: {
    readonly kernelUrl: string
    readonly secret: string
    readonly port?: number | undefined
    readonly wrap?: ((client: KernelClient.KernelClient["Service"]) => KernelClient.KernelClient["Service"]) | undefined
  }
): Effect.Effect<string, never, Scope.Scope> =>
  Effect.gen(function*() {
    const serverContext = yield* Layer.build(
      NodeHttpServer.layer(() => createServer({ keepAliveTimeout: 60_000 }), {
        port: options.port ?? 0,
        host: "127.0.0.1"
      })
    ).pipe(Effect.orDie)
    const server = Context.get(serverContext, HttpServer.HttpServer)
    const address = server.address
    const port = address._tag === "UnixPathAddress" ? 0 : address.port
    // The agent's connections to the kernel as `KernelClient.layerSocket` opens them (64 by default), built in this
    // scope. `BENCH_AGENT_CONNECTIONS=<n>` sets another cap and `BENCH_AGENT_TRANSPORT=undici` puts the agent on
    // `KernelClient.layerUndici`, for diagnosis (every reported figure uses the defaults).
    const cap = Number(process.env["BENCH_AGENT_CONNECTIONS"] ?? NaN)
    const connections = Number.isInteger(cap) && cap > 0 ? cap : KernelClient.defaultConnections
    const clientOptions = { baseUrl: options.kernelUrl, secret: options.secret, connections }
    const client = process.env["BENCH_AGENT_TRANSPORT"] === "undici"
      ? yield* KernelClient.makeUndici(clientOptions).pipe(
        Effect.provide(yield* Layer.build(NodeHttpClient.layerDispatcherOptions({ connections }))),
        Effect.orDie
      )
      : yield* KernelClient.makeSocket(clientOptions).pipe(Effect.orDie)
    const wrapped = options.wrap === undefined ? client : options.wrap(client)
    yield* Layer.build(
      Agent.layer(agent).pipe(
        Layer.provide(Layer.succeed(KernelClient.KernelClient, wrapped)),
        Layer.provide(Layer.succeedContext(serverContext))
      )
    )
    return `http://127.0.0.1:${port}/webhook`
  })
