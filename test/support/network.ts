/**
 * Network facts for the tests that check where a kernel listens.
 *
 * @since 0.2.0
 */
import { Effect } from "effect"
import * as Net from "node:net"
import * as Os from "node:os"

/**
 * This machine's first non-loopback IPv4 address, if it has one.
 *
 * @since 0.2.0
 */
export const externalAddress: string | undefined = Object.values(Os.networkInterfaces()).flat().find((i) =>
  i !== undefined && i.family === "IPv4" && !i.internal
)?.address

/**
 * Whether a TCP connection to `host:port` is accepted (within 3 s).
 *
 * @since 0.2.0
 */
export const accepts = (host: string, port: number) =>
  Effect.callback<boolean>((resume) => {
    const socket = Net.connect({ host, port })
    socket.once("connect", () => {
      socket.destroy()
      resume(Effect.succeed(true))
    })
    socket.once("error", () => resume(Effect.succeed(false)))
  }).pipe(Effect.timeout("3 seconds"))
