/** Applying manifests to a real cluster for the e2e suites and the cluster bench, as `kubectl apply --server-side` does. */
import { readFileSync } from 'node:fs';
import { KubernetesObjectApi, PatchStrategy, type KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import YAML from 'yaml';

/** The objects of YAML files (multi-document), empty documents dropped. */
export function manifestObjects(files: (string | URL)[]): KubernetesObject[] {
  return files.flatMap((u) => YAML.parseAllDocuments(readFileSync(u, 'utf8')).map((d) => d.toJS() as KubernetesObject | null)).filter((o): o is KubernetesObject => !!o);
}

/**
 * Applies each object server-side (`kubectl apply --server-side --force-conflicts`: fields the API
 * server owns, such as a Service's clusterIP, stay as they are); retries for a while because a kind
 * served by a CRD appears only once the CRD is established. `keep` names objects that must not be
 * changed when they exist (what `lookup` keeps on a `helm upgrade`).
 */
export async function applyObjects(kc: KubeConfig, objs: KubernetesObject[], keep: (o: KubernetesObject) => boolean = () => false): Promise<void> {
  const client = KubernetesObjectApi.makeApiClient(kc);
  for (const obj of objs) {
    for (let attempt = 0; ; attempt++) {
      try {
        if (keep(obj) && (await client.read(obj as never).catch(() => null))) break;
        await client.patch(obj, undefined, undefined, 'sandpod-tests', true, PatchStrategy.ServerSideApply);
        break;
      } catch (err) {
        if (attempt >= 20) throw err;
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  }
}
