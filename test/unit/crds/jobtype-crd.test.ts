/**
 * The JobType CRD: a structural apiextensions.k8s.io/v1 schema that accepts the service's job types
 * (the chart's three samples, every default) and rejects bad ones. JobTypes are validated against its
 * openAPIV3Schema with ajv (OpenAPI v3's `format`s and `x-kubernetes-*` extensions handled below).
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { Ajv, type ValidateFunction } from 'ajv';
import * as v from 'valibot';
import YAML from 'yaml';
import { beforeAll, describe, expect, it } from 'vitest';
import { BUILTIN_JOB_TYPES, JobTypeConfigSchema, MemorySchema, parseMemory } from '../../../src/config.ts';
import { fromConfig } from '../../../src/jobtypes/job-type.ts';
import {
  CRD_FILE,
  REPO_ROOT,
  TOOL_BUILD_TIMEOUT_MS,
  byKind,
  describeRendered,
  prepareRenderer,
  renderOk,
  validateBuiltin,
  withDb,
  type Manifest,
} from '../../support/chart.ts';

const crd = YAML.parse(readFileSync(CRD_FILE, 'utf8')) as Manifest;
const version = crd.spec.versions[0];
const schema = version.schema.openAPIV3Schema as Manifest;

function makeAjv(useDefaults: boolean): Ajv {
  // strict: false lets the x-kubernetes-* extensions through as annotations.
  const ajv = new Ajv({ strict: false, allErrors: true, useDefaults });
  ajv.addFormat('int32', { type: 'number', validate: (n: number) => Number.isInteger(n) && Math.abs(n) < 2 ** 31 });
  ajv.addFormat('int64', { type: 'number', validate: (n: number) => Number.isInteger(n) });
  ajv.addFormat('date-time', /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/);
  return ajv;
}

let validate: ValidateFunction;
let withDefaults: ValidateFunction;
beforeAll(() => {
  validate = makeAjv(false).compile(structuredClone(schema));
  withDefaults = makeAjv(true).compile(structuredClone(schema));
});

function jobType(spec: Manifest, name = 'sample', extra: Manifest = {}): Manifest {
  return { apiVersion: 'sandpod.io/v1alpha1', kind: 'JobType', metadata: { name, namespace: 'sandpod' }, spec, ...extra };
}

function errors(obj: Manifest): string[] {
  return validate(obj) ? [] : (validate.errors ?? []).map((e) => `${e.instancePath} ${e.message}`);
}

/** The CRD's defaults applied to a spec, as the API server does on create. */
function defaulted(spec: Manifest): Manifest {
  const obj = jobType(structuredClone(spec));
  expect(withDefaults(obj), JSON.stringify(withDefaults.errors)).toBe(true);
  return obj.spec;
}

/** The service's resolved job type for a spec, by way of its config (snake_case) form. */
function serviceView(name: string, spec: Manifest): Manifest {
  const s = defaulted(spec);
  const conf = v.parse(JobTypeConfigSchema, {
    name,
    python_version: s.pythonVersion,
    requirements: s.requirements,
    preload: s.preload,
    memory_limit: s.memoryLimit,
    cpu_limit: s.cpuLimit,
    timeout: s.timeout,
    max_processes: s.maxProcesses,
    max_file_size: s.maxFileSize,
    network: { mode: s.network.mode, allowed_hosts: s.network.allowedHosts },
    image: s.image ?? null,
    env: s.env,
    version: s.version,
    ...(s.cpuRequest !== undefined ? { cpu_request: s.cpuRequest } : {}),
    ...(s.memoryRequest !== undefined ? { memory_request: s.memoryRequest } : {}),
  });
  return fromConfig(conf);
}

