/**
 * End-to-end helpers over real HTTP: serve agents with the SDK's default
 * kernel client (stage `auto`) against a kernel URL, a `Client` for the
 * backend side (and for the agents' subagent calls), and a wait for an
 * execution to end.
 */
import { NodeHttpClient, NodeHttpServer } from "@effect/platform-node"
import { Context, Effect, Layer, Schedule } from "effect"
import type { Config, Scope } from "effect"
import { HttpServer } from "effect/http"
import type { HttpServerError } from "effect/http"
import { createServer } from "node:http"
import * as Agent from "../../src/Agent.js"
import * as Client from "../../src/Client.js"
import * as KernelClient from "../../src/KernelClient.js"
import * as Protocol from "../../src/Protocol.js"
import type { KernelError } from "../../src/RebunoError.js"

/** A `Client` of the kernel at `baseUrl` (no API key: the dev kernel is open). */
export const clientLayer = (baseUrl: string): Layer.Layer<Client.Client, Config.ConfigError> =>
  Client.layer({ baseUrl }).pipe(Layer.provide(NodeHttpClient.layerUndici))

export const client = (baseUrl: string): Effect.Effect<Client.Client.Service, Config.ConfigError, Scope.Scope> =>
  Effect.map(Layer.build(clientLayer(baseUrl)), (context) => Context.get(context, Client.Client))

/**
 * Serve `agent` on a free loopback port against `kernelUrl` with the default
 * kernel client options (plus `options`), register it, and return its webhook URL.
 * A `Client` of the same kernel is in the agent's context (for subagents).
 */
export const serve = <In, A, E>(
  agent: Agent.Agent<In, A, E, never | Client.Client>,
  kernelUrl: string,
  secret: string,
  options: Partial<KernelClient.UndiciOptions> = {}
): Effect.Effect<string, Config.ConfigError | HttpServerError.ServeError | KernelError, Scope.Scope> =>
  Effect.gen(function*() {
    const admin = yield* client(kernelUrl)
    // Registered before the agent starts (as a manifest would), so that its start-up
    // metadata publication finds it; the real webhook URL follows once the port is known.
    yield* admin.registerAgent({ id: agent.id, webhookUrl: "http://127.0.0.1:9/webhook", secret })
    const context = yield* Layer.build(
      Agent.layer(agent).pipe(
        Layer.provideMerge(NodeHttpServer.layerServer(() => createServer(), { port: 0, host: "127.0.0.1" })),
        Layer.provide(KernelClient.layerUndici({ baseUrl: kernelUrl, secret, ...options })),
        Layer.provide(clientLayer(kernelUrl))
      )
    )
    const address = Context.get(context, HttpServer.HttpServer).address
    if (address._tag === "UnixPathAddress") return yield* Effect.die(new Error("expected a TCP address"))
    const webhookUrl = `http://127.0.0.1:${address.port}/webhook`
    yield* admin.registerAgent({ id: agent.id, webhookUrl, secret })
    return webhookUrl
  })

/** Poll until the execution is terminal (about 20 s at most). */
export const settled = (
  admin: Client.Client.Service,
  executionId: string
): Effect.Effect<Protocol.Execution, KernelError | "not terminal"> =>
  admin.get(executionId).pipe(
    Effect.filterOrFail((e) => Protocol.isTerminalStatus(e.status), () => "not terminal" as const),
    Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 400 })
  )
