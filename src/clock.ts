/**
 * The one clock shape. Everything whose decisions depend on time (breaker, controller, pools,
 * heartbeats, the record lifecycle) takes a `Clock` so tests can drive time by hand.
 */

/** Milliseconds since the epoch, like `Date.now()`. */
export interface Clock {
  now(): number;
}

/** The real clock. */
export const systemClock: Clock = { now: () => Date.now() };
