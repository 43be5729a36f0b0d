/**
 * `end-to-end`: a hello-like agent (two tools) over real HTTP against the
 * embedded kernel with its default dispatcher (a 2 s tick, woken at once when
 * an execution is created, claiming 10 per tick, 8 deliveries in flight), and
 * against the reference kernel: the binary `REBUNO_REFERENCE_BIN` names, started
 * here in dev mode with a manifest naming the agent, or a running one at
 * `REBUNO_REFERENCE_URL`.
 *
 * Executions are created with the operator `Client` and watched with it
 * (`GET /v0/executions/{id}`), as a backend would. Two workloads:
 *
 * - burst: M executions created at once; executions/s and steps/s until the
 *   last one is terminal;
 * - sequential: create one, wait until it is terminal, repeat; the median
 *   latency (create → terminal, polled every 10 ms).
 *
 * A running reference kernel needs this agent in its manifest (the benchmark
 * serves it on 127.0.0.1:5055, or `REBUNO_REFERENCE_AGENT_PORT`):
 *
 * ```yaml
 * agents:
 *   - id: bench
 *     webhook_url: http://127.0.0.1:5055/webhook
 *     secret: bench-secret
 * ```
 *
 * `REBUNO_REFERENCE_TOKEN` is sent as the bearer token when the reference
 * kernel is not in dev mode.
 *
 * @since 0.1.0
 */
import { NodeHttpClient } from "@effect/platform-node"
import { Effect, Layer, Schema } from "effect"
import type { Scope } from "effect"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Agent, Client, Protocol, Tool } from "../src/index.js"
import * as Kernel from "../src/kernel/index.js"
import { serveAgent } from "./harness.js"
import type { BenchOptions, Result } from "./util.js"
import { AGENT_ID, freePort, log, median, nowMs, round, SECRET, spawnServer, writeManifest } from "./util.js"

const reverse = Tool.make("reverse", {
  args: Schema.Struct({ text: Schema.String }),
  success: Schema.Struct({ reversed: Schema.String }),
  execute: ({ text }) => Effect.succeed({ reversed: [...text].reverse().join("") })
})
const wordCount = Tool.make("word_count", {
  args: Schema.Struct({ text: Schema.String }),
  success: Schema.Struct({ count: Schema.Number }),
  execute: ({ text }) => Effect.succeed({ count: text.split(/\s+/).filter(Boolean).length })
})
const hello = Agent.make({
  id: AGENT_ID,
  input: Schema.Struct({ query: Schema.String }),
  handler: ({ query }) =>
    Effect.gen(function*() {
      const { reversed } = yield* reverse({ text: query })
      const { count } = yield* wordCount({ text: query })
      return { query, reversed, word_count: count }
    })
})

type ClientService = Client.Client["Service"]

const isTerminal = (e: Protocol.Execution) => Protocol.isTerminalStatus(e.status)

/** Poll the executions in creation order until all are terminal (or the deadline). */
const awaitAll = (client: ClientService, ids: ReadonlyArray<string>, pollMs: number, deadlineMs: number) =>
  Effect.gen(function*() {
    const started = nowMs()
    let next = 0
    let completed = 0
    while (next < ids.length && nowMs() - started < deadlineMs) {
      const e = yield* client.get(ids[next]!)
      if (isTerminal(e)) {
        if (e.status === "completed") completed++
        next++
        continue
      }
      yield* Effect.sleep(pollMs)
    }
    return { terminal: next, completed }
  })

const workloads = (client: ClientService, options: BenchOptions, label: string) =>
  Effect.gen(function*() {
    const burst = options.quick ? 40 : 100
    const sequential = options.quick ? 5 : 15
    // warm-up
    const warm = yield* client.create(AGENT_ID, { query: "warm up" })
    yield* awaitAll(client, [warm.id], 10, 60_000)

    const t0 = nowMs()
    // A backend creating a burst with a few requests in flight.
    const ids = yield* Effect.forEach(
      Array.from({ length: burst }, (_, i) => i),
      (i) => Effect.map(client.create(AGENT_ID, { query: `hello durable world ${i}` }), (e) => e.id),
      { concurrency: 8 }
    )
    const createdMs = nowMs() - t0
    const { completed, terminal } = yield* awaitAll(client, ids, 50, 300_000)
    const wallMs = nowMs() - t0
    log(`  ${label}: burst of ${burst}: ${completed} completed in ${round(wallMs / 1000, 2)} s`)

    const latencies: Array<number> = []
    for (let i = 0; i < sequential; i++) {
      const s0 = nowMs()
      const e = yield* client.create(AGENT_ID, { query: `one at a time ${i}` })
      yield* awaitAll(client, [e.id], 10, 60_000)
      latencies.push(nowMs() - s0)
    }
    log(`  ${label}: sequential median ${round(median(latencies))} ms`)
    return {
      burst_executions: burst,
      burst_completed: completed,
      burst_terminal: terminal,
      burst_wall_s: round(wallMs / 1000, 2),
      burst_create_ms: round(createdMs),
      executions_per_s: round((burst * 1000) / wallMs, 2),
      steps_per_s: round((2 * burst * 1000) / wallMs, 2),
      sequential_runs: sequential,
      sequential_latency_ms_median: round(median(latencies), 1),
      sequential_latency_ms_min: round(Math.min(...latencies), 1),
      sequential_latency_ms_max: round(Math.max(...latencies), 1)
    }
  })

