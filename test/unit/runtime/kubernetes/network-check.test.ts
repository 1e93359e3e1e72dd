/**
 * The network check (issue 23 item 2): the canary Job is a `network: none` run pod's sandbox, its
 * script connects to the service's Service, and the verdict is a pure function of the pod as the
 * informer sees it and the time. The script is run here for real: with a network it reaches a
 * listener; in a network namespace of its own, and under runsc `--network=none`, it does not.
 */
import { spawn, spawnSync } from 'node:child_process';
import net from 'node:net';
import os from 'node:os';
import type { V1Pod } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildNetworkCheckJob, NETWORK_CHECK_ROLE, NETWORK_CHECK_SCRIPT, NetworkCheck, networkCheckVerdict, parseNetworkReport } from '../../../../src/runtime/kubernetes/checks/network-check.ts';
import { PREFLIGHT_LABEL } from '../../../../src/runtime/kubernetes/checks/preflight.ts';
import { unknownFields, validateJob } from '../../../support/k8s-schema.ts';
import { testConfig } from '../../../support/kube-runtime.ts';

const report = (result: Record<string, unknown>, target = '10.96.0.12:8000') => JSON.stringify({ sandpod_network_check: 1, target, result });
const pod = (state: object | undefined): V1Pod => ({ status: { phase: 'Running', containerStatuses: state ? [{ name: 'canary', image: 'x', imageID: '', ready: false, restartCount: 0, state }] : [] } }) as V1Pod;
const terminated = (message: string | undefined, exitCode = 0, reason = 'Completed') => pod({ terminated: { exitCode, reason, message } });

describe('buildNetworkCheckJob', () => {
  const config = testConfig({ kubernetes: { executor_image: 'reg/exec:1', instance: 'blue', runs_namespace: 'runs', runtime_class_network_none: 'gvisor-nonet' } });
  const job = buildNetworkCheckJob(config, { name: 'sp-netcheck-x', runtimeClassName: 'gvisor', target: { host: '10.96.0.12', port: 8000 }, retrySec: 90 });
  const spec = job.spec!.template.spec!;

  it('is a valid batch/v1 Job with only fields Kubernetes 1.20 knows', () => {
    expect(() => validateJob(job)).not.toThrow();
    expect(unknownFields(job, 'io.k8s.api.batch.v1.Job')).toEqual([]);
  });

  it('is a network none run pod: its labels (NetworkPolicy selects them), no resolver, the network-none RuntimeClass', () => {
    for (const labels of [job.metadata!.labels!, job.spec!.template.metadata!.labels!]) {
      expect(labels).toMatchObject({ 'app.kubernetes.io/managed-by': 'sandpod', 'sandpod.io/instance': 'blue', 'sandpod.io/network': 'none', [PREFLIGHT_LABEL]: NETWORK_CHECK_ROLE });
    }
    expect(spec.dnsPolicy).toBe('None');
    expect(spec.dnsConfig!.nameservers).toEqual(['127.0.0.1']);
    expect(spec.runtimeClassName).toBe('gvisor-nonet');
    expect(spec.automountServiceAccountToken).toBe(false);
    expect(spec.enableServiceLinks).toBe(false);
    expect(spec.containers[0]!.command!.slice(-3)).toEqual(['10.96.0.12', '8000', '90']);
  });

  it('without a network-none class it runs under the run class, and under none in permissive mode without gVisor', () => {
    const plain = testConfig({ kubernetes: { executor_image: 'reg/exec:1' } });
    expect(buildNetworkCheckJob(plain, { name: 'n', runtimeClassName: 'gvisor', target: { host: '10.0.0.1', port: 80 }, retrySec: 1 }).spec!.template.spec!.runtimeClassName).toBe('gvisor');
    expect(buildNetworkCheckJob(config, { name: 'n', runtimeClassName: null, target: { host: '10.0.0.1', port: 80 }, retrySec: 1 }).spec!.template.spec!.runtimeClassName).toBeUndefined();
  });
});

describe('networkCheckVerdict', () => {
  it.each([
    ['not seen yet', undefined, 1_000, 'running'],
    ['pending', pod({ waiting: { reason: 'ContainerCreating' } }), 1_000, 'running'],
    ['connected: not isolated', terminated(report({ reached: true, attempts: 1 })), 1_000, 'not_isolated'],
    ['timed out connecting (a dropping policy)', terminated(report({ reached: false, refused: false, error: 'TimeoutError: timed out' })), 1_000, 'isolated'],
    ['unreachable (runsc --network=none)', terminated(report({ reached: false, refused: false, error: 'OSError: [Errno 113] No route to host' })), 1_000, 'isolated'],
    ['refused to the end (no ready endpoint)', terminated(report({ reached: false, refused: true, error: 'ConnectionRefusedError' })), 1_000, 'inconclusive'],
    ['no report', terminated('Traceback ...', 1, 'Error'), 1_000, 'inconclusive'],
    ['image missing', pod({ waiting: { reason: 'ImagePullBackOff' } }), 1_000, 'inconclusive'],
    ['could not start', terminated('oci runtime error', 128, 'StartError'), 1_000, 'inconclusive'],
    ['never scheduled (RuntimeClass handler missing on the node)', pod({ waiting: { reason: 'ContainerCreating' } }), 300_000, 'inconclusive'],
    ['no pod at all past the deadline', undefined, 300_000, 'inconclusive'],
  ] as const)('%s → %s', (_name, p, elapsed, want) => {
    expect(networkCheckVerdict(p, elapsed, 240_000).status).toBe(want);
  });

  it('the not-isolated reason says "network policy not enforced" and names the target', () => {
    const v = networkCheckVerdict(terminated(report({ reached: true })), 0, 1);
    expect(v).toMatchObject({ status: 'not_isolated', target: '10.96.0.12:8000' });
    expect(NetworkCheck.problem(v)).toMatch(/^network policy not enforced: .*10\.96\.0\.12:8000/);
    expect(NetworkCheck.problem(networkCheckVerdict(terminated(report({ reached: false, error: 'x' })), 0, 1))).toBeNull();
    expect(NetworkCheck.problem({ status: 'inconclusive', reason: 'x' })).toBeNull();
    expect(NetworkCheck.problem({ status: 'failed', reason: 'RuntimeClass x does not exist' })).toMatch(/^network check failed: RuntimeClass x/);
  });
});

