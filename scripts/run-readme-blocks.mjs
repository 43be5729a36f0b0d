// Runs the README's runnable ```ts blocks in a consumer project where the packed package
// is installed (with effect, @effect/platform-node, vitest and @effect/vitest): what
// `npm run check:examples` type-checks against src/, this runs against the tarball.
//
//   node scripts/run-readme-blocks.mjs <project dir> [file.md]  (.ci/consumer-smoke.sh calls it)
//
// (`file.md`: another Markdown file than the checkout's README.md, to try the check.)
//
// The blocks are read, marked and assembled by scripts/readme-blocks.mjs (the parser and
// the preludes check-examples.mjs uses; the preludes' `run` forms here). Each block is
// written to <project>/readme-blocks/ and, by its kind:
//   - imports @effect/vitest: a test file; all of them run in one `vitest run`;
//   - marked `run agent ID INPUT`: an agent process. A dev kernel of the installed bin
//     (`effect-rebuno dev --port 0`) registers ID at a free port with a secret; the block
//     runs under plain Node with REBUNO_URL, REBUNO_AGENT_SECRET and AGENT_PORT set (and
//     its `port: 5000` made that port); an execution of ID on INPUT must complete;
//   - any other: a module run under plain Node (type stripping) that must exit 0.
// Blocks marked `skip` or `norun`, and fragments whose preludes only declare names, are
// listed as not run, with why. Exits 1 if a block fails; 20 s per block at most.
import { spawn } from "node:child_process"
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"
import { readmeSnippets, assemble, runtimePrelude } from "./readme-blocks.mjs"

const root = Path.resolve(Path.dirname(fileURLToPath(import.meta.url)), "..")
const project = Path.resolve(process.argv[2] ?? ".")
const dir = Path.join(project, "readme-blocks")
const timeoutMs = 20_000
const started = Date.now()

const readmePath = Path.resolve(process.argv[3] ?? Path.join(root, "README.md"))
const readmeName = Path.basename(readmePath)
const { snippets, problems } = readmeSnippets(Fs.readFileSync(readmePath, "utf8").split("\n"), readmeName)
if (problems.length > 0) {
  for (const problem of problems) console.error(problem)
  process.exit(1)
}

Fs.rmSync(dir, { recursive: true, force: true })
Fs.mkdirSync(dir, { recursive: true })

// --- classify and write ------------------------------------------------------------------

