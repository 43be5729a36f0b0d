/**
 * The resource calls of `KernelClient` (PROTOCOL-CURRENT C.6) on both
 * transports — `HttpClient` (undici's, through `layer`) and the undici
 * dispatcher (`layerUndici`) — against a real loopback server: register, bind
 * and checkpoints with the lease headers and a valid `v1=` signature, the
 * exact body bytes (the same JSON as the Python SDK's C.14 vectors),
 * `resources` on submit only when declared, captures and capture failures
 * with a step's outcome, the answers decoded, the errors mapped, and the
 * transport retries.
 */
import { NodeHttpClient } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Cause, Context, Effect, Exit, Layer, Redacted, type Scope } from "effect"
import { readFileSync } from "node:fs"
import * as Http from "node:http"
import type * as Net from "node:net"
import * as KernelClient from "../src/KernelClient.js"
import { LeaseSuperseded, Terminated } from "../src/RebunoError.js"
import * as Signature from "../src/Signature.js"
import { makeDouble, json as jsonAnswer, noContent } from "./support/httpDouble.js"

const SECRET = "test-secret"
const EXEC = "018f3a2b-4c5d-7e6f-8a9b-0c1d2e3f4a5b"
const STEP = "a".repeat(64)
const caller: KernelClient.Caller = {
  agentId: "test-agent",
  lease: { dispatchId: "01920000-0000-7000-8000-000000000001", attempt: 3 }
}

const vectors = (JSON.parse(
  readFileSync(new URL("../../shared/fixtures/current-vectors.json", import.meta.url), "utf8")
) as { readonly v1_requests: ReadonlyArray<{ readonly name: string; readonly body: string }> }).v1_requests
const vectorBody = (name: string) => JSON.parse(vectors.find((v) => v.name === name)!.body)

/** The resource object of C.6.1, as the kernel answers it. */
const RESOURCE_WIRE = {
  key: "workspace",
  driver_id: "example.e2b.v1",
  configuration: { timeout: 600 },
  coverage_reuse: false,
  every_steps: 5,
  on_completion: true,
  registered_seq: 12,
  generation: 5,
  count: 4,
  binding: { sandbox_id: "sbx-1" },
  checkpoint_ref: "snap-0",
  covered: false
}

interface Received {
  readonly method: string
  readonly path: string
  readonly headers: Http.IncomingHttpHeaders
  readonly body: string
}

type Answer = { readonly status: number; readonly body?: unknown } | "destroy"

/** A loopback server answering from a script, recording every request; closed with the scope. */
const server = (script: (request: Received, index: number) => Answer) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly url: string; readonly received: Array<Received>; readonly server: Http.Server }>(
      (resume) => {
        const received: Array<Received> = []
        const s = Http.createServer((req, res) => {
          const chunks: Array<Buffer> = []
          req.on("data", (c: Buffer) => chunks.push(c))
          req.on("end", () => {
            const request = {
              method: req.method ?? "",
              path: req.url ?? "",
              headers: req.headers,
              body: Buffer.concat(chunks).toString("utf8")
            }
            const answer = script(request, received.push(request) - 1)
            if (answer === "destroy") return void req.socket.destroy()
            if (answer.body === undefined) return void res.writeHead(answer.status, { "content-length": 0 }).end()
            const text = JSON.stringify(answer.body) + "\n"
            res.writeHead(answer.status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) })
            res.end(text)
          })
        })
        s.listen(0, "127.0.0.1", () =>
          resume(Effect.succeed({
            url: `http://127.0.0.1:${(s.address() as Net.AddressInfo).port}`,
            received,
            server: s
          })))
      }
    ),
    ({ server: s }) =>
      Effect.callback<void>((resume) => {
        s.closeAllConnections()
        s.close(() => resume(Effect.void))
      })
  )

const transports = {
  httpClient: (baseUrl: string) =>
    KernelClient.layer({ baseUrl, secret: Redacted.make(SECRET), stage: "current" }).pipe(
      Layer.provide(NodeHttpClient.layerUndici)
    ),
  undici: (baseUrl: string) => KernelClient.layerUndici({ baseUrl, secret: Redacted.make(SECRET), stage: "current" })
} as const

