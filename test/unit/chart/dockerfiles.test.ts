/**
 * The two images (no Docker engine here, so nothing is built): their Dockerfiles copy files that
 * exist and that the build context does not ignore, run what package.json runs, and use the uid/gid
 * the chart's securityContext (and the sandbox's uid 1000) expect. test/integration/build checks
 * that what the service image runs (`npm run build`, then `node dist/main.js`) works.
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import YAML from 'yaml';
import { describe, expect, it } from 'vitest';
import { CHART_DIR, REPO_ROOT } from '../../support/chart.ts';

interface Instr {
  op: string;
  args: string;
}

/** Dockerfile instructions (continuations joined, comments dropped), of the last stage when `lastStage`. */
function parseDockerfile(file: string, lastStage = false): Instr[] {
  const text = readFileSync(file, 'utf8').replace(/\\\n/g, ' ');
  const all = text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'))
    .map((l) => {
      const [op, ...rest] = l.split(/\s+/);
      return { op: op!.toUpperCase(), args: rest.join(' ') };
    });
  if (!lastStage) return all;
  const from = all.map((i) => i.op).lastIndexOf('FROM');
  return all.slice(from);
}

/** Source paths of the COPY instructions that copy from the build context (not --from=stage). */
function copySources(instrs: Instr[]): string[] {
  return instrs
    .filter((i) => i.op === 'COPY' && !/--from=/.test(i.args))
    .flatMap((i) => {
      const words = i.args.split(/\s+/).filter((w) => !w.startsWith('--'));
      return words.slice(0, -1);
    });
}

function execForm(instrs: Instr[], op: string): string[] {
  const i = instrs.filter((x) => x.op === op).at(-1);
  expect(i, `${op} instruction`).toBeDefined();
  return JSON.parse(i!.args) as string[];
}

/** .dockerignore semantics (last matching rule wins; a rule matches a path or any of its parents). */
function ignored(patterns: string[], file: string): boolean {
  let result = false;
  const parts = file.split('/');
  for (const raw of patterns) {
    const negate = raw.startsWith('!');
    const pat = path.posix.normalize((negate ? raw.slice(1) : raw).replace(/\/$/, ''));
    const re = new RegExp(
      '^' +
        pat
          .split('**')
          .map((s) => s.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '[^/]*').replace(/\?/g, '[^/]'))
          .join('.*') +
        '$',
    );
    const matches = parts.some((_, n) => re.test(parts.slice(0, n + 1).join('/')));
    if (matches) result = !negate;
  }
  return result;
}

const chartValues = YAML.parse(readFileSync(path.join(CHART_DIR, 'values.yaml'), 'utf8'));
const pkg = JSON.parse(readFileSync(path.join(REPO_ROOT, 'package.json'), 'utf8'));

