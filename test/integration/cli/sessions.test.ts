/**
 * Sessions from the typed client (`client.sessions`) and from the `sandpod` command as a real
 * subprocess, against a real listening service (real database and sandbox): state kept across cells,
 * files in and out, the event stream, listing and closing; the CLI's exit codes, `--json`, and
 * one-line errors.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { createSandpodClient, SandpodError, type SessionEvent } from '../../../src/client/index.ts';
import { useServedService } from '../../support/service.ts';

const BIN = path.resolve('src/cli/sandpod.js');
const dir = mkdtempSync(path.join(tmpdir(), 'sandpod-sess-cli-'));
const asRoot = process.getuid?.() === 0;

function sandpod(url: string, args: string[], stdin?: string, onStdout?: (all: string) => void): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args], { cwd: dir, env: { ...process.env, SANDPOD_URL: url, SANDPOD_TOKEN: undefined, NO_COLOR: '1' }, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      stdout += d;
      onStdout?.(stdout);
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
    child.stdin.end(stdin ?? '');
  });
}

const file = (name: string, text: string) => {
  const p = path.join(dir, name);
  writeFileSync(p, text);
  return p;
};

describe.skipIf(!asRoot)('sessions from the client and the CLI', () => {
  const served = useServedService({ max_sessions: 4, warm_pool: { sizes: {} } });

  it('client: create, files in, cells with state, events, files out, get, list, close', async () => {
    const client = createSandpodClient({ baseUrl: served.url });
    const s = await client.sessions.create({ idle_timeout: 120 });
    expect(s).toMatchObject({ status: 'ready', cells: 0, idle_timeout: 120 });
    const put = await client.sessions.putFile(s.session_id, 'data.csv', 'a,b\n1,2\n3,4\n');
    expect(put).toMatchObject({ name: 'data.csv', size_bytes: 12, created: true });
    expect((await client.sessions.putFile(s.session_id, 'data.csv', new TextEncoder().encode('a,b\n5,6\n'))).created).toBe(false);
    const c1 = await client.sessions.execute(s.session_id, { code: 'rows = open("data.csv").read().split()[1:]\nprint(len(rows))' });
    expect(c1).toMatchObject({ success: true, cell: 1, stdout: '1\n' });
    const c2 = await client.sessions.execute(s.session_id, { code: 'open("out.txt", "w").write(rows[0] + str(n))', input_data: { n: 1 } });
    const c3 = await client.sessions.execute(s.session_id, { code: 'import json\nn = json.load(open("/input/data.json"))["n"]\nopen("out.txt", "w").write(rows[0] + str(n))', input_data: { n: 7 } });
    expect(c3).toMatchObject({ success: true, cell: 3 });
    expect(c2).toMatchObject({ success: false, cell: 2, error: { type: 'name_error' } });
    expect(new TextDecoder().decode(await client.sessions.getFile(s.session_id, 'out.txt'))).toBe('5,67');
    expect((await client.sessions.listFiles(s.session_id)).map((f) => f.name).sort()).toEqual(['data.csv', 'out.txt']);
    await client.sessions.deleteFile(s.session_id, 'out.txt');
    await expect(client.sessions.getFile(s.session_id, 'out.txt')).rejects.toMatchObject({ status: 404 });
    await expect(client.sessions.putFile(s.session_id, '..', 'x')).rejects.toBeInstanceOf(SandpodError);
    expect(await client.sessions.get(s.session_id)).toMatchObject({ status: 'ready', cells: 3 });
    expect((await client.sessions.list({ status: 'ready' })).items.map((x) => x.session_id)).toContain(s.session_id);
    const closed = await client.sessions.close(s.session_id);
    expect(closed).toMatchObject({ status: 'ended', end_reason: 'closed' });
    const seen: SessionEvent[] = [];
    for await (const e of client.sessions.events(s.session_id)) seen.push(e);
    expect(seen.filter((e) => e.event === 'cell').map((e) => e.data.cell)).toEqual([1, 2, 3]);
    const ends = seen.filter((e): e is Extract<SessionEvent, { event: 'cell_end' }> => e.event === 'cell_end');
    expect(ends.map((e) => [e.data.cell, e.data.status])).toEqual([
      [1, 'succeeded'],
      [2, 'failed'],
      [3, 'succeeded'],
    ]);
    expect(seen.at(-1)).toMatchObject({ event: 'end', data: { end_reason: 'closed' } });
    await expect(client.sessions.execute(s.session_id, { code: 'print(1)' })).rejects.toMatchObject({ status: 409 });
    await expect(client.sessions.get('no-such-session')).rejects.toMatchObject({ status: 404, code: 'not_found' });
  }, 120_000);

  it('CLI: session new, put, exec (and sandpod exec), get, ls, rm; exit codes and --json', async () => {
    const url = served.url;
    const created = await sandpod(url, ['session', 'new', '--idle-timeout', '120']);
    expect(created.code, created.stderr).toBe(0);
    const id = created.stdout.trim();
    expect(id).toMatch(/^[0-9a-f-]{36}$/);
    const put = await sandpod(url, ['session', 'put', id, file('local-input.txt', 'hello'), 'in.txt']);
    expect(put.code, put.stderr).toBe(0);
    expect(put.stdout).toMatch(/^in\.txt 5 B sha256:[0-9a-f]{64}\n$/);
    const one = await sandpod(url, ['session', 'exec', id, file('one.py', 'import sys\nword = open("in.txt").read()\nprint(word)\nprint("note", file=sys.stderr)')]);
    expect(one).toMatchObject({ code: 0, stdout: 'hello\n' });
    expect(one.stderr).toContain('note\n');
    // `sandpod exec ID FILE` is the same; the cell sees the earlier cell's variable; stdin works as FILE.
    const two = await sandpod(url, ['exec', id, '-'], 'open("upper.txt", "w").write(word.upper())\nraise SystemExit(3)');
    expect(two.code).toBe(3);
    const json = await sandpod(url, ['--json', 'exec', id, file('three.py', 'import json\nprint(json.load(open("/input/data.json"))["k"])'), '--input', '{"k": "v"}']);
    expect(json.code, json.stderr).toBe(0);
    expect(JSON.parse(json.stdout)).toMatchObject({ success: true, cell: 3, session_id: id, stdout: 'v\n' });
    // Output is live: the cell waits for a file that the test writes once its first line was printed;
    // then the rest follows, nothing twice.
    let sawTick: () => void;
    const ticked = new Promise<void>((r) => (sawTick = r));
    const live = sandpod(url, ['session', 'exec', id, file('live.py', 'import os, time\nprint("tick", flush=True)\nwhile not os.path.exists("go"): time.sleep(0.05)\nprint("done")')], undefined, (all) => {
      if (all.includes('tick\n')) sawTick();
    });
    await ticked;
    const client = createSandpodClient({ baseUrl: url });
    await client.sessions.putFile(id, 'go', '1');
    expect(await live).toMatchObject({ code: 0, stdout: 'tick\ndone\n' });
    expect((await sandpod(url, ['exec', id, file('quiet.py', 'print("at the end")'), '--no-follow'])).stdout).toBe('at the end\n');
    const slow = await sandpod(url, ['exec', id, file('slow.py', 'import time\ntime.sleep(30)'), '--timeout', '1']);
    expect(slow.code).toBe(124);
    expect(slow.stderr).toContain('execution_timeout');
    const get = await sandpod(url, ['session', 'get', id, 'upper.txt', '-o', path.join(dir, 'got.txt')]);
    expect(get.code, get.stderr).toBe(0);
    expect(readFileSync(path.join(dir, 'got.txt'), 'utf8')).toBe('HELLO');
    expect((await sandpod(url, ['session', 'get', id, 'upper.txt', '-o', '-'])).stdout).toBe('HELLO');
    const files = await sandpod(url, ['session', 'ls', id]);
    expect(files.stdout.split('\n')[0]).toMatch(/^NAME\s+SIZE\s+MODIFIED$/);
    expect(files.stdout).toMatch(/\nin\.txt\s+5 B/);
    expect(files.stdout).toMatch(/\nupper\.txt\s+5 B/);
    const rmFile = await sandpod(url, ['session', 'rm', id, 'upper.txt']);
    expect(rmFile.code, rmFile.stderr).toBe(0);
    expect(JSON.parse((await sandpod(url, ['--json', 'session', 'ls', id])).stdout).map((f: { name: string }) => f.name)).toEqual(['go', 'in.txt']);
    const list = await sandpod(url, ['session', 'ls']);
    expect(list.stdout).toMatch(new RegExp(`\\n${id}\\s+ready\\s+default\\s+6\\s`));
    const rm = await sandpod(url, ['session', 'rm', id]);
    expect(rm).toMatchObject({ code: 0, stdout: `${id} ended (closed)\n` });
    const after = await sandpod(url, ['exec', id, file('late.py', 'print(1)')]);
    expect(after.code).toBe(3);
    expect(after.stderr).toMatch(/^sandpod: session '.+' has ended \(closed\) \[conflict\]\n$/);
    const bad = await sandpod(url, ['session', 'get', id, '../etc/passwd']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('is not a file name');
    const badTimeout = await sandpod(url, ['session', 'new', '--idle-timeout', 'soon']);
    expect(badTimeout.code).toBe(2);
  }, 180_000);
});
