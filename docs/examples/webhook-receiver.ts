/**
 * A receiver of sandpod's completion webhooks: verifies each delivery with the Standard Webhooks
 * algorithm (the `standardwebhooks` package; any of its libraries will do), drops duplicates by
 * `webhook-id` (delivery is at least once), and answers 2xx quickly. docs/api.md explains the steps;
 * the tests use this file as it is.
 *
 *   WEBHOOK_SECRET=whsec_… PORT=9000 node --import tsx docs/examples/webhook-receiver.ts
 */
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Webhook } from 'standardwebhooks';

/** A verified delivery. */
export interface ReceivedWebhook {
  id: string;
  timestamp: number;
  /** The parsed body: `{ type: 'execution.finished', timestamp, data: <the record> }`. */
  payload: { type: string; timestamp: string; data: Record<string, unknown> };
  /** True when this `webhook-id` was seen before (a retry of a delivery already handled). */
  duplicate: boolean;
}

/** Options of {@link startReceiver}. */
export interface ReceiverOptions {
  /** The secret(s) this receiver trusts; during a rotation, list both. */
  secrets: string[];
  port?: number;
  host?: string;
  /** Called for every verified delivery. */
  onWebhook?: (w: ReceivedWebhook) => void;
  /** Called for every request that failed verification, with why. */
  onRejected?: (reason: string) => void;
}

function readBody(req: IncomingMessage, limit = 4 * 1024 * 1024): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > limit) req.destroy(new Error('body too large'));
      else chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

/**
 * Verifies `body` (the raw bytes, before any JSON parsing) and its headers against `secrets`:
 * the parsed payload, or throws. `webhook-signature` may hold several `v1,<base64>` signatures (one
 * per secret of the sender); one match is enough. Deliveries older or newer than 5 minutes are refused
 * (replays).
 */
export function verify(secrets: string[], body: string, headers: Record<string, string | string[] | undefined>): ReceivedWebhook['payload'] {
  const h = {
    'webhook-id': String(headers['webhook-id'] ?? ''),
    'webhook-timestamp': String(headers['webhook-timestamp'] ?? ''),
    'webhook-signature': String(headers['webhook-signature'] ?? ''),
  };
  let last: unknown;
  for (const secret of secrets) {
    try {
      return new Webhook(secret).verify(body, h) as ReceivedWebhook['payload'];
    } catch (err) {
      last = err;
    }
  }
  throw last instanceof Error ? last : new Error('no secret configured');
}

/** Starts the receiver; resolves once it listens. */
export async function startReceiver(o: ReceiverOptions): Promise<{ server: Server; url: string; close(): Promise<void> }> {
  const seen = new Set<string>();
  const server = createServer((req, res) => {
    void (async () => {
      if (req.method !== 'POST') return res.writeHead(405).end();
      const body = await readBody(req);
      let payload: ReceivedWebhook['payload'];
      try {
        payload = verify(o.secrets, body, req.headers);
      } catch (err) {
        o.onRejected?.((err as Error).message);
        return res.writeHead(401).end();
      }
      const id = String(req.headers['webhook-id']);
      const duplicate = seen.has(id);
      seen.add(id);
      // Answer first and work later: the sender waits at most a few seconds for the status line.
      res.writeHead(204).end();
      o.onWebhook?.({ id, timestamp: Number(req.headers['webhook-timestamp']), payload, duplicate });
    })().catch(() => res.writeHead(500).end());
  });
  await new Promise<void>((r) => server.listen(o.port ?? 0, o.host ?? '127.0.0.1', r));
  const addr = server.address() as AddressInfo;
  return {
    server,
    url: `http://${addr.address}:${addr.port}`,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const secrets = (process.env.WEBHOOK_SECRET ?? '').split(/[\s,]+/).filter(Boolean);
  if (secrets.length === 0) throw new Error('set WEBHOOK_SECRET (one or more whsec_… secrets, comma-separated)');
  const r = await startReceiver({
    secrets,
    port: Number(process.env.PORT ?? 9000),
    host: process.env.HOST ?? '127.0.0.1',
    onWebhook: (w) => console.log(JSON.stringify({ id: w.id, duplicate: w.duplicate, job_id: w.payload.data.job_id, status: w.payload.data.status })),
    onRejected: (why) => console.error(`rejected: ${why}`),
  });
  console.log(`listening on ${r.url}`);
}
