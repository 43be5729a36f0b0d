/**
 * Scoped API keys on the wire (PROTOCOL-CURRENT C.9.1, C.9.2, C.14): the token
 * format and stored hash, the `/v0/api-keys` routes, bearer authentication
 * with the bootstrap token and keys, and the scope of every bearer route.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { TestClock } from "effect/testing"
import * as ApiKeys from "../../src/kernel/internal/apiKeys.js"
import * as Routes from "../../src/kernel/Routes.js"
import {
  type Answer,
  FORBIDDEN,
  harness,
  type Harness,
  JSON_TYPE,
  NOT_FOUND,
  NOT_FOUND_PAGE,
  running,
  UNAUTHORIZED,
  UNKNOWN_ID,
  VALIDATION
} from "../support/currentRoutes.js"
import { vectors } from "../support/currentVectors.js"

const TOKEN = /^rbk_[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.[A-Za-z0-9_-]{43}$/
const NAME_AND_SCOPES =
  "{\"code\":\"validation_error\",\"message\":\"validation error: name and scopes are required\"}\n"
const BOOTSTRAP = "bootstrap-token"

const bearer = (token: string) => ({ Authorization: `Bearer ${token}` })

/** Creates a key over the wire (dev mode or with `auth`) and returns its answer. */
const createKey = (h: Harness, name: string, scopes: ReadonlyArray<string>, auth: Record<string, string> = {}) =>
  Effect.map(
    h.send("POST", "/v0/api-keys", { body: JSON.stringify({ name, scopes }), headers: auth }),
    (res) => ({ res, key: JSON.parse(res.body) as { id: string; token: string; scopes: Array<string> } })
  )

const listKeys = (h: Harness) => Effect.map(h.send("GET", "/v0/api-keys"), (res) => JSON.parse(res.body) as Array<unknown>)

describe("API key tokens (C.9.1, C.14)", () => {
  it("the C.14 api_key vector: token format and stored SHA-256", () => {
    const { secret_part_length, stored_sha256, token } = vectors.api_key
    const secret = Uint8Array.from({ length: 32 }, (_, i) => i)
    expect(ApiKeys.formatToken("01920000-0000-7000-8000-0000000000aa", secret)).toBe(token)
    expect(token.split(".")[1]).toHaveLength(secret_part_length)
    expect(ApiKeys.hashToken(token)).toBe(stored_sha256)
    expect(ApiKeys.parseToken(token)).toBe("01920000-0000-7000-8000-0000000000aa")
  })

  it("malformed tokens name no key", () => {
    const { token } = vectors.api_key
    for (
      const bad of [
        token.replace("rbk_", "rbx_"),
        token.replace("rbk_", "RBK_"),
        token.slice(0, -1),
        token + "A",
        token.replace("AAEC", "AA+C"),
        "rbk_not-a-uuid." + "A".repeat(43),
        "rbk_01920000-0000-7000-8000-0000000000aa" + "A".repeat(44),
        ""
      ]
    ) expect(ApiKeys.parseToken(bad)).toBeUndefined()
  })
})

