/**
 * Three API replicas on a real cluster (issue 20 item 2): one leads through the Lease, a burst of
 * 100 async and 20 concurrent sync runs all succeed exactly once, deleting the leader mid-burst moves
 * the Lease within the renew deadline, and deleting (killing) a non-leader mid-burst has its runs
 * adopted. "Exactly once": each program prints and writes its own tag; the database has one record
 * per submission with that output, no program said it ran in two pods (the witness, see `code`), and
 * no execution had two run pods the collector logs cannot rule out as having run.
 *
 * Skipped unless the chart test's variables are set (test/support/e2e-release.ts).
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { Log, Watch } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TOOL_BUILD_TIMEOUT_MS } from '../support/chart.ts';
import { E2ERelease, RELEASE_READY, sleep } from '../support/e2e-release.ts';

type J = Record<string, any>;
const TERMINAL = new Set(['succeeded', 'failed', 'cancelled', 'timeout']);
/** Where kcluster's pods reach this machine (the pod network's gateway). */
const HOST_IP = process.env.SANDPOD_E2E_HOST_IP ?? '10.244.0.1';
/**
 * Each program first tells this test, over HTTP, which pod it runs in (its host name), then prints and
 * writes its tag. A witness that needs no pod log: a pod deleted a moment after its program ran (a
 * takeover fences or removes pods) may leave no log to read, and the log check counts such a pod as
 * having run. The call reaches the machine only because kcluster does not enforce NetworkPolicy (the
 * chart's policy would stop it on a cluster that does): where it is stopped, no witness arrives and
 * the log check alone decides, as before.
 */
const code = (tag: string, witness: string) =>
  `import json, socket, urllib.request\ntry:\n    urllib.request.urlopen(${JSON.stringify(`${witness}?tag=${tag}&pod=`)} + socket.gethostname(), timeout=20).read()\nexcept Exception:\n    pass\nprint(${JSON.stringify(tag)})\njson.dump({"id": ${JSON.stringify(tag)}}, open("/output/result.json", "w"))\n`;
/**
 * The startup limit each run asks for (SPEC: 10–600 s, default 60). It bounds pod creation —
 * scheduling, the gVisor sandbox's start, the runner's — up to the program's start. The burst puts
 * 3 replicas × max_workers 8 = 24 run pods (plus the warm pool's refills) into start at once on one
 * 2-core node that also carries the control plane and the three replicas: an idle node starts a
 * gVisor run pod in about 3 s of mostly CPU, so the last of a wave of 24 waits its turn for roughly
 * 24 × 3 s / 2 cores = 36 s even when nothing else runs; at the load averages of 16–23 seen during
 * this burst the default 60 s failed runs with `startup_timeout`, which is the machine's size, not a
 * fault of the service. 300 s leaves room for that and still ends a run whose pod never starts well
 * within the test's own limits. The burst test logs the startups it measured.
 */
const STARTUP_TIMEOUT_S = 300;

