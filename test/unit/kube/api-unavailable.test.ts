/** Which failures say "the API server is out of reach" (wait for it) rather than "this object" (give up). */
import { ApiException } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { ExecError, KubeTimeoutError, isApiUnavailable } from '../../../src/kube/index.ts';

describe('isApiUnavailable', () => {
  const table: [string, unknown, boolean][] = [
    ['a call past its deadline', new KubeTimeoutError('list pods: no answer'), true],
    ['the same, as the cause of a wrapped error', new Error('reconcile', { cause: new KubeTimeoutError('x') }), true],
    ['an exec upgrade never answered', new ExecError('exec: the API server did not answer the upgrade within 30000 ms', undefined, true), true],
    ['an exec refused 503', new ExecError('exec refused: HTTP 503', 503), true],
    ['an exec refused 429', new ExecError('exec refused: HTTP 429', 429), true],
    ['an exec refused 503, wrapped as KubeApi.exec does', new Error('exec: HTTP 503', { cause: new ExecError('exec refused: HTTP 503', 503) }), true],
    ['an exec refused 404 (pod gone)', new ExecError('exec refused: HTTP 404', 404), false],
    ['an exec refused 400 (container not running)', new ExecError('exec refused: HTTP 400', 400), false],
    ['an exec stream that broke after it started', new ExecError('exec stream closed before the command ended (no status)'), false],
    ['an API 500', new ApiException(500, 'Internal', '{}', {}), true],
    ['an API 409', new ApiException(409, 'Conflict', '{}', {}), false],
    ['a plain error', new Error('tar in the collector failed (exit 2)'), false],
    ['nothing', undefined, false],
  ];
  it.each(table)('%s → %s', (_what, err, expected) => {
    expect(isApiUnavailable(err)).toBe(expected);
  });
});
