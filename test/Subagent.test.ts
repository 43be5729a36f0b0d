/**
 * Subagent calls (PROTOCOL-CURRENT C.5) against the scripted kernel: the step,
 * the child bound to it, the one suspend for every waiting call, the quiet end
 * of the run, the replay of the child's outcome and the error mapping of
 * C.5.4 #5.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Layer, Schema } from "effect"
import * as Agent from "../src/Agent.js"
import {
  Abandoned,
  Blocked,
  InvalidArguments,
  KernelError,
  LeaseSuperseded,
  PolicyError,
  StatusError,
  StepDecodeError,
  SubagentError,
  Terminated,
  ToolError
} from "../src/RebunoError.js"
import * as Signature from "../src/Signature.js"
import * as Subagent from "../src/Subagent.js"
import * as Tool from "../src/Tool.js"
import * as Kernel from "effect-rebuno/kernel"
import { TestKernel } from "effect-rebuno/testing"
import * as Embedded from "./support/embedded.js"
import { FakeKernel, SECRET } from "./support/FakeKernel.js"

const EXEC = "0192f1a0-0000-7000-8000-000000000000"
const D1 = "0192f1a0-0000-7000-8000-0000000000d1"
const D2 = "0192f1a0-0000-7000-8000-0000000000d2"

const encoder = new TextEncoder()

const deliver = (rt: Agent.AgentRuntime, dispatch = D1, attempt = 1) =>
  Effect.gen(function*() {
    const body = encoder.encode(JSON.stringify({
      execution_id: EXEC,
      dispatch_id: dispatch,
      dispatch_attempt: attempt,
      lease_timeout_seconds: 60
    }))
    const status = yield* rt.handleWebhook({ body, signature: yield* Signature.sign(SECRET, body) })
    expect(status).toBe(200)
    yield* rt.awaitIdle
  })

const summarize = Subagent.make({
  agentId: "summarizer",
  input: Schema.Struct({ text: Schema.String }),
  output: Schema.Struct({ summary: Schema.String })
})

/** What the handler saw fail, for the assertions. */
const seen: Array<unknown> = []
const observe = <A, E, R>(self: Effect.Effect<A, E, R>) =>
  Effect.tapError(self, (e) => Effect.sync(() => seen.push(e)))

/** Summarises every document concurrently; every call runs to its end (none interrupts the others). */
const researcher = Agent.make({
  id: "researcher",
  input: Schema.Struct({ documents: Schema.Array(Schema.String) }),
  handler: ({ documents }) =>
    Effect.forEach(documents, (text) => Effect.exit(observe(summarize({ text }))), { concurrency: "unbounded" }).pipe(
      Effect.flatMap((exits) => Effect.all(exits)),
      Effect.map((summaries) => summaries.map((s) => s.summary))
    )
})

const setup = <In, A, E, R>(agent: Agent.Agent<In, A, E, R>, fake: FakeKernel) => {
  seen.length = 0
  return Agent.runtime(agent).pipe(
    Effect.provide(Layer.merge(fake.layer, fake.clientLayer)),
    Effect.map((rt) => rt as Agent.AgentRuntime)
  )
}

const ops = (fake: FakeKernel) => fake.ops().map((c) => c.op)

/** A fresh dispatch after the children settled: the kernel would redeliver with a new lease. */
const resume = (fake: FakeKernel) => {
  fake.executions.get(EXEC)!.status = "running"
  fake.calls.length = 0
}

