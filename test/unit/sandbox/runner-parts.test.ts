/**
 * The runner is kept as parts (src/sandbox/runner/NN-*.py) and joined in name order into the one
 * file every sandbox gets: the join, the materialized file and the written copy must be that text.
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { RUNNER_PATH, runnerText, writeRunner } from '../../../src/sandbox/paths.ts';
import { materializeParts } from '../../../src/util/python-parts.ts';

const PARTS = path.resolve(import.meta.dirname, '../../../src/sandbox/runner');

describe('the runner from its parts', () => {
  it('joins every NN-name.py part in name order, and nothing else', () => {
    const names = readdirSync(PARTS).filter((f) => f.endsWith('.py')).sort();
    expect(names.length).toBeGreaterThan(1);
    expect(names.every((f) => /^\d\d-[\w-]+\.py$/.test(f))).toBe(true);
    const text = runnerText();
    expect(text).toBe(names.map((f) => readFileSync(path.join(PARTS, f), 'utf8')).join(''));
    expect(text.startsWith('#!/usr/bin/env python3\n')).toBe(true);
    expect(text.trimEnd().endsWith("main()")).toBe(true);
  });

  it('RUNNER_PATH and writeRunner hold exactly the joined text', () => {
    expect(readFileSync(RUNNER_PATH, 'utf8')).toBe(runnerText());
    const out = path.join(mkdtempSync(path.join(tmpdir(), 'runner-parts-')), 'sub', 'runner.py');
    writeRunner(out);
    expect(readFileSync(out, 'utf8')).toBe(runnerText());
  });

  it('the joined file is one valid Python program (no part ends mid-statement)', () => {
    const r = spawnSync('python3', ['-c', 'import ast,sys; ast.parse(open(sys.argv[1]).read())', RUNNER_PATH], { encoding: 'utf8' });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
  });

  it('each part parses alone too, so a part is a whole concern (no statement split across files)', () => {
    for (const f of readdirSync(PARTS).filter((x) => x.endsWith('.py'))) {
      const r = spawnSync('python3', ['-c', 'import ast,sys; ast.parse(open(sys.argv[1]).read())', path.join(PARTS, f)], { encoding: 'utf8' });
      expect(r.status, `${f}: ${r.stderr}`).toBe(0);
    }
  });
});

describe('the joined file in the shared temp directory', () => {
  it('is not taken from a directory someone else can write, nor when its text differs', () => {
    const root = mkdtempSync(path.join(tmpdir(), 'parts-'));
    const parts = path.join(root, 'p');
    mkdirSync(parts);
    writeFileSync(path.join(parts, '00-a.py'), 'print("a")\n');
    const p = { partsDir: parts, built: path.join(root, 'built.py'), name: `t${process.pid}x${Date.now()}` };
    const first = materializeParts(p);
    expect(readFileSync(first, 'utf8')).toBe('print("a")\n');
    // A tampered file of the same name is replaced with the real text.
    writeFileSync(first, 'print("evil")\n');
    expect(readFileSync(materializeParts(p), 'utf8')).toBe('print("a")\n');
    // A directory writable by others is not used at all.
    chmodSync(path.dirname(first), 0o777);
    const second = materializeParts(p);
    expect(path.dirname(second)).not.toBe(path.dirname(first));
    expect(readFileSync(second, 'utf8')).toBe('print("a")\n');
  });
});
