/**
 * The hand-over of a program to a pod that waits for it (a claimed warm pool pod, or a cold pod
 * started the same way): the service attaches to the pod's `collector` (deliver.py), sends one header
 * line and the program and input bytes; the collector writes them into the volumes `main` mounts
 * read-only, then passes the go line to `main`'s runner over loopback and relays the runner's phase
 * lines back on its stdout (see pool-plan.ts). The hand-over has succeeded once `execution` comes
 * back: the runner has started the program. Until then nothing of the user's has run, so a failure
 * here (an attach that drops or is refused, a collector that reports `undelivered`, no answer within
 * the limit) may be retried on another pod without running the program twice.
 *
 * A warm run opens the attach while its claim is still being decided ({@link openCollector}): the
 * upgrade through API server and kubelet overlaps the claim's patch. Nothing is written on it until
 * the claim won, and nothing read from it is used before: attaching starts nothing in the pod (the
 * collector waits for its header line). An attach whose claim was lost is never closed by us: with
 * `stdinOnce` the container runtime closes the container's stdin when an attach ends, which would cut
 * the hand-over of the run that did win the pod. It stays open, unread, until the pod ends it.
 */
import { PassThrough } from 'node:stream';
import type { AttachSession, KubeApi } from '../../../kube/index.ts';
import { runEnv, type RunSpec } from '../../runtime.ts';
import { CONTAINERS } from '../names.ts';
import { CollectorStream } from './collector-stream.ts';
import { parseOutputTar, type CollectedOutput, type OutputLimits } from './output-tar.ts';

/** Frames the payload is sent in (a real API server and kubelet relay frames of any size; smaller ones keep memory flat). */
const FRAME_BYTES = 256 * 1024;

/** The hand-over failed before the program started: the run may be retried elsewhere. */
export class HandOverError extends Error {
  override readonly name: string = 'HandOverError';
}

/** The attach ended before the program started (the collector may have just ended: its status says why). */
export class AttachEndedError extends HandOverError {
  override readonly name = 'AttachEndedError';
}

/** What {@link handOver} reports while the run goes on. */
export interface HandOverOptions {
  /** The runner said `done N`: the program ended and its outputs are written. */
  onDone: (exitCode: number) => void;
  /**
   * The collector is sending the outputs on the attach: `output` settles once `done` came, with what
   * was read (null when incomplete or unreadable: the controller pulls them by exec then). Resolves
   * true when the outputs were taken: the collector is released.
   */
  onOutputs: (output: Promise<CollectedOutput | null>) => Promise<boolean>;
  /** Limits the outputs sent on the attach are read with (as an exec'd collection would be). */
  limits: OutputLimits;
  /** How long the program may take to start after the payload was sent, ms. */
  timeoutMs: number;
  /** The run's egress proxy URL, with its credential: the runner points the program's proxy variables at it. */
  proxy?: string | null;
  /**
   * Asked once the attach is open, right before the payload's first byte: an error when the run is
   * no longer this process's to start (given back on shutdown or taken over while the attach was
   * opening, which under load takes seconds), null to go on. Nothing is sent then: the attach
   * closes, the collector finds its stdin closed with no program (it exits 3), the hand-over rejects
   * with that error and the run's next holder sees a pod that ran nothing. Without this, an attach
   * opened before the run was given back could hand the program to a collector that had not been
   * running when the next holder asked its claim.
   */
  stopBeforeSending?: () => Error | null;
}

/**
 * The bytes the collector reads: a header line, then the program, then its input (deliver.py). The
 * header's `go` object is the runner's go line: the runner adds `env` to the program's environment
 * (its TRACEPARENT) and points its proxy variables at `proxy` (the run's egress proxy URL with its
 * credential), both bound to this run only (a pool pod is made before any run exists).
 */
export function handOverPayload(spec: Pick<RunSpec, 'code' | 'inputJson' | 'timeoutSec' | 'maxStdoutBytes' | 'traceparent'>, proxy: string | null = null): Buffer {
  const code = Buffer.from(spec.code, 'utf8');
  const input = Buffer.from(spec.inputJson, 'utf8');
  const env = runEnv(spec);
  const go = { timeout: spec.timeoutSec, max_stream_bytes: spec.maxStdoutBytes, ...(Object.keys(env).length ? { env } : {}), ...(proxy ? { proxy } : {}) };
  const header = { code: code.length, input: input.length, go };
  return Buffer.concat([Buffer.from(JSON.stringify(header) + '\n', 'utf8'), code, input]);
}

