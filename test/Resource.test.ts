/**
 * The SDK flow of resources (PROTOCOL-CURRENT C.6.8) against the test kit's
 * kernel, over the direct client and over the kernel's HTTP routes, on
 * virtual time: registration, create-and-bind or open, the baseline capture,
 * `resources` on submit, captures of due resources sent with the step's
 * outcome (and capture failures), the completion checkpoint, serialised steps
 * while resources are registered, and a fork restoring its resource from the
 * checkpoint of the fork point (or failing with `CheckpointUnavailable`).
 */
import { describe, expect, expectTypeOf, it } from "@effect/vitest"
import { Context, Deferred, Effect, Fiber, Layer, Schedule, Schema } from "effect"
import * as Agent from "../src/Agent.js"
import type { Execution } from "../src/Execution.js"
import * as Protocol from "../src/Protocol.js"
import * as Resource from "../src/Resource.js"
import * as Step from "../src/Step.js"
import * as Tool from "../src/Tool.js"
import { TestKernel } from "effect-rebuno/testing"

// ---------------------------------------------------------------------------
// An in-memory driver: "boxes" of named strings, snapshots in a map
// ---------------------------------------------------------------------------

interface Box {
  readonly id: string
  readonly files: Map<string, string>
}

class Boxes extends Context.Service<Boxes, Resource.Driver<Box>>()("test/Boxes") {}

/** The driver's world, and what it was asked to do (for the assertions). */
const makeWorld = (options: { readonly failCheckpoints?: boolean; readonly coverageReuse?: boolean } = {}) => {
  const live = new Map<string, Box>()
  const snapshots = new Map<string, ReadonlyMap<string, string>>()
  const log: Array<string> = []
  let next = 0
  const driver: Resource.Driver<Box> = {
    driverId: "test.boxes.v1",
    configuration: { size: "small" },
    ...(options.coverageReuse === undefined ? {} : { coverageReuse: options.coverageReuse }),
    create: ({ checkpointRef, executionId, key }) =>
      Effect.suspend(() => {
        log.push(`create ${key} ${checkpointRef ?? "fresh"}`)
        let files = new Map<string, string>()
        if (checkpointRef !== undefined) {
          const snapshot = snapshots.get(checkpointRef)
          if (snapshot === undefined) {
            return Effect.fail(
              new Resource.CheckpointUnavailable({ key, checkpointRef, description: "the snapshot was deleted" })
            )
          }
          files = new Map(snapshot)
        }
        const id = `box-${++next}`
        live.set(id, { id, files })
        return Effect.succeed({ handle: live.get(id)!, binding: { box: id, execution: executionId } })
      }),
    open: (binding, { key }) =>
      Effect.suspend(() => {
        const id = (binding as { readonly box: string }).box
        log.push(`open ${key} ${id}`)
        const box = live.get(id)
        return box === undefined
          ? Effect.fail(new Resource.ResourceError({ key, operation: "open", description: `${id} is gone` }))
          : Effect.succeed(box)
      }),
    checkpoint: (box) =>
      Effect.suspend(() => {
        if (options.failCheckpoints === true) {
          log.push(`checkpoint ${box.id} failed`)
          return Effect.fail(new Resource.ResourceError({ key: box.id, operation: "checkpoint", description: "disk full" }))
        }
        const ref = `snap-${snapshots.size + 1}`
        snapshots.set(ref, new Map(box.files))
        log.push(`checkpoint ${box.id} ${ref}`)
        return Effect.succeed(ref)
      })
  }
  return { live, snapshots, log, layer: Layer.succeed(Boxes, driver) }
}

const workspace = Resource.make("workspace", { driver: Boxes, checkpoints: { everySteps: 1 } })

const write = (name: string, text: string) =>
  Step.run(
    `write ${name}`,
    Effect.gen(function*() {
      const box = yield* workspace.handle
      box.files.set(name, text)
    }),
    { resources: [workspace] }
  )

const contents = (box: Box) => Object.fromEntries([...box.files].sort(([a], [b]) => a < b ? -1 : 1))

