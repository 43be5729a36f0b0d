/**
 * The official Python SDK 0.29.2, unmodified, against the embedded kernel in
 * its current stage (PROTOCOL-CURRENT) over real HTTP: the surface that
 * PythonSdk.test.ts leaves out.
 *
 * - the whole public `Client` (create with sessions, parents, idempotency keys
 *   and `spawned_by`; get; events with `after_seq`/`limit`, followed while a run
 *   goes and paged past the 1000 cap; cancel; fork; steps list/get; approvals
 *   list/get/grant/deny) and every error class it maps, with bearer tokens
 *   and scoped API keys on a kernel with `apiToken`;
 * - the agent side: the execution context, `step()`, `@tool`, `wrap_tool`,
 *   the MCP wrappers, LLM calls through `http_client()` (plain, streamed with
 *   live deltas, refused, replayed in a fork, over a token budget),
 *   `raise_for_refusal`, `failure_reason`, `previous()`, `Result`,
 *   `subagent()` (a failing child, a cancelled parent, an API-keyed client),
 *   a Pydantic-typed handler on its own webhook path;
 * - how a Python agent sees a denied or expired approval, a cancel while it
 *   runs (released → `Terminated`; hanging → the heartbeat's
 *   `lease_superseded` cancels it) and a cancel while it is parked.
 *
 * The Python side is test/python/client_agent.py, client_typed.py (agents) and
 * client_driver.py (the client, one scenario per run). Every port is a free
 * one picked at start.
 * Skipped when there is no python3 (or REBUNO_PYTHON).
 */
import { expect, layer } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Redacted } from "effect"
import type { Scope } from "effect"
import type { Client } from "effect-rebuno"
import * as Kernel from "effect-rebuno/kernel"
import * as ChildProcess from "node:child_process"
import * as Fs from "node:fs"
import * as Http from "node:http"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import { describe } from "vitest"
import * as Embedded from "../support/embedded.js"
import {
  freePort,
  type PythonAgent,
  recordingProxy,
  type RecordingProxy,
  runScript,
  startAgent,
  venvPython
} from "../support/pythonSdk.js"

type Json = any

/** The ports of the test's servers, picked free at start. */
interface Ports {
  readonly kernel: number
  readonly authKernel: number
  readonly surface: number
  readonly typed: number
  readonly llm: number
  readonly blackhole: number
  /** Nothing listens there. */
  readonly refused: number
}

const freePorts: Effect.Effect<Ports> = Effect.gen(function*() {
  const ports = []
  for (let i = 0; i < 7; i++) ports.push(yield* freePort)
  const [kernel, authKernel, surface, typed, llm, blackhole, refused] = ports as [
    number, number, number, number, number, number, number
  ]
  return { kernel, authKernel, surface, typed, llm, blackhole, refused }
})

const BOOTSTRAP = "boot-token-for-the-python-client-test"

const hasPython = ChildProcess.spawnSync(process.env["REBUNO_PYTHON"] ?? "python3", ["--version"]).status === 0

const SURFACE_POLICY = [
  "default_action: allow",
  "rules:",
  "  - id: no-forbidden",
  "    when: { target: forbidden }",
  "    then: { decision: deny, reason: forbidden is off }",
  "  - id: no-model",
  "    when: { target: forbidden-model }",
  "    then: { decision: deny, reason: model not allowed }",
  "  - id: gate-deploy",
  "    when: { target: deploy }",
  "    then:",
  "      decision: require_approval",
  "      approval_config: { approvers: [alice], timeout: 10m, message: \"Deploy?\" }",
  "  - id: gate-fast",
  "    when: { target: deploy_fast }",
  "    then:",
  "      decision: require_approval",
  "      approval_config: { timeout: 1s }",
  "  - id: ping-park",
  "    when: { target: ping }",
  "    then: { decision: allow, rate_limit: { max_calls: 1, window: 2s, max_wait: 3s } }",
  "  - id: limited",
  "    when: { target: limited }",
  "    then: { decision: allow, rate_limit: { max_calls: 1, window: 1m } }",
  "  - id: budget",
  "    when: { target: budget-1 }",
  "    then: { decision: allow, budget: { max_tokens: 5 } }",
  ""
].join("\n")

// --- an OpenAI-like server, a silent server ----------------------------------

/** The SSE text of a streamed reply of `n` parts. */
const streamText = (n: number) => {
  let out = ""
  for (let i = 0; i < n; i++) out += `data: ${JSON.stringify({ choices: [{ delta: { content: `part-${i} é🙂 ` } }] })}\n\n`
  out += `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 7, completion_tokens: 11 } })}\n\n`
  return out + "data: [DONE]\n\n"
}
const completion = (model: string) =>
  JSON.stringify({
    id: "chatcmpl-1",
    model,
    choices: [{ message: { role: "assistant", content: "hello" } }],
    usage: { prompt_tokens: 3, completion_tokens: 5 }
  })
/** What `gated-big` streams: one 1800-emoji chunk (the first delta is 1750 of them, 7000 bytes) and ASCII. */
const BIG = "🙂".repeat(1800) + "x".repeat(3000) + "data: [DONE]\n\n"

interface FakeLlm {
  readonly url: string
  readonly calls: () => number
  /** Holds `gated-*` streams until {@link open}. */
  readonly close: () => void
  readonly open: () => void
}

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

const fakeLlm = (port: number): Effect.Effect<FakeLlm, never, Scope.Scope> => {
  let calls = 0
  let release = () => {}
  let gate = Promise.resolve()
  const server = Http.createServer(async (req, res) => {
    let text = ""
    for await (const chunk of req) text += chunk
    calls++
    const body = JSON.parse(text || "{}")
    if (body.stream !== true) {
      res.writeHead(200, { "content-type": "application/json" })
      return res.end(completion(body.model))
    }
    // (headers too: the SDK's first delta flush then sees the whole first chunk at once)
    if (String(body.model).startsWith("gated-")) await gate
    res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8" })
    if (body.model === "gated-big") {
      res.write(BIG.slice(0, -"data: [DONE]\n\n".length))
      await pause(100)
      return res.end("data: [DONE]\n\n")
    }
    const parts = streamText(12).split(/(?<=\n\n)/)
    for (const part of parts) {
      res.write(part)
      await pause(30)
    }
    res.end()
  })
  return Effect.acquireRelease(
    Effect.callback<FakeLlm>((resume) => {
      server.listen(port, "127.0.0.1", () =>
        resume(Effect.succeed({
          url: `http://127.0.0.1:${port}/v1`,
          calls: () => calls,
          close: () => {
            gate = new Promise<void>((resolve) => (release = resolve))
          },
          open: () => release()
        })))
    }),
    () =>
      Effect.callback<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  )
}

