import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Option, Redacted } from "effect"
import * as ChildProcess from "node:child_process"
import * as Fs from "node:fs"
import * as Http from "node:http"
import * as Net from "node:net"
import type { AddressInfo } from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"
import * as KernelConfig from "../../src/kernel/Config.js"
import { accepts, externalAddress } from "../support/network.js"

const repoRoot = fileURLToPath(new URL("../..", import.meta.url))

const fromEnv = (env: Record<string, string>) =>
  Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromUnknown(env, { preserveEmptyStrings: true }))

interface Spawned {
  readonly child: ChildProcess.ChildProcess
  /** Resolves with the first stdout line matching `pattern`. */
  readonly waitFor: (pattern: RegExp) => Promise<string>
  /** Resolves with the first stderr line matching `pattern`. */
  readonly waitForErr: (pattern: RegExp) => Promise<string>
  readonly output: () => { readonly stdout: string; readonly stderr: string }
  readonly exited: Promise<number | null>
}

const spawnCli = (args: ReadonlyArray<string>, env: Record<string, string> = {}): Spawned => {
  const child = ChildProcess.spawn(process.execPath, ["--import", "tsx", "src/bin/cli.ts", ...args], {
    cwd: repoRoot,
    env: { ...process.env, ...env, NO_COLOR: "1" },
    stdio: ["ignore", "pipe", "pipe"]
  })
  let stdout = ""
  let stderr = ""
  const waiters: Array<() => void> = []
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => {
    stdout += chunk
    for (const w of waiters.splice(0)) w()
  })
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
    stderr += chunk
    for (const w of waiters.splice(0)) w()
  })
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
  const waitIn = (stream: () => string) => (pattern: RegExp) =>
    new Promise<string>((resolve, reject) => {
      const check = () => {
        const line = stream().split("\n").find((l) => pattern.test(l))
        if (line !== undefined) return resolve(line)
        waiters.push(check)
      }
      void exited.then((code) => reject(new Error(`exited with ${code}: ${stdout}\n${stderr}`)))
      check()
    })
  return {
    child,
    waitFor: waitIn(() => stdout),
    waitForErr: waitIn(() => stderr),
    output: () => ({ stdout, stderr }),
    exited
  }
}

