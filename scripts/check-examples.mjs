// npm run check:examples: every ```ts block of README.md, and every ```ts block
// inside an `@example` JSDoc tag of src/**/*.ts, type-checks against the package as
// a user imports it (`effect-rebuno`, `effect-rebuno/kernel`, `effect-rebuno/testing`,
// mapped to src/ by the root tsconfig's `paths`).
//
// Each block is written to its own module under node_modules/.cache/examples/ and
// one `tsc --noEmit` checks them all; errors are printed as README.md:LINE:COL or
// src/File.ts:LINE:COL, pointing into the README or the JSDoc comment.
//
// JSDoc examples (as Effect's docgen checks them): each ```ts block of an `@example`
// tag is a self-contained module a user could paste: its own imports, from the
// package names above, `effect` or `@effect/platform-node`, never a relative path;
// the leading ` * ` of the comment is stripped. An `@example` without a ```ts block
// is reported. No preludes.
//
// README blocks can be marked by an HTML comment on the line right before their fence:
//   <!-- readme-check: skip (why) -->        not checked (keep this rare)
//   <!-- readme-check: prelude NAME … -->    checked after the named preludes below:
//                                             declarations the fragment assumes, and
//                                             (`handler`) its statements wrapped in
//                                             `Effect.gen(function*() { … })`.
// Prefer a complete block: readers copy them.
//
// `node scripts/check-examples.mjs [file]` checks another Markdown file instead of
// README.md (the JSDoc examples are checked either way).
import { spawnSync } from "node:child_process"
import * as Fs from "node:fs"
import { createRequire } from "node:module"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"

const root = Path.resolve(Path.dirname(fileURLToPath(import.meta.url)), "..")
const readmePath = Path.resolve(root, process.argv[2] ?? "README.md") // another file, to try the check
const readmeName = Path.relative(root, readmePath)
const outDir = Path.join(root, "node_modules", ".cache", "examples")