describe('CRD object', () => {
  it('names: sandpod.io/v1alpha1 JobType, plural jobtypes, short name jt, namespaced', () => {
    expect(crd.apiVersion).toBe('apiextensions.k8s.io/v1');
    expect(crd.metadata.name).toBe('jobtypes.sandpod.io');
    expect(crd.spec.group).toBe('sandpod.io');
    expect(crd.spec.scope).toBe('Namespaced');
    expect(crd.spec.names).toMatchObject({ kind: 'JobType', plural: 'jobtypes', singular: 'jobtype', shortNames: ['jt'] });
    expect(crd.spec.versions.map((x: Manifest) => [x.name, x.served, x.storage])).toEqual([['v1alpha1', true, true]]);
    expect(version.subresources).toEqual({ status: {} });
  });

  it('is a valid CustomResourceDefinition (Kubernetes OpenAPI schema)', async () => {
    expect(await validateBuiltin(crd)).toBeNull();
  });

  it('crds/ holds only CustomResourceDefinitions (Helm installs everything in it)', () => {
    const dir = path.join(REPO_ROOT, 'crds');
    for (const f of readdirSync(dir)) {
      const p = path.join(dir, f);
      expect(statSync(p).isFile(), `${f} must be a file`).toBe(true);
      expect(f).toMatch(/\.ya?ml$/);
      for (const doc of YAML.parseAllDocuments(readFileSync(p, 'utf8'))) {
        expect((doc.toJS() as Manifest).kind).toBe('CustomResourceDefinition');
      }
    }
  });

  it('the schema is structural and uses nothing newer than Kubernetes 1.20', () => {
    const problems: string[] = [];
    const JUNCTORS = ['allOf', 'anyOf', 'oneOf', 'not'];
    const walk = (node: Manifest, at: string, inJunctor: boolean): void => {
      if (node['x-kubernetes-validations']) problems.push(`${at}: x-kubernetes-validations (CEL) needs 1.25+`);
      if (node.$ref) problems.push(`${at}: $ref is not allowed`);
      if (inJunctor) {
        for (const k of ['type', 'default', 'description', 'nullable', 'additionalProperties']) {
          if (k in node) problems.push(`${at}: ${k} inside a logical junctor`);
        }
      } else if (!node.type && !node['x-kubernetes-int-or-string'] && !node['x-kubernetes-preserve-unknown-fields']) {
        problems.push(`${at}: no type`);
      }
      if (node.properties && node.additionalProperties) problems.push(`${at}: properties and additionalProperties`);
      if (node.additionalProperties !== undefined && node.type !== 'object') problems.push(`${at}: additionalProperties off a map`);
      for (const [k, child] of Object.entries((node.properties ?? {}) as Record<string, Manifest>)) {
        walk(child, `${at}.${k}`, inJunctor);
      }
      if (node.items) walk(node.items, `${at}[]`, inJunctor);
      if (typeof node.additionalProperties === 'object') walk(node.additionalProperties, `${at}{}`, inJunctor);
      for (const j of JUNCTORS) {
        const branches: Manifest[] = j === 'not' ? (node.not ? [node.not] : []) : (node[j] ?? []);
        for (const b of branches) {
          // Every field named in a junctor must exist in the structural part.
          for (const k of Object.keys(b.properties ?? {})) {
            if (!node.properties?.[k]) problems.push(`${at}.${j}: ${k} is not a declared property`);
          }
          walk(b, `${at}.${j}`, true);
        }
      }
    };
    walk(schema, 'openAPIV3Schema', false);
    // At the root, metadata may only restrict name/generateName.
    expect(Object.keys(schema.properties.metadata.properties ?? {}).every((k) => ['name', 'generateName'].includes(k))).toBe(
      true,
    );
    expect(problems).toEqual([]);
  });

  it('every default is valid against its own schema', () => {
    const check = (node: Manifest, at: string): void => {
      if ('default' in node) {
        const sub = structuredClone(node);
        delete sub.default;
        const ok = makeAjv(false).validate(sub, node.default);
        expect(ok, `default of ${at}`).toBe(true);
      }
      for (const [k, child] of Object.entries((node.properties ?? {}) as Record<string, Manifest>)) check(child, `${at}.${k}`);
    };
    check(schema, 'openAPIV3Schema');
  });

  it('printer columns point at declared fields with matching types', () => {
    const names = version.additionalPrinterColumns.map((c: Manifest) => c.name);
    expect(names).toEqual(['Python', 'Memory', 'CPU', 'Timeout', 'Network', 'Ready', 'Building', 'Digest', 'Image', 'Failed', 'Age']);
    for (const col of version.additionalPrinterColumns as Manifest[]) {
      if (col.jsonPath === '.metadata.creationTimestamp') continue;
      if (col.jsonPath.startsWith('.status.conditions[')) {
        expect(schema.properties.status.properties.conditions.items.properties.status.type).toBe('string');
        continue;
      }
      let node: Manifest | undefined = schema;
      for (const part of String(col.jsonPath).slice(1).split('.')) node = node?.properties?.[part];
      expect(node, col.jsonPath).toBeDefined();
      expect(col.type === 'date' ? 'string' : col.type, col.jsonPath).toBe(node!.type);
    }
  });

  it('spec fields are exactly the service’s JobType fields (less name and digest), defaults equal', () => {
    const service = fromConfig(v.parse(JobTypeConfigSchema, { name: 'x' })) as unknown as Manifest;
    // warmPool (the cluster warm pool's size) and callbackUrl (the webhook default, issue 21) are read
    // by the registry apart from the run's fields.
    const specKeys = Object.keys(schema.properties.spec.properties).filter((k) => k !== 'warmPool' && k !== 'callbackUrl').sort();
    expect(specKeys).toEqual(Object.keys(service).filter((k) => k !== 'name' && k !== 'digest').sort());
    expect(Object.keys(schema.properties.spec.properties.network.properties).sort()).toEqual(['allowedHosts', 'mode']);
    // image and the requests have no CRD default: absent is null in the service (a fraction, for requests).
    const { image, cpuRequest, memoryRequest, name: _n, digest: _d, ...rest } = service;
    expect(image).toBeNull();
    expect(cpuRequest).toBeNull();
    expect(memoryRequest).toBeNull();
    expect(defaulted({})).toEqual(rest);
  });
});

