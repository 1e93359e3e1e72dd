#!/usr/bin/env python3
"""sandpod delivery: the `collector` of a Kubernetes pod whose program arrives by attach (a warm pool
pod, or a cold pod started the same way).

Why a second process, in another container: the program's /code and /input must be read-only to it
in the kernel's sense (SPEC 1.5), and the program runs with the runner's uid in `main`. Whatever
`main` can write, the program can write. So `main` mounts both volumes read-only, and this process,
in the `collector` container (which mounts them writable and runs nothing of the user's), writes
them. The runner in `main` learns of the delivery on a loopback connection it only reads the go line
from (runner.py --go-port); its phase lines come back on that connection and are relayed here, so
`main`'s stdout and stderr carry only the program's output, as in a cold pod (`kubectl logs -c main`).

Standard library only; shipped as `python3 -c <this file>` in the pod's command, like the runner.

CLI
    python3 deliver.py --code PATH --input PATH --go-port PORT --release PATH [--claim PATH] [--output DIR]

Protocol (stdin, attached by the service once, `stdinOnce`)
    one line: {"code": N1, "input": N2, "go": {...}}   (at most 64 KiB)
    then N1 bytes of the program and N2 bytes of its input.
    The files are written, then the runner's port on 127.0.0.1 is connected to (retried while it
    is refused, for at most --connect-timeout seconds) and the `go` object is sent as one line.
    The runner's phase lines (`ready`, `execution`, `done N`) are copied to stdout; its `control`
    line and the bytes after it (see Outputs) are not.
    A stream that ends before the whole payload sends nothing to the runner: no program runs.
    The go line is sent only once the claim is taken (--claim, default /control/claim): a symbolic
    link made there atomically, to `deliver`, once the runner's port answered. A run's new holder
    (another replica took the run over while its holder was stalled or dying) that finds no sign of
    a program started takes the claim itself by exec, a link to `fence`, before it deletes the pod: a
    stale holder's hand-over that gets there after that finds the claim taken and runs nothing (exit
    status 4, FENCED). Either the program runs here or the new holder knows it never will: without
    this an adopter could not tell a hand-over still in flight from one that never began, and a
    program could run in two pods.
    Errors are reported on stdout as one line `undelivered REASON`.
    A stdin that ends before its first byte (no hand-over ever began) makes this process exit with
    status 3 (STDIN_GONE) after saying so: no program can reach this pod any more, and a container
    that ended says that to the service (and the warm pool) at once, where one that waited would hold
    its run until the startup limit. Seen on gVisor (kcluster's runsc adapter): a collector read EOF at
    its start while the attach's bytes sat in its stdin pipe.

Outputs (with --output DIR): when the runner's `done N` line comes, its outputs are written; before
that line is passed on, DIR goes out on stdout as a tar archive, in frames: a line `outputs`, then
frames of a 4-byte big-endian length and that many bytes, ended by an empty frame, then a line
`outputs-end ok` (or `outputs-end failed REASON`: the service then pulls DIR by exec as before).
This saves the service an exec (a process started in the sandbox) per run. The bytes are the same
archive `tar -C DIR -cf - .` would give (minus owner names: numeric ids only), and the service
parses them with the same limits.

The runner's own files (its report, the program's captured streams, the phase) come to this process
before `done`, on the same connection: a line `control NAME LEN NAME LEN ...`, then the bytes of each
file in that order (never relayed). The archive is built as soon as they come: those files from
these bytes (as the runner writes them into DIR meanwhile; DIR's entries of those names are left
out), everything else from DIR. Reading back what the runner has just written would cost a walk, an
open, a read and a close per file through gVisor's gofer (milliseconds apiece on a busy node) on the
run's path, and an empty DIR would still cost four of them. `done` is relayed after the archive, as
before; the runner sends it once its files are written, so an exec'd pull after a failed archive
finds them. Without a `control` line (a runner that sends none), DIR is archived whole at `done`.

Afterwards the process is the pod's collector: it holds /output (read-only here) for the service's
exec'd `tar` and exits 0 when the release file appears, when the line `release` comes on stdin
(the service has the outputs), or on SIGTERM/SIGINT.
"""
import _signal
import _socket
import _thread
import io
import os
import select
import struct
import sys
import time


def _import_late():
    """json (the header) and tarfile (the outputs) are imported on a thread of their own from the
    start: under gVisor they cost ~40 and ~60 ms (re, shutil, bz2, lzma and the rest, each file a
    round trip to the gofer), and in a cold pod this process starts just before its payload comes,
    so imported in line they would delay the hand-over. The main thread meanwhile waits for stdin;
    a use before the thread is done waits for the import (Python's module lock). socket and signal
    are not imported at all (their C modules serve; the Python ones bring enum and selectors)."""
    try:
        import json  # noqa: F401
        _tarfile()
    except BaseException:  # noqa: B902 — the main thread's own import reports it, if it is used
        pass


