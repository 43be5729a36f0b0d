/**
 * An execution's event log (PROTOCOL 12), stored column by column: per event
 * its type, its time and either its payload text or the step it is about. A
 * step event's payload is rendered from the step (id, kind, target never
 * change) and its options when the event is read, so the four to five events
 * of every step cost a few array slots and no object each. Most events are
 * never read; those that are (listing, streaming, the test kit's results) are
 * built as plain {@link EventRecord}s then.
 *
 * @since 0.1.0
 * @internal
 */
import type { EventRecord } from "./model.js"
import { flat } from "./flat.js"
import * as Payload from "./payloads.js"

/**
 * What a step event's payload is rendered from.
 *
 * @since 0.1.0
 * @internal
 */
export interface StepIdentity {
  readonly stepId: string
  readonly kind: string
  readonly target: string
}

const CHUNK_BITS = 10
const CHUNK = 1 << CHUNK_BITS
const IN_CHUNK = CHUNK - 1

/**
 * An append-only column of the log. Its first chunk grows as an array does
 * (a short log costs what an array costs); the chunks after it are allocated
 * whole, so that a long log is never copied to grow.
 */
class Column<A> {
  private readonly chunks: Array<Array<A>> = [[]]

  /** Append `value` as the element at `index`, the column's length. */
  push(index: number, value: A): void {
    if (index < CHUNK) {
      this.chunks[0]!.push(value)
      return
    }
    const offset = index & IN_CHUNK
    if (offset === 0) this.chunks.push(new Array<A>(CHUNK))
    this.chunks[index >>> CHUNK_BITS]![offset] = value
  }

  /** The element at `index` (`undefined` out of range, as an array's). */
  at(index: number): A {
    return this.chunks[index >>> CHUNK_BITS]?.[index & IN_CHUNK] as A
  }
}

/**
 * @since 0.1.0
 * @internal
 */
export class EventLog {
  private count = 0
  private readonly types = new Column<string>()
  private readonly times = new Column<number>()
  /** The payload text, or the step a step event is about. */
  private readonly data = new Column<string | StepIdentity>()
  /** A step event's payload options (`undefined` for none). */
  private readonly options = new Column<Payload.StepPayloadOptions | undefined>()

  constructor(readonly executionId: string) {}

  /** The number of events; the last one's `seq`. */
  get length(): number {
    return this.count
  }

  /** Append an event with its payload text. */
  push(type: string, payload: string, occurredAtMs: number): void {
    this.append(type, occurredAtMs, flat(payload), undefined)
  }

  /** Append a step event; its payload is rendered when it is read. */
  pushStep(type: string, occurredAtMs: number, step: StepIdentity, options?: Payload.StepPayloadOptions): void {
    this.append(type, occurredAtMs, step, options)
  }

  /** The events with index in `[from, to)` (seq `from + 1` …), as records. */
  slice(from: number, to: number = this.count): Array<EventRecord> {
    const end = Math.min(to, this.count)
    const out: Array<EventRecord> = []
    for (let i = Math.max(0, from); i < end; i++) out.push(this.at(i))
    return out
  }

  /** The type of the event at `index` (seq `index + 1`). */
  typeAt(index: number): string {
    return this.types.at(index)
  }

  /**
   * What the event at `index` was appended with: its payload text, or the
   * step it is about and its options (a fork copies events this way,
   * PROTOCOL-CURRENT C.7.2).
   */
  dataAt(index: number): { readonly data: string | StepIdentity; readonly options: Payload.StepPayloadOptions | undefined } {
    return { data: this.data.at(index), options: this.options.at(index) }
  }

  private append(
    type: string,
    occurredAtMs: number,
    data: string | StepIdentity,
    options: Payload.StepPayloadOptions | undefined
  ): void {
    const index = this.count++
    this.types.push(index, type)
    this.times.push(index, occurredAtMs)
    this.data.push(index, data)
    this.options.push(index, options)
  }

  private at(index: number): EventRecord {
    const data = this.data.at(index)
    return {
      executionId: this.executionId,
      seq: index + 1,
      type: this.types.at(index),
      payload: typeof data === "string" ?
        data :
        flat(Payload.stepPayload(data.stepId, data.kind, data.target, this.options.at(index))),
      occurredAtMs: this.times.at(index)
    }
  }
}
