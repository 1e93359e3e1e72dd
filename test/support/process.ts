/** Runs the real service as a child process (`tsx src/main.ts`) for restart and multi-process tests. */
import { spawn, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import path from 'node:path';

const ROOT = path.resolve(import.meta.dirname, '../..');

/** A free TCP port on loopback. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const addr = s.address();
      s.close(() => (typeof addr === 'object' && addr ? resolve(addr.port) : reject(new Error('no port'))));
    });
  });
}

function withInherited(stdio: ('ignore' | 'pipe')[], extra: Record<number, number>): ('ignore' | 'pipe' | number)[] {
  const out: ('ignore' | 'pipe' | number)[] = [...stdio];
  for (const [child, fd] of Object.entries(extra)) {
    while (out.length <= Number(child)) out.push('ignore');
    out[Number(child)] = fd;
  }
  return out;
}

/** A service process. */
export interface ServiceProcess {
  url: string;
  child: ChildProcess;
  logs: () => string;
  exited: Promise<number | null>;
  kill(signal: NodeJS.Signals): void;
}

/** Starts `src/main.ts` with a config file and waits until `/readyz` answers. */
export async function startServiceProcess(opts: {
  databaseUrl: string;
  workspace: string;
  config?: Record<string, unknown>;
  name: string;
  /** fds the service inherits without close-on-exec, as from a harness: child fd → this process's fd. */
  inheritFds?: Record<number, number>;
  /** More environment for the service (e.g. KUBECONFIG pointing at the fake API server). */
  env?: Record<string, string>;
}): Promise<ServiceProcess> {
  const port = await freePort();
  const cfgFile = path.join(opts.workspace, `${opts.name}.json`);
  writeFileSync(cfgFile, JSON.stringify({ host: '127.0.0.1', sandbox_engine: 'bubblewrap', log_level: 'info', ...opts.config }));
  // `node --import tsx` (not the tsx CLI, which runs the service in a child process): signals reach the service itself.
  const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], {
    cwd: ROOT,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, SVC_CONFIG: cfgFile, SVC_DATABASE_URL: opts.databaseUrl, SVC_WORKSPACE: opts.workspace, PORT: String(port), ...opts.env },
    stdio: withInherited(['ignore', 'pipe', 'pipe'], opts.inheritFds ?? {}),
  });
  let out = '';
  child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`service ${opts.name} exited early:\n${out}`);
    try {
      const res = await fetch(`${url}/readyz`);
      if (res.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`service ${opts.name} did not become ready:\n${out}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return { url, child, logs: () => out, exited, kill: (s) => child.kill(s) };
}
