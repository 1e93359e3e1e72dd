/**
 * Offline validation of built objects against the Kubernetes OpenAPI schemas:
 * - `kubernetes-models` (validators generated from the official OpenAPI of Kubernetes 1.3x) checks
 *   types, required fields, formats and enums;
 * - the official OpenAPI has no `additionalProperties: false`, so a misspelt field would pass; the
 *   generated models of `@kubernetes/client-node` 1.4.0 carry every field name of every type
 *   (their `attributeTypeMap`), which we walk to reject unknown fields the way
 *   `kubectl --validate=strict` / server-side field validation does.
 */
import * as k8s from '@kubernetes/client-node';
import { Job } from 'kubernetes-models/batch/v1/Job';
import { Secret } from 'kubernetes-models/v1/Secret';

type AttrMap = { baseName: string; type: string }[];

function attributes(typeName: string): AttrMap | null {
  const cls = (k8s as unknown as Record<string, { getAttributeTypeMap?: () => AttrMap }>)[typeName];
  return cls?.getAttributeTypeMap ? cls.getAttributeTypeMap() : null;
}

/** Paths of fields that the named client-node model type does not define. */
export function unknownFields(value: unknown, typeName: string, path = ''): string[] {
  const arr = /^Array<(.+)>$/.exec(typeName);
  if (arr) return Array.isArray(value) ? value.flatMap((v, i) => unknownFields(v, arr[1]!, `${path}[${i}]`)) : [];
  const map = /^\{ \[key: string\]: (.+); \}$/.exec(typeName);
  if (map) return value && typeof value === 'object' ? Object.entries(value).flatMap(([k, v]) => unknownFields(v, map[1]!, `${path}.${k}`)) : [];
  const attrs = attributes(typeName);
  if (!attrs || !value || typeof value !== 'object') return [];
  const out: string[] = [];
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    const a = attrs.find((x) => x.baseName === k);
    if (!a) out.push(`${path}.${k}`);
    else out.push(...unknownFields(v, a.type, `${path}.${k}`));
  }
  return out;
}

/** Throws with every problem when the Job is not valid batch/v1. */
export function validateJob(job: object): void {
  new Job(job as never).validate();
  const unknown = unknownFields(job, 'V1Job');
  if (unknown.length) throw new Error(`unknown fields in Job: ${unknown.join(', ')}`);
}

/** Throws with every problem when the Secret is not valid core/v1. */
export function validateSecret(secret: object): void {
  new Secret(secret as never).validate();
  const unknown = unknownFields(secret, 'V1Secret');
  if (unknown.length) throw new Error(`unknown fields in Secret: ${unknown.join(', ')}`);
}

/** batch/v1 JobSpec fields that exist in Kubernetes 1.20 (no suspend, podFailurePolicy, ...). */
export const JOB_SPEC_FIELDS_1_20 = new Set([
  'activeDeadlineSeconds',
  'backoffLimit',
  'completions',
  'manualSelector',
  'parallelism',
  'selector',
  'template',
  'ttlSecondsAfterFinished',
]);
