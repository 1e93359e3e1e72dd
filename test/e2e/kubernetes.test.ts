/**
 * End-to-end checks of the Kubernetes runtime against a real cluster. Skipped (visibly) unless
 * `SANDPOD_E2E_KUBECONFIG` names a kubeconfig; `SANDPOD_E2E_IMAGE` names the executor image
 * (python3, sh, tar, /usr/bin/env; e.g. the image built from the repo's executor Dockerfile), and
 * `SANDPOD_E2E_GVISOR=1` runs under the gVisor RuntimeClass in strict mode.
 *
 * It applies crds/ and test/e2e/manifests/ (namespaces, RuntimeClass, JobTypes), then drives
 * `createKubernetesRuntime` and the JobType registry through the same behaviours as the adapter
 * tests against the fake: success with outputs, a clean environment, runner and startup timeouts,
 * OOM, image errors, cancellation and adoption by a new runtime instance; and that what a program
 * prints is kept as on the local runtime (streams cut at max_stdout_bytes with the truncation flags
 * set, NUL kept, invalid UTF-8 as U+FFFD).
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../src/config.ts';
import { classify } from '../../src/executions/classify.ts';
import { KubernetesJobTypeRegistry } from '../../src/jobtypes/kubernetes-registry.ts';
import { readStream } from '../../src/runtime/local/runs/collect.ts';
import { createKubernetesRuntime } from '../../src/runtime/kubernetes/index.ts';
import { jobNameFor } from '../../src/runtime/kubernetes/names.ts';
import type { Runtime, RunSpec } from '../../src/runtime/runtime.ts';
import { applyObjects, manifestObjects } from '../support/kube-apply.ts';

const KUBECONFIG = process.env.SANDPOD_E2E_KUBECONFIG;
const IMAGE = process.env.SANDPOD_E2E_IMAGE ?? 'ghcr.io/sandpod/executor:0.1.0';
const GVISOR = process.env.SANDPOD_E2E_GVISOR === '1';
const NS = 'sandpod-e2e';

/** What the local runtime makes of a stream file holding `bytes`, with its cap: the same rule is expected here. */
function decodedLocally(bytes: Buffer, cap: number): { text: string; truncated: boolean } {
  const dir = mkdtempSync(path.join(tmpdir(), 'sp-e2e-local-'));
  try {
    writeFileSync(path.join(dir, '.svc_stdout'), bytes);
    return readStream(dir, '.svc_stdout', cap);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
const RUNS_NS = 'sandpod-e2e-jobs';

function manifests(): KubernetesObject[] {
  return manifestObjects([
    ...readdirSync(new URL('../../crds/', import.meta.url)).filter((f) => f.endsWith('.yaml')).map((f) => new URL(`../../crds/${f}`, import.meta.url)),
    ...['namespaces.yaml', 'runtimeclass.yaml', 'jobtypes.yaml'].map((f) => new URL(`./manifests/${f}`, import.meta.url)),
  ]);
}

describe.skipIf(!KUBECONFIG)('kubernetes e2e (needs SANDPOD_E2E_KUBECONFIG and SANDPOD_E2E_IMAGE; skipped without them)', () => {
  let kc: KubeConfig;
  let config: Config;
  let registry: KubernetesJobTypeRegistry;
  let rt: Runtime;
  const instance = `e2e-${randomUUID().slice(0, 8)}`;

  const newRuntime = async (): Promise<Runtime> => {
    const r = createKubernetesRuntime(config, { kubeConfig: kc });
    await r.start();
    return r;
  };
  const spec = (code: string, over: Partial<RunSpec> & { jobTypeName?: string } = {}): RunSpec => {
    const jobType = registry.get(over.jobTypeName ?? 'default');
    if (!jobType) throw new Error(`job type ${over.jobTypeName} not found`);
    const { jobTypeName: _ignored, ...rest } = over;
    return {
      executionId: randomUUID(),
      code,
      inputJson: '{"n": 3}',
      jobType,
      timeoutSec: 30,
      startupTimeoutSec: 120,
      requirements: [],
      maxStdoutBytes: 32768,
      maxArtifactBytes: 5 * 1024 * 1024,
      ...rest,
    };
  };

  beforeAll(async () => {
    kc = new KubeConfig();
    kc.loadFromFile(KUBECONFIG!);
    await applyObjects(kc, manifests());
    config = parseConfig(
      {
        runtime: 'kubernetes',
        security_mode: GVISOR ? 'strict' : 'permissive',
        kubernetes: { namespace: NS, runs_namespace: RUNS_NS, instance, runtime_class: GVISOR ? 'gvisor-e2e' : 'no-such-runtime-class', executor_image: IMAGE, ttl_seconds_after_finished: 120, preflight: false },
      },
      {},
    );
    registry = new KubernetesJobTypeRegistry(config, { kubeConfig: kc });
    await registry.start();
    rt = await newRuntime();
  }, 300_000);

  afterAll(async () => {
    await rt?.stop();
    await registry?.stop();
  });

  it('preflight: the canary runs as a run pod does and passes (threads, select, subprocess)', async () => {
    const withPreflight = parseConfig({ ...JSON.parse(JSON.stringify(config)), kubernetes: { ...config.kubernetes, preflight: true } }, {});
    const r = createKubernetesRuntime(withPreflight, { kubeConfig: kc, tuning: { healthCacheMs: 0 } });
    await r.start();
    try {
      let pf: { status?: string; checks?: Record<string, unknown> } | undefined;
      for (let i = 0; i < 240; i++) {
        pf = (await r.health()).detail?.preflight as typeof pf;
        if (pf?.status !== 'running') break;
        await new Promise((res) => setTimeout(res, 500));
      }
      expect(pf).toEqual({ status: 'passed', checks: { threads: true, select: true, subprocess: true } });
      expect((await r.health()).problems).toBeUndefined();
    } finally {
      await r.stop();
    }
  }, 180_000);

  it('reports health from the cluster', async () => {
    const h = await rt.health();
    expect(h).toMatchObject({ available: true, engine: 'kubernetes', gvisorAvailable: GVISOR });
  });

  it('sees JobTypes applied from the manifests', () => {
    expect(registry.get('tiny-memory')?.memoryLimit).toBe('64m');
  });

  it('runs code: streams, result.json, artifacts, input, execution phase', async () => {
    const phases: string[] = [];
    const raw = await rt.run(
      spec(
        [
          'import json, sys',
          'data = json.load(open("/input/data.json"))',
          'print("hello", data["n"])',
          'print("to stderr", file=sys.stderr)',
          'json.dump({"square": data["n"] ** 2}, open("/output/result.json", "w"))',
          'open("/output/notes.txt", "w").write("artifact")',
        ].join('\n'),
      ),
      { onPhase: (p) => phases.push(p) },
    );
    expect(raw.observation).toMatchObject({ exitCode: 0, timedOut: null, oomKilled: false, infraError: null, phase: 'completed' });
    expect(raw.stdout).toBe('hello 3\n');
    expect(raw.stderr).toContain('to stderr');
    expect(JSON.parse(raw.resultJson!)).toEqual({ square: 9 });
    expect(raw.artifacts.find((a) => a.name === 'notes.txt')?.data?.toString()).toBe('artifact');
    expect(raw.report).toMatchObject({ exit_code: 0 });
    expect(phases).toEqual(['execution']);
  }, 300_000);

  it('a run writing 1,500 files: the first 1,000 by name listed, all counted, the list flagged, result.json kept', async () => {
    const raw = await rt.run(
      spec('import json\nfor i in range(1500):\n    open(f"/output/f{i:04d}.txt", "w").write(str(i))\njson.dump({"n": 1500}, open("/output/result.json", "w"))'),
    );
    expect(raw.observation).toMatchObject({ exitCode: 0, phase: 'completed' });
    expect(JSON.parse(raw.resultJson!)).toEqual({ n: 1500 });
    expect(raw).toMatchObject({ artifactsTotal: 1500, artifactsTruncated: true });
    expect(raw.artifacts).toHaveLength(1000);
    expect(raw.artifacts.at(-1)).toMatchObject({ name: 'f0999.txt', size: 3 });
  }, 300_000);

  it('live output: the main container log is followed; the first chunk arrives while the program still runs', async () => {
    const got: { stream: string; text: string; at: number }[] = [];
    let resolvedAt = 0;
    const raw = await rt
      // Apart in time: the container runtime reads stdout and stderr through separate pipes, so two writes a few
      // microseconds apart on different streams may reach the log in either order.
      .run(spec('import sys, time\nprint("first", flush=True)\ntime.sleep(0.3)\nprint("oops", file=sys.stderr, flush=True)\ntime.sleep(3)\nprint("second")'), {
        onOutput: (stream, c) => got.push({ stream, text: Buffer.from(c).toString('utf8'), at: Date.now() }),
      })
      .finally(() => (resolvedAt = Date.now()));
    expect(raw.stdout).toBe('first\nsecond\n');
    const text = got.map((g) => g.text).join('');
    // The pod log API merges the streams: everything arrives as stdout, in the order written.
    expect(new Set(got.map((g) => g.stream))).toEqual(new Set(['stdout']));
    expect(text).toBe('first\noops\nsecond\n');
    const first = got.find((g) => g.text.includes('first'))!;
    expect(resolvedAt - first.at).toBeGreaterThan(2000);
  }, 300_000);

  it('requests vs limits: run pods request a fraction of their limits (Burstable); requests equal to limits are Guaranteed', async () => {
    const core = kc.makeApiClient((await import('@kubernetes/client-node')).CoreV1Api);
    const podOf = async (s: RunSpec) => (await core.listNamespacedPod({ namespace: RUNS_NS, labelSelector: `job-name=${jobNameFor(s.executionId)}` })).items[0];
    const burstable = spec('print("b")');
    const guaranteed = spec('print("g")', { jobTypeName: 'guaranteed' });
    for (const s of [burstable, guaranteed]) expect((await rt.run(s)).stdout).toBe(s === burstable ? 'b\n' : 'g\n');
    const b = await podOf(burstable);
    const g = await podOf(guaranteed);
    // The API server's own QoS verdict on what buildJob asked for.
    expect(b?.status?.qosClass).toBe('Burstable');
    expect(b?.spec?.containers.find((c) => c.name === 'main')?.resources).toMatchObject({ requests: { cpu: '125m', memory: '128Mi' }, limits: { cpu: '500m', memory: '256Mi' } });
    expect(g?.status?.qosClass).toBe('Guaranteed');
  }, 300_000);

  it('gives user code a clean environment (nothing from Kubernetes, PID 1 included)', async () => {
    const raw = await rt.run(
      spec(
        [
          'import os',
          'env = dict(os.environ)',
          // PID 1 is the runner, which is not dumpable (issue #9): its environ may be unreadable.
          'try:\n    pid1 = open("/proc/1/environ", "rb").read().decode(errors="replace")\nexcept PermissionError:\n    pid1 = ""',
          'print(sorted(k for k in env if "KUBERNETES" in k or "SERVICE" in k))',
          'print("KUBERNETES" in pid1)',
          'print(os.getuid())',
        ].join('\n'),
      ),
    );
    expect(raw.stdout.split('\n')).toEqual(['[]', 'False', '1000', '']);
  }, 300_000);

  it('stdout past max_stdout_bytes is cut and stdout_truncated set, as on the local runtime', async () => {
    // 2,000 bytes of two-byte characters with a cap of 1,001: the cut splits one of them.
    const raw = await rt.run(spec('import sys\nsys.stdout.write("\u00e9" * 1000)\nsys.stderr.write("e" * 10)\n', { maxStdoutBytes: 1001 }));
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
    const local = decodedLocally(Buffer.from('\u00e9'.repeat(1000), 'utf8'), 1001);
    expect(raw.stdout).toBe(local.text);
    expect(raw.stdout).toBe(`${'\u00e9'.repeat(500)}\ufffd`);
    expect(raw.stdoutTruncated).toBe(true);
    expect(raw.stderr).toBe('e'.repeat(10));
    expect(raw.stderrTruncated).toBe(false);
    expect(raw.report).toMatchObject({ stdout_truncated: true, stderr_truncated: false });
  }, 300_000);

  it('NUL bytes and invalid UTF-8 in stdout and stderr are decoded as on the local runtime', async () => {
    const out = Buffer.from([0x61, 0x00, 0x62, 0xff, 0x63, 0xe2, 0x82, 0x64, 0xed, 0xa0, 0x80, 0x0a]);
    const err = Buffer.from([0x00, 0xc3, 0x28, 0xf0, 0x9f, 0x98]);
    const hex = (b: Buffer) => b.toString('hex');
    const raw = await rt.run(
      spec(`import sys\nsys.stdout.buffer.write(bytes.fromhex("${hex(out)}"))\nsys.stderr.buffer.write(bytes.fromhex("${hex(err)}"))\n`),
    );
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
    expect(raw.stdout).toBe(decodedLocally(out, 32768).text);
    expect(raw.stderr).toBe(decodedLocally(err, 32768).text);
    expect(raw.stdout).toBe('a\u0000b\ufffdc\ufffdd\ufffd\ufffd\ufffd\n');
    expect(raw.stderr).toBe('\u0000\ufffd(\ufffd');
    expect(raw.stdoutTruncated || raw.stderrTruncated).toBe(false);
  }, 300_000);

  it('execution timeout: the runner kills the code and says so', async () => {
    const raw = await rt.run(spec('while True:\n    pass\n', { timeoutSec: 3 }));
    expect(raw.observation.exitCode).toBe(124);
    expect(raw.report?.timed_out).toBe(true);
  }, 300_000);

  it('OOM: the memory limit is enforced and reported', async () => {
    const raw = await rt.run(spec('x = []\nwhile True:\n    x.append(bytearray(8 * 1024 * 1024))\n', { jobTypeName: 'tiny-memory' }));
    expect(raw.observation.oomKilled || raw.observation.exitCode === 137).toBe(true);
    expect(raw.observation.infraError).toBeNull();
    expect(classify(raw).status).toBe('oom');
  }, 300_000);

  it('startup timeout when the pod cannot be scheduled; the Job is deleted', async () => {
    const s = spec('print(1)', { jobTypeName: 'unschedulable', startupTimeoutSec: 10 });
    const raw = await rt.run(s);
    expect(raw.observation).toMatchObject({ timedOut: 'startup', phase: 'startup' });
    const batch = kc.makeApiClient((await import('@kubernetes/client-node')).BatchV1Api);
    await expect(batch.readNamespacedJob({ namespace: RUNS_NS, name: jobNameFor(s.executionId) })).rejects.toMatchObject({ code: 404 });
  }, 300_000);

  it('image pull errors are docker_error long before the startup timeout', async () => {
    const t0 = Date.now();
    const raw = await rt.run(spec('print(1)', { jobTypeName: 'missing-image', startupTimeoutSec: 300 }));
    expect(raw.observation.infraError?.type).toBe('docker_error');
    expect(Date.now() - t0).toBeLessThan(120_000);
  }, 300_000);

  it('cancellation deletes the Job and reports cancelled; the pod terminates as the fake API server models it', async () => {
    const ac = new AbortController();
    const s = spec('import time\ntime.sleep(120)\n');
    const raw = await rt.run(s, { signal: ac.signal, onPhase: (p) => p === 'execution' && setTimeout(() => ac.abort(), 2000) });
    expect(raw.observation.cancelled).toBe(true);
    // What test/support/fake-kube models: the pod lingers with deletionTimestamp (its own grace
    // period, not the Job delete's 0), the runner answers SIGTERM by killing the program and exiting
    // 137, the collector traps it and exits 0.
    const core = kc.makeApiClient((await import('@kubernetes/client-node')).CoreV1Api);
    const selector = `job-name=${jobNameFor(s.executionId)}`;
    let seen: { deleting: boolean; grace: number | undefined; codes: Record<string, number | undefined> } | null = null;
    for (let i = 0; i < 40 && !seen; i++) {
      const pod = (await core.listNamespacedPod({ namespace: RUNS_NS, labelSelector: selector })).items[0];
      if (!pod) break;
      const states = pod.status?.containerStatuses ?? [];
      if (states.length > 0 && states.every((c) => c.state?.terminated)) {
        seen = {
          deleting: !!pod.metadata?.deletionTimestamp,
          grace: pod.metadata?.deletionGracePeriodSeconds,
          codes: Object.fromEntries(states.map((c) => [c.name, c.state?.terminated?.exitCode])),
        };
      } else await new Promise((r) => setTimeout(r, 500));
    }
    if (seen) expect(seen).toEqual({ deleting: true, grace: 5, codes: { main: 137, collector: 0 } });
    else console.warn('cancelled run pod gone before its terminated containers could be read');
  }, 300_000);

  it('a new runtime instance adopts a run started by one that stopped', async () => {
    const first = await newRuntime();
    const s = spec('import time\ntime.sleep(8)\nprint("adopted")\n');
    let started!: () => void;
    const inExecution = new Promise<void>((r) => (started = r));
    const lost = first.run(s, { onPhase: (p) => p === 'execution' && started() }).catch((e: unknown) => e);
    await inExecution;
    await first.stop();
    await lost;
    const second = await newRuntime();
    try {
      const raw = await second.run(s, { adopt: true });
      expect(raw.stdout).toBe('adopted\n');
    } finally {
      await second.stop();
    }
  }, 300_000);
  describe('warm pool (issue 10)', () => {
    const warmRuntime = async (inst: string): Promise<Runtime> => {
      const cfg = parseConfig({ ...JSON.parse(JSON.stringify(config)), kubernetes: { ...config.kubernetes, instance: inst, warm_pool_size: 2 } }, {});
      const r = createKubernetesRuntime(cfg, { kubeConfig: kc, jobTypes: () => registry.list().filter((t) => t.name === 'default'), tuning: { poolIntervalMs: 500 } });
      await r.start();
      return r;
    };
    // Pool Jobs outlive a stopped runtime (a restart adopts them): these instances are gone for good.
    afterAll(async () => {
      const { BatchV1Api } = await import('@kubernetes/client-node');
      const batch = kc.makeApiClient(BatchV1Api);
      for (const inst of [`${instance}-w`, `${instance}-race`]) {
        await batch.deleteCollectionNamespacedJob({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${inst}`, propagationPolicy: 'Background' }).catch(() => undefined);
      }
    });
    const readyIdle = (r: Runtime) => r.warmPoolStats!().find((x) => x.job_type === 'default')?.ready ?? 0;
    const waitReady = async (r: Runtime, n: number) => {
      for (let i = 0; i < 240 && readyIdle(r) < n; i++) await new Promise((res) => setTimeout(res, 500));
      expect(readyIdle(r)).toBeGreaterThanOrEqual(n);
    };

    it('a run claims a ready pool pod: labels on the pod, code and input by attach, startup near 0, never reused', async () => {
      const r = await warmRuntime(`${instance}-w`);
      try {
        await waitReady(r, 2);
        const s = spec('import json, os\nopen("/tmp/mark", "w").write("x")\nprint("warm", json.load(open("/input/data.json"))["n"])');
        const raw = await r.run(s);
        expect(raw.observation).toMatchObject({ exitCode: 0, phase: 'completed', infraError: null });
        expect(raw.stdout).toBe('warm 3\n');
        expect(raw.observation.startupMs).toBeLessThan(1000);
        const api = (r as unknown as { internals: { api: { listPods(ns: string, sel: string): Promise<{ items: { metadata?: { name?: string } }[] }> } } }).internals.api;
        const pods = await api.listPods(RUNS_NS, `sandpod.io/execution-id=${s.executionId}`);
        expect(pods.items).toHaveLength(1);
        expect(pods.items[0]!.metadata?.name).toMatch(/^sp-w-/);
        expect(r.warmPoolStats!().find((x) => x.job_type === 'default')).toMatchObject({ hits: 1 });
        await waitReady(r, 1);
        const next = await r.run(spec('import os\nprint(os.path.exists("/tmp/mark"))'));
        expect(next.stdout).toBe('False\n');
      } finally {
        await r.stop();
      }
    }, 300_000);

    it('isolation and limits hold on pool pods as on cold ones: environment, PID 1, fds, timeout, output cap, OOM', async () => {
      const inst = `${instance}-iso`;
      const cfg = parseConfig({ ...JSON.parse(JSON.stringify(config)), kubernetes: { ...config.kubernetes, instance: inst, warm_pool_size: 1 } }, {});
      const r = createKubernetesRuntime(cfg, { kubeConfig: kc, jobTypes: () => registry.list().filter((t) => t.name === 'default' || t.name === 'tiny-memory'), tuning: { poolIntervalMs: 500 } });
      await r.start();
      const stats = (jt: string) => r.warmPoolStats!().find((x) => x.job_type === jt);
      /** Runs `s` on a pool pod of its job type: waits for one to be ready, and requires a hit. */
      const warmRun = async (s: RunSpec) => {
        const jt = s.jobType.name;
        for (let i = 0; i < 240 && (stats(jt)?.ready ?? 0) < 1; i++) await new Promise((res) => setTimeout(res, 500));
        const before = stats(jt)?.hits ?? 0;
        const raw = await r.run(s);
        expect(stats(jt)?.hits, `${jt}: the run claimed a pool pod`).toBe(before + 1);
        return raw;
      };
      try {
        // The same clean environment as a cold run: nothing from Kubernetes, PID 1 (the runner) out of
        // reach, uid 1000, no descriptor but 0-2 and the runner's exception pipe, with stdin (the
        // attach channel) now /dev/null.
        const env = await warmRun(
          spec(
            [
              'import os, ctypes',
              'print(sorted(k for k in os.environ if "KUBERNETES" in k or "SERVICE" in k))',
              'try:\n    open("/proc/1/mem", "rb").read(1)\n    print("pid1 mem readable")\nexcept OSError as e:\n    print("pid1 mem", type(e).__name__)',
              'libc = ctypes.CDLL(None, use_errno=True)',
              'print("ptrace", libc.ptrace(16, 1, None, None), ctypes.get_errno() != 0)',
              'print(os.getuid())',
              'def is_open(fd):\n    try:\n        os.fstat(fd)\n        return True\n    except OSError:\n        return False',
              'print([(fd, "pipe" if os.readlink("/proc/self/fd/%d" % fd).startswith("pipe:") else os.readlink("/proc/self/fd/%d" % fd)) for fd in range(3, 1024) if is_open(fd)])',
              'print(os.readlink("/proc/self/fd/0"))',
            ].join('\n'),
          ),
        );
        expect(env.stderr).toBe('');
        const lines = env.stdout.split('\n');
        expect(lines[0]).toBe('[]');
        expect(lines[1]).toMatch(/^pid1 mem (PermissionError|OSError)$/);
        expect(lines[2]).toBe('ptrace -1 True');
        expect(lines[3]).toBe('1000');
        // Beyond 0-2 only the runner's exception channel (a pipe back to it, as on a cold run).
        expect(lines[4]).toMatch(/^\[\(\d+, 'pipe'\)\]$/);
        expect(lines[5]).toBe('/dev/null');
        // The execution timeout counts from delivery and is enforced by the runner.
        const t = await warmRun(spec('while True:\n    pass\n', { timeoutSec: 3 }));
        expect(t.observation.exitCode).toBe(124);
        expect(t.report?.timed_out).toBe(true);
        expect(t.observation.executionMs).toBeGreaterThanOrEqual(2900);
        // The output cap of the run (from the go line), flags set as on a cold run.
        const cut = await warmRun(spec('import sys\nsys.stdout.write("x" * 5000)\n', { maxStdoutBytes: 1000 }));
        expect(cut.stdout).toBe('x'.repeat(1000));
        expect(cut.stdoutTruncated).toBe(true);
        // The memory limit of a pool pod is its JobType's.
        const oom = await warmRun(spec('x = []\nwhile True:\n    x.append(bytearray(8 * 1024 * 1024))\n', { jobTypeName: 'tiny-memory' }));
        expect(classify(oom).status).toBe('oom');
      } finally {
        await r.stop();
        const { BatchV1Api } = await import('@kubernetes/client-node');
        await kc.makeApiClient(BatchV1Api).deleteCollectionNamespacedJob({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${inst}`, propagationPolicy: 'Background' }).catch(() => undefined);
      }
    }, 600_000);

    it('cold_start attach: a run without a pool pod gets its own, and the program by attach as soon as main runs', async () => {
      const inst = `${instance}-cold`;
      const cfg = parseConfig({ ...JSON.parse(JSON.stringify(config)), kubernetes: { ...config.kubernetes, instance: inst, warm_pool_size: 0, cold_start: 'attach' } }, {});
      const r = createKubernetesRuntime(cfg, { kubeConfig: kc, jobTypes: () => registry.list().filter((t) => t.name === 'default') });
      await r.start();
      try {
        const s = spec('import json\nprint("cold", json.load(open("/input/data.json"))["n"])');
        const raw = await r.run(s);
        expect(raw.observation).toMatchObject({ exitCode: 0, phase: 'completed', infraError: null });
        expect(raw.stdout).toBe('cold 3\n');
        const core = kc.makeApiClient((await import('@kubernetes/client-node')).CoreV1Api);
        const pods = (await core.listNamespacedPod({ namespace: RUNS_NS, labelSelector: `sandpod.io/execution-id=${s.executionId}` })).items;
        expect(pods).toHaveLength(1);
        // No Secret carried the program: attach did.
        expect(pods[0]!.spec!.volumes!.some((v) => v.secret)).toBe(false);
      } finally {
        await r.stop();
      }
    }, 300_000);

    it('pool pods whose image cannot be pulled are removed at once, and not re-made within the back-off', async () => {
      const inst = `${instance}-pull`;
      const cfg = parseConfig({ ...JSON.parse(JSON.stringify(config)), kubernetes: { ...config.kubernetes, instance: inst, warm_pool_size: 1 } }, {});
      const r = createKubernetesRuntime(cfg, { kubeConfig: kc, jobTypes: () => registry.list().filter((t) => t.name === 'missing-image'), tuning: { poolIntervalMs: 200 } });
      const { BatchV1Api } = await import('@kubernetes/client-node');
      const batch = kc.makeApiClient(BatchV1Api);
      const seen = new Set<string>();
      const live = async () => {
        const jobs = (await batch.listNamespacedJob({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${inst},sandpod.io/warm-pool=missing-image` })).items;
        for (const j of jobs) seen.add(j.metadata!.name!);
        return jobs.filter((j) => !j.metadata?.deletionTimestamp);
      };
      await r.start();
      try {
        // The first pool Job's pod hits ErrImagePull/ImagePullBackOff: it is removed, well within the
        // JobType's 15-minute idle limit.
        for (let i = 0; i < 240 && seen.size === 0; i++) {
          await live();
          await new Promise((res) => setTimeout(res, 250));
        }
        expect(seen.size).toBeGreaterThanOrEqual(1);
        const first = [...seen][0]!;
        for (let i = 0; i < 240 && (await live()).some((j) => j.metadata?.name === first); i++) await new Promise((res) => setTimeout(res, 250));
        expect((await live()).map((j) => j.metadata?.name)).not.toContain(first);
        // Within the back-off after that failure (2 s) no replacement churns (only the first Job, at most
        // one made before its failure was seen).
        const before = seen.size;
        for (let i = 0; i < 4; i++) {
          await live();
          await new Promise((res) => setTimeout(res, 250));
        }
        expect(seen.size).toBeLessThanOrEqual(Math.max(before, 2));
        expect(r.warmPoolStats!().find((x) => x.job_type === 'missing-image')?.ready ?? 0).toBe(0);
      } finally {
        await r.stop();
        await batch.deleteCollectionNamespacedJob({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${inst}`, propagationPolicy: 'Background' }).catch(() => undefined);
      }
    }, 300_000);

    it('two runtime instances on one pool never claim the same pod', async () => {
      const inst = `${instance}-race`;
      const one = await warmRuntime(inst);
      const two = await warmRuntime(inst);
      try {
        await waitReady(one, 2);
        await waitReady(two, 2);
        const specs = [spec('print(1)'), spec('print(2)')];
        const raws = await Promise.all([one.run(specs[0]!), two.run(specs[1]!)]);
        expect(raws.map((x) => x.stdout)).toEqual(['1\n', '2\n']);
        const api = (one as unknown as { internals: { api: { listPods(ns: string, sel: string): Promise<{ items: { metadata?: { name?: string } }[] }> } } }).internals.api;
        const names = await Promise.all(specs.map(async (x) => (await api.listPods(RUNS_NS, `sandpod.io/execution-id=${x.executionId}`)).items.map((p) => p.metadata?.name)));
        expect(names.every((n) => n.length === 1)).toBe(true);
        expect(names[0]![0]).not.toBe(names[1]![0]);
      } finally {
        await one.stop();
        await two.stop();
      }
    }, 300_000);
  });
});
