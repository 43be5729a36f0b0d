/**
 * `examples/hello.ts` as an outside checker drives it: the embedded kernel
 * (`effect-rebuno dev` from source, short lease) and the agent (`examples/hello.ts`)
 * each run as a real process, on stage `current` and on stage `v0.14.0`.
 *
 * - The webhook endpoint gets adversarial requests over raw sockets (missing,
 *   bad, duplicated and `v1=` signatures, malformed and mistyped bodies,
 *   oversized bodies, wrong methods and paths, notices for unknown
 *   executions) and must answer each as PROTOCOL 3.5 / 14.2 say, with an empty
 *   body, and keep serving real executions.
 * - The agent's connections to the kernel go through a TCP proxy that resets
 *   them, drops answers or stalls them; deliveries go through a hook that
 *   duplicates or supersedes them; the agent is SIGKILLed mid-run and
 *   restarted. Every execution must end `completed` with DESIGN's output, each
 *   tool step recorded once, and a submit whose answer was lost is never
 *   retried (the run is abandoned and the kernel redelivers: DESIGN "Retry
 *   safety", PROTOCOL 5.7 / 15).
 *
 * Every port is a free one picked at start (the kernel, started without a
 * manifest, learns the webhook URL through `POST /v0/agents`).
 */
import type { ChildProcess } from "node:child_process"
import { createHmac, randomUUID } from "node:crypto"
import * as Http from "node:http"
import * as Net from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { accepts, api, freePort, makeSpawner, sleep, until } from "../support/blackBox.js"
import { makeProxy } from "../support/tcpProxy.js"

const SECRET = "hello-secret"

const sign = (body: string | Buffer) => "sha256=" + createHmac("sha256", SECRET).update(body).digest("hex")

// ---------------------------------------------------------------------------
// Raw HTTP against the agent's webhook
// ---------------------------------------------------------------------------

interface RawAnswer {
  readonly status: number
  readonly head: string
  readonly body: string
}

/** Send `data` as is on a new connection; the answer once complete (dies on a hang). */
const raw = (port: number, data: Buffer, timeoutMs = 5_000) =>
  new Promise<RawAnswer>((resolve, reject) => {
    const socket = Net.connect(port, "127.0.0.1")
    const chunks: Array<Buffer> = []
    const done = () => {
      clearTimeout(timer)
      socket.destroy()
      const text = Buffer.concat(chunks).toString("latin1")
      const end = text.indexOf("\r\n\r\n")
      const head = end < 0 ? text : text.slice(0, end)
      resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0), head, body: end < 0 ? "" : text.slice(end + 4) })
    }
    const timer = setTimeout(() => (socket.destroy(), reject(new Error("no answer (agent hangs)"))), timeoutMs)
    socket.on("data", (chunk) => {
      chunks.push(chunk)
      const text = Buffer.concat(chunks).toString("latin1")
      const end = text.indexOf("\r\n\r\n")
      const length = /\r\ncontent-length: *(\d+)/i.exec(text.slice(0, end))
      if (end >= 0 && length !== null && text.length >= end + 4 + Number(length[1])) done()
    })
    socket.on("close", done)
    socket.on("error", () => undefined)
    socket.write(data)
  })

const request = (
  body: string | Buffer,
  headers: Record<string, string | ReadonlyArray<string>> = {},
  { method = "POST", path = "/webhook" } = {}
): Buffer => {
  const bytes = typeof body === "string" ? Buffer.from(body) : body
  let head = `${method} ${path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${bytes.length}\r\n`
  for (const [name, value] of Object.entries(headers)) {
    for (const v of typeof value === "string" ? [value] : value) head += `${name}: ${v}\r\n`
  }
  return Buffer.concat([Buffer.from(head + "\r\n"), bytes])
}

const signed = (body: string | Buffer) => request(body, { "Rebuno-Signature": sign(body) })

// ---------------------------------------------------------------------------
// The kernel's client and admin routes (dev mode: no auth)
// ---------------------------------------------------------------------------

const createExecution = async (base: string, query: string): Promise<string> => {
  const created = await api(base, "/v0/executions", {
    method: "POST",
    body: JSON.stringify({ agent_id: "hello", input: { query } })
  })
  expect(created.status).toBe(201)
  return created.json.id
}

const terminal = new Set(["completed", "failed", "cancelled"])

