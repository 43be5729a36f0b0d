/**
 * TCP proxies for the black-box checks: one between a process and the kernel
 * (or the kernel and an agent) that breaks connections on purpose.
 *
 * - `makeProxy`: scripted rules on requests (reset, drop the answer, stall
 *   until released) — test/e2e/HelloAbuse.test.ts.
 * - `makeChaosProxy`: a `decide` callback picks a fault for every request
 *   (reset, cut mid-request, drop or cut the answer, stall, delay), plus
 *   whole-proxy cuts and partitions — the soak (test/support/soak.ts).
 *
 * @since 0.2.0
 */
import * as Net from "node:net"

// ---------------------------------------------------------------------------
// A TCP proxy with rules on the requests
// ---------------------------------------------------------------------------

export type Action = "reset" | "dropResponse" | "stall"

export interface Rule {
  readonly match: RegExp
  readonly action: Action
  times: number
  hits: number
}

export const makeProxy = (targetPort: number) => {
  const rules: Array<Rule> = []
  const sockets = new Set<Net.Socket>()
  let stalled: Array<() => void> | undefined
  const server = Net.createServer((client) => {
    const upstream = Net.connect(targetPort, "127.0.0.1")
    sockets.add(client).add(upstream)
    let dropResponse = false
    const close = () => {
      sockets.delete(client)
      sockets.delete(upstream)
      client.destroy()
      upstream.destroy()
    }
    for (const s of [client, upstream]) s.on("error", close).on("close", close)
    upstream.on("data", (data) => {
      if (dropResponse) return void (client.resetAndDestroy(), upstream.destroy())
      if (stalled !== undefined) return void stalled.push(() => client.write(data))
      client.write(data)
    })
    client.on("data", (data) => {
      // the SDK's socket client writes a request (head and body) in one go
      const text = data.toString("utf8")
      const rule = /^[A-Z]+ \//.test(text) ? rules.find((r) => r.times > 0 && r.match.test(text)) : undefined
      if (rule !== undefined) {
        rule.times--
        rule.hits++
        if (rule.action === "reset") return void (client.resetAndDestroy(), upstream.destroy())
        if (rule.action === "dropResponse") dropResponse = true
        if (rule.action === "stall") stalled = []
      }
      if (stalled !== undefined) return void stalled.push(() => upstream.write(data))
      upstream.write(data)
    })
  })
  return {
    /** Listen on a free port; resolves with it. */
    listen: () =>
      new Promise<number>((resolve) =>
        server.listen(0, "127.0.0.1", () => resolve((server.address() as Net.AddressInfo).port))
      ),
    rule: (match: RegExp, action: Action, times = 1): Rule => {
      const rule: Rule = { match, action, times, hits: 0 }
      rules.push(rule)
      return rule
    },
    /** Forget the rules and let stalled traffic through. */
    release: () => {
      rules.length = 0
      const pending = stalled ?? []
      stalled = undefined
      for (const write of pending) write()
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy()
        server.close(() => resolve())
      })
  }
}

// ---------------------------------------------------------------------------
// A chaos proxy: a fault picked per request
// ---------------------------------------------------------------------------

/** What the chaos proxy does to one request (and its answer). */
export type Fault =
  | { readonly kind: "pass" }
  /** hold the connection's traffic for `ms`, then let it through */
  | { readonly kind: "delay"; readonly ms: number }
  /** reset the connection before anything of the request is forwarded */
  | { readonly kind: "reset" }
  /** forward `fraction` of the request's bytes (head and body), then cut both sides */
  | { readonly kind: "cutRequest"; readonly fraction: number }
  /** forward the request; reset the client as soon as the answer starts */
  | { readonly kind: "dropResponse" }
  /** forward the request and `fraction` of the answer's first chunk, then reset */
  | { readonly kind: "cutResponse"; readonly fraction: number }
  /** hold the connection's traffic for `ms`, then let it through or reset it */
  | { readonly kind: "stall"; readonly ms: number; readonly thenReset: boolean }

export type FaultKind = Fault["kind"]

/** The start of a request, as the proxy saw it. */
export interface SeenRequest {
  readonly method: string
  readonly path: string
}

export interface ChaosProxyOptions {
  readonly targetPort: number
  /** Called at the start of every request seen on a connection. */
  readonly decide: (request: SeenRequest) => Fault
}

const requestLine = /^([A-Z]+) (\/\S*) HTTP\/1\.[01]\r\n/

/** The byte length of a request that starts `chunk`, when its head is complete and declares a length. */
const requestLength = (chunk: Buffer): number | undefined => {
  const headEnd = chunk.indexOf("\r\n\r\n")
  if (headEnd < 0) return undefined
  const head = chunk.subarray(0, headEnd).toString("latin1")
  if (/\r\ntransfer-encoding:/i.test(head)) return undefined
  const length = /\r\ncontent-length: *(\d+)/i.exec(head)
  return headEnd + 4 + (length === null ? 0 : Number(length[1]))
}