const scribe = Agent.make({
  id: "scribe",
  resources: [workspace],
  handler: () =>
    Effect.gen(function*() {
      yield* write("a.txt", "alpha")
      yield* Step.now
      yield* write("b.txt", "beta")
      return contents(yield* workspace.handle)
    })
})

describe("Resource: types", () => {
  it("an agent's requirements include its resources' drivers; a handle needs a running execution", () => {
    type Requirements<T> = T extends Agent.Agent<any, any, any, infer R> ? R : never
    expectTypeOf<Requirements<typeof scribe>>().toEqualTypeOf<Boxes>()
    expectTypeOf(workspace.handle).toEqualTypeOf<
      Effect.Effect<Box, Resource.CheckpointUnavailable | Resource.ResourceError, Execution>
    >()
  })
})

const resourceEvents = (events: ReadonlyArray<Protocol.Event>) =>
  events.filter((e) => e.type.startsWith("resource.")).map((e) => ({ type: e.type, payload: e.payload }))

const kit = (world: ReturnType<typeof makeWorld>, transport: "direct" | "http", agents: ReadonlyArray<Agent.Agent<any, any, any, Boxes>> = [scribe]) =>
  TestKernel.layer({ agents, transport }).pipe(Layer.provide(world.layer))

/** Runs `agent` on the kit in context and expects it completed (a failure reason first: it names the cause). */
const runCompleted = <R>(agent: Agent.Agent<any, any, any, R>) =>
  Effect.gen(function*() {
    const kernel = yield* TestKernel.TestKernel
    const result = yield* kernel.run(agent, {})
    expect(result.failureReason).toBeUndefined()
    expect(result.status).toBe("completed")
    return result
  })

/** Runs `agent` on the kit in context; answers the kit, a client of it, the run and its fork points. */
const runForkable = <R>(agent: Agent.Agent<any, any, any, R>) =>
  Effect.gen(function*() {
    const kernel = yield* TestKernel.TestKernel
    const client = yield* kernel.client()
    const source = yield* kernel.run(agent, {})
    const points = yield* client.forkPoints(source.executionId)
    return { kernel, client, source, points }
  })

