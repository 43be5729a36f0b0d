/**
 * Settling on the test kit when a run waits on real I/O outside the kernel
 * (an MCP server over a pipe, a provider over a socket). The kit moves virtual
 * time once the agents' processes look idle, and it cannot see a pipe: a
 * settle may end while the run is still waiting for the server (status
 * `running`). These helpers settle again — with a short real pause so the
 * server can answer — until the execution is terminal or waits on people,
 * within a bounded number of rounds. Fault options arm only the first settle
 * (a planned crash fires once anyway).
 */
import { Effect } from "effect"
import type { Agent, Client } from "effect-rebuno"
import { Protocol } from "effect-rebuno"
import { TestKernel } from "effect-rebuno/testing"

const pause = Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, 5)))

const waitsOnPeople = (run: TestKernel.RunResult) => run.status === "blocked" && run.approvals.length > 0

/** Settle until terminal (or waiting on an approval), at most `rounds` times (default 2000, ~10 s of pauses). */
export const settleReal = (
  kernel: TestKernel.TestKernel.Service,
  executionId: string,
  options?: TestKernel.RunOptions,
  rounds = 2000
): Effect.Effect<TestKernel.RunResult, unknown> =>
  Effect.gen(function*() {
    let run = yield* kernel.settle(executionId, options)
    for (let i = 1; i < rounds && !Protocol.isTerminalStatus(run.status) && !waitsOnPeople(run); i++) {
      yield* pause
      run = yield* kernel.settle(executionId)
    }
    return run
  })

/** `kernel.run` for runs that wait on real I/O (see {@link settleReal}). */
export const runReal = (
  kernel: TestKernel.TestKernel.Service,
  agent: Agent.Agent<any, any, any, any>,
  input?: unknown,
  options?: TestKernel.RunOptions
): Effect.Effect<TestKernel.RunResult, unknown> =>
  Effect.flatMap(kernel.create(agent.id, input), (id) => settleReal(kernel, id, options))

/**
 * Registers `agent` on the kit in context (with its `policy`, if any) and
 * runs it with {@link runReal}.
 */
export const registerAndRunReal = <R>(
  agent: Agent.Agent<any, any, any, R>,
  input?: unknown,
  options?: TestKernel.RunOptions & { readonly policy?: string | undefined }
): Effect.Effect<TestKernel.RunResult, unknown, TestKernel.TestKernel | Exclude<R, Client.Client>> =>
  Effect.gen(function*() {
    const { policy, ...runOptions } = options ?? {}
    const kernel = yield* TestKernel.TestKernel
    yield* kernel.register(agent, { policy })
    return yield* runReal(kernel, agent, input, runOptions)
  })
