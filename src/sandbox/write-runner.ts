/**
 * `node --import tsx src/sandbox/write-runner.ts OUT`: writes the joined runner (paths.ts) to OUT, for
 * the build (`dist/sandbox/runner.py`), the executor image (`src/sandbox/Dockerfile`) and
 * `kcluster image python … --runner OUT`.
 */
import { writeRunner } from './paths.ts';

const out = process.argv[2];
if (!out) {
  process.stderr.write('usage: write-runner.ts OUT\n');
  process.exit(2);
}
writeRunner(out);
