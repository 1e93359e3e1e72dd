/**
 * The sandpod MCP tools (issue 19), registered on an `McpServer` of the official SDK. Every tool is a
 * call of the HTTP API through the typed client (`src/client`), whichever way the client reaches the
 * service: in process for `/mcp` (`src/mcp/server.ts`), over the network for `sandpod mcp` (stdio,
 * `src/cli/mcp.ts`). So validation, limits, admission, idempotency, records and tokens are the API's
 * own; the tools only shape arguments and answers for a model.
 *
 * Answers: a JSON text (and the same object as `structuredContent`). A refusal of the API (4xx, 503,
 * an unreachable service) is a tool error (`isError`) whose text is the API's `detail [code]`. A
 * program that fails is not a tool error: the call worked and its answer says `success: false` with
 * the classified `error`, as `POST /execute` does.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { SandpodConnectionError, SandpodError, unwrap, type ExecutionRecordFull, type SandpodClient } from '../client/index.ts';
import { fileContent, recordSummary } from './answers.ts';

/** Longest single wait of `run_python` with an idempotency key (the API's own cap for `wait=true`). */
const WAIT_SECONDS = 300;

/** Seconds between the progress notifications of a call that asked for them. */
export const PROGRESS_EVERY_MS = 10_000;

/** What a tool body gets of the SDK's request context. */
type Extra = {
  signal: AbortSignal;
  _meta?: { progressToken?: string | number };
  sendNotification: (n: { method: 'notifications/progress'; params: { progressToken: string | number; progress: number; message?: string } }) => Promise<void>;
};
type Signal = { signal: AbortSignal };

/** A tool answer: the object as JSON text and as structured content. */
function answer(value: Record<string, unknown>, extra: CallToolResult['content'] = []): CallToolResult {
  return { content: [{ type: 'text', text: JSON.stringify(value, null, 2) }, ...extra], structuredContent: value };
}

/** A tool error with the API's words (`detail [code]`, HTTP status) or the failure's message. */
export function toolError(err: unknown): CallToolResult {
  let text: string;
  if (err instanceof SandpodError) {
    text = `${err.detail} [${err.code}] (HTTP ${err.status})`;
    const extra = { ...(err.body ?? {}) };
    for (const k of ['detail', 'code', 'correlation_id']) delete extra[k];
    if (Object.keys(extra).length > 0) text += `\n${JSON.stringify(extra)}`;
  } else if (err instanceof SandpodConnectionError) {
    text = err.message;
  } else {
    text = err instanceof Error ? err.message : String(err);
  }
  return { content: [{ type: 'text', text }], isError: true };
}

/**
 * Runs a tool's body; any failure becomes a tool error (the server never sees a throw). When the call
 * carries a progress token, a progress notification goes out every {@link PROGRESS_EVERY_MS} while
 * the body runs, so a client that restarts its timeout on progress waits out a long run.
 */
function guarded<A>(fn: (args: A, extra: Signal) => Promise<CallToolResult>) {
  return async (args: A, extra: Extra): Promise<CallToolResult> => {
    const token = extra._meta?.progressToken;
    let ticks = 0;
    const timer = token === undefined
      ? undefined
      : setInterval(() => {
          ticks += 1;
          const params = { progressToken: token, progress: ticks, message: `still running (${(ticks * PROGRESS_EVERY_MS) / 1000} s)` };
          extra.sendNotification({ method: 'notifications/progress', params }).catch(() => {});
        }, PROGRESS_EVERY_MS);
    try {
      return await fn(args, { signal: extra.signal });
    } catch (err) {
      if (err instanceof Error && err.name === 'AbortError') throw err;
      return toolError(err);
    } finally {
      clearInterval(timer);
    }
  };
}

// Argument schemas: types only. The API checks values and limits and says what is wrong.
const seconds = (what: string) => z.number().int().describe(what).optional();
const sessionId = z.string().min(1).describe('The session, as create_session returned it');
const fileName = z.string().min(1).describe('A plain file name in the session\'s working directory (/workspace): no directories, no ".."');

/**
 * Registers the seven tools on `server`; each calls the service through `api`. `publicUrl` is the
 * service as the MCP client knows it: the URLs of artifacts and files start with it.
 */
