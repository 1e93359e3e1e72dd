/**
 * `sandpod session new|exec|put|get|ls|rm` and `sandpod exec ID FILE` (issue 19; README "Command
 * line"): sessions through the typed client's `sessions` methods. A cell's output goes to our
 * stdout and stderr as it is written (from the session's event stream) and `exec` exits with the
 * cell's exit code, as `run` does; `--json` prints the service's answer instead.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Command } from 'commander';
import type { CellRequest, CellResult, SandpodClient } from '../client/index.ts';
import { EXIT, formatBytes, formatDuration, table, UsageError } from './output.ts';

interface Ctx {
  client: SandpodClient;
  json: boolean;
}

const print = (text: string) => void process.stdout.write(text.endsWith('\n') ? text : `${text}\n`);
const printJson = (value: unknown) => print(JSON.stringify(value, null, 2));

function positive(name: string, unit = ' of seconds') {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) throw new UsageError(`${name} must be a positive whole number${unit}, not '${value}'`);
    return n;
  };
}
const seconds = (name: string) => positive(name);

/** A cell's exit code as a shell would report it: its own, 124 for a timeout, 137 for OOM, else 1. */
function cellExitCode(r: CellResult): number {
  if (r.success) return 0;
  if (r.error?.type === 'execution_timeout') return 124;
  if (r.error?.type === 'oom') return 137;
  if (r.exit_code !== null && r.exit_code !== 0) return r.exit_code & 0xff || 1;
  return EXIT.failed;
}

function readSource(file: string): string {
  try {
    return readFileSync(file === '-' ? 0 : file, 'utf8');
  } catch (err) {
    throw new UsageError(`cannot read ${file}: ${(err as Error).message}`);
  }
}