def _tarfile():
    import tarfile
    # The archive carries numeric owners only: no user or group name lookup per file (each reads
    # /etc/passwd or /etc/group again, milliseconds apiece under gVisor, before the run's `done`).
    tarfile.pwd = None
    tarfile.grp = None
    return tarfile


_thread.start_new_thread(_import_late, ())

MAX_HEADER = 64 * 1024
# Exit status when stdin ended before its first byte (see the module doc).
STDIN_GONE = 3
# Exit status when a run's new holder had taken the claim before the program came (see the module doc).
FENCED = 4
CHUNK = 64 * 1024


def say(line):
    try:
        os.write(1, line.encode('utf-8', 'replace') + b'\n')
    except OSError:
        pass


def parse_args(argv):
    opts = {'--code': '/code/main.py', '--input': '/input/data.json', '--go-port': None, '--release': '/control/release', '--claim': '/control/claim', '--connect-timeout': '60', '--output': None}
    i = 0
    while i < len(argv):
        if argv[i] not in opts or i + 1 >= len(argv):
            say('undelivered bad argument %s' % argv[i])
            sys.exit(2)
        opts[argv[i]] = argv[i + 1]
        i += 2
    if opts['--go-port'] is None:
        say('undelivered --go-port is required')
        sys.exit(2)
    return opts


def read_line(fd, limit):
    buf = bytearray()
    while b'\n' not in buf:
        if len(buf) > limit:
            return None, b''
        chunk = os.read(fd, 4096)
        if not chunk:
            return None, (b'' if buf else None)  # None: the stream ended before its first byte
        buf.extend(chunk)
    at = buf.index(b'\n')
    return bytes(buf[:at]), bytes(buf[at + 1:])


def copy_exact(fd, first, n, path):
    """Writes the next `n` bytes of the stream (`first` already read) to `path`; what is left over."""
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o444)
    try:
        take = first[:n]
        os.write(out, take)
        left = n - len(take)
        rest = first[n:]
        while left > 0:
            chunk = os.read(fd, min(CHUNK, left))
            if not chunk:
                return None
            os.write(out, chunk)
            left -= len(chunk)
        return rest
    finally:
        os.close(out)


def take_claim(path):
    """False when a run's new holder fenced this pod first; True when the program may go (see the module doc)."""
    try:
        os.symlink('deliver', path)
        return True
    except FileExistsError:
        try:
            return os.readlink(path) == 'deliver'
        except OSError:
            return False
    except OSError:
        return True  # no claim can be kept here (an older pod spec): as before, no fence


def connect(port, timeout):
    deadline = time.monotonic() + timeout
    while True:
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            s.connect(('127.0.0.1', port))
            return s
        except OSError:
            s.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


class Frames(object):
    """A write-only file object that sends what is written to stdout as length-prefixed frames."""

    def write(self, data):
        data = bytes(data)
        if data:
            write_all(struct.pack('>I', len(data)) + data)
        return len(data)

    def flush(self):
        pass


def write_all(data):
    view = memoryview(data)
    while view:
        n = os.write(1, view)
        view = view[n:]


def control_name(name):
    """A name the runner may give a control file: one plain entry of DIR (never a path)."""
    return name not in ('', '.', '..') and '/' not in name and '\0' not in name


def send_outputs(out_dir, control=None):
    """DIR as a tar archive in frames (see the module doc), with the runner's `control` files
    ([(name, bytes)]) taken from memory instead of DIR; a failure is reported, never raised."""
    write_all(b'outputs\n')
    why = None
    tarfile = _tarfile()
    try:
        with tarfile.open(fileobj=Frames(), mode='w|', format=tarfile.GNU_FORMAT, bufsize=64 * 1024) as tar:
            if control is None:
                tar.add(out_dir, arcname='.', recursive=True)
            else:
                tar.add(out_dir, arcname='.', recursive=False)
                # As the runner writes them: its uid and gid (the pod's, this process's too), 0644.
                now, uid, gid = int(time.time()), os.getuid(), os.getgid()
                for name, data in control:
                    info = tarfile.TarInfo('./' + name)
                    info.size, info.mode, info.mtime, info.uid, info.gid = len(data), 0o644, now, uid, gid
                    tar.addfile(info, io.BytesIO(data))
                skip = set(name for name, _ in control)
                for name in sorted(os.listdir(out_dir)):
                    if name not in skip:
                        tar.add(os.path.join(out_dir, name), arcname='./' + name, recursive=True)
    except (OSError, tarfile.TarError, ValueError) as e:
        why = str(e) or e.__class__.__name__
    try:
        write_all(struct.pack('>I', 0))
        write_all(b'outputs-end ok\n' if why is None else ('outputs-end failed %s\n' % why.replace('\n', ' ')).encode('utf-8', 'replace'))
    except OSError:
        pass