export function registerTools(server: McpServer, api: SandpodClient, publicUrl: string): void {
  const base = publicUrl.replace(/\/+$/, '');
  /** The full record of a run (for its artifacts and output), as the tools answer it. */
  const summary = async (id: string, signal: AbortSignal) => {
    const record = unwrap(await api.GET('/jobs/{id}', { params: { path: { id }, query: { view: 'full' } }, signal })) as ExecutionRecordFull;
    return recordSummary(record, base);
  };

  server.registerTool(
    'run_python',
    {
      title: 'Run Python once',
      description:
        'Runs a Python program in a fresh sandbox and waits for it to end. Returns stdout, stderr, the result (the JSON the program wrote to /output/result.json), the error if it failed, and the URLs of the files it wrote to /output (artifacts). The program reads input_data from /input/data.json and input files from /input/files/. Nothing persists between calls: use create_session for state.',
      inputSchema: {
        code: z.string().describe('Python source, run as /code/main.py'),
        input_data: z.record(z.unknown()).optional().describe('JSON object written to /input/data.json'),
        requirements: z.array(z.string()).optional().describe('pip requirements installed first, e.g. ["numpy>=1.26"]'),
        job_type: z.string().optional().describe('The environment (see list_job_types); default "default"'),
        timeout: seconds('Execution time limit in seconds; default the job type\'s'),
        input_files: z.record(z.string()).optional().describe('Files placed read-only under /input/files/: name → base64 content'),
        input_artifacts: z
          .array(z.object({ job_id: z.string(), name: z.string(), as: z.string().optional() }))
          .optional()
          .describe('Artifacts of earlier runs placed under /input/files/<as or name>, by reference'),
        idempotency_key: z.string().optional().describe('A repeated call with the same key and payload answers with the same run instead of running again'),
      },
      annotations: { openWorldHint: true },
    },
    guarded(async (args, { signal }) => {
      const { idempotency_key, ...body } = args;
      let id: string;
      if (idempotency_key === undefined) {
        // POST /execute waits for the run; its answer names the record, which has the artifacts.
        const done = unwrap(await api.POST('/execute', { body, signal }));
        id = done.execution_id;
      } else {
        const job = unwrap(await api.POST('/execute/async', { body: { ...body, idempotency_key }, signal }));
        id = job.job_id;
        for (;;) {
          const r = await api.GET('/jobs/{id}/result', { params: { path: { id }, query: { wait: 'true', timeout: WAIT_SECONDS } }, signal });
          if (r.response.status !== 408) {
            unwrap(r);
            break;
          }
        }
      }
      return answer(await summary(id, signal));
    }),
  );

  server.registerTool(
    'create_session',
    {
      title: 'Start a Python session',
      description:
        'Starts a session: a persistent Python interpreter in a sandbox of its own. Variables, imports and files of earlier cells stay for later cells (session_execute). Its working directory /workspace holds the files of upload_file and download_file. Close it with close_session when done; it also ends after idle_timeout seconds without a cell.',
      inputSchema: {
        job_type: z.string().optional().describe('The environment (see list_job_types); default "default"'),
        requirements: z.array(z.string()).optional().describe('pip requirements installed when the session starts'),
        idle_timeout: seconds('Seconds without a cell before the session ends; default 300, at most 3600'),
        max_lifetime: seconds('Seconds after which the session ends whatever it does; default 3600, at most 86400'),
        timeout: seconds('Each cell\'s time limit in seconds; default the job type\'s'),
      },
      annotations: { openWorldHint: true },
    },
    guarded(async (args, { signal }) => answer(unwrap(await api.POST('/sessions', { body: args, signal })) as Record<string, unknown>)),
  );

  server.registerTool(
    'session_execute',
    {
      title: 'Run a cell in a session',
      description:
        'Runs one cell of Python in the session\'s interpreter: earlier cells\' variables, imports and files are still there, and the current directory is /workspace. Returns stdout, stderr, the result (/output/result.json of this cell), the error, the cell number and the URLs of files written to /output during the cell. One cell at a time per session. A cell past its timeout is interrupted and the session keeps its state.',
      inputSchema: {
        session_id: sessionId,
        code: z.string().describe('Python source of the cell'),
        input_data: z.record(z.unknown()).optional().describe('JSON object written to /input/data.json for this cell'),
        timeout: seconds('This cell\'s time limit in seconds; default the session\'s'),
      },
      annotations: { openWorldHint: true },
    },
    guarded(async ({ session_id, ...body }, { signal }) => {
      const cell = unwrap(await api.POST('/sessions/{id}/execute', { params: { path: { id: session_id } }, body, signal }));
      return answer({ session_id, cell: cell.cell, ...(await summary(cell.execution_id, signal)) });
    }),
  );

  server.registerTool(
    'upload_file',
    {
      title: 'Write a file into a session',
      description: 'Writes a file into the session\'s /workspace (the cells\' current directory), replacing one of that name. Give the content as text, or as base64 for binary data.',
      inputSchema: {
        session_id: sessionId,
        name: fileName,
        content: z.string().optional().describe('The file\'s text (written as UTF-8)'),
        content_base64: z.string().optional().describe('The file\'s bytes, base64-encoded (instead of content)'),
      },
      annotations: { idempotentHint: true, destructiveHint: true },
    },
    guarded(async ({ session_id, name, content, content_base64 }, { signal }) => {
      if ((content === undefined) === (content_base64 === undefined)) throw new Error('give exactly one of content (text) and content_base64 (bytes)');
      const bytes = content !== undefined ? Buffer.from(content, 'utf8') : Buffer.from(content_base64!, 'base64');
      if (content_base64 !== undefined && bytes.toString('base64').replace(/=+$/, '') !== content_base64.replace(/\s+/g, '').replace(/=+$/, '')) {
        throw new Error('content_base64 is not valid base64');
      }
      const written = unwrap(
        await api.PUT('/sessions/{id}/files/{name}', {
          params: { path: { id: session_id, name } },
          body: bytes as never,
          bodySerializer: (b: unknown) => new Uint8Array(b as Buffer),
          headers: { 'content-type': 'application/octet-stream' },
          signal,
        }),
      ) as Record<string, unknown>;
      return answer({ session_id, ...written });
    }),
  );

  server.registerTool(
    'download_file',
    {
      title: 'Read a file of a session or a run',
      description:
        'Reads a file: with session_id, one in the session\'s /workspace (what the cells wrote or upload_file put there); with job_id, an artifact of a run or cell (a file it wrote to /output). Text comes back as text, other content as base64.',
      inputSchema: {
        session_id: sessionId.optional(),
        job_id: z.string().min(1).optional().describe('A run or cell (its job_id or execution_id), for its artifact'),
        name: z.string().min(1).describe('The file name'),
      },
      annotations: { readOnlyHint: true },
    },
    guarded(async ({ session_id, job_id, name }, { signal }) => {
      if ((session_id === undefined) === (job_id === undefined)) throw new Error('give exactly one of session_id (a session file) and job_id (a run\'s artifact)');
      const r = session_id !== undefined
        ? await api.GET('/sessions/{id}/files/{name}', { params: { path: { id: session_id, name } }, parseAs: 'arrayBuffer', signal })
        : await api.GET('/jobs/{id}/artifacts/{name}', { params: { path: { id: job_id!, name } }, parseAs: 'arrayBuffer', signal });
      const data = Buffer.from(unwrap(r) as ArrayBuffer);
      const type = r.response.headers.get('content-type') ?? 'application/octet-stream';
      const url = session_id !== undefined
        ? `${base}/sessions/${encodeURIComponent(session_id)}/files/${encodeURIComponent(name)}`
        : `${base}/jobs/${encodeURIComponent(job_id!)}/artifacts/${encodeURIComponent(name)}`;
      const { value, extra } = fileContent(name, data, type, url);
      return answer({ ...(session_id !== undefined ? { session_id } : { job_id }), ...value }, extra);
    }),
  );

  server.registerTool(
    'close_session',
    {
      title: 'Close a session',
      description: 'Ends the session: its sandbox and files are destroyed (a running cell is stopped). Its cells\' records and artifacts stay.',
      inputSchema: { session_id: sessionId },
      annotations: { destructiveHint: true, idempotentHint: true },
    },
    guarded(async ({ session_id }, { signal }) => answer(unwrap(await api.DELETE('/sessions/{id}', { params: { path: { id: session_id } }, signal })) as Record<string, unknown>)),
  );

  server.registerTool(
    'list_job_types',
    {
      title: 'List the environments',
      description: 'The job types (Python environments) code can run in: name, Python version, preinstalled requirements, limits, network and whether it is built.',
      inputSchema: {},
      annotations: { readOnlyHint: true },
    },
    guarded(async (_args, { signal }) => {
      const types = unwrap(await api.GET('/job-types', { signal }));
      return answer({ job_types: types });
    }),
  );
}
