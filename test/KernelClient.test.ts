import { describe, expect, it } from "@effect/vitest"
import { Cause, Config, ConfigProvider, Effect, Exit, Fiber, Layer, Redacted, Result } from "effect"
import { TestClock } from "effect/testing"
import * as KernelClient from "../src/KernelClient.js"
import { KernelError, LeaseSuperseded, PolicyError, Terminated } from "../src/RebunoError.js"
import * as Signature from "../src/Signature.js"
import { readFileSync } from "node:fs"
import * as TrackedClock from "../src/testing/internal/trackedClock.js"
import {
  caller,
  DISPATCH,
  EMPTY_SIGNATURE,
  EXEC,
  EXECUTION_WIRE,
  SECRET,
  STEP,
  SUBMIT_SIGNATURE
} from "./support/kernelClientFixtures.js"
import { type Answer, envelope, json, makeDouble, noContent, type Recorded } from "./support/httpDouble.js"

/**
 * Runs `body` on a client over the HTTP double, with a `TrackedClock` over the
 * test's `TestClock` so that the sleeps in flight (backoffs, timeouts) can be read.
 */
const withClient = <A, E>(
  script: (request: Recorded, index: number) => Answer,
  body: (client: KernelClient.KernelClient.Service, requests: ReadonlyArray<Recorded>) => Effect.Effect<A, E>,
  options: Partial<KernelClient.Options> = {}
) => {
  const double = makeDouble(script)
  return Effect.flatMap(
    // Pinned to the seed stage (`sha256=` signatures): the current stage is tested below.
    KernelClient.make({ baseUrl: "http://kernel:8080", secret: Redacted.make(SECRET), stage: "seed", ...options }),
    (client) => body(client, double.requests)
  ).pipe(Effect.provide(double.layer), TrackedClock.tracked)
}

/** Lets real promises (Response bodies) settle between virtual-clock steps. */
const settle = Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))

/** Settles real promises until `done` holds (signing and Response bodies are promise-based). */
const settleUntil = (done: () => boolean) =>
  Effect.gen(function*() {
    // Generous bound: on a loaded machine Web Crypto signing can take many macrotasks.
    for (let i = 0; i < 10_000 && !done(); i++) yield* settle
  })

/** Settles until at least one sleep (e.g. a request timeout) is registered with the (tracked) TestClock. */
const settleUntilSleeping = Effect.gen(function*() {
  for (let i = 0; i < 10_000 && (yield* TrackedClock.pendingSleeps).length === 0; i++) yield* settle
})

/** Runs an effect to completion, moving the TestClock one second whenever it waits on a sleep. */
const driveClock = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.forkChild(effect)
    for (let i = 0; i < 1000; i++) {
      if (fiber.pollUnsafe() !== undefined) break
      yield* settle
      if ((yield* TrackedClock.pendingSleeps).length > 0) yield* TestClock.adjust("1 second")
    }
    return yield* Fiber.await(fiber)
  })

const leaseHeaders = (signature: string, attempt: string | null = "1", contentLength?: number) => ({
  "content-type": "application/json",
  ...(contentLength === undefined ? {} : { "content-length": String(contentLength) }),
  "rebuno-agent-id": "hello",
  "rebuno-signature": signature,
  "rebuno-dispatch-id": DISPATCH,
  ...(attempt === null ? {} : { "rebuno-dispatch-attempt": attempt })
})

const failureOf = <A, E>(exit: Exit.Exit<A, E>): E => {
  if (Exit.isSuccess(exit)) throw new Error("expected a failure")
  const [reason] = exit.cause.reasons
  if (exit.cause.reasons.length !== 1 || reason === undefined || !Cause.isFailReason(reason)) {
    throw new Error(`expected a Fail cause, got ${Cause.pretty(exit.cause)}`)
  }
  return reason.error
}

/** The configuration `entries` as the current `ConfigProvider` (empty strings kept). */
const withEnv = (entries: ReadonlyArray<readonly [string, string]>) =>
  Effect.provideService(
    ConfigProvider.ConfigProvider,
    ConfigProvider.fromUnknown(Object.fromEntries(entries), { preserveEmptyStrings: true })
  )

