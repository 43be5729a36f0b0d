/**
 * `warm-up`: what a fresh process pays per step while the JIT warms up. A
 * fresh child process runs one execution of N sequential no-op tool steps
 * (5,000; 3,000 with `--quick`) and reports wall and CPU µs/step for steps
 * 1–100, 101–1,000 and 1,001–N (steady state), plus the last 1,000 steps:
 *
 * - `sdk_http`: the SDK over HTTP (`Agent.runtime` + `KernelClient.layerSocket`,
 *   the `step-cost` agent) against the stub kernel in its own child process,
 *   warmed up first by 2,000 bare-client steps (so the figures are the
 *   agent's warm-up, not the server's);
 * - `testkernel`: the same steps in `TestKernel.layer` under `TestClock`.
 *
 * CPU is the child's `process.cpuUsage`, read only at the bucket boundaries.
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import { Agent, Tool } from "../src/index.js"
import { TestKernel } from "../src/testing/index.js"
import { makeBare, makeSdk } from "./stepCost.js"
import { PROCEED_EXECUTION_ID } from "./stubKernel.js"
import type { BenchOptions, Result } from "./util.js"
import { childMain, inChild, log, round, spawnStub } from "./util.js"

const BOUNDARIES = [0, 100, 1_000] as const

/** Records wall and CPU time at the bucket boundaries and after the last step. */
const recorder = (steps: number) => {
  const at = new Map<number, { readonly wall: number; readonly cpu: number }>()
  const wanted = new Set<number>([...BOUNDARIES, steps - 1_000, steps])
  const mark = (i: number) => {
    if (!wanted.has(i)) return
    const c = process.cpuUsage()
    at.set(i, { wall: performance.now(), cpu: c.user + c.system })
  }
  const bucket = (from: number, to: number) => {
    const a = at.get(from)
    const b = at.get(to)
    if (a === undefined || b === undefined) return null
    return {
      wall_us_per_step: round(((b.wall - a.wall) * 1000) / (to - from), 1),
      cpu_us_per_step: round((b.cpu - a.cpu) / (to - from), 1)
    }
  }
  const figures = () => ({
    steps,
    "steps_1-100": bucket(0, 100),
    "steps_101-1000": bucket(100, 1_000),
    [`steps_1001-${steps}`]: bucket(1_000, steps),
    last_1000_steps: bucket(steps - 1_000, steps)
  })
  return { mark, figures }
}

const stepsOf = (quick: boolean) => (quick ? 3_000 : 5_000)

/** The SDK over HTTP, in this (fresh) process, against the stub at `BENCH_STUB_URL`. */
const sdkHttp = async (quick: boolean) => {
  const steps = stepsOf(quick)
  const rec = recorder(steps)
  const sdk = makeSdk(process.env["BENCH_STUB_URL"]!, "socket", true, rec.mark)
  await sdk.run(PROCEED_EXECUTION_ID, steps)
  await sdk.close()
  return rec.figures()
}

/** The test kit, in this (fresh) process. */
const testKernel = (quick: boolean) => {
  const steps = stepsOf(quick)
  const rec = recorder(steps)
  const noop = Tool.make("noop", {
    args: Schema.Struct({ i: Schema.Number }),
    success: Schema.Struct({ ok: Schema.Boolean }),
    execute: () => Effect.succeed({ ok: true })
  })
  const agent = Agent.make({
    id: "warm",
    handler: () =>
      Effect.gen(function*() {
        for (let i = 0; i < steps; i++) {
          rec.mark(i)
          yield* noop({ i })
        }
        rec.mark(steps)
        return { steps }
      })
  })
  return Effect.runPromise(
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const result = yield* kernel.run(agent, {})
      if (result.status !== "completed") return yield* Effect.die(new Error(`warm-up run ended ${result.status}`))
      return rec.figures()
    }).pipe(Effect.provide(TestKernel.layer({ agents: [agent] })), Effect.provide(TestClock.layer()), Effect.orDie)
  )
}

if (process.env["BENCH_WARMUP_CHILD"] === "sdk") {
  childMain("warm-up (sdk)", sdkHttp(process.env["BENCH_QUICK"] === "1"))
} else if (process.env["BENCH_WARMUP_CHILD"] === "testkernel") {
  childMain("warm-up (testkernel)", testKernel(process.env["BENCH_QUICK"] === "1"))
}

/** Runs the `warm-up` line. */
export const run = async (options: BenchOptions): Promise<ReadonlyArray<Result>> => {
  const quick = options.quick ? "1" : "0"
  const stub = await spawnStub()
  try {
    const bare = makeBare(stub.url)
    await bare.run(PROCEED_EXECUTION_ID, 2_000, false)
    await bare.close()
    log(`warm-up: a fresh process running ${stepsOf(options.quick)} steps, SDK over HTTP (stub kernel)`)
    const sdk = await inChild("warmUp", { BENCH_WARMUP_CHILD: "sdk", BENCH_QUICK: quick, BENCH_STUB_URL: stub.url })
    log(`warm-up: a fresh process running ${stepsOf(options.quick)} steps, TestKernel`)
    const kit = await inChild("warmUp", { BENCH_WARMUP_CHILD: "testkernel", BENCH_QUICK: quick })
    return [{ name: "warm-up", sdk_http: sdk, testkernel: kit }]
  } finally {
    stub.stop()
  }
}
