/**
 * `sandpod`, the command line of the service, on commander and the typed client (`src/client`).
 * `sandpod --help` lists the commands; README.md shows them. Everything goes through the HTTP API:
 * `--url` / `SANDPOD_URL` (default http://127.0.0.1:8000), `--token` / `SANDPOD_TOKEN`.
 *
 * Output: the program's stdout and stderr go to ours; `--json` prints the service's answer instead
 * (one JSON document on stdout). Errors are one line on stderr, `sandpod: <detail> [<code>]`; exit
 * codes are in output.ts (`EXIT`) — `run` exits with the program's own code.
 */
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Command, CommanderError, Option } from 'commander';
import { parse as parseExact, stringify as stringifyExact } from 'lossless-json';
import { createSandpodClient, unwrap, type ExecutionRecordFull, type SandpodClient } from '../client/index.ts';
import { followJob, type OutputSink } from './follow.ts';
import { mcpCommand } from './mcp.ts';
import { addSessionCommands } from './session.ts';
import { describeError, EXIT, exitCodeOf, formatBytes, formatDuration, Spinner, table, UsageError } from './output.ts';

const DEFAULT_URL = 'http://127.0.0.1:8000';
/** This package's version (package.json is two levels up from src/cli and from dist/cli). */
const VERSION = (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version;

interface GlobalOptions {
  url: string;
  token?: string;
  json?: boolean;
}

interface Context {
  client: SandpodClient;
  json: boolean;
  spinner: Spinner;
}

const sink: OutputSink = {
  stdout: (t) => void process.stdout.write(t),
  stderr: (t) => void process.stderr.write(t),
  note: (t) => void process.stderr.write(`sandpod: ${t}\n`),
};

/** What the record says it does not list: `<before>N more entries of /output not listed<after>`, or ''. */
function unlisted(record: ExecutionRecordFull, before: string, after: string): string {
  if (!record.artifacts_truncated) return '';
  const more = record.artifacts_total - record.artifacts.length;
  return `${before}${more > 0 ? `${more} more` : 'more'} entries of /output not listed${after}`;
}

const print = (text: string) => void process.stdout.write(text.endsWith('\n') ? text : `${text}\n`);
const printJson = (value: unknown) => print(JSON.stringify(value, null, 2));
/** Prints the service's JSON text indented, its numbers exactly as sent (JSON.parse would round big ones). */
const printJsonText = (text: string) => print(stringifyExact(parseExact(text), null, 2) ?? text);

/** A job's full record as the service's own JSON text. */
async function recordText(client: SandpodClient, id: string): Promise<string> {
  return unwrap(await client.GET('/jobs/{id}', { params: { path: { id }, query: { view: 'full' } }, parseAs: 'text' }));
}

/** Reads `--input`: inline JSON, `@file`, or `@-` (stdin). Returns the JSON text itself, checked. */
export function readInput(spec: string): string {
  let text: string;
  if (spec.startsWith('@')) {
    const file = spec.slice(1);
    try {
      text = readFileSync(file === '-' ? 0 : file, 'utf8');
    } catch (err) {
      throw new UsageError(`--input ${spec}: ${(err as Error).message}`);
    }
  } else {
    text = spec;
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new UsageError(`--input is not valid JSON: ${(err as Error).message}`);
  }
  if (value !== null && (typeof value !== 'object' || Array.isArray(value))) {
    throw new UsageError('--input must be a JSON object (it becomes /input/data.json)');
  }
  return text.trim();
}

/**
 * The submission's JSON text with `input_data` spliced in as the user wrote it: parsing and
 * re-serializing it would round big and long-decimal numbers, which the service keeps exactly.
 */
export function submissionText(fields: Record<string, unknown>, inputText: string | null): string {
  const rest = JSON.stringify(fields);
  if (inputText === null) return rest;
  return `{"input_data":${inputText}${rest === '{}' ? '' : `,${rest.slice(1, -1)}`}}`;
}

function positiveInt(name: string) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) throw new UsageError(`${name} must be a positive whole number of seconds, not '${value}'`);
    return n;
  };
}

