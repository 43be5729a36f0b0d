/**
 * Serve an agent's webhook over real HTTP on a free loopback port, talking to
 * the kernel at `kernelUrl` through `KernelClient.layer` on undici's
 * `HttpClient`, for as long as the current scope. Returns the webhook URL.
 */
import { NodeHttpClient, NodeHttpServer } from "@effect/platform-node"
import { Context, Effect, Layer } from "effect"
import type { Config, Scope } from "effect"
import { HttpServer } from "effect/http"
import type { HttpServerError } from "effect/http"
import { Agent, KernelClient } from "effect-rebuno"
import { createServer } from "node:http"

export const serveAgent = <In, A, E>(
  agent: Agent.Agent<In, A, E, never>,
  kernelUrl: string,
  secret: string
): Effect.Effect<string, Config.ConfigError | HttpServerError.ServeError, Scope.Scope> =>
  Effect.gen(function*() {
    const context = yield* Layer.build(
      Agent.layer(agent).pipe(
        Layer.provideMerge(NodeHttpServer.layerServer(() => createServer(), { port: 0, host: "127.0.0.1" })),
        Layer.provide(KernelClient.layer({ baseUrl: kernelUrl, secret })),
        Layer.provide(NodeHttpClient.layerUndici)
      )
    )
    const address = Context.get(context, HttpServer.HttpServer).address
    if (address._tag === "UnixPathAddress") return yield* Effect.die(new Error("expected a TCP address"))
    return `http://127.0.0.1:${address.port}/webhook`
  })
