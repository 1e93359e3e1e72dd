/**
 * How routes declare their contract, and the OpenAPI 3.1 document generated from those declarations
 * by hono-openapi. A route carries `describeRoute({...responses})` built from the valibot response
 * schemas of `responses.ts`, and validates its query and body with the middlewares below, which also
 * register the request schema with hono-openapi. So the document is made from the objects the routes
 * use, and cannot drift from them.
 *
 * JSON bodies are read by our own middleware (not hono-openapi's `validator('json')`, which reads
 * the whole body before any size check and treats a non-JSON content type as an empty object): it
 * keeps the 413 / 415 / 400 behaviour of `validate.ts` and registers the schema the same way
 * `validator()` does, through hono-openapi's documented `uniqueSymbol` extension point.
 */
import type { Hono, MiddlewareHandler } from 'hono';
import { generateSpecs, resolver, uniqueSymbol, validator, type DescribeRouteOptions } from 'hono-openapi';
import * as v from 'valibot';
import { AppError } from '../errors.ts';
import type { AppEnv } from './deps.ts';
import { formatValiIssues } from './errors.ts';
import { ErrorSchema } from './responses.ts';
import { jsonBody } from './validate.ts';

/** Converter options: document what a client sends (the input side of each pipeline). */
const CONVERT = { options: { typeMode: 'input' } } as const;

/** A valibot schema as hono-openapi consumes it. */
export const schemaOf = (schema: v.GenericSchema) => resolver(schema, CONVERT);

/** A JSON response. */
export function jsonResponse(description: string, schema: v.GenericSchema): ResponseDoc {
  return { description, content: { 'application/json': { schema: schemaOf(schema) } } };
}

/** One response of an operation, as `describeRoute` takes it. */
export type ResponseDoc = NonNullable<DescribeRouteOptions['responses']>[string];

const ERROR_TEXT: Record<number, string> = {
  400: 'Invalid request: the detail names the field and the problem',
  403: 'Authentication is off and the Host or Origin is not allowed (see http.allowed_hosts)',
  404: 'Not found',
  408: 'The wait ran out before the job finished',
  409: 'Conflict with the job\'s state',
  413: 'Request body larger than max_body_bytes',
  415: 'Request body is not application/json',
  429: 'Too many concurrent event streams (per token or in all); retry later',
  500: 'Internal error; quote the correlation id',
  501: 'Not implemented',
  503: 'Queue full, service degraded or shutting down',
};

/** Error responses with the one error body. */
export function errorResponses(...codes: number[]): Record<string, ResponseDoc> {
  return Object.fromEntries(codes.map((c) => [String(c), jsonResponse(ERROR_TEXT[c] ?? 'Error', ErrorSchema)]));
}

/** A path parameter. */
export function pathParam(name: string, description: string, pattern?: string): ParamDoc {
  return { name, in: 'path', required: true, description, schema: { type: 'string', minLength: 1, ...(pattern ? { pattern } : {}) } };
}

/** One parameter of an operation, as `describeRoute` takes it. */
export type ParamDoc = NonNullable<DescribeRouteOptions['parameters']>[number];

/** Validates the query string with `schema` (400 `validation_error` naming the parameter) and documents it. */
export function queryValidator<S extends v.GenericSchema>(schema: S) {
  return validator('query', schema, (result) => {
    if (!result.success) {
      throw new AppError('validation_error', formatValiIssues(result.error as readonly v.BaseIssue<unknown>[]) || 'invalid query');
    }
  }, CONVERT);
}

/**
 * Reads and validates the JSON body (413 beyond `limit`, 415 when not JSON, 400 when malformed or
 * invalid; see `validate.ts`), stores it for `c.req.valid('json')`, and documents `schema` as the
 * request body.
 */
export function bodyValidator<S extends v.GenericSchema>(schema: S, limit: number, before?: () => void, optional = false) {
  const mw: MiddlewareHandler<AppEnv, string, { in: { json: v.InferInput<S> }; out: { json: v.InferOutput<S> } }> = async (c, next) => {
    before?.();
    c.req.addValidatedData('json', (await jsonBody(c, schema, { limit, optional })) as object);
    await next();
  };
  return Object.assign(mw, { [uniqueSymbol]: { target: 'json', ...schemaOf(schema), options: CONVERT } });
}

/** Builds the document for an app whose routes are declared as above. */
export async function buildOpenApi(app: Hono<AppEnv>, version: string, bearerAuth = false): Promise<Record<string, unknown>> {
  const doc = await generateSpecs(app, {
    documentation: {
      info: {
        title: 'sandpod',
        version,
        description:
          'Runs untrusted Python code in sandboxes and keeps a record of every run. Request limits in the schemas are those of this instance\'s configuration.',
        license: { name: 'Apache-2.0', identifier: 'Apache-2.0' },
      },
      // Relative: the document is right wherever the service is mounted (behind a path prefix too).
      servers: [{ url: '.', description: 'This service, at the address this document was fetched from' }],
      // With API tokens configured (auth.tokens / auth.tokens_file) every operation but the probes
      // takes a bearer token; without them the service authenticates nobody (SPEC §5).
      security: bearerAuth ? [{ bearerAuth: [] }] : [],
      ...(bearerAuth
        ? { components: { securitySchemes: { bearerAuth: { type: 'http', scheme: 'bearer', description: 'One of the API tokens this instance is configured with; /livez, /readyz and /health need none.' } } } }
        : {}),
      tags: TAGS,
    },
    // /openapi.json looks like a static file to hono-openapi; it is an operation here.
    excludeStaticFile: false,
    defaultValidationErrorResponse: false,
  });
  markOptionalBodies(doc as unknown as OpenApiDoc);
  return doc as unknown as Record<string, unknown>;
}

type OpenApiDoc = { paths?: Record<string, Record<string, { requestBody?: { required?: boolean; content?: Record<string, { schema?: { $ref?: string } }> } }>>; components?: { schemas?: Record<string, Record<string, unknown>> } };

/**
 * hono-openapi marks every validated body required; a body whose schema carries `x-optional-body`
 * (the optional body of a rerun) is not, and the document says so.
 */
function markOptionalBodies(doc: OpenApiDoc): void {
  for (const item of Object.values(doc.paths ?? {})) {
    for (const op of Object.values(item)) {
      const ref = op?.requestBody?.content?.['application/json']?.schema?.$ref;
      const schema = ref ? doc.components?.schemas?.[ref.split('/').pop()!] : undefined;
      if (schema?.['x-optional-body'] === true && op.requestBody) {
        op.requestBody.required = false;
      }
    }
  }
}

const TAGS = [
  { name: 'execute', description: 'Run code (SPEC §4.1, §4.2)' },
  { name: 'jobs', description: 'Status, results, cancel, rerun, fork, artifacts (SPEC §4.3-§4.8)' },
  { name: 'history', description: 'Execution records (SPEC §4.12)' },
  { name: 'job-types', description: 'Environments (SPEC §4.9)' },
  { name: 'operations', description: 'Health, probes, pool, metrics, this document' },
  { name: 'dlq', description: 'Dead letter queue (SPEC §4.13)' },
];
