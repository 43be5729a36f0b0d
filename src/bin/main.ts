/**
 * The `effect-rebuno` command line (loaded by the `bin/cli.js` entry point,
 * which first turns on Node's compile cache). `effect-rebuno dev` starts the embedded
 * kernel with the reference kernel's dev manifest format and `REBUNO_*`
 * settings (flags win over the environment), prints the URL it listens on and
 * the agents it registered, and serves until interrupted. It listens on
 * `127.0.0.1` unless told otherwise (`--host 0.0.0.0`). Its log lines — every
 * failed webhook delivery with its cause, among others — go to standard error,
 * one per line, as logfmt text or JSON (`--log-format`, `REBUNO_LOG_FORMAT`),
 * from `info` up unless `--log-level` or `REBUNO_LOG_LEVEL` says otherwise.
 *
 * @since 0.1.0
 */
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import * as NodeServices from "@effect/platform-node/NodeServices"
import * as Cause from "effect/Cause"
import * as CliError from "effect/cli/CliError"
import * as CliOutput from "effect/cli/CliOutput"
import * as Command from "effect/cli/Command"
import * as Flag from "effect/cli/Flag"
import * as GlobalFlag from "effect/cli/GlobalFlag"
import * as Config from "effect/Config"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Console from "effect/Console"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as HttpServerError from "effect/http/HttpServerError"
import type * as LogLevel from "effect/LogLevel"
import * as Option from "effect/Option"
import * as Predicate from "effect/Predicate"
import * as References from "effect/References"
import * as Runtime from "effect/Runtime"
import * as Net from "node:net"
import * as KernelConfig from "../kernel/Config.js"
import * as Kernel from "../kernel/index.js"
import { parseMillis } from "../kernel/internal/duration.js"
import { stages } from "../kernel/internal/model.js"

const invalid = (message: string): Effect.Effect<never, CliError.CliError> =>
  Effect.fail(new CliError.ValidationError({ message }))

const durationFlag = (name: string, description: string) =>
  Flag.String(name).pipe(
    Flag.withDescription(description),
    Flag.mapEffect((text) => {
      const ms = parseMillis(text.trim())
      return ms === undefined || ms < 0
        ? invalid(`--${name}: invalid duration ${JSON.stringify(text)} (Go syntax, e.g. 90s, 2m)`)
        : Effect.succeed(ms)
    }),
    Flag.optional
  )

const positiveIntFlag = (name: string, description: string) =>
  Flag.Int(name).pipe(
    Flag.withDescription(description),
    Flag.mapEffect((n) => n > 0 ? Effect.succeed(n) : invalid(`--${name}: must be greater than 0`)),
    Flag.optional
  )

const devFlags = {
  host: Flag.String("host").pipe(
    Flag.withDescription(
      "Interface to listen on (default 127.0.0.1: this machine only, or the host of --listen-addr / REBUNO_LISTEN_ADDR); " +
        "--host 0.0.0.0 accepts connections from other machines and containers"
    ),
    Flag.optional
  ),
  port: Flag.Int("port").pipe(
    Flag.withDescription(
      "Port to listen on (default 8080, or the port of --listen-addr / REBUNO_LISTEN_ADDR; 0 = any free port)"
    ),
    Flag.optional
  ),
  listenAddr: Flag.String("listen-addr").pipe(
    Flag.withDescription(
      "host:port to listen on, as the reference kernel's flag (\":8080\" is every interface; REBUNO_LISTEN_ADDR); " +
        "--host and --port win over it"
    ),
    Flag.mapEffect((text) => {
      const parsed = KernelConfig.parseListenAddress(text.trim())
      return parsed === undefined
        ? invalid(`--listen-addr: invalid listen address ${JSON.stringify(text)} (host:port, e.g. 127.0.0.1:8080 or :8080)`)
        : Effect.succeed(parsed)
    }),
    Flag.optional
  ),
  config: Flag.String("config").pipe(
    Flag.withAlias("c"),
    Flag.withDescription("Dev manifest (YAML with an agents: list)"),
    Flag.optional
  ),
  leaseTimeout: durationFlag("lease-timeout", "Dispatch lease timeout (REBUNO_DISPATCH_LEASE_TIMEOUT, default 2m)"),
  dispatchTimeout: durationFlag("dispatch-timeout", "Webhook HTTP timeout (REBUNO_DISPATCH_TIMEOUT, default 30s)"),
  maxAttempts: positiveIntFlag("max-attempts", "Max delivery attempts (REBUNO_DISPATCH_MAX_ATTEMPTS, default 5)"),
  concurrency: positiveIntFlag("dispatch-concurrency", "Deliveries in flight (REBUNO_DISPATCH_CONCURRENCY, default 8)"),
  approvalTimeout: durationFlag("approval-timeout", "Default approval timeout (REBUNO_APPROVAL_TIMEOUT, default 15m)"),
  deadlineTimeout: durationFlag("deadline-timeout", "Execution deadline (REBUNO_DEADLINE_TIMEOUT, default off)"),
  apiToken: Flag.Redacted("api-token").pipe(
    Flag.withDescription("Bearer token for client/admin routes (REBUNO_API_TOKEN; default: dev mode, no auth)"),
    Flag.optional
  ),
  stage: Flag.Literals("stage", stages).pipe(
    Flag.withDescription("Protocol stage: current, seed or v0.14.0 (REBUNO_STAGE, default current)"),
    Flag.optional
  ),
  logFormat: Flag.Literals("log-format", Kernel.logFormats).pipe(
    Flag.withDescription(
      "Log lines on stderr, one per entry: text (logfmt) or json (REBUNO_LOG_FORMAT, default text); " +
        "the level is --log-level (REBUNO_LOG_LEVEL, default info)"
    ),
    Flag.optional
  )
}

