// The README's ```ts blocks, as two scripts read them: scripts/check-examples.mjs
// type-checks every one against src/, scripts/run-readme-blocks.mjs runs the runnable
// ones from the packed package (.ci/consumer-smoke.sh). One parser, one set of preludes.
//
// A block can be marked by an HTML comment on the line right before its fence, with
// clauses separated by `;` (so a reason cannot contain one):
//   <!-- readme-check: skip (why) -->        neither checked nor run (keep this rare)
//   <!-- readme-check: prelude NAME … -->    checked after the named preludes below:
//                                             declarations the fragment assumes, and
//                                             (`handler`) its statements wrapped in
//                                             `Effect.gen(function*() { … })`.
//   <!-- readme-check: run agent ID INPUT --> run as an agent process: a dev kernel
//                                             (the installed `effect-rebuno dev`) registers ID, the
//                                             block runs with REBUNO_URL, REBUNO_AGENT_SECRET and
//                                             AGENT_PORT (and its `port: 5000` made that port),
//                                             and an execution of ID on INPUT (JSON) must complete.
//   <!-- readme-check: norun (why) -->       type-checked, not run
// e.g. `<!-- readme-check: prelude researcher; run agent researcher {"prompt":"hi"} -->`.
// Unmarked, a block that imports @effect/vitest runs under vitest, any other runs as a
// module under plain Node (type stripping) and must exit 0; a block whose preludes
// only declare names (no `run` form below) is type-checked only.
// Prefer a complete block: readers copy them.

