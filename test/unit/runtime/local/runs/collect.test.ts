import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { collectOutputs, collectRun, readReport, readStream } from '../../../../../src/runtime/local/runs/collect.ts';
import { baseObservation, MAX_ARTIFACT_ENTRIES } from '../../../../../src/runtime/run-output.ts';
import type { LaunchResult } from '../../../../../src/runtime/local/runs/proc.ts';

function outDir(): string {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  return mkdtempSync(path.join('/tmp/sandpod-test', 'collect-'));
}

describe('collectOutputs', () => {
  it('keeps regular files, excludes control files and result.json, never follows links', () => {
    const d = outDir();
    writeFileSync(path.join(d, 'result.json'), '{"a":1}');
    writeFileSync(path.join(d, '.svc_report.json'), '{}');
    writeFileSync(path.join(d, '.svc_stdout'), 'x');
    writeFileSync(path.join(d, 'plot.png'), Buffer.from([1, 2, 3]));
    writeFileSync(path.join(d, '_input.json'), '{}');
    writeFileSync(path.join(d, 'big.txt'), 'x'.repeat(101));
    symlinkSync('/etc/passwd', path.join(d, 'passwd'));
    mkdirSync(path.join(d, 'sub'));
    execFileSync('mkfifo', [path.join(d, 'fifo')]);
    const r = collectOutputs(d, 100);
    expect(r.resultJson).toBe('{"a":1}');
    const by = Object.fromEntries(r.artifacts.map((a) => [a.name, a]));
    expect(Object.keys(by).sort()).toEqual(['_input.json', 'big.txt', 'fifo', 'passwd', 'plot.png', 'sub']);
    expect(by['plot.png']).toMatchObject({ size: 3, contentType: 'image/png', sha256: '039058c6f2c0cb492c533b0a4d14ef77cc0f78abccced5287d84a1a2011cfb81' });
    expect(by['_input.json']).toMatchObject({ skipped: 'reserved_name' });
    expect(by['big.txt']).toMatchObject({ skipped: 'too_large', size: 101 });
    for (const n of ['passwd', 'sub', 'fifo']) {
      expect(by[n]).toMatchObject({ skipped: 'not_regular' });
      expect(by[n]!.data).toBeUndefined();
    }
  });

  it('flags a result.json over the cap and does not read it', () => {
    const d = outDir();
    writeFileSync(path.join(d, 'result.json'), '[' + '1,'.repeat(100) + '1]');
    expect(collectOutputs(d, 50)).toMatchObject({ resultJson: null, resultJsonTooLarge: true });
  });

  it('ignores a result.json that is a symlink', () => {
    const d = outDir();
    symlinkSync('/etc/hostname', path.join(d, 'result.json'));
    expect(collectOutputs(d, 1000).resultJson).toBeNull();
  });
});

describe('collectOutputs: the artifact limit (issue 22)', () => {
  /** `n` one-byte files `f0000.txt`…, plus the runner's control files and a result.json. */
  function outputs(n: number): string {
    const d = outDir();
    for (const f of ['.svc_phase', '.svc_report.json', '.svc_stdout', '.svc_stderr']) writeFileSync(path.join(d, f), '{}');
    writeFileSync(path.join(d, 'result.json'), '{"ok":true}');
    for (let i = 0; i < n; i++) writeFileSync(path.join(d, `f${String(i).padStart(4, '0')}.txt`), 'x');
    return d;
  }

  it('over the limit: keeps the first MAX_ARTIFACT_ENTRIES by name, counts them all, flags it, still reads result.json', () => {
    const r = collectOutputs(outputs(1500), 100);
    expect(r.artifacts).toHaveLength(MAX_ARTIFACT_ENTRIES);
    expect(r.artifacts[0]!.name).toBe('f0000.txt');
    expect(r.artifacts.at(-1)!.name).toBe(`f${String(MAX_ARTIFACT_ENTRIES - 1).padStart(4, '0')}.txt`);
    expect(r).toMatchObject({ artifactsTotal: 1500, artifactsTruncated: true, resultJson: '{"ok":true}' });
  });

  it('exactly at the limit: every file kept (control files take no slot), not truncated', () => {
    const r = collectOutputs(outputs(MAX_ARTIFACT_ENTRIES), 100);
    expect(r.artifacts).toHaveLength(MAX_ARTIFACT_ENTRIES);
    expect(r).toMatchObject({ artifactsTotal: MAX_ARTIFACT_ENTRIES, artifactsTruncated: false });
  });

  it('under the limit: not truncated; skipped entries count as written', () => {
    const d = outputs(3);
    mkdirSync(path.join(d, 'sub'));
    writeFileSync(path.join(d, 'big.bin'), 'x'.repeat(200));
    const r = collectOutputs(d, 100);
    expect(r).toMatchObject({ artifactsTotal: 5, artifactsTruncated: false });
    expect(r.artifacts).toHaveLength(5);
  });

  it('an empty or missing /output: nothing written', () => {
    expect(collectOutputs(outDir(), 100)).toMatchObject({ artifacts: [], artifactsTotal: 0, artifactsTruncated: false });
    expect(collectOutputs('/nonexistent/sandpod-output', 100)).toMatchObject({ artifactsTotal: 0, artifactsTruncated: false });
  });
});