describe("KernelClient requests", () => {
  it.effect("getExecution: GET, signs the empty body, sends no body and no lease headers", () =>
    withClient(
      () =>
        json(200, { ...EXECUTION_WIRE, unknown_member: 1 }),
      (client, requests) =>
        Effect.gen(function*() {
          const execution = yield* client.getExecution({ agentId: "hello" }, EXEC)
          expect(requests).toHaveLength(1)
          expect(requests[0]!.method).toBe("GET")
          expect(requests[0]!.url).toBe(`http://kernel:8080/v0/executions/${EXEC}`)
          expect(requests[0]!.body).toBeUndefined()
          expect(requests[0]!.headers).toEqual({
            "content-type": "application/json",
            "rebuno-agent-id": "hello",
            "rebuno-signature": EMPTY_SIGNATURE
          })
          expect(execution.id).toBe(EXEC)
          expect(execution.agentId).toBe("hello")
          expect(execution.input).toEqual({ query: "hi" })
          expect(execution.status).toBe("running")
          expect(execution.failureReason).toBe("")
          expect(execution.agentVersion).toBe("")
          expect("output" in execution).toBe(false)
        })
    ))

  it.effect("submitStep: exact body bytes, body signature and lease headers", () =>
    withClient(
      () => json(200, { decision: "proceed", step_id: STEP, rule_id: "r1" }),
      (client, requests) =>
        Effect.gen(function*() {
          const decision = yield* client.submitStep(caller, EXEC, {
            kind: "tool_call",
            target: "web_search",
            argsJson: "{\"query\":\"hello\"}",
            idempotency: "safe_to_retry"
          })
          expect(decision).toEqual({ decision: "proceed", stepId: STEP, ruleId: "r1" })
          const request = requests[0]!
          expect(request.method).toBe("POST")
          expect(request.url).toBe(`http://kernel:8080/v0/executions/${EXEC}/steps`)
          expect(request.text).toBe(
            "{\"kind\":\"tool_call\",\"target\":\"web_search\",\"args\":{\"query\":\"hello\"},\"idempotency\":\"safe_to_retry\"}"
          )
          expect(request.headers).toEqual(leaseHeaders(SUBMIT_SIGNATURE, "1", request.body!.length))
        })
    ))

  it.effect("no Rebuno-Dispatch-Attempt header when the attempt is unknown (v0.14.0)", () =>
    withClient(
      () => json(200, { decision: "proceed", step_id: STEP }),
      (client, requests) =>
        Effect.gen(function*() {
          yield* client.submitStep({ agentId: "hello", lease: { dispatchId: DISPATCH, attempt: undefined } }, EXEC, {
            kind: "tool_call",
            target: "web_search",
            argsJson: "{\"query\":\"hello\"}",
            idempotency: "safe_to_retry"
          })
          expect(requests[0]!.headers).toEqual(leaseHeaders(SUBMIT_SIGNATURE, null, 97))
          expect("rebuno-dispatch-attempt" in requests[0]!.headers).toBe(false)
        })
    ))

  it.effect("heartbeat: zero-length body signed as empty, plain decimal attempt", () =>
    withClient(
      () => noContent(),
      (client, requests) =>
        Effect.gen(function*() {
          yield* client.heartbeat({ agentId: "hello", lease: { dispatchId: DISPATCH, attempt: 12 } }, EXEC)
          const request = requests[0]!
          expect(request.method).toBe("POST")
          expect(request.url).toBe(`http://kernel:8080/v0/executions/${EXEC}/heartbeat`)
          expect(request.body).toBeInstanceOf(Uint8Array)
          expect(request.body!.length).toBe(0)
          expect(request.headers).toEqual(leaseHeaders(EMPTY_SIGNATURE, "12"))
        })
    ))

  it.effect("bodies of complete/fail step, delta, complete/fail execution", () =>
    withClient(
      (request) =>
        request.url.endsWith("/complete") && request.url.includes("/steps/")
          ? json(200, { decision: "recorded" })
          : request.url.endsWith("/fail") && request.url.includes("/steps/")
          ? json(200, { decision: "replay", error: { message: "old" } })
          : noContent(),
      (client, requests) =>
        Effect.gen(function*() {
          const completed = yield* client.completeStep(caller, EXEC, STEP, "{\"hits\":3}")
          const failed = yield* client.failStep(caller, EXEC, STEP, "boom \"quoted\" <tag>")
          yield* client.publishDelta(caller, EXEC, STEP, 3, "partial\ntext")
          yield* client.completeExecution(caller, EXEC, undefined)
          yield* client.completeExecution(caller, EXEC, "{\"answer\":42}")
          yield* client.failExecution(caller, EXEC, "handler crashed")
          expect(completed).toEqual({ decision: "recorded" })
          expect(failed).toEqual({ decision: "replay", error: { message: "old" } })
          expect(requests.map((r) => [r.url.replace(`http://kernel:8080/v0/executions/${EXEC}`, ""), r.text]))
            .toEqual([
              [`/steps/${STEP}/complete`, "{\"result\":{\"hits\":3}}"],
              [`/steps/${STEP}/fail`, "{\"error\":{\"message\":\"boom \\\"quoted\\\" <tag>\"}}"],
              [`/steps/${STEP}/stream`, "{\"seq\":3,\"data\":\"partial\\ntext\"}"],
              ["/complete", "{}"],
              ["/complete", "{\"output\":{\"answer\":42}}"],
              ["/fail", "{\"error\":\"handler crashed\"}"]
            ])
          for (const request of requests) {
            expect(request.method).toBe("POST")
            expect(request.headers["rebuno-dispatch-id"]).toBe(DISPATCH)
            expect(request.headers["rebuno-dispatch-attempt"]).toBe("1")
            expect(request.headers["content-type"]).toBe("application/json")
            expect(request.headers["rebuno-signature"]).toMatch(/^sha256=[0-9a-f]{64}$/)
          }
        })
    ))

  it.effect("a decision answer is returned as is, even execution_terminal", () =>
    withClient(
      () => json(200, { decision: "execution_terminal" }),
      (client) =>
        Effect.gen(function*() {
          expect(yield* client.completeStep(caller, EXEC, STEP, "null")).toEqual({ decision: "execution_terminal" })
        })
    ))

  it.effect("base URL: trailing slashes stripped, path prefix kept", () =>
    withClient(
      () => noContent(),
      (client, requests) =>
        Effect.gen(function*() {
          yield* client.heartbeat(caller, EXEC)
          expect(requests[0]!.url).toBe(`http://kernel:8080/rebuno/api/v0/executions/${EXEC}/heartbeat`)
        }),
      { baseUrl: "http://kernel:8080/rebuno/api///" }
    ))

  it.effect("the service exposes the secret only as a Redacted value", () =>
    withClient(
      () => noContent(),
      (client) =>
        Effect.sync(() => {
          expect(Redacted.isRedacted(client.secret)).toBe(true)
          expect(String(client.secret)).not.toContain(SECRET)
          expect(Redacted.value(client.secret)).toBe(SECRET)
        }),
      { secret: SECRET }
    ))
})

