/**
 * What the CLI prints: exit codes, the one-line error, tables, the spinner (ora, on a terminal only).
 */
import ora, { type Ora } from 'ora';
import { SandpodConnectionError, SandpodError, type ExecutionRecordFull } from '../client/index.ts';

/** Exit codes of sandpod itself (`run`, `rerun --follow` exit with the program's own code instead). */
export const EXIT = {
  ok: 0,
  /** The job or build ended badly (a run that `run` reports with the program's code does not use it). */
  failed: 1,
  /** Bad arguments: an unknown option, unreadable file, invalid --input JSON. */
  usage: 2,
  /** The service answered an error body, or could not be reached. */
  service: 3,
  /** `result` of a job that has not finished. */
  notFinished: 4,
} as const;

/** A problem with what the user typed (exit 2). */
export class UsageError extends Error {}

/**
 * The exit code of a finished run, as a shell would report the program: its own exit code when it
 * has one; otherwise 124 for a timeout (like timeout(1)), 137 for out of memory (SIGKILL), 130 for a
 * cancelled run (SIGINT), 1 for anything else that did not succeed.
 */
export function exitCodeOf(record: Pick<ExecutionRecordFull, 'status' | 'exit_code'>): number {
  if (record.status === 'succeeded') return record.exit_code ?? 0;
  if (record.status === 'timeout') return 124;
  if (record.status === 'oom') return 137;
  if (record.status === 'cancelled') return 130;
  if (record.exit_code !== null && record.exit_code !== 0) return record.exit_code & 0xff || 1;
  return 1;
}

/** The one line printed for an error, and the exit code that goes with it. */
export function describeError(err: unknown): { line: string; code: number } {
  if (err instanceof UsageError) return { line: err.message, code: EXIT.usage };
  if (err instanceof SandpodConnectionError) {
    return { line: `${err.message} (is it running? set --url or SANDPOD_URL)`, code: EXIT.service };
  }
  if (err instanceof SandpodError) {
    const hint = err.status === 401 ? ' (pass --token or set SANDPOD_TOKEN)' : '';
    return { line: `${oneLine(err.detail)} [${err.code}]${hint}`, code: EXIT.service };
  }
  return { line: err instanceof Error ? oneLine(err.message) : String(err), code: EXIT.failed };
}

const oneLine = (s: string) => s.replace(/\s*\n\s*/g, ' ').trim();

/** Rows as aligned columns under a header. */
export function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]!))).join('  ').trimEnd();
  return [line(header), ...rows.map(line)].join('\n') + '\n';
}

/** `1.2 KiB` style sizes. */
export function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB'];
  let v = n;
  let u = -1;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v.toFixed(1)} ${units[u]}`;
}

/** `850 ms` / `3.2 s`. */
export function formatDuration(ms: number | null | undefined): string {
  if (ms === null || ms === undefined) return '-';
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}

/** What a phase of the event stream means, for the spinner. */
export function phaseText(phase: string, status?: string): string {
  switch (phase) {
    case 'queued':
      return 'queued';
    case 'starting':
      return 'starting the sandbox';
    case 'installing':
      return 'installing requirements';
    case 'running':
      return 'running';
    default:
      return phase || status || '';
  }
}

/** A spinner on stderr when it is a terminal (and not --json); nothing at all otherwise. */
export class Spinner {
  private readonly ora: Ora | null;
  constructor(enabled: boolean) {
    this.ora = enabled ? ora({ stream: process.stderr, discardStdin: false }) : null;
  }
  /** Shows (or updates) the spinner with `text`. */
  show(text: string): void {
    if (!this.ora) return;
    this.ora.text = text;
    if (!this.ora.isSpinning) this.ora.start();
  }
  /** Removes it (before output is written). */
  stop(): void {
    if (this.ora?.isSpinning) this.ora.stop();
  }
  /** Leaves a final line with a ✔ or ✖ (terminal only). */
  done(ok: boolean, text: string): void {
    if (!this.ora) return;
    if (ok) this.ora.succeed(text);
    else this.ora.fail(text);
  }
}
