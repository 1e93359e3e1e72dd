/**
 * `sandpod mcp`: an MCP server on stdin/stdout (issue 19) for desktop agents that launch a command
 * rather than connect to a URL. It serves the same tools as the service's `/mcp` (src/mcp/tools.ts),
 * each forwarded to the service at `--url` with `--token` through the typed client, so the service
 * decides everything exactly as for any API client. stdout carries the protocol only; diagnostics go
 * to stderr. It ends when its client closes stdin.
 */
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { Command } from 'commander';
import { createSandpodClient } from '../client/index.ts';
import { createMcpServer } from '../mcp/server.ts';
import { UsageError } from './output.ts';

/** The `mcp` command; `--url` and `--token` are the program's own options. */
export function mcpCommand(version: string): Command {
  return new Command('mcp')
    .description('serve MCP on stdin/stdout, forwarding each tool call to the service (for desktop agents)')
    .action(async (_o: unknown, cmd: Command) => {
      const g = cmd.optsWithGlobals<{ url: string; token?: string }>();
      let url: URL;
      try {
        url = new URL(g.url);
      } catch {
        throw new UsageError(`--url '${g.url}' is not a URL (e.g. http://127.0.0.1:8000)`);
      }
      if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new UsageError(`--url '${g.url}' must be an http or https URL`);
      const base = url.href.replace(/\/+$/, '');
      const client = createSandpodClient({ baseUrl: base, token: g.token || undefined });
      const server = createMcpServer(client, base, version);
      const transport = new StdioServerTransport();
      const closed = new Promise<void>((resolve) => {
        server.server.onclose = resolve;
      });
      server.server.onerror = (err) => void process.stderr.write(`sandpod mcp: ${err.message}\n`);
      process.stdin.once('end', () => void server.close());
      await server.connect(transport);
      process.stderr.write(`sandpod mcp: serving MCP on stdio for ${base}\n`);
      await closed;
    });
}
