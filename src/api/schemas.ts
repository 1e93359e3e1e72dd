/**
 * Request schemas (SPEC §2.1, §4): bodies and query strings. Built from the configuration because
 * some limits are configurable (`max_timeout`, code and input size caps). The same objects validate
 * requests and generate the OpenAPI document, so the limits a client reads are the ones enforced.
 * Checks JSON Schema cannot express (UTF-8 byte counts) are enforced by `v.check` and stated in the
 * document by `v.metadata` (`x-max-bytes`, a description, and `maxLength` as a character bound that
 * is implied by the byte bound). Unknown body fields are ignored, as most JSON APIs do.
 */
import * as v from 'valibot';
import type { Config } from '../config.ts';
import { STATUS_FILTERS } from '../executions/index.ts';
import { MAX_INPUT_FILES } from '../executions/input-files.ts';
import { isExactNumber, jsonDepth, MAX_JSON_DEPTH, stringifyJson } from '../util/json.ts';

const utf8Bytes = (s: string) => Buffer.byteLength(s, 'utf8');

/** Index of the first lone surrogate in `s`, or -1 (such a string has no UTF-8 form). */
function loneSurrogateAt(s: string): number {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const next = s.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) i++;
      else return i;
    } else if (c >= 0xdc00 && c <= 0xdfff) return i;
  }
  return -1;
}

