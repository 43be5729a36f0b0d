/**
 * The official Python SDK under test, unmodified: a venv with
 * `rebuno==0.29.2` that the test makes itself (once, then reused), the agents
 * of `test/python/` run as child processes, a driver script run to its end,
 * and a recording proxy between the SDK and the kernel that keeps every
 * request the SDK sent with the kernel's answer, for the failure report.
 *
 * The venv lives in `node_modules/.cache/rebuno-python-sdk/` (ignored by git
 * with the rest of `node_modules/`). The interpreter is `python3` on `PATH`,
 * or `REBUNO_PYTHON`; without one the set-up fails and says so.
 */
import { Data, Effect } from "effect"
import type { Scope } from "effect"
import * as ChildProcess from "node:child_process"
import * as Fs from "node:fs"
import * as Http from "node:http"
import * as Net from "node:net"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"

/** The SDK release the current protocol stage must serve. */
export const sdkVersion = "0.29.2"

const repoRoot = fileURLToPath(new URL("../..", import.meta.url))
const scriptsDir = Path.join(repoRoot, "test", "python")

/** Where the venv is kept between runs. */
export const cacheDir = Path.join(repoRoot, "node_modules", ".cache", "rebuno-python-sdk")

/** A set-up step that failed, with what the tool printed. */
export class PythonSdkError extends Data.TaggedError("PythonSdkError")<{ readonly message: string }> {}

interface Finished {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
  readonly stdout: string
  readonly stderr: string
  /** The command could not be started (e.g. `ENOENT`). */
  readonly spawnError?: NodeJS.ErrnoException | undefined
  readonly timedOut: boolean
}

/** Runs a command to its end (killed after `timeoutMs`); never fails, reports what happened. */
const run = (
  command: string,
  args: ReadonlyArray<string>,
  options: { readonly timeoutMs: number; readonly env?: NodeJS.ProcessEnv | undefined }
): Effect.Effect<Finished> =>
  Effect.callback<Finished>((resume) => {
    const child = ChildProcess.spawn(command, args, {
      cwd: repoRoot,
      env: options.env ?? process.env,
      stdio: ["ignore", "pipe", "pipe"]
    })
    let stdout = ""
    let stderr = ""
    let timedOut = false
    let spawnError: NodeJS.ErrnoException | undefined
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk))
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk))
    const timer = setTimeout(() => {
      timedOut = true
      child.kill("SIGKILL")
    }, options.timeoutMs)
    child.on("error", (error) => {
      spawnError = error
    })
    child.on("close", (code, signal) => {
      clearTimeout(timer)
      resume(Effect.succeed({ code, signal, stdout, stderr, spawnError, timedOut }))
    })
    return Effect.sync(() => {
      clearTimeout(timer)
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
    })
  })

const describeRun = (what: string, finished: Finished) =>
  `${what} ${
    finished.timedOut ? "timed out" : `exited with ${finished.code ?? finished.signal}`
  }\n--- stdout\n${finished.stdout}\n--- stderr\n${finished.stderr}`

const pythonIn = (venv: string) =>
  process.platform === "win32" ? Path.join(venv, "Scripts", "python.exe") : Path.join(venv, "bin", "python")

/** The installed `rebuno` version of a venv's interpreter, or `undefined`. */
const installedVersion = (python: string) =>
  Fs.existsSync(python)
    ? Effect.map(
      run(python, ["-c", "import importlib.metadata as m, rebuno; print(m.version('rebuno'))"], { timeoutMs: 30_000 }),
      (finished) => finished.code === 0 ? finished.stdout.trim() : undefined
    )
    : Effect.succeed(undefined)

/** The base interpreter, checked to exist and to be Python ≥ 3.11 (the SDK's floor). */
const baseInterpreter = Effect.gen(function*() {
  const python = process.env["REBUNO_PYTHON"] ?? "python3"
  const probe = yield* run(python, ["-c", "import sys; print('%d.%d' % sys.version_info[:2])"], { timeoutMs: 30_000 })
  if (probe.spawnError !== undefined || probe.code !== 0) {
    return yield* new PythonSdkError({
      message: `${python} not found or not working (${probe.spawnError?.code ?? describeRun(python, probe)}): ` +
        `the Python SDK test needs Python >= 3.11 to install rebuno==${sdkVersion} into a venv; ` +
        "install python3 (with its venv module) or point REBUNO_PYTHON at an interpreter"
    })
  }
  const [major, minor] = probe.stdout.trim().split(".").map(Number)
  if (major! < 3 || (major === 3 && minor! < 11)) {
    return yield* new PythonSdkError({
      message: `${python} is Python ${probe.stdout.trim()}; rebuno==${sdkVersion} needs Python >= 3.11 ` +
        "(point REBUNO_PYTHON at a newer interpreter)"
    })
  }
  return python
})

/**
 * The venv's interpreter with `rebuno==0.29.2` installed from PyPI: reused
 * when it is there with that version, else made in a temporary directory and
 * renamed into place (so an interrupted install never looks finished).
 */
