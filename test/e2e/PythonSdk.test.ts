/**
 * The official Python SDK 0.29.2, unmodified, against the embedded kernel in
 * its current stage (PROTOCOL-CURRENT) over real HTTP: the agents of
 * `test/python/` run as child processes (`Agent.run`, uvicorn), the SDK from
 * a venv the test makes itself (test/support/pythonSdk.ts; needs python3).
 *
 * Eight flows, each asserting what a user sees (status, output, events in
 * order, steps, side-effect counters): hello, an approval granted through the
 * Python `Client`, crash and replay (SIGKILL mid-run), a session whose second
 * execution reads the first's state, a subagent, rate-limit parking, a
 * resource (a directory checkpointed by a Python driver, a crash mid-run, and
 * a fork restored from the last checkpoint), and forks made with the Python
 * `Client.fork` that replay the copied steps and run the rest live, one under
 * a policy of its own.
 *
 * Every agent talks to the kernel through a recording proxy; when a flow
 * fails (or always, with `REBUNO_PYTHON_SDK_TRACE=1`), every request the SDK
 * sent and the kernel's answer are printed with the agents' output.
 */
import { expect, layer } from "@effect/vitest"
import { Context, Effect, Exit, Layer } from "effect"
import type { Scope } from "effect"
import { Client, StepId } from "effect-rebuno"
import * as Kernel from "effect-rebuno/kernel"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Embedded from "../support/embedded.js"
import {
  freePort,
  type PythonAgent,
  type PythonSdkError,
  recordingProxy,
  type RecordingProxy,
  runScript,
  startAgent,
  venvPython
} from "../support/pythonSdk.js"

// --- the shared environment: the venv and one current-stage kernel ---------

interface Shared {
  readonly python: string
  readonly kernel: Kernel.RunningKernel
  readonly client: Client.Client.Service
}

class Env extends Context.Service<Env, Shared>()("test/PythonSdk/Env") {}

const EnvLive = Layer.effect(
  Env,
  Effect.gen(function*() {
    const python = yield* Effect.orDie(venvPython)
    const kernel = yield* Kernel.start({ stage: "current" })
    const client = yield* Embedded.client(kernel.url)
    return { python, kernel, client }
  })
)

// --- helpers ----------------------------------------------------------------

type Json = any

/** A JSON request to the kernel as a user would send it (set-up and wire reads). */
const wire = (baseUrl: string, method: string, path: string, body?: unknown) =>
  Effect.promise(async () => {
    const response = await fetch(`${baseUrl}${path}`, {
      method,
      headers: body === undefined ? {} : { "content-type": "application/json" },
      ...(body === undefined ? {} : { body: JSON.stringify(body) })
    })
    const text = await response.text()
    return { status: response.status, text, json: text === "" ? undefined : safeParse(text) as Json }
  })

const safeParse = (text: string): unknown => {
  try {
    return JSON.parse(text)
  } catch {
    return text
  }
}

const expectStatus = (what: string, expected: number) => (answer: { status: number; text: string }) =>
  answer.status === expected
    ? Effect.void
    : Effect.die(new Error(`${what}: expected ${expected}, got ${answer.status} ${answer.text}`))

/** Polls `probe` every 100 ms until `done`; dies after `timeoutMs` with the last value seen. */
const waitFor = <A, E, R>(
  what: string,
  probe: Effect.Effect<A, E, R>,
  done: (a: A) => boolean,
  timeoutMs = 20_000
): Effect.Effect<A, E, R> =>
  Effect.gen(function*() {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const last = yield* probe
      if (done(last)) return last
      if (Date.now() > deadline) {
        return yield* Effect.die(
          new Error(`timed out after ${timeoutMs} ms waiting for ${what}; last seen: ${JSON.stringify(last)}`)
        )
      }
      yield* Effect.sleep("100 millis")
    }
  })

const terminal = (status: string) => status === "completed" || status === "failed" || status === "cancelled"

const readExecution = (baseUrl: string, id: string) =>
  Effect.map(wire(baseUrl, "GET", `/v0/executions/${id}`), (answer) => answer.json as Json)

const waitTerminal = (baseUrl: string, id: string, timeoutMs = 20_000) =>
  waitFor(`execution ${id} to finish`, readExecution(baseUrl, id), (e) => terminal(e?.status), timeoutMs)

