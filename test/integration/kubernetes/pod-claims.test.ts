/**
 * What an attach pod's claim says (runs/claim.ts), against the fake API server running the real
 * runner and deliver.py: a collector the kubelet still reports as not started, while the container
 * runtime runs it, may already hold the program; only the runtime's own refusal, with the status,
 * makes "never reached" believable.
 */
import { pino } from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { systemClock } from '../../../src/clock.ts';
import { ExecError, KubeApi } from '../../../src/kube/index.ts';
import { FENCE_COMMAND, LABELS } from '../../../src/runtime/kubernetes/names.ts';
import { coldAttachJob } from '../../../src/runtime/kubernetes/pool/pool-plan.ts';
import { PodClaims, runtimeSaysNotRunning } from '../../../src/runtime/kubernetes/runs/claim.ts';
import { handOverPayload } from '../../../src/runtime/kubernetes/runs/hand-over.ts';
import { shippedSources, sourcesConfigMap, sourcesName } from '../../../src/runtime/kubernetes/runs/runner-sources.ts';
import type { RunSpec } from '../../../src/runtime/runtime.ts';
import { FakeKube, spec, testConfig } from '../../support/kube-runtime.ts';

const NS = 'sandpod-jobs';
const texts = shippedSources();

describe('runtimeSaysNotRunning: which exec refusals speak for the container runtime', () => {
  it.each([
    ['the kubelet, container not created (kcluster 1.20)', new ExecError('exec refused: HTTP 500 container not found ("collector")', 500), true],
    ['the kubelet, attach wording', new ExecError('attach refused: HTTP 500 container collector not found in pod p_ns', 500), true],
    ['containerd, created but not started', new ExecError('exec refused: HTTP 500 container is in CONTAINER_CREATED state', 500), true],
    ['wrapped by KubeApi (the cause chain)', new Error('exec: HTTP 500', { cause: new ExecError('exec refused: HTTP 500 container not found ("collector")', 500) }), true],
    ['the API server loaded', new ExecError('exec refused: HTTP 429 too many requests', 429), false],
    ['the kubelet not answering', new ExecError('exec refused: HTTP 500 error dialing backend: i/o timeout', 500), false],
    ['no answer to the upgrade (no HTTP status)', new ExecError('exec: no answer within 15000 ms'), false],
    ['a message alone, not a refusal', new Error('container not found'), false],
  ])('%s', (_what, err, expected) => {
    expect(runtimeSaysNotRunning(err)).toBe(expected);
  });
});

describe('PodClaims on the fake API server (real runner and deliver.py)', () => {
  let fake: FakeKube;
  let api: KubeApi;
  const lines: Record<string, unknown>[] = [];
  const log = pino({ level: 'info' }, { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, unknown>) });

  /** `runWarmPods`: the fake starts attach pods' runner and deliver.py; without, their containers never start. */
  async function startFake(runWarmPods: boolean): Promise<void> {
    lines.length = 0;
    fake = await FakeKube.start({ runWarmPods, schedulePods: true });
    fake.addRuntimeClass('gvisor');
    api = new KubeApi(fake.kubeConfig());
  }
  afterEach(async () => {
    fake.onExec(null);
    await fake.close();
  });

  async function attachPod(s: RunSpec, started = true): Promise<string> {
    const cfg = testConfig({ kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false } });
    await api.createConfigMap(sourcesConfigMap(NS, 'sandpod', texts)).catch(() => undefined); // made once per fake
    await api.createJob(coldAttachJob(s, cfg, { name: `sp-${s.executionId}`, runtimeClassName: 'gvisor', sources: sourcesName(texts), graceSec: 5 }));
    const find = () => fake.list('pods', NS).find((p) => p.metadata.labels?.[LABELS.executionId] === s.executionId)?.metadata.name as string | undefined;
    await fake.waitFor(() => !!find() && (!started || fake.processAlive(find()!, 'collector')), 5000, 'the pod (and its collector process)');
    return find()!;
  }

  it('a collector that runs and took the program while the kubelet still says it has not started, its fence execs failing (a starved node): started, never "never reached"', async () => {
    await startFake(true);
    // The kubelet reports the start 9 s late; the runtime has the collector from the first moment.
    fake.statusLagMs = 9000;
    const s = spec({ code: 'print("taken")' });
    const pod = await attachPod(s);
    const attach = await api.attach(NS, pod, 'collector', () => undefined);
    await attach.send(handOverPayload({ code: s.code, inputJson: s.inputJson, timeoutSec: s.timeoutSec, maxStdoutBytes: s.maxStdoutBytes }));
    await fake.waitFor(() => fake.logOf(pod, 'collector').includes('execution'), 5000, 'the program started');
    expect(fake.list('pods', NS).find((p) => p.metadata.name === pod)?.status?.containerStatuses?.find((c: { name: string }) => c.name === 'collector')?.state?.waiting).toBeTruthy();
    // Each fence exec fails without an answer from the claim for 6.5 s, longer than a status that
    // says "not started" is believed on its own.
    const until = Date.now() + 6500;
    fake.onExec((call) => (call.command.join(' ') === FENCE_COMMAND.join(' ') && Date.now() < until ? { exitCode: 1, stderr: 'error: unable to upgrade connection', delayMs: 200 } : undefined));
    const answer = await new PodClaims({ api, ns: NS, clock: systemClock, log }).of(pod, s.executionId);
    expect(answer).toBe('started');
    expect(lines.filter((l) => l.msg === 'the program never reached this pod')).toEqual([]);
    attach.close();
  }, 30_000);

  it('a collector the kubelet reports not started and the runtime refuses to exec in: never reached, after a while, and the log says why', async () => {
    // The pod is scheduled and its containers never start: ContainerCreating, and the kubelet
    // refuses an exec for the runtime not having the container.
    await startFake(false);
    const s = spec({ code: 'print("x")' });
    const pod = await attachPod(s, false);
    const t0 = Date.now();
    const answer = await new PodClaims({ api, ns: NS, clock: systemClock, log }).of(pod, s.executionId);
    expect(answer).toBe('never');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(5000);
    expect(lines.find((l) => l.msg === 'the program never reached this pod')).toMatchObject({ execution_id: s.executionId, pod, why: expect.stringContaining('has not started') });
  }, 30_000);
});
