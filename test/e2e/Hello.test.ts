/**
 * The hello example end to end over real HTTP: against the embedded kernel
 * always, and against a reference kernel when `REBUNO_REFERENCE_URL` points at
 * one (e.g. `rebuno dev --listen-addr 127.0.0.1:8181`; the test registers its
 * own agent through the admin API).
 */
import { NodeHttpClient } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer, Schedule } from "effect"
import { Client, StepId } from "effect-rebuno"
import * as Kernel from "effect-rebuno/kernel"
import { hello } from "../../examples/hello.js"
import { serveAgent } from "../support/serveAgent.js"

/** Serve `hello` on a free loopback port against `kernelUrl`; returns the webhook URL. */
const serveHello = (kernelUrl: string, secret: string) => serveAgent(hello, kernelUrl, secret)

const clientFor = (baseUrl: string) =>
  Effect.map(
    Layer.build(Client.layer({ baseUrl }).pipe(Layer.provide(NodeHttpClient.layerUndici))),
    (context) => Context.get(context, Client.Client)
  )

/** Register, create, wait for the end; then check what a user would see. */
const roundTrip = (client: Client.Client.Service, agentId: string, webhookUrl: string, secret: string) =>
  Effect.gen(function*() {
    yield* client.registerAgent({ id: agentId, webhookUrl, secret })
    const query = "héllo wörld 🙂 again"
    const created = yield* client.create(agentId, { query })
    const done = yield* client.get(created.id).pipe(
      Effect.filterOrFail((e) => e.status === "completed" || e.status === "failed"),
      Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 400 })
    )
    expect(done.status).toBe("completed")
    expect(done.output).toEqual({ query, reversed: "niaga 🙂 dlröw olléh", word_count: 4 })
    const steps = yield* client.listSteps(created.id)
    expect(steps.map((s) => s.target).sort()).toEqual(["reverse", "word_count"])
    // the kernel's step ids are the ones the protocol derives from the canonical arguments
    for (const step of steps) {
      const argsHash = StepId.argsHash(JSON.stringify(step.args))
      expect(step.argsHash).toBe(argsHash)
      expect(step.stepId).toBe(
        StepId.make({ executionId: created.id, kind: "tool_call", target: step.target, argsHash, occurrence: 0 })
      )
    }
    const events = yield* client.events(created.id)
    expect(events.map((e) => e.type).filter((t) => t.startsWith("step.") || t.startsWith("execution."))).toEqual([
      "execution.created",
      "execution.started",
      "step.proposed",
      "step.allowed",
      "step.executing",
      "step.succeeded",
      "step.proposed",
      "step.allowed",
      "step.executing",
      "step.succeeded",
      "execution.completed"
    ])
  })

describe("hello over real HTTP", () => {
  it.live("completes on the embedded kernel", () =>
    Effect.gen(function*() {
      const kernel = yield* Kernel.start({ port: 0 })
      const webhookUrl = yield* serveHello(kernel.url, "e2e-secret")
      const client = yield* clientFor(kernel.url)
      yield* roundTrip(client, "hello", webhookUrl, "e2e-secret")
    }).pipe(Effect.scoped))

  const reference = process.env["REBUNO_REFERENCE_URL"]
  it.live.skipIf(reference === undefined)("completes on the reference kernel (REBUNO_REFERENCE_URL)", () =>
    Effect.gen(function*() {
      const webhookUrl = yield* serveHello(reference!, "e2e-secret")
      const client = yield* clientFor(reference!)
      yield* roundTrip(client, "hello", webhookUrl, "e2e-secret")
    }).pipe(Effect.scoped), 60_000)
})
