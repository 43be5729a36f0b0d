/**
 * Sessions, state and idempotent create in the current stage
 * (PROTOCOL-CURRENT C.4), on the wire through the kernel's routes and on the
 * core: the create members and their check order, what create writes, one
 * running execution per session, the session head as parent, `state` on
 * complete, `GET …/previous`, the `session` filter, deadlines from creation,
 * the changed answers of C.10 and C.8.7 — and the older stages refusing all of it.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import * as Core from "../../src/kernel/Core.js"
import {
  allIds,
  APPROVE_SEND_EMAIL,
  claim,
  create,
  endExecution,
  errorBody,
  eventsFrom,
  eventTypes,
  EXECUTION_TERMINAL,
  FORBIDDEN,
  type Harness,
  harness,
  NOT_FOUND,
  NOT_FOUND_PAGE,
  running,
  submitSendEmail,
  UNKNOWN_ID,
  VALIDATION
} from "../support/currentRoutes.js"
import { expectVectorLeaseSuperseded, v1Vector, vectorKernel, vectorRequest } from "../support/currentVectors.js"

const T0 = "1970-01-01T00:00:00Z"
const BAD_SESSION = errorBody(
  "validation_error",
  "validation error: session must be a nonblank UTF-8 string of at most 256 bytes without NUL"
)
const BAD_KEY = errorBody(
  "validation_error",
  "validation error: idempotency_key must be a nonblank UTF-8 string of at most 256 bytes without NUL"
)
const PARENT_CONFLICT = errorBody(
  "conflict",
  "conflict: the parent must be a completed execution of the same agent"
)

/** Creates and answers the parsed execution (the create must be a 201). */
const created = (h: Harness, body: Record<string, unknown>) =>
  Effect.map(create(h, body), (res) => {
    expect(res.status).toBe(201)
    return JSON.parse(res.body) as Record<string, unknown> & { readonly id: string; readonly status: string }
  })

/** Claims `id`'s dispatch and completes the execution over the wire with this body. */
const complete = (h: Harness, id: string, body: string, agentId = "hello") =>
  endExecution(h, id, "complete", body, agentId)

const getExecution = (h: Harness, id: string) =>
  Effect.map(h.send("GET", `/v0/executions/${id}`), (res) => JSON.parse(res.body) as Record<string, unknown>)

const previous = (h: Harness, id: string, agentId = "hello") =>
  h.agent(agentId, "GET", `/v0/executions/${id}/previous`)

