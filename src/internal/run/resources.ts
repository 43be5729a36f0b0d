/**
 * The SDK flow of resources (PROTOCOL-CURRENT C.6.8) inside one run: the
 * resources an agent declares are registered when the run starts, opened
 * (`binding` present) or created (from a fork's `checkpoint_ref`, else fresh)
 * and bound, and captured as a baseline when checkpointing is on and nothing
 * covers them yet; a step whose `proceed` lists `due` resources captures them
 * after its body and sends the captures with its outcome; tool calls and
 * local steps run one at a time while any resource is registered; and a
 * handler that returns normally re-registers every resource and captures
 * those with `on_completion` that nothing covers.
 *
 * The run's opened resources live in a `Context.Reference` that the dispatch
 * runtime provides around the handler; the step path reads it only once a
 * process has declared a resource (`Resource.make` switches it on), so runs
 * without resources pay nothing.
 *
 * @since 0.2.0
 * @internal
 */
import { Cause, Context, Effect, Exit, Option, Ref, Schema, Semaphore } from "effect"
import type { Execution } from "../../Execution.js"
import type { CheckpointRecords, ResourceRegistration } from "../../KernelClient.js"
import type * as Protocol from "../../Protocol.js"
import { Abandoned, KernelError, LeaseSuperseded, Terminated } from "../../RebunoError.js"
import { isTransportFailure } from "../http/exchange.js"
import { stringifyStrict } from "../wire/json.js"
import { messageOf } from "./failureReason.js"
import type { RunState } from "./runtime.js"

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/**
 * A driver cannot restore a resource from the checkpoint a fork starts from:
 * the checkpoint is gone (PROTOCOL-CURRENT C.6.8 #7). `yield* resource.handle`
 * fails with it; unless the handler catches it, the execution fails with
 * `agent_error: CheckpointUnavailable: <message>` — also when it is met in a
 * step body (a tool's `execute`): the step is failed with it (as any body
 * failure is) and the error itself, not a `ToolError`, leaves the step.
 *
 * @since 0.2.0
 * @category errors
 */
export class CheckpointUnavailable extends Schema.TaggedError<CheckpointUnavailable>(
  "effect-rebuno/CheckpointUnavailable"
)("CheckpointUnavailable", {
  key: Schema.String,
  checkpointRef: Schema.String,
  description: Schema.String
}) {
  override get message(): string {
    const base = `checkpoint ${this.checkpointRef} of resource "${this.key}" is unavailable`
    return this.description === "" ? base : `${base}: ${this.description}`
  }
}

/** The message of a recorded `CheckpointUnavailable` (see {@link fromStepError}). */
const RECORDED = /^CheckpointUnavailable: checkpoint ([\s\S]*?) of resource "([\s\S]*?)" is unavailable(?:: ([\s\S]*))?$/

/**
 * The `CheckpointUnavailable` a failed step recorded
 * (`{"message":"CheckpointUnavailable: <message>","_tag":"CheckpointUnavailable"}`,
 * see `stepErrorRecord`), raised again on replay so that a handler that
 * caught it the first time catches it again; `undefined` for any other error.
 *
 * @since 0.2.0
 * @internal
 */
export const fromStepError = (recorded: unknown): CheckpointUnavailable | undefined => {
  if (typeof recorded !== "object" || recorded === null) return undefined
  const { _tag, message } = recorded as { readonly _tag?: unknown; readonly message?: unknown }
  if (_tag !== "CheckpointUnavailable" || typeof message !== "string") return undefined
  const parts = RECORDED.exec(message)
  if (parts === null) return undefined
  const error = new CheckpointUnavailable({ checkpointRef: parts[1]!, key: parts[2]!, description: parts[3] ?? "" })
  return `CheckpointUnavailable: ${error.message}` === message ? error : undefined
}

/**
 * A resource operation failed: a driver could not create, open or checkpoint
 * its resource, or the handler asked for a resource its agent does not
 * declare (`operation` says which). A failed checkpoint is recorded as a
 * capture failure, never fails the step.
 *
 * @since 0.2.0
 * @category errors
 */
