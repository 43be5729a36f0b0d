/**
 * Raw HTTP/1.x over `node:net` for the tests that speak bytes to a server:
 * write parts (strings, buffers, pauses), collect what comes back, and split
 * it into responses — `Content-Length`, chunked, or up to the close.
 */
import { Effect } from "effect"
import * as Net from "node:net"

/** A part to write: bytes, or a pause of that many milliseconds. */
export type Part = string | Buffer | number

/** Where to connect: a port on 127.0.0.1, or a host and port. */
export type Target = number | { readonly host: string; readonly port: number }

export interface Exchange {
  /** Every byte the server sent. */
  readonly bytes: Buffer
  /** The server closed the connection (rather than the exchange's ceiling ending it). */
  readonly closed: boolean
}

/**
 * Connects, writes the parts in order (a number waits that many ms), then
 * collects what the server sends until it closes the connection, `expect`
 * complete responses have arrived, or `ceiling` ms have passed. `end` half-closes
 * after the last part.
 */
export const exchange = (
  target: Target,
  parts: ReadonlyArray<Part>,
  options: { readonly expect?: number; readonly ceiling?: number; readonly end?: boolean } = {}
): Effect.Effect<Exchange> =>
  Effect.callback<Exchange>((resume) => {
    const socket = typeof target === "number"
      ? Net.connect(target, "127.0.0.1")
      : Net.connect(target.port, target.host)
    const chunks: Array<Buffer> = []
    let done = false
    const finish = (closed: boolean) => {
      if (done) return
      done = true
      clearTimeout(timer)
      socket.destroy()
      resume(Effect.succeed({ bytes: Buffer.concat(chunks), closed }))
    }
    const timer = setTimeout(() => finish(false), options.ceiling ?? 1500)
    socket.on("data", (chunk) => {
      chunks.push(chunk)
      if (options.expect !== undefined && responses(Buffer.concat(chunks)).complete >= options.expect) finish(false)
    })
    socket.on("error", () => {})
    socket.on("close", () => finish(true))
    socket.on("connect", async () => {
      for (const part of parts) {
        if (typeof part === "number") await new Promise((r) => setTimeout(r, part))
        else if (!socket.destroyed) socket.write(part)
      }
      if (options.end === true && !socket.destroyed) socket.end()
    })
    return Effect.sync(() => finish(false))
  })

export interface Response {
  /** The status line as sent, e.g. `HTTP/1.1 400 Bad Request`. */
  readonly statusLine: string
  readonly status: number
  /** Lower-cased names; a repeated field's values joined with `, `. */
  readonly headers: Readonly<Record<string, string>>
  readonly body: string
}

/** The complete HTTP/1.x responses in `bytes` (content-length or chunked framing, or up to the end). */
export const responses = (bytes: Buffer): { readonly list: ReadonlyArray<Response>; readonly complete: number } => {
  const list: Array<Response> = []
  let offset = 0
  while (offset < bytes.length) {
    const headEnd = bytes.indexOf("\r\n\r\n", offset)
    if (headEnd < 0) break
    const lines = bytes.subarray(offset, headEnd).toString("latin1").split("\r\n")
    const statusLine = lines[0]!
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(statusLine)?.[1] ?? -1)
    const headers: Record<string, string> = {}
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(":")
      const name = line.slice(0, colon).toLowerCase()
      const value = line.slice(colon + 1).trim()
      headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`
    }
    offset = headEnd + 4
    if (status >= 100 && status < 200) {
      list.push({ statusLine, status, headers, body: "" })
      continue
    }
    const length = headers["content-length"]
    if (length !== undefined) {
      if (offset + Number(length) > bytes.length) break
      list.push({ statusLine, status, headers, body: bytes.subarray(offset, offset + Number(length)).toString("utf8") })
      offset += Number(length)
    } else if (headers["transfer-encoding"] === "chunked") {
      const parts: Array<Buffer> = []
      let complete = false
      for (;;) {
        const lineEnd = bytes.indexOf("\r\n", offset)
        if (lineEnd < 0) break
        const size = parseInt(bytes.subarray(offset, lineEnd).toString("latin1"), 16)
        if (size === 0) {
          offset = lineEnd + 4
          complete = true
          break
        }
        parts.push(bytes.subarray(lineEnd + 2, lineEnd + 2 + size))
        offset = lineEnd + 2 + size + 2
      }
      if (!complete) break
      list.push({ statusLine, status, headers, body: Buffer.concat(parts).toString("utf8") })
    } else {
      list.push({ statusLine, status, headers, body: status === 204 ? "" : bytes.subarray(offset).toString("utf8") })
      offset = status === 204 ? offset : bytes.length
    }
  }
  return { list, complete: list.length }
}