// Named preludes. `imports` are import statements, added unless the block
// imports the same local name itself; `code` is declarations placed before the
// block's statements; `wrap` puts those statements (everything after the block's
// imports) inside `Effect.gen(function*() { … })`, for fragments of a handler.
// Import paths are relative to the type-check's directory (node_modules/.cache/examples).
// `run` is the prelude as run-readme-blocks.mjs uses it (`{ imports, code, files }`:
// `files` are copied from the checkout next to the block's module, and import paths
// are relative to it); without `run`, a prelude that neither declares (`declare …`)
// nor wraps is used as it is, and one that does makes its blocks type-checked only.
// Keep them few and small: a block that can be complete should be.
const search = `
const search = Tool.make("search", {
  description: "Search the web.",
  args: Schema.Struct({ query: Schema.String }),
  success: Schema.Array(Schema.String),
  execute: ({ query }) => Effect.succeed([\`result for \${query}\`])
})`
export const preludes = {
  // the statements of a handler (or of a backend program), with the usual imports and
  // the names the API tour's fragments leave to the reader
  handler: {
    wrap: true,
    imports: [
      `import { Console, Effect, Layer, Option, Schedule, Schema, Stream } from "effect"`,
      `import { Agent, Client, Llm, Protocol, Step, Tool } from "effect-rebuno"`,
      `import { Explore } from "effect-rebuno/testing"`,
      `import type OpenAI from "openai"`
    ],
    code: `
declare const loadRows: Effect.Effect<ReadonlyArray<{ readonly id: string }>>
const User = Schema.Struct({ id: Schema.String, name: Schema.String })
declare const lookup: (id: string) => Effect.Effect<typeof User.Type>
declare const fetchQuote: Effect.Effect<number, Error>
declare const deadline: number
declare const documents: ReadonlyArray<string>
declare const client: Client.Client.Service
declare const executionId: string
declare const pauseRefunds: string
declare const apiKey: string
declare const model: string
declare const messages: Array<OpenAI.Chat.ChatCompletionMessageParam>`
  },
  // the \`search\` tool and the \`researcher\` agent of the API tour
  researcher: {
    imports: [
      `import { Effect, Layer, Schema } from "effect"`,
      `import { Agent, KernelClient, Step, Tool } from "effect-rebuno"`
    ],
    code: search + `
const researcher = Agent.make({
  id: "researcher",
  input: Schema.Struct({ prompt: Schema.String }),
  handler: ({ prompt }) =>
    Effect.gen(function*() {
      const startedAt = yield* Step.now
      const hits = yield* search({ query: prompt })
      return { startedAt, hits }
    }).pipe(Effect.catchTag("PolicyError", (e) => Effect.succeed({ denied: e.reason })))
})`
  },
  // the \`search\` tool alone
  search: {
    imports: [`import { Effect, Schema } from "effect"`, `import { Agent, Step, Tool } from "effect-rebuno"`],
    code: search
  },
  // the AI toolkit block: a second tool and a LanguageModel layer
  toolLoop: {
    imports: [
      `import { Effect, Layer, Schema } from "effect"`,
      `import { LanguageModel } from "effect/ai"`,
      `import { Tool } from "effect-rebuno"`
    ],
    code: search + `
const fetchPage = Tool.make("fetch_page", {
  args: Schema.Struct({ url: Schema.String }),
  success: Schema.String,
  execute: ({ url }) => Effect.succeed(url)
})
declare const LanguageModelLive: Layer.Layer<LanguageModel.LanguageModel>`,
    // the model layer of the openAiChat block, never called: the block only defines the agent
    run: {
      imports: [
        `import { Effect, Layer, Redacted, Schema } from "effect"`,
        `import { FetchHttpClient } from "effect/http"`,
        `import { Llm, Tool } from "effect-rebuno"`,
        `import * as OpenAiChat from "./examples/support/openAiChat.ts"`
      ],
      code: search + `
const fetchPage = Tool.make("fetch_page", {
  args: Schema.Struct({ url: Schema.String }),
  success: Schema.String,
  execute: ({ url }) => Effect.succeed(url)
})
const LanguageModelLive = OpenAiChat.layer({
  apiUrl: "http://127.0.0.1:9/v1",
  apiKey: Redacted.make("sk-readme-check"),
  model: "gpt-4o-mini",
  transformClient: Llm.transformClient
}).pipe(Layer.provide(FetchHttpClient.layer))`,
      files: ["examples/support/openAiChat.ts"]
    }
  },
  // examples/support/openAiChat.ts, which the README tells readers to copy
  openAiChat: {
    imports: [
      `import { Layer, Redacted } from "effect"`,
      `import { FetchHttpClient } from "effect/http"`,
      `import { Llm } from "effect-rebuno"`,
      `import * as OpenAiChat from "../../../examples/support/openAiChat.js"`
    ],
    code: `declare const apiKey: string`,
    run: {
      imports: [
        `import { Layer, Redacted } from "effect"`,
        `import { FetchHttpClient } from "effect/http"`,
        `import { Llm } from "effect-rebuno"`,
        `import * as OpenAiChat from "./examples/support/openAiChat.ts"`
      ],
      code: `const apiKey = "sk-readme-check"`,
      files: ["examples/support/openAiChat.ts"]
    }
  },
  // the \`refunds\` agent of examples/whatIf.ts
  refunds: {
    imports: [`import { refunds } from "../../../examples/whatIf.js"`],
    run: { imports: [`import { refunds } from "./examples/whatIf.ts"`], files: ["examples/whatIf.ts"] }
  },
  // a driver's three functions, for the Sandbox block
  sandbox: {
    imports: [`import { Resource } from "effect-rebuno"`],
    code: `
declare const create: Resource.Driver<{ readonly id: string }>["create"]
declare const open: Resource.Driver<{ readonly id: string }>["open"]
declare const checkpoint: Resource.Driver<{ readonly id: string }>["checkpoint"]`,
    // never called: the block only defines the driver's layer and the resource
    run: {
      imports: [`import { Effect } from "effect"`, `import { Resource } from "effect-rebuno"`],
      code: `
const create = () => Effect.die("not called")
const open = () => Effect.die("not called")
const checkpoint = () => Effect.die("not called")`
    }
  },
  // an agent for the crash explorer
  checkout: {
    imports: [`import { Agent } from "effect-rebuno"`],
    code: `declare const checkout: Agent.Agent<{ readonly cart: string }, { readonly total: number }, never, never>`,
    run: {
      imports: [`import { Effect, Schema } from "effect"`, `import { Agent, Step } from "effect-rebuno"`],
      code: `
const checkout = Agent.make({
  id: "checkout",
  input: Schema.Struct({ cart: Schema.String }),
  output: Schema.Struct({ total: Schema.Number }),
  handler: ({ cart }) => Step.run("price", Effect.succeed({ total: cart.length * 100 }), { args: { cart } })
})`
    }
  },
  // an MCP client of another SDK, for Mcp.wrap
  sdkClient: {
    imports: [`import { Effect } from "effect"`, `import { Mcp } from "effect-rebuno"`],
    code: `declare const sdkClient: { callTool(request: { name: string; arguments: Record<string, unknown> }): Promise<unknown> }`,
    run: {
      imports: [`import { Effect } from "effect"`, `import { Mcp } from "effect-rebuno"`],
      code: `const sdkClient = { callTool: async () => ({ content: [] }) }`
    }
  }
}

