/**
 * The fake API server behaves like a real one where the runtime depends on it (issue #9): pods are
 * deleted with their own grace period and linger terminating while their containers stop, an exec
 * channel opens with the empty frames a real server sends, and the collector's archive comes from
 * the real `tar` command.
 */
import net from 'node:net';
import { PassThrough } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { execInContainer } from '../../../src/kube/exec.ts';
import { KubeApi } from '../../../src/kube/kube-api.ts';
import { parseOutputTar } from '../../../src/runtime/kubernetes/runs/output-tar.ts';
import { FakeKube, type KObj } from '../../support/fake-kube/server.ts';

const NS = 'sandpod-jobs';
let fake: FakeKube;
let api: KubeApi;

beforeAll(async () => {
  fake = await FakeKube.start({ podDeletionDelayMs: 200, sigtermIgnoredBy: ['stubborn'] });
  api = new KubeApi(fake.kubeConfig());
});
afterAll(async () => {
  await fake?.close();
});

let seq = 0;
/** A Job whose pod runs the given containers; returns the pod's name. */
async function jobWithPod(containers: string[] = ['main', 'collector'], grace?: number): Promise<{ job: string; pod: string }> {
  const job = `fk-${++seq}`;
  await api.createJob({
    metadata: { name: job, namespace: NS },
    spec: {
      template: {
        spec: {
          restartPolicy: 'Never',
          ...(grace !== undefined ? { terminationGracePeriodSeconds: grace } : {}),
          containers: containers.map((name) => ({ name, image: 'x' })),
        },
      },
    },
  });
  return { job, pod: await fake.waitForPod(job) };
}

const containerState = (p: KObj | undefined, name: string) => (p?.status.containerStatuses as { name: string; state: any }[] | undefined)?.find((c) => c.name === name)?.state;

describe('fake API server: pod deletion as a real cluster does it', () => {
  it('a running pod lingers with deletionTimestamp (its own grace period), its containers move to terminated, then it goes', async () => {
    const { pod } = await jobWithPod(['main', 'collector'], 5);
    fake.mainRunning(pod);
    const t0 = Date.now();
    fake.deletePod(pod);
    const terminating = fake.get('pods', NS, pod)!;
    expect(terminating.metadata.deletionTimestamp).toBeDefined();
    expect(terminating.metadata.deletionGracePeriodSeconds).toBe(5);
    expect(Date.parse(terminating.metadata.deletionTimestamp!) - t0).toBeGreaterThan(3000);
    await fake.waitFor(() => containerState(fake.get('pods', NS, pod), 'main')?.terminated !== undefined, 2000, 'containers stopped');
    const stopped = fake.get('pods', NS, pod)!;
    // The runner kills the program and exits 137; the collector traps TERM and exits 0.
    expect(containerState(stopped, 'main').terminated).toMatchObject({ exitCode: 137 });
    expect(containerState(stopped, 'collector').terminated).toMatchObject({ exitCode: 0, reason: 'Completed' });
    expect(stopped.status.phase).toBe('Failed');
    await fake.waitFor(() => !fake.get('pods', NS, pod), 2000, 'pod removed');
  });

  it("the delete's gracePeriodSeconds wins over the pod's; a container ignoring SIGTERM keeps the pod until the grace ends", async () => {
    const { pod } = await jobWithPod(['stubborn'], 30);
    fake.updatePod(pod, (p) => {
      p.spec.nodeName = 'fake-node';
      p.status.containerStatuses[0].state = { running: { startedAt: new Date().toISOString() } };
    });
    const t0 = Date.now();
    await api.core.deleteNamespacedPod({ namespace: NS, name: pod, gracePeriodSeconds: 1 });
    expect(fake.get('pods', NS, pod)?.metadata.deletionGracePeriodSeconds).toBe(1);
    await new Promise((r) => setTimeout(r, 300));
    expect(containerState(fake.get('pods', NS, pod), 'stubborn').running).toBeDefined();
    await fake.waitFor(() => !fake.get('pods', NS, pod), 3000, 'pod removed after its grace');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1000);
  });

  it('a pod not bound to a node, a finished pod, and a delete with grace 0 go at once', async () => {
    const unbound = (await jobWithPod()).pod;
    fake.deletePod(unbound);
    expect(fake.get('pods', NS, unbound)).toBeUndefined();
    const done = (await jobWithPod(['main'])).pod;
    fake.mainTerminated(done, 0);
    fake.deletePod(done);
    expect(fake.get('pods', NS, done)).toBeUndefined();
    const forced = (await jobWithPod()).pod;
    fake.mainRunning(forced);
    fake.deletePod(forced, 0);
    expect(fake.get('pods', NS, forced)).toBeUndefined();
  });

  it('a Job deleted with gracePeriodSeconds 0 and Background propagation: its pod still gets its own grace period', async () => {
    const { job, pod } = await jobWithPod(['main', 'collector'], 5);
    fake.mainRunning(pod);
    await api.deleteJob(NS, job);
    await fake.waitFor(() => fake.get('pods', NS, pod)?.metadata.deletionTimestamp !== undefined, 2000, 'pod terminating');
    expect(fake.get('pods', NS, pod)?.metadata.deletionGracePeriodSeconds).toBe(5);
    await fake.waitFor(() => !fake.get('pods', NS, pod), 2000, 'pod removed');
  });
});

