/**
 * The spans of a run as an OpenTelemetry backend receives them: an agent that
 * makes a local step, a tool call and an LLM call runs on the test kit over
 * the real HTTP kernel client, with `@effect/opentelemetry`'s tracer exporting
 * to an in-memory exporter. Every SDK span is exported, nested under the right
 * parent, and carries the execution id, dispatch id and attempt.
 */
import * as OtelTracer from "@effect/opentelemetry/OtelTracer"
import { describe, expect, it } from "@effect/vitest"
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import type { ReadableSpan } from "@opentelemetry/sdk-trace-base"
import { Effect, Layer, Schema } from "effect"
import * as Agent from "../src/Agent.js"
import * as Llm from "../src/Llm.js"
import * as Step from "../src/Step.js"
import * as Tool from "../src/Tool.js"
import { TestKernel } from "../src/testing/index.js"

const MODEL = "gpt-test"
const COMPLETION = JSON.stringify({ choices: [{ message: { role: "assistant", content: "hello" } }] })

const echo = Tool.make("echo", {
  args: Schema.Struct({ text: Schema.String }),
  success: Schema.Struct({ text: Schema.String }),
  execute: ({ text }) => Effect.succeed({ text })
})

/** The provider: answers a chat completion without any I/O. */
const provider: Llm.Fetch = () =>
  Promise.resolve(new Response(COMPLETION, { headers: { "content-type": "application/json" } }))

const traced = Agent.make({
  id: "traced",
  handler: () =>
    Effect.gen(function*() {
      const picked = yield* Step.run("pick", Effect.succeed(7))
      const echoed = yield* echo({ text: "hi" })
      const fetch = yield* Llm.makeFetch({ fetch: provider })
      const reply = yield* Effect.promise(async () => {
        const response = await fetch("http://provider.invalid/v1/chat/completions", {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }] })
        })
        return response.text()
      })
      return { picked, echoed: echoed.text, reply }
    })
})

/** An OpenTelemetry SDK tracer provider exporting to memory, installed as Effect's tracer. */
const otel = () => {
  const exporter = new InMemorySpanExporter()
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] })
  const layer = OtelTracer.layer.pipe(Layer.provide(Layer.succeed(OtelTracer.OtelTracerProvider, provider)))
  return { exporter, layer }
}

/** Run the agent once on a fresh kit (HTTP kernel client) under a `test` span; the exported spans. */
const runTraced = Effect.suspend(() => {
  const { exporter, layer } = otel()
  return Effect.gen(function*() {
    const kernel = yield* TestKernel.TestKernel
    const result = yield* kernel.run(traced, {}).pipe(Effect.withSpan("test"))
    expect(result.status).toBe("completed")
    expect(result.output).toEqual({ picked: 7, echoed: "hi", reply: COMPLETION })
    return { result, spans: new Spans(exporter.getFinishedSpans()) }
  }).pipe(
    Effect.provide(TestKernel.layer({ agents: [traced], transport: "http" })),
    Effect.provide(layer)
  )
})

class Spans {
  private readonly byId: Map<string, ReadableSpan>
  constructor(readonly all: ReadonlyArray<ReadableSpan>) {
    this.byId = new Map(all.map((s) => [s.spanContext().spanId, s]))
  }
  parentOf(span: ReadableSpan): ReadableSpan | undefined {
    const id = span.parentSpanContext?.spanId
    return id === undefined ? undefined : this.byId.get(id)
  }
  ancestors(span: ReadableSpan): Array<string> {
    const out: Array<string> = []
    for (let p = this.parentOf(span); p !== undefined; p = this.parentOf(p)) out.push(p.name)
    return out
  }
  named(name: string): Array<ReadableSpan> {
    return this.all.filter((s) => s.name === name)
  }
  one(name: string): ReadableSpan {
    const found = this.named(name)
    expect(found, name).toHaveLength(1)
    return found[0]!
  }
  childrenOf(parent: ReadableSpan): Array<string> {
    return this.all.filter((s) => this.parentOf(s) === parent).map((s) => s.name)
  }
}

const SDK_STEP_SPANS = ["Step.run", "Tool.call", "Llm.fetch"]

describe("spans exported through @effect/opentelemetry", () => {
  it.effect("step, tool, LLM and kernel-call spans are exported, nested under the right parents", () =>
    Effect.gen(function*() {
      const { spans } = yield* runTraced

      // The SDK's step spans, each exported once, with their own attributes.
      const [step, tool, llm] = SDK_STEP_SPANS.map((name) => spans.one(name)) as [
        ReadableSpan,
        ReadableSpan,
        ReadableSpan
      ]
      expect(step.attributes["rebuno.step.target"]).toBe("pick")
      expect(tool.attributes["rebuno.tool"]).toBe("echo")
      expect(llm.attributes).toMatchObject({ "rebuno.step.kind": "llm_call", "rebuno.step.target": MODEL })

      // One trace: every span descends from the test's span.
      const root = spans.one("test")
      for (const span of spans.all) {
        if (span !== root) expect(spans.ancestors(span), span.name).toContain("test")
        expect(span.spanContext().traceId).toBe(root.spanContext().traceId)
      }

      // The run is the webhook's: the step spans and the run's own kernel calls are its children.
      const webhook = spans.one("Agent.handleWebhook")
      expect(webhook.attributes["rebuno.agent_id"]).toBe("traced")
      for (const span of [step, tool, llm, spans.one("KernelClient.completeExecution")]) {
        expect(spans.parentOf(span)?.name, span.name).toBe("Agent.handleWebhook")
      }
      expect(spans.named("KernelClient.getExecution").length).toBeGreaterThanOrEqual(1)
      for (const span of spans.named("KernelClient.getExecution")) {
        expect(spans.parentOf(span)?.name).toBe("Agent.handleWebhook")
      }

      // Each step's kernel calls are nested in the step's span, and nowhere else.
      const submits = spans.named("KernelClient.submitStep")
      const completes = spans.named("KernelClient.completeStep")
      expect(submits).toHaveLength(3)
      expect(completes).toHaveLength(3)
      for (const parent of [step, tool, llm]) {
        expect(spans.childrenOf(parent).sort(), parent.name).toEqual(["KernelClient.completeStep", "KernelClient.submitStep"])
      }
      // The kernel-call spans are the HTTP exchanges' parents.
      for (const call of [...submits, ...completes]) {
        expect(spans.childrenOf(call), call.name).toEqual(["POST"])
      }
    }))

  it.effect("the step, tool, LLM and kernel-call spans carry the execution id, dispatch id and attempt", () =>
    Effect.gen(function*() {
      const { result, spans } = yield* runTraced
      const runSpans = [
        ...SDK_STEP_SPANS.map((name) => spans.one(name)),
        ...spans.named("KernelClient.submitStep"),
        ...spans.named("KernelClient.completeStep"),
        spans.one("KernelClient.completeExecution")
      ]
      expect(runSpans).toHaveLength(10)
      const dispatchId = spans.one("Llm.fetch").attributes["rebuno.dispatch_id"]
      expect(dispatchId).toEqual(expect.any(String))
      for (const span of runSpans) {
        expect(span.attributes, span.name).toMatchObject({
          "rebuno.execution_id": result.executionId,
          "rebuno.dispatch_id": dispatchId,
          "rebuno.dispatch_attempt": "1"
        })
      }
    }))
})
