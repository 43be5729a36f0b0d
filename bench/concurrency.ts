/**
 * `concurrency`: many executions at once in one agent process, against the
 * embedded kernel over real HTTP (kernel and agent share this process).
 *
 * 1. 1,000 concurrent executions of 10 no-op tool steps each, lease 12 s (so
 *    a heartbeat every 4 s). The dispatcher is tuned so deliveries keep up
 *    (64 claimed and delivered at a time, 50 ms tick) instead of its defaults
 *    (10 per 2 s tick, 8 at a time). The claim batch stays at the delivery
 *    concurrency: a lease runs from its claim, so a dispatch claimed long
 *    before its turn to be delivered would lapse before its run started. Wall time, steps/s, peak RSS, and heartbeats:
 *    every beat is timed at the agent (a wrapper around the real
 *    `KernelClient`), a beat is late when it comes more than 1 s after it was
 *    due (interval + 1 s after the previous one, or after the run started),
 *    and the kernel side counts redeliveries (a lease that lapsed).
 * 2. The memory check: N runs in flight at once (10,000; 2,000 with
 *    `--quick`), each parked in a tool body on a shared latch while its
 *    heartbeat keeps running (lease 60 s → a beat every 20 s); peak RSS of the
 *    process, then the latch opens and every run completes.
 *
 * @since 0.1.0
 */