describe.skipIf(!RELEASE_READY)('three replicas on a real cluster (needs the chart test’s SANDPOD_E2E_* variables)', () => {
  const rel = RELEASE_READY ? new E2ERelease('spr') : (null as unknown as E2ERelease);
  /** Run pods seen per execution label, from polling the runs namespace. */
  const podsByExecution = new Map<string, Set<string>>();
  /** Run pods' names by uid (a program names its pod by its host name). */
  const podNames = new Map<string, string>();
  /** Pods each tag's program said it ran in (see {@link code}), and where it says so. */
  const witnessed = new Map<string, Set<string>>();
  let witnessUrl = '';
  let witnessServer: Server | null = null;
  /**
   * Pods the program never reached, by uid: their `collector` log (deliver.py relays the runner's
   * phase lines there) has no `execution` line once the pod is going. A hand-over that failed before
   * the program started (under kcluster's gVisor adapter a collector can find its stdin closed at
   * start) fails that attempt and the service runs the program in a new pod: no second run.
   */
  const neverDelivered = new Set<string>();
  const classified = new Set<string>();
  /**
   * Collector logs followed from the moment the container runs, by pod uid: a follow gets the log
   * from its start and ends when the container does, so a pod deleted right after (a run requeued by
   * a draining replica, its Job deleted) still says whether the program reached it — read once it is
   * going, its log was often gone already, and such a pod counted as a second run.
   */
  const followed = new Set<string>();
  const follow = (name: string, uid: string) => {
    followed.add(uid);
    let text = '';
    let settled = false;
    const settle = () => {
      if (settled) return;
      settled = true;
      // The whole log when it can still be read (a follow cut short would miss a late line); else what came.
      void rel.core
        .readNamespacedPodLog({ namespace: rel.runsNs, name, container: 'collector' })
        .then((log) => String(log), () => text)
        .then((log) => {
          classified.add(uid);
          if (!/^execution$/m.test(log)) neverDelivered.add(uid);
        });
    };
    const sink = new Writable({
      write(chunk: Buffer, _enc, cb) {
        text += chunk.toString();
        cb();
      },
    });
    sink.on('finish', settle);
    sink.on('error', settle);
    new Log(rel.kc).log(rel.runsNs, name, 'collector', sink, { follow: true }).catch(() => followed.delete(uid));
  };
  let watching: NodeJS.Timeout | null = null;
  let deletions: AbortController | null = null;

  const lease = async () => (await rel.coordination.readNamespacedLease({ name: `${rel.release}-sandpod-leader`, namespace: rel.ns })).spec ?? {};
  const apiPods = async () =>
    (await rel.core.listNamespacedPod({ namespace: rel.ns, labelSelector: `app.kubernetes.io/instance=${rel.release},app.kubernetes.io/name=sandpod` })).items.filter(
      (p) => p.status?.phase === 'Running' && !p.metadata?.deletionTimestamp && p.metadata?.name?.startsWith(`${rel.deployment}-`) && !p.metadata.name.includes('migrate'),
    );

  async function submitAsync(tags: string[]): Promise<string[]> {
    return Promise.all(
      tags.map(async (tag) => {
        const res = await rel.call('/execute/async', { method: 'POST', body: JSON.stringify({ code: code(tag, witnessUrl), idempotency_key: tag, startup_timeout: STARTUP_TIMEOUT_S }) });
        const body = (await res.json()) as J;
        if (res.status !== 202) throw new Error(`${tag}: ${res.status} ${JSON.stringify(body)}`);
        return body.job_id as string;
      }),
    );
  }

  async function waitAll(ids: string[], timeoutMs: number): Promise<void> {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const rows = await rel.query<{ status: string }>('SELECT status FROM executions WHERE id = ANY($1::text[])', [ids]);
      if (rows.length === ids.length && rows.every((r) => TERMINAL.has(r.status))) return;
      if (Date.now() > end) throw new Error(`runs not done: ${JSON.stringify(rows.reduce<Record<string, number>>((m, r) => ({ ...m, [r.status]: (m[r.status] ?? 0) + 1 }), {}))}`);
      await sleep(1000);
    }
  }

  /** Every submission has exactly one record, succeeded, with its own output; no execution had two pods. */
  async function expectExactlyOnce(tags: string[]): Promise<void> {
    const rows = await rel.query<{ id: string; status: string; stdout: string; result: unknown; idempotency_key: string; error: unknown }>(
      "SELECT id, status, stdout #>> '{}' AS stdout, output AS result, idempotency_key, error FROM executions WHERE idempotency_key = ANY($1::text[]) OR (stdout #>> '{}') = ANY($2::text[])",
      [tags, tags.map((t) => `${t}\n`)],
    );
    expect(rows.length).toBe(tags.length);
    const byTag = new Map(rows.map((r) => [r.idempotency_key ?? r.stdout.trim(), r]));
    for (const tag of tags) {
      const r = byTag.get(tag);
      expect(r, tag).toBeDefined();
      expect({ tag, status: r!.status, error: r!.error }).toEqual({ tag, status: 'succeeded', error: null });
      expect(r!.stdout).toBe(`${tag}\n`);
      expect(r!.result).toEqual({ id: tag });
    }
    const ours = new Set(rows.map((r) => String(r.id)));
    const tagOf = new Map(rows.map((r) => [String(r.id), r.idempotency_key ?? r.stdout.trim()]));
    // The witness: no program said it ran in two pods.
    const twice = tags.filter((t) => (witnessed.get(t)?.size ?? 0) > 1).map((t) => [t, [...witnessed.get(t)!]]);
    if (twice.length > 0) await printReplicaLines(rows.filter((r) => twice.some(([t]) => t === tagOf.get(String(r.id)))).map((r) => String(r.id)));
    expect(twice).toEqual([]);
    const heard = tags.filter((t) => witnessed.has(t)).length;
    console.log(`programs that said which pod they ran in: ${heard} of ${tags.length}`);
    // The pod logs: a pod whose collector log could not be read counts as having run, unless its tag's
    // program said it ran elsewhere (and in that pod only).
    const ranIn = (id: string, uid: string) => {
      const said = witnessed.get(tagOf.get(id) ?? '');
      return !neverDelivered.has(uid) && !(said && said.size === 1 && !said.has(podNames.get(uid) ?? ''));
    };
    const byLogs = [...podsByExecution].filter(([id]) => ours.has(id)).map(([id, pods]) => [id, [...pods].filter((uid) => !neverDelivered.has(uid))] as const).filter(([, pods]) => pods.length > 1);
    if (byLogs.length > 0) {
      console.log(`executions with two pods the logs cannot rule out: ${byLogs.length}; their programs said they ran in: ${JSON.stringify(byLogs.map(([id, pods]) => ({ id, pods: pods.map((u) => podNames.get(u)), said: [...(witnessed.get(tagOf.get(id) ?? '') ?? [])] })))}`);
      // What the replicas logged about them: each "never reached" says the evidence it rests on.
      await printReplicaLines(byLogs.map(([id]) => id));
    }
    const doubled = [...podsByExecution].filter(([id]) => ours.has(id)).map(([id, pods]) => [id, [...pods].filter((uid) => ranIn(id, uid)).map((uid) => podNames.get(uid))] as const).filter(([, pods]) => pods.length > 1);
    if (doubled.length > 0) await printReplicaLines(doubled.map(([id]) => id));
    expect(doubled).toEqual([]);
    const retried = [...podsByExecution].filter(([id, pods]) => ours.has(id) && [...pods].some((uid) => neverDelivered.has(uid)));
    if (retried.length > 0) console.log(`runs with a pod the program never reached (a failed hand-over), run again in a new pod: ${retried.length}`);
  }

  /** The replicas' log lines about `ids` (which path started each pod), for a run that went wrong. */
  async function printReplicaLines(ids: string[]): Promise<void> {
    for (const p of await apiPods()) {
      const log = String(await rel.core.readNamespacedPodLog({ namespace: rel.ns, name: p.metadata!.name!, container: p.spec!.containers[0]!.name }).catch((e: unknown) => `(no log: ${String(e)})`));
      const lines = log.split('\n').filter((l) => ids.some((id) => l.includes(id)));
      console.log(`${p.metadata!.name}: ${lines.length} lines about ${ids.join(', ')}\n${lines.join('\n')}`);
    }
  }

  beforeAll(async () => {
    witnessServer = createServer((req, res) => {
      const q = new URL(req.url ?? '/', 'http://witness').searchParams;
      const tag = q.get('tag') ?? '';
      witnessed.set(tag, (witnessed.get(tag) ?? new Set<string>()).add(q.get('pod') ?? ''));
      res.end('ok');
    });
    await new Promise<void>((r) => witnessServer!.listen(0, '0.0.0.0', () => r()));
    witnessUrl = `http://${HOST_IP}:${(witnessServer.address() as AddressInfo).port}/ran`;
    await rel.install([
      '--set', 'replicaCount=3',
      // policy/v1 PodDisruptionBudget is unknown to a 1.20 API server (kcluster); not what is tested here.
      '--set', 'podDisruptionBudget.enabled=false',
      '--set', 'resources.requests.cpu=50m',
      '--set-json', 'jobTypes.items.default.cpuLimit=0.25',
      '--set', 'config.shutdown_grace_seconds=20',
      // Three API replicas and dozens of gVisor run pods share a 2-core node here: a probe that waits
      // 3 s restarts a replica that is only starved (seen at load 38), which is not what is tested.
      '--set', 'probes.startup.failureThreshold=90',
      '--set', 'probes.liveness.timeoutSeconds=15',
      // The second run (load average 36) had every replica restarted mid-burst (503 shutting_down, then
      // the Service refused connections): the liveness probe gets 2 min here, not 30 s.
      '--set', 'probes.liveness.failureThreshold=12',
      '--set', 'probes.readiness.timeoutSeconds=15',
    ]);
    // A pod deleted before it was ever bound to a node ran nothing. Its last state comes with its
    // DELETED event: an unbound pod goes at once, often between two of the lists below, which then
    // never see it deleting (and counted it as having run, the program's word missing).
    const watchDeletions = async (): Promise<void> => {
      deletions = await new Watch(rel.kc).watch(
        `/api/v1/namespaces/${rel.runsNs}/pods`,
        { labelSelector: 'sandpod.io/execution-id' },
        (phase: string, p: { metadata?: { uid?: string }; spec?: { nodeName?: string } }) => {
          if (phase === 'DELETED' && p.metadata?.uid && !p.spec?.nodeName) neverDelivered.add(p.metadata.uid);
        },
        // Ended by the API server (its request timeout) or cut: watched again until the tests end.
        () => void (watching && watchDeletions().catch(() => undefined)),
      );
    };
    await watchDeletions();
    // One list at a time, served from the API server's watch cache (resourceVersion 0): a quorum list
    // of every run pod each 500 ms took 16 s at the burst's peak and piled up dozens deep, loading the
    // API server and etcd more than the service did (seen in kcluster's apiserver traces).
    let listing = false;
    watching = setInterval(() => {
      if (listing) return;
      listing = true;
      rel.core
        .listNamespacedPod({ namespace: rel.runsNs, labelSelector: 'sandpod.io/execution-id', resourceVersion: '0' })
        .finally(() => (listing = false))
        .then((l) => {
          for (const p of l.items) {
            const id = p.metadata?.labels?.['sandpod.io/execution-id'];
            if (!id || !p.metadata?.uid) continue;
            const set = podsByExecution.get(id) ?? new Set<string>();
            set.add(p.metadata.uid);
            podsByExecution.set(id, set);
            const uid = p.metadata.uid;
            podNames.set(uid, p.metadata.name ?? '');
            const collectorEnded = p.status?.containerStatuses?.some((c) => c.name === 'collector' && c.state?.terminated);
            // Only pods whose program goes by attach (their collector is deliver.py, with stdin) say so.
            const byAttach = p.spec?.containers.some((c) => c.name === 'collector' && c.stdin);
            const collectorUp = p.status?.containerStatuses?.some((c) => c.name === 'collector' && (c.state?.running || c.state?.terminated));
            if (byAttach && collectorUp && !followed.has(uid) && !classified.has(uid)) follow(p.metadata.name!, uid);
            // A pod deleted before it was ever scheduled ran nothing (a run requeued by a draining replica
            // whose pod still waited for CPU: the next holder removes it and starts afresh).
            if (p.metadata.deletionTimestamp && !p.spec?.nodeName) neverDelivered.add(uid);
            else if (byAttach && (p.metadata.deletionTimestamp || collectorEnded) && !classified.has(uid)) {
              classified.add(uid);
              rel.core
                .readNamespacedPodLog({ namespace: rel.runsNs, name: p.metadata.name!, container: 'collector' })
                .then((log) => {
                  if (!/^execution$/m.test(String(log))) neverDelivered.add(uid);
                })
                .catch(() => classified.delete(uid)); // not readable yet (or any more): tried again next time
            }
          }
        })
        .catch(() => undefined);
    }, 500);
  }, TOOL_BUILD_TIMEOUT_MS + 600_000);

  afterAll(async () => {
    if (watching) clearInterval(watching);
    watching = null;
    deletions?.abort();
    witnessServer?.close();
    await rel?.uninstall();
  }, 300_000);

  it('one replica leads: the Lease names one of the three pods, and each replica’s /health says the same', async () => {
    let holder = '';
    for (let i = 0; i < 30 && !holder; i++) {
      holder = (await lease()).holderIdentity ?? '';
      if (!holder) await sleep(1000);
    }
    const pods = await apiPods();
    expect(pods).toHaveLength(3);
    expect(pods.map((p) => p.metadata!.name)).toContain(holder);
    for (const p of pods) {
      const res = await fetch(`http://${p.status!.podIP}:8000/health`, { headers: { authorization: `Bearer ${rel.token}` } });
      const leader = ((await res.json()) as J).sandbox?.detail?.leader;
      expect(leader).toMatchObject({ enabled: true, identity: p.metadata!.name, leading: p.metadata!.name === holder, lease: `${rel.ns}/${rel.release}-sandpod-leader` });
      const metrics = await (await fetch(`http://${p.status!.podIP}:8000/metrics`, { headers: { authorization: `Bearer ${rel.token}` } })).text();
      expect(metrics).toContain(`sandpod_leader{identity="${p.metadata!.name}"} ${p.metadata!.name === holder ? 1 : 0}`);
    }
  }, 60_000);

  it('a burst of 100 async runs and 20 concurrent sync runs all succeed exactly once', async () => {
    const asyncTags = Array.from({ length: 100 }, (_, i) => `a-${rel.suffix}-${i}`);
    const syncTags = Array.from({ length: 20 }, (_, i) => `s-${rel.suffix}-${i}`);
    const sync = Promise.all(
      syncTags.map(async (tag) => {
        const res = await rel.call('/execute', { method: 'POST', body: JSON.stringify({ code: code(tag, witnessUrl), startup_timeout: STARTUP_TIMEOUT_S }), signal: AbortSignal.timeout(600_000) });
        return { tag, status: res.status, body: (await res.json()) as J };
      }),
    );
    const ids = await submitAsync(asyncTags);
    const answers = await sync;
    const wrong = answers.filter((a) => a.status !== 200 || a.body.success !== true);
    if (wrong.length > 0) await printReplicaLines(wrong.map((a) => String(a.body.execution_id ?? a.tag)));
    for (const a of answers) expect({ tag: a.tag, status: a.status, stdout: a.body.stdout, success: a.body.success, error: a.body.error ?? null }).toEqual({ tag: a.tag, status: 200, stdout: `${a.tag}\n`, success: true, error: null });
    await waitAll(ids, 900_000);
    const startup = (await rel.query<{ ms: string }>("SELECT (timing->>'startup_ms') AS ms FROM executions WHERE idempotency_key = ANY($1::text[]) OR (stdout #>> '{}') = ANY($2::text[])", [asyncTags.concat(syncTags), syncTags.map((t) => `${t}\n`)]))
      .map((r) => Number(r.ms))
      .filter(Number.isFinite)
      .sort((a, b) => a - b);
    const at = (q: number) => startup[Math.min(startup.length - 1, Math.floor(q * startup.length))];
    console.log(`startup_ms over ${startup.length} runs: p50 ${at(0.5)}, p90 ${at(0.9)}, p99 ${at(0.99)}, max ${startup.at(-1)}; load ${(await import('node:os')).loadavg().map((l) => l.toFixed(1)).join(' ')}`);
    await expectExactlyOnce([...asyncTags, ...syncTags]);
  }, 1_000_000);

  it('deleting the leader mid-burst moves the Lease within the renew deadline, and every run still ends once', async () => {
    const tags = Array.from({ length: 30 }, (_, i) => `l-${rel.suffix}-${i}`);
    const ids = await submitAsync(tags);
    const old = (await lease()).holderIdentity!;
    await sleep(3000);
    const t0 = Date.now();
    await rel.core.deleteNamespacedPod({ name: old, namespace: rel.ns });
    let holder = old;
    while ((holder === old || holder === '') && Date.now() - t0 < 30_000) {
      await sleep(200);
      holder = (await lease()).holderIdentity ?? '';
    }
    const movedMs = Date.now() - t0;
    console.log(`the Lease moved ${movedMs} ms after the leader's deletion; load ${(await import('node:os')).loadavg().map((l) => l.toFixed(1)).join(' ')}`);
    expect(holder).not.toBe(old);
    expect(holder).not.toBe('');
    // Released on SIGTERM: a follower takes it within a retry period, far inside the 10 s renew deadline.
    expect(movedMs).toBeLessThan(10_000);
    await waitAll(ids, 600_000);
    await expectExactlyOnce(tags);
    await rel.rolledOut();
  }, 900_000);

  it('killing a non-leader mid-burst (no grace): its runs are adopted and every run still ends once', async () => {
    const tags = Array.from({ length: 30 }, (_, i) => `k-${rel.suffix}-${i}`);
    const ids = await submitAsync(tags);
    const leader = (await lease()).holderIdentity!;
    // Wait until a non-leader holds some of these runs, then kill it.
    let victim = '';
    for (let i = 0; i < 120 && !victim; i++) {
      const held = await rel.query<{ claimed_by: string }>("SELECT claimed_by FROM executions WHERE id = ANY($1::text[]) AND status = 'running'", [ids]);
      victim = held.map((h) => h.claimed_by.split('/')[0]!).find((pod) => pod !== leader) ?? '';
      if (!victim) await sleep(500);
    }
    if (!victim) console.log(`no non-leader held a running run; the runs by status and holder: ${JSON.stringify(await rel.query("SELECT status, claimed_by, count(*)::int AS n FROM executions WHERE id = ANY($1::text[]) GROUP BY 1, 2", [ids]))}; leader ${leader}`);
    expect(victim).not.toBe('');
    await rel.core.deleteNamespacedPod({ name: victim, namespace: rel.ns, gracePeriodSeconds: 0 });
    await waitAll(ids, 600_000);
    await expectExactlyOnce(tags);
    expect((await lease()).holderIdentity).toBe(leader);
  }, 900_000);
});