describe("KernelClient error mapping (PROTOCOL.md 13.3)", () => {
  const submission: KernelClient.StepSubmission = {
    kind: "tool_call",
    target: "t",
    argsJson: "{}",
    idempotency: "safe_to_retry"
  }
  const submitAnswering = (answer: () => Response) =>
    withClient(answer, (client) => Effect.exit(client.submitStep(caller, EXEC, submission)))

  it.effect("409 lease_superseded → LeaseSuperseded", () =>
    Effect.gen(function*() {
      const error = failureOf(
        yield* submitAnswering(() => envelope(409, "lease_superseded", "dispatch lease superseded"))
      )
      expect(error).toBeInstanceOf(LeaseSuperseded)
    }))

  it.effect("409 execution_terminal → Terminated", () =>
    Effect.gen(function*() {
      const error = failureOf(yield* submitAnswering(() => envelope(409, "execution_terminal", "execution terminal")))
      expect(error).toBeInstanceOf(Terminated)
    }))

  it.effect("policy_denied → PolicyError with the message and rule id", () =>
    Effect.gen(function*() {
      const error = failureOf(
        yield* submitAnswering(() => envelope(403, "policy_denied", "no emails", { rule_id: "block-email" }))
      )
      expect(error).toBeInstanceOf(PolicyError)
      expect(error).toMatchObject({ reason: "no emails", ruleId: "block-email" })
    }))

  it.effect("policy_denied without a message → \"denied by policy\"", () =>
    Effect.gen(function*() {
      const error = failureOf(yield* submitAnswering(() => envelope(403, "policy_denied", "")))
      expect(error).toMatchObject({ _tag: "PolicyError", reason: "denied by policy" })
    }))

  it.effect.each([
    [400, "validation_error", "validation error: bad or missing Rebuno-Dispatch-Attempt"],
    [401, "unauthorized", "unauthorized"],
    [403, "forbidden", "forbidden"],
    [404, "not_found", "not found"],
    [409, "conflict", "conflict"],
    [418, "teapot", "short and stout"]
  ] as const)("%s %s → KernelError Status with code and status", ([status, code, message]) =>
    Effect.gen(function*() {
      const error = failureOf(yield* submitAnswering(() => envelope(status, code, message)))
      expect(error).toBeInstanceOf(KernelError)
      expect(error).toMatchObject({ reason: { _tag: "StatusError", status, code, description: message } })
      expect(KernelClient.isTransportFailure(error)).toBe(false)
    }))

  it.effect("non-JSON error body → internal_error with the body text", () =>
    Effect.gen(function*() {
      const error = failureOf(
        yield* submitAnswering(() =>
          new Response("404 page not found\n", { status: 404, headers: { "content-type": "text/plain" } })
        )
      )
      expect(error).toMatchObject({
        _tag: "KernelError",
        reason: { _tag: "StatusError", status: 404, code: "internal_error", description: "404 page not found" }
      })
    }))

  it.effect("empty error body → internal_error \"request failed\"", () =>
    Effect.gen(function*() {
      const error = failureOf(yield* submitAnswering(() => new Response(null, { status: 405 })))
      expect(error).toMatchObject({ reason: { status: 405, code: "internal_error", description: "request failed" } })
    }))

  it.effect("JSON error body without code → internal_error with the body text", () =>
    Effect.gen(function*() {
      const error = failureOf(yield* submitAnswering(() => json(400, { message: "nope" })))
      expect(error).toMatchObject({
        reason: { status: 400, code: "internal_error", description: "{\"message\":\"nope\"}" }
      })
    }))

  it.effect("redirects are not followed: a 3xx is an error after exactly one request", () =>
    withClient(
      () => new Response(null, { status: 307, headers: { location: "http://elsewhere/" } }),
      (client, requests) =>
        Effect.gen(function*() {
          const error = failureOf(yield* Effect.exit(client.completeStep(caller, EXEC, STEP, "1")))
          expect(error).toMatchObject({ _tag: "KernelError", reason: { _tag: "StatusError", status: 307 } })
          expect(requests).toHaveLength(1)
        })
    ))

  it.effect("execution_terminal on heartbeat is a plain Status error; lease_superseded is LeaseSuperseded", () =>
    withClient(
      (_, index) =>
        index === 0
          ? envelope(409, "execution_terminal", "execution terminal")
          : envelope(409, "lease_superseded", "dispatch lease superseded"),
      (client) =>
        Effect.gen(function*() {
          const first = failureOf(yield* Effect.exit(client.heartbeat(caller, EXEC)))
          expect(first).toMatchObject({ _tag: "KernelError", status: 409, code: "execution_terminal" })
          const second = failureOf(yield* Effect.exit(client.heartbeat(caller, EXEC)))
          expect(second).toBeInstanceOf(LeaseSuperseded)
        })
    ))

  it.effect("complete/fail step: execution_terminal envelope → Terminated, lease_superseded → LeaseSuperseded", () =>
    withClient(
      (_, index) =>
        index === 0
          ? envelope(409, "execution_terminal", "execution terminal")
          : envelope(409, "lease_superseded", "dispatch lease superseded"),
      (client) =>
        Effect.gen(function*() {
          expect(failureOf(yield* Effect.exit(client.completeStep(caller, EXEC, STEP, "1")))).toBeInstanceOf(
            Terminated
          )
          expect(failureOf(yield* Effect.exit(client.failStep(caller, EXEC, STEP, "x")))).toBeInstanceOf(
            LeaseSuperseded
          )
        })
    ))

  it.effect("undecodable success answers → KernelError Decode", () =>
    withClient(
      (_, index) => (index === 0 ? new Response("not json", { status: 200 }) : json(200, { nope: true })),
      (client) =>
        Effect.gen(function*() {
          const first = failureOf(yield* Effect.exit(client.submitStep(caller, EXEC, submission)))
          expect(first).toMatchObject({ _tag: "KernelError", reason: { _tag: "DecodeError", status: 200 } })
          const second = failureOf(yield* Effect.exit(client.submitStep(caller, EXEC, submission)))
          expect(second).toMatchObject({ _tag: "KernelError", reason: { _tag: "DecodeError" } })
        })
    ))

  it.effect("the secret never appears in an error's message, toString or JSON", () =>
    withClient(
      (_, index) => (index === 0 ? "transport" : envelope(401, "unauthorized", "unauthorized")),
      (client) =>
        Effect.gen(function*() {
          const errors = [
            failureOf(yield* Effect.exit(client.submitStep(caller, EXEC, submission))),
            failureOf(yield* Effect.exit(client.submitStep(caller, EXEC, submission)))
          ]
          for (const error of errors) {
            expect(error.message).not.toContain(SECRET)
            expect(String(error)).not.toContain(SECRET)
            expect(JSON.stringify(error)).not.toContain(SECRET)
            expect(JSON.stringify(error.toJSON())).not.toContain(SECRET)
          }
        })
    ))
})

