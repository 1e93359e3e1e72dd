/**
 * The committed client types (src/client/schema.ts) are what `npm run gen:client` makes from the
 * routes now: a route whose contract changed without regenerating fails here.
 */
import { describe, expect, it } from 'vitest';
import { committedSchema, renderSchema, serviceDocument } from '../../../src/client/generate.ts';

describe('generated client types', () => {
  it('src/client/schema.ts is up to date with the routes (npm run gen:client)', async () => {
    const fresh = await renderSchema();
    expect(committedSchema(), 'src/client/schema.ts is stale: run npm run gen:client').toBe(fresh);
  }, 60_000);

  it('covers every path of the service\'s document', async () => {
    const doc = (await serviceDocument()) as { paths: Record<string, unknown> };
    const text = committedSchema();
    const paths = Object.keys(doc.paths);
    expect(paths).toContain('/execute/async');
    for (const p of paths) expect(text, p).toContain(`"${p}": {`);
  }, 60_000);
});