describe('report and streams', () => {
  it('parses only a JSON object report, not through a symlink', () => {
    const d = outDir();
    writeFileSync(path.join(d, '.svc_report.json'), '{"exit_code": 3}');
    expect(readReport(d)).toEqual({ exit_code: 3 });
    writeFileSync(path.join(d, '.svc_report.json'), '[1]');
    expect(readReport(d)).toBeNull();
    const e = outDir();
    symlinkSync('/etc/os-release', path.join(e, '.svc_report.json'));
    expect(readReport(e)).toBeNull();
  });
  it('caps a stream and flags truncation', () => {
    const d = outDir();
    writeFileSync(path.join(d, '.svc_stdout'), 'abcdef');
    expect(readStream(d, '.svc_stdout', 4)).toEqual({ text: 'abcd', truncated: true });
    expect(readStream(d, '.svc_stderr', 4)).toEqual({ text: '', truncated: false });
  });
});

describe('collectRun', () => {
  const launch = (over: Partial<LaunchResult>): LaunchResult => ({ exitCode: 0, signal: null, tExec: 1, killedBy: null, stdoutTail: '', stderrTail: '', spawnError: null, captured: null, byDoneMarker: true, doneReport: null, framed: null, ...over });

  it('a held warm sandbox: the report from the done line, the streams from the frames, no control file read', () => {
    const d = outDir();
    // Files a program could have left: not what the run reports.
    writeFileSync(path.join(d, '.svc_report.json'), '{"exit_code": 99}');
    writeFileSync(path.join(d, '.svc_stdout'), 'forged');
    writeFileSync(path.join(d, 'plot.png'), Buffer.from([1]));
    const report = { phase: 'failed', exit_code: 3, exception: 'KeyError', stdout_truncated: true };
    const r = collectRun(d, launch({ exitCode: 3, doneReport: Buffer.from(JSON.stringify(report)), framed: { stdout: Buffer.from('héllo'), stderr: Buffer.from('err') } }), baseObservation(0, { oomDetectable: true }), { maxStdoutBytes: 100, maxArtifactBytes: 100 });
    expect(r.report).toMatchObject({ exit_code: 3, exception: 'KeyError' });
    expect([r.stdout, r.stderr, r.stdoutTruncated, r.stderrTruncated]).toEqual(['héllo', 'err', true, false]);
    expect(r.artifacts.map((a) => a.name)).toEqual(['plot.png']);
  });

  it('without a report on the done line, the files are read as before', () => {
    const d = outDir();
    writeFileSync(path.join(d, '.svc_report.json'), '{"exit_code": 4}');
    writeFileSync(path.join(d, '.svc_stdout'), 'from the file');
    const r = collectRun(d, launch({ exitCode: 4, framed: { stdout: Buffer.from('from frames'), stderr: Buffer.alloc(0) } }), baseObservation(0, { oomDetectable: true }), { maxStdoutBytes: 100, maxArtifactBytes: 100 });
    expect(r.report).toMatchObject({ exit_code: 4 });
    expect(r.stdout).toBe('from the file');
  });
});
