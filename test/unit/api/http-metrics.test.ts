/**
 * The HTTP metrics middleware on small hono apps shaped like ours (sub-apps mounted with route(),
 * middleware on wildcards): the route label is the template of the endpoint, whatever answered.
 */
import { Hono } from 'hono';
import { describe, expect, it } from 'vitest';
import { UNMATCHED_ROUTE, httpMetrics } from '../../../src/api/middleware/http-metrics.ts';
import { Metrics } from '../../../src/metrics.ts';

function appWith(metrics: Metrics): Hono {
  const app = new Hono();
  app.use('*', httpMetrics(metrics));
  const jobs = new Hono();
  // A sub-app's own middleware on a wildcard must not count as "the route".
  jobs.use('/jobs/*', async (_c, next) => next());
  jobs.get('/jobs/:id', (c) => c.json({ id: c.req.param('id') }));
  jobs.get('/jobs/:id/boom', () => {
    throw new Error('boom');
  });
  jobs.post('/jobs/:id/cancel', (c) => c.json({}, 409));
  app.route('/', jobs);
  app.onError((_err, c) => c.json({ error: true }, 500));
  return app;
}

async function counts(metrics: Metrics): Promise<Record<string, number>> {
  const metric = await metrics.httpRequests.get();
  return Object.fromEntries(metric.values.map((v) => [`${v.labels.method} ${v.labels.route} ${v.labels.status}`, v.value]));
}

describe('httpMetrics', () => {
  it('labels by route template and status, including errors and HEAD', async () => {
    const metrics = new Metrics();
    const app = appWith(metrics);
    expect((await app.request('/jobs/a1')).status).toBe(200);
    expect((await app.request('/jobs/b2')).status).toBe(200);
    expect((await app.request('/jobs/c3', { method: 'HEAD' })).status).toBe(200);
    expect((await app.request('/jobs/c3/boom')).status).toBe(500);
    expect((await app.request('/jobs/c3/cancel', { method: 'POST' })).status).toBe(409);
    expect(await counts(metrics)).toEqual({
      'GET /jobs/:id 200': 2,
      'HEAD /jobs/:id 200': 1,
      'GET /jobs/:id/boom 500': 1,
      'POST /jobs/:id/cancel 409': 1,
    });
    const duration = await metrics.httpDuration.get();
    const count = duration.values.find((v) => v.metricName === 'sandpod_http_request_duration_seconds_count' && v.labels.route === '/jobs/:id' && v.labels.method === 'GET');
    expect(count?.value).toBe(2);
  });

  it('gives unmatched paths (even below a wildcard middleware), wrong methods and odd methods one label each', async () => {
    const metrics = new Metrics();
    const app = appWith(metrics);
    expect((await app.request('/nothing/here')).status).toBe(404);
    expect((await app.request('/jobs/a1/b2/c3')).status).toBe(404);
    expect((await app.request('/jobs/a1', { method: 'DELETE' })).status).toBe(404);
    expect((await app.request('/jobs/a1', { method: 'BREW' })).status).toBe(404);
    expect(await counts(metrics)).toEqual({
      [`GET ${UNMATCHED_ROUTE} 404`]: 2,
      [`DELETE ${UNMATCHED_ROUTE} 404`]: 1,
      [`OTHER ${UNMATCHED_ROUTE} 404`]: 1,
    });
  });
});