describe("KernelClient retries (PROTOCOL.md 15.1)", () => {
  const submission: KernelClient.StepSubmission = {
    kind: "tool_call",
    target: "t",
    argsJson: "{}",
    idempotency: "at_most_once"
  }

  it.effect("completeStep is retried after a 503 and then succeeds", () =>
    withClient(
      (_, index) => (index === 0 ? envelope(503, "internal_error", "unavailable") : json(200, { decision: "recorded" })),
      (client, requests) =>
        Effect.gen(function*() {
          const exit = yield* driveClock(client.completeStep(caller, EXEC, STEP, "1"))
          expect(exit).toEqual(Exit.succeed({ decision: "recorded" }))
          expect(requests).toHaveLength(2)
          expect(requests[1]!.text).toBe(requests[0]!.text)
          expect(requests[1]!.headers).toEqual(requests[0]!.headers)
        })
    ))

  it.effect("completeStep gives up after four tries with backoff on Effect's clock", () =>
    withClient(
      () => "transport",
      (client, requests) =>
        Effect.gen(function*() {
          const fiber = yield* Effect.forkChild(client.failStep(caller, EXEC, STEP, "x"))
          yield* settleUntil(() => requests.length === 1)
          expect(requests).toHaveLength(1)
          yield* TestClock.adjust("99 millis")
          yield* settle
          expect(requests).toHaveLength(1)
          yield* TestClock.adjust("1 millis")
          yield* settleUntil(() => requests.length === 2)
          expect(requests).toHaveLength(2)
          yield* TestClock.adjust("200 millis")
          yield* settleUntil(() => requests.length === 3)
          expect(requests).toHaveLength(3)
          yield* TestClock.adjust("400 millis")
          yield* settleUntil(() => requests.length === 4)
          const error = failureOf(yield* Fiber.await(fiber))
          expect(requests).toHaveLength(4)
          expect(error).toMatchObject({ _tag: "KernelError", reason: { _tag: "TransportError" } })
          expect(KernelClient.isTransportFailure(error)).toBe(true)
        })
    ))

  it.effect("getExecution is retried on transport failures", () =>
    withClient(
      (_, index) => (index < 2 ? "transport" : json(200, { id: EXEC, status: "running", input: null })),
      (client, requests) =>
        Effect.gen(function*() {
          const exit = yield* driveClock(client.getExecution(caller, EXEC))
          expect(Exit.isSuccess(exit)).toBe(true)
          expect(requests).toHaveLength(3)
        })
    ))

  it.effect("4xx answers are not retried", () =>
    withClient(
      () => envelope(404, "not_found", "not found"),
      (client, requests) =>
        Effect.gen(function*() {
          const exit = yield* driveClock(client.completeStep(caller, EXEC, STEP, "1"))
          expect(failureOf(exit)).toMatchObject({ status: 404, code: "not_found" })
          expect(requests).toHaveLength(1)
        })
    ))

  it.effect("submitStep is never retried after a 503: exactly one request", () =>
    withClient(
      () => envelope(503, "internal_error", "unavailable"),
      (client, requests) =>
        Effect.gen(function*() {
          const exit = yield* driveClock(client.submitStep(caller, EXEC, submission))
          const error = failureOf(exit)
          expect(error).toMatchObject({ _tag: "KernelError", reason: { _tag: "StatusError", status: 503 } })
          expect(KernelClient.isTransportFailure(error)).toBe(true)
          yield* TestClock.adjust("1 minute")
          expect(requests).toHaveLength(1)
        })
    ))

  it.effect("submitStep is never retried after a transport failure: exactly one request", () =>
    withClient(
      () => "transport",
      (client, requests) =>
        Effect.gen(function*() {
          const exit = yield* driveClock(client.submitStep(caller, EXEC, submission))
          const error = failureOf(exit)
          expect(error).toMatchObject({ _tag: "KernelError", reason: { _tag: "TransportError" } })
          expect((error as KernelError).reason.description).toContain("ECONNREFUSED")
          yield* TestClock.adjust("1 minute")
          expect(requests).toHaveLength(1)
        })
    ))

  it.effect("heartbeat is not retried", () =>
    withClient(
      () => envelope(503, "internal_error", "unavailable"),
      (client, requests) =>
        Effect.gen(function*() {
          const exit = yield* driveClock(client.heartbeat(caller, EXEC))
          expect(failureOf(exit)).toMatchObject({ status: 503 })
          expect(requests).toHaveLength(1)
        })
    ))

  it.effect("publishDelta swallows every error and is not retried", () =>
    withClient(
      (_, index) => (index === 0 ? "transport" : envelope(400, "validation_error", "validation error")),
      (client, requests) =>
        Effect.gen(function*() {
          expect(yield* driveClock(client.publishDelta(caller, EXEC, STEP, 0, "a"))).toEqual(Exit.void)
          expect(yield* driveClock(client.publishDelta(caller, EXEC, STEP, 1, "b"))).toEqual(Exit.void)
          expect(requests).toHaveLength(2)
        })
    ))

  it.effect("completeExecution: 409 execution_terminal counts as success", () =>
    withClient(
      () => envelope(409, "execution_terminal", "execution terminal"),
      (client, requests) =>
        Effect.gen(function*() {
          yield* client.completeExecution(caller, EXEC, "1")
          yield* client.failExecution(caller, EXEC, "x")
          expect(requests).toHaveLength(2)
        })
    ))

  it.effect("completeExecution: retried after a lost answer, then 409 execution_terminal = success", () =>
    withClient(
      (_, index) => (index === 0 ? "transport" : envelope(409, "execution_terminal", "execution terminal")),
      (client, requests) =>
        Effect.gen(function*() {
          expect(yield* driveClock(client.completeExecution(caller, EXEC, "{\"ok\":true}"))).toEqual(Exit.void)
          expect(requests).toHaveLength(2)
        })
    ))

  it.effect("completeExecution: lease_superseded is LeaseSuperseded", () =>
    withClient(
      () => envelope(409, "lease_superseded", "dispatch lease superseded"),
      (client) =>
        Effect.gen(function*() {
          const error = failureOf(yield* Effect.exit(client.completeExecution(caller, EXEC, undefined)))
          expect(error).toBeInstanceOf(LeaseSuperseded)
        })
    ))
})

describe("KernelClient timeouts", () => {
  it.effect("a request that never answers fails with a Transport error after 35 s", () =>
    withClient(
      () => "never",
      (client, requests) =>
        Effect.gen(function*() {
          const fiber = yield* Effect.forkChild(client.heartbeat(caller, EXEC))
          yield* settleUntil(() => requests.length === 1)
          yield* settleUntilSleeping
          yield* TestClock.adjust("34999 millis")
          yield* settle
          expect(fiber.pollUnsafe()).toBeUndefined()
          yield* TestClock.adjust("1 millis")
          const error = failureOf(yield* Fiber.await(fiber))
          expect(error).toMatchObject({ _tag: "KernelError", reason: { _tag: "TransportError" } })
          expect((error as KernelError).reason.description).toContain("timed out")
          expect(KernelClient.isTransportFailure(error)).toBe(true)
          expect(requests).toHaveLength(1)
        })
    ))

  it.effect("the timeout is configurable, and a timed-out submit is not retried", () =>
    withClient(
      () => "never",
      (client, requests) =>
        Effect.gen(function*() {
          const fiber = yield* Effect.forkChild(
            client.submitStep(caller, EXEC, { kind: "local", target: "x", argsJson: "null", idempotency: "safe_to_retry" })
          )
          yield* settleUntil(() => requests.length === 1)
          yield* settleUntilSleeping
          yield* TestClock.adjust("2 seconds")
          const error = failureOf(yield* Fiber.await(fiber))
          expect(error).toMatchObject({ _tag: "KernelError", reason: { _tag: "TransportError" } })
          yield* TestClock.adjust("1 minute")
          expect(requests).toHaveLength(1)
        }),
      { timeout: "2 seconds" }
    ))
})

