import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, flow, Layer, Logger, Option, Redacted, References, Schema, Stream } from "effect"
import { Sse } from "effect/encoding"
import { FetchHttpClient, HttpClient, HttpClientRequest, HttpClientResponse } from "effect/http"
import type { HttpClientError } from "effect/http"
import OpenAI, { APIError } from "openai"
import * as Execution from "../src/Execution.js"
import { KernelClient } from "../src/KernelClient.js"
import * as KernelClientModule from "../src/KernelClient.js"
import type { Caller, StepSubmission } from "../src/KernelClient.js"
import * as Llm from "../src/Llm.js"
import type * as Protocol from "../src/Protocol.js"
import {
  Abandoned,
  Blocked,
  DecodeError,
  InvalidArguments,
  KernelError,
  LeaseSuperseded,
  PolicyError,
  RateLimited,
  Terminated,
  ToolError,
  TransportError
} from "../src/RebunoError.js"
import { cutDeltas, DeltaBuffer } from "../src/internal/run/llmStream.js"
import * as ReplayLog from "../src/internal/run/replayLog.js"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import * as FakeOpenAi from "./support/fakeOpenAi.js"

// ---------------------------------------------------------------------------
// A scripted in-memory kernel client: steps keyed by (kind, target, args,
// occurrence), occurrences counted per lease, so that a second run replays
// what the first one recorded.
// ---------------------------------------------------------------------------

type Scripted = Protocol.StepDecision | KernelError | PolicyError | LeaseSuperseded | Terminated

interface StepState {
  readonly stepId: string
  status: "executing" | "succeeded" | "failed"
  result?: unknown
  error?: unknown
}

class TestKernel {
  readonly submits: Array<{ readonly caller: Caller; readonly submission: StepSubmission }> = []
  readonly completes: Array<{ readonly stepId: string; readonly json: string }> = []
  readonly fails: Array<{ readonly stepId: string; readonly message: string }> = []
  readonly deltas: Array<{ readonly stepId: string; readonly seq: number; readonly data: string }> = []
  readonly script: Array<Scripted> = []
  private readonly steps = new Map<string, StepState>()
  private readonly counters = new Map<string, number>()
  private next = 0

  readonly service: KernelClient.Service = {
    secret: Redacted.make("secret"),
    getExecution: () => Effect.die("not used"),
    submitStep: (caller, _executionId, submission) =>
      Effect.suspend(() => {
        this.submits.push({ caller, submission })
        const scripted = this.script.shift()
        if (scripted !== undefined) {
          return scripted instanceof KernelError || scripted instanceof PolicyError ||
              scripted instanceof LeaseSuperseded || scripted instanceof Terminated
            ? Effect.fail(scripted)
            : Effect.succeed(scripted)
        }
        const base = `${submission.kind}|${submission.target}|${submission.argsJson}`
        const counter = `${caller.lease.dispatchId}:${caller.lease.attempt}|${base}`
        const occurrence = this.counters.get(counter) ?? 0
        this.counters.set(counter, occurrence + 1)
        const existing = this.steps.get(`${base}|${occurrence}`)
        if (existing === undefined) {
          const stepId = `step-${this.next++}`
          this.steps.set(`${base}|${occurrence}`, { stepId, status: "executing" })
          return Effect.succeed<Protocol.StepDecision>({ decision: "proceed", stepId })
        }
        if (existing.status === "succeeded") {
          return Effect.succeed<Protocol.StepDecision>({
            decision: "replay",
            stepId: existing.stepId,
            result: existing.result
          })
        }
        if (existing.status === "failed") {
          return Effect.succeed<Protocol.StepDecision>({
            decision: "replay",
            stepId: existing.stepId,
            error: existing.error
          })
        }
        return Effect.succeed<Protocol.StepDecision>({ decision: "proceed", stepId: existing.stepId })
      }),
    completeStep: (_caller, _executionId, stepId, json) =>
      Effect.sync(() => {
        this.completes.push({ stepId, json })
        const step = this.find(stepId)
        if (step === undefined || step.status !== "executing") return { decision: "replay" }
        step.status = "succeeded"
        step.result = JSON.parse(json)
        return { decision: "recorded" }
      }),
    failStep: (caller, executionId, stepId, message) =>
      this.service.failStepJson(caller, executionId, stepId, JSON.stringify({ message })),
    failStepJson: (_caller, _executionId, stepId, errorJson) =>
      Effect.sync(() => {
        const error = JSON.parse(errorJson)
        this.fails.push({ stepId, message: error.message })
        const step = this.find(stepId)
        if (step === undefined || step.status !== "executing") return { decision: "replay" }
        step.status = "failed"
        step.error = error
        return { decision: "recorded" }
      }),
    publishDelta: (_caller, _executionId, stepId, seq, data) =>
      Effect.sync(() => {
        this.deltas.push({ stepId, seq, data })
      }),
    heartbeat: () => Effect.void,
    completeExecution: () => Effect.void,
    failExecution: () => Effect.void
  }

  private find(stepId: string): StepState | undefined {
    for (const step of this.steps.values()) if (step.stepId === stepId) return step
    return undefined
  }

  recorded(index = 0): { status: number; headers: Record<string, string>; body: string } {
    return JSON.parse(this.completes[index]!.json)
  }
}

const EXEC = "0192f1a0-0000-7000-8000-0000000000aa"
const MODEL = "gpt-test"

const inRun = (kernel: TestKernel, attempt = 1) => <A, E, R>(self: Effect.Effect<A, E, R>) =>
  self.pipe(
    Effect.provide(Execution.layer({ agentId: "agent", executionId: EXEC, dispatchId: "d1", dispatchAttempt: attempt })),
    Effect.provide(Layer.succeed(KernelClient, kernel.service))
  )

const openai = (fake: FakeOpenAi.FakeOpenAi, fetch: Llm.Fetch, maxRetries = 0) =>
  new OpenAI({ apiKey: "sk-test", baseURL: fake.url, fetch, maxRetries })

const ask = (client: OpenAI) =>
  Effect.tryPromise({
    try: () => client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }] }),
    catch: (e) => e
  })

