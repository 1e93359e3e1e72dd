/**
 * The chart's side of leader election: the Lease the service is told to hold is the one its Role lets
 * it renew, and the Role grants Leases nothing more.
 */
import { beforeAll, expect, it } from 'vitest';
import YAML from 'yaml';
import { parseConfig } from '../../../src/config.ts';
import { describeRendered, one, prepareRenderer, render, renderOk, TOOL_BUILD_TIMEOUT_MS, withDb, type Manifest } from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

const config = (docs: Manifest[]) => parseConfig(YAML.parse(one(docs, 'ConfigMap', 'sandpod-config').data['config.yaml']), {});
const leaseRules = (docs: Manifest[]) => (one(docs, 'Role', 'sandpod-jobtypes').rules as Manifest[]).filter((r) => r.apiGroups.includes('coordination.k8s.io'));

describeRendered('leader election', () => {
  it('on by default: the service holds <fullname>-leader with the values’ times, and may create Leases and get/update only that one', () => {
    const docs = renderOk(withDb('--set', 'leaderElection.leaseDurationSeconds=20'), { release: 'pods' });
    const le = parseConfig(YAML.parse(one(docs, 'ConfigMap', 'pods-sandpod-config').data['config.yaml']), {}).kubernetes.leader_election;
    expect(le).toEqual({ enabled: true, lease_name: 'pods-sandpod-leader', lease_duration_seconds: 20, renew_deadline_seconds: 10, retry_period_seconds: 2 });
    const rules = (one(docs, 'Role', 'pods-sandpod-jobtypes').rules as Manifest[]).filter((r) => r.apiGroups.includes('coordination.k8s.io'));
    expect(rules).toEqual([
      { apiGroups: ['coordination.k8s.io'], resources: ['leases'], verbs: ['create'] },
      { apiGroups: ['coordination.k8s.io'], resources: ['leases'], resourceNames: ['pods-sandpod-leader'], verbs: ['get', 'update'] },
    ]);
    // Leases appear in no other Role.
    for (const role of docs.filter((d) => d.kind === 'Role' || d.kind === 'ClusterRole')) {
      if (role.metadata.name === 'pods-sandpod-jobtypes') continue;
      expect(JSON.stringify(role.rules)).not.toContain('leases');
    }
  });

  it('leaderElection.enabled=false: no Lease rules, and the service is told not to elect', () => {
    const docs = renderOk(withDb('--set', 'leaderElection.enabled=false'));
    expect(leaseRules(docs)).toEqual([]);
    expect(config(docs).kubernetes.leader_election.enabled).toBe(false);
  });

  it('times out of order are refused by the service’s config (renew deadline must be below the duration)', () => {
    const docs = renderOk(withDb('--set', 'leaderElection.renewDeadlineSeconds=20'));
    expect(() => config(docs)).toThrow(/retry_period_seconds < renew_deadline_seconds < lease_duration_seconds/);
  });

  it('the values schema refuses a negative retry period', () => {
    const r = render(withDb('--set', 'leaderElection.retryPeriodSeconds=-1'));
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/retryPeriodSeconds/);
  });
});
