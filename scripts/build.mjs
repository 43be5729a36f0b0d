// npm run build: a clean dist/ with ESM .js, .d.ts and their maps, compiled by tsc
// from tsconfig.build.json; then the bin gets its executable bit.
import { spawnSync } from "node:child_process"
import * as Fs from "node:fs"
import { createRequire } from "node:module"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"

const root = Path.resolve(Path.dirname(fileURLToPath(import.meta.url)), "..")
const dist = Path.join(root, "dist")
const bin = Path.join(dist, "bin", "cli.js")

Fs.rmSync(dist, { recursive: true, force: true })

const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc")
const result = spawnSync(process.execPath, [tsc, "-p", Path.join(root, "tsconfig.build.json")], {
  cwd: root,
  stdio: "inherit"
})
if (result.status !== 0) {
  console.error(`build: tsc failed (${result.status ?? result.signal})`)
  process.exit(1)
}

if (!Fs.readFileSync(bin, "utf8").startsWith("#!/usr/bin/env node\n")) {
  console.error(`build: ${Path.relative(root, bin)} lost its shebang`)
  process.exit(1)
}
Fs.chmodSync(bin, 0o755)

let files = 0
const count = (dir) => {
  for (const entry of Fs.readdirSync(dir, { withFileTypes: true })) {
    if (entry.isDirectory()) count(Path.join(dir, entry.name))
    else files++
  }
}
count(dist)
console.log(`build: dist/ written (${files} files)`)
