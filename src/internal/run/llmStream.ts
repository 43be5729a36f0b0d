/**
 * The streaming tee of PROTOCOL.md 14.8: hand the provider's bytes to the
 * caller unchanged while decoding them incrementally as UTF-8 into a full
 * transcript and a pending buffer that is published as live deltas (at 2000
 * pending characters or 50 ms after the last flush, cut into pieces of at most
 * 1750 characters on code-point boundaries), and record the transcript exactly
 * once — at the end of the stream or when the consumer cancels. A read error
 * fails the step instead and errors the caller's stream.
 *
 * It works on Web streams so that the `fetch` wrapper and the `HttpClient`
 * transform share it; the kernel calls come in as Promise-returning hooks.
 *
 * @since 0.1.0
 * @internal
 */

/**
 * Flush the pending text when it reaches this many characters.
 *
 * @since 0.1.0
 * @internal
 */
export const FLUSH_CHARS = 2000

/**
 * … or when this many milliseconds have passed since the last flush.
 *
 * @since 0.1.0
 * @internal
 */
export const FLUSH_INTERVAL_MILLIS = 50

/**
 * The largest delta, in UTF-16 code units (the kernel caps a delta at 7000
 * bytes; 1750 × 4).
 *
 * @since 0.1.0
 * @internal
 */
export const MAX_DELTA_CHARS = 1750

const isHighSurrogate = (code: number): boolean => code >= 0xd800 && code <= 0xdbff
const isLowSurrogate = (code: number): boolean => code >= 0xdc00 && code <= 0xdfff

/**
 * Cut text into pieces of at most `max` code units, never inside a surrogate pair.
 *
 * @since 0.1.0
 * @internal
 */
export const cutDeltas = (text: string, max: number = MAX_DELTA_CHARS): ReadonlyArray<string> => {
  const out: Array<string> = []
  let start = 0
  while (start < text.length) {
    let end = Math.min(start + max, text.length)
    if (
      end < text.length && end - start > 1 && isHighSurrogate(text.charCodeAt(end - 1)) &&
      isLowSurrogate(text.charCodeAt(end))
    ) {
      end--
    }
    out.push(text.slice(start, end))
    start = end
  }
  return out
}

/**
 * One live delta.
 *
 * @since 0.1.0
 * @internal
 */
export interface Delta {
  readonly seq: number
  readonly data: string
}

/**
 * The text side of the tee: incremental UTF-8 decoding, the transcript, the
 * pending buffer, the flush rule and the delta sequence.
 *
 * @since 0.1.0
 * @internal
 */
export class DeltaBuffer {
  private readonly decoder = new TextDecoder("utf-8")
  private pending = ""
  private seq = 0
  private text = ""
  private lastFlush: number

  constructor(now: number) {
    this.lastFlush = now
  }

  /** Everything decoded so far. */
  get transcript(): string {
    return this.text
  }

  /** Decode a chunk (a character split across chunks waits for its remaining bytes). */
  push(bytes: Uint8Array): void {
    this.append(this.decoder.decode(bytes, { stream: true }))
  }

  /** The stream is over: decode whatever bytes are still held back. */
  end(): void {
    this.append(this.decoder.decode())
  }

  /** The deltas due now (all pending text when `force`), advancing `seq`. */
  take(now: number, force: boolean): ReadonlyArray<Delta> {
    if (this.pending === "") return []
    if (!force && this.pending.length < FLUSH_CHARS && now - this.lastFlush < FLUSH_INTERVAL_MILLIS) return []
    this.lastFlush = now
    const pieces = cutDeltas(this.pending)
    this.pending = ""
    return pieces.map((data) => ({ seq: this.seq++, data }))
  }

  private append(text: string): void {
    if (text === "") return
    this.text += text
    this.pending += text
  }
}

/**
 * The kernel side of the tee. `publish` and `fail` never reject; `complete`
 * resolves to the error to raise on the caller's stream, or `undefined`.
 *
 * @since 0.1.0
 * @internal
 */
export interface TeeHooks {
  readonly now: () => number
  readonly publish: (seq: number, data: string) => Promise<void>
  readonly complete: (transcript: string) => Promise<unknown>
  readonly fail: (error: unknown) => Promise<void>
}

/**
 * Tee a provider stream (see the module comment). The returned stream pulls
 * from `source` only when read (no read-ahead).
 *
 * @since 0.1.0
 * @internal
 */
export const teeStream = (source: ReadableStream<Uint8Array>, hooks: TeeHooks): ReadableStream<Uint8Array> => {
  const reader = source.getReader()
  const buffer = new DeltaBuffer(hooks.now())
  let finished = false
  let publishing: Promise<void> = Promise.resolve()

  const flush = (force: boolean): void => {
    for (const delta of buffer.take(hooks.now(), force)) {
      publishing = publishing.then(() => hooks.publish(delta.seq, delta.data)).catch(() => undefined)
    }
  }

  /** Flush the rest, wait for the deltas, record the transcript. Called at most once. */
  const finish = async (): Promise<unknown> => {
    buffer.end()
    flush(true)
    await publishing
    return hooks.complete(buffer.transcript)
  }

  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        if (finished) return
        let chunk: ReadableStreamReadResult<Uint8Array>
        try {
          chunk = await reader.read()
        } catch (error) {
          if (finished) return
          finished = true
          await publishing
          await hooks.fail(error)
          controller.error(error)
          return
        }
        if (finished) return
        if (chunk.done) {
          finished = true
          const error = await finish()
          if (error === undefined) controller.close()
          else controller.error(error)
          return
        }
        buffer.push(chunk.value)
        flush(false)
        controller.enqueue(chunk.value)
      },
      async cancel(reason) {
        if (finished) return
        finished = true
        await reader.cancel(reason).catch(() => undefined)
        await finish()
      }
    },
    { highWaterMark: 0 }
  )
}
