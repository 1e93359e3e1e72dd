/**
 * Issue 22 item 8, chart: a preStop pause before SIGTERM with a grace period that covers it and the
 * drain; images that cannot silently change (pull Always for tags, IfNotPresent only when pinned by
 * digest).
 */
import { execFileSync, spawn } from 'node:child_process';
import { beforeAll, expect, it } from 'vitest';
import YAML from 'yaml';
import { TOOL_BUILD_TIMEOUT_MS, describeRendered, one, prepareRenderer, render, renderOk, validateBuiltin, withDb, type Manifest } from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

const DIGEST = `sha256:${'b'.repeat(64)}`;
const api = (docs: Manifest[]) => one(docs, 'Deployment', 'sandpod').spec.template.spec;
const pullPolicyOfRuns = (docs: Manifest[]) => (YAML.parse(one(docs, 'ConfigMap').data['config.yaml']) as { kubernetes: { image_pull_policy: string } }).kubernetes.image_pull_policy;

describeRendered('preStop and grace', () => {
  it('the API container steps down (SIGUSR2 to the service) and pauses preStopSleepSeconds (a shell: a node start took seconds on a loaded node) before SIGTERM', async () => {
    const docs = renderOk(withDb());
    const c = api(docs).containers[0];
    expect(c.lifecycle.preStop.exec.command).toEqual(['/bin/sh', '-c', 'kill -USR2 1; sleep 5']);
    expect(await validateBuiltin(one(docs, 'Deployment', 'sandpod'))).toBeNull();
    const longer = api(renderOk(withDb('--set', 'preStopSleepSeconds=12', '--set', 'config.shutdown_grace_seconds=60')));
    const script = longer.containers[0].lifecycle.preStop.exec.command[2] as string;
    expect(script).toBe('kill -USR2 1; sleep 12');
    // Run for real by a shell, against a process standing for PID 1: it gets SIGUSR2, and the hook pauses.
    // It says `ready` once its handler is in place: a signal before that would kill it (SIGUSR2's
    // default), and a node start takes seconds on a loaded machine (a fixed 300 ms wait flaked in CI).
    const target = spawn('node', ['-e', "process.on('SIGUSR2', () => { console.log('stepped down'); process.exit(0) }); console.log('ready'); setInterval(() => {}, 1000)"], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    const ready = new Promise<void>((r) => target.stdout.on('data', (b: Buffer) => ((out += b.toString()), out.startsWith('ready\n') && r())));
    await ready;
    out = out.slice('ready\n'.length);
    const t0 = Date.now();
    execFileSync('/bin/sh', ['-c', script.replace('kill -USR2 1', `kill -USR2 ${target.pid}`).replace('sleep 12', 'sleep 1')]);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(900);
    await new Promise<void>((r) => (target.exitCode !== null ? r() : target.on('exit', () => r())));
    expect(out).toBe('stepped down\n');
    // The grace period runs from the preStop hook: pause + drain + margin.
    expect(longer.terminationGracePeriodSeconds).toBe(12 + 60 + 15);
  });

  it('0 turns the hook off; the grace is then the drain plus the margin', () => {
    const spec = api(renderOk(withDb('--set', 'preStopSleepSeconds=0')));
    expect(spec.containers[0].lifecycle).toBeUndefined();
    expect(spec.terminationGracePeriodSeconds).toBe(30 + 15);
    expect(render(withDb('--set', 'preStopSleepSeconds=-1')).code).toBe(1);
  });
});

describeRendered('image pull policies', () => {
  it('by default (tags): Always for the API, the migration Job and run pods (kubernetes.image_pull_policy)', () => {
    const docs = renderOk(withDb());
    expect(api(docs).containers[0].imagePullPolicy).toBe('Always');
    expect(one(docs, 'Job', 'sandpod-migrate').spec.template.spec.containers[0].imagePullPolicy).toBe('Always');
    expect(pullPolicyOfRuns(docs)).toBe('Always');
  });

  it('executor and trial database pinned by digest: IfNotPresent; an explicit pullPolicy wins', () => {
    const pinned = renderOk(withDb('--set', `executorImage.digest=${DIGEST}`));
    expect(pullPolicyOfRuns(pinned)).toBe('IfNotPresent');
    expect(pullPolicyOfRuns(renderOk(withDb('--set', `executorImage.digest=${DIGEST}`, '--set', 'executorImage.pullPolicy=Always')))).toBe('Always');
    expect(pullPolicyOfRuns(renderOk(withDb('--set', 'executorImage.pullPolicy=Never')))).toBe('Never');
    const trial = (args: string[]) => one(renderOk(['--set', 'postgresql.enabled=true', ...args]), 'StatefulSet').spec.template.spec.containers[0].imagePullPolicy;
    expect(trial([])).toBe('Always');
    expect(trial(['--set', `postgresql.image.digest=${DIGEST}`])).toBe('IfNotPresent');
    expect(api(renderOk(withDb('--set', 'image.pullPolicy=IfNotPresent'))).containers[0].imagePullPolicy).toBe('IfNotPresent');
  });
});

describeRendered('generated Secrets or your own (GitOps renders cannot look up)', () => {
  const secretNames = (docs: Manifest[]) => docs.filter((d) => d.kind === 'Secret').map((d) => d.metadata.name as string).sort();

  it('postgresql.existingSecret: no generated password Secret; the database and the API read the one named', () => {
    const docs = renderOk(['--set', 'postgresql.enabled=true', '--set', 'postgresql.existingSecret=my-pg', '--set', 'postgresql.existingSecretKey=pw']);
    expect(secretNames(docs)).not.toContain('sandpod-postgresql');
    const refs = [
      one(docs, 'StatefulSet').spec.template.spec.containers[0].env,
      api(docs).containers[0].env,
    ].map((env: Manifest[]) => env.find((e) => e.valueFrom?.secretKeyRef)?.valueFrom.secretKeyRef);
    expect(refs).toEqual([{ name: 'my-pg', key: 'pw' }, { name: 'my-pg', key: 'pw' }]);
    // By default the chart generates it (kept by lookup on helm upgrade).
    const generated = renderOk(['--set', 'postgresql.enabled=true']);
    expect(secretNames(generated)).toContain('sandpod-postgresql');
    expect(api(generated).containers[0].env.find((e: Manifest) => e.name === 'TRIAL_DATABASE_PASSWORD').valueFrom.secretKeyRef).toEqual({ name: 'sandpod-postgresql', key: 'password' });
  });

  it('with auth.existingSecret and database.existingSecret the chart renders no random Secret of its own but the egress key', () => {
    const docs = renderOk(['--set', 'auth.existingSecret=my-tokens', '--set', 'database.existingSecret=my-db']);
    expect(secretNames(docs)).toEqual(['sandpod-egress-key']);
  });

  it('egressProxy.existingSecret: no generated key; the API and the proxy pods mount the key named', () => {
    const docs = renderOk(['--set', 'auth.existingSecret=my-tokens', '--set', 'database.existingSecret=my-db', '--set', 'egressProxy.existingSecret=my-egress', '--set', 'egressProxy.existingSecretKey=signing']);
    expect(secretNames(docs)).toEqual([]);
    const keyVolumes = docs
      .filter((d) => d.kind === 'Deployment')
      .map((d) => d.spec.template.spec.volumes.find((v: Manifest) => v.secret && v.secret.items?.some((i: Manifest) => i.path === 'key'))?.secret);
    expect(keyVolumes).toHaveLength(2);
    for (const s of keyVolumes) expect(s).toMatchObject({ secretName: 'my-egress', items: [{ key: 'signing', path: 'key' }] });
    // By default both mount the generated Secret's `key`.
    const generated = renderOk(['--set', 'auth.existingSecret=my-tokens', '--set', 'database.existingSecret=my-db'])
      .filter((d) => d.kind === 'Deployment')
      .map((d) => d.spec.template.spec.volumes.find((v: Manifest) => v.secret && v.secret.items?.some((i: Manifest) => i.path === 'key'))?.secret);
    for (const s of generated) expect(s).toMatchObject({ secretName: 'sandpod-egress-key', items: [{ key: 'key', path: 'key' }] });
  });
});