def parse_control(line):
    """[(name, length)] of a `control NAME LEN ...` line; None when it is not one."""
    parts = line.decode('utf-8', 'replace').split(' ')[1:]
    if len(parts) % 2 or len(parts) > 16:
        return None
    try:
        files = [(parts[i], int(parts[i + 1])) for i in range(0, len(parts), 2)]
    except ValueError:
        return None
    if any(not control_name(n) or size < 0 for n, size in files) or len(set(n for n, _ in files)) != len(files):
        return None
    return files


class Relay(object):
    """The runner's lines, copied to stdout, with the outputs archive before `done` (with --output)."""

    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.buf = bytearray()
        self.archived = False
        self.want = None  # [(name, length)] of the control files still to read
        self.control = []

    def archive(self, control=None):
        if self.out_dir is not None and not self.archived:
            self.archived = True
            send_outputs(self.out_dir, control)

    def feed(self, chunk):
        """Takes the next bytes from the runner and acts on what is complete."""
        buf = self.buf
        buf += chunk
        while True:
            if self.want is not None:
                name, size = self.want[0]
                if len(buf) < size:
                    return
                self.control.append((name, bytes(buf[:size])))
                del buf[:size]
                self.want.pop(0)
                if not self.want:
                    self.want = None
                    self.archive(self.control)
                continue
            at = buf.find(b'\n')
            if at < 0:
                return
            line = bytes(buf[:at])
            del buf[:at + 1]
            if line.startswith(b'control '):
                # Never relayed. A malformed one (a runner bug) is dropped: the archive is then
                # made from DIR at `done`, as without one.
                self.want = parse_control(line) or None
                continue
            if line.startswith(b'done '):
                self.archive()
            write_all(line + b'\n')


def relay(conn, out_dir):
    """Copies the runner's lines to stdout; before a `done` line, the outputs (with --output)."""
    r = Relay(out_dir)
    while True:
        chunk = conn.recv(CHUNK)
        if not chunk:
            break
        r.feed(chunk)
    if r.buf and r.want is None:
        write_all(bytes(r.buf))


def deliver(opts):
    header, rest = read_line(0, MAX_HEADER)
    if header is None:
        # The attach ended before a hand-over: nothing runs. Before its first byte: nothing ever can.
        return STDIN_GONE if rest is None else None
    try:
        import json
        msg = json.loads(header)
        sizes = [int(msg['code']), int(msg['input'])]
        go = msg['go']
        if not isinstance(go, dict) or min(sizes) < 0:
            raise ValueError()
    except (ValueError, KeyError, TypeError):
        say('undelivered bad header')
        return
    for path, n in zip((opts['--code'], opts['--input']), sizes):
        try:
            rest = copy_exact(0, rest, n, path)
        except OSError as e:
            say('undelivered cannot write %s: %s' % (path, e.strerror))
            return
        if rest is None:
            return  # the stream ended mid-payload: no go line, nothing runs
    try:
        conn = connect(int(opts['--go-port']), float(opts['--connect-timeout']))
    except OSError as e:
        say('undelivered the runner is not listening: %s' % e)
        return
    if not take_claim(opts['--claim']):
        conn.close()  # the runner sees its go connection end without a go line: it exits, nothing ran
        say('undelivered fenced: the run has a new holder, which took this pod before the program started')
        return FENCED
    try:
        conn.sendall(json.dumps(go).encode() + b'\n')  # json: imported for the header above
        relay(conn, opts['--output'])
    except OSError:
        pass
    finally:
        conn.close()


def main():
    _signal.signal(_signal.SIGTERM, lambda *_: os._exit(0))
    _signal.signal(_signal.SIGINT, lambda *_: os._exit(0))
    opts = parse_args(sys.argv[1:])
    ended = deliver(opts)
    if ended == STDIN_GONE:
        say('undelivered stdin closed before the program came')
        os._exit(STDIN_GONE)
    if ended == FENCED:
        os._exit(FENCED)
    # The collector's part: until released, by the file (exec) or by a `release` line on stdin.
    stdin_open = True
    line = b''
    while not os.path.exists(opts['--release']):
        if not stdin_open:
            time.sleep(0.2)
            continue
        try:
            ready, _, _ = select.select([0], [], [], 0.2)
            chunk = os.read(0, 64) if ready else None
        except (OSError, ValueError):
            chunk = b''
        if chunk is None:
            continue
        if not chunk:
            stdin_open = False
            continue
        line = (line + chunk)[-64:]
        if b'release\n' in line:
            break
    os._exit(0)


if __name__ == '__main__':
    main()