const askText = (client: OpenAI) => Effect.map(ask(client), (c) => c.choices[0]?.message.content ?? "")

/** Stream a completion; stop after `stopAfter` chunks when given. */
const askStream = (client: OpenAI, stopAfter?: number) =>
  Effect.tryPromise({
    try: async () => {
      const stream = await client.chat.completions.create({
        model: MODEL,
        messages: [{ role: "user", content: "hi" }],
        stream: true
      })
      let text = ""
      let chunks = 0
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta.content ?? ""
        if (stopAfter !== undefined && ++chunks >= stopAfter) break
      }
      return text
    },
    catch: (e) => e
  })

/** A raw POST through a fetch. */
const post = (fetch: Llm.Fetch, url: string, body: string | undefined) =>
  Effect.promise(async () => {
    const response = await fetch(url, body === undefined ? { method: "GET" } : { method: "POST", body })
    return { status: response.status, type: response.headers.get("content-type"), text: await response.text() }
  })

const LONG_REPLY = "Durable héllo wörld — ☃ 😀 ✓ ".repeat(300)

// ---------------------------------------------------------------------------

describe("Llm.makeFetch with the openai client", () => {
  it.effect("first run calls the provider once and records the response; replay does not call it", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: "The answer is 42." })
      const kernel = new TestKernel()
      const first = yield* Effect.flatMap(Llm.makeFetch(), (fetch) => askText(openai(fake, fetch))).pipe(inRun(kernel, 1))
      expect(first).toBe("The answer is 42.")
      expect(fake.calls).toBe(1)
      const [submit] = kernel.submits
      expect(submit!.submission.kind).toBe("llm_call")
      expect(submit!.submission.target).toBe(MODEL)
      expect(submit!.submission.idempotency).toBe("safe_to_retry")
      expect(JSON.parse(submit!.submission.argsJson)).toEqual(fake.requests[0])
      expect(kernel.completes.map((c) => c.stepId)).toEqual(["step-0"])
      expect(Object.keys(JSON.parse(kernel.completes[0]!.json))).toEqual(["status", "headers", "body"])
      expect(kernel.recorded()).toEqual({
        status: 200,
        headers: { "content-type": "application/json" },
        body: FakeOpenAi.completionText(MODEL, "The answer is 42.")
      })

      const second = yield* Effect.flatMap(Llm.makeFetch(), (fetch) => askText(openai(fake, fetch))).pipe(inRun(kernel, 2))
      expect(second).toBe("The answer is 42.")
      expect(fake.calls).toBe(1)
      expect(kernel.submits).toHaveLength(2)
      expect(kernel.completes).toHaveLength(1)
    }))

  it.effect("streaming: the caller gets the text live, deltas are published (seq 0.., ≤ 1750 chars), replay streams it back", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: LONG_REPLY })
      const kernel = new TestKernel()
      const live = yield* Effect.flatMap(Llm.makeFetch(), (fetch) => askStream(openai(fake, fetch))).pipe(inRun(kernel, 1))
      expect(live).toBe(LONG_REPLY)
      expect(fake.calls).toBe(1)
      expect(kernel.completes).toHaveLength(1)
      const transcript = FakeOpenAi.streamText(MODEL, LONG_REPLY)
      expect(kernel.recorded()).toEqual({
        status: 200,
        headers: { "content-type": "text/event-stream; charset=utf-8" },
        body: transcript
      })
      const deltas = kernel.deltas
      expect(deltas.length).toBeGreaterThan(2)
      expect(deltas.every((d) => d.stepId === "step-0")).toBe(true)
      expect(deltas.map((d) => d.seq)).toEqual(deltas.map((_, i) => i))
      expect(deltas.every((d) => d.data.length > 0 && d.data.length <= 1750)).toBe(true)
      expect(deltas.some((d) => d.data.length === 1750)).toBe(true)
      expect(deltas.every((d) => !/[\ud800-\udbff]$/.test(d.data) && !/^[\udc00-\udfff]/.test(d.data))).toBe(true)
      expect(deltas.map((d) => d.data).join("")).toBe(transcript)

      const replayed = yield* Effect.flatMap(Llm.makeFetch(), (fetch) => askStream(openai(fake, fetch))).pipe(
        inRun(kernel, 2)
      )
      expect(replayed).toBe(LONG_REPLY)
      expect(fake.calls).toBe(1)
      expect(kernel.deltas).toHaveLength(deltas.length)
      expect(kernel.completes).toHaveLength(1)
    }))

  it.effect("streaming: a consumer that stops early records what it read, exactly once", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: LONG_REPLY })
      const kernel = new TestKernel()
      const partial = yield* Effect.flatMap(Llm.makeFetch(), (fetch) => askStream(openai(fake, fetch), 2)).pipe(
        inRun(kernel)
      )
      expect(LONG_REPLY.startsWith(partial)).toBe(true)
      expect(kernel.completes).toHaveLength(1)
      expect(kernel.fails).toHaveLength(0)
      const body = kernel.recorded().body
      expect(body.length).toBeGreaterThan(0)
      const full = FakeOpenAi.streamText(MODEL, LONG_REPLY)
      expect(full.startsWith(body)).toBe(true)
      expect(body.length).toBeLessThan(full.length)
      expect(kernel.deltas.map((d) => d.data).join("")).toBe(body)
    }))

  it.effect("streaming: a mid-stream read error fails the step and errors the caller's stream", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: LONG_REPLY })
      fake.mode = "cut"
      const kernel = new TestKernel()
      const error = yield* Effect.flip(
        Effect.flatMap(Llm.makeFetch(), (fetch) => askStream(openai(fake, fetch))).pipe(inRun(kernel))
      )
      expect(error).toBeInstanceOf(Error)
      expect(kernel.completes).toHaveLength(0)
      expect(kernel.fails.map((f) => f.stepId)).toEqual(["step-0"])
    }))

  it.effect("denied → 403 APIError through openai, which raiseForRefusal turns into PolicyError", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped()
      const kernel = new TestKernel()
      kernel.script.push({ decision: "denied", stepId: "s-1", reason: "no llm for you" })
      const [error, refusal] = yield* Effect.gen(function*() {
        const fetch = yield* Llm.makeFetch()
        const error = yield* Effect.flip(ask(openai(fake, fetch)))
        return [error, yield* Effect.flip(Llm.raiseForRefusal(error))] as const
      }).pipe(inRun(kernel))
      expect(error).toBeInstanceOf(OpenAI.PermissionDeniedError)
      expect((error as APIError).status).toBe(403)
      expect(refusal).toBeInstanceOf(PolicyError)
      expect(refusal).toMatchObject({ reason: "no llm for you", stepId: "s-1", target: MODEL })
      expect(Llm.decodeRefusal(new Error(`403 ${(error as APIError).message}`)).pipe(Option.map((r) => r.message)))
        .toEqual(Option.some("no llm for you"))
      expect(fake.calls).toBe(0)
      expect(kernel.completes).toHaveLength(0)
    }))

  it.effect("liftRefusals surfaces the typed refusal in the error channel", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped()
      const kernel = new TestKernel()
      kernel.script.push({ decision: "denied", stepId: "s-1" })
      const error = yield* Effect.flip(
        Effect.flatMap(Llm.makeFetch(), (fetch) => ask(openai(fake, fetch)).pipe(Llm.liftRefusals)).pipe(inRun(kernel))
      )
      expect(error).toBeInstanceOf(PolicyError)
      expect((error as PolicyError).reason).toBe("denied by policy")
    }))

  it.effect("blocked → 403, Blocked recorded on the run", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped()
      const kernel = new TestKernel()
      kernel.script.push({ decision: "blocked", stepId: "s-1", approvalId: "ap-1" })
      const [error, signal] = yield* Effect.gen(function*() {
        const fetch = yield* Llm.makeFetch()
        const error = yield* Effect.flip(ask(openai(fake, fetch)))
        return [error, yield* Execution.signal] as const
      }).pipe(inRun(kernel))
      expect((error as APIError).status).toBe(403)
      const recorded = Option.getOrUndefined(signal)
      expect(recorded).toBeInstanceOf(Blocked)
      expect((recorded as Blocked).approvalId).toBe("ap-1")
      const refusal = yield* Effect.flip(Llm.raiseForRefusal(error))
      expect(refusal).toBeInstanceOf(Blocked)
      expect(refusal).toMatchObject({ approvalId: "ap-1", stepId: "s-1" })
      expect(fake.calls).toBe(0)
    }))

  it.effect("rate_limited → 429 that the openai client does not retry; RateLimited with the reason", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped()
      const kernel = new TestKernel()
      kernel.script.push({ decision: "rate_limited", reason: "rate_limit_exceeded" })
      const error = yield* Effect.flip(
        Effect.flatMap(Llm.makeFetch(), (fetch) => ask(openai(fake, fetch, 2))).pipe(inRun(kernel))
      )
      expect(error).toBeInstanceOf(OpenAI.RateLimitError)
      expect(kernel.submits).toHaveLength(1)
      const refusal = yield* Effect.flip(Llm.raiseForRefusal(error))
      expect(refusal).toBeInstanceOf(RateLimited)
      expect((refusal as RateLimited).reason).toBe("rate_limit_exceeded")
    }))
})