/** Wait for the end, then check what DESIGN promises: the output, each tool step once. */
const expectCompletedOnce = async (base: string, id: string) => {
  let execution: any
  await until(`execution ${id} to end`, async () => {
    execution = (await api(base, `/v0/executions/${id}`)).json
    return terminal.has(execution.status)
  }, 20_000)
  const query: string = execution.input.query
  expect({ status: execution.status, output: execution.output }).toEqual({
    status: "completed",
    output: {
      query,
      reversed: Array.from(query).reverse().join(""),
      word_count: query.split(/\s+/).filter((w) => w.length > 0).length
    }
  })
  const steps: Array<any> = (await api(base, `/v0/executions/${id}/steps`)).json ?? []
  expect(steps.map((s) => `${s.target}/${s.occurrence}/${s.status}`).sort()).toEqual([
    "reverse/0/succeeded",
    "word_count/0/succeeded"
  ])
  const events: Array<any> = (await api(base, `/v0/executions/${id}/events`)).json ?? []
  const count = (type: string, target?: string) =>
    events.filter((e) => e.type === type && (target === undefined || e.payload.target === target)).length
  for (const target of ["reverse", "word_count"]) {
    expect(count("step.proposed", target)).toBe(1)
    expect(count("step.succeeded", target)).toBe(1)
  }
  expect(count("execution.completed")).toBe(1)
  expect(count("execution.failed")).toBe(0)
  return { events, ackedAttempts: events.filter((e) => e.type === "dispatch.acked").map((e) => e.payload.attempt) }
}

// ---------------------------------------------------------------------------
// One kernel, one agent, per stage
// ---------------------------------------------------------------------------

const stages = [{ stage: "current" }, { stage: "v0.14.0" }] as const

