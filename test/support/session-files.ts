/**
 * The files API of a session (issue 19), checked the same way on every runtime: the local runtime
 * (test/integration/api/sessions.test.ts), the Kubernetes runtime against the fake API server
 * (test/integration/kubernetes/sessions.test.ts) and on a real cluster over HTTP (test/e2e/agents.test.ts).
 * One body of assertions, so a rule that holds on one runtime is asserted on all of them.
 *
 * What it checks: PUT (201 new, 200 replaced, sha256), GET (ETag, 304, HEAD), list, DELETE, the size
 * cap both ways, binary bytes intact; traversal refused on every route (`..`, absolute names, encoded
 * slashes and backslashes, NUL, newlines); links, directories and FIFOs a cell planted are never
 * followed (GET, HEAD and PUT are 409; the list shows regular files only; DELETE removes the link
 * itself, never its target, and a directory is 409); after the session ends, 409.
 */
import { expect } from 'vitest';

/** One HTTP request to the service: `path` as sent (a client may normalise `..` away first). */
export type Send = (method: string, path: string, body?: string | Buffer, headers?: Record<string, string>) => Promise<Response>;
/** Runs one cell of the session; its answer as `POST /sessions/{id}/execute` gives it. */
export type ExecCell = (code: string) => Promise<Record<string, any>>;

const octet = { 'content-type': 'application/octet-stream' };

/** What differs between runtimes. */
export interface FilesApiOptions {
  /**
   * How a FIFO a cell made looks to the files API: `refused` (409: seen, not a regular file; local
   * runtime, runc pods), or `unseen` (404, like no file: under gVisor a named pipe lives in the pod
   * sandbox's kernel, which another container's view of the shared workspace, the collector's, does
   * not show). Default `refused`.
   */
  fifo?: 'refused' | 'unseen';
}

/**
 * The whole files round trip on a fresh session `sessionId` (with nothing in its workspace yet);
 * ends by closing the session. `maxArtifactBytes` is the service's `max_artifact_bytes`.
 */
