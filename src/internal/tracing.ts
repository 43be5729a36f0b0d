/**
 * Spans on the hot path. `Effect.withSpan` makes the span the parent of
 * everything inside it by changing the fiber's context, and on Effect 3 that
 * costs more than the rest of a step put together (a fiber-ref update copies
 * the fiber's refs and compares contexts structurally). Effect's built-in
 * tracer keeps its spans nowhere, so when it is the installed tracer (no
 * exporter such as `@effect/opentelemetry`, no DevTools) or tracing is
 * disabled, {@link withSpan} runs the effect without a span. With any other
 * tracer every span is created as with `Effect.withSpan`.
 *
 * @since 0.1.0
 * @internal
 */
import { Effect, FiberRef } from "effect"
import type { Fiber, Tracer } from "effect"

/** Effect's built-in tracer (the default service). */
const builtInTracer: Tracer.Tracer = Effect.runSync(Effect.tracer)

/**
 * Is a span started now observable by anyone?
 *
 * @internal
 */
export const isRecording = (tracer: Tracer.Tracer, enabled: boolean): boolean => enabled && tracer !== builtInTracer

/**
 * `Effect.withSpan`, skipped when the installed tracer is Effect's built-in one
 * or tracing is disabled. The span's stack frame is never captured (it would be
 * this library's, not the caller's).
 *
 * @internal
 */
export const withSpan = (name: string, options?: SpanOptions) =>
<A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.withFiberRuntime((fiber) => withSpanIn(fiber, name, options, self))

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
 * {@link withSpan} for code already running with its fiber at hand.
 *
 * @internal
 */
export const withSpanIn = <A, E, R>(
  fiber: Fiber.RuntimeFiber<unknown, unknown>,
  name: string,
  options: SpanOptions | undefined,
  self: Effect.Effect<A, E, R>
): Effect.Effect<A, E, R> =>
  isRecording(fiber.currentTracer, fiber.getFiberRef(FiberRef.currentTracerEnabled))
    ? Effect.withSpan(self, name, {
      captureStackTrace: false,
      ...(options?.kind === undefined ? {} : { kind: options.kind }),
      ...(options?.attributes === undefined ? {} : { attributes: options.attributes })
    })
    : self