import { Deferred, Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import * as Kernel from "../src/kernel/index.js"
import { Agent, Tool } from "../src/index.js"
import type { KernelClient } from "../src/index.js"
import { TestKernel } from "../src/testing/index.js"
import { serveAgent } from "./harness.js"
import type { BenchOptions, Result } from "./util.js"
import { childMain, gc, inChild, log, mib, nowMs, round, rssSampler, sleep } from "./util.js"

const SECRET = "bench-secret"

/** Deliveries keep up with a thousand executions; claims never run ahead of deliveries. */
const DISPATCHER = { claimBatch: 64, concurrency: 64, tickIntervalMs: 50 } as const

const noop = Tool.make("noop", {
  args: Schema.Struct({ i: Schema.Number }),
  success: Schema.Struct({ ok: Schema.Boolean }),
  execute: () => Effect.succeed({ ok: true })
})

/** Wait (polling the core) until every execution is terminal, or the deadline passes. */
const awaitTerminal = (
  core: Kernel.Core.KernelCore,
  ids: ReadonlyArray<string>,
  deadlineMs: number
): Effect.Effect<number> =>
  Effect.gen(function*() {
    const pending = new Set(ids)
    const started = nowMs()
    while (pending.size > 0 && nowMs() - started < deadlineMs) {
      for (const id of pending) {
        const record = yield* Effect.orDie(core.getExecution(id))
        if (record.status === "completed" || record.status === "failed" || record.status === "cancelled") {
          pending.delete(id)
        }
      }
      if (pending.size > 0) yield* Effect.promise(() => sleep(100))
    }
    return ids.length - pending.size
  })

const createMany = (core: Kernel.Core.KernelCore, agentId: string, n: number) =>
  Effect.forEach(
    Array.from({ length: n }, (_, i) => i),
    (i) =>
      Effect.map(
        Effect.orDie(core.createExecution({ agentId, inputRaw: `{"n":${i}}`, agentVersion: undefined })),
        (r) => r.id
      )
  )

/**
 * Redeliveries (attempt > 1), split by cause: a failed webhook delivery
 * (`dispatch.failed`) or a lease that lapsed and was reclaimed (the rest).
 */
const redeliveries = (core: Kernel.Core.KernelCore) =>
  Effect.gen(function*() {
    const hit = (yield* core.dispatches()).filter((d) => d.attempt > 1)
    let webhookFailures = 0
    for (const d of hit) {
      const events = yield* core.eventLog(d.executionId)
      webhookFailures += events.filter((e) => e.type === "dispatch.failed").length
    }
    const extraAttempts = hit.reduce((n, d) => n + d.attempt - 1, 0)
    return { dispatches: hit.length, extraAttempts, webhookFailures, leaseLapses: extraAttempts - webhookFailures }
  })

const concurrent = (options: BenchOptions) =>
  Effect.scoped(Effect.gen(function*() {
    const executions = Number(process.env["BENCH_EXECUTIONS"] ?? (options.quick ? 200 : 1_000))
    const stepsEach = 10
    const leaseSeconds = 12
    const intervalMs = Agent.heartbeatIntervalMillis(leaseSeconds)
    const lateAfterMs = intervalMs + 1_000
    const kernel = yield* Kernel.start({
      port: 0,
      settings: { leaseTimeoutMs: leaseSeconds * 1000 },
      dispatcher: DISPATCHER
    })
    const runStart = new Map<string, number>()
    const lastBeat = new Map<string, number>()
    let beats = 0
    let late = 0
    let maxGap = 0
    let finished = 0
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
          // Gaps are per run (execution + attempt). A first beat is timed from the
          // run's start only for attempt 1 (a redelivered run's start is not observed).
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
      completeExecution: (caller, id, output) =>
        Effect.suspend(() => {
          finished++
          return client.completeExecution(caller, id, output)
        })
    })
    const agent = Agent.make({
      id: "bench",
      handler: () =>
        Effect.gen(function*() {
          for (let i = 0; i < stepsEach; i++) yield* noop({ i })
          return { ok: true }
        })
    })
    const webhookUrl = yield* serveAgent(agent, { kernelUrl: kernel.url, secret: SECRET, wrap: observe })
    yield* Effect.orDie(kernel.core.registerAgent({ id: "bench", webhookUrl, secret: SECRET }))
    gc()
    const rss = rssSampler(50)
    const rssBefore = rss.sample()
    const t0 = nowMs()
    const ids = yield* createMany(kernel.core, "bench", executions)
    const done = yield* awaitTerminal(kernel.core, ids, 600_000)
    const wallMs = nowMs() - t0
    // Count the beats of runs still finishing their outcome posts, then stop sampling.
    const peak = rss.peak
    rss.stop()
    let completed = 0
    for (const id of ids) {
      if ((yield* Effect.orDie(kernel.core.getExecution(id))).status === "completed") completed++
    }
    const redelivered = yield* redeliveries(kernel.core)
    const steps = executions * stepsEach
    log(`  concurrency: ${completed}/${executions} completed in ${round(wallMs / 1000, 2)} s, ${beats} beats (${late} late), peak RSS ${mib(peak)} MiB`)
    return {
      executions,
      steps_per_execution: stepsEach,
      completed,
      terminal: done,
      wall_s: round(wallMs / 1000, 2),
      steps_per_s: round((steps * 1000) / wallMs),
      executions_per_s: round((executions * 1000) / wallMs, 1),
      peak_rss_mib: mib(peak),
      rss_before_mib: mib(rssBefore),
      lease_timeout_s: leaseSeconds,
      heartbeat_interval_ms: intervalMs,
      heartbeats: beats,
      heartbeats_late: late,
      heartbeat_late_threshold_ms: lateAfterMs,
      heartbeat_max_gap_ms: round(maxGap),
      redelivered_dispatches: redelivered.dispatches,
      redeliveries_after_webhook_failure: redelivered.webhookFailures,
      redeliveries_after_lease_lapse: redelivered.leaseLapses,
      outcome_posts: finished,
      dispatcher: DISPATCHER
    }
  }))

/**
 * The memory check, in-process: the test kit's kernel core, its in-process
 * webhook delivery and its direct kernel client, under `TestClock` (so 10,000
 * runs can be parked and heartbeat without 10,000 × HTTP round trips).
 */
