/** The reading of a collector's attach stream (runs/collector-stream.ts), fed in every split. */
import { describe, expect, it } from 'vitest';
import { CollectorStream } from '../../../../src/runtime/kubernetes/runs/collector-stream.ts';

function frame(data: string): Buffer {
  const b = Buffer.from(data, 'binary');
  const len = Buffer.alloc(4);
  len.writeUInt32BE(b.length);
  return Buffer.concat([len, b]);
}

/** What the stream reports, as one list of events. */
function read(chunks: Buffer[]): string[] {
  const out: string[] = [];
  let data = '';
  const s = new CollectorStream({
    line: (t) => out.push(`line ${t}`),
    outputsStart: () => out.push('start'),
    outputsData: (c) => (data += c.toString('binary')),
    outputsEnd: () => {
      out.push(`data ${data}`);
      out.push('end');
    },
  });
  for (const c of chunks) s.feed(c);
  return out;
}

const whole = Buffer.concat([
  Buffer.from('ready\nexecution\noutputs\n'),
  frame('tar\n bytes\x00\x01'),
  frame('more'),
  Buffer.alloc(4),
  Buffer.from('outputs-end ok\ndone 0\n'),
]);
const want = ['line ready', 'line execution', 'start', 'data tar\n bytes\x00\x01more', 'end', 'line outputs-end ok', 'line done 0'];

describe('CollectorStream', () => {
  it.each([
    ['in one chunk', [whole]],
    ['byte by byte', [...whole].map((b) => Buffer.from([b]))],
    ['in chunks of 3', Array.from({ length: Math.ceil(whole.length / 3) }, (_, i) => whole.subarray(i * 3, i * 3 + 3))],
    ['split inside a length prefix', [whole.subarray(0, 26), whole.subarray(26)]],
  ])('lines, then the archive frames, then lines again: %s', (_n, chunks) => {
    expect(read(chunks)).toEqual(want);
  });

  it.each([
    ['no outputs (an older collector): lines only', [Buffer.from('execution\ndone 3\n')], ['line execution', 'line done 3']],
    ['an empty archive', [Buffer.concat([Buffer.from('outputs\n'), Buffer.alloc(4), Buffer.from('outputs-end failed no such dir\n')])], ['start', 'data ', 'end', 'line outputs-end failed no such dir']],
    ['a line of 5000 bytes without newline is dropped', [Buffer.from('x'.repeat(5000)), Buffer.from('\ndone 0\n')], ['line ', 'line done 0']],
  ])('%s', (_n, chunks, events) => {
    expect(read(chunks)).toEqual(events);
  });
});