/** Accepts connections and never answers (a client timeout). */
const blackHole = (port: number): Effect.Effect<void, never, Scope.Scope> => {
  const sockets = new Set<Net.Socket>()
  const server = Net.createServer((socket) => {
    sockets.add(socket)
    socket.on("close", () => sockets.delete(socket))
  })
  return Effect.acquireRelease(
    Effect.callback<void>((resume) => {
      server.listen(port, "127.0.0.1", () => resume(Effect.void))
    }),
    () =>
      Effect.callback<void>((resume) => {
        for (const socket of sockets) socket.destroy()
        server.close(() => resume(Effect.void))
      })
  )
}

// --- the shared environment ---------------------------------------------------

/** A JSON request as a user (or the test's set-up) sends it. */
const wire = (baseUrl: string, method: string, path: string, body?: unknown, token?: string) =>
  Effect.promise(async () => {
    const headers: Record<string, string> = {}
    if (body !== undefined) headers["content-type"] = "application/json"
    if (token !== undefined) headers["authorization"] = `Bearer ${token}`
    const response = await fetch(`${baseUrl}${path}`, {
      method,
      headers,
      ...(body === undefined ? {} : { body: JSON.stringify(body) })
    })
    const text = await response.text()
    let json: Json = undefined
    try {
      json = text === "" ? undefined : JSON.parse(text)
    } catch {
      json = text
    }
    return { status: response.status, text, json }
  })

const expectStatus = (what: string, expected: number) => <A extends { status: number; text: string }>(answer: A) =>
  answer.status === expected
    ? Effect.succeed(answer)
    : Effect.die(new Error(`${what}: expected ${expected}, got ${answer.status} ${answer.text}`))

interface Shared {
  readonly ports: Ports
  readonly python: string
  readonly counterDir: string
  readonly llm: FakeLlm
  readonly kernel: Kernel.RunningKernel
  readonly client: Client.Client.Service
  readonly surface: PythonAgent
  readonly surfaceProxy: RecordingProxy
  readonly authKernel: Kernel.RunningKernel
  readonly typed: PythonAgent
  readonly typedProxy: RecordingProxy
  /** The API key the typed agent's subagent client uses. */
  readonly typedKey: { readonly id: string; readonly token: string }
}

class Env extends Context.Service<Env, Shared>()("test/PythonClient/Env") {}

const EnvLive = Layer.effect(
  Env,
  Effect.gen(function*() {
    const python = yield* Effect.orDie(venvPython)
    const ports = yield* freePorts
    const counterDir = yield* Effect.acquireRelease(
      Effect.sync(() => Fs.mkdtempSync(Path.join(Os.tmpdir(), "rebuno-python-client-"))),
      (dir) => Effect.sync(() => Fs.rmSync(dir, { recursive: true, force: true }))
    )
    const llm = yield* fakeLlm(ports.llm)
    yield* blackHole(ports.blackhole)

    // the open kernel and the surface agent (lease 10 s: a heartbeat every 3.3 s)
    const kernel = yield* Kernel.start({ stage: "current", port: ports.kernel })
    const client = yield* Embedded.client(kernel.url)
    yield* wire(kernel.url, "POST", "/v0/agents", {
      id: "surface",
      webhook_url: `http://127.0.0.1:${ports.surface}/webhook`,
      secret: "surface-secret",
      lease_timeout_seconds: 10
    }).pipe(Effect.flatMap(expectStatus("register surface", 201)))
    yield* wire(kernel.url, "POST", "/v0/policies/surface", { bundle: SURFACE_POLICY }).pipe(
      Effect.flatMap(expectStatus("the policy of surface", 204))
    )
    const surfaceProxy = yield* recordingProxy(kernel.url)
    const surface = yield* Effect.orDie(startAgent({
      python,
      script: "client_agent.py",
      kernelUrl: surfaceProxy.url,
      secret: "surface-secret",
      port: ports.surface,
      counterDir,
      env: { LLM_URL: llm.url }
    }))

    // the kernel with bearer auth and the typed agent (its subagent client has an API key)
    const authKernel = yield* Kernel.start({
      stage: "current",
      port: ports.authKernel,
      apiToken: Redacted.make(BOOTSTRAP)
    })
    yield* wire(authKernel.url, "POST", "/v0/agents", {
      id: "typed",
      webhook_url: `http://127.0.0.1:${ports.typed}/hooks/typed`,
      secret: "typed-secret"
    }, BOOTSTRAP).pipe(Effect.flatMap(expectStatus("register typed", 201)))
    const typedKey = (yield* wire(authKernel.url, "POST", "/v0/api-keys", {
      name: "typed-agent",
      scopes: ["executions:write"]
    }, BOOTSTRAP).pipe(Effect.flatMap(expectStatus("the typed agent's key", 201)))).json
    const typedProxy = yield* recordingProxy(authKernel.url)
    const typed = yield* Effect.orDie(startAgent({
      python,
      script: "client_typed.py",
      kernelUrl: typedProxy.url,
      secret: "typed-secret",
      port: ports.typed,
      counterDir,
      env: { REBUNO_API_KEY: typedKey.token }
    }))
    return {
      ports,
      python,
      counterDir,
      llm,
      kernel,
      client,
      surface,
      surfaceProxy,
      authKernel,
      typed,
      typedProxy,
      typedKey
    }
  })
)

// --- helpers ----------------------------------------------------------------

/** Polls `probe` every 50 ms until `done`; dies after `timeoutMs` with the last value seen. */
const waitFor = <A, E, R>(what: string, probe: Effect.Effect<A, E, R>, done: (a: A) => boolean, timeoutMs = 20_000) =>
  Effect.gen(function*() {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const last = yield* probe
      if (done(last)) return last
      if (Date.now() > deadline) {
        return yield* Effect.die(new Error(`timed out waiting for ${what}; last seen: ${JSON.stringify(last)}`))
      }
      yield* Effect.sleep("50 millis")
    }
  })

const readExecution = (baseUrl: string, id: string, token?: string) =>
  Effect.map(wire(baseUrl, "GET", `/v0/executions/${id}`, undefined, token), (answer) => answer.json as Json)

const waitTerminal = (baseUrl: string, id: string, token?: string) =>
  waitFor(
    `execution ${id} to finish`,
    readExecution(baseUrl, id, token),
    (e) => ["completed", "failed", "cancelled"].includes(e?.status)
  )

