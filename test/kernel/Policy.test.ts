import { describe, expect, it } from "@effect/vitest"
import { Result } from "effect"
import { createHash } from "node:crypto"
import * as Policy from "../../src/kernel/Policy.js"
import * as Duration from "../../src/kernel/internal/duration.js"
import * as Glob from "../../src/kernel/internal/glob.js"
import * as GoFormat from "../../src/kernel/internal/goFormat.js"

/** The seed stage's bundle language (PROTOCOL 10.2) unless a test says `current` (C.8.6, at the end). */
const SEED = { stage: "seed" } as const

const load = (yaml: string): Policy.Bundle => {
  const result = Policy.parseBundle(yaml, SEED)
  if (Result.isFailure(result)) throw new Error(`bundle rejected: ${result.failure}`)
  return result.success
}

const rejection = (yaml: string): string => {
  const result = Policy.parseBundle(yaml, SEED)
  if (Result.isSuccess(result)) throw new Error("bundle unexpectedly loaded")
  return result.failure
}

const input = (overrides: Partial<Policy.PolicyInput> = {}): Policy.PolicyInput => ({
  agentId: "agent",
  kind: "tool_call",
  target: "tool",
  argsRaw: undefined,
  ...overrides
})

const decide = (bundle: Policy.Bundle | undefined, overrides: Partial<Policy.PolicyInput> = {}) => {
  const result = Policy.evaluate(bundle, input(overrides))
  return [result.decision, result.ruleId, result.reason] as const
}

/** A deny-by-default bundle with one `allow` rule whose `when` is the given YAML flow map. */
const allowWhen = (when: string): Policy.Bundle =>
  load(`default_action: deny\nrules:\n  - id: r\n    when: ${when}\n    then: { decision: allow }\n`)

const argumentRule = (predicate: string): Policy.Bundle => allowWhen(`{ arguments: { v: ${predicate} } }`)

const withArgs = (bundle: Policy.Bundle, argsRaw: string | undefined): string =>
  Policy.evaluate(bundle, input({ argsRaw })).decision

