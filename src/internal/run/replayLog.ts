/**
 * Replay-aware logging (issue 13): the log lines a handler writes while its
 * run is *replaying* are dropped, marked, or written as usual.
 *
 * A run is replaying while it re-executes steps that an earlier run recorded:
 * from its start until its first `proceed` decision, provided a step of it was
 * answered `replay` first. Until its first `replay` or `proceed` decision a
 * run cannot know which it is, so the lines of that stretch wait (with their
 * time, annotations and spans as they were) and go out once it knows: dropped
 * or marked after a `replay`, written after a `proceed`, and written when the
 * run ends without either (nothing was recorded, so nothing is repeated). The
 * first `proceed` makes the run live for good.
 *
 * It is a logger wrapper: the handler's fiber gets its loggers wrapped, and the
 * step path reports decisions to the run's tracker, found by the run's kernel
 * client (one per run).
 *
 * @since 0.2.0
 * @internal
 */
import { Logger, References } from "effect"
import type { Fiber } from "effect"

/**
 * What happens to a handler's log lines while its run is replaying:
 * `"suppress"` drops them, `"mark"` writes them with the annotation
 * `rebuno.replaying=true`, `"all"` writes them as usual (no wrapper at all).
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export type Mode = "suppress" | "mark" | "all"

/**
 * The annotation that marks a replayed log line under `"mark"`.
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const replayingAnnotation = "rebuno.replaying"

/**
 * The most lines a run holds back before its first decision; past it the run
 * is taken as live (its lines are written) rather than hold more.
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const maxHeldLines = 1_000

type State = "pending" | "replaying" | "live"

interface Held {
  readonly logger: Logger.Logger<unknown, unknown>
  readonly options: Logger.Options<unknown>
}

/**
 * The replay state of one run and its held-back lines.
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export class Tracker {
  private state: State = "pending"
  private held: Array<Held> = []

  constructor(readonly mode: Exclude<Mode, "all">) {}

  /** Whether the run is replaying now (lines written now are dropped or marked). */
  get replaying(): boolean {
    return this.state === "replaying"
  }

  /** A step decision of the run. */
  decided(decision: string): void {
    if (this.state === "live") return
    if (decision === "proceed") this.becomeLive()
    else if (decision === "replay" && this.state === "pending") {
      this.state = "replaying"
      const held = this.held
      this.held = []
      for (const line of held) this.replayed(line.logger, line.options)
    }
  }

  /** The handler is over: lines still held back are written. */
  end(): void {
    this.becomeLive()
  }

  /** A log line through `logger`. */
  log(logger: Logger.Logger<unknown, unknown>, options: Logger.Options<unknown>): void {
    switch (this.state) {
      case "live":
        logger.log(options)
        return
      case "replaying":
        this.replayed(logger, options)
        return
      case "pending":
        this.held.push({ logger, options: { ...options, fiber: frozen(options.fiber, false) } })
        if (this.held.length > maxHeldLines) this.becomeLive()
    }
  }

  private becomeLive(): void {
    this.state = "live"
    if (this.held.length === 0) return
    const held = this.held
    this.held = []
    for (const line of held) line.logger.log(line.options)
  }

  private replayed(logger: Logger.Logger<unknown, unknown>, options: Logger.Options<unknown>): void {
    if (this.mode === "mark") logger.log({ ...options, fiber: frozen(options.fiber, true) })
  }
}

/**
 * The fiber as loggers see it: its log annotations and spans as they are now
 * (a held line is written later), plus the replay mark when `mark`. Everything
 * else is the fiber's own.
 */
const frozen = (fiber: Fiber.Fiber<unknown, unknown>, mark: boolean): Fiber.Fiber<unknown, unknown> => {
  const annotations = fiber.getRef(References.CurrentLogAnnotations)
  const spans = fiber.getRef(References.CurrentLogSpans)
  const marked = mark ? { ...annotations, [replayingAnnotation]: true } : annotations
  const view = Object.create(fiber) as { getRef: Fiber.Fiber<unknown, unknown>["getRef"] }
  const annotationsRef: unknown = References.CurrentLogAnnotations
  const spansRef: unknown = References.CurrentLogSpans
  view.getRef = (ref) => (ref === annotationsRef ? marked : ref === spansRef ? spans : fiber.getRef(ref)) as never
  return view as unknown as Fiber.Fiber<unknown, unknown>
}

const trackers = new WeakMap<object, Tracker>()

/**
 * Track the replay state of the run whose kernel client is `run` (its
 * `Execution.kernel`), for a logger wrapper.
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const track = (run: object, mode: Exclude<Mode, "all">): Tracker => {
  const tracker = new Tracker(mode)
  trackers.set(run, tracker)
  return tracker
}

/**
 * Report a step decision of the run whose kernel client is `run` (a no-op for
 * an untracked run).
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const decided = (run: object, decision: string): void => {
  const tracker = trackers.get(run)
  if (tracker !== undefined) tracker.decided(decision)
}

/**
 * The loggers of a tracked handler: each of `loggers` behind the tracker.
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const wrapLoggers = (
  tracker: Tracker,
  loggers: ReadonlySet<Logger.Logger<unknown, any>>
): ReadonlySet<Logger.Logger<unknown, any>> => {
  const wrapped = new Set<Logger.Logger<unknown, any>>()
  for (const logger of loggers) wrapped.add(Logger.make((options) => tracker.log(logger, options)))
  return wrapped
}
