/**
 * A chaos soak of `examples/hello.ts` against the embedded kernel, both as
 * real processes (`src/bin/cli.ts dev`, `examples/hello.ts`), driven from the
 * outside: used by `scripts/soak.ts` (minutes) and test/e2e/Soak.test.ts
 * (seconds).
 *
 * One *lane* per protocol stage: a kernel, an agent, and two chaos proxies —
 * agent → kernel (its signed calls) and kernel → agent (the webhook; the agent
 * is registered at the proxy's port). For the soak's duration, every lane
 *
 * - keeps creating executions (Poisson arrivals, sometimes bursts) with random
 *   queries (Unicode, odd whitespace, empty);
 * - lets both proxies reset, cut mid-request, drop or cut answers, stall and
 *   delay requests, at an intensity that changes over time (calm to storm);
 * - SIGKILLs or SIGTERMs the agent and restarts it, cuts every connection at
 *   once, partitions one direction for a while.
 *
 * The kernel keeps its state in memory only (there is no store option), so it
 * is never killed: that would lose every execution by design.
 *
 * Then the chaos stops, every lane settles (bounded), and the kernel's API is
 * checked: every execution created is `completed` exactly once with DESIGN's
 * output; its steps are `reverse/0` and `word_count/0`, each proposed and
 * succeeded once, nothing failed; no step event after `execution.completed`;
 * the kernel lists exactly the executions created; the kernel never exited,
 * logged nothing at error level (and nothing but failed deliveries at warn
 * level), exits 0 on SIGTERM; its RSS stayed within a budget; the agent never
 * died on its own and always exited on SIGTERM.
 *
 * A seeded PRNG drives every choice (one stream per lane and purpose, so that
 * one kind of chaos does not shift another): the same seed gives the same
 * plan; timing still varies from run to run.
 *
 * @since 0.2.0
 */
import type { ChildProcess } from "node:child_process"
import { readFileSync } from "node:fs"
import { accepts, api, exited, freePort, makeSpawner, sleep, until } from "./blackBox.js"
import { type ChaosProxy, type Fault, type FaultKind, makeChaosProxy } from "./tcpProxy.js"

export type Stage = "current" | "seed" | "v0.14.0"

export const allStages: ReadonlyArray<Stage> = ["current", "seed", "v0.14.0"]

const SECRET = "hello-secret"

// ---------------------------------------------------------------------------
// Seeded randomness
// ---------------------------------------------------------------------------

/** mulberry32: a small, fast, seedable PRNG. */
const mulberry32 = (seed: number) => {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** FNV-1a of `seed:label`: independent streams for independent purposes. */
const derive = (seed: number, label: string): number => {
  let h = 0x811c9dc5
  for (const c of `${seed}:${label}`) {
    h ^= c.codePointAt(0)!
    h = Math.imul(h, 0x01000193) >>> 0
  }
  return h
}

export class Rng {
  private readonly next: () => number
  constructor(seed: number, label: string) {
    this.next = mulberry32(derive(seed, label))
  }
  float(): number {
    return this.next()
  }
  chance(p: number): boolean {
    return this.next() < p
  }
  /** An integer in [min, max]. */
  int(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1))
  }
  pick<A>(items: ReadonlyArray<A>): A {
    return items[Math.floor(this.next() * items.length)]!
  }
  weighted<A>(items: ReadonlyArray<readonly [number, A]>): A {
    const total = items.reduce((sum, [w]) => sum + w, 0)
    let r = this.next() * total
    for (const [w, item] of items) {
      if ((r -= w) < 0) return item
    }
    return items[items.length - 1]![1]
  }
  /** An exponential wait with the given mean. */
  exponential(meanMs: number): number {
    return -Math.log(1 - this.next()) * meanMs
  }
}

// ---------------------------------------------------------------------------
// Options and results
// ---------------------------------------------------------------------------

