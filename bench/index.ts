/**
 * `npm run bench [-- --quick] [-- --only=a,b]`: compiles `src` and `bench`
 * with `tsc` (into `.bench/`) and runs the benchmarks of issue 14 in turn.
 * One JSON line per result goes to stdout; commentary, and a summary of every
 * target with its figure and whether it was met, go to stderr. A full run
 * takes about 4–5 minutes (240 s measured with `REBUNO_REFERENCE_BIN`, of
 * which `kernel` 117 s), `--quick` under 2.
 *
 * Wherever sides are compared they run in interleaved rounds in a rotated
 * order (round r starts with side r mod n, so no side always follows the
 * heaviest one); each side is reported as `{median, min, max}` over the
 * rounds, and the ratios per round as well.
 *
 * Lines (`--only=` takes these names):
 *
 * - `step-cost`: the SDK (`KernelClient.layerSocket`) vs a bare keep-alive
 *   undici client sending the same signed bytes to a stub kernel (child
 *   process): steps/s, client CPU µs/step, the overhead (SDK − bare CPU
 *   µs/step, median and per round; target ≤ 60) and the ratio per round
 *   (target ≥ 0.85 in every round); the same against a bare client on one
 *   `node:net` socket (the same transport as the SDK's, `versus_bare_socket`,
 *   with the targets repeated for it), plus the SDK on undici
 *   (`layerUndici`) and on `effect/http`'s HttpClient, and the bare
 *   HttpClient floor;
 *   `replay`: the same for recorded steps (one round trip each);
 * - `kernel`: a 200-step agent over HTTP against the embedded kernel in its
 *   own process (`<cli> dev`), with `REBUNO_REFERENCE_BIN` (spawned with a
 *   temp manifest) or `REBUNO_REFERENCE_URL` the reference Go kernel, and a
 *   do-nothing Node HTTP server (`node_floor`, `floorKernel.ts`), after a
 *   warm-up of ≥ 1,000 steps per side; in two modes with the same agent
 *   process, `sequential` (executions one after the other) and
 *   `concurrent_8` (8 executions in flight): per mode steps/s of each side
 *   and the ratio (target ≥ 2, printed for both modes:
 *   `ratio_embedded_to_reference_sequential` and `…_concurrent_8`; the
 *   headline gives `ratio_sequential` and `ratio_concurrent_8`, and
 *   `ratio_ceiling_*`, the floor's steps/s over the reference's, and
 *   `ratio_agent_bound_*`, 10⁶ / the agent's CPU µs per step over the
 *   reference's steps/s: what no kernel can exceed with this agent), kernel CPU
 *   µs/step from `/proc` (ours: target ≤ 300, both modes), our kernel's CPU
 *   above the floor's (`embedded_kernel_cpu_above_floor_us_per_step_*`),
 *   agent CPU µs/step (target ≤ 250, sequential), and the protocol stage
 *   each side spoke (see `kernel.ts`);
 * - `testkernel`: the test kit's steps/s (target ≥ 100,000) and a 100-step
 *   agent test (target ≤ 2 ms), in a fresh child process;
 * - `warm-up`: a fresh process's µs/step (wall, CPU) for steps 1–100,
 *   101–1,000 and after, for the SDK over HTTP and for the test kit;
 * - `memory`: 10,000 runs in flight (2,000 with `--quick`) in one process
 *   (peak RSS, target < 512 MiB; heartbeats on time) and the same over real
 *   HTTP against the embedded kernel in its own process (wall time, RSS of
 *   agent and kernel, late heartbeats); `concurrency` is an alias;
 * - `cli`: spawn of `<cli> dev --port 0` until `/v0/health` answers (target
 *   < 1 s), median of several;
 * - `end-to-end`: a two-tool agent against the embedded kernel with its
 *   default dispatcher, burst and one-at-a-time latency (and a running
 *   reference kernel at `REBUNO_REFERENCE_URL`, see `endToEnd.ts`).
 *
 * Every result carries `loadavg_1m` (the machine's load when it started): on
 * a shared 2-core machine wall-clock figures move with it; CPU figures less.
 *
 * Knobs (environment): `REBUNO_REFERENCE_BIN`, `REBUNO_REFERENCE_URL`,
 * `REBUNO_REFERENCE_PID`, `REBUNO_REFERENCE_AGENT_PORT`,
 * `REBUNO_REFERENCE_TOKEN` (`kernel.ts`, `endToEnd.ts`); `BENCH_AGENT_TRANSPORT=undici`
 * puts the agents of `kernel` and `memory` on `layerUndici`; `BENCH_KERNEL_STAGE`
 * runs our kernel at another stage in `kernel`, `BENCH_KERNEL_FLOOR=0`
 * leaves out its `node_floor` side; `BENCH_IN_FLIGHT` sets the
 * size of `memory`, `BENCH_HEAP_SNAPSHOT=<file>` writes a heap snapshot while
 * its in-process runs are parked. tsx, which keeps function names by wrapping
 * every function it creates, would add 30–80 % to the in-process figures,
 * hence the compiled JavaScript. After a build,
 * `node --cpu-prof .bench/bench/profile.js [proceed|replay] [steps]` profiles
 * the SDK side of `step-cost` alone.
 *
 * @since 0.1.0
 */
