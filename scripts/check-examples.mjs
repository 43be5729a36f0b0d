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
// README blocks can be marked (`skip`, `prelude NAME …`, `run …`, `norun …`) by an HTML
// comment on the line right before their fence: see scripts/readme-blocks.mjs, which
// holds the README's block extraction, the named preludes and the module assembly this
// script shares with scripts/run-readme-blocks.mjs (which runs the blocks).
//
// `node scripts/check-examples.mjs [file]` checks another Markdown file instead of
// README.md (the JSDoc examples are checked either way).
import { spawnSync } from "node:child_process"
import * as Fs from "node:fs"
import { createRequire } from "node:module"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"
import { assemble, readmeSnippets } from "./readme-blocks.mjs"

const root = Path.resolve(Path.dirname(fileURLToPath(import.meta.url)), "..")
const readmePath = Path.resolve(root, process.argv[2] ?? "README.md") // another file, to try the check
const readmeName = Path.relative(root, readmePath)
const outDir = Path.join(root, "node_modules", ".cache", "examples")

// --- extract ------------------------------------------------------------------------

const readme = Fs.readFileSync(readmePath, "utf8").split("\n")
const { snippets, problems } = readmeSnippets(readme, readmeName)

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

Fs.rmSync(outDir, { recursive: true, force: true })
Fs.mkdirSync(outDir, { recursive: true })

const files = new Map() // absolute path → { snippet, origin: per line of the module, [line, column offset] or null }
for (const snippet of snippets) {
  if (snippet.skip) continue
  const out = assemble(snippet)
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
const readmeOnly = snippets.filter((s) => s.source === readmeName)
const skipped = readmeOnly.filter((s) => s.skip).length
const failed = problems.length > 0 || errors.length > 0 || result.status !== 0
;(failed ? console.error : console.log)(
  `check:examples: ${readmeName}: ${readmeOnly.length} \`\`\`ts blocks, ${skipped} skipped; ` +
    `src: ${exampleTags} @example tags, ${snippets.length - readmeOnly.length} \`\`\`ts blocks; ` +
    `${files.size} modules checked, ${problems.length} problem(s), ${errors.length} error(s) in ${seconds}s (tsc)`
)
if (failed) process.exit(1)
