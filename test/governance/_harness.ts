/**
 * Shared helpers of the governance tests: policy text, event helpers, a probe
 * agent that reports each step's decision, and an "observed" agent runtime —
 * the agent served by our own dispatcher over the test kit's core, through a
 * `KernelClient` that records every call and its answer, so a test can assert
 * what the SDK posted (or did not post) and drive the run step by step.
 */
import { Effect, Redacted, Schema } from "effect"
import { Agent, KernelClient, Step } from "effect-rebuno"
import type { Protocol } from "effect-rebuno"
import { Dispatcher } from "effect-rebuno/kernel"
import { TestKernel } from "effect-rebuno/testing"

/** YAML lines → bundle text. */
export const yaml = (...lines: ReadonlyArray<string>): string => lines.join("\n") + "\n"

/** Event types, in order. */
export const types = (events: ReadonlyArray<Protocol.Event>): ReadonlyArray<string> => events.map((e) => e.type)

/** Event types from the first `step.*` event on (drops creation and the first delivery). */
export const fromFirstStep = (events: ReadonlyArray<Protocol.Event>): ReadonlyArray<string> => {
  const all = types(events)
  const at = all.findIndex((t) => t.startsWith("step."))
  return at === -1 ? [] : all.slice(at)
}

/** The payload of the events of a type. */
export const payloads = (events: ReadonlyArray<Protocol.Event>, type: string): ReadonlyArray<any> =>
  events.filter((e) => e.type === type).map((e) => e.payload)

/** `target:rule_id` of every policy decision event (`step.allowed` / `step.denied` with a rule id), in order. */
export const ruleIds = (events: ReadonlyArray<Protocol.Event>): ReadonlyArray<string> =>
  events
    .filter((e) => e.type === "step.allowed" || e.type === "step.denied" || e.type === "step.awaiting_approval")
    .map((e) => e.payload as { readonly target?: string; readonly rule_id?: string })
    .filter((p) => p.rule_id !== undefined)
    .map((p) => `${p.target}:${p.rule_id}`)

const ProbeCall = Schema.Struct({
  kind: Schema.optional(Schema.String),
  target: Schema.String,
  args: Schema.optional(Schema.Unknown)
})

/** A probe's input: the steps to try, in order. */
export interface ProbeCall extends Schema.Schema.Type<typeof ProbeCall> {}

/**
 * An agent that submits each requested step (`tool_call` unless told) and
 * returns what happened to it: `allow`, `deny: <reason>` or
 * `rate_limited: <reason>`.
 */
export const makeProbe = (id: string) =>
  Agent.make({
    id,
    input: Schema.Struct({ calls: Schema.Array(ProbeCall) }),
    handler: ({ calls }) =>
      Effect.forEach(calls, (call) =>
        Step.make({
          kind: call.kind ?? "tool_call",
          target: call.target,
          args: call.args ?? {},
          body: () => Effect.succeed(null)
        }).pipe(
          Effect.as("allow"),
          Effect.catchTags({
            PolicyError: (e) => Effect.succeed(`deny: ${e.reason}`),
            RateLimited: (e) => Effect.succeed(`rate_limited: ${e.reason}`)
          })
        ))
  })

/** One call of the agent to the kernel, as the observed runtime saw it. */
export interface Call {
  readonly call: string
  readonly target?: string | undefined
  /** The decision, or the error's tag, or `ok`. */
  readonly outcome: string
  /** The `fail` reason, for `failExecution`. */
  readonly detail?: string | undefined
}

const outcomeOf = (call: string, log: Array<Call>, target?: string, detail?: string) =>
<A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  effect.pipe(
    Effect.tap((a) =>
      Effect.sync(() => {
        const decision = typeof a === "object" && a !== null && "decision" in a ? String(a.decision) : "ok"
        log.push({ call, target, outcome: decision, detail })
      })
    ),
    Effect.tapError((e) =>
      Effect.sync(() => {
        const tag = typeof e === "object" && e !== null && "_tag" in e ? String(e._tag) : String(e)
        log.push({ call, target, outcome: tag, detail })
      })
    )
  )

/** A `KernelClient` that records every call (except reads and heartbeats) and its answer. */
export const recording = (inner: KernelClient.KernelClient.Service, log: Array<Call>): KernelClient.KernelClient.Service => ({
  ...inner,
  submitStep: (caller, executionId, s) =>
    inner.submitStep(caller, executionId, s).pipe(outcomeOf("submitStep", log, s.target)),
  completeStep: (caller, executionId, stepId, json) =>
    inner.completeStep(caller, executionId, stepId, json).pipe(outcomeOf("completeStep", log)),
  failStep: (caller, executionId, stepId, message) =>
    inner.failStep(caller, executionId, stepId, message).pipe(outcomeOf("failStep", log)),
  failStepJson: (caller, executionId, stepId, json) =>
    inner.failStepJson(caller, executionId, stepId, json).pipe(outcomeOf("failStep", log)),
  completeExecution: (caller, executionId, json) =>
    inner.completeExecution(caller, executionId, json).pipe(outcomeOf("completeExecution", log, undefined, json)),
  failExecution: (caller, executionId, reason) =>
    inner.failExecution(caller, executionId, reason).pipe(outcomeOf("failExecution", log, undefined, reason))
})

/** Let forked fibers and pending promises (Web Crypto) make progress. */
export const settleMicrotasks = Effect.gen(function*() {
  for (let i = 0; i < 5; i++) yield* Effect.yieldNow
  yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
})

/** Poll `condition` (yielding to other fibers and promises, no clock moves) until it holds. */
export const until = <E>(what: string, condition: Effect.Effect<boolean, E>, rounds = 500): Effect.Effect<void> =>
  Effect.gen(function*() {
    for (let i = 0; i < rounds; i++) {
      if (yield* Effect.orDie(condition)) return
      yield* settleMicrotasks
    }
    return yield* Effect.die(new Error(`timed out waiting for ${what}`))
  })

/**
 * Serve `agent` in-process over the test kit's core, through a recording
 * `KernelClient` and our own dispatcher (never call the kit's `tick` / `settle`
 * for such an agent's executions: its dispatcher does not serve it).
 */
export const observe = <In, A, E, R>(agent: Agent.Agent<In, A, E, R>, options: { readonly policy?: string } = {}) =>
  Effect.gen(function*() {
    const kit = yield* TestKernel.TestKernel
    const inner = yield* KernelClient.KernelClient
    const log: Array<Call> = []
    yield* kit.core.registerAgent({
      id: agent.id,
      webhookUrl: `http://observed.invalid/${agent.id}`,
      secret: Redacted.value(inner.secret),
      ...(options.policy === undefined ? {} : { policyBundle: options.policy })
    })
    const runtime = yield* Agent.runtime(agent).pipe(
      Effect.provideService(KernelClient.KernelClient, recording(inner, log))
    )
    const encoder = new TextEncoder()
    const dispatcher = yield* Dispatcher.make(kit.core, {
      background: false,
      deliver: (_claim, body, signature) =>
        Effect.map(
          runtime.handleWebhook({ body: encoder.encode(body), signature }),
          (status) => status >= 200 && status < 300
        )
    })
    /** Deliver what is due; the runs continue in the background. */
    const tick = dispatcher.tick
    /** Wait until no run of this agent is in progress. */
    const idle = until("the runs to end", Effect.map(runtime.activeRuns, (n) => n === 0))
    /** The calls that post an execution outcome. */
    const posts = () => log.filter((c) => c.call === "completeExecution" || c.call === "failExecution")
    return { kit, log, runtime, tick, idle, posts }
  })
