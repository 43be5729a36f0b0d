/**
 * `kernel`: the same agent — one execution = 200 sequential no-op tool steps
 * — over real HTTP against
 *
 * - `embedded`: our kernel in its own child process, started as users start
 *   it (`node <cli> dev --port P --config <temp manifest>`, the compiled CLI:
 *   `dist/bin/cli.js` when built, else `.bench/src/bin/cli.js`), at its
 *   default stage unless `BENCH_KERNEL_STAGE` says otherwise;
 * - `reference`: the reference Go kernel, when `REBUNO_REFERENCE_BIN` names
 *   its binary (spawned as `<bin> dev --listen-addr 127.0.0.1:P --config
 *   <temp manifest> --log-level warn`; v0.14.0 speaks the `v0.14.0` stage),
 *   or `REBUNO_REFERENCE_URL` points at a running one (its manifest must
 *   register agent `bench`, secret `bench-secret`, webhook
 *   `http://127.0.0.1:<REBUNO_REFERENCE_AGENT_PORT, default 5055>/webhook`;
 *   its CPU is then read only when `REBUNO_REFERENCE_PID` is given).
 *
 * The agent runs in this process (one `Agent.layer` server per kernel, each
 * idle while the other side runs). A round runs a few executions one after
 * the other on one side (create with the operator `Client`, wait until the
 * agent's `complete` has been answered); rounds alternate the sides in a
 * rotated order (round r starts with side r mod n). Per side and round:
 *
 * - `steps_per_s`: steps / time inside the handler's step loop (first step
 *   submitted → last step recorded), the kernel's step path;
 * - `steps_per_s_incl_dispatch`: steps / round wall time (create → complete
 *   answered, so dispatch latency and the execution's own requests count);
 * - `kernel_cpu_us_per_step`: the kernel process's CPU (user + system, all
 *   threads, `/proc/<pid>/stat`, 10 ms ticks summed over the round's loops)
 *   per step in the step loops, and over the whole round;
 * - `agent_cpu_us_per_step`: this process's CPU (`process.cpuUsage`) per step
 *   in the step loops, and over the whole round.
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
  cliPath,
  freePort,
  log,
  median,
  nowMs,
  procCpuUs,
  rotated,
  round,
  spawnServer,
  spread,
  target
} from "./util.js"

const SECRET = "bench-secret"
const AGENT_ID = "bench"
/** Steps per execution. */
export const STEPS = 200

const noop = Tool.make("noop", {
  args: Schema.Struct({ i: Schema.Number }),
  success: Schema.Struct({ ok: Schema.Boolean }),
  execute: () => Effect.succeed({ ok: true })
})

/** What one execution's step loop cost. */
interface Window {
  readonly ms: number
  readonly agentCpuUs: number
  readonly kernelCpuUs: number | undefined
}

/** One kernel under test, with its own agent server. */
interface Side {
  readonly label: "embedded" | "reference"
  readonly stage: string
  readonly how: string
  readonly url: string
  readonly pid: number | undefined
  readonly client: Client.Client["Service"]
  /** Resolves when the agent's `complete` for `executionId` has been answered. */
  readonly completed: (executionId: string) => Promise<void>
  readonly windows: Array<Window>
}