describe("Resource: the SDK flow (PROTOCOL-CURRENT C.6.8)", () => {
  for (const transport of ["direct", "http"] as const) {
    it.effect(`${transport}: register, create and bind, baseline, captures with each declaring step`, () => {
      const world = makeWorld()
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const result = yield* runCompleted(scribe)
        expect(result.output).toEqual({ "a.txt": "alpha", "b.txt": "beta" })
        expect(world.log).toEqual([
          "create workspace fresh",
          "checkpoint box-1 snap-1",
          "checkpoint box-1 snap-2",
          "checkpoint box-1 snap-3"
        ])
        expect(world.snapshots.get("snap-1")).toEqual(new Map())
        expect(world.snapshots.get("snap-2")).toEqual(new Map([["a.txt", "alpha"]]))
        const binding = { box: "box-1", execution: result.executionId }
        expect(resourceEvents(result.events)).toEqual([
          {
            type: "resource.registered",
            payload: {
              key: "workspace",
              driver_id: "test.boxes.v1",
              configuration: { size: "small" },
              coverage_reuse: false,
              every_steps: 1,
              on_completion: true
            }
          },
          { type: "resource.bound", payload: { key: "workspace", binding } },
          {
            type: "resource.checkpointed",
            payload: expect.objectContaining({ key: "workspace", generation: 0, checkpoint_ref: "snap-1" })
          },
          {
            type: "resource.checkpointed",
            payload: expect.objectContaining({ key: "workspace", generation: 1, checkpoint_ref: "snap-2" })
          },
          {
            type: "resource.checkpointed",
            payload: expect.objectContaining({ key: "workspace", generation: 3, checkpoint_ref: "snap-3" })
          }
        ])
        // The declaring steps name the resource; `now` declares nothing but still moves the generation.
        const executing = result.events.filter((e) => e.type === "step.executing").map((e) => e.payload as any)
        expect(executing.map((p) => p.resources ?? [])).toEqual([["workspace"], [], ["workspace"]])
        expect(executing.map((p) => p.generations)).toEqual([{ workspace: 1 }, { workspace: 2 }, { workspace: 3 }])
        // Every capture came with its step's outcome: nothing is left to capture at completion.
        const points = yield* (yield* kernel.client()).forkPoints(result.executionId)
        expect(points.checkpoints.map((c) => [c.checkpointRef, c.invalidatedSeq === undefined])).toEqual([
          ["snap-1", false],
          ["snap-2", false],
          ["snap-3", true]
        ])
      }).pipe(Effect.provide(kit(world, transport)))
    })
  }

  it.effect("a redelivery opens the bound resource, captures a baseline when nothing covers it, replays capture nothing", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const result = yield* kernel.run(scribe, {}, { crash: { afterSteps: 2 } })
      expect(result.crashed).toBe(true)
      expect(result.status).toBe("completed")
      expect(result.deliveries).toBe(2)
      expect(result.output).toEqual({ "a.txt": "alpha", "b.txt": "beta" })
      expect(world.log).toEqual([
        "create workspace fresh",
        "checkpoint box-1 snap-1",
        "checkpoint box-1 snap-2",
        // The crash came after `now`, which moved the generation past snap-2: a new baseline.
        "open workspace box-1",
        "checkpoint box-1 snap-3",
        "checkpoint box-1 snap-4"
      ])
      expect(world.snapshots.get("snap-3")).toEqual(new Map([["a.txt", "alpha"]]))
      expect(resourceEvents(result.events).filter((e) => e.type === "resource.bound")).toHaveLength(1)
    }).pipe(Effect.provide(kit(world, "direct")))
  })

  it.effect("everySteps: 2 captures after every second declaring step, and on completion what is not covered", () => {
    const world = makeWorld()
    const sparse = Resource.make("workspace", { driver: Boxes, checkpoints: { everySteps: 2, onCompletion: true } })
    const writeSparse = (name: string) =>
      Step.run(`write ${name}`, Effect.map(sparse.handle, (box) => void box.files.set(name, name)), {
        resources: [sparse]
      })
    const agent = Agent.make({
      id: "sparse",
      resources: [sparse],
      handler: () => Effect.andThen(Effect.all([writeSparse("1"), writeSparse("2"), writeSparse("3")]), Effect.void)
    })
    return Effect.gen(function*() {
      const result = yield* runCompleted(agent)
      // baseline, after step 2, then the completion checkpoint (step 3 was not due).
      expect(world.log).toEqual([
        "create workspace fresh",
        "checkpoint box-1 snap-1",
        "checkpoint box-1 snap-2",
        "checkpoint box-1 snap-3"
      ])
      expect(world.snapshots.get("snap-2")).toEqual(new Map([["1", "1"], ["2", "2"]]))
      expect(world.snapshots.get("snap-3")).toEqual(new Map([["1", "1"], ["2", "2"], ["3", "3"]]))
      const completed = result.events.findIndex((e) => e.type === "execution.completed")
      const captures = result.events.flatMap((e, i) => e.type === "resource.checkpointed" ? [i] : [])
      const lastCapture = captures[captures.length - 1]!
      expect(lastCapture).toBeLessThan(completed)
      expect(result.events[lastCapture]!.payload).toMatchObject({ checkpoint_ref: "snap-3", generation: 3 })
    }).pipe(Effect.provide(kit(world, "direct", [agent])))
  })

  it.effect("without a policy the resource is registered and bound but never captured", () => {
    const world = makeWorld()
    const plain = Resource.make("workspace", { driver: Boxes })
    const agent = Agent.make({
      id: "plain",
      resources: [plain],
      handler: () =>
        Step.run("touch", Effect.map(plain.handle, (box) => void box.files.set("x", "y")), { resources: [plain] })
    })
    return Effect.gen(function*() {
      const result = yield* runCompleted(agent)
      expect(world.log).toEqual(["create workspace fresh"])
      expect(resourceEvents(result.events).map((e) => e.type)).toEqual(["resource.registered", "resource.bound"])
      expect(resourceEvents(result.events)[0]!.payload).toMatchObject({ every_steps: 0, on_completion: false })
    }).pipe(Effect.provide(kit(world, "direct", [agent])))
  })

  it.effect("a failed checkpoint is a capture failure with the error's text; the step and the run carry on", () => {
    const world = makeWorld({ failCheckpoints: true })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const result = yield* kernel.run(scribe, {})
      expect(result.status).toBe("completed")
      expect(resourceEvents(result.events).filter((e) => e.type === "resource.checkpoint_failed")).toEqual([
        { type: "resource.checkpoint_failed", payload: { key: "workspace", generation: 0, error: "checkpoint box-1: disk full" } },
        { type: "resource.checkpoint_failed", payload: { key: "workspace", generation: 1, error: "checkpoint box-1: disk full" } },
        { type: "resource.checkpoint_failed", payload: { key: "workspace", generation: 3, error: "checkpoint box-1: disk full" } },
        // Nothing covered it: the completion checkpoint is tried too.
        { type: "resource.checkpoint_failed", payload: { key: "workspace", generation: 3, error: "checkpoint box-1: disk full" } }
      ])
      expect(result.steps.every((s) => s.status === "succeeded")).toBe(true)
    }).pipe(Effect.provide(kit(world, "direct")))
  })

  it.effect("a body that fails still sends the captures of its due resources with the step failure", () => {
    const world = makeWorld()
    const agent = Agent.make({
      id: "breaks",
      resources: [workspace],
      handler: () =>
        Tool.make("half_write", {
          args: Schema.Struct({}),
          success: Schema.Void,
          resources: [workspace],
          execute: () =>
            Effect.andThen(
              Effect.map(workspace.handle, (box) => void box.files.set("half", "written")),
              Effect.fail(new Error("disk went away"))
            )
        })({}).pipe(Effect.catchTag("ToolError", () => Effect.succeed("caught")))
    })
    return Effect.gen(function*() {
      const result = yield* runCompleted(agent)
      expect(result.steps[0]).toMatchObject({ status: "failed", error: { message: "disk went away" } })
      const failedAt = result.events.findIndex((e) => e.type === "step.failed")
      expect(result.events[failedAt + 1]).toMatchObject({
        type: "resource.checkpointed",
        payload: { key: "workspace", generation: 1, checkpoint_ref: "snap-2" }
      })
      expect(world.snapshots.get("snap-2")).toEqual(new Map([["half", "written"]]))
    }).pipe(Effect.provide(kit(world, "direct", [agent])))
  })

  it.effect("tool calls and local steps run one at a time while a resource is registered (C.6.8 #4)", () => {
    const world = makeWorld()
    const trace: Array<string> = []
    const slow = (name: string) =>
      Step.run(name, Effect.gen(function*() {
        trace.push(`start ${name}`)
        yield* Effect.sleep("1 second")
        trace.push(`end ${name}`)
      }))
    const parallel = (id: string, resources: ReadonlyArray<Resource.Any>) =>
      Agent.make({
        id,
        resources,
        handler: () => Effect.asVoid(Effect.all([slow("a"), slow("b"), slow("c")], { concurrency: "unbounded" }))
      })
    const serial = parallel("serial", [workspace])
    const free = parallel("free", [])
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      yield* runCompleted(serial)
      expect(trace).toEqual(["start a", "end a", "start b", "end b", "start c", "end c"])
      trace.length = 0
      expect((yield* kernel.run(free, {})).status).toBe("completed")
      expect(trace.slice(0, 3)).toEqual(["start a", "start b", "start c"])
    }).pipe(Effect.provide(kit(world, "direct", [serial, free])))
  })

  it.effect("a step inside a step body does not wait for the permit its enclosing step holds", () => {
    const world = makeWorld()
    const agent = Agent.make({
      id: "nested",
      resources: [workspace],
      handler: () => Step.run("outer", Step.run("inner", Effect.succeed(1)), { resources: [workspace] })
    })
    return Effect.gen(function*() {
      const result = yield* runCompleted(agent)
      expect(result.output).toBe(1)
    }).pipe(Effect.provide(kit(world, "direct", [agent])))
  })

  it.effect("the handle of a resource the agent does not declare is a ResourceError", () => {
    const world = makeWorld()
    const other = Resource.make("other", { driver: Boxes })
    const agent = Agent.make({
      id: "undeclared",
      resources: [workspace],
      handler: () => other.handle
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const result = yield* kernel.run(agent, {})
      expect(result.status).toBe("failed")
      expect(result.failureReason).toBe(
        "agent_error: ResourceError: handle other: the running agent does not declare this resource"
      )
    }).pipe(Effect.provide(kit(world, "direct", [agent])))
  })

  it.effect("a kernel that refuses the registration fails the execution before the handler runs", () => {
    const world = makeWorld()
    const bad = Resource.make("no/slashes", { driver: Boxes })
    let ran = false
    const agent = Agent.make({
      id: "badkey",
      resources: [bad],
      handler: () => Effect.sync(() => (ran = true))
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const result = yield* kernel.run(agent, {})
      expect(result.status).toBe("failed")
      expect(result.failureReason).toMatch(/^agent_error: KernelError: .*key must match/)
      expect(ran).toBe(false)
      expect(world.log).toEqual([])
    }).pipe(Effect.provide(kit(world, "direct", [agent])))
  })
})

