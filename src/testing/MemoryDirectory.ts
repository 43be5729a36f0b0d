/**
 * A resource driver for tests (PROTOCOL-CURRENT C.6): a directory of text
 * files kept in memory — the test kit's counterpart of `LocalDirectory`, with
 * nothing on disk and everything deterministic. Use it to run an agent with
 * resources in the test kit: its checkpoints, a crash and the redelivery that
 * reopens the same directory, and a fork that restores the directory as of a
 * checkpoint.
 *
 * The {@link Store} plays the machine's disk: it outlives the agent's
 * processes, so a crashed run's redelivery opens the directory the crashed
 * run was changing (its binding names it), exactly as with a local
 * directory. Each execution gets its own directory, bound as
 * `{"directory":"<execution id>/<key>"}`. A checkpoint copies the files; its
 * `checkpoint_ref` is the SHA-256 of their canonical JSON, so the same files
 * always give the same reference, on every run. A fork's `create` restores
 * the files of its checkpoint; a checkpoint the store has {@link Store.forget forgotten}
 * is `CheckpointUnavailable`.
 *
 * **Example** (An agent that edits files, its crash, and a restore)
 *
 * ```ts
 * import { expect, it } from "@effect/vitest"
 * import { Effect, Schema } from "effect"
 * import { Agent, Resource, Tool } from "effect-rebuno"
 * import { MemoryDirectory, TestKernel } from "effect-rebuno/testing"
 *
 * const workspace = Resource.make("workspace", { driver: MemoryDirectory.MemoryDirectory, checkpoints: { everySteps: 1 } })
 * const write = Tool.make("write", {
 *   args: Schema.Struct({ path: Schema.String, text: Schema.String }),
 *   success: Schema.Null,
 *   resources: [workspace],
 *   execute: ({ path, text }) => Effect.map(workspace.handle, ({ files }) => (files.set(path, text), null))
 * })
 * const scribe = Agent.make({
 *   id: "scribe",
 *   resources: [workspace],
 *   handler: () => Effect.andThen(write({ path: "a.txt", text: "alpha" }), write({ path: "b.txt", text: "beta" }))
 * })
 *
 * const disk = MemoryDirectory.make()
 *
 * it.effect("edits files, survives a crash, restores a checkpoint", () =>
 *   Effect.gen(function*() {
 *     const kernel = yield* TestKernel.TestKernel
 *     // the process dies after the first write; the redelivery reopens the same directory
 *     const run = yield* kernel.run(scribe, {}, { crash: { afterSteps: 1 } })
 *     expect(run.deliveries).toBe(2)
 *     expect(disk.files(run.executionId, "workspace")).toEqual({ "a.txt": "alpha", "b.txt": "beta" })
 *     // a fork at the second write starts from the checkpoint taken after the first
 *     const fork = yield* kernel.fork(run, { atStep: 1 })
 *     const restored = fork.restoration?.["workspace"]?.checkpointRef
 *     expect(disk.checkpoint(restored!)).toEqual({ "a.txt": "alpha" })
 *     expect(disk.files(fork.executionId, "workspace")).toEqual({ "a.txt": "alpha", "b.txt": "beta" })
 *   }).pipe(Effect.provide(TestKernel.layer({ agents: [scribe] })), Effect.provide(disk.layer)))
 * ```
 *
 * @since 0.2.0
 */
import { Context, Effect, Layer } from "effect"
import { hash } from "node:crypto"
import type * as Resource from "../Resource.js"
import { CheckpointUnavailable, ResourceError } from "../Resource.js"

/**
 * An opened directory: its files (path → text), changed in place by the
 * agent's steps, and where it lives in the store.
 *
 * @since 0.2.0
 * @category models
 */
export interface Handle {
  /** The files of the directory, by path. Change them in place. */
  readonly files: Map<string, string>
  /** The directory's name in the store, `<execution id>/<key>` (its binding's `directory`). */
  readonly directory: string
  /** The resource key. */
  readonly key: string
}

/**
 * The default driver id.
 *
 * @since 0.2.0
 * @category constants
 */
export const driverId = "effect-rebuno.testing.memory-directory.v1"