describe('service image (Dockerfile)', () => {
  const file = path.join(REPO_ROOT, 'Dockerfile');
  const instrs = parseDockerfile(file);
  const final = parseDockerfile(file, true);
  const ignore = readFileSync(path.join(REPO_ROOT, '.dockerignore'), 'utf8')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'));
  /** Stage name → its instructions. */
  const stages = new Map<string, Instr[]>();
  for (const i of instrs) {
    if (i.op === 'FROM') stages.set(i.args.split(/\s+as\s+/i)[1] ?? '', []);
    [...stages.values()].at(-1)?.push(i);
  }

  it('copies files that exist and that .dockerignore keeps in the context', () => {
    const sources = copySources(instrs);
    expect(sources).toEqual(expect.arrayContaining(['package.json', 'package-lock.json', 'tsconfig.json', 'tsconfig.build.json', 'src']));
    for (const src of sources) {
      expect(existsSync(path.join(REPO_ROOT, src)), src).toBe(true);
      expect(ignored(ignore, src), `${src} must not be ignored`).toBe(false);
    }
    for (const f of ['src/main.ts', 'src/store/migrate.ts', 'src/sandbox/runner/50-main.py', 'src/sandbox/paths.ts', 'src/runtime/local/spawner/20-main.py']) expect(ignored(ignore, f), f).toBe(false);
    for (const f of ['node_modules/x/index.js', '.git/HEAD', 'dist/main.js', 'test/unit/x.test.ts', 'charts/sandpod/values.yaml']) {
      expect(ignored(ignore, f), f).toBe(true);
    }
  });

  it('builds dist/ with `npm run build` in a stage of its own; the final stage gets dist/ and production dependencies only', () => {
    const build = stages.get('build') ?? [];
    expect(build.some((i) => i.op === 'RUN' && i.args === 'npm run build')).toBe(true);
    expect(pkg.scripts.build).toContain('tsconfig.build.json');
    const deps = stages.get('deps') ?? [];
    expect(deps.some((i) => i.op === 'RUN' && /npm ci\b.*--omit=dev/.test(i.args))).toBe(true);
    const fromStages = final.filter((i) => i.op === 'COPY' && /--from=/.test(i.args)).map((i) => i.args);
    expect(fromStages).toEqual(['--from=deps /app/node_modules ./node_modules', '--from=build /app/dist ./dist']);
    // No sources and no TypeScript toolchain in the image.
    expect(copySources(final)).toEqual(['package.json']);
  });

  it('runs dist/main.js (package.json "start") directly with node, not through npm or tsx', () => {
    const cmd = execForm(final, 'CMD');
    expect(cmd).toEqual(['node', 'dist/main.js']);
    expect(pkg.scripts.start).toBe(cmd.join(' '));
  });

  it('has the `migrate` script the chart’s hook runs, compiled from an existing file', () => {
    expect(pkg.scripts.migrate).toBe('node dist/store/migrate.js');
    expect(existsSync(path.join(REPO_ROOT, 'src/store/migrate.ts'))).toBe(true);
  });

  it('is Node 20 and runs as the uid/gid of the chart’s securityContext', () => {
    expect(instrs.find((i) => i.op === 'ARG' && i.args.startsWith('NODE_IMAGE='))?.args).toBe('NODE_IMAGE=node:20-slim');
    expect(pkg.engines.node).toBe('>=20.19 <25');
    const user = final.filter((i) => i.op === 'USER').at(-1)?.args;
    expect(user).toBe(`${chartValues.podSecurityContext.runAsUser}:${chartValues.podSecurityContext.runAsGroup}`);
    expect(user).toBe(`${chartValues.securityContext.runAsUser}:${chartValues.securityContext.runAsGroup}`);
    expect(final.find((i) => i.op === 'EXPOSE')?.args).toBe('8000');
  });
});

describe('executor image (src/sandbox/Dockerfile)', () => {
  const dir = path.join(REPO_ROOT, 'src/sandbox');
  const instrs = parseDockerfile(path.join(dir, 'Dockerfile'));

  it('is python:3.11-slim (pip included) and copies runner.py, which the build writes into its context, to /sandpod/runner.py', () => {
    expect(instrs[0]).toEqual({ op: 'FROM', args: 'python:3.11-slim' });
    expect(copySources(instrs)).toEqual(['runner.py']);
    // The context is dist/sandbox: `npm run build` joins the runner's parts into dist/sandbox/runner.py.
    expect(readFileSync(path.join(dir, 'Dockerfile'), 'utf8')).toMatch(/-f src\/sandbox\/Dockerfile dist\/sandbox/);
    const build = JSON.parse(readFileSync(path.join(REPO_ROOT, 'package.json'), 'utf8')).scripts.build as string;
    expect(build).toContain('src/sandbox/write-runner.ts dist/sandbox/runner.py');
    expect(existsSync(path.join(dir, 'runner', '50-main.py'))).toBe(true);
    const copy = instrs.find((i) => i.op === 'COPY')!;
    expect(copy.args.split(/\s+/).at(-1)).toBe('/sandpod/runner.py');
    expect(execForm(instrs, 'CMD')).toEqual(['python3', '/sandpod/runner.py']);
    expect(instrs.some((i) => i.op === 'RUN' && /pip --version/.test(i.args))).toBe(true);
  });

  it('creates the uid/gid 1000 user and runs as it (the run contract’s uid, the chart’s too)', () => {
    const run = instrs.filter((i) => i.op === 'RUN').map((i) => i.args).join(' ');
    expect(run).toMatch(/groupadd --gid 1000 /);
    expect(run).toMatch(/useradd --uid 1000 --gid 1000 /);
    expect(instrs.filter((i) => i.op === 'USER').at(-1)?.args).toBe('1000:1000');
    expect(chartValues.podSecurityContext.runAsUser).toBe(1000);
  });

  it('has the run layout as mount points and works with a read-only root (no .pyc, HOME=/tmp)', () => {
    const run = instrs.filter((i) => i.op === 'RUN').map((i) => i.args).join(' ');
    for (const d of ['/code', '/input', '/output', '/deps', '/control', '/sandpod']) expect(run).toContain(d);
    const env = instrs.filter((i) => i.op === 'ENV').map((i) => i.args).join(' ');
    expect(env).toContain('PYTHONDONTWRITEBYTECODE=1');
    expect(env).toContain('HOME=/tmp');
  });
});