describe("Llm.makeFetch refusal answers", () => {
  const URL = "http://127.0.0.1:9/v1/chat/completions"
  const BODY = JSON.stringify({ model: MODEL, messages: [] })
  const never: Llm.Fetch = () => Promise.reject(new Error("the provider must not be called"))

  const answer = (kernel: TestKernel, scripted: Scripted) =>
    Effect.gen(function*() {
      kernel.script.push(scripted)
      const fetch = yield* Llm.makeFetch({ fetch: never })
      const response = yield* post(fetch, URL, BODY)
      return { response, signal: Option.getOrUndefined(yield* Execution.signal) }
    }).pipe(inRun(kernel))

  const refusal = (message: string) => JSON.stringify({ error: { type: "rebuno_refusal", message } })

  it.effect("exact statuses and bodies, with application/json, and the signals recorded", () =>
    Effect.gen(function*() {
      const cases: ReadonlyArray<readonly [Scripted, number, string, unknown]> = [
        [{ decision: "denied", stepId: "s", reason: "no" }, 403, "rebuno_refusal: denied reason=no", undefined],
        [{ decision: "denied", stepId: "s" }, 403, "rebuno_refusal: denied reason=denied by policy", undefined],
        [{ decision: "blocked", stepId: "s" }, 403, "rebuno_refusal: blocked", Blocked],
        [{ decision: "execution_blocked" }, 403, "rebuno_refusal: blocked", Blocked],
        [{ decision: "execution_terminal" }, 403, "rebuno_refusal: execution_terminal", Terminated],
        [
          { decision: "rate_limited", reason: "rate_limiter_unavailable" },
          429,
          "rebuno_refusal: rate_limited reason=rate_limiter_unavailable",
          undefined
        ],
        [{ decision: "rate_limited" }, 429, "rebuno_refusal: rate_limited", undefined],
        [new LeaseSuperseded(), 409, "rebuno_refusal: lease_superseded", LeaseSuperseded],
        [new Terminated(), 403, "rebuno_refusal: execution_terminal", Terminated],
        [new PolicyError({ reason: "policy says no" }), 403, "rebuno_refusal: denied reason=policy says no", undefined]
      ]
      for (const [scripted, status, message, signal] of cases) {
        const kernel = new TestKernel()
        const { response, signal: recorded } = yield* answer(kernel, scripted)
        expect(response).toEqual({ status, type: "application/json", text: refusal(message) })
        if (signal === undefined) expect(recorded).toBeUndefined()
        else expect(recorded).toBeInstanceOf(signal as typeof Blocked)
      }
    }))

  it.effect("a submit transport failure records Abandoned and rejects", () =>
    Effect.gen(function*() {
      const kernel = new TestKernel()
      kernel.script.push(new KernelError({ reason: new TransportError({ description: "connection reset" }) }))
      const [error, signal] = yield* Effect.gen(function*() {
        const fetch = yield* Llm.makeFetch({ fetch: never })
        const error = yield* Effect.flip(Effect.tryPromise({ try: () => fetch(URL, { method: "POST", body: BODY }), catch: (e) => e }))
        return [error, Option.getOrUndefined(yield* Execution.signal)] as const
      }).pipe(inRun(kernel))
      expect(error).toBeInstanceOf(Abandoned)
      expect(signal).toBeInstanceOf(Abandoned)
    }))

  it.effect("a replayed failure rejects with '<model>: <message>'", () =>
    Effect.gen(function*() {
      const kernel = new TestKernel()
      kernel.script.push({ decision: "replay", stepId: "s", error: { message: "boom" } })
      const error = yield* Effect.gen(function*() {
        const fetch = yield* Llm.makeFetch({ fetch: never })
        return yield* Effect.flip(Effect.tryPromise({ try: () => fetch(URL, { method: "POST", body: BODY }), catch: (e) => e }))
      }).pipe(inRun(kernel))
      expect(error).toBeInstanceOf(ToolError)
      expect((error as ToolError).message).toBe(`${MODEL}: boom`)
    }))

  it.effect("replay rebuilds the recorded response; a non-object value is 200 JSON of its text", () =>
    Effect.gen(function*() {
      const kernel = new TestKernel()
      const a = yield* answer(kernel, {
        decision: "replay",
        stepId: "s",
        result: { status: 418, headers: { "content-type": "text/plain" }, body: "teapot" }
      })
      expect(a.response).toEqual({ status: 418, type: "text/plain", text: "teapot" })
      const b = yield* answer(kernel, { decision: "replay", stepId: "s", result: 42 })
      expect(b.response).toEqual({ status: 200, type: "application/json", text: "42" })
      const c = yield* answer(kernel, { decision: "replay", stepId: "s" })
      expect(c.response).toEqual({ status: 200, type: "application/json", text: "null" })
      const d = yield* answer(kernel, { decision: "replay", stepId: "s", result: { body: "{}" } })
      expect(d.response).toEqual({ status: 200, type: "application/json", text: "{}" })
    }))

  it.effect("a body with a number JSON cannot carry rejects with InvalidArguments before anything is sent", () =>
    Effect.gen(function*() {
      const kernel = new TestKernel()
      const error = yield* Effect.gen(function*() {
        const fetch = yield* Llm.makeFetch({ fetch: never })
        return yield* Effect.flip(
          Effect.tryPromise({ try: () => fetch(URL, { method: "POST", body: "{\"model\":\"m\",\"t\":1e400}" }), catch: (e) => e })
        )
      }).pipe(inRun(kernel))
      expect(error).toBeInstanceOf(InvalidArguments)
      expect(kernel.submits).toHaveLength(0)
    }))

  it.effect("an unknown decision rejects", () =>
    Effect.gen(function*() {
      const kernel = new TestKernel()
      kernel.script.push({ decision: "recorded" })
      const error = yield* Effect.gen(function*() {
        const fetch = yield* Llm.makeFetch({ fetch: never })
        return yield* Effect.flip(Effect.tryPromise({ try: () => fetch(URL, { method: "POST", body: BODY }), catch: (e) => e }))
      }).pipe(inRun(kernel))
      expect(error).toBeInstanceOf(KernelError)
      expect((error as KernelError).reason).toBeInstanceOf(DecodeError)
      expect((error as KernelError).reason.description).toBe("unexpected step decision: recorded")
    }))
})