/**
 * The driver service of in-memory directories (provide it with
 * {@link Store.layer}). To drive a resource declared with a driver service
 * of your own, provide {@link Store.driver} for it:
 * `Layer.succeed(MyDriver)(disk.driver)`.
 *
 * @since 0.2.0
 * @category services
 */
export class MemoryDirectory extends Context.Service<MemoryDirectory, Resource.Driver<Handle>>()(
  "effect-rebuno/testing/MemoryDirectory"
) {}

/**
 * One call the driver answered, in order: what a test asserts on to see
 * which runs created, reopened or captured a directory.
 *
 * @since 0.2.0
 * @category models
 */
export type DriverCall =
  | { readonly op: "create"; readonly directory: string; readonly checkpointRef: string | undefined }
  | { readonly op: "open"; readonly directory: string }
  | { readonly op: "checkpoint"; readonly directory: string; readonly checkpointRef: string | undefined }

/**
 * The options of {@link make}.
 *
 * @since 0.2.0
 * @category models
 */
export interface Options {
  /** The driver id registered with the kernel (default {@link driverId}). */
  readonly driverId?: string | undefined
  /** The resource's configuration (JSON), part of its identity on the kernel (default none). */
  readonly configuration?: unknown
  /** Skip the generation bump of steps that do not declare the resource (C.6.4; default `false`). */
  readonly coverageReuse?: boolean | undefined
  /** The files a fresh directory starts with (default none). */
  readonly initial?: Readonly<Record<string, string>> | undefined
}

/**
 * An in-memory store of directories and checkpoints, and the driver over it.
 *
 * @since 0.2.0
 * @category models
 */
export interface Store {
  /** The driver over this store. */
  readonly driver: Resource.Driver<Handle>
  /** The driver as the {@link MemoryDirectory} service. */
  readonly layer: Layer.Layer<MemoryDirectory>
  /**
   * The files of an execution's resource now, sorted by path; `undefined`
   * when the directory was never created.
   */
  readonly files: (executionId: string, key: string) => Readonly<Record<string, string>> | undefined
  /** The files of a checkpoint, sorted by path; `undefined` when the store has no such checkpoint. */
  readonly checkpoint: (checkpointRef: string) => Readonly<Record<string, string>> | undefined
  /** Every checkpoint the store holds, oldest first. */
  readonly checkpoints: () => ReadonlyArray<string>
  /** Drop a checkpoint: a fork restoring from it meets `CheckpointUnavailable` (C.6.8 #7). */
  readonly forget: (checkpointRef: string) => void
  /**
   * The next `times` captures (default 1) fail with `message`: the SDK
   * records each as a capture failure (`resource.checkpoint_failed`), the
   * step's outcome stands.
   */
  readonly failCheckpoints: (message: string, times?: number) => void
  /** The driver calls answered so far, in order. */
  readonly calls: () => ReadonlyArray<DriverCall>
}

/** The files as a plain object sorted by path. */
const sorted = (files: ReadonlyMap<string, string>): Record<string, string> => {
  const out: Record<string, string> = {}
  for (const path of [...files.keys()].sort()) out[path] = files.get(path)!
  return out
}

/** The checkpoint reference of some files: the SHA-256 of their canonical JSON. */
const refOf = (files: Record<string, string>): string => hash("sha256", JSON.stringify(files), "hex")

const directoryOf = (binding: unknown): string | undefined => {
  if (typeof binding !== "object" || binding === null) return undefined
  const directory = (binding as { readonly directory?: unknown }).directory
  return typeof directory === "string" ? directory : undefined
}