describe("Subagent: the first run (C.5.1, C.5.2)", () => {
  it.effect("submits a tool_call step, creates the child bound to it, suspends once and ends quietly", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { documents: ["doc one"] })
      const rt = yield* setup(researcher, fake)
      yield* deliver(rt)
      expect(ops(fake)).toEqual(["getExecution", "submitStep", "suspend"])
      const submit = fake.ops("submitStep")[0]!
      expect(submit.submission).toEqual({
        kind: "tool_call",
        target: "summarizer",
        argsJson: "{\"text\":\"doc one\"}",
        idempotency: "safe_to_retry"
      })
      expect(fake.created).toEqual([{
        executionId: "child-0",
        agentId: "summarizer",
        input: { text: "doc one" },
        options: { spawnedBy: { executionId: EXEC, stepId: "step-0" } }
      }])
      // the suspend carries the run's lease; the run posted no outcome
      expect(fake.ops("suspend")[0]!.lease).toEqual({ dispatchId: D1, attempt: 1 })
      expect(seen).toHaveLength(1)
      expect(seen[0]).toBeInstanceOf(Blocked)
      expect(seen[0]).toMatchObject({ stepId: "step-0", reason: "awaiting_steps" })
      expect((seen[0] as Blocked).message).toBe("execution suspended awaiting its subagents")
      expect(fake.executions.get(EXEC)!.status).toBe("blocked")
    }))

  it.effect("several concurrent calls: every child is created, then one suspend for all", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { documents: ["a", "b", "c"] })
      const rt = yield* setup(researcher, fake)
      yield* deliver(rt)
      expect(fake.created.map((c) => [c.input, c.options?.spawnedBy?.stepId])).toEqual([
        [{ text: "a" }, "step-0"],
        [{ text: "b" }, "step-1"],
        [{ text: "c" }, "step-2"]
      ])
      expect(fake.ops("suspend")).toHaveLength(1)
      expect(ops(fake).indexOf("suspend")).toBe(ops(fake).length - 1)
      expect(seen.map((e) => (e as Blocked)._tag)).toEqual(["Blocked", "Blocked", "Blocked"])
      expect(ops(fake).filter((op) => op === "completeExecution" || op === "failExecution")).toEqual([])
    }))

  it.effect("a tool still running holds the suspend until its outcome is recorded", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const gate = yield* Deferred.make<void>()
      const slow = Tool.make("slow", {
        args: Schema.Struct({}),
        success: Schema.String,
        execute: () => Effect.as(Deferred.await(gate), "done")
      })
      const agent = Agent.make({
        id: "researcher",
        handler: () => Effect.all([summarize({ text: "x" }), slow({})], { concurrency: "unbounded" })
      })
      const rt = yield* setup(agent, fake)
      const body = encoder.encode(JSON.stringify({ execution_id: EXEC, dispatch_id: D1, dispatch_attempt: 1 }))
      yield* rt.handleWebhook({ body, signature: yield* Signature.sign(SECRET, body) })
      for (let i = 0; i < 100 && fake.created.length === 0; i++) yield* Effect.yieldNow
      for (let i = 0; i < 20; i++) yield* Effect.yieldNow
      expect(fake.created).toHaveLength(1)
      expect(fake.ops("suspend")).toHaveLength(0)
      yield* Deferred.succeed(gate, undefined)
      yield* rt.awaitIdle
      const order = ops(fake)
      expect(order.filter((op) => op === "completeStep" || op === "suspend")).toEqual(["completeStep", "suspend"])
      expect(fake.step("step-1")).toMatchObject({ target: "slow", status: "succeeded", result: "done" })
    }))

  it.effect("called inside a tool's body, it does not wait for that tool", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const delegate = Tool.make("delegate", {
        args: Schema.Struct({ text: Schema.String }),
        success: Schema.String,
        execute: ({ text }) => Effect.map(summarize({ text }), (s) => s.summary)
      })
      const agent = Agent.make({ id: "researcher", handler: () => delegate({ text: "x" }) })
      const rt = yield* setup(agent, fake)
      yield* deliver(rt)
      expect(fake.ops("submitStep").map((c) => c.submission!.target)).toEqual(["delegate", "summarizer"])
      expect(fake.created.map((c) => c.options?.spawnedBy?.stepId)).toEqual(["step-1"])
      expect(fake.ops("suspend")).toHaveLength(1)
      // the enclosing step records nothing: the run ended quietly
      expect(ops(fake).filter((op) => op.endsWith("Step") && op !== "submitStep")).toEqual([])
    }))

  it.effect("the child's session is sent when given (per call, else the definition's)", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const chat = Subagent.make({
        agentId: "chat",
        input: Schema.String,
        output: Schema.String,
        target: "ask_chat",
        session: "default-session"
      })
      const agent = Agent.make({
        id: "researcher",
        handler: () =>
          Effect.all([chat("one"), chat("two", { session: "thread-7" })], { concurrency: "unbounded" })
      })
      const rt = yield* setup(agent, fake)
      yield* deliver(rt)
      expect(fake.ops("submitStep").map((c) => [c.submission!.target, c.submission!.argsJson])).toEqual([
        ["ask_chat", "\"one\""],
        ["ask_chat", "\"two\""]
      ])
      expect(fake.created.map((c) => [c.agentId, c.input, c.options?.session])).toEqual([
        ["chat", "one", "default-session"],
        ["chat", "two", "thread-7"]
      ])
      expect(chat.agentId).toBe("chat")
      expect(chat.target).toBe("ask_chat")
    }))
})

