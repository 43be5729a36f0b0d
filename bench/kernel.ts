/**
 * `kernel`: the same agent — one execution = 200 sequential no-op tool steps
 * — over real HTTP against
 *
 * - `embedded`: our kernel in its own child process, started as users start
 *   it (`node <cli> dev --port P --config <temp manifest>`, the compiled CLI:
 *   `dist/bin/cli.js` when built and not older than `src`, else
 *   `.bench/src/bin/cli.js`, see `cliPath`), at its
 *   default stage unless `BENCH_KERNEL_STAGE` says otherwise;
 * - `reference`: the reference Go kernel, when `REBUNO_REFERENCE_BIN` names
 *   its binary (spawned as `<bin> dev --listen-addr 127.0.0.1:P --config
 *   <temp manifest> --log-level warn`; v0.14.0 speaks the `v0.14.0` stage),
 *   or `REBUNO_REFERENCE_URL` points at a running one (its manifest must
 *   register agent `bench`, secret `bench-secret`, webhook
 *   `http://127.0.0.1:<REBUNO_REFERENCE_AGENT_PORT, default 5055>/webhook`;
 *   its CPU is then read only when `REBUNO_REFERENCE_PID` is given);
 * - `node_floor` (unless `BENCH_KERNEL_FLOOR=0`): a do-nothing `node:http`
 *   server in its own process (`floorKernel.ts`) that answers the same agent
 *   and operator client with the smallest valid replies and sends the
 *   webhook, so its CPU per step is what any Node kernel pays just to serve
 *   this HTTP traffic; the embedded kernel's CPU above it is its own cost.
 *
 * The agent runs in this process (one `Agent.layer` server per side, each
 * idle while another side runs). Two modes, with the same agent:
 *
 * - `sequential`: a round runs a few executions one after the other on one
 *   side (create with the operator `Client`, wait until the agent's
 *   `complete` has been answered): bound by the agent's own CPU and the two
 *   round trips per step as much as by the kernel;
 * - `concurrent_8`: a round creates {@link CONCURRENCY} (8) executions at
 *   once, waits for all of them, then (full run) a second batch: the same
 *   agent process then keeps 8 step loops in flight, which shows the
 *   kernel's capacity (as long as the agent process is not the bottleneck:
 *   compare with `node_floor`).
 *
 * Before the timed rounds every side gets an untimed warm-up of at least
 * 1,000 sequential steps (5 executions; our kernel 10 in a full run) and one
 * batch of 8 at once. Round r runs `sequential` then `concurrent_8`, each
 * with the sides in a rotated order (starting with side r mod n). Per mode,
 * side and round:
 *
 * - `steps_per_s`: steps / time during which at least one step loop ran
 *   (first step submitted → last step recorded, over the overlap of the
 *   loops in `concurrent_8`), the kernel's step path;
 * - `steps_per_s_incl_dispatch`: steps / round wall time (create → complete
 *   answered, so dispatch latency and the execution's own requests count);
 * - `kernel_cpu_us_per_step`: the server process's CPU (user + system, all
 *   threads, `/proc/<pid>/stat`, 10 ms ticks summed over the round's loop
 *   spans) per step in the step loops, and over the whole round;
 * - `agent_cpu_us_per_step`: this process's CPU (`process.cpuUsage`) per step
 *   in the step loops, and over the whole round.
 *
 * Per mode also: `ratio_embedded_to_reference` (of the medians of
 * `steps_per_s`), per round and its minimum, `ratio_embedded_to_node_floor`,
 * `ratio_node_floor_to_reference` (the ceiling: what a kernel that cost
 * nothing would reach with this agent; headline `ratio_ceiling_*`),
 * `embedded_kernel_cpu_above_floor_us_per_step` (ours − the floor's kernel
 * CPU µs/step, per round, then median and range), and
 * `agent_bound_steps_per_s` = 10⁶ / the agent's CPU µs per step: the agent is
 * one Node process, so no kernel, however fast, gets more steps/s out of it
 * than that (`ratio_agent_bound_to_reference`, headline
 * `ratio_agent_bound_*`). The ≥ 2× target of issue 14 is printed for both modes (`…_sequential`, `…_concurrent_8`): the issue
 * does not say which, so neither is picked.
 *
 * @since 0.1.0
 */
