/** The runner's `--stream-frames` output as the local runtime parses it (proc.ts FrameReader). */
import { describe, expect, it } from 'vitest';
import { FrameReader } from '../../../../../src/runtime/local/runs/proc.ts';

function parse(parts: (string | Buffer)[]) {
  const out: { stream: string; text: string }[] = [];
  const control: string[] = [];
  const r = new FrameReader((stream, b) => {
    const last = out.at(-1);
    if (last && last.stream === stream) last.text += b.toString('latin1');
    else out.push({ stream, text: b.toString('latin1') });
  });
  for (const p of parts) r.feed(typeof p === 'string' ? Buffer.from(p, 'latin1') : p, (l) => control.push(l));
  return { out, control };
}

describe('FrameReader', () => {
  it.each([
    ['one frame', ['o 3\nabc'], [{ stream: 'stdout', text: 'abc' }], []],
    ['frames of both streams and the done line', ['o 2\nhie 3\nerrdone 0\n'], [{ stream: 'stdout', text: 'hi' }, { stream: 'stderr', text: 'err' }], ['done 0\n']],
    ['a frame split across reads, header too', ['o', ' 5\nab', 'c', 'de', 'done 1\n'], [{ stream: 'stdout', text: 'abcde' }], ['done 1\n']],
    ['program output that looks like a control line stays output', ['o 7\ndone 0\n', 'o 10\nexecution\n'], [{ stream: 'stdout', text: 'done 0\nexecution\n' }], []],
    ['an empty frame', ['o 0\ne 1\nx'], [{ stream: 'stderr', text: 'x' }], []],
    // A held sandbox's done line carries the report, split across reads like anything else.
    ['a done line with its report, split across reads', ['o 2\nhi', 'done 0 {"exit_code":0,', `"exception_message":"${'é'.repeat(4000)}"}\n`], [{ stream: 'stdout', text: 'hi' }], [`done 0 {"exit_code":0,"exception_message":"${'é'.repeat(4000)}"}\n`]],
  ])('%s', (_name, parts, out, control) => {
    const r = parse(parts as string[]);
    expect(r.out).toEqual(out);
    expect(r.control).toEqual(control);
  });
});