describe("KernelClient v1 signatures (PROTOCOL.md 17.B)", () => {
  const v1Lease: KernelClient.Caller = {
    agentId: "hello",
    lease: { dispatchId: "01920000-0000-7000-8000-000000000001", attempt: 3 }
  }
  const v1 = { secret: "test-secret", signing: "v1" as const }

  it.effect("empty read: GET with a v1 signature and timestamp", () =>
    withClient(
      () => json(200, { id: "alpha", status: "running", input: null }),
      (client, requests) =>
        Effect.gen(function*() {
          yield* TestClock.setTime(1_700_000_000_000)
          yield* client.getExecution({ agentId: "hello" }, "alpha")
          expect(requests[0]!.headers).toEqual({
            "content-type": "application/json",
            "rebuno-agent-id": "hello",
            "rebuno-timestamp": "1700000000",
            "rebuno-signature": "v1=d0f262ef4226bcdf886ec35a7ce4cf77286055b563078faca8b307caa8ca5839"
          })
        }),
      v1
    ))

  it.effect("heartbeat vector", () =>
    withClient(
      () => noContent(),
      (client, requests) =>
        Effect.gen(function*() {
          yield* TestClock.setTime(1_700_000_000_000)
          yield* client.heartbeat(v1Lease, "alpha")
          expect(requests[0]!.headers["rebuno-signature"]).toBe(
            "v1=63a3e161395bd65728afa785799ddb9e52c01f8e0a61d1d6a4089f582d334b0e"
          )
          expect(requests[0]!.headers["rebuno-dispatch-attempt"]).toBe("3")
        }),
      v1
    ))

  it.effect("submit vector", () =>
    withClient(
      () => json(200, { decision: "proceed", step_id: STEP }),
      (client, requests) =>
        Effect.gen(function*() {
          yield* TestClock.setTime(1_700_000_000_000)
          yield* client.submitStep(v1Lease, "018f3a2b-4c5d-7e6f-8a9b-0c1d2e3f4a5b", {
            kind: "tool_call",
            target: "send_email",
            argsJson: "{\"to\":\"ops@example.com\"}",
            idempotency: "safe_to_retry"
          })
          expect(requests[0]!.headers["rebuno-signature"]).toBe(
            "v1=017dff4039ba40e90d3d8d566fdf51db427672f92d45ef41b738672238ea0058"
          )
        }),
      v1
    ))

  it.effect("the target includes the base-URL path prefix; each retry gets a fresh timestamp", () =>
    withClient(
      (_, index) => (index === 0 ? "transport" : json(200, { decision: "recorded" })),
      (client, requests) =>
        Effect.gen(function*() {
          // The retry waits 100 ms and so crosses into the next second.
          yield* TestClock.setTime(1_700_000_000_900)
          yield* driveClock(client.completeStep(v1Lease, "alpha", STEP, "1"))
          expect(requests).toHaveLength(2)
          expect(requests[0]!.url).toBe(`http://kernel:8080/prefix/v0/executions/alpha/steps/${STEP}/complete`)
          expect(requests[0]!.headers["rebuno-timestamp"]).toBe("1700000000")
          expect(requests[1]!.headers["rebuno-timestamp"]).toBe("1700000001")
          expect(requests[1]!.headers["rebuno-signature"]).not.toBe(requests[0]!.headers["rebuno-signature"])
        }),
      { ...v1, baseUrl: "http://kernel:8080/prefix/" }
    ))
})

describe("KernelClient layers", () => {
  const double = makeDouble(() => noContent())
  const heartbeat = Effect.flatMap(KernelClient.KernelClient, (client) => client.heartbeat(caller, EXEC))

  it.effect("layerConfig reads REBUNO_URL and REBUNO_AGENT_SECRET", () =>
    Effect.gen(function*() {
      const secret = yield* Effect.gen(function*() {
        const client = yield* KernelClient.KernelClient
        yield* client.heartbeat(caller, EXEC)
        return client.secret
      }).pipe(
        Effect.provide(KernelClient.layerConfig().pipe(Layer.provide(double.layer))),
        withEnv([["REBUNO_URL", "http://env-kernel:9000/"], ["REBUNO_AGENT_SECRET", SECRET], ["REBUNO_STAGE", "seed"]])
      )
      const request = double.requests[double.requests.length - 1]!
      expect(request.url).toBe(`http://env-kernel:9000/v0/executions/${EXEC}/heartbeat`)
      expect(request.headers["rebuno-signature"]).toBe(EMPTY_SIGNATURE)
      // The environment holds a string; the service holds it as a Redacted (Effect 4's
      // `Schema.Redacted` decodes a Redacted value, so this catches a config read the wrong way).
      expect(Redacted.isRedacted(secret)).toBe(true)
      expect(Redacted.value(secret)).toBe(SECRET)
      expect(String(secret)).not.toContain(SECRET)
    }))

  it.effect("options win over the environment", () =>
    Effect.gen(function*() {
      yield* heartbeat.pipe(
        Effect.provide(
          KernelClient.layerConfig({ baseUrl: "http://option-kernel" }).pipe(Layer.provide(double.layer))
        ),
        withEnv([["REBUNO_URL", "http://env-kernel:9000"], ["REBUNO_AGENT_SECRET", SECRET]])
      )
      expect(double.requests[double.requests.length - 1]!.url).toBe(
        `http://option-kernel/v0/executions/${EXEC}/heartbeat`
      )
    }))

  it.effect.each([
    ["missing secret", [["REBUNO_URL", "http://k"]]],
    ["empty secret", [["REBUNO_URL", "http://k"], ["REBUNO_AGENT_SECRET", ""]]],
    ["missing URL", [["REBUNO_AGENT_SECRET", SECRET]]],
    ["empty URL", [["REBUNO_URL", ""], ["REBUNO_AGENT_SECRET", SECRET]]]
  ] as const)("layerConfig fails fast: %s", ([, env]) =>
    Effect.gen(function*() {
      const exit = yield* heartbeat.pipe(
        Effect.provide(KernelClient.layerConfig().pipe(Layer.provide(double.layer))),
        withEnv(env),
        Effect.exit
      )
      const error = failureOf(exit)
      expect(error).toBeInstanceOf(Config.ConfigError)
      expect(JSON.stringify(error)).not.toContain(SECRET)
    }))

  it.effect("layer rejects an empty secret and a bad base URL", () =>
    Effect.gen(function*() {
      for (const options of [
        { baseUrl: "http://k", secret: "" },
        { baseUrl: "http://k", secret: Redacted.make("") },
        { baseUrl: "not a url", secret: SECRET },
        { baseUrl: "ftp://k", secret: SECRET },
        { baseUrl: "   ", secret: SECRET }
      ]) {
        const exit = yield* heartbeat.pipe(
          Effect.provide(KernelClient.layer(options).pipe(Layer.provide(double.layer))),
          Effect.exit
        )
        expect(Exit.isFailure(exit)).toBe(true)
        expect(Result.isFailure(Result.fail(failureOf(exit)))).toBe(true)
      }
    }))
})

// ---------------------------------------------------------------------------
// The current stage (PROTOCOL-CURRENT C.2–C.5, C.13)
// ---------------------------------------------------------------------------

interface CurrentVector {
  readonly name: string
  readonly secret: string
  readonly method: string
  readonly target: string
  readonly body: string
  readonly timestamp: string
  readonly dispatch_id: string
  readonly dispatch_attempt: string
  readonly signature: string
}
const currentVectors = (JSON.parse(
  readFileSync(new URL("../../shared/fixtures/current-vectors.json", import.meta.url), "utf8")
) as { readonly v1_requests: ReadonlyArray<CurrentVector> }).v1_requests
const vector = (name: string) => currentVectors.find((v) => v.name === name)!