/** The `execution.*` and `step.*` event types, in order. */
const lifecycle = (events: ReadonlyArray<{ readonly type: string }>) =>
  events.map((e) => e.type).filter((t) => t.startsWith("execution.") || t.startsWith("step."))

/** The lifecycle of a step that ran live and succeeded. */
const STEP_SUCCEEDED: ReadonlyArray<string> = ["step.proposed", "step.allowed", "step.executing", "step.succeeded"]

/** The lifecycle of a run of two live steps that completed. */
const TWO_STEPS_COMPLETED: ReadonlyArray<string> = [
  "execution.created",
  "execution.started",
  ...STEP_SUCCEEDED,
  ...STEP_SUCCEEDED,
  "execution.completed"
]

const counter = (dir: string, name: string) => {
  const path = Path.join(dir, name)
  return Fs.existsSync(path) ? Number(Fs.readFileSync(path, "utf8")) : 0
}

const tempDir = Effect.acquireRelease(
  Effect.sync(() => Fs.mkdtempSync(Path.join(Os.tmpdir(), "rebuno-python-sdk-"))),
  (dir) => Effect.sync(() => Fs.rmSync(dir, { recursive: true, force: true }))
)

/** What a flow started, printed when it fails. */
class Trace {
  readonly entries: Array<{ readonly name: string; readonly output: () => string; readonly proxy: RecordingProxy }> =
    []
  report(): string {
    return this.entries.map(({ name, output, proxy }) =>
      `===== ${name}: requests the SDK sent and the kernel's answers\n${proxy.report()}\n` +
      `===== ${name}: output\n${output()}`
    ).join("\n")
  }
}

/** What a flow works with: the shared environment, its kernel's URL, its counters and trace. */
interface FlowContext extends Shared {
  readonly kernelUrl: string
  readonly counterDir: string
  readonly trace: Trace
}

interface Launched {
  readonly agent: PythonAgent
  readonly proxy: RecordingProxy
  /** Starts the script again on the same port, behind the same proxy. */
  readonly restart: (env?: Record<string, string>) => Effect.Effect<PythonAgent, PythonSdkError, Scope.Scope>
}

/**
 * Registers `agentId` (webhook on a free port, optional policy), then starts
 * `script` behind a recording proxy for the rest of the test.
 */
const launch = (
  shared: FlowContext,
  options: {
    readonly script: string
    readonly agentId: string
    readonly policy?: string | undefined
    readonly env?: Record<string, string> | undefined
  }
): Effect.Effect<Launched, PythonSdkError, Scope.Scope> =>
  Effect.gen(function*() {
    const port = yield* freePort
    const secret = `${options.agentId}-secret`
    yield* wire(shared.kernelUrl, "POST", "/v0/agents", {
      id: options.agentId,
      webhook_url: `http://127.0.0.1:${port}/webhook`,
      secret
    }).pipe(Effect.flatMap(expectStatus(`register ${options.agentId}`, 201)))
    if (options.policy !== undefined) {
      yield* wire(shared.kernelUrl, "POST", `/v0/policies/${options.agentId}`, { bundle: options.policy }).pipe(
        Effect.flatMap(expectStatus(`load the policy of ${options.agentId}`, 204))
      )
    }
    const proxy = yield* recordingProxy(shared.kernelUrl)
    const start = (env?: Record<string, string>) =>
      startAgent({
        python: shared.python,
        script: options.script,
        kernelUrl: proxy.url,
        secret,
        port,
        counterDir: shared.counterDir,
        env
      }).pipe(Effect.tap((agent) =>
        Effect.sync(() =>
          shared.trace.entries.push({ name: `${options.script} (pid ${agent.pid})`, output: agent.output, proxy })
        )
      ))
    const agent = yield* start(options.env)
    return { agent, proxy, restart: start }
  })

/**
 * Runs a flow with a fresh counter directory and prints its trace when it
 * fails (assertions included).
 */
const flow = <A, E>(
  body: (context: FlowContext) => Effect.Effect<A, E, Scope.Scope>
) =>
  Effect.gen(function*() {
    const shared = yield* Env
    const counterDir = yield* tempDir
    const trace = new Trace()
    return yield* body({ ...shared, kernelUrl: shared.kernel.url, counterDir, trace }).pipe(
      Effect.onExit((exit) =>
        Exit.isFailure(exit) || process.env["REBUNO_PYTHON_SDK_TRACE"] !== undefined
          ? Effect.sync(() => console.error(trace.report()))
          : Effect.void
      )
    )
  })

