/**
 * Step calls to an in-process kernel as plain function calls. A kernel client
 * that lives in the agent's process (the test kit's direct client) can answer
 * a submit or complete at once; the step path then spends no Effect on the
 * call. Such a client registers its calls with {@link register}; every call
 * answers either a `Result` (the answer, given now) or an `Effect` to run
 * instead (the same call with something injected around it), and behaves
 * exactly like the client's own `submitStep` / `completeStep` at time `now`.
 *
 * The calls belong to that very client object: a client built from it (say,
 * `{ ...client, submitStep: logged }`) has none, so its own methods are used.
 *
 * @since 0.1.0
 * @internal
 */
import { Clock } from "effect"
import type { Effect, Fiber, Result } from "effect"
import type { Caller, KernelClient, StepSubmission } from "../../KernelClient.js"
import type * as Protocol from "../../Protocol.js"
import type { KernelError, LeaseSuperseded, PolicyError, Terminated } from "../../RebunoError.js"

/**
 * An answer given now (`Result`) or the Effect that gives it.
 *
 * @since 0.1.0
 * @internal
 */
export type Answer<E> =
  | Result.Result<Protocol.StepDecision, E>
  | Effect.Effect<Protocol.StepDecision, E>

/**
 * @since 0.1.0
 * @internal
 */
export interface InProcessSteps {
  readonly submitStep: (
    now: number,
    caller: Caller,
    executionId: string,
    submission: StepSubmission
  ) => Answer<KernelError | LeaseSuperseded | Terminated | PolicyError>
  readonly completeStep: (
    now: number,
    caller: Caller,
    executionId: string,
    stepId: string,
    resultJson: string
  ) => Answer<KernelError | LeaseSuperseded | Terminated>
}

const registered = new WeakMap<KernelClient.Service, InProcessSteps>()

/**
 * Give `kernel` (the client object itself) in-process step calls.
 *
 * @since 0.1.0
 * @internal
 */
export const register = <K extends KernelClient.Service>(kernel: K, steps: InProcessSteps): K => {
  registered.set(kernel, steps)
  return kernel
}

/**
 * The in-process step calls of `kernel`, when it has them.
 *
 * @since 0.1.0
 * @internal
 */
export const stepsOf = (kernel: KernelClient.Service): InProcessSteps | undefined => registered.get(kernel)

/**
 * The current time (epoch ms) on the fiber's `Clock`, as `Clock.currentTimeMillis`
 * would read it.
 *
 * @since 0.1.0
 * @internal
 */
export const nowOf = (fiber: Fiber.Fiber<unknown, unknown>): number =>
  fiber.getRef(Clock.Clock).currentTimeMillisUnsafe()
