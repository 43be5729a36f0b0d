/**
 * Helpers for the outside, black-box checks that run the kernel CLI and
 * `examples/hello.ts` as real processes (test/e2e/HelloAbuse.test.ts,
 * test/e2e/Soak.test.ts, scripts/soak.ts): waiting, free ports, spawning Node
 * with tsx, and the kernel's JSON API.
 *
 * @since 0.2.0
 */
import { type ChildProcess, spawn, type StdioOptions } from "node:child_process"
import * as Net from "node:net"
import { fileURLToPath } from "node:url"

/** The checkout's root directory. */
export const ROOT = fileURLToPath(new URL("../..", import.meta.url))

/** The Node binary running this process (Node 24 under `npx`). */
export const NODE = process.execPath

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** Polls `condition` every 20 ms until it holds; rejects after `ms`. */
export const until = async (what: string, condition: () => boolean | Promise<boolean>, ms = 15_000) => {
  const deadline = Date.now() + ms
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(20)
  }
}

/** Whether something on `127.0.0.1:port` accepts a TCP connection. */
export const accepts = (port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = Net.connect(port, "127.0.0.1")
    socket.once("connect", () => (socket.destroy(), resolve(true)))
    socket.once("error", () => resolve(false))
  })

/** A port nothing listens on now. */
export const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = Net.createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as Net.AddressInfo
      server.close(() => resolve(port))
    })
  })

/** A JSON call to the kernel's client and admin routes (dev mode: no auth). */
export const api = async (base: string, path: string, init?: RequestInit): Promise<{ status: number; json: any }> => {
  const response = await fetch(base + path, init)
  const text = await response.text()
  return { status: response.status, json: text === "" ? undefined : JSON.parse(text) }
}

/**
 * Spawns Node processes from the checkout's root and remembers them until
 * they exit, so that `killAll` can end whatever is left.
 */
export const makeSpawner = (stdio: StdioOptions = "ignore") => {
  const children = new Set<ChildProcess>()
  return {
    children,
    /** `node <args>` with the environment plus `env`. */
    start: (args: ReadonlyArray<string>, env: Record<string, string> = {}) => {
      const child = spawn(NODE, args, { cwd: ROOT, env: { ...process.env, ...env }, stdio })
      children.add(child)
      child.once("exit", () => children.delete(child))
      return child
    },
    killAll: (signal: NodeJS.Signals = "SIGKILL") => {
      for (const child of children) child.kill(signal)
    }
  }
}

/** Whether a spawned process has ended. */
export const exited = (child: ChildProcess) => child.exitCode !== null || child.signalCode !== null
