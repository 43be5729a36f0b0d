/**
 * The local-directory driver (`LocalDirectory`) on the real file system, in a
 * temporary directory: the content-addressed store (objects by SHA-256, one
 * manifest per checkpoint, the manifest's hash as the reference), restoring a
 * directory to exactly a manifest (extra entries removed, nested and empty
 * directories, symbolic links, permission bits), the errors of a missing or
 * corrupt checkpoint (`CheckpointUnavailable`, before the directory is
 * touched), bindings, and unsafe paths.
 */
import { describe, expect, it } from "@effect/vitest"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import * as NodePath from "@effect/platform-node/NodePath"
import { Effect, Exit, Layer } from "effect"
import { createHash } from "node:crypto"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as LocalDirectory from "../src/LocalDirectory.js"
import { CheckpointUnavailable, ResourceError } from "../src/Resource.js"

const Platform = Layer.mergeAll(NodeFileSystem.layer, NodePath.layer)

/** A fresh temporary directory, removed after the test. */
const tempDir = Effect.acquireRelease(
  Effect.sync(() => fs.mkdtempSync(path.join(os.tmpdir(), "rebuno-localdir-"))),
  (dir) => Effect.sync(() => fs.rmSync(dir, { recursive: true, force: true }))
)

const sha256 = (bytes: Uint8Array | string) => createHash("sha256").update(bytes).digest("hex")

/** Every entry under `dir` as `path → content` (directories `<dir>/`, links `-> target`). */
const tree = (dir: string): Record<string, string> => {
  const out: Record<string, string> = {}
  const visit = (relative: string) => {
    for (const name of fs.readdirSync(path.join(dir, relative))) {
      const child = relative === "" ? name : `${relative}/${name}`
      const stat = fs.lstatSync(path.join(dir, child))
      if (stat.isSymbolicLink()) out[child] = `-> ${fs.readlinkSync(path.join(dir, child))}`
      else if (stat.isDirectory()) {
        out[`${child}/`] = ""
        visit(child)
      } else out[child] = fs.readFileSync(path.join(dir, child), "utf8")
    }
  }
  visit("")
  return out
}

const write = (dir: string, files: Record<string, string>) => {
  for (const [name, content] of Object.entries(files)) {
    fs.mkdirSync(path.dirname(path.join(dir, name)), { recursive: true })
    fs.writeFileSync(path.join(dir, name), content)
  }
}

const failureOf = <A, E>(exit: Exit.Exit<A, E>): E => {
  if (Exit.isSuccess(exit)) throw new Error("expected a failure")
  const error = exit.cause.reasons.find((r) => r._tag === "Fail")
  if (error === undefined || error._tag !== "Fail") throw new Error("expected a Fail reason")
  return error.error
}

