/**
 * Forks in the current stage (PROTOCOL-CURRENT C.7), on the wire through the
 * kernel's routes: `POST …/fork` with its checks in order and their exact
 * messages (C.7.1), what a fork contains — steps copied under the fork's own
 * ids (the C.14 `fork_rename` vector), their events, `execution.forked`,
 * the resources restored from the checkpoint covering the fork point, a policy
 * bundle of its own, a session, the source's parent — and how it runs: the
 * copied steps replay, the rest runs live (C.7.2); `GET …/fork-points`
 * (C.7.3); and the programmatic overrides the test kit's "what if" tests use.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Core from "../../src/kernel/Core.js"
import * as Routes from "../../src/kernel/Routes.js"
import * as StepId from "../../src/StepId.js"
import {
  allIds,
  errorBody,
  FORBIDDEN,
  type Harness,
  harness,
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

const EPOCH = "1970-01-01T00:00:00Z"

const submit = (h: Harness, run: Running, target: string, extra: Record<string, unknown> = {}) =>
  Effect.map(
    h.agent(
      "hello",
      "POST",
      `/v0/executions/${run.id}/steps`,
      JSON.stringify({ kind: "tool_call", target, args: { target }, idempotency: "safe_to_retry", ...extra }),
      run.lease
    ),
    (res) => {
      expect(res.status, res.body).toBe(200)
      return JSON.parse(res.body) as Json
    }
  )

const complete = (h: Harness, run: Running, stepId: string, body: unknown) =>
  Effect.map(
    h.agent("hello", "POST", `/v0/executions/${run.id}/steps/${stepId}/complete`, JSON.stringify(body), run.lease),
    (res) => expect(res.body).toBe(RECORDED)
  )

/** Submits a step and completes it with `result`; answers its id. */
const step = (h: Harness, run: Running, target: string, result: unknown, extra: Record<string, unknown> = {}) =>
  Effect.gen(function*() {
    const decision = yield* submit(h, run, target, extra)
    expect(decision.decision).toBe("proceed")
    yield* complete(h, run, decision.step_id, { result })
    return decision.step_id as string
  })

const forkOf = (h: Harness, id: string, body: unknown, headers: Record<string, string> = {}) =>
  h.send("POST", `/v0/executions/${id}/fork`, { body: JSON.stringify(body), headers })

const forked = (h: Harness, id: string, body: unknown) =>
  Effect.map(forkOf(h, id, body), (res) => {
    expect(res.status, res.body).toBe(201)
    return JSON.parse(res.body) as Json
  })

/** Claims the fork's dispatch: its run. */
const claimRun = (h: Harness, id: string) =>
  Effect.map(h.core.claimDue(100), (claims) => {
    const claim = claims.find((c) => c.executionId === id)
    if (claim === undefined) throw new Error("no dispatch for " + id)
    return { id, lease: leaseOf(claim) } satisfies Running
  })

const apiKey = (h: Harness, scopes: ReadonlyArray<string>) =>
  Effect.map(
    h.send("POST", "/v0/api-keys", { body: JSON.stringify({ name: "k", scopes }) }),
    (res) => ({ Authorization: `Bearer ${JSON.parse(res.body).token as string}` })
  )

const DENY_LIVE = [
  "default_action: allow",
  "rules:",
  "  - id: no-b-in-forks",
  "    when: { target: b }",
  "    then: { decision: deny, reason: not in this branch }",
  ""
].join("\n")

/** A source run: step `a` settled, step `b` settled, step `c` still executing; the seq right after `a`. */
const source = (h: Harness) =>
  Effect.gen(function*() {
    const run = yield* running(h)
    const a = yield* step(h, run, "a", { n: "a" })
    const afterA = yield* seqOf(h, run.id)
    const b = yield* step(h, run, "b", { n: "b" })
    const c = (yield* submit(h, run, "c")).step_id as string
    return { run, a, b, c, afterA }
  })

const renamed = (forkId: string, target: string) =>
  StepId.make({
    executionId: forkId,
    kind: "tool_call",
    target,
    argsHash: StepId.argsHash(JSON.stringify({ target })),
    occurrence: 0
  })

// ---------------------------------------------------------------------------

