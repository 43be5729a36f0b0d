/**
 * Helpers shared by the benchmarks: medians, a peak-RSS sampler, the JSON
 * result line (stdout) and commentary (stderr), and the stub-kernel child
 * process.
 *
 * @since 0.1.0
 */
import { spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as net from "node:net"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import * as v8 from "node:v8"
import * as vm from "node:vm"

/** Options every benchmark receives. */
export interface BenchOptions {
  readonly quick: boolean
}

/** A JSON-serialisable result (one line on stdout). */
export type Result = { readonly name: string } & Record<string, unknown>

/** Commentary for humans: stderr only. */
export const log = (...parts: ReadonlyArray<unknown>): void => {
  process.stderr.write(parts.map((p) => (typeof p === "string" ? p : JSON.stringify(p))).join(" ") + "\n")
}

/** Print one result line on stdout. */
export const emit = (result: Result): void => {
  process.stdout.write(JSON.stringify(result) + "\n")
}

/** Median of a non-empty list. */
export const median = (xs: ReadonlyArray<number>): number => {
  const s = [...xs].sort((a, b) => a - b)
  const mid = s.length >> 1
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2
}

/** Round to `digits` significant-ish decimals for display. */
export const round = (x: number, digits = 0): number => {
  const f = 10 ** digits
  return Math.round(x * f) / f
}

/** Milliseconds since an arbitrary origin, high resolution. */
export const nowMs = (): number => performance.now()

/** Samples `process.memoryUsage().rss` every `intervalMs` and remembers the peak. */
export const rssSampler = (intervalMs = 50) => {
  let peak = process.memoryUsage().rss
  const timer = setInterval(() => {
    const rss = process.memoryUsage().rss
    if (rss > peak) peak = rss
  }, intervalMs)
  timer.unref()
  return {
    sample: (): number => {
      const rss = process.memoryUsage().rss
      if (rss > peak) peak = rss
      return rss
    },
    get peak() {
      const rss = process.memoryUsage().rss
      if (rss > peak) peak = rss
      return peak
    },
    reset: () => {
      peak = process.memoryUsage().rss
    },
    stop: () => clearInterval(timer)
  }
}

/** Bytes → MiB, one decimal. */
export const mib = (bytes: number): number => round(bytes / (1024 * 1024), 1)

let collect: (() => void) | undefined

/**
 * Run a full garbage collection. `npm run bench` cannot pass `--expose-gc`, so
 * the flag is set at run time and `gc` is fetched from a fresh context.
 */
export const gc = (): void => {
  if (collect === undefined) {
    const exposed = (globalThis as { gc?: () => void }).gc
    if (typeof exposed === "function") {
      collect = exposed
    } else {
      v8.setFlagsFromString("--expose-gc")
      collect = vm.runInNewContext("gc") as () => void
    }
  }
  collect()
}

/**
 * Node's arguments to run a sibling module of this one in a child process: the
 * compiled `.js` as it is (`npm run bench`), a `.ts` source through tsx.
 */
export const nodeArgs = (module: string): Array<string> => {
  const ext = import.meta.url.endsWith(".ts") ? ".ts" : ".js"
  const script = fileURLToPath(new URL(`./${module}${ext}`, import.meta.url))
  return ext === ".ts" ? ["--import", "tsx", script] : [script]
}

/**
 * Run a sibling module in a fresh child process with `env` added, and resolve
 * with the JSON of the last line it prints on stdout (its stderr is ours).
 */
export const inChild = <A = Record<string, unknown>>(module: string, env: Record<string, string>): Promise<A> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, nodeArgs(module), {
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "inherit"]
    })
    let out = ""
    child.stdout!.on("data", (chunk: Buffer) => (out += chunk.toString("utf8")))
    child.on("error", reject)
    child.on("exit", (code) => {
      const line = out.trim().split("\n").pop() ?? ""
      try {
        resolve(JSON.parse(line) as A)
      } catch {
        reject(new Error(`${module} child exited ${code} without a result`))
      }
    })
  })

/**
 * The child's side of {@link inChild}: print the result as the last line on
 * stdout and exit 0, or report the failure and exit 1.
 */