const withKernel = <A, E>(
  transport: keyof typeof transports,
  script: (request: Received, index: number) => Answer,
  body: (client: KernelClient.KernelClient.Service, received: ReadonlyArray<Received>) => Effect.Effect<A, E>
): Effect.Effect<A, E | unknown, Scope.Scope> =>
  Effect.gen(function*() {
    const s = yield* server(script)
    const context = yield* Layer.build(transports[transport](s.url))
    return yield* body(Context.get(context, KernelClient.KernelClient), s.received)
  })

/** The request carries the lease and a `v1=` signature over exactly these bytes. */
const expectSignedWithLease = (request: Received) =>
  Effect.gen(function*() {
    expect(request.headers["rebuno-agent-id"]).toBe("test-agent")
    expect(request.headers["rebuno-dispatch-id"]).toBe("01920000-0000-7000-8000-000000000001")
    expect(request.headers["rebuno-dispatch-attempt"]).toBe("3")
    expect(request.headers["content-type"]).toBe("application/json")
    const timestamp = String(request.headers["rebuno-timestamp"])
    const valid = yield* Signature.verifyV1(
      SECRET,
      {
        method: request.method,
        target: request.path,
        timestamp,
        dispatchId: "01920000-0000-7000-8000-000000000001",
        dispatchAttempt: "3",
        body: new TextEncoder().encode(request.body)
      },
      String(request.headers["rebuno-signature"]),
      Number(timestamp)
    )
    expect(valid).toBe(true)
  })

const failureOf = <A, E>(exit: Exit.Exit<A, E>): E => {
  if (Exit.isSuccess(exit)) throw new Error("expected a failure")
  const reason = exit.cause.reasons.find(Cause.isFailReason)
  if (reason === undefined) throw new Error(`expected a Fail cause, got ${Cause.pretty(exit.cause)}`)
  return reason.error
}

const registration: KernelClient.ResourceRegistration = {
  key: "workspace",
  driverId: "example.e2b.v1",
  configurationJson: "{\"timeout\":600}",
  coverageReuse: false,
  everySteps: 5,
  onCompletion: true
}