describe("LocalDirectory store", () => {
  it.effect("a checkpoint stores each file under objects/<2>/<62> and a manifest whose hash is the reference", () =>
    Effect.gen(function*() {
      const root = yield* tempDir
      const work = path.join(root, "work")
      const storeDir = path.join(root, "store")
      write(work, { "a.txt": "alpha", "docs/b.md": "beta", "docs/copy.txt": "alpha" })
      fs.mkdirSync(path.join(work, "empty"))
      const store = yield* LocalDirectory.makeStore(storeDir)
      const ref = yield* store.checkpoint(work)
      expect(ref).toMatch(/^[0-9a-f]{64}$/)
      const manifestBytes = fs.readFileSync(path.join(storeDir, "manifests", `${ref}.json`))
      expect(sha256(manifestBytes)).toBe(ref)
      const alpha = sha256("alpha")
      const beta = sha256("beta")
      expect(fs.readFileSync(path.join(storeDir, "objects", alpha.slice(0, 2), alpha.slice(2)), "utf8")).toBe("alpha")
      expect(fs.readFileSync(path.join(storeDir, "objects", beta.slice(0, 2), beta.slice(2)), "utf8")).toBe("beta")
      // Identical contents are stored once.
      expect(fs.readdirSync(path.join(storeDir, "objects")).length).toBe(new Set([alpha, beta].map((h) => h.slice(0, 2))).size)
      const mode = fs.statSync(path.join(work, "a.txt")).mode & 0o777
      expect(JSON.parse(manifestBytes.toString("utf8"))).toEqual({
        version: 1,
        entries: [
          { path: "a.txt", type: "file", size: 5, mode, sha256: alpha },
          { path: "docs", type: "directory" },
          { path: "docs/b.md", type: "file", size: 4, mode, sha256: beta },
          { path: "docs/copy.txt", type: "file", size: 5, mode, sha256: alpha },
          { path: "empty", type: "directory" }
        ]
      })
      expect(yield* store.manifest(ref)).toEqual(JSON.parse(manifestBytes.toString("utf8")))
      // The same contents give the same reference; a change gives another.
      expect(yield* store.checkpoint(work)).toBe(ref)
      write(work, { "a.txt": "ALPHA" })
      expect(yield* store.checkpoint(work)).not.toBe(ref)
    }).pipe(Effect.scoped, Effect.provide(Platform)))

  it.effect("restore rewrites the directory to exactly the manifest: extra entries go, changed ones come back", () =>
    Effect.gen(function*() {
      const root = yield* tempDir
      const work = path.join(root, "work")
      write(work, { "a.txt": "alpha", "nested/deep/c.txt": "gamma", "run.sh": "#!/bin/sh\n" })
      fs.chmodSync(path.join(work, "run.sh"), 0o755)
      fs.mkdirSync(path.join(work, "empty"))
      fs.symlinkSync("a.txt", path.join(work, "link"))
      const store = yield* LocalDirectory.makeStore(path.join(root, "store"))
      const ref = yield* store.checkpoint(work)
      const before = tree(work)
      // Change everything: edit, delete, add files and directories, retarget the link, replace a file by a directory.
      write(work, { "a.txt": "changed", "new.txt": "new", "added/dir/x": "x" })
      fs.rmSync(path.join(work, "nested"), { recursive: true })
      fs.rmSync(path.join(work, "empty"), { recursive: true })
      fs.rmSync(path.join(work, "run.sh"))
      fs.mkdirSync(path.join(work, "run.sh"))
      fs.rmSync(path.join(work, "link"))
      fs.symlinkSync("new.txt", path.join(work, "link"))
      yield* store.restore(ref, work)
      expect(tree(work)).toEqual(before)
      expect(fs.statSync(path.join(work, "run.sh")).mode & 0o777).toBe(0o755)
      // Into a directory that does not exist yet.
      const elsewhere = path.join(root, "elsewhere", "copy")
      yield* store.restore(ref, elsewhere)
      expect(tree(elsewhere)).toEqual(before)
    }).pipe(Effect.scoped, Effect.provide(Platform)))

  it.effect("a missing or corrupt checkpoint is unavailable, and the directory is left alone", () =>
    Effect.gen(function*() {
      const root = yield* tempDir
      const work = path.join(root, "work")
      const storeDir = path.join(root, "store")
      write(work, { "a.txt": "alpha" })
      const store = yield* LocalDirectory.makeStore(storeDir)
      const ref = yield* store.checkpoint(work)
      write(work, { "b.txt": "kept" })
      const unavailable = (r: string) => Effect.map(Effect.exit(store.restore(r, work)), failureOf)
      expect(yield* unavailable("0".repeat(64))).toEqual({
        _tag: "StoreUnavailable",
        description: "its manifest is not in the store"
      })
      expect(yield* unavailable("../../etc/passwd")).toMatchObject({ _tag: "StoreUnavailable" })
      const alpha = sha256("alpha")
      fs.writeFileSync(path.join(storeDir, "objects", alpha.slice(0, 2), alpha.slice(2)), "tampered")
      expect(yield* unavailable(ref)).toEqual({
        _tag: "StoreUnavailable",
        description: `object ${alpha} does not match its hash`
      })
      fs.rmSync(path.join(storeDir, "objects"), { recursive: true })
      expect(yield* unavailable(ref)).toEqual({ _tag: "StoreUnavailable", description: `object ${alpha} is not in the store` })
      fs.writeFileSync(path.join(storeDir, "manifests", `${ref}.json`), "{}")
      expect(yield* unavailable(ref)).toEqual({
        _tag: "StoreUnavailable",
        description: "its manifest does not match its hash"
      })
      expect(tree(work)).toEqual({ "a.txt": "alpha", "b.txt": "kept" })
    }).pipe(Effect.scoped, Effect.provide(Platform)))

  it.effect("a manifest that names a path outside the directory is refused", () =>
    Effect.gen(function*() {
      const root = yield* tempDir
      const storeDir = path.join(root, "store")
      const store = yield* LocalDirectory.makeStore(storeDir)
      for (const bad of ["../escape", "/abs", "a/../../b", "a//b", "."]) {
        const bytes = JSON.stringify({ version: 1, entries: [{ path: bad, type: "directory" }] })
        const ref = sha256(bytes)
        fs.mkdirSync(path.join(storeDir, "manifests"), { recursive: true })
        fs.writeFileSync(path.join(storeDir, "manifests", `${ref}.json`), bytes)
        expect(failureOf(yield* Effect.exit(store.restore(ref, path.join(root, "work"))))).toEqual({
          _tag: "StoreUnavailable",
          description: "its manifest is malformed"
        })
      }
      expect(fs.existsSync(path.join(root, "escape"))).toBe(false)
    }).pipe(Effect.scoped, Effect.provide(Platform)))
})