export const childMain = (what: string, result: Promise<unknown>): void => {
  result.then(
    (value) => {
      process.stdout.write(JSON.stringify(value) + "\n")
      process.exit(0)
    },
    (error) => {
      log(`${what} failed:`, String(error))
      process.exit(1)
    }
  )
}

/** The stub kernel in a child process (its own core), killed by `stop`. */
export const spawnStub = (): Promise<{ readonly url: string; readonly stop: () => void }> =>
  new Promise((resolve, reject) => {
    const child: ChildProcess = spawn(process.execPath, nodeArgs("stubKernel"), {
      env: { ...process.env, BENCH_STUB_CHILD: "1" },
      stdio: ["pipe", "pipe", "inherit"]
    })
    let out = ""
    const onData = (chunk: Buffer) => {
      out += chunk.toString("utf8")
      const m = /listening (\S+)\n/.exec(out)
      if (m !== null) {
        child.stdout!.off("data", onData)
        resolve({
          url: m[1]!,
          stop: () => {
            child.stdin!.end()
            child.kill()
          }
        })
      }
    }
    child.stdout!.on("data", onData)
    child.on("error", reject)
    child.on("exit", (code) => reject(new Error(`stub kernel exited early (${code})`)))
  })

/** Sleep on the real clock. */
export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

/**
 * The order of the sides in round `r` (0-based): rotated so that round `r`
 * starts with side `r mod n`, and no side always follows the same one.
 */
export const rotated = <A>(sides: ReadonlyArray<A>, r: number): Array<A> =>
  sides.map((_, i) => sides[(i + r) % sides.length]!)

/** Median and range of a non-empty list, rounded to `digits`. */
export const spread = (xs: ReadonlyArray<number>, digits = 0) => ({
  median: round(median(xs), digits),
  min: round(Math.min(...xs), digits),
  max: round(Math.max(...xs), digits)
})

/** A target as printed on a result line: what is required, the figure and whether it was met. */
export interface Target {
  readonly target: string
  readonly value: number | null
  readonly met: boolean | null
}

/** `value` against `limit`: `"<="` (at most), `">="` (at least) or `"<"`. */
export const target = (op: "<=" | ">=" | "<", limit: number, value: number | null | undefined, unit = ""): Target => ({
  target: `${op} ${limit}${unit === "" ? "" : " " + unit}`,
  value: value ?? null,
  met: value === null || value === undefined
    ? null
    : op === "<="
    ? value <= limit
    : op === ">="
    ? value >= limit
    : value < limit
})

const CLOCK_TICK_US = 1e6 / 100 // USER_HZ: 100 on Linux (`getconf CLK_TCK`)

/**
 * CPU time (user + system, all threads) of another process in µs, from
 * `/proc/<pid>/stat` (10 ms resolution); `undefined` when it cannot be read.
 */
export const procCpuUs = (pid: number): number | undefined => {
  try {
    const text = fs.readFileSync(`/proc/${pid}/stat`, "latin1")
    const fields = text.slice(text.lastIndexOf(")") + 2).split(" ")
    return (Number(fields[11]) + Number(fields[12])) * CLOCK_TICK_US
  } catch {
    return undefined
  }
}

/** Peak (`VmHWM`) and current (`VmRSS`) RSS of another process in bytes, from `/proc/<pid>/status`. */
export const procRss = (pid: number): { readonly peak: number; readonly current: number } | undefined => {
  try {
    const text = fs.readFileSync(`/proc/${pid}/status`, "latin1")
    const kib = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(text)?.[1] ?? NaN) * 1024
    return { peak: kib("VmHWM"), current: kib("VmRSS") }
  } catch {
    return undefined
  }
}

/** This process's peak RSS so far, in bytes (the kernel's figure: no sampling gap). */
export const peakRss = (): number => process.resourceUsage().maxRSS * 1024

/** A free TCP port on 127.0.0.1 (bound, read and released). */
export const freePort = (): Promise<number> =>
  new Promise((resolve, reject) => {
    const server = net.createServer()
    server.on("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo
      server.close(() => resolve(port))
    })
  })

