/**
 * Governance end to end: the `deployer` agent ships a service; its policy
 * (`examples/policies/deployer.yaml`) allows read-only tools and staging
 * deploys, holds production deploys for `alice`, and never allows dropping a
 * database. This script serves the agent *and* plays the operator: it creates
 * an execution with the client, waits for the approval, grants it as `alice`,
 * and follows the events until the execution ends.
 *
 * Works unchanged on the embedded and the reference kernel:
 *
 *   npm run kernel -- dev --config examples/rebuno.dev.yaml   # or: rebuno dev --config examples/rebuno.v0.14.yaml
 *   npx tsx examples/approval.ts
 *
 *   REBUNO_URL (default http://localhost:8080), AGENT_PORT (default 5001),
 *   REBUNO_AGENT_SECRET (default deployer-secret)
 */
import { NodeHttpClient, NodeRuntime } from "@effect/platform-node"
import { Config, Console, Effect, Layer, Redacted, Schedule, Schema, Stream } from "effect"
import { Agent, Client, KernelClient, Tool } from "effect-rebuno"
import { pathToFileURL } from "node:url"

/** Allowed: `run_tests` matches the read-only rule. */
export const runTests = Tool.make("run_tests", {
  description: "Run the service's test suite.",
  args: Schema.Struct({ service: Schema.String }),
  success: Schema.Struct({ passed: Schema.Number, failed: Schema.Number }),
  execute: () => Effect.succeed({ passed: 42, failed: 0 })
})

/** Staging deploys are allowed; production deploys wait for `alice`. */
export const deploy = Tool.make("deploy", {
  description: "Deploy a service to an environment.",
  args: Schema.Struct({ service: Schema.String, environment: Schema.Literals(["staging", "production"]) }),
  success: Schema.Struct({ url: Schema.String }),
  idempotency: "at_most_once",
  execute: ({ environment, service }) => Effect.succeed({ url: `https://${service}.${environment}.example.com` })
})

/** Always denied; `denialAsText` hands the denial to the handler as text (as an LLM would see it). */
export const dropDatabase = Tool.denialAsText(
  Tool.make("drop_database", {
    description: "Drop a database.",
    args: Schema.Struct({ name: Schema.String }),
    success: Schema.String,
    execute: ({ name }) => Effect.succeed(`dropped ${name}`)
  })
)

/** The `deployer` agent. */
export const deployer = Agent.make({
  id: "deployer",
  input: Schema.Struct({ service: Schema.String }),
  handler: ({ service }) =>
    Effect.gen(function*() {
      const tests = yield* runTests({ service })
      const staging = yield* deploy({ service, environment: "staging" })
      const production = yield* deploy({ service, environment: "production" })
      const cleanup = yield* dropDatabase({ name: `${service}_legacy` })
      return { tests, staging: staging.url, production: production.url, cleanup }
    })
})

const settings = Effect.gen(function*() {
  const baseUrl = yield* Config.String("REBUNO_URL").pipe(Config.withDefault("http://localhost:8080"))
  const secret = yield* Config.Redacted("REBUNO_AGENT_SECRET").pipe(
    Config.withDefault(Redacted.make("deployer-secret"))
  )
  const port = yield* Config.Int("AGENT_PORT").pipe(Config.withDefault(5001))
  return { baseUrl, secret, port }
})

/** The agent's webhook server and the operator's client, both on the configured kernel. */
export const DeployerLive = Layer.unwrap(
  Effect.map(settings, ({ baseUrl, port, secret }) =>
    Layer.mergeAll(
      Agent.serve(deployer, { port }).pipe(Layer.provide(KernelClient.layerSocket({ baseUrl, secret }))),
      Client.layer({ baseUrl }).pipe(Layer.provide(NodeHttpClient.layerUndici))
    ))
)

/** The operator: create, wait for the approval, grant it as alice, follow to the end. */
export const operate = Effect.gen(function*() {
  const client = yield* Client.Client
  const execution = yield* client.create("deployer", { service: "billing" })
  yield* Console.log(`created execution ${execution.id}`)
  const approval = yield* client.listApprovals().pipe(
    Effect.flatMap((list) => Effect.fromNullishOr(list.find((a) => a.executionId === execution.id))),
    Effect.retry({ schedule: Schedule.spaced("250 millis"), times: 240 })
  )
  yield* Console.log(`approval ${approval.id} pending (approvers: ${approval.approvers.join(", ")}): ${approval.message}`)
  yield* client.grantApproval(approval.id, { decidedBy: "alice", rationale: "release window is open" })
  yield* Console.log("granted as alice")
  yield* client.follow(execution.id, { pollInterval: "250 millis" }).pipe(
    Stream.runForEach((event) => Console.log(`  #${event.eventSeq} ${event.type}`)),
    Effect.timeout("60 seconds")
  )
  const final = yield* client.get(execution.id)
  yield* Console.log(`execution ${final.status}: ${JSON.stringify(final.output ?? final.failureReason)}`)
  return final
})

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  operate.pipe(Effect.provide(DeployerLive), NodeRuntime.runMain)
}