const embedded = (options: BenchOptions): Effect.Effect<Record<string, unknown>, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    const kernel = yield* Kernel.start({ port: 0 })
    const http = yield* Layer.build(NodeHttpClient.layerUndici)
    const client = yield* Client.make({ baseUrl: kernel.url }).pipe(Effect.provide(http))
    // Registered before it is served: a served agent publishes its metadata at once, and the kernel refuses the
    // signature of an agent it does not know yet (a warning, not sent again).
    const port = yield* Effect.promise(freePort)
    yield* client.registerAgent({ id: AGENT_ID, webhookUrl: `http://127.0.0.1:${port}/webhook`, secret: SECRET })
    yield* serveAgent(hello, { kernelUrl: kernel.url, secret: SECRET, port })
    return yield* workloads(client, options, "embedded")
  })

const reference = (
  url: string,
  agentPort: number,
  options: BenchOptions
): Effect.Effect<Record<string, unknown>, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    yield* serveAgent(hello, { kernelUrl: url, secret: SECRET, port: agentPort })
    const http = yield* Layer.build(NodeHttpClient.layerUndici)
    const token = process.env["REBUNO_REFERENCE_TOKEN"]
    const client = yield* Client.make({ baseUrl: url, ...(token === undefined ? {} : { apiKey: token }) }).pipe(
      Effect.provide(http)
    )
    return yield* workloads(client, options, "reference")
  })

/** The reference binary (`REBUNO_REFERENCE_BIN`) in dev mode, its manifest naming the agent on a free port. */
const spawnedReference = (bin: string, options: BenchOptions) =>
  Effect.gen(function*() {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "rebuno-bench-e2e-"))
    yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(dir, { recursive: true, force: true })))
    const [port, agentPort] = yield* Effect.promise(() => Promise.all([freePort(), freePort()]))
    const url = `http://127.0.0.1:${port}`
    const manifest = writeManifest(dir, "reference.yaml", `http://127.0.0.1:${agentPort}/webhook`)
    yield* Effect.acquireRelease(
      Effect.promise(() =>
        spawnServer(bin, ["dev", "--listen-addr", `127.0.0.1:${port}`, "--config", manifest, "--log-level", "warn"], url)
      ),
      (server) => Effect.promise(() => server.stop())
    )
    return yield* reference(url, agentPort, options)
  })

/** Runs the `end-to-end` figures. */
export const run = async (options: BenchOptions): Promise<ReadonlyArray<Result>> => {
  log("end-to-end: hello agent (2 tool steps) over HTTP, default dispatcher")
  const e = await Effect.runPromise(Effect.scoped(embedded(options)))
  const bin = process.env["REBUNO_REFERENCE_BIN"]
  const referenceUrl = process.env["REBUNO_REFERENCE_URL"]
  let ref: Record<string, unknown> | string = "skipped (set REBUNO_REFERENCE_BIN or REBUNO_REFERENCE_URL)"
  if (bin !== undefined && bin !== "") {
    log(`end-to-end: reference kernel ${bin} dev (own process)`)
    ref = await Effect.runPromise(Effect.scoped(spawnedReference(bin, options)))
  } else if (referenceUrl !== undefined && referenceUrl !== "") {
    log(`end-to-end: reference kernel at ${referenceUrl}`)
    const agentPort = Number(process.env["REBUNO_REFERENCE_AGENT_PORT"] ?? 5055)
    ref = await Effect.runPromise(Effect.scoped(reference(referenceUrl, agentPort, options)))
  }
  return [{
    name: "end-to-end",
    agent: "hello: reverse + word_count tool steps",
    dispatcher: "defaults: 2 s tick (woken on create), claim 10 per tick, 8 deliveries in flight",
    embedded: e,
    reference: ref
  }]
}
