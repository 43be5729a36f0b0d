/**
 * Resources and checkpoints in the current stage (PROTOCOL-CURRENT C.6), on
 * the wire through the kernel's routes: registering (C.6.2: the resource
 * object's exact members, new and existing keys, the configuration compared by
 * its canonical fingerprint — the C.14 vector —, policy defaults, the checks in
 * order), binding (C.6.3), `resources` on submit and in `proceed` with
 * generations, `due` and invalidated checkpoints (C.6.4), captures on step
 * outcomes and their refusals in order (C.6.5), `POST …/resources/checkpoints`
 * (C.6.6), counts of settled steps (also subagent-settled, C.5.3), and the
 * resources a session execution inherits (C.6.7). Refused input changes
 * nothing; the older stages answer as before.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { createHash } from "node:crypto"
import * as Core from "../../src/kernel/Core.js"
import * as Routes from "../../src/kernel/Routes.js"
import * as Signature from "../../src/Signature.js"
import {
  claim,
  create,
  errorBody,
  EXECUTION_TERMINAL,
  FORBIDDEN,
  type Harness,
  harness,
  LEASE_SUPERSEDED,
  leaseOf,
  NOT_FOUND,
  NOT_FOUND_PAGE,
  RECORDED,
  request,
  running,
  type Running,
  seqOf,
  UNKNOWN_ID,
  validationError,
  VALIDATION,
  wireEvents
} from "../support/currentRoutes.js"
import { vectors } from "../support/currentVectors.js"

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

type Json = any

const STALE_LEASE = { "Rebuno-Dispatch-Id": "01920000-0000-7000-8000-000000000001", "Rebuno-Dispatch-Attempt": "1" }

/** The Python SDK's registration body of the C.14 vector (spaces after `,` and `:`). */
const SDK_REGISTRATION = vectors.v1_requests.find((v) => v.name.startsWith("register"))!.body

const text = (body: unknown) => (typeof body === "string" ? body : JSON.stringify(body))

const register = (h: Harness, run: Running, body: unknown, agentId = "hello", lease = run.lease) =>
  h.agent(agentId, "POST", `/v0/executions/${run.id}/resources`, text(body), lease)

/** Registers and answers the parsed resource (status 200 expected). */
const registered = (h: Harness, run: Running, body: unknown) =>
  Effect.map(register(h, run, body), (res) => {
    expect(res.status, res.body).toBe(200)
    return JSON.parse(res.body) as Json
  })

const bind = (h: Harness, run: Running, key: string, body: unknown, agentId = "hello", lease = run.lease) =>
  h.agent(agentId, "POST", `/v0/executions/${run.id}/resources/${key}/binding`, text(body), lease)

const publish = (h: Harness, run: Running, body: unknown, agentId = "hello", lease = run.lease) =>
  h.agent(agentId, "POST", `/v0/executions/${run.id}/resources/checkpoints`, text(body), lease)

const submit = (h: Harness, run: Running, s: Record<string, unknown>) =>
  h.agent(
    "hello",
    "POST",
    `/v0/executions/${run.id}/steps`,
    JSON.stringify({ kind: "tool_call", args: {}, idempotency: "safe_to_retry", ...s }),
    run.lease
  )

const decide = (h: Harness, run: Running, s: Record<string, unknown>) =>
  Effect.map(submit(h, run, s), (res) => {
    expect(res.status, res.body).toBe(200)
    return JSON.parse(res.body) as Json
  })

const outcome = (h: Harness, run: Running, stepId: string, route: "complete" | "fail", body: unknown) =>
  h.agent("hello", "POST", `/v0/executions/${run.id}/steps/${stepId}/${route}`, text(body), run.lease)

const complete = (h: Harness, run: Running, stepId: string, body: unknown = { result: "ok" }) =>
  Effect.map(outcome(h, run, stepId, "complete", body), (res) => expect(res.body).toBe(RECORDED))

const eventsAfter = (h: Harness, id: string, seq: number) =>
  Effect.map(wireEvents(h, id), (all) => all.filter((e) => e.seq > seq).map((e) => [e.type, e.payload] as const))

const forkPoints = (h: Harness, id: string) =>
  Effect.map(h.send("GET", `/v0/executions/${id}/fork-points`), (res) => {
    expect(res.status, res.body).toBe(200)
    return JSON.parse(res.body) as Json
  })

/** The resource as the register route reads it back now (an existing key answers as it is). */
const current = (h: Harness, run: Running, key = "workspace", driver = "example.e2b.v1", configuration: unknown = {
  timeout: 600
}) => registered(h, run, { key, driver_id: driver, configuration })

/** The run redelivered under a new dispatch (its lease lapsed), as after a crash. */
const redeliver = (h: Harness, run: Running) =>
  Effect.gen(function*() {
    yield* h.core.expireLeases()
    const claim = (yield* h.core.claimDue(100)).find((c) => c.executionId === run.id)!
    return { id: run.id, lease: leaseOf(claim) } satisfies Running
  })

const WORKSPACE = { key: "workspace", driver_id: "example.e2b.v1", configuration: { timeout: 600 } }

