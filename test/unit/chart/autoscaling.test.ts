/**
 * The optional HorizontalPodAutoscaler of the API Deployment (issue 20 item 5, docs/capacity.md):
 * off by default; when on it targets the Deployment, which then leaves its replica count to it, and
 * the PodDisruptionBudget follows minReplicas; autoscaling/v2 where served, v2beta2 on older clusters.
 */
import { beforeAll, expect, it } from 'vitest';
import { byKind, describeRendered, one, prepareRenderer, render, renderOk, TOOL_BUILD_TIMEOUT_MS, withDb } from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

describeRendered('autoscaling', () => {
  it('off by default: no HPA, the Deployment keeps replicaCount', () => {
    const docs = renderOk(withDb('--set', 'replicaCount=3'));
    expect(byKind(docs, 'HorizontalPodAutoscaler')).toEqual([]);
    expect(one(docs, 'Deployment', 'sandpod').spec.replicas).toBe(3);
  });

  it('on: targets the Deployment on CPU, the Deployment has no replica count, the PDB follows minReplicas', () => {
    const docs = renderOk(withDb('--set', 'autoscaling.enabled=true', '--set', 'autoscaling.minReplicas=3', '--set', 'autoscaling.maxReplicas=9', '--set', 'replicaCount=1'));
    const hpa = one(docs, 'HorizontalPodAutoscaler', 'sandpod');
    const deploy = one(docs, 'Deployment', 'sandpod');
    expect(hpa.apiVersion).toBe('autoscaling/v2');
    expect(hpa.metadata.namespace).toBe('sandpod');
    expect(hpa.spec.scaleTargetRef).toEqual({ apiVersion: 'apps/v1', kind: 'Deployment', name: deploy.metadata.name });
    expect(hpa.spec.minReplicas).toBe(3);
    expect(hpa.spec.maxReplicas).toBe(9);
    expect(hpa.spec.metrics).toEqual([{ type: 'Resource', resource: { name: 'cpu', target: { type: 'Utilization', averageUtilization: 70 } } }]);
    expect(hpa.spec.behavior).toBeUndefined();
    expect(deploy.spec.replicas).toBeUndefined();
    // Utilization is relative to requests: the API container must have a CPU request.
    expect(deploy.spec.template.spec.containers[0].resources.requests.cpu).toBeDefined();
    // replicaCount=1 alone would drop the PDB; minReplicas=3 keeps it.
    expect(one(docs, 'PodDisruptionBudget').spec.selector.matchLabels).toEqual(deploy.spec.selector.matchLabels);
  });

  it('a memory target and a behavior are passed through; minReplicas 1 drops the PDB', () => {
    const docs = renderOk(
      withDb('--set', 'autoscaling.enabled=true', '--set', 'autoscaling.minReplicas=1', '--set', 'autoscaling.targetMemoryUtilizationPercentage=80', '--set', 'autoscaling.behavior.scaleDown.stabilizationWindowSeconds=600'),
    );
    const hpa = one(docs, 'HorizontalPodAutoscaler');
    expect(hpa.spec.metrics.map((m: { resource: { name: string; target: { averageUtilization: number } } }) => [m.resource.name, m.resource.target.averageUtilization])).toEqual([
      ['cpu', 70],
      ['memory', 80],
    ]);
    expect(hpa.spec.behavior).toEqual({ scaleDown: { stabilizationWindowSeconds: 600 } });
    expect(byKind(docs, 'PodDisruptionBudget')).toEqual([]);
  });

  it.each([
    ['1.20', 'autoscaling/v2beta2'],
    ['1.22', 'autoscaling/v2beta2'],
    ['1.23', 'autoscaling/v2'],
    ['1.30', 'autoscaling/v2'],
  ])('Kubernetes %s gets %s', (kube, api) => {
    const hpa = one(renderOk(withDb('--kube-version', kube, '--set', 'autoscaling.enabled=true')), 'HorizontalPodAutoscaler');
    expect(hpa.apiVersion).toBe(api);
    expect(hpa.spec.metrics).toHaveLength(1);
  });

  it('refuses maxReplicas below minReplicas, no target at all, and a minReplicas of 0', () => {
    const low = render(withDb('--set', 'autoscaling.enabled=true', '--set', 'autoscaling.minReplicas=4', '--set', 'autoscaling.maxReplicas=2'));
    expect(low.code).not.toBe(0);
    expect(low.stderr).toContain('autoscaling.maxReplicas (2) must be at least autoscaling.minReplicas (4)');
    const none = render(withDb('--set', 'autoscaling.enabled=true', '--set', 'autoscaling.targetCPUUtilizationPercentage=null'));
    expect(none.code).not.toBe(0);
    expect(none.stderr).toContain('needs autoscaling.targetCPUUtilizationPercentage');
    const zero = render(withDb('--set', 'autoscaling.enabled=true', '--set', 'autoscaling.minReplicas=0'));
    expect(zero.code).not.toBe(0);
    expect(zero.stderr).toMatch(/minReplicas/);
  });
});
