/**
 * `testkernel`: the in-process test kit (`TestKernel.layer`, direct transport,
 * under `TestClock`). Two figures:
 *
 * - steps/s of an agent doing many sequential no-op tool steps, timed inside
 *   the handler (and for the whole create + settle, which also decodes the
 *   run's steps and events);
 * - the wall time of a typical agent test: create + settle of a 100-step run
 *   (median over several runs in one layer), and the same including building
 *   the layer (a fresh kit per test, as `it.effect` does).
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import { Agent, Tool } from "../src/index.js"
import { TestKernel } from "../src/testing/index.js"
import type { BenchOptions, Result } from "./util.js"
import { childMain, inChild, log, median, nowMs, round, spread, target } from "./util.js"

const makeAgents = () => {
  let steps = 0
  let elapsed = 0
  let cpuUs = 0
  const noop = Tool.make("noop", {
    args: Schema.Struct({ i: Schema.Number }),
    success: Schema.Struct({ ok: Schema.Boolean }),
    execute: () => Effect.succeed({ ok: true })
  })
  const many = Agent.make({
    id: "many",
    handler: () =>
      Effect.gen(function*() {
        const c0 = process.cpuUsage()
        const t0 = nowMs()
        for (let i = 0; i < steps; i++) yield* noop({ i })
        elapsed = nowMs() - t0
        const c = process.cpuUsage(c0)
        cpuUs = c.user + c.system
        return { steps }
      })
  })
  const hundred = Agent.make({
    id: "hundred",
    handler: () =>
      Effect.gen(function*() {
        for (let i = 0; i < 100; i++) yield* noop({ i })
        return { steps: 100 }
      })
  })
  return {
    many,
    hundred,
    setSteps: (n: number) => {
      steps = n
      elapsed = -1
    },
    elapsed: () => elapsed,
    cpuUs: () => cpuUs
  }
}

/** A fresh kit (as each `it.effect` test gets) running one agent to completion. */
const inFreshKit = <A>(
  agents: ReturnType<typeof makeAgents>,
  use: (kernel: TestKernel.TestKernel["Service"]) => Effect.Effect<A, unknown>
): Promise<A> =>
  Effect.runPromise(
    Effect.gen(function*() {
      return yield* use(yield* TestKernel.TestKernel)
    }).pipe(
      Effect.provide(TestKernel.layer({ agents: [agents.many, agents.hundred] })),
      Effect.provide(TestClock.layer()),
      Effect.orDie
    )
  )

/** The figures, measured in this process. */
const measure = async (options: BenchOptions): Promise<Result> => {
  const agents = makeAgents()
  const steps = options.quick ? 5_000 : 10_000
  const rounds = options.quick ? 5 : 9
  const testRuns = options.quick ? 10 : 30
  log(`testkernel: ${rounds} tests of ${steps} sequential steps (a fresh kit each), then ${testRuns} 100-step tests`)
  const longRun = (kernel: TestKernel.TestKernel["Service"]) =>
    Effect.gen(function*() {
      const t0 = nowMs()
      const result = yield* kernel.run(agents.many, {})
      const t1 = nowMs()
      if (result.status !== "completed" || agents.elapsed() < 0) {
        return yield* Effect.die(new Error(`testkernel: run ended ${result.status} ${result.failureReason}`))
      }
      return {
        inside: (steps * 1000) / agents.elapsed(),
        perCpu: (steps * 1e6) / agents.cpuUs(),
        whole: (steps * 1000) / (t1 - t0)
      }
    })
  // Warm-up: let the JIT settle before anything is timed.
  for (let i = 0; i < 3; i++) {
    agents.setSteps(steps)
    await inFreshKit(agents, longRun)
  }
  const inside: Array<number> = []
  const whole: Array<number> = []
  const perCpu: Array<number> = []
  for (let r = 0; r < rounds; r++) {
    agents.setSteps(steps)
    const figures = await inFreshKit(agents, longRun)
    inside.push(figures.inside)
    whole.push(figures.whole)
    perCpu.push(figures.perCpu)
    log(
      `  testkernel round ${r + 1}/${rounds}: ${round(figures.inside)} steps/s in the handler (${
        round(figures.perCpu)
      } per CPU second), ${round(figures.whole)} incl. create + settle`
    )
  }
  // A typical agent test: create + settle of the 100-step agent, in one kit…
  const hundred = await inFreshKit(agents, (kernel) =>
    Effect.gen(function*() {
      const times: Array<number> = []
      const cpuMs: Array<number> = []
      for (let r = 0; r < testRuns; r++) {
        const c0 = process.cpuUsage()
        const t0 = nowMs()
        const result = yield* kernel.run(agents.hundred, {})
        times.push(nowMs() - t0)
        const c = process.cpuUsage(c0)
        cpuMs.push((c.user + c.system) / 1000)
        if (result.status !== "completed") return yield* Effect.die(new Error("testkernel: 100-step run failed"))
      }
      return { times, cpuMs }
    }))
  // … and with a fresh kit (layer build) per test, as `it.effect` does.
  const fresh: Array<number> = []
  for (let r = 0; r < (options.quick ? 5 : 15); r++) {
    const t0 = nowMs()
    await inFreshKit(agents, (kernel) => kernel.run(agents.hundred, {}))
    fresh.push(nowMs() - t0)
  }
  const stepsPerS = median(inside)
  const testMs = round(median(hundred.times), 2)
  return {
    name: "testkernel",
    transport: "direct",
    steps_per_run: steps,
    runs: rounds,
    steps_per_s: spread(inside),
    steps_per_s_incl_create_settle: spread(whole),
    // steps per second of this process's CPU time in the handler: what the wall figure would be on an idle core
    steps_per_cpu_s: spread(perCpu),
    us_per_step: round(1e6 / stepsPerS, 1),
    test_100_steps_ms: spread(hundred.times, 2),
    test_100_steps_cpu_ms: spread(hundred.cpuMs, 2),
    test_100_steps_fresh_layer_ms: spread(fresh, 2),
    test_100_steps_runs: hundred.times.length,
    process: "fresh child process; a fresh TestKernel.layer per long run; the 100-step tests share one kit",
    targets: {
      steps_per_s: target(">=", 100_000, round(stepsPerS)),
      test_100_steps_ms: target("<=", 2, testMs, "ms")
    }
  }
}

if (process.env["BENCH_TESTKERNEL_CHILD"] === "1") {
  childMain("testkernel", measure({ quick: process.env["BENCH_QUICK"] === "1" }))
}

/** Runs the `testkernel` figures in a fresh child process (earlier benchmarks leave a large heap behind). */
export const run = async (options: BenchOptions): Promise<ReadonlyArray<Result>> => [
  await inChild<Result>("testKernel", { BENCH_TESTKERNEL_CHILD: "1", BENCH_QUICK: options.quick ? "1" : "0" })
]