describe("Forks (PROTOCOL-CURRENT C.7)", () => {
  describe("POST …/fork (C.7.1, C.7.2)", () => {
    it.effect("C.14 fork_rename: a copied step is renamed with §8.2 under the fork's execution id", () =>
      Effect.gen(function*() {
        const v = vectors.fork_rename
        const h = yield* harness()
        yield* h.core.createExecution({
          agentId: "hello",
          inputRaw: undefined,
          agentVersion: undefined,
          id: v.source_execution_id
        })
        const run = yield* claimRun(h, v.source_execution_id)
        const decision = yield* Effect.map(
          h.agent(
            "hello",
            "POST",
            `/v0/executions/${run.id}/steps`,
            `{"kind": "${v.kind}", "target": "${v.target}", "args": {"query": "hello world", "limit": 10}}`,
            run.lease
          ),
          (res) => JSON.parse(res.body) as Json
        )
        expect(decision.step_id).toBe(v.source_step_id)
        yield* complete(h, run, v.source_step_id, { result: ["r1"] })
        const { execution } = yield* h.core.fork(run.id, {
          atSeq: yield* seqOf(h, run.id),
          id: v.fork_execution_id
        })
        expect(execution.id).toBe(v.fork_execution_id)
        const copied = yield* h.core.getStep(v.fork_execution_id, v.fork_step_id)
        expect(copied).toMatchObject({
          executionId: v.fork_execution_id,
          kind: v.kind,
          target: v.target,
          argsHash: v.args_hash,
          occurrence: v.occurrence,
          status: "succeeded",
          argsRaw: "{\"query\":\"hello world\",\"limit\":10}",
          resultRaw: "[\"r1\"]"
        })
      }))

    it.effect("201 with the new execution; settled steps and their events copied; it starts at once", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const src = yield* source(h)
        const res = yield* forkOf(h, src.run.id, { at_seq: src.afterA })
        expect(res.status).toBe(201)
        const id = JSON.parse(res.body).id as string
        expect(res.body).toBe(
          `{"id":"${id}","agent_id":"hello","input":{"q":1},"status":"running","forked_from":"${src.run.id}",` +
            `"fork_seq":${src.afterA},"created_at":"${EPOCH}","updated_at":"${EPOCH}"}\n`
        )
        // GET shows forked_from and fork_seq too (restoration only on the fork answer)
        expect((yield* h.send("GET", `/v0/executions/${id}`)).body).toBe(res.body)

        const a = renamed(id, "a")
        const sourceEvents = yield* wireEvents(h, src.run.id)
        const copiedFromSource = sourceEvents
          .filter((e) => e.seq <= src.afterA && e.type.startsWith("step.") && e.payload.step_id === src.a)
          .map((e) => [e.type, { ...e.payload, step_id: a }])
        expect(copiedFromSource.map(([type]) => type)).toEqual([
          "step.proposed",
          "step.allowed",
          "step.executing",
          "step.succeeded"
        ])
        const log = yield* wireEvents(h, id)
        expect(log.map((e) => [e.type, e.payload])).toEqual([
          ["execution.created", { execution_id: id, status: "pending" }],
          ["execution.forked", { fork_seq: src.afterA, policy_override: false, source_execution_id: src.run.id }],
          ...copiedFromSource,
          ["execution.started", { execution_id: id, status: "running" }],
          ["dispatch.queued", expect.objectContaining({ execution_id: id, status: "pending" })]
        ])
        expect(log.map((e) => e.seq)).toEqual([1, 2, 3, 4, 5, 6, 7, 8])
        const steps = yield* h.send("GET", `/v0/executions/${id}/steps`)
        expect(JSON.parse(steps.body)).toEqual([
          expect.objectContaining({ step_id: a, execution_id: id, target: "a", status: "succeeded", result: { n: "a" } })
        ])
        // the source did not change
        expect(yield* seqOf(h, src.run.id)).toBe(sourceEvents.length)
      }))

    it.effect("the rerun replays the copied steps (no policy) and runs the rest live", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const src = yield* source(h)
        const fork = yield* forked(h, src.run.id, { at_seq: yield* seqOf(h, src.run.id) })
        const run = yield* claimRun(h, fork.id)
        expect(yield* submit(h, run, "a")).toEqual({ decision: "replay", step_id: renamed(fork.id, "a"), result: { n: "a" } })
        expect(yield* submit(h, run, "b")).toEqual({ decision: "replay", step_id: renamed(fork.id, "b"), result: { n: "b" } })
        // c was still executing at the fork point: not copied, it runs live
        const c = yield* submit(h, run, "c")
        expect(c).toEqual({ decision: "proceed", step_id: renamed(fork.id, "c") })
        const types = (yield* wireEvents(h, fork.id)).map((e) => e.type)
        expect(types.slice(-3)).toEqual(["step.proposed", "step.allowed", "step.executing"])
        expect(types.filter((t) => t === "step.succeeded")).toHaveLength(2)
      }))

    it.effect("the checks in order, with their messages; nothing created", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const src = yield* source(h)
        yield* h.send("POST", "/v0/executions", { body: JSON.stringify({ agent_id: "hello", session: "taken" }) })
        const latest = yield* seqOf(h, src.run.id)
        const before = yield* allIds(h)
        const id = src.run.id
        const cases: ReadonlyArray<readonly [string, unknown, Record<string, string>, number, string]> = [
          ["not-a-uuid", { at_seq: 1 }, {}, 400, VALIDATION],
          [id, { at_seq: 1, extra: 1 }, {}, 400, VALIDATION],
          [id, { at_seq: "1" }, {}, 400, VALIDATION],
          [UNKNOWN_ID, { at_seq: 0, session: " ", policy_bundle: "x: [" }, {}, 404, NOT_FOUND],
          [id, { at_seq: 0, session: " ", policy_bundle: "x: [" }, {}, 400, validationError(
            "validation error: session must be a nonblank UTF-8 string of at most 256 bytes without NUL"
          )],
          [id, { at_seq: 0, session: "taken", policy_bundle: "x: [" }, {}, 409, errorBody(
            "conflict",
            "conflict: session \"taken\" already has executions"
          )],
          [id, { at_seq: 0, policy_bundle: "x: [" }, {}, 400, validationError(
            `validation error: at_seq must be between 1 and ${latest}`
          )],
          [id, { policy_bundle: "x: [" }, {}, 400, validationError(`validation error: at_seq must be between 1 and ${latest}`)],
          [id, { at_seq: latest + 1 }, {}, 400, validationError(`validation error: at_seq must be between 1 and ${latest}`)],
          [id, { at_seq: 1, policy_bundle: "x: [" }, yield* apiKey(h, ["executions:write"]), 403, errorBody(
            "forbidden",
            "forbidden: policy_bundle requires policies:write"
          )],
          [id, { at_seq: 1 }, yield* apiKey(h, ["executions:read", "policies:write"]), 403, FORBIDDEN]
        ]
        for (const [target, body, headers, status, answer] of cases) {
          expect(yield* forkOf(h, target, body, headers), JSON.stringify(body)).toMatchObject({ status, body: answer })
        }
        const bad = yield* forkOf(h, id, { at_seq: 1, policy_bundle: "rules: [" })
        expect(bad.status).toBe(400)
        expect(JSON.parse(bad.body)).toMatchObject({ code: "validation_error" })
        expect(JSON.parse(bad.body).message).toMatch(/^validation error: invalid policy bundle: .+/)
        expect(yield* allIds(h)).toEqual(before)
        expect(yield* seqOf(h, id)).toBe(latest)
        // with both scopes the same request is accepted
        const both = yield* apiKey(h, ["executions:write", "policies:write"])
        expect((yield* forkOf(h, id, { at_seq: 1, policy_bundle: DENY_LIVE }, both)).status).toBe(201)
      }))

    it.effect("a policy bundle of its own decides the live steps; a fork of the fork keeps it", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const src = yield* source(h)
        const fork = yield* forked(h, src.run.id, { at_seq: src.afterA, policy_bundle: DENY_LIVE })
        const log = yield* wireEvents(h, fork.id)
        expect(log[1]).toMatchObject({ type: "execution.forked", payload: { policy_override: true } })
        const run = yield* claimRun(h, fork.id)
        expect((yield* submit(h, run, "a")).decision).toBe("replay")
        expect(yield* submit(h, run, "b")).toEqual({
          decision: "denied",
          step_id: renamed(fork.id, "b"),
          reason: "not in this branch",
          rule_id: "no-b-in-forks"
        })
        // the source itself still runs under the agent's (absent) policy
        expect((yield* submit(h, src.run, "d")).decision).toBe("proceed")
        // a fork of the fork inherits its bundle
        const again = yield* forked(h, fork.id, { at_seq: 3 })
        expect((yield* wireEvents(h, again.id))[1]).toMatchObject({
          type: "execution.forked",
          payload: { policy_override: false, fork_seq: 3, source_execution_id: fork.id }
        })
        const run2 = yield* claimRun(h, again.id)
        yield* submit(h, run2, "a")
        expect(yield* submit(h, run2, "b")).toMatchObject({ decision: "denied", rule_id: "no-b-in-forks" })
      }))

    it.effect("a session: the fork joins it and starts; the source's parent is the fork's parent", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const first = JSON.parse(
          (yield* h.send("POST", "/v0/executions", { body: JSON.stringify({ agent_id: "hello", session: "s" }) })).body
        ).id as string
        const firstRun = yield* claimRun(h, first)
        yield* h.agent(
          "hello",
          "POST",
          `/v0/executions/${first}/complete`,
          "{\"output\":1,\"state\":{\"turn\":1}}",
          firstRun.lease
        )
        const second = JSON.parse(
          (yield* h.send("POST", "/v0/executions", { body: JSON.stringify({ agent_id: "hello", session: "s" }) })).body
        ) as Json
        expect(second.parent_execution_id).toBe(first)
        const fork = yield* forked(h, second.id, { at_seq: 1, session: "branch" })
        expect(fork).toMatchObject({
          status: "running",
          session: "branch",
          parent_execution_id: first,
          forked_from: second.id,
          fork_seq: 1
        })
        expect(Object.keys(fork)).toEqual([
          "id",
          "agent_id",
          "input",
          "status",
          "session",
          "parent_execution_id",
          "forked_from",
          "fork_seq",
          "created_at",
          "updated_at"
        ])
        const log = yield* wireEvents(h, fork.id)
        expect(log.map((e) => [e.type, e.payload])).toEqual([
          ["execution.created", { execution_id: fork.id, session: "branch", status: "pending" }],
          ["execution.forked", { fork_seq: 1, policy_override: false, source_execution_id: second.id }],
          ["execution.started", {
            execution_id: fork.id,
            parent_execution_id: first,
            session: "branch",
            status: "running"
          }],
          ["dispatch.queued", expect.objectContaining({ execution_id: fork.id })]
        ])
        // previous reads what the source read
        expect((yield* h.send("GET", `/v0/executions/${fork.id}/previous`)).body).toBe("{\"state\":{\"turn\":1}}\n")
        // the session is now taken
        expect((yield* forkOf(h, second.id, { at_seq: 1, session: "branch" })).status).toBe(409)
      }))

    it.effect("resources: restored from the newest checkpoint covering the fork point, else an earlier one", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const agent = (path: string, body: unknown) =>
          h.agent("hello", "POST", `/v0/executions/${run.id}${path}`, JSON.stringify(body), run.lease)
        yield* agent("/resources", { key: "workspace", driver_id: "dir.v1", configuration: { root: "/w" }, every_steps: 1 })
        yield* agent("/resources/workspace/binding", { binding: { path: "/w/1" } })
        yield* agent("/resources/checkpoints", { captures: [{ key: "workspace", generation: 0, checkpoint_ref: "snap-0" }] })
        const w1 = yield* submit(h, run, "w1", { resources: ["workspace"] })
        yield* complete(h, run, w1.step_id, {
          result: 1,
          captures: [{ key: "workspace", generation: 1, checkpoint_ref: "snap-1" }]
        })
        const covered = yield* seqOf(h, run.id)
        const w2 = yield* submit(h, run, "w2", { resources: ["workspace"] })
        const during = yield* seqOf(h, run.id)
        const sourcePoints = JSON.parse((yield* h.send("GET", `/v0/executions/${run.id}/fork-points`)).body)
        expect(sourcePoints).toEqual({
          latest_seq: during,
          resources: { workspace: 4 },
          checkpoints: [
            { key: "workspace", generation: 0, checkpoint_ref: "snap-0", covered_seq: 5, invalidated_seq: 9 },
            { key: "workspace", generation: 1, checkpoint_ref: "snap-1", covered_seq: 10, invalidated_seq: during }
          ]
        })

        // covered: snap-1 covers seqs 10..(during - 1)
        const res = yield* forkOf(h, run.id, { at_seq: covered })
        expect(res.status).toBe(201)
        const fork = JSON.parse(res.body) as Json
        expect(res.body).toContain(
          `"fork_seq":${covered},"restoration":{"workspace":{"checkpoint_ref":"snap-1","checkpoint_seq":10,"covered":true}},`
        )
        const log = yield* wireEvents(h, fork.id)
        expect(log.map((e) => [e.seq, e.type, e.payload])).toEqual([
          [1, "execution.created", { execution_id: fork.id, status: "pending" }],
          [2, "execution.forked", {
            fork_seq: covered,
            policy_override: false,
            restoration: { workspace: { checkpoint_ref: "snap-1", checkpoint_seq: 10, covered: true } },
            source_execution_id: run.id
          }],
          [3, "resource.registered", {
            key: "workspace",
            driver_id: "dir.v1",
            configuration: { root: "/w" },
            coverage_reuse: false,
            every_steps: 1,
            on_completion: true
          }],
          [4, "step.proposed", expect.objectContaining({ target: "w1" })],
          [5, "step.allowed", expect.objectContaining({ target: "w1" })],
          [6, "step.executing", expect.objectContaining({ target: "w1", generations: { workspace: 1 } })],
          [7, "step.succeeded", expect.objectContaining({ target: "w1" })],
          [8, "resource.initialized", { key: "workspace", generation: 1, checkpoint_ref: "snap-1" }],
          // source seqs mapped into the fork's log: 5 → 3 (the registration), 10 → 7, 9 → 6
          [9, "resource.checkpointed", { key: "workspace", generation: 0, checkpoint_ref: "snap-0", covered_seq: 3 }],
          [10, "resource.checkpointed", { key: "workspace", generation: 1, checkpoint_ref: "snap-1", covered_seq: 7 }],
          [11, "execution.started", { execution_id: fork.id, status: "running" }],
          [12, "dispatch.queued", expect.objectContaining({ execution_id: fork.id })]
        ])
        expect(JSON.parse((yield* h.send("GET", `/v0/executions/${fork.id}/fork-points`)).body)).toEqual({
          latest_seq: 12,
          resources: { workspace: 8 },
          checkpoints: [
            { key: "workspace", generation: 0, checkpoint_ref: "snap-0", covered_seq: 3, invalidated_seq: 6 },
            { key: "workspace", generation: 1, checkpoint_ref: "snap-1", covered_seq: 7 }
          ]
        })
        // the agent reads it: checkpoint_ref, no binding, covered; the copied step counted
        const forkRun = yield* claimRun(h, fork.id)
        const view = yield* h.agent(
          "hello",
          "POST",
          `/v0/executions/${fork.id}/resources`,
          JSON.stringify({ key: "workspace", driver_id: "dir.v1", configuration: { root: "/w" } }),
          forkRun.lease
        )
        expect(view.body).toBe(
          "{\"key\":\"workspace\",\"driver_id\":\"dir.v1\",\"configuration\":{\"root\":\"/w\"},\"coverage_reuse\":false," +
            "\"every_steps\":1,\"on_completion\":true,\"registered_seq\":8,\"generation\":1,\"count\":1," +
            "\"checkpoint_ref\":\"snap-1\",\"covered\":true}\n"
        )

        // not covered (w2 running at the fork point): the earlier checkpoint, generation + 1
        const uncovered = yield* forked(h, run.id, { at_seq: during })
        expect(uncovered.restoration).toEqual({
          workspace: { checkpoint_ref: "snap-1", checkpoint_seq: 10, covered: false }
        })
        const [resource] = yield* h.core.listResources(uncovered.id)
        expect(resource).toMatchObject({ generation: 3, count: 1, checkpointRef: "snap-1", covered: false })
        // before the registration: no resources, no restoration
        const early = yield* forked(h, run.id, { at_seq: 3 })
        expect(early.restoration).toBeUndefined()
        expect(yield* h.core.listResources(early.id)).toEqual([])
        // registered, no checkpoint yet: the initial environment
        const initial = yield* forked(h, run.id, { at_seq: 4 })
        expect(initial.restoration).toEqual({ workspace: { covered: false } })
        expect(yield* h.core.listResources(initial.id)).toMatchObject([{ generation: 1, checkpointRef: undefined }])
        expect(w2.step_id).toBeDefined()
      }))

    it.effect("in process: overrides replace a copied step's recorded outcome; a step not copied is a 400", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const src = yield* source(h)
        const latest = yield* seqOf(h, src.run.id)
        const { execution } = yield* h.core.fork(src.run.id, {
          atSeq: latest,
          overrides: { [src.a]: { result: { n: "changed" } }, [src.b]: { error: { message: "declined" } } }
        })
        const run = yield* claimRun(h, execution.id)
        expect(yield* submit(h, run, "a")).toEqual({
          decision: "replay",
          step_id: renamed(execution.id, "a"),
          result: { n: "changed" }
        })
        expect(yield* submit(h, run, "b")).toEqual({
          decision: "replay",
          step_id: renamed(execution.id, "b"),
          error: { message: "declined" }
        })
        const log = yield* wireEvents(h, execution.id)
        expect(log.filter((e) => e.payload.target === "b").map((e) => e.type)).toEqual([
          "step.proposed",
          "step.allowed",
          "step.executing",
          "step.failed"
        ])
        expect(log.find((e) => e.type === "step.failed")!.payload.error).toEqual({ message: "declined" })

        const before = yield* allIds(h)
        const failure = yield* Effect.flip(h.core.fork(src.run.id, { atSeq: latest, overrides: { [src.c]: { result: 1 } } }))
        expect(failure).toMatchObject({
          status: 400,
          message: `validation error: overrides name a step that is not copied: "${src.c}"`
        })
        expect(yield* allIds(h)).toEqual(before)
      }))

    it.effect("in process: an override nested 10,000 deep is recorded; one that is not JSON as it stands is a 400", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const src = yield* source(h)
        const latest = yield* seqOf(h, src.run.id)
        let deep: unknown = "core"
        for (let i = 0; i < 9_999; i++) deep = [deep]
        const { execution } = yield* h.core.fork(src.run.id, { atSeq: latest, overrides: { [src.a]: { result: deep } } })
        const run = yield* claimRun(h, execution.id)
        const res = yield* h.agent(
          "hello",
          "POST",
          `/v0/executions/${run.id}/steps`,
          JSON.stringify({ kind: "tool_call", target: "a", args: { target: "a" }, idempotency: "safe_to_retry" }),
          run.lease
        )
        expect(res.status).toBe(200)
        expect(res.body).toContain("\"result\":" + "[".repeat(9_999) + "\"core\"" + "]".repeat(9_999) + "}")

        const before = yield* allIds(h)
        for (const value of [Number.NaN, undefined, new Date(0), { nested: [1, Infinity] }]) {
          const failure = yield* Effect.flip(
            h.core.fork(src.run.id, { atSeq: latest, overrides: { [src.a]: { result: value } } })
          )
          expect(failure).toMatchObject({
            status: 400,
            message: `validation error: override of "${src.a}" is not JSON`
          })
        }
        expect(yield* allIds(h)).toEqual(before)
      }))
  })

  describe("GET …/fork-points (C.7.3)", () => {
    it.effect("200 with the latest seq; {} and [] without resources; 400, 404, scopes", () =>
      Effect.gen(function*() {
        const h = yield* harness()
        const run = yield* running(h)
        const res = yield* h.send("GET", `/v0/executions/${run.id}/fork-points`)
        expect(res).toMatchObject({
          status: 200,
          body: "{\"latest_seq\":3,\"resources\":{},\"checkpoints\":[]}\n"
        })
        expect(yield* h.send("GET", `/v0/executions/${UNKNOWN_ID}/fork-points`)).toMatchObject({
          status: 404,
          body: NOT_FOUND
        })
        expect(yield* h.send("GET", "/v0/executions/nope/fork-points")).toMatchObject({ status: 400, body: VALIDATION })
        const writer = yield* apiKey(h, ["executions:write"])
        expect(yield* h.send("GET", `/v0/executions/${run.id}/fork-points`, { headers: writer })).toMatchObject({
          status: 403,
          body: FORBIDDEN
        })
        const reader = yield* apiKey(h, ["executions:read"])
        expect((yield* h.send("GET", `/v0/executions/${run.id}/fork-points`, { headers: reader })).status).toBe(200)
      }))
  })

  describe("older stages", () => {
    it.effect("seed: fork and fork-points are the plain 404", () =>
      Effect.gen(function*() {
        const core = yield* Core.make({ stage: "seed" })
        yield* core.registerAgent({ id: "hello", webhookUrl: "http://localhost:5000/webhook", secret: "s" })
        const handle = Routes.make(core)
        const created = yield* core.createExecution({ agentId: "hello", inputRaw: undefined, agentVersion: undefined })
        for (
          const [method, url] of [
            ["POST", `/v0/executions/${created.id}/fork`],
            ["GET", `/v0/executions/${created.id}/fork-points`]
          ] as const
        ) {
          const res = yield* handle(request(method, url, { body: "{\"at_seq\":1}" }))
          expect({ status: res.status, body: res.body }).toEqual({ status: 404, body: NOT_FOUND_PAGE })
        }
        expect(yield* core.listExecutions({ agentId: "", status: "", cursor: undefined, limit: 10 })).toMatchObject({
          executions: [{ id: created.id }]
        })
      }))
  })
})