describe("Subagent: the redelivered run (C.5.3, C.5.4 #3)", () => {
  it.effect("replays the child's output, decoded with the output Schema", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { documents: ["a", "b"] })
      const rt = yield* setup(researcher, fake)
      yield* deliver(rt)
      fake.settleChild("child-0", { output: { summary: "A" } })
      fake.settleChild("child-1", { output: { summary: "B" } })
      resume(fake)
      yield* deliver(rt, D2)
      expect(ops(fake)).toEqual(["getExecution", "submitStep", "submitStep", "completeExecution"])
      expect(fake.ops("completeExecution")[0]!.json).toBe("[\"A\",\"B\"]")
      expect(fake.created).toHaveLength(2)
    }))

  it.effect("a failed child is a SubagentError with its execution id and reason; unhandled, the execution fails", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { documents: ["a"] })
      const rt = yield* setup(researcher, fake)
      yield* deliver(rt)
      fake.settleChild("child-0", { failed: "agent_error: Boom: x" })
      resume(fake)
      yield* deliver(rt, D2)
      const error = seen[seen.length - 1]
      expect(error).toBeInstanceOf(SubagentError)
      expect(error).toMatchObject({
        agentId: "summarizer",
        executionId: "child-0",
        reason: "subagent_failed",
        failureReason: "agent_error: Boom: x",
        target: "summarizer",
        stepId: "step-0",
        cancelled: false
      })
      expect(fake.ops("failExecution")[0]!.reason).toBe("tool_error: summarizer: subagent_failed: agent_error: Boom: x")
    }))

  it.effect("a cancelled child, caught by the handler", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const agent = Agent.make({
        id: "researcher",
        handler: () =>
          summarize({ text: "x" }).pipe(
            Effect.map((s) => s.summary),
            Effect.catchTag("SubagentError", (e) => Effect.succeed(`${e.executionId} ${e.cancelled ? "cancelled" : "failed"}`))
          )
      })
      const rt = yield* setup(agent, fake)
      yield* deliver(rt)
      fake.settleChild("child-0", { cancelled: "parent_agent_terminal" })
      resume(fake)
      yield* deliver(rt, D2)
      expect(fake.ops("completeExecution")[0]!.json).toBe("\"child-0 cancelled\"")
    }))

  it.effect("another recorded error is a ToolError; an output that does not decode is a StepDecodeError", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { documents: ["a", "b"] })
      const rt = yield* setup(researcher, fake)
      yield* deliver(rt)
      fake.step("step-0")!.status = "failed"
      fake.step("step-0")!.error = { message: "cannot start subagent summarizer: not found" }
      fake.settleChild("child-1", { output: { wrong: true } })
      resume(fake)
      yield* deliver(rt, D2)
      expect(seen.slice(-2).map((e) => (e as { _tag: string })._tag).sort()).toEqual(["StepDecodeError", "ToolError"])
      const tool = seen.find((e) => e instanceof ToolError) as ToolError
      expect(tool.message).toBe("summarizer: cannot start subagent summarizer: not found")
      expect(seen.find((e) => e instanceof StepDecodeError)).toMatchObject({ target: "summarizer" })
    }))

  it.effect("a child that settled before the suspend ({\"suspended\":false}): the step is read and returned at once", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const agent = Agent.make({ id: "researcher", handler: () => summarize({ text: "a" }) })
      // the child ends before the suspend arrives: the kernel has settled the step, nothing waits
      fake.onSuspend = () =>
        Effect.sync(() => {
          fake.settleChild("child-0", { output: { summary: "fast" } })
          return false
        })
      const rt = yield* setup(agent, fake)
      yield* deliver(rt)
      expect(ops(fake)).toEqual(["getExecution", "submitStep", "suspend", "getStep", "completeExecution"])
      expect(fake.ops("completeExecution")[0]!.json).toBe("{\"summary\":\"fast\"}")
    }))

  it.effect("suspended:false with a failed child: SubagentError at once", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { documents: ["a"] })
      fake.onSuspend = () =>
        Effect.sync(() => {
          fake.settleChild("child-0", { failed: "agent_error: E: e" })
          return false
        })
      const rt = yield* setup(researcher, fake)
      yield* deliver(rt)
      expect(seen[0]).toMatchObject({ _tag: "SubagentError", executionId: "child-0", failureReason: "agent_error: E: e" })
      expect(fake.ops("failExecution")[0]!.reason).toBe("tool_error: summarizer: subagent_failed: agent_error: E: e")
    }))
})

