/**
 * The session channel (session/session-channel.ts) over a stand-in attach: what came before the
 * sync line of this attach is never read as frames (an attach opens mid-stream), answers are matched
 * to requests in order with their data, and frames that come before a handler is set are kept.
 */
import { describe, expect, it } from 'vitest';
import type { AttachSession } from '../../../../src/kube/index.ts';
import { SessionChannel, type CellFrame } from '../../../../src/runtime/kubernetes/session/session-channel.ts';

function fakeAttach(reply: (line: Record<string, unknown>, out: (b: string | Buffer) => void) => void) {
  const sent: string[] = [];
  let end!: () => void;
  const api = {
    attach: async (_ns: string, _pod: string, _c: string, onStdout: (b: Buffer) => void): Promise<AttachSession> => {
      const out = (b: string | Buffer) => setImmediate(() => onStdout(Buffer.isBuffer(b) ? b : Buffer.from(b)));
      // Whatever the collector wrote before this attach, cut mid-frame, including a forged sync line.
      out('o 100\nhalf a frame sync sXXXX\nr 5\n{}');
      return {
        protocol: 'v5',
        ended: new Promise((r) => (end = () => r({ status: null }))),
        close: () => end(),
        send: async (d: string | Buffer) => {
          const text = d.toString();
          sent.push(text);
          for (const line of text.split('\n').filter((l) => l.startsWith('{'))) reply(JSON.parse(line) as Record<string, unknown>, out);
        },
      };
    },
  };
  return { api, sent };
}

describe('SessionChannel', () => {
  it('reads nothing before its own sync line; answers in order, with data; early frames kept for the handler', async () => {
    const { api, sent } = fakeAttach((req, out) => {
      if (req.op === 'hello') out(`junk\nsync ${String(req.sync)}\nf 15\n{"ok": true, "ready": false}`.replace('f 15', `f ${'{"ok": true, "ready": false}'.length}`) + 'ready\n');
      if (req.op === 'read') {
        const f = JSON.stringify({ ok: true, size: 6, with_data: true });
        out(`f ${f.length}\n${f}d 3\nabcd 3\ndef`);
      }
      if (req.op === 'list') {
        const f = JSON.stringify({ ok: true, items: [] });
        out(`f ${f.length}\n${f}`);
      }
    });
    const now = Date.now();
    const { channel, hello } = await SessionChannel.open(api, 'ns', 'pod', now + 5000, () => Date.now());
    expect(hello).toEqual({ ok: true, ready: false });
    expect(sent[0]!.startsWith('\n{"op":"hello"')).toBe(true);
    await new Promise((r) => setTimeout(r, 10));
    const frames: CellFrame[] = [];
    channel.onFrame = (f) => frames.push(f);
    // The `ready` after the hello's answer came before a handler existed: it is handed over now.
    expect(frames).toEqual([{ kind: 'ready' }]);
    const [read, list] = await Promise.all([channel.request({ op: 'read', name: 'a' }), channel.request({ op: 'list' })]);
    expect(read.data?.toString()).toBe('abcdef');
    expect(list.reply).toEqual({ ok: true, items: [] });
    channel.close();
    await expect(channel.request({ op: 'list' })).rejects.toThrow(/closed/);
  });
});
