/**
 * The `kubernetes` section of the configuration (src/config.ts holds the rest): where runs go, how
 * their pods are made, the warm pool, builds, the egress proxy and leader election.
 */
import * as v from 'valibot';

/** An integer in [min, max]. */
export const int = (min: number, max = Number.MAX_SAFE_INTEGER) => v.pipe(v.number(), v.integer(), v.minValue(min), v.maxValue(max));

/**
 * Leader election (src/kube/leader-elector.ts): the cluster-wide loops (pool sizing, the orphan sweep,
 * JobType reconciles, build garbage collection) run on the one replica holding the Lease
 * `lease_name` in `namespace`. Times follow client-go's defaults; renew deadline < lease duration.
 */
export const LeaderElectionSchema = v.pipe(
  v.object({
    enabled: v.optional(v.boolean(), true),
    lease_name: v.optional(v.pipe(v.string(), v.regex(/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/, 'must be a DNS subdomain name')), 'sandpod-leader'),
    lease_duration_seconds: v.optional(int(2, 600), 15),
    renew_deadline_seconds: v.optional(int(1, 600), 10),
    retry_period_seconds: v.optional(v.pipe(v.number(), v.gtValue(0), v.maxValue(600)), 2),
  }),
  v.check((o) => o.retry_period_seconds < o.renew_deadline_seconds && o.renew_deadline_seconds < o.lease_duration_seconds, 'needs retry_period_seconds < renew_deadline_seconds < lease_duration_seconds'),
);

export const KubernetesConfigSchema = v.object({
  namespace: v.optional(v.string(), 'sandpod'),
  runs_namespace: v.optional(v.string(), 'sandpod-jobs'),
  instance: v.optional(v.string(), 'sandpod'),
  runtime_class: v.optional(v.string(), 'gvisor'),
  executor_image: v.optional(v.nullable(v.string()), null),
  image_pull_policy: v.optional(v.picklist(['Always', 'IfNotPresent', 'Never']), 'IfNotPresent'),
  ttl_seconds_after_finished: v.optional(int(0), 600),
  deadline_grace_seconds: v.optional(int(0), 30),
  /**
   * Warm run pods per JobType (issue 10; runtime/kubernetes/pool.ts) when its spec names no
   * `warmPool.size`: pre-created run Jobs waiting for their program. 0 (the default here; the chart
   * sets 1) keeps no pool. A pod waiting longer than `warm_pool_max_idle_seconds` is replaced.
   */
  warm_pool_size: v.optional(int(0, 64), 0),
  warm_pool_max_idle_seconds: v.optional(int(10), 900),
  /**
   * How a cold run (no warm pod) gets its program: `secret` (a per-run Secret mounted as volumes;
   * completion seen when the kubelet reports `main` ended) or `attach` (the run's pod is made as a
   * pool pod is, the program is sent through attach once `main` runs, completion by the runner's
   * `done` line: no Secret volume to mount, no wait for the kubelet's status). Runs with
   * requirements to install always use `secret`. The chart sets `attach`.
   */
  cold_start: v.optional(v.picklist(['secret', 'attach']), 'secret'),
  watch_job_types: v.optional(v.boolean(), true),
  /** At start, run a canary pod that checks threads, select() and subprocesses in the run sandbox. */
  preflight: v.optional(v.boolean(), true),
  /**
   * A second RuntimeClass for job types with network `none` (issue 23): its runsc handler runs with
   * `--network=none`, so those pods have no network interface but loopback whatever the CNI does with
   * NetworkPolicy. Used only when the run would get `runtime_class` (gVisor); null: one class for all.
   */
  runtime_class_network_none: v.optional(v.nullable(v.pipe(v.string(), v.minLength(1))), null),
  /**
   * The name of the service's own Service in `namespace` (the chart sets it). With `preflight`, a
   * second canary, made as a `network: none` run pod, tries to connect to that Service's ClusterIP and
   * port; when it can, `/health` is degraded: "network policy not enforced". Null: no such check.
   */
  network_check_service: v.optional(v.nullable(v.pipe(v.string(), v.minLength(1))), null),
  // What a run reserves when its job type names no request: this fraction of its limit.
  cpu_request_fraction: v.optional(v.pipe(v.number(), v.gtValue(0), v.maxValue(1)), 0.25),
  memory_request_fraction: v.optional(v.pipe(v.number(), v.gtValue(0), v.maxValue(1)), 0.5),
  // Deadline of every Kubernetes API call (a hung API server fails the call, not the service).
  api_timeout_seconds: v.optional(int(1, 600), 30),
  // Server-side timeout of each watch; a watch still open well past it is stalled: re-listed.
  watch_timeout_seconds: v.optional(int(1, 3600), 60),
  /**
   * The cluster's egress proxy (src/egress, the chart's `egressProxy`). When set, run pods of a `bridge`
   * job type with `allowed_hosts` get `HTTP(S)_PROXY` pointing at `url` with a per-run credential signed
   * with the key in `key_file`, and only reach the proxy. Null: `allowed_hosts` is not enforced in the
   * cluster (the NetworkPolicy's CIDRs are all there is).
   */
  egress_proxy: v.optional(
    v.nullable(
      v.object({
        url: v.pipe(v.string(), v.regex(/^http:\/\/[^/@\s]+:\d{1,5}\/?$/, 'must be http://host:port (the proxy takes plain HTTP and CONNECT)')),
        key_file: v.pipe(v.string(), v.minLength(1)),
      }),
    ),
    null,
  ),
  /**
   * Job-type builds (SPEC §4.9): the registry and repository prefix built images are pushed to,
   * e.g. `registry.example.com/sandpod/builds` (each type gets `<prefix>/<type>`). Null: no builds
   * (`POST /job-types/{name}/build` answers 501). Nodes must be able to pull from it.
   */
  build_registry: v.optional(v.nullable(v.pipe(v.string(), v.regex(/^[A-Za-z0-9.-]+(:\d+)?(\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/, 'must be host[:port][/path]'))), null),
  /** A `kubernetes.io/dockerconfigjson` Secret in `namespace` with the push (and base pull) credentials. */
  build_registry_secret: v.optional(v.nullable(v.pipe(v.string(), v.minLength(1))), null),
  /** Talk plain HTTP to the build registry (tests, an in-cluster registry without TLS). */
  build_registry_insecure: v.optional(v.boolean(), false),
  /** Platform (`os/arch`) picked from a multi-platform executor image. */
  build_platform: v.optional(v.pipe(v.string(), v.regex(/^[a-z0-9]+\/[a-z0-9]+$/, 'must look like linux/amd64')), 'linux/amd64'),
  /** Requests and limits of a build pod's pip container (Kubernetes quantities). */
  build_cpu: v.optional(v.string(), '1'),
  build_memory: v.optional(v.string(), '2Gi'),
  /** Room for the installed requirements (the build pod's emptyDir). */
  build_ephemeral_storage: v.optional(v.string(), '4Gi'),
  leader_election: v.optional(LeaderElectionSchema, {}),
});
