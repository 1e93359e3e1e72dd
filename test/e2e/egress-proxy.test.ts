/**
 * Egress by host name on a real cluster (issue #13 point 1). Skipped unless `SANDPOD_E2E_KUBECONFIG`
 * names a kubeconfig (`SANDPOD_E2E_IMAGE`: the executor image).
 *
 * A run pod of a bridge job type with allowed_hosts, made by the Kubernetes runtime configured with
 * `kubernetes.egress_proxy`, gets HTTP(S)_PROXY with its own credential. In the pod, Python's urllib
 * reaches the allowed address (an HTTP server on the machine, at the pod network's gateway
 * `SANDPOD_E2E_HOST_IP`, default 10.244.0.1 — where kcluster's pods reach the machine) through the
 * proxy, gets 403 for hosts not in the list and 407 without the credential; the proxy logs each
 * refusal with the execution id. The proxy runs:
 * 1. on the machine, listening on the gateway address (src/egress/cluster.ts in this process);
 * 2. in the cluster, when `SANDPOD_E2E_SERVICE_IMAGE` names the service image: a pod of that image
 *    running src/egress/main.ts (bundled here with esbuild and mounted from a ConfigMap, so an image
 *    built before this code works too) behind a ClusterIP Service, its log read from the API.
 * Whether a pod can bypass the proxy is the NetworkPolicy's job; kcluster does not enforce
 * NetworkPolicy, so that is covered by the chart tests, not here.
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { CoreV1Api, KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import * as v from 'valibot';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { JobTypeConfigSchema, parseConfig } from '../../src/config.ts';
import { startClusterEgressProxy } from '../../src/egress/cluster.ts';
import type { EgressProxy } from '../../src/egress/proxy.ts';
import { fromConfig } from '../../src/jobtypes/job-type.ts';
import { createLogger } from '../../src/logger.ts';
import { createKubernetesRuntime } from '../../src/runtime/kubernetes/index.ts';
import type { Runtime } from '../../src/runtime/runtime.ts';
import { applyObjects, manifestObjects } from '../support/kube-apply.ts';

const KUBECONFIG = process.env.SANDPOD_E2E_KUBECONFIG;
const IMAGE = process.env.SANDPOD_E2E_IMAGE ?? 'ghcr.io/sandpod/executor:0.1.0';
const SERVICE_IMAGE = process.env.SANDPOD_E2E_SERVICE_IMAGE;
const HOST_IP = process.env.SANDPOD_E2E_HOST_IP ?? '10.244.0.1';
const NS = 'sandpod-e2e';
/** Under real gVisor (`kcluster up --gvisor`) the run pods get the gVisor RuntimeClass, strictly. */
const GVISOR = process.env.SANDPOD_E2E_GVISOR === '1';
const RUNS_NS = 'sandpod-e2e-jobs';
const KEY = randomUUID() + randomUUID();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let kc: KubeConfig;
let site: http.Server;
let sitePort: number;
let keyFile: string;

/** A runtime whose runs go through the proxy at `proxyUrl`. */
async function runtimeFor(proxyUrl: string): Promise<Runtime> {
  const config = parseConfig(
    {
      runtime: 'kubernetes',
      security_mode: GVISOR ? 'strict' : 'permissive',
      kubernetes: {
        namespace: NS,
        runs_namespace: RUNS_NS,
        instance: `e2e-egress-${randomUUID().slice(0, 8)}`,
        runtime_class: GVISOR ? 'gvisor-e2e' : 'no-such-runtime-class',
        executor_image: IMAGE,
        ttl_seconds_after_finished: 120,
        preflight: false,
        egress_proxy: { url: proxyUrl, key_file: keyFile },
      },
    },
    {},
  );
  const rt = createKubernetesRuntime(config, { kubeConfig: kc });
  await rt.start();
  return rt;
}

/**
 * Runs urllib requests in a run pod through its proxy env and checks the answers, then that the
 * proxy's log (`logs()`, JSON lines) holds the decisions with the execution id.
 */