export const venvPython: Effect.Effect<string, PythonSdkError> = Effect.gen(function*() {
  const venv = Path.join(cacheDir, `venv-${sdkVersion}`)
  const python = pythonIn(venv)
  if ((yield* installedVersion(python)) === sdkVersion) return python

  const base = yield* baseInterpreter
  const staging = `${venv}.tmp-${process.pid}`
  Fs.mkdirSync(cacheDir, { recursive: true })
  Fs.rmSync(staging, { recursive: true, force: true })
  const created = yield* run(base, ["-m", "venv", staging], { timeoutMs: 120_000 })
  if (created.code !== 0) {
    return yield* new PythonSdkError({ message: describeRun(`${base} -m venv ${staging}`, created) })
  }
  const installed = yield* run(
    pythonIn(staging),
    ["-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--quiet", `rebuno==${sdkVersion}`],
    { timeoutMs: 300_000 }
  )
  if (installed.code !== 0) {
    Fs.rmSync(staging, { recursive: true, force: true })
    return yield* new PythonSdkError({ message: describeRun(`pip install rebuno==${sdkVersion}`, installed) })
  }
  // Another run may have finished first: keep a good venv, replace a stale one.
  if ((yield* installedVersion(python)) === sdkVersion) {
    Fs.rmSync(staging, { recursive: true, force: true })
  } else {
    Fs.rmSync(venv, { recursive: true, force: true })
    Fs.renameSync(staging, venv)
  }
  const version = yield* installedVersion(python)
  if (version !== sdkVersion) {
    return yield* new PythonSdkError({ message: `the venv at ${venv} has rebuno ${version ?? "missing"}` })
  }
  return python
})

/** A free loopback port (bound, read, released). */
export const freePort: Effect.Effect<number> = Effect.callback<number>((resume) => {
  const server = Net.createServer()
  server.listen(0, "127.0.0.1", () => {
    const port = (server.address() as Net.AddressInfo).port
    server.close(() => resume(Effect.succeed(port)))
  })
})

/** One request through the {@link recordingProxy} and the kernel's answer. */
export interface Exchange {
  readonly method: string
  readonly path: string
  readonly headers: Readonly<Record<string, string>>
  readonly body: string
  readonly status: number
  readonly answer: string
}

/** A transparent HTTP proxy in front of the kernel that records every exchange. */
export interface RecordingProxy {
  readonly url: string
  readonly exchanges: ReadonlyArray<Exchange>
  /** The exchanges as text, one request and its answer per entry. */
  readonly report: () => string
}

const clip = (text: string) => (text.length > 1500 ? `${text.slice(0, 1500)}… (${text.length} chars)` : text)

/**
 * Forwards to `targetUrl` unchanged (method, path and query, headers, body:
 * the agent signatures cover the path and body, not the host) for as long as
 * the scope.
 */
export const recordingProxy = (targetUrl: string): Effect.Effect<RecordingProxy, never, Scope.Scope> => {
  const target = new URL(targetUrl)
  const exchanges: Array<Exchange> = []
  const server = Http.createServer((req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (chunk: Buffer) => chunks.push(chunk))
    req.on("end", () => {
      const body = Buffer.concat(chunks)
      const headers: Record<string, string> = {}
      for (const [name, value] of Object.entries(req.headers)) {
        if (name.startsWith("rebuno-") || name === "authorization") headers[name] = String(value)
      }
      const record = (status: number, answer: string) =>
        exchanges.push({
          method: req.method ?? "",
          path: req.url ?? "",
          headers,
          body: body.toString("utf8"),
          status,
          answer
        })
      const upstream = Http.request(
        {
          host: target.hostname,
          port: target.port,
          method: req.method,
          path: req.url,
          headers: { ...req.headers, host: target.host, connection: "close" }
        },
        (answer) => {
          const parts: Array<Buffer> = []
          answer.on("data", (chunk: Buffer) => parts.push(chunk))
          answer.on("end", () => {
            const payload = Buffer.concat(parts)
            record(answer.statusCode ?? 0, payload.toString("utf8"))
            const { "transfer-encoding": _chunked, connection: _connection, ...rest } = answer.headers
            res.writeHead(answer.statusCode ?? 502, { ...rest, "content-length": String(payload.length) })
            res.end(payload)
          })
        }
      )
      upstream.on("error", (error) => {
        record(502, `proxy: ${error.message}`)
        res.writeHead(502).end()
      })
      upstream.end(body)
    })
  })
  return Effect.acquireRelease(
    Effect.callback<RecordingProxy>((resume) => {
      server.listen(0, "127.0.0.1", () => {
        const port = (server.address() as Net.AddressInfo).port
        resume(Effect.succeed({
          url: `http://127.0.0.1:${port}`,
          exchanges,
          report: () =>
            exchanges.map((e) =>
              `→ ${e.method} ${e.path} ${JSON.stringify(e.headers)}\n  ${clip(e.body) || "(empty body)"}\n` +
              `← ${e.status} ${clip(e.answer) || "(empty body)"}`
            ).join("\n")
        }))
      })
    }),
    () =>
      Effect.callback<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  )
}

