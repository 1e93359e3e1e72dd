/** Where every Kubernetes client of the service gets its configuration. */
import { KubeConfig } from '@kubernetes/client-node';

/**
 * Loads the client configuration the way kubectl does: the in-cluster service account when running
 * in a pod, else `KUBECONFIG` / `~/.kube/config`. Throws when none of them is usable.
 */
export function defaultKubeConfig(): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromDefault();
  return kc;
}