/** Parses `--input`: inline JSON, `@file` or `@-`; must be an object. */
function inputOf(spec: string | undefined): Record<string, unknown> | undefined {
  if (spec === undefined) return undefined;
  const text = spec.startsWith('@') ? readSource(spec.slice(1)) : spec;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new UsageError(`--input is not valid JSON: ${(err as Error).message}`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new UsageError('--input must be a JSON object (it becomes /input/data.json)');
  return value as Record<string, unknown>;
}

/** A workspace file name as the service takes it: a plain name, never a path. */
function fileName(name: string): string {
  if (!name || name !== path.basename(name) || name === '.' || name === '..') throw new UsageError(`'${name}' is not a file name (session files are flat: no directories)`);
  return name;
}

/**
 * Runs a cell while following the session's event stream from the cell after the last one, printing
 * that cell's output as it is written. What the stream did not deliver (a service without it, a
 * dropped connection) is printed from the answer afterwards, so the output is complete either way.
 */
async function execLive(c: Ctx, id: string, body: CellRequest): Promise<CellResult> {
  const before = await c.client.sessions.get(id);
  const printed = { stdout: '', stderr: '' };
  let cellId: string | null = null;
  const ctl = new AbortController();
  // After every event of the last cell (the largest id there can be): the stream starts at the next cell.
  const lastEventId = `${before.cells}:999999999999999`;
  const follow = (async () => {
    for await (const ev of c.client.sessions.events(id, { lastEventId, signal: ctl.signal, retries: 2 })) {
      if (ev.event === 'cell') cellId ??= ev.data.execution_id;
      else if ((ev.event === 'stdout' || ev.event === 'stderr') && ev.data.execution_id === cellId) {
        process[ev.event].write(ev.data.data);
        printed[ev.event] += ev.data.data;
      } else if (ev.event === 'cell_end' && ev.data.execution_id === cellId) return;
    }
  })().catch(() => undefined);
  try {
    const r = await c.client.sessions.execute(id, body);
    // The stream is at most moments behind the answer: let it reach the cell's end, briefly.
    await Promise.race([follow, new Promise((res) => setTimeout(res, 3000).unref())]);
    const mine = cellId === r.execution_id;
    for (const s of ['stdout', 'stderr'] as const) {
      const rest = mine && r[s].startsWith(printed[s]) ? r[s].slice(printed[s].length) : r[s];
      if (rest) process[s].write(rest);
    }
    return r;
  } finally {
    ctl.abort();
  }
}

/** Runs FILE as the session's next cell; prints its output (live unless `follow` is false); returns its exit code. */
async function execCell(c: Ctx, id: string, file: string, o: { input?: string; timeout?: number; follow: boolean }): Promise<number> {
  const input = inputOf(o.input);
  const body: CellRequest = { code: readSource(file), ...(input ? { input_data: input } : {}), ...(o.timeout ? { timeout: o.timeout } : {}) };
  if (c.json) {
    const r = await c.client.sessions.execute(id, body);
    printJson(r);
    return cellExitCode(r);
  }
  let r: CellResult;
  if (o.follow) r = await execLive(c, id, body);
  else {
    r = await c.client.sessions.execute(id, body);
    process.stdout.write(r.stdout);
    process.stderr.write(r.stderr);
  }
  const programFailure = r.exit_code !== null && r.exit_code !== 0 && r.error?.type !== 'oom';
  if (!r.success && !programFailure && r.error) process.stderr.write(`sandpod: cell ${r.cell} (${r.execution_id}): ${r.error.type}: ${r.error.message}\n`);
  return cellExitCode(r);
}

/** `sandpod session …` and `sandpod exec`, added to `program`. */
export function addSessionCommands(program: Command, ctx: (cmd: Command) => Ctx, onExit: (code: number) => void): void {
  const session = program.command('session').description('sessions: a Python interpreter that keeps its state between cells');

  session
    .command('new')
    .description('start a session; prints its id')
    .option('--job-type <name>', 'the job type (environment)')
    .option('--idle-timeout <seconds>', 'end it after this long without a cell (default 300)', seconds('--idle-timeout'))
    .option('--max-lifetime <seconds>', 'end it after this long whatever it does (default 3600)', seconds('--max-lifetime'))
    .option('--timeout <seconds>', "each cell's time limit (default: the job type's)", seconds('--timeout'))
    .action(async (o: { jobType?: string; idleTimeout?: number; maxLifetime?: number; timeout?: number }, cmd: Command) => {
      const c = ctx(cmd);
      const s = await c.client.sessions.create({
        ...(o.jobType ? { job_type: o.jobType } : {}),
        ...(o.idleTimeout ? { idle_timeout: o.idleTimeout } : {}),
        ...(o.maxLifetime ? { max_lifetime: o.maxLifetime } : {}),
        ...(o.timeout ? { timeout: o.timeout } : {}),
      });
      if (c.json) printJson(s);
      else print(s.session_id);
    });

  const execOptions = (cmd: Command) =>
    cmd
      .argument('<id>', 'session id')
      .argument('<file>', 'the cell (.py), or - for stdin')
      .option('--input <json>', "the cell's input data: inline JSON, @file or @- (/input/data.json)")
      .option('--timeout <seconds>', "the cell's time limit", seconds('--timeout'))
      .option('--no-follow', 'print the output when the cell ends, not live')
      .action(async (id: string, file: string, o: { input?: string; timeout?: number; follow: boolean }, c: Command) => onExit(await execCell(ctx(c), id, file, o)));
  execOptions(session.command('exec').description("run a file as the session's next cell; exits with its exit code"));
  execOptions(program.command('exec').description("run a file as the next cell of session ID (sandpod session exec)"));

  session
    .command('put')
    .description("copy a local file into the session's /workspace")
    .argument('<id>', 'session id')
    .argument('<file>', 'the local file')
    .argument('[name]', 'its name in /workspace (default: the file\'s own name)')
    .action(async (id: string, file: string, name: string | undefined, _o: unknown, cmd: Command) => {
      const c = ctx(cmd);
      let bytes: Buffer;
      try {
        bytes = readFileSync(file);
      } catch (err) {
        throw new UsageError(`cannot read ${file}: ${(err as Error).message}`);
      }
      const w = await c.client.sessions.putFile(id, fileName(name ?? path.basename(file)), bytes);
      if (c.json) printJson(w);
      else print(`${w.name} ${formatBytes(w.size_bytes)} sha256:${w.sha256}`);
    });

  session
    .command('get')
    .description("copy a file of the session's /workspace here")
    .argument('<id>', 'session id')
    .argument('<name>', 'the file in /workspace')
    .option('-o, --output <path>', 'where to write it (- for stdout; default: ./NAME)')
    .action(async (id: string, name: string, o: { output?: string }, cmd: Command) => {
      const c = ctx(cmd);
      const bytes = await c.client.sessions.getFile(id, fileName(name));
      if (o.output === '-') return void process.stdout.write(bytes);
      const out = o.output ?? name;
      writeFileSync(out, bytes);
      if (c.json) printJson({ name, path: out, size_bytes: bytes.length });
      else print(out);
    });

  session
    .command('ls')
    .description('the sessions, newest first; with an id, the files of its /workspace')
    .argument('[id]', 'session id')
    .option('--status <status>', 'only sessions in this status (starting, ready, busy, ended)')
    .option('--limit <n>', 'how many sessions', positive('--limit', ''), 20)
    .action(async (id: string | undefined, o: { status?: string; limit: number }, cmd: Command) => {
      const c = ctx(cmd);
      if (id !== undefined) {
        const files = await c.client.sessions.listFiles(id);
        if (c.json) return printJson(files);
        return void process.stdout.write(table(['NAME', 'SIZE', 'MODIFIED'], files.map((f) => [f.name, formatBytes(f.size_bytes), f.modified_at])));
      }
      const page = await c.client.sessions.list({ limit: o.limit, ...(o.status ? { status: o.status as 'ready' } : {}) });
      if (c.json) return printJson(page);
      const age = (t: string) => formatDuration(Date.now() - new Date(t).getTime());
      const rows = page.items.map((s) => [s.session_id, s.end_reason ? `${s.status} (${s.end_reason})` : s.status, s.job_type, String(s.cells), s.created_at, age(s.last_used_at)]);
      process.stdout.write(table(['SESSION ID', 'STATUS', 'TYPE', 'CELLS', 'CREATED', 'IDLE'], rows));
    });

  session
    .command('rm')
    .description("close a session; with a name, remove that file of its /workspace instead")
    .argument('<id>', 'session id')
    .argument('[name]', 'the file in /workspace')
    .action(async (id: string, name: string | undefined, _o: unknown, cmd: Command) => {
      const c = ctx(cmd);
      if (name !== undefined) {
        await c.client.sessions.deleteFile(id, fileName(name));
        return c.json ? printJson({ name, deleted: true }) : undefined;
      }
      const s = await c.client.sessions.close(id);
      if (c.json) printJson(s);
      else print(`${s.session_id} ${s.status} (${s.end_reason})`);
    });
}