describe("Policy.parseBundle", () => {
  it("parses the full 10.2 format", () => {
    const bundle = load(`
default_action: deny
rules:
  - id: allow-llm
    priority: 5
    when:
      target: "web_*"
      targets: ["a", "b*"]
      agent_id: hello
      agent_ids: [hello, x]
      step_kind: llm_call
      arguments:
        command:
          equals: "ls"
          contains: "x"
          one_of: ["a", "b"]
          regex: '^\\s*ls\\b'
    then:
      decision: require_approval
      reason: "text"
      approval_config:
        approvers: [alice, bob]
        timeout: 5m
        message: "please review"
      rate_limit:
        max_calls: 5
        window: 1m
        per_what: agent
        on_limiter_error: deny
`)
    expect(bundle.defaultAction).toBe("deny")
    expect(bundle.rules).toHaveLength(1)
    const rule = bundle.rules[0]!
    expect(rule.id).toBe("allow-llm")
    expect(rule.priority).toBe(5)
    expect(rule.when.target).toBe("web_*")
    expect(rule.when.targets).toEqual(["a", "b*"])
    expect(rule.when.agentId).toBe("hello")
    expect(rule.when.agentIds).toEqual(["hello", "x"])
    expect(rule.when.stepKind).toBe("llm_call")
    const command = rule.when.arguments.get("command")!
    expect([command.equals, command.contains, command.oneOf, command.regex]).toEqual([
      "ls",
      "x",
      ["a", "b"],
      "^\\s*ls\\b"
    ])
    expect(command.compiled).toBeDefined()
    expect(rule.then).toMatchObject({
      decision: "require_approval",
      reason: "text",
      approval: { approvers: ["alice", "bob"], timeoutMs: 300_000, message: "please review" },
      rateLimit: { maxCalls: 5, windowMs: 60_000, perWhat: "agent", onLimiterError: "deny" }
    })
  })

  it("gives an empty bundle for text without a document", () => {
    for (const text of ["", "   \n\t\n", "# only a comment\n"]) {
      expect(load(text)).toEqual({ defaultAction: "", rules: [] })
    }
    expect(decide(load(""))).toEqual(["deny", "default", "no explicit allow rule matched"])
  })

  it("ignores unknown keys at every level", () => {
    const bundle = load(`
version: 3
default_action: allow
rules:
  - id: r
    rule_id: ignored
    colour: blue
    when: { target: t, flavour: x, arguments: { a: { equals: "1", fuzzy: true } } }
    then: { decision: deny, rule_id: other, extra: [1, 2], rate_limit: { max_calls: 1, window: 1s, burst: 9 } }
`)
    const result = Policy.evaluate(bundle, input({ target: "t", argsRaw: `{"a":1}` }))
    expect(result.ruleId).toBe("r")
    expect(result.decision).toBe("deny")
  })

  it("defaults priority to 0 and rejects two omitted priorities (quirk)", () => {
    expect(rejection(`rules:\n  - id: a\n    then: {decision: allow}\n  - id: b\n    then: {decision: deny}\n`)).toBe(
      `duplicate priority 0 used by "a" and "b"`
    )
    expect(load(`rules:\n  - id: a\n    then: {decision: allow}\n`).rules[0]!.priority).toBe(0)
  })

  it("names the earlier rule first in a duplicate priority", () => {
    expect(
      rejection(`rules:
  - { id: first, priority: 7, then: { decision: allow } }
  - { id: middle, priority: 1, then: { decision: allow } }
  - { id: second, priority: 7, then: { decision: deny } }
`)
    ).toBe(`duplicate priority 7 used by "first" and "second"`)
  })

  it("rejects a rule without an id, checked rule by rule with the priorities", () => {
    expect(rejection(`rules:\n  - priority: 1\n    then: {decision: allow}\n`)).toBe("rule missing id")
    expect(rejection(`rules:\n  - id: ""\n    priority: 1\n    then: {decision: allow}\n`)).toBe("rule missing id")
    expect(rejection(`rules:\n  - id: ~\n    then: {decision: allow}\n`)).toBe("rule missing id")
    // the missing id comes before the duplicate, so it is reported first
    expect(
      rejection(`rules:
  - { id: a, then: { decision: allow } }
  - { then: { decision: allow } }
  - { id: c, then: { decision: allow } }
`)
    ).toBe("rule missing id")
    expect(
      rejection(`rules:
  - { id: a, then: { decision: allow } }
  - { id: b, then: { decision: allow } }
  - { then: { decision: allow } }
`)
    ).toBe(`duplicate priority 0 used by "a" and "b"`)
  })

  it("allows duplicate rule ids", () => {
    const bundle = load(`rules:
  - { id: same, priority: 1, when: { target: a }, then: { decision: allow } }
  - { id: same, priority: 2, when: { target: b }, then: { decision: deny } }
`)
    expect(bundle.rules.map((r) => r.id)).toEqual(["same", "same"])
  })

  it("rejects argument predicates without a non-empty constraint", () => {
    const message = `rule "r" argument "command" has no constraint (equals/contains/one_of/regex); an empty predicate matches any value`
    for (const predicate of ["{}", `{ equals: "" }`, `{ one_of: [] }`, `{ regex: "", contains: "" }`, "~"]) {
      expect(
        rejection(`rules:\n  - id: r\n    when: { arguments: { command: ${predicate} } }\n    then: { decision: allow }\n`)
      ).toBe(message)
    }
    // an empty field next to a real constraint is just no constraint
    expect(
      load(`rules:\n  - id: r\n    when: { arguments: { command: { contains: rm, equals: "" } } }\n    then: { decision: deny }\n`)
        .rules
    ).toHaveLength(1)
  })

  it("compiles regexes with RE2 and rejects what RE2 rejects", () => {
    for (const pattern of ["(?i)^ls", "a\\z", "(?P<name>x)", "\\pL+", "[[:alpha:]]"]) {
      expect(Result.isSuccess(Policy.parseBundle(argumentYaml(pattern), SEED))).toBe(true)
    }
    expect(rejection(argumentYaml("^(?=ls)"))).toBe(
      "rule \"r\" argument \"v\" invalid regex: error parsing regexp: invalid or unsupported Perl syntax: `(?=`"
    )
    expect(rejection(argumentYaml("(a)\\1"))).toBe(
      "rule \"r\" argument \"v\" invalid regex: error parsing regexp: invalid escape sequence: `\\1`"
    )
    expect(rejection(argumentYaml("(?<!x)y"))).toMatch(/^rule "r" argument "v" invalid regex: /)
    expect(rejection(argumentYaml("["))).toMatch(/missing closing ]/)
  })

  it("rejects unknown and missing decisions (deliberate difference 16.3 #7)", () => {
    expect(rejection(`rules:\n  - id: r\n    then: { decision: maybe }\n`)).toBe(
      `rule "r": unknown policy decision "maybe" (want allow, deny or require_approval)`
    )
    expect(rejection(`rules:\n  - id: r\n    then: { decision: Allow }\n`)).toMatch(/unknown policy decision "Allow"/)
    expect(rejection(`rules:\n  - id: r\n    when: { target: x }\n`)).toBe(
      `rule "r": then.decision is required (allow, deny or require_approval)`
    )
    for (const decision of ["allow", "deny", "require_approval"]) {
      expect(load(`rules:\n  - id: r\n    then: { decision: ${decision} }\n`).rules[0]!.then.decision).toBe(decision)
    }
  })

  it("rejects type mismatches with the rule and the field", () => {
    const cases: ReadonlyArray<readonly [string, string]> = [
      [`rules:\n  - id: r\n    priority: "5"\n    then: {decision: allow}\n`, `rule "r": priority: expected an integer, got "5"`],
      [`rules:\n  - id: r\n    priority: high\n    then: {decision: allow}\n`, `rule "r": priority: expected an integer, got "high"`],
      [`rules:\n  - id: r\n    priority: true\n    then: {decision: allow}\n`, `rule "r": priority: expected an integer, got true`],
      [`rules:\n  - id: r\n    priority: [1]\n    then: {decision: allow}\n`, `rule "r": priority: expected an integer, got a list`],
      [`rules:\n  - id: r\n    when: { targets: web_search }\n    then: {decision: allow}\n`, `rule "r": when.targets: expected a list, got "web_search"`],
      [`rules:\n  - id: r\n    when: { agent_ids: [[a]] }\n    then: {decision: allow}\n`, `rule "r": when.agent_ids[0]: expected a string, got a list`],
      [`rules:\n  - id: r\n    when: { target: { a: 1 } }\n    then: {decision: allow}\n`, `rule "r": when.target: expected a string, got a map`],
      [`rules:\n  - id: r\n    then: { decision: allow, reason: { a: 1 } }\n`, `rule "r": then.reason: expected a string, got a map`],
      [`rules:\n  - id: r\n    then: { decision: allow, reason: [a, b] }\n`, `rule "r": then.reason: expected a string, got a list`],
      [`rules:\n  - id: r\n    when: web_search\n    then: {decision: allow}\n`, `rule "r": when: expected a map, got "web_search"`],
      [`rules:\n  - id: r\n    when: { arguments: [a] }\n    then: {decision: allow}\n`, `rule "r": when.arguments: expected a map, got a list`],
      [`rules:\n  - id: r\n    then: { decision: allow, rate_limit: { max_calls: "5" } }\n`, `rule "r": then.rate_limit.max_calls: expected an integer, got "5"`],
      [`rules:\n  - id: r\n    then: { decision: allow, approval_config: { approvers: alice } }\n`, `rule "r": then.approval_config.approvers: expected a list, got "alice"`],
      [`rules:\n  - priority: x\n    then: {decision: allow}\n`, `rules[0]: priority: expected an integer, got "x"`],
      [`rules:\n  - just-a-string\n`, `rules[0]: expected a map, got "just-a-string"`],
      [`rules: { id: r }\n`, `rules: expected a list, got a map`],
      [`default_action: [allow]\n`, `default_action: expected a string, got a list`],
      [`- id: r\n`, `bundle: expected a map, got a list`],
      [`just text\n`, `bundle: expected a map, got "just text"`]
    ]
    for (const [yaml, message] of cases) expect(rejection(yaml)).toBe(message)
  })

  it("takes any scalar as written for string fields, like the reference decoder", () => {
    const bundle = load(`rules:
  - id: 7
    priority: 1
    when: { target: 1.50, agent_ids: [10, true] }
    then: { decision: deny, reason: 0x10 }
  - id: r
    priority: 2
    then: { decision: allow, reason: ~ }
`)
    const [numeric, plain] = bundle.rules
    expect(numeric!.id).toBe("7")
    expect(numeric!.when.target).toBe("1.50")
    expect(numeric!.when.agentIds).toEqual(["10", "true"])
    expect(numeric!.then.reason).toBe("0x10")
    expect(plain!.then.reason).toBe("")
  })

  it("reads integers as the reference does (YAML 1.2 forms, floats truncated)", () => {
    const priorities = (value: string) => load(`rules:\n  - id: r\n    priority: ${value}\n    then: {decision: allow}\n`).rules[0]!.priority
    expect(priorities("-3")).toBe(-3)
    expect(priorities("0x10")).toBe(16)
    expect(priorities("0o17")).toBe(15)
    expect(priorities("1_000")).toBe(1000)
    expect(priorities("2.0")).toBe(2)
    expect(priorities("2.9")).toBe(2)
    expect(priorities("1e3")).toBe(1000)
    expect(priorities("~")).toBe(0)
  })

  it("accepts only Go duration strings for durations (quirk)", () => {
    const timeout = (value: string) =>
      Policy.parseBundle(`rules:\n  - id: r\n    then: { decision: require_approval, approval_config: { timeout: ${value} } }\n`, SEED)
    const ms = (value: string) => {
      const result = timeout(value)
      return Result.isSuccess(result) ? result.success.rules[0]!.then.approval.timeoutMs : result.failure
    }
    expect(ms("30s")).toBe(30_000)
    expect(ms("1m30s")).toBe(90_000)
    expect(ms("1.5h")).toBe(5_400_000)
    expect(ms("500ms")).toBe(500)
    expect(ms("0s")).toBe(0)
    expect(ms(`"0"`)).toBe(0)
    expect(ms("~")).toBe(0)
    expect(ms(`"300"`)).toBe(`rule "r": then.approval_config.timeout: invalid duration "300"`)
    expect(ms("300")).toBe(
      `rule "r": then.approval_config.timeout: invalid duration 300 (a bare number; write a duration string with a unit, e.g. "300s")`
    )
    expect(ms("0")).toMatch(/invalid duration 0 \(a bare number/)
    expect(ms("1.5")).toMatch(/invalid duration 1\.5 \(a bare number/)
    expect(ms("5 minutes")).toBe(`rule "r": then.approval_config.timeout: invalid duration "5 minutes"`)
    expect(ms("[5m]")).toBe(`rule "r": then.approval_config.timeout: expected a duration string, got a list`)
    expect(
      rejection(`rules:\n  - id: x\n    then: { decision: allow, rate_limit: { max_calls: 5, window: "300" } }\n`)
    ).toBe(`rule "x": then.rate_limit.window: invalid duration "300"`)
  })

  it("keeps approvers null when absent and [] when explicitly empty", () => {
    const approvers = (config: string) =>
      load(`rules:\n  - id: r\n    then: { decision: require_approval${config} }\n`).rules[0]!.then.approval.approvers
    expect(approvers("")).toBeNull()
    expect(approvers(", approval_config: { message: hi }")).toBeNull()
    expect(approvers(", approval_config: { approvers: ~ }")).toBeNull()
    expect(approvers(", approval_config: { approvers: [] }")).toEqual([])
    expect(approvers(", approval_config: { approvers: [alice, bob] }")).toEqual(["alice", "bob"])
  })

  it("decodes rate limits as written", () => {
    const rateLimit = (yaml: string) => load(`rules:\n  - id: r\n    then: { decision: allow${yaml} }\n`).rules[0]!.then.rateLimit
    expect(rateLimit("")).toBeUndefined()
    expect(rateLimit(", rate_limit: { max_calls: 2, window: 1m }")).toEqual({
      maxCalls: 2,
      windowMs: 60_000,
      perWhat: "",
      onLimiterError: ""
    })
    expect(rateLimit(", rate_limit: { max_calls: 2, window: -1m, per_what: tenant }")).toEqual({
      maxCalls: 2,
      windowMs: -60_000,
      perWhat: "tenant",
      onLimiterError: ""
    })
  })

  it("reports YAML syntax errors and duplicate keys", () => {
    expect(rejection("rules: [\n")).toMatch(/^yaml: /)
    expect(rejection("default_action: allow\ndefault_action: deny\n")).toMatch(/^yaml: Map keys must be unique/)
    expect(rejection("rules:\n  - id: a\n    id: b\n")).toMatch(/^yaml: Map keys must be unique/)
  })

  it("resolves anchors, aliases and merge keys", () => {
    const bundle = load(`
shared: &approve { decision: require_approval, reason: needs a human }
rules:
  - { id: a, priority: 1, when: { target: a }, then: *approve }
  - { id: b, priority: 2, when: { target: b }, then: { <<: *approve, reason: overridden } }
`)
    expect(decide(bundle, { target: "a" })).toEqual(["require_approval", "a", "needs a human"])
    expect(decide(bundle, { target: "b" })).toEqual(["require_approval", "b", "overridden"])
    expect(rejection("rules: *nowhere\n")).toMatch(/^yaml: |unknown anchor/)
  })

  it("reads only the first document", () => {
    expect(load("default_action: allow\n---\ndefault_action: deny\n").defaultAction).toBe("allow")
  })

  it("drops null list items, as the reference decoder does", () => {
    const bundle = load(`rules:\n  - ~\n  - id: r\n    when: { targets: [a, ~, b] }\n    then: { decision: allow }\n`)
    expect(bundle.rules).toHaveLength(1)
    expect(bundle.rules[0]!.when.targets).toEqual(["a", "b"])
  })
})

const argumentYaml = (regex: string): string =>
  `rules:\n  - id: r\n    when: { arguments: { v: { regex: '${regex.replaceAll("'", "''")}' } } }\n    then: { decision: allow }\n`

describe("Policy.evaluate", () => {
  it("is permissive without a bundle (10.1)", () => {
    expect(Policy.evaluate(undefined, input())).toEqual({
      decision: "allow",
      ruleId: "permissive",
      reason: "",
      approval: undefined,
      rateLimit: undefined
    })
    expect(Policy.evaluate(undefined, input({ kind: "local" })).ruleId).toBe("permissive")
  })

  it("applies the default action (10.3 step 4)", () => {
    expect(decide(load("default_action: allow\n"))).toEqual(["allow", "default", "default allow"])
    expect(decide(load("default_action: deny\n"))).toEqual(["deny", "default", "no explicit allow rule matched"])
    expect(decide(load("rules: []\n"))).toEqual(["deny", "default", "no explicit allow rule matched"])
    expect(decide(load("default_action: ALLOW\n"))).toEqual(["deny", "default", "no explicit allow rule matched"])
    expect(decide(load("default_action: yes\n"))[0]).toBe("deny")
  })

  it("allows unmatched local steps whatever the default (10.3 step 3, quirk)", () => {
    expect(decide(load("default_action: deny\n"), { kind: "local" })).toEqual(["allow", "local", "local step"])
    expect(decide(load("default_action: allow\n"), { kind: "local" })).toEqual(["allow", "local", "local step"])
    // a matching rule still wins over the local fallback
    const denyLocal = load(`rules:\n  - { id: no-local, when: { step_kind: local }, then: { decision: deny } }\n`)
    expect(decide(denyLocal, { kind: "local" })).toEqual(["deny", "no-local", ""])
    // "local" is matched exactly
    expect(decide(load("default_action: deny\n"), { kind: "Local" })[1]).toBe("default")
  })

  it("takes the first matching rule by ascending priority, not file order", () => {
    const bundle = load(`default_action: allow
rules:
  - { id: late, priority: 30, when: { target: "web_*" }, then: { decision: allow, reason: late } }
  - { id: early, priority: -5, when: { target: "web_search" }, then: { decision: deny, reason: early } }
  - { id: middle, priority: 10, when: { target: "web_*" }, then: { decision: require_approval } }
`)
    expect(bundle.rules.map((r) => r.id)).toEqual(["early", "middle", "late"])
    expect(decide(bundle, { target: "web_search" })).toEqual(["deny", "early", "early"])
    expect(decide(bundle, { target: "web_fetch" })).toEqual(["require_approval", "middle", ""])
    expect(decide(bundle, { target: "other" })).toEqual(["allow", "default", "default allow"])
  })

  it("returns the rule's reason as written, approval config and rate limit", () => {
    const bundle = load(`rules:
  - id: gate
    when: { target: t }
    then:
      decision: require_approval
      reason: "  spaced  "
      approval_config: { approvers: [alice], timeout: 90s, message: check }
      rate_limit: { max_calls: 3, window: 1h, per_what: global }
`)
    expect(Policy.evaluate(bundle, input({ target: "t" }))).toEqual({
      decision: "require_approval",
      ruleId: "gate",
      reason: "  spaced  ",
      approval: { approvers: ["alice"], timeoutMs: 90_000, message: "check" },
      rateLimit: { maxCalls: 3, windowMs: 3_600_000, perWhat: "global", onLimiterError: "" }
    })
  })

  it("an empty when matches everything", () => {
    const bundle = load(`rules:\n  - { id: all, when: {}, then: { decision: allow } }\n  - { id: none, priority: 1, then: { decision: deny } }\n`)
    expect(decide(bundle, { kind: "anything", target: "" })).toEqual(["allow", "all", ""])
  })

  it("matches target globs", () => {
    const bundle = allowWhen(`{ target: "web_*" }`)
    expect(decide(bundle, { target: "web_search" })[0]).toBe("allow")
    expect(decide(bundle, { target: "web/search" })[0]).toBe("deny")
    expect(decide(bundle, { target: "WEB_search" })[0]).toBe("deny")
    const malformed = allowWhen(`{ target: "web_[" }`)
    expect(decide(malformed, { target: "web_[" })[0]).toBe("allow") // exact-equality shortcut
    expect(decide(malformed, { target: "web_x" })[0]).toBe("deny")
  })

  it("matches any of targets", () => {
    const bundle = allowWhen(`{ targets: ["fs_write_*", "fs_edit_*", "exact"] }`)
    expect(decide(bundle, { target: "fs_write_file" })[0]).toBe("allow")
    expect(decide(bundle, { target: "fs_edit_x" })[0]).toBe("allow")
    expect(decide(bundle, { target: "exact" })[0]).toBe("allow")
    expect(decide(bundle, { target: "fs_read_file" })[0]).toBe("deny")
    // an empty list is no condition
    expect(decide(allowWhen(`{ targets: [] }`), { target: "anything" })[0]).toBe("allow")
  })

  it("matches agent_id and agent_ids exactly", () => {
    expect(decide(allowWhen(`{ agent_id: hello }`), { agentId: "hello" })[0]).toBe("allow")
    expect(decide(allowWhen(`{ agent_id: hello }`), { agentId: "hello2" })[0]).toBe("deny")
    expect(decide(allowWhen(`{ agent_id: "hel*" }`), { agentId: "hello" })[0]).toBe("deny")
    expect(decide(allowWhen(`{ agent_ids: [a, b] }`), { agentId: "b" })[0]).toBe("allow")
    expect(decide(allowWhen(`{ agent_ids: [a, b] }`), { agentId: "c" })[0]).toBe("deny")
  })

  it("matches step_kind exactly", () => {
    expect(decide(allowWhen(`{ step_kind: llm_call }`), { kind: "llm_call" })[0]).toBe("allow")
    expect(decide(allowWhen(`{ step_kind: llm_call }`), { kind: "tool_call" })[0]).toBe("deny")
    expect(decide(allowWhen(`{ step_kind: llm_call }`), { kind: "LLM_CALL" })[0]).toBe("deny")
  })

  it("requires every present condition (AND)", () => {
    const bundle = allowWhen(`{ target: "shell_*", agent_id: ops, step_kind: tool_call }`)
    expect(decide(bundle, { target: "shell_exec", agentId: "ops" })[0]).toBe("allow")
    expect(decide(bundle, { target: "shell_exec", agentId: "dev" })[0]).toBe("deny")
    expect(decide(bundle, { target: "shell_exec", agentId: "ops", kind: "llm_call" })[0]).toBe("deny")
  })

  it("argument equals", () => {
    const bundle = argumentRule(`{ equals: ls }`)
    expect(withArgs(bundle, `{"v":"ls"}`)).toBe("allow")
    expect(withArgs(bundle, `{"v":"ls -la"}`)).toBe("deny")
    expect(withArgs(bundle, `{"v":"LS"}`)).toBe("deny")
  })

  it("argument contains", () => {
    const bundle = argumentRule(`{ contains: "rm " }`)
    expect(withArgs(bundle, `{"v":"sudo rm -rf /"}`)).toBe("allow")
    expect(withArgs(bundle, `{"v":"rmdir x"}`)).toBe("deny")
  })

  it("argument one_of", () => {
    const bundle = argumentRule(`{ one_of: [staging, prod] }`)
    expect(withArgs(bundle, `{"v":"prod"}`)).toBe("allow")
    expect(withArgs(bundle, `{"v":"dev"}`)).toBe("deny")
    expect(withArgs(bundle, `{"v":"prod "}`)).toBe("deny")
  })

  it("argument regex is an unanchored RE2 search", () => {
    const bundle = argumentRule(`{ regex: "prod-[0-9]+" }`)
    expect(withArgs(bundle, `{"v":"eu-prod-12"}`)).toBe("allow")
    expect(withArgs(bundle, `{"v":"prod-x"}`)).toBe("deny")
    const anchored = argumentRule(`{ regex: "^prod-.*" }`)
    expect(withArgs(anchored, `{"v":"prod-123"}`)).toBe("allow")
    expect(withArgs(anchored, `{"v":"staging-123"}`)).toBe("deny")
    expect(withArgs(anchored, `{"v":"prod"}`)).toBe("deny")
  })

  it("argument regex uses RE2 syntax: (?i) flags, \\z", () => {
    const caseless = argumentRule(`{ regex: "(?i)^drop table" }`)
    expect(withArgs(caseless, `{"v":"DROP TABLE users"}`)).toBe("allow")
    expect(withArgs(caseless, `{"v":"select 1"}`)).toBe("deny")
    const endOfText = argumentRule(`{ regex: 'ls\\z' }`)
    expect(withArgs(endOfText, `{"v":"ls"}`)).toBe("allow")
    expect(withArgs(endOfText, `{"v":"ls\\n"}`)).toBe("deny")
    // Go's $ (without (?m)) matches only at the end of the text
    const dollar = argumentRule(`{ regex: "ls$" }`)
    expect(withArgs(dollar, `{"v":"ls\\n"}`)).toBe("deny")
  })

  it("argument constraints combine with AND, across keys too", () => {
    const bundle = allowWhen(`{ arguments: { cmd: { contains: git, regex: "^git (status|log)" }, dir: { one_of: [/repo] } } }`)
    expect(withArgs(bundle, `{"cmd":"git status","dir":"/repo"}`)).toBe("allow")
    expect(withArgs(bundle, `{"cmd":"git push","dir":"/repo"}`)).toBe("deny")
    expect(withArgs(bundle, `{"cmd":"git log","dir":"/tmp"}`)).toBe("deny")
    expect(withArgs(bundle, `{"cmd":"git log"}`)).toBe("deny")
  })

  it("arguments nested 9,999 deep are judged (as Go decodes up to 10,000 levels), not a stack overflow", () => {
    const deep = "[".repeat(9_999) + "\"ls\"" + "]".repeat(9_999)
    expect(withArgs(argumentRule(`{ contains: ls }`), `{"v":${deep}}`)).toBe("allow")
    expect(withArgs(argumentRule(`{ equals: x }`), `{"v":${deep}}`)).toBe("deny")
  })

  it("argument predicates fail without a JSON object", () => {
    const bundle = argumentRule(`{ regex: ".*" }`)
    expect(withArgs(bundle, `{"v":""}`)).toBe("allow")
    expect(withArgs(bundle, undefined)).toBe("deny")
    expect(withArgs(bundle, "null")).toBe("deny")
    expect(withArgs(bundle, `["v"]`)).toBe("deny")
    expect(withArgs(bundle, `"v"`)).toBe("deny")
    expect(withArgs(bundle, `{"w":"x"}`)).toBe("deny")
    expect(withArgs(bundle, `{not json`)).toBe("deny")
    // a number Go cannot hold as a float64 fails the whole decode
    expect(withArgs(bundle, `{"v":"x","big":1e400}`)).toBe("deny")
  })

  it("compares argument values in their Go %v form (quirk)", () => {
    const equals = (expected: string, argsRaw: string) => withArgs(argumentRule(`{ equals: "${expected}" }`), argsRaw)
    expect(equals("10", `{"v":10}`)).toBe("allow")
    expect(equals("10", `{"v":10.0}`)).toBe("allow")
    expect(equals("1e+06", `{"v":1000000}`)).toBe("allow")
    expect(equals("1000000", `{"v":1000000}`)).toBe("deny")
    expect(equals("true", `{"v":true}`)).toBe("allow")
    expect(equals("<nil>", `{"v":null}`)).toBe("allow")
    expect(equals("[1 a <nil> 2.5]", `{"v":[1,"a",null,2.5]}`)).toBe("allow")
    expect(equals("map[a:x b:1]", `{"v":{"b":1,"a":"x"}}`)).toBe("allow")
    expect(equals("-0", `{"v":-0}`)).toBe("allow")
    // duplicate keys: the last one wins
    expect(equals("2", `{"v":1,"v":2}`)).toBe("allow")
  })

  it("parses args once per evaluation and only when needed", () => {
    const bundle = load(`rules:
  - { id: a, priority: 1, when: { target: x, arguments: { v: { equals: "1" } } }, then: { decision: deny } }
  - { id: b, priority: 2, when: { arguments: { v: { equals: "2" } } }, then: { decision: allow } }
`)
    expect(Policy.evaluate(bundle, input({ target: "y", argsRaw: `{"v":2}` })).ruleId).toBe("b")
    expect(Policy.evaluate(bundle, input({ target: "x", argsRaw: `{"v":1}` })).ruleId).toBe("a")
  })
})

describe("reference example policies (10.6)", () => {
  const shell = load(`default_action: deny
rules:
  - id: allow-llm
    priority: 5
    when:
      step_kind: llm_call
    then:
      decision: allow
  - id: allow-safe-shell
    priority: 10
    when:
      target: shell_exec
      arguments:
        command:
          regex: '^\\s*(ls|cat|pwd|echo|whoami|date|uname|df|free|uptime|head|tail|wc)(\\s|$)'
    then:
      decision: allow
      reason: safe read-only command
  - id: approve-other-shell
    priority: 20
    when:
      target: shell_exec
    then:
      decision: require_approval
      reason: non-safe shell command needs approval
`)

  const mcp = load(`default_action: allow
rules:
  - id: approve-fs-writes
    priority: 10
    when:
      targets: ["fs_write_*", "fs_edit_*", "fs_move_*", "fs_create_*"]
    then:
      decision: require_approval
      reason: filesystem writes need approval
`)

  const researcher = load(`default_action: deny
rules:
  - id: allow-llm
    priority: 5
    when:
      step_kind: llm_call
    then:
      decision: allow
  - id: allow-research-tools
    priority: 10
    when:
      targets: ["web_search", "doc_fetch", "calculator"]
    then:
      decision: allow
      reason: research tools are permitted
`)

  it("shell: deny by default, LLM calls allowed", () => {
    expect(decide(shell, { kind: "llm_call", target: "gpt" })).toEqual(["allow", "allow-llm", ""])
    expect(decide(shell, { target: "web_search" })).toEqual(["deny", "default", "no explicit allow rule matched"])
    expect(decide(shell, { kind: "local", target: "now" })).toEqual(["allow", "local", "local step"])
  })

  it("shell: safe read-only commands allowed, anything else needs approval", () => {
    const run = (command: string) => decide(shell, { target: "shell_exec", argsRaw: JSON.stringify({ command }) })
    expect(run("ls -la")).toEqual(["allow", "allow-safe-shell", "safe read-only command"])
    expect(run("  pwd")).toEqual(["allow", "allow-safe-shell", "safe read-only command"])
    expect(run("cat")).toEqual(["allow", "allow-safe-shell", "safe read-only command"])
    expect(run("rm -rf /")).toEqual(["require_approval", "approve-other-shell", "non-safe shell command needs approval"])
    expect(run("lsblk")).toEqual(["require_approval", "approve-other-shell", "non-safe shell command needs approval"])
    expect(decide(shell, { target: "shell_exec" })[1]).toBe("approve-other-shell")
  })

  it("mcp: allow by default, filesystem writes need approval", () => {
    for (const target of ["fs_write_file", "fs_edit_file", "fs_move_file", "fs_create_directory"]) {
      expect(decide(mcp, { target })).toEqual(["require_approval", "approve-fs-writes", "filesystem writes need approval"])
    }
    expect(decide(mcp, { target: "fs_read_file" })).toEqual(["allow", "default", "default allow"])
    expect(decide(mcp, { kind: "llm_call", target: "model" })).toEqual(["allow", "default", "default allow"])
  })

  it("researcher: only its tools and LLM calls", () => {
    expect(decide(researcher, { target: "doc_fetch" })).toEqual(["allow", "allow-research-tools", "research tools are permitted"])
    expect(decide(researcher, { target: "shell_exec" })).toEqual(["deny", "default", "no explicit allow rule matched"])
  })
})

describe("glob (Go path.Match, 10.4)", () => {
  it("matches the examples of 10.4", () => {
    expect(Glob.match("web_*", "web_search")).toBe(true)
    expect(Glob.match("web_*", "web/search")).toBe(false)
    expect(Glob.match("fs_*", "fs_write_file")).toBe(true)
    expect(Glob.match("*", "")).toBe(true)
    expect(Glob.match("[^a-c]x", "dx")).toBe(true)
    expect(Glob.match("[^a-c]x", "bx")).toBe(false)
    expect(Glob.match("WEB_*", "web_x")).toBe(false)
  })

  it("treats ! as a plain class member, not a negation", () => {
    expect(Glob.match("[!a-c]", "!")).toBe(true)
    expect(Glob.match("[!a-c]", "b")).toBe(true)
    expect(Glob.match("[!a-c]", "d")).toBe(false)
  })

  it("? matches one code point except /", () => {
    expect(Glob.match("a?c", "abc")).toBe(true)
    expect(Glob.match("a?c", "a/c")).toBe(false)
    expect(Glob.match("a?c", "ac")).toBe(false)
    expect(Glob.match("a?c", "aéc")).toBe(true)
    expect(Glob.match("a?c", "a😀c")).toBe(true)
    expect(Glob.match("[😀-😂]", "😁")).toBe(true)
  })

  it("* never crosses /, and the whole value must match", () => {
    expect(Glob.match("*", "a/b")).toBe(false)
    expect(Glob.match("*/*", "a/b")).toBe(true)
    expect(Glob.match("a*", "xa")).toBe(false)
    expect(Glob.match("*b", "aab")).toBe(true)
    expect(Glob.match("*b*", "abc")).toBe(true)
    expect(Glob.match("a*b*c", "aXbYbZc")).toBe(true)
    expect(Glob.match("a*b", "a/b")).toBe(false)
    expect(Glob.match("**", "abc")).toBe(true)
  })

  it("supports classes with ranges and escapes", () => {
    expect(Glob.match("[a-c]1", "b1")).toBe(true)
    expect(Glob.match("[a-cx-z]", "y")).toBe(true)
    expect(Glob.match("[a-c]", "d")).toBe(false)
    expect(Glob.match("[\\]]", "]")).toBe(true)
    expect(Glob.match("[\\-]", "-")).toBe(true)
    expect(Glob.match("\\*", "*")).toBe(true)
    expect(Glob.match("\\*", "a")).toBe(false)
    expect(Glob.match("a\\?", "a?")).toBe(true)
  })

  it("malformed patterns never match, except by exact equality", () => {
    for (const pattern of ["[", "a[", "[]a]", "[a-]", "a\\", "[a", "[^]", "[a-b"]) {
      expect(Glob.pathMatch(pattern, "a")).toBeUndefined()
      expect(Glob.match(pattern, "a")).toBe(false)
      expect(Glob.match(pattern, pattern)).toBe(true)
    }
    // malformed after a mismatch is still an error, like Go
    expect(Glob.pathMatch("x[", "a")).toBeUndefined()
    expect(Glob.pathMatch("x", "a")).toBe(false)
    expect(Glob.pathMatch("a*b[", "acd")).toBeUndefined()
  })
})

describe("Go %v formatting (10.4)", () => {
  it("formats every number example of 10.4", () => {
    const examples: ReadonlyArray<readonly [string, string]> = [
      ["10", "10"],
      ["1.5", "1.5"],
      ["100000", "100000"],
      ["999999", "999999"],
      ["1000000", "1e+06"],
      ["1234567.5", "1.2345675e+06"],
      ["123456789", "1.23456789e+08"],
      ["1e20", "1e+20"],
      ["1e21", "1e+21"],
      ["0.0001", "0.0001"],
      ["0.00001", "1e-05"],
      ["0.0000123", "1.23e-05"],
      ["-0", "-0"],
      ["-2500000", "-2.5e+06"],
      ["9007199254740993", "9.007199254740992e+15"]
    ]
    for (const [json, expected] of examples) expect(GoFormat.formatValue(JSON.parse(json))).toBe(expected)
    expect(GoFormat.formatFloat(0)).toBe("0")
    expect(GoFormat.formatFloat(1e100)).toBe("1e+100")
    expect(GoFormat.formatFloat(5e-324)).toBe("5e-324")
    expect(GoFormat.formatFloat(-123456.75)).toBe("-123456.75")
  })

  it("formats the compound examples of 10.4", () => {
    expect(GoFormat.formatValue(JSON.parse(`[1,"a",null,2.5]`))).toBe("[1 a <nil> 2.5]")
    expect(GoFormat.formatValue(JSON.parse(`{"b":1,"a":"x"}`))).toBe("map[a:x b:1]")
    expect(GoFormat.formatValue([])).toBe("[]")
    expect(GoFormat.formatValue({})).toBe("map[]")
    expect(GoFormat.formatValue(JSON.parse(`{"z":[{"y":true,"x":null}],"a":{}}`))).toBe("map[a:map[] z:[map[x:<nil> y:true]]]")
    expect(GoFormat.formatValue(null)).toBe("<nil>")
    expect(GoFormat.formatValue(false)).toBe("false")
  })

  it("sorts map keys by code point, like Go", () => {
    expect(GoFormat.formatValue({ "\uff5e": 1, "\u{1f600}": 2, B: 3, a: 4 })).toBe("map[B:3 a:4 \uff5e:1 \u{1f600}:2]")
  })

  it("quotes like Go's %q", () => {
    expect(GoFormat.quote("plain")).toBe(`"plain"`)
    expect(GoFormat.quote(`a"b\\c`)).toBe(`"a\\"b\\\\c"`)
    expect(GoFormat.quote("tab\tnl\n\x01\x7f")).toBe(`"tab\\tnl\\n\\x01\\x7f"`)
    expect(GoFormat.quote("é😀\u00a0")).toBe(`"é😀\\u00a0"`)
  })
})

describe("Go duration parsing", () => {
  it("parses Go duration strings to milliseconds", () => {
    const cases: ReadonlyArray<readonly [string, number]> = [
      ["0", 0],
      ["+0", 0],
      ["-0", 0],
      ["0s", 0],
      ["30s", 30_000],
      ["1m30s", 90_000],
      ["1h30m", 5_400_000],
      ["1.5h", 5_400_000],
      [".5s", 500],
      ["1.s", 1_000],
      ["500ms", 500],
      ["1h2m3s4ms5us6ns", 3_723_004.005006],
      ["2us", 0.002],
      ["2\u00b5s", 0.002],
      ["2\u03bcs", 0.002],
      ["-1m", -60_000],
      ["+5m", 300_000],
      ["1s1s", 2_000],
      ["0.000000001s", 0.000001]
    ]
    for (const [text, ms] of cases) expect(Duration.parseMillis(text)).toBeCloseTo(ms, 9)
    expect(Duration.parseNanos("2562047h47m16.854775807s")).toBe(9223372036854775807n)
    expect(Duration.parseNanos("-2562047h47m16.854775808s")).toBe(-9223372036854775808n)
  })

  it("rejects what Go rejects", () => {
    for (const text of ["", "300", "1", "s", ".s", "-", "1x", "1S", "1 s", " 1s", "1s ", "1hm", "1.5", "+", "1e3s", "1_0s", "2562047h47m16.854775808s", "9223372036854775808ns"]) {
      expect(Duration.parseMillis(text), text).toBeUndefined()
    }
  })
})

// ---------------------------------------------------------------------------
// The current stage's bundle language (PROTOCOL-CURRENT C.8.6)
// ---------------------------------------------------------------------------

const loadCurrent = (yaml: string): Policy.Bundle => {
  const result = Policy.parseBundle(yaml)
  if (Result.isFailure(result)) throw new Error(`bundle rejected: ${result.failure}`)
  return result.success
}

const rejectionCurrent = (yaml: string): string => {
  const result = Policy.parseBundle(yaml, { stage: "current" })
  if (Result.isSuccess(result)) throw new Error("bundle unexpectedly loaded")
  return result.failure
}

const sha256 = (text: string): string => createHash("sha256").update(text, "utf8").digest("hex")

/** A deny-by-default current bundle with one `allow` rule whose `when` is the given flow map. */
const allowWhenCurrent = (when: string): Policy.Bundle =>
  loadCurrent(`default_action: deny\nrules:\n  - id: r\n    when: ${when}\n    then: { decision: allow }\n`)

describe("the current stage's bundle language (C.8.6)", () => {
  it("is the default language and parses every member; the hash is the text's SHA-256", () => {
    const text = `
default_action: deny
rules:
  - id: gate
    when:
      target: "deploy/*"
      targets: ["deploy/prod*", "deploy/stage?"]
      agent_id: hello
      agent_ids: [hello, x]
      step_kind: tool_call
      arguments:
        env: { equals: prod, contains: ro, one_of: [prod, staging], regex: '^p' }
    then:
      decision: judge
      reason: "ask the judge"
      approval_config: { approvers: [alice], timeout: 5m, message: check }
      rate_limit: { max_calls: 5, window: 1m, per_what: session, max_wait: 30s, on_limiter_error: deny }
      budget: { max_tokens: 1000, scope: session, on_exceed: require_approval }
      judge: { instructions: "Production deploys need a reason.", threshold: 0.8, fallback: deny }
  - id: second
    then: { decision: allow }
`
    const bundle = loadCurrent(text)
    expect(bundle.policyHash).toBe(sha256(text))
    expect(bundle.rules.map((r) => [r.id, r.priority])).toEqual([["gate", 0], ["second", 1]])
    const rule = bundle.rules[0]!
    expect([rule.when.target, rule.when.targets, rule.when.agentId, rule.when.agentIds, rule.when.stepKind]).toEqual([
      "deploy/*",
      ["deploy/prod*", "deploy/stage?"],
      "hello",
      ["hello", "x"],
      "tool_call"
    ])
    expect(rule.then).toMatchObject({
      decision: "judge",
      reason: "ask the judge",
      approval: { approvers: ["alice"], timeoutMs: 300_000, message: "check" },
      rateLimit: { maxCalls: 5, windowMs: 60_000, perWhat: "session", maxWaitMs: 30_000, onLimiterError: "deny" },
      budget: { maxTokens: 1000, scope: "session", onExceed: "require_approval" },
      judge: { instructions: "Production deploys need a reason.", threshold: 0.8, fallback: "deny" }
    })
    // and the same text is refused by the seed language, which knows no judge
    expect(Result.isFailure(Policy.parseBundle(text, SEED))).toBe(true)
  })

  it("evaluates rules in file order: the first match wins", () => {
    const bundle = loadCurrent(`default_action: allow
rules:
  - { id: exact, when: { target: web_search }, then: { decision: deny, reason: exact } }
  - { id: broad, when: { target: "web_*" }, then: { decision: require_approval } }
  - { id: broader, when: { target: "*" }, then: { decision: deny } }
`)
    expect(decide(bundle, { target: "web_search" })).toEqual(["deny", "exact", "exact"])
    expect(decide(bundle, { target: "web_fetch" })).toEqual(["require_approval", "broad", ""])
    expect(decide(bundle, { target: "shell" })).toEqual(["deny", "broader", ""])
    const reversed = loadCurrent(`rules:
  - { id: broad, when: { target: "web_*" }, then: { decision: require_approval } }
  - { id: exact, when: { target: web_search }, then: { decision: deny } }
`)
    expect(decide(reversed, { target: "web_search" })[1]).toBe("broad")
  })

  it("results carry the policy hash and the rule's budget and judge; fixed results too", () => {
    const text = `default_action: allow
rules:
  - id: b
    when: { step_kind: llm_call }
    then: { decision: allow, budget: { max_tokens: 10 } }
`
    const bundle = loadCurrent(text)
    const hash = sha256(text)
    expect(Policy.evaluate(bundle, input({ kind: "llm_call" }))).toEqual({
      decision: "allow",
      ruleId: "b",
      reason: "",
      approval: { approvers: null, timeoutMs: 0, message: "" },
      rateLimit: undefined,
      policyHash: hash,
      budget: { maxTokens: 10, scope: "execution", onExceed: "deny" },
      judge: undefined
    })
    expect(Policy.evaluate(bundle, input())).toEqual({ ...Policy.defaultAllow, policyHash: hash })
    expect(Policy.evaluate(bundle, input({ kind: "local", target: "x" }))).toMatchObject({ ruleId: "local", policyHash: hash })
    const denying = loadCurrent("default_action: deny\n")
    expect(Policy.evaluate(denying, input({ kind: "local" }))).toEqual({
      ...Policy.localStep,
      policyHash: sha256("default_action: deny\n")
    })
    expect(decide(denying)).toEqual(["deny", "default", "no explicit allow rule matched"])
    expect(Policy.evaluate(undefined, input())).toEqual(Policy.permissive)
  })

  it("rejects unknown keys anywhere, saying where; priority gets a hint", () => {
    expect(rejectionCurrent("version: 3\ndefault_action: allow\n")).toBe("bundle: unknown key \"version\"")
    expect(rejectionCurrent("rules:\n  - { id: a, priority: 1, then: { decision: allow } }\n")).toBe(
      "rule \"a\": unknown key \"priority\" (rules are evaluated in file order; remove priority and order the rules instead)"
    )
    const cases: ReadonlyArray<readonly [string, string]> = [
      ["{ id: a, colour: blue, then: { decision: allow } }", "rule \"a\": unknown key \"colour\""],
      ["{ id: a, when: { flavour: x }, then: { decision: allow } }", "rule \"a\": when: unknown key \"flavour\""],
      [
        "{ id: a, when: { arguments: { v: { equals: x, fuzzy: true } } }, then: { decision: allow } }",
        "rule \"a\": when.arguments.v: unknown key \"fuzzy\""
      ],
      ["{ id: a, then: { decision: allow, rule_id: b } }", "rule \"a\": then: unknown key \"rule_id\""],
      [
        "{ id: a, then: { decision: require_approval, approval_config: { approver: x } } }",
        "rule \"a\": then.approval_config: unknown key \"approver\""
      ],
      [
        "{ id: a, then: { decision: allow, rate_limit: { max_calls: 1, window: 1s, burst: 9 } } }",
        "rule \"a\": then.rate_limit: unknown key \"burst\""
      ],
      [
        "{ id: a, then: { decision: allow, budget: { max_tokens: 5, tokens: 1 } } }",
        "rule \"a\": then.budget: unknown key \"tokens\""
      ],
      [
        "{ id: a, then: { decision: judge, judge: { instructions: x, model: gpt } } }",
        "rule \"a\": then.judge: unknown key \"model\""
      ]
    ]
    for (const [rule, message] of cases) expect(rejectionCurrent(`rules:\n  - ${rule}\n`), rule).toBe(message)
  })

  it("requires unique rule ids", () => {
    expect(rejectionCurrent("rules:\n  - { id: a, then: { decision: allow } }\n  - { then: { decision: deny } }\n")).toBe(
      "rules[1]: rule missing id"
    )
    expect(
      rejectionCurrent("rules:\n  - { id: a, then: { decision: allow } }\n  - { id: a, then: { decision: deny } }\n")
    ).toBe("duplicate rule id \"a\" (rule ids must be unique)")
    // without priorities, rules may follow each other freely
    expect(loadCurrent("rules:\n  - { id: a, then: { decision: allow } }\n  - { id: b, then: { decision: deny } }\n").rules)
      .toHaveLength(2)
  })

  it("checks decisions, rate limits, budgets and judge options", () => {
    const rule = (then: string) => rejectionCurrent(`rules:\n  - { id: a, then: ${then} }\n`)
    expect(rule("{ reason: x }")).toBe(
      "rule \"a\": then.decision is required (allow, deny, require_approval or judge)"
    )
    expect(rule("{ decision: maybe }")).toBe(
      "rule \"a\": unknown policy decision \"maybe\" (want allow, deny, require_approval or judge)"
    )
    expect(rule("{ decision: allow, rate_limit: { max_calls: 1, window: 1s, per_what: user } }")).toBe(
      "rule \"a\": then.rate_limit.per_what must be execution, session, agent or global, got \"user\""
    )
    expect(rule("{ decision: allow, rate_limit: { max_calls: 1, window: 1s, on_limiter_error: retry } }")).toBe(
      "rule \"a\": then.rate_limit.on_limiter_error must be allow or deny, got \"retry\""
    )
    expect(rule("{ decision: allow, rate_limit: { max_calls: 1, window: 1s, max_wait: -1s } }")).toBe(
      "rule \"a\": then.rate_limit.max_wait must not be negative"
    )
    expect(rule("{ decision: allow, rate_limit: { max_calls: 1, window: 1s, max_wait: 30 } }")).toBe(
      "rule \"a\": then.rate_limit.max_wait: invalid duration 30 (a bare number; write a duration string with a unit, e.g. \"30s\")"
    )
    expect(rule("{ decision: allow, budget: { max_tokens: 0 } }")).toBe("rule \"a\": then.budget.max_tokens must be positive")
    expect(rule("{ decision: allow, budget: { max_tokens: 5, scope: agent } }")).toBe(
      "rule \"a\": then.budget.scope must be execution or session, got \"agent\""
    )
    expect(rule("{ decision: allow, budget: { max_tokens: 5, on_exceed: allow } }")).toBe(
      "rule \"a\": then.budget.on_exceed must be deny or require_approval, got \"allow\""
    )
    expect(rule("{ decision: judge }")).toBe("rule \"a\": then.judge.instructions is required")
    expect(rule("{ decision: judge, judge: { instructions: x, threshold: 1.5 } }")).toBe(
      "rule \"a\": then.judge.threshold must be between 0 and 1"
    )
    expect(rule("{ decision: judge, judge: { instructions: x, threshold: high } }")).toBe(
      "rule \"a\": then.judge.threshold: expected a number, got \"high\""
    )
    expect(rule("{ decision: judge, judge: { instructions: x, fallback: judge } }")).toBe(
      "rule \"a\": then.judge.fallback must be allow, deny or require_approval, got \"judge\""
    )
    expect(rule("{ decision: allow, judge: { instructions: x } }")).toBe(
      "rule \"a\": then.judge is only valid with decision judge"
    )
    const judged = loadCurrent("rules:\n  - { id: a, then: { decision: judge, judge: { instructions: be careful } } }\n")
    expect(judged.rules[0]!.then.judge).toEqual({ instructions: "be careful", threshold: 0.6, fallback: "require_approval" })
    const whole = loadCurrent("rules:\n  - { id: a, then: { decision: judge, judge: { instructions: x, threshold: 1 } } }\n")
    expect(whole.rules[0]!.then.judge!.threshold).toBe(1)
  })

  it("targets: '*' and '?' also match '/', classes and escapes work, the exact value always matches", () => {
    const bundle = allowWhenCurrent(`{ targets: ["fs/*", "db_?", "[a-c]x", "[^a-c]y", "lit\\\\*"] }`)
    const allowed = (target: string) => decide(bundle, { target })[0] === "allow"
    expect(allowed("fs/a/b/c")).toBe(true)
    expect(allowed("fs/")).toBe(true)
    expect(allowed("db_/")).toBe(true)
    expect(allowed("db_12")).toBe(false)
    expect(allowed("bx")).toBe(true)
    expect(allowed("dx")).toBe(false)
    expect(allowed("dy")).toBe(true)
    expect(allowed("ay")).toBe(false)
    expect(allowed("lit*")).toBe(true)
    expect(allowed("litx")).toBe(false)
    const star = allowWhenCurrent(`{ target: "*" }`)
    expect(decide(star, { target: "a/b" })[0]).toBe("allow")
    expect(decide(star, { target: "" })[0]).toBe("allow")
    const middle = allowWhenCurrent(`{ target: "mcp_*_write" }`)
    expect(decide(middle, { target: "mcp_fs/x_write" })[0]).toBe("allow")
    expect(decide(middle, { target: "mcp_fs_write_log" })[0]).toBe("deny")
    // target and targets must both hold
    const both = allowWhenCurrent(`{ target: "web_*", targets: ["*_search"] }`)
    expect(decide(both, { target: "web_search" })[0]).toBe("allow")
    expect(decide(both, { target: "web_fetch" })[0]).toBe("deny")
  })

  it("rejects malformed globs at load", () => {
    const cases: ReadonlyArray<readonly [string, string]> = [
      ["[a", "unclosed character class"],
      ["[]a]", "empty character class"],
      ["[^]", "empty character class"],
      ["[a-]", "malformed character range"],
      ["x\\\\", "trailing backslash"]
    ]
    for (const [pattern, problem] of cases) {
      expect(rejectionCurrent(`rules:\n  - { id: g, when: { target: "${pattern}" }, then: { decision: allow } }\n`))
        .toBe(`rule "g": when.target: malformed glob ${JSON.stringify(pattern.replaceAll("\\\\", "\\"))}: ${problem}`)
    }
    expect(rejectionCurrent(`rules:\n  - { id: g, when: { targets: [ok, "b["] }, then: { decision: allow } }\n`)).toBe(
      "rule \"g\": when.targets[1]: malformed glob \"b[\": unclosed character class"
    )
  })

  it("arguments: equals, contains, one_of and RE2 regexes on Go %v strings; empty predicates and bad regexes are refused", () => {
    const bundle = loadCurrent(`default_action: deny
rules:
  - id: cmd
    when:
      arguments:
        cmd: { regex: '(?i)^\\s*ls\\b' }
        n: { one_of: ["1", "2"] }
        path: { contains: "/tmp/" }
        mode: { equals: "true" }
    then: { decision: allow }
`)
    const args = (cmd: string, n: number, path: string, mode: boolean) =>
      Policy.evaluate(bundle, input({ argsRaw: JSON.stringify({ cmd, n, path, mode }) })).ruleId
    expect(args("  LS -la", 1, "/tmp/x", true)).toBe("cmd")
    expect(args("lsof", 1, "/tmp/x", true)).toBe("default")
    expect(args("ls", 3, "/tmp/x", true)).toBe("default")
    expect(args("ls", 2, "/var/x", true)).toBe("default")
    expect(args("ls", 2, "/tmp/x", false)).toBe("default")
    expect(Policy.evaluate(bundle, input({ argsRaw: "{\"cmd\":\"ls\"}" })).ruleId).toBe("default")
    expect(rejectionCurrent("rules:\n  - { id: a, when: { arguments: { v: {} } }, then: { decision: allow } }\n")).toBe(
      "rule \"a\" argument \"v\" has no constraint (equals/contains/one_of/regex); an empty predicate matches any value"
    )
    expect(rejectionCurrent("rules:\n  - { id: a, when: { arguments: { v: { regex: '(?=x)' } } }, then: { decision: allow } }\n"))
      .toMatch(/^rule "a" argument "v" invalid regex: /)
  })
})

describe("judge outcomes (C.8.6)", () => {
  const options = { instructions: "x", threshold: 0.6, fallback: "require_approval" } as const

  it("the top decision stands at or above the threshold, with two decimals", () => {
    expect(Policy.judgeDecide(options, { allow: 0.912, deny: 0.05, requireApproval: 0.038 })).toEqual({
      decision: "allow",
      reason: "judge: allow 0.91"
    })
    expect(Policy.judgeDecide(options, { allow: 0.1, deny: 0.6, requireApproval: 0.3 })).toEqual({
      decision: "deny",
      reason: "judge: deny 0.60"
    })
    expect(Policy.judgeDecide(options, { allow: 0, deny: 0, requireApproval: 1 })).toEqual({
      decision: "require_approval",
      reason: "judge: require_approval 1.00"
    })
  })

  it("below the threshold the fallback applies; ties go to the stricter decision", () => {
    expect(Policy.judgeDecide({ ...options, fallback: "deny" }, { allow: 0.55, deny: 0.25, requireApproval: 0.2 }))
      .toEqual({ decision: "deny", reason: "judge: allow 0.55 below threshold 0.60" })
    expect(Policy.judgeDecide({ ...options, threshold: 0.4 }, { allow: 0.4, deny: 0.4, requireApproval: 0.2 }))
      .toEqual({ decision: "deny", reason: "judge: deny 0.40" })
    expect(Policy.judgeDecide(options, { allow: 0.3, deny: 0.3, requireApproval: 0.3 })).toEqual({
      decision: "require_approval",
      reason: "judge: deny 0.30 below threshold 0.60"
    })
  })

  it("without a judge a judge rule denies: judge not configured", () => {
    expect(Policy.judgeNotConfigured).toEqual({ decision: "deny", reason: "judge not configured" })
  })
})
