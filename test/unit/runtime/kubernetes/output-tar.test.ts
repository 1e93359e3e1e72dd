import { PassThrough, Readable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { defaultOutputLimits, normalizeEntryName, parseOutputTar, type OutputLimits } from '../../../../src/runtime/kubernetes/runs/output-tar.ts';
import { contentTypeFor, MAX_ARTIFACT_ENTRIES } from '../../../../src/runtime/run-output.ts';
import { makeTar, outputTar, type TarEntry } from '../../../support/fake-kube/tar.ts';

const limits: OutputLimits = { maxArtifactBytes: 1000, maxStdoutBytes: 10, maxTotalBytes: 100_000, maxEntries: 50 };
const parse = async (entries: TarEntry[] | Buffer, l: OutputLimits = limits) =>
  parseOutputTar(Readable.from([Buffer.isBuffer(entries) ? entries : await makeTar(entries)]), l);

describe('parseOutputTar', () => {
  it('sorts control files, result.json and artifacts', async () => {
    const out = await parse(
      await outputTar({
        phase: 'completed',
        stdout: 'out',
        stderr: 'err',
        report: { exit_code: 0, exception: null, execution_ms: 7 },
        result: '{"a": 1}',
        files: { 'a.txt': 'hello', 'dir/b.json': '{}' },
      }),
    );
    expect(out).toMatchObject({ stdout: 'out', stderr: 'err', resultJson: '{"a": 1}', report: { exit_code: 0, execution_ms: 7 }, truncated: false, rejected: [] });
    expect(out.artifacts.map((a) => [a.name, a.size, a.contentType, a.data?.toString()])).toEqual([
      ['a.txt', 5, 'text/plain; charset=utf-8', 'hello'],
      ['dir', 0, 'application/octet-stream', undefined],
    ]);
    expect(out.artifacts[1]!.skipped).toBe('not_regular');
    expect(out.artifacts[0]!.sha256).toBe('2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824');
    expect(out).toMatchObject({ artifactsTotal: 2, artifactsTruncated: false });
  });

  it('caps stdout/stderr at maxStdoutBytes and says so', async () => {
    const out = await parse(await outputTar({ stdout: 'x'.repeat(25), stderr: 'short' }));
    expect(out.stdout).toBe('x'.repeat(10));
    expect(out.stdoutTruncated).toBe(true);
    expect(out.stderrTruncated).toBe(false);
  });

  it('keeps metadata but not bytes of artifacts over maxArtifactBytes; flags a too-large result.json', async () => {
    const out = await parse(await outputTar({ result: '1'.repeat(2000), files: { 'big.bin': Buffer.alloc(5000, 1), 'ok.bin': Buffer.alloc(10) } }));
    expect(out.resultJson).toBeNull();
    expect(out.resultJsonTooLarge).toBe(true);
    const big = out.artifacts.find((a) => a.name === 'big.bin')!;
    expect(big).toMatchObject({ size: 5000, skipped: 'too_large' });
    expect(big.data).toBeUndefined();
    expect(big.sha256).toMatch(/^[0-9a-f]{64}$/);
    expect(out.artifacts.find((a) => a.name === 'ok.bin')!.data).toHaveLength(10);
  });

  it('stops at the total cap and reports truncation', async () => {
    const files = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`f${i}.bin`, Buffer.alloc(900, i)]));
    const out = await parse(await outputTar({ files }), { ...limits, maxTotalBytes: 5000 });
    expect(out.truncated).toBe(true);
    expect(out.artifacts.length).toBeLessThan(20);
    // Not every entry was seen: the count is what was, and the record says the list is incomplete.
    expect(out.artifactsTruncated).toBe(true);
    expect(out.artifactsTotal).toBeGreaterThanOrEqual(out.artifacts.length);
    expect(out.artifactsTotal).toBeLessThan(20);
  });

  it('stops at the entry cap', async () => {
    const files = Object.fromEntries(Array.from({ length: 30 }, (_, i) => [`f${i}.txt`, 'x']));
    const out = await parse(await outputTar({ files }), { ...limits, maxEntries: 10 });
    expect(out.truncated).toBe(true);
    expect(out.artifacts.length).toBeLessThanOrEqual(10);
    expect(out.artifactsTruncated).toBe(true);
    expect(out.artifactsTotal).toBeLessThanOrEqual(10);
  });

  describe('the artifact limit (issue 22): listed up to maxArtifacts, every entry counted', () => {
    const numbered = (n: number, width = 2) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`f${String(i).padStart(width, '0')}.txt`, `${i}`]));

    it('over the limit: the first by name are kept (as on the local runtime), the rest counted, result and streams still read', async () => {
      const out = await parse(await outputTar({ stdout: 'out', report: { exit_code: 0 }, result: '{"ok":1}', files: numbered(30) }), { ...limits, maxArtifacts: 10 });
      expect(out.artifacts.map((a) => a.name)).toEqual(Object.keys(numbered(10)));
      expect(out.artifacts.map((a) => a.data?.toString())).toEqual(Object.values(numbered(10)));
      expect(out).toMatchObject({ artifactsTotal: 30, artifactsTruncated: true, truncated: false, resultJson: '{"ok":1}', stdout: 'out', report: { exit_code: 0 } });
    });

    it('whatever order the archive lists them in, and a subdirectory takes one slot', async () => {
      const names = ['m.txt', 'b.txt', 'z.txt', 'a.txt', 'k.txt', 'c.txt'];
      const out = await parse([...names.map((n) => ({ name: `./${n}`, data: n })), { name: './d/', type: 'directory' }, { name: './d/x.txt', data: 'x' }], { ...limits, maxArtifacts: 4 });
      expect(out.artifacts.map((a) => a.name)).toEqual(['a.txt', 'b.txt', 'c.txt', 'd']);
      expect(out.artifacts.map((a) => a.data?.toString())).toEqual(['a.txt', 'b.txt', 'c.txt', undefined]);
      expect(out).toMatchObject({ artifactsTotal: 7, artifactsTruncated: true });
    });

    it('exactly at the limit: nothing flagged (control files and result.json take no slot)', async () => {
      const out = await parse(await outputTar({ phase: 'completed', stdout: 'x', report: {}, result: '1', files: numbered(10) }), { ...limits, maxArtifacts: 10 });
      expect(out.artifacts).toHaveLength(10);
      expect(out).toMatchObject({ artifactsTotal: 10, artifactsTruncated: false });
    });

    it('1,500 files through the real tar with the default limits: 1,000 listed, 1,500 counted', async () => {
      const out = await parse(await outputTar({ stdout: 'done', files: numbered(1500, 4) }), defaultOutputLimits(1000, 1000));
      expect(out.artifacts).toHaveLength(MAX_ARTIFACT_ENTRIES);
      expect(out.artifacts.at(-1)!.name).toBe(`f${String(MAX_ARTIFACT_ENTRIES - 1).padStart(4, '0')}.txt`);
      expect(out).toMatchObject({ artifactsTotal: 1500, artifactsTruncated: true, truncated: false, stdout: 'done' });
    });
  });

  it('refuses hostile names and never turns links or devices into data', async () => {
    const out = await parse([
      { name: './', type: 'directory' },
      { name: '../escape.txt', data: 'x' },
      { name: './../../etc/passwd', data: 'x' },
      { name: '/abs/path', data: 'x' },
      { name: './sub/../../up', data: 'x' },
      { name: './back\\slash', data: 'x' },
      { name: './ctl\u0001char', data: 'x' },
      { name: `./${'n'.repeat(300)}`, data: 'x' },
      { name: './link-to-secret', type: 'symlink', linkname: '/var/run/secrets/token' },
      { name: './hard', type: 'link', linkname: 'a.txt' },
      { name: './dev', type: 'character-device' },
      { name: './pipe', type: 'fifo' },
      { name: './.svc_stdout', type: 'symlink', linkname: '/etc/shadow' },
      { name: './a.txt', data: 'fine' },
    ]);
    expect(out.rejected.map((r) => r.reason)).toEqual(['unsafe_name', 'unsafe_name', 'unsafe_name', 'unsafe_name', 'unsafe_name', 'unsafe_name', 'name_too_long']);
    const byName = Object.fromEntries(out.artifacts.map((a) => [a.name, a]));
    for (const n of ['link-to-secret', 'hard', 'dev', 'pipe']) {
      expect(byName[n]).toMatchObject({ skipped: 'not_regular', size: 0 });
      expect(byName[n]!.data).toBeUndefined();
    }
    expect(out.stdout).toBe('');
    expect(byName['a.txt']!.data!.toString()).toBe('fine');
    expect(Object.keys(byName).sort()).toEqual(['a.txt', 'dev', 'hard', 'link-to-secret', 'pipe']);
  });

  it('marks reserved input artifact names, lists subdirectories as not kept, never keeps control files', async () => {
    const out = await parse(await outputTar({ phase: 'x', report: {}, files: { '_code.py': 'x', '_input.json': '{}', 'sub/_code.py': 'fine' } }));
    expect(out.artifacts.map((a) => [a.name, a.skipped ?? null])).toEqual([
      ['_code.py', 'reserved_name'],
      ['_input.json', 'reserved_name'],
      ['sub', 'not_regular'],
    ]);
  });

  it('a forged or oversized report is not trusted as an object', async () => {
    expect((await parse(await outputTar({ report: '[1,2]' }))).report).toBeNull();
    expect((await parse(await outputTar({ report: 'not json' }))).report).toBeNull();
    expect((await parse(await outputTar({ report: `{"x":"${'a'.repeat(70_000)}"}` }), { ...limits, maxTotalBytes: 1e6 })).report).toBeNull();
  });

  it('keeps the first of duplicate entries (tar appends; later ones cannot replace it)', async () => {
    const out = await parse([
      { name: './a.txt', data: 'first' },
      { name: './a.txt', data: 'second' },
    ]);
    expect(out.artifacts).toHaveLength(1);
    expect(out.artifacts[0]!.data!.toString()).toBe('first');
  });

  it('parses a stream delivered in tiny chunks', async () => {
    const tar = await outputTar({ stdout: 'chunky', files: { 'x.txt': 'y'.repeat(700) } });
    const pipe = new PassThrough();
    const parsing = parseOutputTar(pipe, limits);
    for (let i = 0; i < tar.length; i += 7) pipe.write(tar.subarray(i, i + 7));
    pipe.end();
    const out = await parsing;
    expect(out.stdout).toBe('chunky');
    expect(out.artifacts[0]!.size).toBe(700);
  });

  it('rejects a stream that is not a tar archive or ends mid-entry', async () => {
    await expect(parse(Buffer.from('this is not a tar archive'.repeat(40)))).rejects.toThrow();
    const tar = await outputTar({ files: { 'x.bin': Buffer.alloc(3000) } });
    await expect(parse(tar.subarray(0, 1200))).rejects.toThrow();
  });

  it('reads what GNU tar writes for long names (././@LongLink records) and lists artifacts by name', async () => {
    const long = `${'l'.repeat(180)}.txt`;
    const out = await parse(await outputTar({ stdout: 'ok', files: { [long]: 'long', 'b.txt': 'b', 'a.txt': 'a' } }));
    expect(out.artifacts.map((a) => a.name)).toEqual(['a.txt', 'b.txt', long]);
    expect(out.artifacts[2]!.data!.toString()).toBe('long');
    expect(out.rejected).toEqual([]);
  });

  it('an empty /output as tar archives it gives no artifacts and no streams', async () => {
    const out = await parse(await outputTar({}));
    expect(out.entries).toBe(1);
    expect(out).toMatchObject({ stdout: '', stderr: '', artifacts: [], truncated: false, report: null });
  });

  it('accepts an empty stream as an empty /output', async () => {
    const out = await parse(Buffer.alloc(0));
    expect(out.entries).toBe(0);
    expect(out.artifacts).toEqual([]);
  });
});

describe('entry names and types', () => {
  it('normalizes tar names', () => {
    expect(normalizeEntryName('./a/b.txt')).toBe('a/b.txt');
    expect(normalizeEntryName('./')).toBe('');
    expect(normalizeEntryName('./dir/')).toBe('dir');
    expect(normalizeEntryName('a//b')).toMatchObject({ reason: 'unsafe_name' });
  });

  it('guesses content types by extension', () => {
    expect(contentTypeFor('x.PNG')).toBe('image/png');
    expect(contentTypeFor('noext')).toBe('application/octet-stream');
  });
});
