import { describe, expect, it } from 'vitest';
import { classify, EXCEPTION_TYPES, exceptionType } from '../../../src/executions/classify.ts';
import { cellAfterEnd } from '../../../src/runtime/session.ts';
import { MAX_JSON_DEPTH } from '../../../src/util/json.ts';
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

// Every field of the verdict, stated literally (a table derived from the code under test would
// agree with any change to it).
describe('classify: the SPEC §7.2 tables, literally', () => {
  const SPEC_EXCEPTIONS: Record<string, string> = {
    SyntaxError: 'syntax_error', IndentationError: 'syntax_error', TabError: 'syntax_error',
    ModuleNotFoundError: 'import_error', ImportError: 'import_error',
    TypeError: 'type_error', ValueError: 'value_error', KeyError: 'key_error', IndexError: 'index_error',
    AttributeError: 'attribute_error', NameError: 'name_error', UnboundLocalError: 'name_error',
    FileNotFoundError: 'file_not_found', IsADirectoryError: 'file_error', NotADirectoryError: 'file_error',
    PermissionError: 'permission',
    ConnectionError: 'network_error', ConnectionRefusedError: 'network_error', ConnectionResetError: 'network_error',
    ConnectionAbortedError: 'network_error', gaierror: 'network_error', TimeoutError: 'network_timeout', timeout: 'network_timeout',
    RecursionError: 'recursion_error', AssertionError: 'assertion_error', ZeroDivisionError: 'division_error',
    OverflowError: 'overflow_error', JSONDecodeError: 'json_error',
    UnicodeError: 'encoding_error', UnicodeDecodeError: 'encoding_error', UnicodeEncodeError: 'encoding_error',
    OSError: 'os_error', IOError: 'os_error', MemoryError: 'oom',
  };

  it('maps each exception class as the spec says', () => {
    expect(EXCEPTION_TYPES).toEqual(SPEC_EXCEPTIONS);
    for (const [exc, type] of Object.entries(SPEC_EXCEPTIONS)) expect(exceptionType(exc, null)).toBe(type);
  });

  it.each([
    [1, 'SIGHUP'], [2, 'SIGINT'], [3, 'SIGQUIT'], [4, 'SIGILL'], [5, 'SIGTRAP'], [6, 'SIGABRT'], [7, 'SIGBUS'], [8, 'SIGFPE'],
    [11, 'SIGSEGV'], [13, 'SIGPIPE'], [14, 'SIGALRM'], [15, 'SIGTERM'], [24, 'SIGXCPU'], [25, 'SIGXFSZ'], [31, 'SIGSYS'],
  ])('signal %i is named %s in the message', (sig, name) => {
    expect(classify(makeRaw({ exitCode: 128 + sig }, { report: null })).error?.message).toBe(`killed by signal ${sig} (${name})`);
  });

  it('exit 137 where an OOM kill would have been seen names SIGKILL', () => {
    expect(classify(makeRaw({ exitCode: 137, oomDetectable: true }, { report: null })).error?.message).toBe('killed by signal 9 (SIGKILL), not by the memory limit');
  });
});