describe("Llm.makeFetch proceed and passthrough", () => {
  it.effect("error statuses are recorded as successful steps and replayed", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped()
      fake.mode = "error"
      fake.errorStatus = 500
      const kernel = new TestKernel()
      const body = JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }] })
      const url = `${fake.url}/chat/completions`
      const first = yield* Effect.flatMap(Llm.makeFetch(), (fetch) => post(fetch, url, body)).pipe(inRun(kernel, 1))
      expect(first.status).toBe(500)
      expect(kernel.recorded()).toEqual({ status: 500, headers: { "content-type": "application/json" }, body: first.text })
      const second = yield* Effect.flatMap(Llm.makeFetch(), (fetch) => post(fetch, url, body)).pipe(inRun(kernel, 2))
      expect(second).toEqual(first)
      expect(fake.calls).toBe(1)
      expect(kernel.fails).toHaveLength(0)
    }))

  it.effect("a provider failure fails the step and rejects with the provider's error", () =>
    Effect.gen(function*() {
      const kernel = new TestKernel()
      const boom = new TypeError("fetch failed")
      const error = yield* Effect.gen(function*() {
        const fetch = yield* Llm.makeFetch({ fetch: () => Promise.reject(boom) })
        return yield* Effect.flip(
          Effect.tryPromise({
            try: () => fetch("http://127.0.0.1:9/x", { method: "POST", body: JSON.stringify({ model: "m" }) }),
            catch: (e) => e
          })
        )
      }).pipe(inRun(kernel))
      expect(error).toBe(boom)
      expect(kernel.fails).toEqual([{ stepId: "step-0", message: "fetch failed" }])
      expect(kernel.submits[0]!.submission.target).toBe("m")
    }))

  it.effect("a body read error fails the step, then rethrows", () =>
    Effect.gen(function*() {
      const kernel = new TestKernel()
      const broken = new ReadableStream<Uint8Array>({
        pull(controller) {
          controller.error(new Error("socket hang up"))
        }
      })
      const error = yield* Effect.gen(function*() {
        const fetch = yield* Llm.makeFetch({
          fetch: () => Promise.resolve(new Response(broken, { headers: { "content-type": "application/json" } }))
        })
        return yield* Effect.flip(
          Effect.tryPromise({
            try: () => fetch("http://127.0.0.1:9/x", { method: "POST", body: JSON.stringify({ model: "m" }) }),
            catch: (e) => e
          })
        )
      }).pipe(inRun(kernel))
      expect((error as Error).message).toBe("socket hang up")
      expect(kernel.fails.map((f) => f.message)).toEqual(["socket hang up"])
      expect(kernel.completes).toHaveLength(0)
    }))

  it.effect("non-JSON-object bodies and requests without a body pass through untouched", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped()
      const kernel = new TestKernel()
      const url = `${fake.url}/chat/completions`
      yield* Effect.gen(function*() {
        const fetch = yield* Llm.makeFetch()
        yield* post(fetch, url, "not json")
        yield* post(fetch, url, "[1,2,3]")
        yield* post(fetch, url, "\"text\"")
        yield* post(fetch, url, undefined)
        yield* Effect.promise(() =>
          fetch(url, { method: "POST", body: new TextEncoder().encode(JSON.stringify({ model: "m" })) })
        )
      }).pipe(inRun(kernel))
      expect(kernel.submits).toHaveLength(0)
      expect(fake.calls).toBe(4)
    }))

  it.effect("outside a run, makeFetchOptional passes through", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: "plain" })
      const fetch = yield* Llm.makeFetchOptional()
      expect(yield* askText(openai(fake, fetch))).toBe("plain")
      expect(fake.calls).toBe(1)
    }))

  it.effect("inside a run, makeFetchOptional records", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped()
      const kernel = new TestKernel()
      yield* Effect.flatMap(Llm.makeFetchOptional(), (fetch) => askText(openai(fake, fetch))).pipe(inRun(kernel))
      expect(kernel.submits).toHaveLength(1)
      expect(kernel.completes).toHaveLength(1)
    }))
})