export class ResourceError extends Schema.TaggedError<ResourceError>("effect-rebuno/ResourceError")("ResourceError", {
  key: Schema.String,
  operation: Schema.Literals(["create", "open", "bind", "checkpoint", "handle"]),
  description: Schema.String,
  cause: Schema.optional(Schema.Defect())
}) {
  override get message(): string {
    return `${this.operation} ${this.key}: ${this.description}`
  }
}

// ---------------------------------------------------------------------------
// Drivers and declarations
// ---------------------------------------------------------------------------

/**
 * What a driver is asked to create: the resource of `key` for the execution
 * `executionId`, from the checkpoint `checkpointRef` (a fork's restoration)
 * or fresh (`undefined`).
 *
 * @since 0.2.0
 * @category models
 */
export interface CreateRequest {
  readonly key: string
  readonly executionId: string
  readonly checkpointRef: string | undefined
}

/**
 * What a driver is asked to open: the resource of `key`, already created and
 * bound for `executionId` (a redelivery after a crash or a suspension).
 *
 * @since 0.2.0
 * @category models
 */
export interface OpenRequest {
  readonly key: string
  readonly executionId: string
}

/**
 * A created resource: its handle, and the JSON binding that lets a later run
 * of the same execution open it again.
 *
 * @since 0.2.0
 * @category models
 */
export interface Created<Handle> {
  readonly handle: Handle
  readonly binding: unknown
}

/**
 * A resource driver (PROTOCOL-CURRENT C.6): how the SDK creates, opens and
 * checkpoints one kind of external state. `driverId`, `configuration` (JSON)
 * and `coverageReuse` are the resource's identity on the kernel, fixed once
 * registered.
 *
 * @since 0.2.0
 * @category models
 */
export interface Driver<Handle> {
  readonly driverId: string
  readonly configuration?: unknown
  /** Skip the generation bump of steps that do not declare the resource (C.6.4). */
  readonly coverageReuse?: boolean | undefined
  /** Create the resource, restored from `checkpointRef` when given; `CheckpointUnavailable` when that is gone. */
  readonly create: (request: CreateRequest) => Effect.Effect<Created<Handle>, CheckpointUnavailable | ResourceError>
  /** Open the resource a binding names. */
  readonly open: (binding: unknown, request: OpenRequest) => Effect.Effect<Handle, CheckpointUnavailable | ResourceError>
  /** Capture the resource's current state; the answer is its `checkpoint_ref`. */
  readonly checkpoint: (handle: Handle) => Effect.Effect<string, ResourceError>
}

/**
 * When a resource is captured (PROTOCOL-CURRENT C.6.2): after every
 * `everySteps` steps that declare it, and when the handler returns normally
 * (`onCompletion`).
 *
 * @since 0.2.0
 * @category models
 */
export interface CheckpointPolicy {
  readonly everySteps: number
  readonly onCompletion: boolean
}

/**
 * A declared resource as the run sees it.
 *
 * @since 0.2.0
 * @internal
 */
export interface Declared {
  readonly key: string
  readonly driver: Context.Key<any, Driver<any>>
  readonly checkpoints: CheckpointPolicy | undefined
}

/**
 * Resource bookkeeping in the step path is switched on once a process
 * declares a resource (normally at module load).
 */
let declared = false

/**
 * Switch the step path's resource bookkeeping on (process-wide, for good).
 *
 * @since 0.2.0
 * @internal
 */
export const enable = (): void => {
  declared = true
}

/**
 * Whether any resource was declared in this process.
 *
 * @since 0.2.0
 * @internal
 */
export const isEnabled = (): boolean => declared

// ---------------------------------------------------------------------------
// The run's resources
// ---------------------------------------------------------------------------

/**
 * One resource of a run: its declaration, driver and registration, and the
 * outcome of opening it (the handle, or why there is none).
 *
 * @since 0.2.0
 * @internal
 */
