/**
 * Hostile programs through the whole service (HTTP → record → classification), on both real
 * engines: each ends with the right status and the service stays healthy. The sandbox suite
 * (test/integration/sandbox) checks the same programs at the runtime level in more detail.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;

describe.each(['bubblewrap', 'gvisor'] as const)('hostile programs on %s', (engine) => {
  let svc: TestService;
  beforeAll(async () => {
    svc = await startTestService({ sandbox_engine: engine });
  });
  afterAll(async () => {
    await svc?.close();
  });

  async function run(code: string, extra: J = {}): Promise<J> {
    const res = await svc.post('/execute', { code, ...extra });
    expect(res.status).toBe(200);
    const body = (await res.json()) as J;
    return (await (await svc.get(`/executions/${body.execution_id}?view=full`)).json()) as J;
  }

  afterEach(async () => {
    const h = await svc.get('/health');
    expect(h.status).toBe(200);
    expect(((await h.json()) as J).status).toBe('healthy');
  });

  it('network access fails', async () => {
    const r = await run('import socket\nsocket.create_connection(("1.1.1.1", 80), timeout=3)');
    expect(r.status).toBe('failed');
    expect(['network_error', 'network_timeout', 'os_error']).toContain(r.error.type);
  });

  it('writes outside /output and /tmp fail', async () => {
    const r = await run('open("/usr/evil", "w").write("x")');
    expect(r.status).toBe('failed');
    expect(['os_error', 'permission']).toContain(r.error.type);
    expect(r.stderr).toMatch(/Read-only file system|Permission denied/);
  });

  it("the service's environment is not readable", async () => {
    process.env.SANDPOD_HOSTILE_CANARY = 'secret-canary';
    const r = await run('import os, glob\nfor p in glob.glob("/proc/*/environ"):\n  try: print(open(p,"rb").read())\n  except Exception: pass\nprint(dict(os.environ))');
    expect(r.status).toBe('succeeded');
    expect(r.stdout).not.toContain('secret-canary');
  });

  it('a fork bomb ends (process limit) without hurting the service', async () => {
    const r = await run('import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass', { timeout: 5 });
    expect(['failed', 'timeout']).toContain(r.status);
  });

  it('a memory bomb ends as oom with exit 137', async () => {
    const r = await run('x = bytearray(3 * 1024 ** 3)\nprint(len(x))');
    expect(r).toMatchObject({ status: 'oom', exit_code: 137, error: { type: 'oom' } });
  });

  it('a 2 GB file stops at the file-size limit', async () => {
    const r = await run('f = open("/output/big.bin", "wb")\nfor _ in range(2048):\n    f.write(b"x" * 1048576)');
    expect(r.status).not.toBe('succeeded');
    expect(r.stderr + JSON.stringify(r.error)).toMatch(/File too large|oom|killed/i);
  });

  it('killing the runner ends the run as killed (gVisor) or cannot be done (bubblewrap: the runner is PID 1)', async () => {
    const r = await run('import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(1)\nprint("survived")');
    if (engine === 'gvisor') {
      expect(r.status).toBe('failed');
      expect(r.error.type).toBe('killed');
    } else {
      // bwrap --as-pid-1 (issue #9): the program's parent is PID 1 of the sandbox, which Linux does not
      // let a SIGKILL from inside the namespace end; the program carries on.
      expect(r.status).toBe('succeeded');
      expect(r.stdout).toBe('survived\n');
    }
  });
});
