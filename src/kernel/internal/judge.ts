/**
 * `judge` rules of the current stage (PROTOCOL-CURRENT C.8.6): an external
 * model scores the three decisions for a proposed step; the top one stands
 * when its probability reaches the rule's `threshold`, otherwise the rule's
 * `fallback` applies, and so it does when the judge cannot be asked. Without a
 * configured judge a `judge` rule denies with reason `judge not configured`.
 *
 * The kernel asks through the {@link Judge} interface; {@link openAiJudge} is
 * the one the embedded kernel offers: a chat completion on any
 * OpenAI-compatible endpoint (C.15 #9 leaves the provider open — only the
 * outcome and its reason texts are specified).
 *
 * @since 0.2.0
 * @internal
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import * as Schema from "effect/Schema"
import { compact } from "../../internal/wire/json.js"

/**
 * The three decisions a judge scores, and a judge rule's `fallback`.
 *
 * @since 0.2.0
 * @category models
 */
export type JudgedDecision = "allow" | "deny" | "require_approval"

/**
 * What a judge is asked about: the step as submitted and the rule's
 * instructions.
 *
 * @since 0.2.0
 * @category models
 */
export interface JudgeRequest {
  readonly executionId: string
  readonly agentId: string
  readonly kind: string
  readonly target: string
  /** The raw `args` JSON text as submitted (`undefined` when absent). */
  readonly argsRaw: string | undefined
  /** The rule's `judge.instructions`. */
  readonly instructions: string
  /** The judge rule's id. */
  readonly ruleId: string
}

/**
 * A judge's answer: a probability in `[0, 1]` for each decision.
 *
 * @since 0.2.0
 * @category models
 */
export interface JudgeScores {
  readonly allow: number
  readonly deny: number
  readonly requireApproval: number
}

/**
 * The judge could not be asked, or its answer could not be read. The
 * `message` becomes the `<error>` of `judge unavailable: <error>`.
 *
 * @since 0.2.0
 * @category errors
 */
export class JudgeError extends Schema.TaggedError<JudgeError>("effect-rebuno/kernel/JudgeError")("JudgeError", {
  message: Schema.String
}) {}

/**
 * A judge: scores a proposed step. Set it as the kernel's `judge` setting.
 *
 * @since 0.2.0
 * @category models
 */
export interface Judge {
  readonly ask: (request: JudgeRequest) => Effect.Effect<JudgeScores, JudgeError>
}

/**
 * A `judge` rule's options (C.8.6): `threshold` defaults to `0.6`, `fallback`
 * to `require_approval`.
 *
 * @since 0.2.0
 * @category models
 */
export interface JudgeOptions {
  readonly instructions: string
  readonly threshold: number
  readonly fallback: JudgedDecision
}

/**
 * What a judge rule decided and why.
 *
 * @since 0.2.0
 * @category models
 */
export interface JudgeOutcome {
  readonly decision: JudgedDecision
  readonly reason: string
}

/**
 * The outcome without a configured judge: deny, `judge not configured`.
 *
 * @since 0.2.0
 * @category constants
 */
export const notConfigured: JudgeOutcome = { decision: "deny", reason: "judge not configured" }

/** Probabilities are printed with two decimals (C.8.6). */
const twoDecimals = (p: number): string => p.toFixed(2)

/**
 * The outcome of a judge rule from the judge's scores (C.8.6). The top
 * decision is the highest score; ties go to the stricter decision (`deny`,
 * then `require_approval`, then `allow`). It stands when its score is ≥ the
 * threshold (`judge: <decision> <p>`), else the fallback applies
 * (`judge: <top> <p> below threshold <threshold>`).
 *
 * @since 0.2.0
 * @category outcomes
 */
export const decide = (options: JudgeOptions, scores: JudgeScores): JudgeOutcome => {
  let top: JudgedDecision = "deny"
  let p = scores.deny
  if (scores.requireApproval > p) {
    top = "require_approval"
    p = scores.requireApproval
  }
  if (scores.allow > p) {
    top = "allow"
    p = scores.allow
  }
  return p >= options.threshold
    ? { decision: top, reason: `judge: ${top} ${twoDecimals(p)}` }
    : {
      decision: options.fallback,
      reason: `judge: ${top} ${twoDecimals(p)} below threshold ${twoDecimals(options.threshold)}`
    }
}

/**
 * The outcome when the judge could not be asked: the fallback, with reason
 * `judge unavailable: <error>`.
 *
 * @since 0.2.0
 * @category outcomes
 */
export const unavailable = (options: JudgeOptions, error: string): JudgeOutcome => ({
  decision: options.fallback,
  reason: `judge unavailable: ${error}`
})

// ---------------------------------------------------------------------------
// An OpenAI-compatible judge
// ---------------------------------------------------------------------------

/**
 * Options of {@link openAiJudge}.
 *
 * @since 0.2.0
 * @category models
 */
export interface OpenAiJudgeOptions {
  /**
   * Base URL of an OpenAI-compatible API (`https://api.openai.com/v1`,
   * `http://localhost:11434/v1`, …); `/chat/completions` is appended unless
   * the URL already ends with it.
   */
  readonly url: string
  /** The model to ask. */
  readonly model: string
  /** Sent as `Authorization: Bearer <key>` when given. */
  readonly apiKey?: Redacted.Redacted<string> | undefined
  /** How long one judgement may take (default 10 s); the fallback applies after it. */
  readonly timeoutMs?: number | undefined
  /** The `fetch` to use (default: the global one). */
  readonly fetch?: typeof globalThis.fetch | undefined
}

