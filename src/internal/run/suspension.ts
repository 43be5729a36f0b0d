/**
 * The suspension of a run that waits on its subagents (PROTOCOL-CURRENT
 * C.5.2, C.5.4 #2): the run counts its steps in flight, and a subagent call
 * that has created its child waits until every step in flight either waits on
 * a child too or has ended; then `POST …/suspend` is sent **once** for all the
 * waiting calls, and each of them gets its answer.
 *
 * Waiting for the other steps keeps a suspension from cutting a running tool
 * off: once the kernel blocks the execution it retires the run's lease, and a
 * tool body that finished after that could not record its outcome.
 *
 * Only the steps of the handler itself are counted (a step run inside another
 * step's body is part of that step), so that a subagent called inside a tool
 * body does not wait for the very tool that calls it. LLM calls are not
 * counted, as in the official SDKs: one that ends after the suspension is
 * simply run again on the next delivery (it is `safe_to_retry`).
 *
 * @since 0.2.0
 * @internal
 */
import { Context, Deferred, Effect, Exit } from "effect"

/**
 * Whether the fiber runs inside a step's body: the steps it starts are not
 * counted as in flight (their enclosing step is).
 *
 * @since 0.2.0
 * @internal
 */
export const InStepBody = Context.Reference<boolean>("effect-rebuno/Step/InStepBody", { defaultValue: () => false })

/**
 * Steps are counted only once the process has defined a subagent call
 * (`Subagent.make` switches it on, normally at module load): until then the
 * bookkeeping costs a step nothing.
 */
let counting = false

/**
 * Start counting steps in flight (process-wide, for good).
 *
 * @since 0.2.0
 * @internal
 */
export const enable = (): void => {
  counting = true
}

/**
 * Whether steps are counted.
 *
 * @since 0.2.0
 * @internal
 */
export const isEnabled = (): boolean => counting

/**
 * The in-flight bookkeeping of one run.
 *
 * @since 0.2.0
 * @internal
 */
export interface Suspension {
  /** A step of the handler starts (before its submission). */
  readonly enter: () => void
  /** A step of the handler has ended (whatever its outcome). */
  readonly exit: Effect.Effect<void>
  /**
   * Wait until every step in flight waits here or has ended, then run
   * `suspend` once for all the waiters of that round; each gets its outcome.
   */
  readonly await: <E>(suspend: Effect.Effect<boolean, E>) => Effect.Effect<boolean, E>
}

interface Round {
  waiting: number
  called: boolean
  readonly ready: Deferred.Deferred<void>
  readonly outcome: Deferred.Deferred<boolean, any>
}

/**
 * Make the bookkeeping of a run.
 *
 * @since 0.2.0
 * @internal
 */
export const make = (): Suspension => new Bookkeeping()

/**
 * The bookkeeping as fields and prototype methods: every run holds one, and
 * most never suspend (the Effects it needs are built on first use).
 */
class Bookkeeping implements Suspension {
  private inFlight = 0
  private round: Round | undefined = undefined
  private exitEffect: Effect.Effect<void> | undefined = undefined
  private checkSoonEffect: Effect.Effect<void> | undefined = undefined

  enter(): void {
    this.inFlight++
  }

  get exit(): Effect.Effect<void> {
    return this.exitEffect ??= Effect.suspend(() => {
      this.inFlight--
      return this.round === undefined ? Effect.void : this.checkSoon
    })
  }

  await<E>(suspend: Effect.Effect<boolean, E>): Effect.Effect<boolean, E> {
    return Effect.suspend(() => {
      const current: Round = this.round ?? {
        waiting: 0,
        called: false,
        ready: Deferred.makeUnsafe<void>(),
        outcome: Deferred.makeUnsafe<boolean, E>()
      }
      this.round = current
      current.waiting++
      const outcome = current.outcome as Deferred.Deferred<boolean, E>
      return Effect.andThen(this.checkSoon, Deferred.await(current.ready)).pipe(
        Effect.onInterrupt(() =>
          Effect.sync(() => {
            // A waiter that goes away before the round starts no longer counts.
            if (this.round === current) current.waiting--
            this.check()
          })
        ),
        Effect.andThen(Effect.suspend(() => {
          if (current.called) return Deferred.await(outcome)
          current.called = true
          return Effect.onExit(suspend, (exit) => Deferred.done(outcome, exit))
        }))
      )
    })
  }

  private release(current: Round): void {
    if (this.round === current) this.round = undefined
    Deferred.doneUnsafe(current.ready, Exit.void)
  }

  private check(): void {
    if (this.round !== undefined && this.round.waiting >= this.inFlight) this.release(this.round)
  }

  /**
   * Check once the fibers already scheduled have had their turn: concurrent
   * steps forked together start one after the other, and one that answers at
   * once (an in-process kernel) must not suspend before its siblings entered.
   */
  private get checkSoon(): Effect.Effect<void> {
    return this.checkSoonEffect ??= Effect.andThen(Effect.yieldNow, Effect.sync(() => this.check()))
  }
}
