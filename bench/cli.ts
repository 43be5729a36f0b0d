/**
 * `cli`: how long `effect-rebuno dev` takes to be ready — from spawning
 * `node <cli> dev --port 0` (the compiled CLI: `dist/bin/cli.js` when the
 * package is built, else `.bench/src/bin/cli.js`) until `GET /v0/health`
 * answers 200 (the URL is read from the line it prints, then polled every
 * 2 ms), and the child's CPU time by then. Median and range of several
 * spawns, one at a time; each is stopped with SIGTERM before the next.
 *
 * @since 0.1.0
 */
import { spawn } from "node:child_process"
import * as path from "node:path"
import type { BenchOptions, Result } from "./util.js"
import { cliPath, log, nowMs, procCpuUs, round, sleep, spread, target, waitHealthy } from "./util.js"

/** One spawn: ms until the URL line, ms until healthy. */
const once = (
  cli: string
): Promise<{ readonly printedMs: number; readonly readyMs: number; readonly cpuMs: number }> =>
  new Promise((resolve, reject) => {
    const t0 = nowMs()
    const child = spawn(process.execPath, [cli, "dev", "--port", "0"], {
      env: { ...process.env, REBUNO_LOG_LEVEL: "warn" },
      stdio: ["ignore", "pipe", "inherit"]
    })
    let out = ""
    let settled = false
    const finish = (error: Error | undefined, value?: { printedMs: number; readyMs: number; cpuMs: number }) => {
      if (settled) return
      settled = true
      child.kill("SIGTERM")
      child.once("exit", () => (error === undefined ? resolve(value!) : reject(error)))
    }
    child.on("error", reject)
    child.on("exit", (code) => {
      if (!settled) {
        settled = true
        reject(new Error(`${cli} dev exited (${code}) before it was ready`))
      }
    })
    child.stdout!.on("data", (chunk: Buffer) => {
      const before = out
      out += chunk.toString("utf8")
      const m = /listening on (\S+)/.exec(out)
      if (m === null || /listening on (\S+)/.test(before)) return
      const printedMs = nowMs() - t0
      waitHealthy(m[1]!, 10_000, 2).then(
        () => finish(undefined, { printedMs, readyMs: nowMs() - t0, cpuMs: (procCpuUs(child.pid!) ?? NaN) / 1000 }),
        (error) => finish(error as Error)
      )
    })
  })

/** Runs the `cli` line. */
export const run = async (options: BenchOptions): Promise<ReadonlyArray<Result>> => {
  const cli = cliPath()
  const spawns = options.quick ? 3 : 7
  log(`cli: ${spawns} spawns of node ${path.relative(process.cwd(), cli)} dev --port 0 until /v0/health answers`)
  const printed: Array<number> = []
  const ready: Array<number> = []
  const cpu: Array<number> = []
  for (let i = 0; i < spawns; i++) {
    const r = await once(cli)
    printed.push(r.printedMs)
    ready.push(r.readyMs)
    cpu.push(r.cpuMs)
    log(
      `  cli spawn ${i + 1}/${spawns}: URL printed after ${round(r.printedMs)} ms, healthy after ${
        round(r.readyMs)
      } ms (${round(r.cpuMs)} ms of CPU)`
    )
    await sleep(100)
  }
  const readyMs = spread(ready, 1)
  return [{
    name: "cli",
    command: `node ${path.relative(process.cwd(), cli)} dev --port 0`,
    spawns,
    ready_ms: readyMs,
    url_printed_ms: spread(printed, 1),
    // the child's CPU (user + system, all threads, /proc, 10 ms ticks) when it was healthy: less load-dependent
    cpu_ms_to_ready: spread(cpu),
    targets: { ready_ms: target("<", 1000, readyMs.median, "ms") }
  }]
}
