/**
 * A resource driver for a local directory (PROTOCOL-CURRENT C.6), snapshotted
 * into a content-addressed store on the same machine — what an agent that
 * edits files needs to be forked, on a laptop, with nothing else installed.
 *
 * Each execution gets its own directory, `<root>/<execution id>/<key>`; its
 * binding is that path relative to `root` (`{"directory":"<execution id>/<key>"}`),
 * so a later run of the execution (after a crash, an approval, a subagent)
 * opens the same directory.
 *
 * A checkpoint hashes every file with SHA-256 into
 * `<store>/objects/<first two hex digits>/<the other 62>` (a file already
 * stored is not written again) and writes a **manifest** — every entry's path,
 * type, size, mode and hash (or a symbolic link's target), sorted by path —
 * to `<store>/manifests/<hash>.json`. The manifest's SHA-256 is the
 * `checkpoint_ref`: the same contents always give the same reference.
 *
 * Restoring (a fork's `create` from a `checkpoint_ref`) rewrites the directory
 * to exactly the manifest: entries the manifest does not list are removed,
 * every listed file is written from the store. A manifest or an object that
 * is missing or does not match its hash is {@link Resource.CheckpointUnavailable}.
 *
 * Files are read whole into memory: it is meant for workspaces of source
 * files and documents, not for gigabytes. Everything goes through
 * `effect/FileSystem` and `effect/Path` (provide `NodeFileSystem.layer` and
 * `NodePath.layer`, or `NodeServices.layer`).
 *
 * **Example** (The driver of a workspace, on Node.js)
 *
 * ```ts
 * import { NodeServices } from "@effect/platform-node"
 * import { Layer } from "effect"
 * import { LocalDirectory, Resource } from "effect-rebuno"
 *
 * const workspace = Resource.make("workspace", { driver: LocalDirectory.LocalDirectory, checkpoints: { everySteps: 1 } })
 * const Drivers = LocalDirectory.layer({ root: "./.rebuno/workspaces", store: "./.rebuno/store" }).pipe(
 *   Layer.provide(NodeServices.layer)
 * )
 * ```
 *
 * @since 0.2.0
 */
import { Context, Effect, FileSystem, Layer, Path } from "effect"
import type { PlatformError } from "effect"
import { CheckpointUnavailable, ResourceError } from "./internal/run/resources.js"
import type { Driver } from "./internal/run/resources.js"

/**
 * An opened directory: its absolute path.
 *
 * @since 0.2.0
 * @category models
 */
export interface Handle {
  readonly directory: string
}

/**
 * The options of {@link make}.
 *
 * @since 0.2.0
 * @category models
 */
export interface Options {
  /** Where the executions' directories live (created when missing); relative paths resolve against the working directory. */
  readonly root: string
  /** The content-addressed store of checkpoints (created when missing). */
  readonly store: string
  /** The driver id registered with the kernel (default {@link driverId}). */
  readonly driverId?: string | undefined
  /**
   * The resource's configuration (JSON), part of its identity on the kernel
   * (default none). Paths are deliberately not part of it: moving the store
   * does not change the resource.
   */
  readonly configuration?: unknown
}

/**
 * The default driver id.
 *
 * @since 0.2.0
 * @category constants
 */
export const driverId = "effect-rebuno.local-directory.v1"

/**
 * One entry of a manifest: a file (its size, permission bits and SHA-256), a
 * directory, or a symbolic link (its target). `path` is relative to the
 * directory, `/`-separated.
 *
 * @since 0.2.0
 * @category models
 */
export type ManifestEntry =
  | { readonly path: string; readonly type: "file"; readonly size: number; readonly mode: number; readonly sha256: string }
  | { readonly path: string; readonly type: "directory" }
  | { readonly path: string; readonly type: "symlink"; readonly target: string }

/**
 * A checkpoint's manifest: every entry of the directory, sorted by path.
 *
 * @since 0.2.0
 * @category models
 */
export interface Manifest {
  readonly version: 1
  readonly entries: ReadonlyArray<ManifestEntry>
}

/**
 * The driver service for local directories (provide it with {@link layer}).
 * To drive two kinds of directories with different stores, declare a service
 * of your own with the same shape and provide it with {@link make}.
 *
 * @since 0.2.0
 * @category services
 */
export class LocalDirectory extends Context.Service<LocalDirectory, Driver<Handle>>()(
  "effect-rebuno/LocalDirectory"
) {}

const HEX = /^[0-9a-f]{64}$/

const encoder = new TextEncoder()

