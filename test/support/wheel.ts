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

/**
 * One source distribution to build: a pure-Python package whose in-tree PEP 517 backend (no
 * setuptools needed: `requires = []`) runs `buildHook` (Python source, indented by the helper) inside
 * `build_wheel` before it writes the wheel. The hook is how a test plays a hostile package: its code
 * runs inside the install sandbox, and an exception it raises ends up in pip's output.
 */
export interface SdistSpec extends WheelSpec {
  buildHook?: string;
}

const SDIST = String.raw`
import io, json, sys, tarfile, textwrap
spec = json.loads(sys.argv[1]); out = sys.argv[2]
name, ver = spec['name'], spec['version']
pkg = name.replace('-', '_')
base = '%s-%s' % (pkg, ver)
backend = '''import base64, hashlib, os, zipfile
NAME, VERSION, MODULES = %r, %r, %r

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
%s
    pkg = NAME.replace('-', '_')
    files = {pkg + '/' + k: v.encode() for k, v in MODULES.items()}
    dist = '%%s-%%s.dist-info' %% (pkg, VERSION)
    files[dist + '/METADATA'] = ('Metadata-Version: 2.1\\nName: %%s\\nVersion: %%s\\n' %% (NAME, VERSION)).encode()
    files[dist + '/WHEEL'] = b'Wheel-Version: 1.0\\nGenerator: sandpod-tests\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n'
    record = []
    for p, d in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()
        record.append('%%s,sha256=%%s,%%d' %% (p, h, len(d)))
    record.append(dist + '/RECORD,,')
    files[dist + '/RECORD'] = ('\\n'.join(record) + '\\n').encode()
    whl = '%%s-%%s-py3-none-any.whl' %% (pkg, VERSION)
    with zipfile.ZipFile(os.path.join(wheel_directory, whl), 'w') as z:
        for p, d in files.items():
            z.writestr(p, d)
    return whl
''' % (name, ver, spec['modules'], textwrap.indent(spec.get('hook') or 'pass', '    '))
files = {
    'pyproject.toml': '[build-system]\nrequires = []\nbuild-backend = "sandpod_test_backend"\nbackend-path = ["."]\n',
    'sandpod_test_backend.py': backend,
    'PKG-INFO': 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' % (name, ver),
}
path = '%s/%s.tar.gz' % (out, base)
with tarfile.open(path, 'w:gz') as t:
    for p, d in files.items():
        data = d.encode()
        info = tarfile.TarInfo('%s/%s' % (base, p))
        info.size = len(data)
        info.mode = 0o644
        t.addfile(info, io.BytesIO(data))
print(path)
`;

/** Writes one sdist per spec into `dir` (as {@link buildWheels} does for wheels) and returns the directory. */
export function buildSdists(specs: SdistSpec[], dir?: string, python = '/usr/bin/python3'): string {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  const out = dir ?? mkdtempSync(path.join('/tmp/sandpod-test', 'sdists-'));
  mkdirSync(out, { recursive: true });
  chmodSync(out, 0o755);
  for (const s of specs) {
    const full = { name: s.name, version: s.version ?? '1.0.0', modules: s.modules ?? { '__init__.py': `VALUE = ${JSON.stringify(`${s.name}-${s.version ?? '1.0.0'}`)}\n` }, hook: s.buildHook ?? null };
    execFileSync(python, ['-I', '-c', SDIST, JSON.stringify(full), out], { stdio: ['ignore', 'pipe', 'inherit'] });
  }
  return out;
}