import { NodeHttpClient } from "@effect/platform-node"
import { Effect, Layer, Schema } from "effect"
import type { Scope } from "effect"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Agent, Client, Tool } from "../src/index.js"
import type { KernelClient } from "../src/index.js"
import { serveAgent } from "./harness.js"
import type { BenchOptions, ChildServer, Result } from "./util.js"
import {
  AGENT_ID,
  cliPath,
  freePort,
  log,
  median,
  nodeArgs,
  nowMs,
  procCpuUs,
  rotated,
  round,
  SECRET,
  spawnServer,
  spread,
  target,
  writeManifest
} from "./util.js"

/** Steps per execution. */
export const STEPS = 200

const noop = Tool.make("noop", {
  args: Schema.Struct({ i: Schema.Number }),
  success: Schema.Struct({ ok: Schema.Boolean }),
  execute: () => Effect.succeed({ ok: true })
})

/**
 * A stretch of time in which at least one step loop of the side's agent was
 * running (one execution's loop when they run one after the other; the
 * overlap of several when they run at once), and what it cost.
 */
interface Span {
  readonly ms: number
  readonly agentCpuUs: number
  readonly kernelCpuUs: number | undefined
}

/** The step loops of one side's agent: the spans, and the loops finished. */
interface Loops {
  readonly spans: Array<Span>
  finished: number
}

/** One kernel (or the Node floor) under test, with its own agent server. */
interface Side {
  readonly label: "embedded" | "reference" | "node_floor"
  readonly stage: string
  readonly how: string
  readonly url: string
  readonly pid: number | undefined
  readonly client: Client.Client["Service"]
  /** Resolves when the agent's `complete` for `executionId` has been answered. */
  readonly completed: (executionId: string) => Promise<void>
  readonly loops: Loops
}

/** The agent of one side, and its completion signal (wraps the real `KernelClient`). */
const makeAgent = (pid: () => number | undefined, loops: Loops) => {
  const waiters = new Map<string, () => void>()
  const done = new Set<string>()
  // Loops running now, and where the current span started.
  let active = 0
  let t0 = 0
  let c0: NodeJS.CpuUsage = process.cpuUsage()
  let k0: number | undefined
  const enter = Effect.sync(() => {
    if (active++ > 0) return
    const p = pid()
    k0 = p === undefined ? undefined : procCpuUs(p)
    c0 = process.cpuUsage()
    t0 = nowMs()
  })
  const leave = Effect.sync(() => {
    loops.finished++
    if (--active > 0) return
    const ms = nowMs() - t0
    const c = process.cpuUsage(c0)
    const p = pid()
    const k1 = p === undefined ? undefined : procCpuUs(p)
    loops.spans.push({
      ms,
      agentCpuUs: c.user + c.system,
      kernelCpuUs: k0 === undefined || k1 === undefined ? undefined : k1 - k0
    })
  })
  const agent = Agent.make({
    id: AGENT_ID,
    handler: () =>
      Effect.gen(function*() {
        yield* enter
        for (let i = 0; i < STEPS; i++) yield* noop({ i })
        yield* leave
        return { steps: STEPS }
      })
  })
  const wrap = (client: KernelClient.KernelClient["Service"]): KernelClient.KernelClient["Service"] => ({
    ...client,
    completeExecution: (caller, id, output, state) =>
      Effect.tap(
        client.completeExecution(caller, id, output, state),
        () =>
          Effect.sync(() => {
            const waiter = waiters.get(id)
            if (waiter === undefined) done.add(id)
            else waiter()
          })
      )
  })
  const completed = (id: string): Promise<void> =>
    done.delete(id) ? Promise.resolve() : new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`execution ${id} did not complete within 120 s`)), 120_000)
      waiters.set(id, () => {
        clearTimeout(timer)
        waiters.delete(id)
        resolve()
      })
    })
  return { agent, wrap, completed }
}

/** A spawned kernel, stopped when the scope closes. */
const spawned = (start: () => Promise<ChildServer>) =>
  Effect.acquireRelease(Effect.promise(start), (server) => Effect.promise(() => server.stop()))

/**
 * Start the kernel at `url` with `start(webhookUrl)` (or nothing, for a
 * running one) — its manifest already naming the agent's webhook, so the
 * agent's port is chosen first — then serve the agent on that port and
 * connect an operator client.
 */
