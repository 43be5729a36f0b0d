/**
 * Path segments the SDK sends (agent ids, execution ids, step ids, resource
 * keys) reach the kernel as the values meant: each is escaped as Go's
 * `net/url` escapes a path, because the reference kernel — and the embedded
 * one, which routes as it does — routes on the path as sent unless it is that
 * canonical form. `encodeURIComponent` escapes `:`, `@`, `+`, `,`, `;`, `=`,
 * `$` and `&`, which Go does not: such an agent id named a different agent.
 */
import { NodeHttpClient } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import * as Client from "../src/Client.js"
import * as Path from "../src/internal/wire/path.js"
import * as Kernel from "../src/kernel/index.js"

describe("path segments", () => {
  it("are escaped as Go escapes a path: sub-delimiters kept, everything else %XX upper-case", () => {
    expect(Path.segment("team:alpha@eu+1,x;y=z$&")).toBe("team:alpha@eu+1,x;y=z$&")
    expect(Path.segment("a b/c?d#e%f")).toBe("a%20b%2Fc%3Fd%23e%25f")
    expect(Path.segment("é!*'()")).toBe("%C3%A9%21%2A%27%28%29")
    expect(Path.escapePath("/v0/agents/a b")).toBe("/v0/agents/a%20b")
  })

  it.effect("agent ids with sub-delimiters, spaces and non-ASCII reach the embedded kernel as given", () =>
    Effect.gen(function*() {
      const kernel = yield* Kernel.start({ port: 0 })
      const client = yield* Effect.map(
        Layer.build(Client.layer({ baseUrl: kernel.url }).pipe(Layer.provide(NodeHttpClient.layerUndici))),
        Context.get(Client.Client)
      )
      for (const id of ["team:alpha@eu+1", "a,b;c=d", "with space", "ünïcode", "pct%41"]) {
        yield* client.registerAgent({ id, webhookUrl: "http://127.0.0.1:9/webhook", secret: "s" })
        expect((yield* client.getAgent(id)).id, id).toBe(id)
        yield* client.loadPolicy(id, "default_action: allow\n")
      }
    }))
})