/** The C.14 vectors' execution and lease. */
const VECTOR_EXEC = "018f3a2b-4c5d-7e6f-8a9b-0c1d2e3f4a5b"
const vectorLease: KernelClient.Caller = {
  agentId: "test-agent",
  lease: { dispatchId: "01920000-0000-7000-8000-000000000001", attempt: 3 }
}

/** A client with the default stage (`auto`) over the double. */
const withCurrent = <A, E>(
  script: (request: Recorded, index: number) => Answer,
  body: (client: KernelClient.KernelClient.Service, requests: ReadonlyArray<Recorded>) => Effect.Effect<A, E>,
  options: Partial<KernelClient.Options> = {}
) => {
  const double = makeDouble(script)
  return Effect.flatMap(
    KernelClient.make({ baseUrl: "http://kernel:8080", secret: "test-secret", ...options }),
    (client) => body(client, double.requests)
  ).pipe(Effect.provide(double.layer), TrackedClock.tracked)
}

/** Does the request carry a valid `v1=` signature (at the TestClock's time)? */
const isV1 = (request: Recorded, secret = "test-secret") =>
  Effect.gen(function*() {
    const signature = request.headers["rebuno-signature"] ?? ""
    if (!signature.startsWith("v1=")) return false
    const url = new URL(request.url)
    return yield* Signature.verifyV1(
      secret,
      {
        method: request.method,
        target: url.pathname + url.search,
        timestamp: request.headers["rebuno-timestamp"] ?? "",
        dispatchId: request.headers["rebuno-dispatch-id"] ?? "",
        dispatchAttempt: request.headers["rebuno-dispatch-attempt"] ?? "",
        body: request.body ?? new Uint8Array(0)
      },
      signature,
      Number(request.headers["rebuno-timestamp"])
    )
  })

const unauthorized = () => envelope(401, "unauthorized", "unauthorized")

describe("KernelClient, current stage: v1 by default (C.2.1)", () => {
  it.effect("every call is signed v1= with a timestamp; sha256= is never sent", () =>
    withCurrent(
      (request) =>
        request.method === "GET" ?
          json(200, EXECUTION_WIRE) :
          request.url.endsWith("/steps") ?
          json(200, { decision: "proceed", step_id: STEP }) :
          request.url.includes("/steps/") ?
          json(200, { decision: "recorded" }) :
          noContent(),
      (client, requests) =>
        Effect.gen(function*() {
          yield* TestClock.setTime(1_700_000_123_000)
          yield* client.getExecution({ agentId: "hello" }, EXEC)
          yield* client.submitStep(caller, EXEC, {
            kind: "tool_call",
            target: "web_search",
            argsJson: "{\"query\":\"hello\"}",
            idempotency: "safe_to_retry"
          })
          yield* client.completeStep(caller, EXEC, STEP, "1")
          yield* client.heartbeat(caller, EXEC)
          yield* client.completeExecution(caller, EXEC, "1")
          expect(requests).toHaveLength(5)
          for (const request of requests) {
            expect(request.headers["rebuno-timestamp"]).toBe("1700000123")
            expect(yield* isV1(request)).toBe(true)
          }
          expect(yield* client.signingScheme!).toBe("v1")
        })
    ))

  it.effect("stage current and signing v1 sign v1=; stage seed and v0.14.0 sign sha256=", () =>
    Effect.gen(function*() {
      for (const [options, scheme] of [
        [{ stage: "current" }, "v1"],
        [{ signing: "v1" }, "v1"],
        [{ stage: "seed" }, "sha256"],
        [{ stage: "v0.14.0" }, "sha256"],
        [{ stage: "current", signing: "sha256" }, "sha256"]
      ] as const) {
        yield* withCurrent(
          () => noContent(),
          (client, requests) =>
            Effect.gen(function*() {
              yield* client.heartbeat(caller, EXEC)
              expect(requests[0]!.headers["rebuno-signature"]!.startsWith(`${scheme}=`)).toBe(true)
              expect("rebuno-timestamp" in requests[0]!.headers).toBe(scheme === "v1")
              expect(yield* client.signingScheme!).toBe(scheme)
            }),
          options
        )
      }
    }))

  it.effect("an unknown stage is a ConfigError", () =>
    Effect.gen(function*() {
      const exit = yield* Effect.exit(
        KernelClient.make({ baseUrl: "http://k", secret: SECRET, stage: "v2" as KernelClient.Stage }).pipe(
          Effect.provide(makeDouble(() => noContent()).layer)
        )
      )
      expect(failureOf(exit)).toBeInstanceOf(Config.ConfigError)
    }))
})

