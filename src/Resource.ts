/**
 * Resources and checkpoints (PROTOCOL-CURRENT C.6): external state an agent
 * changes — a working directory, a sandbox, a database — that the kernel
 * checkpoints alongside the execution, so that a fork (C.7) starts from the
 * state the resource had at the fork point.
 *
 * A resource is driven by a **driver**, an Effect service the application
 * provides as a `Layer` ({@link Driver}: create, open, checkpoint). An agent
 * declares its resources with {@link make} (`Agent.make({ resources: […] })`);
 * the dispatch runtime then, for every run (C.6.8):
 *
 * 1. registers each resource (`POST …/resources`) with its checkpoint policy;
 * 2. opens it from its binding, or creates it — restored from the fork's
 *    `checkpoint_ref` when the execution is a fork — and binds it
 *    (`…/binding`);
 * 3. captures a baseline when checkpointing is on and nothing covers the
 *    resource yet (`…/resources/checkpoints`);
 * 4. runs tool calls and local steps one at a time;
 * 5. captures the resources a step's `proceed` lists as due right after the
 *    step's body, and sends the captures (or the capture failures) with the
 *    step's outcome;
 * 6. when the handler returns normally, captures the resources with
 *    `onCompletion` that nothing covers.
 *
 * A step declares the resources its body may change with the `resources`
 * option of `Step.make`, `Step.run` and `Tool.make`; the handler reaches the
 * opened resource with `yield* resource.handle`.
 *
 * **Example** (A workspace directory, checkpointed after every step that writes it)
 *
 * ```ts
 * import { NodeFileSystem, NodePath } from "@effect/platform-node"
 * import { Effect, FileSystem, Layer, Path, Schema } from "effect"
 * import { Agent, LocalDirectory, Resource, Step } from "effect-rebuno"
 *
 * const workspace = Resource.make("workspace", {
 *   driver: LocalDirectory.LocalDirectory,
 *   checkpoints: { everySteps: 1 }
 * })
 *
 * const writeNote = (name: string, text: string) =>
 *   Step.run(`write ${name}`, Effect.gen(function*() {
 *     const { directory } = yield* workspace.handle
 *     const fs = yield* FileSystem.FileSystem
 *     const path = yield* Path.Path
 *     yield* fs.writeFileString(path.join(directory, name), text)
 *   }), { resources: [workspace] })
 *
 * const scribe = Agent.make({
 *   id: "scribe",
 *   resources: [workspace],
 *   handler: () => Effect.andThen(writeNote("a.txt", "alpha"), writeNote("b.txt", "beta"))
 * })
 *
 * const Drivers = LocalDirectory.layer({ root: "./workspaces", store: "./checkpoints" }).pipe(
 *   Layer.provideMerge(Layer.mergeAll(NodeFileSystem.layer, NodePath.layer))
 * )
 * ```
 *
 * @since 0.2.0
 */
import type { Context, Effect } from "effect"
import { Pipeable } from "effect"
import type { Execution } from "./Execution.js"
import * as internal from "./internal/run/resources.js"

export {
  /**
   * @since 0.2.0
   * @category errors
   */
  CheckpointUnavailable,
  /**
   * @since 0.2.0
   * @category errors
   */
  ResourceError
} from "./internal/run/resources.js"

/**
 * A resource driver: how the SDK creates, opens and checkpoints one kind of
 * external state (see the module documentation). Provide one as a service:
 *
 * ```ts
 * class Sandbox extends Context.Service<Sandbox, Resource.Driver<SandboxHandle>>()("app/Sandbox") {}
 * const SandboxLive = Layer.succeed(Sandbox, Sandbox.of({ driverId: "app.sandbox.v1", create, open, checkpoint }))
 * ```
 *
 * - `create` makes the resource for an execution, restored from
 *   `checkpointRef` when given (a fork's restoration), and answers its handle
 *   and a JSON binding; it fails with {@link CheckpointUnavailable} when that
 *   checkpoint is gone.
 * - `open` reopens what a binding names (a later run of the same execution).
 * - `checkpoint` captures the current state and answers its reference.
 *
 * @since 0.2.0
 * @category models
 */
export type Driver<Handle> = internal.Driver<Handle>