/** A kernel of its own with a short lease, so a lost run is reclaimed quickly; the flow on it, and a client. */
const shortLeaseKernel = (t: FlowContext) =>
  Effect.gen(function*() {
    const kernel = yield* Kernel.start({ stage: "current", settings: { leaseTimeoutMs: 3_000 } })
    const client = yield* Embedded.client(kernel.url)
    return { kernel, local: { ...t, kernelUrl: kernel.url }, client }
  })

/**
 * Runs a Python `Client` script of `test/python/` against `kernelUrl` through
 * a recording proxy (in the flow's trace); answers the JSON it printed.
 */
const runClientScript = (t: FlowContext, kernelUrl: string, script: string, env?: Record<string, string>) =>
  Effect.gen(function*() {
    const clientProxy = yield* recordingProxy(kernelUrl)
    t.trace.entries.push({ name: script, output: () => "(in the error, if it failed)", proxy: clientProxy })
    const report = (yield* runScript({
      python: t.python,
      script,
      kernelUrl: clientProxy.url,
      counterDir: t.counterDir,
      timeoutMs: 45_000,
      env
    })) as Json
    return { report, clientProxy }
  })

/** Every request the SDK sent was signed `v1=` and answered 2xx. */
const expectCleanWire = (proxy: RecordingProxy) => {
  const signed = proxy.exchanges.filter((e) => e.headers["rebuno-signature"] !== undefined)
  expect(signed.length).toBeGreaterThan(0)
  for (const e of signed) expect(e.headers["rebuno-signature"]).toMatch(/^v1=[0-9a-f]{64}$/)
  expect(proxy.exchanges.filter((e) => e.status >= 300).map((e) => `${e.method} ${e.path} → ${e.status} ${e.answer}`))
    .toEqual([])
}

const submitsOf = (proxy: RecordingProxy, target: string) =>
  proxy.exchanges.filter((e) =>
    e.method === "POST" && /\/steps$/.test(e.path) && (safeParse(e.body) as Json)?.target === target
  ).map((e) => ({
    dispatchId: e.headers["rebuno-dispatch-id"],
    body: safeParse(e.body) as Json,
    answer: safeParse(e.answer) as Json
  }))

// --- the flows ----------------------------------------------------------------