const makeSide = (
  label: Side["label"],
  stage: string,
  how: string,
  url: string,
  agentPort: number | undefined,
  start: ((webhookUrl: string) => Promise<ChildServer>) | undefined,
  knownPid?: number
): Effect.Effect<Side, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    const loops: Loops = { spans: [], finished: 0 }
    let pid: number | undefined = knownPid
    const { agent, completed, wrap } = makeAgent(() => pid, loops)
    const port = agentPort ?? (yield* Effect.promise(freePort))
    if (start !== undefined) {
      const server = yield* spawned(() => start(`http://127.0.0.1:${port}/webhook`))
      pid = server.pid
    }
    yield* serveAgent(agent, { kernelUrl: url, secret: SECRET, port, wrap })
    const http = yield* Layer.build(NodeHttpClient.layerUndici)
    const client = yield* Client.make({ baseUrl: url }).pipe(Effect.provide(http))
    return { label, stage, how, url, pid, client, completed, loops }
  })

/** How the executions of a round are run: one after the other, or `CONCURRENCY` at once. */
type Mode = "sequential" | "concurrent_8"

/** Executions in flight at once in the `concurrent_8` mode. */
export const CONCURRENCY = 8

/**
 * One round on one side: `executions` executions, one after the other
 * (`sequential`) or in batches of {@link CONCURRENCY} created at once, the
 * next batch once the whole batch has completed (`concurrent_8`).
 */
const runRound = (side: Side, mode: Mode, executions: number) =>
  Effect.gen(function*() {
    side.loops.spans.length = 0
    side.loops.finished = 0
    const batch = mode === "sequential" ? 1 : CONCURRENCY
    const k0 = side.pid === undefined ? undefined : procCpuUs(side.pid)
    const c0 = process.cpuUsage()
    const t0 = nowMs()
    for (let e = 0; e < executions; e += batch) {
      const created = yield* Effect.forEach(
        Array.from({ length: Math.min(batch, executions - e) }),
        () => side.client.create(AGENT_ID, {}),
        { concurrency: "unbounded" }
      )
      yield* Effect.promise(() => Promise.all(created.map((execution) => side.completed(execution.id))))
    }
    const wallMs = nowMs() - t0
    const c = process.cpuUsage(c0)
    const k1 = side.pid === undefined ? undefined : procCpuUs(side.pid)
    const steps = executions * STEPS
    const spans = side.loops.spans
    if (side.loops.finished !== executions) {
      return yield* Effect.die(
        new Error(`${side.label}: ${side.loops.finished} step loops finished for ${executions} executions`)
      )
    }
    const loopMs = spans.reduce((n, w) => n + w.ms, 0)
    const kernelLoop = spans.every((w) => w.kernelCpuUs !== undefined)
      ? spans.reduce((n, w) => n + w.kernelCpuUs!, 0) / steps
      : undefined
    return {
      stepsPerS: (steps * 1000) / loopMs,
      stepsPerSInclDispatch: (steps * 1000) / wallMs,
      agentCpu: spans.reduce((n, w) => n + w.agentCpuUs, 0) / steps,
      agentCpuRound: (c.user + c.system) / steps,
      kernelCpu: kernelLoop,
      kernelCpuRound: k0 === undefined || k1 === undefined ? undefined : (k1 - k0) / steps
    }
  })

type RoundFigures = Effect.Success<ReturnType<typeof runRound>>

const sideFigures = (side: Side, rounds: ReadonlyArray<RoundFigures>) => {
  const kernelCpu = rounds.every((r) => r.kernelCpu !== undefined) ? rounds.map((r) => r.kernelCpu!) : undefined
  const kernelCpuRound = rounds.every((r) => r.kernelCpuRound !== undefined)
    ? rounds.map((r) => r.kernelCpuRound!)
    : undefined
  return {
    stage: side.stage,
    how: side.how,
    steps_per_s: spread(rounds.map((r) => r.stepsPerS)),
    steps_per_s_incl_dispatch: spread(rounds.map((r) => r.stepsPerSInclDispatch)),
    us_per_step: round(1e6 / median(rounds.map((r) => r.stepsPerS)), 1),
    kernel_cpu_us_per_step: kernelCpu === undefined ? null : spread(kernelCpu, 1),
    kernel_cpu_us_per_step_incl_dispatch: kernelCpuRound === undefined ? null : spread(kernelCpuRound, 1),
    agent_cpu_us_per_step: spread(rounds.map((r) => r.agentCpu), 1),
    agent_cpu_us_per_step_incl_dispatch: spread(rounds.map((r) => r.agentCpuRound), 1)
  }
}

