/**
 * Issue 22 item 8, chart: a preStop pause before SIGTERM with a grace period that covers it and the
 * drain; images that cannot silently change (pull Always for tags, IfNotPresent only when pinned by
 * digest).
 */
import { beforeAll, expect, it } from 'vitest';
import YAML from 'yaml';
import { TOOL_BUILD_TIMEOUT_MS, describeRendered, one, prepareRenderer, render, renderOk, validateBuiltin, withDb, type Manifest } from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

const DIGEST = `sha256:${'b'.repeat(64)}`;
const api = (docs: Manifest[]) => one(docs, 'Deployment', 'sandpod').spec.template.spec;
const pullPolicyOfRuns = (docs: Manifest[]) => (YAML.parse(one(docs, 'ConfigMap').data['config.yaml']) as { kubernetes: { image_pull_policy: string } }).kubernetes.image_pull_policy;

describeRendered('preStop and grace', () => {
  it('the API container pauses preStopSleepSeconds (with node: no shell tools needed) before SIGTERM', async () => {
    const docs = renderOk(withDb());
    const c = api(docs).containers[0];
    expect(c.lifecycle.preStop.exec.command).toEqual(['node', '-e', 'setTimeout(() => {}, 5000)']);
    expect(await validateBuiltin(one(docs, 'Deployment', 'sandpod'))).toBeNull();
    const longer = api(renderOk(withDb('--set', 'preStopSleepSeconds=12', '--set', 'config.shutdown_grace_seconds=60')));
    expect(longer.containers[0].lifecycle.preStop.exec.command[2]).toBe('setTimeout(() => {}, 12000)');
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