layer(EnvLive, { timeout: "480 seconds", excludeTestServices: true })("Python SDK 0.29.2 (unmodified)", (it) => {
  it.effect("hello: two tools, its metadata published, v1 signatures only", () =>
    flow((t) =>
      Effect.gen(function*() {
        const { proxy } = yield* launch(t, { script: "hello.py", agentId: "hello" })
        const query = "héllo wörld 🙂 again"
        const created = yield* t.client.create("hello", { query })
        const done = yield* waitTerminal(t.kernelUrl, created.id)
        expect(done.status).toBe("completed")
        expect(done.output).toEqual({ query, reversed: "niaga 🙂 dlröw olléh", word_count: 4 })

        const steps = yield* t.client.listSteps(created.id)
        expect(steps.map((s) => s.target).sort()).toEqual(["reverse", "word_count"])
        for (const step of steps) {
          const argsHash = StepId.argsHash(JSON.stringify(step.args))
          expect(step.argsHash).toBe(argsHash)
          expect(step.stepId).toBe(
            StepId.make({ executionId: created.id, kind: "tool_call", target: step.target, argsHash, occurrence: 0 })
          )
        }
        expect(lifecycle(yield* t.client.events(created.id))).toEqual(TWO_STEPS_COMPLETED)

        // C.3: published once at start-up, with the schema of `process(query: str)`
        const metadata = proxy.exchanges.filter((e) => e.path === "/v0/agents/hello/metadata")
        expect(metadata.map((e) => [e.method, e.status])).toEqual([["PUT", 204]])
        expect(JSON.parse(metadata[0]!.body)).toEqual({
          description: "Reverses a query and counts its words.",
          input_schema: {
            properties: { query: { title: "Query", type: "string" } },
            required: ["query"],
            title: "process",
            type: "object"
          },
          output_schema: {
            type: "object",
            properties: {
              query: { type: "string" },
              reversed: { type: "string" },
              word_count: { type: "integer" }
            },
            required: ["query", "reversed", "word_count"]
          }
        })
        // …and the kernel stored it on the agent (C.3.3)
        const stored = (yield* t.kernel.core.getAgent("hello")).metadata
        expect(stored?.description).toBe("Reverses a query and counts its words.")
        expect(JSON.parse(stored?.inputSchemaRaw ?? "null")).toEqual(JSON.parse(metadata[0]!.body).input_schema)
        expect(JSON.parse(stored?.outputSchemaRaw ?? "null")).toEqual(JSON.parse(metadata[0]!.body).output_schema)
        expectCleanWire(proxy)
      })
    ), 60_000)

  it.effect("approval: the Python client grants, the deploy runs once", () =>
    flow((t) =>
      Effect.gen(function*() {
        const { proxy } = yield* launch(t, {
          script: "deployer.py",
          agentId: "deployer",
          policy: [
            "default_action: deny",
            "rules:",
            "  - id: allow-tests",
            "    when: { target: run_tests }",
            "    then: { decision: allow }",
            "  - id: approve-production-deploys",
            "    when:",
            "      target: deploy",
            "      arguments: { environment: { equals: production } }",
            "    then:",
            "      decision: require_approval",
            "      reason: production deploys need a human",
            "      approval_config: { approvers: [alice], timeout: 10m, message: \"Deploy to production?\" }",
            ""
          ].join("\n")
        })
        // the Python client's calls go through a recording proxy too
        const { report, clientProxy } = yield* runClientScript(t, t.kernelUrl, "approve.py")
        const id: string = report.created.id
        expect(report.created).toMatchObject({ agent_id: "deployer", status: "running", input: { service: "billing" } })
        expect(report.blocked.status).toBe("blocked")
        expect(report.approval).toMatchObject({ execution_id: id, status: "pending", message: "Deploy to production?" })
        expect(report.pending_after).toEqual([])
        expect(report.final).toMatchObject({
          status: "completed",
          output: {
            tests: { service: "billing", passed: true },
            deployed: { service: "billing", environment: "production", deploys: 1 }
          }
        })
        expect(counter(t.counterDir, "deploy")).toBe(1)

        const granted = yield* t.client.getApproval(report.approval.id)
        expect(granted).toMatchObject({ status: "granted", decidedBy: "alice", rationale: "tests passed" })
        const types = (report.events as Array<Json>).map((e) => e.type)
        expect(types.filter((t) => !t.startsWith("dispatch."))).toEqual([
          "execution.created",
          "execution.started",
          ...STEP_SUCCEEDED,
          "step.proposed",
          "step.awaiting_approval",
          "approval.requested",
          "execution.blocked",
          "approval.granted",
          "step.allowed",
          "execution.resumed",
          "step.executing",
          "step.succeeded",
          "execution.completed"
        ])
        const awaiting = (report.events as Array<Json>).find((e) => e.type === "step.awaiting_approval")
        expect(awaiting.payload).toMatchObject({ target: "deploy", rule_id: "approve-production-deploys" })
        // the blocked submit (naming the approval the client granted), then the resubmit after the grant
        const deploys = submitsOf(proxy, "deploy")
        expect(deploys.map((s) => s.answer.decision)).toEqual(["blocked", "proceed"])
        expect(deploys[0]!.answer).toEqual({
          decision: "blocked",
          step_id: report.approval.step_id,
          approval_id: report.approval.id
        })
        expectCleanWire(proxy)
        expect(clientProxy.exchanges.filter((e) => e.status >= 300)).toEqual([])
        expect(clientProxy.exchanges.filter((e) => e.path.includes("/grant")).map((e) => JSON.parse(e.body))).toEqual([
          { rationale: "tests passed", decided_by: "alice" }
        ])
      })
    ), 60_000)

  it.effect("crash and replay: SIGKILL mid-run, the recorded step replays", () =>
    flow((t) =>
      Effect.gen(function*() {
        const { kernel, local, client } = yield* shortLeaseKernel(t)
        const { agent, proxy, restart } = yield* launch(local, {
          script: "crashy.py",
          agentId: "crashy",
          env: { HANG_IN_SHIP: "1" }
        })
        const created = yield* client.create("crashy", { order: "o-1", amount: 42 })
        yield* waitFor("ship to start", Effect.sync(() => counter(t.counterDir, "ship")), (n) => n === 1)
        yield* agent.kill("SIGKILL")
        const killedAt = proxy.exchanges.length
        expect((yield* readExecution(kernel.url, created.id)).status).toBe("running")

        yield* restart()
        const done = yield* waitTerminal(kernel.url, created.id, 30_000)
        expect(done.status).toBe("completed")
        expect(done.output).toEqual({
          charged: { order: "o-1", amount: 42, charges: 1 },
          shipped: { order: "o-1", shipped: true, runs: 2 }
        })
        expect(counter(t.counterDir, "charge")).toBe(1)
        expect(counter(t.counterDir, "ship")).toBe(2)

        // the restarted process: charge replayed from the record, ship ran again
        const after = { ...proxy, exchanges: proxy.exchanges.slice(killedAt) }
        expect(submitsOf(after, "charge").map((s) => s.answer)).toEqual([
          expect.objectContaining({ decision: "replay", result: { order: "o-1", amount: 42, charges: 1 } })
        ])
        expect(submitsOf(after, "ship").map((s) => s.answer.decision)).toEqual(["proceed"])
        expect(after.exchanges.every((e) => e.headers["rebuno-dispatch-attempt"] !== "1")).toBe(true)

        const events = yield* client.events(created.id)
        expect(lifecycle(events)).toEqual(TWO_STEPS_COMPLETED)
        const acked = events.filter((e) => e.type === "dispatch.acked").map((e) => (e.payload as Json).attempt)
        expect(acked[0]).toBe(1)
        expect(acked.at(-1)).toBeGreaterThan(1)
        const steps = yield* client.listSteps(created.id)
        // (the list is sorted by step id, PROTOCOL 6.2)
        expect(steps.map((s) => [s.target, s.status]).sort()).toEqual([["charge", "succeeded"], ["ship", "succeeded"]])
      })
    ), 60_000)

  it.effect("sessions: the second execution reads the first's state", () =>
    flow((t) =>
      Effect.gen(function*() {
        const { proxy } = yield* launch(t, { script: "chat.py", agentId: "chat" })
        const session = "chat:u42:c7"
        const first = yield* t.client.create("chat", { message: "hi" }, { session })
        const second = yield* t.client.create("chat", { message: "how are you?" }, { session })
        // one running execution per session: the second waits (C.4.4)
        expect(first.status).toBe("running")
        expect(second.status).toBe("pending")

        const one = yield* waitTerminal(t.kernelUrl, first.id)
        const two = yield* waitTerminal(t.kernelUrl, second.id)
        expect(one).toMatchObject({ status: "completed", session, output: { turn: 1, previous: null } })
        expect(one.parent_execution_id).toBeUndefined()
        expect(two).toMatchObject({
          status: "completed",
          session,
          parent_execution_id: first.id,
          output: { turn: 2, previous: { messages: ["hi"] } }
        })
        const previous = yield* wire(t.kernelUrl, "GET", `/v0/executions/${second.id}/previous`)
        expect(previous).toMatchObject({ status: 200, json: { state: { messages: ["hi"] } } })

        const firstEvents = yield* t.client.events(first.id)
        const secondEvents = yield* t.client.events(second.id)
        expect(lifecycle(secondEvents)).toEqual(["execution.created", "execution.started", "execution.completed"])
        expect(secondEvents.find((e) => e.type === "execution.created")!.payload).toMatchObject({ status: "pending" })
        expect(secondEvents.find((e) => e.type === "execution.started")!.payload).toMatchObject({
          status: "running",
          session,
          parent_execution_id: first.id
        })
        // the second started only once the first had completed
        const completedAt = firstEvents.find((e) => e.type === "execution.completed")!.occurredAt
        const startedAt = secondEvents.find((e) => e.type === "execution.started")!.occurredAt
        expect(Date.parse(startedAt)).toBeGreaterThanOrEqual(Date.parse(completedAt))
        // `state` went up with complete, and previous() read it back
        const completes = proxy.exchanges.filter((e) => e.path.endsWith("/complete") && !e.path.includes("/steps/"))
        expect(completes.map((e) => JSON.parse(e.body))).toEqual([
          { output: { turn: 1, previous: null }, state: { messages: ["hi"] } },
          { output: { turn: 2, previous: { messages: ["hi"] } }, state: { messages: ["hi", "how are you?"] } }
        ])
        expectCleanWire(proxy)
      })
    ), 60_000)

  it.effect("subagent: the parent suspends, resumes with the child's output", () =>
    flow((t) =>
      Effect.gen(function*() {
        const child = yield* launch(t, { script: "researcher.py", agentId: "researcher" })
        const parent = yield* launch(t, { script: "planner.py", agentId: "planner" })
        const created = yield* t.client.create("planner", { topic: "rebuno" })
        const done = yield* waitTerminal(t.kernelUrl, created.id, 30_000)
        const findings = { summary: "1 fact about rebuno", facts: ["rebuno is durable"] }
        expect(done).toMatchObject({ status: "completed", output: { topic: "rebuno", findings } })
        expect(counter(t.counterDir, "delegate")).toBe(1)
        expect(counter(t.counterDir, "lookup")).toBe(1)

        const [step] = yield* t.client.listSteps(created.id)
        expect(step).toMatchObject({ target: "delegate", status: "succeeded", result: findings })
        const children = (yield* t.client.list({ agentId: "researcher" })).executions
        expect(children).toHaveLength(1)
        const childJson = yield* readExecution(t.kernelUrl, children[0]!.id)
        expect(childJson).toMatchObject({
          status: "completed",
          output: findings,
          spawned_by: { execution_id: created.id, step_id: step!.stepId }
        })

        const events = yield* t.client.events(created.id)
        expect(lifecycle(events)).toEqual([
          "execution.created",
          "execution.started",
          "step.proposed",
          "step.allowed",
          "step.executing",
          "execution.blocked",
          "step.succeeded",
          "execution.resumed",
          "execution.completed"
        ])
        expect(events.find((e) => e.type === "execution.blocked")!.payload).toMatchObject({ reason: "awaiting_steps" })
        expect(
          parent.proxy.exchanges.filter((e) => e.path.endsWith("/suspend")).map((e) => [e.status, safeParse(e.answer)])
        ).toEqual([[200, { suspended: true }]])
        // the rerun replayed the step with the child's output
        expect(submitsOf(parent.proxy, "delegate").map((s) => s.answer.decision)).toEqual(["proceed", "replay"])
        expectCleanWire(child.proxy)
        expectCleanWire(parent.proxy)
      })
    ), 60_000)

  it.effect("rate-limit parking: the execution waits, then completes", () =>
    flow((t) =>
      Effect.gen(function*() {
        const { proxy } = yield* launch(t, {
          script: "poller.py",
          agentId: "poller",
          policy: [
            "default_action: deny",
            "rules:",
            "  - id: ping-rate",
            "    when: { target: ping }",
            "    then:",
            "      decision: allow",
            "      rate_limit: { max_calls: 1, window: 2s, max_wait: 10s }",
            ""
          ].join("\n")
        })
        const created = yield* t.client.create("poller", { count: 2 })
        const done = yield* waitTerminal(t.kernelUrl, created.id, 30_000)
        expect(done.status).toBe("completed")
        const pings = done.output.pings as Array<Json>
        expect(pings.map((p) => [p.n, p.pings])).toEqual([[0, 1], [1, 2]])
        expect(counter(t.counterDir, "ping")).toBe(2)
        // the second ping ran only after the limiter's wait (about the 2 s window)
        expect(pings[1].at - pings[0].at).toBeGreaterThan(1.5)

        // C.8.3: parked with `blocked` and no approval id; redelivered; resubmitted
        const secondPing = submitsOf(proxy, "ping").filter((s) => s.body.args.n === 1)
        expect(secondPing.map((s) => s.answer)).toEqual([
          { decision: "blocked", reason: "rate_limit_exceeded" },
          expect.objectContaining({ decision: "proceed" })
        ])
        // …under a new dispatch: the parked one was retired
        expect(secondPing[1]!.dispatchId).not.toBe(secondPing[0]!.dispatchId)
        const events = yield* t.client.events(created.id)
        expect(lifecycle(events)).toEqual([
          "execution.created",
          "execution.started",
          ...STEP_SUCCEEDED,
          "step.rate_limited",
          ...STEP_SUCCEEDED,
          "execution.completed"
        ])
        expect(events.find((e) => e.type === "step.rate_limited")!.payload).toMatchObject({
          step_type: "tool_call",
          target: "ping",
          rule_id: "ping-rate",
          error: { reason: "rate_limit_exceeded", rule_id: "ping-rate" }
        })
        expectCleanWire(proxy)
      })
    ), 60_000)

  it.effect("resources: a checkpointed directory, a crash mid-run, and a fork restored from the last checkpoint", () =>
    flow((t) =>
      Effect.gen(function*() {
        const { kernel, local, client } = yield* shortLeaseKernel(t)
        const root = yield* tempDir
        const env = { WORKSPACE_ROOT: root }
        const { agent, proxy, restart } = yield* launch(local, {
          script: "workspace.py",
          agentId: "workspace",
          env: { ...env, HANG_ON: "c.txt" }
        })
        const files = [
          { name: "a.txt", text: "alpha" },
          { name: "b.txt", text: "bravo" },
          { name: "c.txt", text: "charlie" }
        ]
        const created = yield* client.create("workspace", { files })
        yield* waitFor("the write of c.txt to start", Effect.sync(() => counter(t.counterDir, "write_c.txt")), (n) => n === 1)
        yield* agent.kill("SIGKILL")
        const killedAt = proxy.exchanges.length

        // the restarted process reopens the bound directory (a partial write included), replays a and b
        yield* restart(env)
        const done = yield* waitTerminal(kernel.url, created.id, 30_000)
        const abc = { "a.txt": "alpha", "b.txt": "bravo", "c.txt": "charlie" }
        expect(done).toMatchObject({
          status: "completed",
          output: { initial: { "a.txt": "alpha", "b.txt": "bravo", "c.txt": "PARTIAL" }, files: abc }
        })
        expect([1, 1, 2]).toEqual(["a.txt", "b.txt", "c.txt"].map((name) => counter(t.counterDir, `write_${name}`)))
        const after = { ...proxy, exchanges: proxy.exchanges.slice(killedAt) }
        expect(after.exchanges.filter((e) => e.status >= 300)).toEqual([])
        expect(submitsOf(after, "write_file").map((s) => s.answer.decision)).toEqual(["replay", "replay", "proceed"])

        // what the kernel recorded: registration, binding, a baseline and one capture per write (C.6)
        const events = yield* client.events(created.id)
        const resourceEvents = events.filter((e) => e.type.startsWith("resource."))
        expect(resourceEvents.map((e) => [e.type, (e.payload as Json).generation])).toEqual([
          ["resource.registered", undefined],
          ["resource.bound", undefined],
          ["resource.checkpointed", 0],
          ["resource.checkpointed", 1],
          ["resource.checkpointed", 2],
          // the rerun's baseline while the orphaned write of c.txt still counts as a writer
          ["resource.checkpoint_failed", 3],
          ["resource.checkpointed", 4],
          // on completion, after list_files touched the directory
          ["resource.checkpointed", 5]
        ])
        expect(resourceEvents[0]!.payload).toEqual({
          key: "workspace",
          driver_id: "local.dir.v1",
          configuration: { store: "sha256" },
          coverage_reuse: false,
          every_steps: 1,
          on_completion: true
        })
        expect(resourceEvents[1]!.payload).toEqual({ key: "workspace", binding: { path: done.output.path } })
        expect(resourceEvents[5]!.payload).toMatchObject({ error: "writers_active" })

        // restore: fork at the checkpoint taken after b.txt, with the SDK's Client.fork
        const afterB = resourceEvents[4]!
        const bRef = (afterB.payload as Json).checkpoint_ref as string
        const { report, clientProxy } = yield* runClientScript(t, kernel.url, "forker.py", {
          SOURCE_ID: created.id,
          AT_SEQ: String(afterB.eventSeq)
        })
        expect(report.forked).toMatchObject({
          agent_id: "workspace",
          status: "running",
          forked_from: created.id,
          fork_seq: afterB.eventSeq,
          input: { files },
          restoration: {
            workspace: { checkpoint_ref: bRef, checkpoint_seq: (afterB.payload as Json).covered_seq, covered: true }
          }
        })
        const fork = yield* waitTerminal(kernel.url, report.forked.id, 30_000)
        // the fork's directory started as of the checkpoint (no partial c.txt), a and b replayed, c ran live
        expect(fork).toMatchObject({
          status: "completed",
          forked_from: created.id,
          output: { initial: { "a.txt": "alpha", "b.txt": "bravo" }, files: abc }
        })
        expect(fork.output.path).not.toBe(done.output.path)
        expect(fork.restoration).toBeUndefined()
        expect([1, 1, 3]).toEqual(["a.txt", "b.txt", "c.txt"].map((name) => counter(t.counterDir, `write_${name}`)))
        const forkEvents = yield* client.events(report.forked.id)
        expect(forkEvents.filter((e) => e.type.startsWith("resource.")).map((e) => e.type).slice(0, 5)).toEqual([
          "resource.registered",
          "resource.initialized",
          "resource.checkpointed",
          "resource.checkpointed",
          "resource.checkpointed"
        ])
        expect(forkEvents.find((e) => e.type === "resource.initialized")!.payload).toEqual({
          key: "workspace",
          generation: 2,
          checkpoint_ref: bRef
        })
        expect(clientProxy.exchanges.map((e) => [e.method, e.path, e.status])).toEqual([
          ["POST", `/v0/executions/${created.id}/fork`, 201]
        ])
        expect(JSON.parse(clientProxy.exchanges[0]!.body)).toEqual({ at_seq: afterB.eventSeq })
      })
    ), 90_000)

  it.effect("forks: Client.fork replays the copied steps and runs the rest live, under the fork's policy", () =>
    flow((t) =>
      Effect.gen(function*() {
        const { proxy } = yield* launch(t, { script: "pipeline.py", agentId: "pipeline" })
        const created = yield* t.client.create("pipeline", { topic: "rebuno" })
        const done = yield* waitTerminal(t.kernelUrl, created.id)
        const fetched = { topic: "rebuno", facts: ["rebuno is durable"], fetches: 1 }
        expect(done).toMatchObject({
          status: "completed",
          output: { fetched, published: { summary: "rebuno is durable", publishes: 1 } }
        })
        const events = yield* t.client.events(created.id)
        const fetchSettled = events.find((e) => e.type === "step.succeeded")!.eventSeq

        const fork = (env: Record<string, string>) =>
          Effect.gen(function*() {
            const { report, clientProxy } = yield* runClientScript(t, t.kernelUrl, "forker.py", {
              SOURCE_ID: created.id,
              AT_SEQ: String(fetchSettled),
              ...env
            })
            expect(clientProxy.exchanges.map((e) => e.status)).toEqual([201])
            return report.forked as Json
          })

        // a fork with its own policy: fetch replays, publish is denied live
        const denying = yield* fork({
          FORK_POLICY: [
            "default_action: allow",
            "rules:",
            "  - id: no-publish",
            "    when: { target: publish }",
            "    then: { decision: deny, reason: publishing is off in this branch }",
            ""
          ].join("\n")
        })
        expect(denying).toMatchObject({
          agent_id: "pipeline",
          status: "running",
          forked_from: created.id,
          fork_seq: fetchSettled,
          input: { topic: "rebuno" }
        })
        expect(denying.restoration).toBeNull()
        const denied = yield* waitTerminal(t.kernelUrl, denying.id)
        expect(denied).toMatchObject({
          status: "completed",
          // the SDK's wrapper hands the denial to the caller as text (C.11, §14.6)
          output: {
            fetched,
            published: "publish not allowed. reason: [policy_denied] publishing is off in this branch (HTTP 403)"
          }
        })
        const denial = (yield* t.client.events(denying.id)).find((e) => e.type === "step.denied")!
        expect(denial.payload).toMatchObject({
          target: "publish",
          rule_id: "no-publish",
          error: { reason: "publishing is off in this branch", rule_id: "no-publish" }
        })
        const forkedEvents = yield* t.client.events(denying.id)
        expect(forkedEvents.slice(0, 2).map((e) => [e.type, e.payload])).toEqual([
          ["execution.created", { execution_id: denying.id, status: "pending" }],
          ["execution.forked", { fork_seq: fetchSettled, policy_override: true, source_execution_id: created.id }]
        ])
        expect(lifecycle(forkedEvents)).toEqual([
          "execution.created",
          "execution.forked",
          ...STEP_SUCCEEDED,
          "execution.started",
          "step.proposed",
          "step.denied",
          "execution.completed"
        ])

        // a fork without one: publish runs again, live (at_most_once included)
        const live = yield* fork({ FORK_SESSION: "what-if" })
        expect(live).toMatchObject({ session: "what-if", status: "running" })
        const published = yield* waitTerminal(t.kernelUrl, live.id)
        expect(published).toMatchObject({
          status: "completed",
          session: "what-if",
          output: { fetched, published: { summary: "rebuno is durable", publishes: 2 } }
        })
        expect(counter(t.counterDir, "fetch")).toBe(1)
        expect(counter(t.counterDir, "publish")).toBe(2)
        // every fetch in the forks replayed the recorded step
        expect(submitsOf(proxy, "fetch").map((s) => s.answer.decision)).toEqual(["proceed", "replay", "replay"])
        expectCleanWire(proxy)
      })
    ), 60_000)
})