describe("Subagent: errors (C.5.4 #5)", () => {
  const withSuspend = (answer: Effect.Effect<boolean, KernelError | LeaseSuperseded | Terminated>) =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { documents: ["a", "b"] })
      fake.onSuspend = () => answer
      const rt = yield* setup(researcher, fake)
      yield* deliver(rt)
      return fake
    })

  it.effect("409 lease_superseded stops the run: nothing recorded", () =>
    Effect.gen(function*() {
      const fake = yield* withSuspend(Effect.fail(new LeaseSuperseded()))
      expect(ops(fake)).toEqual(["getExecution", "submitStep", "submitStep", "suspend"])
      expect(fake.ops("suspend")).toHaveLength(1)
    }))

  it.effect("409 execution_terminal ends the run quietly (Terminated for every waiting call)", () =>
    Effect.gen(function*() {
      const fake = yield* withSuspend(Effect.fail(new Terminated()))
      expect(ops(fake)).toEqual(["getExecution", "submitStep", "submitStep", "suspend"])
      expect(seen.map((e) => (e as Terminated)._tag)).toEqual(["Terminated", "Terminated"])
    }))

  it.effect("any other error fails each waiting step (ToolError), and the execution", () =>
    Effect.gen(function*() {
      const fake = yield* withSuspend(
        Effect.fail(new KernelError({ reason: new StatusError({ status: 409, code: "conflict", description: "conflict: x" }) }))
      )
      expect(fake.ops("failStep").map((c) => [c.stepId, JSON.parse(c.json!)])).toEqual([
        ["step-0", { message: "cannot suspend for subagent summarizer: Status 409 conflict: conflict: x" }],
        ["step-1", { message: "cannot suspend for subagent summarizer: Status 409 conflict: conflict: x" }]
      ])
      expect(seen.every((e) => e instanceof ToolError)).toBe(true)
      expect(fake.ops("failExecution")[0]!.reason).toBe(
        "tool_error: summarizer: cannot suspend for subagent summarizer: Status 409 conflict: conflict: x"
      )
    }))

  it.effect("a transport failure of the suspend abandons the run", () =>
    Effect.gen(function*() {
      const fake = yield* withSuspend(Effect.fail(FakeKernel.transport("suspend")))
      expect(seen.every((e) => e instanceof Abandoned)).toBe(true)
      expect(ops(fake)).toEqual(["getExecution", "submitStep", "submitStep", "suspend"])
    }))

  it.effect("the child cannot be created: the step fails with the reason (a ToolError); a transport failure abandons", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { documents: ["a"] })
      fake.onCreate = () =>
        Effect.fail(new KernelError({ reason: new StatusError({ status: 404, code: "not_found", description: "not found" }) }))
      const rt = yield* setup(researcher, fake)
      yield* deliver(rt)
      expect(JSON.parse(fake.ops("failStep")[0]!.json!)).toEqual({
        message: "cannot start subagent summarizer: Status 404 not_found: not found"
      })
      expect(fake.ops("suspend")).toHaveLength(0)
      expect(fake.ops("failExecution")[0]!.reason).toBe(
        "tool_error: summarizer: cannot start subagent summarizer: Status 404 not_found: not found"
      )

      const lost = new FakeKernel().addExecution(EXEC, { documents: ["a"] })
      lost.onCreate = () => Effect.fail(FakeKernel.transport("create"))
      const rt2 = yield* setup(researcher, lost)
      yield* deliver(rt2)
      expect(seen[0]).toBeInstanceOf(Abandoned)
      expect(ops(lost)).toEqual(["getExecution", "submitStep"])
    }))

  it.effect("an input that does not encode: InvalidArguments, nothing sent", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, {})
      const strict = Subagent.make({
        agentId: "summarizer",
        input: Schema.Struct({ n: Schema.Int }),
        output: Schema.Unknown
      })
      let error: unknown
      const agent = Agent.make({
        id: "researcher",
        handler: () => strict({ n: 1.5 }).pipe(Effect.tapError((e) => Effect.sync(() => { error = e })))
      })
      const rt = yield* setup(agent, fake)
      yield* deliver(rt)
      expect(error).toBeInstanceOf(InvalidArguments)
      expect(ops(fake)).toEqual(["getExecution", "failExecution"])
    }))

  it.effect("a denied subagent step is a PolicyError with its rule id; no child is created", () =>
    Effect.gen(function*() {
      const fake = new FakeKernel().addExecution(EXEC, { documents: ["a"] })
      fake.policy = () => ({ decision: "denied", reason: "no delegation", ruleId: "no-subagents" })
      const rt = yield* setup(researcher, fake)
      yield* deliver(rt)
      expect(seen[0]).toBeInstanceOf(PolicyError)
      expect(seen[0]).toMatchObject({ reason: "no delegation", ruleId: "no-subagents", target: "summarizer" })
      expect(fake.created).toHaveLength(0)
    }))

  it.effect("outside a run, or without a Client, it is a type error", () =>
    Effect.sync(() => {
      // @ts-expect-error a subagent call needs the Execution and a Client in context
      const outside: Effect.Effect<unknown> = summarize({ text: "x" })
      // @ts-expect-error the output is typed by the output Schema
      const wrong: Effect.Effect<number, unknown, unknown> = summarize({ text: "x" })
      // @ts-expect-error the input is typed by the input Schema
      const badInput = summarize({ text: 1 })
      expect([outside, wrong, badInput].every(Effect.isEffect)).toBe(true)
    }))
})

