/**
 * `examples/resources.ts` end to end over real HTTP on the embedded kernel:
 * the agent dies half-way through its third note, the operator forks the
 * execution at the latest covered seq, and the fork's workspace starts as of
 * the last checkpoint — the two notes written before the crash, without the
 * torn third one — before the fork writes the third note live.
 */
import { NodeServices } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Effect, References } from "effect"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { demo, listing } from "../examples/resources.js"

describe("examples/resources.ts", () => {
  it.live("crash mid-run, fork at the last checkpoint: the workspace is as of that checkpoint", () =>
    Effect.gen(function*() {
      const base = yield* Effect.acquireRelease(
        Effect.sync(() => fs.mkdtempSync(path.join(os.tmpdir(), "rebuno-example-"))),
        (dir) => Effect.sync(() => fs.rmSync(dir, { recursive: true, force: true }))
      )
      const store = path.join(base, "store")
      const outcome = yield* demo({ root: path.join(base, "workspaces"), store })
      // The crash left a torn third note in the crashed execution's workspace.
      expect(outcome.afterCrash).toEqual({ "note-1.txt": "alpha", "note-2.txt": "beta", "note-3.txt": "gamma, a" })
      expect(yield* listing(outcome.sourceDirectory)).toEqual(outcome.afterCrash)
      expect(outcome.source.status).toBe("cancelled")
      // The fork's workspace was restored from a checkpoint of the store, and started without the torn note.
      expect(outcome.restoredFrom).toMatch(/^[0-9a-f]{64}$/)
      expect(fs.existsSync(path.join(store, "manifests", `${outcome.restoredFrom}.json`))).toBe(true)
      expect(outcome.fork).toMatchObject({ status: "completed", forkSeq: outcome.forkSeq })
      expect(outcome.fork.output).toEqual({
        startedWith: { "note-1.txt": "alpha", "note-2.txt": "beta" },
        files: { "note-1.txt": "alpha", "note-2.txt": "beta", "note-3.txt": "gamma, at length" }
      })
      expect(yield* listing(outcome.forkDirectory)).toEqual({
        "note-1.txt": "alpha",
        "note-2.txt": "beta",
        "note-3.txt": "gamma, at length"
      })
    }).pipe(
      Effect.scoped,
      Effect.provide(NodeServices.layer),
      Effect.provideService(References.MinimumLogLevel, "Error"),
      Effect.timeout("60 seconds")
    ), 90_000)
})
