/**
 * MCP (issue 19) with the SDK's own client against a real listening service (real app, database and
 * sandbox): over streamable HTTP at /mcp, and over stdio through `sandpod mcp` spawned as a
 * subprocess. The tools round-trip (a one-shot run with its result and a downloadable artifact, a
 * session keeping state with files in and out, the job types), bad input is a tool error with the
 * API's words, the records are the API's (idempotency included), and /mcp takes the API's tokens.
 */
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { afterAll, describe, expect, it } from 'vitest';
import { call, closeMcpClients, httpClient, MCP_TOOLS as TOOLS, ok, RUN, sessionRoundTrip, trackMcpClient, type Answer } from '../../support/mcp-client.ts';
import { useServedService } from '../../support/service.ts';

const TOKEN = 'mcp-test-token-0123456789abcdef';
const BIN = path.resolve('src/cli/sandpod.js');
const asRoot = process.getuid?.() === 0;

afterAll(closeMcpClients);

async function stdioClient(url: string, token: string): Promise<Client> {
  const client = new Client({ name: 'sandpod-test-stdio', version: '1.0.0' });
  const env = Object.fromEntries(Object.entries(process.env).filter(([k, v]) => v !== undefined && !k.startsWith('SANDPOD_'))) as Record<string, string>;
  await client.connect(new StdioClientTransport({ command: process.execPath, args: [BIN, 'mcp', '--url', url, '--token', token], env, stderr: 'pipe' }));
  trackMcpClient(client);
  return client;
}

