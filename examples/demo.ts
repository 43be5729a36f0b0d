/**
 * `npm start`: the quick-start demo. Everything runs in this process over real
 * HTTP on loopback: the embedded kernel, three agents, and an operator using
 * the client. It shows, as a timeline,
 *
 *   1. a durable run: every tool call recorded as a step;
 *   2. a crash mid-run and the resume that replays the recorded steps without
 *      re-running their side effects (the card is charged once);
 *   3. a step held for approval by policy, granted through the client.
 */
import { NodeHttpClient, NodeHttpServer, NodeRuntime } from "@effect/platform-node"
import { Console, Context, Deferred, Effect, Exit, Layer, References, Schema, Scope } from "effect"
import { HttpServer } from "effect/http"
import { Agent, Client, Execution, KernelClient, Tool } from "effect-rebuno"
import * as Kernel from "effect-rebuno/kernel"
import { readFileSync } from "node:fs"
import { createServer } from "node:http"
import { deployer, operate } from "./approval.js"
import { hello } from "./hello.js"

const color = (code: number) => (s: string) => process.stdout.isTTY ? `\x1b[${code}m${s}\x1b[0m` : s
const dim = color(2)
const bold = color(1)
const green = color(32)
const red = color(31)
const yellow = color(33)

// --- the travel agent: a side effect that must happen once -----------------

let cardCharges = 0
let receiptsSent = 0
/** Completed by the receipt tool the first time it runs: the demo then kills the agent's process. */
let crashNow: Deferred.Deferred<void> | undefined

const searchFlights = Tool.make("search_flights", {
  args: Schema.Struct({ from: Schema.String, to: Schema.String }),
  success: Schema.Struct({ flight: Schema.String, price: Schema.Number }),
  execute: ({ from, to }) =>
    Effect.andThen(
      Console.log(`      ${dim("body")} search_flights ${from}→${to}`),
      Effect.succeed({ flight: "RB 042", price: 420 })
    )
})

const chargeCard = Tool.make("charge_card", {
  args: Schema.Struct({ amount: Schema.Number }),
  success: Schema.Struct({ receipt: Schema.String }),
  idempotency: "at_most_once",
  execute: ({ amount }) =>
    Effect.sync(() => {
      cardCharges++
      console.log(`      ${dim("body")} charge_card ${yellow(`💳 charged €${amount}`)} (charge #${cardCharges})`)
      return { receipt: `R-${amount}-001` }
    })
})

const sendReceipt = Tool.make("send_receipt", {
  args: Schema.Struct({ receipt: Schema.String }),
  success: Schema.Boolean,
  execute: ({ receipt }) =>
    crashNow !== undefined
      ? Effect.andThen(Deferred.succeed(crashNow, undefined), Effect.never)
      : Effect.sync(() => {
        receiptsSent++
        console.log(`      ${dim("body")} send_receipt ${receipt} ✉️`)
        return true
      })
})

const travel = Agent.make({
  id: "travel",
  input: Schema.Struct({ from: Schema.String, to: Schema.String }),
  handler: ({ from, to }) =>
    Effect.gen(function*() {
      const execution = yield* Execution.Execution
      yield* Console.log(
        `    ${bold("▶ run")} dispatch attempt ${execution.dispatchAttempt ?? "?"} starts from the top`
      )
      const { flight, price } = yield* searchFlights({ from, to })
      const { receipt } = yield* chargeCard({ amount: price })
      yield* sendReceipt({ receipt })
      return { flight, receipt }
    })
})

// --- plumbing ---------------------------------------------------------------

/**
 * Serve an agent's webhook on 127.0.0.1:`port` in its own scope ("process"), registered
 * with the kernel before the agent starts: at start-up the agent publishes its metadata,
 * signed with its secret, which the kernel refuses (401) for an agent it does not know.
 */
const serveAgent = <In, A, E>(agent: Agent.Agent<In, A, E, never>, kernelUrl: string, secret: string, port = 0) =>
  Effect.gen(function*() {
    const client = yield* Client.Client
    // A child of the program's scope: killing it is a crash, and it closes with the program anyway.
    const scope = yield* Scope.fork(yield* Effect.scope, "sequential")
    const server = yield* Layer.buildWithScope(NodeHttpServer.layer(() => createServer(), { port, host: "127.0.0.1" }), scope)
    const address = Context.get(server, HttpServer.HttpServer).address
    const boundPort = address._tag === "UnixPathAddress" ? port : address.port
    const url = `http://127.0.0.1:${boundPort}/webhook`
    yield* client.registerAgent({ id: agent.id, webhookUrl: url, secret })
    yield* Layer.buildWithScope(
      Agent.layer(agent).pipe(
        Layer.provide(Layer.succeedContext(server)),
        Layer.provide(KernelClient.layerSocket({ baseUrl: kernelUrl, secret }))
      ),
      scope
    )
    return { port: boundPort, url, kill: Scope.close(scope, Exit.void) }
  })

