/**
 * Logging in tests: the code under test logs (a rejected webhook, a failed
 * delivery, a metadata publish the kernel refused), and a test that provokes
 * those on purpose should not print them. Provide {@link layer} wherever a
 * test builds a runtime of its own — an agent's `toWebHandler` / `serve`
 * layer, a kernel server, an `it.live` test (whose fibers log to the real
 * console; `it.effect` already logs to its `TestConsole`) — and the lines go
 * to a buffer instead of the console.
 *
 * Nothing is lost when a test fails: the setup file (`test/support/setup.ts`,
 * in `vitest.config.ts`) prints the lines a failing test logged, after its
 * failure. {@link lines} gives a test the lines logged so far in it, to
 * assert on.
 *
 * @example
 * ```ts
 * import * as TestLogs from "../support/logging.js"
 *
 * const web = Agent.toWebHandler(agent, Layer.merge(kernel.layer, TestLogs.layer))
 * ```
 *
 * @since 0.2.0
 */
import { Layer, Logger, References } from "effect"

/** The lines logged since the current test started, oldest first. */
const buffer: Array<string> = []

/**
 * A logger that keeps each line (in the `logfmt` form of `Logger.formatLogFmt`)
 * instead of printing it.
 *
 * @since 0.2.0
 */
export const capturing: Logger.Logger<unknown, void> = Logger.map(Logger.formatLogFmt, (line) => {
  buffer.push(line)
})

/**
 * Replaces the loggers of whatever it is provided to with {@link capturing}.
 *
 * @since 0.2.0
 */
export const layer: Layer.Layer<never> = Logger.layer([capturing])

/**
 * The lines logged since the current test started (through {@link capturing}).
 *
 * @since 0.2.0
 */
export const lines = (): ReadonlyArray<string> => buffer.slice()

/**
 * Forget the lines logged so far (the setup file calls it before every test).
 *
 * @since 0.2.0
 */
export const reset = (): void => {
  buffer.length = 0
}

/**
 * One logged entry as {@link captureLogs} keeps it.
 *
 * @since 0.2.0
 */
export interface Logged {
  readonly level: string
  readonly message: string
  readonly annotations: Readonly<Record<string, unknown>>
}

/**
 * A logger that keeps every entry (all levels) with its annotations, for a
 * test that asserts on what was logged: provide `layer`, read `lines`.
 *
 * @since 0.2.0
 */
export const captureLogs = (): { readonly lines: Array<Logged>; readonly layer: Layer.Layer<never> } => {
  const lines: Array<Logged> = []
  const logger = Logger.make<unknown, void>((options) => {
    const parts: ReadonlyArray<unknown> = Array.isArray(options.message) ? options.message : [options.message]
    lines.push({
      level: options.logLevel,
      message: parts.map(String).join(" "),
      annotations: { ...options.fiber.getRef(References.CurrentLogAnnotations) }
    })
  })
  const layer = Layer.merge(Logger.layer([logger]), Layer.succeed(References.MinimumLogLevel, "All"))
  return { lines, layer }
}