export interface SoakOptions {
  readonly durationMs: number
  readonly seed: number
  readonly stages?: ReadonlyArray<Stage>
  /** Executions created per second per lane, on average (default 3). */
  readonly rate?: number
  /** Wait between chaos events (kills, cuts, partitions) per lane, ms (default [2000, 12000]). */
  readonly chaosEveryMs?: readonly [number, number]
  /** How long the lanes may take to settle once the chaos stops (default 180 s). */
  readonly settleTimeoutMs?: number
  /** The kernel's lease timeout flag (default 3s). */
  readonly leaseTimeout?: string
  /** The kernel's webhook timeout flag (default 2s). */
  readonly dispatchTimeout?: string
  /** Progress lines (default: none). */
  readonly log?: (line: string) => void
  /** Check the kernel's RSS budget (default: when the run lasts a minute or more). */
  readonly checkRss?: boolean
}

export interface LaneSummary {
  readonly stage: Stage
  readonly executions: number
  readonly completed: number
  readonly sigkills: number
  readonly sigterms: number
  readonly agentStarts: number
  readonly cutAlls: number
  readonly partitions: number
  readonly faults: { readonly toKernel: Record<FaultKind, number>; readonly toAgent: Record<FaultKind, number> }
  readonly refusedWhilePartitioned: number
  readonly settleMs: number
  readonly latencyMs: { readonly p50: number; readonly p99: number; readonly max: number }
  readonly reexecutedSteps: number
  readonly maxDispatchAttempt: number
  readonly rssKb: { readonly start: number; readonly warm: number; readonly peak: number; readonly end: number }
  readonly kernelWarnings: Record<string, number>
  readonly agentLogLevels: Record<string, number>
  readonly agentErrorSamples: ReadonlyArray<string>
  readonly sigtermExitMs: { readonly max: number }
}

export interface SoakSummary {
  readonly seed: number
  readonly durationMs: number
  readonly wallMs: number
  readonly lanes: ReadonlyArray<LaneSummary>
  readonly violations: ReadonlyArray<string>
}

// ---------------------------------------------------------------------------
// Queries and what DESIGN says hello answers
// ---------------------------------------------------------------------------

const words = [
  "hello", "world", "héllo", "wörld", "🙂", "👩‍💻", "日本語", "e\u0301", "x", "chaos", "soak", "Ωmega", "naïve",
  "a-b", "12345", "\u{1F600}\u{1F601}", "ꙮ", "שלום", "mañana"
]
const separators = [" ", " ", " ", "  ", "\t", "\n", "\u00a0", "\u3000", " \r\n "]

const makeQuery = (rng: Rng): string => {
  if (rng.chance(0.02)) return ""
  const n = rng.int(1, 7)
  let query = rng.chance(0.1) ? rng.pick(separators) : ""
  for (let i = 0; i < n; i++) query += (i > 0 ? rng.pick(separators) : "") + rng.pick(words)
  if (rng.chance(0.1)) query += rng.pick(separators)
  return query
}

export const expectedOutput = (query: string) => ({
  query,
  reversed: Array.from(query).reverse().join(""),
  word_count: query.split(/\s+/).filter((w) => w.length > 0).length
})

const deepEqual = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b)

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

const rssKb = (pid: number | undefined): number | undefined => {
  if (pid === undefined) return undefined
  try {
    const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))
    return match === null ? undefined : Number(match[1])
  } catch {
    return undefined
  }
}

/** Calls `onLine` with every line a stream writes. */
const lines = (stream: NodeJS.ReadableStream | null, onLine: (line: string) => void) => {
  if (stream === null) return
  let rest = ""
  stream.setEncoding("utf8")
  stream.on("data", (chunk: string) => {
    rest += chunk
    let i: number
    while ((i = rest.indexOf("\n")) >= 0) {
      onLine(rest.slice(0, i))
      rest = rest.slice(i + 1)
    }
  })
  stream.on("end", () => rest !== "" && onLine(rest))
}