/** The log levels `REBUNO_LOG_LEVEL` accepts: those of `--log-level`. */
const logLevels: ReadonlyArray<readonly [string, LogLevel.LogLevel]> = [
  ["all", "All"],
  ["trace", "Trace"],
  ["debug", "Debug"],
  ["info", "Info"],
  ["warn", "Warn"],
  ["warning", "Warn"],
  ["error", "Error"],
  ["fatal", "Fatal"],
  ["none", "None"]
]

/** A variable holding one of `choices` (case and surrounding whitespace ignored). */
const choiceVariable = <A>(name: string, what: string, choices: ReadonlyArray<readonly [string, A]>) =>
  Config.String(name).pipe(
    Config.mapEffect((text) => {
      const found = choices.find(([choice]) => choice === text.trim().toLowerCase())
      return found === undefined
        ? Effect.fail(
          new Config.ConfigError(
            new ConfigProvider.SourceError({
              message: `Invalid data at ${name}: invalid ${what} ${JSON.stringify(text)} (expected one of: ${
                choices.map(([choice]) => choice).join(", ")
              })`
            })
          )
        )
        : Effect.succeed(found[1])
    })
  )

/** `REBUNO_LOG_FORMAT` and `REBUNO_LOG_LEVEL` (the reference kernel's variables). */
const logConfig = Config.all({
  format: Config.option(
    choiceVariable("REBUNO_LOG_FORMAT", "format", Kernel.logFormats.map((format) => [format, format] as const))
  ),
  level: Config.option(choiceVariable("REBUNO_LOG_LEVEL", "level", logLevels))
})

/**
 * Whether something accepts TCP connections at a webhook URL's host and port:
 * `false` when the connection is refused or fails, `undefined` when the URL
 * cannot be parsed or no answer comes within `timeoutMs`.
 */
const probeWebhook = (url: string, timeoutMs = 300): Effect.Effect<boolean | undefined> => {
  let target: URL
  try {
    target = new URL(url)
  } catch {
    return Effect.succeed(undefined)
  }
  if (target.protocol !== "http:" && target.protocol !== "https:") return Effect.succeed(undefined)
  const port = target.port !== "" ? Number(target.port) : target.protocol === "https:" ? 443 : 80
  const host = target.hostname.startsWith("[") ? target.hostname.slice(1, -1) : target.hostname
  return Effect.callback<boolean>((resume) => {
    const socket = Net.connect({ host, port })
    socket.once("connect", () => {
      socket.destroy()
      resume(Effect.succeed(true))
    })
    socket.once("error", () => {
      socket.destroy()
      resume(Effect.succeed(false))
    })
    return Effect.sync(() => socket.destroy())
  }).pipe(Effect.timeoutOption(Duration.millis(timeoutMs)), Effect.map(Option.getOrUndefined))
}

/** Hosts that only this machine can reach. */
const isLoopback = (host: string): boolean =>
  host === "localhost" || host === "::1" || host === "[::1]" || host.startsWith("127.")

/** The one line printed on stderr when `dev` cannot start. */
const describeFailure = (error: unknown): string =>
  error instanceof Config.ConfigError
    ? `invalid configuration (${error.cause.message})`
    : error instanceof HttpServerError.ServeError
    ? `cannot listen: ${error.cause instanceof Error ? error.cause.message : String(error.cause)}`
    : Predicate.hasProperty(error, "message")
    ? String(error.message)
    : String(error)

/**
 * `effect-rebuno dev`.
 *
 * @since 0.1.0
 * @category commands
 */
export const dev = Command.make("dev", devFlags, (flags) =>
  Effect.gen(function*() {
    const logging = yield* logConfig
    const format = Option.getOrElse(Option.orElse(flags.logFormat, () => logging.format), () => "text" as const)
    // `--log-level` (effect/cli's global flag) has set the level already; else REBUNO_LOG_LEVEL does.
    const levelFlag = yield* GlobalFlag.LogLevel
    const level = Option.isSome(levelFlag) ? Option.none() : logging.level
    const served = serveDev(flags).pipe(Effect.provide(Kernel.layerLogger(format)))
    return yield* Option.isSome(level) ? Effect.provideService(served, References.MinimumLogLevel, level.value) : served
  }).pipe(
    Effect.scoped,
    Effect.tapError((error) => Console.error(`effect-rebuno: ${describeFailure(error)}`))
  )).pipe(Command.withDescription("Run the embedded in-memory Rebuno kernel"))