describe("Resource: forks restore the resource (C.6.8 #2, #7; C.7)", () => {
  /** Writes a, b, c; its third step waits on `gate` so that a test can crash it mid-body. */
  const gate = { current: undefined as Deferred.Deferred<void> | undefined }
  const three = Agent.make({
    id: "three",
    resources: [workspace],
    handler: () =>
      Effect.gen(function*() {
        yield* write("a.txt", "alpha")
        yield* write("b.txt", "beta")
        yield* Step.run(
          "write c.txt",
          Effect.gen(function*() {
            const box = yield* workspace.handle
            box.files.set("c.txt", "half")
            if (gate.current !== undefined) yield* Deferred.await(gate.current)
            box.files.set("c.txt", "gamma")
          }),
          { resources: [workspace] }
        )
        return contents(yield* workspace.handle)
      })
  })

  for (const transport of ["direct", "http"] as const) {
    it.effect(`${transport}: a fork at a covered seq creates the resource from that checkpoint`, () => {
      const world = makeWorld()
      gate.current = undefined
      return Effect.gen(function*() {
        const { client, kernel, points, source } = yield* runForkable(three)
        expect(source.output).toEqual({ "a.txt": "alpha", "b.txt": "beta", "c.txt": "gamma" })
        // Fork right after b.txt was written and captured.
        const afterB = points.checkpoints.find((c) => c.checkpointRef === "snap-3")!
        const fork = yield* client.fork(source.executionId, { atSeq: afterB.coveredSeq })
        expect(fork.forkedFrom).toBe(source.executionId)
        expect(Protocol.decodeRestoration(fork.restoration)).toEqual({
          workspace: { checkpointRef: "snap-3", checkpointSeq: afterB.coveredSeq, covered: true }
        })
        const forked = yield* kernel.settle(fork.id)
        expect(forked.status).toBe("completed")
        expect(forked.output).toEqual({ "a.txt": "alpha", "b.txt": "beta", "c.txt": "gamma" })
        expect(world.log.slice(world.log.indexOf("create workspace snap-3"))).toEqual([
          "create workspace snap-3",
          "checkpoint box-2 snap-5"
        ])
        // The fork's box started as the checkpoint: a and b only.
        expect(world.snapshots.get("snap-3")).toEqual(new Map([["a.txt", "alpha"], ["b.txt", "beta"]]))
      }).pipe(Effect.provide(kit(world, transport, [three])))
    })
  }

  it.effect("a fork whose checkpoint is gone fails with agent_error: CheckpointUnavailable", () => {
    const world = makeWorld()
    gate.current = undefined
    return Effect.gen(function*() {
      const { client, kernel, points, source } = yield* runForkable(three)
      const seq = Protocol.latestCoveredSeq(points)!
      world.snapshots.clear()
      const fork = yield* client.fork(source.executionId, { atSeq: seq })
      const forked = yield* kernel.settle(fork.id)
      expect(forked.status).toBe("failed")
      expect(forked.failureReason).toBe(
        "agent_error: CheckpointUnavailable: checkpoint snap-4 of resource \"workspace\" is unavailable: the snapshot was deleted"
      )
    }).pipe(Effect.provide(kit(world, "direct", [three])))
  })

  it.effect("a handler that catches CheckpointUnavailable carries on", () => {
    const world = makeWorld()
    const tolerant = Agent.make({
      id: "tolerant",
      resources: [workspace],
      handler: () =>
        Effect.gen(function*() {
          yield* write("a.txt", "alpha")
          return yield* workspace.handle.pipe(
            Effect.map(contents),
            Effect.catchTag("CheckpointUnavailable", (e) => Effect.succeed({ lost: e.checkpointRef }))
          )
        })
    })
    return Effect.gen(function*() {
      const { client, kernel, points, source } = yield* runForkable(tolerant)
      world.snapshots.clear()
      const fork = yield* client.fork(source.executionId, { atSeq: Protocol.latestCoveredSeq(points)! })
      const forked = yield* kernel.settle(fork.id)
      expect(forked.status).toBe("completed")
      expect(forked.output).toEqual({ lost: "snap-2" })
    }).pipe(Effect.provide(kit(world, "direct", [tolerant])))
  })

  /** A tool whose body reads the handle: appends a line to `log.txt` and answers the line count. */
  const append = Tool.make("append", {
    args: Schema.Struct({ line: Schema.String }),
    success: Schema.Number,
    resources: [workspace],
    execute: ({ line }) =>
      Effect.map(workspace.handle, (box) => {
        const text = (box.files.get("log.txt") ?? "") + line + "\n"
        box.files.set("log.txt", text)
        return text.split("\n").length - 1
      })
  })
  const appender = Agent.make({
    id: "appender",
    resources: [workspace],
    handler: () =>
      Effect.gen(function*() {
        yield* append({ line: "one" })
        return { lines: yield* append({ line: "two" }) }
      })
  })
  // Baseline snap-1, then one capture per append: a fork at the second append restores snap-2.
  const unavailable = "CheckpointUnavailable: checkpoint snap-2 of resource \"workspace\" is unavailable: " +
    "the snapshot was deleted"

  for (const transport of ["direct", "http"] as const) {
    it.effect(`${transport}: met in a tool body, it fails the step, then the execution as agent_error`, () => {
      const world = makeWorld()
      return Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const source = yield* runCompleted(appender)
        world.snapshots.clear()
        const fork = yield* kernel.fork(source, { atStep: 1 })
        expect(fork.restoration?.["workspace"]?.checkpointRef).toBe("snap-2")
        expect(fork.status).toBe("failed")
        // The same reason as when the handler reads the handle (C.6.8 #7), not `tool_error: append: …`.
        expect(fork.failureReason).toBe(`agent_error: ${unavailable}`)
        // The body ran (and failed): its step is failed with the error, as any tagged error is recorded.
        expect(fork.steps.map((s) => [s.target, s.status])).toEqual([["append", "succeeded"], ["append", "failed"]])
        expect(fork.steps[1]!.error).toEqual({ message: unavailable, _tag: "CheckpointUnavailable" })
      }).pipe(Effect.provide(kit(world, transport, [appender])))
    })
  }

  it.effect("under a retry schedule it is not retried: every attempt would meet the same handle", () => {
    const world = makeWorld()
    const retried = Tool.make("append", {
      args: Schema.Struct({ line: Schema.String }),
      success: Schema.Number,
      resources: [workspace],
      retry: Schedule.recurs(3),
      execute: ({ line }) =>
        Effect.map(workspace.handle, (box) => {
          box.files.set("log.txt", (box.files.get("log.txt") ?? "") + line + "\n")
          return box.files.size
        })
    })
    const persistent = Agent.make({
      id: "persistent",
      resources: [workspace],
      handler: () =>
        Effect.gen(function*() {
          yield* retried({ line: "one" })
          return { lines: yield* retried({ line: "two" }) }
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const source = yield* runCompleted(persistent)
      world.snapshots.clear()
      const fork = yield* kernel.fork(source, { atStep: 1 })
      expect(fork.failureReason).toBe(`agent_error: ${unavailable}`)
      expect(fork.steps.map((s) => [s.target, s.status])).toEqual([["append", "succeeded"], ["append", "failed"]])
      expect(fork.steps[1]!.error).toEqual({ message: unavailable, _tag: "CheckpointUnavailable", attempt: 1 })
    }).pipe(Effect.provide(kit(world, "direct", [persistent])))
  })

  it.effect("a handler that catches it around a tool call carries on, and again when the call replays", () => {
    const world = makeWorld()
    const forgiving = Agent.make({
      id: "forgiving",
      resources: [workspace],
      handler: () =>
        Effect.gen(function*() {
          yield* append({ line: "one" })
          const lines = yield* append({ line: "two" }).pipe(
            Effect.catchTag("CheckpointUnavailable", (e) => Effect.succeed(`lost ${e.key} at ${e.checkpointRef}`))
          )
          yield* Step.now
          return { lines }
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const source = yield* runCompleted(forgiving)
      world.snapshots.clear()
      // The process dies after `Step.now` is recorded: the redelivery replays the failed call.
      const fork = yield* kernel.fork(source, { atStep: 1, crash: { afterSteps: 2 } })
      expect(fork.crashed).toBe(true)
      expect(fork.deliveries).toBe(2)
      expect(fork.failureReason).toBeUndefined()
      expect(fork.status).toBe("completed")
      expect(fork.output).toEqual({ lines: "lost workspace at snap-2" })
      expect(fork.steps.map((s) => [s.target, s.status])).toEqual([
        ["append", "succeeded"],
        ["append", "failed"],
        ["now", "succeeded"]
      ])
      expect(fork.steps[1]!.error).toEqual({ message: unavailable, _tag: "CheckpointUnavailable" })
    }).pipe(Effect.provide(kit(world, "direct", [forgiving])))
  })

  it.effect("crash mid-step, fork at the last checkpoint: the resource is as of that checkpoint", () => {
    const world = makeWorld()
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const client = yield* kernel.client()
      gate.current = yield* Deferred.make<void>()
      const id = yield* kernel.create("three", {})
      const running = yield* Effect.forkChild(kernel.settle(id))
      // Wait until the third step's body is half-way, then kill the agent's process.
      while (!world.live.get("box-1")?.files.has("c.txt")) yield* Effect.yieldNow
      yield* kernel.restart("three")
      gate.current = undefined
      yield* kernel.cancel(id)
      yield* Fiber.join(running)
      expect(contents(world.live.get("box-1")!)).toEqual({ "a.txt": "alpha", "b.txt": "beta", "c.txt": "half" })
      const points = yield* client.forkPoints(id)
      const seq = Protocol.latestCoveredSeq(points)!
      const fork = yield* client.fork(id, { atSeq: seq })
      expect(Protocol.decodeRestoration(fork.restoration)["workspace"]?.checkpointRef).toBe("snap-3")
      const forked = yield* kernel.settle(fork.id)
      expect(forked.status).toBe("completed")
      // Restored as of the checkpoint (no half-written c.txt), then c.txt written live.
      expect(world.snapshots.get("snap-3")).toEqual(new Map([["a.txt", "alpha"], ["b.txt", "beta"]]))
      expect(forked.output).toEqual({ "a.txt": "alpha", "b.txt": "beta", "c.txt": "gamma" })
    }).pipe(Effect.provide(kit(world, "direct", [three])))
  })
})
