/**
 * `memory`: N runs in flight at once (10,000; over HTTP 2,000 with
 * `--quick`; `BENCH_IN_FLIGHT` overrides both), each parked in a tool body on a shared latch
 * while its heartbeat keeps running, then released so that every run
 * completes. Two parts, each in fresh child processes (so earlier benchmarks
 * do not inflate the RSS):
 *
 * 1. `in_process`: one process — the test kit's kernel core, its in-process
 *    webhook delivery and direct kernel client, under `TestClock` (lease
 *    120 s, one heartbeat round of 30 s virtual time: a run whose lease was
 *    not renewed by it counts as late). Peak RSS is the process's own
 *    `maxRSS` (no sampling gap); the target is < 512 MiB.
 * 2. `http`: the same N runs over real HTTP — the embedded kernel in its own
 *    child process (`Kernel.start`, dispatcher 64 claimed and delivered at a
 *    time, 50 ms tick), the agent in another (`Agent.layer` +
 *    `KernelClient.layerSocket`), executions created with the operator
 *    `Client` (16 requests in flight), real clock. Leases of 30 s (12 s with
 *    `--quick`) give a beat every 10 s (4 s); the runs stay parked for 2.5
 *    beat intervals. A beat is late when it comes more than 1 s after it was
 *    due (interval + 1 s after the previous one, or after the run started).
 *    Wall time (create → all parked, release → all completed, given up after
 *    150 s, 60 s with `--quick`), late beats
 *    while parked and after the release (when N runs post their outcomes at
 *    once), and the peak RSS of each process (agent: `maxRSS`; kernel:
 *    `VmHWM`).
 *
 * `BENCH_HEAP_SNAPSHOT=<file>` writes a heap snapshot while the in-process
 * runs are parked.
 *
 * @since 0.1.0
 */
