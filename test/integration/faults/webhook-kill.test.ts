/**
 * A webhook survives a `kill -9` (issue 21): the service process is killed while its delivery is on
 * the wire (the receiver holds the first request without answering), and a new process on the same
 * database sends it again once the dead one's lease runs out, with the same `webhook-id`; the receiver
 * example verifies the signature and sees the second copy as a duplicate (delivery is at least once).
 * PostgreSQL only: two processes share the database.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
import { verify } from '../../../docs/examples/webhook-receiver.ts';
import { testDbKind } from '../../support/db.ts';
import { useServiceProcesses } from '../../support/service-processes.ts';

const kind = await testDbKind();
type J = Record<string, any>;

async function until<T>(what: string, f: () => T | undefined | Promise<T | undefined>, ms = 60_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe.skipIf(kind !== 'postgres')('a webhook across a kill -9', () => {
  const services = useServiceProcesses();

  it('is sent again by the next process, same webhook-id, valid signature, and recorded delivered', async () => {
    const secret = `whsec_${randomBytes(32).toString('base64')}`;
    const hits: { id: string; verified: unknown }[] = [];
    const held: ServerResponse[] = [];
    const receiver = createServer((req: IncomingMessage, res: ServerResponse) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        hits.push({ id: String(req.headers['webhook-id']), verified: verify([secret], body, req.headers) });
        // The first request is never answered: the sender dies waiting for it.
        if (hits.length === 1) held.push(res);
        else res.writeHead(204).end();
      });
    });
    await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
    const port = (receiver.address() as AddressInfo).port;
    try {
      // timeout_seconds 3: a dead worker's lease (2 × timeout + 5 s) runs out 11 s after its claim.
      const cfg = { webhooks: { secrets: [secret], allowed_hosts: [`127.0.0.1:${port}`], timeout_seconds: 3 } };
      const a = await services.start('a', cfg);
      const sub = (await (await fetch(`${a.url}/execute/async`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ code: 'print("kill")', callback_url: `http://127.0.0.1:${port}/hook` }) })).json()) as J;
      await until('the first delivery attempt', () => (hits.length >= 1 ? true : undefined));
      a.kill('SIGKILL');
      await a.exited;
      expect(hits).toHaveLength(1);

      const b = await services.start('b', cfg);
      await until('the delivery to be recorded delivered', async () => {
        const d = (await (await fetch(`${b.url}/jobs/${sub.job_id}/deliveries`)).json()) as J;
        return d.deliveries[0]?.status === 'delivered' ? d : undefined;
      });
      expect(hits.map((h) => h.id)).toEqual([`msg_${sub.job_id}`, `msg_${sub.job_id}`]);
      for (const h of hits) expect(h.verified).toMatchObject({ type: 'execution.finished', data: { job_id: sub.job_id, status: 'succeeded', stdout: 'kill\n' } });
      const d = (await (await fetch(`${b.url}/jobs/${sub.job_id}/deliveries`)).json()) as J;
      // The attempt of the killed process left no row (it never got an answer); the one that delivered did.
      expect(d.deliveries[0]).toMatchObject({ webhook_id: `msg_${sub.job_id}`, status: 'delivered', attempts: [{ attempt: 1, status_code: 204, outcome: 'delivered' }] });
      b.kill('SIGTERM');
      expect(await b.exited).toBe(0);
    } finally {
      for (const r of held) r.destroy();
      await new Promise((r) => receiver.close(r));
    }
  }, 120_000);
});
