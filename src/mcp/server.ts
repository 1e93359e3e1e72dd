/**
 * `/mcp`: the Model Context Protocol over streamable HTTP (issue 19), with the official SDK's
 * `McpServer` and its web-standard transport, mounted in the hono app after the token check (so the
 * API's bearer tokens, Host guard and cross-site rules apply unchanged).
 *
 * Stateless: each POST gets a fresh server and transport (no `Mcp-Session-Id`), and GET/DELETE are
 * 405. Everything a client keeps between calls is already durable in the API — a sandpod session is a
 * row and a sandbox named by `session_id`, a run is a record — so an MCP session would hold nothing
 * of its own, and stateless requests can land on any replica behind a load balancer. The answer to a
 * tool call is an SSE stream (the SDK's default), whose keep-alive comments hold a long run's
 * connection open through proxies.
 *
 * The tools (`tools.ts`) call the API in process: a request into this same hono app, carrying the
 * MCP request's token, correlation id, client address and trace, so records, limits, admission and
 * idempotency are exactly the API's.
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js';
import { Hono, type Context } from 'hono';
import { describeRoute } from 'hono-openapi';
import { createSandpodClient, type SandpodClient } from '../client/index.ts';
import { clientIp } from '../api/client-ip.ts';
import type { AppDeps, AppEnv } from '../api/deps.ts';
import { requestHeader } from '../api/request-header.ts';
import { registerTools } from './tools.ts';

/** What an MCP client is told about the server at initialization. */
export const INSTRUCTIONS =
  'sandpod runs untrusted Python in sandboxes. run_python runs a program once in a fresh sandbox. For work over several steps (load data once, then ask questions), create_session, then session_execute cells that keep their variables, upload_file/download_file for files in its /workspace, and close_session when done. Artifacts are files a program writes to /output; their URLs need the same bearer token.';

/** A fresh MCP server with the sandpod tools, calling the service through `api`; URLs it answers start with `publicUrl`. */
export function createMcpServer(api: SandpodClient, publicUrl: string, version: string): McpServer {
  const server = new McpServer({ name: 'sandpod', version }, { instructions: INSTRUCTIONS, capabilities: { tools: {} } });
  registerTools(server, api, publicUrl);
  return server;
}

/**
 * The public base URL of this service as the MCP client reached it: the request's own origin, with
 * `https` when a proxy in front says so (`X-Forwarded-Proto`). Artifact URLs are built on it.
 */
export function publicBase(c: Context<AppEnv>): string {
  const url = new URL(c.req.url);
  const proto = requestHeader(c, 'x-forwarded-proto')?.split(',')[0]?.trim().toLowerCase();
  if (proto === 'https' || proto === 'http') url.protocol = `${proto}:`;
  return url.origin;
}

/** A typed client whose requests go into `app` in process, as the MCP request's caller. */
function inProcessClient(c: Context<AppEnv>, app: () => Hono<AppEnv>): SandpodClient {
  const headers: Record<string, string> = { 'x-correlation-id': c.get('correlationId') };
  const auth = requestHeader(c, 'authorization');
  if (auth) headers.authorization = auth;
  const ip = clientIp(c);
  if (ip) headers['x-forwarded-for'] = ip;
  const traceparent = c.get('traceparent');
  if (traceparent) headers.traceparent = traceparent;
  // Under the origin the request came in on: the Host the guard already accepted.
  return createSandpodClient({ baseUrl: new URL(c.req.url).origin, headers, fetch: (req) => Promise.resolve(app().fetch(req as Request)) });
}

/** Sub-app for `/mcp`. `app` is the whole application, which the tools call in process. */
export function mcpRoutes(deps: AppDeps, app: () => Hono<AppEnv>) {
  const routes = new Hono<AppEnv>();
  const notAllowed = (c: Context<AppEnv>) =>
    c.json({ jsonrpc: '2.0', error: { code: -32000, message: 'Method not allowed: this MCP endpoint is stateless; send JSON-RPC requests by POST' }, id: null }, 405, { Allow: 'POST' });
  // Not in the OpenAPI document: JSON-RPC under MCP's own schema, not a REST operation (docs/mcp.md).
  const hidden = describeRoute({ hide: true });
  routes.get('/mcp', hidden, notAllowed);
  routes.delete('/mcp', hidden, notAllowed);
  routes.post('/mcp', hidden, async (c) => {
    const server = createMcpServer(inProcessClient(c, app), publicBase(c), deps.version);
    const transport = new WebStandardStreamableHTTPServerTransport({ sessionIdGenerator: undefined, maxRequestBodySize: deps.config.max_body_bytes });
    await server.connect(transport);
    return transport.handleRequest(c.req.raw);
  });
  return routes;
}