describe('fake API server: exec', () => {
  it('opens stdout, stderr and the error channel with an empty frame, as a real server does', async () => {
    const { pod } = await jobWithPod();
    fake.mainRunning(pod);
    const url = `${fake.url.replace(/^http/, 'ws')}/api/v1/namespaces/${NS}/pods/${pod}/exec?command=true&container=collector&stdout=true&stderr=true`;
    const frames: Buffer[] = [];
    await new Promise<void>((resolve, reject) => {
      const ws = new WebSocket(url, ['v5.channel.k8s.io']);
      ws.on('message', (d: Buffer) => frames.push(Buffer.from(d)));
      ws.on('close', () => resolve());
      ws.on('error', reject);
    });
    expect(frames.slice(0, 3).map((f) => [...f])).toEqual([[1], [2], [3]]);
    // The status comes after them, on channel 3 with a payload.
    expect(frames.at(-1)![0]).toBe(3);
    expect(frames.at(-1)!.length).toBeGreaterThan(1);
  });

  it("the collector's archive is made by the real tar over the pod's /output, streamed as it runs", async () => {
    const { pod } = await jobWithPod();
    fake.mainRunning(pod);
    const big = Buffer.alloc(3 * 1024 * 1024, 7);
    fake.setOutput(pod, { stdout: 'hi\n', files: { 'big.bin': big, 'a.txt': 'a' } });
    const pipe = new PassThrough();
    const parsing = parseOutputTar(pipe, { maxArtifactBytes: 8 * 1024 * 1024, maxStdoutBytes: 100, maxTotalBytes: 64 * 1024 * 1024, maxEntries: 100 });
    const res = await execInContainer(fake.kubeConfig(), { namespace: NS, pod, container: 'collector', command: ['tar', '-C', '/output', '-cf', '-', '.'], stdout: pipe });
    const out = await parsing;
    expect(res.exitCode).toBe(0);
    expect(out.stdout).toBe('hi\n');
    expect(out.artifacts.map((a) => [a.name, a.size])).toEqual([
      ['a.txt', 1],
      ['big.bin', big.length],
    ]);
  });

  it("tar's own failure reaches the client as its exit status and stderr", async () => {
    const { pod } = await jobWithPod();
    fake.mainRunning(pod);
    const res = await execInContainer(fake.kubeConfig(), { namespace: NS, pod, container: 'collector', command: ['tar', '-C', '/output/missing', '-cf', '-', '.'] });
    expect(res.exitCode).toBe(2);
    expect(res.stderr).toMatch(/missing/);
  });
});

describe('fake API server: the ports of the pods it runs', () => {
  it('a port a socket on this machine already holds is never given to a pod (its runner could not bind it)', async () => {
    // Pods of the fake share the host's loopback, unlike a real cluster's: a listener of another
    // service (RabbitMQ's 25672 lies in the range) or of another test file's pods must be skipped.
    const holder = net.createServer();
    let held = 0;
    for (let tries = 0; held === 0 && tries < 20; tries++) {
      const port = 12_000 + Math.floor(Math.random() * 19_000);
      held = await new Promise<number>((resolve) => {
        holder.once('error', () => resolve(0));
        holder.listen(port, '127.0.0.1', () => resolve(port));
      });
    }
    expect(held).toBeGreaterThan(0);
    try {
      const ports = fake as unknown as { nextGoPort: number; takeGoPort(): number };
      ports.nextGoPort = held;
      const given = ports.takeGoPort();
      expect(given).not.toBe(held);
      expect(given).toBeGreaterThan(held);
    } finally {
      holder.close();
    }
  });
});