// ---------------------------------------------------------------------------
// Effect-native clients
// ---------------------------------------------------------------------------

// A small OpenAI-compatible chat-completions client on `effect/http`, built
// the way Effect's provider clients are: the `HttpClient` from context, the API
// URL and bearer token added to every request, an optional `transformClient`,
// then only 2xx answers accepted. Streams are read as server-sent events up to
// `data: [DONE]`.

const Completion = Schema.Struct({
  choices: Schema.Array(Schema.Struct({ message: Schema.Struct({ content: Schema.NullOr(Schema.String) }) }))
})

const CompletionChunk = Schema.Struct({
  choices: Schema.Array(Schema.Struct({ delta: Schema.Struct({ content: Schema.optional(Schema.String) }) }))
})
const decodeChunk = Schema.decodeEffect(Schema.fromJsonString(CompletionChunk))

interface ChatRequest {
  readonly model: string
  readonly messages: ReadonlyArray<{ readonly role: string; readonly content: string }>
}

class ChatClient extends Context.Service<ChatClient, {
  readonly createChatCompletion: (
    request: ChatRequest
  ) => Effect.Effect<typeof Completion.Type, HttpClientError.HttpClientError | Schema.SchemaError>
  readonly streamChatCompletion: (
    request: ChatRequest
  ) => Stream.Stream<
    typeof CompletionChunk.Type,
    HttpClientError.HttpClientError | Sse.Retry | Sse.SseError | Schema.SchemaError
  >
}>()("test/ChatClient") {}

const makeChatClient = (options: {
  readonly apiKey: Redacted.Redacted
  readonly apiUrl: string
  readonly transformClient?: ((client: HttpClient.HttpClient) => HttpClient.HttpClient) | undefined
}) =>
  Effect.gen(function*() {
    const client = (yield* HttpClient.HttpClient).pipe(
      HttpClient.mapRequest(flow(
        HttpClientRequest.prependUrl(options.apiUrl),
        HttpClientRequest.bearerToken(Redacted.value(options.apiKey)),
        HttpClientRequest.acceptJson
      )),
      options.transformClient ?? ((client) => client),
      HttpClient.filterStatusOk
    )
    const post = (body: object) =>
      HttpClientRequest.post("/chat/completions").pipe(HttpClientRequest.bodyJsonUnsafe(body))
    return ChatClient.of({
      createChatCompletion: (request) =>
        client.execute(post(request)).pipe(Effect.flatMap(HttpClientResponse.schemaBodyJson(Completion))),
      streamChatCompletion: (request) =>
        client.execute(post({ ...request, stream: true })).pipe(
          Effect.map((response) =>
            response.stream.pipe(
              Stream.decodeText,
              Stream.pipeThroughChannel(Sse.decode()),
              Stream.takeWhile((event) => event.data !== "[DONE]"),
              Stream.mapEffect((event) => decodeChunk(event.data))
            )
          ),
          Stream.unwrap
        )
    })
  })

const chatLayer = (options: Parameters<typeof makeChatClient>[0]) => Layer.effect(ChatClient, makeChatClient(options))

const openAiLayer = (fake: FakeOpenAi.FakeOpenAi) =>
  chatLayer({ apiKey: Redacted.make("sk-test"), apiUrl: fake.url, transformClient: Llm.transformClient }).pipe(
    Layer.provide(FetchHttpClient.layer)
  )

const chatRequest: ChatRequest = { model: MODEL, messages: [{ role: "user", content: "hi" }] }

const createCompletion = Effect.flatMap(Effect.service(ChatClient), (client) => client.createChatCompletion(chatRequest))

const streamCompletionTake = (take: number) =>
  Effect.flatMap(Effect.service(ChatClient), (client) =>
    client.streamChatCompletion(chatRequest).pipe(
      Stream.take(take),
      Stream.map((chunk) => chunk.choices[0]?.delta.content ?? ""),
      Stream.mkString
    ))

const streamCompletion = streamCompletionTake(Number.MAX_SAFE_INTEGER)

