/**
 * Load generator for the acceptance benchmark, run as its own process so it does not share the
 * service's event loop: keep-alive `node:http` clients POSTing one body in a closed loop.
 * Usage: load.ts URL CONCURRENCY SECONDS WARMUP_SECONDS; prints {"ok":N,"other":N,"seconds":S,"warmup_ok":N}
 * (ok and other count the measured seconds; warmup_ok the 202s before them).
 */
import http from 'node:http';

const [url, concurrencyArg, secondsArg, warmupArg] = process.argv.slice(2);
const target = new URL(url!);
const concurrency = Number(concurrencyArg ?? 32);
const seconds = Number(secondsArg ?? 5);
const warmup = Number(warmupArg ?? 1);
const body = Buffer.from(JSON.stringify({ code: 'print(1)' }));
const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });

function once(): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: target.hostname, port: target.port, path: target.pathname, method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': body.length } },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

async function loop(until: number, count: { ok: number; other: number }): Promise<void> {
  while (performance.now() < until) {
    const status = await once();
    status === 202 ? count.ok++ : count.other++;
  }
}

const warmEnd = performance.now() + warmup * 1000;
const warm = { ok: 0, other: 0 };
await Promise.all(Array.from({ length: concurrency }, () => loop(warmEnd, warm)));
const count = { ok: 0, other: 0 };
const t0 = performance.now();
await Promise.all(Array.from({ length: concurrency }, () => loop(t0 + seconds * 1000, count)));
const elapsed = (performance.now() - t0) / 1000;
process.stdout.write(`${JSON.stringify({ ...count, seconds: elapsed, warmup_ok: warm.ok })}\n`);
agent.destroy();
