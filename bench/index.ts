/**
 * `npm run bench [-- --quick] [-- --only=a,b]`: runs the benchmarks in turn and
 * prints one JSON line per result on stdout; commentary and the final summary
 * go to stderr.
 *
 * - `step-cost`, `replay`: SDK vs a bare keep-alive client against a stub kernel;
 * - `concurrency`: 1,000 concurrent executions against the embedded kernel, and
 *   the 10,000-in-flight memory check;
 * - `testkernel`: the in-process test kit;
 * - `end-to-end`: a two-tool agent against the embedded kernel (and a
 *   reference kernel when `REBUNO_REFERENCE_URL` is set).
 *
 * Every result carries `loadavg_1m` (the machine's load when it started): the
 * figures are medians, but on a shared 2-core machine they still move with it.
 *
 * Knobs (environment): `REBUNO_REFERENCE_URL`, `REBUNO_REFERENCE_TOKEN`,
 * `REBUNO_REFERENCE_AGENT_PORT` (see `endToEnd.ts`); `BENCH_EXECUTIONS` and
 * `BENCH_IN_FLIGHT` override the sizes of `concurrency`,
 * `BENCH_SKIP_CONCURRENT=1` runs only its memory check, and
 * `BENCH_HEAP_SNAPSHOT=<file>` writes a heap snapshot while the runs are parked.
 * `npm run bench` compiles `src` and `bench` with `tsc` (into `.bench/`) and
 * runs the JavaScript, as a published build of the library would run: tsx,
 * which keeps function names by wrapping every function it creates, adds
 * 30–80 % to the in-process figures. After a build,
 * `node --cpu-prof .bench/bench/profile.js [proceed|replay] [steps]` profiles
 * the SDK side of `step-cost` alone.
 *
 * @since 0.1.0
 */
import * as os from "node:os"
import * as Concurrency from "./concurrency.js"
import * as EndToEnd from "./endToEnd.js"
import * as StepCost from "./stepCost.js"
import * as TestKernelBench from "./testKernel.js"
import type { BenchOptions, Result } from "./util.js"
import { emit, log, nowMs, round } from "./util.js"

const argv = process.argv.slice(2)
const quick = argv.includes("--quick")
const onlyArg = argv.find((a) => a.startsWith("--only="))
const only = onlyArg === undefined ? undefined : new Set(onlyArg.slice("--only=".length).split(","))

const suites: ReadonlyArray<{ readonly names: ReadonlyArray<string>; readonly run: (o: BenchOptions) => Promise<ReadonlyArray<Result>> }> = [
  { names: ["step-cost", "replay"], run: StepCost.run },
  { names: ["testkernel"], run: TestKernelBench.run },
  { names: ["concurrency"], run: Concurrency.run },
  { names: ["end-to-end"], run: EndToEnd.run }
]

const figures = (o: Record<string, unknown>, prefix = ""): Array<string> =>
  Object.entries(o).flatMap(([k, v]) =>
    k === "name"
      ? []
      : typeof v === "number" || typeof v === "boolean"
      ? [`${prefix}${k}=${v}`]
      : typeof v === "object" && v !== null && !Array.isArray(v)
      ? figures(v as Record<string, unknown>, `${prefix}${k}.`)
      : []
  )

const summarise = (r: Result): string => `${r.name}: ${figures(r).join(" ")}`

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
  for (const r of results) log("  " + summarise(r))
}

main().then(
  () => process.exit(0),
  (error) => {
    log("benchmark failed:", String(error?.stack ?? error))
    process.exit(1)
  }
)