/** Poll `GET <url>/v0/health` until it answers 200 (every `everyMs`), or reject after `timeoutMs`. */
export const waitHealthy = async (url: string, timeoutMs = 30_000, everyMs = 5): Promise<void> => {
  const t0 = nowMs()
  for (;;) {
    try {
      const response = await fetch(url + "/v0/health")
      await response.arrayBuffer()
      if (response.status === 200) return
    } catch {
      // not listening yet
    }
    if (nowMs() - t0 > timeoutMs) throw new Error(`${url}/v0/health did not answer within ${timeoutMs} ms`)
    await sleep(everyMs)
  }
}

/** A kernel (or other server) running in a child process. */
export interface ChildServer {
  readonly url: string
  readonly pid: number
  readonly stop: () => Promise<void>
}

/** The benchmark agent's id and secret, in every kernel the benchmarks start. */
export const AGENT_ID = "bench"
export const SECRET = "bench-secret"

/** Write a dev manifest (PROTOCOL 4.2) naming the benchmark agent at `webhookUrl` to `dir/name`; its path. */
export const writeManifest = (dir: string, name: string, webhookUrl: string): string => {
  const file = path.join(dir, name)
  fs.writeFileSync(file, `agents:\n  - id: ${AGENT_ID}\n    webhook_url: ${webhookUrl}\n    secret: ${SECRET}\n`)
  return file
}

/**
 * Spawn `command args` and wait until `url` answers `/v0/health`. Its stdout
 * is dropped, its stderr is ours; `stop` sends SIGTERM and waits for the exit.
 */
export const spawnServer = async (
  command: string,
  args: ReadonlyArray<string>,
  url: string,
  env: Record<string, string> = {}
): Promise<ChildServer> => {
  const child = spawn(command, args, { env: { ...process.env, ...env }, stdio: ["ignore", "ignore", "inherit"] })
  let exited = false
  const exit = new Promise<void>((resolve) => child.on("exit", () => ((exited = true), resolve())))
  const early = exit.then(() => {
    throw new Error(`${command} exited before ${url} was healthy`)
  })
  await Promise.race([waitHealthy(url), early])
  early.catch(() => {})
  return {
    url,
    pid: child.pid!,
    stop: async () => {
      if (!exited) child.kill("SIGTERM")
      await Promise.race([exit, sleep(5_000)])
      if (!exited) child.kill("SIGKILL")
    }
  }
}

/** The newest modification time (ms) of the files under `dir` whose names end with `ext`; 0 when none. */
const newestMtime = (dir: string, ext: string): number => {
  let newest = 0
  try {
    for (const name of fs.readdirSync(dir, { recursive: true, encoding: "utf8" })) {
      if (!name.endsWith(ext)) continue
      const mtime = fs.statSync(path.join(dir, name)).mtimeMs
      if (mtime > newest) newest = mtime
    }
  } catch {
    // no such directory
  }
  return newest
}

let cliChoice: string | undefined

/**
 * The compiled CLI: `dist/bin/cli.js` when the package is built and the build
 * is not older than `src` (else it would run a stale kernel), otherwise
 * `.bench/src/bin/cli.js` (compiled with the benchmarks, so from the same
 * `src`). The choice is logged once.
 */
export const cliPath = (): string => {
  const root = fileURLToPath(new URL(import.meta.url.endsWith(".ts") ? "../" : "../../", import.meta.url))
  const dist = path.join(root, "dist/bin/cli.js")
  const compiled = path.join(root, ".bench/src/bin/cli.js")
  const built = fs.existsSync(dist) ? newestMtime(path.join(root, "dist"), ".js") : 0
  const stale = built > 0 && built < newestMtime(path.join(root, "src"), ".ts")
  const chosen = built > 0 && !stale ? dist : compiled
  if (cliChoice !== chosen) {
    cliChoice = chosen
    log(
      `  kernel CLI: ${path.relative(process.cwd(), chosen)}${
        stale ? " (dist/ is older than src/: not used)" : built > 0 ? "" : " (no dist/ build)"
      }`
    )
  }
  return chosen
}