describe("Llm.transformClient with an Effect-native client", () => {
  it.effect("records a completion and replays it without calling the provider", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: "effect native" })
      const kernel = new TestKernel()
      const first = yield* createCompletion.pipe(Effect.provide(openAiLayer(fake)), inRun(kernel, 1))
      expect(first.choices[0]?.message.content).toBe("effect native")
      expect(kernel.submits[0]!.submission.kind).toBe("llm_call")
      expect(kernel.submits[0]!.submission.target).toBe(MODEL)
      expect(JSON.parse(kernel.submits[0]!.submission.argsJson)).toEqual(fake.requests[0])
      expect(kernel.recorded()).toEqual({
        status: 200,
        headers: { "content-type": "application/json" },
        body: FakeOpenAi.completionText(MODEL, "effect native")
      })
      const second = yield* createCompletion.pipe(Effect.provide(openAiLayer(fake)), inRun(kernel, 2))
      expect(second.choices[0]?.message.content).toBe("effect native")
      expect(fake.calls).toBe(1)
      expect(kernel.completes).toHaveLength(1)
    }))

  it.effect("tees a streamed completion (deltas published) and replays it", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: LONG_REPLY })
      const kernel = new TestKernel()
      const live = yield* streamCompletion.pipe(Effect.provide(openAiLayer(fake)), inRun(kernel, 1))
      expect(live).toBe(LONG_REPLY)
      const transcript = FakeOpenAi.streamText(MODEL, LONG_REPLY)
      expect(kernel.recorded().body).toBe(transcript)
      expect(kernel.deltas.map((d) => d.seq)).toEqual(kernel.deltas.map((_, i) => i))
      expect(kernel.deltas.map((d) => d.data).join("")).toBe(transcript)
      const deltas = kernel.deltas.length
      const replayed = yield* streamCompletion.pipe(Effect.provide(openAiLayer(fake)), inRun(kernel, 2))
      expect(replayed).toBe(LONG_REPLY)
      expect(fake.calls).toBe(1)
      expect(kernel.deltas).toHaveLength(deltas)
    }))

  it.effect("a denial surfaces as an error that raiseForRefusal turns into PolicyError with the exact reason", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped()
      const kernel = new TestKernel()
      kernel.script.push({ decision: "denied", stepId: "s-1", reason: "models are off today" })
      kernel.script.push({ decision: "denied", stepId: "s-2", reason: "models are off today" })
      const [a, b] = yield* Effect.all([
        Effect.flip(createCompletion),
        Effect.flip(streamCompletion)
      ]).pipe(Effect.provide(openAiLayer(fake)), inRun(kernel))
      for (const error of [a, b]) {
        const refusal = yield* Effect.flip(Llm.raiseForRefusal(error))
        expect(refusal).toBeInstanceOf(PolicyError)
        expect((refusal as PolicyError).reason).toBe("models are off today")
      }
      expect(fake.calls).toBe(0)
    }))

  it.effect("a stream the consumer stops early is recorded once with what was read; a cut stream fails the step", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: LONG_REPLY })
      const kernel = new TestKernel()
      const partial = yield* streamCompletionTake(3).pipe(Effect.provide(openAiLayer(fake)), inRun(kernel))
      expect(LONG_REPLY.startsWith(partial)).toBe(true)
      expect(kernel.completes).toHaveLength(1)
      const full = FakeOpenAi.streamText(MODEL, LONG_REPLY)
      const body = kernel.recorded().body
      expect(full.startsWith(body) && body.length < full.length).toBe(true)

      fake.mode = "cut"
      const cut = new TestKernel()
      yield* Effect.flip(streamCompletion.pipe(Effect.provide(openAiLayer(fake)), inRun(cut)))
      expect(cut.completes).toHaveLength(0)
      expect(cut.fails).toHaveLength(1)
    }))

  it.effect("layerHttpClient records every client built on it", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: "via layer" })
      const kernel = new TestKernel()
      const layer = chatLayer({ apiKey: Redacted.make("sk-test"), apiUrl: fake.url }).pipe(
        Layer.provide(Llm.layerHttpClient),
        Layer.provide(FetchHttpClient.layer)
      )
      const result = yield* createCompletion.pipe(Effect.provide(layer), inRun(kernel))
      expect(result.choices[0]?.message.content).toBe("via layer")
      expect(kernel.completes).toHaveLength(1)
    }))

  it.effect("a kernel client sharing the recording HttpClient is never recorded itself", () =>
    Effect.gen(function*() {
      const paths: Array<string> = []
      const kernelHttp = HttpClient.make((request) =>
        Effect.sync(() => {
          paths.push(new URL(request.url).pathname)
          const body = request.url.endsWith("/steps")
            ? "{\"decision\":\"proceed\",\"step_id\":\"s1\"}"
            : "{\"decision\":\"recorded\"}"
          return HttpClientResponse.fromWeb(
            request,
            new Response(body, { headers: { "content-type": "application/json" } })
          )
        })
      )
      const kernelLayer = KernelClientModule.layer({
        baseUrl: "http://kernel.invalid",
        secret: "secret",
        transformClient: Llm.transformClient
      }).pipe(Layer.provide(Layer.succeed(HttpClient.HttpClient, kernelHttp)))
      const provider: Llm.Fetch = () =>
        Promise.resolve(new Response("{\"ok\":true}", { headers: { "content-type": "application/json" } }))
      const response = yield* Effect.flatMap(
        Llm.makeFetch({ fetch: provider }),
        (fetch) => post(fetch, "http://provider.invalid/v1/chat/completions", JSON.stringify({ model: "m" }))
      ).pipe(
        Effect.provide(Execution.layer({ agentId: "agent", executionId: EXEC, dispatchId: "d1", dispatchAttempt: 1 })),
        Effect.provide(kernelLayer)
      )
      expect(response.text).toBe("{\"ok\":true}")
      expect(paths).toEqual([`/v0/executions/${EXEC}/steps`, `/v0/executions/${EXEC}/steps/s1/complete`])
    }))

  it.effect("outside a run the client passes through", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: "no run" })
      const result = yield* createCompletion.pipe(Effect.provide(openAiLayer(fake)))
      expect(result.choices[0]?.message.content).toBe("no run")
      expect(fake.calls).toBe(1)
    }))
})

// ---------------------------------------------------------------------------
// The refusal decoder and the stream buffer
// ---------------------------------------------------------------------------

