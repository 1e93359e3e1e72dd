#!/usr/bin/env python3
"""sandpod session collector: the `collector` of a Kubernetes session pod (issue 19).

Why a second process, in another container: as in every pod (deliver.py), the cells' /code and
/input must be read-only to them, and the cells run with the runner's uid in `main`; so `main` mounts
both read-only and this process, which runs nothing of the user's, writes them. It also does the
session's files API in /workspace (mounted here too) and hands back what each cell wrote to /output,
then empties it for the next cell. `main`'s runner (runner.py --session --go-port) holds the cell
channel on a loopback connection that only this process makes, at its start.

Standard library only; shipped as `python3 -c <this file>` in the pod's command, like the runner.

CLI
    python3 session-collector.py --go-port PORT [--code-dir /code] [--input /input/data.json]
        [--output /output] [--workspace /workspace] [--connect-timeout 300]
    (--connect-timeout: how long main's runner may take to listen, s; as long as a session's start
    may take, since a loaded node can start main well after the collector.)

Requests (stdin, attached by the service; `stdin` without `stdinOnce`, so a restarted service can
attach again and go on): one JSON object per line, bytes as base64. A line cut off by a service that
died is ended by the next attacher's first `\\n` and is then not JSON: ignored.
    {"op": "hello", "sync": S}       answered by the line `sync S` (the attacher's stdout starts
                                     mid-stream: it reads nothing before that line), then `f` with
                                     {"ready", "busy": N|null, "ended": {...}|null}
    {"op": "cell", "cell": N, "code": TEXT, "input": TEXT, "go": {timeout, max_stream_bytes, env}}
    {"op": "list"} | {"op": "read", "name", "max", "data": bool} | {"op": "write", "name", "max", "b64"}
    {"op": "delete", "name"} | {"op": "close"}
Answers (stdout): the runner's frames as it sent them (`ready`, `o|e LEN`, `t o|e`, `r LEN`, `x LEN`),
and this process's own: `f LEN` + JSON (the answer of a file op or hello: {"ok": true, ...} or
{"ok": false, "code": not_found|conflict|payload_too_large|bad_request, "message"}), `d LEN` + bytes
(a file's contents after its `f`, in pieces), `a LEN` + bytes (a cell's /output as a tar archive,
in pieces) and `A LEN` + JSON (its end: {"ok": true} or {"ok": false, "why"}), both just before the
cell's `r`. Names are plain file names; every open is O_NOFOLLOW (a link a cell planted is refused,
never followed), only regular files are read or written.
"""
import base64
import json
import os
import select
import shutil
import signal
import socket
import stat
import sys
import tarfile
import time

CHUNK = 256 * 1024
MAX_LINE = 512 * 1024 * 1024
MAX_RUNNER_FRAME = 1 << 20


def write_all(data):
    view = memoryview(data)
    while view:
        try:
            n = os.write(1, view)
        except InterruptedError:
            continue
        view = view[n:]


def frame(kind, data):
    write_all(b'%s %d\n' % (kind, len(data)) + data)


def answer(obj):
    frame(b'f', json.dumps(obj).encode())


def parse_args(argv):
    opts = {'--go-port': None, '--code-dir': '/code', '--input': '/input/data.json', '--output': '/output',
            '--workspace': '/workspace', '--connect-timeout': '300'}
    for i in range(0, len(argv) - 1, 2):
        if argv[i] not in opts:
            sys.exit('session-collector: bad argument %s' % argv[i])
        opts[argv[i]] = argv[i + 1]
    if opts['--go-port'] is None:
        sys.exit('session-collector: --go-port is required')
    return opts


def connect(port, timeout):
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.connect(('127.0.0.1', port))
            return s
        except OSError:
            s.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


class Refused(Exception):
    def __init__(self, code, message):
        Exception.__init__(self, message)
        self.code = code


def check_name(name):
    if not isinstance(name, str) or not name or name in ('.', '..') or '/' in name or '\\' in name \
            or any(ord(c) < 32 or ord(c) == 127 for c in name) or len(name.encode('utf-8', 'surrogatepass')) > 255:
        raise Refused('bad_request', 'invalid file name %s' % json.dumps(name))


