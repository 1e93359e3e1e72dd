/** Runs once before the suite: nothing yet besides making sure the scratch root exists. */
import { mkdirSync } from 'node:fs';
export default function setup(): void {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
}
