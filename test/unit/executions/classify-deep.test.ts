/**
 * A result.json nested far past the limit (deeper than the exact parser reads at all) fails the
 * run with the same json_error and message as one a level too deep — not "not valid JSON" with the
 * parser's own wording, and never a stack overflow.
 */
import { describe, expect, it } from 'vitest';
import { classify } from '../../../src/executions/classify.ts';
import { MAX_JSON_DEPTH } from '../../../src/util/json.ts';
import { makeRaw } from '../../support/raw-run.ts';

describe('classify: result.json nested far too deep', () => {
  it.each([MAX_JSON_DEPTH + 2, 5_000, 100_000])('%i levels → json_error naming the limit', (depth) => {
    const c = classify(makeRaw({}, { resultJson: `${'['.repeat(depth)}${']'.repeat(depth)}` }));
    expect(c).toMatchObject({ status: 'failed', output: null, error: { type: 'json_error', message: `/output/result.json nests deeper than ${MAX_JSON_DEPTH} levels` } });
  });
});