/** Lower-case hex SHA-256 of `bytes` (Web Crypto). */
const sha256 = (bytes: Uint8Array): Effect.Effect<string> =>
  Effect.promise(() => globalThis.crypto.subtle.digest("SHA-256", bytes as Uint8Array<ArrayBuffer>)).pipe(
    Effect.map((digest) => {
      let out = ""
      for (const byte of new Uint8Array(digest)) out += byte.toString(16).padStart(2, "0")
      return out
    })
  )

/** A manifest's bytes: members in a fixed order, so that equal contents give equal references. */
const manifestBytes = (manifest: Manifest): Uint8Array =>
  encoder.encode(JSON.stringify({
    version: manifest.version,
    entries: manifest.entries.map((e) =>
      e.type === "file"
        ? { path: e.path, type: e.type, size: e.size, mode: e.mode, sha256: e.sha256 }
        : e.type === "directory"
        ? { path: e.path, type: e.type }
        : { path: e.path, type: e.type, target: e.target }
    )
  }))

/** A relative `/`-separated path without empty, `.` or `..` segments. */
const isSafeRelative = (p: string): boolean =>
  p !== "" && !p.startsWith("/") && !p.includes("\\") && !p.includes("\0") &&
  p.split("/").every((segment) => segment !== "" && segment !== "." && segment !== "..")

const isManifest = (u: unknown): u is Manifest => {
  if (typeof u !== "object" || u === null) return false
  const m = u as { readonly version?: unknown; readonly entries?: unknown }
  if (m.version !== 1 || !Array.isArray(m.entries)) return false
  return m.entries.every((e: unknown) => {
    if (typeof e !== "object" || e === null) return false
    const entry = e as Record<string, unknown>
    if (typeof entry["path"] !== "string" || !isSafeRelative(entry["path"])) return false
    switch (entry["type"]) {
      case "file":
        return typeof entry["sha256"] === "string" && HEX.test(entry["sha256"]) &&
          typeof entry["size"] === "number" && typeof entry["mode"] === "number"
      case "directory":
        return true
      case "symlink":
        return typeof entry["target"] === "string"
      default:
        return false
    }
  })
}

const isNotFound = (e: PlatformError.PlatformError): boolean => e.reason._tag === "NotFound"

/**
 * The checkpoint store at `store`, as plain Effects on `FileSystem` and
 * `Path`: take a checkpoint of a directory, restore one into a directory,
 * read a manifest. The driver is built on it; use it directly to inspect or
 * restore checkpoints outside a run.
 *
 * @since 0.2.0
 * @category models
 */
export interface Store {
  /** Snapshot `directory`; the answer is the manifest's SHA-256 (the `checkpoint_ref`). */
  readonly checkpoint: (directory: string) => Effect.Effect<string, PlatformError.PlatformError>
  /**
   * Rewrite `directory` (created when missing) to exactly the checkpoint
   * `ref`. Fails with `"unavailable"` — before touching the directory — when
   * the manifest or one of its objects is missing or corrupt.
   */
  readonly restore: (
    ref: string,
    directory: string
  ) => Effect.Effect<void, PlatformError.PlatformError | StoreUnavailable>
  /** The manifest of `ref`, checked against its hash. */
  readonly manifest: (ref: string) => Effect.Effect<Manifest, PlatformError.PlatformError | StoreUnavailable>
}

/**
 * Why a checkpoint cannot be restored from the store.
 *
 * @since 0.2.0
 * @category models
 */
export interface StoreUnavailable {
  readonly _tag: "StoreUnavailable"
  readonly description: string
}

const unavailable = (description: string): StoreUnavailable => ({ _tag: "StoreUnavailable", description })

/**
 * The checkpoint store at `store` (see {@link Store}).
 *
 * @since 0.2.0
 * @category constructors
 */
