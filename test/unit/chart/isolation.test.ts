/**
 * Defence in depth for `network: none` runs (issue 23 item 2): the chart can name a second
 * RuntimeClass (runsc with --network=none) for those job types, and by default runs the network check
 * (a `network: none` canary against the release's own Service), for which the service may read that
 * one Service and nothing else.
 */
import { beforeAll, expect, it } from 'vitest';
import { parseConfig } from '../../../src/config.ts';
import { TOOL_BUILD_TIMEOUT_MS, byKind, describeRendered, one, prepareRenderer, renderOk, validateBuiltin, withDb, type Manifest } from '../../support/chart.ts';
import YAML from 'yaml';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

const k8sConfig = (docs: Manifest[]) => parseConfig(YAML.parse(one(docs, 'ConfigMap').data['config.yaml']), { SVC_DATABASE_URL: 'postgres://x/y' }).kubernetes;
const serviceRules = (docs: Manifest[]) => one(docs, 'Role', 'sandpod-jobtypes').rules.filter((r: Manifest) => r.resources.includes('services'));

describeRendered('network none: second RuntimeClass and network check', () => {
  it('by default: no second class; the network check aims at the release Service, readable by name only', () => {
    const docs = renderOk(withDb());
    const k = k8sConfig(docs);
    expect(k.runtime_class_network_none).toBeNull();
    expect(k.network_check_service).toBe(one(docs, 'Service', 'sandpod').metadata.name);
    expect(byKind(docs, 'RuntimeClass')).toEqual([]);
    expect(serviceRules(docs)).toEqual([{ apiGroups: [''], resources: ['services'], resourceNames: ['sandpod'], verbs: ['get'] }]);
  });

  it('runs.networkCheck=false (or preflight off): no check and no access to the Service', () => {
    for (const args of [['--set', 'runs.networkCheck=false'], ['--set', 'runs.preflight=false']]) {
      const docs = renderOk(withDb(...args));
      expect(k8sConfig(docs).network_check_service).toBeNull();
      expect(serviceRules(docs)).toEqual([]);
    }
  });

  it('runtimeClass.networkNone.enabled names the class in the config; create renders it with its handler', async () => {
    const named = renderOk(withDb('--set', 'runtimeClass.networkNone.enabled=true'));
    expect(k8sConfig(named).runtime_class_network_none).toBe('gvisor-network-none');
    expect(byKind(named, 'RuntimeClass')).toEqual([]);
    const docs = renderOk(withDb('--set', 'runtimeClass.networkNone.enabled=true', '--set', 'runtimeClass.networkNone.create=true', '--set', 'runtimeClass.networkNone.handler=runsc-nonet', '--set', 'runtimeClass.networkNone.name=nonet'));
    const rc = one(docs, 'RuntimeClass', 'nonet');
    expect(rc.handler).toBe('runsc-nonet');
    expect(await validateBuiltin(rc)).toBeNull();
    expect(k8sConfig(docs).runtime_class_network_none).toBe('nonet');
    // create without enabled renders nothing: the class would be unused.
    expect(byKind(renderOk(withDb('--set', 'runtimeClass.networkNone.create=true')), 'RuntimeClass')).toEqual([]);
  });
});
