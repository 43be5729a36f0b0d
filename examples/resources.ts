/**
 * Resources and checkpoints (PROTOCOL-CURRENT C.6, C.7) on a laptop: the
 * `scribe` agent writes one note per step into its workspace — a local
 * directory driven by `LocalDirectory`, checkpointed after every step that
 * writes it into a content-addressed store. Everything runs in this process
 * over real HTTP: the embedded kernel, the agent, and an operator with the
 * client.
 *
 *   1. the agent's process dies half-way through writing the third note: the
 *      workspace holds a torn file;
 *   2. the operator reads the fork points, forks the execution at the latest
 *      seq every checkpoint covers, and cancels the crashed one;
 *   3. the restarted agent runs the fork: its workspace is created from that
 *      checkpoint — the two notes written before the crash, no torn file —
 *      the two recorded steps replay, and the third note is written live.
 *
 * Why a fork: a plain redelivery of the crashed execution reopens its
 * workspace as the crash left it (its binding names that directory), torn
 * note included, and runs the unrecorded step again on it. A fork at a
 * covered seq is how to start from the state of a checkpoint instead.
 *
 *   npx tsx examples/resources.ts
 *
 * The workspaces and the store go to a temporary directory (printed), or under
 * `RESOURCES_DIR` when set.
 */
import { NodeHttpClient, NodeHttpServer, NodeRuntime, NodeServices } from "@effect/platform-node"
import { Config, Console, Context, Deferred, Effect, Exit, FileSystem, Layer, Path, Schedule, Schema, Scope } from "effect"
import { HttpServer } from "effect/http"
import { Agent, Client, Execution, KernelClient, LocalDirectory, Protocol, Resource, Tool } from "effect-rebuno"
import * as Kernel from "effect-rebuno/kernel"
import { createServer } from "node:http"
import { pathToFileURL } from "node:url"

/** The workspace: a local directory, captured after every step that writes it and when the run completes. */
export const workspace = Resource.make("workspace", {
  driver: LocalDirectory.LocalDirectory,
  checkpoints: { everySteps: 1, onCompletion: true }
})

/** Every file of a directory (recursively) and its text, sorted by path. */
export const listing = (directory: string) =>
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const path = yield* Path.Path
    const names = (yield* fs.readDirectory(directory, { recursive: true })).sort()
    const files: Record<string, string> = {}
    for (const name of names) {
      const file = path.join(directory, name)
      if ((yield* fs.stat(file)).type === "File") files[name.split(path.sep).join("/")] = yield* fs.readFileString(file)
    }
    return files
  })

/**
 * Set by the demo: the run writing this note dies half-way (the demo kills
 * the agent's process once `reached` completes).
 */
export const crash: { current: { readonly note: string; readonly reached: Deferred.Deferred<void> } | undefined } = {
  current: undefined
}

/** Write a note in two halves — a crash between them leaves a torn file, as a real one would. */
export const writeNote = Tool.make("write_note", {
  description: "Write a note into the workspace.",
  args: Schema.Struct({ name: Schema.String, text: Schema.String }),
  success: Schema.Struct({ bytes: Schema.Number }),
  resources: [workspace],
  execute: ({ name, text }) =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const path = yield* Path.Path
      const { directory } = yield* workspace.handle
      const file = path.join(directory, name)
      const half = Math.ceil(text.length / 2)
      yield* fs.writeFileString(file, text.slice(0, half))
      const armed = crash.current
      if (armed !== undefined && armed.note === name) {
        yield* Deferred.succeed(armed.reached, undefined)
        return yield* Effect.never
      }
      yield* fs.writeFileString(file, text)
      return { bytes: text.length }
    })
})

/** The `scribe` agent: one note per step; its output is what the workspace held when the run started, and at the end. */
export const scribe = Agent.make({
  id: "scribe",
  input: Schema.Struct({ notes: Schema.Array(Schema.String) }),
  resources: [workspace],
  handler: ({ notes }) =>
    Effect.gen(function*() {
      const { directory } = yield* workspace.handle
      const startedWith = yield* listing(directory)
      const executionId = yield* Execution.executionId
      yield* Console.log(`    run of ${executionId.slice(-12)} starts with ${JSON.stringify(startedWith)}`)
      for (const [i, text] of notes.entries()) yield* writeNote({ name: `note-${i + 1}.txt`, text })
      return { startedWith, files: yield* listing(directory) }
    })
})

/** The local-directory driver and the platform it runs on. */
export const drivers = (options: { readonly root: string; readonly store: string }) =>
  LocalDirectory.layer(options).pipe(Layer.provideMerge(NodeServices.layer))

