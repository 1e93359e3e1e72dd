/** Timers a test can pause: while paused nothing fires (a frozen event loop, as far as others can tell). */
import type { Every } from '../../src/queue/holders.ts';

export function pausableTimers(): { every: Every; pause(): void; resume(): void } {
  let paused = false;
  return {
    every: (ms, fn) => {
      const t = setInterval(() => {
        if (!paused) fn();
      }, ms);
      return () => clearInterval(t);
    },
    pause: () => (paused = true),
    resume: () => (paused = false),
  };
}
