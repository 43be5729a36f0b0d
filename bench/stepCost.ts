/**
 * `step-cost` and `replay`: the SDK's per-step overhead over real HTTP, against
 * the stub kernel (a child process, so it does not share the client's core),
 * compared side by side with a bare keep-alive undici client that sends the
 * same bytes, signs each request with node:crypto, and parses each answer.
 *
 * Rounds interleave the sides (bare, platform floor, SDK on undici, SDK on
 * HttpClient) in a rotated order (round r starts with side r mod 4; a round
 * is cut into 4 segments, each rotated once more, so that a burst of load on
 * the shared machine falls on every side); each
 * side's figures are the median and range over the rounds, and the SDK/bare
 * ratio and the CPU overhead (SDK − bare, µs/step) are also given per round.
 *
 * @since 0.1.0
 */
import { NodeHttpClient } from "@effect/platform-node"
import { Context, Effect, Layer, ManagedRuntime, Schema } from "effect"
import { HttpBody, HttpClient, HttpClientRequest } from "effect/http"
import { createHmac } from "node:crypto"
import * as Net from "node:net"
import * as Undici from "undici"
import { Agent, KernelClient, Signature, Tool } from "../src/index.js"
import { PROCEED_EXECUTION_ID, REPLAY_EXECUTION_ID } from "./stubKernel.js"
import type { BenchOptions, Result } from "./util.js"
import { AGENT_ID, log, median, nowMs, rotated, round, SECRET, spawnStub, spread, target } from "./util.js"

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

/**
 * The bare clients' step loop over their `post`: `steps` sequential steps (a
 * submit, then a complete); with `replay`, one round trip each (the submit).
 * Resolves with the elapsed milliseconds.
 */
const stepLoop = (label: string, post: (path: string, body: string) => Promise<unknown>) =>
async (executionId: string, steps: number, replay: boolean): Promise<number> => {
  const base = "/v0/executions/" + executionId
  const t0 = nowMs()
  for (let i = 0; i < steps; i++) {
    const decision = (await post(base + "/steps", SUBMIT_BODY)) as { decision: string; step_id: string }
    if (replay) {
      if (decision.decision !== "replay") throw new Error(`${label}: expected replay`)
      continue
    }
    if (decision.decision !== "proceed") throw new Error(`${label}: expected proceed`)
    const recorded = (await post(base + "/steps/" + decision.step_id + "/complete", COMPLETE_BODY)) as {
      decision: string
    }
    if (recorded.decision !== "recorded") throw new Error(`${label}: expected recorded`)
  }
  return nowMs() - t0
}

