/**
 * Builds tiny pure-Python wheels for tests, with Python's standard library only (zipfile), so tests
 * can install requirements with `pip --no-index --find-links DIR` on a machine without PyPI.
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync } from 'node:fs';
import path from 'node:path';

/** One package to put in a wheel: `modules` maps file names inside the package to their source. */
export interface WheelSpec {
  name: string;
  version?: string;
  modules?: Record<string, string>;
}

const BUILD = String.raw`
import base64, hashlib, json, sys, zipfile
spec = json.loads(sys.argv[1]); out = sys.argv[2]
name, ver = spec['name'], spec['version']
pkg = name.replace('-', '_')
files = {pkg + '/' + k: v.encode() for k, v in spec['modules'].items()}
dist = '%s-%s.dist-info' % (pkg, ver)
files[dist + '/METADATA'] = ('Metadata-Version: 2.1\nName: %s\nVersion: %s\n' % (name, ver)).encode()
files[dist + '/WHEEL'] = b'Wheel-Version: 1.0\nGenerator: sandpod-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n'
record = []
for p, d in files.items():
    h = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()
    record.append('%s,sha256=%s,%d' % (p, h, len(d)))
record.append(dist + '/RECORD,,')
files[dist + '/RECORD'] = ('\n'.join(record) + '\n').encode()
path = '%s/%s-%s-py3-none-any.whl' % (out, pkg, ver)
with zipfile.ZipFile(path, 'w') as z:
    for p, d in files.items():
        z.writestr(p, d)
print(path)
`;

/**
 * Writes one wheel per spec into `dir` (a new temporary directory under /tmp/sandpod-test when not
 * given, readable by the sandbox user) and returns the directory.
 */
export function buildWheels(specs: WheelSpec[], dir?: string, python = '/usr/bin/python3'): string {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  const out = dir ?? mkdtempSync(path.join('/tmp/sandpod-test', 'wheels-'));
  mkdirSync(out, { recursive: true });
  chmodSync(out, 0o755);
  for (const s of specs) {
    const full = { name: s.name, version: s.version ?? '1.0.0', modules: s.modules ?? { '__init__.py': `VALUE = ${JSON.stringify(`${s.name}-${s.version ?? '1.0.0'}`)}\n` } };
    execFileSync(python, ['-I', '-c', BUILD, JSON.stringify(full), out], { stdio: ['ignore', 'pipe', 'inherit'] });
  }
  return out;
}