export interface Opened {
  readonly declared: Declared
  readonly driver: Driver<unknown>
  readonly registration: ResourceRegistration
  readonly handle: Exit.Exit<unknown, CheckpointUnavailable | ResourceError>
}

/**
 * The resources of one run.
 *
 * @since 0.2.0
 * @internal
 */
export interface RunResources {
  readonly byKey: ReadonlyMap<string, Opened>
  /** Tool calls and local steps run one at a time while any resource is registered (C.6.8 #4). */
  readonly exclusive: Semaphore.Semaphore
}

/**
 * The resources of the running handler (`undefined` outside a run with resources).
 *
 * @since 0.2.0
 * @internal
 */
export const CurrentResources = Context.Reference<RunResources | undefined>("effect-rebuno/Resource/CurrentResources", {
  defaultValue: () => undefined
})

/** Whether the fiber runs inside a step that holds the run's exclusive permit (its nested steps do not wait). */
const HoldsExclusive = Context.Reference<boolean>("effect-rebuno/Resource/HoldsExclusive", {
  defaultValue: () => false
})

/**
 * Run a tool call or local step exclusively while the run has resources
 * (PROTOCOL-CURRENT C.6.8 #4): a step started by the body of a step that
 * holds the permit runs at once.
 *
 * @since 0.2.0
 * @internal
 */
