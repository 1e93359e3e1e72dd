/**
 * `node --import tsx src/runtime/local/write-spawner.ts OUT`: writes the joined spawner (spawner.ts)
 * to OUT, for the build (`dist/runtime/local/spawner.py`).
 */
import { writeParts } from '../../util/python-parts.ts';
import { SPAWNER_PARTS } from './spawner.ts';

const out = process.argv[2];
if (!out) {
  process.stderr.write('usage: write-spawner.ts OUT\n');
  process.exit(2);
}
writeParts(SPAWNER_PARTS, out);