const memory = (options: BenchOptions) =>
  Effect.gen(function*() {
    const inFlight = Number(process.env["BENCH_IN_FLIGHT"] ?? (options.quick ? 2_000 : 10_000))
    const kernel = yield* TestKernel.TestKernel
    const latch = yield* Deferred.make<void>()
    let parked = 0
    let done = 0
    const wait = Tool.make("wait", {
      args: Schema.Struct({}),
      success: Schema.Struct({ ok: Schema.Boolean }),
      execute: () =>
        Effect.suspend(() => {
          parked++
          return Effect.as(Deferred.await(latch), { ok: true })
        })
    })
    const agent = Agent.make({
      id: "parked",
      handler: () => Effect.map(wait({}), (r) => (done++, r))
    })
    yield* Effect.orDie(kernel.register(agent))
    gc()
    const rss = rssSampler(50)
    const rssBefore = rss.sample()
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
    const peakBeforeGc = rss.peak
    gc()
    const afterGc = process.memoryUsage()
    if (process.env["BENCH_HEAP_SNAPSHOT"] !== undefined) {
      const v8 = yield* Effect.promise(() => import("node:v8"))
      log("  heap snapshot", v8.writeHeapSnapshot(process.env["BENCH_HEAP_SNAPSHOT"]))
    }
    const peakParked = peakBeforeGc
    log(`  memory: ${parked}/${inFlight} parked in ${round(parkedMs / 1000, 1)} s, ${renewed} leases renewed by heartbeats, peak RSS ${mib(peakParked)} MiB`)
    yield* Deferred.succeed(latch, undefined)
    const t1 = nowMs()
    while (done < inFlight && nowMs() - t1 < 300_000) yield* Effect.yieldNow
    for (let i = 0; i < 50; i++) yield* Effect.yieldNow
    let completed = 0
    for (const id of ids) if ((yield* Effect.orDie(core.getExecution(id))).status === "completed") completed++
    const peak = rss.peak
    rss.stop()
    return {
      in_flight: inFlight,
      how: "in-process: TestKernel (direct transport) under TestClock; runs parked in a tool on a latch",
      parked,
      parked_after_s: round(parkedMs / 1000, 1),
      heartbeats_renewed: renewed,
      peak_rss_mib_parked: mib(peakParked),
      rss_mib_parked_after_gc: mib(afterGc.rss),
      heap_used_mib_parked_after_gc: mib(afterGc.heapUsed),
      live_heap_per_run_kib: round(((afterGc.heapUsed - heapBefore) / inFlight) / 1024, 1),
      peak_rss_mib: mib(peak),
      rss_before_mib: mib(rssBefore),
      under_1_gib: peak < 1024 * 1024 * 1024,
      completed_after_release: completed,
      ...(options.quick ? { note: `quick mode: ${inFlight} in flight instead of 10,000` } : {})
    }
  }).pipe(Effect.provide(TestKernel.layer()), Effect.provide(TestClock.layer()))

/**
 * The memory check in a fresh child process (so earlier benchmarks do not
 * inflate its RSS): `BENCH_MEMORY_CHILD=1` makes this module print the result.
 */
const memoryInChild = (options: BenchOptions): Promise<Record<string, unknown>> =>
  inChild("concurrency", { BENCH_MEMORY_CHILD: "1", BENCH_QUICK: options.quick ? "1" : "0" })

if (process.env["BENCH_MEMORY_CHILD"] === "1") {
  childMain("memory check", Effect.runPromise(memory({ quick: process.env["BENCH_QUICK"] === "1" })))
}

/** Runs the `concurrency` figures (one JSON line with both parts). */
export const run = async (options: BenchOptions): Promise<ReadonlyArray<Result>> => {
  log(`concurrency: executions over HTTP against the embedded kernel (kernel + agent in this process)`)
  const c = process.env["BENCH_SKIP_CONCURRENT"] === "1" ? {} : await Effect.runPromise(concurrent(options))
  log(`concurrency: memory check (fresh child process)`)
  const m = await memoryInChild(options)
  return [{ name: "concurrency", ...c, memory: m }]
}
