/**
 * A pod's QoS class the way the API server computes it (`status.qosClass`), over CPU and memory of
 * every container, init containers included: a limit without a request counts as a request equal to
 * it (API defaulting); Guaranteed when every container has CPU and memory limits equal to its
 * requests, BestEffort when no container requests or limits either, Burstable otherwise.
 */

/** A Kubernetes quantity (`250m`, `1`, `512Mi`, `1G`, `536870912`) as a number of base units. */
export function parseQuantity(q: string | number): number {
  if (typeof q === 'number') return q;
  const m = /^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$/.exec(q.trim());
  if (!m) throw new Error(`not a quantity: ${q}`);
  const mult: Record<string, number> = { m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, Ti: 1024 ** 4 };
  return Number(m[1]) * (m[2] ? mult[m[2]]! : 1);
}

type Resources = { requests?: Record<string, string | number>; limits?: Record<string, string | number> };

/** `Guaranteed`, `Burstable` or `BestEffort` for a pod spec. */
export function qosClassOf(spec: { containers: { resources?: Resources }[]; initContainers?: { resources?: Resources }[] }): 'Guaranteed' | 'Burstable' | 'BestEffort' {
  const all = [...(spec.initContainers ?? []), ...spec.containers];
  let any = false;
  let guaranteed = true;
  for (const c of all) {
    for (const r of ['cpu', 'memory']) {
      const limit = c.resources?.limits?.[r];
      const request = c.resources?.requests?.[r] ?? limit;
      if (limit !== undefined || request !== undefined) any = true;
      if (limit === undefined || request === undefined || parseQuantity(limit) !== parseQuantity(request)) guaranteed = false;
    }
  }
  if (!any) return 'BestEffort';
  return guaranteed ? 'Guaranteed' : 'Burstable';
}