const timeline = (executionId: string) =>
  Effect.gen(function*() {
    const client = yield* Client.Client
    const events = yield* client.events(executionId, { limit: 1000 })
    const t0 = Date.parse(events[0]?.occurredAt ?? "")
    yield* Console.log(`    ${dim("kernel event log:")}`)
    for (const event of events) {
      const payload = (event.payload ?? {}) as Record<string, unknown>
      const at = ((Date.parse(event.occurredAt) - t0) / 1000).toFixed(2).padStart(6)
      const detail = [
        typeof payload["target"] === "string" ? payload["target"] : "",
        typeof payload["attempt"] === "number" && event.type !== "dispatch.queued" ? `attempt ${payload["attempt"]}` : "",
        typeof payload["reason"] === "string" ? `reason ${payload["reason"]}` : ""
      ].filter((s) => s !== "").join(" ")
      yield* Console.log(`    ${dim(`+${at}s`)}  ${event.type.padEnd(24)} ${detail}`)
    }
  })

const waitFor = (executionId: string, done: (status: string) => boolean) =>
  Effect.gen(function*() {
    const client = yield* Client.Client
    while (true) {
      const execution = yield* client.get(executionId)
      if (done(execution.status)) return execution
      yield* Effect.sleep("100 millis")
    }
  })

const program = Effect.gen(function*() {
  yield* Console.log(bold("\neffect-rebuno quick start"))
  yield* Console.log(dim("an embedded Rebuno kernel, three agents and an operator, all in this process over HTTP\n"))

  // A short lease so the crash demo resumes in seconds (the protocol default is 120 s).
  const kernel = yield* Kernel.start({ port: 0, settings: { leaseTimeoutMs: 3_000 } })
  yield* Console.log(`kernel listening on ${kernel.url} ${dim("(lease timeout 3 s, dispatch tick 2 s)")}`)

  const client = Context.get(
    yield* Layer.build(Client.layer({ baseUrl: kernel.url }).pipe(Layer.provide(NodeHttpClient.layerUndici))),
    Client.Client
  )
  const withClient = Effect.provideService(Client.Client, client)

  // 1. hello -----------------------------------------------------------------
  yield* Console.log(bold("\n1. A durable run"))
  yield* withClient(serveAgent(hello, kernel.url, "hello-secret"))
  const first = yield* client.create("hello", { query: "durable agents in TypeScript" })
  yield* Console.log(`    created execution ${first.id} for agent hello`)
  const helloDone = yield* withClient(waitFor(first.id, (s) => s === "completed" || s === "failed"))
  yield* withClient(timeline(first.id))
  yield* Console.log(`    ${green("✓")} ${helloDone.status}: ${JSON.stringify(helloDone.output)}`)

  // 2. crash and resume ------------------------------------------------------
  yield* Console.log(bold("\n2. A crash mid-run, and the resume"))
  crashNow = yield* Deferred.make<void>()
  const travelServer = yield* withClient(serveAgent(travel, kernel.url, "travel-secret"))
  const trip = yield* client.create("travel", { from: "LIS", to: "BER" })
  yield* Console.log(`    created execution ${trip.id} for agent travel`)
  yield* Deferred.await(crashNow)
  crashNow = undefined
  yield* travelServer.kill
  yield* Console.log(
    `    ${red("💥 the agent process died while sending the receipt")} ${dim("(no outcome posted, heartbeats stopped)")}`
  )
  const restarted = yield* withClient(serveAgent(travel, kernel.url, "travel-secret", travelServer.port))
  yield* Console.log(`    agent process restarted on :${restarted.port}; waiting for the lease to lapse…`)
  const tripDone = yield* withClient(waitFor(trip.id, (s) => s === "completed" || s === "failed"))
  yield* withClient(timeline(trip.id))
  yield* Console.log(`    ${green("✓")} ${tripDone.status}: ${JSON.stringify(tripDone.output)}`)
  yield* Console.log(
    `    card charged ${bold(String(cardCharges))} time(s), receipt sent ${bold(String(receiptsSent))} time(s): ` +
      `search_flights and charge_card were ${bold("replayed")} from the kernel's record on the second run`
  )
  if (cardCharges !== 1) return yield* Effect.die(new Error(`expected one charge, saw ${cardCharges}`))

  // 3. approval --------------------------------------------------------------
  yield* Console.log(bold("\n3. A step held for approval"))
  yield* withClient(serveAgent(deployer, kernel.url, "deployer-secret"))
  const policy = readFileSync(new URL("./policies/deployer.yaml", import.meta.url), "utf8")
  yield* client.loadPolicy("deployer", policy)
  yield* Console.log(`    loaded examples/policies/deployer.yaml: production deploys need alice`)
  const deployed = yield* withClient(operate)
  if (deployed.status !== "completed") return yield* Effect.die(new Error(`deployer ended ${deployed.status}`))

  yield* Console.log(bold("\nDone."), dim("Next: README.md (API tour, testing guide, production kernel)\n"))
})

NodeRuntime.runMain(Effect.scoped(program).pipe(Effect.provideService(References.MinimumLogLevel, "Warn")))
