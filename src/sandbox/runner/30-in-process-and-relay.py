def run_in_process(a):
    """--exec: the program runs in this process; never returns."""
    write_file(os.path.join(a.output, '.svc_phase'), b'execution')
    if a.phase_fd >= 0:
        try:
            os.write(a.phase_fd, b'execution\n')
        except OSError:
            pass
        if a.phase_fd > 2:
            try:
                os.close(a.phase_fd)
            except OSError:
                pass
    apply_rlimits(a, 2)
    if a.cwd:
        os.chdir(a.cwd)

    def on_exception(e):
        try:
            report = {'phase': 'failed', 'exit_code': 1}
            report.update(exception_fields(exception_parts(e)))
            write_file(os.path.join(a.output, '.svc_report.json'), to_json(report).encode('utf-8', 'replace'))
        except BaseException:
            pass

    run_program(a, on_exception)


def to_json(v):
    """A tiny JSON encoder for the report (importing json would pull in re)."""
    if v is None:
        return 'null'
    if v is True:
        return 'true'
    if v is False:
        return 'false'
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        out = ['"']
        for ch in v:
            o = ord(ch)
            if ch == '"' or ch == '\\':
                out.append('\\' + ch)
            elif o < 0x20 or 0xd800 <= o <= 0xdfff:
                out.append('\\u%04x' % o)
            else:
                out.append(ch)
        out.append('"')
        return ''.join(out)
    if isinstance(v, (list, tuple)):
        return '[' + ','.join(to_json(x) for x in v) + ']'
    if isinstance(v, dict):
        return '{' + ','.join(to_json(str(k)) + ':' + to_json(x) for k, x in v.items()) + '}'
    return to_json(str(v))


def open_relay():
    """The loopback listener the program's proxy variables name (bound before the fork, so the child
    knows its port)."""
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(('127.0.0.1', 0))
    s.listen(64)
    return s


def start_relay(listener, uds_path):
    """Relays each connection to the listener to a new connection to the Unix socket `uds_path`, in
    daemon threads of the runner (after the fork: the program's process has no threads)."""
    import socket
    import threading

    def pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def serve(conn):
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(uds_path)
        except OSError:
            conn.close()
            up.close()
            return
        t = threading.Thread(target=pump, args=(up, conn), daemon=True)
        t.start()
        pump(conn, up)
        t.join()
        conn.close()
        up.close()

    def accept_loop():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()


PR_SET_DUMPABLE = 4


def set_dumpable(on):
    """prctl(PR_SET_DUMPABLE, on); False when it could not be called.

    Why the runner is not dumpable: it runs with the program's uid, beside it, in the same sandbox
    (PID 1 under gVisor, bubblewrap --as-pid-1 and as a Kubernetes container), and it holds what the
    program must not touch: the capture pipes, the report it writes after the program ended, the
    egress relay's threads. A dumpable process of the same uid can be opened through
    /proc/<pid>/mem, attached with ptrace and written with process_vm_writev; a non-dumpable one
    only by a holder of CAP_SYS_PTRACE, which nothing in a sandbox has. That holds whether or not the
    syscall filter is on (it can be switched off, and it cannot tell an open of /proc/<pid>/mem from
    any other open). The forked program sets itself dumpable again, as `python PATH` would be;
    anything it execs is anyway (execve resets the flag).

    Only the C half of ctypes is imported (`_ctypes`, well under a millisecond); the `ctypes`
    package would cost a few milliseconds on every run.
    """
    try:
        import _ctypes

        class c_int(_ctypes._SimpleCData):
            _type_ = 'i'

        class CFunc(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL
            _restype_ = c_int

        class Libc:
            _handle = _ctypes.dlopen(None)

        prctl = CFunc(('prctl', Libc()))
        return prctl(PR_SET_DUMPABLE, 1 if on else 0, 0, 0, 0) == 0
    except Exception:  # noqa: B902 — no _ctypes, no prctl: the caller decides
        return False


def close_stray_fds(keep):
    """Closes every fd above 2 but `keep`: the program gets stdio and nothing its launcher leaked.
    (Where /proc/self/fd cannot be listed, as under gVisor, the host's fds are not visible anyway.)"""
    try:
        names = os.listdir('/proc/self/fd')
    except OSError:
        return
    for n in names:
        fd = int(n)
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass


