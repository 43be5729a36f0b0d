/**
 * The clients of the test kit, wired to the embedded kernel's core without a
 * socket: the agents' `KernelClient` (the direct client, or the real HTTP
 * client over the kernel's routes in-process), the backend's `Client`, and an
 * `HttpClient` that answers from the routes. Every agent call passes through
 * the kit's interceptor.
 *
 * @since 0.2.0
 * @internal
 */
import { Effect, Redacted } from "effect"
import { HttpClient } from "effect/http"
import * as Client from "../../Client.js"
import type * as Core from "../../kernel/Core.js"
import * as Routes from "../../kernel/Routes.js"
import * as KernelClient from "../../KernelClient.js"
import type { Activity } from "./activity.js"
import * as DirectClient from "./directClient.js"
import * as InMemoryHttp from "./inMemoryHttp.js"

/**
 * The base URL the in-process clients use; never dialled.
 *
 * @since 0.2.0
 * @internal
 */
export const inProcessUrl = "http://test-kernel.invalid"

/**
 * The clients of a kit.
 *
 * @since 0.2.0
 * @internal
 */
export interface Clients {
  readonly kernelClient: KernelClient.KernelClient.Service
  readonly client: Client.Client.Service
  /** An `HttpClient` that answers from the kernel's routes in-process. */
  readonly httpClient: HttpClient.HttpClient
  /** A further `Client` over the same routes, sending `apiKey` as its bearer token (none: no header). */
  readonly clientWith: (apiKey: Redacted.Redacted<string> | string | undefined) => Effect.Effect<Client.Client.Service>
}

/** Count every call of `service` as in flight while it runs. */
const countedClient = (
  service: KernelClient.KernelClient.Service,
  activity: Activity
): KernelClient.KernelClient.Service => {
  const counted = activity.countInFlight
  return {
    secret: service.secret,
    getExecution: (caller, executionId) => counted(service.getExecution(caller, executionId)),
    submitStep: (caller, executionId, s) => counted(service.submitStep(caller, executionId, s)),
    completeStep: (caller, executionId, stepId, result, records) =>
      counted(service.completeStep(caller, executionId, stepId, result, records)),
    failStep: (caller, executionId, stepId, message) => counted(service.failStep(caller, executionId, stepId, message)),
    failStepJson: (caller, executionId, stepId, error, records) =>
      counted(service.failStepJson(caller, executionId, stepId, error, records)),
    publishDelta: service.publishDelta,
    heartbeat: (caller, executionId) => counted(service.heartbeat(caller, executionId)),
    completeExecution: (caller, executionId, output, state) =>
      counted(service.completeExecution(caller, executionId, output, state)),
    failExecution: (caller, executionId, reason) => counted(service.failExecution(caller, executionId, reason)),
    signingScheme: service.signingScheme,
    observeWebhook: service.observeWebhook,
    previous: service.previous === undefined
      ? undefined
      : (caller, executionId) => counted(service.previous!(caller, executionId)),
    getStep: service.getStep === undefined
      ? undefined
      : (caller, executionId, stepId) => counted(service.getStep!(caller, executionId, stepId)),
    suspend: service.suspend === undefined
      ? undefined
      : (caller, executionId) => counted(service.suspend!(caller, executionId)),
    publishMetadata: service.publishMetadata === undefined
      ? undefined
      : (agentId, metadata) => counted(service.publishMetadata!(agentId, metadata)),
    // PROTOCOL-CURRENT C.6.2, C.6.3, C.6.6.
    registerResource: service.registerResource === undefined
      ? undefined
      : (caller, executionId, registration) => counted(service.registerResource!(caller, executionId, registration)),
    bindResource: service.bindResource === undefined
      ? undefined
      : (caller, executionId, key, binding) => counted(service.bindResource!(caller, executionId, key, binding)),
    publishCheckpoints: service.publishCheckpoints === undefined
      ? undefined
      : (caller, executionId, records) => counted(service.publishCheckpoints!(caller, executionId, records))
  }
}

/**
 * Make the clients of a kit over `core`.
 *
 * - `"direct"` calls the core without serialising; `"http"` sends the exact
 *   signed bytes through the kernel's routes in-process.
 *
 * @since 0.2.0
 * @internal
 */
export const make = (options: {
  readonly core: Core.KernelCore
  readonly secret: string
  readonly transport: "direct" | "http"
  readonly interceptor: DirectClient.Interceptor
  readonly activity: Activity
  /** The kernel's bootstrap token (PROTOCOL-CURRENT C.9.1 step 3); the kit's `Client` sends it. */
  readonly apiToken?: Redacted.Redacted<string> | undefined
}): Effect.Effect<Clients> =>
  Effect.gen(function*() {
    const { core, interceptor, secret } = options
    // Built on first request: a kit on the direct transport often sends none.
    let handle: ((request: Routes.KernelRequest) => Effect.Effect<Routes.KernelResponse>) | undefined
    const routes = (request: Routes.KernelRequest): Effect.Effect<Routes.KernelResponse> =>
      (handle ??= Routes.make(core, options.apiToken === undefined ? {} : { apiToken: options.apiToken }))(request)
    const httpClient = InMemoryHttp.make(routes)
    // The direct client counts the calls that can suspend itself; over HTTP every call is counted.
    const kernelClient = options.transport === "http"
      ? countedClient(
        // The agents speak the kernel's stage: `v1=` signatures in the current stage, `sha256=` before it.
        yield* KernelClient.make({ baseUrl: inProcessUrl, secret, stage: core.settings.stage }).pipe(
          Effect.provideService(HttpClient.HttpClient, InMemoryHttp.make(routes, interceptor)),
          Effect.orDie
        ),
        options.activity
      )
      : DirectClient.make(core, secret, interceptor)
    const clientWith = (apiKey: Redacted.Redacted<string> | string | undefined) =>
      Client.make(apiKey === undefined ? { baseUrl: inProcessUrl } : { baseUrl: inProcessUrl, apiKey }).pipe(
        Effect.provideService(HttpClient.HttpClient, httpClient),
        Effect.orDie
      )
    const client = yield* clientWith(options.apiToken)
    return { kernelClient, client, httpClient, clientWith }
  })