/**
 * @since 0.2.0
 * @category models
 */
export type CreateRequest = internal.CreateRequest

/**
 * @since 0.2.0
 * @category models
 */
export type OpenRequest = internal.OpenRequest

/**
 * @since 0.2.0
 * @category models
 */
export type Created<Handle> = internal.Created<Handle>

/**
 * When a resource is captured: after every `everySteps` steps that declare it
 * and, with `onCompletion`, when the handler returns normally.
 *
 * @since 0.2.0
 * @category models
 */
export type CheckpointPolicy = internal.CheckpointPolicy

/**
 * @since 0.2.0
 * @category type ids
 */
export const TypeId: "~effect-rebuno/Resource" = "~effect-rebuno/Resource"

/**
 * A declared resource: its key, the driver service that drives it, its
 * checkpoint policy, and `handle`, the opened resource of the running
 * execution.
 *
 * @since 0.2.0
 * @category models
 */
export interface Resource<Handle, Id = never> extends Pipeable.Pipeable {
  readonly [TypeId]: typeof TypeId
  /** The resource key, `^[A-Za-z0-9_.-]{1,128}$`. */
  readonly key: string
  readonly driver: Context.Key<Id, Driver<Handle>>
  /** `undefined`: never checkpointed. */
  readonly checkpoints: CheckpointPolicy | undefined
  /**
   * The resource as opened for the running execution. Fails with
   * {@link CheckpointUnavailable} when a fork's checkpoint is gone, with a
   * {@link ResourceError} when the driver could not create or open it, or
   * when the running agent does not declare this resource.
   */
  readonly handle: Effect.Effect<Handle, internal.CheckpointUnavailable | internal.ResourceError, Execution>
}

/**
 * Any declared resource.
 *
 * @since 0.2.0
 * @category models
 */
export type Any = Resource<any, any>

/**
 * The driver services a list of resources needs.
 *
 * @since 0.2.0
 * @category models
 */
export type Services<Resources extends ReadonlyArray<Any>> = Resources[number] extends infer R ?
  R extends Resource<any, infer Id> ? Id : never :
  never

/**
 * The options of {@link make}. Without `checkpoints` the resource is
 * registered, opened and bound but never captured (`every_steps` 0). With
 * them, `everySteps` defaults to 1 (a capture after every declaring step)
 * and `onCompletion` to `true`.
 *
 * @since 0.2.0
 * @category models
 */
export interface Options<Handle, Id> {
  readonly driver: Context.Key<Id, Driver<Handle>>
  readonly checkpoints?: {
    readonly everySteps?: number | undefined
    readonly onCompletion?: boolean | undefined
  } | undefined
}

const ResourceProto = {
  [TypeId]: TypeId,
  pipe() {
    return Pipeable.pipeArguments(this, arguments)
  }
}

/**
 * Declare a resource: its key (unique per execution), its driver service and
 * its checkpoint policy. Declare it on the agent (`resources`) and on the
 * steps whose bodies change it; read it with `yield* resource.handle`.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Agent, LocalDirectory, Resource } from "effect-rebuno"
 *
 * const workspace = Resource.make("workspace", {
 *   driver: LocalDirectory.LocalDirectory,
 *   checkpoints: { everySteps: 2, onCompletion: true }
 * })
 *
 * const scribe = Agent.make({
 *   id: "scribe",
 *   resources: [workspace],
 *   handler: () => Effect.map(workspace.handle, ({ directory }) => ({ directory }))
 * })
 * ```
 *
 * @since 0.2.0
 * @category constructors
 */
export const make = <Handle, Id>(key: string, options: Options<Handle, Id>): Resource<Handle, Id> => {
  internal.enable()
  const self = Object.create(ResourceProto)
  self.key = key
  self.driver = options.driver
  self.checkpoints = options.checkpoints === undefined ? undefined : {
    everySteps: options.checkpoints.everySteps ?? 1,
    onCompletion: options.checkpoints.onCompletion ?? true
  }
  self.handle = internal.handleOf(key)
  return self
}

/**
 * Is this a declared resource?
 *
 * @since 0.2.0
 * @category guards
 */
export const isResource = (u: unknown): u is Any => typeof u === "object" && u !== null && TypeId in u