/** A Python agent process of `test/python/`. */
export interface PythonAgent {
  readonly pid: number
  /** Everything the process printed so far (stdout and stderr, interleaved). */
  readonly output: () => string
  /** Sends `signal` and waits until the process has exited. */
  readonly kill: (signal: NodeJS.Signals) => Effect.Effect<void>
}

/** Options of {@link startAgent}. */
export interface AgentOptions {
  readonly python: string
  /** File name in `test/python/`, e.g. `hello.py`. */
  readonly script: string
  /** `REBUNO_URL` for the SDK (the recording proxy's URL). */
  readonly kernelUrl: string
  readonly secret: string
  readonly port: number
  /** Directory of the side-effect counters (`COUNTER_DIR`). */
  readonly counterDir: string
  readonly env?: Readonly<Record<string, string>> | undefined
  /** How long start-up may take (default 30 s). */
  readonly readyTimeoutMs?: number | undefined
}

const agentEnv = (options: Omit<AgentOptions, "python" | "script">): NodeJS.ProcessEnv => ({
  ...process.env,
  REBUNO_URL: options.kernelUrl,
  REBUNO_AGENT_SECRET: options.secret,
  REBUNO_API_KEY: "",
  AGENT_PORT: String(options.port),
  COUNTER_DIR: options.counterDir,
  // The scripts' directory stays clean (no __pycache__ next to the sources).
  PYTHONDONTWRITEBYTECODE: "1",
  PYTHONUNBUFFERED: "1",
  ...options.env
})

/**
 * Starts `python test/python/<script>` (which serves its agent with
 * `Agent.run` on `port`) and waits until uvicorn says it is listening. The
 * process is stopped (SIGTERM, then SIGKILL) when the scope closes.
 */
export const startAgent = (options: AgentOptions): Effect.Effect<PythonAgent, PythonSdkError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.callback<{ readonly agent: PythonAgent; readonly child: ChildProcess.ChildProcess }, PythonSdkError>(
      (resume) => {
        const child = ChildProcess.spawn(options.python, [Path.join(scriptsDir, options.script)], {
          cwd: scriptsDir,
          env: agentEnv(options),
          stdio: ["ignore", "pipe", "pipe"]
        })
        let output = ""
        let ready = false
        const exited = new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) resolve()
          else child.once("exit", () => resolve())
        })
        const agent: PythonAgent = {
          pid: child.pid ?? -1,
          output: () => output,
          kill: (signal) =>
            Effect.promise(() => {
              if (child.exitCode === null && child.signalCode === null) child.kill(signal)
              return exited
            })
        }
        const onChunk = (chunk: string) => {
          output += chunk
          if (!ready && /Uvicorn running on/.test(output)) {
            ready = true
            clearTimeout(timer)
            resume(Effect.succeed({ agent, child }))
          }
        }
        child.stdout.setEncoding("utf8").on("data", onChunk)
        child.stderr.setEncoding("utf8").on("data", onChunk)
        const fail = (why: string) => {
          if (ready) return
          ready = true
          clearTimeout(timer)
          if (child.exitCode === null) child.kill("SIGKILL")
          resume(Effect.fail(new PythonSdkError({ message: `${options.script} ${why}\n--- output\n${output}` })))
        }
        const timeoutMs = options.readyTimeoutMs ?? 30_000
        const timer = setTimeout(() => fail(`did not start listening within ${timeoutMs} ms`), timeoutMs)
        child.on("error", (error) => fail(`could not be started: ${error.message}`))
        child.on("exit", (code, signal) => fail(`exited with ${code ?? signal} before listening`))
        return Effect.sync(() => {
          clearTimeout(timer)
          child.kill("SIGKILL")
        })
      }
    ),
    ({ child }) =>
      Effect.promise(() =>
        new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) return resolve()
          const force = setTimeout(() => child.kill("SIGKILL"), 3_000)
          child.once("exit", () => {
            clearTimeout(force)
            resolve()
          })
          child.kill("SIGTERM")
        })
      )
  ).pipe(Effect.map(({ agent }) => agent))

/**
 * Runs a driver script of `test/python/` to its end and decodes the JSON it
 * prints on stdout; fails with its output when it exits non-zero, prints no
 * JSON, or runs longer than `timeoutMs`.
 */
export const runScript = (
  options: Omit<AgentOptions, "port" | "secret" | "readyTimeoutMs"> & { readonly timeoutMs: number }
): Effect.Effect<unknown, PythonSdkError> =>
  Effect.gen(function*() {
    const finished = yield* run(options.python, [Path.join(scriptsDir, options.script)], {
      timeoutMs: options.timeoutMs,
      env: agentEnv({ ...options, port: 0, secret: "" })
    })
    if (finished.code !== 0) return yield* new PythonSdkError({ message: describeRun(options.script, finished) })
    return yield* Effect.try({
      try: () => JSON.parse(finished.stdout) as unknown,
      catch: () => new PythonSdkError({ message: describeRun(`${options.script} printed no JSON:`, finished) })
    })
  })
