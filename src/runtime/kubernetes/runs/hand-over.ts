/**
 * The hand-over of a program to a pod that waits for it (a claimed warm pool pod, or a cold pod
 * started the same way): the service attaches to the pod's `collector` (deliver.py), sends one header
 * line and the program and input bytes; the collector writes them into the volumes `main` mounts
 * read-only, then passes the go line to `main`'s runner over loopback and relays the runner's phase
 * lines back on its stdout (see pool-plan.ts). The hand-over has succeeded once `execution` comes
 * back: the runner has started the program. Until then nothing of the user's has run, so a failure
 * here (an attach that drops or is refused, a collector that reports `undelivered`, no answer within
 * the limit) may be retried on another pod without running the program twice.
 */
import type { AttachSession, KubeApi } from '../../../kube/index.ts';
import { runEnv, type RunSpec } from '../../runtime.ts';
import { CONTAINERS } from '../names.ts';

/** Frames the payload is sent in (a real API server and kubelet relay frames of any size; smaller ones keep memory flat). */
const FRAME_BYTES = 256 * 1024;

/** The hand-over failed before the program started: the run may be retried elsewhere. */
export class HandOverError extends Error {
  override readonly name = 'HandOverError';
}

/** What {@link handOver} reports while the run goes on. */
export interface HandOverOptions {
  /** The runner said `done N`: the program ended and its outputs are written. */
  onDone: (exitCode: number) => void;
  /** How long the program may take to start after the payload was sent, ms. */
  timeoutMs: number;
}

/** The bytes the collector reads: a header line, then the program, then its input (deliver.py). */
export function handOverPayload(spec: Pick<RunSpec, 'code' | 'inputJson' | 'timeoutSec' | 'maxStdoutBytes' | 'traceparent'>): Buffer {
  const code = Buffer.from(spec.code, 'utf8');
  const input = Buffer.from(spec.inputJson, 'utf8');
  // The runner adds `env` to the program's environment (its TRACEPARENT); deliver.py passes `go` on as is.
  const env = runEnv(spec);
  const go = { timeout: spec.timeoutSec, max_stream_bytes: spec.maxStdoutBytes, ...(Object.keys(env).length ? { env } : {}) };
  const header = { code: code.length, input: input.length, go };
  return Buffer.concat([Buffer.from(JSON.stringify(header) + '\n', 'utf8'), code, input]);
}

/**
 * Hands `spec`'s program to `pod`; resolves with the open attach once the program started (the
 * caller closes it when the run ends), rejects with {@link HandOverError} when it did not.
 */
export async function handOver(api: Pick<KubeApi, 'attach'>, ns: string, pod: string, spec: RunSpec, o: HandOverOptions): Promise<AttachSession> {
  let started!: () => void;
  let failed!: (why: string) => void;
  const ack = new Promise<void>((resolve, reject) => {
    started = resolve;
    failed = (why) => reject(new HandOverError(`the program never reached the run pod: ${why}`));
  });
  ack.catch(() => undefined);
  let line = '';
  const session = await api.attach(ns, pod, CONTAINERS.collector, (chunk) => {
    line += chunk.toString('utf8');
    let nl: number;
    while ((nl = line.indexOf('\n')) >= 0) {
      const text = line.slice(0, nl).trim();
      line = line.slice(nl + 1);
      const done = /^done (-?\d+)$/.exec(text);
      if (text === 'execution') started();
      else if (done) {
        started();
        o.onDone(Number(done[1]));
      } else if (text.startsWith('undelivered')) failed(`its collector said: ${text.slice('undelivered'.length).trim() || 'undelivered'}`);
    }
    if (line.length > 4096) line = '';
  });
  void session.ended.then(() => failed('the attach to its collector ended before the program started'));
  let timer: NodeJS.Timeout | undefined;
  try {
    const payload = handOverPayload(spec);
    for (let i = 0; i < payload.length; i += FRAME_BYTES) await session.send(payload.subarray(i, i + FRAME_BYTES));
    await Promise.race([
      ack,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new HandOverError(`the program never reached the run pod: no answer within ${o.timeoutMs} ms`)), o.timeoutMs);
      }),
    ]);
    return session;
  } catch (err) {
    session.close();
    throw err instanceof HandOverError ? err : new HandOverError(`the program never reached the run pod: ${err instanceof Error ? err.message : String(err)}`);
  } finally {
    clearTimeout(timer);
  }
}
