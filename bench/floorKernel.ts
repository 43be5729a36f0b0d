/**
 * The Node floor of the `kernel` line: a do-nothing `node:http` server, in its
 * own process, that answers everything the SDK agent and the operator
 * `Client` send during a `kernel` round with the smallest valid reply, and
 * keeps no state, checks no signature and decodes no body:
 *
 * - `GET /v0/health` → `200 {"status":"ok"}`;
 * - `POST /v0/executions` → `201` with a fresh `pending` execution, then (once
 *   answered) one signed webhook to `$BENCH_FLOOR_WEBHOOK` (a keep-alive
 *   `node:http` agent; `sha256=` HMAC of the body with `$BENCH_FLOOR_SECRET`);
 * - `GET /v0/executions/{id}` → a `running` execution;
 * - `POST …/steps` → `{"decision":"proceed","step_id":"<64 hex>"}`;
 * - `POST …/steps/{step_id}/complete` → `{"decision":"recorded"}`;
 * - anything else (metadata, heartbeat, complete / fail execution) → `204`.
 *
 * Its CPU per step is what a Node process spends just to serve the agent's
 * HTTP traffic (parse requests, write answers): the floor under any kernel
 * written on `node:http`. Listens on `127.0.0.1:$BENCH_FLOOR_PORT` until killed.
 *
 * @since 0.2.0
 */
import { createHmac, randomUUID } from "node:crypto"
import { Agent, createServer, request } from "node:http"
import type { IncomingMessage, ServerResponse } from "node:http"

const port = Number(process.env["BENCH_FLOOR_PORT"])
const webhook = new URL(process.env["BENCH_FLOOR_WEBHOOK"] ?? "http://127.0.0.1:1/webhook")
const secret = process.env["BENCH_FLOOR_SECRET"] ?? ""
const webhookAgent = new Agent({ keepAlive: true, maxSockets: 64 })

const STEP_ID = "7f".repeat(32)
const PROCEED = JSON.stringify({ decision: "proceed", step_id: STEP_ID })
const RECORDED = JSON.stringify({ decision: "recorded" })
const HEALTH = JSON.stringify({ status: "ok" })

const execution = (id: string, status: string): string =>
  JSON.stringify({
    id,
    agent_id: "bench",
    agent_version: "",
    input: {},
    status,
    failure_reason: "",
    created_at: "2026-01-01T00:00:00Z",
    updated_at: "2026-01-01T00:00:00Z",
    deadline_at: ""
  })

const json = (res: ServerResponse, status: number, body: string): void => {
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) })
  res.end(body)
}

const deliver = (executionId: string): void => {
  const body = JSON.stringify({
    execution_id: executionId,
    dispatch_id: randomUUID(),
    dispatch_attempt: 1,
    lease_timeout_seconds: 30
  })
  const req = request({
    agent: webhookAgent,
    host: webhook.hostname,
    port: webhook.port,
    path: webhook.pathname,
    method: "POST",
    headers: {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(body),
      "rebuno-signature": "sha256=" + createHmac("sha256", secret).update(body).digest("hex")
    }
  }, (res) => {
    res.resume()
    if (res.statusCode !== 200) process.stderr.write(`floor kernel: webhook answered ${res.statusCode}\n`)
  })
  req.on("error", (error) => process.stderr.write(`floor kernel: webhook failed: ${String(error)}\n`))
  req.end(body)
}

const handle = (req: IncomingMessage, res: ServerResponse): void => {
  req.on("data", () => {})
  req.on("end", () => {
    const parts = (req.url ?? "/").split("?")[0]!.split("/") // ["", "v0", "executions", id, ...]
    if (req.method === "GET") {
      if (parts[2] === "health") return json(res, 200, HEALTH)
      if (parts[2] === "executions" && parts.length === 4) return json(res, 200, execution(parts[3]!, "running"))
      res.writeHead(404).end()
      return
    }
    if (req.method === "POST" && parts[2] === "executions" && parts.length === 3) {
      const id = randomUUID()
      json(res, 201, execution(id, "pending"))
      setImmediate(() => deliver(id))
      return
    }
    if (req.method === "POST" && parts.length === 5 && parts[4] === "steps") return json(res, 200, PROCEED)
    if (req.method === "POST" && parts.length === 7 && parts[4] === "steps") return json(res, 200, RECORDED)
    res.writeHead(204).end()
  })
}

createServer({ keepAliveTimeout: 60_000 }, handle).listen(port, "127.0.0.1")