// Named preludes. `imports` are import statements, added unless the block
// imports the same local name itself; `code` is declarations placed before the
// block's statements; `wrap` puts those statements (everything after the block's
// imports) inside `Effect.gen(function*() { … })`, for fragments of a handler.
// Keep them few and small: a block that can be complete should be.
const search = `
const search = Tool.make("search", {
  description: "Search the web.",
  args: Schema.Struct({ query: Schema.String }),
  success: Schema.Array(Schema.String),
  execute: ({ query }) => Effect.succeed([\`result for \${query}\`])
})`
const preludes = {
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
declare const LanguageModelLive: Layer.Layer<LanguageModel.LanguageModel>`
  },
  // examples/support/openAiChat.ts, which the README tells readers to copy
  openAiChat: {
    imports: [
      `import { Layer, Redacted } from "effect"`,
      `import { FetchHttpClient } from "effect/http"`,
      `import { Llm } from "effect-rebuno"`,
      `import * as OpenAiChat from "../../../examples/support/openAiChat.js"`
    ],
    code: `declare const apiKey: string`
  },
  // the \`refunds\` agent of examples/whatIf.ts
  refunds: {
    imports: [`import { refunds } from "../../../examples/whatIf.js"`]
  },
  // a driver's three functions, for the Sandbox block
  sandbox: {
    imports: [`import { Resource } from "effect-rebuno"`],
    code: `
declare const create: Resource.Driver<{ readonly id: string }>["create"]
declare const open: Resource.Driver<{ readonly id: string }>["open"]
declare const checkpoint: Resource.Driver<{ readonly id: string }>["checkpoint"]`
  },
  // an agent for the crash explorer
  checkout: {
    imports: [`import { Agent } from "effect-rebuno"`],
    code: `declare const checkout: Agent.Agent<{ readonly cart: string }, { readonly total: number }, never, never>`
  },
  // an MCP client of another SDK, for Mcp.wrap
  sdkClient: {
    imports: [`import { Effect } from "effect"`, `import { Mcp } from "effect-rebuno"`],
    code: `declare const sdkClient: { callTool(request: { name: string; arguments: Record<string, unknown> }): Promise<unknown> }`
  }
}

// --- extract ------------------------------------------------------------------------

// A snippet: `source` (the file it is reported in), `fenceLine` (1-based line of its
// opening fence), `lines` (its code), `at` ([line, column offset] in `source` of each
// code line: the README indent or the comment's ` * ` stripped from it), `skip`,
// `preludes` (names) and `name` (of the module written for it).
const snippets = []
const problems = []

const readme = Fs.readFileSync(readmePath, "utf8").split("\n")
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
  let skip = false
  const names = []
  if (marker) {
    const [word, ...rest] = marker[1].split(/\s+/)
    if (word === "skip") skip = true
    else if (word === "prelude") {
      for (const name of rest) {
        if (!(name in preludes)) problems.push(`${readmeName}:${start}: unknown prelude "${name}"`)
        else names.push(name)
      }
    } else problems.push(`${readmeName}:${start}: unknown readme-check marker "${marker[1]}"`)
  }
  readmeBlocks++
  snippets.push({
    source: readmeName,
    fenceLine: start + 1,
    lines,
    at,
    skip,
    preludes: names,
    name: `readme-${String(readmeBlocks).padStart(2, "0")}-L${start + 1}`
  })
  i = end
}

// The ```ts blocks of the `@example` tags of src/**/*.ts. A tag runs from its line to
// the next tag or the end of its comment.
const srcFiles = Fs.readdirSync(Path.join(root, "src"), { recursive: true, withFileTypes: true })
  .filter((entry) => entry.isFile() && entry.name.endsWith(".ts") && !entry.name.endsWith(".d.ts"))
  .map((entry) => Path.relative(root, Path.join(entry.parentPath, entry.name)))
  .sort()
let exampleTags = 0
for (const source of srcFiles) {
  const text = Fs.readFileSync(Path.join(root, source), "utf8").split("\n")
  let inComment = false
  let tag = null // { line, blocks } of the @example tag being read
  let block = null // { fenceLine, lines, at } of the ```ts block being read
  const closeTag = () => {
    if (block !== null) problems.push(`${source}:${block.fenceLine}: unclosed \`\`\`ts block in @example`)
    else if (tag !== null && tag.blocks === 0) {
      problems.push(`${source}:${tag.line}: @example without a \`\`\`ts block (write the example as one)`)
    }
    tag = null
    block = null
  }
  for (let i = 0; i < text.length; i++) {
    const line = text[i]
    if (!inComment) {
      if (/^\s*\/\*\*/.test(line) && !/\*\/\s*$/.test(line)) inComment = true
      continue
    }
    const prefix = /^\s*\*?(?: |$)/.exec(line)[0]
    const content = line.slice(prefix.length)
    const ends = /^\s*\*\//.test(line)
    if (ends || (block === null && /^@\w/.test(content))) closeTag()
    if (ends) {
      inComment = false
      continue
    }
    // An `@example` tag, or an `**Example** (…)` heading in the description (Effect's style):
    // each opens an example that runs to the next tag, heading or the end of the comment.
    if (/^@example\b/.test(content) || (block === null && /^\*\*Example\*\*/.test(content))) {
      if (tag !== null) closeTag()
      exampleTags++
      tag = { line: i + 1, blocks: 0 }
      continue
    }
    if (tag === null) continue
    if (block === null) {
      if (/^```\s*ts\s*$/.test(content)) block = { fenceLine: i + 1, lines: [], at: [] }
      else if (/^```/.test(content)) {
        problems.push(`${source}:${i + 1}: fence "${content.trim()}" in @example is not checked; write \`\`\`ts`)
      }
    } else if (/^```\s*$/.test(content)) {
      tag.blocks++
      block.lines.forEach((code, k) => {
        const from = /\bfrom\s+["'](\.{1,2}\/[^"']*)["']|\bimport\s*\(?\s*["'](\.{1,2}\/[^"']*)["']/.exec(code)
        if (from) {
          problems.push(
            `${source}:${block.at[k][0]}: @example imports "${from[1] ?? from[2]}"; import from ` +
              `effect-rebuno, effect-rebuno/kernel or effect-rebuno/testing as a user would`
          )
        }
      })
      snippets.push({
        source,
        fenceLine: block.fenceLine,
        lines: block.lines,
        at: block.at,
        skip: false,
        preludes: [],
        name: `${source.replace(/\.ts$/, "").replace(/[\/\\]/g, "_")}-L${block.fenceLine}`
      })
      block = null
    } else {
      block.lines.push(content)
      block.at.push([i + 1, prefix.length])
    }
  }
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

Fs.rmSync(outDir, { recursive: true, force: true })
Fs.mkdirSync(outDir, { recursive: true })

const files = new Map() // absolute path → { snippet, origin: per line of the module, [line, column offset] or null }
for (const snippet of snippets) {
  if (snippet.skip) continue
  const out = [] // [text, [line, column offset] in snippet.source | null (prelude)]
  const chosen = snippet.preludes.map((name) => preludes[name])
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
  const file = Path.join(outDir, `${snippet.name}.ts`)
  Fs.writeFileSync(file, out.map(([text]) => text).join("\n") + "\n")
  files.set(file, { snippet, origin: out.map(([, line]) => line) })
}

const rootConfig = Path.relative(outDir, Path.join(root, "tsconfig.json"))
Fs.writeFileSync(
  Path.join(outDir, "tsconfig.json"),
  JSON.stringify(
    {
      extends: rootConfig,
      compilerOptions: {
        // the root options (strict, exactOptionalPropertyTypes, NodeNext, the `paths`
        // that map effect-rebuno to src/), minus the ones a short example cannot meet
        noUnusedLocals: false,
        noUnusedParameters: false,
        moduleDetection: "force",
        noEmit: true
      },
      include: [],
      files: [...files.keys()].map((file) => Path.basename(file))
    },
    null,
    2
  ) + "\n"
)

// --- check -----------------------------------------------------------------------------

const started = Date.now()
const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc")
const result = spawnSync(process.execPath, [tsc, "-p", Path.join(outDir, "tsconfig.json"), "--pretty", "false"], {
  cwd: root,
  encoding: "utf8",
  maxBuffer: 64 * 1024 * 1024
})
const seconds = ((Date.now() - started) / 1000).toFixed(1)

const errors = []
let current = null
for (const line of (result.stdout + result.stderr).split("\n")) {
  const m = /^(.+?)\((\d+),(\d+)\): (error|warning) (TS\d+): (.*)$/.exec(line)
  if (m) {
    const file = Path.resolve(root, m[1])
    const entry = files.get(file)
    let where
    if (entry) {
      const origin = entry.origin[Number(m[2]) - 1]
      where = origin === null || origin === undefined
        ? `${entry.snippet.source}:${entry.snippet.fenceLine} (block's prelude, ${Path.relative(root, file)}:${m[2]})`
        : `${entry.snippet.source}:${origin[0]}:${Number(m[3]) + origin[1]}`
    } else {
      where = `${Path.relative(root, file)}:${m[2]}:${m[3]}`
    }
    current = `${where}: ${m[5]}: ${m[6]}`
    errors.push(current)
  } else if (current !== null && /^\s/.test(line) && line.trim() !== "") {
    errors[errors.length - 1] += "\n" + line
  } else if (line.trim() !== "") {
    errors.push(line)
    current = null
  }
}

for (const problem of problems) console.error(problem)
for (const error of errors) console.error(error)
const readmeSnippets = snippets.filter((s) => s.source === readmeName)
const skipped = readmeSnippets.filter((s) => s.skip).length
const failed = problems.length > 0 || errors.length > 0 || result.status !== 0
;(failed ? console.error : console.log)(
  `check:examples: ${readmeName}: ${readmeSnippets.length} \`\`\`ts blocks, ${skipped} skipped; ` +
    `src: ${exampleTags} @example tags, ${snippets.length - readmeSnippets.length} \`\`\`ts blocks; ` +
    `${files.size} modules checked, ${problems.length} problem(s), ${errors.length} error(s) in ${seconds}s (tsc)`
)
if (failed) process.exit(1)