describe("Llm.raiseForRefusal", () => {
  const decode = (error: unknown) => Effect.flip(Llm.raiseForRefusal(error))

  it.effect("maps every marker kind", () =>
    Effect.gen(function*() {
      expect(yield* decode(new Error("rebuno_refusal: blocked"))).toBeInstanceOf(Blocked)
      expect(yield* decode(new Error("rebuno_refusal: execution_blocked"))).toBeInstanceOf(Blocked)
      expect(yield* decode(new Error("rebuno_refusal: execution_terminal"))).toBeInstanceOf(Terminated)
      expect(yield* decode(new Error("rebuno_refusal: lease_superseded"))).toBeInstanceOf(LeaseSuperseded)
      expect(yield* decode(new Error("rebuno_refusal: denied"))).toMatchObject({ _tag: "PolicyError", reason: "policy_denied" })
      expect(yield* decode(new Error("rebuno_refusal: rate_limited"))).toMatchObject({
        _tag: "RateLimited",
        reason: "rate_limit_exceeded"
      })
      expect(yield* decode(new Error("rebuno_refusal: rate_limited reason=rate_limiter_unavailable"))).toMatchObject({
        reason: "rate_limiter_unavailable"
      })
    }))

  it.effect("trims trailing quotes, braces and spaces from the reason and stops at a newline", () =>
    Effect.gen(function*() {
      const json = `403 {"error":{"type":"rebuno_refusal","message":"rebuno_refusal: denied reason=no pii allowed"}}  `
      expect(yield* decode(new Error(json))).toMatchObject({ reason: "no pii allowed" })
      expect(yield* decode(new Error("x rebuno_refusal: denied reason='it is late' \nmore"))).toMatchObject({
        reason: "'it is late"
      })
    }))

  it.effect("walks up to 10 levels of cause", () =>
    Effect.gen(function*() {
      const nest = (levels: number) => {
        let error: Error = new Error("rebuno_refusal: denied reason=deep")
        for (let i = 0; i < levels; i++) error = new Error(`wrapper ${i}`, { cause: error })
        return error
      }
      expect(yield* decode(nest(10))).toMatchObject({ reason: "deep" })
      yield* Llm.raiseForRefusal(nest(11))
    }))

  it.effect("succeeds when there is no marker; strings and typed errors count", () =>
    Effect.gen(function*() {
      yield* Llm.raiseForRefusal(new Error("plain failure"))
      yield* Llm.raiseForRefusal(undefined)
      yield* Llm.raiseForRefusal({ message: 42 })
      expect(yield* decode("rebuno_refusal: blocked")).toBeInstanceOf(Blocked)
      const typed = new RateLimited({ reason: "rate_limit_exceeded" })
      expect(yield* decode(new Error("wrapped", { cause: typed }))).toBe(typed)
    }))

  it.effect("records a signal on the run when inside one", () =>
    Effect.gen(function*() {
      const kernel = new TestKernel()
      const signal = yield* Effect.gen(function*() {
        yield* Effect.flip(Llm.raiseForRefusal(new Error("rebuno_refusal: execution_terminal")))
        return Option.getOrUndefined(yield* Execution.signal)
      }).pipe(inRun(kernel))
      expect(signal).toBeInstanceOf(Terminated)
    }))

  it("refusalBody and constants", () => {
    expect(Llm.refusalBody("denied", "x")).toBe(
      "{\"error\":{\"type\":\"rebuno_refusal\",\"message\":\"rebuno_refusal: denied reason=x\"}}"
    )
    expect(Llm.refusalBody("blocked")).toBe("{\"error\":{\"type\":\"rebuno_refusal\",\"message\":\"rebuno_refusal: blocked\"}}")
    expect([Llm.flushChars, Llm.flushIntervalMillis, Llm.maxDeltaChars]).toEqual([2000, 50, 1750])
  })
})

describe("stream buffer", () => {
  it("decodes characters split across chunks", () => {
    const bytes = new TextEncoder().encode("aé😀b")
    const buffer = new DeltaBuffer(0)
    for (const byte of bytes) buffer.push(new Uint8Array([byte]))
    buffer.end()
    expect(buffer.transcript).toBe("aé😀b")
    expect(buffer.take(0, true)).toEqual([{ seq: 0, data: "aé😀b" }])
  })

  it("flushes at 2000 pending characters or 50 ms, cutting at 1750 on code-point boundaries", () => {
    const buffer = new DeltaBuffer(0)
    buffer.push(new TextEncoder().encode("x".repeat(1999)))
    expect(buffer.take(49, false)).toEqual([])
    expect(buffer.take(50, false).map((d) => [d.seq, d.data.length])).toEqual([[0, 1750], [1, 249]])
    buffer.push(new TextEncoder().encode("y".repeat(1749) + "😀" + "z".repeat(10)))
    const deltas = buffer.take(100, false)
    expect(deltas.map((d) => [d.seq, d.data.length])).toEqual([[2, 1749], [3, 12]])
    expect(deltas[1]!.data.startsWith("😀")).toBe(true)
  })

  it("cutDeltas never splits a surrogate pair", () => {
    const text = "😀".repeat(2000)
    const pieces = cutDeltas(text)
    expect(pieces.join("")).toBe(text)
    expect(pieces.every((p) => p.length <= 1750 && p.length % 2 === 0)).toBe(true)
  })
})

// ---------------------------------------------------------------------------
// Usage (PROTOCOL-CURRENT C.8.5)
// ---------------------------------------------------------------------------

/**
 * The kernel's usage extraction of C.8.5, written from the text: the result's
 * non-empty string `body` (else the result), parsed as JSON or else as SSE
 * `data:` lines; every object walked; the largest number per direction.
 */
const extractUsage = (resultJson: string): { readonly input: number; readonly output: number } | undefined => {
  const INPUT = ["prompt_tokens", "input_tokens", "inputTokens", "promptTokenCount", "prompt_eval_count"]
  const OUTPUT = ["completion_tokens", "output_tokens", "outputTokens", "candidatesTokenCount", "eval_count"]
  const result = JSON.parse(resultJson) as unknown
  const body = typeof result === "object" && result !== null && typeof (result as { body?: unknown }).body === "string" &&
      (result as { body: string }).body !== ""
    ? (result as { body: string }).body
    : undefined
  let values: Array<unknown> = []
  if (body === undefined) values = [result]
  else {
    try {
      values = [JSON.parse(body)]
    } catch {
      for (const line of body.split("\n")) {
        if (!line.startsWith("data:")) continue
        try {
          values.push(JSON.parse(line.slice("data:".length)))
        } catch {
          // not JSON: skipped
        }
      }
    }
  }
  let input = 0
  let output = 0
  const walk = (u: unknown): void => {
    if (Array.isArray(u)) return u.forEach(walk)
    if (typeof u !== "object" || u === null) return
    for (const [key, value] of Object.entries(u)) {
      if (typeof value === "number" && INPUT.includes(key)) input = Math.max(input, value)
      else if (typeof value === "number" && OUTPUT.includes(key)) output = Math.max(output, value)
      else walk(value)
    }
  }
  values.forEach(walk)
  return input > 0 || output > 0 ? { input, output } : undefined
}

