import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import * as NodePath from "@effect/platform-node/NodePath"
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Layer } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Core from "../../src/kernel/Core.js"
import * as Manifest from "../../src/kernel/Manifest.js"

const platform = Layer.merge(NodeFileSystem.layer, NodePath.layer)

const tempDir = Effect.acquireRelease(
  Effect.sync(() => Fs.mkdtempSync(Path.join(Os.tmpdir(), "rebuno-manifest-"))),
  (dir) => Effect.sync(() => Fs.rmSync(dir, { recursive: true, force: true }))
)

const write = (dir: string, name: string, text: string): string => {
  const file = Path.join(dir, name)
  Fs.mkdirSync(Path.dirname(file), { recursive: true })
  Fs.writeFileSync(file, text)
  return file
}

const withEnv = (env: Record<string, string>) =>
  Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromUnknown(env, { preserveEmptyStrings: true }))

/** These tests pin the seed stage's bundle language (priorities); the current one is Policy's. */
const loadText = (text: string, env: Record<string, string> = {}) =>
  Effect.gen(function*() {
    const dir = yield* tempDir
    const file = write(dir, "manifest.yaml", text)
    return yield* Manifest.load(file, { stage: "seed" }).pipe(withEnv(env))
  }).pipe(Effect.provide(platform))

const errorOf = (text: string, env: Record<string, string> = {}) =>
  Effect.map(Effect.flip(loadText(text, env)), (e) => {
    expect(e._tag).toBe("ManifestError")
    return e.message
  })

const POLICY = `default_action: deny
rules:
  - id: allow-llm
    priority: 5
    when: { step_kind: llm_call }
    then: { decision: allow }
`