const serveDev = (flags: Command.Command.Config.Infer<typeof devFlags>) =>
  Effect.gen(function*() {
    const env = yield* KernelConfig.kernelConfig
    const listen = Option.getOrUndefined(Option.orElse(flags.listenAddr, () => env.listen))
    const host = Option.getOrElse(flags.host, () => listen === undefined ? KernelConfig.defaults.host : listen.host ?? "")
    const port = Option.getOrElse(flags.port, () => listen?.port ?? KernelConfig.defaults.port)
    const deadlineMs = Option.getOrElse(flags.deadlineTimeout, () => env.deadlineMs)
    const apiToken = Option.getOrUndefined(Option.orElse(flags.apiToken, () => env.apiToken))
    const stage = Option.getOrElse(flags.stage, () => env.stage)
    const kernel = yield* Kernel.start({
      host,
      port,
      manifest: Option.getOrUndefined(flags.config),
      settings: {
        leaseTimeoutMs: Option.getOrElse(flags.leaseTimeout, () => env.leaseTimeoutMs),
        maxAttempts: Option.getOrElse(flags.maxAttempts, () => env.maxAttempts),
        approvalTimeoutMs: Option.getOrElse(flags.approvalTimeout, () => env.approvalTimeoutMs),
        deadlineMs: deadlineMs !== undefined && deadlineMs > 0 ? deadlineMs : undefined,
        ...(Option.isSome(env.judge) ? { judge: Kernel.Policy.openAiJudge(env.judge.value) } : {})
      },
      dispatcher: {
        timeoutMs: Option.getOrElse(flags.dispatchTimeout, () => env.dispatchTimeoutMs),
        concurrency: Option.getOrElse(flags.concurrency, () => env.concurrency),
        deadlineCheckIntervalMs: env.deadlineCheckIntervalMs
      },
      apiToken,
      stage
    })
    yield* Console.log(`effect-rebuno dev kernel listening on ${kernel.url}`)
    if (isLoopback(host)) {
      yield* Console.log("reachable from this machine only (--host 0.0.0.0 to accept other machines and containers)")
    }
    if (kernel.agents.length === 0) {
      yield* Console.log("no agents registered (use --config manifest.yaml or POST /v0/agents)")
    }
    const reachable = yield* Effect.forEach(kernel.agents, (agent) => probeWebhook(agent.webhookUrl), {
      concurrency: "unbounded"
    })
    for (const [i, agent] of kernel.agents.entries()) {
      const note = reachable[i] === false ? " (nothing is listening there yet: deliveries fail until the agent runs)" : ""
      yield* Console.log(`registered agent ${agent.id} -> ${agent.webhookUrl}${note}`)
    }
    yield* Console.log(apiToken === undefined ? "bearer auth: off (dev mode)" : "bearer auth: on")
    yield* Console.log(`protocol stage: ${stage}`)
    if (Option.isSome(env.judge)) yield* Console.log(`judge: ${env.judge.value.url}`)
    return yield* Effect.never
  })

/**
 * The `effect-rebuno` root command.
 *
 * @since 0.1.0
 * @category commands
 */
export const command = Command.make("effect-rebuno").pipe(
  Command.withDescription("Effect SDK for Rebuno: tools for the embedded kernel"),
  Command.withSubcommands([dev])
)

/**
 * How the CLI answers a bad command line and `--version`, as it always has:
 * only the error, one line each, on stderr (no help page around it; `--help`
 * shows that), and the bare version number.
 *
 * @since 0.1.0
 * @category running
 */
export const presenter: CliOutput.Presenter = {
  present: (event) => {
    switch (event._tag) {
      case "InvalidInvocation":
        return Effect.forEach(event.errors, (error) => Console.error(error.message), { discard: true })
      case "Version":
        return Console.log(event.version)
      case "Help":
        return CliOutput.defaultPresenter.present(event)
    }
  }
}

/**
 * Runs the CLI with the given process arguments (`process.argv`: the node
 * binary and the script come first and are skipped).
 *
 * @since 0.1.0
 * @category running
 */
export const run = (argv: ReadonlyArray<string>) =>
  Command.runWith(command, { version: "0.2.0" })(argv.slice(2)).pipe(
    Effect.provideService(CliOutput.Presenter, presenter)
  )

// Exit codes as before: 0 after an interrupt (Ctrl-C, SIGTERM), 1 (or the
// error's own code) after a failure, whose message the command printed itself.
const teardown: Runtime.Teardown = (exit, onExit) =>
  Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause) ? onExit(0) : Runtime.defaultTeardown(exit, onExit)

/**
 * Runs the command line on `process.argv` as the `effect-rebuno` binary does:
 * Node services, the environment as configuration, and exit codes of its own.
 *
 * @since 0.2.0
 * @category running
 */
export const main = (): void =>
  run(process.argv).pipe(
    Effect.provide(NodeServices.layer),
    // A variable set to "" is kept (the manifest's `$VAR` and the REBUNO_* checks see it), as in the reference kernel.
    Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ preserveEmptyStrings: true })),
    NodeRuntime.runMain({ disableErrorReporting: true, teardown })
  )