export const makeStore: (store: string) => Effect.Effect<Store, never, FileSystem.FileSystem | Path.Path> = Effect
  .fnUntraced(function*(storeRoot: string) {
    const fs = yield* FileSystem.FileSystem
    const path = yield* Path.Path
    const store = path.resolve(storeRoot)
    const objectPath = (hash: string) => path.join(store, "objects", hash.slice(0, 2), hash.slice(2))
    const manifestPath = (hash: string) => path.join(store, "manifests", `${hash}.json`)
    const nativePath = (directory: string, relative: string) => path.join(directory, ...relative.split("/"))

    /** Write `bytes` at `target` unless it exists: a temporary file renamed into place. */
    const putOnce = (target: string, bytes: Uint8Array) =>
      Effect.gen(function*() {
        if (yield* fs.exists(target)) return
        yield* fs.makeDirectory(path.dirname(target), { recursive: true })
        const temporary = `${target}.${globalThis.crypto.randomUUID()}.tmp`
        yield* fs.writeFile(temporary, bytes)
        yield* fs.rename(temporary, target)
      })

    /** Every entry under `directory`, not following symbolic links, sorted by path. */
    const walk = (directory: string) =>
      Effect.gen(function*() {
        const found: Array<{ readonly path: string; readonly type: FileSystem.File.Type }> = []
        const visit = (relative: string): Effect.Effect<void, PlatformError.PlatformError> =>
          Effect.flatMap(
            fs.readDirectoryEntries(relative === "" ? directory : nativePath(directory, relative)),
            (entries) =>
              Effect.forEach(entries, (entry) => {
                const child = relative === "" ? entry.name : `${relative}/${entry.name}`
                const typed = entry.type === "Unknown"
                  ? Effect.map(fs.lstat(nativePath(directory, child)), (info) => info.type)
                  : Effect.succeed(entry.type)
                return Effect.flatMap(typed, (type) => {
                  found.push({ path: child, type })
                  return type === "Directory" ? visit(child) : Effect.void
                })
              }, { discard: true })
          )
        yield* visit("")
        return found.sort((a, b) => a.path < b.path ? -1 : a.path > b.path ? 1 : 0)
      })

    const checkpoint = (directory: string) =>
      Effect.gen(function*() {
        const root = path.resolve(directory)
        const entries: Array<ManifestEntry> = []
        for (const entry of yield* walk(root)) {
          const native = nativePath(root, entry.path)
          if (entry.type === "Directory") {
            entries.push({ path: entry.path, type: "directory" })
          } else if (entry.type === "SymbolicLink") {
            entries.push({ path: entry.path, type: "symlink", target: yield* fs.readLink(native) })
          } else if (entry.type === "File") {
            const bytes = yield* fs.readFile(native)
            const hash = yield* sha256(bytes)
            yield* putOnce(objectPath(hash), bytes)
            const info = yield* fs.stat(native)
            entries.push({ path: entry.path, type: "file", size: bytes.length, mode: info.mode & 0o777, sha256: hash })
          }
          // Sockets, FIFOs and devices are not state a checkpoint can hold: left out.
        }
        const bytes = manifestBytes({ version: 1, entries })
        const ref = yield* sha256(bytes)
        yield* putOnce(manifestPath(ref), bytes)
        return ref
      })

    const manifest = (ref: string) =>
      Effect.gen(function*() {
        if (!HEX.test(ref)) return yield* Effect.fail(unavailable(`${JSON.stringify(ref)} is not a checkpoint of this store`))
        const bytes = yield* fs.readFile(manifestPath(ref)).pipe(
          Effect.catchIf(isNotFound, () => Effect.fail(unavailable("its manifest is not in the store")))
        )
        if ((yield* sha256(bytes)) !== ref) return yield* Effect.fail(unavailable("its manifest does not match its hash"))
        let parsed: unknown
        try {
          parsed = JSON.parse(new TextDecoder().decode(bytes))
        } catch {
          return yield* Effect.fail(unavailable("its manifest is not JSON"))
        }
        if (!isManifest(parsed)) return yield* Effect.fail(unavailable("its manifest is malformed"))
        return parsed
      })

    const restore = (ref: string, directory: string) =>
      Effect.gen(function*() {
        const target = yield* manifest(ref)
        const root = path.resolve(directory)
        // Every object must be there (and intact) before the directory is touched.
        const contents = new Map<string, Uint8Array>()
        for (const entry of target.entries) {
          if (entry.type !== "file" || contents.has(entry.sha256)) continue
          const bytes = yield* fs.readFile(objectPath(entry.sha256)).pipe(
            Effect.catchIf(isNotFound, () => Effect.fail(unavailable(`object ${entry.sha256} is not in the store`)))
          )
          if ((yield* sha256(bytes)) !== entry.sha256) {
            return yield* Effect.fail(unavailable(`object ${entry.sha256} does not match its hash`))
          }
          contents.set(entry.sha256, bytes)
        }
        yield* fs.makeDirectory(root, { recursive: true })
        const wanted = new Map(target.entries.map((e) => [e.path, e]))
        const kinds = { file: "File", directory: "Directory", symlink: "SymbolicLink" } as const
        for (const existing of (yield* walk(root)).reverse()) {
          const entry = wanted.get(existing.path)
          // Links are rewritten below; anything unlisted or of another type goes.
          if (entry === undefined || kinds[entry.type] !== existing.type || existing.type === "SymbolicLink") {
            yield* fs.remove(nativePath(root, existing.path), { recursive: true, force: true })
          }
        }
        for (const entry of target.entries) {
          const native = nativePath(root, entry.path)
          if (entry.type === "directory") {
            yield* fs.makeDirectory(native, { recursive: true })
          } else if (entry.type === "symlink") {
            yield* fs.symlink(entry.target, native)
          } else {
            yield* fs.writeFile(native, contents.get(entry.sha256)!)
            yield* fs.chmod(native, entry.mode)
          }
        }
      })

    return { checkpoint, restore, manifest }
  })

