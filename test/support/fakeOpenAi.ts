/**
 * A local OpenAI-compatible server for tests and examples: `node:http` on
 * 127.0.0.1, port 0. `POST /v1/chat/completions` answers a `chat.completion`
 * JSON object, or — when the request asks for `stream: true` — a
 * `text/event-stream` of `chat.completion.chunk` events followed by
 * `data: [DONE]`. The stream's bytes are written in small odd-sized slices, so
 * multi-byte characters get split across writes. It counts calls and keeps the
 * parsed request bodies; `mode` switches it to an error answer or to a stream
 * that is cut off halfway.
 */
import { Effect } from "effect"
import type { Scope } from "effect"
import { createServer } from "node:http"
import type { IncomingMessage, ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"

export interface FakeOpenAiOptions {
  /** The assistant's reply (default `"Hello from the fake model."`). */
  readonly reply?: string
  /** Characters of content per stream chunk (default 40). */
  readonly chunkChars?: number
}

export interface FakeOpenAi {
  /** Base URL including `/v1` (what the `openai` client takes as `baseURL`). */
  readonly url: string
  /** Calls of `POST /v1/chat/completions` so far. */
  readonly calls: number
  /** Parsed request bodies, in arrival order. */
  readonly requests: ReadonlyArray<unknown>
  reply: string
  /** `ok` (default), `error` (answer `errorStatus` with an OpenAI error body), `cut` (stream stops halfway, socket destroyed). */
  mode: "ok" | "error" | "cut"
  errorStatus: number
  readonly close: () => Promise<void>
}

const CREATED = 1_700_000_000

/** The SSE text the server streams for a reply (also what a recording should hold). */
export const streamText = (model: string, reply: string, chunkChars = 40): string => {
  const pieces: Array<string> = []
  const chars = Array.from(reply)
  for (let i = 0; i < chars.length; i += chunkChars) pieces.push(chars.slice(i, i + chunkChars).join(""))
  const event = (delta: object, finish: string | null) =>
    "data: " + JSON.stringify({
      id: "chatcmpl-fake",
      object: "chat.completion.chunk",
      created: CREATED,
      model,
      choices: [{ index: 0, delta, finish_reason: finish }]
    }) + "\n\n"
  let out = event({ role: "assistant", content: "" }, null)
  for (const piece of pieces) out += event({ content: piece }, null)
  out += event({}, "stop")
  out += "data: [DONE]\n\n"
  return out
}

/** The JSON text the server answers for a non-streaming reply. */
export const completionText = (model: string, reply: string): string =>
  JSON.stringify({
    id: "chatcmpl-fake",
    object: "chat.completion",
    created: CREATED,
    model,
    choices: [{
      index: 0,
      message: { role: "assistant", content: reply, refusal: null },
      logprobs: null,
      finish_reason: "stop"
    }],
    usage: { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 }
  })

const readBody = (req: IncomingMessage): Promise<string> =>
  new Promise((resolve, reject) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")))
    req.on("error", reject)
  })

const tick = () => new Promise<void>((resolve) => setImmediate(resolve))

export const start = async (options: FakeOpenAiOptions = {}): Promise<FakeOpenAi> => {
  const chunkChars = options.chunkChars ?? 40
  const requests: Array<unknown> = []
  let calls = 0

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    if (req.method !== "POST" || req.url !== "/v1/chat/completions") {
      res.writeHead(404, { "content-type": "application/json" })
      res.end(JSON.stringify({ error: { message: "not found", type: "invalid_request_error" } }))
      return
    }
    calls++
    const text = await readBody(req)
    let body: { model?: unknown; stream?: unknown } = {}
    try {
      body = JSON.parse(text)
    } catch {
      // keep {}
    }
    requests.push(body)
    const model = typeof body.model === "string" ? body.model : "unknown"
    if (fake.mode === "error") {
      res.writeHead(fake.errorStatus, { "content-type": "application/json" })
      res.end(JSON.stringify({ error: { message: "the fake model is down", type: "server_error", code: null } }))
      return
    }
    if (body.stream !== true) {
      res.writeHead(200, { "content-type": "application/json" })
      res.end(completionText(model, fake.reply))
      return
    }
    res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache" })
    const bytes = Buffer.from(streamText(model, fake.reply, chunkChars), "utf8")
    const limit = fake.mode === "cut" ? Math.floor(bytes.length / 2) : bytes.length
    for (let offset = 0; offset < limit; offset += 997) {
      res.write(bytes.subarray(offset, Math.min(offset + 997, limit)))
      await tick()
    }
    if (fake.mode === "cut") res.destroy()
    else res.end()
  }

  const server = createServer((req, res) => {
    handle(req, res).catch(() => res.destroy())
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const { port } = server.address() as AddressInfo

  const fake: FakeOpenAi = {
    url: `http://127.0.0.1:${port}/v1`,
    get calls() {
      return calls
    },
    requests,
    reply: options.reply ?? "Hello from the fake model.",
    mode: "ok",
    errorStatus: 500,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  }
  return fake
}

/** The server for the life of a scope. */
export const scoped = (options?: FakeOpenAiOptions): Effect.Effect<FakeOpenAi, never, Scope.Scope> =>
  Effect.acquireRelease(Effect.promise(() => start(options)), (fake) => Effect.promise(() => fake.close()))
