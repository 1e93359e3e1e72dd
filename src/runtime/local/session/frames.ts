/**
 * The session runner's answers (runner part `45-session.py`), parsed from its stdout as it arrives:
 * `ready\n`; `o LEN\n` / `e LEN\n` + bytes (output); `t o|e\n` (that stream was cut); `r LEN\n` + JSON
 * (a cell's result); `x LEN\n` + JSON (the session's runner ends). Length-prefixed, so nothing a
 * program prints reads as a frame. Everything is untrusted (user code runs with the runner's uid).
 */

/** One parsed frame. */
export type SessionFrame =
  | { kind: 'ready' }
  | { kind: 'o' | 'e'; data: Buffer }
  | { kind: 'cut'; stream: 'o' | 'e' }
  | { kind: 'result'; result: Record<string, unknown> }
  | { kind: 'end'; info: Record<string, unknown> }
  /** A frame of a kind the caller added (`extraKinds`: a Kubernetes session's collector adds its own). */
  | { kind: 'extra'; k: string; data: Buffer };

/** Largest frame accepted (a result is small; output frames are at most 64 KiB). */
const MAX_FRAME = 1 << 20;

/** A frame's JSON object; `{}` for anything else (the runner's frames are not trusted). */
export function parseObject(b: Buffer): Record<string, unknown> {
  try {
    const v = JSON.parse(b.toString('utf8')) as unknown;
    return v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

/** Incremental parser: {@link push} bytes, get the complete frames. */
export class SessionFrames {
  private buf: Buffer = Buffer.alloc(0);
  private readonly head: RegExp;

  /** `extraKinds`: more one-letter kinds of `K LEN` frames, handed back as `extra`; `maxFrame`: bytes. */
  constructor(
    extraKinds = '',
    private readonly maxFrame = MAX_FRAME,
  ) {
    if (!/^[a-zA-Z]*$/.test(extraKinds)) throw new Error('frame kinds are letters');
    this.head = new RegExp(`^([oerx${extraKinds}]) (\\d{1,9})$`);
  }

  push(chunk: Buffer): SessionFrame[] {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    const out: SessionFrame[] = [];
    for (;;) {
      const nl = this.buf.indexOf(10);
      if (nl < 0) break;
      const head = this.buf.subarray(0, nl).toString('latin1');
      if (head === 'ready') {
        out.push({ kind: 'ready' });
        this.buf = this.buf.subarray(nl + 1);
        continue;
      }
      const t = /^t ([oe])$/.exec(head);
      if (t) {
        out.push({ kind: 'cut', stream: t[1] as 'o' | 'e' });
        this.buf = this.buf.subarray(nl + 1);
        continue;
      }
      const m = this.head.exec(head);
      if (!m || Number(m[2]) > (m[1] && 'oerx'.includes(m[1]) ? MAX_FRAME : this.maxFrame)) {
        // Not the runner's protocol: nothing after it can be trusted to be framed.
        out.push({ kind: 'end', info: { reason: 'protocol', head: head.slice(0, 80) } });
        this.buf = Buffer.alloc(0);
        break;
      }
      const len = Number(m[2]);
      if (this.buf.length < nl + 1 + len) break;
      const data = Buffer.from(this.buf.subarray(nl + 1, nl + 1 + len));
      this.buf = this.buf.subarray(nl + 1 + len);
      const k = m[1]!;
      if (k === 'o' || k === 'e') out.push({ kind: k, data });
      else if (k === 'r') out.push({ kind: 'result', result: parseObject(data) });
      else if (k === 'x') out.push({ kind: 'end', info: parseObject(data) });
      else out.push({ kind: 'extra', k, data });
    }
    return out;
  }
}