import * as os from "node:os"
import * as Cli from "./cli.js"
import * as EndToEnd from "./endToEnd.js"
import * as KernelBench from "./kernel.js"
import * as Memory from "./memory.js"
import * as StepCost from "./stepCost.js"
import * as TestKernelBench from "./testKernel.js"
import type { BenchOptions, Result, Target } from "./util.js"
import * as WarmUp from "./warmUp.js"
import { emit, log, nowMs, round } from "./util.js"

const argv = process.argv.slice(2)
const quick = argv.includes("--quick")
const onlyArg = argv.find((a) => a.startsWith("--only="))
const only = onlyArg === undefined ? undefined : new Set(onlyArg.slice("--only=".length).split(","))

const suites: ReadonlyArray<{ readonly names: ReadonlyArray<string>; readonly run: (o: BenchOptions) => Promise<ReadonlyArray<Result>> }> = [
  { names: ["step-cost", "replay"], run: StepCost.run },
  { names: ["kernel"], run: KernelBench.run },
  { names: ["testkernel"], run: TestKernelBench.run },
  { names: ["warm-up"], run: WarmUp.run },
  { names: ["memory", "concurrency"], run: Memory.run },
  { names: ["cli"], run: Cli.run },
  { names: ["end-to-end"], run: EndToEnd.run }
]

const figures = (o: Record<string, unknown>, prefix = ""): Array<string> =>
  Object.entries(o).flatMap(([k, v]) =>
    k === "name" || k === "targets"
      ? []
      : typeof v === "number" || typeof v === "boolean"
      ? [`${prefix}${k}=${v}`]
      : typeof v === "object" && v !== null && !Array.isArray(v)
      ? figures(v as Record<string, unknown>, `${prefix}${k}.`)
      : []
  )

/** The top-level figures of a line (numbers and lists of numbers; not the nested sides). */
const headline = (o: Record<string, unknown>): Array<string> =>
  Object.entries(o).flatMap(([k, v]) =>
    k === "loadavg_1m"
      ? []
      : typeof v === "number"
      ? [`${k}=${v}`]
      : Array.isArray(v) && v.every((x) => typeof x === "number")
      ? [`${k}=[${v.join(", ")}]`]
      : []
  )

/** A line's headline figures and its targets, one per line; every figure when it has no targets. */
const summarise = (r: Result): Array<string> => {
  const targets = r["targets"] as Record<string, Target> | undefined
  if (targets === undefined) return [`${r.name}: ${figures(r).join(" ")}`]
  const top = headline(r)
  return [...(top.length === 0 ? [] : [`${r.name}: ${top.join(" ")}`]), ...Object.entries(targets).map(([k, t]) =>
    `${r.name}: ${k} = ${t.value ?? "n/a"} (target ${t.target}): ${
      t.met === null ? "not measured" : t.met ? "met" : "NOT MET"
    }`
  )]
}

const main = async () => {
  const started = nowMs()
  log(`effect-rebuno benchmarks (${quick ? "quick" : "full"}), node ${process.version}, pid ${process.pid}`)
  const results: Array<Result> = []
  for (const suite of suites) {
    if (only !== undefined && !suite.names.some((n) => only.has(n))) continue
    const t0 = nowMs()
    const loadavg = round(os.loadavg()[0]!, 2)
    const out = await suite.run({ quick })
    for (const r of out) {
      const withLoad = { ...r, loadavg_1m: loadavg }
      emit(withLoad)
      results.push(withLoad)
    }
    log(`(${suite.names.join(", ")} took ${round((nowMs() - t0) / 1000, 1)} s)`)
  }
  log("")
  log(`summary (${round((nowMs() - started) / 1000, 1)} s):`)
  for (const r of results) for (const line of summarise(r)) log("  " + line)
}

main().then(
  () => process.exit(0),
  (error) => {
    log("benchmark failed:", String(error?.stack ?? error))
    process.exit(1)
  }
)
