/**
 * A scripted OpenAI-compatible model for the examples and tests: `POST
 * /v1/chat/completions` answers what a script says for the request — text, or
 * tool calls — as a `chat.completion` JSON object. The script sees the whole
 * request (messages, tools), so a multi-turn tool loop is a function of the
 * conversation so far; tool-call ids are derived from the turn, so the same
 * conversation always gets the same answer.
 *
 * Served two ways, with the same script: over real HTTP on 127.0.0.1 (port
 * 0), and as an in-process `HttpClient` (for tests under TestClock). Both count
 * the calls and keep the parsed request bodies.
 */
import { Effect } from "effect"
import type { Scope } from "effect"
import { HttpClient, HttpClientError, HttpClientResponse } from "effect/http"
import { createServer } from "node:http"
import type { IncomingMessage } from "node:http"
import type { AddressInfo } from "node:net"

export interface ChatMessage {
  readonly role: string
  readonly content?: string | null
  readonly tool_call_id?: string
  readonly tool_calls?: ReadonlyArray<{ readonly id: string; readonly function: { readonly name: string; readonly arguments: string } }>
}

export interface ChatRequest {
  readonly model: string
  readonly messages: ReadonlyArray<ChatMessage>
  readonly tools?: ReadonlyArray<{ readonly function: { readonly name: string; readonly description?: string; readonly parameters: unknown } }>
}

/** What the model answers: text, or a turn of tool calls. */
export type Reply =
  | { readonly text: string }
  | { readonly toolCalls: ReadonlyArray<{ readonly name: string; readonly arguments: unknown }> }

export type Script = (request: ChatRequest) => Reply

/** The results of the tool calls so far, in order (`content` of the `tool` messages). */
export const toolResults = (request: ChatRequest): ReadonlyArray<string> =>
  request.messages.flatMap((m) => m.role === "tool" && typeof m.content === "string" ? [m.content] : [])

/** The first user message. */
export const question = (request: ChatRequest): string =>
  request.messages.find((m) => m.role === "user")?.content ?? ""

const CREATED = 1_700_000_000

/** The `chat.completion` JSON text for a reply. */
export const completionText = (request: ChatRequest, reply: Reply): string => {
  const turn = request.messages.filter((m) => m.role === "assistant").length
  const message = "text" in reply
    ? { role: "assistant", content: reply.text, refusal: null }
    : {
      role: "assistant",
      content: null,
      refusal: null,
      tool_calls: reply.toolCalls.map((call, i) => ({
        id: `call_${turn}_${i}`,
        type: "function",
        function: { name: call.name, arguments: JSON.stringify(call.arguments) }
      }))
    }
  return JSON.stringify({
    id: `chatcmpl-scripted-${turn}`,
    object: "chat.completion",
    created: CREATED,
    model: request.model,
    choices: [{ index: 0, message, logprobs: null, finish_reason: "text" in reply ? "stop" : "tool_calls" }],
    usage: { prompt_tokens: 10 + request.messages.length, completion_tokens: 7, total_tokens: 17 + request.messages.length }
  })
}

/** A model's calls, as either server counts them. */
export interface Calls {
  /** Calls of `POST /v1/chat/completions` so far. */
  readonly calls: number
  /** Parsed request bodies, in arrival order. */
  readonly requests: ReadonlyArray<ChatRequest>
}

const answer = (script: Script, text: string, requests: Array<ChatRequest>) => {
  let request: ChatRequest
  try {
    request = JSON.parse(text) as ChatRequest
  } catch {
    return { status: 400, body: JSON.stringify({ error: { message: "body is not JSON", type: "invalid_request_error" } }) }
  }
  requests.push(request)
  try {
    return { status: 200, body: completionText(request, script(request)) }
  } catch (error) {
    return { status: 500, body: JSON.stringify({ error: { message: `the script failed: ${String(error)}`, type: "server_error" } }) }
  }
}

export interface ScriptedModel extends Calls {
  /** Base URL including `/v1`. */
  readonly url: string
  readonly close: () => Promise<void>
}

const readBody = (req: IncomingMessage): Promise<string> =>
  new Promise((resolve, reject) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")))
    req.on("error", reject)
  })

/** Serve the script over HTTP on 127.0.0.1 (a free port). */
export const start = async (script: Script): Promise<ScriptedModel> => {
  const requests: Array<ChatRequest> = []
  const server = createServer((req, res) => {
    if (req.method !== "POST" || req.url !== "/v1/chat/completions") {
      res.writeHead(404, { "content-type": "application/json" })
      res.end(JSON.stringify({ error: { message: "not found", type: "invalid_request_error" } }))
      return
    }
    readBody(req).then((text) => {
      const { body, status } = answer(script, text, requests)
      res.writeHead(status, { "content-type": "application/json" })
      res.end(body)
    }, () => res.destroy())
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const { port } = server.address() as AddressInfo
  return {
    url: `http://127.0.0.1:${port}/v1`,
    get calls() {
      return requests.length
    },
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  }
}

/** The HTTP server for the life of a scope. */
export const scoped = (script: Script): Effect.Effect<ScriptedModel, never, Scope.Scope> =>
  Effect.acquireRelease(Effect.promise(() => start(script)), (model) => Effect.promise(() => model.close()))

/** The same script as an in-process `HttpClient` (any URL ending in `/chat/completions`). */
export const httpClient = (script: Script): Calls & { readonly client: HttpClient.HttpClient } => {
  const requests: Array<ChatRequest> = []
  const client = HttpClient.make((request) => {
    if (request.body._tag !== "Uint8Array" || !request.url.endsWith("/chat/completions")) {
      return Effect.fail(
        new HttpClientError.HttpClientError({
          reason: new HttpClientError.TransportError({ request, description: "the scripted model only answers JSON chat completions" })
        })
      )
    }
    const { body, status } = answer(script, new TextDecoder().decode(request.body.body), requests)
    return Effect.succeed(
      HttpClientResponse.fromWeb(request, new Response(body, { status, headers: { "content-type": "application/json" } }))
    )
  })
  return {
    client,
    get calls() {
      return requests.length
    },
    requests
  }
}