/** A real child: summarises a text, fails on "fail". */
const summarizer = Agent.make({
  id: "summarizer",
  input: Schema.Struct({ text: Schema.String }),
  output: Schema.Struct({ summary: Schema.String }),
  handler: ({ text }) =>
    text === "fail" ? Effect.fail(new Error("cannot summarise")) : Effect.succeed({ summary: text.toUpperCase() })
})

/** A real parent: one subagent call per document, concurrently; a failed child becomes text. */
const delegating = Agent.make({
  id: "researcher",
  input: Schema.Struct({ documents: Schema.Array(Schema.String) }),
  handler: ({ documents }) =>
    Effect.forEach(
      documents,
      (text) =>
        summarize({ text }).pipe(
          Effect.map((s) => s.summary),
          Effect.catchTag("SubagentError", (e) => Effect.succeed(`${e.reason}: ${e.failureReason}`))
        ),
      { concurrency: "unbounded" }
    )
})

describe("Subagent over HTTP on the embedded kernel (current stage)", () => {
  it.live("children run, the parent suspends once and completes with their outputs on the replay", () =>
    Effect.gen(function*() {
      const kernel = yield* Kernel.start({ port: 0 })
      yield* Embedded.serve(summarizer, kernel.url, "summarizer-secret")
      yield* Embedded.serve(delegating, kernel.url, "researcher-secret")
      const admin = yield* Embedded.client(kernel.url)
      const created = yield* admin.create("researcher", { documents: ["one", "fail", "two"] })
      const done = yield* Embedded.settled(admin, created.id)
      expect(done.status).toBe("completed")
      expect(done.output).toEqual(["ONE", "subagent_failed: agent_error: Error: cannot summarise", "TWO"])

      const steps = yield* admin.listSteps(created.id)
      expect(steps.map((s) => [s.kind, s.target, s.status]).sort()).toEqual([
        ["tool_call", "summarizer", "failed"],
        ["tool_call", "summarizer", "succeeded"],
        ["tool_call", "summarizer", "succeeded"]
      ])
      // every child is bound to its step
      const children = yield* admin.list({ agentId: "summarizer" })
      expect(children.executions).toHaveLength(3)
      for (const child of children.executions) {
        expect(child.spawnedBy?.executionId).toBe(created.id)
        expect(steps.map((s) => s.stepId)).toContain(child.spawnedBy?.stepId)
      }
      const types = (yield* admin.events(created.id)).map((e) => e.type)
      // one suspension for the three calls, then the redelivered run
      expect(types.filter((t) => t === "execution.blocked")).toHaveLength(1)
      expect(types.filter((t) => t === "execution.resumed")).toHaveLength(1)
      expect(types[types.length - 1]).toBe("execution.completed")
    }).pipe(Effect.scoped), 30_000)
})

describe("Subagent in the test kit (TestKernel, virtual time)", () => {
  for (const transport of ["direct", "http"] as const) {
    it.effect(`${transport}: the parent suspends once, its children run, the replay completes it`, () =>
      Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const result = yield* kernel.run(delegating, { documents: ["one", "fail", "two"] })
        expect(result.status).toBe("completed")
        expect(result.output).toEqual(["ONE", "subagent_failed: agent_error: Error: cannot summarise", "TWO"])
        expect(result.deliveries).toBe(2)
        expect(result.calls.filter((c) => c.call === "suspend")).toHaveLength(1)
        expect(result.events.filter((e) => e.type === "execution.blocked").map((e) => e.payload)).toEqual([
          { execution_id: result.executionId, status: "blocked", reason: "awaiting_steps" }
        ])
      }).pipe(Effect.provide(TestKernel.layer({ agents: [delegating, summarizer], transport }))))
  }
})