/**
 * A fresh store (nothing created, no checkpoints) and its driver.
 *
 * @example
 * ```ts
 * import { expect, it } from "@effect/vitest"
 * import { Effect, Schema } from "effect"
 * import { Agent, Resource, Tool } from "effect-rebuno"
 * import { MemoryDirectory, TestKernel } from "effect-rebuno/testing"
 *
 * const workspace = Resource.make("workspace", { driver: MemoryDirectory.MemoryDirectory })
 *
 * const append = Tool.make("append", {
 *   args: Schema.Struct({ line: Schema.String }),
 *   success: Schema.Null,
 *   resources: [workspace],
 *   execute: ({ line }) =>
 *     Effect.map(workspace.handle, ({ files }) => (files.set("README.md", `${files.get("README.md")}\n${line}`), null))
 * })
 *
 * const scribe = Agent.make({ id: "scribe", resources: [workspace], handler: () => append({ line: "- one" }) })
 *
 * // plays the machine's disk: provide disk.layer next to the test kit
 * const disk = MemoryDirectory.make({ initial: { "README.md": "# notes" } })
 *
 * it.effect("a fresh workspace starts with the initial files", () =>
 *   Effect.gen(function*() {
 *     const kernel = yield* TestKernel.TestKernel
 *     const run = yield* kernel.run(scribe, {})
 *     expect(disk.files(run.executionId, "workspace")).toEqual({ "README.md": "# notes\n- one" })
 *   }).pipe(Effect.provide(TestKernel.layer({ agents: [scribe] })), Effect.provide(disk.layer)))
 * ```
 *
 * @since 0.2.0
 * @category constructors
 */
export const make = (options: Options = {}): Store => {
  const directories = new Map<string, Map<string, string>>()
  const snapshots = new Map<string, Record<string, string>>()
  const calls: Array<DriverCall> = []
  const failing = { message: "", remaining: 0 }
  const initial = Object.entries(options.initial ?? {})

  const driver: Resource.Driver<Handle> = {
    driverId: options.driverId ?? driverId,
    ...(options.configuration === undefined ? {} : { configuration: options.configuration }),
    ...(options.coverageReuse === undefined ? {} : { coverageReuse: options.coverageReuse }),
    create: ({ checkpointRef, executionId, key }) =>
      Effect.suspend(() => {
        const directory = `${executionId}/${key}`
        calls.push({ op: "create", directory, checkpointRef })
        let contents: ReadonlyArray<readonly [string, string]> = initial
        if (checkpointRef !== undefined) {
          const snapshot = snapshots.get(checkpointRef)
          if (snapshot === undefined) {
            return Effect.fail(
              new CheckpointUnavailable({ key, checkpointRef, description: "the memory store does not hold it" })
            )
          }
          contents = Object.entries(snapshot)
        }
        // A directory created again (a run that crashed before binding it) is rewritten in place.
        let files = directories.get(directory)
        if (files === undefined) {
          files = new Map()
          directories.set(directory, files)
        }
        files.clear()
        for (const [path, text] of contents) files.set(path, text)
        return Effect.succeed({ handle: { files, directory, key }, binding: { directory } })
      }),
    open: (binding, { key }) =>
      Effect.suspend(() => {
        const directory = directoryOf(binding)
        const files = directory === undefined ? undefined : directories.get(directory)
        if (directory === undefined || files === undefined) {
          return Effect.fail(
            new ResourceError({
              key,
              operation: "open",
              description: `no directory for the binding ${JSON.stringify(binding)}`
            })
          )
        }
        calls.push({ op: "open", directory })
        return Effect.succeed({ files, directory, key })
      }),
    checkpoint: (handle) =>
      Effect.suspend(() => {
        if (failing.remaining > 0) {
          failing.remaining--
          calls.push({ op: "checkpoint", directory: handle.directory, checkpointRef: undefined })
          return Effect.fail(
            new ResourceError({ key: handle.key, operation: "checkpoint", description: failing.message })
          )
        }
        const files = sorted(handle.files)
        const checkpointRef = refOf(files)
        if (!snapshots.has(checkpointRef)) snapshots.set(checkpointRef, files)
        calls.push({ op: "checkpoint", directory: handle.directory, checkpointRef })
        return Effect.succeed(checkpointRef)
      })
  }

  return {
    driver,
    layer: Layer.succeed(MemoryDirectory)(driver),
    files: (executionId, key) => {
      const files = directories.get(`${executionId}/${key}`)
      return files === undefined ? undefined : sorted(files)
    },
    checkpoint: (checkpointRef) => {
      const files = snapshots.get(checkpointRef)
      return files === undefined ? undefined : { ...files }
    },
    checkpoints: () => [...snapshots.keys()],
    forget: (checkpointRef) => void snapshots.delete(checkpointRef),
    failCheckpoints: (message, times = 1) => {
      failing.message = message
      failing.remaining = times
    },
    calls: () => calls.slice()
  }
}