describe.skipIf(!asRoot)('MCP with API tokens', () => {
  const served = useServedService({ auth: { tokens: [TOKEN] }, max_sessions: 4, warm_pool: { sizes: {} } });
  const auth = { authorization: `Bearer ${TOKEN}` };

  it('lists the seven tools, each with a description and an input schema', async () => {
    const client = await httpClient(served.url, TOKEN);
    const { tools } = await client.listTools();
    expect(tools.map((t) => t.name).sort()).toEqual(TOOLS);
    for (const t of tools) {
      expect(t.description?.length).toBeGreaterThan(40);
      expect(t.inputSchema.type).toBe('object');
    }
    expect(tools.find((t) => t.name === 'run_python')!.inputSchema.required).toEqual(['code']);
    expect(client.getServerVersion()?.name).toBe('sandpod');
  });

  it('run_python: stdout, result and an artifact URL that downloads with the token; the record is the API\'s', async () => {
    const client = await httpClient(served.url, TOKEN);
    const r = await ok(client, 'run_python', { code: RUN });
    expect(r).toMatchObject({ status: 'succeeded', success: true, exit_code: 0, stdout: 'hello 42\n', stderr: '', result: { answer: 42 }, error: null });
    expect(r.artifacts).toHaveLength(1);
    expect(r.artifacts[0]).toMatchObject({ name: 'plot.txt', size_bytes: 10, url: `${served.url}/jobs/${r.job_id}/artifacts/plot.txt` });
    const res = await fetch(r.artifacts[0].url, { headers: auth });
    expect(res.status).toBe(200);
    expect(await res.text()).toBe('p'.repeat(10));
    expect((await fetch(r.artifacts[0].url)).status).toBe(401);
    const record = (await (await fetch(`${served.url}/jobs/${r.job_id}?view=full`, { headers: auth })).json()) as Answer;
    expect(record).toMatchObject({ status: 'succeeded', stdout: 'hello 42\n', output: { answer: 42 } });

    const failed = await ok(client, 'run_python', { code: 'raise ValueError("bad value")' });
    expect(failed).toMatchObject({ success: false, status: 'failed', error: { type: 'value_error' } });
    expect(failed.stderr).toContain('ValueError: bad value');
  }, 120_000);

  it('run_python with an idempotency key answers the same run twice; input_data reaches the program', async () => {
    const client = await httpClient(served.url, TOKEN);
    const args = { code: 'import json\nd = json.load(open("/input/data.json"))\nprint(d["n"] * 2)', input_data: { n: 21 }, idempotency_key: `mcp-${Date.now()}` };
    const first = await ok(client, 'run_python', args);
    expect(first).toMatchObject({ success: true, stdout: '42\n' });
    const again = await ok(client, 'run_python', args);
    expect(again.job_id).toBe(first.job_id);
    const other = await call(client, 'run_python', { ...args, code: 'print(0)' });
    expect(other.ok).toBe(false);
    expect(other.text).toMatch(/HTTP 409/);
  }, 120_000);

  it('a long run sends progress when asked, so a client restarting its timeout on progress waits it out', async () => {
    const client = await httpClient(served.url, TOKEN);
    const progress: number[] = [];
    // 12 s timeout, 14 s run: only the progress at 10 s keeps the call alive.
    const result = (await client.callTool({ name: 'run_python', arguments: { code: 'import time\ntime.sleep(14)\nprint("slept")', timeout: 60 } }, undefined, {
      timeout: 12_000,
      resetTimeoutOnProgress: true,
      onprogress: (p) => void progress.push(p.progress),
    })) as CallToolResult;
    expect(result.isError).toBeFalsy();
    expect(result.structuredContent).toMatchObject({ success: true, stdout: 'slept\n' });
    expect(progress[0]).toBe(1);
  }, 60_000);

  it('a session over HTTP: state across cells, a file in, a file out, closed', async () => {
    await sessionRoundTrip(await httpClient(served.url, TOKEN), served.url);
  }, 240_000);

  it('a tool\'s run carries the MCP request\'s correlation id (the inner API call is made as that request)', async () => {
    // Stateless: a tools/call needs no initialize before it; the answer is an SSE stream.
    const res = await fetch(`${served.url}/mcp`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-06-18', 'x-correlation-id': 'mcp-corr-1' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'run_python', arguments: { code: 'print(1)' } } }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    expect(res.headers.get('x-correlation-id')).toBe('mcp-corr-1');
    const data = (await res.text()).split('\n').find((l) => l.startsWith('data: '))!;
    const msg = JSON.parse(data.slice(6)) as { id: number; result: CallToolResult };
    expect(msg.id).toBe(7);
    const jobId = (msg.result.structuredContent as Answer).job_id as string;
    const record = (await (await fetch(`${served.url}/jobs/${jobId}?view=full`, { headers: auth })).json()) as Answer;
    expect(record).toMatchObject({ stdout: '1\n', correlation_id: 'mcp-corr-1' });
  }, 60_000);

  it('a client that goes away mid-call leaves the server serving (the late answer has nowhere to go)', async () => {
    const gone = new AbortController();
    const res = await fetch(`${served.url}/mcp`, {
      method: 'POST',
      signal: gone.signal,
      headers: { ...auth, 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-06-18' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 8, method: 'tools/call', params: { name: 'run_python', arguments: { code: 'import time\ntime.sleep(2)' } } }),
    });
    expect(res.status).toBe(200);
    gone.abort();
    await new Promise((r) => setTimeout(r, 3500));
    const client = await httpClient(served.url, TOKEN);
    expect((await ok(client, 'run_python', { code: 'print("still here")' })).stdout).toBe('still here\n');
  }, 60_000);

  it('list_job_types answers the API\'s job types', async () => {
    const client = await httpClient(served.url, TOKEN);
    const r = await ok(client, 'list_job_types');
    const api = (await (await fetch(`${served.url}/job-types`, { headers: auth })).json()) as Answer[];
    expect(r.job_types).toEqual(api);
    expect(r.job_types.map((t: Answer) => t.name)).toContain('default');
  });

  it('bad input is a tool error with a clear message, and the server keeps serving', async () => {
    const client = await httpClient(served.url, TOKEN);
    const noCode = await call(client, 'run_python', {});
    expect(noCode.ok).toBe(false);
    expect(noCode.text).toMatch(/code/);
    const timeout = await call(client, 'run_python', { code: 'print(1)', timeout: 0 });
    expect(timeout.ok).toBe(false);
    expect(timeout.text).toBe('timeout: timeout must be between 1 and 120 seconds [validation_error] (HTTP 400)');
    const blank = await call(client, 'run_python', { code: '   ' });
    expect(blank.text).toContain('code must be a non-empty string');
    const unknown = await call(client, 'session_execute', { session_id: '00000000-0000-4000-8000-000000000000', code: 'print(1)' });
    expect(unknown.ok).toBe(false);
    expect(unknown.text).toMatch(/HTTP 404/);
    const traversal = await call(client, 'upload_file', { session_id: '00000000-0000-4000-8000-000000000000', name: '../etc/passwd', content: 'x' });
    expect(traversal.ok).toBe(false);
    expect(traversal.text).toMatch(/HTTP 4\d\d/);
    const both = await call(client, 'upload_file', { session_id: 'x', name: 'a.txt', content: 'x', content_base64: 'eA==' });
    expect(both.text).toContain('exactly one of content');
    const noSuchTool = await client.callTool({ name: 'rm_rf', arguments: {} }).then((r) => r as CallToolResult, (e: Error) => e);
    expect(noSuchTool instanceof Error ? noSuchTool.message : JSON.stringify(noSuchTool)).toMatch(/rm_rf not found/);
    expect((await ok(client, 'list_job_types')).job_types.length).toBeGreaterThan(0);
  });

  it('/mcp without a valid token is 401 like the API; GET is 405 (stateless); not in the OpenAPI document', async () => {
    const init = { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }) };
    const none = await fetch(`${served.url}/mcp`, init);
    expect(none.status).toBe(401);
    expect(none.headers.get('www-authenticate')).toBe('Bearer realm="sandpod"');
    expect(((await none.json()) as Answer).code).toBe('unauthorized');
    const wrong = await fetch(`${served.url}/mcp`, { ...init, headers: { ...init.headers, authorization: 'Bearer not-the-token-0123456789' } });
    expect(wrong.status).toBe(401);
    expect(((await wrong.json()) as Answer).detail).toBe('the bearer token is not valid');
    await expect(httpClient(served.url)).rejects.toThrow(/401|nauthorized/);
    await expect(httpClient(served.url, 'not-the-token-0123456789')).rejects.toThrow(/401|nauthorized/);
    expect((await fetch(`${served.url}/mcp`, { headers: auth })).status).toBe(405);
    // JSON-RPC under MCP's own schema: not a REST operation of the OpenAPI document.
    const doc = (await (await fetch(`${served.url}/openapi.json`, { headers: auth })).json()) as { paths: Record<string, unknown> };
    expect(Object.keys(doc.paths)).toContain('/sessions/{id}/execute');
    expect(Object.keys(doc.paths)).not.toContain('/mcp');
  });

  it('over stdio (`sandpod mcp --url --token`): the tools, a run with its artifact, a session', async () => {
    const client = await stdioClient(served.url, TOKEN);
    expect((await client.listTools()).tools.map((t) => t.name).sort()).toEqual(TOOLS);
    const r = await ok(client, 'run_python', { code: RUN });
    expect(r).toMatchObject({ success: true, stdout: 'hello 42\n', result: { answer: 42 } });
    const art = await ok(client, 'download_file', { job_id: r.job_id, name: 'plot.txt' });
    expect(art).toMatchObject({ text: 'p'.repeat(10), url: r.artifacts[0].url });
    expect((await ok(client, 'list_job_types')).job_types.map((t: Answer) => t.name)).toContain('default');
    await sessionRoundTrip(client, served.url);
  }, 240_000);

  it('sandpod mcp with a --url that is not one exits 2 with a one-line error', async () => {
    const r = spawnSync(process.execPath, [BIN, 'mcp', '--url', 'not a url'], { encoding: 'utf8', input: '' });
    expect(r.status).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr).toContain("sandpod: --url 'not a url' is not a URL");
  });

  it('over stdio with a wrong token: each tool call is a tool error saying 401', async () => {
    const client = await stdioClient(served.url, 'not-the-token-0123456789');
    const r = await call(client, 'list_job_types');
    expect(r.ok).toBe(false);
    expect(r.text).toBe('the bearer token is not valid [unauthorized] (HTTP 401)');
  });
});

describe.skipIf(!asRoot)('MCP without tokens (the local default)', () => {
  const served = useServedService({ warm_pool: { sizes: {} } });

  it('answers on a loopback Host and runs code through the guarded API', async () => {
    const client = await httpClient(served.url);
    const r = await ok(client, 'run_python', { code: 'print("local")' });
    expect(r).toMatchObject({ success: true, stdout: 'local\n' });
    const res = await fetch(`${served.url}/mcp`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', origin: 'https://evil.example' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    expect(res.status).toBe(403);
  }, 120_000);
});