/** The figures of one mode: each side, the embedded/reference ratios, and the embedded kernel's CPU above the floor. */
const modeFigures = (
  sides: ReadonlyArray<Side>,
  figures: ReadonlyMap<Side, ReadonlyArray<RoundFigures>>,
  reference: string,
  executions: number,
  inFlight: number
) => {
  const bySide = (label: Side["label"]) => sides.find((s) => s.label === label)
  const ours = bySide("embedded")!
  const oursRounds = figures.get(ours)!
  const ref = bySide("reference")
  const refRounds = ref === undefined ? undefined : figures.get(ref)!
  const floor = bySide("node_floor")
  const floorRounds = floor === undefined ? undefined : figures.get(floor)!
  const ratios = refRounds === undefined
    ? undefined
    : oursRounds.map((f, r) => round(f.stepsPerS / refRounds[r]!.stepsPerS, 3))
  const ratio = refRounds === undefined
    ? null
    : round(median(oursRounds.map((f) => f.stepsPerS)) / median(refRounds.map((f) => f.stepsPerS)), 3)
  const ratioInclDispatch = refRounds === undefined
    ? null
    : round(
      median(oursRounds.map((f) => f.stepsPerSInclDispatch)) / median(refRounds.map((f) => f.stepsPerSInclDispatch)),
      3
    )
  const oursFigures = sideFigures(ours, oursRounds)
  // Steps/s at which the agent's own CPU per step (against our kernel) fills its one core.
  const agentBound = Math.round(1e6 / oursFigures.agent_cpu_us_per_step.median)
  const floorFigures = floor === undefined ? undefined : sideFigures(floor, floorRounds!)
  // Per round (the floor's round r ran next to ours), then the median.
  const aboveFloor = floorRounds === undefined || oursRounds.some((f, r) =>
      f.kernelCpu === undefined || floorRounds[r]!.kernelCpu === undefined
    )
    ? undefined
    : oursRounds.map((f, r) => f.kernelCpu! - floorRounds[r]!.kernelCpu!)
  return {
    executions_per_round: executions,
    in_flight: inFlight,
    embedded: oursFigures,
    reference: ref === undefined ? reference : sideFigures(ref, refRounds!),
    node_floor: floorFigures ?? "none",
    ratio_embedded_to_reference: ratio,
    ratio_per_round: ratios ?? null,
    ratio_min: ratios === undefined ? null : Math.min(...ratios),
    ratio_incl_dispatch: ratioInclDispatch,
    ratio_embedded_to_node_floor: floorRounds === undefined
      ? null
      : round(median(oursRounds.map((f) => f.stepsPerS)) / median(floorRounds.map((f) => f.stepsPerS)), 3),
    // The best ratio any kernel could reach with this agent: a server that does nothing, against the reference.
    ratio_node_floor_to_reference: floorRounds === undefined || refRounds === undefined
      ? null
      : round(median(floorRounds.map((f) => f.stepsPerS)) / median(refRounds.map((f) => f.stepsPerS)), 3),
    embedded_kernel_cpu_above_floor_us_per_step: aboveFloor === undefined ? null : spread(aboveFloor, 1),
    // The agent is one Node process: one core's worth of CPU at most, whatever kernel answers it.
    agent_bound_steps_per_s: agentBound,
    ratio_agent_bound_to_reference: refRounds === undefined
      ? null
      : round(agentBound / median(refRounds.map((f) => f.stepsPerS)), 3)
  }
}

