/**
 * Schema encoding and decoding on the step path without an Effect per value.
 *
 * `encodeSync` / `decodeSync` run a schema's parser synchronously and return
 * `{ value }` when that succeeds; they return `undefined` when it does not —
 * the value is invalid, or the schema needs services or asynchronous work — and
 * the caller then takes the Effect path (`Schema.encodeEffect` /
 * `Schema.decodeUnknownEffect`), which gives the authoritative answer and
 * error. Parsers are built once per schema.
 *
 * @since 0.1.0
 * @internal
 */
import type * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import type * as Schema from "effect/Schema"
import type * as SchemaIssue from "effect/SchemaIssue"
import * as SchemaParser from "effect/SchemaParser"

type Parser = (u: unknown) => Effect.Effect<unknown, SchemaIssue.Issue, unknown>

const encoders = new WeakMap<object, Parser>()
const decoders = new WeakMap<object, Parser>()

const parserFor = (cache: WeakMap<object, Parser>, schema: Schema.Top, make: (schema: Schema.Top) => Parser): Parser => {
  let parser = cache.get(schema)
  if (parser === undefined) {
    parser = make(schema)
    cache.set(schema, parser)
  }
  return parser
}

// A parser that finishes synchronously returns its `Exit` itself; one that needs
// services or asynchronous work returns a suspended Effect, which is left to the
// caller's Effect path. Running nothing here keeps this free of a fiber per value.
const run = <A>(parser: Parser, value: unknown): { readonly value: A } | undefined => {
  const result = parser(value)
  return Exit.isExit(result) && Exit.isSuccess(result) ? { value: result.value as A } : undefined
}

/**
 * Encode synchronously, or `undefined` (take the Effect path).
 *
 * @internal
 */
export const encodeSync = <S extends Schema.Top>(
  schema: S,
  value: S["Type"]
): { readonly value: S["Encoded"] } | undefined =>
  run(parserFor(encoders, schema, (s) => SchemaParser.encodeUnknownEffect(s)), value)

/**
 * Decode synchronously, or `undefined` (take the Effect path).
 *
 * @internal
 */
export const decodeSync = <S extends Schema.Top>(
  schema: S,
  value: unknown
): { readonly value: S["Type"] } | undefined =>
  run(parserFor(decoders, schema, (s) => SchemaParser.decodeUnknownEffect(s)), value)
