/**
 * The operator's side over real HTTP, against the embedded kernel on a real
 * socket (`Kernel.start({ port: 0 })`) with `Client.layer` on undici, and an
 * agent served over HTTP with `Agent.layer`: approvals listed, read, granted
 * and denied; paginated listing; `follow` until terminal; live deltas over SSE;
 * agents admin and policy bundles. Real time, kept short.
 */
import { NodeHttpClient } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Fiber, Layer, Schema, Stream } from "effect"
import { Agent, Client, KernelClient, Tool } from "effect-rebuno"
import type { KernelError, Protocol } from "effect-rebuno"
import * as Kernel from "effect-rebuno/kernel"
import { serveAgent } from "../support/serveAgent.js"
import { types, yaml } from "./_harness.js"

const secret = "governance-secret"

/** A Client on undici for a kernel URL, living in the current scope. */
const clientFor = (baseUrl: string) =>
  Effect.map(
    Layer.build(Client.layer({ baseUrl }).pipe(Layer.provide(NodeHttpClient.layerUndici))),
    Context.get(Client.Client)
  )

/** A signed KernelClient on undici (what an agent process uses). */
const kernelClientFor = (baseUrl: string) =>
  Effect.map(
    Layer.build(KernelClient.layer({ baseUrl, secret }).pipe(Layer.provide(NodeHttpClient.layerUndici))),
    Context.get(KernelClient.KernelClient)
  )


/** Poll (real time) until the execution has this status. */
const awaitStatus = (client: Client.Client.Service, id: string, status: string) =>
  Effect.gen(function*() {
    for (let i = 0; i < 500; i++) {
      const execution = yield* client.get(id)
      if (execution.status === status) return execution
      yield* Effect.sleep(Duration.millis(10))
    }
    return yield* Effect.die(new Error(`execution ${id} never reached ${status}`))
  })

const gate = yaml(
  "default_action: allow",
  "rules:",
  "  - id: gate",
  "    when: { target: deploy }",
  "    then: { decision: require_approval, approval_config: { approvers: [alice], message: deploy 1.2? } }"
)

const makeShipper = () => {
  const count = { prepare: 0, deploy: 0 }
  const prepare = Tool.make("prepare", {
    args: Schema.Struct({}),
    success: Schema.String,
    execute: () => Effect.sync(() => (count.prepare++, "built"))
  })
  const deploy = Tool.make("deploy", {
    args: Schema.Struct({}),
    success: Schema.String,
    execute: () => Effect.sync(() => (count.deploy++, "deployed"))
  })
  const agent = Agent.make({
    id: "shipper",
    handler: () =>
      Effect.gen(function*() {
        const built = yield* prepare({})
        const shipped = yield* deploy({}).pipe(Effect.catchTag("PolicyError", (e) => Effect.succeed(`denied: ${e.reason}`)))
        return { built, shipped }
      })
  })
  return { count, agent }
}

/** A kernel, a client, and the shipper agent served over HTTP, registered and gated through the Client. */
const setupShipper = Effect.gen(function*() {
  const kernel = yield* Kernel.start({ port: 0, settings: { stage: "seed" } })
  const client = yield* clientFor(kernel.url)
  const shipper = makeShipper()
  const webhookUrl = yield* serveAgent(shipper.agent, kernel.url, secret)
  yield* client.registerAgent({ id: "shipper", webhookUrl, secret })
  yield* client.loadPolicy("shipper", gate)
  return { kernel, client, shipper }
})

const withoutDispatch = (events: ReadonlyArray<Protocol.Event>) =>
  types(events).filter((t) => !t.startsWith("dispatch."))