describe('classify: messages and edge cases', () => {
  it.each<[string, Parameters<typeof makeRaw>[0], Parameters<typeof makeRaw>[1], object]>([
    ['cancelled', { cancelled: true }, {}, { status: 'cancelled', exitCode: 0, error: { type: 'cancelled', message: 'cancelled by user' } }],
    ['startup timeout', { exitCode: null, timedOut: 'startup' }, {}, { error: { message: 'startup phase exceeded startup_timeout (sandbox creation and dependency installation)' } }],
    ['dependency error', { exitCode: null, dependencyError: 'no such wheel' }, {}, { status: 'failed', exitCode: null, error: { message: 'dependency installation failed: no such wheel' } }],
    ['execution timeout', { exitCode: 9, timedOut: 'execution' }, {}, { exitCode: null, error: { message: 'code exceeded its execution timeout' } }],
    ['cgroup OOM kill', { exitCode: 1, oomKilled: true }, {}, { status: 'oom', exitCode: 137, error: { type: 'oom', message: 'out of memory: the run exceeded its memory limit' } }],
    ['no exit status', { exitCode: null }, { report: null }, { status: 'failed', exitCode: null, error: { type: 'internal_error', message: 'the sandbox ended without an exit status' } }],
    ['exit 137, OOM not detectable', { exitCode: 137, oomDetectable: false }, { report: null }, { error: { message: 'out of memory: the run was killed (exit 137)' } }],
    ['runner timeout', { exitCode: 124 }, { report: { exit_code: null, timed_out: true } }, { error: { message: 'code exceeded its execution timeout' } }],
    ['exit 124 without a report', { exitCode: 124 }, { report: null }, { status: 'failed', exitCode: 124, error: { type: 'runtime_error', message: 'process exited with code 124' } }],
    ['runner failure', { exitCode: 125 }, { report: null }, { status: 'failed', exitCode: 125, error: { type: 'internal_error', message: 'the sandbox runner failed before running the code' } }],
    ['result.json too large', {}, { resultJsonTooLarge: true, resultJson: '{}' }, { status: 'failed', exitCode: 0, output: null, error: { type: 'json_error', message: 'result.json is larger than max_artifact_bytes and was not read' } }],
    ['MemoryError', { exitCode: 1 }, { report: exceptionReport('MemoryError') }, { status: 'oom', exitCode: 1, error: { type: 'oom', message: 'out of memory: MemoryError: boom' } }],
    ['an exception without a message', { exitCode: 1 }, { report: { exit_code: 1, exception: 'KeyError', timed_out: false } }, { error: { type: 'key_error', message: 'KeyError' } }],
    ['a missing module on a non-import error', { exitCode: 1 }, { report: exceptionReport('KeyError', ['KeyError'], { missing_module: 'numpy' }) }, { error: { type: 'key_error', message: 'KeyError: boom' } }],
    ['an import error without a module name', { exitCode: 1 }, { report: exceptionReport('ImportError') }, { error: { type: 'import_error', message: 'ImportError: boom' } }],
  ])('%s', (_label, obs, rest, expected) => {
    const c = classify(makeRaw(obs, rest));
    expect(c).toMatchObject(expected);
  });

  it('an import error with a module names it', () => {
    const c = classify(makeRaw({ exitCode: 1 }, { report: exceptionReport('ImportError', ['ImportError'], { missing_module: 'numpy' }) }));
    expect(c.status).toBe('failed');
    expect(c.error).toEqual({ type: 'import_error', message: "ImportError: boom (module 'numpy' is not available in this job type)" });
  });

  it('a report without an MRO (null or empty) classifies by the class name', () => {
    expect(classify(makeRaw({ exitCode: 1 }, { report: { ...exceptionReport('KeyError'), exception_mro: null } })).error?.type).toBe('key_error');
    expect(classify(makeRaw({ exitCode: 1 }, { report: { ...exceptionReport('KeyError'), exception_mro: [] } })).error?.type).toBe('key_error');
    expect(exceptionType('Weird', ['Weird', 'ValueError'])).toBe('value_error');
    expect(exceptionType('Weird', null)).toBe('runtime_error');
  });

  it('result.json: as deep as allowed is kept, one level deeper fails', () => {
    const nest = (d: number) => `${'['.repeat(d)}${']'.repeat(d)}`;
    const ok = classify(makeRaw({}, { resultJson: nest(MAX_JSON_DEPTH) }));
    expect(ok.status).toBe('succeeded');
    const deep = classify(makeRaw({}, { resultJson: nest(MAX_JSON_DEPTH + 1) }));
    expect(deep).toMatchObject({ status: 'failed', output: null, error: { type: 'json_error', message: `/output/result.json nests deeper than ${MAX_JSON_DEPTH} levels` } });
  });

  it('invalid result.json names the parse error', () => {
    expect(classify(makeRaw({}, { resultJson: '{nope' })).error?.message).toMatch(/^\/output\/result\.json is not valid JSON: ./);
  });

  it('clips a message past 2000 characters, not one of exactly 2000', () => {
    const long = classify(makeRaw({ exitCode: null, infraError: { type: 'docker_error', message: 'x'.repeat(2001) } }));
    expect(long.error?.message).toBe(`${'x'.repeat(2000)}…`);
    const exact = classify(makeRaw({ exitCode: null, infraError: { type: 'docker_error', message: 'y'.repeat(2000) } }));
    expect(exact.error?.message).toBe('y'.repeat(2000));
  });

  it('phase_at_exit: startup when the run failed in startup, failed after it', () => {
    expect(classify(makeRaw({ exitCode: null, phase: 'startup', infraError: { type: 'docker_error', message: 'm' } })).timing.phase_at_exit).toBe('startup');
    expect(classify(makeRaw({ exitCode: 1, phase: 'execution' }, { report: null })).timing.phase_at_exit).toBe('failed');
    expect(classify(makeRaw({ exitCode: 1, phase: 'completed' }, { report: null })).timing.phase_at_exit).toBe('failed');
  });

  it('timings are whole milliseconds, never negative', () => {
    const c = classify(makeRaw({ startupMs: -3, depInstallMs: 5.4, executionMs: 7.6, totalMs: -0.2 }));
    expect(c.timing).toMatchObject({ startup_ms: 0, dep_install_ms: 5, execution_ms: 8, total_ms: 0 });
    expect(c.resourceUsage.wall_time_ms).toBe(8);
  });

  it('usage falls back to the report, and to 0 when the report has none or a negative value', () => {
    const fromReport = classify(makeRaw({}, { report: { exit_code: 0, timed_out: false, max_rss_kb: 2048, cpu_time_ms: 7.6 } }));
    expect(fromReport.resourceUsage).toEqual({ max_rss_mb: 2, cpu_time_ms: 8, wall_time_ms: 40 });
    const none = classify(makeRaw({}, { report: { exit_code: 0, timed_out: false } }));
    expect(none.resourceUsage).toEqual({ max_rss_mb: 0, cpu_time_ms: 0, wall_time_ms: 40 });
    const negative = classify(makeRaw({}, { report: { exit_code: 0, timed_out: false, max_rss_kb: -5, cpu_time_ms: -5 } }));
    expect(negative.resourceUsage).toEqual({ max_rss_mb: 0, cpu_time_ms: 0, wall_time_ms: 40 });
  });
});

describe('a session cell that reached a sandbox already ended (cellAfterEnd)', () => {
  it.each([
    ['oom', 'oom', 'oom'],
    ['crashed', 'failed', 'killed'],
    ['closed', 'failed', 'killed'],
  ] as const)('ended %s → %s / %s, exit 137, nothing ran', (reason, status, type) => {
    const raw = cellAfterEnd({ reason, detail: 'x' }, 1_000);
    expect(raw.stdout + raw.stderr).toBe('');
    const c = classify(raw);
    expect(c).toMatchObject({ status, exitCode: 137, error: { type }, output: null });
  });
});
