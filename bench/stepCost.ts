/**
 * `step-cost` and `replay`: the SDK's per-step overhead over real HTTP, against
 * the stub kernel (a child process, so it does not share the client's core),
 * compared side by side with a bare keep-alive undici client that sends the
 * same bytes, signs each request with node:crypto, and parses each answer.
 *
 * Rounds interleave the sides (bare, platform floor, SDK on undici, SDK on
 * HttpClient, bare, …); the figures are medians.
 *
 * @since 0.1.0
 */
import { NodeHttpClient } from "@effect/platform-node"
import { Context, Effect, Layer, ManagedRuntime, Schema } from "effect"
import { HttpBody, HttpClient, HttpClientRequest } from "effect/http"
import { createHmac } from "node:crypto"
import * as Undici from "undici"
import { Agent, KernelClient, Signature, Tool } from "../src/index.js"
import { PROCEED_EXECUTION_ID, REPLAY_EXECUTION_ID } from "./stubKernel.js"
import type { BenchOptions, Result } from "./util.js"
import { log, median, nowMs, round, spawnStub } from "./util.js"

const SECRET = "bench-secret"
const AGENT_ID = "bench"
const DISPATCH_ID = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a60"

const SUBMIT_BODY = "{\"kind\":\"tool_call\",\"target\":\"noop\",\"args\":{},\"idempotency\":\"safe_to_retry\"}"
const COMPLETE_BODY = "{\"result\":{\"ok\":true}}"

/** The headers of a step call with `body`, signed per request with node:crypto (bare and floor sides). */
const signedHeaders = (body: string | Uint8Array): Record<string, string> => ({
  "content-type": "application/json",
  "rebuno-agent-id": AGENT_ID,
  "rebuno-signature": "sha256=" + createHmac("sha256", SECRET).update(body).digest("hex"),
  "rebuno-dispatch-id": DISPATCH_ID,
  "rebuno-dispatch-attempt": "1"
})

/** The bare baseline: the same requests with undici's Agent, signed per request with node:crypto. */
const makeBare = (baseUrl: string) => {
  const dispatcher = new Undici.Agent({ keepAliveTimeout: 60_000 })
  const origin = new URL(baseUrl).origin
  const post = async (path: string, body: string): Promise<unknown> => {
    const response = await dispatcher.request({ origin, path, method: "POST", headers: signedHeaders(body), body })
    const text = await response.body.text()
    if (response.statusCode >= 300) throw new Error(`bare: status ${response.statusCode}`)
    return JSON.parse(text)
  }
  /** `steps` sequential steps; with `replay`, one round trip each (the submit). */
  const run = async (executionId: string, steps: number, replay: boolean): Promise<number> => {
    const base = "/v0/executions/" + executionId
    const t0 = nowMs()
    for (let i = 0; i < steps; i++) {
      const decision = (await post(base + "/steps", SUBMIT_BODY)) as { decision: string; step_id: string }
      if (replay) {
        if (decision.decision !== "replay") throw new Error("bare: expected replay")
        continue
      }
      if (decision.decision !== "proceed") throw new Error("bare: expected proceed")
      const recorded = (await post(base + "/steps/" + decision.step_id + "/complete", COMPLETE_BODY)) as {
        decision: string
      }
      if (recorded.decision !== "recorded") throw new Error("bare: expected recorded")
    }
    return nowMs() - t0
  }
  return { run, close: () => dispatcher.close() }
}

/**
 * The floor of any client built on `effect/http`: the same requests
 * (bytes, headers, per-request node:crypto signature, JSON parse) through
 * `HttpClient` on `NodeHttpClient.layerUndici`, in an `Effect.gen` loop, with
 * none of the SDK's code.
 */