describe("KernelClient, current stage: the new calls and the C.14 vectors", () => {
  it.effect("previous: GET …/previous, no lease headers, the vector's signature; answers the state", () =>
    withCurrent(
      () => json(200, { state: { messages: ["hi"] } }),
      (client, requests) =>
        Effect.gen(function*() {
          yield* TestClock.setTime(1_700_000_000_000)
          expect(yield* client.previous!({ agentId: "test-agent" }, VECTOR_EXEC)).toEqual({ messages: ["hi"] })
          const v = vector("previous_get")
          expect(requests[0]!.method).toBe(v.method)
          expect(new URL(requests[0]!.url).pathname).toBe(v.target)
          expect(requests[0]!.body).toBeUndefined()
          expect(requests[0]!.headers).toEqual({
            "content-type": "application/json",
            "rebuno-agent-id": "test-agent",
            "rebuno-timestamp": v.timestamp,
            "rebuno-signature": v.signature
          })
        })
    ))

  it.effect("previous: null state, a missing member, 404 and 403 (C.4.6)", () =>
    withCurrent(
      (_, index) =>
        [
          json(200, { state: null }),
          json(200, {}),
          new Response("404 page not found\n", { status: 404, headers: { "content-type": "text/plain" } }),
          envelope(403, "forbidden", "forbidden")
        ][index]!,
      (client) =>
        Effect.gen(function*() {
          expect(yield* client.previous!({ agentId: "hello" }, EXEC)).toBeNull()
          expect(yield* client.previous!({ agentId: "hello" }, EXEC)).toBeNull()
          const notFound = failureOf(yield* Effect.exit(client.previous!({ agentId: "hello" }, EXEC)))
          expect(notFound).toMatchObject({ status: 404, code: "internal_error" })
          const forbidden = failureOf(yield* Effect.exit(client.previous!({ agentId: "hello" }, EXEC)))
          expect(forbidden).toMatchObject({ status: 403, code: "forbidden" })
        })
    ))

  it.effect("suspend: POST …/suspend with the lease and an empty body; the vector's signature (C.5.2)", () =>
    withCurrent(
      (_, index) => json(200, { suspended: index === 0 }),
      (client, requests) =>
        Effect.gen(function*() {
          yield* TestClock.setTime(1_700_000_000_000)
          expect(yield* client.suspend!(vectorLease, VECTOR_EXEC)).toBe(true)
          expect(yield* client.suspend!(vectorLease, VECTOR_EXEC)).toBe(false)
          const v = vector("suspend")
          expect(new URL(requests[0]!.url).pathname).toBe(v.target)
          expect(requests[0]!.method).toBe("POST")
          expect(requests[0]!.text).toBe("")
          expect(requests[0]!.headers).toEqual({
            "content-type": "application/json",
            "rebuno-agent-id": "test-agent",
            "rebuno-timestamp": v.timestamp,
            "rebuno-signature": v.signature,
            "rebuno-dispatch-id": v.dispatch_id,
            "rebuno-dispatch-attempt": v.dispatch_attempt
          })
        })
    ))

  it.effect("suspend: lease_superseded, execution_terminal, other errors, and retries after a transport failure", () =>
    withCurrent(
      (_, index) =>
        [
          envelope(409, "lease_superseded", "lease superseded"),
          envelope(409, "execution_terminal", "execution terminal"),
          envelope(409, "conflict", "conflict: x"),
          "transport" as const,
          json(200, { suspended: true })
        ][index]!,
      (client, requests) =>
        Effect.gen(function*() {
          expect(failureOf(yield* Effect.exit(client.suspend!(caller, EXEC)))).toBeInstanceOf(LeaseSuperseded)
          expect(failureOf(yield* Effect.exit(client.suspend!(caller, EXEC)))).toBeInstanceOf(Terminated)
          expect(failureOf(yield* Effect.exit(client.suspend!(caller, EXEC)))).toMatchObject({
            _tag: "KernelError",
            status: 409,
            code: "conflict"
          })
          expect(yield* driveClock(client.suspend!(caller, EXEC))).toEqual(Exit.succeed(true))
          expect(requests).toHaveLength(5)
        })
    ))

  it.effect("getStep: GET …/steps/{step_id}, agent-signed, decoded", () =>
    withCurrent(
      () =>
        json(200, {
          step_id: STEP,
          execution_id: EXEC,
          kind: "tool_call",
          target: "summarizer",
          status: "succeeded",
          result: { summary: "s" }
        }),
      (client, requests) =>
        Effect.gen(function*() {
          const step = yield* client.getStep!({ agentId: "hello" }, EXEC, STEP)
          expect(step).toMatchObject({ stepId: STEP, status: "succeeded", result: { summary: "s" } })
          expect(requests[0]!.method).toBe("GET")
          expect(requests[0]!.url).toBe(`http://kernel:8080/v0/executions/${EXEC}/steps/${STEP}`)
          expect("rebuno-dispatch-id" in requests[0]!.headers).toBe(false)
          expect(yield* isV1(requests[0]!)).toBe(true)
        })
    ))

  it.effect("publishMetadata: PUT /v0/agents/{id}/metadata, every member present, no lease headers (C.3.1)", () =>
    withCurrent(
      (_, index) =>
        index === 0 ? noContent() : new Response("404 page not found\n", { status: 404 }),
      (client, requests) =>
        Effect.gen(function*() {
          yield* TestClock.setTime(1_700_000_000_000)
          yield* client.publishMetadata!("test-agent", {
            description: "Answers questions",
            inputSchema: null,
            outputSchema: null
          })
          const request = requests[0]!
          expect(request.method).toBe("PUT")
          expect(request.url).toBe("http://kernel:8080/v0/agents/test-agent/metadata")
          expect(request.text).toBe("{\"description\":\"Answers questions\",\"input_schema\":null,\"output_schema\":null}")
          expect(Object.keys(request.headers).sort()).toEqual([
            "content-length",
            "content-type",
            "rebuno-agent-id",
            "rebuno-signature",
            "rebuno-timestamp"
          ])
          expect(yield* isV1(request)).toBe(true)
          // The vector signs the Python SDK's bytes; the same signer over those bytes gives the vector.
          const v = vector("metadata_put")
          expect(yield* Signature.signV1(v.secret, { ...v, dispatchId: "", dispatchAttempt: "" })).toBe(v.signature)
          // A kernel without the route: a plain 404, not retried.
          yield* client.publishMetadata!("test-agent", {
            description: null,
            inputSchema: { type: "object" },
            outputSchema: null
          }).pipe(Effect.exit, Effect.map((exit) => expect(failureOf(exit)).toMatchObject({ status: 404 })))
          expect(requests[1]!.text).toBe("{\"description\":null,\"input_schema\":{\"type\":\"object\"},\"output_schema\":null}")
          expect(requests).toHaveLength(2)
        })
    ))

  it.effect("completeExecution with state: {\"output\":…,\"state\":…} (C.4.5)", () =>
    withCurrent(
      () => noContent(),
      (client, requests) =>
        Effect.gen(function*() {
          yield* client.completeExecution(caller, EXEC, "{\"answer\":42}", "{\"messages\":[]}")
          yield* client.completeExecution(caller, EXEC, undefined, "{\"n\":1}")
          yield* client.completeExecution(caller, EXEC, "1")
          expect(requests.map((r) => r.text)).toEqual([
            "{\"output\":{\"answer\":42},\"state\":{\"messages\":[]}}",
            "{\"state\":{\"n\":1}}",
            "{\"output\":1}"
          ])
        })
    ))

  it.effect("a denial's rule_id is decoded (C.8.4)", () =>
    withCurrent(
      () => json(200, { decision: "denied", step_id: STEP, reason: "no email", rule_id: "block-email" }),
      (client) =>
        Effect.gen(function*() {
          const decision = yield* client.submitStep(caller, EXEC, {
            kind: "tool_call",
            target: "send_email",
            argsJson: "{}",
            idempotency: "at_most_once"
          })
          expect(decision).toEqual({ decision: "denied", stepId: STEP, reason: "no email", ruleId: "block-email" })
        })
    ))
})