/** A log message with its ids, numbers and durations blanked, to group by. */
const shape = (message: string) =>
  message
    .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, "<id>")
    .replace(/\d+(\.\d+)?/g, "N")
    .slice(0, 200)

const expectedKernelWarning = /^webhook delivery to agent hello failed: /

const percentile = (sorted: ReadonlyArray<number>, p: number) =>
  sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!

// ---------------------------------------------------------------------------
// A lane
// ---------------------------------------------------------------------------

interface Created {
  readonly id: string
  readonly query: string
  readonly createdAt: number
}

const runLane = async (stage: Stage, options: SoakOptions) => {
  const seed = options.seed
  const log = (line: string) => options.log?.(`[${stage}] ${line}`)
  const violations: Array<string> = []
  const violation = (what: string) => {
    violations.push(`[${stage}] ${what}`)
    log(`VIOLATION ${what}`)
  }
  const rng = {
    create: new Rng(seed, `${stage}/create`),
    query: new Rng(seed, `${stage}/query`),
    chaos: new Rng(seed, `${stage}/chaos`),
    intensity: new Rng(seed, `${stage}/intensity`),
    toKernel: new Rng(seed, `${stage}/toKernel`),
    toAgent: new Rng(seed, `${stage}/toAgent`)
  }
  const spawner = makeSpawner(["ignore", "pipe", "pipe"])
  spawners.add(spawner)
  const kernelPort = await freePort()
  const agentPort = await freePort()
  const base = `http://127.0.0.1:${kernelPort}`
  const created: Array<Created> = []

  // -- chaos on requests: an intensity (probability of a fault per request) that changes over time
  let intensity = 0
  const decide = (r: Rng) => (): Fault => {
    if (!r.chance(intensity)) return { kind: "pass" }
    return r.weighted<Fault>([
      [18, { kind: "reset" }],
      [18, { kind: "cutRequest", fraction: r.float() }],
      [16, { kind: "dropResponse" }],
      [14, { kind: "cutResponse", fraction: r.float() }],
      [16, { kind: "stall", ms: r.int(100, 7000), thenReset: r.chance(0.35) }],
      [18, { kind: "delay", ms: r.int(20, 1500) }]
    ])
  }
  const toKernel: ChaosProxy = makeChaosProxy({ targetPort: kernelPort, decide: decide(rng.toKernel) })
  const toAgent: ChaosProxy = makeChaosProxy({ targetPort: agentPort, decide: decide(rng.toAgent) })
  const toKernelPort = await toKernel.listen()
  const toAgentPort = await toAgent.listen()

  // -- the kernel
  const kernelWarnings: Record<string, number> = {}
  let kernelStopping = false
  const kernel = spawner.start([
    "--import", "tsx", "src/bin/cli.ts", "dev", "--port", String(kernelPort), "--stage", stage,
    "--lease-timeout", options.leaseTimeout ?? "3s", "--dispatch-timeout", options.dispatchTimeout ?? "2s",
    // chaos makes many deliveries fail: the soak checks that nothing is lost, not the give-up rule
    "--max-attempts", "1000000",
    "--log-format", "json", "--log-level", "warn"
  ])
  kernel.once("exit", (code, signal) => {
    if (!kernelStopping) violation(`the kernel exited during the soak (code ${code}, signal ${signal})`)
  })
  lines(kernel.stdout, (line) => {
    if (!/^(effect-rebuno dev kernel listening on|reachable from|no agents registered|bearer auth|protocol stage)/.test(line)) {
      violation(`unexpected kernel output: ${line.slice(0, 300)}`)
    }
  })
  lines(kernel.stderr, (line) => {
    let entry: { message?: unknown; level?: unknown }
    try {
      entry = JSON.parse(line)
    } catch {
      return violation(`kernel wrote a non-log line on stderr: ${line.slice(0, 300)}`)
    }
    const message = Array.isArray(entry.message) ? entry.message.join(" ") : String(entry.message)
    if (entry.level === "WARN" && expectedKernelWarning.test(message)) {
      const key = shape(message.replace(/; attempt .*$/, ""))
      kernelWarnings[key] = (kernelWarnings[key] ?? 0) + 1
      return
    }
    violation(`kernel logged ${entry.level}: ${line.slice(0, 400)}`)
  })
  await until("the kernel to listen", () => accepts(kernelPort), 30_000)
  const registered = await api(base, "/v0/agents", {
    method: "POST",
    body: JSON.stringify({ id: "hello", webhook_url: `http://127.0.0.1:${toAgentPort}/webhook`, secret: SECRET })
  })
  if (registered.status >= 300) throw new Error(`cannot register the agent: ${registered.status}`)

  // -- the agent
  const agentLogLevels: Record<string, number> = {}
  const agentErrorSamples: Array<string> = []
  let agent: ChildProcess | undefined
  let agentStarts = 0
  const onAgentLine = (line: string) => {
    // the pretty logger: `[hh:mm:ss.sss] LEVEL (#fiber): message`, annotations on the next lines
    const level = /^\[[\d:.]+\] ([A-Z]+) /.exec(line)?.[1]
    if (level === undefined) return
    agentLogLevels[level] = (agentLogLevels[level] ?? 0) + 1
    if (level !== "INFO" && level !== "DEBUG" && agentErrorSamples.length < 10) agentErrorSamples.push(line.slice(0, 400))
  }
  const startAgent = async () => {
    const child = spawner.start(["--import", "tsx", "examples/hello.ts"], {
      REBUNO_URL: `http://127.0.0.1:${toKernelPort}`,
      AGENT_PORT: String(agentPort),
      REBUNO_AGENT_SECRET: SECRET
    })
    agentStarts++
    const state = { expected: false }
    expectedExits.set(child, state)
    child.once("exit", (code, signal) => {
      if (!state.expected) violation(`the agent exited by itself (code ${code}, signal ${signal})`)
    })
    lines(child.stdout, onAgentLine)
    lines(child.stderr, onAgentLine)
    agent = child
    await until("the agent to listen", () => exited(child) || accepts(agentPort), 30_000)
  }
  const expectedExits = new Map<ChildProcess, { expected: boolean }>()
  let sigkills = 0
  let sigterms = 0
  const sigtermExit: Array<number> = []
  const stopAgent = async (signal: "SIGKILL" | "SIGTERM") => {
    const child = agent
    if (child === undefined || exited(child)) return
    expectedExits.get(child)!.expected = true
    const at = Date.now()
    child.kill(signal)
    if (signal === "SIGKILL") {
      sigkills++
      await until("the agent to die", () => exited(child), 10_000)
      return
    }
    sigterms++
    try {
      await until("the agent to exit on SIGTERM", () => exited(child), 10_000)
      sigtermExit.push(Date.now() - at)
      // NodeRuntime.runMain exits 130 after an interrupt (its SIGTERM handling)
      if (child.exitCode !== 0 && child.exitCode !== 130 && child.signalCode === null) {
        violation(`the agent exited ${child.exitCode} on SIGTERM`)
      }
    } catch {
      violation("the agent did not exit within 10 s of SIGTERM")
      child.kill("SIGKILL")
      await until("the agent to die", () => exited(child), 10_000)
    }
  }
  await startAgent()

  // -- the chaos runs for the soak's duration from here (starting the processes takes seconds)
  const startedAt = Date.now()
  const chaosUntil = startedAt + options.durationMs

  // -- RSS of the kernel
  const rss: Array<{ readonly at: number; readonly kb: number }> = []
  const sampleRss = () => {
    const kb = rssKb(kernel.pid)
    if (kb === undefined) return
    rss.push({ at: Date.now(), kb })
    if (rss.length % 30 === 0) log(`kernel RSS ${(kb / 1024).toFixed(0)} MB after ${created.length} executions`)
  }
  sampleRss()
  const rssTimer = setInterval(sampleRss, 1000)

  // -- creating executions
  const inFlight = new Set<Promise<void>>()
  const createOne = async () => {
    const query = makeQuery(rng.query)
    try {
      const answer = await api(base, "/v0/executions", {
        method: "POST",
        body: JSON.stringify({ agent_id: "hello", input: { query } })
      })
      if (answer.status !== 201) return violation(`create answered ${answer.status}: ${JSON.stringify(answer.json)}`)
      created.push({ id: answer.json.id, query, createdAt: Date.now() })
    } catch (error) {
      violation(`create failed: ${String(error)}`)
    }
  }
  const creating = (async () => {
    const rate = options.rate ?? 3
    while (Date.now() < chaosUntil) {
      await sleep(Math.min(rng.create.exponential(1000 / rate), 5000))
      if (Date.now() >= chaosUntil) break
      if (rng.create.chance(0.02)) {
        const n = rng.create.int(5, 25)
        await Promise.all(Array.from({ length: n }, createOne))
      } else {
        const p = createOne()
        inFlight.add(p)
        void p.finally(() => inFlight.delete(p))
      }
    }
    await Promise.all(inFlight)
  })()

  // -- intensity phases
  const phases = (async () => {
    while (Date.now() < chaosUntil) {
      intensity = rng.intensity.weighted([[2, 0], [3, 0.02], [3, 0.05], [3, 0.1], [2, 0.2], [1, 0.35]])
      log(`fault intensity ${intensity}`)
      await sleep(Math.min(rng.intensity.int(3000, 15000), Math.max(0, chaosUntil - Date.now())))
    }
  })()

  // -- kills, cuts, partitions
  let cutAlls = 0
  let partitions = 0
  const [minEvery, maxEvery] = options.chaosEveryMs ?? [2000, 12000]
  const events = (async () => {
    while (true) {
      await sleep(Math.min(rng.chaos.int(minEvery, maxEvery), Math.max(0, chaosUntil - Date.now())))
      if (Date.now() >= chaosUntil) break
      const event = rng.chaos.weighted([
        [30, "sigkill"],
        [12, "sigterm"],
        [20, "cutAll"],
        [12, "partitionToKernel"],
        [12, "partitionToAgent"]
      ] as const)
      switch (event) {
        case "sigkill":
        case "sigterm": {
          const down = rng.chaos.int(0, 2500)
          log(`${event} the agent, restart in ${down} ms`)
          await stopAgent(event === "sigkill" ? "SIGKILL" : "SIGTERM")
          await sleep(down)
          await startAgent()
          break
        }
        case "cutAll": {
          cutAlls++
          log(`cut every connection (${toKernel.cutAll() + toAgent.cutAll()})`)
          break
        }
        case "partitionToKernel":
        case "partitionToAgent": {
          partitions++
          const proxy = event === "partitionToKernel" ? toKernel : toAgent
          const ms = rng.chaos.int(500, 4000)
          log(`${event} for ${ms} ms`)
          proxy.partition(true)
          await sleep(ms)
          proxy.partition(false)
          break
        }
      }
    }
  })()

  await Promise.all([creating, phases, events])

  // -- settle
  const chaosEndedAt = Date.now()
  toKernel.calm()
  toAgent.calm()
  if (agent === undefined || exited(agent)) await startAgent()
  const settleTimeout = options.settleTimeoutMs ?? 180_000
  const pending = new Map(created.map((c) => [c.id, c]))
  const records = new Map<string, any>()
  log(`chaos over: ${created.length} executions created; settling`)
  while (pending.size > 0 && Date.now() - chaosEndedAt < settleTimeout) {
    const batch = [...pending.keys()]
    for (let i = 0; i < batch.length; i += 16) {
      await Promise.all(batch.slice(i, i + 16).map(async (id) => {
        const got = await api(base, `/v0/executions/${id}`)
        if (got.status === 200 && ["completed", "failed", "cancelled"].includes(got.json.status)) {
          records.set(id, got.json)
          pending.delete(id)
        }
      }))
    }
    if (pending.size > 0) await sleep(250)
  }
  const settleMs = Date.now() - chaosEndedAt
  for (const id of pending.keys()) {
    const got = await api(base, `/v0/executions/${id}`)
    const events = await allEvents(base, id)
    violation(
      `execution ${id} stuck in ${got.json?.status} after ${settleTimeout} ms of settling; last events: ` +
        events.slice(-6).map((e) => e.type).join(", ")
    )
  }
  // late events after the end would show up in this pause
  await sleep(2000)

  // -- verify every execution through the kernel's API
  const latencies: Array<number> = []
  let completed = 0
  let reexecutedSteps = 0
  let maxDispatchAttempt = 0
  const verify = async ({ id, query }: Created) => {
    const execution = (await api(base, `/v0/executions/${id}`)).json
    const bad = (what: string) => violation(`execution ${id} (${JSON.stringify(query)}): ${what}`)
    if (execution.status !== "completed") return bad(`ended ${execution.status}: ${JSON.stringify(execution)}`)
    completed++
    if (!deepEqual(execution.output, expectedOutput(query))) {
      bad(`output ${JSON.stringify(execution.output)}, expected ${JSON.stringify(expectedOutput(query))}`)
    }
    const steps: Array<any> = (await api(base, `/v0/executions/${id}/steps`)).json ?? []
    const stepKeys = steps.map((s) => `${s.target}/${s.occurrence}/${s.status}`).sort()
    if (!deepEqual(stepKeys, ["reverse/0/succeeded", "word_count/0/succeeded"])) bad(`steps ${JSON.stringify(stepKeys)}`)
    const events = await allEvents(base, id)
    const count = (type: string, target?: string) =>
      events.filter((e) => e.type === type && (target === undefined || e.payload?.target === target)).length
    for (const target of ["reverse", "word_count"]) {
      if (count("step.proposed", target) !== 1) bad(`${count("step.proposed", target)} step.proposed for ${target}`)
      if (count("step.succeeded", target) !== 1) bad(`${count("step.succeeded", target)} step.succeeded for ${target}`)
      reexecutedSteps += Math.max(0, count("step.executing", target) - 1)
    }
    for (const type of ["step.failed", "execution.failed", "execution.cancelled"]) {
      if (count(type) !== 0) bad(`${count(type)} ${type}`)
    }
    if (count("execution.completed") !== 1) bad(`${count("execution.completed")} execution.completed`)
    const end = events.findIndex((e) => e.type === "execution.completed")
    const after = events.slice(end + 1).filter((e) => !e.type.startsWith("dispatch."))
    if (end >= 0 && after.length > 0) bad(`events after execution.completed: ${after.map((e) => e.type).join(", ")}`)
    for (const e of events) {
      if (e.type.startsWith("dispatch.") && typeof e.payload?.attempt === "number") {
        maxDispatchAttempt = Math.max(maxDispatchAttempt, e.payload.attempt)
      }
    }
    if (end >= 0) latencies.push(Date.parse(events[end].occurred_at) - Date.parse(execution.created_at))
  }
  for (let i = 0; i < created.length; i += 8) await Promise.all(created.slice(i, i + 8).map(verify))

  // -- the kernel holds exactly the executions created
  const listed = new Set<string>()
  let cursor = ""
  for (let page = 0; page < 100_000; page++) {
    const got = await api(base, `/v0/executions?limit=200${cursor === "" ? "" : `&cursor=${cursor}`}`)
    for (const e of got.json.executions ?? []) {
      if (listed.has(e.id)) violation(`execution ${e.id} listed twice`)
      listed.add(e.id)
    }
    if (got.json.next_cursor === undefined || got.json.next_cursor === "") break
    cursor = got.json.next_cursor
  }
  const createdIds = new Set(created.map((c) => c.id))
  for (const id of listed) if (!createdIds.has(id)) violation(`the kernel lists execution ${id} that was never created`)
  for (const id of createdIds) if (!listed.has(id)) violation(`the kernel does not list execution ${id}`)

  // -- RSS
  clearInterval(rssTimer)
  sampleRss()
  const warm = rss.find((s) => s.at >= startedAt + (chaosUntil - startedAt) / 4) ?? rss[0]!
  const rssKbs = {
    start: rss[0]?.kb ?? 0,
    warm: warm?.kb ?? 0,
    peak: Math.max(0, ...rss.map((s) => s.kb)),
    end: rss.at(-1)?.kb ?? 0
  }
  // The kernel keeps every execution and its events in memory by design: growth in proportion to
  // the executions is expected; more than 160 MB + 64 KiB per execution is not.
  const budgetKb = 160 * 1024 + 64 * created.length
  const checkRss = options.checkRss ?? options.durationMs >= 60_000
  if (checkRss && rssKbs.end - rssKbs.warm > budgetKb) {
    violation(`kernel RSS grew ${rssKbs.end - rssKbs.warm} KiB (budget ${budgetKb} KiB for ${created.length} executions)`)
  }

  // -- shut down: both exit on SIGTERM, the kernel with 0
  await stopAgent("SIGTERM")
  kernelStopping = true
  kernel.kill("SIGTERM")
  try {
    await until("the kernel to exit on SIGTERM", () => exited(kernel), 10_000)
    if (kernel.exitCode !== 0) violation(`the kernel exited ${kernel.exitCode ?? kernel.signalCode} on SIGTERM`)
  } catch {
    violation("the kernel did not exit within 10 s of SIGTERM")
  }
  spawner.killAll("SIGKILL")
  await Promise.all([toKernel.close(), toAgent.close()])

  const sorted = [...latencies].sort((a, b) => a - b)
  const summary: LaneSummary = {
    stage,
    executions: created.length,
    completed,
    sigkills,
    sigterms,
    agentStarts,
    cutAlls,
    partitions,
    faults: { toKernel: { ...toKernel.counts }, toAgent: { ...toAgent.counts } },
    refusedWhilePartitioned: toKernel.refused() + toAgent.refused(),
    settleMs,
    latencyMs: { p50: percentile(sorted, 0.5), p99: percentile(sorted, 0.99), max: sorted.at(-1) ?? 0 },
    reexecutedSteps,
    maxDispatchAttempt,
    rssKb: rssKbs,
    kernelWarnings,
    agentLogLevels,
    agentErrorSamples,
    sigtermExitMs: { max: Math.max(0, ...sigtermExit) }
  }
  return { summary, violations }
}

