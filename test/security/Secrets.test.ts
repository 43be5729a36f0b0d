/**
 * Secrets never leak (PROTOCOL 3; the agent secret signs every request and
 * verifies every webhook, the API key authorises the client). An agent runs end
 * to end against the test kernel over the exact HTTP wire, and again against
 * kernels that fail in every way (connection refused, 5xx, 4xx, garbage
 * answers), with every log record (all levels) and every span captured. The
 * secret — as text, hex or base64 — must not appear in any log message, cause
 * or annotation, any span name, attribute, event or exit, any error's
 * `message`, `String(…)`, `JSON.stringify(…)` or inspection, nor in the
 * `ConfigError`s of the `KernelClient` / `Client` layers. Secrets are held as
 * `Redacted` by the clients.
 *
 * A `sha256=` signature of the empty body is also a credential here: the
 * scheme signs only the body, so that one value authorises every GET and every
 * heartbeat of the agent for any execution. It must not be recorded either.
 */
import { NodeHttpClient } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import {
  Cause,
  ConfigProvider,
  Context,
  Effect,
  Exit,
  Fiber,
  Layer,
  Logger,
  Redacted,
  References,
  Result,
  Schema,
  Tracer
} from "effect"
import { HttpClient, HttpClientResponse } from "effect/http"
import { TestClock } from "effect/testing"
import * as Net from "node:net"
import * as Util from "node:util"
import * as Agent from "../../src/Agent.js"
import * as Client from "../../src/Client.js"
import * as KernelClient from "../../src/KernelClient.js"
import * as Signature from "../../src/Signature.js"
import * as Tool from "../../src/Tool.js"
import { TestKernel } from "../../src/testing/index.js"

const SECRET = "s3cr3t-Agent-Key-Do-Not-Leak"
const API_KEY = "api-K3y-Do-Not-Leak"

/** Every spelling of a secret that would give it away. */
const spellings = (secret: string): ReadonlyArray<string> => [
  secret,
  Buffer.from(secret).toString("hex"),
  Buffer.from(secret).toString("base64"),
  encodeURIComponent(secret),
  JSON.stringify(secret).slice(1, -1)
]

const safeJson = (value: unknown): string => {
  try {
    const seen = new WeakSet<object>()
    return JSON.stringify(value, (_k, v) => {
      if (typeof v === "bigint") return v.toString()
      if (typeof v === "object" && v !== null) {
        if (seen.has(v)) return "[cycle]"
        seen.add(v)
      }
      return v
    }) ?? ""
  } catch (e) {
    return `[unserialisable: ${String(e)}]`
  }
}

/** Every rendering of a value a log sink, an exporter or a developer could produce. */
const renderings = (value: unknown): string => {
  const parts: Array<string> = []
  try {
    parts.push(String(value))
  } catch {
    // objects without a string form
  }
  parts.push(safeJson(value))
  parts.push(Util.inspect(value, { depth: 12, showHidden: true, getters: true }))
  if (value instanceof Error) {
    parts.push(value.message, value.stack ?? "")
    if ("cause" in value) parts.push(renderings((value as { cause?: unknown }).cause))
  }
  if (Cause.isCause(value)) parts.push(Cause.pretty(value))
  return parts.join("\n")
}

