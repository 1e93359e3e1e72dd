/**
 * MCP (issue 19) with the SDK's own client, shared by the MCP tests on every runtime: the local one
 * (test/integration/mcp/mcp.test.ts) and a real cluster (test/e2e/agents.test.ts). `sessionRoundTrip`
 * is the session round trip every transport and runtime must pass: create_session, session_execute
 * keeping state, upload_file, a cell's artifact, download_file (a session file and an artifact),
 * a missing file's 404, close_session, and the closed session refusing the next cell.
 */
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { expect } from 'vitest';

/** The tools /mcp lists, sorted. */
export const MCP_TOOLS = ['close_session', 'create_session', 'download_file', 'list_job_types', 'run_python', 'session_execute', 'upload_file'];

export type Answer = Record<string, any>;
const clients: Client[] = [];
/** Closes every client made here (or passed to {@link trackMcpClient}); for an `afterAll`. */
export async function closeMcpClients(): Promise<void> {
  for (const c of clients.splice(0)) await c.close().catch(() => {});
}
/** Has {@link closeMcpClients} close `client` too. */
export function trackMcpClient(client: Client): void {
  clients.push(client);
}

/** An SDK client connected to `${url}/mcp` over streamable HTTP, with a bearer token when given. */
export async function httpClient(url: string, token?: string): Promise<Client> {
  const client = new Client({ name: 'sandpod-test', version: '1.0.0' });
  const headers: Record<string, string> = token ? { authorization: `Bearer ${token}` } : {};
  await client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp`), { requestInit: { headers } }));
  clients.push(client);
  return client;
}

/** Calls a tool; returns its structured answer, or the error text when `isError`. */
export async function call(client: Client, name: string, args: Record<string, unknown> = {}, timeoutMs = 120_000): Promise<{ ok: boolean; value: Answer; text: string; result: CallToolResult }> {
  const result = (await client.callTool({ name, arguments: args }, undefined, { timeout: timeoutMs })) as CallToolResult;
  const text = result.content.map((c) => (c.type === 'text' ? c.text : '')).join('\n');
  return { ok: result.isError !== true, value: (result.structuredContent ?? {}) as Answer, text, result };
}

/** Calls a tool that must succeed; its structured answer (the same as its text content). */
export async function ok(client: Client, name: string, args: Record<string, unknown> = {}, timeoutMs = 120_000): Promise<Answer> {
  const r = await call(client, name, args, timeoutMs);
  expect(r.ok, r.text).toBe(true);
  expect(JSON.parse(r.result.content[0]!.type === 'text' ? r.result.content[0]!.text : 'null')).toEqual(r.value);
  return r.value;
}

/** A one-shot run with stdout, a result and one artifact. */
export const RUN = 'import json\nprint("hello", 6 * 7)\nopen("/output/plot.txt", "w").write("p" * 10)\njson.dump({"answer": 42}, open("/output/result.json", "w"))\n';

/** The session round trip every transport must pass. */
export async function sessionRoundTrip(client: Client, url: string, timeoutMs = 120_000): Promise<void> {
  const s = await ok(client, 'create_session', { idle_timeout: 120 }, timeoutMs);
  expect(s).toMatchObject({ status: 'ready', cells: 0, idle_timeout: 120 });
  const id = s.session_id as string;
  try {
    const c1 = await ok(client, 'session_execute', { session_id: id, code: 'x = 1' }, timeoutMs);
    expect(c1).toMatchObject({ session_id: id, cell: 1, success: true, stdout: '' });
    const c2 = await ok(client, 'session_execute', { session_id: id, code: 'print(x)' }, timeoutMs);
    expect(c2).toMatchObject({ cell: 2, success: true, stdout: '1\n' });

    const up = await ok(client, 'upload_file', { session_id: id, name: 'data.csv', content: 'a,b\n1,2\n3,4\n' }, timeoutMs);
    expect(up).toMatchObject({ name: 'data.csv', size_bytes: 12 });
    const c3 = await ok(client, 'session_execute', {
      session_id: id,
      code: 'rows = open("data.csv").read().splitlines()\nprint(len(rows))\nopen("summary.txt", "w").write(f"rows={len(rows)} x={x}")\nopen("/output/cell.bin", "wb").write(bytes(range(256)))',
    }, timeoutMs);
    expect(c3).toMatchObject({ cell: 3, success: true, stdout: '3\n' });
    expect(c3.artifacts).toEqual([expect.objectContaining({ name: 'cell.bin', size_bytes: 256, url: `${url}/jobs/${c3.job_id}/artifacts/cell.bin` })]);

    const down = await ok(client, 'download_file', { session_id: id, name: 'summary.txt' }, timeoutMs);
    expect(down).toMatchObject({ session_id: id, name: 'summary.txt', encoding: 'utf8', text: 'rows=3 x=1' });
    const bin = await ok(client, 'download_file', { job_id: c3.job_id, name: 'cell.bin' }, timeoutMs);
    expect(bin.encoding).toBe('base64');
    expect(Buffer.from(bin.content_base64, 'base64')).toEqual(Buffer.from(Array.from({ length: 256 }, (_, i) => i)));

    const missing = await call(client, 'download_file', { session_id: id, name: 'nope.txt' }, timeoutMs);
    expect(missing.ok).toBe(false);
    expect(missing.text).toMatch(/HTTP 404/);
  } finally {
    const closed = await ok(client, 'close_session', { session_id: id }, timeoutMs);
    expect(closed).toMatchObject({ session_id: id, status: 'ended', end_reason: 'closed' });
  }
  const after = await call(client, 'session_execute', { session_id: id, code: 'print(x)' }, timeoutMs);
  expect(after.ok).toBe(false);
  expect(after.text).toContain('has ended (closed)');
  expect(after.text).toContain('HTTP 409');
}

