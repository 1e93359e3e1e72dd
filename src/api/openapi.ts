/**
 * The OpenAPI 3.1 document, generated from the same valibot schemas the routes validate with
 * (request bodies), plus hand-written response shapes for SPEC §2.
 */
import { toJsonSchema } from '@valibot/to-json-schema';
import type { GenericSchema } from 'valibot';
import type { Config } from '../config.ts';
import { requestSchemas, RECORD_STATUSES } from './schemas.ts';

const json = (schema: GenericSchema) => toJsonSchema(schema, { errorMode: 'ignore', typeMode: 'input' });

const ERROR = {
  type: 'object',
  required: ['detail', 'code', 'correlation_id'],
  properties: { detail: { type: 'string' }, code: { type: 'string' }, correlation_id: { type: 'string' } },
};
const errorResponses = (...codes: number[]) =>
  Object.fromEntries(codes.map((c) => [String(c), { description: STATUS_TEXT[c] ?? 'error', content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } } }]));
const STATUS_TEXT: Record<number, string> = {
  400: 'invalid request',
  404: 'not found',
  408: 'wait timed out',
  409: 'conflict',
  413: 'body too large',
  415: 'not JSON',
  503: 'queue full, degraded or shutting down',
};
const ok = (description: string, ref?: string) => ({
  description,
  content: { 'application/json': { schema: ref ? { $ref: `#/components/schemas/${ref}` } : { type: 'object' } } },
});
const idParam = (name = 'id') => ({ name, in: 'path', required: true, schema: { type: 'string' } });
const viewQ = { name: 'view', in: 'query', schema: { type: 'string', enum: ['full'] } };
const page = [
  { name: 'limit', in: 'query', schema: { type: 'integer', minimum: 1, maximum: 1000, default: 100 } },
  { name: 'offset', in: 'query', schema: { type: 'integer', minimum: 0, default: 0 } },
];