describe("KernelClient, stage auto: detecting an older kernel (C.13)", () => {
  /** A v0.14.0 kernel: only sha256= signatures get through. */
  const olderKernel = (request: Recorded): Answer =>
    request.headers["rebuno-signature"]?.startsWith("sha256=") ?
      (request.method === "GET" ? json(200, EXECUTION_WIRE) : noContent()) :
      unauthorized()

  it.effect("a 401 to the first read, then the read signed sha256= gets through: sha256= from then on", () =>
    withCurrent(olderKernel, (client, requests) =>
      Effect.gen(function*() {
        const execution = yield* client.getExecution({ agentId: "hello" }, EXEC)
        expect(execution.id).toBe(EXEC)
        expect(requests.map((r) => r.headers["rebuno-signature"]!.split("=")[0])).toEqual(["v1", "sha256"])
        expect(yield* client.signingScheme!).toBe("sha256")
        yield* client.heartbeat(caller, EXEC)
        yield* client.getExecution({ agentId: "hello" }, EXEC)
        expect(requests.slice(2).map((r) => r.headers["rebuno-signature"]!.split("=")[0])).toEqual(["sha256", "sha256"])
        expect(requests[2]!.headers["rebuno-signature"]).toBe(EMPTY_SIGNATURE)
      }), { secret: SECRET }))

  it.effect("a 401 that sha256= does not get through either: the scheme stays v1= and the first 401 is the error", () =>
    withCurrent(
      () => envelope(401, "unauthorized", "unauthorized"),
      (client, requests) =>
        Effect.gen(function*() {
          const error = failureOf(yield* Effect.exit(client.getExecution({ agentId: "hello" }, EXEC)))
          expect(error).toMatchObject({ _tag: "KernelError", status: 401, code: "unauthorized" })
          expect(requests).toHaveLength(2)
          expect(yield* client.signingScheme!).toBe("v1")
        })
    ))

  it.effect("an upgraded kernel: signing sha256=, a 401 the v1= read gets through switches back", () =>
    withCurrent(
      (request) =>
        request.headers["rebuno-signature"]?.startsWith("v1=") ? json(200, EXECUTION_WIRE) : unauthorized(),
      (client, requests) =>
        Effect.gen(function*() {
          yield* client.observeWebhook!({ executionId: EXEC, dispatchId: DISPATCH, dispatchAttempt: undefined, leaseTimeoutSeconds: undefined })
          expect(yield* client.signingScheme!).toBe("sha256")
          yield* client.getExecution({ agentId: "hello" }, EXEC)
          expect(requests.map((r) => r.headers["rebuno-signature"]!.split("=")[0])).toEqual(["sha256", "v1"])
          expect(yield* client.signingScheme!).toBe("v1")
        })
    ))

  it.effect("only the first read detects: other calls answered 401 are errors as they are", () =>
    withCurrent(olderKernel, (client, requests) =>
      Effect.gen(function*() {
        const error = failureOf(yield* Effect.exit(client.heartbeat(caller, EXEC)))
        expect(error).toMatchObject({ status: 401 })
        expect(requests).toHaveLength(1)
        expect(yield* client.signingScheme!).toBe("v1")
      })))

  it.effect("pinned stages and signing never fall back", () =>
    Effect.gen(function*() {
      for (const options of [{ stage: "current" as const }, { signing: "v1" as const }]) {
        yield* withCurrent(olderKernel, (client, requests) =>
          Effect.gen(function*() {
            expect(failureOf(yield* Effect.exit(client.getExecution({ agentId: "hello" }, EXEC)))).toMatchObject({
              status: 401
            })
            yield* client.observeWebhook!({ executionId: EXEC, dispatchId: DISPATCH, dispatchAttempt: undefined, leaseTimeoutSeconds: undefined })
            expect(requests).toHaveLength(1)
            expect(yield* client.signingScheme!).toBe("v1")
          }), options)
      }
    }))

  it.effect("a webhook without dispatch_attempt means v0.14.0; one with it changes nothing", () =>
    withCurrent(() => noContent(), (client, requests) =>
      Effect.gen(function*() {
        yield* client.observeWebhook!({ executionId: EXEC, dispatchId: DISPATCH, dispatchAttempt: 1, leaseTimeoutSeconds: 120 })
        expect(yield* client.signingScheme!).toBe("v1")
        yield* client.observeWebhook!({ executionId: EXEC, dispatchId: DISPATCH, dispatchAttempt: undefined, leaseTimeoutSeconds: undefined })
        expect(yield* client.signingScheme!).toBe("sha256")
        yield* client.heartbeat({ agentId: "hello", lease: { dispatchId: DISPATCH, attempt: undefined } }, EXEC)
        expect(requests[0]!.headers["rebuno-signature"]).toBe(EMPTY_SIGNATURE)
      }), { secret: SECRET }))

  it.effect("once a v1= request got through, a webhook without dispatch_attempt changes nothing (a current kernel sent none)", () =>
    withCurrent(() => noContent(), (client, requests) =>
      Effect.gen(function*() {
        yield* client.heartbeat(caller, EXEC)
        yield* client.observeWebhook!({ executionId: EXEC, dispatchId: DISPATCH, dispatchAttempt: undefined, leaseTimeoutSeconds: undefined })
        expect(yield* client.signingScheme!).toBe("v1")
        yield* client.heartbeat(caller, EXEC)
        expect(requests.map((r) => r.headers["rebuno-signature"]!.split("=")[0])).toEqual(["v1", "v1"])
      }), { secret: SECRET }))
})

describe("KernelClient layers: REBUNO_STAGE", () => {
  const double = makeDouble(() => noContent())
  const scheme = Effect.flatMap(KernelClient.KernelClient, (client) =>
    Effect.andThen(client.heartbeat(caller, EXEC), client.signingScheme!))
  const env = [["REBUNO_URL", "http://env-kernel"], ["REBUNO_AGENT_SECRET", SECRET]] as const

  it.effect.each([
    [undefined, "v1"],
    ["auto", "v1"],
    ["current", "v1"],
    ["seed", "sha256"],
    ["v0.14.0", "sha256"]
  ] as const)("REBUNO_STAGE=%s signs %s=", ([stage, expected]) =>
    Effect.gen(function*() {
      const got = yield* scheme.pipe(
        Effect.provide(KernelClient.layerConfig().pipe(Layer.provide(double.layer))),
        withEnv(stage === undefined ? env : [...env, ["REBUNO_STAGE", stage]])
      )
      expect(got).toBe(expected)
      expect(double.requests[double.requests.length - 1]!.headers["rebuno-signature"]!.startsWith(`${expected}=`)).toBe(
        true
      )
    }))

  it.effect("an unknown REBUNO_STAGE fails fast; the stage option wins over it", () =>
    Effect.gen(function*() {
      const exit = yield* scheme.pipe(
        Effect.provide(KernelClient.layerConfig().pipe(Layer.provide(double.layer))),
        withEnv([...env, ["REBUNO_STAGE", "v2"]]),
        Effect.exit
      )
      const error = failureOf(exit)
      expect(error).toBeInstanceOf(Config.ConfigError)
      expect(String(error)).toContain("REBUNO_STAGE")
      const pinned = yield* scheme.pipe(
        Effect.provide(KernelClient.layerConfig({ stage: "seed" }).pipe(Layer.provide(double.layer))),
        withEnv([...env, ["REBUNO_STAGE", "current"]])
      )
      expect(pinned).toBe("sha256")
    }))
})
