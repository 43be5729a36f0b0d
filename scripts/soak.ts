/**
 * Chaos soak of examples/hello.ts against the embedded kernel (see
 * test/support/soak.ts for what it does and checks).
 *
 *   npx tsx scripts/soak.ts --minutes 10 --seed 42 [--stages current,seed,v0.14.0] [--rate 3]
 *     [--chaos-every 2,12 (seconds between kills/cuts/partitions)] [--settle 180 (s)] [--quiet]
 *   npm run soak -- --minutes 10 --seed 42
 *
 * Prints the seed first (a failure is replayed with the same `--seed`) and a
 * summary last; exits 1 on any violation.
 */
import { randomInt } from "node:crypto"
import { parseArgs } from "node:util"
import { allStages, formatSummary, killEverything, runSoak, type Stage } from "../test/support/soak.js"

const { values } = parseArgs({
  options: {
    minutes: { type: "string", default: "1" },
    seed: { type: "string" },
    stages: { type: "string", default: allStages.join(",") },
    rate: { type: "string", default: "3" },
    settle: { type: "string", default: "180" },
    "chaos-every": { type: "string", default: "2,12" },
    quiet: { type: "boolean", default: false }
  }
})

const minutes = Number(values.minutes)
const seed = values.seed === undefined ? randomInt(2 ** 31) : Number(values.seed)
const stages = values.stages.split(",").map((s) => s.trim()) as Array<Stage>
if (!Number.isFinite(minutes) || minutes <= 0) throw new Error(`--minutes: ${values.minutes}`)
if (!Number.isInteger(seed)) throw new Error(`--seed: ${values.seed}`)
for (const stage of stages) if (!allStages.includes(stage)) throw new Error(`--stages: unknown stage ${stage}`)

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    killEverything()
    console.log(`\ninterrupted; seed=${seed}`)
    process.exit(130)
  })
}

console.log(`soak: seed=${seed} minutes=${minutes} stages=${stages.join(",")} (replay: --seed ${seed})`)
const t0 = Date.now()
const summary = await runSoak({
  durationMs: minutes * 60_000,
  seed,
  stages,
  rate: Number(values.rate),
  chaosEveryMs: values["chaos-every"].split(",").map((s) => Number(s) * 1000) as unknown as readonly [number, number],
  settleTimeoutMs: Number(values.settle) * 1000,
  ...(values.quiet ? {} : {
    log: (line: string) => console.log(`${((Date.now() - t0) / 1000).toFixed(1).padStart(7)}s ${line}`)
  })
})
console.log(formatSummary(summary))
process.exit(summary.violations.length === 0 ? 0 : 1)
