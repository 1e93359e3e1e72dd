MAX_GO_LINE = 64 * 1024 * 1024


def open_go_listener(a):
    """--go-port: the loopback port the go line comes in on, held from before any program exists."""
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(('127.0.0.1', a.go_port))
        s.listen(1)
    except OSError as e:
        die('cannot listen on 127.0.0.1:%d: %s' % (a.go_port, e))
    return s


def open_ready_listener(a):
    """--ready-listen HOST:PORT: the port a Kubernetes `tcpSocket` startup probe connects to, opened
    once the go port is held and the held child's preloads are imported, so the pod counts as ready
    only then (nothing is exec'd into the sandbox to find out). Opened after the fork, in this process
    only, and close-on-exec: the program's process never has it, and it is closed when the go
    connection comes (accept_go), before the program exists."""
    import socket
    host, _, port = a.ready_listen.rpartition(':')
    host = host.strip('[]')
    s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
        s.listen(8)
    except (OSError, ValueError) as e:
        die('cannot listen on %s: %s' % (a.ready_listen, e))
    return s


def accept_go(a, listener, ready=None):
    """--go-port: the first connection becomes the go channel and the phase fd; the port is let go.
    Connections to the `ready` listener meanwhile are probes: accepted and closed at once (nothing is
    read from them); it is closed before the go connection is used."""
    import select
    while True:
        try:
            if ready is not None:
                can, _, _ = select.select([listener, ready], [], [])
                if ready in can:
                    try:
                        probe, _ = ready.accept()
                        probe.close()
                    except OSError:
                        pass
                if listener not in can:
                    continue
            conn, _ = listener.accept()
            break
        except InterruptedError:
            continue
        except OSError:
            os._exit(EXIT_NOT_DELIVERED)
    if ready is not None:
        ready.close()
    listener.close()
    a.phase_fd = os.dup(conn.fileno())
    conn.close()
    return a.phase_fd


def send_control(fd, files):
    """--go-port: the report's files ([(name, bytes)]) go to the collector before `done`: a line
    `control NAME LEN NAME LEN ...`, then the bytes of each in that order. Its outputs archive takes
    them from here instead of reading back what this process writes into --output (on gVisor a walk,
    an open, a read and a close through the gofer per file, on the run's path; deliver.py). The files
    are written all the same, before `done`: a pull of --output by exec finds them."""
    data = ('control %s\n' % ' '.join('%s %d' % (name, len(b)) for name, b in files)).encode() + b''.join(b for _, b in files)
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass


def wait_for_go(a, src=0):
    """--wait: says `ready`, reads the one go line from `src` (stdin, or the --go-port connection),
    then closes the stdin channel for good."""
    import json
    if a.phase_fd >= 0:
        try:
            os.write(a.phase_fd, b'ready\n')
        except OSError:
            os._exit(EXIT_NOT_DELIVERED)
    buf = bytearray()
    # The line may carry the program and its input (cluster pools): bounded, but far above 4 KiB.
    while len(buf) < MAX_GO_LINE:
        # `ping` lines come before the go line to a sandbox restored from a checkpoint: this process
        # was checkpointed right here, past its `ready`, so it says `ready` again for each (the host
        # then knows the restore is done and this runner reads its new stdin).
        while buf.startswith(b'ping\n'):
            del buf[:5]
            if a.phase_fd >= 0:
                try:
                    os.write(a.phase_fd, b'ready\n')
                except OSError:
                    os._exit(EXIT_NOT_DELIVERED)
        if b'\n' in buf:
            break
        try:
            chunk = os.read(src, 4096)
        except InterruptedError:
            continue
        except OSError:
            chunk = b''
        if not chunk:
            break
        buf.extend(chunk)
    if b'\n' not in buf:
        os._exit(EXIT_NOT_DELIVERED)  # retired before use, or the hand-over failed: nothing ran
    try:
        msg = json.loads(bytes(buf[:buf.index(b'\n')]))
        if 'timeout' in msg:
            a.timeout = float(msg['timeout'])
        if 'max_stream_bytes' in msg:
            a.max_stream_bytes = int(msg['max_stream_bytes'])
        files = [(a.code, msg['code'])] if 'code' in msg else []
        if 'input' in msg:
            files.append((a.input, msg['input']))
        # What only the run knows (its TRACEPARENT): it crosses the gate to the held child as
        # KEY=VALUE lines, so neither may hold a newline, and the key no '='.
        env = msg.get('env', {})
        for k, v in env.items():
            if not (isinstance(k, str) and isinstance(v, str)) or not k or '=' in k or any(c in k + v for c in '\n\0'):
                raise TypeError('env')
        if msg.get('proxy') is not None:
            proxy = msg['proxy']
            # Crosses the gate as env lines: one line of text.
            if not isinstance(proxy, str) or not proxy or any(ord(c) < 32 or ord(c) == 127 for c in proxy):
                raise TypeError('proxy')
            # The run's proxy URL (a per-run credential): set at the go, never at start.
            env = dict(env, **{k: proxy for k in PROXY_VARS})
        a.go_env = env
        for path, text in files:
            if not isinstance(text, str):
                raise TypeError(path)
    except (ValueError, TypeError, AttributeError):
        die('bad go message')
    # Written before the gate opens: the program's process reads --code only after the go.
    for path, text in files:
        write_file(path, text.encode('utf-8', 'surrogatepass'))
    # The channel is gone before the program exists: fd 0 is /dev/null from here on.
    null = os.open('/dev/null', os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def reseed():
    """In the held child at the go: fresh seeds for the generators a preload may have seeded already.
    A sandbox restored from a checkpoint continues the checkpointed interpreter, so without this every
    sandbox restored from one image would draw the same "random" numbers (os.urandom, and so
    `secrets` and `uuid4`, ask the kernel each time and need nothing). The hash seed of str and bytes
    is fixed at the interpreter's start and cannot change here: restored sandboxes of one image share
    it (docs/warm-restore.md)."""
    r = sys.modules.get('random')
    if r is not None:
        r.seed()
    npr = sys.modules.get('numpy.random')
    if npr is not None:
        try:
            npr.seed()
        except Exception:
            pass
    t = sys.modules.get('tempfile')
    if t is not None and hasattr(t, '_name_sequence'):
        t._name_sequence = None


PROXY_VARS = ('HTTP_PROXY', 'HTTPS_PROXY', 'ALL_PROXY', 'http_proxy', 'https_proxy', 'all_proxy')


def set_proxy_env(url):
    """Points the program's proxy variables (both cases) at `url`; NO_PROXY goes."""
    for k in ('NO_PROXY', 'no_proxy'):
        os.environ.pop(k, None)
    for k in PROXY_VARS:
        os.environ[k] = url


def preload(modules, log_fd):
    """--preload, in the held child: imports each module before the go line, so the program's own
    import finds it in sys.modules. What the imports print goes to the runner's log (`log_fd`, the
    runner's stderr), not into the program's streams. A module that fails is logged there and skipped
    (whatever it half-imported is dropped), so the program gets the real error when it imports it."""
    saved = (os.dup(1), os.dup(2))
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    try:
        for name in modules:
            before = set(sys.modules)
            try:
                __import__(name)
            except BaseException as e:  # noqa: B902 — SystemExit or KeyboardInterrupt from a module too
                for m in set(sys.modules) - before:
                    sys.modules.pop(m, None)
                try:
                    os.write(log_fd, ('sandpod runner: preload of %s failed, skipped: %s: %s\n' % (name, type(e).__name__, e)).encode('utf-8', 'replace'))
                except OSError:
                    pass
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