/** The directory a binding names, relative to the root, when it is one this driver wrote. */
const bindingDirectory = (binding: unknown): string | undefined => {
  if (typeof binding !== "object" || binding === null) return undefined
  const directory = (binding as { readonly directory?: unknown }).directory
  return typeof directory === "string" && isSafeRelative(directory) ? directory : undefined
}

const describe = (e: PlatformError.PlatformError | StoreUnavailable): string =>
  e._tag === "StoreUnavailable" ? e.description : e.message

/**
 * The local-directory driver (see the module documentation).
 *
 * @since 0.2.0
 * @category constructors
 */
export const make: (options: Options) => Effect.Effect<Driver<Handle>, never, FileSystem.FileSystem | Path.Path> =
  Effect.fnUntraced(function*(options: Options) {
    const fs = yield* FileSystem.FileSystem
    const path = yield* Path.Path
    const store = yield* makeStore(options.store)
    const root = path.resolve(options.root)
    const absolute = (relative: string) => path.join(root, ...relative.split("/"))

    const create: Driver<Handle>["create"] = ({ checkpointRef, executionId, key }) =>
      Effect.gen(function*() {
        const relative = `${executionId}/${key}`
        if (!isSafeRelative(relative)) {
          return yield* Effect.fail(
            new ResourceError({ key, operation: "create", description: `cannot name a directory ${JSON.stringify(relative)}` })
          )
        }
        const directory = absolute(relative)
        if (checkpointRef === undefined) {
          // A fresh directory: empty, even when an earlier try left something behind.
          yield* fs.remove(directory, { recursive: true, force: true })
          yield* fs.makeDirectory(directory, { recursive: true })
        } else {
          yield* store.restore(checkpointRef, directory).pipe(
            Effect.catchTag("StoreUnavailable", (e) =>
              Effect.fail(new CheckpointUnavailable({ key, checkpointRef, description: e.description })))
          )
        }
        return { handle: { directory }, binding: { directory: relative } }
      }).pipe(
        Effect.catchTag("PlatformError", (e) =>
          Effect.fail(new ResourceError({ key, operation: "create", description: describe(e), cause: e })))
      )

    const open: Driver<Handle>["open"] = (binding, { key }) =>
      Effect.gen(function*() {
        const relative = bindingDirectory(binding)
        if (relative === undefined) {
          return yield* Effect.fail(
            new ResourceError({ key, operation: "open", description: `not a binding of this driver: ${JSON.stringify(binding)}` })
          )
        }
        const directory = absolute(relative)
        const exists = yield* fs.exists(directory).pipe(
          Effect.catchTag("PlatformError", (e) =>
            Effect.fail(new ResourceError({ key, operation: "open", description: describe(e), cause: e })))
        )
        if (!exists) {
          return yield* Effect.fail(
            new ResourceError({ key, operation: "open", description: `the directory ${directory} is gone` })
          )
        }
        return { directory }
      })

    const checkpoint: Driver<Handle>["checkpoint"] = (handle) =>
      store.checkpoint(handle.directory).pipe(
        Effect.catchTag("PlatformError", (e) =>
          Effect.fail(
            new ResourceError({ key: path.basename(handle.directory), operation: "checkpoint", description: describe(e), cause: e })
          ))
      )

    return {
      driverId: options.driverId ?? driverId,
      ...(options.configuration === undefined ? {} : { configuration: options.configuration }),
      create,
      open,
      checkpoint
    }
  })

/**
 * The {@link LocalDirectory} driver service as a Layer.
 *
 * @since 0.2.0
 * @category layers
 */
export const layer = (options: Options): Layer.Layer<LocalDirectory, never, FileSystem.FileSystem | Path.Path> =>
  Layer.effect(LocalDirectory, make(options))