const SYSTEM_PROMPT = "You are the policy judge of an AI agent runtime. An agent proposes a step " +
  "(a tool call, an LLM call or a local step). Following the policy instructions, estimate how " +
  "likely each decision is the right one: allow the step, deny it, or require a human approval. " +
  "Answer with one JSON object and nothing else: " +
  "{\"allow\": <probability>, \"deny\": <probability>, \"require_approval\": <probability>}, " +
  "probabilities between 0 and 1 that sum to 1."

const completionsUrl = (url: string): string => {
  const base = url.replace(/\/+$/, "")
  return base.endsWith("/chat/completions") ? base : base + "/chat/completions"
}

/**
 * The user message: the step as JSON, its arguments spliced in as recorded (compacted) rather than parsed and
 * serialised again, so arguments nested as deep as the kernel accepts (10,000 levels) reach the judge instead of
 * overflowing `JSON.stringify`'s recursion.
 */
const judgeContent = (request: JudgeRequest): string =>
  "{\"agent_id\":" + JSON.stringify(request.agentId) +
  ",\"kind\":" + JSON.stringify(request.kind) +
  ",\"target\":" + JSON.stringify(request.target) +
  ",\"args\":" + (request.argsRaw === undefined ? "null" : compact(request.argsRaw) ?? JSON.stringify(request.argsRaw)) +
  "}"

const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

const probability = (u: unknown): number | undefined =>
  typeof u === "number" && Number.isFinite(u) && u >= 0 && u <= 1 ? u : undefined

/**
 * Reads the scores out of a chat completion's text: a JSON object (possibly
 * inside a Markdown code fence) with at least one probability member.
 *
 * @since 0.2.0
 * @internal
 */
export const parseScores = (content: string): JudgeScores | undefined => {
  const fenced = /```(?:json)?\s*([\s\S]*?)```/.exec(content)
  const text = (fenced === null ? content : fenced[1]!).trim()
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    return undefined
  }
  if (!isRecord(value)) return undefined
  const allow = probability(value.allow)
  const deny = probability(value.deny)
  const requireApproval = probability(value.require_approval)
  if (allow === undefined && deny === undefined && requireApproval === undefined) return undefined
  return { allow: allow ?? 0, deny: deny ?? 0, requireApproval: requireApproval ?? 0 }
}

const errorText = (u: unknown): string => (u instanceof Error ? u.message : String(u))

/**
 * A judge that asks a chat model through an OpenAI-compatible
 * `POST …/chat/completions` (temperature 0, JSON answer): the rule's
 * instructions go into the system message, the step (`agent_id`, `kind`,
 * `target`, `args`) into the user message as JSON, and the answer's
 * `choices[0].message.content` must hold the three probabilities. A non-2xx
 * status, a transport error, a timeout or an unreadable answer fail with a
 * {@link JudgeError}, so the rule's fallback applies.
 *
 * @since 0.2.0
 * @category constructors
 */
export const openAiJudge = (options: OpenAiJudgeOptions): Judge => {
  const url = completionsUrl(options.url)
  const timeout = Duration.millis(options.timeoutMs ?? 10_000)
  const doFetch = options.fetch ?? globalThis.fetch
  const headers: Record<string, string> = { "content-type": "application/json" }
  if (options.apiKey !== undefined) headers.authorization = "Bearer " + Redacted.value(options.apiKey)
  return {
    ask: (request) =>
      Effect.tryPromise({
        try: async (signal) => {
          const response = await doFetch(url, {
            method: "POST",
            headers,
            signal,
            body: JSON.stringify({
              model: options.model,
              temperature: 0,
              response_format: { type: "json_object" },
              messages: [
                { role: "system", content: SYSTEM_PROMPT + "\n\nPolicy instructions:\n" + request.instructions },
                {
                  role: "user",
                  content: judgeContent(request)
                }
              ]
            })
          })
          const text = await response.text()
          if (!response.ok) throw new Error(`HTTP ${response.status}`)
          return text
        },
        catch: (error) => new JudgeError({ message: errorText(error) })
      }).pipe(
        Effect.flatMap((text) => {
          let body: unknown
          try {
            body = JSON.parse(text)
          } catch {
            return Effect.fail(new JudgeError({ message: "the answer is not JSON" }))
          }
          const choices = isRecord(body) ? body.choices : undefined
          const first = Array.isArray(choices) ? choices[0] : undefined
          const message = isRecord(first) ? first.message : undefined
          const content = isRecord(message) ? message.content : undefined
          const scores = typeof content === "string" ? parseScores(content) : undefined
          return scores === undefined
            ? Effect.fail(new JudgeError({ message: "the answer holds no decision probabilities" }))
            : Effect.succeed(scores)
        }),
        Effect.timeoutOrElse({
          duration: timeout,
          orElse: () => Effect.fail(new JudgeError({ message: `no answer within ${Duration.format(timeout)}` }))
        })
      )
  }
}
