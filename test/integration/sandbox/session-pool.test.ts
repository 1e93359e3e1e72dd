/**
 * Sessions from the warm pool on the local runtime (issue 19: "a sandbox, from the warm pool when one
 * is ready, becomes this session's"), on each real engine, nothing mocked: a session opened while one
 * is ready gets it (`warm`, and it is the sandbox that was waiting: its directory existed before the
 * open), keeps state across cells and moves files; two concurrent opens get different sandboxes; the
 * pool refills after a take and counts hits and misses; the escape probe (read-only /code and /input,
 * uid 1000, the type's limits on the host's cgroup and inside, no network for a `none` type) runs in a
 * cell of a pool-taken session; an allowed_hosts type's pooled session keeps its network rules; a
 * ready one that dies while it waits is replaced; stop destroys the ready ones.
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../../src/config.ts';
import { FileJobTypeRegistry } from '../../../src/jobtypes/job-type.ts';
import { createLocalRuntime, type LocalRuntime } from '../../../src/runtime/local/index.ts';
import { runLimits } from '../../../src/runtime/local/runs/steps.ts';
import { instanceRoot } from '../../../src/runtime/local/workspace.ts';
import type { CellSpec, SessionSandbox } from '../../../src/runtime/session.ts';
import { hostWorkspaceFiles } from '../../../src/sessions/files.ts';
import { describeEachEngine } from '../../support/engines.ts';

const asRoot = process.getuid?.() === 0;

const PROBE = String.raw`
import json, os, resource, socket, sys
r = {"uid": os.getuid(), "cwd": os.getcwd()}
def attempt(name, f):
    try:
        f()
        r[name] = "allowed"
    except OSError as e:
        r[name] = "refused"
for p in os.listdir("/code"):
    attempt("code w " + p, lambda p=p: open("/code/" + p, "r+").close())
attempt("code create", lambda: open("/code/new.py", "w").close())
attempt("input w", lambda: open("/input/data.json", "w").close())
attempt("input create", lambda: open("/input/x", "w").close())
for d in ["/", "/etc", "/usr", "/code", "/input"]:
    attempt("write " + d, lambda d=d: open(os.path.join(d, "sp-escape"), "w").close())
attempt("write /tmp", lambda: open("/tmp/sp-escape", "w").close())
attempt("write /workspace", lambda: open("/workspace/sp-escape", "w").close())
def big():
    with open("/workspace/big", "wb") as f:
        f.write(b"x" * (2 * 1024 * 1024))
attempt("over max_file_size", big)
def direct():
    s = socket.create_connection(("127.0.0.1", PORT), timeout=3)
    s.close()
attempt("connect host", direct)
r["fsize"] = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
r["input n"] = json.load(open("/input/data.json"))["n"]
print(json.dumps(r))
`;

/** The host's cgroup limits of a sandbox (v1 or v2), by its id. */
function cgroupLimits(instance: string, id: string): { memory: number; pids: number } {
  const v2 = `/sys/fs/cgroup/sandpod/${instance}/${id}`;
  if (existsSync(path.join(v2, 'memory.max'))) return { memory: Number(readFileSync(path.join(v2, 'memory.max'), 'utf8')), pids: Number(readFileSync(path.join(v2, 'pids.max'), 'utf8')) };
  const mem = readFileSync(`/sys/fs/cgroup/memory/sandpod/${instance}/${id}/memory.limit_in_bytes`, 'utf8');
  const pids = readFileSync(`/sys/fs/cgroup/pids/sandpod/${instance}/${id}/pids.max`, 'utf8');
  return { memory: Number(mem), pids: Number(pids) };
}

/** The processes in a sandbox's cgroup (v1 or v2). */
function cgroupPids(instance: string, id: string): number[] {
  for (const f of [`/sys/fs/cgroup/sandpod/${instance}/${id}/cgroup.procs`, `/sys/fs/cgroup/pids/sandpod/${instance}/${id}/cgroup.procs`]) {
    if (existsSync(f)) return readFileSync(f, 'utf8').split('\n').filter(Boolean).map(Number);
  }
  return [];
}

/** A process that exists and is not a zombie (ended, its parent not having waited for it yet). */
const alive = (pid: number): string | null => {
  try {
    const state = /^State:\s+(\S)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? '?';
    return state === 'Z' ? null : `${pid} ${state} ${readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ')}`;
  } catch {
    return null;
  }
};

