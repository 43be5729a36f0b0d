/**
 * Spans on the hot path. A span is not free even on Effect 4: `Effect.withSpan`
 * creates the span and makes it the parent of everything inside by providing
 * it in the fiber's context. Under Effect's built-in tracer that costs about
 * 4–5 µs a span — as much again as a step-shaped Effect, and +40–100 % on the
 * test kit's in-process tool step (measured on Effect 4.1). Effect's built-in
 * tracer (`Tracer.nativeTracer`) exports its
 * spans nowhere, so when it is the installed tracer (no exporter such as
 * `@effect/opentelemetry`, no DevTools) or tracing is disabled, {@link withSpan}
 * runs the effect without a span. With any other tracer every span is created
 * as with `Effect.withSpan`.
 *
 * @since 0.1.0
 * @internal
 */
import { Effect, References, Tracer } from "effect"
import type { Fiber } from "effect"

/**
 * Is a span started now observable by anyone? Not under Effect's built-in
 * tracer — Effect documents comparing against `Tracer.nativeTracer` for
 * exactly this — nor with tracing disabled.
 *
 * @internal
 */
export const isRecording = (tracer: Tracer.Tracer, enabled: boolean): boolean =>
  enabled && tracer !== Tracer.nativeTracer

/**
 * `Effect.withSpan`, skipped when the installed tracer is Effect's built-in one
 * or tracing is disabled. The span's stack frame is never captured (it would be
 * this library's, not the caller's).
 *
 * @internal
 */
export const withSpan = (name: string, options?: SpanOptions) =>
<A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.withFiber((fiber) => withSpanIn(fiber, name, options, self))

/**
 * The options of a span.
 *
 * @internal
 */
export interface SpanOptions {
  readonly kind?: Tracer.SpanKind | undefined
  readonly attributes?: Record<string, unknown> | undefined
}

/**
 * What identifies a run: its execution, dispatch and delivery attempt.
 *
 * @internal
 */
export interface RunIdentity {
  readonly executionId: string
  readonly dispatchId: string
  readonly dispatchAttempt: number | undefined
}

/**
 * The attributes that tie a span (or a log line) to its run:
 * `rebuno.execution_id`, `rebuno.dispatch_id` and `rebuno.dispatch_attempt`
 * (the attempt as a string, `"unknown"` when the kernel sent none) — the
 * names and values `Agent` annotates a run's logs with.
 *
 * @internal
 */
export const runAttributes = (run: RunIdentity): Record<string, string> => ({
  "rebuno.execution_id": run.executionId,
  "rebuno.dispatch_id": run.dispatchId,
  "rebuno.dispatch_attempt": String(run.dispatchAttempt ?? "unknown")
})

/**
 * {@link withSpan} for code already running with its fiber at hand.
 *
 * @internal
 */
export const withSpanIn = <A, E, R>(
  fiber: Fiber.Fiber<unknown, unknown>,
  name: string,
  options: SpanOptions | undefined,
  self: Effect.Effect<A, E, R>
): Effect.Effect<A, E, R> =>
  isRecording(fiber.getRef(Tracer.Tracer), fiber.getRef(References.TracerEnabled))
    ? Effect.withSpan(self, name, {
      captureStackTrace: false,
      ...(options?.kind === undefined ? {} : { kind: options.kind }),
      ...(options?.attributes === undefined ? {} : { attributes: options.attributes })
    })
    : self