/** Body schemas for the configured limits. */
export function requestSchemas(config: Config) {
  const code = v.pipe(
    v.string('code must be a string'),
    v.metadata({
      description: `Python source run as /code/main.py. Not blank, no NUL, at most ${config.max_code_bytes} bytes of UTF-8 (max_code_bytes).`,
      minLength: 1,
      maxLength: config.max_code_bytes,
      'x-max-bytes': config.max_code_bytes,
      examples: ['print(1)'],
    }),
    v.check((s) => s.trim().length > 0, 'code must be a non-empty string'),
    v.check((s) => utf8Bytes(s) <= config.max_code_bytes, `code must be at most ${config.max_code_bytes} bytes`),
    v.check((s) => !s.includes('\u0000'), 'code must not contain NUL characters'),
    v.rawCheck(({ dataset, addIssue }) => {
      if (!dataset.typed) return;
      const at = loneSurrogateAt(dataset.value);
      if (at >= 0) addIssue({ message: `code must be valid Unicode text: it has a lone surrogate at character ${at}, which no UTF-8 source file can hold` });
    }),
  );
  const inputData = v.pipe(
    v.optional(
      v.pipe(
        v.custom<Record<string, unknown> | null>(
          (x) => x === null || (typeof x === 'object' && !Array.isArray(x) && !isExactNumber(x)),
          'input_data must be a JSON object (not an array, string or number)',
        ),
        v.metadata({
          type: ['object', 'null'],
          description: `Written to /input/data.json; null means {}. At most ${config.max_input_bytes} bytes as JSON (max_input_bytes) and ${MAX_JSON_DEPTH} levels of nesting. Any JSON value survives: NUL and other control characters, lone surrogates (kept as \\u escapes), any key name, numbers exactly as written (12345678901234567890, 0.1000000000000000055511, 1.0).`,
          'x-max-bytes': config.max_input_bytes,
          examples: [{ n: 42 }],
        }),
      ),
      {},
    ),
    v.transform((x): Record<string, unknown> => x ?? {}),
    // Depth first, and size only for a value that passed it: serializing a deeper one would overflow
    // the stack (valibot runs every check of a pipe even after one failed).
    v.rawCheck(({ dataset, addIssue }) => {
      if (!dataset.typed) return;
      if (jsonDepth(dataset.value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH) {
        addIssue({ message: `input_data must nest at most ${MAX_JSON_DEPTH} levels deep (it nests deeper)` });
      } else if (utf8Bytes(stringifyJson(dataset.value)) > config.max_input_bytes) {
        addIssue({ message: `input_data must be at most ${config.max_input_bytes} bytes as JSON` });
      }
    }),
  );
  const timeout = v.optional(
    v.pipe(
      v.number('timeout must be an integer number of seconds'),
      v.integer('timeout must be an integer number of seconds'),
      v.minValue(1, `timeout must be between 1 and ${config.max_timeout} seconds`),
      v.maxValue(config.max_timeout, `timeout must be between 1 and ${config.max_timeout} seconds (max_timeout)`),
      v.description('Execution time limit in seconds (excludes startup). Default: the job type\'s timeout, capped at max_timeout.'),
    ),
  );
  const startupTimeout = v.optional(
    v.pipe(
      v.number('startup_timeout must be an integer number of seconds'),
      v.integer('startup_timeout must be an integer number of seconds'),
      v.minValue(10, 'startup_timeout must be between 10 and 600 seconds'),
      v.maxValue(600, 'startup_timeout must be between 10 and 600 seconds'),
      v.description('Time limit in seconds for sandbox creation and dependency installation.'),
    ),
    60,
  );
  const jobType = v.optional(
    v.pipe(v.string('job_type must be a string'), v.minLength(1, 'job_type must not be empty'), v.maxLength(63), v.description('Job type (environment) name; see GET /job-types.')),
    'default',
  );
  const requirements = v.pipe(
    v.optional(
      v.nullable(
        v.array(v.pipe(v.string('requirements must be strings'), v.minLength(1), v.maxLength(200)), 'requirements must be an array of strings'),
      ),
      [],
    ),
    v.metadata({
      maxItems: 50,
      description:
        'Package specifiers installed in the startup phase: a name, optional [extras] and version clauses (e.g. "numpy>=1.26,<2"). URLs, paths and options are refused; at most 50.',
    }),
    v.transform((x) => x ?? []),
    v.check((x) => x.length <= 50, 'requirements must list at most 50 packages'),
  );
  const inputFiles = v.optional(
    v.pipe(
      v.record(v.string(), v.string('input_files values must be base64 strings'), 'input_files must be an object mapping file names to base64 content'),
      v.metadata({
        description: `Files placed read-only under /input/files/: file name → base64 content. Names are plain file names (no directories, no '..', no control characters, not _code.py or _input.json); at most ${MAX_INPUT_FILES} files with input_artifacts, each at most ${config.max_artifact_bytes} bytes (max_artifact_bytes), all within the body limit (max_body_bytes).`,
        examples: [{ 'data.csv': 'YSxiCjEsMgo=' }],
      }),
    ),
  );
  const inputArtifacts = v.optional(
    v.pipe(
      v.array(
        v.object(
          {
            job_id: v.pipe(v.string('input_artifacts[].job_id must be a string'), v.minLength(1), v.maxLength(64)),
            name: v.pipe(v.string('input_artifacts[].name must be a string'), v.minLength(1), v.maxLength(255)),
            as: v.optional(v.pipe(v.string('input_artifacts[].as must be a string'), v.minLength(1), v.maxLength(255), v.description('Name under /input/files/; the artifact\'s own name when absent.'))),
          },
          'input_artifacts entries must be objects with job_id and name',
        ),
        'input_artifacts must be an array of {job_id, name}',
      ),
      v.maxLength(MAX_INPUT_FILES, `input_artifacts must list at most ${MAX_INPUT_FILES} artifacts`),
      v.description('Artifacts of earlier jobs, by reference, placed read-only under /input/files/<as or name>: jobs chain without the bytes passing through the client. An unknown job or artifact is 404.'),
    ),
  );
  const callbackUrl = v.optional(
    v.nullable(
      v.pipe(
        v.string('callback_url must be a string'),
        v.minLength(1, 'callback_url must not be empty'),
        v.maxLength(2048, 'callback_url must be at most 2048 characters'),
        v.description(
          'http(s) URL the record is POSTed to when the job ends, signed per Standard Webhooks (see docs/api.md). Its host must match webhooks.allowed_hosts (else 400). Absent: the job type\'s or the configured default; null: none.',
        ),
      ),
    ),
  );
  const shared = { code, input_data: inputData, timeout, startup_timeout: startupTimeout, job_type: jobType, requirements, input_files: inputFiles, input_artifacts: inputArtifacts, callback_url: callbackUrl };
  const sync = v.pipe(
    v.looseObject(shared, 'request body must be a JSON object'),
    v.metadata({ ref: 'ExecuteRequest', 'x-max-bytes': config.max_body_bytes, description: `SPEC §2.1 without idempotency_key. The whole body is at most ${config.max_body_bytes} bytes (max_body_bytes).` }),
    v.check((x) => !('idempotency_key' in x), 'idempotency_key is only accepted by POST /execute/async'),
    v.transform(({ code, input_data, timeout, startup_timeout, job_type, requirements, input_files, input_artifacts, callback_url }) => ({
      code,
      input_data,
      timeout,
      startup_timeout,
      job_type,
      requirements,
      input_files: input_files as Record<string, string> | undefined,
      input_artifacts,
      callback_url,
    })),
  );
  const asyncBody = v.pipe(
    v.object(
      {
        ...shared,
        idempotency_key: v.optional(
          v.pipe(
            v.string('idempotency_key must be a string'),
            v.minLength(1, 'idempotency_key must not be empty'),
            v.maxLength(255, 'idempotency_key must be at most 255 characters'),
            v.check((k) => !/[\u0000-\u001f\u007f]/.test(k) && loneSurrogateAt(k) < 0, 'idempotency_key must be text without control characters or lone surrogates'),
            v.description('Same key and same payload returns the existing job; same key and another payload is 409.'),
          ),
        ),
      },
      'request body must be a JSON object',
    ),
    v.metadata({ ref: 'ExecuteAsyncRequest', 'x-max-bytes': config.max_body_bytes, description: `SPEC §2.1. The whole body is at most ${config.max_body_bytes} bytes (max_body_bytes).` }),
  );
  const fork = v.pipe(
    v.object({ code, callback_url: callbackUrl }, 'request body must be a JSON object with a code field'),
    v.metadata({ ref: 'ForkRequest', 'x-max-bytes': config.max_body_bytes, description: `The whole body is at most ${config.max_body_bytes} bytes (max_body_bytes). Without callback_url the original job's callback is kept.` }),
  );
  const rerun = v.pipe(
    v.object({ callback_url: callbackUrl }, 'request body must be a JSON object'),
    v.metadata({ ref: 'RerunRequest', 'x-optional-body': true, description: 'Optional; without a body (or callback_url) the original job\'s callback is kept.' }),
  );
  const seconds = (name: string, max: number, description: string) =>
    v.optional(
      v.pipe(
        v.number(`${name} must be an integer number of seconds`),
        v.integer(`${name} must be an integer number of seconds`),
        v.minValue(1, `${name} must be between 1 and ${max} seconds`),
        v.maxValue(max, `${name} must be between 1 and ${max} seconds`),
        v.description(description),
      ),
    );
  const session = v.pipe(
    v.object(
      {
        job_type: jobType,
        requirements,
        idle_timeout: seconds('idle_timeout', 3600, 'Seconds without a cell after which the session ends (idle). Default 300.'),
        max_lifetime: seconds('max_lifetime', 86400, 'Seconds after which the session ends whatever it does (lifetime). Default 3600.'),
        timeout: seconds('timeout', config.max_timeout, "Each cell's execution time limit in seconds (a cell may set its own). Default: the job type's, capped at max_timeout."),
      },
      'request body must be a JSON object',
    ),
    v.metadata({ ref: 'SessionRequest', description: 'A new session (issue 19).' }),
  );
  const cell = v.pipe(
    v.object({ code, input_data: inputData, timeout, callback_url: callbackUrl }, 'request body must be a JSON object with a code field'),
    v.metadata({ ref: 'CellRequest', 'x-max-bytes': config.max_body_bytes, description: "One cell, run in the session's interpreter; /input/data.json holds its input_data." }),
  );
  return { sync, async: asyncBody, fork, rerun, session, cell };
}

/** Query integer: a decimal string within [min, max]; documented as an integer. */
export function intParam(name: string, min: number, max: number, dflt: number, description?: string) {
  const msg = `${name} must be an integer between ${min} and ${max}`;
  return v.pipe(
    v.optional(v.pipe(v.string(`${name} must be given once, as an integer between ${min} and ${max}`), v.regex(/^-?\d+$/, msg), v.transform(Number), v.number(), v.minValue(min, msg), v.maxValue(max, msg)), String(dflt)),
    // The wire form is a digit string; the document states the integer it means (and drops the
    // digit pattern, which only applies to strings).
    v.metadata({ type: 'integer', pattern: undefined, minimum: min, maximum: max, default: dflt, ...(description ? { description } : {}) }),
  );
}

/** Query boolean: true/false/1/0. */
export function boolParam(name: string, description?: string) {
  return v.optional(
    v.pipe(
      v.picklist(['true', 'false', '1', '0'], `${name} must be true or false`),
      v.description<'true' | 'false' | '1' | '0', string>(description ?? `${name}: true or false`),
      v.transform((s) => s === 'true' || s === '1'),
    ),
    'false',
  );
}

/** `view`: omitted (or `summary`) for the SPEC §2.3 fields, `full` for the extended ones. */
export const viewParam = v.optional(
  v.pipe(v.picklist(['full', 'summary'], "view must be 'full' (or omitted)"), v.description('`full` adds the extended fields of SPEC §2.3.')),
);

/** `?view=` */
export const ViewQuery = v.object({ view: viewParam });

/** `GET /jobs/{id}/result` query. */
export const ResultQuery = v.object({
  wait: boolParam('wait', 'Wait for the job to finish (long-poll).'),
  timeout: intParam('timeout', 1, 300, 30, 'Seconds to wait when wait=true; running out is 408.'),
  view: viewParam,
});

/** `GET /executions` query. */
export const ExecutionsQuery = v.object({
  status: v.optional(
    v.pipe(v.picklist(STATUS_FILTERS, `status must be one of ${STATUS_FILTERS.join(', ')}`), v.description('Record status; `pending` is the queue\'s name for `queued`.')),
  ),
  job_type: v.optional(v.pipe(v.string('job_type must be given once'), v.maxLength(63, 'job_type must be at most 63 characters'), v.description('Job type name.'))),
  limit: intParam('limit', 1, 1000, 100, 'Page size.'),
  offset: intParam('offset', 0, Number.MAX_SAFE_INTEGER, 0, 'Records skipped.'),
  view: viewParam,
});

/** `GET /sessions` query. */
export const SessionsQuery = v.object({
  status: v.optional(v.pipe(v.picklist(['starting', 'ready', 'busy', 'ended'], 'status must be one of starting, ready, busy, ended'), v.description('Only sessions in this status.'))),
  limit: intParam('limit', 1, 1000, 100, 'Page size.'),
  offset: intParam('offset', 0, Number.MAX_SAFE_INTEGER, 0, 'Sessions skipped.'),
});

/** `GET /dlq` query. */
export const DlqQuery = v.object({
  error_type: v.optional(v.pipe(v.string('error_type must be given once'), v.maxLength(64, 'error_type must be at most 64 characters'), v.description('Only entries of this error type (SPEC §7.2).'))),
  limit: intParam('limit', 1, 1000, 100, 'Page size.'),
  offset: intParam('offset', 0, Number.MAX_SAFE_INTEGER, 0, 'Entries skipped.'),
});
