import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { parseOutputTar } from '../../../src/runtime/kubernetes/runs/output-tar.ts';
import { collectOutputs, readReport, readStream } from '../../../src/runtime/local/runs/collect.ts';
import { baseObservation, contentTypeFor, decodeText, emptyRun, parseRunnerReport, REPORT_FILE, STDOUT_FILE } from '../../../src/runtime/run-output.ts';
import { makeTar } from '../../support/fake-kube/tar.ts';

/** Name → the Content-Type both runtimes must give it. */
const EXPECTED: Record<string, string> = {
  'table.csv': 'text/csv; charset=utf-8',
  'data.json': 'application/json',
  'plot.png': 'image/png',
  'PLOT.PNG': 'image/png',
  'frame.parquet': 'application/vnd.apache.parquet',
  'notes.txt': 'text/plain; charset=utf-8',
  'script.py': 'text/x-python; charset=utf-8',
  'rows.jsonl': 'application/x-ndjson',
  'page.html': 'text/html; charset=utf-8',
  'noext': 'application/octet-stream',
  'weird.unknownext': 'application/octet-stream',
  // A dotfile has no extension; nor does a bare extension-like name.
  '.csv': 'application/octet-stream',
  'json': 'application/octet-stream',
};

function outDir(): string {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  return mkdtempSync(path.join('/tmp/sandpod-test', 'run-output-'));
}

describe('contentTypeFor', () => {
  it.each(Object.entries(EXPECTED))('%s → %s', (name, type) => {
    expect(contentTypeFor(name)).toBe(type);
  });

  it('gives the same Content-Type for the same file through the local and the Kubernetes collection', async () => {
    const names = Object.keys(EXPECTED);
    const dir = outDir();
    for (const n of names) writeFileSync(path.join(dir, n), 'x');
    const local = collectOutputs(dir, 1000).artifacts;
    const tar = await parseOutputTar(Readable.from([await makeTar(names.map((n) => ({ name: `./${n}`, data: 'x' })))]), {
      maxArtifactBytes: 1000,
      maxStdoutBytes: 1000,
      maxTotalBytes: 100_000,
      maxEntries: 100,
    });
    const types = (files: { name: string; contentType: string }[]) => Object.fromEntries(files.map((f) => [f.name, f.contentType]));
    expect(types(local)).toEqual(EXPECTED);
    expect(types(tar.artifacts)).toEqual(EXPECTED);
  });
});

describe('parseRunnerReport (untrusted input)', () => {
  it('keeps the known fields of a well-formed report', () => {
    const r = { phase: 'failed', exit_code: 1, signal: null, exception: 'ValueError', exception_mro: ['ValueError', 'Exception'], execution_ms: 12.5, timed_out: false };
    expect(parseRunnerReport(JSON.stringify(r))).toEqual(r);
  });

  it('drops unknown and ill-typed fields one by one, keeping the rest', () => {
    const forged = { exit_code: 0, signal: 'KILL', exception: 42, exception_mro: ['A', 1], timed_out: 'yes', max_rss_kb: 1e400, admin: true };
    expect(parseRunnerReport(JSON.stringify(forged).replace('"max_rss_kb":null', '"max_rss_kb":1e400'))).toEqual({ exit_code: 0 });
  });

  it('is null for anything but a JSON object, and for an oversized report', () => {
    for (const bad of ['[1]', '"x"', 'null', '{', '']) expect(parseRunnerReport(bad)).toBeNull();
    expect(parseRunnerReport(JSON.stringify({ exit_code: 0, pad: 'x'.repeat(70_000) }))).toBeNull();
  });

  it('is the parser of both runtimes', async () => {
    const forged = JSON.stringify({ exit_code: 3, exception: ['not', 'a', 'string'] });
    const dir = outDir();
    writeFileSync(path.join(dir, REPORT_FILE), forged);
    const tar = await parseOutputTar(Readable.from([await makeTar([{ name: `./${REPORT_FILE}`, data: forged }])]), {
      maxArtifactBytes: 1000,
      maxStdoutBytes: 1000,
      maxTotalBytes: 100_000,
      maxEntries: 100,
    });
    expect(readReport(dir)).toEqual({ exit_code: 3 });
    expect(tar.report).toEqual({ exit_code: 3 });
  });
});

describe('baseObservation and emptyRun', () => {
  it('is a run that has not started anything, at the given time', () => {
    const obs = baseObservation(1_700_000_000_000, { cancelled: true });
    expect(obs).toMatchObject({ exitCode: null, timedOut: null, oomKilled: false, cancelled: true, phase: 'startup', totalMs: 0 });
    expect(obs.startedAt.getTime()).toBe(1_700_000_000_000);
    expect(emptyRun(obs)).toEqual({ observation: obs, report: null, stdout: '', stderr: '', stdoutTruncated: false, stderrTruncated: false, resultJson: null, artifacts: [] });
  });
});

describe('decodeText: one rule for printed text on both runtimes', () => {
  // BOM, NUL, an invalid byte, a truncated sequence, an overlong encoding, a lone surrogate's bytes.
  const bytes = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('a\u0000b'), Buffer.from([0xff, 0x7c, 0xe2, 0x82, 0x7c, 0xc0, 0xaf, 0x7c, 0xed, 0xa0, 0x80])]);
  const expected = '\ufeffa\u0000b\ufffd|\ufffd|\ufffd\ufffd|\ufffd\ufffd\ufffd';

  it('keeps a leading BOM and NUL, and turns each invalid sequence into U+FFFD', () => {
    expect(decodeText(bytes)).toBe(expected);
  });

  it('gives the same stdout through the local collector and the Kubernetes archive', async () => {
    const dir = outDir();
    writeFileSync(path.join(dir, STDOUT_FILE), bytes);
    expect(readStream(dir, STDOUT_FILE, 1000).text).toBe(expected);
    const tar = await parseOutputTar(Readable.from([await makeTar([{ name: `./${STDOUT_FILE}`, data: bytes }])]), {
      maxArtifactBytes: 1000,
      maxStdoutBytes: 1000,
      maxTotalBytes: 100_000,
      maxEntries: 100,
    });
    expect(tar.stdout).toBe(expected);
  });
});