describe("/v0/api-keys (C.9.2)", () => {
  it.effect("create answers 201 with the token once, no-store; scopes sorted and de-duplicated, name trimmed", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* TestClock.setTime(Date.UTC(2025, 4, 6, 7, 8, 9))
      const { key, res } = yield* createKey(h, "  reader ", ["executions:read", "agents:read", "executions:read"])
      expect(res.status).toBe(201)
      expect(res.headers).toEqual({ "content-type": JSON_TYPE, "cache-control": "no-store" })
      expect(key.token).toMatch(TOKEN)
      expect(key.token.slice(4, 40)).toBe(key.id)
      expect(res.body).toBe(
        `{"id":"${key.id}","name":"reader","scopes":["agents:read","executions:read"],` +
          `"created_at":"2025-05-06T07:08:09Z","token":"${key.token}"}\n`
      )
      // only the hash is kept
      const [stored] = yield* h.core.listApiKeys()
      expect(stored!.tokenHash).toBe(ApiKeys.hashToken(key.token))
      expect(JSON.stringify(stored)).not.toContain(key.token.split(".")[1])
      // the list never shows the token
      const listed = yield* h.send("GET", "/v0/api-keys")
      expect(listed).toEqual({
        status: 200,
        headers: { "content-type": JSON_TYPE },
        body:
          `[{"id":"${key.id}","name":"reader","scopes":["agents:read","executions:read"],"created_at":"2025-05-06T07:08:09Z"}]\n`
      })
    }))

  it.effect("bad create bodies are 400 with the exact message and create nothing", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const cases: ReadonlyArray<readonly [string, string]> = [
        ["{\"name\":\"\",\"scopes\":[\"executions:read\"]}", NAME_AND_SCOPES],
        ["{\"name\":\"   \",\"scopes\":[\"executions:read\"]}", NAME_AND_SCOPES],
        [JSON.stringify({ name: "x".repeat(201), scopes: ["executions:read"] }), NAME_AND_SCOPES],
        [JSON.stringify({ name: "é".repeat(101), scopes: ["executions:read"] }), NAME_AND_SCOPES],
        ["{\"name\":\"k\",\"scopes\":[]}", NAME_AND_SCOPES],
        ["{\"name\":\"k\"}", NAME_AND_SCOPES],
        ["{\"name\":\"k\",\"scopes\":null}", NAME_AND_SCOPES],
        ["{\"scopes\":[\"executions:read\"]}", NAME_AND_SCOPES],
        [
          "{\"name\":\"k\",\"scopes\":[\"executions:read\",\"executions:admin\"]}",
          "{\"code\":\"validation_error\",\"message\":\"validation error: unknown scope \\\"executions:admin\\\"\"}\n"
        ],
        ["{\"name\":\"k\",\"scopes\":\"executions:read\"}", VALIDATION],
        ["{\"name\":\"k\",\"scopes\":[1]}", VALIDATION],
        ["{\"name\":\"k\",\"scopes\":[\"executions:read\"],\"ttl\":1}", VALIDATION],
        ["{\"name\":1,\"scopes\":[\"executions:read\"]}", VALIDATION],
        ["nope", VALIDATION]
      ]
      for (const [body, expected] of cases) {
        const res = yield* h.send("POST", "/v0/api-keys", { body })
        expect([body, res.status, res.body]).toEqual([body, 400, expected])
      }
      expect(yield* listKeys(h)).toEqual([])
      // 200 bytes is the limit
      expect((yield* createKey(h, "x".repeat(200), ["executions:read"])).res.status).toBe(201)
    }))

  it.effect("rotate: same id, scopes and created_at, a new token; the old one stops working", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const { key } = yield* createKey(h, "reader", ["executions:read"])
      const path = "/v0/executions"
      expect((yield* h.send("GET", path, { headers: bearer(key.token) })).status).toBe(200)
      yield* TestClock.adjust("1 hour")
      const rotated = yield* h.send("POST", `/v0/api-keys/${key.id}/rotate`)
      expect(rotated.status).toBe(200)
      expect(rotated.headers).toEqual({ "content-type": JSON_TYPE, "cache-control": "no-store" })
      const body = JSON.parse(rotated.body)
      expect(body).toEqual({ ...key, token: body.token })
      expect(Object.keys(body)).toEqual(["id", "name", "scopes", "created_at", "token"])
      expect(body.token).not.toBe(key.token)
      expect(body.token).toMatch(TOKEN)
      expect(yield* h.send("GET", path, { headers: bearer(key.token) })).toMatchObject({ status: 401, body: UNAUTHORIZED })
      expect((yield* h.send("GET", path, { headers: bearer(body.token) })).status).toBe(200)
    }))

  it.effect("rotate: unknown 404, revoked 409 conflict, bad id 400", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const { key } = yield* createKey(h, "reader", ["executions:read"])
      expect(yield* h.send("POST", `/v0/api-keys/${UNKNOWN_ID}/rotate`)).toMatchObject({ status: 404, body: NOT_FOUND })
      expect(yield* h.send("POST", "/v0/api-keys/nope/rotate")).toMatchObject({ status: 400, body: VALIDATION })
      expect((yield* h.send("DELETE", `/v0/api-keys/${key.id}`)).status).toBe(204)
      const before = yield* listKeys(h)
      expect(yield* h.send("POST", `/v0/api-keys/${key.id}/rotate`)).toEqual({
        status: 409,
        headers: { "content-type": JSON_TYPE },
        body: "{\"code\":\"conflict\",\"message\":\"conflict\"}\n"
      })
      expect(yield* listKeys(h)).toEqual(before)
    }))

  it.effect("delete revokes (listed with revoked_at), is repeatable, and the key stops working", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      yield* TestClock.setTime(Date.UTC(2025, 0, 1))
      const a = (yield* createKey(h, "a", ["executions:read"])).key
      yield* TestClock.adjust("1 minute")
      const b = (yield* createKey(h, "b", ["agents:read"])).key
      const del = yield* h.send("DELETE", `/v0/api-keys/${a.id}`)
      expect(del).toEqual({ status: 204, headers: {}, body: "" })
      expect(yield* h.send("DELETE", `/v0/api-keys/${a.id}`)).toEqual(del)
      expect(yield* h.send("DELETE", `/v0/api-keys/${UNKNOWN_ID}`)).toEqual(del)
      expect(yield* listKeys(h)).toEqual([
        {
          id: a.id,
          name: "a",
          scopes: ["executions:read"],
          created_at: "2025-01-01T00:00:00Z",
          revoked_at: "2025-01-01T00:01:00Z"
        },
        { id: b.id, name: "b", scopes: ["agents:read"], created_at: "2025-01-01T00:01:00Z" }
      ])
      expect(yield* h.send("GET", "/v0/executions", { headers: bearer(a.token) })).toMatchObject({
        status: 401,
        body: UNAUTHORIZED
      })
    }))

  it.effect("the seed and v0.14.0 stages have no key routes", () =>
    Effect.gen(function*() {
      for (const stage of ["seed", "v0.14.0"] as const) {
        const h = yield* harness({}, { stage })
        const res = yield* h.send("POST", "/v0/api-keys", { body: "{\"name\":\"k\",\"scopes\":[\"executions:read\"]}" })
        expect([res.status, res.body]).toEqual([404, NOT_FOUND_PAGE])
        expect((yield* h.send("GET", "/v0/api-keys")).status).toBe(404)
      }
    }))
})