/** An OpenAI-style server whose streamed answer ends with a usage chunk (`stream_options.include_usage`). */
const usageStreamServer = Effect.acquireRelease(
  Effect.callback<{ readonly url: string; readonly close: () => void }>((resume) => {
    const server = createServer((_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" })
      res.write("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n")
      res.write("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":7,\"total_tokens\":18}}\n\n")
      res.end("data: [DONE]\n\n")
    })
    server.listen(0, "127.0.0.1", () =>
      resume(Effect.succeed({
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/chat/completions`,
        close: () => server.close()
      })))
  }),
  (server) => Effect.sync(server.close)
)

describe("LLM usage is recorded where the kernel reads it (PROTOCOL-CURRENT C.8.5)", () => {
  it.effect("makeFetch and transformClient: the recorded body keeps the provider's usage", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: "with usage" })
      const viaFetch = new TestKernel()
      yield* Effect.flatMap(Llm.makeFetch(), (fetch) => askText(openai(fake, fetch))).pipe(inRun(viaFetch))
      const viaClient = new TestKernel()
      yield* createCompletion.pipe(Effect.provide(openAiLayer(fake)), inRun(viaClient))
      for (const kernel of [viaFetch, viaClient]) {
        expect(JSON.parse(kernel.recorded().body).usage).toEqual({ prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 })
        expect(extractUsage(kernel.completes[0]!.json)).toEqual({ input: 3, output: 5 })
      }
    }))

  it.effect("a streamed answer: the recorded transcript keeps the usage chunk", () =>
    Effect.gen(function*() {
      const server = yield* usageStreamServer
      const kernel = new TestKernel()
      const answer = yield* Effect.flatMap(Llm.makeFetch(), (fetch) =>
        post(fetch, server.url, JSON.stringify({ model: MODEL, stream: true, stream_options: { include_usage: true } }))).pipe(
          inRun(kernel)
        )
      expect(answer.status).toBe(200)
      expect(kernel.recorded().body).toContain("\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":7")
      expect(extractUsage(kernel.completes[0]!.json)).toEqual({ input: 11, output: 7 })
    }))

  it.effect("a denial's rule_id reaches the PolicyError of a refused LLM call (C.8.4)", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped()
      const kernel = new TestKernel()
      kernel.script.push({ decision: "denied", stepId: "s-1", reason: "budget", ruleId: "token-budget" })
      const error = yield* Effect.flip(createCompletion).pipe(Effect.provide(openAiLayer(fake)), inRun(kernel))
      const refusal = yield* Effect.flip(Llm.raiseForRefusal(error))
      expect(refusal).toBeInstanceOf(PolicyError)
      expect(refusal).toMatchObject({ reason: "budget" })
      // the refusal answer is what the provider client sees: 403 with the C.12 body
      expect(fake.calls).toBe(0)
    }))

  it.effect("rate-limit parking (blocked without approval_id): 403 blocked, and the run is Blocked with the reason", () =>
    Effect.gen(function*() {
      const kernel = new TestKernel()
      kernel.script.push({ decision: "blocked", reason: "rate_limit_exceeded" })
      const program = Effect.gen(function*() {
        const fetch = yield* Llm.makeFetch({ fetch: () => Promise.reject(new Error("must not be called")) })
        const answer = yield* post(fetch, "http://provider.invalid/v1/chat/completions", JSON.stringify({ model: MODEL }))
        return { answer, signal: yield* Execution.signal }
      })
      const { answer, signal } = yield* program.pipe(inRun(kernel))
      expect(answer).toEqual({
        status: 403,
        type: "application/json",
        text: "{\"error\":{\"type\":\"rebuno_refusal\",\"message\":\"rebuno_refusal: blocked\"}}"
      })
      expect(Option.getOrUndefined(signal)).toMatchObject({ _tag: "Blocked", reason: "rate_limit_exceeded" })
    }))
})

describe("replay-aware logging counts LLM calls (issue 13)", () => {
  /** The handler's logging around one recorded LLM call, behind the run's replay tracker. */
  const logged = (kernel: TestKernel, fake: FakeOpenAi.FakeOpenAi, attempt: number) => {
    const lines: Array<string> = []
    const capture = Logger.make<unknown, void>((options) => {
      const marked = options.fiber.getRef(References.CurrentLogAnnotations)["rebuno.replaying"] === true
      lines.push(`${marked ? "[replaying] " : ""}${String(Array.isArray(options.message) ? options.message[0] : options.message)}`)
    })
    return Effect.gen(function*() {
      const execution = yield* Execution.Execution
      const tracker = ReplayLog.track(execution.kernel, "mark")
      yield* Effect.gen(function*() {
        yield* Effect.log("asking")
        yield* createCompletion
        yield* Effect.log("answered")
      }).pipe(
        Effect.provideService(Logger.CurrentLoggers, ReplayLog.wrapLoggers(tracker, new Set([capture]))),
        Effect.ensuring(Effect.sync(() => tracker.end()))
      )
      return lines
    }).pipe(Effect.provide(openAiLayer(fake)), inRun(kernel, attempt))
  }

  it.effect("a replayed llm_call makes the lines around it replayed lines; a live one does not", () =>
    Effect.gen(function*() {
      const fake = yield* FakeOpenAi.scoped({ reply: "hi" })
      const kernel = new TestKernel()
      expect(yield* logged(kernel, fake, 1)).toEqual(["asking", "answered"])
      expect(yield* logged(kernel, fake, 2)).toEqual(["[replaying] asking", "[replaying] answered"])
      expect(fake.calls).toBe(1)
    }))
})