import { NodeHttpClient } from "@effect/platform-node"
import { Deferred, Effect, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"
import { Agent, Client, Tool } from "../src/index.js"
import type { KernelClient } from "../src/index.js"
import { TestKernel } from "../src/testing/index.js"
import { serveAgent } from "./harness.js"
import type { BenchOptions, Result } from "./util.js"
import {
  childMain,
  freePort,
  gc,
  inChild,
  log,
  mib,
  nodeArgs,
  nowMs,
  peakRss,
  procRss,
  round,
  SECRET,
  sleep,
  spawnServer,
  target
} from "./util.js"

/** Deliveries keep up with thousands of executions; claims never run ahead of deliveries. */
const DISPATCHER = { claimBatch: 64, concurrency: 64, tickIntervalMs: 50 } as const

/** Runs in flight: 10,000 (in-process: also with `--quick`; over HTTP 2,000 with `--quick`), or `BENCH_IN_FLIGHT`. */
const inFlightOf = (options: BenchOptions, part: "in-process" | "http") =>
  Number(process.env["BENCH_IN_FLIGHT"] ?? (options.quick && part === "http" ? 2_000 : 10_000))

/** A tool that parks every run on `latch`, counting the parked runs. */
const parkingTool = (latch: Deferred.Deferred<void>, onPark: () => void) =>
  Tool.make("wait", {
    args: Schema.Struct({}),
    success: Schema.Struct({ ok: Schema.Boolean }),
    execute: () =>
      Effect.suspend(() => {
        onPark()
        return Effect.as(Deferred.await(latch), { ok: true })
      })
  })

/** Part 1: in one process, the test kit under `TestClock`. */
const inProcess = (options: BenchOptions) =>
  Effect.gen(function*() {
    const inFlight = inFlightOf(options, "in-process")
    const kernel = yield* TestKernel.TestKernel
    const latch = yield* Deferred.make<void>()
    let parked = 0
    let done = 0
    const wait = parkingTool(latch, () => parked++)
    const agent = Agent.make({
      id: "parked",
      handler: () => Effect.map(wait({}), (r) => (done++, r))
    })
    yield* Effect.orDie(kernel.register(agent))
    gc()
    const rssBefore = process.memoryUsage().rss
    const heapBefore = process.memoryUsage().heapUsed
    const t0 = nowMs()
    const ids: Array<string> = []
    for (let i = 0; i < inFlight; i++) ids.push(yield* Effect.orDie(kernel.create("parked", { n: i })))
    // The kit's dispatcher claims 10 per tick: tick until every run is parked in its tool.
    while (parked < inFlight && nowMs() - t0 < 300_000) {
      yield* kernel.tick
      yield* Effect.yieldNow
    }
    const parkedMs = nowMs() - t0
    // One heartbeat round for every run (lease 120 s → a beat every 30 s, on virtual time).
    const core = kernel.core
    const before = yield* core.dispatches()
    const lockedBefore = new Map(before.map((d) => [d.id, d.lockedAtMs]))
    yield* TestClock.adjust("30 seconds")
    for (let i = 0; i < 20; i++) yield* Effect.yieldNow
    const after = yield* core.dispatches()
    const renewed = after.filter((d) => d.status === "in_flight" && d.lockedAtMs !== lockedBefore.get(d.id)).length
    yield* Effect.promise(() => sleep(200))
    const peakParked = peakRss()
    gc()
    const afterGc = process.memoryUsage()
    if (process.env["BENCH_HEAP_SNAPSHOT"] !== undefined) {
      const v8 = yield* Effect.promise(() => import("node:v8"))
      log("  heap snapshot", v8.writeHeapSnapshot(process.env["BENCH_HEAP_SNAPSHOT"]))
    }
    log(
      `  memory in-process: ${parked}/${inFlight} parked in ${round(parkedMs / 1000, 1)} s, ${renewed} leases renewed by heartbeats, peak RSS ${
        mib(peakParked)
      } MiB`
    )
    yield* Deferred.succeed(latch, undefined)
    const t1 = nowMs()
    while (done < inFlight && nowMs() - t1 < 300_000) yield* Effect.yieldNow
    for (let i = 0; i < 50; i++) yield* Effect.yieldNow
    let completed = 0
    for (const id of ids) if ((yield* Effect.orDie(core.getExecution(id))).status === "completed") completed++
    const peak = peakRss()
    return {
      in_flight: inFlight,
      how: "one process: TestKernel (direct transport) under TestClock; runs parked in a tool on a latch",
      parked,
      parked_after_s: round(parkedMs / 1000, 1),
      heartbeats_renewed: renewed,
      heartbeats_late: inFlight - renewed,
      peak_rss_mib_parked: mib(peakParked),
      rss_mib_parked_after_gc: mib(afterGc.rss),
      heap_used_mib_parked_after_gc: mib(afterGc.heapUsed),
      live_heap_per_run_kib: round(((afterGc.heapUsed - heapBefore) / inFlight) / 1024, 1),
      peak_rss_mib: mib(peak),
      rss_before_mib: mib(rssBefore),
      completed_after_release: completed
    }
  }).pipe(Effect.provide(TestKernel.layer()), Effect.provide(TestClock.layer()))

/** Part 2: the agent (this child process) and the embedded kernel (its own child) over HTTP. */
const overHttp = (options: BenchOptions) =>
  Effect.scoped(Effect.gen(function*() {
    const inFlight = inFlightOf(options, "http")
    const leaseSeconds = options.quick ? 12 : 30
    const intervalMs = Agent.heartbeatIntervalMillis(leaseSeconds)
    const lateAfterMs = intervalMs + 1_000
    const holdMs = 2.5 * intervalMs
    // Bounds the run: the release of 10,000 runs at once took 74–197 s on the shared 2-core machine.
    const releaseDeadlineMs = options.quick ? 60_000 : 150_000
    const port = yield* Effect.promise(freePort)
    const url = `http://127.0.0.1:${port}`
    const kernelOptions = { settings: { leaseTimeoutMs: leaseSeconds * 1000 }, dispatcher: DISPATCHER }
    const kernel = yield* Effect.acquireRelease(
      Effect.promise(() =>
        spawnServer(process.execPath, nodeArgs("kernelChild"), url, {
          BENCH_KERNEL_PORT: String(port),
          BENCH_KERNEL_OPTIONS: JSON.stringify(kernelOptions)
        })
      ),
      (server) => Effect.promise(() => server.stop())
    )
    const latch = yield* Deferred.make<void>()
    let parked = 0
    let completedPosts = 0
    const completedIds = new Set<string>()
    const runStart = new Map<string, number>()
    const lastBeat = new Map<string, number>()
    let beats = 0
    let late = 0
    let maxGap = 0
    const observe = (client: KernelClient.KernelClient["Service"]): KernelClient.KernelClient["Service"] => ({
      ...client,
      getExecution: (caller, id) =>
        Effect.suspend(() => {
          // The run's heartbeat fiber starts just before this read.
          if (!runStart.has(id)) runStart.set(id, nowMs())
          return client.getExecution(caller, id)
        }),
      heartbeat: (caller, id) =>
        Effect.suspend(() => {
          // Gaps are per run (execution + attempt); a first beat is timed from the run's start (attempt 1).
          const now = nowMs()
          const run = `${id}/${caller.lease.attempt ?? "?"}`
          const previous = lastBeat.get(run) ?? (caller.lease.attempt === 1 ? runStart.get(id) : undefined)
          beats++
          if (previous !== undefined) {
            const gap = now - previous
            if (gap > lateAfterMs) late++
            if (gap > maxGap) maxGap = gap
          }
          lastBeat.set(run, now)
          return client.heartbeat(caller, id)
        }),
      completeExecution: (caller, id, output, state) =>
        Effect.tap(
          client.completeExecution(caller, id, output, state),
          () => Effect.sync(() => (completedPosts++, completedIds.add(id)))
        )
    })
    const wait = parkingTool(latch, () => parked++)
    const agent = Agent.make({ id: "parked", handler: () => wait({}) })
    const http = yield* Layer.build(NodeHttpClient.layerUndici)
    const client = yield* Client.make({ baseUrl: url }).pipe(Effect.provide(http))
    // Registered before the agent starts, so that its metadata is accepted at once.
    const agentPort = yield* Effect.promise(freePort)
    yield* client.registerAgent({ id: "parked", webhookUrl: `http://127.0.0.1:${agentPort}/webhook`, secret: SECRET })
    yield* serveAgent(agent, { kernelUrl: url, secret: SECRET, port: agentPort, wrap: observe })
    gc()
    const rssBefore = process.memoryUsage().rss
    const t0 = nowMs()
    yield* Effect.forEach(
      Array.from({ length: inFlight }, (_, i) => i),
      (i) => client.create("parked", { n: i }),
      { concurrency: 16, discard: true }
    )
    const createdMs = nowMs() - t0
    while (parked < inFlight && nowMs() - t0 < 600_000) yield* Effect.promise(() => sleep(50))
    const parkedMs = nowMs() - t0
    log(
      `  memory over HTTP: ${parked}/${inFlight} parked after ${round(parkedMs / 1000, 1)} s (created in ${
        round(createdMs / 1000, 1)
      } s); holding ${round(holdMs / 1000)} s`
    )
    yield* Effect.promise(() => sleep(holdMs))
    const beatsWhileParked = beats
    const lateWhileParked = late
    const agentPeakParked = peakRss()
    const kernelParked = procRss(kernel.pid)
    const t1 = nowMs()
    yield* Deferred.succeed(latch, undefined)
    while (completedIds.size < inFlight && nowMs() - t1 < releaseDeadlineMs) yield* Effect.promise(() => sleep(20))
    const releasedMs = nowMs() - t1
    const agentPeak = peakRss()
    const kernelRss = procRss(kernel.pid)
    log(
      `  memory over HTTP: ${completedIds.size}/${inFlight} completed ${
        round(releasedMs / 1000, 1)
      } s after release; ${beats} beats (${late} late: ${lateWhileParked} while parked, ${
        late - lateWhileParked
      } after the release); peak RSS agent ${
        mib(agentPeak)
      } MiB, kernel ${kernelRss === undefined ? "?" : mib(kernelRss.peak)} MiB`
    )
    return {
      in_flight: inFlight,
      how:
        "agent and embedded kernel in two child processes over 127.0.0.1 HTTP, real clock; runs parked in a tool on a latch",
      parked,
      created_s: round(createdMs / 1000, 1),
      parked_after_s: round(parkedMs / 1000, 1),
      held_parked_s: round(holdMs / 1000, 1),
      completed: completedIds.size,
      complete_posts: completedPosts,
      completed_after_release_s: round(releasedMs / 1000, 1),
      release_deadline_s: releaseDeadlineMs / 1000,
      all_completed_before_deadline: completedIds.size === inFlight,
      wall_s: round((parkedMs + holdMs + releasedMs) / 1000, 1),
      wall_s_excluding_hold: round((parkedMs + releasedMs) / 1000, 1),
      lease_timeout_s: leaseSeconds,
      heartbeat_interval_ms: intervalMs,
      heartbeats: beats,
      heartbeats_while_parked: beatsWhileParked,
      heartbeats_late: late,
      heartbeats_late_while_parked: lateWhileParked,
      heartbeats_late_after_release: late - lateWhileParked,
      heartbeat_late_threshold_ms: lateAfterMs,
      heartbeat_max_gap_ms: round(maxGap),
      agent_rss_before_mib: mib(rssBefore),
      agent_peak_rss_mib_parked: mib(agentPeakParked),
      agent_peak_rss_mib: mib(agentPeak),
      kernel_rss_mib_parked: kernelParked === undefined ? null : mib(kernelParked.current),
      kernel_peak_rss_mib: kernelRss === undefined ? null : mib(kernelRss.peak),
      dispatcher: DISPATCHER
    }
  }))

if (process.env["BENCH_MEMORY_CHILD"] === "in-process") {
  childMain("memory (in-process)", Effect.runPromise(inProcess({ quick: process.env["BENCH_QUICK"] === "1" })))
} else if (process.env["BENCH_MEMORY_CHILD"] === "http") {
  childMain("memory (HTTP)", Effect.runPromise(overHttp({ quick: process.env["BENCH_QUICK"] === "1" })))
}

/** Runs the `memory` line (both parts, each in fresh child processes). */
export const run = async (options: BenchOptions): Promise<ReadonlyArray<Result>> => {
  const quick = options.quick ? "1" : "0"
  const inProcessN = inFlightOf(options, "in-process")
  const httpN = inFlightOf(options, "http")
  log(`memory: ${inProcessN} runs in flight in one process (fresh child)`)
  const one = await inChild("memory", { BENCH_MEMORY_CHILD: "in-process", BENCH_QUICK: quick })
  log(`memory: ${httpN} over HTTP (agent and kernel in fresh child processes)`)
  const http = await inChild("memory", { BENCH_MEMORY_CHILD: "http", BENCH_QUICK: quick })
  return [{
    name: "memory",
    in_process: one,
    http,
    targets: {
      ...(inProcessN < 10_000 ? {} : { in_process_peak_rss_mib: target("<", 512, one["peak_rss_mib"] as number, "MiB") }),
      in_process_heartbeats_late: target("<=", 0, one["heartbeats_late"] as number),
      http_heartbeats_late: target("<=", 0, http["heartbeats_late"] as number)
    },
    ...(inProcessN < 10_000 || httpN < 10_000
      ? { note: `in flight: ${inProcessN} in one process, ${httpN} over HTTP (10,000 in a full run)` }
      : {})
  }]
}