/** The machine's first non-loopback IPv4 address (the canary must reach it over a real interface). */
const hostAddress = Object.values(os.networkInterfaces()).flat().find((a) => a && a.family === 'IPv4' && !a.internal)?.address;
const runsc = spawnSync('sh', ['-c', 'command -v runsc'], { encoding: 'utf8' }).stdout.trim();
const isRoot = process.getuid?.() === 0;

describe.skipIf(!hostAddress)('the canary script, run for real', () => {
  let server: net.Server;
  let port = 0;
  beforeAll(async () => {
    server = net.createServer((s) => s.end());
    await new Promise<void>((r) => server.listen(0, '0.0.0.0', r));
    port = (server.address() as net.AddressInfo).port;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  const run = (prefix: string[], target: string, p: number, wait = 0) => {
    const argv = [...prefix, '/usr/bin/python3', '-I', '-c', NETWORK_CHECK_SCRIPT, target, String(p), String(wait)];
    const r = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8', timeout: 60_000 });
    return { ...r, report: parseNetworkReport(r.stdout) };
  };

  it('with a network it reaches a listener: not isolated', () => {
    const r = run([], hostAddress!, port);
    expect(r.report).toMatchObject({ target: `${hostAddress}:${port}`, reached: true });
    expect(networkCheckVerdict(terminated(r.stdout), 0, 1).status).toBe('not_isolated');
  });

  it('a closed port is refused, and retried for the given time (a Service without endpoints): inconclusive', () => {
    const t0 = Date.now();
    const r = run([], '127.0.0.1', 1, 3);
    expect(r.report).toMatchObject({ reached: false, refused: true });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(2_000);
    expect(networkCheckVerdict(terminated(r.stdout), 0, 1).status).toBe('inconclusive');
  });

  it('a connect that times out is tried again until the window ends (a Service whose rules are not on the node yet): reached later, not isolated', async () => {
    // A listener whose accept queue is full drops new SYNs, so a connect times out (no errno), as
    // it does towards a ClusterIP kube-proxy has not written rules for yet; after 6 s (longer than one
    // 5 s attempt) it drains its queue and accepts.
    const listener = spawn('/usr/bin/python3', ['-I', '-c', [
      'import socket, sys, time',
      "l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(0)",
      'fill = []',
      'for _ in range(3):',
      '    c = socket.socket(); c.setblocking(False)',
      "    try: c.connect(l.getsockname())",
      '    except BlockingIOError: pass',
      '    fill.append(c)',
      'print(l.getsockname()[1], flush=True)',
      'time.sleep(6)',
      'l.settimeout(30)',
      'while True: l.accept()[0].close()',
    ].join('\n')], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      const listenPort = Number(await new Promise<string>((r) => listener.stdout!.once('data', (d: Buffer) => r(d.toString()))));
      const t0 = Date.now();
      const r = await new Promise<{ stdout: string }>((resolve) => {
        const c = spawn('/usr/bin/python3', ['-I', '-c', NETWORK_CHECK_SCRIPT, '127.0.0.1', String(listenPort), '20']);
        let stdout = '';
        c.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
        c.on('close', () => resolve({ stdout }));
      });
      const doc = JSON.parse(r.stdout) as { result: { reached: boolean; attempts: number } };
      expect(doc.result.reached, r.stdout).toBe(true);
      expect(doc.result.attempts).toBeGreaterThanOrEqual(2);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(5_000);
      expect(networkCheckVerdict(terminated(r.stdout), 0, 1).status).toBe('not_isolated');
    } finally {
      listener.kill('SIGKILL');
    }
  }, 60_000);

  it.skipIf(!isRoot)('in a network namespace of its own (what a pod without a network gets) it cannot: isolated', () => {
    const r = run(['unshare', '-n'], hostAddress!, port);
    expect(r.report).toMatchObject({ reached: false, refused: false });
    expect(networkCheckVerdict(terminated(r.stdout), 0, 1).status).toBe('isolated');
  });

  it.skipIf(!isRoot || !runsc)('under runsc --network=none (the network-none RuntimeClass handler) it cannot: isolated', () => {
    const r = run([runsc, '--network=none', '--platform=ptrace', 'do'], hostAddress!, port);
    expect(r.report, r.stderr).toMatchObject({ reached: false, refused: false });
    expect(networkCheckVerdict(terminated(r.stdout), 0, 1).status).toBe('isolated');
  }, 90_000);
});