const counter = (dir: string, name: string) => {
  const path = Path.join(dir, name)
  return Fs.existsSync(path) ? Number(Fs.readFileSync(path, "utf8")) : 0
}

/** What a run of client_agent.py wrote to `seen-<id>.jsonl`. */
const seen = (dir: string, id: string): Array<Json> => {
  const path = Path.join(dir, `seen-${id}.jsonl`)
  return Fs.existsSync(path) ? Fs.readFileSync(path, "utf8").trim().split("\n").map((l) => JSON.parse(l)) : []
}

const sdkError = (klass: string, code: string | null, status: number | null, message?: string) => ({
  error: { class: klass, code, status, message: message ?? expect.any(String) }
})

/** The exchanges of an agent's proxy that concern one execution. */
const exchangesOf = (proxy: RecordingProxy, id: string) => proxy.exchanges.filter((e) => e.path.includes(id))

/** Every agent request was signed `v1=` and answered 2xx. */
const expectClean = (exchanges: RecordingProxy["exchanges"]) => {
  expect(exchanges.length).toBeGreaterThan(0)
  for (const e of exchanges) expect(e.headers["rebuno-signature"]).toMatch(/^v1=[0-9a-f]{64}$/)
  expect(exchanges.filter((e) => e.status >= 300).map((e) => `${e.method} ${e.path} → ${e.status} ${e.answer}`))
    .toEqual([])
}

interface FlowContext extends Shared {
  readonly proxies: Array<{ readonly name: string; readonly proxy: RecordingProxy }>
}

/**
 * Runs a flow; when it fails (or always, with `REBUNO_PYTHON_SDK_TRACE=1`)
 * prints the driver's requests and the agents' output.
 */
const flow = <A, E>(body: (t: FlowContext) => Effect.Effect<A, E, Scope.Scope>) =>
  Effect.gen(function*() {
    const shared = yield* Env
    const t: FlowContext = { ...shared, proxies: [] }
    const surfaceFrom = shared.surfaceProxy.exchanges.length
    return yield* body(t).pipe(
      Effect.onExit((exit) =>
        Exit.isFailure(exit) || process.env["REBUNO_PYTHON_SDK_TRACE"] !== undefined
          ? Effect.sync(() =>
            console.error(
              t.proxies.map(({ name, proxy }) => `===== ${name}: requests and answers\n${proxy.report()}`).join("\n") +
                `\n===== client_agent.py: its requests in this flow\n${
                  { ...shared.surfaceProxy, exchanges: shared.surfaceProxy.exchanges.slice(surfaceFrom) }
                    .exchanges.map((e) => `→ ${e.method} ${e.path} ${e.body.slice(0, 300)}\n← ${e.status} ${e.answer.slice(0, 300)}`)
                    .join("\n")
                }\n===== client_agent.py output\n${shared.surface.output().slice(-6000)}` +
                `\n===== client_typed.py output\n${shared.typed.output().slice(-3000)}`
            )
          )
          : Effect.void
      )
    )
  })

/** Runs `client_driver.py` with `SCENARIO` through a recording proxy; answers its JSON report. */
const driver = (t: FlowContext, scenario: string, env: Record<string, string> = {}, kernelUrl = t.kernel.url) =>
  Effect.gen(function*() {
    const proxy = yield* recordingProxy(kernelUrl)
    t.proxies.push({ name: `client_driver.py ${scenario}`, proxy })
    const report = yield* Effect.orDie(runScript({
      python: t.python,
      script: "client_driver.py",
      kernelUrl: proxy.url,
      counterDir: t.counterDir,
      timeoutMs: 45_000,
      env: {
        SCENARIO: scenario,
        REFUSED_URL: `http://127.0.0.1:${t.ports.refused}`,
        BLACKHOLE_URL: `http://127.0.0.1:${t.ports.blackhole}`,
        ...env
      }
    }))
    return { report: report as Json, proxy }
  })

/** The deltas of an execution's SSE stream while the scope is open. */
const followDeltas = (baseUrl: string, id: string) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const controller = new AbortController()
      const response = await fetch(`${baseUrl}/v0/executions/${id}/stream`, { signal: controller.signal })
      const deltas: Array<{ step_id: string; seq: number; data: string }> = []
      const reader = response.body!.getReader()
      const decoder = new TextDecoder()
      let buffer = ""
      void (async () => {
        try {
          for (;;) {
            const { done, value } = await reader.read()
            if (done) return
            buffer += decoder.decode(value, { stream: true })
            for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
              for (const line of buffer.slice(0, end).split("\n")) {
                if (line.startsWith("data: ")) deltas.push(JSON.parse(line.slice(6)))
              }
              buffer = buffer.slice(end + 2)
            }
          }
        } catch {
          // aborted
        }
      })()
      return { status: response.status, contentType: response.headers.get("content-type"), deltas, controller }
    }),
    ({ controller }) => Effect.sync(() => controller.abort())
  )

const isUuid = (value: unknown) => /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$/.test(String(value))

// --- the flows ----------------------------------------------------------------

