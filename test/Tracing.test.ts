/**
 * Spans on the step path: recorded as nested spans when a tracer other than
 * Effect's built-in one is installed, skipped (no span at all) under the
 * built-in tracer or with tracing disabled. Also: schemas that need an Effect
 * to encode or decode (asynchronous transformations) still work on the step
 * path, which otherwise encodes synchronously.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Option, Schema, SchemaIssue, SchemaTransformation, Tracer } from "effect"
import * as Execution from "../src/Execution.js"
import * as Step from "../src/Step.js"
import * as Tool from "../src/Tool.js"
import { FakeKernel } from "./support/FakeKernel.js"

const EXEC = "0192f1a0-0000-7000-8000-000000000000"
const run1: Execution.RunOptions = { agentId: "agent", executionId: EXEC, dispatchId: "d1", dispatchAttempt: 1 }
const run2: Execution.RunOptions = { agentId: "agent", executionId: EXEC, dispatchId: "d1", dispatchAttempt: 2 }

const inRun = (fake: FakeKernel, options: Execution.RunOptions = run1) => <A, E>(self: Effect.Effect<A, E, Execution.Execution>) =>
  self.pipe(Effect.provide(Execution.layer(options)), Effect.provide(fake.layer))

interface Recorded {
  readonly name: string
  readonly parent: string | undefined
  readonly attributes: Map<string, unknown>
}

/** A tracer that keeps every span it is asked for. */
const recordingTracer = () => {
  const spans: Array<Recorded> = []
  let ids = 0
  const tracer = Tracer.make({
    span: ({ annotations, kind, links, name, parent, sampled, startTime }) => {
      const record: Recorded = {
        name,
        parent: Option.isSome(parent) && parent.value._tag === "Span" ? parent.value.name : undefined,
        attributes: new Map()
      }
      spans.push(record)
      let ended: Tracer.SpanStatus | undefined
      return {
        _tag: "Span",
        name,
        spanId: String(++ids),
        traceId: "trace",
        parent,
        annotations,
        get status(): Tracer.SpanStatus {
          return ended ?? { _tag: "Started", startTime }
        },
        attributes: record.attributes,
        links: [...links],
        sampled,
        kind,
        end: (endTime, exit) => {
          ended = { _tag: "Ended", startTime, endTime, exit }
        },
        attribute: (key, value) => void record.attributes.set(key, value),
        event: () => {},
        addLinks: () => {}
      }
    }
  })
  return { tracer, spans }
}

const echo = Tool.make("echo", {
  args: Schema.Struct({ text: Schema.String }),
  success: Schema.Struct({ text: Schema.String }),
  execute: ({ text }) => Effect.succeed({ text }).pipe(Effect.withSpan("provider.call"))
})

describe("spans on the step path", () => {
  it.effect("with a tracer installed: Tool.call and Step.run spans, the body's spans nested inside", () =>
    Effect.gen(function*() {
      const { spans, tracer } = recordingTracer()
      const fake = new FakeKernel()
      yield* inRun(fake)(
        Effect.gen(function*() {
          yield* echo({ text: "hi" })
          yield* Step.run("pick", Effect.succeed(1).pipe(Effect.withSpan("inside.pick")))
        }).pipe(Effect.withSpan("handler"))
      ).pipe(Effect.withTracer(tracer))
      const byName = new Map(spans.map((s) => [s.name, s]))
      expect(byName.get("Tool.call")).toMatchObject({ parent: "handler" })
      expect(byName.get("Tool.call")!.attributes.get("rebuno.tool")).toBe("echo")
      expect(byName.get("provider.call")).toMatchObject({ parent: "Tool.call" })
      expect(byName.get("Step.run")).toMatchObject({ parent: "handler" })
      expect(byName.get("Step.run")!.attributes.get("rebuno.step.target")).toBe("pick")
      expect(byName.get("inside.pick")).toMatchObject({ parent: "Step.run" })
    }))

  it.effect("with tracing disabled: no span of the SDK reaches the tracer", () =>
    Effect.gen(function*() {
      const { spans, tracer } = recordingTracer()
      const fake = new FakeKernel()
      yield* inRun(fake)(echo({ text: "hi" })).pipe(Effect.withTracerEnabled(false), Effect.withTracer(tracer))
      expect(spans.map((s) => s.name)).toEqual([])
    }))

  it.effect("under Effect's built-in tracer the step body sees its caller's span (no SDK span is made)", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      let seen: string | undefined
      const probe = Tool.make("probe", {
        args: Schema.Struct({}),
        success: Schema.Null,
        execute: () =>
          Effect.map(Effect.currentSpan, (span) => {
            seen = span.name
            return null
          }).pipe(Effect.orDie)
      })
      yield* inRun(fake)(probe({}).pipe(Effect.withSpan("handler")))
      expect(seen).toBe("handler")
    }))
})

/** A string stored as its length-prefixed form, through an asynchronous transformation. */
const Delayed = Schema.String.pipe(Schema.decodeTo(
  Schema.String,
  SchemaTransformation.transformEffect({
    decode: (s) => Effect.as(Effect.sleep("1 millis"), s.slice(s.indexOf(":") + 1)),
    encode: (s) => Effect.as(Effect.sleep("1 millis"), `${s.length}:${s}`)
  })
))

describe("schemas that need an Effect", () => {
  it.live("asynchronous argument, result and replay codecs take the Effect path", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      let executed = 0
      const slow = Tool.make("slow", {
        args: Schema.Struct({ name: Delayed }),
        success: Schema.Struct({ greeting: Delayed }),
        execute: ({ name }) =>
          Effect.sync(() => {
            executed++
            return { greeting: `hello ${name}` }
          })
      })
      const first = yield* inRun(fake, run1)(slow({ name: "ada" }))
      const second = yield* inRun(fake, run2)(slow({ name: "ada" }))
      expect(first).toEqual({ greeting: "hello ada" })
      expect(second).toEqual({ greeting: "hello ada" })
      expect(executed).toBe(1)
      expect(fake.ops("submitStep")[0]!.submission!.argsJson).toBe("{\"name\":\"3:ada\"}")
      expect(fake.ops("completeStep")[0]!.json).toBe("{\"greeting\":\"9:hello ada\"}")
    }))

  it.live("an asynchronous result schema that fails records the step as failed", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel()
      const Refusing = Schema.String.pipe(Schema.decodeTo(
        Schema.String,
        SchemaTransformation.transformEffect({
          decode: (s) => Effect.succeed(s),
          encode: (s, options) =>
            Effect.flatMap(Effect.sleep("1 millis"), () => Effect.fail(new SchemaIssue.InvalidValue(undefined, s, options)))
        })
      ))
      const bad = Tool.make("bad", {
        args: Schema.Struct({}),
        success: Refusing,
        execute: () => Effect.succeed("x")
      })
      const error = yield* Effect.flip(inRun(fake)(bad({})))
      expect(error._tag).toBe("ToolError")
      expect(fake.ops("failStep")).toHaveLength(1)
      expect(JSON.parse(fake.ops("failStep")[0]!.json!).message).toMatch(/^result does not encode/)
    }))
})