/** A fresh kernel with a running execution of `hello` that registered `resource`. */
const withResource = (resource: unknown = WORKSPACE) =>
  Effect.gen(function*() {
    const h = yield* harness()
    const run = yield* running(h)
    yield* register(h, run, resource)
    return { h, run }
  })

// ---------------------------------------------------------------------------

describe("Resources (PROTOCOL-CURRENT C.6)", () => {
  describe("register (C.6.2)", () => {
    it.effect("a new key: 200 with the resource object, members in order, and resource.registered", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const seq = yield* seqOf(h, run.id)
        const res = yield* register(h, run, SDK_REGISTRATION)
        expect(res.status).toBe(200)
        expect(res.headers["content-type"]).toBe("application/json; charset=utf-8")
        expect(res.body).toBe(
          "{\"key\":\"workspace\",\"driver_id\":\"example.e2b.v1\",\"configuration\":{\"timeout\":600}," +
            "\"coverage_reuse\":false,\"every_steps\":5,\"on_completion\":true," +
            `"registered_seq":${seq + 1},"generation":0,"count":0,"covered":false}\n`
        )
        expect(yield* eventsAfter(h, run.id, seq)).toEqual([
          ["resource.registered", {
            key: "workspace",
            driver_id: "example.e2b.v1",
            configuration: { timeout: 600 },
            coverage_reuse: false,
            every_steps: 5,
            on_completion: true
          }]
        ])
        const log = yield* h.core.eventLog(run.id)
        expect(log.at(-1)!.payload).toBe(
          "{\"configuration\":{\"timeout\":600},\"coverage_reuse\":false,\"driver_id\":\"example.e2b.v1\"," +
            "\"every_steps\":5,\"key\":\"workspace\",\"on_completion\":true}"
        )
      }))

    it.effect("without configuration and policy: configuration omitted, every_steps 0, on_completion false", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const res = yield* register(h, run, {
          key: "db.main_1",
          driver_id: "sqlite.v1",
          configuration: null,
          coverage_reuse: true
        })
        expect(res.body).toBe(
          "{\"key\":\"db.main_1\",\"driver_id\":\"sqlite.v1\",\"coverage_reuse\":true,\"every_steps\":0," +
            "\"on_completion\":false,\"registered_seq\":4,\"generation\":0,\"count\":0,\"covered\":false}\n"
        )
        const [event] = yield* eventsAfter(h, run.id, 3)
        expect(event).toEqual(["resource.registered", {
          key: "db.main_1",
          driver_id: "sqlite.v1",
          configuration: null,
          coverage_reuse: true,
          every_steps: 0,
          on_completion: false
        }])
        // a positive interval defaults on_completion to true (docs, C.6.2)
        const other = yield* registered(h, run, { key: "w2", driver_id: "d", every_steps: 2 })
        expect(other).toMatchObject({ every_steps: 2, on_completion: true })
        const off = yield* registered(h, run, { key: "w3", driver_id: "d", every_steps: 2, on_completion: false })
        expect(off).toMatchObject({ every_steps: 2, on_completion: false })
      }))

    it.effect("an existing key answers as it is now: configuration compared by canonical JSON (C.14 fingerprint)", () =>
      Effect.gen(function*() {
        const vector = vectors.resource_configuration_fingerprint
        expect(createHash("sha256").update(vector.canonical).digest("hex")).toBe(vector.sha256)
        const h = yield* harness()
        const run = yield* running(h)
        const first = yield* register(h, run, SDK_REGISTRATION)
        const seq = yield* seqOf(h, run.id)
        // the Python SDK's spacing, other whitespace, another member order: the same fingerprint
        for (
          const body of [
            SDK_REGISTRATION,
            "{\"key\":\"workspace\",\"driver_id\":\"example.e2b.v1\",\"configuration\":{ \"timeout\" :600 }}",
            { ...WORKSPACE, every_steps: 5 }
          ]
        ) {
          expect(yield* register(h, run, body)).toEqual(first)
        }
        expect(yield* seqOf(h, run.id)).toBe(seq)
      }))

    it.effect("an existing key with another driver, configuration or coverage_reuse: 409, nothing changed", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource(SDK_REGISTRATION)
        const seq = yield* seqOf(h, run.id)
        const conflict = errorBody(
          "conflict",
          "conflict: resource \"workspace\" is registered with another driver, configuration, or coverage_reuse"
        )
        for (
          const body of [
            { ...WORKSPACE, driver_id: "example.e2b.v2" },
            { ...WORKSPACE, configuration: { timeout: 601 } },
            { ...WORKSPACE, configuration: null },
            { ...WORKSPACE, coverage_reuse: true }
          ]
        ) {
          expect(yield* register(h, run, body)).toMatchObject({ status: 409, body: conflict })
        }
        expect(yield* seqOf(h, run.id)).toBe(seq)
      }))

    it.effect("re-registering with a positive interval enables checkpointing; an enabled policy is never reduced", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const off = yield* registered(h, run, WORKSPACE)
        expect(off).toMatchObject({ every_steps: 0, on_completion: false, registered_seq: 4 })
        const on = yield* registered(h, run, { ...WORKSPACE, every_steps: 3 })
        expect(on).toMatchObject({ every_steps: 3, on_completion: true, registered_seq: 4 })
        expect(yield* eventsAfter(h, run.id, 4)).toEqual([
          ["resource.registered", {
            key: "workspace",
            driver_id: "example.e2b.v1",
            configuration: { timeout: 600 },
            coverage_reuse: false,
            every_steps: 3,
            on_completion: true
          }]
        ])
        const seq = yield* seqOf(h, run.id)
        expect(yield* registered(h, run, WORKSPACE)).toEqual(on)
        expect(yield* registered(h, run, { ...WORKSPACE, every_steps: 1, on_completion: false })).toEqual(on)
        expect(yield* seqOf(h, run.id)).toBe(seq)
      }))

    it.effect("the checks in order: body, lease headers, members, then 404/403, terminal, lease — nothing changed", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const seq = yield* seqOf(h, run.id)
        const url = `/v0/executions/${run.id}/resources`
        // strict decoding first: unknown member, wrong types
        for (
          const body of [
            { ...WORKSPACE, extra: 1 },
            { ...WORKSPACE, coverage_reuse: "yes" },
            { ...WORKSPACE, every_steps: 1.5 },
            { ...WORKSPACE, on_completion: 1 },
            "[]"
          ]
        ) {
          expect(yield* register(h, run, body)).toMatchObject({ status: 400, body: VALIDATION })
        }
        // then the lease headers, before the members
        expect(yield* h.agent("hello", "POST", url, JSON.stringify({ key: "bad key" }))).toMatchObject({
          status: 400,
          body: validationError("validation error: bad or missing Rebuno-Dispatch-Id")
        })
        // the members, in order
        const members: ReadonlyArray<readonly [unknown, string]> = [
          [{ key: "bad key", driver_id: "" }, "validation error: key must match ^[A-Za-z0-9_.-]{1,128}$"],
          [{ key: "", driver_id: "d" }, "validation error: key must match ^[A-Za-z0-9_.-]{1,128}$"],
          [{ key: "k".repeat(129), driver_id: "d" }, "validation error: key must match ^[A-Za-z0-9_.-]{1,128}$"],
          [{ key: "k", driver_id: "", every_steps: -1 }, "validation error: driver_id is required"],
          [{ key: "k", driver_id: "d", every_steps: -1 }, "validation error: every_steps must be positive"]
        ]
        for (const [body, message] of members) {
          expect(yield* register(h, run, body, "hello", { ...run.lease, "Rebuno-Dispatch-Id": STALE_LEASE["Rebuno-Dispatch-Id"] }))
            .toMatchObject({ status: 400, body: validationError(message) })
        }
        // then the execution: unknown, another agent's, the lease
        const unknown = { ...run, id: UNKNOWN_ID }
        expect(yield* register(h, unknown, WORKSPACE)).toMatchObject({ status: 404, body: NOT_FOUND })
        const theirs = yield* running(h, "other")
        expect(yield* register(h, theirs, WORKSPACE, "hello")).toMatchObject({ status: 403, body: FORBIDDEN })
        expect(yield* register(h, run, WORKSPACE, "hello", STALE_LEASE)).toMatchObject({
          status: 409,
          body: LEASE_SUPERSEDED
        })
        expect(yield* seqOf(h, run.id)).toBe(seq)
        expect(yield* h.core.listResources(run.id)).toEqual([])
        // a terminal execution
        yield* h.agent("hello", "POST", `/v0/executions/${run.id}/complete`, "{\"output\":1}", run.lease)
        expect(yield* register(h, run, WORKSPACE)).toMatchObject({ status: 409, body: EXECUTION_TERMINAL })
      }))

    it.effect("in process: a configuration that is not canonical JSON is a 400 with its detail", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const lease = { dispatchId: run.lease["Rebuno-Dispatch-Id"]!, attempt: 1 }
        const failure = yield* Effect.flip(
          h.core.registerResource(run.id, lease, { key: "k", driverId: "d", configurationRaw: "{\"a\":" })
        )
        expect(failure).toMatchObject({ status: 400, code: "validation_error" })
        expect(failure.message).toMatch(/^validation error: invalid configuration: .+/)
        expect(yield* h.core.listResources(run.id)).toEqual([])
      }))
  })

  describe("binding (C.6.3)", () => {
    it.effect("bind: 204 and resource.bound; the same JSON again writes nothing; other JSON is a 409", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource(SDK_REGISTRATION)
        const seq = yield* seqOf(h, run.id)
        const bound = yield* bind(h, run, "workspace", "{\"binding\": {\"sandbox_id\": \"sbx-1\", \"region\": \"eu\"}}")
        expect(bound).toMatchObject({ status: 204, body: "" })
        expect(yield* eventsAfter(h, run.id, seq)).toEqual([
          ["resource.bound", { key: "workspace", binding: { sandbox_id: "sbx-1", region: "eu" } }]
        ])
        // canonically equal: other member order and spacing
        expect(yield* bind(h, run, "workspace", { binding: { region: "eu", sandbox_id: "sbx-1" } })).toMatchObject({
          status: 204
        })
        expect(yield* bind(h, run, "workspace", { binding: { sandbox_id: "sbx-2" } })).toMatchObject({
          status: 409,
          body: errorBody("conflict", "conflict: resource \"workspace\" is already bound")
        })
        expect(yield* seqOf(h, run.id)).toBe(seq + 1)
        // the register answer now carries the binding (stored compacted)
        const res = yield* register(h, run, SDK_REGISTRATION)
        expect(res.body).toBe(
          "{\"key\":\"workspace\",\"driver_id\":\"example.e2b.v1\",\"configuration\":{\"timeout\":600}," +
            "\"coverage_reuse\":false,\"every_steps\":5,\"on_completion\":true,\"registered_seq\":4," +
            "\"generation\":0,\"count\":0,\"binding\":{\"sandbox_id\":\"sbx-1\",\"region\":\"eu\"},\"covered\":false}\n"
        )
      }))

    it.effect("bad input: body, lease headers, binding required, then 404s — nothing changed", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource()
        const seq = yield* seqOf(h, run.id)
        expect(yield* bind(h, run, "workspace", { binding: 1, extra: 2 })).toMatchObject({
          status: 400,
          body: VALIDATION
        })
        expect(yield* bind(h, run, "workspace", { binding: null }, "hello", {})).toMatchObject({
          status: 400,
          body: validationError("validation error: bad or missing Rebuno-Dispatch-Id")
        })
        for (const body of [{ binding: null }, {}]) {
          expect(yield* bind(h, run, "workspace", body, "hello", STALE_LEASE)).toMatchObject({
            status: 400,
            body: validationError("validation error: binding is required")
          })
        }
        expect(yield* bind(h, { ...run, id: UNKNOWN_ID }, "workspace", { binding: 1 })).toMatchObject({
          status: 404,
          body: NOT_FOUND
        })
        expect(yield* bind(h, run, "workspace", { binding: 1 }, "hello", STALE_LEASE)).toMatchObject({
          status: 409,
          body: LEASE_SUPERSEDED
        })
        expect(yield* bind(h, run, "nope", { binding: 1 })).toMatchObject({ status: 404, body: NOT_FOUND })
        expect(yield* seqOf(h, run.id)).toBe(seq)
      }))
  })

  describe("resources on submit and in proceed (C.6.4)", () => {
    it.effect("a declared resource: proceed lists it with its generation and due; step.executing carries both", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource({ ...WORKSPACE, every_steps: 2 })
        const seq = yield* seqOf(h, run.id)
        const first = yield* submit(h, run, { target: "write", args: { n: 1 }, resources: ["workspace"] })
        const stepId = JSON.parse(first.body).step_id as string
        // count 0: (0 + 1) mod 2 ≠ 0, so not due (`due` omitted)
        expect(first.body).toBe(
          `{"decision":"proceed","step_id":"${stepId}","resources":[{"key":"workspace","generation":1}]}\n`
        )
        const log = yield* h.core.eventLog(run.id)
        expect(log.slice(seq).map((e) => e.type)).toEqual(["step.proposed", "step.allowed", "step.executing"])
        expect(log.at(-1)!.payload).toBe(
          `{"generations":{"workspace":1},"resources":["workspace"],"step_id":"${stepId}","step_type":"tool_call",` +
            "\"target\":\"write\"}"
        )
        yield* complete(h, run, stepId)
        // count 1: the next affecting step is due
        const second = yield* decide(h, run, { target: "write", args: { n: 2 }, resources: ["workspace"] })
        expect(second.resources).toEqual([{ key: "workspace", generation: 2, due: true }])
        expect(yield* current(h, run)).toMatchObject({ generation: 2, count: 1, covered: false })
      }))

    it.effect("undeclared resources: bumped unless coverage_reuse; an llm_call's declaration is ignored", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource({ ...WORKSPACE, every_steps: 1 })
        yield* register(h, run, { key: "cache", driver_id: "kv", coverage_reuse: true, every_steps: 1 })
        const llm = yield* decide(h, run, { kind: "llm_call", target: "gpt", args: { p: 1 }, resources: ["workspace"] })
        expect(llm.resources).toEqual([{ key: "workspace", generation: 1 }])
        const log = yield* h.core.eventLog(run.id)
        expect(JSON.parse(log.at(-1)!.payload)).toEqual({
          generations: { workspace: 1 },
          step_id: llm.step_id,
          step_type: "llm_call",
          target: "gpt"
        })
        // declaring the coverage_reuse resource touches it; the other one is bumped anyway
        const tool = yield* decide(h, run, { target: "t", resources: ["cache"] })
        expect(tool.resources).toEqual([{ key: "workspace", generation: 2 }, { key: "cache", generation: 1, due: true }])
        expect(JSON.parse((yield* h.core.eventLog(run.id)).at(-1)!.payload)).toMatchObject({
          generations: { cache: 1, workspace: 2 },
          resources: ["cache"]
        })
        // only coverage_reuse resources and nothing declared: nothing touched, the plain answer
        const h2 = yield* harness()
        const run2 = yield* running(h2)
        yield* register(h2, run2, { key: "cache", driver_id: "kv", coverage_reuse: true })
        const plain = yield* submit(h2, run2, { target: "t" })
        expect(plain.body).toBe(`{"decision":"proceed","step_id":"${JSON.parse(plain.body).step_id}"}\n`)
        expect(JSON.parse((yield* h2.core.eventLog(run2.id)).at(-1)!.payload)).not.toHaveProperty("generations")
      }))

    it.effect("a declared key must be registered (400, nothing written); replays ignore the declaration", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource()
        const seq = yield* seqOf(h, run.id)
        expect(yield* submit(h, run, { target: "t", resources: ["workspace", "nope"] })).toMatchObject({
          status: 400,
          body: validationError("validation error: unknown resource \"nope\"")
        })
        expect(yield* seqOf(h, run.id)).toBe(seq)
        const step = yield* decide(h, run, { target: "t", resources: ["workspace"] })
        yield* complete(h, run, step.step_id)
        // an existing step (the rerun's first submission): no validation, no touch
        const rerun = yield* redeliver(h, run)
        const replay = yield* decide(h, rerun, { target: "t", resources: ["nope"] })
        expect(replay).toEqual({ decision: "replay", step_id: step.step_id, result: "ok" })
      }))

    it.effect("starting a step invalidates the open checkpoints of every key it touches, at step.executing", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource({ ...WORKSPACE, every_steps: 1 })
        expect(yield* publish(h, run, { captures: [{ key: "workspace", generation: 0, checkpoint_ref: "snap-0" }] }))
          .toMatchObject({ status: 204 })
        expect(yield* current(h, run)).toMatchObject({ generation: 0, covered: true })
        const step = yield* decide(h, run, { target: "t", resources: ["workspace"] })
        const executingSeq = yield* seqOf(h, run.id)
        expect(yield* current(h, run)).toMatchObject({ generation: 1, covered: false })
        expect(yield* forkPoints(h, run.id)).toEqual({
          latest_seq: executingSeq,
          resources: { workspace: 4 },
          checkpoints: [{ key: "workspace", generation: 0, checkpoint_ref: "snap-0", covered_seq: 4, invalidated_seq: executingSeq }]
        })
        expect(step.resources).toEqual([{ key: "workspace", generation: 1, due: true }])
      }))

    it.effect("an approved step starts when resubmitted: proceed with resources and step.executing", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        yield* h.core.loadPolicy(
          "hello",
          "default_action: allow\nrules:\n  - id: hold\n    when: { target: deploy }\n    then: { decision: require_approval }\n"
        )
        const run = yield* running(h)
        yield* register(h, run, { ...WORKSPACE, every_steps: 1 })
        const blocked = yield* decide(h, run, { target: "deploy", resources: ["workspace"] })
        expect(blocked.decision).toBe("blocked")
        // not started: nothing touched yet
        expect(yield* h.core.listResources(run.id)).toMatchObject([{ generation: 0 }])
        yield* h.core.grantApproval(blocked.approval_id, { decidedBy: "alice", rationale: "" })
        const [claim] = yield* h.core.claimDue(10)
        const again = { id: run.id, lease: leaseOf(claim!) }
        const seq = yield* seqOf(h, run.id)
        const proceed = yield* decide(h, again, { target: "deploy", resources: ["workspace"] })
        expect(proceed).toEqual({
          decision: "proceed",
          step_id: blocked.step_id,
          resources: [{ key: "workspace", generation: 1, due: true }]
        })
        expect(yield* eventsAfter(h, run.id, seq)).toEqual([
          ["step.executing", {
            generations: { workspace: 1 },
            resources: ["workspace"],
            step_id: blocked.step_id,
            step_type: "tool_call",
            target: "deploy"
          }]
        ])
      }))

    it.effect("an orphaned safe_to_retry step re-run touches again; one that touches nothing writes no event", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource({ ...WORKSPACE, every_steps: 1 })
        yield* register(h, run, { key: "cache", driver_id: "kv", coverage_reuse: true })
        const writer = yield* decide(h, run, { target: "write", resources: ["workspace"] })
        const rerun = yield* redeliver(h, run)
        const seq = yield* seqOf(h, run.id)
        const again = yield* decide(h, rerun, { target: "write", resources: ["workspace"] })
        expect(again).toEqual({
          decision: "proceed",
          step_id: writer.step_id,
          resources: [{ key: "workspace", generation: 2, due: true }]
        })
        expect((yield* eventsAfter(h, run.id, seq)).map(([type]) => type)).toEqual(["step.executing"])

        // only the coverage_reuse cache and nothing declared: untouched, no new event
        const h2 = yield* harness()
        const run2 = yield* running(h2)
        yield* register(h2, run2, { key: "cache", driver_id: "kv", coverage_reuse: true })
        const reader = yield* decide(h2, run2, { target: "read" })
        const rerun2 = yield* redeliver(h2, run2)
        const seq2 = yield* seqOf(h2, run2.id)
        expect(yield* decide(h2, rerun2, { target: "read" })).toEqual({ decision: "proceed", step_id: reader.step_id })
        expect(yield* seqOf(h2, run2.id)).toBe(seq2)
      }))
  })

  describe("captures on step outcomes (C.6.5)", () => {
    it.effect("an accepted capture: resource.checkpointed covering from the outcome event; covered", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource({ ...WORKSPACE, every_steps: 1 })
        const step = yield* decide(h, run, { target: "write", resources: ["workspace"] })
        const seq = yield* seqOf(h, run.id)
        const res = yield* outcome(h, run, step.step_id, "complete", {
          result: "wrote a.txt",
          captures: [{ key: "workspace", generation: 1, checkpoint_ref: "snapshot-abc" }]
        })
        expect(res).toMatchObject({ status: 200, body: RECORDED })
        expect(yield* eventsAfter(h, run.id, seq)).toEqual([
          ["step.succeeded", { step_id: step.step_id, step_type: "tool_call", target: "write" }],
          ["resource.checkpointed", {
            key: "workspace",
            generation: 1,
            checkpoint_ref: "snapshot-abc",
            covered_seq: seq + 1
          }]
        ])
        expect(yield* current(h, run)).toMatchObject({ generation: 1, count: 1, covered: true })
        expect((yield* forkPoints(h, run.id)).checkpoints).toEqual([
          { key: "workspace", generation: 1, checkpoint_ref: "snapshot-abc", covered_seq: seq + 1 }
        ])
      }))

    it.effect("failures first, then each capture refused by the first reason in order; the outcome stands", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource({ ...WORKSPACE, every_steps: 1 })
        yield* register(h, run, { key: "db", driver_id: "sql" })
        const writer = yield* decide(h, run, { target: "write", resources: ["workspace", "db"] })
        // another executing step declares db: captures of db are refused while it runs
        const other = yield* decide(h, run, { target: "migrate", resources: ["db"] })
        const seq = yield* seqOf(h, run.id)
        const res = yield* outcome(h, run, writer.step_id, "fail", {
          error: { message: "boom" },
          capture_failures: [{ key: "database", generation: 3, error: "snapshot timed out" }],
          captures: [
            { key: "nope", generation: 1, checkpoint_ref: "x" },
            { key: "workspace", generation: 1, checkpoint_ref: "" },
            { key: "workspace", generation: 2, checkpoint_ref: "ws-1" },
            { key: "workspace", generation: 2, checkpoint_ref: "ws-2" },
            { key: "db", generation: 1, checkpoint_ref: "db-1" },
            { key: "db", generation: 2, checkpoint_ref: "db-2" }
          ]
        })
        expect(res).toMatchObject({ status: 200, body: RECORDED })
        const refused = (key: string, generation: number, error: string) =>
          ["resource.checkpoint_failed", { key, generation, error }] as const
        expect(yield* eventsAfter(h, run.id, seq)).toEqual([
          ["step.failed", { step_id: writer.step_id, step_type: "tool_call", target: "write", error: { message: "boom" } }],
          refused("database", 3, "snapshot timed out"),
          refused("nope", 1, "unknown_resource"),
          refused("workspace", 1, "missing_checkpoint_ref"),
          ["resource.checkpointed", { key: "workspace", generation: 2, checkpoint_ref: "ws-1", covered_seq: seq + 1 }],
          refused("workspace", 2, "duplicate_capture"),
          refused("db", 1, "stale_generation"),
          refused("db", 2, "writers_active")
        ])
        // the failed step counts; the step itself is failed
        expect(yield* current(h, run)).toMatchObject({ count: 1, covered: true })
        expect(yield* h.core.getStep(run.id, writer.step_id)).toMatchObject({ status: "failed" })
        expect(other.resources).toEqual([{ key: "workspace", generation: 2 }, { key: "db", generation: 2 }])
      }))

    it.effect("a replayed outcome records nothing; bad capture entries are a 400 with nothing changed", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource({ ...WORKSPACE, every_steps: 1 })
        const step = yield* decide(h, run, { target: "write", resources: ["workspace"] })
        const seq = yield* seqOf(h, run.id)
        for (
          const body of [
            { result: 1, captures: [{ key: "workspace", generation: 1, checkpoint_ref: "x", extra: 1 }] },
            { result: 1, captures: { key: "workspace" } },
            { result: 1, capture_failures: [{ key: "workspace", generation: "1", error: "e" }] },
            { result: 1, unknown: [] }
          ]
        ) {
          expect(yield* outcome(h, run, step.step_id, "complete", body)).toMatchObject({ status: 400, body: VALIDATION })
        }
        expect(yield* seqOf(h, run.id)).toBe(seq)
        yield* complete(h, run, step.step_id, { result: 1, captures: null, capture_failures: [] })
        const settled = yield* seqOf(h, run.id)
        expect(settled).toBe(seq + 1)
        const again = yield* outcome(h, run, step.step_id, "complete", {
          result: 2,
          captures: [{ key: "workspace", generation: 1, checkpoint_ref: "late" }]
        })
        expect(again.body).toBe("{\"decision\":\"replay\",\"result\":1}\n")
        expect(yield* seqOf(h, run.id)).toBe(settled)
        expect(yield* current(h, run)).toMatchObject({ count: 1, covered: false })
      }))
  })

  describe("POST …/resources/checkpoints (C.6.6)", () => {
    it.effect("204; recorded as on an outcome, covering from the latest seq", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource({ ...WORKSPACE, every_steps: 1 })
        const seq = yield* seqOf(h, run.id)
        const res = yield* publish(h, run, {
          captures: [{ key: "workspace", generation: 0, checkpoint_ref: "base" }, {
            key: "workspace",
            generation: 0,
            checkpoint_ref: "again"
          }],
          capture_failures: [{ key: "workspace", generation: 0, error: "RuntimeError" }]
        })
        expect(res).toMatchObject({ status: 204, body: "" })
        expect(yield* eventsAfter(h, run.id, seq)).toEqual([
          ["resource.checkpoint_failed", { key: "workspace", generation: 0, error: "RuntimeError" }],
          ["resource.checkpointed", { key: "workspace", generation: 0, checkpoint_ref: "base", covered_seq: seq }],
          ["resource.checkpoint_failed", { key: "workspace", generation: 0, error: "duplicate_capture" }]
        ])
        // both lists optional
        expect(yield* publish(h, run, {})).toMatchObject({ status: 204 })
        // a running writer refuses it
        yield* decide(h, run, { target: "write", resources: ["workspace"] })
        const before = yield* seqOf(h, run.id)
        yield* publish(h, run, { captures: [{ key: "workspace", generation: 1, checkpoint_ref: "mid" }] })
        expect(yield* eventsAfter(h, run.id, before)).toEqual([
          ["resource.checkpoint_failed", { key: "workspace", generation: 1, error: "writers_active" }]
        ])
      }))

    it.effect("bad input: body, lease headers, 404, 403, lease — nothing changed", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource()
        const seq = yield* seqOf(h, run.id)
        expect(yield* publish(h, run, { captures: [], extra: 1 })).toMatchObject({ status: 400, body: VALIDATION })
        expect(yield* publish(h, run, {}, "hello", {})).toMatchObject({
          status: 400,
          body: validationError("validation error: bad or missing Rebuno-Dispatch-Id")
        })
        expect(yield* publish(h, { ...run, id: UNKNOWN_ID }, {})).toMatchObject({ status: 404, body: NOT_FOUND })
        const theirs = yield* running(h, "other")
        expect(yield* publish(h, theirs, {}, "hello")).toMatchObject({ status: 403, body: FORBIDDEN })
        expect(yield* publish(h, run, {}, "hello", STALE_LEASE)).toMatchObject({ status: 409, body: LEASE_SUPERSEDED })
        expect(yield* seqOf(h, run.id)).toBe(seq)
      }))
  })

  describe("counts (C.6.5 step 1)", () => {
    it.effect("succeeded, failed and cancelled executing steps count; denied and replayed ones do not", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        yield* h.core.loadPolicy(
          "hello",
          "default_action: allow\nrules:\n  - id: no-rm\n    when: { target: rm }\n    then: { decision: deny }\n"
        )
        const run = yield* running(h)
        yield* register(h, run, WORKSPACE)
        const a = yield* decide(h, run, { target: "a", resources: ["workspace"] })
        yield* complete(h, run, a.step_id)
        const b = yield* decide(h, run, { target: "b", resources: ["workspace"] })
        yield* outcome(h, run, b.step_id, "fail", { error: { message: "x" } })
        const denied = yield* decide(h, run, { target: "rm", resources: ["workspace"] })
        expect(denied.decision).toBe("denied")
        const rerun = yield* redeliver(h, run)
        for (const target of ["a", "b", "rm"]) {
          const replayed = yield* decide(h, rerun, { target, resources: ["workspace"] })
          expect(replayed.decision).not.toBe("proceed")
        }
        expect(yield* current(h, rerun)).toMatchObject({ count: 2, generation: 2 })
        // an executing step cancelled with its execution counts too
        yield* decide(h, rerun, { target: "c", resources: ["workspace"] })
        yield* h.core.cancelExecution(run.id)
        const [resource] = yield* h.core.listResources(run.id)
        expect(resource).toMatchObject({ count: 3, generation: 3 })
      }))

    it.effect("a step settled by its subagent counts against its resources (C.5.3)", () =>
      Effect.gen(function*() {
        const { h, run } = yield* withResource()
        const step = yield* decide(h, run, { target: "delegate", resources: ["workspace"] })
        const created = yield* create(h, { agent_id: "other", spawned_by: { execution_id: run.id, step_id: step.step_id } })
        const child = JSON.parse(created.body).id as string
        yield* h.agent("other", "POST", `/v0/executions/${child}/complete`, "{\"output\":\"done\"}", yield* claim(h, child))
        expect(yield* h.core.getStep(run.id, step.step_id)).toMatchObject({ status: "succeeded", resultRaw: "\"done\"" })
        expect(yield* current(h, run)).toMatchObject({ count: 1 })
      }))
  })

  describe("inheritance (C.6.7)", () => {
    it.effect("the next execution of a session inherits its parent's resources: binding kept, no checkpoint", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const create = (input: unknown) =>
          h.send("POST", "/v0/executions", { body: JSON.stringify({ agent_id: "hello", input, session: "s1" }) })
        const first = JSON.parse((yield* create(1)).body).id as string
        const [claim] = yield* h.core.claimDue(10)
        const run: Running = { id: first, lease: leaseOf(claim!) }
        yield* register(h, run, { ...WORKSPACE, every_steps: 2 })
        yield* bind(h, run, "workspace", { binding: { sandbox_id: "sbx-1" } })
        yield* publish(h, run, { captures: [{ key: "workspace", generation: 0, checkpoint_ref: "snap" }] })
        const step = yield* decide(h, run, { target: "w", resources: ["workspace"] })
        yield* complete(h, run, step.step_id)
        const second = JSON.parse((yield* create(2)).body).id as string
        yield* h.agent("hello", "POST", `/v0/executions/${first}/complete`, "{\"output\":1}", run.lease)

        const log = yield* wireEvents(h, second)
        expect(log.map((e) => [e.type, e.payload])).toEqual([
          ["execution.created", { execution_id: second, session: "s1", status: "pending" }],
          ["execution.started", { execution_id: second, parent_execution_id: first, session: "s1", status: "running" }],
          ["resource.registered", {
            key: "workspace",
            driver_id: "example.e2b.v1",
            configuration: { timeout: 600 },
            coverage_reuse: false,
            every_steps: 2,
            on_completion: true
          }],
          ["resource.bound", { key: "workspace", binding: { sandbox_id: "sbx-1" } }],
          ["dispatch.queued", expect.objectContaining({ execution_id: second })]
        ])
        const [resource] = yield* h.core.listResources(second)
        expect(resource).toEqual({
          key: "workspace",
          driverId: "example.e2b.v1",
          configurationRaw: "{\"timeout\":600}",
          coverageReuse: false,
          everySteps: 2,
          onCompletion: true,
          registeredSeq: 3,
          generation: 0,
          count: 0,
          bindingRaw: "{\"sandbox_id\":\"sbx-1\"}",
          checkpointRef: undefined,
          covered: false
        })
      }))
  })

  describe("older stages", () => {
    it.effect("seed: the resource routes are the plain 404; resources and captures are unknown members (400)", () =>
      Effect.gen(function*() {
        const core = yield* Core.make({ stage: "seed" })
        yield* core.registerAgent({ id: "hello", webhookUrl: "http://localhost:5000/webhook", secret: "s" })
        const handle = Routes.make(core)
        const created = yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined })
        const send = (method: string, url: string, body = "{}") =>
          Effect.map(handle(request(method, url, { body })), (res) => ({ status: res.status, body: res.body }))
        for (
          const url of [
            `/v0/executions/${created.id}/resources`,
            `/v0/executions/${created.id}/resources/workspace/binding`,
            `/v0/executions/${created.id}/resources/checkpoints`
          ]
        ) {
          expect(yield* send("POST", url)).toEqual({ status: 404, body: NOT_FOUND_PAGE })
        }
        // a signed agent request with `resources` on submit or `captures` on complete: unknown members
        const [claim] = yield* core.claimDue(10)
        const signed = (url: string, body: string) =>
          Effect.flatMap(Signature.sign("s", body), (signature) =>
            Effect.map(
              handle(request("POST", url, {
                body,
                headers: {
                  "Rebuno-Agent-Id": "hello",
                  "Rebuno-Signature": signature,
                  "Rebuno-Dispatch-Id": claim!.dispatchId,
                  "Rebuno-Dispatch-Attempt": String(claim!.attempt)
                }
              })),
              (res) => ({ status: res.status, body: res.body })
            ))
        const step = yield* signed(
          `/v0/executions/${created.id}/steps`,
          "{\"kind\":\"tool_call\",\"target\":\"t\",\"args\":{},\"idempotency\":\"safe_to_retry\"}"
        )
        const stepId = JSON.parse(step.body as string).step_id as string
        expect(yield* signed(`/v0/executions/${created.id}/steps`, "{\"kind\":\"tool_call\",\"target\":\"u\",\"resources\":[]}"))
          .toEqual({ status: 400, body: VALIDATION })
        expect(
          yield* signed(`/v0/executions/${created.id}/steps/${stepId}/complete`, "{\"result\":1,\"captures\":[]}")
        ).toEqual({ status: 400, body: VALIDATION })
        expect(yield* signed(`/v0/executions/${created.id}/steps/${stepId}/complete`, "{\"result\":1}")).toEqual({
          status: 200,
          body: RECORDED
        })
      }))
  })
})