// --- extract ------------------------------------------------------------------------

// Parse a marker comment: { skip, names (preludes), run: { agent, input } | undefined,
// norun (reason) | undefined }, and problems.
export const parseMarker = (text, where) => {
  const marker = { skip: false, names: [], run: undefined, norun: undefined }
  const problems = []
  for (const clause of text.split(";").map((s) => s.trim()).filter(Boolean)) {
    const [word, ...rest] = clause.split(/\s+/)
    if (word === "skip") marker.skip = true
    else if (word === "norun") marker.norun = rest.join(" ") || "marked norun"
    else if (word === "prelude") {
      for (const name of rest) {
        if (!(name in preludes)) problems.push(`${where}: unknown prelude "${name}"`)
        else marker.names.push(name)
      }
    } else if (word === "run" && rest[0] === "agent" && rest.length >= 3) {
      try {
        marker.run = { agent: rest[1], input: JSON.parse(rest.slice(2).join(" ")) }
      } catch (e) {
        problems.push(`${where}: run agent ${rest[1]}: the input is not JSON (${e.message})`)
      }
    } else problems.push(`${where}: unknown readme-check marker "${clause}"`)
  }
  return { marker, problems }
}

// A snippet: `source` (the file it is reported in), `fenceLine` (1-based line of its
// opening fence), `lines` (its code), `at` ([line, column offset] in `source` of each
// code line: the README indent or the comment's ` * ` stripped from it), `skip`,
// `preludes` (names), `run`, `norun` and `name` (of the module written for it).
export const readmeSnippets = (readme, readmeName) => {
  const snippets = []
  const problems = []
  let readmeBlocks = 0
  for (let i = 0; i < readme.length; i++) {
    if (/^\s*```(typescript|tsx?\s+\S.*)\s*$/.test(readme[i])) {
      problems.push(`${readmeName}:${i + 1}: fence "${readme[i].trim()}" is not checked; write \`\`\`ts`)
    }
    const open = /^(\s*)```ts\s*$/.exec(readme[i])
    if (!open) continue
    const indent = open[1]
    const start = i
    let end = i + 1
    while (end < readme.length && !new RegExp(`^${indent}\`\`\`\\s*$`).test(readme[end])) end++
    if (end === readme.length) {
      problems.push(`${readmeName}:${start + 1}: unclosed \`\`\`ts block`)
      break
    }
    const raw = readme.slice(start + 1, end)
    const lines = raw.map((line) => line.startsWith(indent) ? line.slice(indent.length) : line)
    const at = raw.map((line, k) => [start + 2 + k, line.startsWith(indent) ? indent.length : 0])
    const marker = /^\s*<!--\s*readme-check:\s*(.*?)\s*-->\s*$/.exec(readme[start - 1] ?? "")
    const { marker: parsed, problems: markerProblems } = marker
      ? parseMarker(marker[1], `${readmeName}:${start}`)
      : { marker: { skip: false, names: [], run: undefined, norun: undefined }, problems: [] }
    problems.push(...markerProblems)
    readmeBlocks++
    snippets.push({
      source: readmeName,
      fenceLine: start + 1,
      lines,
      at,
      skip: parsed.skip,
      preludes: parsed.names,
      run: parsed.run,
      norun: parsed.norun,
      name: `readme-${String(readmeBlocks).padStart(2, "0")}-L${start + 1}`
    })
    i = end
  }
  return { snippets, problems }
}

