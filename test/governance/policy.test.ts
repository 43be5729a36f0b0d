/**
 * Policy through the kernel, end to end (PROTOCOL.md 10, 11.10): every rule
 * form and predicate, rule order, defaults, the local-step fallback, the
 * permissive engine, and loading bundles at runtime through the kit and the
 * Client — what the agent's steps are told, and which rule decided.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { Agent, Client, Step, Tool } from "effect-rebuno"
import type { KernelError } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"
import { makeProbe, ruleIds, yaml } from "./_harness.js"
import type { ProbeCall } from "./_harness.js"

const probe = makeProbe("probe")
const other = makeProbe("other")

/** Run the probe agent with these calls; return its per-call outcomes and the deciding rule ids. */
const decide = (agentId: string, calls: ReadonlyArray<ProbeCall>) =>
  Effect.gen(function*() {
    const kernel = yield* TestKernel.TestKernel
    const run = yield* kernel.run(agentId, { calls })
    expect(run.status).toBe("completed")
    return { outcomes: run.output as ReadonlyArray<string>, rules: ruleIds(run.events) }
  })

const kit = (policy?: string) =>
  TestKernel.layer({
    stage: "seed",
    agents: [probe, other],
    ...(policy === undefined ? {} : { policies: { probe: policy, other: policy } })
  })