describe("Client over real HTTP", () => {
  it.live("approvals: list, get, a 403 for a non-approver, grant; follow streams every event and ends at the end", () =>
    Effect.gen(function*() {
      const { client, shipper } = yield* setupShipper
      const execution = yield* client.create("shipper", { version: "1.2" })
      expect(execution.status).toBe("running")
      yield* awaitStatus(client, execution.id, "blocked")

      const pending = yield* client.listApprovals()
      expect(pending).toHaveLength(1)
      const approval = pending[0]!
      expect(approval).toMatchObject({
        executionId: execution.id,
        status: "pending",
        approvers: ["alice"],
        message: "deploy 1.2?"
      })
      expect(yield* client.getApproval(approval.id)).toEqual(approval)
      const steps = yield* client.listSteps(execution.id)
      expect(steps.find((s) => s.stepId === approval.stepId)?.status).toBe("awaiting_approval")

      const forbidden: KernelError = yield* Effect.flip(client.grantApproval(approval.id, { decidedBy: "mallory" }))
      expect([forbidden.status, forbidden.code, forbidden.reason.description]).toEqual([
        403,
        "forbidden",
        "forbidden: \"mallory\" is not an approver for this approval"
      ])
      yield* client.grantApproval(approval.id, { decidedBy: "alice", rationale: "go" })

      const events = yield* client.follow(execution.id, { pollInterval: Duration.millis(20) }).pipe(
        Stream.runCollect,
        Effect.timeout(Duration.seconds(10))
      )
      expect(events.map((e) => e.eventSeq)).toEqual(events.map((_, i) => i + 1))
      // dispatch.acked is written when the webhook answer arrives and may interleave with the
      // run's first events over a real socket; every other event is in the order of 12.3
      expect(withoutDispatch(events)).toEqual([
        "execution.created",
        "execution.started",
        "step.proposed",
        "step.allowed",
        "step.executing",
        "step.succeeded",
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
      expect(types(events).filter((t) => t.startsWith("dispatch."))).toEqual([
        "dispatch.queued",
        "dispatch.acked",
        "dispatch.queued",
        "dispatch.acked"
      ])
      expect(events.at(-1)!.type).toBe("execution.completed")

      const done = yield* client.get(execution.id)
      expect(done).toMatchObject({ status: "completed", output: { built: "built", shipped: "deployed" } })
      expect(shipper.count).toEqual({ prepare: 1, deploy: 1 })
      expect(yield* client.getApproval(approval.id)).toMatchObject({ status: "granted", decidedBy: "alice", rationale: "go" })
      expect(yield* client.listApprovals()).toEqual([])
      const twice = yield* Effect.flip(client.grantApproval(approval.id, { decidedBy: "alice" }))
      expect([twice.status, twice.code]).toEqual([409, "conflict"])
    }))

  it.live("approvals: deny with and without a rationale reaches the handler as the reason", () =>
    Effect.gen(function*() {
      const { client, shipper } = yield* setupShipper
      const first = yield* client.create("shipper", {})
      yield* awaitStatus(client, first.id, "blocked")
      const second = yield* client.create("shipper", {})
      yield* awaitStatus(client, second.id, "blocked")
      const approvals = yield* client.listApprovals()
      // oldest first
      expect(approvals.map((a) => a.executionId)).toEqual([first.id, second.id])
      yield* client.denyApproval(approvals[0]!.id, { decidedBy: "alice", rationale: "freeze" })
      yield* client.denyApproval(approvals[1]!.id, { decidedBy: "alice" })
      expect((yield* awaitStatus(client, first.id, "completed")).output).toEqual({ built: "built", shipped: "denied: freeze" })
      expect((yield* awaitStatus(client, second.id, "completed")).output).toEqual({
        built: "built",
        shipped: "denied: approval_denied"
      })
      expect(shipper.count).toEqual({ prepare: 2, deploy: 0 })
      expect(yield* client.getApproval(approvals[1]!.id)).toMatchObject({ status: "denied", rationale: "" })
    }))

  it.live("list pages newest first with a cursor (7 executions, page size 3 → 3 pages); follow ends on cancel", () =>
    Effect.gen(function*() {
      const kernel = yield* Kernel.start({ port: 0, settings: { stage: "seed" }, dispatcher: { background: false } })
      const client = yield* clientFor(kernel.url)
      yield* client.registerAgent({ id: "pager", webhookUrl: "http://127.0.0.1:9/none", secret })
      yield* client.registerAgent({ id: "bystander", webhookUrl: "http://127.0.0.1:9/none", secret })
      const created: Array<string> = []
      for (let i = 0; i < 7; i++) {
        created.push((yield* client.create("pager", { i })).id)
        if (i === 3) yield* client.create("bystander")
      }
      const newestFirst = [...created].reverse()

      const page1 = yield* client.list({ agentId: "pager", limit: 3 })
      expect(page1.executions.map((e) => e.id)).toEqual(newestFirst.slice(0, 3))
      expect(page1.nextCursor).toBeDefined()
      const page2 = yield* client.list({ agentId: "pager", limit: 3, cursor: page1.nextCursor })
      expect(page2.executions.map((e) => e.id)).toEqual(newestFirst.slice(3, 6))
      const page3 = yield* client.list({ agentId: "pager", limit: 3, cursor: page2.nextCursor })
      expect(page3.executions.map((e) => e.id)).toEqual(newestFirst.slice(6))
      expect(page3.nextCursor).toBeUndefined()
      const all = yield* Stream.runCollect(client.listAll({ agentId: "pager", limit: 3 }))
      expect(all.map((e) => e.id)).toEqual(newestFirst)
      // without the agent filter the other agent's execution shows up; status filters too
      expect((yield* client.list({})).executions).toHaveLength(8)
      expect((yield* client.list({ status: "completed" })).executions).toEqual([])

      const target = created[2]!
      const following = yield* Effect.forkChild(
        client.follow(target, { pollInterval: Duration.millis(20) }).pipe(Stream.runCollect)
      )
      yield* Effect.sleep(Duration.millis(50))
      yield* client.cancel(target)
      const events = yield* Fiber.join(following).pipe(Effect.timeout(Duration.seconds(10)))
      expect(types(events)).toEqual(["execution.created", "execution.started", "dispatch.queued", "execution.cancelled"])
      expect((yield* client.list({ status: "cancelled" })).executions.map((e) => e.id)).toEqual([target])
    }))

  it.live("deltas: the SSE stream receives a delta posted to the stream route by the signed KernelClient", () =>
    Effect.gen(function*() {
      const kernel = yield* Kernel.start({ port: 0, settings: { stage: "seed" }, dispatcher: { background: false } })
      const client = yield* clientFor(kernel.url)
      const agentClient = yield* kernelClientFor(kernel.url)
      yield* client.registerAgent({ id: "streamer", webhookUrl: "http://127.0.0.1:9/none", secret })
      const execution = yield* client.create("streamer")
      const stepId = "a".repeat(64)
      const receiving = yield* Effect.forkChild(
        client.deltas(execution.id).pipe(Stream.take(2), Stream.runCollect)
      )
      // the kernel keeps no buffer: publish until the subscriber has seen two
      const caller = { agentId: "streamer", lease: { dispatchId: "0192f1a0-0000-7000-8000-000000000001", attempt: 1 } }
      let seq = 0
      while (receiving.pollUnsafe() === undefined && seq < 500) {
        yield* agentClient.publishDelta(caller, execution.id, stepId, seq, `chunk <${seq}> & "more"`)
        seq++
        yield* Effect.sleep(Duration.millis(10))
      }
      const deltas = yield* Fiber.join(receiving).pipe(Effect.timeout(Duration.seconds(5)))
      expect(deltas).toHaveLength(2)
      const first = deltas[0]!
      expect(first).toEqual({ stepId, seq: first.seq, data: `chunk <${first.seq}> & "more"` })
      expect(deltas[1]).toEqual({ stepId, seq: first.seq + 1, data: `chunk <${first.seq + 1}> & "more"` })
    }))

  it.live("agents admin and policies: register, list, get, load, refuse, re-register drops the bundle, delete", () =>
    Effect.gen(function*() {
      const kernel = yield* Kernel.start({ port: 0, settings: { stage: "seed" }, dispatcher: { background: false } })
      const client = yield* clientFor(kernel.url)
      const b = yield* client.registerAgent({ id: "beta", webhookUrl: "http://127.0.0.1:9/b", secret })
      expect(b).toMatchObject({ id: "beta", webhookUrl: "http://127.0.0.1:9/b", policyBundle: "" })
      expect(b.registeredAt).not.toBe("")
      yield* client.registerAgent({ id: "alpha", webhookUrl: "http://127.0.0.1:9/a", secret })
      expect((yield* client.listAgents()).map((a) => a.id)).toEqual(["alpha", "beta"])
      expect(yield* client.getAgent("beta")).toEqual(b)

      yield* client.loadPolicy("beta", gate)
      expect((yield* client.getAgent("beta")).policyBundle).toBe(gate)
      const bad: KernelError = yield* Effect.flip(
        client.loadPolicy("beta", yaml("rules:", "  - { id: x, then: { decision: allow } }", "  - { id: y, then: { decision: deny } }"))
      )
      expect([bad.status, bad.code, bad.reason.description]).toEqual([
        400,
        "validation_error",
        "load policy bundle: validation error: invalid policy bundle: duplicate priority 0 used by \"x\" and \"y\""
      ])
      const missing = yield* Effect.flip(client.loadPolicy("gamma", gate))
      expect([missing.status, missing.code, missing.reason.description]).toEqual([404, "not_found", "load policy bundle: not found"])
      expect((yield* client.getAgent("beta")).policyBundle).toBe(gate)

      // upsert replaces the whole record and drops the loaded bundle (quirk)
      const again = yield* client.registerAgent({ id: "beta", webhookUrl: "http://127.0.0.1:9/b2", secret })
      expect(again).toMatchObject({ webhookUrl: "http://127.0.0.1:9/b2", policyBundle: "" })

      yield* client.deleteAgent("beta")
      const gone = yield* Effect.flip(client.getAgent("beta"))
      expect([gone.status, gone.code]).toEqual([404, "not_found"])
      yield* client.deleteAgent("beta")
      expect((yield* client.listAgents()).map((a) => a.id)).toEqual(["alpha"])
      const noAgent = yield* Effect.flip(client.create("beta"))
      expect(noAgent._tag === "KernelError" && noAgent.status).toBe(404)
    }))
})