async function checkFromRunPod(rt: Runtime, proxyHostPort: string, logs: () => Promise<Record<string, unknown>[]>): Promise<void> {
  const jobType = fromConfig(v.parse(JobTypeConfigSchema, { name: 'egress-e2e', network: { mode: 'bridge', allowed_hosts: [`${HOST_IP}:${sitePort}`, '*.wild.test'] } }));
  const executionId = randomUUID();
  const otherPort = sitePort === 9 ? 10 : 9;
  const code = [
    'import os, urllib.request, urllib.error',
    'def fetch(url, opener=None):',
    '    try:',
    '        r = (opener or urllib.request.build_opener()).open(url, timeout=20)',
    '        return "%d %s" % (r.status, r.read().decode())',
    '    except urllib.error.HTTPError as e:',
    '        return "%d %s" % (e.code, e.read().decode().strip())',
    `print("allowed:", fetch("http://${HOST_IP}:${sitePort}/hello"))`,
    `print("other-port:", fetch("http://${HOST_IP}:${otherPort}/"))`,
    'print("by-name:", fetch("http://example.com/"))',
    'bare = os.environ["HTTP_PROXY"].split("@")[1]',
    'anon = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://" + bare}))',
    `print("no-credential:", fetch("http://${HOST_IP}:${sitePort}/hello", anon))`,
    'print("proxy-host:", bare)',
    // Issue 22 item 1: a NUL in a host that matches *.wild.test, sent raw with the run's credential.
    'import base64, socket, urllib.parse',
    'u = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])',
    'cred = base64.b64encode(("%s:%s" % (urllib.parse.unquote(u.username), urllib.parse.unquote(u.password))).encode())',
    's = socket.create_connection((u.hostname, u.port), timeout=20)',
    `s.sendall(b"CONNECT ${HOST_IP}\\0.wild.test:${sitePort} HTTP/1.1\\r\\nProxy-Authorization: Basic " + cred + b"\\r\\n\\r\\n")`,
    'print("nul-host:", s.recv(4096).split(b"\\r\\n")[0].decode())',
  ].join('\n');
  const raw = await rt.run({
    executionId,
    code,
    inputJson: '{}',
    jobType,
    timeoutSec: 60,
    startupTimeoutSec: 180,
    requirements: [],
    maxStdoutBytes: 32768,
    maxArtifactBytes: 1024 * 1024,
  });
  expect(raw.observation, raw.stderr).toMatchObject({ exitCode: 0, infraError: null, phase: 'completed' });
  const out = Object.fromEntries(raw.stdout.trim().split('\n').map((l) => [l.slice(0, l.indexOf(':')), l.slice(l.indexOf(':') + 2)]));
  expect(out['proxy-host']).toBe(proxyHostPort);
  expect(out.allowed).toBe('200 allowed site saw GET /hello');
  expect(out['other-port']).toMatch(new RegExp(`^403 sandpod egress proxy: egress to ${HOST_IP.replace(/\./g, '\\.')}:${otherPort} is not allowed`));
  expect(out['by-name']).toMatch(/^403 sandpod egress proxy: egress to example\.com:80 is not allowed/);
  expect(out['no-credential']).toMatch(/^407 sandpod egress proxy: proxy authentication failed \(missing\)/);
  expect(out['nul-host']).toBe('HTTP/1.1 400 Bad Request');
  let lines: Record<string, unknown>[] = [];
  for (let i = 0; i < 30; i++) {
    lines = await logs();
    if (lines.filter((l) => l.execution_id === executionId).length >= 3) break;
    await sleep(1000);
  }
  expect(lines).toContainEqual(expect.objectContaining({ level: 'info', msg: 'egress allowed', execution_id: executionId, host: HOST_IP, port: sitePort }));
  expect(lines).toContainEqual(expect.objectContaining({ level: 'warn', msg: 'egress refused', execution_id: executionId, host: 'example.com', port: 80 }));
  expect(lines).toContainEqual(expect.objectContaining({ level: 'warn', msg: 'egress refused', execution_id: executionId, host: HOST_IP, port: otherPort }));
}

