import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { Agent, Protocol, Resource, Tool } from "effect-rebuno"
import { MemoryDirectory, TestKernel } from "effect-rebuno/testing"

/**
 * A scribe that appends one line per step to `log.txt` in its workspace,
 * checkpointed after every step: a step that ran twice shows as a repeated
 * line.
 */
const makeScribe = (disk: MemoryDirectory.Store) => {
  const workspace = Resource.make("workspace", {
    driver: MemoryDirectory.MemoryDirectory,
    checkpoints: { everySteps: 1 }
  })
  const append = Tool.make("append", {
    args: Schema.Struct({ line: Schema.String }),
    success: Schema.Number,
    resources: [workspace],
    execute: ({ line }) =>
      Effect.map(workspace.handle, ({ files }) => {
        const text = (files.get("log.txt") ?? "") + line + "\n"
        files.set("log.txt", text)
        return text.split("\n").length - 1
      })
  })
  const scribe = Agent.make({
    id: "scribe",
    resources: [workspace],
    handler: () =>
      Effect.gen(function*() {
        yield* append({ line: "one" })
        yield* append({ line: "two" })
        const lines = yield* append({ line: "three" })
        return { lines }
      })
  })
  return { disk, scribe, workspace }
}

const types = (run: TestKernel.RunResult) => run.events.map((e) => e.type)
const ops = (disk: MemoryDirectory.Store) => disk.calls().map((c) => c.op)