export async function expectSessionFilesApi(send: Send, sessionId: string, exec: ExecCell, maxArtifactBytes: number, opts: FilesApiOptions = {}): Promise<void> {
  const base = `/sessions/${sessionId}/files`;
  const put = (name: string, body: string | Buffer) => send('PUT', `${base}/${name}`, body, octet);
  const json = async (res: Response) => (await res.json()) as Record<string, any>;

  expect((await put('data.csv', 'a,b\n1,2\n')).status).toBe(201);
  const replaced = await put('data.csv', 'a,b\n3,4\n');
  expect(replaced.status).toBe(200);
  expect(await json(replaced)).toMatchObject({ name: 'data.csv', size_bytes: 8, sha256: expect.stringMatching(/^[0-9a-f]{64}$/) });
  // What a cell plants: a link out to /etc/passwd, a link to the root directory, a directory, a FIFO.
  const c = await exec('print(open("data.csv").read().split()[1])\nopen("out.txt", "w").write("from cell")\nimport os\nos.symlink("/etc/passwd", "link")\nos.symlink("/", "up")\nos.mkdir("sub")\nos.mkfifo("fifo")');
  expect(c, JSON.stringify(c)).toMatchObject({ success: true, stdout: '3,4\n' });

  const got = await send('GET', `${base}/out.txt`);
  expect(got.status).toBe(200);
  expect(await got.text()).toBe('from cell');
  const etag = got.headers.get('etag')!;
  expect(etag).toMatch(/^"[0-9a-f]{64}"$/);
  expect((await send('GET', `${base}/out.txt`, undefined, { 'if-none-match': etag })).status).toBe(304);
  const head = await send('HEAD', `${base}/out.txt`);
  expect(head.status).toBe(200);
  expect(head.headers.get('content-length')).toBe('9');
  expect(head.headers.get('etag')).toBe(etag);

  // The list: regular files at the top only; never a link's target, a directory, a FIFO.
  const list = await send('GET', base);
  expect(list.status).toBe(200);
  expect((await json(list)).items.map((f: any) => f.name)).toEqual(['data.csv', 'out.txt']);
  for (const name of ['link', 'up', 'sub', ...(opts.fifo === 'unseen' ? [] : ['fifo'])]) {
    expect((await send('GET', `${base}/${name}`)).status, `GET ${name}`).toBe(409);
    expect((await send('HEAD', `${base}/${name}`)).status, `HEAD ${name}`).toBe(409);
    expect((await put(name, 'overwritten')).status, `PUT ${name}`).toBe(409);
  }
  if (opts.fifo === 'unseen') {
    expect((await send('GET', `${base}/fifo`)).status, 'GET fifo').toBe(404);
    expect((await send('HEAD', `${base}/fifo`)).status, 'HEAD fifo').toBe(404);
  }

  // Names a URL parser resolves away ('..') never reach a file route: some 4xx. The rest reach it: 400.
  for (const bad of ['..', '%2E%2E', '.', '../../../etc/passwd', '../files/out.txt/..']) {
    for (const method of ['GET', 'HEAD', 'PUT', 'DELETE']) {
      const res = await send(method, `${base}/${bad}`, method === 'PUT' ? 'x' : undefined, method === 'PUT' ? octet : {});
      expect(res.status, `${method} ${bad}`).toBeGreaterThanOrEqual(400);
      expect(res.status, `${method} ${bad}`).toBeLessThan(500);
    }
  }
  for (const bad of ['..%2F..%2Fetc%2Fpasswd', '%2Fetc%2Fpasswd', 'up%2Fetc%2Fpasswd', 'link%2F', 'a%5Cb', '..%5C..%5Cetc', 'a%00b', 'a%0Ab']) {
    for (const method of ['GET', 'HEAD', 'PUT', 'DELETE']) {
      const res = await send(method, `${base}/${bad}`, method === 'PUT' ? 'x' : undefined, method === 'PUT' ? octet : {});
      expect(res.status, `${method} ${bad}`).toBe(400);
    }
  }
  // The list route takes no name: what a client appends to it changes nothing.
  for (const q of ['?path=..', '?name=%2Fetc', '?prefix=up']) {
    const res = await send('GET', `${base}${q}`);
    expect(res.status, q).toBe(200);
    expect((await json(res)).items.map((f: any) => f.name), q).toEqual(['data.csv', 'out.txt']);
  }

  // Sizes: over max_artifact_bytes both ways (the write refused; a file a cell made, refused when read).
  expect((await put('big.bin', Buffer.alloc(maxArtifactBytes + 1))).status).toBe(413);
  expect(await exec(`open("huge.bin", "wb").write(b"x" * ${maxArtifactBytes + 1})`)).toMatchObject({ success: true });
  expect((await send('GET', `${base}/huge.bin`)).status).toBe(413);
  const bin = Buffer.from(Array.from({ length: 300_000 }, (_, i) => i % 251));
  expect((await put('blob.bin', bin)).status).toBe(201);
  expect(Buffer.from(await (await send('GET', `${base}/blob.bin`)).arrayBuffer()).equals(bin)).toBe(true);

  // DELETE: a file; a link itself (its target stays); a directory is 409; twice is 404.
  expect((await send('DELETE', `${base}/out.txt`)).status).toBe(204);
  expect((await send('GET', `${base}/out.txt`)).status).toBe(404);
  expect((await send('DELETE', `${base}/out.txt`)).status).toBe(404);
  expect((await send('DELETE', `${base}/link`)).status).toBe(204);
  expect((await send('DELETE', `${base}/sub`)).status).toBe(409);
  const after = await exec('import os\nprint(os.path.lexists("link"), os.path.isfile("/etc/passwd"), "overwritten" in open("/etc/passwd").read(), os.path.isdir("sub"), sorted(os.listdir("/"))[:1] != [])');
  expect(after).toMatchObject({ success: true, stdout: 'False True False True True\n' });

  const closed = await send('DELETE', `/sessions/${sessionId}`);
  expect(closed.status).toBe(200);
  expect((await send('GET', `${base}/data.csv`)).status).toBe(409);
  expect((await put('late.txt', 'x')).status).toBe(409);
  expect((await send('GET', base)).status).toBe(409);
}