async function until<T>(what: string, f: () => T | null | undefined | false, ms = 90_000, detail: () => unknown = () => ''): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = f();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what} ${JSON.stringify(detail())}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describeEachEngine('sessions from the warm pool', (engine) => {
  let rt: LocalRuntime;
  let config: Config;
  let runsDir: string;
  let instance: string;
  let site: http.Server;
  let sitePort: number;
  let trap: net.Server;
  let trapPort: number;
  let trapConnections = 0;
  const open: SessionSandbox[] = [];

  beforeAll(async () => {
    site = http.createServer((_req, res) => res.end('site-a'));
    await new Promise<void>((r) => site.listen(0, '127.0.0.1', r));
    sitePort = (site.address() as AddressInfo).port;
    trap = net.createServer((c) => {
      trapConnections++;
      c.destroy();
    });
    await new Promise<void>((r) => trap.listen(0, '127.0.0.1', r));
    trapPort = (trap.address() as AddressInfo).port;
    const workspace = mkdtempSync(path.join('/tmp', 'sandpod-sess-pool-'));
    config = parseConfig(
      {
        workspace,
        sandbox_engine: engine,
        warm_pool: { sizes: {}, session_sizes: { default: 1, probe: 1, 'to-a': 1 } },
        job_types: [
          { name: 'probe', memory_limit: '256m', max_processes: 32, max_file_size: '1m' },
          { name: 'to-a', network: { mode: 'bridge', allowed_hosts: [`127.0.0.1:${sitePort}`] } },
        ],
      },
      {},
    );
    ({ instance } = instanceRoot(config));
    runsDir = path.join(instanceRoot(config).root, 'runs');
    rt = createLocalRuntime(config);
    await rt.start();
  }, 120_000);
  afterAll(async () => {
    for (const s of open) await s.destroy().catch(() => {});
    await rt?.stop();
    await new Promise((r) => site?.close(r));
    await new Promise((r) => trap?.close(r));
  });

  const jt = (name: string) => new FileJobTypeRegistry(config).get(name)!;
  const stat = (name: string) => rt.sessionPoolStats().find((s) => s.job_type === name);
  const wait = <T>(what: string, f: () => T | null | undefined | false) => until(what, f, 90_000, () => ({ pool: rt.sessionPoolStats(), dirs: [...sessionDirs()] }));
  const sessionDirs = () => new Set(readdirSync(runsDir).filter((d) => d.startsWith('sp-s-')));
  const openSession = async (name: string) => {
    const s = await rt.openSession!(jt(name), { maxStreamBytes: config.max_stdout_bytes, startupMs: 60_000 });
    open.push(s);
    return s;
  };
  let n = 0;
  const cell = (s: SessionSandbox, code: string, over: Partial<CellSpec> = {}) =>
    s.runCell({ cell: ++n, code, inputJson: '{"n": 3}', timeoutSec: 30, maxStdoutBytes: 32768, maxArtifactBytes: 1 << 20, ...over });

  it.skipIf(!asRoot)('a session opened while one is ready gets it: warm, the waiting sandbox, state and files work; the pool refills', async () => {
    await wait('a ready default session sandbox', () => (stat('default')?.ready ?? 0) >= 1);
    const before = stat('default')!;
    expect(before.target).toBe(1);
    // The pool's sandbox is the only session sandbox on the host now (the others are starting or of other types).
    const waiting = sessionDirs();
    const s = await openSession('default');
    expect(s.warm).toBe(true);
    const dir = path.basename(path.dirname(s.workspaceDir!));
    expect(waiting.has(dir), 'the session got a sandbox that was there before it opened').toBe(true);
    expect(stat('default')).toMatchObject({ hits: before.hits + 1, misses: before.misses });
    // State across cells, and the files API on its /workspace both ways.
    const files = hostWorkspaceFiles(s.workspaceDir!);
    await files.write('in.csv', Buffer.from('1,2,3\n'), 1 << 20);
    const a = await cell(s, 'rows = [int(x) for x in open("in.csv").read().split(",")]\nopen("made.txt", "w").write(str(sum(rows)))\nprint(len(rows))');
    expect(a.stdout).toBe('3\n');
    expect((await cell(s, 'print(sum(rows) * 2)')).stdout).toBe('12\n');
    expect((await files.read('made.txt', 1 << 20, true)).data!.toString()).toBe('6');
    expect((await files.list()).map((f) => f.name).sort()).toEqual(['in.csv', 'made.txt']);
    // The pool starts a replacement: another sandbox, not the taken one.
    await wait('the pool refilled', () => (stat('default')?.ready ?? 0) >= 1);
    const after = sessionDirs();
    expect([...after].filter((d) => !waiting.has(d)).length).toBeGreaterThanOrEqual(1);
  }, 180_000);

  it.skipIf(!asRoot)('two concurrent opens get different sandboxes: one from the pool, one started for it', async () => {
    await wait('a ready default session sandbox', () => (stat('default')?.ready ?? 0) >= 1 && stat('default')!.starting === 0);
    const before = stat('default')!;
    const timed = async () => {
      const t0 = Date.now();
      const s = await openSession('default');
      return { s, ms: Date.now() - t0 };
    };
    const [o1, o2] = await Promise.all([timed(), timed()]);
    const [s1, s2] = [o1.s, o2.s];
    const [warmMs, coldMs] = s1.warm ? [o1.ms, o2.ms] : [o2.ms, o1.ms];
    console.log(`${engine}: session open from the pool ${warmMs} ms, started for it ${coldMs} ms`);
    expect(s1.workspaceDir).not.toBe(s2.workspaceDir);
    expect([s1.warm, s2.warm].sort()).toEqual([false, true]);
    expect(stat('default')).toMatchObject({ hits: before.hits + 1, misses: before.misses + 1 });
    await cell(s1, 'mine = 1\nopen("/workspace/only-1", "w").write("1")');
    const seen = await cell(s2, 'import os\nprint("mine" in globals(), os.path.exists("/workspace/only-1"))');
    expect(seen.stdout).toBe('False False\n');
  }, 240_000);

  it.skipIf(!asRoot)('the escape probe in a cell of a pool-taken session: read-only /code and /input, uid 1000, the limits, no network', async () => {
    await wait('a ready probe session sandbox', () => (stat('probe')?.ready ?? 0) >= 1);
    const s = await openSession('probe');
    expect(s.warm).toBe(true);
    const id = path.basename(path.dirname(s.workspaceDir!));
    const mem = 256 * 1024 * 1024;
    expect(cgroupLimits(instance, id)).toEqual({ memory: mem, pids: runLimits(engine, jt('probe'), mem, false).pids });
    const r = await cell(s, PROBE.replace('PORT', String(trapPort)));
    expect(r.observation.exitCode, r.stderr).toBe(0);
    const p = JSON.parse(r.stdout.trim().split('\n').pop()!) as Record<string, unknown>;
    for (const [k, val] of Object.entries(p)) if (k.startsWith('code w ') || (k.startsWith('write /') && !['write /tmp', 'write /workspace'].includes(k))) expect(val, k).toBe('refused');
    expect(p).toMatchObject({
      uid: 1000,
      cwd: '/workspace',
      'code create': 'refused',
      'input w': 'refused',
      'input create': 'refused',
      'write /tmp': 'allowed',
      'write /workspace': 'allowed',
      'over max_file_size': 'refused',
      'connect host': 'refused',
      fsize: 1024 * 1024,
      'input n': 3,
    });
    expect(trapConnections).toBe(0);
  }, 180_000);

  it.skipIf(!asRoot)("an allowed_hosts type's pooled session reaches exactly its hosts, through the sandbox's own proxy", async () => {
    await wait('a ready to-a session sandbox', () => (stat('to-a')?.ready ?? 0) >= 1);
    const s = await openSession('to-a');
    expect(s.warm).toBe(true);
    const code = [
      'import urllib.request, urllib.error, socket',
      `print(urllib.request.urlopen("http://127.0.0.1:${sitePort}/", timeout=10).read().decode())`,
      'try:',
      `    urllib.request.urlopen("http://127.0.0.1:${trapPort}/", timeout=10)`,
      'except urllib.error.HTTPError as e:',
      '    print(e.code)',
      'try:',
      `    socket.create_connection(("127.0.0.1", ${trapPort}), timeout=3); print("direct connected")`,
      'except OSError:',
      '    print("direct refused")',
    ].join('\n');
    const r = await cell(s, code);
    expect(r.stdout, r.stderr).toBe('site-a\n403\ndirect refused\n');
    expect(trapConnections).toBe(0);
  }, 180_000);

  it.skipIf(!asRoot)('a ready sandbox that dies while it waits is dropped and replaced; stop destroys the ready ones', async () => {
    // Every type's sandbox ready and none starting: only waiting ones are killed.
    await wait('every type ready, none starting', () => ['default', 'probe', 'to-a'].every((t) => stat(t)?.ready === 1 && stat(t)?.starting === 0));
    const taken = new Set(open.map((s) => path.basename(path.dirname(s.workspaceDir!))));
    const pooled = [...sessionDirs()].filter((d) => !taken.has(d));
    // Kill the processes of the waiting default sandbox (the only pooled one of that type).
    const victims = pooled.map((d) => ({ d, pids: cgroupPids(instance, d) })).filter((v) => v.pids.length > 0);
    expect(victims.length).toBeGreaterThanOrEqual(1);
    const before = sessionDirs();
    // One killed may take others of its cgroup with it before their turn: a pid already gone is fine.
    const kill = (pid: number) => {
      try {
        process.kill(pid, 'SIGKILL');
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
      }
    };
    for (const v of victims) for (const pid of v.pids) kill(pid);
    await wait('the dead ones dropped', () => victims.every((v) => !existsSync(path.join(runsDir, v.d))));
    await wait('replacements ready', () => (stat('default')?.ready ?? 0) >= 1);
    const fresh = [...sessionDirs()].filter((d) => !before.has(d) && !taken.has(d));
    expect(fresh.length).toBeGreaterThanOrEqual(1);
    // Stop: every ready sandbox's processes end and its directory goes.
    const ready = [...sessionDirs()].filter((d) => !taken.has(d));
    const pids = ready.flatMap((d) => cgroupPids(instance, d));
    expect(pids.length).toBeGreaterThan(0);
    for (const s of open.splice(0)) await s.destroy();
    await rt.stop();
    expect(pids.map(alive).filter(Boolean)).toEqual([]);
    expect(rt.sessionPoolStats()).toEqual([]);
  }, 240_000);
});
