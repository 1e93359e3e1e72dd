/**
 * Imports between the Kubernetes layers point one way: src/kube (the client layer) knows nothing of
 * runs or job types; jobtypes/ builds on src/kube, never on the Kubernetes runtime; both reach the
 * client layer through its index only.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const SRC = fileURLToPath(new URL('../../../../src/', import.meta.url));

/** Every `.ts` file under a src/ folder, with the src-relative paths of what it imports. */
function importsUnder(dir: string): { file: string; imports: string[] }[] {
  const root = path.join(SRC, dir);
  return readdirSync(root, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts'))
    .map((e) => {
      const file = path.join(e.parentPath, e.name);
      const text = readFileSync(file, 'utf8');
      const specs = [...text.matchAll(/(?:^|\n)\s*(?:import|export)\b[^'"]*?from\s+'([^']+)'|import\(\s*'([^']+)'\s*\)/g)].map((m) => m[1] ?? m[2]!);
      const imports = specs.filter((s) => s.startsWith('.')).map((s) => path.relative(SRC, path.resolve(path.dirname(file), s)));
      return { file: path.relative(SRC, file), imports };
    });
}

describe('Kubernetes layering', () => {
  it('finds the files it checks', () => {
    expect(importsUnder('kube').map((f) => f.file)).toContain('kube/informer.ts');
    expect(importsUnder('jobtypes').find((f) => f.file === 'jobtypes/kubernetes-registry.ts')?.imports).toContain('kube/index.ts');
  });

  it('src/kube imports nothing from runtime/, jobtypes/, executions/ or api/', () => {
    const up = importsUnder('kube').flatMap((f) => f.imports.filter((i) => /^(runtime|jobtypes|executions|api)\//.test(i)).map((i) => `${f.file} → ${i}`));
    expect(up).toEqual([]);
  });

  it('jobtypes/ imports nothing from runtime/kubernetes/', () => {
    const bad = importsUnder('jobtypes').flatMap((f) => f.imports.filter((i) => i.startsWith('runtime/kubernetes/')).map((i) => `${f.file} → ${i}`));
    expect(bad).toEqual([]);
  });

  it('runtime/kubernetes/ and jobtypes/ use the client layer through src/kube/index.ts', () => {
    const deep = [...importsUnder('runtime/kubernetes'), ...importsUnder('jobtypes')].flatMap((f) =>
      f.imports.filter((i) => i.startsWith('kube/') && i !== 'kube/index.ts').map((i) => `${f.file} → ${i}`),
    );
    expect(deep).toEqual([]);
  });
});