describe("policy rule forms", () => {
  it.effect("target: a path.Match glob (no '/' for '*', case-sensitive, exact-equality shortcut)", () =>
    Effect.gen(function*() {
      const { outcomes, rules } = yield* decide("probe", [
        { target: "web_search" },
        { target: "web/search" },
        { target: "WEB_search" },
        { target: "fs[" },
        { target: "fsx" },
        { target: "db_1" }
      ])
      expect(outcomes).toEqual([
        "allow",
        "deny: no explicit allow rule matched",
        "deny: no explicit allow rule matched",
        "allow",
        "deny: no explicit allow rule matched",
        "allow"
      ])
      expect(rules).toEqual([
        "web_search:web",
        "web/search:default",
        "WEB_search:default",
        "fs[:malformed",
        "fsx:default",
        "db_1:class"
      ])
    }).pipe(Effect.provide(kit(yaml(
      "default_action: deny",
      "rules:",
      "  - { id: web, priority: 1, when: { target: 'web_*' }, then: { decision: allow } }",
      // a malformed pattern never matches, except through the exact-equality shortcut
      "  - { id: malformed, priority: 2, when: { target: 'fs[' }, then: { decision: allow } }",
      "  - { id: class, priority: 3, when: { target: 'db_[^a-c]' }, then: { decision: allow } }"
    )))))

  it.effect("targets: any of the globs", () =>
    Effect.gen(function*() {
      const { outcomes, rules } = yield* decide("probe", [
        { target: "fs_read" },
        { target: "db_query" },
        { target: "fs_write" }
      ])
      expect(outcomes).toEqual(["deny: read-only mode", "deny: read-only mode", "allow"])
      expect(rules).toEqual(["fs_read:ro", "db_query:ro", "fs_write:default"])
    }).pipe(Effect.provide(kit(yaml(
      "default_action: allow",
      "rules:",
      "  - id: ro",
      "    when: { targets: [fs_read, 'db_*'] }",
      "    then: { decision: deny, reason: read-only mode }"
    )))))

  it.effect("agent_id and agent_ids: exact match on the execution's agent", () =>
    Effect.gen(function*() {
      const mine = yield* decide("probe", [{ target: "x" }, { target: "y" }])
      const theirs = yield* decide("other", [{ target: "x" }, { target: "y" }])
      expect(mine.outcomes).toEqual(["allow", "deny: no explicit allow rule matched"])
      expect(mine.rules).toEqual(["x:only-probe", "y:default"])
      expect(theirs.outcomes).toEqual(["deny: no explicit allow rule matched", "deny: not for you"])
      expect(theirs.rules).toEqual(["x:default", "y:others"])
    }).pipe(Effect.provide(kit(yaml(
      "default_action: deny",
      "rules:",
      "  - { id: only-probe, priority: 1, when: { agent_id: probe, target: x }, then: { decision: allow } }",
      "  - id: others",
      "    priority: 2",
      "    when: { agent_ids: [other, third], target: y }",
      "    then: { decision: deny, reason: not for you }"
    )))))

  it.effect("step_kind: exact match with the submitted kind", () =>
    Effect.gen(function*() {
      const { outcomes, rules } = yield* decide("probe", [
        { kind: "llm_call", target: "gpt-test" },
        { kind: "tool_call", target: "gpt-test" },
        { kind: "LLM_CALL", target: "gpt-test" }
      ])
      expect(outcomes).toEqual(["allow", "deny: no explicit allow rule matched", "deny: no explicit allow rule matched"])
      expect(rules).toEqual(["gpt-test:llm", "gpt-test:default", "gpt-test:default"])
    }).pipe(Effect.provide(kit(yaml(
      "default_action: deny",
      "rules:",
      "  - { id: llm, when: { step_kind: llm_call }, then: { decision: allow } }"
    )))))

  it.effect("arguments: equals, contains, one_of and regex (RE2, unanchored), on Go %v strings", () =>
    Effect.gen(function*() {
      const { outcomes, rules } = yield* decide("probe", [
        { target: "shell", args: { command: "ls" } }, // equals
        { target: "shell", args: { command: "ls -la" } }, // regex
        { target: "shell", args: { command: "  cat notes" } }, // regex with leading blanks
        { target: "shell", args: { command: "rm -rf /" } }, // contains
        { target: "shell", args: { command: "echo" } }, // no rule
        { target: "shell", args: {} }, // key absent: no predicate holds
        { target: "deploy", args: { env: "staging" } }, // one_of
        { target: "deploy", args: { env: "prod" } },
        { target: "deploy", args: { replicas: 1000000 } }, // %v of a number: 1e+06
        { target: "deploy", args: { flags: [1, "a", null] } } // %v of an array
      ])
      expect(outcomes).toEqual([
        "allow",
        "allow",
        "allow",
        "deny: destructive",
        "deny: no explicit allow rule matched",
        "deny: no explicit allow rule matched",
        "allow",
        "deny: no explicit allow rule matched",
        "deny: too many",
        "allow"
      ])
      expect(rules).toEqual([
        "shell:exact-ls",
        "shell:read-only",
        "shell:read-only",
        "shell:no-rm",
        "shell:default",
        "shell:default",
        "deploy:envs",
        "deploy:default",
        "deploy:scale",
        "deploy:flags"
      ])
    }).pipe(Effect.provide(kit(yaml(
      "default_action: deny",
      "rules:",
      "  - { id: exact-ls, priority: 1, when: { target: shell, arguments: { command: { equals: ls } } }, then: { decision: allow } }",
      "  - id: no-rm",
      "    priority: 2",
      "    when: { target: shell, arguments: { command: { contains: 'rm ' } } }",
      "    then: { decision: deny, reason: destructive }",
      "  - id: read-only",
      "    priority: 3",
      "    when: { target: shell, arguments: { command: { regex: '^\\s*(ls|cat)\\b' } } }",
      "    then: { decision: allow }",
      "  - { id: envs, priority: 4, when: { target: deploy, arguments: { env: { one_of: [dev, staging] } } }, then: { decision: allow } }",
      "  - id: scale",
      "    priority: 5",
      "    when: { target: deploy, arguments: { replicas: { equals: '1e+06' } } }",
      "    then: { decision: deny, reason: too many }",
      "  - { id: flags, priority: 6, when: { target: deploy, arguments: { flags: { equals: '[1 a <nil>]' } } }, then: { decision: allow } }"
    )))))

  it.effect("every present condition must hold (AND); an empty when matches everything", () =>
    Effect.gen(function*() {
      const { outcomes, rules } = yield* decide("probe", [
        { kind: "tool_call", target: "pay", args: { amount: "10" } },
        { kind: "tool_call", target: "pay", args: { amount: "99" } },
        { kind: "local", target: "pay", args: { amount: "10" } }
      ])
      expect(outcomes).toEqual(["allow", "deny: catch-all", "deny: catch-all"])
      expect(rules).toEqual(["pay:small-pay", "pay:all", "pay:all"])
    }).pipe(Effect.provide(kit(yaml(
      "default_action: allow",
      "rules:",
      "  - id: small-pay",
      "    priority: 1",
      "    when: { target: pay, step_kind: tool_call, agent_id: probe, arguments: { amount: { one_of: ['1', '10'] } } }",
      "    then: { decision: allow }",
      "  - { id: all, priority: 2, when: {}, then: { decision: deny, reason: catch-all } }"
    )))))
})