describe("Sessions (PROTOCOL-CURRENT C.4)", () => {
  describe("create", () => {
    it.effect("the first execution of a session starts at once; its JSON and events carry the session", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const res = yield* create(h, { agent_id: "hello", input: { q: 1 }, session: "chat:u42:c7" })
        expect(res.status).toBe(201)
        const id = JSON.parse(res.body).id as string
        expect(res.body).toBe(
          `{"id":"${id}","agent_id":"hello","input":{"q":1},"status":"running","session":"chat:u42:c7",` +
            `"created_at":"${T0}","updated_at":"${T0}"}\n`
        )
        const [dispatch] = yield* h.core.dispatches(id)
        expect(yield* eventsFrom(h, id)).toEqual([
          ["execution.created", { execution_id: id, session: "chat:u42:c7", status: "pending" }],
          ["execution.started", { execution_id: id, session: "chat:u42:c7", status: "running" }],
          ["dispatch.queued", { attempt: 0, dispatch_id: dispatch!.id, execution_id: id, status: "pending" }]
        ])
        expect((yield* h.core.eventLog(id))[0]!.payload).toBe(
          `{"execution_id":"${id}","session":"chat:u42:c7","status":"pending"}`
        )
      }))

    it.effect("without a session nothing changes: created, started, queued and running", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const res = yield* create(h, { agent_id: "hello", input: null })
        const id = JSON.parse(res.body).id as string
        expect(res.body).toBe(
          `{"id":"${id}","agent_id":"hello","input":null,"status":"running","created_at":"${T0}","updated_at":"${T0}"}\n`
        )
        expect(yield* eventTypes(h, id)).toEqual(["execution.created", "execution.started", "dispatch.queued"])
      }))

    it.effect("a second execution waits pending while the session runs: no start, no dispatch", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const first = yield* created(h, { agent_id: "hello", session: "s" })
        const second = yield* created(h, { agent_id: "hello", input: { turn: 2 }, session: "s" })
        expect(first.status).toBe("running")
        expect(second).toEqual({
          id: second.id,
          agent_id: "hello",
          input: { turn: 2 },
          status: "pending",
          session: "s",
          created_at: T0,
          updated_at: T0
        })
        expect(yield* eventsFrom(h, second.id)).toEqual([
          ["execution.created", { execution_id: second.id, session: "s", status: "pending" }]
        ])
        expect(yield* h.core.dispatches(second.id)).toEqual([])
        expect((yield* h.core.claimDue(10)).map((c) => c.executionId)).toEqual([first.id])
      }))

    it.effect("labels: empty means absent; blank, NUL and over 256 bytes are 400 with nothing created", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const bad: ReadonlyArray<string> = [
          " ",
          "\t\n\u00a0\u3000",
          "a\u0000b",
          "x".repeat(257),
          "€".repeat(86) // 258 bytes
        ]
        for (const label of bad) {
          const session = yield* h.send("POST", "/v0/executions", {
            body: `{"agent_id":"hello","session":${JSON.stringify(label)}}`
          })
          expect(session).toMatchObject({ status: 400, body: BAD_SESSION })
          const key = yield* h.send("POST", "/v0/executions", {
            body: `{"agent_id":"hello","idempotency_key":${JSON.stringify(label)}}`
          })
          expect(key).toMatchObject({ status: 400, body: BAD_KEY })
        }
        expect(yield* allIds(h)).toEqual([])
        // 256 bytes exactly, multi-byte and surrounded by spaces are fine; "" and null are absent
        const edge = yield* created(h, { agent_id: "hello", session: "x".repeat(256), idempotency_key: " k€ " })
        expect(edge).toMatchObject({ session: "x".repeat(256), idempotency_key: " k€ " })
        const plain = yield* created(h, { agent_id: "hello", session: "", idempotency_key: null })
        expect(plain.session).toBeUndefined()
        expect(plain.idempotency_key).toBeUndefined()
        expect(plain.status).toBe("running")
      }))

    it.effect("check order: labels, then the agent, then the idempotency key, then the parent", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        // labels before the agent lookup
        expect(yield* create(h, { agent_id: "nobody", session: " " })).toMatchObject({ status: 400, body: BAD_SESSION })
        expect(yield* create(h, { agent_id: "nobody", session: "ok", idempotency_key: " " })).toMatchObject({
          status: 400,
          body: BAD_KEY
        })
        expect(yield* create(h, { agent_id: "nobody", session: "ok" })).toMatchObject({ status: 404, body: NOT_FOUND })
        // an existing key wins over everything after it
        const first = yield* created(h, { agent_id: "hello", idempotency_key: "k-1" })
        const again = yield* create(h, {
          agent_id: "hello",
          idempotency_key: "k-1",
          input: { other: true },
          session: "elsewhere",
          parent_execution_id: UNKNOWN_ID
        })
        expect(again.status).toBe(201)
        expect(JSON.parse(again.body)).toEqual(first)
        expect(yield* allIds(h)).toEqual([first.id])
        // without the key the unknown parent is 404
        expect(yield* create(h, { agent_id: "hello", parent_execution_id: UNKNOWN_ID })).toMatchObject({
          status: 404,
          body: NOT_FOUND
        })
        expect(yield* create(h, { agent_id: "hello", parent_execution_id: "not-a-uuid" })).toMatchObject({
          status: 400,
          body: VALIDATION
        })
        expect(yield* allIds(h)).toEqual([first.id])
      }))

    it.effect("strict body: agent_version, unknown members and a malformed spawned_by are 400", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        for (
          const body of [
            "{\"agent_id\":\"hello\",\"agent_version\":\"v1\"}",
            "{\"agent_id\":\"hello\",\"on_behalf_of\":\"bob\"}",
            "{\"agent_id\":\"hello\",\"session\":7}",
            "{\"agent_id\":\"hello\",\"spawned_by\":\"x\"}",
            `{"agent_id":"hello","spawned_by":{"execution_id":"${UNKNOWN_ID}","step_id":"a","extra":1}}`,
            "{\"agent_id\":\"hello\",\"spawned_by\":{\"execution_id\":\"nope\",\"step_id\":\"a\"}}"
          ]
        ) {
          expect(yield* h.send("POST", "/v0/executions", { body })).toMatchObject({ status: 400, body: VALIDATION })
        }
        expect(yield* allIds(h)).toEqual([])
      }))

    it.effect("idempotency: the same key answers the execution as it is now, per agent", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const first = yield* created(h, { agent_id: "hello", input: { n: 1 }, idempotency_key: "k-1" })
        expect(first).toMatchObject({ status: "running", idempotency_key: "k-1" })
        const log = yield* h.core.eventLog(first.id)
        yield* complete(h, first.id, "{\"output\":{\"done\":true}}")
        const again = yield* created(h, { agent_id: "hello", input: { n: 2 }, idempotency_key: "k-1" })
        expect(again).toEqual({ ...first, status: "completed", output: { done: true }, updated_at: T0 })
        expect((yield* h.core.eventLog(first.id)).length).toBe(log.length + 1)
        // another agent's key space is its own
        const other = yield* created(h, { agent_id: "other", idempotency_key: "k-1" })
        expect(other.id).not.toBe(first.id)
        expect(yield* allIds(h)).toEqual([other.id, first.id])
      }))
  })

  describe("one at a time per session (C.4.4)", () => {
    it.effect("a terminal execution admits the oldest pending one, whose parent is the session head", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const first = yield* created(h, { agent_id: "hello", session: "s" })
        const second = yield* created(h, { agent_id: "hello", session: "s" })
        const third = yield* created(h, { agent_id: "hello", session: "s" })
        yield* TestClock.adjust("1 second")
        yield* complete(h, first.id, "{\"output\":{\"turn\":1},\"state\":{\"messages\":[\"hi\"]}}")
        expect(yield* eventsFrom(h, second.id)).toMatchObject([
          ["execution.created", { execution_id: second.id, session: "s", status: "pending" }],
          [
            "execution.started",
            { execution_id: second.id, parent_execution_id: first.id, session: "s", status: "running" }
          ],
          ["dispatch.queued", { attempt: 0, execution_id: second.id, status: "pending" }]
        ])
        expect((yield* h.core.eventLog(second.id))[1]!.payload).toBe(
          `{"execution_id":"${second.id}","parent_execution_id":"${first.id}","session":"s","status":"running"}`
        )
        const res = yield* h.send("GET", `/v0/executions/${second.id}`)
        expect(res.body).toBe(
          `{"id":"${second.id}","agent_id":"hello","input":null,"status":"running","session":"s",` +
            `"parent_execution_id":"${first.id}","created_at":"${T0}","updated_at":"1970-01-01T00:00:01Z"}\n`
        )
        expect((yield* getExecution(h, third.id)).status).toBe("pending")
        // the new head reads the previous state
        expect(yield* previous(h, second.id)).toMatchObject({ status: 200, body: "{\"state\":{\"messages\":[\"hi\"]}}\n" })
        yield* complete(h, second.id, "{\"output\":{\"turn\":2}}")
        expect(yield* getExecution(h, third.id)).toMatchObject({ status: "running", parent_execution_id: second.id })
        // no state stored: the parent's output
        expect(yield* previous(h, third.id)).toMatchObject({ status: 200, body: "{\"state\":{\"turn\":2}}\n" })
      }))

    it.effect("failed and cancelled executions admit the next one but never become its parent", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const done = yield* created(h, { agent_id: "hello", session: "s" })
        yield* complete(h, done.id, "{\"output\":1}")
        const failing = yield* created(h, { agent_id: "hello", session: "s" })
        const cancelled = yield* created(h, { agent_id: "hello", session: "s" })
        const last = yield* created(h, { agent_id: "hello", session: "s" })
        expect(failing).toMatchObject({ status: "running", parent_execution_id: done.id })
        yield* endExecution(h, failing.id, "fail", "{\"error\":\"boom\"}")
        expect(yield* getExecution(h, cancelled.id)).toMatchObject({ status: "running", parent_execution_id: done.id })
        expect((yield* h.send("POST", `/v0/executions/${cancelled.id}/cancel`)).status).toBe(204)
        expect(yield* getExecution(h, last.id)).toMatchObject({ status: "running", parent_execution_id: done.id })
      }))

    it.effect("sessions are global: another agent's execution waits, and the head is per agent", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const mine = yield* created(h, { agent_id: "hello", session: "shared" })
        const theirs = yield* created(h, { agent_id: "other", session: "shared" })
        const elsewhere = yield* created(h, { agent_id: "other", session: "another" })
        expect([mine.status, theirs.status, elsewhere.status]).toEqual(["running", "pending", "running"])
        yield* complete(h, mine.id, "{\"output\":1}")
        const started = yield* getExecution(h, theirs.id)
        expect(started.status).toBe("running")
        expect(started.parent_execution_id).toBeUndefined()
        expect(yield* previous(h, theirs.id, "other")).toMatchObject({ status: 200, body: "{\"state\":null}\n" })
      }))

    it.effect("a blocked execution keeps its session busy; resuming does not admit", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        yield* h.core.loadPolicy("hello", APPROVE_SEND_EMAIL)
        const first = yield* created(h, { agent_id: "hello", session: "s" })
        const second = yield* created(h, { agent_id: "hello", session: "s" })
        const lease = yield* claim(h, first.id)
        const submit = yield* submitSendEmail(h, first.id, lease)
        const approvalId = JSON.parse(submit.body).approval_id as string
        expect((yield* getExecution(h, first.id)).status).toBe("blocked")
        expect((yield* getExecution(h, second.id)).status).toBe("pending")
        yield* h.send("POST", `/v0/approvals/${approvalId}/deny`, { body: "{\"decided_by\":\"alice\"}" })
        expect((yield* getExecution(h, first.id)).status).toBe("running")
        expect((yield* getExecution(h, second.id)).status).toBe("pending")
        yield* complete(h, first.id, "{\"output\":null}")
        expect((yield* getExecution(h, second.id)).status).toBe("running")
      }))

    it.effect("a pending execution can be cancelled: it is never admitted", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const first = yield* created(h, { agent_id: "hello", session: "s" })
        const second = yield* created(h, { agent_id: "hello", session: "s" })
        const third = yield* created(h, { agent_id: "hello", session: "s" })
        expect((yield* h.send("POST", `/v0/executions/${second.id}/cancel`)).status).toBe(204)
        expect(yield* eventsFrom(h, second.id)).toEqual([
          ["execution.created", { execution_id: second.id, session: "s", status: "pending" }],
          ["execution.cancelled", { execution_id: second.id, reason: "client_cancelled", status: "cancelled" }]
        ])
        expect((yield* getExecution(h, first.id)).status).toBe("running")
        expect((yield* getExecution(h, third.id)).status).toBe("pending")
        yield* complete(h, first.id, "{\"output\":1}")
        expect(yield* eventTypes(h, second.id)).toEqual(["execution.created", "execution.cancelled"])
        expect(yield* getExecution(h, third.id)).toMatchObject({ status: "running", parent_execution_id: first.id })
      }))

    it.effect("the admission sweep finds nothing to do while admission happens on every end", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        yield* created(h, { agent_id: "hello", session: "s" })
        yield* created(h, { agent_id: "hello", session: "s" })
        expect(yield* h.core.admitSessions()).toBe(0)
      }))

    it.effect("a session filled in the seed stage is admitted by the sweep once the kernel speaks the current stage", () =>
      Effect.gen(function*() {
        const core = yield* Core.make({ stage: "current" })
        yield* core.registerAgent({ id: "hello", webhookUrl: "http://localhost:5000/webhook", secret: "s" })
        const first = yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined, session: "s" })
        const second = yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined, session: "s" })
        yield* core.updateSettings({ stage: "seed" })
        yield* core.cancelExecution(first.id) // the seed stage admits nothing
        expect((yield* core.getExecution(second.id)).status).toBe("pending")
        yield* core.updateSettings({ stage: "current" })
        expect(yield* core.admitSessions()).toBe(1)
        expect((yield* core.getExecution(second.id)).status).toBe("running")
      }))

    it.effect("deadlines run from creation: an expired pending execution is cancelled deadline_exceeded", () =>
      Effect.gen(function*() {
        const core = yield* Core.make({ stage: "current", deadlineMs: 60_000 })
        yield* core.registerAgent({ id: "hello", webhookUrl: "http://localhost:5000/webhook", secret: "s" })
        const first = yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined, session: "s" })
        yield* TestClock.adjust("30 seconds")
        const second = yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined, session: "s" })
        const third = yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined, session: "s" })
        expect(second).toMatchObject({ status: "pending", deadlineAtMs: 90_000 })
        expect((yield* core.eventLog(second.id))[0]!.payload).toBe(
          `{"deadline_at":"1970-01-01T00:01:30Z","execution_id":"${second.id}","session":"s","status":"pending"}`
        )
        yield* TestClock.adjust("30 seconds")
        expect(yield* core.cancelPastDeadline()).toBe(1)
        expect(yield* core.getExecution(first.id)).toMatchObject({ status: "cancelled", failureReason: "deadline_exceeded" })
        // the first one's end admitted the second: its deadline still counts from its creation
        const admitted = yield* core.eventLog(second.id)
        expect(admitted.map((e) => e.type)).toEqual(["execution.created", "execution.started", "dispatch.queued"])
        expect(admitted[1]!.payload).toBe(
          `{"deadline_at":"1970-01-01T00:01:30Z","execution_id":"${second.id}","session":"s","status":"running"}`
        )
        yield* TestClock.adjust("30 seconds")
        expect(yield* core.cancelPastDeadline()).toBe(2)
        expect(yield* core.getExecution(third.id)).toMatchObject({ status: "cancelled", failureReason: "deadline_exceeded" })
        expect((yield* core.eventLog(third.id)).map((e) => [e.type, e.payload])).toEqual([
          [
            "execution.created",
            `{"deadline_at":"1970-01-01T00:01:30Z","execution_id":"${third.id}","session":"s","status":"pending"}`
          ],
          [
            "execution.cancelled",
            `{"execution_id":"${third.id}","reason":"deadline_exceeded","status":"cancelled"}`
          ]
        ])
      }))
  })

  describe("explicit parent (C.4.1 step 5)", () => {
    it.effect("a completed execution of the same agent; otherwise 409 with nothing created", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const runningOne = yield* created(h, { agent_id: "hello" })
        const otherAgent = yield* created(h, { agent_id: "other" })
        yield* complete(h, otherAgent.id, "{\"output\":1}", "other")
        const before = yield* allIds(h)
        for (const parent of [runningOne.id, otherAgent.id]) {
          expect(yield* create(h, { agent_id: "hello", parent_execution_id: parent })).toMatchObject({
            status: 409,
            body: PARENT_CONFLICT
          })
        }
        expect(yield* allIds(h)).toEqual(before)
        yield* complete(h, runningOne.id, "{\"output\":{\"a\":1},\"state\":{\"s\":1}}")
        const child = yield* created(h, { agent_id: "hello", parent_execution_id: runningOne.id })
        expect(child).toMatchObject({ status: "running", parent_execution_id: runningOne.id })
        expect(yield* eventsFrom(h, child.id)).toMatchObject([
          ["execution.created", { execution_id: child.id, status: "pending" }],
          ["execution.started", { execution_id: child.id, parent_execution_id: runningOne.id, status: "running" }],
          ["dispatch.queued", {}]
        ])
        expect(yield* previous(h, child.id)).toMatchObject({ status: 200, body: "{\"state\":{\"s\":1}}\n" })
      }))

    it.effect("with a session: the session must be new, and the explicit parent wins over any head", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const root = yield* created(h, { agent_id: "hello" })
        yield* complete(h, root.id, "{\"output\":\"root\"}")
        const inSession = yield* created(h, { agent_id: "hello", session: "s" })
        const before = yield* allIds(h)
        expect(yield* create(h, { agent_id: "hello", session: "s", parent_execution_id: root.id })).toMatchObject({
          status: 409,
          body: errorBody("conflict", "conflict: session \"s\" already has executions")
        })
        expect(
          yield* create(h, { agent_id: "hello", session: "quote\"d", parent_execution_id: inSession.id })
        ).toMatchObject({ status: 409, body: PARENT_CONFLICT })
        expect(yield* allIds(h)).toEqual(before)
        const branch = yield* created(h, { agent_id: "hello", session: "branch", parent_execution_id: root.id })
        expect(branch).toMatchObject({ status: "running", session: "branch", parent_execution_id: root.id })
        yield* complete(h, branch.id, "{\"output\":\"b1\"}")
        const next = yield* created(h, { agent_id: "hello", session: "branch" })
        expect(next).toMatchObject({ status: "running", parent_execution_id: branch.id })
        expect(yield* previous(h, next.id)).toMatchObject({ body: "{\"state\":\"b1\"}\n" })
      }))
  })

  describe("state and previous (C.4.5, C.4.6)", () => {
    it.effect("state is stored when present and not null, and shown in no event and no execution JSON", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const first = yield* created(h, { agent_id: "hello", session: "s" })
        yield* complete(h, first.id, "{\"output\":{\"answer\":42},\"state\":{ \"messages\" : [] }}")
        const res = yield* h.send("GET", `/v0/executions/${first.id}`)
        expect(res.body).not.toContain("messages")
        expect((yield* h.send("GET", `/v0/executions/${first.id}/events`)).body).not.toContain("messages")
        expect((yield* eventsFrom(h, first.id)).at(-1)).toEqual([
          "execution.completed",
          { execution_id: first.id, output: { answer: 42 }, status: "completed" }
        ])
        const second = yield* created(h, { agent_id: "hello", session: "s" })
        expect(yield* previous(h, second.id)).toMatchObject({ status: 200, body: "{\"state\":{\"messages\":[]}}\n" })
        // a null state is not stored: the output is read instead
        yield* complete(h, second.id, "{\"output\":{\"answer\":43},\"state\":null}")
        const third = yield* created(h, { agent_id: "hello", session: "s" })
        expect(yield* previous(h, third.id)).toMatchObject({ status: 200, body: "{\"state\":{\"answer\":43}}\n" })
        // neither state nor output: null
        yield* complete(h, third.id, "{}")
        const fourth = yield* created(h, { agent_id: "hello", session: "s" })
        expect(yield* previous(h, fourth.id)).toMatchObject({ status: 200, body: "{\"state\":null}\n" })
      }))

    it.effect("previous: a dual route — 400, 404, 403 for another agent's execution, bearer reads any", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id } = yield* running(h)
        expect(yield* previous(h, id)).toEqual({
          status: 200,
          headers: { "content-type": "application/json; charset=utf-8" },
          body: "{\"state\":null}\n"
        })
        expect(yield* h.send("GET", `/v0/executions/${id}/previous`)).toMatchObject({
          status: 200,
          body: "{\"state\":null}\n"
        })
        expect(yield* previous(h, "not-a-uuid")).toMatchObject({ status: 400, body: VALIDATION })
        expect(yield* h.send("GET", "/v0/executions/not-a-uuid/previous")).toMatchObject({ status: 400, body: VALIDATION })
        expect(yield* previous(h, UNKNOWN_ID)).toMatchObject({ status: 404, body: NOT_FOUND })
        expect(yield* h.send("GET", `/v0/executions/${UNKNOWN_ID}/previous`)).toMatchObject({
          status: 404,
          body: NOT_FOUND
        })
        expect(yield* previous(h, id, "other")).toMatchObject({ status: 403, body: FORBIDDEN })
        expect((yield* h.send("POST", `/v0/executions/${id}/previous`)).status).toBe(405)
      }))

    it.effect("the C.14 previous vector is accepted as signed", () =>
      Effect.gen(function*() {
        const v = v1Vector("previous_get")
        const { handle } = yield* vectorKernel(v, { claimed: false })
        const res = yield* handle(vectorRequest(v))
        expect(res.status).toBe(200)
        expect(res.body).toBe("{\"state\":null}\n")
      }))

    it.effect("the C.14 complete-with-state vector passes the signature; a stale lease changes nothing", () =>
      Effect.gen(function*() {
        const { core, id } = yield* expectVectorLeaseSuperseded(v1Vector("complete_with_state"))
        expect((yield* core.getExecution(id)).status).toBe("running")
      }))

    it.effect("complete keeps its other answers: 409 execution_terminal once finished, strict body", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id, lease } = yield* running(h)
        expect(
          yield* h.agent("hello", "POST", `/v0/executions/${id}/complete`, "{\"output\":1,\"status\":2}", lease)
        ).toMatchObject({ status: 400, body: VALIDATION })
        expect((yield* getExecution(h, id)).status).toBe("running")
        expect((yield* h.agent("hello", "POST", `/v0/executions/${id}/complete`, "{\"state\":[1]}", lease)).status).toBe(204)
        expect(yield* h.agent("hello", "POST", `/v0/executions/${id}/complete`, "{\"output\":2}", lease)).toMatchObject({
          status: 409,
          body: EXECUTION_TERMINAL
        })
      }))
  })

  describe("listing (C.4.7)", () => {
    it.effect("session filters by exact session, with the other filters and paging", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const a1 = yield* created(h, { agent_id: "hello", session: "a" })
        yield* TestClock.adjust("1 millis")
        const b1 = yield* created(h, { agent_id: "hello", session: "b" })
        yield* TestClock.adjust("1 millis")
        const a2 = yield* created(h, { agent_id: "other", session: "a" })
        yield* TestClock.adjust("1 millis")
        const a3 = yield* created(h, { agent_id: "hello", session: "a" })
        yield* TestClock.adjust("1 millis")
        yield* created(h, { agent_id: "hello" })
        const ids = (body: string) =>
          (JSON.parse(body).executions as ReadonlyArray<{ readonly id: string }> | null)?.map((e) => e.id) ?? null
        const list = (query: string) => h.send("GET", "/v0/executions" + query)
        expect(ids((yield* list("?session=a")).body)).toEqual([a3.id, a2.id, a1.id])
        expect(ids((yield* list("?session=a&agent_id=hello")).body)).toEqual([a3.id, a1.id])
        expect(ids((yield* list("?session=a&status=pending")).body)).toEqual([a3.id, a2.id])
        expect(ids((yield* list("?session=b")).body)).toEqual([b1.id])
        const page = JSON.parse((yield* list("?session=a&limit=2")).body)
        expect(page.next_cursor).toBe(a2.id)
        expect(ids((yield* list(`?session=a&cursor=${a2.id}`)).body)).toEqual([a1.id])
        expect((yield* list("?session=A")).body).toBe("{\"executions\":null}\n")
        expect(ids((yield* list("")).body)!.length).toBe(5)
      }))
  })

  describe("other answers of the current stage", () => {
    it.effect("cancel of a terminal execution is 409 conflict (C.10)", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { id } = yield* running(h)
        expect((yield* h.send("POST", `/v0/executions/${id}/cancel`)).status).toBe(204)
        const log = yield* h.core.eventLog(id)
        expect(yield* h.send("POST", `/v0/executions/${id}/cancel`)).toMatchObject({
          status: 409,
          body: errorBody("conflict", "conflict: execution is already terminal")
        })
        expect(yield* h.core.eventLog(id)).toEqual(log)
        expect(yield* h.send("POST", `/v0/executions/${UNKNOWN_ID}/cancel`)).toMatchObject({
          status: 404,
          body: NOT_FOUND
        })
      }))

    it.effect("heartbeat of an unknown execution is 404 before the lease (C.10)", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const { lease } = yield* running(h)
        expect(yield* h.agent("hello", "POST", `/v0/executions/${UNKNOWN_ID}/heartbeat`, "", lease)).toMatchObject({
          status: 404,
          body: NOT_FOUND
        })
      }))

    it.effect("complete/fail of a step that is neither settled nor executing is 409 conflict (C.8.7)", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        yield* h.core.loadPolicy("hello", APPROVE_SEND_EMAIL)
        const { id, lease } = yield* running(h)
        const submit = yield* submitSendEmail(h, id, lease)
        const { approval_id: approvalId, step_id: stepId } = JSON.parse(submit.body)
        const seq = (yield* h.core.eventLog(id)).length
        for (const outcome of ["complete", "fail"]) {
          const body = outcome === "complete" ? "{\"result\":1}" : "{\"error\":{\"message\":\"x\"}}"
          expect(yield* h.agent("hello", "POST", `/v0/executions/${id}/steps/${stepId}/${outcome}`, body, lease))
            .toMatchObject({
              status: 409,
              body: errorBody("conflict", "conflict: cannot record outcome for step in status awaiting_approval")
            })
        }
        yield* h.send("POST", `/v0/approvals/${approvalId}/grant`, { body: "{\"decided_by\":\"alice\"}" })
        const next = yield* claim(h, id)
        expect(
          yield* h.agent("hello", "POST", `/v0/executions/${id}/steps/${stepId}/complete`, "{\"result\":1}", next)
        ).toMatchObject({
          status: 409,
          body: errorBody("conflict", "conflict: cannot record outcome for step in status allowed")
        })
        expect((yield* h.core.eventLog(id)).slice(seq).map((e) => e.type)).toEqual([
          "approval.granted",
          "step.allowed",
          "execution.resumed",
          "dispatch.queued"
        ])
        expect((yield* h.core.getStep(id, stepId)).status).toBe("allowed")
      }))
  })

  describe("older stages", () => {
    for (const stage of ["seed", "v0.14.0"] as const) {
      it.effect(`${stage}: session members and state are unknown members, previous and suspend are no routes`, () =>
        Effect.gen(function*() {
          const h = yield* harness({}, { stage })
          for (
            const body of [
              "{\"agent_id\":\"hello\",\"session\":\"s\"}",
              "{\"agent_id\":\"hello\",\"idempotency_key\":\"k\"}",
              `{"agent_id":"hello","parent_execution_id":"${UNKNOWN_ID}"}`,
              `{"agent_id":"hello","spawned_by":{"execution_id":"${UNKNOWN_ID}","step_id":"a"}}`
            ]
          ) {
            expect(yield* h.send("POST", "/v0/executions", { body })).toMatchObject({ status: 400, body: VALIDATION })
          }
          const { id, lease } = yield* running(h)
          expect(
            yield* h.agentSha256("hello", "POST", `/v0/executions/${id}/complete`, "{\"output\":1,\"state\":{}}", lease)
          ).toMatchObject({ status: 400, body: VALIDATION })
          expect(yield* h.agentSha256("hello", "GET", `/v0/executions/${id}/previous`)).toMatchObject({
            status: 404,
            body: NOT_FOUND_PAGE
          })
          expect(yield* h.agentSha256("hello", "POST", `/v0/executions/${id}/suspend`, "", lease)).toMatchObject({
            status: 404,
            body: NOT_FOUND_PAGE
          })
          expect((yield* getExecution(h, id)).status).toBe("running")
        }))
    }
  })
})