export const exclusive = <A, E, R>(step: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.withFiber((fiber) => {
    const resources = fiber.getRef(CurrentResources)
    if (resources === undefined || resources.byKey.size === 0 || fiber.getRef(HoldsExclusive)) return step
    return resources.exclusive.withPermits(1)(Effect.provideService(step, HoldsExclusive, true))
  })

/**
 * The handle of a declared resource in the running handler.
 *
 * @since 0.2.0
 * @internal
 */
export const handleOf = (key: string): Effect.Effect<unknown, CheckpointUnavailable | ResourceError> =>
  Effect.withFiber((fiber) => {
    const opened = fiber.getRef(CurrentResources)?.byKey.get(key)
    return opened === undefined
      ? Effect.fail(
        new ResourceError({ key, operation: "handle", description: "the running agent does not declare this resource" })
      )
      : opened.handle
  })

/** The text of a capture failure (C.6.8 #5): the error's message, else its name. */
const failureText = (cause: Cause.Cause<unknown>): string => {
  const failure = Cause.findErrorOption(cause)
  const error: unknown = Option.isSome(failure) ? failure.value : Cause.squash(cause)
  const message = messageOf(error)
  if (message !== "") return message
  if (typeof error === "object" && error !== null) {
    const tag = (error as { readonly _tag?: unknown })._tag
    if (typeof tag === "string" && tag !== "") return tag
  }
  return error instanceof Error && error.name !== "" ? error.name : "Error"
}

/**
 * Capture each due resource (C.6.8 #5): a capture per checkpoint taken, a
 * capture failure (with the error's text) per driver failure or resource
 * this run did not open. Never fails; interruption stops it.
 *
 * @since 0.2.0
 * @internal
 */
export const capture = (
  byKey: ReadonlyMap<string, Opened> | undefined,
  due: ReadonlyArray<Protocol.StepResource>
): Effect.Effect<CheckpointRecords> =>
  Effect.suspend(() => {
    const captures: Array<Protocol.Capture> = []
    const captureFailures: Array<Protocol.CaptureFailure> = []
    return Effect.forEach(due, (r) => {
        const opened = byKey?.get(r.key)
        if (opened === undefined) {
          captureFailures.push({ key: r.key, generation: r.generation, error: "the resource is not open in this run" })
          return Effect.void
        }
        const handle = opened.handle
        if (Exit.isFailure(handle)) {
          captureFailures.push({ key: r.key, generation: r.generation, error: failureText(handle.cause) })
          return Effect.void
        }
        return Effect.matchCauseEffect(Effect.suspend(() => opened.driver.checkpoint(handle.value)), {
          onFailure: (cause) => {
            if (Cause.hasInterruptsOnly(cause)) return Effect.failCause(cause as Cause.Cause<never>)
            const error = failureText(cause)
            captureFailures.push({ key: r.key, generation: r.generation, error })
            return Effect.logWarning(`checkpoint of resource "${r.key}" failed: ${error}`)
          },
          onSuccess: (checkpointRef) =>
            Effect.sync(() => {
              captures.push({ key: r.key, generation: r.generation, checkpointRef })
            })
        })
      }, { discard: true }).pipe(
        Effect.map((): CheckpointRecords => captureFailures.length === 0 ? { captures } : { captures, captureFailures })
      )
  })

/** The error of a run's setup call: a transport failure left after the retries abandons the run. */
type SetupError = KernelError | LeaseSuperseded | Terminated | Abandoned | ResourceError

const missing = (what: string) =>
  Effect.die(new Error(`the KernelClient in use cannot run resources (it has no \`${what}\` call)`))

/**
 * A kernel call of the setup or completion: transport failures left after the
 * client's retries abandon the run (the kernel redelivers); the signals are
 * recorded on the run by its client.
 */
const kernelCall = <A>(
  state: RunState,
  call: Effect.Effect<A, KernelError | LeaseSuperseded | Terminated>,
  what: string
): Effect.Effect<A, SetupError> =>
  Effect.catchIf(call, isTransportFailure, (e) => {
    const abandoned = new Abandoned({ reason: `${what} failed: ${(e as KernelError).message}` })
    return Effect.andThen(state.raise(abandoned), Effect.fail(abandoned))
  })

/** The registration of a declaration (C.6.8 #1): `every_steps` 0 and `on_completion` false without a policy. */
const registrationOf = (
  declared: Declared,
  driver: Driver<unknown>
): ResourceRegistration | ResourceError => {
  let configurationJson: string | undefined
  if (driver.configuration !== undefined) {
    const json = stringifyStrict(driver.configuration)
    if (json._tag === "Invalid") {
      return new ResourceError({
        key: declared.key,
        operation: "create",
        description: `the driver's configuration is not JSON at ${json.path}: ${json.reason}`
      })
    }
    configurationJson = json.json
  }
  return {
    key: declared.key,
    driverId: driver.driverId,
    configurationJson,
    coverageReuse: driver.coverageReuse === true,
    everySteps: declared.checkpoints?.everySteps ?? 0,
    onCompletion: declared.checkpoints?.onCompletion ?? false
  }
}

/**
 * Register, open or create (and bind), and capture a baseline of each
 * declared resource, in order (C.6.8 #1–3). Driver failures to create or open
 * are kept as the handle's failure (the handler meets them at
 * `resource.handle`); kernel errors fail the setup.
 *
 * @since 0.2.0
 * @internal
 */
export const open = (
  state: RunState,
  declarations: ReadonlyArray<Declared>
): Effect.Effect<RunResources, SetupError, any> =>
  Effect.gen(function*() {
    const client = state.client
    const register = client.registerResource
    const bind = client.bindResource
    const publish = client.publishCheckpoints
    if (register === undefined) return yield* missing("registerResource")
    if (bind === undefined) return yield* missing("bindResource")
    if (publish === undefined) return yield* missing("publishCheckpoints")
    const byKey = new Map<string, Opened>()
    for (const declaration of declarations) {
      const driver = (yield* declaration.driver) as Driver<unknown>
      const registration = registrationOf(declaration, driver)
      if (registration instanceof ResourceError) return yield* Effect.fail(registration)
      const view = yield* kernelCall(
        state,
        register(state.caller, state.executionId, registration),
        `registering resource "${declaration.key}"`
      )
      const request = { key: declaration.key, executionId: state.executionId }
      let handle: Exit.Exit<unknown, CheckpointUnavailable | ResourceError>
      if (view.binding !== undefined && view.binding !== null) {
        handle = yield* Effect.exit(Effect.suspend(() => driver.open(view.binding, request)))
      } else {
        const created = yield* Effect.exit(
          Effect.suspend(() => driver.create({ ...request, checkpointRef: view.checkpointRef }))
        )
        if (Exit.isSuccess(created)) {
          const binding = stringifyStrict(created.value.binding ?? null)
          if (binding._tag === "Invalid") {
            handle = Exit.fail(
              new ResourceError({
                key: declaration.key,
                operation: "bind",
                description: `the driver's binding is not JSON at ${binding.path}: ${binding.reason}`
              })
            )
          } else {
            yield* kernelCall(
              state,
              bind(state.caller, state.executionId, declaration.key, binding.json),
              `binding resource "${declaration.key}"`
            )
            handle = Exit.succeed(created.value.handle)
          }
        } else {
          handle = created
        }
      }
      // Interruptions and driver defects end the setup; the driver's typed failures wait at `resource.handle`.
      if (Exit.isFailure(handle) && Option.isNone(Cause.findErrorOption(handle.cause))) {
        return yield* Effect.failCause(handle.cause as Cause.Cause<never>)
      }
      const opened: Opened = { declared: declaration, driver, registration, handle }
      byKey.set(declaration.key, opened)
      if (view.everySteps > 0 && !view.covered && Exit.isSuccess(handle)) {
        const records = yield* capture(byKey, [
          { key: declaration.key, generation: view.generation, due: true }
        ])
        yield* kernelCall(
          state,
          publish(state.caller, state.executionId, records),
          `posting the baseline checkpoint of resource "${declaration.key}"`
        )
      }
    }
    return { byKey, exclusive: yield* Semaphore.make(1) }
  })

/**
 * After a handler that returned normally (C.6.8 #6): re-register each
 * resource (which reads its view) and capture those with `on_completion`
 * that nothing covers. Signals fail; any other error is logged and the
 * execution completes anyway.
 *
 * @since 0.2.0
 * @internal
 */
export const complete = (
  state: RunState,
  resources: RunResources
): Effect.Effect<void, LeaseSuperseded | Terminated | Abandoned> =>
  Effect.gen(function*() {
    const register = state.client.registerResource
    const publish = state.client.publishCheckpoints
    if (register === undefined || publish === undefined) return
    const due: Array<Protocol.StepResource> = []
    for (const opened of resources.byKey.values()) {
      const view = yield* kernelCall(
        state,
        register(state.caller, state.executionId, opened.registration),
        `registering resource "${opened.declared.key}"`
      )
      if (view.onCompletion && !view.covered) due.push({ key: view.key, generation: view.generation, due: true })
    }
    if (due.length === 0) return
    const records = yield* capture(resources.byKey, due)
    yield* kernelCall(state, publish(state.caller, state.executionId, records), "posting the completion checkpoints")
  }).pipe(
    Effect.catch((error): Effect.Effect<void, LeaseSuperseded | Terminated | Abandoned> =>
      error instanceof LeaseSuperseded || error instanceof Terminated || error instanceof Abandoned
        ? Effect.fail(error)
        : Effect.logWarning("checkpoint on completion failed", error)
    )
  )

/**
 * Run `handler` with the declared resources open (C.6.8): set them up,
 * provide them, and after a normal return — unless the run recorded a signal
 * — take the completion checkpoints.
 *
 * @since 0.2.0
 * @internal
 */
export const around = <A, E, R>(
  state: RunState,
  declarations: ReadonlyArray<Declared>,
  handler: Effect.Effect<A, E, R | Execution>
): Effect.Effect<A, E | SetupError, R | Execution> =>
  Effect.flatMap(open(state, declarations), (resources) =>
    handler.pipe(
      Effect.provideService(CurrentResources, resources),
      Effect.tap(() =>
        Effect.flatMap(Ref.get(state.signal), (signal) => Option.isSome(signal) ? Effect.void : complete(state, resources))
      )
    ))
