/**
 * Sessions and state (PROTOCOL-CURRENT C.4): the `Session` values, their
 * types, and a chat agent over real HTTP against the embedded kernel — one
 * execution at a time per session, each reading the state the previous one
 * stored.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Option, Schema } from "effect"
import * as Kernel from "effect-rebuno/kernel"
import { TestKernel } from "effect-rebuno/testing"
import * as Agent from "../src/Agent.js"
import * as Session from "../src/Session.js"
import { client, serve, settled } from "./support/embedded.js"

describe("Session values", () => {
  it("withState carries the output and the state; isWithState recognises it (and nothing else)", () => {
    const session = Session.make<ReadonlyArray<string>>({
      id: "chat:u1",
      parentExecutionId: undefined,
      previous: Effect.succeed(Option.none())
    })
    const answer = session.withState({ reply: "hi" }, ["hi"])
    expect(answer.output).toEqual({ reply: "hi" })
    expect(answer.state).toEqual(["hi"])
    expect(Session.isWithState(answer)).toBe(true)
    for (const other of [null, undefined, "x", { output: 1, state: 2 }, [answer]]) {
      expect(Session.isWithState(other)).toBe(false)
    }
    expect(session.id).toEqual(Option.some("chat:u1"))
    expect(session.parentExecutionId).toEqual(Option.none())
  })

  it("a handler's state and output are typed by the agent's Schemas", () => {
    const History = Schema.Array(Schema.String)
    const typed = Agent.make({
      id: "typed",
      output: Schema.Struct({ turns: Schema.Number }),
      state: History,
      handler: (_input, session) =>
        Effect.gen(function*() {
          const previous: Option.Option<ReadonlyArray<string>> = yield* session.previous
          return session.withState({ turns: Option.getOrElse(previous, () => []).length }, ["x"])
        })
    })
    expect(typed.stateSchema).toBe(History)
    Agent.make({
      id: "wrong-state",
      state: History,
      // @ts-expect-error the state must be a list of strings
      handler: (_input, session) => Effect.succeed(session.withState("out", { n: 1 }))
    })
    Agent.make({
      id: "wrong-output",
      output: Schema.Struct({ turns: Schema.Number }),
      state: History,
      // @ts-expect-error the output must match the output Schema
      handler: (_input, session) => Effect.succeed(session.withState({ turns: "1" }, ["x"]))
    })
  })
})

const History = Schema.Array(Schema.String)

/** A chat agent: the history grows by one message per execution of the session. */
const chat = Agent.make({
  id: "chat",
  input: Schema.Struct({ message: Schema.String }),
  state: History,
  handler: ({ message }, session) =>
    Effect.gen(function*() {
      const history = Option.getOrElse(yield* session.previous, () => [])
      const next = [...history, message]
      return session.withState({ session: Option.getOrNull(session.id), history: next }, next)
    })
})

describe("sessions over HTTP on the embedded kernel (current stage)", () => {
  it.live("executions of a session run in order, each reading the state the previous one stored", () =>
    Effect.gen(function*() {
      const kernel = yield* Kernel.start({ port: 0 })
      yield* serve(chat, kernel.url, "chat-secret")
      const admin = yield* client(kernel.url)
      const first = yield* admin.create("chat", { message: "one" }, { session: "s-1" })
      const second = yield* admin.create("chat", { message: "two" }, { session: "s-1" })
      const other = yield* admin.create("chat", { message: "elsewhere" }, { session: "s-2" })
      const third = yield* admin.create("chat", { message: "three" }, { session: "s-1" })
      expect(first.session).toBe("s-1")
      const done = yield* Effect.forEach([first, second, other, third], (e) => settled(admin, e.id))
      expect(done.map((e) => [e.status, e.output])).toEqual([
        ["completed", { session: "s-1", history: ["one"] }],
        ["completed", { session: "s-1", history: ["one", "two"] }],
        ["completed", { session: "s-2", history: ["elsewhere"] }],
        ["completed", { session: "s-1", history: ["one", "two", "three"] }]
      ])
      expect(done[3]!.parentExecutionId).toBe(second.id)
      // what the next execution of the session will read
      expect(yield* admin.previous(third.id)).toEqual(["one", "two"])
    }).pipe(Effect.scoped), 30_000)

  it.live("the agent runs on every stage's kernel with the default client", () =>
    Effect.gen(function*() {
      const plain = Agent.make({
        id: "plain",
        input: Schema.Struct({ n: Schema.Number }),
        handler: ({ n }) => Effect.succeed({ doubled: n * 2 })
      })
      for (const stage of ["current", "seed", "v0.14.0"] as const) {
        const kernel = yield* Kernel.start({ port: 0, stage })
        yield* serve(plain, kernel.url, "plain-secret")
        const admin = yield* client(kernel.url)
        const created = yield* admin.create("plain", { n: 21 })
        const done = yield* settled(admin, created.id)
        expect([stage, done.status, done.output]).toEqual([stage, "completed", { doubled: 42 }])
      }
    }).pipe(Effect.scoped), 60_000)
})

describe("sessions in the test kit (TestKernel, virtual time)", () => {
  for (const transport of ["direct", "http"] as const) {
    it.effect(`${transport}: each execution of a session reads the state of the one before`, () =>
      Effect.gen(function*() {
        const kernel = yield* TestKernel.TestKernel
        const ids: Array<string> = []
        for (const message of ["one", "two", "three"]) {
          ids.push(yield* kernel.create("chat", { message }, { session: "s-1" }))
        }
        const last = yield* kernel.settle(ids[2]!)
        expect(last.output).toEqual({ session: "s-1", history: ["one", "two", "three"] })
        expect(last.execution.parentExecutionId).toBe(ids[1])
        const first = yield* kernel.settle(ids[0]!)
        expect(first.output).toEqual({ session: "s-1", history: ["one"] })
      }).pipe(Effect.provide(TestKernel.layer({ agents: [chat], transport }))))
  }
})