describe.each(stages)("examples/hello.ts under abuse (stage $stage)", ({ stage }) => {
  let kernelPort = 0
  let agentPort = 0
  let proxyPort = 0
  let base = ""
  let proxy!: ReturnType<typeof makeProxy>
  const spawner = makeSpawner()
  const start = spawner.start
  let agent: ChildProcess | undefined
  let hookServer: Http.Server | undefined
  const current = stage === "current"

  /** What the delivery hook does with each webhook the kernel sends (default: pass it on). */
  let hook: (body: string) => Promise<number> = (body) => deliver(body)
  const delivered: Array<string> = []
  const deliver = (body: string, signature = sign(body)) =>
    fetch(`http://127.0.0.1:${agentPort}/webhook`, {
      method: "POST",
      headers: { "content-type": "application/json", "rebuno-signature": signature },
      body
    }).then(async (response) => (await response.text(), response.status))

  const startAgent = async () => {
    agent = start(["--import", "tsx", "examples/hello.ts"], {
      REBUNO_URL: `http://127.0.0.1:${proxyPort}`,
      AGENT_PORT: String(agentPort),
      REBUNO_AGENT_SECRET: SECRET
    })
    await until("the agent to listen", () => accepts(agentPort))
  }

  beforeAll(async () => {
    kernelPort = await freePort()
    agentPort = await freePort()
    base = `http://127.0.0.1:${kernelPort}`
    proxy = makeProxy(kernelPort)
    proxyPort = await proxy.listen()
    hookServer = Http.createServer((req, res) => {
      const chunks: Array<Buffer> = []
      req.on("data", (c: Buffer) => chunks.push(c)).on("end", () => {
        const body = Buffer.concat(chunks).toString("utf8")
        delivered.push(body)
        hook(body).then(
          (status) => res.writeHead(status, { "content-length": 0 }).end(),
          () => res.writeHead(502, { "content-length": 0 }).end()
        )
      })
    })
    const hookPort = await new Promise<number>((resolve) =>
      hookServer!.listen(0, "127.0.0.1", () => resolve((hookServer!.address() as Net.AddressInfo).port))
    )
    start([
      "--import", "tsx", "src/bin/cli.ts", "dev", "--port", String(kernelPort), "--stage", stage,
      "--lease-timeout", "3s", "--dispatch-timeout", "2s", "--log-level", "none"
    ])
    await until("the kernel to listen", () => accepts(kernelPort))
    const registered = await api(base, "/v0/agents", {
      method: "POST",
      body: JSON.stringify({ id: "hello", webhook_url: `http://127.0.0.1:${hookPort}/webhook`, secret: SECRET })
    })
    expect(registered.status).toBeLessThan(300)
    await startAgent()
  }, 30_000)

  afterAll(async () => {
    spawner.killAll("SIGKILL")
    await proxy?.close()
    await new Promise<void>((resolve) => hookServer === undefined ? resolve() : hookServer.close(() => resolve()))
  })

  it("answers adversarial webhooks as PROTOCOL 3.5 / 14.2 say, never hangs, and keeps serving", async () => {
    const E = randomUUID()
    const D = randomUUID()
    // A current kernel always sends dispatch_attempt; a v0.14.0 one never does. Signed bodies
    // follow the stage (a signed body without dispatch_attempt is stage evidence to the agent).
    const notice = (extra: Record<string, unknown> = {}) =>
      JSON.stringify({ execution_id: E, dispatch_id: D, ...(current ? { dispatch_attempt: 1 } : {}), ...extra })
    const good = notice({ lease_timeout_seconds: 3 })
    const now = Math.floor(Date.now() / 1000)
    const v1 = (ts: number) =>
      "v1=" + createHmac("sha256", SECRET).update(`rebuno-request-v1\nPOST\n/webhook\n${ts}\n\n\n`).update(good).digest("hex")
    const nonUtf8 = Buffer.from([0x7b, 0xff, 0x7d])
    const cases: ReadonlyArray<readonly [string, Buffer, number]> = [
      // 3.5: anything but the exact `sha256=` + lowercase hex of this body → 401
      ["no signature", request(good), 401],
      ["empty signature", request(good, { "Rebuno-Signature": "" }), 401],
      ["signature of other bytes", request(good, { "Rebuno-Signature": sign(good + " ") }), 401],
      ["signature with another secret", request(good, { "Rebuno-Signature": "sha256=" + createHmac("sha256", "other").update(good).digest("hex") }), 401],
      ["uppercase hex", request(good, { "Rebuno-Signature": "sha256=" + sign(good).slice(7).toUpperCase() }), 401],
      ["no sha256= prefix", request(good, { "Rebuno-Signature": sign(good).slice(7) }), 401],
      ["SHA256= prefix", request(good, { "Rebuno-Signature": "SHA256=" + sign(good).slice(7) }), 401],
      ["fresh v1= signature (webhooks are sha256= only)", request(good, { "Rebuno-Signature": v1(now), "Rebuno-Timestamp": String(now), "Rebuno-Agent-Id": "hello" }), 401],
      ["stale v1= signature", request(good, { "Rebuno-Signature": v1(now - 3600), "Rebuno-Timestamp": String(now - 3600) }), 401],
      ["duplicated header: good, bad", request(good, { "Rebuno-Signature": [sign(good), "sha256=00"] }), 401],
      ["duplicated header: bad, good", request(good, { "Rebuno-Signature": ["sha256=00", sign(good)] }), 401],
      ["duplicated header: good, good", request(good, { "Rebuno-Signature": [sign(good), sign(good)] }), 401],
      // 14.2 step 2: a verified body that is not a webhook notice → 400
      ["malformed JSON", signed("{not json"), 400],
      ["empty body", signed(""), 400],
      ["JSON array", signed("[1]"), 400],
      ["JSON null", signed("null"), 400],
      ["JSON string", signed('"x"'), 400],
      ["not UTF-8", request(nonUtf8, { "Rebuno-Signature": sign(nonUtf8) }), 400],
      ["execution_id a number", signed(JSON.stringify({ execution_id: 1, dispatch_id: D })), 400],
      ["execution_id empty", signed(JSON.stringify({ execution_id: "", dispatch_id: D })), 400],
      ["no execution_id", signed(JSON.stringify({ dispatch_id: D })), 400],
      ["no dispatch_id", signed(JSON.stringify({ execution_id: E })), 400],
      ["dispatch_id null", signed(JSON.stringify({ execution_id: E, dispatch_id: null })), 400],
      ["dispatch_attempt 0", signed(notice({ dispatch_attempt: 0 })), 400],
      ["dispatch_attempt -1", signed(notice({ dispatch_attempt: -1 })), 400],
      ["dispatch_attempt 1.5", signed(notice({ dispatch_attempt: 1.5 })), 400],
      ["dispatch_attempt a string", signed(notice({ dispatch_attempt: "1" })), 400],
      ["dispatch_attempt true", signed(notice({ dispatch_attempt: true })), 400],
      // absent or a positive integer: `null` is neither (14.2 step 2)
      ["dispatch_attempt null", signed(notice({ dispatch_attempt: null })), 400],
      // unknown members ignored, bad lease_timeout_seconds treated as absent; the kernel does not
      // know the execution: accepted (200), the run reads it, gets 404 and stops (14.3 step 3)
      ["unknown members", signed(notice({ foo: { bar: [1] }, lease_timeout_seconds: 3 })), 200],
      ["lease_timeout_seconds a string", signed(notice({ lease_timeout_seconds: "x" })), 200],
      ["lease_timeout_seconds negative", signed(notice({ lease_timeout_seconds: -5 })), 200],
      ["members reordered, whitespace", signed(` {\n "dispatch_id" : "${D}" ,"execution_id":"${E}"${current ? ',"dispatch_attempt":1' : ""} }\n`), 200],
      ["execution id that is not a UUID", signed(JSON.stringify({ execution_id: "../../v0/agents", dispatch_id: D, ...(current ? { dispatch_attempt: 1 } : {}) })), 200],
      ["query string on the path", request(good, { "Rebuno-Signature": sign(good) }, { path: "/webhook?x=1" }), 200],
      // 14.2: the built-in server answers 404 to anything but POST on exactly the path
      ["GET /webhook", request("", {}, { method: "GET" }), 404],
      ["PUT /webhook, signed", request(good, { "Rebuno-Signature": sign(good) }, { method: "PUT" }), 404],
      ["DELETE /webhook", request("", {}, { method: "DELETE" }), 404],
      ["POST /other, signed", request(good, { "Rebuno-Signature": sign(good) }, { path: "/other" }), 404],
      ["POST /webhook/, signed", request(good, { "Rebuno-Signature": sign(good) }, { path: "/webhook/" }), 404],
      ["POST /WEBHOOK, signed", request(good, { "Rebuno-Signature": sign(good) }, { path: "/WEBHOOK" }), 404],
      ["POST //webhook, signed", request(good, { "Rebuno-Signature": sign(good) }, { path: "//webhook" }), 404],
      // oversized: refused before reading it all (declared or streamed), never a crash or a hang
      ["declared 2 MB body", Buffer.from("POST /webhook HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 2000000\r\nRebuno-Signature: sha256=00\r\n\r\n{"), 401],
      ["1 MiB + 1 body", request(Buffer.alloc(1024 * 1024 + 1, 0x20), { "Rebuno-Signature": "sha256=00" }), 401],
      ["1.25 MiB chunked body", Buffer.concat([
        Buffer.from("POST /webhook HTTP/1.1\r\nHost: a\r\nConnection: close\r\nTransfer-Encoding: chunked\r\nRebuno-Signature: sha256=00\r\n\r\n"),
        ...Array.from({ length: 20 }, () => Buffer.concat([Buffer.from("10000\r\n"), Buffer.alloc(65536, 0x20), Buffer.from("\r\n")])),
        Buffer.from("0\r\n\r\n")
      ]), 401]
    ]
    const answers = await Promise.all(cases.map(([, data]) => raw(agentPort, data)))
    expect(answers.map((a, i) => `${cases[i]![0]}: ${a.status} ${JSON.stringify(a.body)}`)).toEqual(
      cases.map(([name, , status]) => `${name}: ${status} ""`)
    )
    // a body of exactly 1 MiB is read in full and verified
    const padded = Buffer.concat([Buffer.from(good), Buffer.alloc(1024 * 1024 - good.length, 0x20)])
    expect((await raw(agentPort, request(padded, { "Rebuno-Signature": sign(padded) }))).status).toBe(200)
    // the agent is still up, serves real executions, and the kernel's deliveries are unaffected
    expect(agent?.exitCode).toBeNull()
    const ids = await Promise.all(["after abuse one", "after abuse two"].map((q) => createExecution(base, q)))
    for (const id of ids) await expectCompletedOnce(base, id)
  })

  it("cut connections: lost answers and resets end in one completed run; a lost submit is never retried", async () => {
    const submit = (marker: string) => new RegExp(`^POST /v0/executions/[^/ ]+/steps HTTP[\\s\\S]*${marker}`)
    const stepComplete = (marker: string) => new RegExp(`^POST /v0/executions/[^/ ]+/steps/[^/ ]+/complete HTTP[\\s\\S]*${marker}`)
    const execComplete = (marker: string) => new RegExp(`^POST /v0/executions/[^/ ]+/complete HTTP[\\s\\S]*${marker}`)
    const rules = {
      resetSubmit: proxy.rule(submit("cutA"), "reset"),
      dropSubmitAnswer: proxy.rule(submit("cutB"), "dropResponse"),
      // the step results carry the reversed query
      resetStepComplete: proxy.rule(stepComplete("Ctuc"), "reset"),
      dropStepCompleteAnswer: proxy.rule(stepComplete("Dtuc"), "dropResponse"),
      dropExecCompleteAnswer: proxy.rule(execComplete("cutE"), "dropResponse"),
      resetExecCompleteTwice: proxy.rule(execComplete("cutF"), "reset", 2)
    }
    const queries = ["x cutA", "x cutB", "x cutC", "x cutD", "x cutE", "x cutF", "x plain"]
    const ids = await Promise.all(queries.map((q) => createExecution(base, q)))
    const results = []
    for (const id of ids) results.push(await expectCompletedOnce(base, id))
    proxy.release()
    expect(Object.fromEntries(Object.entries(rules).map(([name, rule]) => [name, rule.hits]))).toEqual({
      resetSubmit: 1,
      dropSubmitAnswer: 1,
      resetStepComplete: 1,
      dropStepCompleteAnswer: 1,
      dropExecCompleteAnswer: 1,
      resetExecCompleteTwice: 2
    })
    // A submit that met a transport failure is not retried by the run: only a redelivery
    // (attempt 2 after the 3 s lease, or a later one on a loaded host) gets the execution going again.
    expect(results[0]!.ackedAttempts.some((attempt) => attempt >= 2)).toBe(true)
    expect(results[1]!.ackedAttempts.some((attempt) => attempt >= 2)).toBe(true)
  })

  it("duplicate deliveries of one dispatch start one run; a late duplicate changes nothing", async () => {
    const statuses: Array<number> = []
    hook = async (body) => {
      const all = await Promise.all([deliver(body), deliver(body), deliver(body)])
      statuses.push(...all)
      return all[0]!
    }
    const id = await createExecution(base, "duplicate deliveries")
    try {
      const first = await expectCompletedOnce(base, id)
      expect(statuses.length).toBeGreaterThanOrEqual(3)
      expect(statuses.every((s) => s === 200)).toBe(true)
      hook = (body) => deliver(body)
      const last = delivered.filter((b) => b.includes(id)).at(-1)!
      expect(await deliver(last)).toBe(200)
      await sleep(300)
      const again = await expectCompletedOnce(base, id)
      expect(again.events.length).toBe(first.events.length)
    } finally {
      hook = (body) => deliver(body)
    }
  })

  it.runIf(current)("a second delivery for the same execution supersedes the run; the execution still completes once", async () => {
    hook = async (body) => {
      const notice = JSON.parse(body)
      const status = await deliver(body)
      // a newer attempt of the same dispatch, then another dispatch, while run #1 runs
      expect(await deliver(JSON.stringify({ ...notice, dispatch_attempt: notice.dispatch_attempt + 1 }))).toBe(200)
      expect(await deliver(JSON.stringify({ ...notice, dispatch_id: randomUUID() }))).toBe(200)
      return status
    }
    try {
      const id = await createExecution(base, "superseded twice")
      hook = (body) => deliver(body)
      await expectCompletedOnce(base, id)
    } finally {
      hook = (body) => deliver(body)
    }
  })

  it.runIf(current)("a stray verified notice without dispatch_attempt does not switch the signing of runs in flight", async () => {
    const stall = proxy.rule(/^POST \/v0\/executions\/[^/ ]+\/steps\/[^/ ]+\/complete HTTP[\s\S]*pilf/, "stall")
    const id = await createExecution(base, "x flip")
    await until("the run to be mid-step", () => stall.hits > 0)
    // Signed with the agent's secret, for an execution the kernel does not know: 200, the run reads
    // it, gets 404 and stops. A current kernel never sends such a notice, so it is no stage evidence.
    expect(await deliver(JSON.stringify({ execution_id: randomUUID(), dispatch_id: randomUUID() }))).toBe(200)
    await sleep(200)
    proxy.release()
    // The run goes on signing v1= and is never refused: no redelivery was needed.
    expect((await expectCompletedOnce(base, id)).ackedAttempts).toEqual([1])
    expect((await expectCompletedOnce(base, await createExecution(base, "after the stray notice"))).ackedAttempts)
      .toEqual([1])
  })

  it("SIGKILL mid-run, restart: every execution completes once", async () => {
    const stall = proxy.rule(/^POST \/v0\/executions\/[^/ ]+\/steps\/[^/ ]+\/complete HTTP[\s\S]*llik/, "stall")
    const ids = await Promise.all(["kill a", "kill b", "kill c", "kill d"].map((q) => createExecution(base, q)))
    await until("a run to be mid-step", () => stall.hits > 0)
    agent!.kill("SIGKILL")
    await until("the agent to die", () => agent!.exitCode !== null || agent!.signalCode !== null)
    proxy.release()
    await startAgent()
    const results = []
    for (const id of ids) results.push(await expectCompletedOnce(base, id))
    // the run that was mid-step when the process died finished on a redelivery (attempt 2, or a
    // later one when the restarted agent was not listening yet as attempt 2 came)
    expect(results.some((r) => r.ackedAttempts.some((attempt) => attempt >= 2))).toBe(true)
  })
})
