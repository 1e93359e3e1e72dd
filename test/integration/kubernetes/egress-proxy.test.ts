/**
 * Against the fake API server: with `kubernetes.egress_proxy` configured, the pod of a `bridge` run
 * with allowed_hosts gets the proxy env (a credential for that run, signed with the key file, valid
 * through the Job's deadline) and the label the chart's NetworkPolicies select; other runs do not.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyEgressToken } from '../../../src/egress/token.ts';
import type { Runtime, RunSpec } from '../../../src/runtime/runtime.ts';
import { FakeKube, jobType, podOf, spec, startRuntime, testConfig } from '../../support/kube-runtime.ts';

const KEY = 'fake-kube-egress-key-of-at-least-32-bytes';
const NOW = Date.UTC(2026, 10, 24, 1, 0, 0);
let fake: FakeKube;
let rt: Runtime;
let keyFile: string;

beforeAll(async () => {
  fake = await FakeKube.start();
  fake.addRuntimeClass('gvisor');
  keyFile = path.join(mkdtempSync(path.join(tmpdir(), 'egress-key-')), 'key');
  writeFileSync(keyFile, `${KEY}\n`); // as a Secret volume may hold it, with a newline
  const config = testConfig({ kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false, egress_proxy: { url: 'http://egress.sandpod.svc:3128', key_file: keyFile } } });
  rt = await startRuntime(fake, { config, options: { clock: { now: () => NOW } } });
});
afterAll(async () => {
  await rt?.stop();
  await fake?.close();
});

/** Starts a run, returns its pod's runner `--env` pairs and labels, then cancels it. */
async function podEnv(s: RunSpec): Promise<{ env: Record<string, string>; labels: Record<string, string> }> {
  const ac = new AbortController();
  const running = rt.run(s, { signal: ac.signal });
  const podName = await podOf(fake, s);
  const pod = fake.get('pods', 'sandpod-jobs', podName)!;
  const cmd: string[] = pod.spec.containers.find((c: { name: string }) => c.name === 'main').command;
  const env: Record<string, string> = {};
  cmd.forEach((a, i) => {
    if (a === '--env') env[cmd[i + 1]!.split('=')[0]!] = cmd[i + 1]!.slice(cmd[i + 1]!.indexOf('=') + 1);
  });
  ac.abort();
  await running;
  return { env, labels: pod.metadata.labels ?? {} };
}

describe('egress proxy env on run pods (fake API server)', () => {
  it('a bridge run with allowed_hosts gets HTTP(S)_PROXY with its own credential and the egress label', async () => {
    const t = jobType({ name: 'http', network: { mode: 'bridge', allowed_hosts: ['api.github.com:443', '10.244.0.1'] } });
    const s = spec({ jobType: t });
    const { env, labels } = await podEnv(s);
    expect(labels['sandpod.io/egress']).toBe('proxy');
    for (const k of ['HTTP_PROXY', 'HTTPS_PROXY', 'http_proxy', 'https_proxy']) expect(env[k]).toBe(env.HTTP_PROXY);
    expect([env.NO_PROXY, env.no_proxy]).toEqual(['', '']);
    const url = new URL(env.HTTP_PROXY!);
    // A name the service cannot resolve (no cluster DNS here) is passed on as it is.
    expect(url.host).toBe('egress.sandpod.svc:3128');
    expect(decodeURIComponent(url.username)).toBe(s.executionId);
    // Signed with the key file's key (the trailing newline is not part of it), for this run's patterns.
    const v = verifyEgressToken(url.password, KEY, NOW);
    expect(v).toMatchObject({ grant: { executionId: s.executionId, allowedHosts: ['api.github.com:443', '10.244.0.1'] } });
    // Valid past the Job's deadline (startup + timeout + grace), not for ever.
    const deadline = NOW + (s.startupTimeoutSec + s.timeoutSec + 5) * 1000;
    expect('grant' in verifyEgressToken(url.password, KEY, deadline)).toBe(true);
    expect(verifyEgressToken(url.password, KEY, deadline + 3600_000)).toEqual({ refused: 'expired' });
  });

  it.each([
    ['network none', jobType()],
    ['bridge without allowed_hosts', jobType({ name: 'open', network: { mode: 'bridge' } })],
  ])('%s: no proxy env, no egress label', async (_name, t) => {
    const { env, labels } = await podEnv(spec({ jobType: t }));
    expect(labels['sandpod.io/egress']).toBeUndefined();
    expect(Object.keys(env).filter((k) => /proxy/i.test(k))).toEqual([]);
  });
});

describe('egress proxy address', () => {
  it('a proxy name the service resolves reaches the pod as an address: the pod needs no DNS', async () => {
    const config = testConfig({ kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false, egress_proxy: { url: 'http://localhost:3128', key_file: keyFile } } });
    const rt2 = await startRuntime(fake, { config, options: { clock: { now: () => NOW } } });
    try {
      const t = jobType({ name: 'http', network: { mode: 'bridge', allowed_hosts: ['api.github.com:443'] } });
      const s = spec({ jobType: t });
      const ac = new AbortController();
      const running = rt2.run(s, { signal: ac.signal });
      const pod = fake.get('pods', 'sandpod-jobs', await podOf(fake, s))!;
      ac.abort();
      await running;
      const cmd: string[] = pod.spec.containers.find((c: { name: string }) => c.name === 'main').command;
      const proxy = cmd[cmd.findIndex((a) => a.startsWith('HTTP_PROXY='))]!.slice('HTTP_PROXY='.length);
      expect(['127.0.0.1:3128', '[::1]:3128']).toContain(new URL(proxy).host);
      expect('grant' in verifyEgressToken(new URL(proxy).password, KEY, NOW)).toBe(true);
    } finally {
      await rt2.stop();
    }
  });
});

describe('egress proxy misconfigured', () => {
  it('an unreadable key file fails the run with a message naming the setting', async () => {
    const f2 = await FakeKube.start();
    f2.addRuntimeClass('gvisor');
    const config = testConfig({ kubernetes: { executor_image: 'x', preflight: false, egress_proxy: { url: 'http://egress:3128', key_file: '/nonexistent/key' } } });
    const rt2 = await startRuntime(f2, { config });
    try {
      const t = jobType({ name: 'http', network: { mode: 'bridge', allowed_hosts: ['pypi.org'] } });
      await expect(rt2.run(spec({ jobType: t }))).rejects.toThrow(/kubernetes\.egress_proxy\.key_file: cannot read \/nonexistent\/key/);
      // Nothing of the run was created (the leader Lease is the replica's, not the run's).
      expect(f2.requests.filter((r) => r.method === 'POST' && !r.path.includes('/leases'))).toEqual([]);
    } finally {
      await rt2.stop();
      await f2.close();
    }
  });
});