// --- assemble ------------------------------------------------------------------------

// The local names an import statement binds.
const importedNames = (statement) => {
  const names = new Set()
  const clause = /^\s*import\s+(?:type\s+)?([\s\S]*?)\s+from\s+["']/.exec(statement)?.[1]
  if (!clause) return names
  const braces = /\{([\s\S]*)\}/.exec(clause)
  if (braces) {
    for (const spec of braces[1].split(",")) {
      const name = spec.trim().replace(/^type\s+/, "").split(/\s+as\s+/).pop()?.trim()
      if (name) names.add(name)
    }
  }
  const rest = clause.replace(/\{[\s\S]*\}/, "").split(",").map((s) => s.trim()).filter(Boolean)
  for (const part of rest) names.add(part.replace(/^\*\s+as\s+/, ""))
  return names
}

// Split a block into its leading import statements and the rest.
const splitImports = (lines) => {
  let n = 0
  let statement = ""
  let imports = 0
  while (n < lines.length) {
    const line = lines[n]
    if (statement === "" && !/^\s*import\b/.test(line) && !/^\s*(\/\/.*)?$/.test(line)) break
    statement += line + "\n"
    n++
    if (statement.trim() === "" || /^\s*\/\//.test(statement)) {
      statement = ""
      imports = n
      continue
    }
    if (/\bfrom\s+["'][^"']+["']|^\s*import\s+["']/.test(statement)) {
      statement = ""
      imports = n
    }
  }
  return imports
}

// The prelude as run: its `run` form, the type-check form if it declares nothing,
// else undefined (not runnable).
export const runtimePrelude = (name) => {
  const prelude = preludes[name]
  if (prelude.run) return { wrap: prelude.wrap, ...prelude.run }
  return /\bdeclare\b/.test(prelude.code ?? "") || prelude.wrap ? undefined : prelude
}

// The module for a snippet: [text, [line, column offset] in snippet.source | null (prelude)]
// per line. `runtime`: with the preludes' run forms (all must have one).
export const assemble = (snippet, { runtime = false } = {}) => {
  const out = []
  const chosen = snippet.preludes.map((name) => runtime ? runtimePrelude(name) : preludes[name])
  const importCount = splitImports(snippet.lines)
  const own = new Set()
  for (const statement of snippet.lines.slice(0, importCount).join("\n").split(/\n(?=\s*import\b)/)) {
    for (const name of importedNames(statement.replace(/^(\s*\/\/.*\n)*/, ""))) own.add(name)
  }
  for (const prelude of chosen) {
    for (const statement of prelude.imports ?? []) {
      const from = /\sfrom\s+("[^"]+")/.exec(statement)[1]
      const named = /^import\s+(type\s+)?\{([^}]*)\}/.exec(statement)
      if (named) {
        const wanted = named[2].split(",").map((s) => s.trim()).filter(Boolean)
          .filter((spec) => !own.has(spec.split(/\s+as\s+/).pop()))
        wanted.forEach((spec) => own.add(spec.split(/\s+as\s+/).pop()))
        if (wanted.length > 0) out.push([`import ${named[1] ?? ""}{ ${wanted.join(", ")} } from ${from}`, null])
      } else {
        const names = [...importedNames(statement)]
        if (names.some((name) => own.has(name))) continue
        names.forEach((name) => own.add(name))
        out.push([statement, null])
      }
    }
  }
  snippet.lines.slice(0, importCount).forEach((line, i) => out.push([line, snippet.at[i]]))
  for (const prelude of chosen) {
    for (const line of (prelude.code ?? "").split("\n")) if (line.trim() !== "") out.push([line, null])
  }
  const wrap = chosen.some((p) => p.wrap)
  if (wrap) {
    out.push([`import * as ReadmeCheck$Effect from "effect/Effect"`, null])
    out.push([`export const readmeCheck$snippet = ReadmeCheck$Effect.gen(function*() {`, null])
  }
  snippet.lines.slice(importCount).forEach((line, i) => out.push([line, snippet.at[importCount + i]]))
  if (wrap) out.push([`})`, null])
  out.push([`export {}`, null])
  return out
}