/** Serve the agent on a loopback port in a scope of its own: closing it kills the "process". */
const serveAgent = (kernelUrl: string, dirs: { readonly root: string; readonly store: string }, secret: string) =>
  Effect.gen(function*() {
    const scope = yield* Scope.fork(yield* Effect.scope, "sequential")
    const context = yield* Layer.buildWithScope(
      Agent.layer(scribe).pipe(
        Layer.provideMerge(NodeHttpServer.layer(() => createServer(), { port: 0, host: "127.0.0.1" })),
        Layer.provide(KernelClient.layerSocket({ baseUrl: kernelUrl, secret })),
        Layer.provide(drivers(dirs))
      ),
      scope
    )
    const address = Context.get(context, HttpServer.HttpServer).address
    const port = address._tag === "UnixPathAddress" ? 0 : address.port
    return { url: `http://127.0.0.1:${port}/webhook`, kill: Scope.close(scope, Exit.void) }
  })

const waitUntilTerminal = (client: Client.Client.Service, executionId: string) =>
  client.get(executionId).pipe(
    Effect.filterOrFail((e) => Protocol.isTerminalStatus(e.status), () => new Error(`${executionId} did not end`)),
    Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 600 })
  )

/** What the demo saw, for its test. */
export interface Outcome {
  /** The crashed execution's workspace right after the crash. */
  readonly afterCrash: Record<string, string>
  /** The fork point and the checkpoint its workspace was restored from. */
  readonly forkSeq: number
  readonly restoredFrom: string | undefined
  /** The fork's output: its workspace when its run started, and at the end. */
  readonly fork: Protocol.Execution
  /** The crashed execution, cancelled. */
  readonly source: Protocol.Execution
  readonly sourceDirectory: string
  readonly forkDirectory: string
}

/** The whole demo, with the workspaces under `root` and the store in `store`. */
export const demo = (dirs: { readonly root: string; readonly store: string }) =>
  Effect.gen(function*() {
    const path = yield* Path.Path
    const secret = "scribe-secret"
    const kernel = yield* Kernel.start({ port: 0 })
    const client = Context.get(
      yield* Layer.build(Client.layer({ baseUrl: kernel.url }).pipe(Layer.provide(NodeHttpClient.layerUndici))),
      Client.Client
    )
    yield* Console.log(`kernel on ${kernel.url}; workspaces in ${dirs.root}, checkpoints in ${dirs.store}`)

    // 1. A run that dies half-way through the third note.
    const reached = yield* Deferred.make<void>()
    crash.current = { note: "note-3.txt", reached }
    // Registered before it starts (as a manifest would), so that it can publish its metadata.
    yield* client.registerAgent({ id: "scribe", webhookUrl: "http://127.0.0.1:9/webhook", secret })
    const first = yield* serveAgent(kernel.url, dirs, secret)
    yield* client.registerAgent({ id: "scribe", webhookUrl: first.url, secret })
    const source = yield* client.create("scribe", { notes: ["alpha", "beta", "gamma, at length"] })
    yield* Deferred.await(reached).pipe(Effect.timeout("20 seconds"))
    yield* first.kill
    crash.current = undefined
    const sourceDirectory = path.join(dirs.root, source.id, "workspace")
    const afterCrash = yield* listing(sourceDirectory)
    yield* Console.log(`1. the agent died writing note-3.txt; its workspace holds ${JSON.stringify(afterCrash)}`)

    // 2. The agent's process restarts; the operator forks at the latest seq every checkpoint covers
    //    and cancels the crashed execution.
    const second = yield* serveAgent(kernel.url, dirs, secret)
    yield* client.registerAgent({ id: "scribe", webhookUrl: second.url, secret })
    const points = yield* client.forkPoints(source.id)
    const forkSeq = Protocol.latestCoveredSeq(points)
    if (forkSeq === undefined) return yield* Effect.die(new Error("no covered fork point"))
    const forked = yield* client.fork(source.id, { atSeq: forkSeq })
    const restoredFrom = Protocol.decodeRestoration(forked.restoration)["workspace"]?.checkpointRef
    yield* client.cancel(source.id)
    yield* Console.log(
      `2. forked ${source.id.slice(-12)} at seq ${forkSeq} of ${points.latestSeq} as ${forked.id.slice(-12)}, ` +
        `its workspace restored from checkpoint ${restoredFrom?.slice(0, 12)}…`
    )

    // 3. The restarted agent runs the fork.
    const fork = yield* waitUntilTerminal(client, forked.id)
    yield* Console.log(`3. the fork ${fork.status}: ${JSON.stringify(fork.output)}`)
    return {
      afterCrash,
      forkSeq,
      restoredFrom,
      fork,
      source: yield* client.get(source.id),
      sourceDirectory,
      forkDirectory: path.join(dirs.root, forked.id, "workspace")
    } satisfies Outcome
  })

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const path = yield* Path.Path
    const base = yield* Config.String("RESOURCES_DIR").pipe(
      Config.withDefault(""),
      Effect.flatMap((dir) => dir === "" ? fs.makeTempDirectory({ prefix: "rebuno-resources-" }) : Effect.succeed(dir))
    )
    yield* demo({ root: path.join(base, "workspaces"), store: path.join(base, "store") })
  }).pipe(Effect.scoped, Effect.provide(NodeServices.layer), NodeRuntime.runMain)
}
