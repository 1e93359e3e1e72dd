/**
 * The small pieces the response schemas share: component names, timestamps, integers, examples and the
 * SPEC §2.8 page. Split from responses.ts (over 400 lines) so that the record and operations schemas can
 * live in two files without repeating them.
 */
import * as v from 'valibot';

/** Names the component a schema becomes in the document (read by hono-openapi's valibot converter). */
export function ref<T>(name: string, description?: string): v.MetadataAction<T, Record<string, unknown>> {
  return v.metadata<T, Record<string, unknown>>({ ref: name, ...(description ? { description } : {}) });
}
export const timestamp = v.pipe(v.string(), v.isoTimestamp(), v.description('ISO 8601 UTC timestamp'));
export const nullableTimestamp = v.nullable(timestamp);
export const int = v.pipe(v.number(), v.integer());
export const nonNegInt = v.pipe(v.number(), v.integer(), v.minValue(0));
export const sha256Hex = v.pipe(v.string(), v.regex(/^[0-9a-f]{64}$/));
export const ID_EXAMPLE = '3f1c0f8e-8a5e-4b4a-9c55-0d3e1a6b2c7d';
export const TIME_EXAMPLE = '2026-01-02T03:04:05.678Z';

/** A SPEC §2.8 page of `item`, named `name` in the document. */
export const page = <T extends v.GenericSchema>(item: T, name: string) =>
  v.pipe(
    v.strictObject({ items: v.array(item), limit: nonNegInt, offset: nonNegInt, has_more: v.boolean(), count: nonNegInt }),
    ref(name, 'SPEC §2.8 page.'),
  );