describe.skipIf(!hasPython)("Python SDK 0.29.2 client surface (needs python3)", () => {
  layer(EnvLive, { timeout: "300 seconds", excludeTestServices: true })("Python SDK 0.29.2: the rest of its surface", (it) => {
    it.effect("agent helpers: context, step(), tools, wrappers, LLM calls, Result; a fork replays all of it", () =>
      flow((t) =>
        Effect.gen(function*() {
          const callsBefore = t.llm.calls()
          const { report } = yield* driver(t, "basics")
          const id: string = report.created.id
          expect(report.created).toMatchObject({ agent_id: "surface", status: "running", input: { mode: "basics" } })
          expect(report.final.status).toBe("completed")
          const out = report.final.output
          const events: Array<Json> = report.events
          const firstDispatch = events.find((e) => e.type === "dispatch.queued").payload.dispatch_id
          expect(out.context).toEqual({
            id,
            agent_id: "surface",
            input: { mode: "basics" },
            status: "running",
            dispatch_id: firstDispatch,
            dispatch_attempt: 1
          })
          expect(isUuid(out.context.dispatch_id)).toBe(true)
          expect(out.previous).toBeNull()
          expect(out.clock).toBe(1700000000.5)
          expect(out.sum).toBe(5)
          expect(out.minted).toMatch(/^id-\d+$/)
          expect(out.echo.text).toBe("héllo <&> \u2028 🙂")
          const steps: Array<Json> = report.steps
          const explodeStep = steps.find((s) => s.target === "explode")
          expect(out.explode).toEqual({
            class: "ToolError",
            str: "explode: kaboom",
            tool_id: "explode",
            step_id: explodeStep.step_id,
            failure_reason: "tool_error: explode: kaboom"
          })
          expect(out.concurrent).toEqual(["left", "right"])
          expect(out.kv).toEqual({ key: "answer", value: 42, wrapped: true })
          // MCP: null arguments dropped, structured content kept, text blocks joined
          expect(out.mcp_search).toEqual({ hits: ["rebuno"], args: { query: "rebuno" } })
          expect(out.mcp_read).toBe("page 3\n<image>")
          expect(out.forbidden).toBe("forbidden not allowed. reason: [policy_denied] forbidden is off (HTTP 403)")
          expect(out.llm_plain).toEqual({ status: 200, body: JSON.parse(completion("fake-1")) })
          expect(out.llm_stream).toEqual({
            status: 200,
            content_type: "text/event-stream; charset=utf-8",
            text: streamText(12)
          })
          expect(out.llm_refused).toEqual({
            status: 403,
            body: { error: { type: "rebuno_refusal", message: "rebuno_refusal: denied reason=model not allowed" } },
            raised: { class: "PolicyError", message: "model not allowed" }
          })

          // the steps as the Client reads them: sorted by step id, each as get_step answers it
          expect(steps.map((s) => s.step_id)).toEqual([...steps.map((s) => s.step_id)].sort())
          expect(steps.map((s) => `${s.kind} ${s.target} ${s.status} ${s.idempotency}`).sort()).toEqual([
            "llm_call fake-1 succeeded safe_to_retry",
            "llm_call fake-1 succeeded safe_to_retry",
            "llm_call forbidden-model denied safe_to_retry",
            "local add succeeded safe_to_retry",
            "local clock succeeded safe_to_retry",
            "local mint succeeded at_most_once",
            "tool_call docs_search succeeded safe_to_retry",
            "tool_call echo succeeded safe_to_retry",
            "tool_call echo succeeded safe_to_retry",
            "tool_call echo succeeded safe_to_retry",
            "tool_call explode failed safe_to_retry",
            "tool_call forbidden denied safe_to_retry",
            "tool_call kv_get succeeded safe_to_retry",
            "tool_call read succeeded safe_to_retry"
          ])
          expect(report.got_steps).toEqual(steps)
          expect(report.terminal_steps).toEqual(steps)
          for (const s of steps) expect(s).toMatchObject({ execution_id: id, occurrence: 0 })
          expect(explodeStep.error).toEqual({ message: "kaboom" })
          expect(steps.find((s) => s.target === "add").args).toEqual({ a: 2, b: 3 })
          expect(steps.find((s) => s.target === "docs_search").args).toEqual({ query: "rebuno" })
          expect(steps.find((s) => s.target === "forbidden").error).toEqual({
            reason: "forbidden is off",
            rule_id: "no-forbidden"
          })
          const llmSteps = steps.filter((s) => s.target === "fake-1")
          expect(llmSteps.map((s) => s.result).sort((a, b) => a.body.length - b.body.length)).toEqual([
            { status: 200, headers: { "content-type": "application/json" }, body: completion("fake-1") },
            { status: 200, headers: { "content-type": "text/event-stream; charset=utf-8" }, body: streamText(12) }
          ])
          // usage read from the JSON body and from the SSE body (C.8.5)
          expect(
            events.filter((e) => e.type === "step.succeeded" && e.payload.step_type === "llm_call")
              .map((e) => e.payload.usage)
          ).toEqual([{ input_tokens: 3, output_tokens: 5 }, { input_tokens: 7, output_tokens: 11 }])
          expect(events.at(-1).type).toBe("execution.completed")

          // the wire: all 2xx and v1-signed; state sent with the output; deltas posted for the streamed call
          const agentExchanges = exchangesOf(t.surfaceProxy, id)
          expectClean(agentExchanges)
          const complete = agentExchanges.filter((e) => e.path === `/v0/executions/${id}/complete`)
          expect(JSON.parse(complete[0]!.body).state).toEqual({ turns: 1, mode: "basics" })
          const streamedStep = llmSteps.find((s) => s.result.body === streamText(12)).step_id
          const deltas = agentExchanges.filter((e) => e.path.endsWith(`/steps/${streamedStep}/stream`))
          expect(deltas.length).toBeGreaterThan(0)
          expect(deltas.map((e) => e.status).every((s) => s === 204)).toBe(true)
          expect(deltas.map((e) => JSON.parse(e.body).seq)).toEqual(deltas.map((_, i) => i))
          expect(deltas.map((e) => JSON.parse(e.body).data).join("")).toBe(streamText(12))

          // the fork after the last step replays everything: no model call, no tool body, same output
          const counters = ["echo", "explode", "mint", "mcp_search", "mcp_read"].map((n) => counter(t.counterDir, n))
          expect(report.forked).toMatchObject({
            status: "running",
            forked_from: id,
            fork_seq: report.fork_at,
            input: { mode: "basics" },
            restoration: null
          })
          expect(report.fork_final.status).toBe("completed")
          const forkExplode = report.fork_steps.find((s: Json) => s.target === "explode").step_id
          expect(report.fork_final.output).toEqual({
            ...out,
            context: { ...out.context, id: report.forked.id, dispatch_id: expect.any(String) },
            explode: { ...out.explode, step_id: forkExplode }
          })
          expect(t.llm.calls() - callsBefore).toBe(2)
          expect(["echo", "explode", "mint", "mcp_search", "mcp_read"].map((n) => counter(t.counterDir, n)))
            .toEqual(counters)
          expectClean(exchangesOf(t.surfaceProxy, report.forked.id))
        })
      ), 60_000)

    it.effect("approvals: deny with and without a rationale, expiry, a cancel while pending", () =>
      flow((t) =>
        Effect.gen(function*() {
          const { report, proxy } = yield* driver(t, "approvals")
          const gateId: string = report.first.execution_id
          expect(report.first).toMatchObject({ status: "pending", message: "Deploy?", decided_by: "", rationale: "" })
          expect(report.grant_by_mallory).toEqual(sdkError(
            "ForbiddenError",
            "forbidden",
            403,
            "[forbidden] forbidden: \"mallory\" is not an approver for this approval (HTTP 403)"
          ))
          expect(report.deny).toEqual({ ok: null })
          expect(report.deny_again).toEqual(sdkError("ConflictError", "conflict", 409))
          expect(report.first_after).toMatchObject({ status: "denied", decided_by: "alice", rationale: "not today" })
          expect(report.second_after).toMatchObject({ status: "denied", decided_by: "alice", rationale: "" })
          // what the Python handler saw: the @tool wrapper's text, then invoke_tool's PolicyError
          expect(report.gate_final).toMatchObject({
            status: "completed",
            output: {
              as_tool: "deploy not allowed. reason: [policy_denied] not today (HTTP 403)",
              direct: { class: "PolicyError", reason: "approval_denied", rule_id: "", code: "policy_denied" }
            }
          })
          expect(
            (report.gate_events as Array<Json>).map((e) => e.type).filter((type) => !type.startsWith("dispatch."))
          ).toEqual([
            "execution.created",
            "execution.started",
            "step.proposed",
            "step.awaiting_approval",
            "approval.requested",
            "execution.blocked",
            "approval.denied",
            "step.denied",
            "execution.resumed",
            "step.proposed",
            "step.awaiting_approval",
            "approval.requested",
            "execution.blocked",
            "approval.denied",
            "step.denied",
            "execution.resumed",
            "execution.completed"
          ])
          expect((report.gate_events as Array<Json>).filter((e) => e.type === "step.denied").map((e) => e.payload.error))
            .toEqual([{ reason: "not today" }, { reason: "approval_denied" }])
          expect(report.bad_id).toEqual(sdkError("ValidationError", "validation_error", 400))
          expect(report.unknown_id).toEqual(sdkError("NotFoundError", "not_found", 404))
          // the deploy never ran; the resubmitted denied steps answered `denied`
          expect(counter(t.counterDir, "deploy")).toBe(0)
          const resubmits = exchangesOf(t.surfaceProxy, gateId).filter((e) => e.path.endsWith("/steps"))
            .map((e) => JSON.parse(e.answer).decision)
          expect(resubmits).toEqual(["blocked", "denied", "blocked", "denied", "denied"])

          // expiry: the handler gets PolicyError(approval_timeout)
          expect(report.expire_final).toMatchObject({
            status: "completed",
            output: { class: "PolicyError", reason: "approval_timeout", rule_id: "" }
          })
          expect(report.expired).toMatchObject({ status: "expired", rationale: "timeout", decided_by: "" })

          // cancel with a pending approval: expired with execution_cancelled, no longer listed, not grantable
          expect(report.cancel).toEqual({ ok: null })
          expect(report.cancelled).toMatchObject({ status: "cancelled", failure_reason: "client_cancelled" })
          expect(report.cancelled_approval).toMatchObject({ status: "expired", rationale: "execution_cancelled" })
          expect(report.cancelled_listed).toEqual([])
          expect(report.grant_after_cancel).toEqual(sdkError("ConflictError", "conflict", 409))
          expect((report.cancelled_events as Array<Json>).slice(-3).map((e) => [e.type, e.payload.reason ?? e.payload.rationale ?? e.payload.error?.reason]))
            .toEqual([
              ["execution.cancelled", "client_cancelled"],
              ["approval.expired", "execution_cancelled"],
              ["step.denied", "execution_cancelled"]
            ])
          expect(report.cancelled_steps).toEqual([
            expect.objectContaining({ target: "deploy", status: "denied", error: { reason: "execution_cancelled" } })
          ])
          // the SDK's requests: grant/deny bodies as documented, list with ?status=pending
          expect(proxy.exchanges.filter((e) => e.path.endsWith("/deny")).map((e) => JSON.parse(e.body))).toEqual([
            { rationale: "not today", decided_by: "alice" },
            { rationale: "", decided_by: "alice" },
            { rationale: "", decided_by: "alice" }
          ])
          expect(proxy.exchanges.filter((e) => e.path.startsWith("/v0/approvals?")).map((e) => e.path)).toContain(
            "/v0/approvals?status=pending"
          )
        })
      ), 60_000)

    it.effect("cancel while running: a released tool meets Terminated, a hanging one the heartbeat's lease_superseded", () =>
      flow((t) =>
        Effect.gen(function*() {
          const { report } = yield* driver(t, "cancel_running")
          const { released, hanging } = report.ids as { released: string; hanging: string }
          expect(report.released_cancel).toEqual({ ok: null })
          expect(report.released).toMatchObject({ status: "cancelled", failure_reason: "client_cancelled" })
          expect(report.released_cancel_again).toEqual(sdkError(
            "ConflictError",
            "conflict",
            409,
            "[conflict] conflict: execution is already terminal (HTTP 409)"
          ))
          // released: the step's complete is answered execution_terminal, the next submit raises Terminated
          const releasedSeen = yield* waitFor("the released run to end", Effect.sync(() => seen(t.counterDir, released)), (s) => s.length === 3)
          expect(releasedSeen).toEqual([
            { where: "slow", returned: 1 },
            { where: "handler", after: "slow" },
            { where: "handler", exception: "Terminated", message: "execution is terminal" }
          ])
          const releasedWire = exchangesOf(t.surfaceProxy, released)
          expect(releasedWire.filter((e) => e.path.includes("/complete")).map((e) => [e.status, JSON.parse(e.answer)]))
            .toEqual([[200, { decision: "execution_terminal" }]])
          expect(releasedWire.filter((e) => e.path.endsWith("/steps")).map((e) => JSON.parse(e.answer).decision))
            .toEqual(["proceed", "execution_terminal"])
          // hanging: within one heartbeat interval (3.3 s) the SDK cancels the run
          const hangingSeen = yield* waitFor("the hanging run to stop", Effect.sync(() => seen(t.counterDir, hanging)), (s) => s.length === 2, 10_000)
          expect(hangingSeen).toEqual([
            { where: "slow", exception: "CancelledError" },
            { where: "handler", exception: "CancelledError", message: "" }
          ])
          const heartbeats = exchangesOf(t.surfaceProxy, hanging).filter((e) => e.path.endsWith("/heartbeat"))
          expect(heartbeats.at(-1)).toMatchObject({ status: 409 })
          expect(JSON.parse(heartbeats.at(-1)!.answer)).toMatchObject({ code: "lease_superseded" })
          expect(report.hanging).toMatchObject({ status: "cancelled", failure_reason: "client_cancelled" })
          expect(report.hanging_steps).toEqual([
            expect.objectContaining({ target: "slow", status: "cancelled", error: { reason: "execution_cancelled" } })
          ])
          expect((report.hanging_events as Array<Json>).slice(-2).map((e) => e.type)).toEqual([
            "execution.cancelled",
            "step.cancelled"
          ])
          // no outcome was recorded after the cancel
          expect((yield* t.client.events(hanging)).at(-1)!.type).toBe("step.cancelled")
        })
      ), 60_000)

    it.effect("cancel while parked by a rate limit: the run ended Blocked and is never redelivered", () =>
      flow((t) =>
        Effect.gen(function*() {
          const { report } = yield* driver(t, "cancel_parked")
          const id: string = report.id
          expect(report.before.status).toBe("running")
          expect(report.cancel).toEqual({ ok: null })
          expect(report.after).toMatchObject({ status: "cancelled", failure_reason: "client_cancelled" })
          const events = yield* t.client.events(id)
          const parkedAt = Date.parse(events.find((e) => e.type === "step.rate_limited")!.occurredAt)
          // past the longest park (max_wait 3 s), with room for a delivery
          yield* Effect.sleep(`${Math.max(0, parkedAt + 4_000 - Date.now())} millis`)
          expect(seen(t.counterDir, id)).toEqual([
            { where: "start", attempt: 1 },
            { where: "handler", exception: "Blocked" }
          ])
          const after = yield* t.client.events(id)
          expect(after.map((e) => e.type).slice(-3)).toEqual(["step.rate_limited", "dispatch.queued", "execution.cancelled"])
          const submits = exchangesOf(t.surfaceProxy, id).filter((e) => e.path.endsWith("/steps"))
          expect(submits.map((e) => JSON.parse(e.answer))).toEqual([
            expect.objectContaining({ decision: "proceed" }),
            { decision: "blocked", reason: "rate_limit_exceeded" }
          ])
          expect(exchangesOf(t.surfaceProxy, id).filter((e) => e.method === "GET")).toHaveLength(1)
        })
      ), 60_000)

    it.effect("events: followed with after_seq while the run goes, then paged past the 1000 cap; 250 steps listed", () =>
      flow((t) =>
        Effect.gen(function*() {
          const { report, proxy } = yield* driver(t, "follow", { COUNT: "250" })
          const total = 4 + 250 * 4 + 1
          expect(report.final).toMatchObject({ status: "completed", output: { total: (249 * 250) / 2 } })
          expect(report.followed.map((e: Json) => e[0])).toEqual(Array.from({ length: total }, (_, i) => i + 1))
          expect(report.followed.at(-1)).toEqual([total, "execution.completed"])
          expect(report.default_page).toEqual(Array.from({ length: 100 }, (_, i) => i + 1))
          expect(report.capped_page).toBe(1000)
          expect(report.zero_limit).toBe(100)
          expect(report.paged).toEqual(Array.from({ length: total }, (_, i) => i + 1))
          expect(report.past_end).toEqual([])
          expect(report.steps).toHaveLength(250)
          expect(report.terminal_steps).toBe(250)
          expect(report.steps.map((s: Json) => s[3]).sort((a: number, b: number) => a - b)).toEqual(
            Array.from({ length: 250 }, (_, i) => i)
          )
          // what the SDK sent: after_seq omitted when 0, limit always
          const eventPaths = proxy.exchanges.filter((e) => e.path.includes("/events")).map((e) => e.path.split("?")[1])
          expect(eventPaths[0]).toBe("limit=50")
          expect(eventPaths).toContain("limit=1000&after_seq=1000")
        })
      ), 60_000)

    it.effect("live deltas: the SDK's stream deltas reach an SSE follower in order and add up to the recorded body", () =>
      flow((t) =>
        Effect.gen(function*() {
          for (const model of ["gated-stream", "gated-big"]) {
            t.llm.close()
            const created = yield* t.client.create("surface", { mode: "stream", model })
            const follower = yield* followDeltas(t.kernel.url, created.id)
            expect(follower.status).toBe(200)
            expect(follower.contentType).toBe("text/event-stream")
            t.llm.open()
            const done = yield* waitTerminal(t.kernel.url, created.id)
            expect(done.status).toBe("completed")
            const [step] = yield* t.client.listSteps(created.id)
            yield* waitFor(
              "the last delta",
              Effect.sync(() => follower.deltas.map((d) => d.data).join("")),
              (text) => text === done.output.text,
              5_000
            )
            expect(follower.deltas.every((d) => d.step_id === step!.stepId)).toBe(true)
            expect(follower.deltas.map((d) => d.seq)).toEqual(follower.deltas.map((_, i) => i))
            expect((step!.result as Json).body).toBe(done.output.text)
            if (model === "gated-big") {
              expect(done.output.text).toBe(BIG)
              // the SDK cuts at 1750 characters: the first delta is 1750 emoji, exactly the 7000-byte cap
              expect(Buffer.byteLength(follower.deltas[0]!.data)).toBe(7000)
              expect(follower.deltas.every((d) => Array.from(d.data).length <= 1750)).toBe(true)
            } else {
              expect(done.output.text).toBe(streamText(12))
              expect(follower.deltas.length).toBeGreaterThan(1)
            }
            expect(exchangesOf(t.surfaceProxy, created.id).filter((e) => e.path.endsWith("/stream")).map((e) => e.status))
              .toEqual(follower.deltas.map(() => 204))
          }
        })
      ), 60_000)

    it.effect("errors, sessions, idempotency, parents, forks and failure reasons through the Client", () =>
      flow((t) =>
        Effect.gen(function*() {
          const { report: r } = yield* driver(t, "errors")
          expect(r.get_unknown).toEqual(sdkError("NotFoundError", "not_found", 404, "[not_found] not found (HTTP 404)"))
          expect(r.get_bad_id).toEqual(sdkError("ValidationError", "validation_error", 400))
          expect(r.events_unknown).toEqual({ ok: [] })
          expect(r.steps_unknown).toEqual({ ok: [] })
          expect(r.cancel_unknown).toEqual(sdkError("NotFoundError", "not_found", 404))
          expect(r.create_unknown_agent).toEqual(sdkError("NotFoundError", "not_found", 404))
          expect(r.create_blank_session).toEqual(sdkError(
            "ValidationError",
            "validation_error",
            400,
            "[validation_error] validation error: session must be a nonblank UTF-8 string of at most 256 bytes without NUL (HTTP 400)"
          ))
          expect(r.fork_unknown).toEqual(sdkError("NotFoundError", "not_found", 404))
          // failure reasons (C.12)
          expect([r.fail_agent, r.fail_tool, r.fail_policy, r.fail_rate, r.budget].map((e: Json) => [e.status, e.failure_reason]))
            .toEqual([
              ["failed", "agent_error: ValueError: boom"],
              ["failed", "tool_error: explode: no luck"],
              ["failed", "policy_denied: forbidden is off"],
              ["failed", "rate_limit_exceeded"],
              ["failed", "execution_token_budget_exceeded"]
            ])
          expect(seen(t.counterDir, r.budget.id)).toEqual([{
            first: 200,
            second: 403,
            body: {
              error: {
                type: "rebuno_refusal",
                message: "rebuno_refusal: denied reason=execution_token_budget_exceeded"
              }
            }
          }])
          expect(r.get_step_unknown).toEqual(sdkError("NotFoundError", "not_found", 404))
          expect(r.get_step_other_execution).toEqual(sdkError("NotFoundError", "not_found", 404))
          // idempotency: the second create answers the first execution as it is
          expect(r.idempotent[0].ok).toMatchObject({ idempotency_key: "order-7", input: { mode: "many", count: 1 } })
          expect(r.idempotent[1].ok.id).toBe(r.idempotent[0].ok.id)
          expect(r.idempotent[1].ok.input).toEqual({ mode: "many", count: 1 })
          // an explicit parent: previous() reads its state
          expect(r.child).toMatchObject({ status: "running", session: "child-of-base", parent_execution_id: r.base_id })
          expect(r.child_final).toMatchObject({
            status: "completed",
            output: { previous: { turns: 1, mode: "basics" } }
          })
          expect(r.child_again).toEqual(sdkError(
            "ConflictError",
            "conflict",
            409,
            "[conflict] conflict: session \"child-of-base\" already has executions (HTTP 409)"
          ))
          expect(r.parent_not_completed).toEqual(sdkError(
            "ConflictError",
            "conflict",
            409,
            "[conflict] conflict: the parent must be a completed execution of the same agent (HTTP 409)"
          ))
          expect(r.spawned_by_terminal).toEqual(sdkError(
            "ConflictError",
            "conflict",
            409,
            "[conflict] conflict: the parent execution is terminal (HTTP 409)"
          ))
          const range = `[validation_error] validation error: at_seq must be between 1 and ${r.latest_seq} (HTTP 400)`
          expect(r.fork_at_zero).toEqual(sdkError("ValidationError", "validation_error", 400, range))
          expect(r.fork_past_end).toEqual(sdkError("ValidationError", "validation_error", 400, range))
          expect(r.fork_bad_policy.error).toMatchObject({ class: "ValidationError", code: "validation_error" })
          expect(r.fork_bad_policy.error.message).toContain("invalid policy bundle")
          expect(r.fork_taken_session).toEqual(sdkError("ConflictError", "conflict", 409))
          expect(r.fork_in_session.ok).toMatchObject({
            session: "fork-session",
            forked_from: r.base_id,
            fork_seq: r.latest_seq,
            status: "running"
          })
          // one running execution per session
          expect(r.session_created.map((e: Json) => [e.session, e.status])).toEqual([["queue", "running"], [
            "queue",
            "pending"
          ]])
          expect(r.session_final.map((e: Json) => e.status)).toEqual(["completed", "completed"])
          expect(r.session_final[1].parent_execution_id).toBe(r.session_created[0].id)
          // transport failures and configuration
          expect(r.refused).toEqual(sdkError("NetworkError", null, null))
          expect(r.timeout).toEqual(sdkError("NetworkError", null, null))
          expect(r.no_url).toBe("Client base_url is required (set REBUNO_URL or pass base_url=)")
        })
      ), 60_000)

    it.effect("subagents: one completes, one fails (ToolError), and a cancelled parent cancels its running child", () =>
      flow((t) =>
        Effect.gen(function*() {
          const { report } = yield* driver(t, "tree")
          expect(report.final).toMatchObject({
            status: "completed",
            output: {
              ok: { total: 3 },
              failed: { class: "ToolError", str: "delegate: subagent_failed", tool_id: "delegate" }
            }
          })
          const steps = report.steps as Array<Json>
          const failed = steps.find((s) => s.status === "failed")
          expect(failed.error).toMatchObject({ reason: "subagent_failed", failure_reason: "agent_error: ValueError: boom" })
          const failedChild = yield* readExecution(t.kernel.url, failed.error.execution_id)
          expect(failedChild).toMatchObject({
            status: "failed",
            spawned_by: { execution_id: report.final.id, step_id: failed.step_id }
          })
          // the first child joined the session the tool asked for
          const inSession = (yield* wire(t.kernel.url, "GET", "/v0/executions?agent_id=surface&session=kids")).json
          expect(inSession.executions).toHaveLength(1)
          expect(inSession.executions[0]).toMatchObject({
            status: "completed",
            output: { total: 3 },
            spawned_by: { execution_id: report.final.id }
          })
          expect(
            (report.events as Array<Json>).filter((e) => e.type.startsWith("execution.")).map((e) => e.type)
          ).toEqual([
            "execution.created",
            "execution.started",
            "execution.blocked",
            "execution.resumed",
            "execution.blocked",
            "execution.resumed",
            "execution.completed"
          ])

          // the cancelled parent: its step cancelled, the child cancelled with parent_agent_terminal
          expect(report.cancel).toEqual({ ok: null })
          expect(report.cancelled).toMatchObject({ status: "cancelled", failure_reason: "client_cancelled" })
          expect(report.cancelled_steps).toEqual([
            expect.objectContaining({ target: "delegate", status: "cancelled", error: { reason: "execution_cancelled" } })
          ])
          const listed = (yield* wire(t.kernel.url, "GET", "/v0/executions?agent_id=surface&limit=200")).json
          const child = (listed.executions as Array<Json>).find((e) => e.spawned_by?.execution_id === report.cancelled_id)
          expect(child).toMatchObject({ status: "cancelled", failure_reason: "parent_agent_terminal" })
          // …and the child's Python run is stopped by its next heartbeat
          const childSeen = yield* waitFor("the child run to stop", Effect.sync(() => seen(t.counterDir, child.id)), (s) => s.length === 2, 10_000)
          expect(childSeen.map((s) => s.exception)).toEqual(["CancelledError", "CancelledError"])
        })
      ), 60_000)

    it.effect("bearer auth: the bootstrap token, scoped API keys, rotation and revocation; a typed agent", () =>
      flow((t) =>
        Effect.gen(function*() {
          const url = t.authKernel.url
          const key = (name: string, scopes: Array<string>) =>
            Effect.map(
              wire(url, "POST", "/v0/api-keys", { name, scopes }, BOOTSTRAP).pipe(
                Effect.flatMap(expectStatus(`key ${name}`, 201))
              ),
              (answer) => answer.json as { id: string; token: string }
            )
          const reader = yield* key("reader", ["executions:read"])
          const writer = yield* key("writer", ["executions:write"])
          const forker = yield* key("forker", ["executions:write", "policies:write"])
          const approver = yield* key("approver", ["approvals:read", "approvals:write"])
          const rotated = yield* key("rotated", ["executions:read"])
          const rotatedNew = (yield* wire(url, "POST", `/v0/api-keys/${rotated.id}/rotate`, undefined, BOOTSTRAP)).json
          const revoked = yield* key("revoked", ["executions:read"])
          yield* wire(url, "DELETE", `/v0/api-keys/${revoked.id}`, undefined, BOOTSTRAP).pipe(
            Effect.flatMap(expectStatus("revoke", 204))
          )
          const keys = {
            bootstrap: BOOTSTRAP,
            reader: reader.token,
            writer: writer.token,
            forker: forker.token,
            approver: approver.token,
            rotated_old: rotated.token,
            rotated_new: rotatedNew.token,
            revoked: revoked.token
          }
          const { report: r } = yield* driver(t, "auth", { KEYS: JSON.stringify(keys) }, url)
          const unauthorized = sdkError("UnauthorizedError", "unauthorized", 401, "[unauthorized] unauthorized (HTTP 401)")
          const forbidden = sdkError("ForbiddenError", "forbidden", 403, "[forbidden] forbidden (HTTP 403)")
          expect(r.anonymous).toEqual(unauthorized)
          expect(r.wrong).toEqual(unauthorized)
          expect(r.rotated_old).toEqual(unauthorized)
          expect(r.revoked).toEqual(unauthorized)
          expect(r.rotated_new.ok).toMatchObject({ id: r.ids.tea, status: "completed" })

          // the typed agent: a Pydantic input, its webhook path, a subagent created with the agent's API key
          expect(r.tea).toMatchObject({
            status: "completed",
            output: { item: "tea", qty: 2, parts: [{ item: "tea", qty: 2, packs: expect.any(Number) }] }
          })
          expect(r.split).toMatchObject({
            status: "completed",
            output: { item: "cup", qty: 3, parts: [{ item: "cup", qty: 3, packs: expect.any(Number) }] }
          })
          expect(r.split_steps).toEqual([expect.objectContaining({ target: "split", status: "succeeded" })])
          expect(r.invalid).toMatchObject({ status: "failed" })
          expect(r.invalid.failure_reason).toMatch(/^input_invalid: input validation failed: 2 validation errors for Order/)
          expect(r.missing.failure_reason).toMatch(/^input_invalid: input validation failed: 1 validation error for Order\nitem\n  Field required/)
          const subagentCreate = t.typedProxy.exchanges.filter((e) => e.method === "POST" && e.path === "/v0/executions")
          expect(subagentCreate.map((e) => [e.headers["authorization"], e.status])).toEqual([
            [`Bearer ${t.typedKey.token}`, 201]
          ])
          expect(JSON.parse(subagentCreate[0]!.body)).toEqual({
            agent_id: "typed",
            input: { item: "cup", qty: 3 },
            spawned_by: { execution_id: r.ids.split, step_id: r.split_steps[0].step_id }
          })
          // its metadata, from the Pydantic models, stored as sent
          const metadata = t.typedProxy.exchanges.filter((e) => e.path === "/v0/agents/typed/metadata")
          expect(metadata.map((e) => [e.method, e.status])).toEqual([["PUT", 204]])
          const sent = JSON.parse(metadata[0]!.body)
          expect(sent.input_schema).toMatchObject({ title: "Order", required: ["item"] })
          expect(sent.output_schema).toMatchObject({ title: "Receipt", required: ["item", "qty", "parts"] })
          const stored = (yield* t.authKernel.core.getAgent("typed")).metadata
          expect(stored?.description).toBe("Packs an order, or has a subagent pack it.")
          expect(JSON.parse(stored?.inputSchemaRaw ?? "null")).toEqual(sent.input_schema)
          expect(JSON.parse(stored?.outputSchemaRaw ?? "null")).toEqual(sent.output_schema)

          // scopes (C.9.1): write does not imply read, reads through dual routes with a key
          expect(r.reader.get.ok).toMatchObject({ id: r.ids.tea, status: "completed" })
          expect(r.reader.events.ok.at(-1).type).toBe("execution.completed")
          expect(r.reader.list_steps.ok).toEqual(r.split_steps)
          expect(r.reader.get_step.ok).toEqual(r.split_steps[0])
          expect([r.reader.create, r.reader.cancel, r.reader.fork, r.reader.list_approvals]).toEqual([
            forbidden,
            forbidden,
            forbidden,
            forbidden
          ])
          expect(r.writer.create.ok).toMatchObject({ agent_id: "typed", idempotency_key: "w-1" })
          expect(r.writer.create_again.ok.id).toBe(r.writer.create.ok.id)
          expect(r.writer.get).toEqual(forbidden)
          expect(r.writer.fork.ok).toMatchObject({ forked_from: r.ids.tea, fork_seq: 1 })
          expect(r.writer.fork_with_policy).toEqual(sdkError(
            "ForbiddenError",
            "forbidden",
            403,
            "[forbidden] forbidden: policy_bundle requires policies:write (HTTP 403)"
          ))
          expect(r.forker.fork_with_policy.ok).toMatchObject({ forked_from: r.ids.tea, fork_seq: 1 })
          expect(r.approver.list_approvals).toEqual({ ok: [] })
          expect(r.approver.get).toEqual(forbidden)

          // with its key revoked, the agent's subagent client is refused: the tool fails, then the run
          yield* wire(url, "DELETE", `/v0/api-keys/${t.typedKey.id}`, undefined, BOOTSTRAP).pipe(
            Effect.flatMap(expectStatus("revoke the agent's key", 204))
          )
          const created = (yield* wire(url, "POST", "/v0/executions", {
            agent_id: "typed",
            input: { item: "lid", split: true }
          }, BOOTSTRAP)).json
          const refused = yield* waitTerminal(url, created.id, BOOTSTRAP)
          expect(refused).toMatchObject({
            status: "failed",
            failure_reason: "tool_error: split: [unauthorized] unauthorized (HTTP 401)"
          })
        })
      ), 60_000)
  })
})