/** Spawns the CLI for the duration of the scope; kills exactly that child afterwards. */
const scopedCli = (args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
  Effect.acquireRelease(
    Effect.sync(() => spawnCli(args, env)),
    (cli) =>
      Effect.promise(async () => {
        if (cli.child.exitCode === null) cli.child.kill("SIGTERM")
        await cli.exited
      })
  )

const tempDir = Effect.acquireRelease(
  Effect.sync(() => Fs.mkdtempSync(Path.join(Os.tmpdir(), "rebuno-cli-"))),
  (dir) => Effect.sync(() => Fs.rmSync(dir, { recursive: true, force: true }))
)

/** A port nothing listens on (bound, then released). */
const closedPort = Effect.callback<number>((resume) => {
  const server = Net.createServer()
  server.listen(0, "127.0.0.1", () => {
    const port = (server.address() as AddressInfo).port
    server.close(() => resume(Effect.succeed(port)))
  })
})

/** A manifest with one agent whose webhook URL nothing listens on. */
const unreachableManifest = Effect.gen(function*() {
  const dir = yield* tempDir
  const port = yield* closedPort
  const manifest = Path.join(dir, "manifest.yaml")
  Fs.writeFileSync(manifest, `agents:\n  - id: hello\n    webhook_url: http://127.0.0.1:${port}/webhook\n    secret: s3cr3t-value\n`)
  return { manifest, webhookUrl: `http://127.0.0.1:${port}/webhook` }
})

const createExecution = (url: string) =>
  Effect.promise(() =>
    fetch(url + "/v0/executions", { method: "POST", body: "{\"agent_id\":\"hello\"}" }).then(async (r) =>
      (await r.json()) as { readonly id: string }
    )
  )

const getJson = (url: string) =>
  Effect.promise(() => fetch(url).then(async (r) => ({ status: r.status, body: await r.text() })))

describe("Config", () => {
  it.effect("defaults", () =>
    Effect.gen(function*() {
      const config = yield* KernelConfig.kernelConfig.pipe(fromEnv({}))
      expect(config).toEqual({
        listen: Option.none(),
        maxAttempts: 5,
        dispatchTimeoutMs: 30_000,
        concurrency: 8,
        leaseTimeoutMs: 120_000,
        approvalTimeoutMs: 900_000,
        deadlineMs: undefined,
        deadlineCheckIntervalMs: 30_000,
        apiToken: Option.none(),
        stage: "current",
        judge: Option.none()
      })
    }))

  it.effect("REBUNO_STAGE selects the protocol stage; anything else is a clear config error", () =>
    Effect.gen(function*() {
      for (const stage of ["current", "seed", "v0.14.0"] as const) {
        expect((yield* KernelConfig.kernelConfig.pipe(fromEnv({ REBUNO_STAGE: stage }))).stage).toBe(stage)
      }
      expect((yield* KernelConfig.kernelConfig.pipe(fromEnv({ REBUNO_STAGE: " seed\n" }))).stage).toBe("seed")
      for (const bad of ["", "v0.14", "SEED", "target", "latest"]) {
        const result = yield* Effect.result(KernelConfig.kernelConfig.pipe(fromEnv({ REBUNO_STAGE: bad })))
        expect(result._tag).toBe("Failure")
        if (result._tag === "Failure") {
          expect(String(result.failure)).toContain(
            `Invalid data at REBUNO_STAGE: invalid stage ${JSON.stringify(bad)} (expected one of: current, seed, v0.14.0)`
          )
        }
      }
    }))

  it.effect("REBUNO_* variables with Go durations", () =>
    Effect.gen(function*() {
      const config = yield* KernelConfig.kernelConfig.pipe(fromEnv({
        REBUNO_LISTEN_ADDR: ":9090",
        REBUNO_DISPATCH_MAX_ATTEMPTS: "3",
        REBUNO_DISPATCH_TIMEOUT: "1m30s",
        REBUNO_DISPATCH_CONCURRENCY: "2",
        REBUNO_DISPATCH_LEASE_TIMEOUT: "45s",
        REBUNO_APPROVAL_TIMEOUT: "1h",
        REBUNO_DEADLINE_TIMEOUT: "10m",
        REBUNO_DEADLINE_CHECK_INTERVAL: "500ms",
        REBUNO_API_TOKEN: "tok"
      }))
      expect(config.listen).toEqual(Option.some({ host: undefined, port: 9090 }))
      expect(config).toMatchObject({
        maxAttempts: 3,
        dispatchTimeoutMs: 90_000,
        concurrency: 2,
        leaseTimeoutMs: 45_000,
        approvalTimeoutMs: 3_600_000,
        deadlineMs: 600_000,
        deadlineCheckIntervalMs: 500
      })
      expect(Option.map(config.apiToken, Redacted.value)).toEqual(Option.some("tok"))
    }))

  it.effect("invalid values are config errors", () =>
    Effect.gen(function*() {
      for (
        const env of [
          { REBUNO_DISPATCH_LEASE_TIMEOUT: "120" },
          { REBUNO_DISPATCH_MAX_ATTEMPTS: "0" },
          { REBUNO_DISPATCH_MAX_ATTEMPTS: "x" },
          { REBUNO_LISTEN_ADDR: "8080" }
        ]
      ) {
        const result = yield* Effect.result(KernelConfig.kernelConfig.pipe(fromEnv(env)))
        expect(result._tag).toBe("Failure")
      }
      const off = yield* KernelConfig.kernelConfig.pipe(fromEnv({ REBUNO_DEADLINE_TIMEOUT: "0s" }))
      expect(off.deadlineMs).toBeUndefined()
    }))

  it("parses listen addresses like net.SplitHostPort", () => {
    expect(KernelConfig.parseListenAddress("127.0.0.1:8080")).toEqual({ host: "127.0.0.1", port: 8080 })
    expect(KernelConfig.parseListenAddress("[::1]:80")).toEqual({ host: "::1", port: 80 })
    expect(KernelConfig.parseListenAddress(":0")).toEqual({ host: undefined, port: 0 })
    expect(KernelConfig.parseListenAddress("::1:80")).toBeUndefined()
    expect(KernelConfig.parseListenAddress("host:99999")).toBeUndefined()
  })
})

describe("CLI", () => {
  it.live("dev: prints the URL and agents, serves, applies flags", () =>
    Effect.gen(function*() {
      // a webhook receiver to observe the lease timeout flag
      const webhooks: Array<string> = []
      const receiver = yield* Effect.acquireRelease(
        Effect.callback<Http.Server>((resume) => {
          const server = Http.createServer((req, res) => {
            let body = ""
            req.on("data", (c) => (body += c))
            req.on("end", () => {
              webhooks.push(body)
              res.writeHead(200)
              res.end()
            })
          })
          server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
        }),
        (server) =>
          Effect.callback<void>((resume) => {
            server.closeAllConnections()
            server.close(() => resume(Effect.void))
          })
      )
      const dir = yield* tempDir
      const manifest = Path.join(dir, "manifest.yaml")
      Fs.writeFileSync(
        manifest,
        `agents:\n  - id: hello\n    webhook_url: http://127.0.0.1:\${HOOK_PORT}/webhook\n    secret: $SECRET\n`
      )
      const cli = yield* scopedCli(
        ["dev", "--port", "0", "--config", manifest, "--lease-timeout", "45s", "--max-attempts", "2"],
        { HOOK_PORT: String((receiver.address() as AddressInfo).port), SECRET: "s", REBUNO_DISPATCH_TIMEOUT: "5s" }
      )
      const line = yield* Effect.promise(() => cli.waitFor(/listening on/))
      const url = /^effect-rebuno dev kernel listening on (http:\/\/127\.0\.0\.1:\d+)$/.exec(line)?.[1]
      expect(url).toBeDefined()
      yield* Effect.promise(() => cli.waitFor(/registered agent hello/))
      expect(cli.output().stdout).toContain(
        `registered agent hello -> http://127.0.0.1:${(receiver.address() as AddressInfo).port}/webhook`
      )
      expect(yield* getJson(url + "/v0/health")).toEqual({ status: 200, body: "{\"status\":\"ok\"}\n" })
      const created = yield* Effect.promise(() =>
        fetch(url + "/v0/executions", { method: "POST", body: "{\"agent_id\":\"hello\"}" }).then((r) => r.status)
      )
      expect(created).toBe(201)
      for (let i = 0; i < 300 && webhooks.length === 0; i++) yield* Effect.sleep("10 millis")
      expect(webhooks[0]).toMatch(/"dispatch_attempt":1,"lease_timeout_seconds":45\}$/)
    }), 60_000)

  it.live("REBUNO_LISTEN_ADDR sets host and port", () =>
    Effect.gen(function*() {
      const cli = yield* scopedCli(["dev"], { REBUNO_LISTEN_ADDR: "127.0.0.1:0" })
      const line = yield* Effect.promise(() => cli.waitFor(/listening on/))
      expect(line).toMatch(/listening on http:\/\/127\.0\.0\.1:\d+$/)
      yield* Effect.promise(() => cli.waitFor(/^no agents registered/))
    }), 60_000)

  it.live("--listen-addr (the reference kernel's flag) sets host and port, over REBUNO_LISTEN_ADDR; a bad one is refused", () =>
    Effect.gen(function*() {
      const port = yield* Effect.promise(() =>
        new Promise<number>((resolve) => {
          const probe = Net.createServer().listen(0, "127.0.0.1", () => {
            const free = (probe.address() as AddressInfo).port
            probe.close(() => resolve(free))
          })
        })
      )
      const cli = yield* scopedCli(["dev", "--listen-addr", `127.0.0.1:${port}`], { REBUNO_LISTEN_ADDR: "127.0.0.1:0" })
      expect(yield* Effect.promise(() => cli.waitFor(/listening on/))).toMatch(
        new RegExp(`listening on http://127\\.0\\.0\\.1:${port}$`)
      )
      const bad = yield* scopedCli(["dev", "--listen-addr", "8080"])
      expect(yield* Effect.promise(() => bad.exited)).not.toBe(0)
      expect(bad.output().stderr).toContain("--listen-addr: invalid listen address \"8080\"")
    }), 60_000)

  it.live("--stage and REBUNO_STAGE choose the protocol stage the kernel speaks; the flag wins", () =>
    Effect.gen(function*() {
      const byFlag = yield* scopedCli(["dev", "--port", "0", "--stage", "v0.14.0"], { REBUNO_STAGE: "seed" })
      yield* Effect.promise(() => byFlag.waitFor(/^protocol stage: v0\.14\.0$/))
      const byEnv = yield* scopedCli(["dev", "--port", "0"], { REBUNO_STAGE: "seed" })
      yield* Effect.promise(() => byEnv.waitFor(/^protocol stage: seed$/))
      const byDefault = yield* scopedCli(["dev", "--port", "0"])
      const line = yield* Effect.promise(() => byDefault.waitFor(/listening on/))
      yield* Effect.promise(() => byDefault.waitFor(/^protocol stage: current$/))
      // The current stage is really on: a create with a session is accepted (seed answers 400).
      const url = /listening on (http:\/\/\S+)$/.exec(line)![1]!
      yield* Effect.promise(() =>
        fetch(url + "/v0/agents", {
          method: "POST",
          body: JSON.stringify({ id: "a", webhook_url: "http://127.0.0.1:9/webhook", secret: "s" })
        })
      )
      const created = yield* Effect.promise(() =>
        fetch(url + "/v0/executions", { method: "POST", body: "{\"agent_id\":\"a\",\"session\":\"s1\"}" })
          .then((r) => r.status)
      )
      expect(created).toBe(201)
      const bad = yield* scopedCli(["dev", "--port", "0", "--stage", "v2"])
      expect(yield* Effect.promise(() => bad.exited)).not.toBe(0)
      expect(bad.output().stderr).toContain("v2")
    }), 60_000)

  it.live("the dev loop talks: each failed delivery and the exhaustion are logged on stderr (text, leveled)", () =>
    Effect.gen(function*() {
      const { manifest, webhookUrl } = yield* unreachableManifest
      const cli = yield* scopedCli(["dev", "--port", "0", "--config", manifest, "--max-attempts", "2"])
      const line = yield* Effect.promise(() => cli.waitFor(/listening on/))
      const url = /listening on (http:\/\/\S+)$/.exec(line)![1]!
      // The banner says the kernel is local only, and that nothing listens at the webhook URL yet.
      yield* Effect.promise(() =>
        cli.waitFor(/^reachable from this machine only \(--host 0\.0\.0\.0 to accept other machines and containers\)$/)
      )
      yield* Effect.promise(() => cli.waitFor(/^protocol stage:/))
      expect(cli.output().stdout).toContain(
        `registered agent hello -> ${webhookUrl} (nothing is listening there yet: deliveries fail until the agent runs)`
      )
      if (externalAddress !== undefined) {
        expect(yield* accepts(externalAddress, Number(new URL(url).port))).toBe(false)
      }
      const { id } = yield* createExecution(url)
      const exhausted = yield* Effect.promise(() => cli.waitForErr(/level=ERROR/))
      const lines = cli.output().stderr.trimEnd().split("\n")
      // logfmt, one line per entry: two warnings (attempts 1 and 2), then the execution's failure.
      expect(lines).toHaveLength(3)
      expect(lines[0]).toMatch(/^timestamp=\S+ level=WARN fiber=#\d+ message="webhook delivery to agent hello failed: connection refused/)
      expect(lines[0]).toContain("attempt 1 of 2, next in")
      expect(lines[0]).toContain(
        `rebuno.agent_id=hello rebuno.webhook_url=${webhookUrl} rebuno.execution_id=${id} rebuno.dispatch_id=`
      )
      expect(lines[0]).toContain("rebuno.dispatch_attempt=1 rebuno.error=connection_refused")
      expect(lines[1]).toContain("attempt 2 of 2, the last")
      expect(exhausted).toContain(
        `message="execution ${id} failed with dispatch_exhausted: gave up on agent hello after 2 attempts (last: connection refused)"`
      )
      expect(cli.output().stderr).not.toContain("s3cr3t-value")
      expect(cli.output().stdout).not.toContain("s3cr3t-value")
      // The execution's events say why, too.
      const events = JSON.parse((yield* getJson(`${url}/v0/executions/${id}/events`)).body) as ReadonlyArray<
        { readonly type: string; readonly payload: { readonly error?: unknown } }
      >
      expect(events.filter((e) => e.type === "dispatch.failed").map((e) => e.payload.error)).toEqual([
        { message: "connection refused", reason: "connection_refused" },
        { message: "connection refused", reason: "connection_refused" }
      ])
    }), 60_000)

  it.live("--log-format json: one JSON object per line; --log-level and REBUNO_LOG_LEVEL choose the level; --host 0.0.0.0 exposes it", () =>
    Effect.gen(function*() {
      const { manifest, webhookUrl } = yield* unreachableManifest
      const json = yield* scopedCli(
        ["dev", "--port", "0", "--host", "0.0.0.0", "--config", manifest, "--max-attempts", "1", "--log-format", "json"],
        { REBUNO_LOG_LEVEL: "debug" }
      )
      // REBUNO_LOG_FORMAT=json with --log-level error: only the exhaustion.
      const quiet = yield* scopedCli(
        ["dev", "--port", "0", "--config", manifest, "--max-attempts", "1", "--log-level", "error"],
        { REBUNO_LOG_FORMAT: "json", REBUNO_LOG_LEVEL: "debug" }
      )
      const jsonUrl = /listening on (http:\/\/\S+)$/.exec(yield* Effect.promise(() => json.waitFor(/listening on/)))![1]!
      const quietUrl = /listening on (http:\/\/\S+)$/.exec(yield* Effect.promise(() => quiet.waitFor(/listening on/)))![1]!
      expect(jsonUrl).toMatch(/^http:\/\/localhost:\d+$/)
      yield* Effect.promise(() => json.waitFor(/^protocol stage:/))
      expect(json.output().stdout).not.toContain("reachable from this machine only")
      if (externalAddress !== undefined) {
        expect(yield* accepts(externalAddress, Number(new URL(jsonUrl).port))).toBe(true)
      }
      const { id } = yield* createExecution(jsonUrl)
      yield* Effect.promise(() => json.waitForErr(/"level":"ERROR"/))
      const entries = json.output().stderr.trimEnd().split("\n").map((line) => JSON.parse(line) as {
        readonly message: string
        readonly level: string
        readonly annotations: Record<string, unknown>
      })
      const failed = entries.find((e) => e.level === "WARN")!
      expect(failed.message).toMatch(/^webhook delivery to agent hello failed: connection refused \(is the agent running/)
      expect(failed.annotations).toMatchObject({
        "rebuno.agent_id": "hello",
        "rebuno.webhook_url": webhookUrl,
        "rebuno.execution_id": id,
        "rebuno.dispatch_attempt": "1",
        "rebuno.error": "connection_refused"
      })
      expect(entries.at(-1)).toMatchObject({
        level: "ERROR",
        message: `execution ${id} failed with dispatch_exhausted: gave up on agent hello after 1 attempt (last: connection refused)`
      })

      const { id: quietId } = yield* createExecution(quietUrl)
      const only = yield* Effect.promise(() => quiet.waitForErr(/"level":"ERROR"/))
      expect(JSON.parse(only)).toMatchObject({ level: "ERROR", annotations: { "rebuno.execution_id": quietId } })
      expect(quiet.output().stderr.trimEnd().split("\n")).toHaveLength(1)
    }), 60_000)

  it.live("--help says how to expose the kernel and how to choose the log format; a bad format is refused", () =>
    Effect.gen(function*() {
      const help = yield* scopedCli(["dev", "--help"])
      expect(yield* Effect.promise(() => help.exited)).toBe(0)
      expect(help.output().stdout).toContain("--host 0.0.0.0 accepts connections from other machines and containers")
      expect(help.output().stdout).toContain("--log-format")
      const bad = yield* scopedCli(["dev", "--port", "0"], { REBUNO_LOG_FORMAT: "xml" })
      expect(yield* Effect.promise(() => bad.exited)).not.toBe(0)
      expect(bad.output().stderr).toContain(
        "Invalid data at REBUNO_LOG_FORMAT: invalid format \"xml\" (expected one of: text, json)"
      )
    }), 60_000)

  it.live("--version prints the package's version", () =>
    Effect.gen(function*() {
      const pkg = JSON.parse(Fs.readFileSync(Path.join(repoRoot, "package.json"), "utf8")) as { version: string }
      const cli = yield* scopedCli(["--version"])
      expect(yield* Effect.promise(() => cli.exited)).toBe(0)
      expect(cli.output().stdout.trim()).toContain(pkg.version)
    }), 60_000)

  it.live("start-up errors exit non-zero with the message", () =>
    Effect.gen(function*() {
      const dir = yield* tempDir
      const manifest = Path.join(dir, "bad.yaml")
      Fs.writeFileSync(manifest, "agents:\n  - webhook_url: x\n")
      const bad = yield* scopedCli(["dev", "--port", "0", "--config", manifest])
      const badFlag = yield* scopedCli(["dev", "--port", "0", "--lease-timeout", "120"])
      expect(yield* Effect.promise(() => bad.exited)).not.toBe(0)
      expect(bad.output().stderr).toContain("agents[0]: id is required")
      expect(yield* Effect.promise(() => badFlag.exited)).not.toBe(0)
      expect(badFlag.output().stdout + badFlag.output().stderr).toContain("invalid duration")
    }), 60_000)
})