const expectNoSecret = (where: string, text: string, secrets: ReadonlyArray<string>) => {
  for (const secret of secrets) {
    for (const spelling of spellings(secret)) {
      if (text.includes(spelling)) {
        throw new Error(`${where} contains a secret (${JSON.stringify(spelling)}):\n${text.slice(0, 2000)}`)
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Capturing logs and spans
// ---------------------------------------------------------------------------

interface LogRecord {
  readonly level: string
  readonly message: unknown
  readonly cause: Cause.Cause<unknown>
  readonly annotations: ReadonlyArray<readonly [string, unknown]>
  readonly spans: ReadonlyArray<string>
}

interface SpanRecord {
  readonly name: string
  readonly attributes: Map<string, unknown>
  readonly events: Array<{ readonly name: string; readonly attributes: Record<string, unknown> | undefined }>
  exit: Exit.Exit<unknown, unknown> | undefined
}

const makeCapture = () => {
  const logs: Array<LogRecord> = []
  const spans: Array<SpanRecord> = []
  const logger = Logger.make<unknown, void>((options) => {
    logs.push({
      level: options.logLevel,
      message: options.message,
      cause: options.cause,
      annotations: Object.entries(options.fiber.getRef(References.CurrentLogAnnotations)),
      spans: options.fiber.getRef(References.CurrentLogSpans).map(([label]) => label)
    })
  })
  let ids = 0
  const tracer = Tracer.make({
    span: ({ annotations, kind, links, name, parent, startTime }) => {
      const record: SpanRecord = { name, attributes: new Map(), events: [], exit: undefined }
      spans.push(record)
      const spanId = String(++ids)
      const span: Tracer.Span = {
        _tag: "Span",
        name,
        spanId,
        traceId: "trace",
        parent,
        annotations,
        get status(): Tracer.SpanStatus {
          return record.exit === undefined
            ? { _tag: "Started", startTime }
            : { _tag: "Ended", startTime, endTime: startTime, exit: record.exit }
        },
        attributes: record.attributes,
        links: [...links],
        sampled: true,
        kind,
        end: (_endTime, exit) => {
          record.exit = exit
        },
        attribute: (key, value) => {
          record.attributes.set(key, value)
        },
        event: (eventName, _time, attributes) => {
          record.events.push({ name: eventName, attributes })
        },
        addLinks: () => {}
      }
      return span
    }
  })
  const layer = Layer.mergeAll(
    Logger.layer([logger]),
    Layer.succeed(References.MinimumLogLevel, "All"),
    Layer.succeed(Tracer.Tracer, tracer)
  )
  const assertClean = (secrets: ReadonlyArray<string>) => {
    for (const log of logs) {
      expectNoSecret(`log message (${log.level})`, renderings(log.message), secrets)
      expectNoSecret(`log cause (${log.level})`, renderings(log.cause), secrets)
      for (const [key, value] of log.annotations) expectNoSecret(`log annotation ${key}`, key + renderings(value), secrets)
      expectNoSecret("log span labels", log.spans.join(" "), secrets)
    }
    for (const span of spans) {
      expectNoSecret(`span name ${span.name}`, span.name, secrets)
      for (const [key, value] of span.attributes) expectNoSecret(`span ${span.name} attribute ${key}`, key + renderings(value), secrets)
      for (const event of span.events) expectNoSecret(`span ${span.name} event ${event.name}`, event.name + renderings(event.attributes), secrets)
      if (span.exit !== undefined && Exit.isFailure(span.exit)) {
        // What an exporter records of a failed span: the pretty cause (messages and stacks).
        expectNoSecret(`span ${span.name} exit`, Cause.pretty(span.exit.cause), secrets)
      }
    }
  }
  return { logs, spans, layer, assertClean }
}

// ---------------------------------------------------------------------------
// An agent that exercises every kind of call
// ---------------------------------------------------------------------------

const lookup = Tool.make("lookup", {
  args: Schema.Struct({ q: Schema.String }),
  success: Schema.Struct({ hit: Schema.String }),
  execute: ({ q }) => Effect.succeed({ hit: q.toUpperCase() })
})

const broken = Tool.make("broken", {
  args: Schema.Struct({ q: Schema.String }),
  success: Schema.String,
  execute: () => Effect.fail(new Error("the tool broke"))
})

const researcher = Agent.make({
  id: "researcher",
  input: Schema.Struct({ q: Schema.String }),
  handler: ({ q }) =>
    Effect.gen(function*() {
      const { hit } = yield* lookup({ q })
      yield* Effect.logDebug("looked up", hit)
      const failed = yield* Effect.result(broken({ q }))
      return { hit, failed: Result.isFailure(failed) }
    })
})

const failing = Agent.make({
  id: "quitter",
  handler: (): Effect.Effect<void, Error> => Effect.fail(new Error("handler gave up"))
})

/** The empty-body `sha256=` signature: it authorises GETs and heartbeats. */
const emptyBodySignature = Effect.runSync(Effect.result(Signature.sign(SECRET, ""))).pipe((e) =>
  Result.isSuccess(e) ? e.success : ""
)

describe("secrets never leak", () => {
  it.effect("end to end over the HTTP wire (TestKernel transport: http)", () => {
    const capture = makeCapture()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const ok = yield* kernel.run(researcher, { q: "hello" })
      expect(ok.status).toBe("completed")
      expect(ok.output).toEqual({ hit: "HELLO", failed: true })
      yield* kernel.register(failing)
      const ko = yield* kernel.run(failing, {})
      expect(ko.status).toBe("failed")
      // The client's admin calls carry secrets too (register sends the agent secret).
      const client = yield* Client.Client
      yield* client.registerAgent({ id: "other", webhookUrl: "http://x.invalid/webhook", secret: Redacted.make(SECRET) })
      const listed = yield* client.listAgents()
      expectNoSecret("agent list", renderings(listed), [SECRET])
      const missing = yield* Effect.flip(client.getAgent("nobody"))
      expectNoSecret("client error", renderings(missing), [SECRET])

      expect(capture.logs.length + capture.spans.length).toBeGreaterThan(0)
      capture.assertClean([SECRET, emptyBodySignature])
    }).pipe(
      Effect.provide(TestKernel.layer({ agents: [researcher], transport: "http", secret: SECRET })),
      Effect.provide(capture.layer)
    )
  })

  it.effect("against failing kernels: errors, logs and spans stay clean", () => {
    const capture = makeCapture()
    return Effect.gen(function*() {
      const executionId = "0192f1a0-0000-7000-8000-000000000001"
      const caller: KernelClient.Caller = {
        agentId: "researcher",
        lease: { dispatchId: "0192f1a0-0000-7000-8000-0000000000d1", attempt: 1 }
      }
      // A kernel that answers everything badly, echoing the request headers back in its error bodies.
      let mode: "500" | "401" | "garbage" | "echo" = "500"
      const scripted = HttpClient.make((request) =>
        Effect.succeed(
          HttpClientResponse.fromWeb(
            request,
            mode === "500"
              ? new Response("{\"code\":\"internal_error\",\"message\":\"boom\"}", { status: 500 })
              : mode === "401"
              ? new Response("{\"code\":\"unauthorized\",\"message\":\"unauthorized\"}", { status: 401 })
              : mode === "garbage"
              ? new Response("<html>not json</html>", { status: 200 })
              : new Response(JSON.stringify({ code: "weird", message: "you sent " + JSON.stringify(Object.keys(request.headers)) }), { status: 418 })
          )
        )
      )
      const closedPort = yield* Effect.promise(() =>
        new Promise<number>((resolve) => {
          const probe = Net.createServer()
          probe.listen(0, "127.0.0.1", () => {
            const port = (probe.address() as Net.AddressInfo).port
            probe.close(() => resolve(port))
          })
        })
      )
      const clients = [
        yield* KernelClient.make({ baseUrl: "http://kernel.test", secret: Redacted.make(SECRET) }).pipe(
          Effect.provideService(HttpClient.HttpClient, scripted)
        ),
        yield* KernelClient.make({ baseUrl: "http://kernel.test", secret: SECRET, signing: "v1" }).pipe(
          Effect.provideService(HttpClient.HttpClient, scripted)
        ),
        yield* KernelClient.make({ baseUrl: `http://127.0.0.1:${closedPort}`, secret: Redacted.make(SECRET), timeout: "2 seconds" }).pipe(
          Effect.provide(NodeHttpClient.layerUndici)
        )
      ]
      const errors: Array<unknown> = []
      const collect = <A, E>(effect: Effect.Effect<A, E>) =>
        Effect.gen(function*() {
          // Retries back off on the clock: move it until the call settles.
          const fiber = yield* Effect.forkChild(Effect.exit(effect))
          for (let i = 0; i < 50; i++) {
            if (fiber.pollUnsafe() !== undefined) break
            yield* TestClock.adjust("500 millis")
            yield* Effect.promise(() => new Promise((r) => setTimeout(r, 2)))
          }
          const exit = yield* Fiber.join(fiber)
          if (Exit.isFailure(exit)) errors.push(Cause.squash(exit.cause), exit.cause)
        })
      for (const client of clients) {
        for (const m of ["500", "401", "garbage", "echo"] as const) {
          mode = m
          yield* collect(client.getExecution(caller, executionId))
          yield* collect(client.submitStep(caller, executionId, {
            kind: "tool_call",
            target: "lookup",
            argsJson: "{\"q\":\"x\"}",
            idempotency: "safe_to_retry"
          }))
          yield* collect(client.completeStep(caller, executionId, "ab".repeat(32), "{}"))
          yield* collect(client.failStep(caller, executionId, "ab".repeat(32), "nope"))
          yield* collect(client.heartbeat(caller, executionId))
          yield* collect(client.completeExecution(caller, executionId, "{}"))
          yield* collect(client.failExecution(caller, executionId, "why"))
        }
        // The service holds the secret only as Redacted.
        expect(Redacted.isRedacted(client.secret)).toBe(true)
        expectNoSecret("KernelClient service", renderings(client), [SECRET])
      }
      expect(errors.length).toBeGreaterThan(20)
      for (const error of errors) expectNoSecret("kernel error", renderings(error), [SECRET, emptyBodySignature])

      // Whole runs against kernels that fail in the middle: the webhook is accepted,
      // then reads, heartbeats and outcome posts fail and are logged.
      const execution = JSON.stringify({
        id: executionId,
        agent_id: "researcher",
        input: { q: "x" },
        status: "running",
        created_at: "2026-01-01T00:00:00Z",
        updated_at: "2026-01-01T00:00:00Z"
      })
      let readStatus = 200
      const midway = HttpClient.make((request) => {
        const path = new URL(request.url).pathname
        const answer = (status: number, body: string) =>
          Effect.succeed(HttpClientResponse.fromWeb(request, new Response(status === 204 ? null : body, { status })))
        if (request.method === "GET") {
          return readStatus === 200
            ? answer(200, execution)
            : answer(readStatus, "{\"code\":\"unauthorized\",\"message\":\"unauthorized\"}")
        }
        if (path.endsWith("/steps")) return answer(200, "{\"decision\":\"proceed\",\"step_id\":\"" + "ab".repeat(32) + "\"}")
        if (path.includes("/steps/")) return answer(200, "{\"decision\":\"recorded\"}")
        if (path.endsWith("/heartbeat")) return answer(503, "overloaded")
        return answer(400, "{\"code\":\"validation_error\",\"message\":\"validation error\"}")
      })
      const midwayClient = yield* KernelClient.make({ baseUrl: "http://kernel.test", secret: Redacted.make(SECRET) }).pipe(
        Effect.provideService(HttpClient.HttpClient, midway)
      )
      for (const [client, status] of [[clients[2]!, 200], [midwayClient, 200], [midwayClient, 401]] as const) {
        readStatus = status
        const runtime = yield* Agent.runtime(researcher).pipe(Effect.provideService(KernelClient.KernelClient, client))
        const body = new TextEncoder().encode(
          JSON.stringify({ execution_id: executionId, dispatch_id: caller.lease.dispatchId, dispatch_attempt: 1, lease_timeout_seconds: 3 })
        )
        const signature = yield* Signature.sign(SECRET, body)
        expect(yield* runtime.handleWebhook({ body, signature })).toBe(200)
        expect(yield* runtime.handleWebhook({ body, signature })).toBe(200) // duplicate
        expect(yield* runtime.handleWebhook({ body, signature: "sha256=00" })).toBe(401)
        for (let i = 0; i < 50 && (yield* runtime.activeRuns) > 0; i++) {
          yield* TestClock.adjust("500 millis")
          yield* Effect.promise(() => new Promise((r) => setTimeout(r, 2)))
        }
        expect(yield* runtime.activeRuns).toBe(0)
      }

      expect(capture.logs.length).toBeGreaterThan(0)
      expect(capture.spans.some((s) => s.name.startsWith("KernelClient."))).toBe(true)
      capture.assertClean([SECRET, emptyBodySignature])
    }).pipe(Effect.provide(capture.layer))
  })

  it.effect("layer config errors never show the secret or the API key", () =>
    Effect.gen(function*() {
      const cases: ReadonlyArray<readonly [string, ReadonlyArray<readonly [string, string]>]> = [
        ["bad URL", [["REBUNO_URL", "not a url " + SECRET], ["REBUNO_AGENT_SECRET", SECRET], ["REBUNO_API_KEY", API_KEY]]],
        ["ftp URL", [["REBUNO_URL", "ftp://kernel"], ["REBUNO_AGENT_SECRET", SECRET], ["REBUNO_API_KEY", API_KEY]]],
        ["no URL", [["REBUNO_AGENT_SECRET", SECRET], ["REBUNO_API_KEY", API_KEY]]],
        ["URL with query", [["REBUNO_URL", "http://kernel?x=1"], ["REBUNO_AGENT_SECRET", SECRET], ["REBUNO_API_KEY", API_KEY]]]
      ]
      const httpLayer = Layer.succeed(HttpClient.HttpClient, HttpClient.make(() => Effect.die("never called")))
      for (const [name, env] of cases) {
        const provider = ConfigProvider.fromUnknown(Object.fromEntries(env), { preserveEmptyStrings: true })
        const kernelError = yield* Layer.build(KernelClient.layerConfig().pipe(Layer.provide(httpLayer))).pipe(
          Effect.scoped,
          Effect.provideService(ConfigProvider.ConfigProvider, provider),
          Effect.flip
        )
        const clientError = yield* Layer.build(Client.layerConfig().pipe(Layer.provide(httpLayer))).pipe(
          Effect.scoped,
          Effect.provideService(ConfigProvider.ConfigProvider, provider),
          Effect.flip
        )
        // The URL may be echoed (it is not a secret), but the secret that sits
        // next to it in the environment must not be.
        const secrets = name === "bad URL" ? [API_KEY] : [SECRET, API_KEY]
        expectNoSecret(`KernelClient ${name}`, renderings(kernelError) + renderings(Cause.fail(kernelError)), secrets)
        expectNoSecret(`Client ${name}`, renderings(clientError) + renderings(Cause.fail(clientError)), secrets)
      }
      // A valid environment: both layers build, reading the plain environment
      // strings into Redacted values (a secret read as a string must still end
      // up Redacted, not be refused with an error that shows it).
      const valid = ConfigProvider.fromUnknown(
        { REBUNO_URL: "http://kernel", REBUNO_AGENT_SECRET: SECRET, REBUNO_API_KEY: API_KEY },
        { preserveEmptyStrings: true }
      )
      const fromEnv = yield* Layer.build(KernelClient.layerConfig().pipe(Layer.provide(httpLayer))).pipe(
        Effect.map((context) => Context.get(context, KernelClient.KernelClient)),
        Effect.provideService(ConfigProvider.ConfigProvider, valid)
      )
      expect(Redacted.isRedacted(fromEnv.secret)).toBe(true)
      expect(Redacted.value(fromEnv.secret)).toBe(SECRET)
      expectNoSecret("KernelClient service from the environment", renderings(fromEnv), [SECRET])
      const clientFromEnv = yield* Layer.build(Client.layerConfig().pipe(Layer.provide(httpLayer))).pipe(
        Effect.map((context) => Context.get(context, Client.Client)),
        Effect.provideService(ConfigProvider.ConfigProvider, valid)
      )
      expectNoSecret("Client service from the environment", renderings(clientFromEnv), [API_KEY])
      // Options: a plain string secret is wrapped in Redacted; make() errors do not show it.
      const optionError = yield* KernelClient.make({ baseUrl: "mailto:x", secret: SECRET }).pipe(
        Effect.provideService(HttpClient.HttpClient, HttpClient.make(() => Effect.die("never"))),
        Effect.flip
      )
      expectNoSecret("KernelClient.make error", renderings(optionError), [SECRET])
      const service = yield* KernelClient.make({ baseUrl: "http://kernel", secret: SECRET }).pipe(
        Effect.provideService(HttpClient.HttpClient, HttpClient.make(() => Effect.die("never")))
      )
      expect(Redacted.isRedacted(service.secret)).toBe(true)
      expect(String(service.secret)).not.toContain(SECRET)
      expect(JSON.stringify(service.secret)).not.toContain(SECRET)
      expectNoSecret("KernelClient service", renderings(service) + renderings(Context.make(KernelClient.KernelClient, service)), [SECRET])
      const client = yield* Client.make({ baseUrl: "http://kernel", apiKey: API_KEY }).pipe(
        Effect.provideService(HttpClient.HttpClient, HttpClient.make(() => Effect.die("never")))
      )
      expectNoSecret("Client service", renderings(client), [API_KEY])
    }))
})
