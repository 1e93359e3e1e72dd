/**
 * The circuit breaker of SPEC §3: `closed` → `open` after `failureThreshold` consecutive failures;
 * `open` → `half_open` once `recoveryTimeoutMs` has passed; `half_open` → `closed` after
 * `successThreshold` successes, and back to `open` on any failure.
 *
 * Why not opossum (the stack's default): opossum trips on a rolling error *percentage* and closes a
 * half-open circuit on its first success; SPEC §3 asks for consecutive failures and two successes.
 * This state machine says exactly that, with an injected clock so it is table-tested without sleeping.
 * It only counts; what counts as a failure, and when, is the guard policy's business (`guard.ts`).
 */
import { systemClock, type Clock } from '../clock.ts';

/** Breaker states as `/health` shows them. */
export type BreakerState = 'closed' | 'open' | 'half_open';

/** Options; defaults are SPEC §8's. */
export interface BreakerOptions {
  failureThreshold?: number;
  recoveryTimeoutMs?: number;
  successThreshold?: number;
  clock?: Clock;
  onStateChange?: (from: BreakerState, to: BreakerState) => void;
}

/** Thrown by {@link CircuitBreaker.exec} while the circuit is open. */
export class BreakerOpenError extends Error {
  override readonly name = 'BreakerOpenError';
  constructor(readonly retryAfterMs: number) {
    super(`circuit breaker is open: the sandbox engine failed repeatedly; retry in ${Math.ceil(retryAfterMs / 1000)} s`);
  }
}

/** `/health.circuit_breaker`. */
export interface BreakerSnapshot {
  state: BreakerState;
  failure_count: number;
  success_count: number;
  last_failure: string | null;
}

/** A circuit breaker with SPEC §3 semantics. */
export class CircuitBreaker {
  private stateValue: BreakerState = 'closed';
  private failures = 0;
  private successes = 0;
  private openedAt = 0;
  private lastFailure: number | null = null;
  private readonly failureThreshold: number;
  private readonly recoveryTimeoutMs: number;
  private readonly successThreshold: number;
  private readonly clock: Clock;
  private readonly onStateChange: ((from: BreakerState, to: BreakerState) => void) | undefined;

  constructor(opts: BreakerOptions = {}) {
    this.failureThreshold = opts.failureThreshold ?? 5;
    this.recoveryTimeoutMs = opts.recoveryTimeoutMs ?? 30_000;
    this.successThreshold = opts.successThreshold ?? 2;
    this.clock = opts.clock ?? systemClock;
    this.onStateChange = opts.onStateChange;
  }

  /** Current state; an open circuit whose recovery time has passed reads as half-open. */
  get state(): BreakerState {
    if (this.stateValue === 'open' && this.clock.now() - this.openedAt >= this.recoveryTimeoutMs) this.move('half_open');
    return this.stateValue;
  }

  /** Milliseconds until an open circuit lets calls through again (half-open); 0 when not open. */
  retryInMs(): number {
    return this.state === 'open' ? Math.max(0, this.recoveryTimeoutMs - (this.clock.now() - this.openedAt)) : 0;
  }

  /** Throws {@link BreakerOpenError} when calls are not allowed now. */
  check(): void {
    if (this.state === 'open') throw new BreakerOpenError(this.recoveryTimeoutMs - (this.clock.now() - this.openedAt));
  }

  /** Runs `fn` through the breaker; `isFailure` decides whether a resolved value counts as a failure. */
  async exec<T>(fn: () => Promise<T>, isFailure: (value: T) => boolean = () => false): Promise<T> {
    this.check();
    let value: T;
    try {
      value = await fn();
    } catch (err) {
      this.recordFailure();
      throw err;
    }
    if (isFailure(value)) this.recordFailure();
    else this.recordSuccess();
    return value;
  }

  /** Counts a success. */
  recordSuccess(): void {
    const s = this.state;
    if (s === 'half_open') {
      this.successes += 1;
      if (this.successes >= this.successThreshold) this.move('closed');
    } else if (s === 'closed') {
      this.failures = 0;
      this.successes += 1;
    }
  }

  /** Counts a failure. */
  recordFailure(): void {
    this.lastFailure = this.clock.now();
    const s = this.state;
    if (s === 'half_open') {
      this.move('open');
      return;
    }
    if (s === 'closed') {
      this.failures += 1;
      if (this.failures >= this.failureThreshold) this.move('open');
    }
  }

  /** The `/health` view. */
  snapshot(): BreakerSnapshot {
    return {
      state: this.state,
      failure_count: this.failures,
      success_count: this.successes,
      last_failure: this.lastFailure === null ? null : new Date(this.lastFailure).toISOString(),
    };
  }

  private move(to: BreakerState): void {
    const from = this.stateValue;
    if (from === to) return;
    this.stateValue = to;
    if (to === 'open') this.openedAt = this.clock.now();
    if (to === 'closed') this.failures = 0;
    this.successes = 0;
    this.onStateChange?.(from, to);
  }
}