/**
 * A TCP proxy to `127.0.0.1:targetPort` that asks `decide` what to do with
 * each request. A chunk from the client that starts with a request line
 * starts a request (HTTP/1.1 clients write a request's head in one go).
 */
export const makeChaosProxy = (options: ChaosProxyOptions) => {
  const connections = new Set<{ readonly cut: () => void; readonly release: () => void }>()
  const counts: Record<FaultKind, number> = {
    pass: 0,
    delay: 0,
    reset: 0,
    cutRequest: 0,
    dropResponse: 0,
    cutResponse: 0,
    stall: 0
  }
  let refusing = false
  let refused = 0
  let passThrough = false
  const server = Net.createServer((client) => {
    if (refusing) {
      refused++
      client.on("error", () => undefined)
      return void client.resetAndDestroy()
    }
    const upstream = Net.connect(options.targetPort, "127.0.0.1")
    let closed = false
    /** Writes held back while the connection stalls. */
    let held: Array<() => void> | undefined
    let timer: ReturnType<typeof setTimeout> | undefined
    /** What to do with the answer to the current request. */
    let answer: Fault = { kind: "pass" }
    /** Bytes of the request that may still go up before the connection is cut. */
    let budget: number | undefined
    const close = () => {
      if (closed) return
      closed = true
      if (timer !== undefined) clearTimeout(timer)
      held = undefined
      connections.delete(connection)
      client.destroy()
      upstream.destroy()
    }
    const cut = () => {
      if (closed) return
      client.resetAndDestroy()
      close()
    }
    const release = () => {
      if (timer !== undefined) clearTimeout(timer)
      timer = undefined
      const pending = held ?? []
      held = undefined
      for (const write of pending) write()
    }
    const hold = (ms: number, thenReset: boolean) => {
      held ??= []
      if (timer !== undefined) clearTimeout(timer)
      timer = setTimeout(() => (timer = undefined, thenReset ? cut() : release()), ms)
    }
    const connection = { cut, release }
    connections.add(connection)
    for (const s of [client, upstream]) s.on("error", close).on("close", close)

    const up = (data: Buffer) => {
      if (closed) return
      if (budget !== undefined) {
        if (data.length < budget) {
          budget -= data.length
          return void upstream.write(data)
        }
        const part = data.subarray(0, budget)
        budget = undefined
        // the kernel (or agent) sees a request that stops mid-way and a closed connection
        upstream.write(part, () => cut())
        return
      }
      upstream.write(data)
    }
    const down = (data: Buffer) => {
      if (closed) return
      if (answer.kind === "dropResponse") return cut()
      if (answer.kind === "cutResponse") {
        const part = data.subarray(0, Math.max(1, Math.floor(data.length * answer.fraction)))
        answer = { kind: "pass" }
        return void client.write(part, () => cut())
      }
      client.write(data)
    }

    upstream.on("data", (data: Buffer) => {
      if (held !== undefined) return void held.push(() => down(data))
      down(data)
    })
    client.on("data", (data: Buffer) => {
      const line = requestLine.exec(data.toString("latin1", 0, Math.min(data.length, 4096)))
      if (line !== null && budget === undefined) {
        const fault = passThrough ? { kind: "pass" as const } : options.decide({ method: line[1]!, path: line[2]! })
        counts[fault.kind]++
        answer = fault
        switch (fault.kind) {
          case "reset":
            return cut()
          case "cutRequest": {
            const total = requestLength(data) ?? data.length
            budget = Math.min(total - 1, Math.max(1, Math.floor(total * fault.fraction)))
            break
          }
          case "stall":
            hold(fault.ms, fault.thenReset)
            break
          case "delay":
            hold(fault.ms, false)
            break
        }
      }
      if (held !== undefined) return void held.push(() => up(data))
      up(data)
    })
  })
  return {
    /** Listen on a free port; resolves with it. */
    listen: () =>
      new Promise<number>((resolve) =>
        server.listen(0, "127.0.0.1", () => resolve((server.address() as Net.AddressInfo).port))
      ),
    /** Faults picked so far, by kind (`pass` included). */
    counts,
    /** Connections refused while partitioned. */
    refused: () => refused,
    /** Reset every open connection at once. */
    cutAll: () => {
      const open = [...connections]
      for (const c of open) c.cut()
      return open.length
    },
    /** While on, new connections are reset at once (open ones are cut too). */
    partition: (on: boolean) => {
      refusing = on
      if (on) for (const c of [...connections]) c.cut()
    },
    /** No more faults: every request passes, stalled traffic goes through, partitions end. */
    calm: () => {
      passThrough = true
      refusing = false
      for (const c of [...connections]) c.release()
    },
    /** Faults again after `calm`. */
    storm: () => {
      passThrough = false
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const c of [...connections]) c.cut()
        server.close(() => resolve())
      })
  }
}

export type ChaosProxy = ReturnType<typeof makeChaosProxy>