describe("TestKernel resources", () => {
  it.effect("an agent with a checkpointed resource runs in the kit", () => {
    const world = makeScribe(MemoryDirectory.make())
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.scribe, {})
      expect(run.status).toBe("completed")
      expect(run.output).toEqual({ lines: 3 })
      expect(world.disk.files(run.executionId, "workspace")).toEqual({ "log.txt": "one\ntwo\nthree\n" })
      // create, a baseline, one capture per step; the completion checkpoint is covered already
      expect(ops(world.disk)).toEqual(["create", "checkpoint", "checkpoint", "checkpoint", "checkpoint"])
      expect(types(run)).toEqual([
        "execution.created",
        "execution.started",
        "dispatch.queued",
        "dispatch.acked",
        "resource.registered",
        "resource.bound",
        "resource.checkpointed",
        ...["one", "two", "three"].flatMap(() => [
          "step.proposed",
          "step.allowed",
          "step.executing",
          "step.succeeded",
          "resource.checkpointed"
        ]),
        "execution.completed"
      ])
      const executing = run.events.find((e) => e.type === "step.executing")!
      expect(executing.payload).toMatchObject({ resources: ["workspace"], generations: { workspace: 1 } })
      // the kit logs the resource calls like every agent call
      expect(run.calls.map((c) => c.call).filter((c) => c.endsWith("Resource") || c === "publishCheckpoints"))
        .toEqual(["registerResource", "bindResource", "publishCheckpoints", "registerResource"])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.scribe] })), Effect.provide(world.disk.layer))
  })

  it.effect("a crash after a step: the redelivery reopens the same directory and replays the step", () => {
    const world = makeScribe(MemoryDirectory.make())
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(world.scribe, {}, { crash: { afterSteps: 1 } })
      expect(run.crashed).toBe(true)
      expect(run.deliveries).toBe(2)
      expect(run.output).toEqual({ lines: 3 })
      expect(world.disk.files(run.executionId, "workspace")).toEqual({ "log.txt": "one\ntwo\nthree\n" })
      // the second run opened the bound directory (no second create, no second baseline)
      expect(ops(world.disk)).toEqual(["create", "checkpoint", "checkpoint", "open", "checkpoint", "checkpoint"])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.scribe] })), Effect.provide(world.disk.layer))
  })

  it.effect("crash mid-step, then restore: a fork's directory is as of the last checkpoint", () => {
    const world = makeScribe(MemoryDirectory.make())
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      // the process dies after the second step's body changed the directory, before its outcome was recorded
      const source = yield* kernel.run(world.scribe, {}, {
        crash: { call: "completeStep", index: 1, when: "before" }
      })
      expect(source.status).toBe("completed")
      // the redelivery reran the unrecorded step on the directory as the crash left it
      expect(world.disk.files(source.executionId, "workspace")).toEqual({ "log.txt": "one\ntwo\ntwo\nthree\n" })
      expect(source.output).toEqual({ lines: 4 })

      // restore: fork before the second step; the fork's directory starts from the checkpoint after the first
      const afterFirst = world.disk.checkpoints()[1]!
      expect(world.disk.checkpoint(afterFirst)).toEqual({ "log.txt": "one\n" })
      const fork = yield* kernel.fork(source, { atStep: 1 })
      expect(fork.restoration).toEqual({
        workspace: { checkpointRef: afterFirst, checkpointSeq: expect.any(Number), covered: true }
      })
      expect(world.disk.calls().filter((c) => c.op === "create").at(-1)).toEqual({
        op: "create",
        directory: `${fork.executionId}/workspace`,
        checkpointRef: afterFirst
      })
      expect(fork.output).toEqual({ lines: 3 })
      expect(world.disk.files(fork.executionId, "workspace")).toEqual({ "log.txt": "one\ntwo\nthree\n" })
      // the fork's log: its events, the copied step's, the source's registration, then its own restored resource
      expect(types(fork).slice(0, 9)).toEqual([
        "execution.created",
        "execution.forked",
        "resource.registered",
        "step.proposed",
        "step.allowed",
        "step.executing",
        "step.succeeded",
        "resource.initialized",
        "resource.checkpointed"
      ])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.scribe] })), Effect.provide(world.disk.layer))
  })

  it.effect("fork points with a resource, and a fork at the latest covered seq", () => {
    const world = makeScribe(MemoryDirectory.make())
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const source = yield* kernel.run(world.scribe, {})
      const points = yield* kernel.forkPoints(source.executionId)
      const registered = source.events.find((e) => e.type === "resource.registered")!.eventSeq
      expect(points.latestSeq).toBe(source.events.length)
      expect(points.resources).toEqual({ workspace: registered })
      expect(points.checkpoints.map((c) => [c.generation, c.checkpointRef])).toEqual(
        world.disk.checkpoints().map((ref, generation) => [generation, ref])
      )
      // each capture is invalidated when the next step starts; the last one stays open
      expect(points.checkpoints.map((c) => c.invalidatedSeq === undefined)).toEqual([false, false, false, true])
      expect(Protocol.isCovered(points, registered - 1)).toBe(true)
      expect(Protocol.latestCoveredSeq(points)).toBe(source.events.length)

      const fork = yield* kernel.fork(source, { atSeq: "latestCovered" })
      const last = world.disk.checkpoints().at(-1)!
      expect(fork.restoration?.["workspace"]?.checkpointRef).toBe(last)
      expect(fork.restoration?.["workspace"]?.covered).toBe(true)
      expect(world.disk.files(fork.executionId, "workspace")).toEqual({ "log.txt": "one\ntwo\nthree\n" })
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.scribe] })), Effect.provide(world.disk.layer))
  })

  it.effect("a forgotten checkpoint: the fork fails with CheckpointUnavailable", () => {
    const world = makeScribe(MemoryDirectory.make())
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const source = yield* kernel.run(world.scribe, {})
      const afterFirst = world.disk.checkpoints()[1]!
      world.disk.forget(afterFirst)
      const fork = yield* kernel.fork(source, { atStep: 1 })
      expect(fork.status).toBe("failed")
      // met where the handle is read, here in the first live step's body: the step fails, and so does the
      // execution, as from the handler (C.6.8 #7)
      expect(fork.failureReason).toBe(
        `agent_error: CheckpointUnavailable: checkpoint ${afterFirst} of resource "workspace" is unavailable: ` +
          "the memory store does not hold it"
      )
      expect(fork.steps.map((s) => [s.target, s.status])).toEqual([["append", "succeeded"], ["append", "failed"]])
      expect(world.disk.files(fork.executionId, "workspace")).toBeUndefined()
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.scribe] })), Effect.provide(world.disk.layer))
  })

  it.effect("a failed capture is recorded as such; the step's outcome stands", () => {
    const world = makeScribe(MemoryDirectory.make())
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      world.disk.failCheckpoints("disk full", 2)
      const run = yield* kernel.run(world.scribe, {})
      expect(run.status).toBe("completed")
      const failed = run.events.filter((e) => e.type === "resource.checkpoint_failed").map((e) => e.payload)
      expect(failed).toEqual([
        { key: "workspace", generation: 0, error: "checkpoint workspace: disk full" },
        { key: "workspace", generation: 1, error: "checkpoint workspace: disk full" }
      ])
      expect(run.steps.map((s) => s.status)).toEqual(["succeeded", "succeeded", "succeeded"])
    }).pipe(Effect.provide(TestKernel.layer({ agents: [world.scribe] })), Effect.provide(world.disk.layer))
  })

  for (const transport of ["direct", "http"] as const) {
    it.effect(`a crash at a resource call: the redelivery opens what the crashed run bound (${transport})`, () => {
      const world = makeScribe(MemoryDirectory.make())
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const run = yield* kernel.run(world.scribe, {}, { crash: { call: "bindResource", index: 0, when: "after" } })
        expect(run.crashed).toBe(true)
        expect(run.output).toEqual({ lines: 3 })
        expect(ops(world.disk).slice(0, 3)).toEqual(["create", "open", "checkpoint"])
        const crashed = run.calls.find((c) => c.injected === "crash")!
        expect([crashed.call, crashed.answer, crashed.delivered]).toEqual(["bindResource", "ok", false])
      }).pipe(Effect.provide(TestKernel.layer({ agents: [world.scribe], transport })), Effect.provide(world.disk.layer))
    })
  }

  it.effect("both transports run resources alike", () =>
    Effect.gen(function*() {
      const scenario = (transport: "direct" | "http") => {
        const world = makeScribe(MemoryDirectory.make())
        return Effect.gen(function*() {
          const kernel = yield* TestKernel.TestKernel
          const source = yield* kernel.run(world.scribe, {}, { crash: { afterSteps: 2 } })
          const fork = yield* kernel.fork(source, { atStep: 1 })
          const view = (run: TestKernel.RunResult) => ({
            status: run.status,
            output: run.output,
            // (a binding names its execution, whose id differs)
            events: run.events.map((e) => [
              e.type,
              e.type.startsWith("resource.") && e.type !== "resource.bound" ? e.payload : null
            ]),
            calls: run.calls.map((c) => [c.call, c.answer])
          })
          return {
            source: view(source),
            fork: { ...view(fork), restoration: fork.restoration },
            files: world.disk.files(fork.executionId, "workspace"),
            ops: ops(world.disk)
          }
        }).pipe(Effect.provide(TestKernel.layer({ agents: [world.scribe], transport })), Effect.provide(world.disk.layer))
      }
      const direct = yield* scenario("direct")
      const http = yield* scenario("http")
      expect(http).toEqual(direct)
      expect(direct.files).toEqual({ "log.txt": "one\ntwo\nthree\n" })
    }))
})