const suite = (options: BenchOptions): Effect.Effect<Result, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    const rounds = options.quick ? 4 : 7
    const executions: Record<Mode, number> = {
      sequential: options.quick ? 3 : 5,
      concurrent_8: options.quick ? CONCURRENCY : 2 * CONCURRENCY
    }
    // Untimed, per side: at least 1,000 steps one after the other, then one batch of CONCURRENCY at once.
    // Our kernel (a fresh Node process) and the agent code need ~1,000 steps for the JIT to settle.
    const warmExecutions: Record<Side["label"], number> = {
      embedded: options.quick ? 5 : 10,
      reference: 5,
      node_floor: 5
    }
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "rebuno-bench-"))
    yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(dir, { recursive: true, force: true })))
    const sides: Array<Side> = []

    const stageFlag = process.env["BENCH_KERNEL_STAGE"]
    const cli = cliPath()
    const ourPort = yield* Effect.promise(freePort)
    const ourUrl = `http://127.0.0.1:${ourPort}`
    sides.push(
      yield* makeSide(
        "embedded",
        stageFlag !== undefined && stageFlag !== ""
          ? stageFlag
          : process.env["REBUNO_STAGE"] !== undefined && process.env["REBUNO_STAGE"] !== ""
          ? `${process.env["REBUNO_STAGE"]} (REBUNO_STAGE)`
          : "current (default)",
        `node ${path.relative(process.cwd(), cli)} dev (own process)`,
        ourUrl,
        undefined,
        (webhookUrl) =>
          spawnServer(
            process.execPath,
            [
              cli,
              "dev",
              "--port",
              String(ourPort),
              "--config",
              writeManifest(dir, "embedded.yaml", webhookUrl),
              ...(stageFlag === undefined || stageFlag === "" ? [] : ["--stage", stageFlag])
            ],
            ourUrl,
            { REBUNO_LOG_LEVEL: "warn" }
          )
      )
    )

    const bin = process.env["REBUNO_REFERENCE_BIN"]
    const refUrl = process.env["REBUNO_REFERENCE_URL"]
    let reference = "none (set REBUNO_REFERENCE_BIN or REBUNO_REFERENCE_URL)"
    if (bin !== undefined && bin !== "") {
      const port = yield* Effect.promise(freePort)
      const url = `http://127.0.0.1:${port}`
      reference = `${bin} dev (own process)`
      sides.push(
        yield* makeSide("reference", "v0.14.0 (the reference binary's)", reference, url, undefined, (webhookUrl) =>
          spawnServer(
            bin,
            [
              "dev",
              "--listen-addr",
              `127.0.0.1:${port}`,
              "--config",
              writeManifest(dir, "reference.yaml", webhookUrl),
              "--log-level",
              "warn"
            ],
            url
          ))
      )
    } else if (refUrl !== undefined && refUrl !== "") {
      const pid = Number(process.env["REBUNO_REFERENCE_PID"] ?? NaN)
      reference = `running at ${refUrl}`
      sides.push(
        yield* makeSide(
          "reference",
          "as served at REBUNO_REFERENCE_URL",
          reference,
          refUrl.replace(/\/+$/, ""),
          Number(process.env["REBUNO_REFERENCE_AGENT_PORT"] ?? 5055),
          undefined,
          Number.isInteger(pid) && pid > 0 ? pid : undefined
        )
      )
    }

    if (process.env["BENCH_KERNEL_FLOOR"] !== "0") {
      const floorPort = yield* Effect.promise(freePort)
      const floorUrl = `http://127.0.0.1:${floorPort}`
      sides.push(
        yield* makeSide(
          "node_floor",
          "none (answers without checking)",
          `node ${path.relative(process.cwd(), nodeArgs("floorKernel").at(-1)!)} (own process, do-nothing node:http)`,
          floorUrl,
          undefined,
          (webhookUrl) =>
            spawnServer(process.execPath, nodeArgs("floorKernel"), floorUrl, {
              BENCH_FLOOR_PORT: String(floorPort),
              BENCH_FLOOR_WEBHOOK: webhookUrl,
              BENCH_FLOOR_SECRET: SECRET
            })
        )
      )
    }
    log(
      `kernel: ${STEPS}-step executions over HTTP, ${rounds} rounds per side of ${executions.sequential} executions ` +
        `one after the other, then ${executions.concurrent_8} executions ${CONCURRENCY} at once; sides: ${
          sides.map((s) => `${s.label} (${s.how}, stage ${s.stage})`).join("; ")
        }`
    )
    // Warm-up: every side's server and this process's agent code, in both modes.
    const warm0 = nowMs()
    for (const side of sides) {
      yield* runRound(side, "sequential", warmExecutions[side.label])
      yield* runRound(side, "concurrent_8", CONCURRENCY)
    }
    log(`  kernel warm-up took ${round((nowMs() - warm0) / 1000, 1)} s`)
    const modes: ReadonlyArray<Mode> = ["sequential", "concurrent_8"]
    const figures = new Map<Mode, Map<Side, Array<RoundFigures>>>(
      modes.map((m) => [m, new Map(sides.map((s) => [s, []]))])
    )
    for (let r = 0; r < rounds; r++) {
      for (const mode of modes) {
        const order = rotated(sides, r)
        const byMode = figures.get(mode)!
        for (const side of order) byMode.get(side)!.push(yield* runRound(side, mode, executions[mode]))
        log(
          `  kernel round ${r + 1}/${rounds} ${mode} (${order.map((s) => s.label).join(", ")}): ${
            sides.map((s) => {
              const f = byMode.get(s)![r]!
              return `${s.label} ${round(f.stepsPerS)} steps/s, kernel CPU ${
                f.kernelCpu === undefined ? "?" : round(f.kernelCpu)
              } µs/step, agent CPU ${round(f.agentCpu)} µs/step`
            }).join("; ")
          }`
        )
      }
    }
    const sequential = modeFigures(sides, figures.get("sequential")!, reference, executions.sequential, 1)
    const concurrent = modeFigures(sides, figures.get("concurrent_8")!, reference, executions.concurrent_8, CONCURRENCY)
    const steps = (f: typeof sequential, side: "embedded" | "reference" | "node_floor") => {
      const x = f[side]
      return typeof x === "string" ? null : x.steps_per_s.median
    }
    return {
      name: "kernel",
      steps_per_execution: STEPS,
      rounds,
      warm_up_executions: { sequential: warmExecutions, concurrent_8: CONCURRENCY },
      order: "interleaved, rotated: round r runs sequential then concurrent_8, each starting with side r mod n",
      agent: `this process: one Agent.layer on node:http + KernelClient.${
        process.env["BENCH_AGENT_TRANSPORT"] === "undici" ? "layerUndici" : "layerSocket"
      } per side, sequential no-op tool steps`,
      ratio_target_uses:
        "issue 14 says 'steps/s with the same agent over HTTP' without a concurrency: both figures are targets " +
        "below, labelled; neither is picked",
      // Headline figures (medians over the rounds; the sides' full figures are under `sequential` / `concurrent_8`).
      ratio_sequential: sequential.ratio_embedded_to_reference,
      ratio_concurrent_8: concurrent.ratio_embedded_to_reference,
      ratio_ceiling_sequential: sequential.ratio_node_floor_to_reference,
      ratio_ceiling_concurrent_8: concurrent.ratio_node_floor_to_reference,
      ratio_agent_bound_sequential: sequential.ratio_agent_bound_to_reference,
      ratio_agent_bound_concurrent_8: concurrent.ratio_agent_bound_to_reference,
      ratio_per_round_sequential: sequential.ratio_per_round,
      ratio_per_round_concurrent_8: concurrent.ratio_per_round,
      embedded_steps_per_s_sequential: steps(sequential, "embedded"),
      reference_steps_per_s_sequential: steps(sequential, "reference"),
      node_floor_steps_per_s_sequential: steps(sequential, "node_floor"),
      embedded_steps_per_s_concurrent_8: steps(concurrent, "embedded"),
      reference_steps_per_s_concurrent_8: steps(concurrent, "reference"),
      node_floor_steps_per_s_concurrent_8: steps(concurrent, "node_floor"),
      embedded_kernel_cpu_above_floor_us_per_step_sequential:
        sequential.embedded_kernel_cpu_above_floor_us_per_step?.median ?? null,
      embedded_kernel_cpu_above_floor_us_per_step_concurrent_8:
        concurrent.embedded_kernel_cpu_above_floor_us_per_step?.median ?? null,
      sequential,
      concurrent_8: concurrent,
      targets: {
        ratio_embedded_to_reference_sequential: target(">=", 2, sequential.ratio_embedded_to_reference),
        ratio_embedded_to_reference_concurrent_8: target(">=", 2, concurrent.ratio_embedded_to_reference),
        embedded_kernel_cpu_us_per_step_sequential: target(
          "<=",
          300,
          sequential.embedded.kernel_cpu_us_per_step?.median,
          "µs"
        ),
        embedded_kernel_cpu_us_per_step_concurrent_8: target(
          "<=",
          300,
          concurrent.embedded.kernel_cpu_us_per_step?.median,
          "µs"
        ),
        agent_cpu_us_per_step_sequential: target("<=", 250, sequential.embedded.agent_cpu_us_per_step.median, "µs")
      }
    }
  })

/** Runs the `kernel` line. */
export const run = async (options: BenchOptions): Promise<ReadonlyArray<Result>> => [
  await Effect.runPromise(Effect.scoped(suite(options)))
]