describe.skipIf(!KUBECONFIG)('egress proxy e2e (needs SANDPOD_E2E_KUBECONFIG and SANDPOD_E2E_IMAGE; skipped without them)', () => {
  beforeAll(async () => {
    kc = new KubeConfig();
    kc.loadFromFile(KUBECONFIG!);
    await applyObjects(
      kc,
      manifestObjects([
        ...readdirSync(new URL('../../crds/', import.meta.url)).filter((f) => f.endsWith('.yaml')).map((f) => new URL(`../../crds/${f}`, import.meta.url)),
        new URL('./manifests/namespaces.yaml', import.meta.url),
        new URL('./manifests/runtimeclass.yaml', import.meta.url),
      ]) as KubernetesObject[],
    );
    site = http.createServer((req, res) => res.end(`allowed site saw ${req.method} ${req.url}`));
    await new Promise<void>((r) => site.listen(0, HOST_IP, () => r()));
    sitePort = (site.address() as net.AddressInfo).port;
    keyFile = path.join(mkdtempSync(path.join(tmpdir(), 'sp-e2e-egress-')), 'key');
    writeFileSync(keyFile, KEY);
  }, 300_000);

  afterAll(() => {
    site?.close();
  });

  describe('proxy on the machine', () => {
    let rt: Runtime;
    let proxy: EgressProxy;
    const logLines: Record<string, unknown>[] = [];
    beforeAll(async () => {
      const sink = new Writable({
        write(chunk: Buffer, _e, cb) {
          for (const l of chunk.toString('utf8').split('\n').filter(Boolean)) logLines.push(JSON.parse(l) as Record<string, unknown>);
          cb();
        },
      });
      proxy = await startClusterEgressProxy({ key: KEY, port: 0, host: HOST_IP, logger: createLogger('info', 'json', sink) });
      rt = await runtimeFor(`http://${HOST_IP}:${proxy.port}`);
    }, 120_000);
    afterAll(async () => {
      await rt?.stop();
      await proxy?.close();
    });

    it('allowed address through the proxy, other hosts 403, no credential 407, refusals logged with the execution id', async () => {
      await checkFromRunPod(rt, `${HOST_IP}:${proxy.port}`, async () => logLines);
    }, 300_000);
  });

  describe.skipIf(!SERVICE_IMAGE)('proxy in the cluster (needs SANDPOD_E2E_SERVICE_IMAGE)', () => {
    const name = `egress-e2e-${randomUUID().slice(0, 6)}`;
    let core: CoreV1Api;
    let rt: Runtime;
    let clusterIP: string;

    beforeAll(async () => {
      core = kc.makeApiClient(CoreV1Api);
      const { build } = await import('esbuild');
      const bundle = await build({ entryPoints: [new URL('../../src/egress/main.ts', import.meta.url).pathname], bundle: true, platform: 'node', format: 'esm', target: 'node20', external: ['pino', 'pino-pretty'], write: false });
      const labels = { app: name };
      await applyObjects(kc, [
        { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name, namespace: NS }, data: { 'main.mjs': bundle.outputFiles[0]!.text } } as KubernetesObject,
        { apiVersion: 'v1', kind: 'Secret', metadata: { name, namespace: NS }, stringData: { key: KEY } } as KubernetesObject,
        {
          apiVersion: 'v1',
          kind: 'Pod',
          metadata: { name, namespace: NS, labels },
          spec: {
            automountServiceAccountToken: false,
            enableServiceLinks: false,
            securityContext: { runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000 },
            containers: [
              {
                name: 'egress-proxy',
                image: SERVICE_IMAGE,
                imagePullPolicy: 'IfNotPresent',
                // Beside the image's node_modules, so the bundle finds pino there.
                command: ['node', '/app/egress-e2e/main.mjs'],
                env: [
                  { name: 'SANDPOD_EGRESS_KEY_FILE', value: '/etc/sandpod/egress/key' },
                  { name: 'SANDPOD_EGRESS_PORT', value: '3128' },
                  { name: 'SANDPOD_EGRESS_HEALTH_PORT', value: '8081' },
                ],
                ports: [
                  { name: 'proxy', containerPort: 3128, protocol: 'TCP' },
                  { name: 'health', containerPort: 8081, protocol: 'TCP' },
                ],
                // As the chart probes it: /readyz over HTTP (503 when saturated).
                readinessProbe: { httpGet: { path: '/readyz', port: 8081 }, periodSeconds: 1 },
                securityContext: { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } },
                volumeMounts: [
                  { name: 'code', mountPath: '/app/egress-e2e', readOnly: true },
                  { name: 'key', mountPath: '/etc/sandpod/egress', readOnly: true },
                ],
              },
            ],
            volumes: [
              { name: 'code', configMap: { name } },
              { name: 'key', secret: { secretName: name } },
            ],
          },
        } as KubernetesObject,
        { apiVersion: 'v1', kind: 'Service', metadata: { name, namespace: NS }, spec: { selector: labels, ports: [{ name: 'proxy', port: 3128, targetPort: 3128, protocol: 'TCP' }] } } as KubernetesObject,
      ]);
      for (let i = 0; ; i++) {
        const pod = await core.readNamespacedPod({ name, namespace: NS });
        if (pod.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')) break;
        if (i > 240) throw new Error(`proxy pod not ready: ${JSON.stringify(pod.status)}`);
        await sleep(1000);
      }
      clusterIP = (await core.readNamespacedService({ name, namespace: NS })).spec!.clusterIP!;
      rt = await runtimeFor(`http://${clusterIP}:3128`);
    }, 300_000);

    afterAll(async () => {
      await rt?.stop();
      for (const del of [
        () => core.deleteNamespacedPod({ name, namespace: NS, gracePeriodSeconds: 0 }),
        () => core.deleteNamespacedService({ name, namespace: NS }),
        () => core.deleteNamespacedConfigMap({ name, namespace: NS }),
        () => core.deleteNamespacedSecret({ name, namespace: NS }),
      ]) await del().catch(() => undefined);
    });

    it('through the proxy pod and its Service: allowed 200, others 403, no credential 407; the pod logs refusals with the execution id', async () => {
      await checkFromRunPod(rt, `${clusterIP}:3128`, async () => {
        const text = await core.readNamespacedPodLog({ name, namespace: NS, container: 'egress-proxy' });
        return String(text)
          .split('\n')
          .filter((l) => l.startsWith('{'))
          .map((l) => JSON.parse(l) as Record<string, unknown>);
      });
    }, 300_000);
  });
});