describe("LocalDirectory driver", () => {
  const EXEC = "0192f1a0-0000-7000-8000-000000000000"

  it.effect("create: a fresh directory per execution and key, bound by its path under the root", () =>
    Effect.gen(function*() {
      const root = yield* tempDir
      const driver = yield* LocalDirectory.make({ root: path.join(root, "ws"), store: path.join(root, "store") })
      expect(driver.driverId).toBe("effect-rebuno.local-directory.v1")
      expect(driver.configuration).toBeUndefined()
      // Left over from an earlier try that died before binding: a fresh create empties it.
      write(path.join(root, "ws", EXEC, "workspace"), { "stale.txt": "x" })
      const created = yield* driver.create({ key: "workspace", executionId: EXEC, checkpointRef: undefined })
      expect(created.binding).toEqual({ directory: `${EXEC}/workspace` })
      expect(created.handle.directory).toBe(path.join(root, "ws", EXEC, "workspace"))
      expect(tree(created.handle.directory)).toEqual({})
      const opened = yield* driver.open(created.binding, { key: "workspace", executionId: EXEC })
      expect(opened).toEqual(created.handle)
    }).pipe(Effect.scoped, Effect.provide(Platform)))

  it.effect("create from a checkpoint restores it; checkpoint answers the store's reference", () =>
    Effect.gen(function*() {
      const root = yield* tempDir
      const driver = yield* LocalDirectory.make({ root: path.join(root, "ws"), store: path.join(root, "store") })
      const first = yield* driver.create({ key: "workspace", executionId: EXEC, checkpointRef: undefined })
      write(first.handle.directory, { "a.txt": "alpha", "sub/b.txt": "beta" })
      const ref = yield* driver.checkpoint(first.handle)
      write(first.handle.directory, { "c.txt": "after the checkpoint" })
      const FORK = "0192f1a0-0000-7000-8000-0000000000f0"
      const fork = yield* driver.create({ key: "workspace", executionId: FORK, checkpointRef: ref })
      expect(fork.binding).toEqual({ directory: `${FORK}/workspace` })
      expect(tree(fork.handle.directory)).toEqual({ "a.txt": "alpha", "sub/": "", "sub/b.txt": "beta" })
    }).pipe(Effect.scoped, Effect.provide(Platform)))

  it.effect("a gone checkpoint is CheckpointUnavailable; a gone directory or a foreign binding a ResourceError", () =>
    Effect.gen(function*() {
      const root = yield* tempDir
      const driver = yield* LocalDirectory.make({
        root: path.join(root, "ws"),
        store: path.join(root, "store"),
        driverId: "app.workspace.v2",
        configuration: { purpose: "notes" }
      })
      expect(driver.driverId).toBe("app.workspace.v2")
      expect(driver.configuration).toEqual({ purpose: "notes" })
      const gone = failureOf(
        yield* Effect.exit(driver.create({ key: "workspace", executionId: EXEC, checkpointRef: "f".repeat(64) }))
      )
      expect(gone).toBeInstanceOf(CheckpointUnavailable)
      expect(gone.message).toBe(
        `checkpoint ${"f".repeat(64)} of resource "workspace" is unavailable: its manifest is not in the store`
      )
      const missing = failureOf(
        yield* Effect.exit(driver.open({ directory: `${EXEC}/workspace` }, { key: "workspace", executionId: EXEC }))
      )
      expect(missing).toBeInstanceOf(ResourceError)
      expect(missing.message).toBe(`open workspace: the directory ${path.join(root, "ws", EXEC, "workspace")} is gone`)
      for (const binding of [{ directory: "../outside" }, { sandbox: "x" }, "text", null]) {
        const foreign = failureOf(yield* Effect.exit(driver.open(binding, { key: "workspace", executionId: EXEC })))
        expect(foreign).toMatchObject({ _tag: "ResourceError", operation: "open" })
      }
      const badKey = failureOf(
        yield* Effect.exit(driver.create({ key: "..", executionId: EXEC, checkpointRef: undefined }))
      )
      expect(badKey).toMatchObject({ _tag: "ResourceError", operation: "create" })
    }).pipe(Effect.scoped, Effect.provide(Platform)))
})