for (const transport of ["httpClient", "undici"] as const) {
  describe(`KernelClient resources over ${transport} (PROTOCOL-CURRENT C.6)`, () => {
    it.live("registerResource: POST …/resources, every member in order, lease and v1; the object decoded", () =>
      withKernel(transport, () => ({ status: 200, body: RESOURCE_WIRE }), (client, received) =>
        Effect.gen(function*() {
          const resource = yield* client.registerResource!(caller, EXEC, registration)
          expect(resource).toEqual({
            key: "workspace",
            driverId: "example.e2b.v1",
            configuration: { timeout: 600 },
            coverageReuse: false,
            everySteps: 5,
            onCompletion: true,
            registeredSeq: 12,
            generation: 5,
            count: 4,
            binding: { sandbox_id: "sbx-1" },
            checkpointRef: "snap-0",
            covered: false
          })
          const request = received[0]!
          expect(request.method).toBe("POST")
          expect(request.path).toBe(`/v0/executions/${EXEC}/resources`)
          expect(request.body).toBe(
            "{\"key\":\"workspace\",\"driver_id\":\"example.e2b.v1\",\"configuration\":{\"timeout\":600}," +
              "\"coverage_reuse\":false,\"every_steps\":5,\"on_completion\":true}"
          )
          expect(JSON.parse(request.body)).toEqual(vectorBody("register_resource"))
          yield* expectSignedWithLease(request)
          // Without a configuration: `null`, as the Python SDK sends it.
          yield* client.registerResource!(caller, EXEC, {
            key: "scratch",
            driverId: "d",
            coverageReuse: true,
            everySteps: 0,
            onCompletion: false
          })
          expect(received[1]!.body).toBe(
            "{\"key\":\"scratch\",\"driver_id\":\"d\",\"configuration\":null,\"coverage_reuse\":true,\"every_steps\":0,\"on_completion\":false}"
          )
        })).pipe(Effect.scoped))

    it.live("a fresh resource decodes with its absent members absent", () =>
      withKernel(
        transport,
        () => ({
          status: 200,
          body: {
            key: "workspace",
            driver_id: "d",
            coverage_reuse: false,
            every_steps: 0,
            on_completion: false,
            registered_seq: 3,
            generation: 0,
            count: 0,
            covered: false
          }
        }),
        (client) =>
          Effect.gen(function*() {
            const resource = yield* client.registerResource!(caller, EXEC, registration)
            expect("binding" in resource).toBe(false)
            expect("configuration" in resource).toBe(false)
            expect("checkpointRef" in resource).toBe(false)
          })
      ).pipe(Effect.scoped))

    it.live("bindResource: POST …/resources/{key}/binding with {\"binding\":…}; 204", () =>
      withKernel(transport, () => ({ status: 204 }), (client, received) =>
        Effect.gen(function*() {
          yield* client.bindResource!(caller, EXEC, "workspace", "{\"sandbox_id\":\"sbx-1\"}")
          const request = received[0]!
          expect(request.path).toBe(`/v0/executions/${EXEC}/resources/workspace/binding`)
          expect(request.body).toBe("{\"binding\":{\"sandbox_id\":\"sbx-1\"}}")
          expect(JSON.parse(request.body)).toEqual(vectorBody("bind_resource"))
          yield* expectSignedWithLease(request)
        })).pipe(Effect.scoped))

    it.live("publishCheckpoints: captures and capture failures, each only when non-empty; {} when none", () =>
      withKernel(transport, () => ({ status: 204 }), (client, received) =>
        Effect.gen(function*() {
          yield* client.publishCheckpoints!(caller, EXEC, {
            captures: [{ key: "workspace", generation: 0, checkpointRef: "snap-0" }],
            captureFailures: [{ key: "db", generation: 2, error: "snapshot timed out" }]
          })
          yield* client.publishCheckpoints!(caller, EXEC, { captures: [], captureFailures: [] })
          yield* client.publishCheckpoints!(caller, EXEC, {
            captureFailures: [{ key: "db", generation: 2, error: "x" }]
          })
          expect(received.map((r) => r.path)).toEqual(
            Array(3).fill(`/v0/executions/${EXEC}/resources/checkpoints`)
          )
          expect(received.map((r) => r.body)).toEqual([
            "{\"captures\":[{\"key\":\"workspace\",\"generation\":0,\"checkpoint_ref\":\"snap-0\"}]," +
            "\"capture_failures\":[{\"key\":\"db\",\"generation\":2,\"error\":\"snapshot timed out\"}]}",
            "{}",
            "{\"capture_failures\":[{\"key\":\"db\",\"generation\":2,\"error\":\"x\"}]}"
          ])
          yield* expectSignedWithLease(received[0]!)
        })).pipe(Effect.scoped))

    it.live("submitStep: `resources` after idempotency when declared; the bytes of old without declarations", () =>
      withKernel(
        transport,
        () => ({ status: 200, body: { decision: "proceed", step_id: STEP, resources: [{ key: "workspace", generation: 5, due: true }] } }),
        (client, received) =>
          Effect.gen(function*() {
            const base = {
              kind: "tool_call",
              target: "send_email",
              argsJson: "{\"to\":\"ops@example.com\"}",
              idempotency: "safe_to_retry"
            } as const
            const decision = yield* client.submitStep(caller, EXEC, { ...base, resources: ["workspace", "db"] })
            expect(decision.resources).toEqual([{ key: "workspace", generation: 5, due: true }])
            yield* client.submitStep(caller, EXEC, base)
            yield* client.submitStep(caller, EXEC, { ...base, resources: [] })
            expect(received.map((r) => r.body)).toEqual([
              "{\"kind\":\"tool_call\",\"target\":\"send_email\",\"args\":{\"to\":\"ops@example.com\"}," +
              "\"idempotency\":\"safe_to_retry\",\"resources\":[\"workspace\",\"db\"]}",
              "{\"kind\":\"tool_call\",\"target\":\"send_email\",\"args\":{\"to\":\"ops@example.com\"},\"idempotency\":\"safe_to_retry\"}",
              "{\"kind\":\"tool_call\",\"target\":\"send_email\",\"args\":{\"to\":\"ops@example.com\"},\"idempotency\":\"safe_to_retry\"}"
            ])
          })
      ).pipe(Effect.scoped))

    it.live("completeStep and failStepJson carry the captures after the outcome (C.6.5)", () =>
      withKernel(transport, () => ({ status: 200, body: { decision: "recorded" } }), (client, received) =>
        Effect.gen(function*() {
          yield* client.completeStep(caller, EXEC, STEP, "\"wrote a.txt\"", {
            captures: [{ key: "workspace", generation: 5, checkpointRef: "snapshot-abc" }]
          })
          yield* client.failStepJson(caller, EXEC, STEP, "{\"message\":\"boom\"}", {
            captures: [{ key: "workspace", generation: 6, checkpointRef: "s2" }],
            captureFailures: [{ key: "db", generation: 3, error: "snapshot timed out" }]
          })
          yield* client.completeStep(caller, EXEC, STEP, "1", {})
          expect(received[0]!.path).toBe(`/v0/executions/${EXEC}/steps/${STEP}/complete`)
          expect(received[0]!.body).toBe(
            "{\"result\":\"wrote a.txt\",\"captures\":[{\"key\":\"workspace\",\"generation\":5,\"checkpoint_ref\":\"snapshot-abc\"}]}"
          )
          expect(JSON.parse(received[0]!.body)).toEqual(vectorBody("complete_step_with_captures"))
          expect(received[1]!.path).toBe(`/v0/executions/${EXEC}/steps/${STEP}/fail`)
          expect(received[1]!.body).toBe(
            "{\"error\":{\"message\":\"boom\"},\"captures\":[{\"key\":\"workspace\",\"generation\":6,\"checkpoint_ref\":\"s2\"}]," +
              "\"capture_failures\":[{\"key\":\"db\",\"generation\":3,\"error\":\"snapshot timed out\"}]}"
          )
          expect(received[2]!.body).toBe("{\"result\":1}")
          yield* expectSignedWithLease(received[0]!)
        })).pipe(Effect.scoped))

    it.live("errors: lease_superseded, execution_terminal, conflict and validation; transport failures retried", () =>
      withKernel(
        transport,
        (_, index) =>
          [
            { status: 409, body: { code: "lease_superseded", message: "dispatch lease superseded" } },
            { status: 409, body: { code: "execution_terminal", message: "execution terminal" } },
            {
              status: 409,
              body: {
                code: "conflict",
                message:
                  "conflict: resource \"workspace\" is registered with another driver, configuration, or coverage_reuse"
              }
            },
            { status: 400, body: { code: "validation_error", message: "validation error: binding is required" } },
            "destroy" as const,
            { status: 503, body: { code: "internal_error", message: "down" } },
            { status: 204 }
          ][index]!,
        (client, received) =>
          Effect.gen(function*() {
            expect(failureOf(yield* Effect.exit(client.registerResource!(caller, EXEC, registration)))).toBeInstanceOf(
              LeaseSuperseded
            )
            expect(failureOf(yield* Effect.exit(client.bindResource!(caller, EXEC, "workspace", "1")))).toBeInstanceOf(
              Terminated
            )
            expect(failureOf(yield* Effect.exit(client.registerResource!(caller, EXEC, registration)))).toMatchObject({
              _tag: "KernelError",
              status: 409,
              code: "conflict"
            })
            expect(failureOf(yield* Effect.exit(client.bindResource!(caller, EXEC, "workspace", "null")))).toMatchObject({
              _tag: "KernelError",
              status: 400,
              code: "validation_error"
            })
            // A dropped connection, then a 503, then the answer: three tries of one call.
            yield* client.publishCheckpoints!(caller, EXEC, {})
            expect(received).toHaveLength(7)
          })
      ).pipe(Effect.scoped))
  })
}

describe("KernelClient resources: a key with characters to escape", () => {
  it.effect("the binding route percent-encodes the key", () => {
    const double = makeDouble(() => noContent())
    return Effect.gen(function*() {
      const client = yield* KernelClient.make({ baseUrl: "http://kernel:8080", secret: SECRET, stage: "current" })
      yield* client.bindResource!(caller, EXEC, "a b", "1")
      expect(double.requests[0]!.url).toBe(`http://kernel:8080/v0/executions/${EXEC}/resources/a%20b/binding`)
    }).pipe(Effect.provide(double.layer))
  })

  it.effect("an unreadable register answer is a KernelError with a DecodeError reason", () => {
    const double = makeDouble(() => jsonAnswer(200, { key: 5 }))
    return Effect.gen(function*() {
      const client = yield* KernelClient.make({ baseUrl: "http://kernel:8080", secret: SECRET, stage: "current" })
      const error = failureOf(yield* Effect.exit(client.registerResource!(caller, EXEC, registration)))
      expect(error).toMatchObject({ _tag: "KernelError", reason: { _tag: "DecodeError" } })
    }).pipe(Effect.provide(double.layer))
  })
})