/** The bare baseline: the same requests with undici's Agent, signed per request with node:crypto. */
export const makeBare = (baseUrl: string) => {
  const dispatcher = new Undici.Agent({ keepAliveTimeout: 60_000 })
  const origin = new URL(baseUrl).origin
  const post = async (path: string, body: string): Promise<unknown> => {
    const response = await dispatcher.request({ origin, path, method: "POST", headers: signedHeaders(body), body })
    const text = await response.body.text()
    if (response.statusCode >= 300) throw new Error(`bare: status ${response.statusCode}`)
    return JSON.parse(text)
  }
  return { run: stepLoop("bare", post), close: () => dispatcher.close() }
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

/**
 * The SDK side: a real agent runtime whose handler runs `steps` sequential
 * no-op tool steps. `mark(i)` (warm-up only) is called before step `i` and
 * with `i = steps` after the last one.
 */
export const makeSdk = (
  baseUrl: string,
  transport: "socket" | "undici" | "httpclient",
  tracing = true,
  mark?: (i: number) => void
) => {
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
        if (mark === undefined) {
          for (let i = 0; i < steps; i++) yield* noop({})
        } else {
          for (let i = 0; i < steps; i++) {
            mark(i)
            yield* noop({})
          }
          mark(steps)
        }
        elapsed = nowMs() - t0
      })
  })
  const layer = Layer.effect(RuntimeTag, Agent.runtime(agent)).pipe(
    Layer.provide(
      transport === "socket"
        ? KernelClient.layerSocket({ baseUrl, secret: SECRET })
        : transport === "undici"
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

/**
 * The bare baseline on Node's sockets: the same requests, signed per request
 * with node:crypto, written on one keep-alive `node:net` connection as one
 * buffer each, each answer read by its `content-length` — the least any
 * client on `node:net` does for these round trips (the floor of
 * `KernelClient.layerSocket`).
 */
export const makeBareSocket = (baseUrl: string) => {
  const url = new URL(baseUrl)
  const socket = Net.connect({ host: url.hostname, port: Number(url.port) })
  socket.setNoDelay(true)
  let buffered: Buffer | undefined
  let waiting: ((text: string) => void) | undefined
  socket.on("data", (data: Buffer) => {
    const buffer = buffered === undefined ? data : Buffer.concat([buffered, data])
    const end = buffer.indexOf("\r\n\r\n")
    const length = end < 0 ? -1 : Number(/\r\ncontent-length: *(\d+)/i.exec(buffer.toString("latin1", 0, end))?.[1])
    if (end < 0 || buffer.length < end + 4 + length) {
      buffered = buffer
      return
    }
    buffered = undefined
    const resolve = waiting!
    waiting = undefined
    resolve(buffer.toString("utf8", end + 4, end + 4 + length))
  })
  const post = (path: string, body: string): Promise<unknown> =>
    new Promise<string>((resolve) => {
      waiting = resolve
      let head = `POST ${path} HTTP/1.1\r\nhost: ${url.host}\r\nconnection: keep-alive\r\n`
      const headers = signedHeaders(body)
      for (const name in headers) head += name + ": " + headers[name] + "\r\n"
      socket.write(head + "content-length: " + Buffer.byteLength(body) + "\r\n\r\n" + body)
    }).then((text) => JSON.parse(text))
  return { run: stepLoop("bare socket", post), close: async () => void socket.destroy() }
}

/** The sides of `step-cost` and `replay`, in the order of round 0. */
const SIDES = ["bare", "bare_socket", "floor", "sdk", "sdk_undici", "sdk_httpclient"] as const
type Side = typeof SIDES[number]

const perSide = <A>(f: (side: Side) => A): Record<Side, A> =>
  Object.fromEntries(SIDES.map((side) => [side, f(side)])) as Record<Side, A>

const pair = async (
  name: string,
  options: BenchOptions,
  replay: boolean,
  baseUrl: string
): Promise<Result> => {
  // replay: 1,000 recorded steps per round (the brief's figure)
  const steps = replay ? 1_000 : 2_000
  const rounds = options.quick ? 5 : 9
  const executionId = replay ? REPLAY_EXECUTION_ID : PROCEED_EXECUTION_ID
  const clients: Record<Side, { run: (n: number) => Promise<number>; close: () => Promise<void> }> = {
    bare: ((c) => ({ run: (n: number) => c.run(executionId, n, replay), close: c.close }))(makeBare(baseUrl)),
    bare_socket: ((c) => ({ run: (n: number) => c.run(executionId, n, replay), close: c.close }))(
      makeBareSocket(baseUrl)
    ),
    floor: ((c) => ({ run: (n: number) => c.run(executionId, n, replay), close: c.close }))(makeFloor(baseUrl)),
    sdk: ((c) => ({ run: (n: number) => c.run(executionId, n), close: c.close }))(makeSdk(baseUrl, "socket")),
    sdk_undici: ((c) => ({ run: (n: number) => c.run(executionId, n), close: c.close }))(makeSdk(baseUrl, "undici")),
    sdk_httpclient: ((c) => ({ run: (n: number) => c.run(executionId, n), close: c.close }))(
      makeSdk(baseUrl, "httpclient")
    )
  }
  // Warm-up (JIT, connections; the `warm-up` line shows a fresh SDK needs ~1,000 steps to settle): two untimed
  // passes over the sides.
  const warmSteps = options.quick ? 1_500 : 2_500
  for (let pass = 0; pass < 2; pass++) for (const side of rotated(SIDES, pass)) await clients[side].run(warmSteps)
  const rates = perSide((): Array<number> => [])
  const cpu = perSide((): Array<number> => [])
  const segments = 4
  const segmentSteps = Math.ceil(steps / segments)
  for (let r = 0; r < rounds; r++) {
    // Interleaved and rotated: round r starts with side r mod 6; each round is cut into 4 segments, each in the
    // next rotation, so that a burst of load on the shared machine falls on every side rather than on one.
    const order = rotated(SIDES, r)
    const ms = perSide(() => 0)
    const us = perSide(() => 0)
    for (let segment = 0; segment < segments; segment++) {
      for (const side of rotated(SIDES, r + segment)) {
        const c0 = process.cpuUsage()
        ms[side] += await clients[side].run(segmentSteps)
        const c = process.cpuUsage(c0)
        us[side] += c.user + c.system
      }
    }
    for (const side of SIDES) {
      rates[side].push((segments * segmentSteps * 1000) / ms[side])
      cpu[side].push(us[side] / (segments * segmentSteps))
    }
    log(
      `  ${name} round ${r + 1}/${rounds} (${order.join(", ")}): ${
        SIDES.map((side) => `${side} ${round(rates[side][r]!)}`).join(", ")
      } steps/s; CPU µs/step ${SIDES.map((side) => `${side} ${round(cpu[side][r]!)}`).join(", ")}`
    )
  }
  for (const side of SIDES) await clients[side].close()
  const perRound = (f: (r: number) => number, digits: number) => Array.from({ length: rounds }, (_, r) => round(f(r), digits))
  /** `sdk` against `baseline`, per round: the steps/s ratio and the CPU overhead (µs/step). */
  const versus = (sdk: Side, baseline: Side) => {
    const ratios = perRound((r) => rates[sdk][r]! / rates[baseline][r]!, 3)
    const overhead = perRound((r) => cpu[sdk][r]! - cpu[baseline][r]!, 1)
    return {
      ratio: round(median(rates[sdk]) / median(rates[baseline]), 3),
      ratio_per_round: ratios,
      ratio_min: Math.min(...ratios),
      overhead_cpu_us_per_step: round(median(overhead), 1),
      overhead_cpu_us_per_step_per_round: overhead,
      // Client CPU, baseline / SDK: what the ratio would be if the wall time were the client's CPU alone.
      cpu_ratio_per_round: perRound((r) => cpu[baseline][r]! / cpu[sdk][r]!, 3)
    }
  }
  const headline = versus("sdk", "bare")
  const sameTransport = versus("sdk", "bare_socket")
  return {
    name,
    steps_per_round: steps,
    rounds,
    warm_up_steps_per_side: 2 * warmSteps,
    order: `interleaved, rotated: round r starts with side r mod ${SIDES.length} of ${
      SIDES.join(", ")
    }; 4 segments per round, each rotated once more`,
    round_trips_per_step: replay ? 1 : 2,
    // wall: steps/s of each side (median, min, max over rounds)
    sdk_steps_per_s: spread(rates.sdk),
    bare_steps_per_s: spread(rates.bare),
    // The SDK (KernelClient.layerSocket) against the bare undici client.
    ...headline,
    // CPU of this process (the client side) per step
    sdk_cpu_us_per_step: spread(cpu.sdk, 1),
    bare_cpu_us_per_step: spread(cpu.bare, 1),
    // The same transport on both sides: the SDK on sockets against the bare socket client.
    bare_socket_steps_per_s: spread(rates.bare_socket),
    bare_socket_cpu_us_per_step: spread(cpu.bare_socket, 1),
    versus_bare_socket: sameTransport,
    // The SDK on undici (KernelClient.layerUndici) against the bare undici client.
    sdk_undici_steps_per_s: spread(rates.sdk_undici),
    sdk_undici_cpu_us_per_step: spread(cpu.sdk_undici, 1),
    sdk_undici_versus_bare: versus("sdk_undici", "bare"),
    // The SDK on effect/http's HttpClient (KernelClient.layer + NodeHttpClient.layerUndici).
    sdk_httpclient_steps_per_s: spread(rates.sdk_httpclient),
    sdk_httpclient_ratio: round(median(rates.sdk_httpclient) / median(rates.bare), 3),
    sdk_httpclient_cpu_us_per_step: spread(cpu.sdk_httpclient, 1),
    // The same requests through effect/http's HttpClient with no SDK code: what any HttpClient user pays.
    platform_floor_steps_per_s: spread(rates.floor),
    platform_floor_ratio: round(median(rates.floor) / median(rates.bare), 3),
    platform_floor_cpu_us_per_step: spread(cpu.floor, 1),
    ...(replay ? {} : {
      targets: {
        overhead_cpu_us_per_step: target("<=", 60, headline.overhead_cpu_us_per_step, "µs"),
        ratio_every_round: target(">=", 0.85, headline.ratio_min),
        overhead_cpu_us_per_step_same_transport: target("<=", 60, sameTransport.overhead_cpu_us_per_step, "µs"),
        ratio_every_round_same_transport: target(">=", 0.85, sameTransport.ratio_min)
      }
    }),
    stub: "node:http child process on 127.0.0.1, keep-alive",
    client:
      "sdk: KernelClient.layerSocket; sdk_undici: KernelClient.layerUndici; bare: undici.Agent.request + node:crypto createHmac; bare_socket: one node:net connection, one write per request"
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
  const transport = process.env["BENCH_TRANSPORT"]
  const sdk = makeSdk(baseUrl, transport === "httpclient" || transport === "undici" ? transport : "socket")
  await sdk.run(replay ? REPLAY_EXECUTION_ID : PROCEED_EXECUTION_ID, 500)
  for (let i = 0; i < 3; i++) {
    const c0 = process.cpuUsage()
    const ms = await sdk.run(replay ? REPLAY_EXECUTION_ID : PROCEED_EXECUTION_ID, steps)
    const c = process.cpuUsage(c0)
    log(`sdk: ${round((steps * 1000) / ms)} steps/s, cpu ${round((c.user + c.system) / steps)} us/step`)
  }
  await sdk.close()
}
