/**
 * effect-rebuno: durable AI agents as Effect programs on the Rebuno kernel.
 *
 * Every tool call, LLM call and local non-determinism becomes a durable step
 * that the kernel records, replays after a crash or an approval, and governs by
 * policy. Modules are namespaces: `Agent`, `Step`, `Tool`, `Llm`, `Mcp`, `AiToolkit`, `Session`,
 * `Subagent`, `Resource`, `LocalDirectory`, `Client`, `KernelClient`, `Execution`, `Protocol`, `Signature`,
 * `StepId`; the error classes are exported by name.
 *
 * @since 0.1.0
 */

/**
 * @since 0.1.0
 */
export * as Agent from "./Agent.js"

/**
 * @since 0.2.0
 */
export * as AiToolkit from "./AiToolkit.js"

/**
 * @since 0.1.0
 */
export * as Client from "./Client.js"

/**
 * @since 0.1.0
 */
export * as Execution from "./Execution.js"

/**
 * @since 0.1.0
 */
export * as KernelClient from "./KernelClient.js"

/**
 * @since 0.2.0
 */
export * as LocalDirectory from "./LocalDirectory.js"

/**
 * @since 0.1.0
 */
export * as Llm from "./Llm.js"

/**
 * @since 0.2.0
 */
export * as Mcp from "./Mcp.js"

/**
 * @since 0.1.0
 */
export * as Protocol from "./Protocol.js"

/**
 * @since 0.1.0
 */
export * as RebunoError from "./RebunoError.js"

/**
 * @since 0.1.0
 */
export {
  Abandoned,
  Blocked,
  InvalidArguments,
  DecodeError,
  KernelError,
  LeaseSuperseded,
  PolicyError,
  RateLimited,
  SignatureError,
  StatusError,
  StepDecodeError,
  SubagentError,
  Terminated,
  ToolError,
  TransportError
} from "./RebunoError.js"

/**
 * @since 0.2.0
 */
export * as Resource from "./Resource.js"

/**
 * @since 0.2.0
 */
export { CheckpointUnavailable, ResourceError } from "./Resource.js"

/**
 * @since 0.2.0
 */
export * as Session from "./Session.js"

/**
 * @since 0.1.0
 */
export * as Signature from "./Signature.js"

/**
 * @since 0.1.0
 */
export * as Step from "./Step.js"

/**
 * @since 0.1.0
 */
export * as StepId from "./StepId.js"

/**
 * @since 0.2.0
 */
export * as Subagent from "./Subagent.js"

/**
 * @since 0.1.0
 */
export * as Tool from "./Tool.js"
