import { describe, expect, it } from 'vitest';
import { compileSeccompBpf, DENIED_SYSCALLS, ociSeccomp } from '../../../../src/runtime/local/seccomp.ts';

function decode(buf: Buffer) {
  const out: { code: number; jt: number; jf: number; k: number }[] = [];
  for (let i = 0; i < buf.length; i += 8) out.push({ code: buf.readUInt16LE(i), jt: buf[i + 2]!, jf: buf[i + 3]!, k: buf.readUInt32LE(i + 4) });
  return out;
}

/** A tiny classic-BPF interpreter over seccomp_data, enough for the filter we emit. */
function evaluate(prog: ReturnType<typeof decode>, nr: number, arch: number, arg0 = 0): number {
  let a = 0;
  for (let pc = 0; pc < prog.length; pc++) {
    const { code, jt, jf, k } = prog[pc]!;
    if (code === 0x20) a = k === 0 ? nr : k === 4 ? arch : k === 16 ? arg0 : 0;
    else if (code === 0x06) return k >>> 0;
    else if (code === 0x15) pc += a === k ? jt : jf;
    else if (code === 0x35) pc += a >>> 0 >= k >>> 0 ? jt : jf;
    else if (code === 0x45) pc += (a & k) !== 0 ? jt : jf;
    else throw new Error(`unexpected opcode ${code}`);
  }
  throw new Error('fell off the program');
}

describe('seccomp filter', () => {
  const prog = decode(compileSeccompBpf('x64'));
  const X64 = 0xc000003e;
  it('allows ordinary syscalls and denies the listed ones with EPERM', () => {
    expect(evaluate(prog, 0, X64)).toBe(0x7fff0000); // read
    expect(evaluate(prog, 57, X64)).toBe(0x7fff0000); // fork
    expect(evaluate(prog, 101, X64)).toBe(0x00050001); // ptrace
    expect(evaluate(prog, 165, X64)).toBe(0x00050001); // mount
    expect(evaluate(prog, 272, X64)).toBe(0x00050001); // unshare
  });
  it('kills other architectures and refuses x32 syscalls', () => {
    expect(evaluate(prog, 0, 0x40000003)).toBe(0x80000000);
    expect(evaluate(prog, 0x40000000 + 0, X64)).toBe(0x00050001);
  });
  it('lets clone through unless it asks for new namespaces; clone3 gets ENOSYS', () => {
    expect(evaluate(prog, 56, X64, 0x01200011)).toBe(0x7fff0000); // fork-like flags
    expect(evaluate(prog, 56, X64, 0x10000000)).toBe(0x00050001); // CLONE_NEWUSER
    expect(evaluate(prog, 435, X64)).toBe(0x00050026);
  });
  it('has an aarch64 table and refuses unknown architectures', () => {
    expect(compileSeccompBpf('arm64').length % 8).toBe(0);
    expect(() => compileSeccompBpf('mips')).toThrow(/no seccomp syscall table/);
  });
  it('says the same thing in OCI form, but for clone3', () => {
    const oci = ociSeccomp('x64') as { defaultAction: string; syscalls: { names: string[]; action: string }[] };
    expect(oci.defaultAction).toBe('SCMP_ACT_ALLOW');
    expect(oci.syscalls[0]!.names).toEqual([...DENIED_SYSCALLS]);
    expect(oci.syscalls.filter((s) => s.names.includes('clone'))).toHaveLength(7);
    // No clone3 rule: runsc would answer it EPERM (not ENOSYS), and threads could not start.
    expect(oci.syscalls.filter((s) => s.names.includes('clone3'))).toEqual([]);
  });
});
