def main():
    a = parse_args(sys.argv[1:])
    close_stray_fds(a.phase_fd)
    env = program_env(a)
    current = dict(os.environ)
    # PWD is set by sandbox tools (bwrap) to the working directory: harmless, not worth a re-exec.
    if current.get('PWD') == os.getcwd():
        env['PWD'] = current['PWD']
    if current != env:
        if a.reexeced:
            die('environment could not be cleaned')
        # One extra interpreter start only where the environment carries more than it should (Kubernetes).
        orig = getattr(sys, 'orig_argv', None) or [sys.executable] + sys.argv
        argv = [sys.executable] + list(orig[1:]) + ['--reexeced']
        try:
            os.execve(sys.executable, argv, env)
        except OSError as e:
            die('cannot re-exec with a clean environment: %s' % e)

    if a.session:
        run_session(a)  # never returns (45-session.py)

    if a.exec_mode:
        if a.egress_proxy:
            die('--egress-proxy needs the forking mode (not --exec)')
        run_in_process(a)

    # Before anything the program must not reach exists (after the re-exec above, which would reset
    # it). Fail closed: a runner the program could write into is no sandbox.
    if not set_dumpable(False):
        die('cannot make the runner non-dumpable (prctl PR_SET_DUMPABLE)')

    relay = open_relay() if a.egress_proxy else None
    if a.go_port is not None and not a.wait:
        die('--go-port needs --wait')
    go_listener = open_go_listener(a) if a.go_port is not None else None

    import gc
    import resource  # noqa: F401 — os.wait4 imports it for its result; imported once, before the fork
    import select
    import time
    import _signal as signal  # the C module: `signal` would import enum and collections

    if a.wait and a.exec_mode:
        die('--wait cannot be combined with --exec')
    if a.preload and not a.wait:
        die('--preload needs --wait')
    if a.ready_listen and a.go_port is None:
        die('--ready-listen needs --go-port')

    out_dir = a.output

    def announce_execution():
        write_file(os.path.join(out_dir, '.svc_phase'), b'execution')
        if a.phase_fd >= 0:
            try:
                os.write(a.phase_fd, b'execution\n')
            except OSError:
                pass

    if not a.wait:
        announce_execution()

    # --wait: the program's process is forked before `ready` and held at this gate until the go
    # line, so the fork is not part of the run.
    gate_r, gate_w = os.pipe2(os.O_CLOEXEC) if a.wait else (-1, -1)
    # --preload, --ready-listen: the held child says when its imports (and warm-up) are done; `ready`
    # and the ready listener wait for that, so a claim never waits for them.
    held_r, held_w = os.pipe2(os.O_CLOEXEC) if a.preload or a.ready_listen else (-1, -1)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    terminated = []

    def on_term(signum, _frame):
        terminated.append(signum)

    signal.signal(signal.SIGTERM, on_term)
    sys.stdout.flush()
    sys.stderr.flush()
    # The child shares every page of this interpreter copy-on-write; a collection (or the exit) that
    # walks the runner's own objects would copy them all. Frozen, the collector leaves them alone.
    gc.freeze()
    t0 = time.monotonic()
    try:
        pid = os.fork()
    except OSError as e:
        die('cannot fork: %s' % e)
    if pid == 0:
        # The runner's own stderr, for what preload says (closed before the program exists).
        log_fd = os.dup(2) if a.preload else -1
        signal.set_wakeup_fd(-1)
        for fd in (wake_r, wake_w, out_r, err_r, info_r):
            os.close(fd)
        if go_listener is not None:
            go_listener.close()
        if a.phase_fd > 2:
            try:
                os.close(a.phase_fd)
            except OSError:
                pass
        prepare_child(a, out_w, err_w)
        # The program is an ordinary process again (its own /proc entries, attachable by its children
        # as under `python PATH`); the runner stays out of its reach. A held child is this process
        # before its program exists: nothing in the sandbox but the runner, which never attaches.
        set_dumpable(True)
        if a.wait:
            os.close(gate_w)
            if held_r >= 0:
                os.close(held_r)
            if a.preload:
                preload(a.preload, log_fd)
                os.close(log_fd)
                # The preloaded modules are the program's library, not its garbage: frozen, neither
                # the program's collections nor its exit's (exit_like_python) walk them (pandas and
                # numpy: ~50,000 objects, a ~30 ms walk natively, more under gVisor, at every exit).
                gc.freeze()
            if a.warm_up:
                warm_up()
            if held_w >= 0:
                os.write(held_w, b'h')
                os.close(held_w)
            # EOF: the runner ended without a go line (a retired sandbox); nothing runs. The go byte
            # may be followed by the go line's environment, KEY=VALUE lines (one write, one read).
            go = os.read(gate_r, 4096)
            if not go:
                os._exit(0)
            os.close(gate_r)
            reseed()
            for line in go[1:].split(b'\n'):
                if line:
                    k, v = line.decode('utf-8', 'surrogateescape').split('=', 1)
                    os.environ[k] = v
            # A proxy from the go line (its `proxy`, a per-run credential) is the run's only way
            # out: NO_PROXY must not send anything around it.
            if any(k in os.environ for k in PROXY_VARS):
                for k in ('NO_PROXY', 'no_proxy'):
                    os.environ.pop(k, None)
        if relay is not None:
            url = 'http://127.0.0.1:%d' % relay.getsockname()[1]
            relay.close()
            set_proxy_env(url)
        child(a, InfoPipe(info_w))
        os._exit(EXIT_RUNNER_ERROR)  # not reached
    os.close(out_w)
    os.close(err_w)
    os.close(info_w)
    if a.wait:
        # The go line is JSON (wait_for_go): its parser is imported now, while the sandbox waits, and
        # not once the go came (json brings re and enum: tens of ms under gVisor, on the run's path).
        # In this process only: the program's was forked before.
        import json  # noqa: F401
        os.close(gate_r)
        if held_r >= 0:
            os.close(held_w)
            # A byte when the imports are done; EOF if the child died first (the run then shows it).
            while True:
                try:
                    said = os.read(held_r, 1)
                    break
                except InterruptedError:
                    continue
            os.close(held_r)
            # A pool pod whose program process died while it prepared (its preload killed: out of
            # memory) never becomes ready: it ends now, and its pool replaces it.
            if not said and a.ready_listen:
                die('the program process ended before it was ready')
        # --ready-listen: opened now (after the fork: the program's process never has it), closed by
        # accept_go when the go connection comes.
        ready = open_ready_listener(a) if a.ready_listen else None
        wait_for_go(a, accept_go(a, go_listener, ready) if go_listener is not None else 0)
        t0 = time.monotonic()
        go_env = b''.join(('%s=%s\n' % kv).encode('utf-8', 'surrogateescape') for kv in a.go_env.items())
        if len(go_env) >= 4000:
            die('go line environment too large')  # one pipe write must carry it whole
        os.write(gate_w, b'g' + go_env)
        os.close(gate_w)
        # After the gate: the program need not wait for this. The marker still comes before any of
        # its output (only this process writes the phase fd, and frames start below).
        announce_execution()
    if relay is not None:
        start_relay(relay, a.egress_proxy)
    # The go connection stays open for `done`; the program never had it (accepted after the fork).
    if a.phase_fd > 2 and go_listener is None:
        try:
            os.close(a.phase_fd)
        except OSError:
            pass

    cap = a.max_stream_bytes
    bufs = {out_r: bytearray(), err_r: bytearray()}
    truncated = {out_r: False, err_r: False}
    tee_fd = {out_r: 1, err_r: 2}
    info = bytearray()
    info_tail = b''
    open_fds = [out_r, err_r, info_r]
    deadline = t0 + a.timeout
    status = None
    rusage = None
    timed_out = False
    # --wait --prompt-exit: the program's process group is stopped, for the host to remove.
    held = False

    def read_ready(timeout):
        """Reads what is ready within `timeout`; whether anything was."""
        nonlocal info_tail
        try:
            ready, _, _ = select.select(open_fds + [wake_r], [], [], max(0.0, timeout))
        except InterruptedError:
            return True
        for fd in ready:
            if fd == wake_r:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
                continue
            if fd == info_r:
                if len(info) < 65536:
                    info.extend(chunk)
                # The exit notice is the last thing written: looked for here even past the cap.
                info_tail = (info_tail + chunk)[-8:]
                continue
            b = bufs[fd]
            room = cap - len(b)
            if room > 0:
                b.extend(chunk[:room])
                if a.stream_frames and a.phase_fd >= 0:
                    kept = chunk[:room]
                    try:
                        os.write(a.phase_fd, b'%s %d\n' % (b'o' if fd == out_r else b'e', len(kept)) + kept)
                    except OSError:
                        pass
            if len(chunk) > room:
                truncated[fd] = True
            if a.tee:
                try:
                    os.write(tee_fd[fd], chunk)
                except OSError:
                    pass
        return bool(ready)

    while status is None:
        done, st, ru = os.wait4(pid, os.WNOHANG)
        if done:
            status, rusage = st, ru
            break
        if terminated:
            os.killpg(pid, signal.SIGKILL)
            status, rusage = os.wait4(pid, 0)[1:]
            break
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            status, rusage = os.wait4(pid, 0)[1:]
            break
        read_ready(deadline - now)
        if a.prompt_exit:
            # The notice is the program process's last act, after its streams were flushed and
            # closed: it has ended (or, held, stopped itself for good).
            noticed = exit_notice(info_tail)[0]
            if noticed is not None:
                held = a.wait
                try:
                    os.killpg(pid, signal.SIGSTOP if held else signal.SIGKILL)
                except OSError:
                    pass
                status = noticed << 8  # as wait4 encodes an exit status
                break
    elapsed_ms = int((time.monotonic() - t0) * 1000)
    # Whatever the program left behind in its process group goes now (or stays stopped, `held`);
    # then drain what they wrote.
    if not held:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    if held:
        # The program's group is stopped: what is in the pipes now is all that counts (a process that
        # left the group is stopped by the host right after `done`).
        while open_fds and read_ready(0):
            pass
    else:
        drain_until = time.monotonic() + 0.5
        while open_fds and time.monotonic() < drain_until:
            read_ready(drain_until - time.monotonic())

    exit_code = None
    sig = None
    if os.WIFEXITED(status):
        exit_code = os.WEXITSTATUS(status)
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
    if timed_out:
        runner_exit = EXIT_TIMEOUT
        exit_code = None
        sig = signal.SIGKILL
    elif sig is not None:
        runner_exit = 128 + sig
    else:
        runner_exit = exit_code

    exc = {}
    del info[exit_notice(info)[1]:]
    if info:
        parts = info.decode('utf-8', 'replace').split('\0', 3)
        if len(parts) == 4:
            exc = exception_fields(parts)
    phase = 'execution' if timed_out else ('completed' if runner_exit == 0 else 'failed')
    report = {
        'phase': phase,
        'exit_code': exit_code,
        'signal': int(sig) if sig is not None else None,
        'exception': exc.get('exception'),
        'exception_mro': exc.get('exception_mro'),
        'missing_module': exc.get('missing_module'),
        'exception_message': exc.get('exception_message'),
        'execution_ms': elapsed_ms,
        'max_rss_kb': int(rusage.ru_maxrss) if rusage else None,
        'cpu_time_ms': int((rusage.ru_utime + rusage.ru_stime) * 1000) if rusage else None,
        'stdout_truncated': truncated[out_r],
        'stderr_truncated': truncated[err_r],
        'timed_out': timed_out,
    }
    done = b'done %d\n' % runner_exit
    if held and a.stream_frames and a.phase_fd >= 0:
        # The host has the streams from the frames; the report rides on the done line (no files).
        done = b'done %d %s\n' % (runner_exit, to_json(report).encode('utf-8', 'replace'))
    else:
        files = (('.svc_stdout', bytes(bufs[out_r])), ('.svc_stderr', bytes(bufs[err_r])),
                 ('.svc_report.json', to_json(report).encode('utf-8', 'replace')), ('.svc_phase', phase.encode()))
        if a.wait and a.go_port is not None and a.phase_fd >= 0:
            # The collector archives these from the bytes while they are written (send_control).
            send_control(a.phase_fd, files)
        for name, data in files:
            write_file(os.path.join(out_dir, name), data)
    if a.wait and a.phase_fd >= 0:
        try:
            os.write(a.phase_fd, done)
        except OSError:
            pass
    if a.wait and a.prompt_exit:
        # The host kills the sandbox once it has recorded the run (see --prompt-exit); should it not,
        # the runner ends by itself, taking the stopped program with it.
        time.sleep(HELD_LINGER_SEC)
    os._exit(runner_exit)


if __name__ == '__main__':
    main()
