/**
 * The dev manifest of the embedded kernel (PROTOCOL 4.2): a YAML file with an
 * `agents:` list that registers webhook agents at start-up, in the reference
 * kernel's format. The whole text goes through Go-style environment expansion
 * first (unset variables stay as the literal `$NAME`), each agent may carry an
 * inline `policy` bundle or a `policy_file` relative to the manifest, and every
 * bundle is validated before any agent is registered, so a bad manifest aborts
 * start-up without registering half of it.
 *
 * @since 0.1.0
 */
import * as Config from "effect/Config"
import * as Effect from "effect/Effect"
import * as FileSystem from "effect/FileSystem"
import * as Option from "effect/Option"
import * as Path from "effect/Path"
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"
import * as YAML from "yaml"
import type * as Core from "./Core.js"
import { goQuote } from "./internal/goQuote.js"
import * as Policy from "./Policy.js"

/**
 * A manifest that cannot be loaded. `message` is the exact start-up error of
 * PROTOCOL 4.2 (e.g. `agents[1]: id is required`).
 *
 * @since 0.1.0
 * @category errors
 */
export class ManifestError extends Schema.TaggedError<ManifestError>("effect-rebuno/kernel/ManifestError")("ManifestError", {
  message: Schema.String
}) {}

/**
 * One agent entry of a manifest, after expansion, policy-file loading and
 * validation.
 *
 * @since 0.1.0
 * @category models
 */
export interface ManifestAgent {
  readonly id: string
  readonly webhookUrl: string
  readonly secret: string
  /** Raw YAML text of the policy bundle; `""` = no policy. */
  readonly policyBundle: string
  /** Per-agent lease timeout override (dev-kernel extension), only when ≥ 10. */
  readonly leaseTimeoutSeconds: number | undefined
}

/** Minimum per-agent lease override (PROTOCOL Appendix A). */
const MIN_LEASE_TIMEOUT_SECONDS = 10

const isShellSpecialVar = (c: string): boolean => "*#$@!?-0123456789".includes(c) && c.length === 1

const isAlphaNum = (c: number): boolean =>
  c === 0x5f || (c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a)

/** Go's `os.getShellName`: the variable name after a `$` and how many characters it spans. */
const shellName = (s: string): readonly [name: string, width: number] => {
  if (s[0] === "{") {
    if (s.length > 2 && isShellSpecialVar(s[1]!) && s[2] === "}") return [s[1]!, 3]
    for (let i = 1; i < s.length; i++) {
      if (s[i] === "}") return i === 1 ? ["", 2] : [s.slice(1, i), i + 1]
    }
    return ["", 1]
  }
  if (isShellSpecialVar(s[0]!)) return [s[0]!, 1]
  let i = 0
  while (i < s.length && isAlphaNum(s.charCodeAt(i))) i++
  return [s.slice(0, i), i]
}

/**
 * Go's `os.Expand` with the reference kernel's mapping: `$NAME` and `${NAME}`
 * become the variable's value, an unset variable becomes the literal `$NAME`
 * (braces dropped), a `$` not followed by a name is kept, and malformed
 * `${`…/`${}` are eaten as Go does.
 *
 * @example
 * ```ts
 * import { Manifest } from "effect-rebuno/kernel"
 *
 * Manifest.expandEnv("a $HOME ${NOPE} ^x$", (name) => name === "HOME" ? "/root" : undefined)
 * // "a /root $NOPE ^x$"
 * ```
 *
 * @since 0.1.0
 * @category parsing
 */
export const expandEnv = (text: string, lookup: (name: string) => string | undefined): string => {
  let out = ""
  let i = 0
  for (let j = 0; j < text.length; j++) {
    if (text[j] === "$" && j + 1 < text.length) {
      out += text.slice(i, j)
      const [name, width] = shellName(text.slice(j + 1))
      if (name === "" && width > 0) {
        // invalid syntax: eaten
      } else if (name === "") {
        out += "$"
      } else {
        const value = lookup(name)
        out += value === undefined ? "$" + name : value
      }
      j += width
      i = j + 1
    }
  }
  return out + text.slice(i)
}

/** The names `expandEnv` would look up in `text`. */
const referencedNames = (text: string): ReadonlyArray<string> => {
  const names = new Set<string>()
  expandEnv(text, (name) => {
    names.add(name)
    return ""
  })
  return [...names]
}

/** Go `%q` quoting of an agent id in error messages. */
const quote = goQuote

const fail = (message: string) => Effect.fail(new ManifestError({ message }))

/** A scalar field as Go's yaml.v3 would decode it into a `string`. */
const stringField = (entry: YAML.YAMLMap, key: string): string => {
  const node = entry.get(key, true)
  if (node === undefined || node === null) return ""
  if (YAML.isScalar(node)) {
    const value = node.value
    if (value === null || value === undefined) return ""
    if (typeof value === "string") return value
    return typeof node.source === "string" ? node.source : String(value)
  }
  return ""
}

const hasField = (entry: YAML.YAMLMap, key: string): boolean => stringField(entry, key) !== ""

/**
 * Parses already-expanded manifest text into its agent entries, reading
 * `policy_file`s relative to `baseDir` and validating every bundle in the
 * language of `stage` (default `"current"`, PROTOCOL-CURRENT C.8.6; the seed
 * language of PROTOCOL 10.2 for `"seed"` and `"v0.14.0"`).
 *
 * @since 0.1.0
 * @category parsing
 */
