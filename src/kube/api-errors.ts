/**
 * What the client layer's errors mean to a caller: the deadline's own error, whether an error says
 * the API server is out of reach (wait for it) rather than anything about the object, an error's
 * HTTP status, and the rethrow of a client error as retryable or not. Split from kube-api.ts.
 */
import { ApiException } from '@kubernetes/client-node';
import { UnretryableError } from '../errors.ts';
import { ExecError } from './exec.ts';

/** An API call that got no (complete) answer within its deadline: retryable, the server may recover. */
export class KubeTimeoutError extends Error {
  override readonly name = 'KubeTimeoutError';
}

/**
 * Whether an error (or its cause) says the API server is out of reach or overloaded — no answer
 * within the deadline, an exec it did not take, a 5xx or 429 — rather than anything about the
 * object asked for. Callers retrying in the background wait for the API instead of giving up.
 */
export function isApiUnavailable(err: unknown): boolean {
  for (let e = err, depth = 0; e && depth < 4; e = (e as { cause?: unknown }).cause, depth++) {
    if (e instanceof KubeTimeoutError) return true;
    if (e instanceof ExecError) return e.apiUnavailable;
    const code = httpStatusOf(e);
    if (code !== undefined) return code >= 500 || code === 429;
  }
  return false;
}

/** HTTP status of an API error, if it carries one. */
export function httpStatusOf(err: unknown): number | undefined {
  if (err instanceof ApiException) return err.code;
  const e = err as { code?: unknown; statusCode?: unknown; httpStatus?: unknown } | null;
  if (typeof e?.httpStatus === 'number') return e.httpStatus;
  if (typeof e?.statusCode === 'number') return e.statusCode;
  if (typeof e?.code === 'number') return e.code;
  return undefined;
}

export function messageOf(err: unknown): string {
  if (err instanceof ApiException) {
    const body = err.body as unknown;
    let parsed: { message?: string } | undefined;
    if (typeof body === 'string') {
      try {
        parsed = JSON.parse(body) as { message?: string };
      } catch {
        parsed = { message: body };
      }
    } else parsed = body as { message?: string } | undefined;
    return `HTTP ${err.code}: ${parsed?.message ?? 'no message'}`;
  }
  return err instanceof Error ? err.message : String(err);
}

/** Rethrows a client error as retryable or not: 4xx other than 408/429 will not get better. */
export function rethrow(op: string, err: unknown): never {
  const code = httpStatusOf(err);
  if (code !== undefined && code >= 400 && code < 500 && code !== 408 && code !== 429) {
    throw new UnretryableError(`${op}: ${messageOf(err)}`, 'internal_error', { cause: err });
  }
  throw new Error(`${op}: ${messageOf(err)}`, { cause: err });
}