/** Every event of an execution, page by page. */
const allEvents = async (base: string, id: string): Promise<Array<any>> => {
  const events: Array<any> = []
  let after = 0
  while (true) {
    const page: Array<any> = (await api(base, `/v0/executions/${id}/events?after_seq=${after}&limit=1000`)).json ?? []
    events.push(...page)
    if (page.length < 1000) return events
    after = page.at(-1).event_seq
  }
}

/** The processes of every lane, for a last clean-up. */
const spawners = new Set<ReturnType<typeof makeSpawner>>()

/** SIGKILLs every process a soak started (on a failure or an interrupt). */
export const killEverything = () => {
  for (const spawner of spawners) spawner.killAll("SIGKILL")
}

/** Runs the soak: one lane per stage, side by side. */
export const runSoak = async (options: SoakOptions): Promise<SoakSummary> => {
  const started = Date.now()
  const stages = options.stages ?? allStages
  const results = await Promise.allSettled(stages.map((stage) => runLane(stage, options)))
  killEverything()
  const lanes: Array<LaneSummary> = []
  const violations: Array<string> = []
  for (const [i, result] of results.entries()) {
    if (result.status === "fulfilled") {
      lanes.push(result.value.summary)
      violations.push(...result.value.violations)
    } else {
      violations.push(`[${stages[i]}] the lane failed: ${String(result.reason?.stack ?? result.reason)}`)
    }
  }
  return { seed: options.seed, durationMs: options.durationMs, wallMs: Date.now() - started, lanes, violations }
}

