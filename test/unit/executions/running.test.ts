/**
 * What a resolved run counts as for the breaker (the guard's `isEngineFailure`): the machinery
 * failing counts; everything the user's code did — including failing, timing out, running out of
 * memory, or a bad requirement — is a success of the engine.
 */
import { describe, expect, it } from 'vitest';
import { isEngineFailure } from '../../../src/executions/running.ts';
import { makeRaw } from '../../support/raw-run.ts';

describe('isEngineFailure', () => {
  it.each([
    { name: 'engine error (internal_error)', obs: { infraError: { type: 'internal_error', message: 'sandbox could not start' } }, failure: true },
    { name: 'engine error (docker_error)', obs: { infraError: { type: 'docker_error', message: 'image missing' } }, failure: true },
    { name: 'a config problem of the job type (config_error)', obs: { infraError: { type: 'config_error', message: 'no image' } }, failure: false },
    { name: 'a clean run', obs: {}, failure: false },
    { name: 'user code exits 1', obs: { exitCode: 1, phase: 'failed' as const }, failure: false },
    { name: 'execution timeout', obs: { timedOut: 'execution' as const, exitCode: null }, failure: false },
    { name: 'OOM kill', obs: { oomKilled: true, exitCode: 137 }, failure: false },
    { name: 'dependency install failed', obs: { dependencyError: 'No matching distribution' }, failure: false },
    { name: 'cancelled', obs: { cancelled: true, exitCode: null }, failure: false },
  ])('$name → $failure', ({ obs, failure }) => {
    expect(isEngineFailure(makeRaw(obs))).toBe(failure);
  });
});
