/**
 * Request schemas (SPEC §2.1, §4). Built from the configuration because some limits are configurable
 * (`max_timeout`, code and input size caps). Unknown fields are ignored, as most JSON APIs do.
 */
import * as v from 'valibot';
import type { Config } from '../config.ts';

const utf8Bytes = (s: string) => Buffer.byteLength(s, 'utf8');

/** Body schemas for the configured limits. */
export function requestSchemas(config: Config) {
  const code = v.pipe(
    v.string('code must be a string'),
    v.check((s) => s.trim().length > 0, 'code must be a non-empty string'),
    v.check((s) => utf8Bytes(s) <= config.max_code_bytes, `code must be at most ${config.max_code_bytes} bytes`),
    v.check((s) => !s.includes('\u0000'), 'code must not contain NUL characters'),
  );
  const inputData = v.pipe(
    v.optional(
      v.custom<Record<string, unknown> | null>(
        (x) => x === null || (typeof x === 'object' && !Array.isArray(x)),
        'input_data must be a JSON object (not an array, string or number)',
      ),
      {},
    ),
    v.transform((x): Record<string, unknown> => x ?? {}),
    v.check(
      (x) => utf8Bytes(JSON.stringify(x)) <= config.max_input_bytes,
      `input_data must be at most ${config.max_input_bytes} bytes as JSON`,
    ),
  );
  const timeout = v.optional(
    v.pipe(
      v.number('timeout must be an integer number of seconds'),
      v.integer('timeout must be an integer number of seconds'),
      v.minValue(1, `timeout must be between 1 and ${config.max_timeout} seconds`),
      v.maxValue(config.max_timeout, `timeout must be between 1 and ${config.max_timeout} seconds (max_timeout)`),
    ),
  );
  const startupTimeout = v.optional(
    v.pipe(
      v.number('startup_timeout must be an integer number of seconds'),
      v.integer('startup_timeout must be an integer number of seconds'),
      v.minValue(10, 'startup_timeout must be between 10 and 600 seconds'),
      v.maxValue(600, 'startup_timeout must be between 10 and 600 seconds'),
    ),
  );
  const jobType = v.optional(v.pipe(v.string('job_type must be a string'), v.minLength(1, 'job_type must not be empty'), v.maxLength(63)), 'default');
  const requirements = v.pipe(
    v.optional(v.nullable(v.array(v.pipe(v.string('requirements must be strings'), v.minLength(1), v.maxLength(200)), 'requirements must be an array of strings')), []),
    v.transform((x) => x ?? []),
    v.check((x) => x.length <= 50, 'requirements must list at most 50 packages'),
  );
  const shared = { code, input_data: inputData, timeout, startup_timeout: startupTimeout, job_type: jobType, requirements };
  const sync = v.pipe(
    v.looseObject(shared, 'request body must be a JSON object'),
    v.check((x) => !('idempotency_key' in x), 'idempotency_key is only accepted by POST /execute/async'),
    v.transform(({ code, input_data, timeout, startup_timeout, job_type, requirements }) => ({ code, input_data, timeout, startup_timeout, job_type, requirements })),
  );
  const asyncBody = v.object(
    {
      ...shared,
      idempotency_key: v.optional(
        v.pipe(v.string('idempotency_key must be a string'), v.minLength(1, 'idempotency_key must not be empty'), v.maxLength(255, 'idempotency_key must be at most 255 characters')),
      ),
    },
    'request body must be a JSON object',
  );
  const fork = v.object({ code }, 'request body must be a JSON object with a code field');
  return { sync, async: asyncBody, fork };
}

/** Statuses a history filter accepts (record statuses, plus the queue's `pending` alias of `queued`). */
export const RECORD_STATUSES = ['queued', 'pending', 'running', 'succeeded', 'failed', 'timeout', 'oom', 'cancelled'] as const;