/** Builds the program; `main` parses argv with it. `onExit` receives the code a command ends with. */
export function buildProgram(onExit: (code: number) => void): Command {
  const program = new Command('sandpod')
    .description('Run Python in sandpod sandboxes and follow the runs')
    .version(VERSION)
    .addOption(new Option('--url <url>', 'the service').env('SANDPOD_URL').default(DEFAULT_URL))
    .addOption(new Option('--token <token>', 'API token (Authorization: Bearer)').env('SANDPOD_TOKEN'))
    .option('--json', 'print the service\'s answer as JSON (for scripts)')
    .showHelpAfterError('(sandpod --help lists the commands and options)')
    .exitOverride();

  const ctx = (cmd: Command): Context => {
    const g = cmd.optsWithGlobals<GlobalOptions>();
    let url: URL;
    try {
      url = new URL(g.url);
    } catch {
      throw new UsageError(`--url '${g.url}' is not a URL (e.g. ${DEFAULT_URL})`);
    }
    const json = g.json === true;
    return {
      client: createSandpodClient({ baseUrl: url.href, token: g.token || undefined }),
      json,
      spinner: new Spinner(!json && process.stderr.isTTY === true),
    };
  };

  /** Prints a finished run's outcome (humans: a line when it did not succeed) and returns its exit code. */
  const finish = async (c: Context, record: ExecutionRecordFull): Promise<number> => {
    const code = exitCodeOf(record);
    if (c.json) {
      printJsonText(await recordText(c.client, record.job_id));
      return code;
    }
    const ok = record.status === 'succeeded';
    const summary = `${record.job_id} ${record.status}${record.exit_code !== null ? ` (exit ${record.exit_code})` : ''} in ${formatDuration(record.duration_ms)}`;
    c.spinner.done(ok, summary);
    const programFailure = record.status === 'failed' && record.exit_code !== null && record.exit_code !== 0;
    if (!ok && !programFailure && record.error) {
      process.stderr.write(`sandpod: job ${record.job_id} ${record.status}: ${record.error.type}: ${record.error.message}\n`);
    }
    return code;
  };

  program
    .command('run')
    .description('run a Python file; prints its output live and exits with its exit code')
    .argument('<file>', 'the program (.py), or - for stdin')
    .option('--input <json>', 'input data: inline JSON, @file or @- (the program reads /input/data.json)')
    .option('--requirements <spec...>', 'pip requirements to install first')
    .option('--job-type <name>', 'the job type (environment)')
    .option('--timeout <seconds>', 'execution time limit', positiveInt('--timeout'))
    .option('--idempotency-key <key>', 'a repeated submission with this key returns the same job')
    .option('--callback-url <url>', 'POST the record there when the job ends (signed; see docs/api.md)')
    .option('--async', 'queue it and print the job id without waiting')
    .option('--no-follow', 'wait for the result and print the output at the end, not live')
    .action(async (file: string, o: { input?: string; requirements?: string[]; jobType?: string; timeout?: number; idempotencyKey?: string; callbackUrl?: string; async?: boolean; follow: boolean }, cmd: Command) => {
      let code: string;
      try {
        code = readFileSync(file === '-' ? 0 : file, 'utf8');
      } catch (err) {
        throw new UsageError(`cannot read ${file}: ${(err as Error).message}`);
      }
      const inputText = o.input === undefined ? null : readInput(o.input);
      const c = ctx(cmd);
      const fields = {
        code,
        ...(o.jobType ? { job_type: o.jobType } : {}),
        ...(o.timeout ? { timeout: o.timeout } : {}),
        ...(o.requirements?.length ? { requirements: o.requirements } : {}),
        ...(o.idempotencyKey ? { idempotency_key: o.idempotencyKey } : {}),
        ...(o.callbackUrl ? { callback_url: o.callbackUrl } : {}),
      };
      c.spinner.show('submitting');
      const job = unwrap(await c.client.POST('/execute/async', { body: fields, bodySerializer: () => submissionText(fields, inputText) }));
      if (o.async) {
        c.spinner.stop();
        if (c.json) printJson(job);
        else print(job.job_id);
        return onExit(EXIT.ok);
      }
      // Ctrl-C stops following, not the job: say how to stop that too.
      const detach = () => {
        c.spinner.stop();
        process.stderr.write(`sandpod: stopped following; job ${job.job_id} keeps running (sandpod cancel ${job.job_id} stops it)\n`);
        process.exit(130);
      };
      process.once('SIGINT', detach);
      try {
        const record = await followJob(c.client, job.job_id, { print: !c.json && o.follow, spinner: c.spinner, sink });
        if (!c.json && !o.follow) c.spinner.stop();
        onExit(await finish(c, record));
      } finally {
        process.removeListener('SIGINT', detach);
      }
    });

  program
    .command('jobs')
    .description('recent jobs, newest first')
    .option('--status <status>', 'only this status (queued, running, succeeded, failed, timeout, oom, cancelled)')
    .option('--job-type <name>', 'only this job type')
    .option('--limit <n>', 'how many', positiveInt('--limit'), 20)
    .action(async (o: { status?: string; jobType?: string; limit: number }, cmd: Command) => {
      const c = ctx(cmd);
      const text = unwrap(
        await c.client.GET('/executions', {
          params: { query: { limit: o.limit, ...(o.status ? { status: o.status as 'queued' } : {}), ...(o.jobType ? { job_type: o.jobType } : {}) } },
          parseAs: 'text',
        }),
      );
      if (c.json) return printJsonText(text);
      const page = JSON.parse(text) as { items: ExecutionRecordFull[] };
      const rows = page.items.map((r) => [r.job_id, r.status, r.job_type, r.created_at, formatDuration(r.duration_ms), r.exit_code === null ? '-' : String(r.exit_code)]);
      process.stdout.write(table(['JOB ID', 'STATUS', 'TYPE', 'CREATED', 'DURATION', 'EXIT'], rows));
    });

  program
    .command('logs')
    .description('a job\'s stdout and stderr')
    .argument('<id>', 'job id')
    .option('-f, --follow', 'follow the output live until the job ends')
    .action(async (id: string, o: { follow?: boolean }, cmd: Command) => {
      const c = ctx(cmd);
      if (o.follow) {
        const record = await followJob(c.client, id, { print: !c.json, spinner: c.spinner, sink });
        if (c.json) printJson({ job_id: record.job_id, status: record.status, stdout: record.stdout, stderr: record.stderr });
        return;
      }
      const r = unwrap(await c.client.GET('/executions/{id}', { params: { path: { id }, query: { view: 'full' } } })) as ExecutionRecordFull;
      if (c.json) return printJson({ job_id: r.job_id, status: r.status, stdout: r.stdout, stderr: r.stderr, stdout_truncated: r.stdout_truncated, stderr_truncated: r.stderr_truncated });
      process.stdout.write(r.stdout);
      process.stderr.write(r.stderr);
    });

  program
    .command('result')
    .description('a job\'s outcome: status, exit code, error, output (result.json)')
    .argument('<id>', 'job id')
    .option('--wait', 'wait for the job to finish')
    .option('--timeout <seconds>', 'longest wait (1..300)', positiveInt('--timeout'), 30)
    .action(async (id: string, o: { wait?: boolean; timeout: number }, cmd: Command) => {
      const c = ctx(cmd);
      const r = await c.client.GET('/jobs/{id}/result', {
        params: { path: { id }, query: { view: 'full', ...(o.wait ? { wait: 'true' as const, timeout: o.timeout } : {}) } },
        parseAs: 'text',
      });
      if (r.response.status === 202 || r.response.status === 408) {
        const s = (typeof r.data === 'string' ? JSON.parse(r.data) : r.error) as { status: string; queue_position?: number };
        if (c.json) printJson(s);
        else process.stderr.write(`sandpod: job ${id} has not finished: ${s.status === 'pending' ? 'queued' : s.status}${s.queue_position ? ` (position ${s.queue_position})` : ''}\n`);
        return onExit(EXIT.notFinished);
      }
      const text = unwrap(r);
      if (c.json) return printJsonText(text);
      const record = JSON.parse(text) as ExecutionRecordFull;
      const lines = [
        ['job', record.job_id],
        ['status', `${record.status}${record.exit_code !== null ? ` (exit ${record.exit_code})` : ''} in ${formatDuration(record.duration_ms)}`],
        ...(record.error ? [['error', `${record.error.type}: ${record.error.message}`]] : []),
        ...(record.artifacts.length ? [['artifacts', record.artifacts.map((a) => a.name).join(', ') + unlisted(record, ' (and ', ')')]] : []),
        ['output', record.output === null ? 'null' : JSON.stringify(record.output, null, 2)],
      ];
      for (const [k, v] of lines) print(`${k!.padEnd(10)}${v}`);
    });

  program
    .command('cancel')
    .description('cancel a queued or running job')
    .argument('<id>', 'job id')
    .action(async (id: string, _o: unknown, cmd: Command) => {
      const c = ctx(cmd);
      const r = unwrap(await c.client.POST('/jobs/{id}/cancel', { params: { path: { id } } }));
      if (c.json) return printJson(r);
      print(`${r.job_id} ${r.status} (was ${r.previous_status === 'pending' ? 'queued' : r.previous_status})`);
    });

  program
    .command('rerun')
    .description('run a finished job again (same code and input); prints the new job id')
    .argument('<id>', 'job id')
    .option('--follow', 'follow the new run\'s output and exit with its exit code')
    .action(async (id: string, o: { follow?: boolean }, cmd: Command) => {
      const c = ctx(cmd);
      const job = unwrap(await c.client.POST('/jobs/{id}/rerun', { params: { path: { id } } }));
      if (!o.follow) {
        if (c.json) printJson(job);
        else print(job.job_id);
        return;
      }
      const record = await followJob(c.client, job.job_id, { print: !c.json, spinner: c.spinner, sink });
      onExit(await finish(c, record));
    });

  program
    .command('artifacts')
    .description('list a job\'s artifacts, or download one (NAME) or all of them (-o DIR)')
    .argument('<id>', 'job id')
    .argument('[name]', 'the artifact to download')
    .option('-o, --output <dir>', 'directory to write into (default: the current one)')
    .action(async (id: string, name: string | undefined, o: { output?: string }, cmd: Command) => {
      const c = ctx(cmd);
      const record = unwrap(await c.client.GET('/jobs/{id}', { params: { path: { id }, query: { view: 'full' } } })) as ExecutionRecordFull;
      const kept = record.artifacts.filter((a) => !a.skipped);
      if (name === undefined && o.output === undefined) {
        if (c.json) return printJson(record.artifacts);
        const rows = record.artifacts.map((a) => [a.name, a.skipped ? `skipped: ${a.skipped}` : formatBytes(a.size_bytes), a.content_type]);
        process.stdout.write(table(['NAME', 'SIZE', 'TYPE'], rows));
        if (record.artifacts_truncated) sink.note(`only these are listed${unlisted(record, ': ', '')}`);
        return;
      }
      const wanted = name === undefined ? kept : kept.filter((a) => a.name === name);
      if (name !== undefined && wanted.length === 0) {
        throw new UsageError(`job ${id} has no artifact '${name}' (kept: ${kept.map((a) => a.name).join(', ') || 'none'})`);
      }
      const dir = o.output ?? '.';
      mkdirSync(dir, { recursive: true });
      const written = [];
      for (const a of wanted) {
        // The service refuses names with separators; a name is a file name here, never a path.
        if (a.name !== path.basename(a.name) || a.name === '.' || a.name === '..') throw new UsageError(`refusing artifact name '${a.name}'`);
        const bytes = Buffer.from(unwrap(await c.client.GET('/jobs/{id}/artifacts/{name}', { params: { path: { id, name: a.name } }, parseAs: 'arrayBuffer' })) as ArrayBuffer);
        const sha256 = createHash('sha256').update(bytes).digest('hex');
        if (sha256 !== a.sha256) throw new Error(`artifact ${a.name}: downloaded bytes do not match the record's sha256`);
        const file = path.join(dir, a.name);
        writeFileSync(file, bytes);
        written.push({ name: a.name, path: file, size_bytes: bytes.length, sha256 });
      }
      if (c.json) return printJson(written);
      for (const w of written) print(w.path);
      if (name === undefined && record.artifacts_truncated) sink.note(`only the listed artifacts were downloaded${unlisted(record, ': ', '')}`);
    });

  program
    .command('job-types')
    .description('the job types (environments) and whether each is built')
    .action(async (_o: unknown, cmd: Command) => {
      const c = ctx(cmd);
      const types = unwrap(await c.client.GET('/job-types'));
      if (c.json) return printJson(types);
      const rows = types.map((t) => [t.name, t.python_version, t.requirements.join(' ') || '-', t.image_exists ? 'yes' : 'no', t.version]);
      process.stdout.write(table(['NAME', 'PYTHON', 'REQUIREMENTS', 'BUILT', 'VERSION'], rows));
    });

  program
    .command('build')
    .description('build a job type\'s environment (its requirements installed once)')
    .argument('<type>', 'job type')
    .option('--version-tag <semver>', 'a semantic version for the build (1.2.0)')
    .option('--async', 'start it and print the build without waiting')
    .action(async (type: string, o: { versionTag?: string; async?: boolean }, cmd: Command) => {
      const c = ctx(cmd);
      c.spinner.show(`building ${type}`);
      let build = unwrap(
        await c.client.POST('/job-types/{name}/build', { params: { path: { name: type }, query: { wait: 'false', ...(o.versionTag ? { version_tag: o.versionTag } : {}) } } }),
      );
      while (!o.async && build.status === 'building') {
        c.spinner.show(`building ${type}: ${build.phase}`);
        await new Promise((r) => setTimeout(r, 1000));
        build = unwrap(await c.client.GET('/job-types/{name}/builds/{id}', { params: { path: { name: type, id: build.id } } }));
      }
      c.spinner.stop();
      if (c.json) printJson(build);
      else if (build.status === 'built') c.spinner.done(true, `${type} built: ${build.version} in ${formatDuration(build.duration_ms)}`), print(build.version ?? '');
      else if (build.status === 'building') print(build.id);
      if (build.status === 'failed') {
        process.stderr.write(`sandpod: build of ${type} failed${build.error ? `:\n${build.error.trimEnd()}` : ''}\n`);
        onExit(EXIT.failed);
      }
    });

  program.addCommand(mcpCommand(VERSION).exitOverride());
  addSessionCommands(program, ctx, onExit);

  return program;
}

/** Runs the CLI over `argv` (as `process.argv`) and sets the exit code. */
export async function main(argv: string[]): Promise<void> {
  let code: number = EXIT.ok;
  const program = buildProgram((c) => {
    code = c;
  });
  try {
    await program.parseAsync(argv);
  } catch (err) {
    if (err instanceof CommanderError) {
      // Help and --version exit 0; commander already printed its message for anything else.
      code = err.exitCode === 0 ? EXIT.ok : EXIT.usage;
    } else {
      const { line, code: c } = describeError(err);
      process.stderr.write(`sandpod: ${line}\n`);
      code = c;
    }
  }
  process.exitCode = code;
}