const makeFloor = (baseUrl: string) => {
  const runtime = ManagedRuntime.make(NodeHttpClient.layerUndici)
  const encoder = new TextEncoder()
  const submitBytes = encoder.encode(SUBMIT_BODY)
  const completeBytes = encoder.encode(COMPLETE_BODY)
  const run = (executionId: string, steps: number, replay: boolean): Promise<number> =>
    runtime.runPromise(Effect.gen(function*() {
      const client = yield* HttpClient.HttpClient
      const post = (path: string, body: Uint8Array) => {
        const request = HttpClientRequest.post(baseUrl + path, {
          headers: signedHeaders(body),
          body: HttpBody.uint8Array(body, "application/json")
        })
        return Effect.flatMap(client.execute(request), (response) =>
          Effect.map(response.text, (text) => JSON.parse(text) as { decision: string; step_id: string }))
      }
      const base = "/v0/executions/" + executionId
      const t0 = nowMs()
      for (let i = 0; i < steps; i++) {
        const decision = yield* post(base + "/steps", submitBytes)
        if (replay) continue
        yield* post(base + "/steps/" + decision.step_id + "/complete", completeBytes)
      }
      return nowMs() - t0
    }).pipe(Effect.orDie))
  return { run, close: () => runtime.dispose() }
}

class RuntimeTag extends Context.Service<RuntimeTag, Agent.AgentRuntime>()("bench/AgentRuntime") {}

/** The SDK side: a real agent runtime whose handler runs `steps` sequential no-op tool steps. */
const makeSdk = (baseUrl: string, transport: "undici" | "httpclient", tracing = true) => {
  let steps = 0
  let elapsed = 0
  const noop = Tool.make("noop", {
    args: Schema.Struct({}),
    success: Schema.Struct({ ok: Schema.Boolean }),
    execute: () => Effect.succeed({ ok: true })
  })
  const agent = Agent.make({
    id: AGENT_ID,
    handler: () =>
      Effect.gen(function*() {
        const t0 = nowMs()
        for (let i = 0; i < steps; i++) yield* noop({})
        elapsed = nowMs() - t0
      })
  })
  const layer = Layer.effect(RuntimeTag, Agent.runtime(agent)).pipe(
    Layer.provide(
      transport === "undici"
        ? KernelClient.layerUndici({ baseUrl, secret: SECRET })
        : KernelClient.layer({ baseUrl, secret: SECRET }).pipe(Layer.provide(NodeHttpClient.layerUndici))
    )
  )
  const runtime = ManagedRuntime.make(layer)
  let attempt = 0
  const run = async (executionId: string, n: number): Promise<number> => {
    steps = n
    elapsed = -1
    attempt++
    const body = JSON.stringify({
      execution_id: executionId,
      dispatch_id: DISPATCH_ID,
      dispatch_attempt: attempt,
      lease_timeout_seconds: 120
    })
    await runtime.runPromise(
      Effect.gen(function*() {
        const rt = yield* RuntimeTag
        const signature = yield* Signature.sign(SECRET, body)
        const status = yield* rt.handleWebhook({ body: new TextEncoder().encode(body), signature })
        if (status !== 200) return yield* Effect.die(new Error(`webhook answered ${status}`))
        yield* rt.awaitIdle
      }).pipe(Effect.withTracerEnabled(tracing))
    )
    if (elapsed < 0) throw new Error("sdk: the run did not finish its steps")
    return elapsed
  }
  return { run, close: () => runtime.dispose() }
}

type Side = "bare" | "floor" | "sdk" | "sdk_httpclient"

