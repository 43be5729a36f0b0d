/**
 * The current stage's authentication, ownership and changed responses on the
 * wire (PROTOCOL-CURRENT C.2, C.3, C.9.3, C.10), through the kernel routes
 * in-process.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import * as Core from "../../src/kernel/Core.js"
import * as Dispatcher from "../../src/kernel/Dispatcher.js"
import * as Routes from "../../src/kernel/Routes.js"
import * as Signature from "../../src/Signature.js"
import {
  eventTypes,
  FORBIDDEN,
  harness,
  type Harness,
  JSON_TYPE,
  NOT_FOUND,
  NOT_FOUND_PAGE,
  request,
  running,
  SECRET,
  SUBMIT,
  UNAUTHORIZED,
  UNKNOWN_ID,
  VALIDATION
} from "../support/currentRoutes.js"
import { v1Vector, vectorRequest } from "../support/currentVectors.js"

const metadataVector = v1Vector("metadata_put")

const CONFLICT_TERMINAL = "{\"code\":\"conflict\",\"message\":\"conflict: execution is already terminal\"}\n"
const CONFLICT = "{\"code\":\"conflict\",\"message\":\"conflict\"}\n"

describe("current stage: agent signatures (C.2.1)", () => {
  it.effect("v1= signatures pass; a sha256= request signature is 401 and changes nothing", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const { id, lease } = yield* running(h)
      const before = yield* eventTypes(h, id)

      const read = yield* h.agent("hello", "GET", `/v0/executions/${id}`)
      expect(read.status).toBe(200)
      expect(JSON.parse(read.body)).toMatchObject({ id, agent_id: "hello", status: "running" })

      for (const [method, path, body] of [
        ["GET", `/v0/executions/${id}`, ""],
        ["POST", `/v0/executions/${id}/steps`, SUBMIT],
        ["POST", `/v0/executions/${id}/heartbeat`, ""],
        ["POST", `/v0/executions/${id}/complete`, "{\"output\":1}"],
        ["POST", `/v0/executions/${id}/fail`, "{\"error\":\"x\"}"]
      ] as const) {
        const res = yield* h.agentSha256("hello", method, path, body, lease)
        expect(res).toEqual({ status: 401, headers: { "content-type": JSON_TYPE }, body: UNAUTHORIZED })
      }
      expect(yield* eventTypes(h, id)).toEqual(before)
      expect((yield* h.core.getExecution(id)).status).toBe("running")
      expect(yield* h.core.listSteps(id, false)).toEqual([])
    }))

  it.effect("the ±300 s window is inclusive; one second outside is 401", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const { id } = yield* running(h)
      const now = 1_700_000_000
      yield* TestClock.setTime(now * 1000)
      const path = `/v0/executions/${id}`
      const at = (ts: number) =>
        Effect.gen(function*() {
          const signature = yield* Signature.signV1(SECRET, {
            method: "GET",
            target: path,
            timestamp: String(ts),
            dispatchId: "",
            dispatchAttempt: "",
            body: ""
          })
          const res = yield* h.send("GET", path, {
            headers: { "Rebuno-Agent-Id": "hello", "Rebuno-Timestamp": String(ts), "Rebuno-Signature": signature }
          })
          return res.status
        })
      expect(yield* at(now - 300)).toBe(200)
      expect(yield* at(now + 300)).toBe(200)
      expect(yield* at(now - 301)).toBe(401)
      expect(yield* at(now + 301)).toBe(401)
    }))

  it.effect("middleware order: empty ids, unknown agent, oversized body, bad signature — all 401", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const { id, lease } = yield* running(h)
      const path = `/v0/executions/${id}/heartbeat`
      const good = yield* h.agent("hello", "POST", path, "", lease)
      expect(good.status).toBe(204)
      const signature = yield* Signature.signV1(SECRET, {
        method: "POST",
        target: path,
        timestamp: "0",
        dispatchId: lease["Rebuno-Dispatch-Id"]!,
        dispatchAttempt: lease["Rebuno-Dispatch-Attempt"]!,
        body: ""
      })
      const cases: ReadonlyArray<Record<string, string>> = [
        { "Rebuno-Timestamp": "0", "Rebuno-Signature": signature, ...lease },
        { "Rebuno-Agent-Id": "hello", "Rebuno-Timestamp": "0", ...lease },
        { "Rebuno-Agent-Id": "ghost", "Rebuno-Timestamp": "0", "Rebuno-Signature": signature, ...lease },
        { "Rebuno-Agent-Id": "other", "Rebuno-Timestamp": "0", "Rebuno-Signature": signature, ...lease },
        { "Rebuno-Agent-Id": "hello", "Rebuno-Timestamp": "1", "Rebuno-Signature": signature, ...lease },
        { "Rebuno-Agent-Id": "hello", "Rebuno-Timestamp": "0", "Rebuno-Signature": signature.toUpperCase(), ...lease }
      ]
      for (const headers of cases) {
        const res = yield* h.send("POST", path, { headers })
        expect(res.body).toBe(UNAUTHORIZED)
        expect(res.status).toBe(401)
      }
      // the body cap applies before verification: 401 on the agent path
      const big = new Uint8Array(Routes.maxBodyBytes + 1)
      const over = yield* h.send("POST", path, {
        body: big,
        headers: { "Rebuno-Agent-Id": "hello", "Rebuno-Timestamp": "0", "Rebuno-Signature": signature, ...lease }
      })
      expect(over).toEqual({ status: 401, headers: { "content-type": JSON_TYPE }, body: UNAUTHORIZED })
    }))

  it.effect("dual routes: bearer without agent headers, the agent path with either header", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const { id } = yield* running(h)
      for (const path of [`/v0/executions/${id}`, `/v0/executions/${id}/steps`]) {
        expect((yield* h.send("GET", path)).status).toBe(200)
        expect(yield* h.send("GET", path, { headers: { "Rebuno-Signature": "v1=00" } })).toMatchObject({
          status: 401,
          body: UNAUTHORIZED
        })
        expect(yield* h.send("GET", path, { headers: { "Rebuno-Agent-Id": "hello" } })).toMatchObject({
          status: 401,
          body: UNAUTHORIZED
        })
        expect((yield* h.agent("hello", "GET", path)).status).toBe(200)
      }
    }))

  it.effect("the seed stage still takes sha256= request signatures", () =>
    Effect.gen(function*() {
      const h = yield* harness({}, { stage: "seed" })
      const { id, lease } = yield* running(h)
      expect((yield* h.agentSha256("hello", "POST", `/v0/executions/${id}/heartbeat`, "", lease)).status).toBe(204)
    }))
})

describe("current stage: agent ownership (C.9.3)", () => {
  it.effect("another agent gets 403 on every agent and dual route, and nothing changes", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const { id, lease } = yield* running(h)
      const submitted = yield* h.agent("hello", "POST", `/v0/executions/${id}/steps`, SUBMIT, lease)
      const stepId = JSON.parse(submitted.body).step_id as string
      const before = yield* eventTypes(h, id)
      const step = yield* h.core.getStep(id, stepId)

      const routes: ReadonlyArray<readonly [string, string, string]> = [
        ["GET", `/v0/executions/${id}`, ""],
        ["GET", `/v0/executions/${id}/steps`, ""],
        ["GET", `/v0/executions/${id}/steps/${stepId}`, ""],
        ["POST", `/v0/executions/${id}/steps`, SUBMIT],
        ["POST", `/v0/executions/${id}/steps/${stepId}/complete`, "{\"result\":1}"],
        ["POST", `/v0/executions/${id}/steps/${stepId}/fail`, "{\"error\":{\"message\":\"x\"}}"],
        ["POST", `/v0/executions/${id}/steps/${stepId}/stream`, "{\"seq\":1,\"data\":\"x\"}"],
        ["POST", `/v0/executions/${id}/heartbeat`, ""],
        ["POST", `/v0/executions/${id}/complete`, "{\"output\":1}"],
        ["POST", `/v0/executions/${id}/fail`, "{\"error\":\"x\"}"]
      ]
      for (const [method, path, body] of routes) {
        const res = yield* h.agent("other", method, path, body, lease)
        expect([method, path, res.status, res.body]).toEqual([method, path, 403, FORBIDDEN])
      }
      expect(yield* eventTypes(h, id)).toEqual(before)
      expect(yield* h.core.getStep(id, stepId)).toEqual(step)
      expect((yield* h.core.getExecution(id)).status).toBe("running")
      // the owner still can; a bearer principal is deployment-wide
      expect((yield* h.agent("hello", "GET", `/v0/executions/${id}/steps/${stepId}`)).status).toBe(200)
      expect((yield* h.send("GET", `/v0/executions/${id}/steps/${stepId}`)).status).toBe(200)
    }))

  it.effect("lease routes on an unknown execution are 404 before any lease check", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const { lease } = yield* running(h)
      for (const [path, body] of [
        [`/v0/executions/${UNKNOWN_ID}/heartbeat`, ""],
        [`/v0/executions/${UNKNOWN_ID}/complete`, "{}"],
        [`/v0/executions/${UNKNOWN_ID}/fail`, "{\"error\":\"x\"}"],
        [`/v0/executions/${UNKNOWN_ID}/steps`, SUBMIT],
        [`/v0/executions/${UNKNOWN_ID}/steps/${"a".repeat(64)}/complete`, "{}"]
      ] as const) {
        const res = yield* h.agent("hello", "POST", path, body, lease)
        expect([path, res.status, res.body]).toEqual([path, 404, NOT_FOUND])
      }
      expect((yield* h.agent("hello", "GET", `/v0/executions/${UNKNOWN_ID}`)).status).toBe(404)
      expect((yield* h.agent("hello", "GET", `/v0/executions/${UNKNOWN_ID}/steps`)).status).toBe(404)
      // the seed stage answers the heartbeat of an unknown execution with 409 lease_superseded
      const seed = yield* harness({}, { stage: "seed" })
      const seedLease = (yield* running(seed)).lease
      const beat = yield* seed.agentSha256("hello", "POST", `/v0/executions/${UNKNOWN_ID}/heartbeat`, "", seedLease)
      expect(beat.status).toBe(409)
    }))

  it.effect("a step of another execution is 404 on the step routes", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const a = yield* running(h)
      const b = yield* running(h)
      const submitted = yield* h.agent("hello", "POST", `/v0/executions/${a.id}/steps`, SUBMIT, a.lease)
      const stepId = JSON.parse(submitted.body).step_id as string
      const before = yield* eventTypes(h, b.id)
      for (const [method, suffix, body] of [
        ["GET", "", ""],
        ["POST", "/complete", "{\"result\":1}"],
        ["POST", "/fail", "{\"error\":{}}"],
        ["POST", "/stream", "{\"seq\":1,\"data\":\"x\"}"]
      ] as const) {
        const res = yield* h.agent("hello", method, `/v0/executions/${b.id}/steps/${stepId}${suffix}`, body, b.lease)
        expect([suffix, res.status, res.body]).toEqual([suffix, 404, NOT_FOUND])
      }
      expect((yield* h.send("GET", `/v0/executions/${b.id}/steps/${stepId}`)).status).toBe(404)
      expect(yield* eventTypes(h, b.id)).toEqual(before)
      expect((yield* h.core.getStep(a.id, stepId)).status).toBe("executing")
    }))
})

describe("current stage: the stream-delta route (C.10)", () => {
  it.effect("an executing step takes deltas; unknown 404, settled 409 conflict", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const { id, lease } = yield* running(h)
      const submitted = yield* h.agent("hello", "POST", `/v0/executions/${id}/steps`, SUBMIT, lease)
      const stepId = JSON.parse(submitted.body).step_id as string
      const delta = "{\"seq\":1,\"data\":\"tok\"}"
      const ok = yield* h.agent("hello", "POST", `/v0/executions/${id}/steps/${stepId}/stream`, delta, lease)
      expect(ok).toEqual({ status: 204, headers: {}, body: "" })
      const unknown = yield* h.agent("hello", "POST", `/v0/executions/${id}/steps/${"b".repeat(64)}/stream`, delta, lease)
      expect(unknown).toMatchObject({ status: 404, body: NOT_FOUND })
      yield* h.agent("hello", "POST", `/v0/executions/${id}/steps/${stepId}/complete`, "{\"result\":1}", lease)
      const settled = yield* h.agent("hello", "POST", `/v0/executions/${id}/steps/${stepId}/stream`, delta, lease)
      expect(settled).toEqual({ status: 409, headers: { "content-type": JSON_TYPE }, body: CONFLICT })
      // body checks come first
      const big = JSON.stringify({ seq: 1, data: "x".repeat(7001) })
      expect((yield* h.agent("hello", "POST", `/v0/executions/${id}/steps/${stepId}/stream`, big, lease)).body).toBe(
        VALIDATION
      )
    }))
})

describe("current stage: cancel (C.10)", () => {
  it.effect("cancel of a terminal execution is 409 conflict with the exact message, nothing written", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const { id } = yield* running(h)
      const first = yield* h.send("POST", `/v0/executions/${id}/cancel`)
      expect(first).toEqual({ status: 204, headers: {}, body: "" })
      const events = yield* h.core.eventLog(id)
      expect(events.at(-1)!.type).toBe("execution.cancelled")
      expect(JSON.parse(events.at(-1)!.payload)).toMatchObject({ reason: "client_cancelled", status: "cancelled" })
      const again = yield* h.send("POST", `/v0/executions/${id}/cancel`)
      expect(again).toEqual({ status: 409, headers: { "content-type": JSON_TYPE }, body: CONFLICT_TERMINAL })
      expect(yield* h.core.eventLog(id)).toEqual(events)
      expect((yield* h.send("POST", `/v0/executions/${UNKNOWN_ID}/cancel`)).body).toBe(NOT_FOUND)
      // the seed stage keeps 409 execution_terminal
      const seed = yield* harness({}, { stage: "seed" })
      const s = yield* running(seed)
      yield* seed.send("POST", `/v0/executions/${s.id}/cancel`)
      expect((yield* seed.send("POST", `/v0/executions/${s.id}/cancel`)).body).toBe(
        "{\"code\":\"execution_terminal\",\"message\":\"execution terminal\"}\n"
      )
    }))
})

describe("current stage: create and execution JSON (C.10)", () => {
  it.effect("agent_version on create is 400 and creates nothing; execution JSON has no agent_version", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      for (const v of ["\"v1\"", "null", "\"\""]) {
        const res = yield* h.send("POST", "/v0/executions", {
          body: `{"agent_id":"hello","input":{},"agent_version":${v}}`
        })
        expect(res).toEqual({ status: 400, headers: { "content-type": JSON_TYPE }, body: VALIDATION })
      }
      expect((yield* h.core.listExecutions({ agentId: "", status: "", cursor: undefined, limit: 50 })).executions)
        .toEqual([])
      const { id } = yield* running(h)
      const read = yield* h.send("GET", `/v0/executions/${id}`)
      expect(Object.keys(JSON.parse(read.body))).not.toContain("agent_version")
      // the seed stage still echoes it
      const seed = yield* harness({}, { stage: "seed" })
      const created = yield* seed.send("POST", "/v0/executions", {
        body: "{\"agent_id\":\"hello\",\"input\":{},\"agent_version\":\"v1\"}"
      })
      expect(JSON.parse(created.body).agent_version).toBe("v1")
    }))
})

describe("current stage: agents (C.10)", () => {
  it.effect("register answers 201 with the stored agent in snake_case, without the secret", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* TestClock.setTime(Date.UTC(2025, 0, 2, 3, 4, 5))
      const res = yield* h.send("POST", "/v0/agents", {
        body: "{\"id\":\"writer\",\"webhook_url\":\"http://127.0.0.1:9/hook\",\"secret\":\"s3cret\",\"lease_timeout_seconds\":30}"
      })
      expect(res).toEqual({
        status: 201,
        headers: { "content-type": JSON_TYPE },
        body:
          "{\"id\":\"writer\",\"webhook_url\":\"http://127.0.0.1:9/hook\",\"registered_at\":\"2025-01-02T03:04:05Z\",\"lease_timeout_seconds\":30}\n"
      })
      expect(res.body).not.toContain("s3cret")
      expect((yield* h.core.getAgent("writer")).leaseTimeoutMs).toBe(30_000)
      const got = yield* h.send("GET", "/v0/agents/writer")
      expect(got.body).toBe(res.body)

      // under 10 ignored; a bundle shows as policy_bundle
      const short = yield* h.send("POST", "/v0/agents", {
        body: "{\"id\":\"quick\",\"webhook_url\":\"http://127.0.0.1:9/q\",\"secret\":\"s\",\"lease_timeout_seconds\":9}"
      })
      expect(JSON.parse(short.body)).toEqual({
        id: "quick",
        webhook_url: "http://127.0.0.1:9/q",
        registered_at: "2025-01-02T03:04:05Z"
      })
      expect((yield* h.core.getAgent("quick")).leaseTimeoutMs).toBeUndefined()
      const bundle = "rules: []\n"
      expect((yield* h.send("POST", "/v0/policies/quick", { body: JSON.stringify({ bundle }) })).status).toBe(204)
      const listed = JSON.parse((yield* h.send("GET", "/v0/agents")).body) as Array<Record<string, unknown>>
      expect(listed.map((a) => a.id)).toEqual(["hello", "other", "quick", "writer"])
      expect(listed[2]).toEqual({
        id: "quick",
        webhook_url: "http://127.0.0.1:9/q",
        policy_bundle: bundle,
        registered_at: "2025-01-02T03:04:05Z"
      })
      for (const agent of listed) expect(Object.keys(agent)).not.toContain("secret")
    }))

  it.effect("registration bodies are strict; bad ones change nothing", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      for (
        const body of [
          "{\"id\":\"x\",\"webhook_url\":\"u\",\"secret\":\"s\",\"lease_timeout_seconds\":\"30\"}",
          "{\"id\":\"x\",\"webhook_url\":\"u\",\"secret\":\"s\",\"description\":\"d\"}",
          "{\"id\":\"x\",\"webhook_url\":\"u\",\"secret\":\"s\",\"lease_timeout_seconds\":1e}",
          "not json"
        ]
      ) {
        expect(yield* h.send("POST", "/v0/agents", { body })).toMatchObject({ status: 400, body: VALIDATION })
      }
      expect((yield* h.core.listAgents()).map((a) => a.id)).toEqual(["hello", "other"])
    }))

  it.effect("a registered lease timeout drives the agent's leases and webhooks", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* h.send("POST", "/v0/agents", {
        body: "{\"id\":\"slow\",\"webhook_url\":\"http://127.0.0.1:9/s\",\"secret\":\"s\",\"lease_timeout_seconds\":45}"
      })
      yield* h.send("POST", "/v0/executions", { body: "{\"agent_id\":\"slow\"}" })
      const [claim] = yield* h.core.claimDue(10)
      expect(claim!.leaseTimeoutSeconds).toBe(45)
      expect(JSON.parse(Dispatcher.webhookBody(claim!, "current"))).toMatchObject({
        dispatch_attempt: 1,
        lease_timeout_seconds: 45
      })
      const [dispatch] = yield* h.core.dispatches(claim!.executionId)
      expect(dispatch!.status).toBe("in_flight")
      // the lease lapses after 45 s, not the default 120 s
      yield* TestClock.adjust("44 seconds")
      expect(yield* h.core.reclaimStale()).toBe(0)
      yield* TestClock.adjust("2 seconds")
      expect(yield* h.core.reclaimStale()).toBe(1)
    }))
})

describe("current stage: agent metadata (C.3)", () => {
  const put = (h: Harness, agentId: string, body: string, as = agentId) =>
    h.agent(as, "PUT", `/v0/agents/${agentId}/metadata`, body)

  it.effect("the Python SDK's exact request (C.14 vector) is stored and answered 204", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* h.core.registerAgent({ id: "test-agent", webhookUrl: "http://127.0.0.1:9/t", secret: metadataVector.secret })
      yield* TestClock.setTime(Number(metadataVector.timestamp) * 1000)
      const res = yield* h.handle(vectorRequest(metadataVector, { "Content-Type": "application/json" }))
      expect(res).toEqual({ status: 204, headers: {}, body: "" })
      expect((yield* h.core.getAgent("test-agent")).metadata).toEqual({
        description: "Answers questions",
        inputSchemaRaw: null,
        outputSchemaRaw: null
      })
      // not part of the agent JSON (C.10 lists its members)
      const agent = JSON.parse((yield* h.send("GET", "/v0/agents/test-agent")).body)
      expect(Object.keys(agent)).toEqual(["id", "webhook_url", "registered_at"])
    }))

  it.effect("schemas are stored compacted; a second PUT replaces; registration keeps it", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const schema = "{\"type\": \"object\", \"properties\": {\"q\": {\"type\": \"string\"}}}"
      expect((yield* put(h, "hello", `{"description": null, "input_schema": ${schema}, "output_schema": {}}`)).status)
        .toBe(204)
      expect((yield* h.core.getAgent("hello")).metadata).toEqual({
        description: null,
        inputSchemaRaw: "{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\"}}}",
        outputSchemaRaw: "{}"
      })
      expect((yield* put(h, "hello", "{\"description\":\"v2\",\"input_schema\":null,\"output_schema\":null}")).status)
        .toBe(204)
      yield* h.core.registerAgent({ id: "hello", webhookUrl: "http://localhost:5000/webhook", secret: SECRET })
      expect((yield* h.core.getAgent("hello")).metadata).toEqual({
        description: "v2",
        inputSchemaRaw: null,
        outputSchemaRaw: null
      })
    }))

  it.effect("another agent's metadata is 403, an unknown agent 404, bad bodies 400 — nothing stored", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const valid = "{\"description\":\"d\",\"input_schema\":null,\"output_schema\":null}"
      expect(yield* put(h, "other", valid, "hello")).toMatchObject({ status: 403, body: FORBIDDEN })
      expect(yield* put(h, "ghost", valid, "hello")).toMatchObject({ status: 404, body: NOT_FOUND })
      for (
        const body of [
          "{\"description\":1,\"input_schema\":null,\"output_schema\":null}",
          "{\"description\":\"d\",\"input_schema\":[],\"output_schema\":null}",
          "{\"description\":\"d\",\"input_schema\":null,\"output_schema\":\"x\"}",
          "{\"description\":\"d\",\"input_schema\":null,\"output_schema\":null,\"version\":\"1\"}",
          "[]",
          ""
        ]
      ) {
        const res = yield* put(h, "hello", body)
        expect([body, res.status, res.body]).toEqual([body, 400, VALIDATION])
      }
      // not signed (bearer side) or sha256= signed
      expect(yield* h.send("PUT", "/v0/agents/hello/metadata", { body: valid })).toMatchObject({
        status: 401,
        body: UNAUTHORIZED
      })
      expect((yield* h.agentSha256("hello", "PUT", "/v0/agents/hello/metadata", valid)).status).toBe(401)
      expect((yield* h.core.getAgent("hello")).metadata).toBeUndefined()
      expect((yield* h.core.getAgent("other")).metadata).toBeUndefined()
    }))

  it.effect("older stages have no metadata route: plain-text 404", () =>
    Effect.gen(function*() {
      for (const stage of ["seed", "v0.14.0"] as const) {
        const h = yield* harness({}, { stage })
        const res = yield* h.agentSha256("hello", "PUT", "/v0/agents/hello/metadata", "{}")
        expect(res).toEqual({
          status: 404,
          headers: { "content-type": "text/plain; charset=utf-8", "x-content-type-options": "nosniff" },
          body: NOT_FOUND_PAGE
        })
      }
    }))
})

describe("current stage: the error envelope (C.10)", () => {
  it.effect("a failure's details reach the wire after code and message", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const failing: Core.KernelCore = {
        ...h.core,
        getAgent: () =>
          Effect.fail(
            new Core.KernelFailure({
              status: 400,
              code: "validation_error",
              message: "validation error: bad",
              details: "{\"field\":\"id\"}"
            })
          )
      }
      const res = yield* Routes.make(failing)(request("GET", "/v0/agents/x"))
      expect(res).toEqual({
        status: 400,
        headers: { "content-type": JSON_TYPE },
        body: "{\"code\":\"validation_error\",\"message\":\"validation error: bad\",\"details\":{\"field\":\"id\"}}\n"
      })
    }))
})
