import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { claimWorkspace, instanceRoot, releaseWorkspace } from '../../../../src/runtime/local/workspace.ts';

function tmp(): string {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  return mkdtempSync(path.join('/tmp/sandpod-test', 'ws-'));
}

describe('workspace claim', () => {
  it('derives one instance directory per workspace path', () => {
    const a = instanceRoot({ workspace: '/srv/a' });
    expect(a.root).toBe(path.join('/srv/a', 'sandbox', a.instance));
    expect(instanceRoot({ workspace: '/srv/a/' }).instance).toBe(a.instance);
    expect(instanceRoot({ workspace: '/srv/b' }).instance).not.toBe(a.instance);
  });

  it('claims, is re-entrant for this process, and releases only its own claim', () => {
    const root = tmp();
    claimWorkspace(root, 'ws');
    expect(readFileSync(path.join(root, 'owner.pid'), 'utf8')).toBe(String(process.pid));
    claimWorkspace(root, 'ws');
    releaseWorkspace(root);
    expect(existsSync(path.join(root, 'owner.pid'))).toBe(false);
    writeFileSync(path.join(root, 'owner.pid'), '1');
    releaseWorkspace(root);
    expect(existsSync(path.join(root, 'owner.pid'))).toBe(true);
  });

  it('refuses a workspace a live process holds and takes over a dead one', () => {
    const root = tmp();
    writeFileSync(path.join(root, 'owner.pid'), '1');
    expect(() => claimWorkspace(root, 'ws')).toThrow(/in use by another sandpod process \(pid 1\)/);
    // Past pid_max: no such process.
    writeFileSync(path.join(root, 'owner.pid'), '99999999');
    claimWorkspace(root, 'ws');
    expect(readFileSync(path.join(root, 'owner.pid'), 'utf8')).toBe(String(process.pid));
  });
});
