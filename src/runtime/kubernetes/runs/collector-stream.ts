/**
 * The reading of what a pod's collector (deliver.py) sends back on its attach: text lines (the
 * runner's `execution`, `done N`, the collector's `undelivered …`) and, before `done`, the run's
 * `/output` as a tar archive in length-prefixed frames (deliver.py's module doc):
 *
 *     outputs\n  [u32 length, bytes]…  [u32 0]  outputs-end ok\n
 *
 * Pure byte handling, fed chunk by chunk as the attach delivers them (frames and lines split
 * anywhere); what it reads goes to the callbacks.
 */

/** What {@link CollectorStream} reports. */
export interface CollectorStreamEvents {
  /** A text line (without its newline, trimmed). */
  line(text: string): void;
  /** The outputs archive begins. */
  outputsStart(): void;
  /** Bytes of the archive, in order. */
  outputsData(chunk: Buffer): void;
  /** The archive ended (the empty frame). */
  outputsEnd(): void;
}

/** Longest text line kept; longer ones are dropped (nothing we read is that long). */
const MAX_LINE = 4096;

/** See the module comment. */
export class CollectorStream {
  private mode: 'lines' | 'length' | 'data' = 'lines';
  private pending = Buffer.alloc(0);
  private left = 0;

  constructor(private readonly on: CollectorStreamEvents) {}

  feed(chunk: Buffer): void {
    let buf = this.pending.length > 0 ? Buffer.concat([this.pending, chunk]) : chunk;
    this.pending = Buffer.alloc(0);
    while (buf.length > 0) {
      if (this.mode === 'data') {
        const take = buf.subarray(0, this.left);
        this.left -= take.length;
        buf = buf.subarray(take.length);
        this.on.outputsData(take);
        if (this.left === 0) this.mode = 'length';
      } else if (this.mode === 'length') {
        if (buf.length < 4) break;
        const n = buf.readUInt32BE(0);
        buf = buf.subarray(4);
        if (n === 0) {
          this.mode = 'lines';
          this.on.outputsEnd();
        } else {
          this.left = n;
          this.mode = 'data';
        }
      } else {
        const nl = buf.indexOf(0x0a);
        if (nl < 0) {
          if (buf.length > MAX_LINE) buf = Buffer.alloc(0);
          break;
        }
        const text = buf.subarray(0, nl).toString('utf8').trim();
        buf = buf.subarray(nl + 1);
        if (text === 'outputs') {
          this.mode = 'length';
          this.on.outputsStart();
        } else this.on.line(text);
      }
    }
    if (buf.length > 0) this.pending = Buffer.from(buf);
  }
}
