import { describe, expect, it } from 'vitest';
import { classify, EXCEPTION_TYPES } from '../../../src/executions/classify.ts';
import { exceptionReport, makeRaw } from '../../support/raw-run.ts';

describe('classify', () => {
  it('exit 0 → succeeded with parsed result.json and timing', () => {
    const c = classify(makeRaw({}, { resultJson: '{"answer": 42}' }));
    expect(c.status).toBe('succeeded');
    expect(c.exitCode).toBe(0);
    expect(c.error).toBeNull();
    expect(c.output).toEqual({ answer: 42 });
    expect(c.timing).toEqual({ startup_ms: 10, dep_install_ms: 0, execution_ms: 40, total_ms: 50, phase_at_exit: 'completed' });
    expect(c.resourceUsage).toEqual({ max_rss_mb: 10, cpu_time_ms: 12, wall_time_ms: 40 });
  });

  it('no result.json → output null', () => {
    expect(classify(makeRaw()).output).toBeNull();
  });

  it('invalid result.json → failed json_error', () => {
    const c = classify(makeRaw({}, { resultJson: '{nope' }));
    expect(c.status).toBe('failed');
    expect(c.error?.type).toBe('json_error');
  });

  it.each(Object.entries(EXCEPTION_TYPES).filter(([, t]) => t !== 'oom'))('%s → %s', (exc, type) => {
    const c = classify(makeRaw({ exitCode: 1, phase: 'failed' }, { report: exceptionReport(exc) }));
    expect(c.status).toBe('failed');
    expect(c.exitCode).toBe(1);
    expect(c.error?.type).toBe(type);
    expect(c.error?.message).toContain(exc);
  });

  it('a subclass classifies like its base through the MRO', () => {
    const c = classify(makeRaw({ exitCode: 1 }, { report: exceptionReport('MyError', ['MyError', 'KeyError', 'LookupError', 'Exception']) }));
    expect(c.error?.type).toBe('key_error');
  });

  it('an unknown exception → runtime_error', () => {
    expect(classify(makeRaw({ exitCode: 1 }, { report: exceptionReport('Weird', ['Weird', 'Exception']) })).error?.type).toBe('runtime_error');
  });

  it('import errors name the missing module (SPEC §7.3 rule 8)', () => {
    const c = classify(makeRaw({ exitCode: 1 }, { report: exceptionReport('ModuleNotFoundError', ['ModuleNotFoundError', 'ImportError'], { missing_module: 'numpy', exception_message: "No module named 'numpy'" }) }));
    expect(c.error?.type).toBe('import_error');
    expect(c.error?.message).toContain("'numpy'");
  });

  it.each([
    [139, 'segfault'],
    [134, 'abort'],
    [136, 'arithmetic_error'],
    [135, 'bus_error'],
    [141, 'pipe_error'],
    [143, 'cancelled'],
    [153, 'killed'],
  ])('exit %i → %s', (exit, type) => {
    const c = classify(makeRaw({ exitCode: exit }, { report: null }));
    expect(c.status).toBe('failed');
    expect(c.exitCode).toBe(exit);
    expect(c.error?.type).toBe(type);
  });

  // 128 + signal covers signals 1..31 (exit 129..159); a status outside it is the program's own exit code.
  it.each([128, 160, 200, 255])('exit %i is an ordinary exit code, not a signal', (exit) => {
    const c = classify(makeRaw({ exitCode: exit }, { report: null }));
    expect(c).toMatchObject({ status: 'failed', exitCode: exit, error: { type: 'runtime_error', message: `process exited with code ${exit}` } });
  });

  it.each([
    [129, 'killed by signal 1 (SIGHUP)'],
    [159, 'killed by signal 31 (SIGSYS)'],
    [150, 'killed by signal 22'],
  ])('exit %i at the edges of the signal range names the signal', (exit, message) => {
    const c = classify(makeRaw({ exitCode: exit }, { report: null }));
    expect(c).toMatchObject({ status: 'failed', exitCode: exit, error: { type: 'killed', message } });
  });

  it('exit 137 with a cgroup OOM kill → oom (SPEC §7.3 rule 4)', () => {
    const c = classify(makeRaw({ exitCode: 137, oomKilled: true }, { report: null }));
    expect(c).toMatchObject({ status: 'oom', exitCode: 137, error: { type: 'oom' } });
  });

  it('exit 137 where OOM cannot be told apart → oom (the spec table)', () => {
    const c = classify(makeRaw({ exitCode: 137, oomDetectable: false }, { report: null }));
    expect(c).toMatchObject({ status: 'oom', exitCode: 137, error: { type: 'oom' } });
  });

  it('exit 137 without an OOM kill where it can be told → killed, not oom', () => {
    const c = classify(makeRaw({ exitCode: 137, oomDetectable: true }, { report: null }));
    expect(c).toMatchObject({ status: 'failed', error: { type: 'killed' } });
  });

  it('MemoryError (rlimit) → oom status', () => {
    const c = classify(makeRaw({ exitCode: 1 }, { report: exceptionReport('MemoryError') }));
    expect(c.status).toBe('oom');
    expect(c.error?.type).toBe('oom');
  });

  it('runtime deadline in execution → timeout/execution_timeout, exit null (rule 3)', () => {
    const c = classify(makeRaw({ exitCode: null, timedOut: 'execution', phase: 'execution' }));
    expect(c).toMatchObject({ status: 'timeout', exitCode: null, error: { type: 'execution_timeout', phase: 'execution' } });
    expect(c.timing.phase_at_exit).toBe('execution');
  });

  it('runner timeout (exit 124 + report) → execution_timeout', () => {
    const c = classify(makeRaw({ exitCode: 124 }, { report: { exit_code: null, timed_out: true } }));
    expect(c).toMatchObject({ status: 'timeout', exitCode: null, error: { type: 'execution_timeout', phase: 'execution' } });
  });

  it('exit 124 without a timeout report is just an exit code', () => {
    const c = classify(makeRaw({ exitCode: 124 }, { report: { exit_code: 124, timed_out: false } }));
    expect(c).toMatchObject({ status: 'failed', exitCode: 124, error: { type: 'runtime_error' } });
  });

  it('startup deadline → timeout/startup_timeout, phase startup (rule 2)', () => {
    const c = classify(makeRaw({ exitCode: null, timedOut: 'startup', phase: 'startup' }, { report: null }));
    expect(c).toMatchObject({ status: 'timeout', exitCode: null, error: { type: 'startup_timeout', phase: 'startup' } });
    expect(c.timing.phase_at_exit).toBe('startup');
  });

  it('dependency install failure → dependency_error with pip message', () => {
    const c = classify(makeRaw({ exitCode: null, dependencyError: 'No matching distribution found for nope', phase: 'startup' }, { report: null }));
    expect(c).toMatchObject({ status: 'failed', error: { type: 'dependency_error' } });
    expect(c.error?.message).toContain('No matching distribution');
  });

  it('cancellation wins over everything', () => {
    expect(classify(makeRaw({ cancelled: true, exitCode: 137, oomKilled: true })).status).toBe('cancelled');
  });

  it('infra errors keep their type', () => {
    const c = classify(makeRaw({ exitCode: null, infraError: { type: 'docker_error', message: 'image not found' } }));
    expect(c).toMatchObject({ status: 'failed', error: { type: 'docker_error', message: 'image not found' } });
  });

  it('a forged report that disagrees with the observed exit code is ignored', () => {
    const c = classify(makeRaw({ exitCode: 3 }, { report: exceptionReport('ValueError') }));
    expect(c.error?.type).toBe('runtime_error');
    expect(c.error?.message).toContain('code 3');
  });

  it('a forged report cannot turn a failure into success', () => {
    const c = classify(makeRaw({ exitCode: 2 }, { report: { exit_code: 0, timed_out: false } }));
    expect(c.status).toBe('failed');
  });

  it('a forged timeout report without exit 124 is ignored', () => {
    const c = classify(makeRaw({ exitCode: 0 }, { report: { exit_code: 0, timed_out: true } }));
    expect(c.status).toBe('succeeded');
  });

  it('runner failure (125, no report) → internal_error', () => {
    expect(classify(makeRaw({ exitCode: 125 }, { report: null })).error?.type).toBe('internal_error');
  });

  it('trusted cgroup usage wins over the report', () => {
    const c = classify(makeRaw({ maxRssMb: 33.333, cpuTimeMs: 99 }));
    expect(c.resourceUsage).toMatchObject({ max_rss_mb: 33.33, cpu_time_ms: 99 });
  });
});