export const parse = Effect.fn("Manifest.parse")(function*(
  text: string,
  options: { readonly baseDir: string; readonly stage?: Core.Settings["stage"] | undefined }
) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const doc = YAML.parseDocument(text, { uniqueKeys: true })
  if (doc.errors.length > 0) {
    return yield* fail(`parse manifest: ${doc.errors[0]!.message.split("\n")[0]}`)
  }
  const root = doc.contents
  if (root !== null && !YAML.isMap(root)) {
    return yield* fail("parse manifest: the top level must be a mapping with an agents list")
  }
  const list = root === null ? undefined : root.get("agents", true)
  if (list === undefined || list === null || (YAML.isScalar(list) && list.value === null)) {
    return [] as ReadonlyArray<ManifestAgent>
  }
  if (!YAML.isSeq(list)) {
    return yield* fail("parse manifest: agents must be a list")
  }
  const agents: Array<ManifestAgent> = []
  for (let index = 0; index < list.items.length; index++) {
    const item = list.items[index]
    const entry = YAML.isMap(item) ? item : undefined
    const id = entry === undefined ? "" : stringField(entry, "id")
    if (entry === undefined || id === "") {
      return yield* fail(`agents[${index}]: id is required`)
    }
    const inline = stringField(entry, "policy")
    const policyFile = stringField(entry, "policy_file")
    if (hasField(entry, "policy") && hasField(entry, "policy_file")) {
      return yield* fail(`agent ${quote(id)}: set policy OR policy_file, not both`)
    }
    let bundle = inline
    if (policyFile !== "") {
      const resolved = path.isAbsolute(policyFile) ? policyFile : path.join(options.baseDir, policyFile)
      bundle = yield* fs.readFileString(resolved).pipe(
        Effect.catch((error) =>
          fail(`agent ${quote(id)}: read policy_file ${quote(resolved)}: ${error.message}`)
        )
      )
    }
    if (bundle !== "") {
      const parsed = Policy.parseBundle(bundle, { stage: options.stage })
      if (Result.isFailure(parsed)) {
        return yield* fail(`agent ${quote(id)}: invalid policy bundle: ${parsed.failure}`)
      }
    }
    const leaseNode = entry.get("lease_timeout_seconds", true)
    const leaseValue = YAML.isScalar(leaseNode) ? leaseNode.value : undefined
    const leaseTimeoutSeconds = typeof leaseValue === "number" && Number.isFinite(leaseValue) &&
        leaseValue >= MIN_LEASE_TIMEOUT_SECONDS
      ? leaseValue
      : undefined
    agents.push({
      id,
      webhookUrl: stringField(entry, "webhook_url"),
      secret: stringField(entry, "secret"),
      policyBundle: bundle,
      leaseTimeoutSeconds
    })
  }
  return agents as ReadonlyArray<ManifestAgent>
})

/**
 * Environment expansion with variables read through Effect's `ConfigProvider`
 * (the process environment by default), so tests can supply their own.
 *
 * @since 0.1.0
 * @category parsing
 */
export const expand = Effect.fn("Manifest.expand")(function*(text: string) {
  const values = new Map<string, string>()
  for (const name of referencedNames(text)) {
    const value = yield* Config.option(Config.String(name)).pipe(
      Effect.orElseSucceed(() => Option.none<string>())
    )
    if (Option.isSome(value)) values.set(name, value.value)
  }
  return expandEnv(text, (name) => values.get(name))
})

/**
 * Reads, expands, parses and validates a manifest file (bundles in the
 * language of `stage`, see {@link parse}).
 *
 * @since 0.1.0
 * @category loading
 */
export const load = Effect.fn("Manifest.load")(function*(
  file: string,
  options?: { readonly stage?: Core.Settings["stage"] | undefined }
) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const text = yield* fs.readFileString(file).pipe(
    Effect.catch((error) => fail(`read manifest ${quote(file)}: ${error.message}`))
  )
  const expanded = yield* expand(text)
  return yield* parse(expanded, { baseDir: path.dirname(path.resolve(file)), stage: options?.stage })
})

/**
 * Registers (upserts) manifest agents into a kernel core, in file order.
 * Agents not in the manifest are left alone.
 *
 * @since 0.1.0
 * @category loading
 */
export const register = Effect.fn("Manifest.register")(function*(
  core: Core.KernelCore,
  agents: ReadonlyArray<ManifestAgent>
) {
  for (const agent of agents) {
    yield* core.registerAgent({
      id: agent.id,
      webhookUrl: agent.webhookUrl,
      secret: agent.secret,
      policyBundle: agent.policyBundle,
      ...(agent.leaseTimeoutSeconds !== undefined ? { leaseTimeoutSeconds: agent.leaseTimeoutSeconds } : {})
    }).pipe(
      Effect.mapError((failure) => new ManifestError({ message: failure.message }))
    )
  }
})

/**
 * Loads a manifest file and registers its agents; returns them.
 *
 * @since 0.1.0
 * @category loading
 */
export const loadInto = Effect.fn("Manifest.loadInto")(function*(core: Core.KernelCore, file: string) {
  const agents = yield* load(file, { stage: core.settings.stage })
  yield* register(core, agents)
  return agents
})
