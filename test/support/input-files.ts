/**
 * Files for one-shot runs (issue 19), the same check on every runtime (the local engines in
 * test/integration/api/input-files.test.ts, a real cluster in test/e2e/agents.test.ts): a run given
 * `input_files` sees each under /input/files/ with its exact bytes (binary, a non-ASCII name) and
 * cannot write there, replace or remove one; the record lists them in `input_artifacts` with size,
 * sha256 and path, and each downloads as the run's artifact.
 */
import { createHash } from 'node:crypto';
import { expect } from 'vitest';

export const b64 = (s: string | Buffer) => Buffer.from(s).toString('base64');
export const sha = (s: string | Buffer) => createHash('sha256').update(s).digest('hex');

/** Lists /input/files, reads each file, and tries to write there and to replace and remove a file. */
export const INPUT_FILES_PROBE = `
import json, os, hashlib
d = '/input/files'
files = {n: hashlib.sha256(open(os.path.join(d, n), 'rb').read()).hexdigest() for n in sorted(os.listdir(d))}
def attempt(f):
    try:
        f()
        return 'written'
    except OSError as e:
        return type(e).__name__
write_new = attempt(lambda: open(os.path.join(d, 'new.txt'), 'w').write('x'))
overwrite = attempt(lambda: open(os.path.join(d, 'a.txt'), 'w').write('x'))
remove = attempt(lambda: os.remove(os.path.join(d, 'a.txt')))
json.dump({'files': files, 'write_new': write_new, 'overwrite': overwrite, 'remove': remove, 'a': open(os.path.join(d, 'a.txt')).read()}, open('/output/result.json', 'w'))
`;

export const BINARY = Buffer.from([0, 1, 2, 255, 254, 10, 13]);

/** The `POST /execute` body of the probe with three files. */
export const INPUT_FILES_REQUEST = { code: INPUT_FILES_PROBE, input_files: { 'a.txt': b64('hello'), 'bin.dat': b64(BINARY), 'ünï côdé.csv': b64('x,y\n') } };

type J = Record<string, any>;

/** Checks the answer of {@link INPUT_FILES_REQUEST}, its full record, and the download of `bin.dat` (its bytes). */
export function expectInputFilesSeen(body: J, record: J, binDownload: Buffer): void {
  expect(body.success, body.stderr).toBe(true);
  expect(body.output.files).toEqual({ 'a.txt': sha('hello'), 'bin.dat': sha(BINARY), 'ünï côdé.csv': sha('x,y\n') });
  expect(body.output.a).toBe('hello');
  for (const k of ['write_new', 'overwrite', 'remove']) expect(body.output[k], k).not.toBe('written');
  expect(record.input_artifacts.map((a: J) => a.name)).toEqual(['_code.py', '_input.json', 'a.txt', 'bin.dat', 'ünï côdé.csv']);
  expect(record.input_artifacts[3]).toEqual({ name: 'bin.dat', size_bytes: BINARY.length, sha256: sha(BINARY), content_type: 'application/octet-stream', path: '/input/files/bin.dat' });
  expect(record.input_artifacts[2]).toMatchObject({ name: 'a.txt', size_bytes: 5, sha256: sha('hello'), path: '/input/files/a.txt' });
  expect(binDownload).toEqual(BINARY);
}
