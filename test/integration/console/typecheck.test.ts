/**
 * The console's browser code is its own TypeScript project (DOM types, preact JSX), which the
 * service's `tsc -p .` does not see and esbuild does not check: the suite checks it, so CI does.
 */
import path from 'node:path';
import ts from 'typescript';
import { expect, it } from 'vitest';

it('src/console/web type-checks under its tsconfig (strict, no unused names)', () => {
  const configPath = path.resolve('src/console/web/tsconfig.json');
  const parsed = ts.getParsedCommandLineOfConfigFile(configPath, {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: (d) => { throw new Error(ts.flattenDiagnosticMessageText(d.messageText, '\n')); } });
  expect(parsed?.options.strict).toBe(true);
  expect(parsed!.fileNames.some((f) => f.endsWith('main.tsx'))).toBe(true);
  const program = ts.createProgram(parsed!.fileNames, parsed!.options);
  const problems = ts.getPreEmitDiagnostics(program).map((d) => {
    const where = d.file && d.start !== undefined ? `${path.relative('.', d.file.fileName)}:${d.file.getLineAndCharacterOfPosition(d.start).line + 1}` : '';
    return `${where} ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`;
  });
  expect(problems).toEqual([]);
});
