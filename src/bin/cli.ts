/**
 * The `effect-rebuno` command line. `effect-rebuno dev` starts the embedded
 * kernel with the reference kernel's dev manifest format and `REBUNO_*`
 * settings (flags win over the environment), prints the URL it listens on and
 * the agents it registered, and serves until interrupted.
 *
 * @since 0.1.0
 */
import * as Command from "@effect/cli/Command"
import * as HelpDoc from "@effect/cli/HelpDoc"
import * as Options from "@effect/cli/Options"
import * as ValidationError from "@effect/cli/ValidationError"
import * as NodeContext from "@effect/platform-node/NodeContext"
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import * as ConfigError from "effect/ConfigError"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as KernelConfig from "../kernel/Config.js"
import * as Kernel from "../kernel/index.js"
import { parseMillis } from "../kernel/internal/duration.js"

const invalid = (message: string): Effect.Effect<never, ValidationError.ValidationError> =>
  Effect.fail(ValidationError.invalidValue(HelpDoc.p(message)))

const durationOption = (name: string, description: string) =>
  Options.text(name).pipe(
    Options.withDescription(description),
    Options.mapEffect((text) => {
      const ms = parseMillis(text.trim())
      return ms === undefined || ms < 0
        ? invalid(`--${name}: invalid duration ${JSON.stringify(text)} (Go syntax, e.g. 90s, 2m)`)
        : Effect.succeed(ms)
    }),
    Options.optional
  )

const positiveIntOption = (name: string, description: string) =>
  Options.integer(name).pipe(
    Options.withDescription(description),
    Options.mapEffect((n) => n > 0 ? Effect.succeed(n) : invalid(`--${name}: must be greater than 0`)),
    Options.optional
  )

const devOptions = {
  host: Options.text("host").pipe(
    Options.withDescription("Interface to listen on (default 127.0.0.1, or the host of REBUNO_LISTEN_ADDR)"),
    Options.optional
  ),
  port: Options.integer("port").pipe(
    Options.withDescription("Port to listen on (default 8080, or the port of REBUNO_LISTEN_ADDR; 0 = any free port)"),
    Options.optional
  ),
  config: Options.text("config").pipe(
    Options.withAlias("c"),
    Options.withDescription("Dev manifest (YAML with an agents: list)"),
    Options.optional
  ),
  leaseTimeout: durationOption("lease-timeout", "Dispatch lease timeout (REBUNO_DISPATCH_LEASE_TIMEOUT, default 2m)"),
  dispatchTimeout: durationOption("dispatch-timeout", "Webhook HTTP timeout (REBUNO_DISPATCH_TIMEOUT, default 30s)"),
  maxAttempts: positiveIntOption("max-attempts", "Max delivery attempts (REBUNO_DISPATCH_MAX_ATTEMPTS, default 5)"),
  concurrency: positiveIntOption("dispatch-concurrency", "Deliveries in flight (REBUNO_DISPATCH_CONCURRENCY, default 8)"),
  approvalTimeout: durationOption("approval-timeout", "Default approval timeout (REBUNO_APPROVAL_TIMEOUT, default 15m)"),
  deadlineTimeout: durationOption("deadline-timeout", "Execution deadline (REBUNO_DEADLINE_TIMEOUT, default off)"),
  apiToken: Options.redacted("api-token").pipe(
    Options.withDescription("Bearer token for client/admin routes (REBUNO_API_TOKEN; default: dev mode, no auth)"),
    Options.optional
  )
}

/**
 * `effect-rebuno dev`.
 *
 * @since 0.1.0
 * @category commands
 */
export const dev = Command.make("dev", devOptions, (flags) =>
  Effect.gen(function*() {
    const env = yield* KernelConfig.kernelConfig
    const listen = Option.getOrUndefined(env.listen)
    const host = Option.getOrElse(flags.host, () => listen === undefined ? KernelConfig.defaults.host : listen.host ?? "")
    const port = Option.getOrElse(flags.port, () => listen?.port ?? KernelConfig.defaults.port)
    const deadlineMs = Option.getOrElse(flags.deadlineTimeout, () => env.deadlineMs)
    const apiToken = Option.getOrUndefined(Option.orElse(flags.apiToken, () => env.apiToken))
    const kernel = yield* Kernel.start({
      host,
      port,
      manifest: Option.getOrUndefined(flags.config),
      settings: {
        leaseTimeoutMs: Option.getOrElse(flags.leaseTimeout, () => env.leaseTimeoutMs),
        maxAttempts: Option.getOrElse(flags.maxAttempts, () => env.maxAttempts),
        approvalTimeoutMs: Option.getOrElse(flags.approvalTimeout, () => env.approvalTimeoutMs),
        deadlineMs: deadlineMs !== undefined && deadlineMs > 0 ? deadlineMs : undefined
      },
      dispatcher: {
        timeoutMs: Option.getOrElse(flags.dispatchTimeout, () => env.dispatchTimeoutMs),
        concurrency: Option.getOrElse(flags.concurrency, () => env.concurrency),
        deadlineCheckIntervalMs: env.deadlineCheckIntervalMs
      },
      apiToken
    })
    yield* Console.log(`effect-rebuno dev kernel listening on ${kernel.url}`)
    if (kernel.agents.length === 0) {
      yield* Console.log("no agents registered (use --config manifest.yaml or POST /v0/agents)")
    }
    for (const agent of kernel.agents) {
      yield* Console.log(`registered agent ${agent.id} -> ${agent.webhookUrl}`)
    }
    yield* Console.log(apiToken === undefined ? "bearer auth: off (dev mode)" : "bearer auth: on")
    return yield* Effect.never
  }).pipe(
    Effect.scoped,
    Effect.tapError((error) =>
      Console.error(
        `effect-rebuno: ${
          ConfigError.isConfigError(error)
            ? `invalid configuration ${String(error)}`
            : error._tag === "ServeError"
            ? `cannot listen: ${error.cause instanceof Error ? error.cause.message : String(error.cause)}`
            : typeof error === "object" && error !== null && "message" in error
            ? String(error.message)
            : String(error)
        }`
      )
    )
  )).pipe(Command.withDescription("Run the embedded in-memory Rebuno kernel"))

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
 * Runs the CLI with the given process arguments (`process.argv`).
 *
 * @since 0.1.0
 * @category running
 */
export const run = Command.run(command, { name: "effect-rebuno", version: "0.1.0" })

run(process.argv).pipe(
  Effect.provide(NodeContext.layer),
  NodeRuntime.runMain({ disableErrorReporting: true })
)
