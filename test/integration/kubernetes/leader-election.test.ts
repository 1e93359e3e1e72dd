/**
 * Leader election against the in-repo fake API server (optimistic concurrency on resourceVersion,
 * MicroTime checked like the real one), with a clock driven by hand: one leader among three, a
 * clean handover on stop, a silent death taken over only after a lease duration, and a leader cut
 * off from the API stepping down before anyone else may lead.
 */
import { V1MicroTime } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KubeApi } from '../../../src/kube/kube-api.ts';
import { kubeLeaseStore, LeaderElector, type LeaseStore } from '../../../src/kube/leader-elector.ts';
import { DEFAULT_TIMING } from '../../../src/kube/lease-decide.ts';
import { FakeKube } from '../../support/kube-runtime.ts';

let fake: FakeKube;
let api: KubeApi;
const NS = 'sandpod';

beforeAll(async () => {
  fake = await FakeKube.start();
  api = new KubeApi(fake.kubeConfig());
});
afterAll(async () => {
  await fake?.close();
});

function trio(lease: string, clock: { now(): number }, wrap: (s: LeaseStore, i: number) => LeaseStore = (s) => s) {
  const changes: string[] = [];
  const electors = ['r0', 'r1', 'r2'].map(
    (id, i) => new LeaderElector({ store: wrap(kubeLeaseStore(api, NS, lease), i), identity: id, timing: DEFAULT_TIMING, clock, onChange: (on) => changes.push(`${id}:${on ? 'up' : 'down'}`) }),
  );
  return { electors, changes, leaders: () => electors.filter((e) => e.leading).map((e) => e.identity) };
}

async function round(es: LeaderElector[]): Promise<void> {
  await Promise.all(es.map((e) => e.tick()));
}

describe('leader election over a Lease', () => {
  it('three replicas ticking at once: exactly one leads, the others follow it, and the Lease says who', async () => {
    const clock = { t: 1_000_000, now() { return this.t; } };
    const { electors, leaders } = trio('one-leader', clock);
    for (let i = 0; i < 5; i++) {
      await round(electors);
      expect(leaders()).toHaveLength(1);
      clock.t += 2_000;
    }
    const lease = await api.getLease(NS, 'one-leader');
    expect(lease?.spec?.holderIdentity).toBe(leaders()[0]);
    expect(electors.every((e) => e.holder === leaders()[0])).toBe(true);
    // Renewed in place: one acquisition, MicroTime with microseconds accepted by the server.
    expect(lease?.spec?.leaseTransitions).toBe(0);
    expect(new Date(lease!.spec!.renewTime!).getTime()).toBe(clock.t - 2_000);
  });

  it('a leader that stops releases the Lease, and another takes it on its next attempt', async () => {
    const clock = { t: 2_000_000, now() { return this.t; } };
    const { electors, leaders } = trio('handover', clock);
    await round(electors);
    const first = electors.find((e) => e.leading)!;
    await first.stop();
    expect(first.leading).toBe(false);
    expect((await api.getLease(NS, 'handover'))?.spec?.holderIdentity).toBe('');
    clock.t += 2_000; // one retry period, far less than the 15 s lease duration
    await round(electors.filter((e) => e !== first));
    expect(leaders()).toHaveLength(1);
    expect(leaders()[0]).not.toBe(first.identity);
    expect((await api.getLease(NS, 'handover'))?.spec?.leaseTransitions).toBe(1);
  });

  it('a leader releases with one write at the resourceVersion it last wrote, and reads first only after a conflict', async () => {
    const clock = { t: 2_500_000, now() { return this.t; } };
    const calls: string[] = [];
    const { electors } = trio('release-one-call', clock, (s, i) => ({
      get: () => (calls.push(`${i}:get`), s.get()),
      create: (r) => s.create(r),
      replace: (r) => (calls.push(`${i}:replace`), s.replace(r)),
    }));
    await round(electors);
    const i = electors.findIndex((e) => e.leading);
    calls.length = 0;
    await electors[i]!.stop();
    expect(calls).toEqual([`${i}:replace`]);
    expect((await api.getLease(NS, 'release-one-call'))?.spec?.holderIdentity).toBe('');

    // Renewed behind its back (a write it did not make): the release conflicts, reads, and still releases.
    const again = trio('release-conflict', clock, (s, j) => ({
      get: () => (calls.push(`${j}:get`), s.get()),
      create: (r) => s.create(r),
      replace: (r) => (calls.push(`${j}:replace`), s.replace(r)),
    }));
    await round(again.electors);
    const k = again.electors.findIndex((e) => e.leading);
    const lease = (await api.getLease(NS, 'release-conflict'))!;
    await api.replaceLease({ ...lease, spec: { ...lease.spec, renewTime: new V1MicroTime(clock.t + 1) } });
    calls.length = 0;
    await again.electors[k]!.stop();
    expect(calls).toEqual([`${k}:replace`, `${k}:get`, `${k}:replace`]);
    expect((await api.getLease(NS, 'release-conflict'))?.spec?.holderIdentity).toBe('');
  });

  it('a leader that dies silently is replaced only after a whole lease duration as the others observed it', async () => {
    const clock = { t: 3_000_000, now() { return this.t; } };
    const { electors, leaders } = trio('silent', clock);
    await round(electors);
    const dead = electors.find((e) => e.leading)!;
    const rest = electors.filter((e) => e !== dead);
    const seen: number[] = [];
    for (let elapsed = 0; elapsed <= 20_000; elapsed += 2_000) {
      clock.t += 2_000;
      await round(rest);
      if (rest.some((e) => e.leading)) seen.push(elapsed + 2_000);
    }
    // Observed at +2 s (the first follow after the death); taken at the first attempt ≥ 15 s later.
    expect(seen[0]).toBe(18_000);
    expect(leaders().filter((l) => l !== dead.identity)).toHaveLength(1);
  });

  it('a leader cut off from the API stops leading at its renew deadline, before any other replica may take over', async () => {
    const clock = { t: 4_000_000, now() { return this.t; } };
    const cut = { on: false, index: -1 };
    const { electors } = trio('cut-off', clock, (s, i) => ({
      get: () => (cut.on && i === cut.index ? Promise.reject(new Error('connection refused')) : s.get()),
      create: (r) => s.create(r),
      replace: (r) => (cut.on && i === cut.index ? Promise.reject(new Error('connection refused')) : s.replace(r)),
    }));
    await round(electors);
    const leader = electors.findIndex((e) => e.leading);
    Object.assign(cut, { on: true, index: leader });
    let stepDownAt = -1;
    let takenAt = -1;
    for (let elapsed = 2_000; elapsed <= 24_000; elapsed += 2_000) {
      clock.t += 2_000;
      await round(electors);
      if (stepDownAt < 0 && !electors[leader]!.leading) stepDownAt = elapsed;
      if (takenAt < 0 && electors.some((e, i) => i !== leader && e.leading)) takenAt = elapsed;
    }
    expect(stepDownAt).toBe(10_000);
    expect(takenAt).toBeGreaterThan(stepDownAt);
  });

  it('the fake refuses a Lease time without microseconds, as the real API server does', async () => {
    await expect(
      api.createLease({ metadata: { namespace: NS, name: 'bad-time' }, spec: { holderIdentity: 'x', renewTime: new Date() as never } }),
    ).rejects.toThrow(/HTTP 400/);
  });
});
