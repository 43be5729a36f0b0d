/**
 * Token usage of `llm_call` steps in the current stage (PROTOCOL-CURRENT
 * C.8.5): read from the result an SDK records with `complete` — a provider's
 * JSON answer, or its SSE stream — so that `step.succeeded` can carry it and
 * token budgets can sum it.
 *
 * @since 0.2.0
 * @internal
 */

/**
 * Tokens of one step, both directions.
 *
 * @since 0.2.0
 * @internal
 */
export interface Usage {
  readonly inputTokens: number
  readonly outputTokens: number
}

const INPUT_KEYS: ReadonlySet<string> = new Set([
  "prompt_tokens",
  "input_tokens",
  "inputTokens",
  "promptTokenCount",
  "prompt_eval_count"
])
const OUTPUT_KEYS: ReadonlySet<string> = new Set([
  "completion_tokens",
  "output_tokens",
  "outputTokens",
  "candidatesTokenCount",
  "eval_count"
])

/** Every usage key contains one of these; text without them has no usage (a cheap early exit). */
const mayHoldUsage = /oken|eval_count/

const parseJson = (text: string): { readonly ok: boolean; readonly value: unknown } => {
  try {
    return { ok: true, value: JSON.parse(text) }
  } catch {
    return { ok: false, value: undefined }
  }
}

/** The values a text holds: its JSON value, or else the JSON of every SSE `data:` line. */
const valuesOf = (text: string): ReadonlyArray<unknown> => {
  const whole = parseJson(text)
  if (whole.ok) return [whole.value]
  const values: Array<unknown> = []
  for (const line of text.split(/\r\n|\r|\n/)) {
    if (!line.startsWith("data:")) continue
    const event = parseJson(line.slice(5))
    if (event.ok) values.push(event.value)
  }
  return values
}

/**
 * The usage recorded in an `llm_call` result (C.8.5): when the result is an
 * object with a non-empty string member `body`, that text is read, else the
 * result itself; the text is parsed as JSON or else as SSE (each line starting
 * `data:` whose rest is JSON). Every object is walked recursively; numeric
 * values of the input keys (`prompt_tokens`, `input_tokens`, `inputTokens`,
 * `promptTokenCount`, `prompt_eval_count`) and of the output keys
 * (`completion_tokens`, `output_tokens`, `outputTokens`,
 * `candidatesTokenCount`, `eval_count`) are read and the maximum is taken per
 * direction. `undefined` unless one of them is > 0.
 *
 * @since 0.2.0
 * @internal
 */
export const extract = (resultRaw: string | undefined): Usage | undefined => {
  if (resultRaw === undefined || !mayHoldUsage.test(resultRaw)) return undefined
  const result = parseJson(resultRaw)
  if (!result.ok) return undefined
  let values: ReadonlyArray<unknown> = [result.value]
  const value = result.value
  if (typeof value === "object" && value !== null && !Array.isArray(value)) {
    const body = (value as { readonly body?: unknown }).body
    if (typeof body === "string" && body !== "") values = valuesOf(body)
  }
  let input = 0
  let output = 0
  const walk = (u: unknown, depth: number): void => {
    if (typeof u !== "object" || u === null || depth > 64) return
    if (Array.isArray(u)) {
      for (const item of u) walk(item, depth + 1)
      return
    }
    for (const [key, member] of Object.entries(u)) {
      if (typeof member === "number") {
        if (INPUT_KEYS.has(key) && member > input) input = member
        else if (OUTPUT_KEYS.has(key) && member > output) output = member
      } else {
        walk(member, depth + 1)
      }
    }
  }
  for (const v of values) walk(v, 0)
  return input > 0 || output > 0 ? { inputTokens: Math.floor(input), outputTokens: Math.floor(output) } : undefined
}

/**
 * The `usage` member of `step.succeeded`: `{"input_tokens":n,"output_tokens":m}`.
 *
 * @since 0.2.0
 * @internal
 */
export const toJson = (usage: Usage): string =>
  "{\"input_tokens\":" + usage.inputTokens + ",\"output_tokens\":" + usage.outputTokens + "}"