const blocks = []
for (const snippet of snippets) {
  const where = `${readmeName}:${snippet.fenceLine}`
  const declaring = snippet.preludes.filter((name) => runtimePrelude(name) === undefined)
  let notRun
  if (snippet.skip) notRun = "marked skip"
  else if (snippet.norun) notRun = snippet.norun
  else if (declaring.length > 0) notRun = `a fragment: prelude ${declaring.join(", ")} only declares what it needs`
  if (notRun) {
    blocks.push({ where, kind: "-", status: "not run", detail: notRun })
    continue
  }
  for (const name of snippet.preludes) {
    for (const file of runtimePrelude(name).files ?? []) {
      Fs.mkdirSync(Path.dirname(Path.join(dir, file)), { recursive: true })
      Fs.copyFileSync(Path.join(root, file), Path.join(dir, file))
    }
  }
  let text = assemble(snippet, { runtime: true }).map(([line]) => line).join("\n") + "\n"
  const test = snippet.lines.some((line) => /from\s+["']@effect\/vitest["']/.test(line))
  const kind = test ? "vitest" : snippet.run ? `agent ${snippet.run.agent}` : "module"
  const file = Path.join(dir, `${snippet.name}${test ? ".test" : ""}.ts`)
  blocks.push({ where, kind, file, snippet, text, status: "pending", detail: "" })
}

// --- processes -----------------------------------------------------------------------------

const children = new Set()
const cleanup = () => {
  for (const child of children) {
    try {
      process.kill(-child.pid, "SIGKILL")
    } catch {}
  }
}
process.on("exit", cleanup)
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => process.exit(130))

// A child in its own process group (killed with it), its output kept.
const start = (args, { env = {}, cwd = dir } = {}) => {
  const child = spawn(process.execPath, args, {
    cwd,
    env: { ...process.env, NO_COLOR: "1", ...env },
    detached: true,
    stdio: ["ignore", "pipe", "pipe"]
  })
  children.add(child)
  child.output = ""
  child.stdout.on("data", (data) => (child.output += data))
  child.stderr.on("data", (data) => (child.output += data))
  child.exited = new Promise((resolve) =>
    child.on("exit", (code, signal) => {
      children.delete(child)
      resolve(code ?? signal)
    })
  )
  return child
}
const stop = async (child) => {
  try {
    process.kill(-child.pid, "SIGTERM")
  } catch {}
  const timer = setTimeout(() => {
    try {
      process.kill(-child.pid, "SIGKILL")
    } catch {}
  }, 2_000)
  await child.exited
  clearTimeout(timer)
}
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const freePort = () =>
  new Promise((resolve, reject) => {
    const server = Net.createServer().once("error", reject).listen(0, "127.0.0.1", () => {
      const { port } = server.address()
      server.close(() => resolve(port))
    })
  })
const listening = (port) =>
  new Promise((resolve) => {
    const socket = Net.connect(port, "127.0.0.1")
    socket.once("connect", () => (socket.destroy(), resolve(true)))
    socket.once("error", () => resolve(false))
  })
const tail = (output) => output.trim().split("\n").slice(-15).map((line) => `      ${line}`).join("\n")

// --- run -----------------------------------------------------------------------------------

const runModule = async (block) => {
  Fs.writeFileSync(block.file, block.text)
  const child = start([block.file])
  const code = await Promise.race([child.exited, sleep(timeoutMs).then(() => "timeout")])
  if (code === "timeout") {
    await stop(child)
    return [false, `did not exit within ${timeoutMs / 1000} s\n${tail(child.output)}`]
  }
  return code === 0 ? [true, "exit 0"] : [false, `exit ${code}\n${tail(child.output)}`]
}

const bin = Path.join(project, "node_modules", "effect-rebuno", "dist", "bin", "cli.js")
const runAgent = async (block) => {
  const { agent, input } = block.snippet.run
  const port = await freePort()
  const secret = `${agent}-readme-secret`
  Fs.writeFileSync(block.file, block.text.replace(/\bport: 5000\b/g, `port: ${port}`))
  const manifest = Path.join(dir, `${block.snippet.name}.manifest.yaml`)
  Fs.writeFileSync(
    manifest,
    `agents:\n  - id: ${agent}\n    webhook_url: http://127.0.0.1:${port}/webhook\n    secret: ${secret}\n`
  )
  const until = Date.now() + timeoutMs
  const kernel = start([bin, "dev", "--port", "0", "--config", manifest])
  let process_ = undefined
  try {
    let url
    while (!(url = /listening on (http:\/\/\S+)/.exec(kernel.output)?.[1])) {
      if (Date.now() > until || kernel.exitCode !== null) return [false, `the dev kernel did not start\n${tail(kernel.output)}`]
      await sleep(25)
    }
    process_ = start([block.file], {
      env: { REBUNO_URL: url, REBUNO_AGENT_SECRET: secret, AGENT_PORT: String(port), AGENT_HOST: "127.0.0.1" }
    })
    while (!(await listening(port))) {
      if (Date.now() > until || process_.exitCode !== null) {
        return [false, `the agent did not listen on ${port}\n${tail(process_.output)}`]
      }
      await sleep(25)
    }
    const created = await fetch(`${url}/v0/executions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ agent_id: agent, input })
    })
    if (created.status !== 201) return [false, `create: ${created.status} ${await created.text()}`]
    const { id } = await created.json()
    for (;;) {
      const execution = await (await fetch(`${url}/v0/executions/${id}`)).json()
      if (execution.status === "completed") return [true, `completed: ${JSON.stringify(execution.output).slice(0, 100)}`]
      if (execution.status === "failed" || execution.status === "cancelled" || Date.now() > until) {
        return [
          false,
          `execution ${execution.status}${execution.failure_reason ? `: ${execution.failure_reason}` : ""}\n` +
            `    agent:\n${tail(process_.output)}\n    kernel:\n${tail(kernel.output)}`
        ]
      }
      await sleep(25)
    }
  } finally {
    await Promise.all([stop(kernel), process_ && stop(process_)].filter(Boolean))
  }
}

const runTests = async (tests) => {
  if (tests.length === 0) return
  for (const block of tests) Fs.writeFileSync(block.file, block.text)
  const vitest = Path.join(project, "node_modules", "vitest", "vitest.mjs")
  const report = Path.join(dir, "vitest.json")
  const child = start([vitest, "run", "--root", dir, "--reporter=json", `--outputFile=${report}`], { cwd: dir })
  const code = await Promise.race([child.exited, sleep(3 * timeoutMs).then(() => "timeout")])
  if (code === "timeout") await stop(child)
  const results = Fs.existsSync(report) ? JSON.parse(Fs.readFileSync(report, "utf8")).testResults : []
  for (const block of tests) {
    const result = results.find((r) => Path.resolve(r.name) === block.file)
    if (!result) {
      block.status = "FAILED"
      block.detail = `no result from vitest (${code})\n${tail(child.output)}`
      continue
    }
    const failed = result.assertionResults.filter((a) => a.status !== "passed")
    block.status = result.status === "passed" && failed.length === 0 && result.assertionResults.length > 0
      ? "ok"
      : "FAILED"
    block.detail = block.status === "ok"
      ? `${result.assertionResults.length} test(s) passed`
      : [result.message, ...failed.map((a) => `${a.fullName}: ${a.status}\n${(a.failureMessages ?? []).join("\n")}`)]
        .filter(Boolean).join("\n").split("\n").slice(0, 20).map((line) => `      ${line}`).join("\n")
  }
}

await Promise.all([
  runTests(blocks.filter((b) => b.kind === "vitest")),
  ...blocks.filter((b) => b.kind === "module" || b.kind.startsWith("agent ")).map(async (block) => {
    const [ok, detail] = await (block.kind === "module" ? runModule(block) : runAgent(block))
    block.status = ok ? "ok" : "FAILED"
    block.detail = detail
  })
])

for (const block of blocks) {
  console.log(`${block.where.padEnd(15)} ${block.kind.padEnd(17)} ${block.status.padEnd(7)} ${block.detail}`)
}
const ran = blocks.filter((b) => b.status !== "not run")
const failed = ran.filter((b) => b.status !== "ok")
const seconds = ((Date.now() - started) / 1000).toFixed(1)
;(failed.length > 0 ? console.error : console.log)(
  `run-readme-blocks: ${blocks.length} \`\`\`ts blocks: ${ran.length} run, ${failed.length} failed, ` +
    `${blocks.length - ran.length} not run, in ${seconds}s`
)
process.exit(failed.length > 0 ? 1 : 0)