def open_nofollow(path, flags, mode=0o644):
    name = json.dumps(os.path.basename(path))
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    except FileNotFoundError:
        raise Refused('not_found', "no file named %s in the session's workspace" % name)
    except OSError as e:
        if e.errno in (40, 21, 6):  # ELOOP, EISDIR, ENXIO
            raise Refused('conflict', "%s in the session's workspace is not a regular file (links are not followed)" % name)
        if e.errno == 13:
            raise Refused('conflict', "%s in the session's workspace is not writable" % name)
        raise


def file_op(ws, req):
    op = req.get('op')
    if op == 'list':
        items = []
        for name in sorted(os.listdir(ws))[:10000]:
            try:
                st = os.lstat(os.path.join(ws, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                t = time.gmtime(st.st_mtime)
                items.append({'name': name, 'size_bytes': st.st_size,
                              'modified_at': time.strftime('%Y-%m-%dT%H:%M:%S', t) + '.%03dZ' % int((st.st_mtime % 1) * 1000)})
        answer({'ok': True, 'items': items})
        return
    name = req.get('name')
    check_name(name)
    path = os.path.join(ws, name)
    cap = int(req.get('max', 0))
    if op == 'read':
        fd = open_nofollow(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Refused('conflict', "%s in the session's workspace is not a regular file" % json.dumps(name))
            if st.st_size > cap:
                raise Refused('payload_too_large', '%s is %d bytes, over max_artifact_bytes (%d)' % (json.dumps(name), st.st_size, cap))
            data = b''
            while len(data) < st.st_size:
                chunk = os.read(fd, min(CHUNK, st.st_size - len(data)))
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        answer({'ok': True, 'size': len(data), 'with_data': bool(req.get('data'))})
        if req.get('data'):
            for i in range(0, len(data), CHUNK):
                frame(b'd', data[i:i + CHUNK])
    elif op == 'write':
        data = base64.b64decode(req.get('b64', ''))
        if len(data) > cap:
            raise Refused('payload_too_large', 'the file is %d bytes, over max_artifact_bytes (%d)' % (len(data), cap))
        try:
            created = not stat.S_ISREG(os.lstat(path).st_mode)
        except OSError:
            created = True
        fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Refused('conflict', "%s in the session's workspace is not a regular file" % json.dumps(name))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        answer({'ok': True, 'size': len(data), 'created': created})
    elif op == 'delete':
        try:
            st = os.lstat(path)
        except OSError:
            raise Refused('not_found', "no file named %s in the session's workspace" % json.dumps(name))
        if stat.S_ISDIR(st.st_mode):
            raise Refused('conflict', '%s is a directory' % json.dumps(name))
        os.unlink(path)
        answer({'ok': True})
    else:
        raise Refused('bad_request', 'unknown op')


class Frames(object):
    """A write-only file object: what tarfile writes goes out as `a` frames."""

    def write(self, data):
        if data:
            frame(b'a', bytes(data))
        return len(data)

    def flush(self):
        pass


def hand_outputs(out_dir):
    """The cell's /output as a tar archive (links stored as links, never followed), then emptied."""
    why = None
    try:
        with tarfile.open(fileobj=Frames(), mode='w|', format=tarfile.GNU_FORMAT, bufsize=CHUNK) as tar:
            tar.add(out_dir, arcname='.', recursive=True)
    except (OSError, tarfile.TarError, ValueError) as e:
        why = str(e) or e.__class__.__name__
    frame(b'A', json.dumps({'ok': why is None, 'why': why}).encode())
    for e in os.scandir(out_dir):
        try:
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                os.unlink(e.path)
        except OSError:
            pass


def replace_file(path, text):
    """Writes `path` anew (read-only to everyone: the cells see it at /code or /input)."""
    tmp = path + '.new'
    try:
        os.unlink(tmp)
    except OSError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
    try:
        view = memoryview(text.encode('utf-8', 'surrogatepass'))
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.rename(tmp, path)


def main():
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, lambda *_: os._exit(0))
    o = parse_args(sys.argv[1:])
    try:
        conn = connect(int(o['--go-port']), float(o['--connect-timeout']))
    except OSError as e:
        frame(b'x', json.dumps({'reason': 'runner_unreachable', 'detail': str(e)}).encode())
        os._exit(1)
    state = {'ready': False, 'busy': None, 'ended': None}
    req_buf = b''
    run_buf = b''
    stdin_open = True
    while True:
        fds = [conn] + ([0] if stdin_open else [])
        try:
            can, _, _ = select.select(fds, [], [])
        except InterruptedError:
            continue
        if conn in can:
            data = conn.recv(65536)
            if not data:
                if state['ended'] is None:
                    frame(b'x', json.dumps({'reason': 'runner_gone'}).encode())
                os._exit(0)
            run_buf += data
            while True:
                nl = run_buf.find(b'\n')
                if nl < 0:
                    break
                head = run_buf[:nl]
                if head == b'ready' or head in (b't o', b't e'):
                    write_all(head + b'\n')
                    run_buf = run_buf[nl + 1:]
                    state['ready'] = state['ready'] or head == b'ready'
                    continue
                parts = head.split(b' ')
                if len(parts) != 2 or parts[0] not in (b'o', b'e', b'r', b'x') or not parts[1].isdigit() or int(parts[1]) > MAX_RUNNER_FRAME:
                    frame(b'x', json.dumps({'reason': 'protocol'}).encode())
                    os._exit(1)
                n = int(parts[1])
                if len(run_buf) < nl + 1 + n:
                    break
                body = run_buf[nl + 1:nl + 1 + n]
                run_buf = run_buf[nl + 1 + n:]
                if parts[0] == b'r':
                    hand_outputs(o['--output'])
                    state['busy'] = None
                    try:
                        os.unlink(state.pop('code', ''))
                    except OSError:
                        pass
                elif parts[0] == b'x':
                    state['ended'] = json.loads(body or b'{}')
                frame(parts[0], body)
        if 0 in can:
            data = os.read(0, CHUNK)
            if not data:
                stdin_open = False  # no attacher can come back to a closed stdin; the runner goes on
                continue
            req_buf += data
            if len(req_buf) > MAX_LINE and b'\n' not in req_buf:
                req_buf = b''
            while b'\n' in req_buf:
                line, req_buf = req_buf.split(b'\n', 1)
                try:
                    req = json.loads(line)
                    if not isinstance(req, dict):
                        raise ValueError()
                except ValueError:
                    continue  # a line cut off by an attacher that went away
                op = req.get('op')
                if op == 'hello':
                    write_all(b'\nsync %s\n' % str(req.get('sync', '')).encode('ascii', 'replace'))
                    answer({'ok': True, 'ready': state['ready'], 'busy': state['busy'], 'ended': state['ended']})
                elif op == 'cell':
                    n = int(req['cell'])
                    # The same path in main (the volume is mounted at the same place there).
                    code_path = os.path.join(o['--code-dir'], 'cell-%d.py' % n)
                    replace_file(code_path, req.get('code', ''))
                    replace_file(o['--input'], req.get('input', '{}'))
                    go = req.get('go') or {}
                    cmd = {'cell': n, 'code': code_path, 'timeout': go.get('timeout'),
                           'max_stream_bytes': go.get('max_stream_bytes'), 'env': go.get('env') or {}}
                    conn.sendall(json.dumps(cmd).encode() + b'\n')
                    state['busy'] = n
                    state['code'] = code_path
                elif op == 'close':
                    conn.close()
                    os._exit(0)
                else:
                    try:
                        file_op(o['--workspace'], req)
                    except Refused as e:
                        answer({'ok': False, 'code': e.code, 'message': str(e)})
                    except (OSError, ValueError, TypeError) as e:
                        answer({'ok': False, 'code': 'conflict', 'message': 'the file operation failed: %s' % e})


if __name__ == '__main__':
    main()