describe("policy evaluation order and defaults", () => {
  it.effect("rules apply by ascending priority, not by their order in the file", () =>
    Effect.gen(function*() {
      const { outcomes, rules } = yield* decide("probe", [{ target: "ping" }, { target: "pong" }])
      expect(outcomes).toEqual(["allow", "deny: everything else"])
      expect(rules).toEqual(["ping:narrow", "pong:broad"])
    }).pipe(Effect.provide(kit(yaml(
      "default_action: allow",
      "rules:",
      "  - { id: broad, priority: 20, when: { target: '*' }, then: { decision: deny, reason: everything else } }",
      "  - { id: narrow, priority: 10, when: { target: ping }, then: { decision: allow } }"
    )))))

  it.effect("default_action: allow → rule 'default'; anything else or absent → deny with the default reason", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const allow = yield* decide("probe", [{ target: "anything" }])
      expect(allow).toEqual({ outcomes: ["allow"], rules: ["anything:default"] })
      for (const action of ["deny", "Allow", "yes"]) {
        yield* kernel.loadPolicy("probe", `default_action: ${action}\n`)
        const denied = yield* decide("probe", [{ target: "anything" }])
        expect(denied).toEqual({ outcomes: ["deny: no explicit allow rule matched"], rules: ["anything:default"] })
      }
      yield* kernel.loadPolicy("probe", "rules: []\n")
      const absent = yield* decide("probe", [{ target: "anything" }])
      expect(absent).toEqual({ outcomes: ["deny: no explicit allow rule matched"], rules: ["anything:default"] })
    }).pipe(Effect.provide(kit("default_action: allow\n"))))

  it.effect("deny by default still allows unmatched local steps (Step.now, Step.run); a matching rule wins", () => {
    const fetchTool = Tool.make("fetch", {
      args: Schema.Struct({ url: Schema.String }),
      success: Schema.String,
      execute: () => Effect.succeed("body")
    })
    const agent = Agent.make({
      id: "locals",
      handler: () =>
        Effect.gen(function*() {
          const t = yield* Step.now
          const label = yield* Step.run("label", Effect.succeed("x"))
          const banned = yield* Step.run("banned", Effect.succeed("y")).pipe(
            Effect.catchTag("PolicyError", (e) => Effect.succeed(`deny: ${e.reason}`))
          )
          const fetched = yield* fetchTool({ url: "https://example.com" }).pipe(
            Effect.catchTag("PolicyError", (e) => Effect.succeed(`deny: ${e.reason}`))
          )
          return { t: typeof t, label, banned, fetched }
        })
    })
    return Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const run = yield* kernel.run(agent)
      expect(run.status).toBe("completed")
      expect(run.output).toEqual({
        t: "number",
        label: "x",
        banned: "deny: no local banned",
        fetched: "deny: no explicit allow rule matched"
      })
      expect(ruleIds(run.events)).toEqual(["now:local", "label:local", "banned:no-banned", "fetch:default"])
      const allowed = run.events.filter((e) => e.type === "step.allowed").map((e) => e.payload)
      expect(allowed[0]).toEqual({
        rule_id: "local",
        step_id: run.steps.find((s) => s.target === "now")!.stepId,
        step_type: "local",
        target: "now"
      })
    }).pipe(Effect.provide(TestKernel.layer({
      stage: "seed",
      agents: [agent],
      policies: {
        locals: yaml(
          "default_action: deny",
          "rules:",
          "  - { id: no-banned, when: { step_kind: local, target: banned }, then: { decision: deny, reason: no local banned } }"
        )
      }
    })))
  })

  it.effect("no bundle: permissive, every step allowed by rule 'permissive'", () =>
    Effect.gen(function*() {
      const { outcomes, rules } = yield* decide("probe", [
        { target: "rm_rf" },
        { kind: "llm_call", target: "gpt" },
        { kind: "local", target: "now" }
      ])
      expect(outcomes).toEqual(["allow", "allow", "allow"])
      expect(rules).toEqual(["rm_rf:permissive", "gpt:permissive", "now:permissive"])
    }).pipe(Effect.provide(kit())))
})