/** A readable summary. */
export const formatSummary = (summary: SoakSummary): string => {
  const out: Array<string> = []
  const sum = (f: (l: LaneSummary) => number) => summary.lanes.reduce((n, l) => n + f(l), 0)
  const faultTotal = (c: Record<FaultKind, number>) =>
    Object.entries(c).filter(([k]) => k !== "pass").reduce((n, [, v]) => n + v, 0)
  out.push(`soak seed=${summary.seed} chaos=${(summary.durationMs / 1000).toFixed(0)}s wall=${(summary.wallMs / 1000).toFixed(0)}s`)
  for (const l of summary.lanes) {
    const faults = (c: Record<FaultKind, number>) =>
      Object.entries(c).filter(([k]) => k !== "pass").map(([k, v]) => `${k}=${v}`).join(" ")
    out.push(
      `  [${l.stage}] executions=${l.executions} completed=${l.completed} ` +
        `sigkill=${l.sigkills} sigterm=${l.sigterms} agent-starts=${l.agentStarts} cut-all=${l.cutAlls} ` +
        `partitions=${l.partitions} refused=${l.refusedWhilePartitioned}`
    )
    out.push(`    agent→kernel requests=${sum0(l.faults.toKernel)} faults: ${faults(l.faults.toKernel)}`)
    out.push(`    kernel→agent requests=${sum0(l.faults.toAgent)} faults: ${faults(l.faults.toAgent)}`)
    out.push(
      `    settle=${(l.settleMs / 1000).toFixed(1)}s latency p50=${l.latencyMs.p50}ms p99=${l.latencyMs.p99}ms ` +
        `max=${l.latencyMs.max}ms re-executed steps=${l.reexecutedSteps} max dispatch attempt=${l.maxDispatchAttempt} ` +
        `max SIGTERM exit=${l.sigtermExitMs.max}ms`
    )
    out.push(
      `    kernel RSS start=${mb(l.rssKb.start)} warm=${mb(l.rssKb.warm)} peak=${mb(l.rssKb.peak)} end=${mb(l.rssKb.end)} ` +
        `(${l.executions === 0 ? 0 : Math.round((l.rssKb.end - l.rssKb.warm) / l.executions)} KiB/execution after warm-up)`
    )
    out.push(`    kernel warnings: ${JSON.stringify(l.kernelWarnings)}`)
    out.push(`    agent log levels: ${JSON.stringify(l.agentLogLevels)}`)
    for (const sample of l.agentErrorSamples.slice(0, 3)) out.push(`      e.g. ${sample}`)
  }
  out.push(
    `  total: executions=${sum((l) => l.executions)} completed=${sum((l) => l.completed)} ` +
      `kills=${sum((l) => l.sigkills)} sigterms=${sum((l) => l.sigterms)} ` +
      `cuts=${sum((l) => faultTotal(l.faults.toKernel) + faultTotal(l.faults.toAgent) + l.cutAlls + l.partitions)} ` +
      `max settle=${(Math.max(0, ...summary.lanes.map((l) => l.settleMs)) / 1000).toFixed(1)}s`
  )
  out.push(summary.violations.length === 0 ? "  no violations" : `  ${summary.violations.length} VIOLATIONS:`)
  for (const v of summary.violations.slice(0, 50)) out.push(`    ${v}`)
  if (summary.violations.length > 50) out.push(`    … and ${summary.violations.length - 50} more`)
  return out.join("\n")
}

const sum0 = (c: Record<FaultKind, number>) => Object.values(c).reduce((n, v) => n + v, 0)
const mb = (kb: number) => `${(kb / 1024).toFixed(0)}MB`
