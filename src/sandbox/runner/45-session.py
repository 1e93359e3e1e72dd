SESSION_GRACE_SEC = 3.0


def run_session(a):
    """--session: a persistent interpreter that runs cells one after another (issue 19).

    The runner stays the supervisor (not dumpable, out of the program's reach) and forks one
    interpreter process (prepared like a program's: its own session, rlimits, fds 0-2, cwd). Channel:
    the host writes one JSON line per cell on the runner's stdin, {"cell": N, "code": PATH,
    "timeout": SECONDS, "max_stream_bytes": N}, after writing the cell's code to PATH (under the
    read-only /code mount, which shows the host's writes). The runner answers on the phase fd:
    `ready\\n` once, then per cell the program's output as frames `o LEN\\n` / `e LEN\\n` + bytes (at
    most max_stream_bytes of each stream per cell; `t o|e\\n` once when a stream was cut), then
    `r LEN\\n` + the cell's result as JSON. A cell past its timeout gets SIGINT (KeyboardInterrupt:
    the interpreter and its state survive; the result says timed_out); a cell still running
    SESSION_GRACE_SEC later is killed with its whole process group and the runner ends after
    `x LEN\\n` + {"reason": "interrupt_ignored"}. An interpreter that dies (OOM kill, os._exit) ends
    the runner the same way with its exit status or signal. EOF on stdin ends the session.

    With --go-port (a Kubernetes session pod): the channel is the first connection to that loopback
    port instead of stdin and the phase fd (commands in, frames out, both ways on it), accepted after
    the interpreter was forked, so it never holds the socket; the port is let go at once, so nothing
    else in the pod can connect later. The pod's collector (session-collector.py) makes that
    connection. --ready-listen as for pool pods: open once the interpreter exists, closed at the
    accept. The connection's end ends the session as EOF on stdin does.
    """
    import json
    import select
    import time
    import _signal as signal

    if not set_dumpable(False):
        die('cannot make the runner non-dumpable (prctl PR_SET_DUMPABLE)')
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    cmd_r, cmd_w = os.pipe2(os.O_CLOEXEC)
    res_r, res_w = os.pipe2(os.O_CLOEXEC)
    # --egress-proxy (a type with allowed_hosts): the interpreter's proxy variables name a loopback
    # relay to the session's proxy, as for a one-shot program; the session has no other way out.
    relay = open_relay() if a.egress_proxy else None
    go_listener = open_go_listener(a) if a.go_port is not None else None
    if a.ready_listen and go_listener is None:
        die('--ready-listen needs --go-port')
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd in (out_r, err_r, cmd_w, res_r):
            os.close(fd)
        if a.phase_fd > 2:
            os.close(a.phase_fd)
        if go_listener is not None:
            go_listener.close()
        if relay is not None:
            url = 'http://127.0.0.1:%d' % relay.getsockname()[1]
            relay.close()
            set_proxy_env(url)
        prepare_child(a, out_w, err_w)
        set_dumpable(True)
        session_interpreter(a, cmd_r, res_w)
    for fd in (out_w, err_w, cmd_r, res_w):
        os.close(fd)
    if relay is not None:
        start_relay(relay, a.egress_proxy)
    chan_in = 0
    if go_listener is not None:
        ready = open_ready_listener(a) if a.ready_listen else None
        chan_in = accept_go(a, go_listener, ready)
    phase = a.phase_fd if a.phase_fd >= 0 else 1

    def emit(data):
        try:
            os.write(phase, data)
        except OSError:
            os._exit(0)

    def frame(kind, data):
        emit(b'%s %d\n' % (kind, len(data)) + data)

    def end(info):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        frame(b'x', json.dumps(info).encode())
        os._exit(0)

    emit(b'ready\n')
    stdin_buf = b''
    res_buf = b''
    cell = None  # {'deadline', 'interrupted_at', 'caps': {fd: left}, 'cut': set()}
    caps_default = a.max_stream_bytes
    while True:
        timeout = None
        now = time.monotonic()
        if cell is not None:
            limit = cell['interrupted_at'] + SESSION_GRACE_SEC if cell['interrupted_at'] else cell['deadline']
            timeout = max(0.0, limit - now)
        try:
            ready, _, _ = select.select([chan_in, out_r, err_r, res_r], [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        if cell is not None and not ready:
            if cell['interrupted_at'] is None:
                cell['interrupted_at'] = now
                try:
                    os.kill(pid, signal.SIGINT)
                except OSError:
                    pass
            elif now >= cell['interrupted_at'] + SESSION_GRACE_SEC:
                end({'reason': 'interrupt_ignored', 'cell': cell['n']})
            continue
        for fd in ready:
            if fd in (out_r, err_r):
                data = os.read(fd, 65536)
                if not data:
                    continue
                if cell is None:
                    continue  # output of something a finished cell left running: nobody's
                left = cell['caps'][fd]
                kind = b'o' if fd == out_r else b'e'
                if len(data) > left and kind not in cell['cut']:
                    cell['cut'].add(kind)
                    if left > 0:
                        frame(kind, data[:left])
                    emit(b't %s\n' % kind)
                    cell['caps'][fd] = 0
                elif left > 0:
                    frame(kind, data)
                    cell['caps'][fd] = left - len(data)
            elif fd == res_r:
                data = os.read(res_r, 65536)
                if not data:
                    _, status = os.waitpid(pid, 0)
                    end({'reason': 'interpreter_ended', 'exit_code': os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                         'signal': os.WTERMSIG(status) if os.WIFSIGNALED(status) else None})
                res_buf += data
                while b'\n' in res_buf:
                    line, res_buf = res_buf.split(b'\n', 1)
                    # What the cell printed before its result is in the pipes already: pass it on first.
                    for sfd, kind in ((out_r, b'o'), (err_r, b'e')):
                        while cell is not None and select.select([sfd], [], [], 0)[0]:
                            chunk = os.read(sfd, 65536)
                            if not chunk:
                                break
                            left = cell['caps'][sfd]
                            if left > 0:
                                frame(kind, chunk[:left])
                                cell['caps'][sfd] = max(0, left - len(chunk))
                                if len(chunk) > left and kind not in cell['cut']:
                                    cell['cut'].add(kind)
                                    emit(b't %s\n' % kind)
                    try:
                        res = json.loads(line)
                    except ValueError:
                        res = {}
                    if cell is not None:
                        res['timed_out'] = cell['interrupted_at'] is not None
                    frame(b'r', json.dumps(res).encode())
                    cell = None
            else:
                try:
                    data = os.read(chan_in, 65536)
                except OSError:
                    data = b''
                if not data:
                    end({'reason': 'closed'})
                stdin_buf += data
                while b'\n' in stdin_buf and cell is None:
                    line, stdin_buf = stdin_buf.split(b'\n', 1)
                    try:
                        cmd = json.loads(line)
                        n = int(cmd['cell'])
                    except (ValueError, KeyError, TypeError):
                        continue
                    caps = int(cmd.get('max_stream_bytes', caps_default))
                    cell = {'n': n, 'deadline': time.monotonic() + float(cmd.get('timeout', a.timeout)), 'interrupted_at': None,
                            'caps': {out_r: caps, err_r: caps}, 'cut': set()}
                    env = cmd.get('env') if isinstance(cmd.get('env'), dict) else {}
                    os.write(cmd_w, json.dumps({'cell': n, 'code': cmd.get('code'), 'env': env}).encode() + b'\n')


def session_interpreter(a, cmd_r, res_w):
    """The session's interpreter (forked, prepared): runs each cell in one __main__; never returns."""
    import builtins
    import json
    import time
    import _signal as signal
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main_mod = type(sys)('__main__')
    main_mod.__builtins__ = builtins
    sys.modules['__main__'] = main_mod
    sys.argv = ['']
    sys.path[0] = os.getcwd()
    cmds = os.fdopen(cmd_r, 'rb', buffering=0)
    buf = b''
    cell_env = {}
    while True:
        while b'\n' not in buf:
            try:
                data = cmds.read(65536)
            except KeyboardInterrupt:
                continue  # an interrupt that came after its cell ended
            if not data:
                os._exit(0)
            buf += data
        line, buf = buf.split(b'\n', 1)
        cmd = json.loads(line)
        # The cell's own environment (TRACEPARENT): the last cell's keys go first.
        for k in cell_env:
            os.environ.pop(k, None)
        cell_env = {str(k): str(v) for k, v in (cmd.get('env') or {}).items()}
        os.environ.update(cell_env)
        res = {'cell': cmd['cell'], 'exit_code': 0}
        t0 = time.monotonic()
        try:
            try:
                path = cmd['code']
                with open(path, 'rb') as f:
                    source = f.read()
                main_mod.__file__ = path
                exec(compile(source, path, 'exec'), main_mod.__dict__)
            except SystemExit as e:
                code = e.code
                res['exit_code'] = 0 if code is None else code if isinstance(code, int) else 1
            except BaseException as e:  # noqa: B902 — every uncaught exception is the cell's result
                res.update(exception_fields(exception_parts(e)))
                res['exit_code'] = 1
                t = e.__traceback__
                while t is not None and t.tb_frame.f_code.co_filename != cmd['code']:
                    t = t.tb_next
                e.__traceback__ = t
                try:
                    sys.excepthook(type(e), e, t)
                except BaseException:
                    pass
            for s in (sys.stdout, sys.stderr):
                try:
                    s.flush()
                except BaseException:
                    pass
        except KeyboardInterrupt:
            res.update(exception_fields(exception_parts(KeyboardInterrupt())))
            res['exit_code'] = 1
        res['execution_ms'] = int((time.monotonic() - t0) * 1000)
        while True:
            try:
                os.write(res_w, json.dumps(res).encode() + b'\n')
                break
            except KeyboardInterrupt:
                continue
