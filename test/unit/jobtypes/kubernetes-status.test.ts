/**
 * The JobType status a build writes (jobtypes/kubernetes-registry.ts `nextJobTypeStatus`): the
 * conditions after each build event, transition times, and that every status it writes is valid
 * against the CRD's status schema (what the API server would refuse with 422).
 */
import { readFileSync } from 'node:fs';
import { Ajv } from 'ajv';
import YAML from 'yaml';
import { describe, expect, it } from 'vitest';
import { nextJobTypeStatus, type BuildStatusUpdate, type JobTypeStatus } from '../../../src/jobtypes/kubernetes-registry.ts';

const crd = YAML.parse(readFileSync(new URL('../../../crds/jobtypes.sandpod.io.yaml', import.meta.url), 'utf8'));
const statusSchema = crd.spec.versions[0].schema.openAPIV3Schema.properties.status;
const ajv = new Ajv({ strict: false, allErrors: true });
ajv.addFormat('int64', { type: 'number', validate: (n: number) => Number.isInteger(n) });
ajv.addFormat('date-time', /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/);
const valid = ajv.compile(statusSchema);

const ref = `registry.example.com/sandpod/builds/data@sha256:${'d'.repeat(64)}`;
const T = (s: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, s));
const cond = (st: JobTypeStatus, type: string) => st.conditions!.find((c) => c.type === type)!;
const summary = (st: JobTypeStatus) => Object.fromEntries(st.conditions!.map((c) => [c.type, c.status]));

describe('nextJobTypeStatus', () => {
  it.each<[string, BuildStatusUpdate[], Record<string, string>, boolean]>([
    ['first build starts', [{ phase: 'building', message: 'b' }], { Building: 'True', Ready: 'False', Failed: 'False' }, false],
    ['first build succeeds', [{ phase: 'building', message: 'b' }, { phase: 'ready', imageRef: ref, message: 'ok' }], { Building: 'False', Ready: 'True', Failed: 'False' }, true],
    ['first build fails', [{ phase: 'building', message: 'b' }, { phase: 'failed', message: 'pip: no such package' }], { Building: 'False', Ready: 'False', Failed: 'True' }, false],
    ['rebuild running: the old image stays Ready', [{ phase: 'ready', imageRef: ref, message: 'ok' }, { phase: 'building', message: 'b' }], { Building: 'True', Ready: 'True', Failed: 'False' }, true],
    ['rebuild fails: still Ready with the old image, Failed says why', [{ phase: 'ready', imageRef: ref, message: 'ok' }, { phase: 'building', message: 'b' }, { phase: 'failed', message: 'x' }], { Building: 'False', Ready: 'True', Failed: 'True' }, true],
  ])('%s', (_name, updates, want, hasDigest) => {
    let st: JobTypeStatus | undefined;
    updates.forEach((u, i) => {
      st = nextJobTypeStatus(st, u, T(i), 3);
      expect(valid(st), JSON.stringify(valid.errors)).toBe(true);
    });
    expect(summary(st!)).toEqual(want);
    expect(st!.observedGeneration).toBe(3);
    if (hasDigest) expect(st!.imageDigest).toBe(`sha256:${'d'.repeat(64)}`);
    else expect(st!.imageDigest).toBeUndefined();
  });

  it("Failed carries the builder's message; transition times move only with the status", () => {
    const a = nextJobTypeStatus(undefined, { phase: 'building', message: 'b' }, T(1));
    const b = nextJobTypeStatus(a, { phase: 'failed', message: 'ERROR: No matching distribution found for nosuchpkg' }, T(2));
    expect(cond(b, 'Failed')).toMatchObject({ status: 'True', reason: 'BuildFailed', message: 'ERROR: No matching distribution found for nosuchpkg', lastTransitionTime: '2026-01-01T00:00:02Z' });
    expect(cond(b, 'Ready').lastTransitionTime).toBe('2026-01-01T00:00:01Z');
    const c = nextJobTypeStatus(b, { phase: 'building', message: 'again' }, T(3));
    expect(cond(c, 'Building').lastTransitionTime).toBe('2026-01-01T00:00:03Z');
    expect(cond(c, 'Ready').lastTransitionTime).toBe('2026-01-01T00:00:01Z');
  });

  it('a huge message is cut to what the CRD allows (its tail, where pip says what failed)', () => {
    const st = nextJobTypeStatus(undefined, { phase: 'failed', message: `${'x'.repeat(40000)}THE END` }, T(0));
    expect(cond(st, 'Failed').message.length).toBe(32768);
    expect(cond(st, 'Failed').message.endsWith('THE END')).toBe(true);
    expect(valid(st)).toBe(true);
  });
});
