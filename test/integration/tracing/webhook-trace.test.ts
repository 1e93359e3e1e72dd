/**
 * A completion webhook's attempts are spans of the run's trace (issue 21: "spans cover … the webhook
 * deliveries"), exported over OTLP/HTTP to the test's receiver; the receiver of the webhook gets the
 * attempt's span as `traceparent`, so its own work can continue the trace.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { Tracing } from '../../../src/tracing/setup.ts';
import { OtlpReceiver, startTracingTo } from '../../support/otlp-receiver.ts';
import { startTestService, type TestService } from '../../support/service.ts';

let otlp: OtlpReceiver;
let tracing: Tracing;
let svc: TestService;
const got: IncomingMessage['headers'][] = [];
const hooks = createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    got.push(req.headers);
    res.writeHead(204).end();
  });
});

beforeAll(async () => {
  otlp = await OtlpReceiver.start();
  tracing = await startTracingTo(otlp);
  await new Promise<void>((r) => hooks.listen(0, '127.0.0.1', r));
  const port = (hooks.address() as AddressInfo).port;
  svc = await startTestService({ webhooks: { secrets: [`whsec_${randomBytes(32).toString('base64')}`], allowed_hosts: [`127.0.0.1:${port}`] } });
}, 120_000);

afterAll(async () => {
  await svc?.close();
  await tracing?.shutdown();
  await otlp?.close();
  await new Promise((r) => hooks.close(r));
});

it('each attempt is a CLIENT span in the run\'s trace, and the receiver continues it through traceparent', async () => {
  const traceId = '5bf92f3577b34da6a3ce929d0e0e4737';
  const port = (hooks.address() as AddressInfo).port;
  const res = await svc.post('/execute', { code: 'print(1)', callback_url: `http://127.0.0.1:${port}/hook` }, { traceparent: `00-${traceId}-10f067aa0ba902b7-01` });
  expect(res.status).toBe(200);
  let span;
  for (let i = 0; i < 150 && !span; i++) {
    await tracing.flush();
    span = otlp.trace(traceId).find((s) => s.name === 'sandpod.webhook.delivery');
    if (!span) await new Promise((r) => setTimeout(r, 100));
  }
  expect(span, otlp.tree(traceId)).toBeDefined();
  expect(span!.kind).toBe(3); // CLIENT
  expect(span!.attributes).toMatchObject({ 'sandpod.webhook.attempt': 1, 'sandpod.webhook.outcome': 'delivered', 'http.response.status_code': 204, 'server.address': '127.0.0.1' });
  expect(got).toHaveLength(1);
  expect(got[0]!.traceparent).toBe(`00-${traceId}-${span!.spanId}-01`);
  // Under the span the run's record continues (the request's), beside the run itself.
  const run = otlp.one(traceId, 'sandpod.run');
  expect(span!.parentSpanId).toBe(run.parentSpanId);
}, 60_000);