/** An attach to a pod's collector opened before its claim was decided (see the module comment). */
export interface CollectorAttach {
  readonly pod: string;
  /** The attach; rejects when the upgrade was refused or failed. */
  readonly session: Promise<AttachSession>;
  /** From now on its stdout goes to `onStdout` (before: dropped; the collector says nothing before its payload). */
  listen(onStdout: (chunk: Buffer) => void): void;
  /** The claim was lost or failed: never written to, never read, left open (see the module comment). */
  abandon(): void;
}

/** Starts attaching to `pod`'s collector; see {@link CollectorAttach}. */
export function openCollector(api: Pick<KubeApi, 'attach'>, ns: string, pod: string): CollectorAttach {
  let sink: ((chunk: Buffer) => void) | null = null;
  const session = api.attach(ns, pod, CONTAINERS.collector, (chunk) => sink?.(chunk));
  session.catch(() => undefined);
  return {
    pod,
    session,
    listen: (onStdout) => (sink = onStdout),
    abandon: () => (sink = null),
  };
}

/**
 * Hands `spec`'s program to `pod` (through `opened` when the attach was opened already); resolves with the open attach once the program started (the
 * caller closes it when the run ends), rejects with {@link HandOverError} when it did not.
 */
export async function handOver(api: Pick<KubeApi, 'attach'>, ns: string, pod: string, spec: RunSpec, o: HandOverOptions, opened?: CollectorAttach): Promise<AttachSession> {
  let started!: () => void;
  let failed!: (why: string, Kind?: typeof HandOverError) => void;
  const ack = new Promise<void>((resolve, reject) => {
    started = resolve;
    failed = (why, Kind = HandOverError) => reject(new Kind(`the program never reached the run pod: ${why}`));
  });
  ack.catch(() => undefined);
  // The outputs archive, when the collector sends it (before `done`).
  let outputs: { pipe: PassThrough; parsing: Promise<CollectedOutput>; ok: boolean; settle: (o: Promise<CollectedOutput | null> | null) => void } | null = null;
  let session: AttachSession | null = null;
  const stream = new CollectorStream({
    outputsStart: () => {
      const pipe = new PassThrough();
      const parsing = parseOutputTar(pipe, o.limits).finally(() => pipe.resume());
      parsing.catch(() => undefined);
      let settle!: (v: Promise<CollectedOutput | null> | null) => void;
      const read = new Promise<CollectedOutput | null>((resolve) => (settle = resolve));
      outputs = { pipe, parsing, ok: false, settle };
      void o.onOutputs(read).then((taken) => {
        // The service has the outputs: the collector may go (the pod completes).
        if (taken) session?.send('release\n').catch(() => undefined);
      });
    },
    outputsData: (chunk) => outputs?.pipe.write(chunk),
    outputsEnd: () => outputs?.pipe.end(),
    line: (text) => {
      const done = /^done (-?\d+)$/.exec(text);
      if (text === 'execution') started();
      else if (text === 'outputs-end ok' && outputs) outputs.ok = true;
      else if (done) {
        started();
        // The done line first (it sets the exit code the outputs are judged with), then the outputs.
        o.onDone(Number(done[1]));
        const sent = outputs;
        outputs = null;
        sent?.settle(sent.ok ? sent.parsing.catch(() => null) : null);
      } else if (text.startsWith('undelivered')) failed(`its collector said: ${text.slice('undelivered'.length).trim() || 'undelivered'}`);
    },
  });
  const attach = opened?.pod === pod ? opened : openCollector(api, ns, pod);
  attach.listen((chunk) => stream.feed(chunk));
  session = await attach.session;
  const stop = o.stopBeforeSending?.() ?? null;
  if (stop) {
    session.close();
    throw stop;
  }
  void session.ended.then(() => {
    failed('the attach to its collector ended before the program started', AttachEndedError);
    outputs?.pipe.end();
    outputs?.settle(null);
  });
  let timer: NodeJS.Timeout | undefined;
  try {
    const payload = handOverPayload(spec, o.proxy ?? null);
    // A send fails only on a stream that is closing or closed: the attach ended (see above).
    const sent = (async () => {
      for (let i = 0; i < payload.length; i += FRAME_BYTES) await session.send(payload.subarray(i, i + FRAME_BYTES));
    })();
    await sent.catch((err: unknown) => {
      throw new AttachEndedError(`the program never reached the run pod: ${err instanceof Error ? err.message : String(err)}`);
    });
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
