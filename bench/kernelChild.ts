/**
 * The embedded kernel alone in a child process, for the benchmarks that need
 * settings the `dev` command does not take (the dispatcher's tick and claim
 * batch): `Kernel.start` on `127.0.0.1:$BENCH_KERNEL_PORT` with the JSON of
 * `$BENCH_KERNEL_OPTIONS` (`Kernel.StartOptions`: `settings`, `dispatcher`,
 * `stage`), serving until it is killed.
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import * as Kernel from "../src/kernel/index.js"
import { log } from "./util.js"

const options = JSON.parse(process.env["BENCH_KERNEL_OPTIONS"] ?? "{}") as Kernel.StartOptions

Effect.runPromise(
  Effect.scoped(Effect.gen(function*() {
    const kernel = yield* Kernel.start({ ...options, host: "127.0.0.1", port: Number(process.env["BENCH_KERNEL_PORT"]) })
    log(`  kernel child ${process.pid} listening on ${kernel.url}`)
    return yield* Effect.never
  }))
).catch((error) => {
  log("kernel child failed:", String(error))
  process.exit(1)
})
