/** The warm sandbox series of /metrics, from a runtime's pool stats. */
import { describe, expect, it } from 'vitest';
import { Metrics } from '../../src/metrics.ts';

describe('warm pool metrics', () => {
  it('claims by outcome and hand-over retries per job type', async () => {
    const m = new Metrics();
    m.watchWarmPool(() => [
      { job_type: 'a', target: 2, ready: 1, starting: 0, oldest_age_ms: 5000, newest_age_ms: 5000, hits: 4, misses: 1, handover_retries: 2, refill_ms: 1500, restored: 7 },
      { job_type: 'b', target: 0, ready: 0, starting: 0, oldest_age_ms: null, newest_age_ms: null, hits: 0, misses: 3 },
    ]);
    const text = await m.registry.metrics();
    expect(text).toContain('sandpod_warm_claims_total{job_type="a",outcome="hit"} 4');
    expect(text).toContain('sandpod_warm_handover_retries_total{job_type="a"} 2');
    // A runtime that does not count retries shows no series for them.
    expect(text).not.toContain('sandpod_warm_handover_retries_total{job_type="b"}');
    // Target and refill time (issue 18): the refill only where one was measured.
    expect(text).toContain('sandpod_warm_sandboxes_target{job_type="a"} 2');
    expect(text).toContain('sandpod_warm_refill_seconds{job_type="a"} 1.5');
    expect(text).not.toContain('sandpod_warm_refill_seconds{job_type="b"}');
    // Restored sandboxes (local gVisor with warm_pool.restore), only where counted.
    expect(text).toContain('sandpod_warm_restored_total{job_type="a"} 7');
    expect(text).not.toContain('sandpod_warm_restored_total{job_type="b"}');
  });
});

describe('session pool metrics', () => {
  it('target, ready and starting, hits and misses per job type', async () => {
    const m = new Metrics();
    m.watchSessionPool(() => [{ job_type: 'default', target: 1, ready: 1, starting: 0, hits: 3, misses: 2 }]);
    const text = await m.registry.metrics();
    expect(text).toContain('sandpod_session_pool_target{job_type="default"} 1');
    expect(text).toContain('sandpod_session_pool_sandboxes{job_type="default",state="ready"} 1');
    expect(text).toContain('sandpod_session_pool_sandboxes{job_type="default",state="starting"} 0');
    expect(text).toContain('sandpod_session_pool_claims_total{job_type="default",outcome="hit"} 3');
    expect(text).toContain('sandpod_session_pool_claims_total{job_type="default",outcome="miss"} 2');
  });
});
