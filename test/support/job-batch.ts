/**
 * The fault tests' batch of async jobs (issue 22: "each with 50 async jobs … every job ends once,
 * correctly"). Each job sleeps a little, prints a line naming it and writes a result naming it, so a
 * record holding another job's output, or none, is seen. `checkBatch` reads every record and says
 * what is wrong with it.
 */
import { expect } from 'vitest';

type J = Record<string, any>;

/** How the tests reach a service: in-process (`app.request`) or over HTTP. */
export interface BatchClient {
  post(path: string, body: unknown): Promise<{ status: number; body: J }>;
  get(path: string): Promise<{ status: number; body: J }>;
}

/** A client over HTTP at `base` (a service process). */
export function httpClient(base: () => string): BatchClient {
  const call = async (method: string, p: string, body?: unknown) => {
    const res = await fetch(base() + p, { method, ...(body === undefined ? {} : { headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }) });
    const text = await res.text();
    return { status: res.status, body: (text ? JSON.parse(text) : {}) as J };
  };
  return { post: (p, b) => call('POST', p, b), get: (p) => call('GET', p) };
}

/** A client over a test service's `app.request`. */
export function appClient(svc: { post(p: string, b?: unknown): Promise<Response>; get(p: string): Promise<Response> }): BatchClient {
  const read = async (res: Response) => {
    const text = await res.text();
    return { status: res.status, body: (text ? JSON.parse(text) : {}) as J };
  };
  return { post: async (p, b) => read(await svc.post(p, b)), get: async (p) => read(await svc.get(p)) };
}

/** The code of job `i` of a batch. */
export function batchJobCode(i: number, sleepS = 0.3): string {
  return `import json, time\ntime.sleep(${sleepS})\nprint("job ${i}")\njson.dump({"job": ${i}}, open("/output/result.json", "w"))`;
}

/** Submits `n` async jobs; returns their ids in order. Each submission must be accepted (202). */
export async function submitBatch(client: BatchClient, n: number, sleepS?: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const r = await client.post('/execute/async', { code: batchJobCode(i, sleepS) });
    expect(r.status, JSON.stringify(r.body)).toBe(202);
    ids.push(r.body.job_id as string);
  }
  return ids;
}

const TERMINAL = ['succeeded', 'failed', 'timeout', 'oom', 'cancelled'];

/** Statuses of `ids` (one read each). */
export async function statuses(client: BatchClient, ids: string[]): Promise<string[]> {
  return Promise.all(ids.map(async (id) => (await client.get(`/jobs/${id}`)).body.status as string));
}

/** Waits until `count` of `ids` have succeeded. */
export async function untilSucceeded(client: BatchClient, ids: string[], count: number, timeoutMs = 60_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const s = await statuses(client, ids);
    if (s.filter((x) => x === 'succeeded').length >= count) return;
    if (Date.now() > until) throw new Error(`fewer than ${count} jobs succeeded in time: ${JSON.stringify(s)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Waits until every job of `ids` is terminal; returns their full records in order. */
export async function settledBatch(client: BatchClient, ids: string[], timeoutMs = 90_000): Promise<J[]> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const s = await statuses(client, ids);
    if (s.every((x) => TERMINAL.includes(x))) break;
    if (Date.now() > until) throw new Error(`jobs not settled in time: ${JSON.stringify(s.filter((x) => !TERMINAL.includes(x)))}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  return Promise.all(ids.map(async (id) => (await client.get(`/executions/${id}?view=full`)).body));
}

/** What is wrong with job `i`'s record when it should have succeeded, or null. */
export function wrongSuccess(i: number, r: J): string | null {
  if (r.status !== 'succeeded') return `job ${i} ${r.execution_id}: ${r.status} ${JSON.stringify(r.error)}`;
  if (r.stdout !== `job ${i}\n` || JSON.stringify(r.output) !== JSON.stringify({ job: i }) || r.exit_code !== 0) {
    return `job ${i} ${r.execution_id}: wrong result ${JSON.stringify({ stdout: r.stdout, output: r.output, exit_code: r.exit_code })}`;
  }
  return null;
}

/**
 * The real runtime with every method kept, counting per execution how many times user code started
 * (the runtime's `execution` phase): a job run twice shows as 2.
 */
export function countingStarts<R extends { run: (spec: any, opts?: any) => Promise<any> }>(real: R): { runtime: R; starts: Map<string, number> } {
  const starts = new Map<string, number>();
  const run = (spec: { executionId: string }, opts: { onPhase?: (p: string) => void } = {}) =>
    real.run(spec, {
      ...opts,
      onPhase: (p: string) => {
        if (p === 'execution') starts.set(spec.executionId, (starts.get(spec.executionId) ?? 0) + 1);
        opts.onPhase?.(p);
      },
    });
  const runtime = new Proxy(real, {
    get(t, k) {
      if (k === 'run') return run;
      const v = Reflect.get(t, k, t) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
    },
  });
  return { runtime, starts };
}
