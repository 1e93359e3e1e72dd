#!/usr/bin/env node
// The `sandpod` command (package.json `bin`). Built (`npm run build` copies this file to dist/cli/
// next to the compiled main.js): runs that. From the sources (`npx sandpod` in the repository, or a
// global install of the repository without a build): loads main.ts through tsx, a runtime dependency.
import { existsSync } from 'node:fs';

const built = new URL('./main.js', import.meta.url);
let cli;
if (existsSync(built)) {
  cli = await import(built.href);
} else {
  const { tsImport } = await import('tsx/esm/api');
  cli = await tsImport('./main.ts', import.meta.url);
}
await cli.main(process.argv);