describe("bearer authentication (C.9.1)", () => {
  it.effect("dev mode: no header is full access; any Authorization header must be a valid key", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      expect((yield* h.send("GET", "/v0/agents")).status).toBe(200)
      for (const header of ["Bearer nope", "Basic abc", "bearer x", vectors.api_key.token, "Bearer " + vectors.api_key.token]) {
        const res = yield* h.send("GET", "/v0/agents", { headers: { Authorization: header } })
        expect([header, res.status, res.body]).toEqual([header, 401, UNAUTHORIZED])
      }
      const { key } = yield* createKey(h, "agents", ["agents:read"])
      expect((yield* h.send("GET", "/v0/agents", { headers: bearer(key.token) })).status).toBe(200)
      expect(yield* h.send("GET", "/v0/executions", { headers: bearer(key.token) })).toMatchObject({
        status: 403,
        body: FORBIDDEN
      })
      // the seed stage's dev mode lets every request through, whatever it carries
      const seed = yield* harness({}, { stage: "seed" })
      expect((yield* seed.send("GET", "/v0/agents", { headers: { Authorization: "Bearer nope" } })).status).toBe(200)
    }))

  it.effect("the bootstrap token is full access, case-sensitive, with the exact Bearer prefix", () =>
    Effect.gen(function*() {
      const h = yield* harness({ apiToken: Redacted.make(BOOTSTRAP) })
      expect(yield* h.send("GET", "/v0/agents")).toMatchObject({ status: 401, body: UNAUTHORIZED })
      for (const header of [`bearer ${BOOTSTRAP}`, `Bearer ${BOOTSTRAP.toUpperCase()}`, `Bearer  ${BOOTSTRAP}`, BOOTSTRAP]) {
        expect((yield* h.send("GET", "/v0/agents", { headers: { Authorization: header } })).status).toBe(401)
      }
      expect((yield* h.send("GET", "/v0/agents", { headers: bearer(BOOTSTRAP) })).status).toBe(200)
      // keys need api_keys:manage to be managed; the bootstrap token holds every scope
      const { key, res } = yield* createKey(h, "manager", ["api_keys:manage"], bearer(BOOTSTRAP))
      expect(res.status).toBe(201)
      const created = yield* createKey(h, "reader", ["executions:read"], bearer(key.token))
      expect(created.res.status).toBe(201)
      expect(yield* h.send("GET", "/v0/agents", { headers: bearer(created.key.token) })).toMatchObject({
        status: 403,
        body: FORBIDDEN
      })
      expect(yield* h.send("GET", "/v0/api-keys", { headers: bearer(created.key.token) })).toMatchObject({
        status: 403,
        body: FORBIDDEN
      })
      // a key with the right id and a wrong secret part
      const forged = created.key.token.slice(0, -4) + (created.key.token.endsWith("AAAA") ? "BBBB" : "AAAA")
      expect((yield* h.send("GET", "/v0/executions", { headers: bearer(forged) })).status).toBe(401)
    }))

  it("the scope table is C.9.1's", () => {
    expect(Routes.bearerScopes).toEqual({
      "POST /v0/executions": ["executions:write"],
      "POST /v0/executions/{id}/cancel": ["executions:write"],
      "POST /v0/executions/{id}/fork": ["executions:write"],
      "GET /v0/executions": ["executions:read"],
      "GET /v0/executions/{id}": ["executions:read"],
      "GET /v0/executions/{id}/events": ["executions:read"],
      "GET /v0/executions/{id}/stream": ["executions:read"],
      "GET /v0/executions/{id}/fork-points": ["executions:read"],
      "GET /v0/executions/{id}/previous": ["executions:read"],
      "GET /v0/executions/{id}/steps": ["executions:read"],
      "GET /v0/executions/{id}/steps/{step_id}": ["executions:read"],
      "GET /v0/approvals": ["approvals:read"],
      "GET /v0/approvals/{id}": ["approvals:read"],
      "POST /v0/approvals/{id}/grant": ["approvals:write"],
      "POST /v0/approvals/{id}/deny": ["approvals:write"],
      "GET /v0/agents": ["agents:read"],
      "GET /v0/agents/{id}": ["agents:read"],
      "POST /v0/agents": ["agents:write"],
      "DELETE /v0/agents/{id}": ["agents:write"],
      "POST /v0/policies/{agent_id}": ["policies:write"],
      "POST /v0/policies/{agent_id}/test": ["policies:write", "executions:read"],
      "POST /v0/api-keys": ["api_keys:manage"],
      "GET /v0/api-keys": ["api_keys:manage"],
      "POST /v0/api-keys/{id}/rotate": ["api_keys:manage"],
      "DELETE /v0/api-keys/{id}": ["api_keys:manage"]
    })
  })

  it.effect("every bearer route: a key without its scope is 403 and changes nothing; with it, it runs", () =>
    Effect.gen(function*() {
      const h = yield* harness()
      const { id } = yield* running(h)
      const step = "a".repeat(64)
      const routes: ReadonlyArray<readonly [string, string, string, ReadonlyArray<string>]> = [
        ["POST", "/v0/executions", "{\"agent_id\":\"hello\"}", ["executions:write"]],
        ["POST", `/v0/executions/${UNKNOWN_ID}/cancel`, "", ["executions:write"]],
        ["GET", "/v0/executions", "", ["executions:read"]],
        ["GET", `/v0/executions/${id}`, "", ["executions:read"]],
        ["GET", `/v0/executions/${id}/events`, "", ["executions:read"]],
        ["GET", `/v0/executions/${id}/steps`, "", ["executions:read"]],
        ["GET", `/v0/executions/${id}/steps/${step}`, "", ["executions:read"]],
        ["GET", "/v0/approvals", "", ["approvals:read"]],
        ["GET", `/v0/approvals/${UNKNOWN_ID}`, "", ["approvals:read"]],
        ["POST", `/v0/approvals/${UNKNOWN_ID}/grant`, "{\"decided_by\":\"me\"}", ["approvals:write"]],
        ["POST", `/v0/approvals/${UNKNOWN_ID}/deny`, "{\"decided_by\":\"me\"}", ["approvals:write"]],
        ["GET", "/v0/agents", "", ["agents:read"]],
        ["GET", "/v0/agents/hello", "", ["agents:read"]],
        ["POST", "/v0/agents", "{\"id\":\"new\",\"webhook_url\":\"http://127.0.0.1:9/n\",\"secret\":\"s\"}", ["agents:write"]],
        ["DELETE", "/v0/agents/nobody", "", ["agents:write"]],
        ["POST", "/v0/policies/hello", "{\"bundle\":\"\"}", ["policies:write"]],
        ["POST", "/v0/policies/hello/test", "{\"bundle\":\"\",\"cases\":[]}", ["policies:write", "executions:read"]],
        ["POST", "/v0/api-keys", "{\"name\":\"k\",\"scopes\":[\"agents:read\"]}", ["api_keys:manage"]],
        ["GET", "/v0/api-keys", "", ["api_keys:manage"]],
        ["POST", `/v0/api-keys/${UNKNOWN_ID}/rotate`, "", ["api_keys:manage"]],
        ["DELETE", `/v0/api-keys/${UNKNOWN_ID}`, "", ["api_keys:manage"]]
      ]
      const all = [
        "executions:read",
        "executions:write",
        "approvals:read",
        "approvals:write",
        "agents:read",
        "agents:write",
        "policies:write",
        "api_keys:manage"
      ]
      const snapshot = Effect.gen(function*() {
        return {
          executions: (yield* h.core.listExecutions({ agentId: "", status: "", cursor: undefined, limit: 200 }))
            .executions.length,
          agents: (yield* h.core.listAgents()).map((a) => a.id),
          keys: (yield* h.core.listApiKeys()).length,
          events: (yield* h.core.eventLog(id)).length
        }
      })
      for (const [method, path, body, needed] of routes) {
        // a key holding every other scope (write does not imply read, nor read write)
        const others = all.filter((s) => !needed.includes(s))
        const without = (yield* createKey(h, "without", others)).key
        const before = yield* snapshot
        const denied: Answer = yield* h.send(method, path, { body, headers: bearer(without.token) })
        expect([method, path, denied.status, denied.body]).toEqual([method, path, 403, FORBIDDEN])
        expect(yield* snapshot).toEqual(before)
        const withScope = (yield* createKey(h, "with", needed)).key
        const allowed = yield* h.send(method, path, { body, headers: bearer(withScope.token) })
        expect([method, path, allowed.status === 401 || allowed.status === 403]).toEqual([method, path, false])
      }
    }))

  it.effect("agent-signed requests do not reach bearer routes as agents", () =>
    Effect.gen(function*() {
      const h = yield* harness({ apiToken: Redacted.make(BOOTSTRAP) })
      const res = yield* h.agent("hello", "GET", "/v0/agents")
      expect(res).toMatchObject({ status: 401, body: UNAUTHORIZED })
    }))
})
