/**
 * Following a job to its end: its output live through the event stream (`GET /jobs/{id}/events`),
 * or — with a service that has no event stream — waiting for the result and printing its output
 * then. Either way the caller gets the full record.
 */
import { SandpodError, unwrap, type ExecutionRecordFull, type SandpodClient } from '../client/index.ts';
import { phaseText, type Spinner } from './output.ts';

/** Where the program's output goes (the process's own streams in the CLI). */
export interface OutputSink {
  stdout(text: string): void;
  stderr(text: string): void;
  /** A note from sandpod itself (a truncated stream, say). */
  note(text: string): void;
}

export interface FollowOptions {
  /** Print the program's output (live when the stream is there). */
  print: boolean;
  spinner: Spinner;
  sink: OutputSink;
  /** Long-poll length per request while waiting without the stream, seconds. */
  waitSeconds?: number;
}

/** Follows `jobId` to its end and returns its full record. */
export async function followJob(client: SandpodClient, jobId: string, o: FollowOptions): Promise<ExecutionRecordFull> {
  if (o.print) {
    try {
      return await streamJob(client, jobId, o);
    } catch (err) {
      // 404 from the stream of a job that exists: this service has no event stream; wait instead.
      if (!(err instanceof SandpodError && err.status === 404)) throw err;
      unwrap(await client.GET('/jobs/{id}', { params: { path: { id: jobId } } }));
    }
  }
  const record = await waitForRecord(client, jobId, o);
  o.spinner.stop();
  if (o.print) {
    if (record.stdout) o.sink.stdout(record.stdout);
    if (record.stderr) o.sink.stderr(record.stderr);
    if (record.stdout_truncated) o.sink.note('stdout was truncated at the service\'s max_stdout_bytes');
    if (record.stderr_truncated) o.sink.note('stderr was truncated at the service\'s max_stdout_bytes');
  }
  return record;
}

async function streamJob(client: SandpodClient, jobId: string, o: FollowOptions): Promise<ExecutionRecordFull> {
  o.spinner.show('connecting');
  for await (const ev of client.events(jobId)) {
    switch (ev.event) {
      case 'status':
        if (ev.data.phase === 'running' || isFinal(ev.data.status)) o.spinner.stop();
        else o.spinner.show(phaseText(ev.data.phase, ev.data.status));
        break;
      case 'stdout':
        o.spinner.stop();
        o.sink.stdout(ev.data.data);
        break;
      case 'stderr':
        o.spinner.stop();
        o.sink.stderr(ev.data.data);
        break;
      case 'truncated':
        o.sink.note(`${ev.data.stream} was truncated at the service's max_stdout_bytes`);
        break;
      case 'artifact':
        break;
      case 'end':
        o.spinner.stop();
        return ev.data;
    }
  }
  throw new SandpodError(0, null, `the event stream of job ${jobId} ended without its record`);
}

const isFinal = (s: string) => s !== 'queued' && s !== 'running' && s !== 'pending';

/** Long-polls `GET /jobs/{id}/result` until the job ends; the spinner says its status meanwhile. */
export async function waitForRecord(client: SandpodClient, jobId: string, o: Pick<FollowOptions, 'spinner' | 'waitSeconds'>): Promise<ExecutionRecordFull> {
  o.spinner.show('waiting');
  for (;;) {
    const r = await client.GET('/jobs/{id}/result', {
      params: { path: { id: jobId }, query: { wait: 'true', timeout: o.waitSeconds ?? 5, view: 'full' } },
    });
    if (r.response.status === 200) return r.data as ExecutionRecordFull;
    if (r.response.status === 408 || r.response.status === 202) {
      const status = (r.error ?? r.data) as { status?: string; queue_position?: number } | undefined;
      const s = status?.status === 'pending' ? 'queued' : (status?.status ?? 'waiting');
      o.spinner.show(s === 'queued' && status?.queue_position ? `queued (position ${status.queue_position})` : s);
      continue;
    }
    unwrap(r);
    throw new SandpodError(r.response.status, r.error);
  }
}