describe("loading policy at runtime", () => {
  const denyShell = yaml(
    "default_action: allow",
    "rules:",
    "  - { id: no-shell, when: { target: shell }, then: { decision: deny, reason: no shell today } }"
  )

  it.effect("kernel.loadPolicy replaces the bundle for new steps; \"\" removes it", () =>
    Effect.gen(function*() {
      const kernel = yield* TestKernel.TestKernel
      const before = yield* decide("probe", [{ target: "shell" }])
      expect(before).toEqual({ outcomes: ["allow"], rules: ["shell:permissive"] })
      yield* kernel.loadPolicy("probe", denyShell)
      const during = yield* decide("probe", [{ target: "shell" }, { target: "ls" }])
      expect(during).toEqual({ outcomes: ["deny: no shell today", "allow"], rules: ["shell:no-shell", "ls:default"] })
      // the other agent keeps its own (absent) bundle
      expect(yield* decide("other", [{ target: "shell" }])).toEqual({
        outcomes: ["allow"],
        rules: ["shell:permissive"]
      })
      yield* kernel.loadPolicy("probe", "")
      expect(yield* decide("probe", [{ target: "shell" }])).toEqual({ outcomes: ["allow"], rules: ["shell:permissive"] })
    }).pipe(Effect.provide(kit())))

  it.effect("Client.loadPolicy stores the raw YAML and applies it; a bad bundle is refused with the rule and why", () =>
    Effect.gen(function*() {
      const client = yield* Client.Client
      yield* client.loadPolicy("probe", denyShell)
      expect((yield* client.getAgent("probe")).policyBundle).toBe(denyShell)
      expect((yield* decide("probe", [{ target: "shell" }])).outcomes).toEqual(["deny: no shell today"])

      const refuse = (bundle: string) => Effect.flip(client.loadPolicy("probe", bundle))
      const prefix = "load policy bundle: validation error: invalid policy bundle: "
      const cases: ReadonlyArray<readonly [string, string]> = [
        [
          yaml(
            "rules:",
            "  - { id: a, when: { target: x }, then: { decision: allow } }",
            "  - { id: b, when: { target: y }, then: { decision: deny } }"
          ),
          "duplicate priority 0 used by \"a\" and \"b\""
        ],
        [yaml("rules:", "  - { priority: 1, then: { decision: allow } }"), "rule missing id"],
        [
          yaml("rules:", "  - { id: shellish, when: { arguments: { command: { regex: '(?=x)' } } }, then: { decision: allow } }"),
          "rule \"shellish\" argument \"command\" invalid regex: "
        ],
        [
          yaml("rules:", "  - { id: lax, when: { arguments: { command: { equals: '' } } }, then: { decision: allow } }"),
          "rule \"lax\" argument \"command\" has no constraint (equals/contains/one_of/regex); an empty predicate matches any value"
        ],
        [
          yaml("rules:", "  - { id: maybe, then: { decision: perhaps } }"),
          "rule \"maybe\": unknown policy decision \"perhaps\" (want allow, deny or require_approval)"
        ]
      ]
      for (const [bundle, detail] of cases) {
        const error: KernelError = yield* refuse(bundle)
        expect(error.status).toBe(400)
        expect(error.code).toBe("validation_error")
        if (detail.endsWith(": ")) expect(error.reason.description.startsWith(prefix + detail)).toBe(true)
        else expect(error.reason.description).toBe(prefix + detail)
      }
      // a refused bundle leaves the loaded one in force
      expect((yield* client.getAgent("probe")).policyBundle).toBe(denyShell)
      expect((yield* decide("probe", [{ target: "shell" }])).outcomes).toEqual(["deny: no shell today"])

      const missing = yield* Effect.flip(client.loadPolicy("nobody", denyShell))
      expect([missing.status, missing.code, missing.reason.description]).toEqual([
        404,
        "not_found",
        "load policy bundle: not found"
      ])
      // validation comes before the agent lookup
      const both = yield* Effect.flip(client.loadPolicy("nobody", "rules: [{ id: '' }]\n"))
      expect([both.status, both.reason.description]).toEqual([400, prefix + "rule missing id"])

      yield* client.loadPolicy("probe", "")
      expect((yield* client.getAgent("probe")).policyBundle).toBe("")
      expect((yield* decide("probe", [{ target: "shell" }])).rules).toEqual(["shell:permissive"])
    }).pipe(Effect.provide(kit())))
})
