/**
 * A real OTLP/HTTP trace receiver for tests: an HTTP server on loopback that accepts what the
 * exporter posts to `/v1/traces` (OTLP JSON encoding: `resourceSpans[].scopeSpans[].spans[]`, ids in
 * hex) and keeps the decoded spans, so tests can assert span trees.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { startTracing, type Tracing } from '../../src/tracing/setup.ts';

/** One decoded span. */
export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  kind: number;
  startMs: number;
  endMs: number;
  attributes: Record<string, string | number | boolean>;
  status: { code?: number; message?: string };
  resource: Record<string, string | number | boolean>;
}

interface OtlpValue {
  stringValue?: string;
  intValue?: string | number;
  doubleValue?: number;
  boolValue?: boolean;
}

function attrs(list: { key: string; value: OtlpValue }[] | undefined): Record<string, string | number | boolean> {
  const out: Record<string, string | number | boolean> = {};
  for (const { key, value } of list ?? []) {
    out[key] = value.stringValue ?? (value.intValue !== undefined ? Number(value.intValue) : undefined) ?? value.doubleValue ?? value.boolValue ?? '';
  }
  return out;
}

/** A started receiver. */
export class OtlpReceiver {
  readonly spans: ReceivedSpan[] = [];
  /** Requests that were not OTLP JSON trace exports (asserted empty by tests). */
  readonly rejected: string[] = [];
  private constructor(
    private readonly server: Server,
    readonly url: string,
  ) {}

  static async start(): Promise<OtlpReceiver> {
    let self: OtlpReceiver | undefined;
    const server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8');
        if (req.method !== 'POST' || req.url !== '/v1/traces' || !String(req.headers['content-type']).startsWith('application/json')) {
          self?.rejected.push(`${req.method} ${req.url} ${req.headers['content-type']}`);
          res.writeHead(404).end();
          return;
        }
        try {
          self?.take(JSON.parse(body));
          res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
        } catch (err) {
          self?.rejected.push(`bad body: ${String(err)}`);
          res.writeHead(400).end();
        }
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    self = new OtlpReceiver(server, `http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    return self;
  }

  private take(doc: any): void {
    for (const rs of doc.resourceSpans ?? []) {
      const resource = attrs(rs.resource?.attributes);
      for (const ss of rs.scopeSpans ?? []) {
        for (const s of ss.spans ?? []) {
          this.spans.push({
            traceId: s.traceId,
            spanId: s.spanId,
            parentSpanId: s.parentSpanId ?? '',
            name: s.name,
            kind: s.kind,
            startMs: Number(BigInt(s.startTimeUnixNano) / 1_000_000n),
            endMs: Number(BigInt(s.endTimeUnixNano) / 1_000_000n),
            attributes: attrs(s.attributes),
            status: s.status ?? {},
            resource,
          });
        }
      }
    }
  }

  /** The spans of one trace. */
  trace(traceId: string): ReceivedSpan[] {
    return this.spans.filter((s) => s.traceId === traceId);
  }

  /**
   * The tree of a trace as indented names (children in name order, so the text is deterministic), e.g.
   * `POST /execute\n  sandpod.admission\n  sandpod.run\n    sandpod.sandbox`; a span whose parent is
   * not in the trace is a root.
   */
  tree(traceId: string): string {
    const spans = this.trace(traceId);
    const ids = new Set(spans.map((s) => s.spanId));
    const kids = (parent: string | null) =>
      spans.filter((s) => (parent === null ? !ids.has(s.parentSpanId) : s.parentSpanId === parent)).sort((a, b) => a.name.localeCompare(b.name) || a.startMs - b.startMs);
    const lines: string[] = [];
    const walk = (parent: string | null, depth: number) => {
      for (const s of kids(parent)) {
        lines.push(`${'  '.repeat(depth)}${s.name}`);
        walk(s.spanId, depth + 1);
      }
    };
    walk(null, 0);
    return lines.join('\n');
  }

  /** The one span named `name` in a trace (throws when there is not exactly one). */
  one(traceId: string, name: string): ReceivedSpan {
    const found = this.trace(traceId).filter((s) => s.name === name);
    if (found.length !== 1) throw new Error(`expected one span ${name} in trace ${traceId}, found ${found.length}:\n${this.tree(traceId)}`);
    return found[0]!;
  }

  async close(): Promise<void> {
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

/**
 * Starts the service's tracing exporting to `receiver`: the SDK reads its settings from the
 * environment when it starts (the service's own way), so the endpoint is set only for that moment.
 */
export async function startTracingTo(receiver: OtlpReceiver): Promise<Tracing> {
  process.env.OTEL_EXPORTER_OTLP_ENDPOINT = receiver.url;
  try {
    return await startTracing({ version: 'test' });
  } finally {
    delete process.env.OTEL_EXPORTER_OTLP_ENDPOINT;
  }
}
