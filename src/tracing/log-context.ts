/**
 * `trace_id` on every log line written while a run is being handled, wherever the line comes from
 * (the lifecycle, the runtime, the guard): the run's work goes on inside {@link withRunLogContext},
 * and the root logger's mixin ({@link logTraceMixin}) adds the id. Only runs that have a trace enter
 * the context; otherwise nothing is added and nothing is paid but one `getStore()` per line.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import type { Logger } from 'pino';

const store = new AsyncLocalStorage<string>();

/** Runs `fn` with `traceId` on every log line it writes (directly or through anything it awaits). */
export function withRunLogContext<T>(traceId: string | undefined, fn: () => Promise<T>): Promise<T> {
  return traceId ? store.run(traceId, fn) : fn();
}

/**
 * pino `mixin`: the trace id of the run being handled, unless the logger carries one already (a run's
 * own logger binds it, for lines written from callbacks outside the run's async context). A fresh
 * object each time: pino merges the line's fields into it.
 */
export function logTraceMixin(_fields: object, _level: number, logger: Logger): object {
  const traceId = store.getStore();
  if (traceId === undefined || 'trace_id' in logger.bindings()) return {};
  return { trace_id: traceId };
}
