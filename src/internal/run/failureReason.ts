/**
 * Pure helpers for classifying errors at the edge of a run: the exact
 * `failureReason` strings of PROTOCOL.md 14.5, the message text recorded for a
 * failed step, and the refusal decoder of 14.7 (`rebuno_refusal: …` markers
 * carried by provider errors).
 *
 * @since 0.1.0
 * @internal
 */
import { PolicyError, RateLimited, SubagentError, ToolError } from "../../RebunoError.js"
import * as llmRefusal from "./llmRefusal.js"

const TOKEN = /^[a-z0-9_]+$/

/**
 * A readable message for any thrown or failed value: an `Error`'s message, a
 * string as is, an object's `message` member, otherwise its JSON text.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const messageOf = (u: unknown): string => {
  if (u instanceof Error) return u.message
  if (typeof u === "string") return u
  if (typeof u === "object" && u !== null) {
    const message = (u as { readonly message?: unknown }).message
    if (typeof message === "string") return message
  }
  return safeJson(u)
}

/**
 * The error class name used in `agent_error: <Name>: <message>`: the `_tag` of
 * a tagged error, an `Error`'s `name`, otherwise `"Error"`.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const nameOf = (u: unknown): string => {
  if (typeof u === "object" && u !== null) {
    const tag = (u as { readonly _tag?: unknown })._tag
    if (typeof tag === "string" && tag !== "") return tag
  }
  if (u instanceof Error && u.name !== "") return u.name
  return "Error"
}

/**
 * The error object recorded for a step body's failure that is not a declared
 * typed failure (PROTOCOL.md 14.4: `{"message": …}`). A tagged error keeps its
 * tag: `{"message":"<Tag>: <detail>","_tag":"<Tag>"}`, where the detail is its
 * message, or — for a tagged error without one, such as a
 * `Schema.TaggedError` with only data fields — the JSON of its other fields.
 * The tag leads the message so that a replay (which raises
 * `<target>: <message>`, in any SDK) says the same as the first run.
 *
 * @since 0.2.0
 * @category internal
 * @internal
 */
export const stepErrorRecord = (u: unknown): { readonly message: string; readonly _tag?: string } => {
  const tag = tagOf(u)
  if (tag === undefined) return { message: messageOf(u) }
  const detail = detailOf(u as object)
  return { message: detail === "" || detail === tag ? tag : `${tag}: ${detail}`, _tag: tag }
}

/** The `_tag` of a tagged error (a non-empty string), else `undefined`. */
const tagOf = (u: unknown): string | undefined => {
  if (typeof u !== "object" || u === null) return undefined
  const tag = (u as { readonly _tag?: unknown })._tag
  return typeof tag === "string" && tag !== "" ? tag : undefined
}

/** A tagged error's message, else the JSON of its fields without `_tag` (`""` when it has none). */
const detailOf = (u: object): string => {
  const message = (u as { readonly message?: unknown }).message
  if (typeof message === "string" && message !== "") return message
  const fields: Record<string, unknown> = {}
  let any = false
  for (const [key, value] of Object.entries(u)) {
    if (key === "_tag" || key === "message" || key === "stack" || typeof value === "function") continue
    fields[key] = value
    any = true
  }
  return any ? safeJson(fields) : ""
}

const safeJson = (u: unknown): string => {
  try {
    const text = JSON.stringify(u)
    return text === undefined ? String(u) : text
  } catch {
    return String(u)
  }
}

/**
 * The exact string posted as `error` to `POST /v0/executions/{id}/fail`
 * (PROTOCOL.md 14.5, PROTOCOL-CURRENT C.12): a policy denial whose reason is
 * a token as is, else `policy_denied: <reason>`; a rate limit its reason; a
 * failed step `tool_error: <target>: <message>` (a subagent's failure is the
 * failure of its calling step: `tool_error: <target>: subagent_failed: <the
 * child's reason>`); anything else `agent_error: <Name>: <message>`.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const failureReason = (error: unknown): string => {
  if (error instanceof PolicyError) {
    return TOKEN.test(error.message) ? error.message : `policy_denied: ${error.message}`
  }
  if (error instanceof RateLimited) return error.reason
  if (error instanceof ToolError || error instanceof SubagentError) return `tool_error: ${error.message}`
  return `agent_error: ${nameOf(error)}: ${messageOf(error)}`
}

/**
 * The failure reason for an input that does not match the agent's input schema.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const inputInvalid = (messages: ReadonlyArray<string>): string => `input_invalid: ${messages.join("; ")}`

/**
 * The text of a recorded step error on replay (PROTOCOL.md 14.4):
 * `error.message ?? error.reason ?? JSON.stringify(error)`.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const describeRecordedError = (error: unknown): string => {
  if (typeof error === "object" && error !== null) {
    const o = error as { readonly message?: unknown; readonly reason?: unknown }
    if (o.message !== undefined && o.message !== null) return typeof o.message === "string" ? o.message : safeJson(o.message)
    if (o.reason !== undefined && o.reason !== null) return typeof o.reason === "string" ? o.reason : safeJson(o.reason)
  }
  return safeJson(error)
}

/**
 * What a refusal marker turns into.
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export type Refusal = llmRefusal.Refusal

/**
 * The refusal decoder of PROTOCOL.md 14.7 (shared with the LLM wrapper, which
 * also recognises the refusal responses it produced itself).
 *
 * @since 0.1.0
 * @category internal
 * @internal
 */
export const decodeRefusal: (error: unknown) => Refusal | undefined = llmRefusal.decodeRefusal