/** The agent of one side, and its completion signal (wraps the real `KernelClient`). */
const makeAgent = (pid: () => number | undefined, windows: Array<Window>) => {
  const waiters = new Map<string, () => void>()
  const done = new Set<string>()
  const agent = Agent.make({
    id: AGENT_ID,
    handler: () =>
      Effect.gen(function*() {
        const p = pid()
        const k0 = p === undefined ? undefined : procCpuUs(p)
        const c0 = process.cpuUsage()
        const t0 = nowMs()
        for (let i = 0; i < STEPS; i++) yield* noop({ i })
        const ms = nowMs() - t0
        const c = process.cpuUsage(c0)
        const k1 = p === undefined ? undefined : procCpuUs(p)
        windows.push({
          ms,
          agentCpuUs: c.user + c.system,
          kernelCpuUs: k0 === undefined || k1 === undefined ? undefined : k1 - k0
        })
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

const writeManifest = (dir: string, name: string, webhookUrl: string): string => {
  const file = path.join(dir, name)
  fs.writeFileSync(
    file,
    `agents:\n  - id: ${AGENT_ID}\n    webhook_url: ${webhookUrl}\n    secret: ${SECRET}\n`
  )
  return file
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
    const windows: Array<Window> = []
    let pid: number | undefined = knownPid
    const { agent, completed, wrap } = makeAgent(() => pid, windows)
    const port = agentPort ?? (yield* Effect.promise(freePort))
    if (start !== undefined) {
      const server = yield* spawned(() => start(`http://127.0.0.1:${port}/webhook`))
      pid = server.pid
    }
    yield* serveAgent(agent, { kernelUrl: url, secret: SECRET, port, wrap })
    const http = yield* Layer.build(NodeHttpClient.layerUndici)
    const client = yield* Client.make({ baseUrl: url }).pipe(Effect.provide(http))
    return { label, stage, how, url, pid, client, completed, windows }
  })

/** One round on one side: `executions` executions, one after the other. */
const runRound = (side: Side, executions: number) =>
  Effect.gen(function*() {
    side.windows.length = 0
    const k0 = side.pid === undefined ? undefined : procCpuUs(side.pid)
    const c0 = process.cpuUsage()
    const t0 = nowMs()
    for (let e = 0; e < executions; e++) {
      const execution = yield* side.client.create(AGENT_ID, {})
      yield* Effect.promise(() => side.completed(execution.id))
    }
    const wallMs = nowMs() - t0
    const c = process.cpuUsage(c0)
    const k1 = side.pid === undefined ? undefined : procCpuUs(side.pid)
    const steps = executions * STEPS
    if (side.windows.length !== executions) {
      return yield* Effect.die(new Error(`${side.label}: ${side.windows.length} step loops for ${executions} executions`))
    }
    const loopMs = side.windows.reduce((n, w) => n + w.ms, 0)
    const kernelLoop = side.windows.every((w) => w.kernelCpuUs !== undefined)
      ? side.windows.reduce((n, w) => n + w.kernelCpuUs!, 0) / steps
      : undefined
    return {
      stepsPerS: (steps * 1000) / loopMs,
      stepsPerSInclDispatch: (steps * 1000) / wallMs,
      agentCpu: side.windows.reduce((n, w) => n + w.agentCpuUs, 0) / steps,
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

const suite = (options: BenchOptions): Effect.Effect<Result, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    const rounds = options.quick ? 4 : 7
    const executions = options.quick ? 3 : 5
    // Untimed: our kernel (a fresh Node process) and the agent code need ~1,000 steps for the JIT to settle.
    const warmExecutions = { embedded: options.quick ? 6 : 10, reference: options.quick ? 1 : 3 }
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
    log(
      `kernel: ${STEPS}-step executions over HTTP, ${rounds} rounds × ${executions} executions per side; sides: ${
        sides.map((s) => `${s.label} (${s.how}, stage ${s.stage})`).join("; ")
      }`
    )
    // Warm-up: both kernels and this process's agent code.
    for (const side of sides) yield* runRound(side, warmExecutions[side.label])
    const figures = new Map<Side, Array<RoundFigures>>(sides.map((s) => [s, []]))
    for (let r = 0; r < rounds; r++) {
      const order = rotated(sides, r)
      for (const side of order) figures.get(side)!.push(yield* runRound(side, executions))
      log(
        `  kernel round ${r + 1}/${rounds} (${order.map((s) => s.label).join(", ")}): ${
          sides.map((s) => {
            const f = figures.get(s)![r]!
            return `${s.label} ${round(f.stepsPerS)} steps/s, kernel CPU ${
              f.kernelCpu === undefined ? "?" : round(f.kernelCpu)
            } µs/step, agent CPU ${round(f.agentCpu)} µs/step`
          }).join("; ")
        }`
      )
    }
    const ours = sides[0]!
    const oursRounds = figures.get(ours)!
    const ref = sides[1]
    const refRounds = ref === undefined ? undefined : figures.get(ref)!
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
    return {
      name: "kernel",
      steps_per_execution: STEPS,
      executions_per_round: executions,
      rounds,
      warm_up_executions: warmExecutions,
      order: "interleaved, rotated: round r starts with side r mod n",
      agent: "this process: Agent.layer on node:http + KernelClient.layerUndici, sequential no-op tool steps",
      embedded: oursFigures,
      reference: ref === undefined ? reference : sideFigures(ref, refRounds!),
      ratio_embedded_to_reference: ratio,
      ratio_per_round: ratios ?? null,
      ratio_min: ratios === undefined ? null : Math.min(...ratios),
      ratio_incl_dispatch: ratioInclDispatch,
      targets: {
        ratio_embedded_to_reference: target(">=", 2, ratio),
        embedded_kernel_cpu_us_per_step: target("<=", 300, oursFigures.kernel_cpu_us_per_step?.median, "µs"),
        agent_cpu_us_per_step: target("<=", 250, oursFigures.agent_cpu_us_per_step.median, "µs")
      }
    }
  })

/** Runs the `kernel` line. */
export const run = async (options: BenchOptions): Promise<ReadonlyArray<Result>> => [
  await Effect.runPromise(Effect.scoped(suite(options)))
]
