/**
 * Helpers shared by the benchmarks: medians, a peak-RSS sampler, the JSON
 * result line (stdout) and commentary (stderr), and the stub-kernel child
 * process.
 *
 * @since 0.1.0
 */
import { spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
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