/** Builds the document for the configured limits. */
export function buildOpenApi(config: Config, version: string): Record<string, unknown> {
  const s = requestSchemas(config);
  const body = (schema: GenericSchema) => ({ required: true, content: { 'application/json': { schema: json(schema) } } });
  return {
    openapi: '3.1.0',
    info: { title: 'sandpod', version, description: 'Runs untrusted Python code in sandboxes.' },
    paths: {
      '/execute': { post: { summary: 'Run code and wait for the result', requestBody: body(s.sync), responses: { 200: ok('sync result', 'SyncResult'), ...errorResponses(400, 413, 415, 503) } } },
      '/execute/async': {
        post: {
          summary: 'Queue code for execution (idempotency_key optional)',
          requestBody: body(s.async),
          responses: { 202: ok('queued'), 200: ok('idempotent replay of an existing job'), ...errorResponses(400, 409, 413, 415, 503) },
        },
      },
      '/jobs/{id}': { get: { summary: 'Job status', parameters: [idParam(), viewQ], responses: { 200: ok('status'), ...errorResponses(404) } } },
      '/jobs/{id}/result': {
        get: {
          summary: 'Job result; wait=true long-polls',
          parameters: [
            idParam(),
            { name: 'wait', in: 'query', schema: { type: 'boolean', default: false } },
            { name: 'timeout', in: 'query', schema: { type: 'integer', minimum: 1, maximum: 300, default: 30 } },
            viewQ,
          ],
          responses: { 200: ok('execution record', 'ExecutionRecord'), 202: ok('not finished yet'), ...errorResponses(400, 404, 408) },
        },
      },
      '/jobs/{id}/cancel': { post: { summary: 'Cancel a queued or running job', parameters: [idParam()], responses: { 200: ok('cancelled'), 202: ok('cancelling'), ...errorResponses(404, 409) } } },
      '/jobs/{id}/rerun': { post: { summary: 'Re-run a finished job', parameters: [idParam()], responses: { 202: ok('queued'), ...errorResponses(404, 409, 503) } } },
      '/jobs/{id}/fork': { post: { summary: 'Run new code with a finished job\'s input and settings', parameters: [idParam()], requestBody: body(s.fork), responses: { 202: ok('queued'), ...errorResponses(400, 404, 409, 503) } } },
      '/jobs/{job_id}/artifacts/{artifact_name}': {
        get: {
          summary: 'Download an artifact (ETag, If-None-Match)',
          parameters: [idParam('job_id'), idParam('artifact_name'), { name: 'If-None-Match', in: 'header', schema: { type: 'string' } }],
          responses: { 200: { description: 'file bytes' }, 304: { description: 'not modified' }, ...errorResponses(400, 404) },
        },
        head: { summary: 'Artifact headers only', parameters: [idParam('job_id'), idParam('artifact_name')], responses: { 200: { description: 'headers' }, 304: { description: 'not modified' }, 404: { description: 'not found' } } },
      },
      '/executions': {
        get: {
          summary: 'Execution history, newest first',
          parameters: [
            { name: 'status', in: 'query', schema: { type: 'string', enum: [...RECORD_STATUSES] } },
            { name: 'job_type', in: 'query', schema: { type: 'string' } },
            ...page,
            viewQ,
          ],
          responses: { 200: ok('page', 'Page'), ...errorResponses(400) },
        },
      },
      '/executions/{id}': { get: { summary: 'One execution record', parameters: [idParam(), viewQ], responses: { 200: ok('record', 'ExecutionRecord'), ...errorResponses(404) } } },
      '/job-types': { get: { summary: 'Job types', responses: { 200: ok('job types') } } },
      '/job-types/{name}': { get: { summary: 'One job type', parameters: [idParam('name')], responses: { 200: ok('job type'), ...errorResponses(404) } } },
      '/job-types/{name}/build': { post: { summary: 'Build a job type image (not implemented yet: 501)', parameters: [idParam('name')], responses: { 501: { description: 'not implemented' }, ...errorResponses(404) } } },
      '/health': { get: { summary: 'Health (503 when degraded)', responses: { 200: ok('healthy'), 503: ok('degraded') } } },
      '/livez': { get: { summary: 'Liveness', responses: { 200: ok('alive') } } },
      '/readyz': { get: { summary: 'Readiness', responses: { 200: ok('ready'), 503: ok('not ready') } } },
      '/pool/stats': { get: { summary: 'Worker pool statistics', responses: { 200: ok('stats') } } },
      '/metrics': { get: { summary: 'Prometheus metrics', responses: { 200: { description: 'text exposition format' } } } },
      '/dlq': { get: { summary: 'Dead letter queue', parameters: [{ name: 'error_type', in: 'query', schema: { type: 'string' } }, ...page], responses: { 200: ok('page', 'Page'), ...errorResponses(400) } } },
      '/dlq/stats': { get: { summary: 'DLQ statistics', responses: { 200: ok('stats') } } },
      '/dlq/{id}': { delete: { summary: 'Remove a DLQ entry', parameters: [idParam()], responses: { 200: ok('deleted'), ...errorResponses(400, 404) } } },
    },
    components: {
      schemas: {
        Error: ERROR,
        SyncResult: {
          type: 'object',
          properties: {
            success: { type: 'boolean' },
            output: {},
            stdout: { type: 'string' },
            stderr: { type: 'string' },
            exit_code: { type: ['integer', 'null'] },
            execution_time: { type: 'number' },
            error: {},
            job_type: { type: 'string' },
            execution_id: { type: 'string' },
          },
        },
        ExecutionRecord: {
          type: 'object',
          properties: {
            execution_id: { type: 'string' },
            status: { type: 'string', enum: ['queued', 'running', 'succeeded', 'failed', 'timeout', 'oom', 'cancelled'] },
            job_type: { type: 'string' },
            job_version: { type: 'string' },
            created_at: { type: 'string', format: 'date-time' },
            started_at: { type: ['string', 'null'], format: 'date-time' },
            ended_at: { type: ['string', 'null'], format: 'date-time' },
            duration_ms: { type: ['integer', 'null'] },
            exit_code: { type: ['integer', 'null'] },
            stdout: { type: 'string' },
            stderr: { type: 'string' },
            output: {},
            error: { type: ['object', 'null'] },
            timing: { type: ['object', 'null'] },
          },
        },
        Page: {
          type: 'object',
          properties: { items: { type: 'array' }, limit: { type: 'integer' }, offset: { type: 'integer' }, has_more: { type: 'boolean' }, count: { type: 'integer' } },
        },
      },
    },
  };
}
