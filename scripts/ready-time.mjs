// Measures how long `node dist/bin/cli.js dev --port 0` takes to answer
// GET /v0/health: from spawn to the first 200, over a few runs.
//   node scripts/ready-time.mjs [runs] [path/to/cli.js]
// One untimed warm-up run first (the OS file cache), then one line per run and
// the median; exits 1 when the median exceeds READY_LIMIT_MS (default 1000).
import { spawn } from "node:child_process"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"

const root = Path.resolve(Path.dirname(fileURLToPath(import.meta.url)), "..")
const runs = Number(process.argv[2] ?? 5)
const cli = process.argv[3] ?? Path.join(root, "dist", "bin", "cli.js")
const limit = Number(process.env.READY_LIMIT_MS ?? 1000)

const once = () =>
  new Promise((resolve, reject) => {
    const started = performance.now()
    const child = spawn(process.execPath, [cli, "dev", "--port", "0"], {
      env: { ...process.env, NO_COLOR: "1" },
      stdio: ["ignore", "pipe", "inherit"]
    })
    let out = ""
    let polling = false
    let done = false
    const finish = (error, ms) => {
      done = true
      child.once("exit", () => (error ? reject(error) : resolve(ms)))
      child.kill("SIGTERM")
    }
    child.once("exit", (code) => {
      if (!done) reject(new Error(`the CLI exited (${code}) before it was ready:\n${out}`))
    })
    child.stdout.setEncoding("utf8").on("data", async (chunk) => {
      out += chunk
      const url = /listening on (http:\/\/\S+)/.exec(out)?.[1]
      if (url === undefined || polling) return
      polling = true
      for (;;) {
        try {
          const response = await fetch(`${url}/v0/health`)
          if (response.status === 200) return finish(undefined, performance.now() - started)
        } catch {}
        if (performance.now() - started > 30_000) return finish(new Error("not ready after 30 s"))
        await new Promise((r) => setTimeout(r, 5))
      }
    })
  })

await once()
const times = []
for (let i = 0; i < runs; i++) {
  const ms = await once()
  times.push(ms)
  console.log(`run ${i + 1}: ready in ${ms.toFixed(0)} ms`)
}
times.sort((a, b) => a - b)
const median = times[times.length >> 1]
console.log(`median ready time ${median.toFixed(0)} ms (node ${process.version}, limit ${limit} ms)`)
if (median > limit) process.exit(1)
