/**
 * Schema encoding and decoding on the step path without an Effect per value.
 *
 * `encodeSync` / `decodeSync` run a schema's parser synchronously and return
 * `{ value }` when that succeeds; they return `undefined` when it does not —
 * the value is invalid, or the schema needs services or asynchronous work — and
 * the caller then takes the Effect path (`Schema.encode` / `Schema.decodeUnknown`),
 * which gives the authoritative answer and error. Parsers are built once per
 * schema.
 *
 * @since 0.1.0
 * @internal
 */
import { Either, ParseResult } from "effect"
import type { Schema } from "effect"

type Parser = (u: unknown) => Either.Either<unknown, ParseResult.ParseIssue>

const encoders = new WeakMap<object, Parser>()
const decoders = new WeakMap<object, Parser>()

const parserFor = (
  cache: WeakMap<object, Parser>,
  schema: Schema.Schema.All,
  make: (schema: Schema.Schema<unknown, unknown, never>) => Parser
): Parser => {
  let parser = cache.get(schema)
  if (parser === undefined) {
    // Services a schema needs are only reached through Effects, which the
    // synchronous parser refuses: the caller falls back to the Effect path.
    parser = make(schema as Schema.Schema<unknown, unknown, never>)
    cache.set(schema, parser)
  }
  return parser
}

const run = <A>(parser: Parser, value: unknown): { readonly value: A } | undefined => {
  const result = parser(value)
  return Either.isRight(result) ? { value: result.right as A } : undefined
}

/**
 * Encode synchronously, or `undefined` (take the Effect path).
 *
 * @internal
 */
export const encodeSync = <A, I, R>(schema: Schema.Schema<A, I, R>, value: A): { readonly value: I } | undefined =>
  run(parserFor(encoders, schema, (s) => ParseResult.encodeUnknownEither(s)), value)

/**
 * Decode synchronously, or `undefined` (take the Effect path).
 *
 * @internal
 */
export const decodeSync = <A, I, R>(schema: Schema.Schema<A, I, R>, value: unknown): { readonly value: A } | undefined =>
  run(parserFor(decoders, schema, (s) => ParseResult.decodeUnknownEither(s)), value)