describe('validation', () => {
  const good: [string, Manifest][] = [
    ['an empty spec (all defaults)', {}],
    [
      'every field',
      {
        pythonVersion: '3.12',
        requirements: ['numpy==2.1.0', 'pandas>=2'],
        memoryLimit: '1.5g',
        cpuLimit: 0.5,
        timeout: 120,
        maxProcesses: 128,
        maxFileSize: '1Gi',
        network: { mode: 'bridge', allowedHosts: ['*.example.com', 'api.github.com:443', '192.0.2.10'] },
        image: 'registry.local/sandpod/ml@sha256:' + 'b'.repeat(64),
        env: { MPLBACKEND: 'Agg', EMPTY: '' },
        version: '1.2.0',
      },
    ],
    ['Kubernetes-style memory', { memoryLimit: '512Mi', maxFileSize: '268435456' }],
    ['bridge without hosts', { network: { mode: 'bridge' } }],
    ['requests apart from limits', { cpuLimit: 2, cpuRequest: 0.1, memoryLimit: '1g', memoryRequest: '256Mi' }],
  ];

  it.each(good)('accepts %s', (_what, spec) => {
    expect(errors(jobType(spec))).toEqual([]);
  });

  const bad: [string, Manifest, RegExp][] = [
    ['pythonVersion without minor', { pythonVersion: '3' }, /pythonVersion/],
    ['pythonVersion 2.7', { pythonVersion: '2.7' }, /pythonVersion/],
    ['pythonVersion as a number', { pythonVersion: 3.11 }, /pythonVersion must be string/],
    ['an empty requirement', { requirements: ['numpy', ''] }, /requirements\/1/],
    ['requirements as a string', { requirements: 'numpy' }, /requirements must be array/],
    ['memory with a decimal SI suffix', { memoryLimit: '512MB' }, /memoryLimit/],
    ['memory as words', { memoryLimit: 'lots' }, /memoryLimit/],
    ['zero memory', { memoryLimit: '0' }, /memoryLimit/],
    ['memory as a number', { memoryLimit: 536870912 }, /memoryLimit must be string/],
    ['zero CPU', { cpuLimit: 0 }, /cpuLimit/],
    ['negative CPU', { cpuLimit: -1 }, /cpuLimit/],
    ['CPU as a string', { cpuLimit: '1' }, /cpuLimit must be number/],
    ['zero timeout', { timeout: 0 }, /timeout/],
    ['fractional timeout', { timeout: 1.5 }, /timeout must be integer/],
    ['zero processes', { maxProcesses: 0 }, /maxProcesses/],
    ['bad file size', { maxFileSize: '10 GB' }, /maxFileSize/],
    ['unknown network mode', { network: { mode: 'host' } }, /network\/mode must be equal to one of/],
    ['allowedHosts with network none', { network: { mode: 'none', allowedHosts: ['a.example'] } }, /network/],
    ['allowedHosts without a mode', { network: { allowedHosts: ['a.example'] } }, /network/],
    ['a URL as a host', { network: { mode: 'bridge', allowedHosts: ['https://a.example/x'] } }, /allowedHosts\/0/],
    ['an empty image', { image: '' }, /image/],
    ['env values that are not strings', { env: { A: 1 } }, /env\/A must be string/],
    ['a version with spaces', { version: 'my version' }, /version/],
    ['zero CPU request', { cpuRequest: 0 }, /cpuRequest/],
    ['a memory request as a number', { memoryRequest: 268435456 }, /memoryRequest must be string/],
    ['a memory request with a decimal SI suffix', { memoryRequest: '256MB' }, /memoryRequest/],
  ];

  it.each(bad)('rejects %s', (_what, spec, message) => {
    const errs = errors(jobType(spec));
    expect(errs.length).toBeGreaterThan(0);
    expect(errs.join('\n')).toMatch(message);
  });

  it('rejects a JobType without spec, and a name that is not a DNS label', () => {
    const noSpec = jobType({});
    delete noSpec.spec;
    expect(errors(noSpec).join()).toMatch(/spec/);
    expect(errors(jobType({}, 'Bad_Name')).join()).toMatch(/metadata\/name/);
    expect(errors(jobType({}, 'x'.repeat(64))).join()).toMatch(/metadata\/name/);
  });

  it('status: digest, observedGeneration and conditions in the standard shape', () => {
    const condition = {
      type: 'Ready',
      status: 'True',
      observedGeneration: 2,
      lastTransitionTime: '2026-01-02T03:04:05Z',
      reason: 'ImageBuilt',
      message: 'image built',
    };
    const status = { observedGeneration: 2, imageDigest: `sha256:${'c'.repeat(64)}`, conditions: [condition] };
    expect(errors(jobType({}, 'ok', { status }))).toEqual([]);
    expect(errors(jobType({}, 'ok', { status: { ...status, imageDigest: 'c'.repeat(64) } })).join()).toMatch(/imageDigest/);
    const { reason: _r, ...noReason } = condition;
    expect(errors(jobType({}, 'ok', { status: { conditions: [noReason] } })).join()).toMatch(/reason/);
    expect(errors(jobType({}, 'ok', { status: { conditions: [{ ...condition, status: 'yes' }] } })).join()).toMatch(
      /status/,
    );
  });

  it('every memory value the CRD accepts, the service accepts too (same units, binary)', () => {
    const pattern = new RegExp(schema.properties.spec.properties.memoryLimit.pattern);
    for (const q of ['512m', '1g', '1Gi', '100k', '1.5g', '268435456', '10b', '2G', '64Mi']) {
      expect(pattern.test(q), q).toBe(true);
      expect(v.safeParse(MemorySchema, q).success, q).toBe(true);
      expect(parseMemory(q), q).toBeGreaterThan(0);
    }
    expect(parseMemory('512m')).toBe(parseMemory('512Mi'));
  });
});

describeRendered('the chart’s sample JobTypes', () => {
  let samples: Manifest[];
  beforeAll(() => {
    prepareRenderer();
    samples = byKind(renderOk(withDb()), 'JobType');
  }, TOOL_BUILD_TIMEOUT_MS);

  it('are the three built-ins and valid against the CRD', () => {
    expect(samples.map((s) => s.metadata.name).sort()).toEqual(['data', 'default', 'http']);
    for (const s of samples) expect(errors(s), s.metadata.name).toEqual([]);
  });

  it('resolve to the same job types as the service’s built-ins (src/config.ts BUILTIN_JOB_TYPES)', () => {
    for (const builtin of BUILTIN_JOB_TYPES) {
      const sample = samples.find((s) => s.metadata.name === builtin.name)!;
      expect(serviceView(sample.metadata.name, sample.spec), builtin.name).toEqual(
        fromConfig(v.parse(JobTypeConfigSchema, builtin)),
      );
    }
  });
});