describe("Manifest", () => {
  describe("expandEnv (Go os.Expand with the reference mapping)", () => {
    const env: Record<string, string> = { HOME: "/root", A_1: "x", EMPTY: "" }
    const expand = (s: string) => Manifest.expandEnv(s, (name) => env[name])

    it("replaces $NAME and ${NAME}", () => {
      expect(expand("$HOME/${HOME}/$A_1-${A_1}")).toBe("/root//root/x-x")
      expect(expand("[$EMPTY]")).toBe("[]")
    })

    it("keeps unset variables as the literal $NAME (braces dropped)", () => {
      expect(expand("$NOPE ${NOPE} ${NO PE}")).toBe("$NOPE $NOPE $NO PE")
    })

    it("keeps a $ not followed by a name and eats malformed braces", () => {
      expect(expand("^ls$")).toBe("^ls$")
      expect(expand("a$ b$\" $)")).toBe("a$ b$\" $)")
      expect(expand("x${}y")).toBe("xy")
      expect(expand("x${y")).toBe("xy")
      expect(expand("$1abc $$")).toBe("$1abc $$")
      expect(expand("\\s*ls\\b$")).toBe("\\s*ls\\b$")
      expect(expand("no dollars")).toBe("no dollars")
    })
  })

  describe("load", () => {
    it.effect("parses agents with env expansion, inline policy and lease override", () =>
      Effect.gen(function*() {
        const agents = yield* loadText(
          `agents:
  - id: hello
    webhook_url: http://localhost:\${PORT}/webhook
    secret: $SECRET
    lease_timeout_seconds: 30
  - id: researcher
    webhook_url: http://localhost:5001/webhook
    secret: $UNSET_SECRET
    unknown_key: ignored
    lease_timeout_seconds: 5
    policy: |
${POLICY.split("\n").map((l) => "      " + l).join("\n")}
`,
          { PORT: "5000", SECRET: "hello-secret" }
        )
        expect(agents).toEqual([
          {
            id: "hello",
            webhookUrl: "http://localhost:5000/webhook",
            secret: "hello-secret",
            policyBundle: "",
            leaseTimeoutSeconds: 30
          },
          {
            id: "researcher",
            webhookUrl: "http://localhost:5001/webhook",
            secret: "$UNSET_SECRET",
            policyBundle: POLICY,
            leaseTimeoutSeconds: undefined
          }
        ])
      }))

    it.effect("an empty manifest or an empty agents list registers nothing", () =>
      Effect.gen(function*() {
        expect(yield* loadText("")).toEqual([])
        expect(yield* loadText("agents:\n")).toEqual([])
        expect(yield* loadText("agents: []\nother: 1\n")).toEqual([])
      }))

    it.effect("resolves policy_file against the manifest directory, without expanding it", () =>
      Effect.gen(function*() {
        const dir = yield* tempDir
        const policy = "default_action: allow\nrules:\n  - id: r\n    when: { target: \"$NOT_EXPANDED\" }\n    then: { decision: deny }\n"
        write(dir, "policies/shell.yaml", policy)
        const absolute = write(dir, "abs/other.yaml", POLICY)
        const file = write(
          dir,
          "conf/../manifest.yaml",
          `agents:\n  - id: shell\n    policy_file: policies/shell.yaml\n  - id: abs\n    policy_file: ${absolute}\n`
        )
        const agents = yield* Manifest.load(file, { stage: "seed" }).pipe(
          withEnv({ NOT_EXPANDED: "boom" }),
          Effect.provide(platform)
        )
        expect(agents.map((a) => [a.id, a.policyBundle])).toEqual([["shell", policy], ["abs", POLICY]])
      }))

    it.effect("error messages", () =>
      Effect.gen(function*() {
        expect(yield* errorOf("agents:\n  - id: a\n  - webhook_url: x\n")).toBe("agents[1]: id is required")
        expect(yield* errorOf("agents:\n  - id: \"\"\n")).toBe("agents[0]: id is required")
        expect(yield* errorOf("agents:\n  - id: $UNSET_BUT_LITERAL\n  - secret: s\n")).toBe(
          "agents[1]: id is required"
        )
        expect(yield* errorOf("agents:\n  - id: a\n    policy: \"x: 1\"\n    policy_file: p.yaml\n")).toBe(
          "agent \"a\": set policy OR policy_file, not both"
        )
        expect(yield* errorOf("agents:\n  - id: a\n    policy_file: missing.yaml\n")).toMatch(
          /^agent "a": read policy_file ".*missing\.yaml": /
        )
        const dup = "rules:\n  - id: x\n    then: { decision: allow }\n  - id: y\n    then: { decision: deny }\n"
        expect(yield* errorOf(`agents:\n  - id: a\n    policy: |\n${dup.split("\n").map((l) => "      " + l).join("\n")}`))
          .toBe("agent \"a\": invalid policy bundle: duplicate priority 0 used by \"x\" and \"y\"")
        expect(yield* errorOf("agents: [")).toMatch(/^parse manifest: /)
      }))

    it.effect("an unreadable manifest is an error", () =>
      Effect.gen(function*() {
        const error = yield* Effect.flip(Manifest.load("/nonexistent/manifest.yaml").pipe(Effect.provide(platform)))
        expect(error.message).toMatch(/^read manifest "\/nonexistent\/manifest.yaml": /)
      }))
  })

  describe("register", () => {
    it.effect("upserts agents with their policies and leaves others alone", () =>
      Effect.gen(function*() {
        const core = yield* Core.make({ stage: "seed" })
        yield* core.registerAgent({ id: "other", webhookUrl: "http://o", secret: "o" })
        yield* core.registerAgent({ id: "hello", webhookUrl: "http://old", secret: "old" })
        const dir = yield* tempDir
        const file = write(
          dir,
          "m.yaml",
          `agents:\n  - id: hello\n    webhook_url: http://new\n    secret: s\n    lease_timeout_seconds: 45\n    policy: |\n${
            POLICY.split("\n").map((l) => "      " + l).join("\n")
          }\n`
        )
        const agents = yield* Manifest.loadInto(core, file).pipe(Effect.provide(platform))
        expect(agents.map((a) => a.id)).toEqual(["hello"])
        const hello = yield* core.getAgent("hello")
        expect(hello).toMatchObject({ webhookUrl: "http://new", secret: "s", leaseTimeoutMs: 45_000 })
        expect(hello.policy).toBeDefined()
        expect((yield* core.listAgents()).map((a) => a.id)).toEqual(["hello", "other"])
      }))
  })
})
