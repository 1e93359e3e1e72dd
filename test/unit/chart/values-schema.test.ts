/** values.schema.json rejects bad values at install time, with helm's messages. */
import { beforeAll, expect, it } from 'vitest';
import { TOOL_BUILD_TIMEOUT_MS, describeRendered, prepareRenderer, render, withDb } from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

const SCHEMA_ERROR = "values don't meet the specifications of the schema(s)";

describeRendered('values.schema.json', () => {
  it('accepts the defaults plus a database', () => {
    expect(render(withDb()).code).toBe(0);
  });

  it('accepts a realistic production override', () => {
    const r = render(
      withDb(
        '--set',
        'replicaCount=3',
        '--set',
        'config.security_mode=permissive',
        '--set',
        'config.max_workers=16',
        '--set-json',
        'config.pip={"index_url":"https://pypi.internal/simple","extra_args":["--prefer-binary"]}',
        '--set-json',
        'config.breaker={"failure_threshold":5,"recovery_timeout_ms":30000,"success_threshold":2}',
        '--set-json',
        'jobTypes.items.ml={"pythonVersion":"3.12","memoryLimit":"4g","cpuLimit":4,"timeout":300,"image":"registry.local/ml@sha256:' +
          'a'.repeat(64) +
          '"}',
        '--set-json',
        'networkPolicy.bridge.allowedCIDRs=["192.0.2.0/24",{"cidr":"0.0.0.0/0","except":["10.0.0.0/8"]}]',
      ),
    );
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
  });

  const bad: [string, string[], RegExp][] = [
    ['replica count as a string', ['--set', 'replicaCount=two'], /\/replicaCount': got string, want integer/],
    ['zero replicas', ['--set', 'replicaCount=0'], /\/replicaCount': minimum: got 0, want 1/],
    ['fractional replicas', ['--set', 'replicaCount=1.5'], /\/replicaCount'/],
    ['unknown security mode', ['--set', 'config.security_mode=lax'], /security_mode': value must be one of 'permissive', 'strict'/],
    ['misspelled config key', ['--set', 'config.max_wrokers=4'], /additional properties 'max_wrokers' not allowed/],
    ['chart-owned config key', ['--set', 'config.runtime=local'], /additional properties 'runtime' not allowed/],
    ['local-runtime config key', ['--set', 'config.sandbox_engine=process'], /additional properties 'sandbox_engine' not allowed/],
    ['max_workers out of range', ['--set', 'config.max_workers=1000'], /max_workers': maximum/],
    ['boolean as a string', ['--set-string', 'config.enable_seccomp=yes'], /enable_seccomp': got string, want boolean/],
    ['bad pull policy', ['--set', 'image.pullPolicy=Sometimes'], /pullPolicy': value must be one of/],
    ['bad image digest', ['--set', 'executorImage.digest=latest'], /digest'/],
    ['unknown top-level key', ['--set', 'replicas=2'], /additional properties 'replicas' not allowed/],
    ['non-postgres database URL', ['--set', 'database.url=mysql://x'], /\/database\/url'/],
    ['runs namespace not a DNS label', ['--set', 'runs.namespace=Sandpod_Jobs'], /\/runs\/namespace'/],
    ['unknown Pod Security level', ['--set', 'runs.podSecurity.level=strict'], /level': value must be one of/],
    ['negative TTL', ['--set', 'runs.ttlSecondsAfterFinished=-1'], /ttlSecondsAfterFinished': minimum/],
    ['bad CIDR', ['--set-json', 'networkPolicy.bridge.allowedCIDRs=["example.com"]'], /allowedCIDRs/],
    ['bad job type memory', ['--set', 'jobTypes.items.default.memoryLimit=lots'], /memoryLimit'/],
    ['bad job type network mode', ['--set', 'jobTypes.items.http.network.mode=host'], /mode': value must be one of 'none', 'bridge'/],
    ['bad job type name', ['--set-json', 'jobTypes.items.Bad_Name={}'], /jobTypes\/items'/],
    ['root API pods', ['--set', 'securityContext.runAsNonRoot=false'], /runAsNonRoot'/],
    ['privilege escalation', ['--set', 'securityContext.allowPrivilegeEscalation=true'], /allowPrivilegeEscalation'/],
    ['service port out of range', ['--set', 'service.port=70000'], /\/service\/port': maximum: got 70000, want 65535/],
    ['probe path without slash', ['--set', 'probes.liveness.path=livez'], /\/probes\/liveness\/path'/],
  ];

  it.each(bad)('rejects %s', (_what, args, message) => {
    const r = render(withDb(...args));
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(SCHEMA_ERROR);
    expect(r.stderr).toMatch(message);
  });
});