const pair = async (
  name: string,
  options: BenchOptions,
  replay: boolean,
  baseUrl: string
): Promise<Result> => {
  // replay: 1,000 recorded steps per round (the brief's figure)
  const steps = replay ? 1_000 : options.quick ? 500 : 2_000
  const rounds = options.quick ? 5 : 9
  const bare = makeBare(baseUrl)
  const floor = makeFloor(baseUrl)
  const sdk = makeSdk(baseUrl, "undici")
  const sdkHttpClient = makeSdk(baseUrl, "httpclient")
  const executionId = replay ? REPLAY_EXECUTION_ID : PROCEED_EXECUTION_ID
  const runners: Record<Side, (n: number) => Promise<number>> = {
    bare: (n) => bare.run(executionId, n, replay),
    floor: (n) => floor.run(executionId, n, replay),
    sdk: (n) => sdk.run(executionId, n),
    sdk_httpclient: (n) => sdkHttpClient.run(executionId, n)
  }
  const sides = Object.keys(runners) as ReadonlyArray<Side>
  // Warm-up (JIT, connections).
  for (const side of sides) await runners[side](Math.min(300, steps))
  const rates: Record<Side, Array<number>> = { bare: [], floor: [], sdk: [], sdk_httpclient: [] }
  const cpu: Record<Side, Array<number>> = { bare: [], floor: [], sdk: [], sdk_httpclient: [] }
  for (let r = 0; r < rounds; r++) {
    // Interleaved: bare, floor, sdk, sdk_httpclient, bare, …
    for (const side of sides) {
      const c0 = process.cpuUsage()
      const ms = await runners[side](steps)
      const c = process.cpuUsage(c0)
      rates[side].push((steps * 1000) / ms)
      cpu[side].push((c.user + c.system) / steps)
    }
    log(
      `  ${name} round ${r + 1}/${rounds}: bare ${round(rates.bare[r]!)}, platform floor ${
        round(rates.floor[r]!)
      }, sdk ${round(rates.sdk[r]!)}, sdk on HttpClient ${round(rates.sdk_httpclient[r]!)} steps/s`
    )
  }
  await bare.close()
  await floor.close()
  await sdk.close()
  await sdkHttpClient.close()
  const rate = (side: Side) => median(rates[side])
  const bareRate = rate("bare")
  return {
    name,
    steps_per_round: steps,
    rounds,
    round_trips_per_step: replay ? 1 : 2,
    sdk_steps_per_s: round(rate("sdk")),
    bare_steps_per_s: round(bareRate),
    ratio: round(rate("sdk") / bareRate, 3),
    ...(replay ? {} : { target_ratio: 0.8 }),
    sdk_us_per_step: round(1e6 / rate("sdk"), 1),
    bare_us_per_step: round(1e6 / bareRate, 1),
    sdk_cpu_us_per_step: round(median(cpu.sdk), 1),
    bare_cpu_us_per_step: round(median(cpu.bare), 1),
    // The SDK on effect/http's HttpClient (KernelClient.layer + NodeHttpClient.layerUndici).
    sdk_httpclient_steps_per_s: round(rate("sdk_httpclient")),
    sdk_httpclient_ratio: round(rate("sdk_httpclient") / bareRate, 3),
    sdk_httpclient_cpu_us_per_step: round(median(cpu.sdk_httpclient), 1),
    // The same requests through effect/http's HttpClient with no SDK code: what any HttpClient user pays.
    platform_floor_steps_per_s: round(rate("floor")),
    platform_floor_ratio: round(rate("floor") / bareRate, 3),
    platform_floor_cpu_us_per_step: round(median(cpu.floor), 1),
    stub: "node:http child process on 127.0.0.1, keep-alive",
    client: "sdk: KernelClient.layerUndici; bare: undici.Agent.request + node:crypto createHmac"
  }
}

/** Runs `step-cost` then `replay` against one stub kernel. */
export const run = async (options: BenchOptions): Promise<ReadonlyArray<Result>> => {
  const stub = await spawnStub()
  try {
    log(`step-cost: stub kernel at ${stub.url}`)
    const stepCost = await pair("step-cost", options, false, stub.url)
    log(`replay: stub kernel at ${stub.url}`)
    const replay = await pair("replay", options, true, stub.url)
    return [stepCost, replay]
  } finally {
    stub.stop()
  }
}

/** For `bench/profile.ts`: the SDK side alone. */
export const profileSdk = async (baseUrl: string, replay: boolean, steps: number): Promise<void> => {
  const sdk = makeSdk(baseUrl, process.env["BENCH_TRANSPORT"] === "httpclient" ? "httpclient" : "undici")
  await sdk.run(replay ? REPLAY_EXECUTION_ID : PROCEED_EXECUTION_ID, 500)
  for (let i = 0; i < 3; i++) {
    const c0 = process.cpuUsage()
    const ms = await sdk.run(replay ? REPLAY_EXECUTION_ID : PROCEED_EXECUTION_ID, steps)
    const c = process.cpuUsage(c0)
    log(`sdk: ${round((steps * 1000) / ms)} steps/s, cpu ${round((c.user + c.system) / steps)} us/step`)
  }
  await sdk.close()
}
