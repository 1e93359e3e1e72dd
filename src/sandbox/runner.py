#!/usr/bin/env python3
"""sandpod sandbox runner: runs the user's program inside a sandbox and reports what happened.

The same file is used by every runtime (local bubblewrap/gVisor/process engines, and the `main`
container of a Kubernetes run). Keep the CLI below stable: other runtimes depend on it.

One concern, one file on purpose: everything here is the run of one program (argument parsing, the
clean environment, stream capture, limits, the time limit, the phase file and the report). It is
copied whole into every sandbox and every run's Secret, so it must not import anything of ours.

CLI
    python3 runner.py [options]

    --code PATH             program to run (default /code/main.py)
    --input PATH            input data (default /input/data.json; only checked to exist, the program reads it)
    --output DIR            output directory (default /output); control files are written here
    --timeout SECONDS       execution time limit (float, default 30); on expiry the whole process group
                            of the program is killed with SIGKILL
    --max-stream-bytes N    bytes kept of each of stdout and stderr (default 32768); the rest is read
                            and dropped, and the truncation flag is set
    --tee                   also copy the program's stdout/stderr (uncapped) to the runner's own
                            stdout/stderr, e.g. so `kubectl logs` shows them
    --stream-frames         also write the program's output, as it arrives and within --max-stream-bytes,
                            to the --phase-fd as frames: a line `o LEN` (stdout) or `e LEN` (stderr), then
                            LEN bytes. Length-prefixed, so nothing the program prints reads as a phase line.
    --phase-fd N            write `execution\\n` to fd N just before the program starts (a hint for the
                            runtime; N may be 1). The program never inherits this fd. Every other
                            fd above 2 is closed at start: the program gets stdio and nothing else.
    --env KEY=VALUE         extra environment variable for the program (repeatable; job type env)
    --python-path DIR       directory put on PYTHONPATH (repeatable; e.g. /deps with installed requirements)
    --rlimit NAME=N         resource limit (soft = hard) applied to the program before it starts
                            (repeatable; NAME one of fsize, nproc, nofile, as, core, cpu, stack)
    --cwd DIR               working directory of the program (default: the runner's)
    --tmp DIR               scratch directory named by HOME and TMPDIR (default /tmp)
    --egress-proxy PATH     the run's network is an HTTP proxy on the Unix socket PATH (the sandbox has no
                            other network): the runner listens on a loopback port, relays each connection
                            to PATH, and sets HTTP_PROXY, HTTPS_PROXY and ALL_PROXY (and their lower-case
                            forms) to it in the program's environment. Not with --exec.
    --exec                  run the program in the runner's own process instead of a forked child, for
                            runtimes that watch the sandbox themselves: no --timeout, no stream capture
                            (after the phase marker the program writes to the runner's stdout/stderr),
                            no .svc_stdout/.svc_stderr; .svc_report.json is written only for an uncaught
                            exception (its exception fields, exit_code 1). The exit status is the
                            program's, exactly as with `python PATH`.
    --wait                  warm sandbox (local runtime): start, load everything, fork the program's
                            process (held until the go line), write `ready\n` to the phase fd, then block reading one line from stdin: a JSON object
                            {"timeout": SECONDS, "max_stream_bytes": N} (both optional) that overrides
                            those options. The host writes the program and its input into the
                            (read-only to the sandbox) /code and /input mounts before that line (on
                            Kubernetes the pod's collector does, see --go-port), or puts them in the
                            line as "code" and "input" strings: the runner then writes them to the
                            --code and --input paths before the program starts (only where those
                            are the runner's to write; no runtime of ours uses this any more).
                            The line may be up to 64 MiB. fd 0 is
                            then replaced by /dev/null, so the program never sees the channel; EOF
                            without a line ends the runner with exit status 123 and nothing run (a
                            retired sandbox, or a hand-over that failed: the host must not take it
                            for a program's success). The run then goes on as
                            without --wait, and after the report is written the runner writes
                            `done N\n` (N its exit status) to the phase fd, so the host need not wait
                            for the sandbox's teardown. Not with --exec or --egress-proxy.
    --go-port PORT          with --wait (Kubernetes pool pods): the go line and the phase lines travel over
                            one TCP connection on 127.0.0.1:PORT instead of stdin and the phase fd. The
                            runner listens before anything else runs in the pod (so no program can hold
                            the port), takes the first connection (the pod's `collector`, which wrote the
                            program and input into volumes this container mounts read-only: see
                            deliver.py), writes `ready`, reads the go line from it, then writes
                            `execution` and `done N` to it. stdout and stderr then carry only what
                            --tee copies (the program's output), as in a cold pod. The connection
                            closing before the go line is EOF (exit 123).
    --warm-up               with --wait: while it waits for the go line, the program's process compiles,
                            runs and collects an empty module once, so that the memory a program's start
                            and exit write is its own already (see warm_up). For sandboxes that wait long
                            before their go line (a local pool); it costs CPU right at start, which a pod
                            whose go line comes at once (a CPU-limited cold pod) would wait for.
    --prompt-exit           the host measures the run's resources itself (the local runtime's cgroups),
                            so the runner need not wait for the kernel to tear the program's process
                            down (about half a millisecond for a forked interpreter) to learn its exit
                            status from wait4: when the program's process says it is exiting (its last
                            act, after flushing and closing its streams, is a notice with its status on
                            the info pipe), its process group is killed, what is left in the pipes read,
                            and that status taken. max_rss_kb and cpu_time_ms are then null (a signal
                            death sends no notice and is taken from wait4). A program that
                            sends the notice itself and keeps running is killed there, as if it had
                            exited with that status (which it could have done). Without the option the
                            status and resource usage come from wait4 as always.
                            With --wait, where the host removes the whole sandbox after the run, the
                            program's process stops itself after its notice, the rest of its process
                            group is stopped (SIGSTOP) instead of killed, and the runner stays after
                            `done N` (at most 60 s) until the host kills it: nothing of the program runs
                            any more, and the teardown of its processes waits until the host has taken
                            the result, instead of competing with it for the CPU. With --stream-frames
                            as well (the host has the streams from the frames), the report is not
                            written to files but sent on the done line: `done N {report}`.

Environment
    The program's environment is built from scratch: PATH, HOME and TMPDIR (--tmp), LANG=C.UTF-8,
    PYTHONPATH (from --python-path) and the --env pairs (plus PWD when it names the working directory). When the runner's own environment differs
    from that (e.g. Kubernetes injected KUBERNETES_* variables), the runner re-executes itself once with
    exactly that environment, so not even /proc/<runner pid>/environ shows anything else.

Files written (all in --output)
    .svc_phase          `execution` before the program starts, then `completed` (exit 0) or `failed`;
                        left at `execution` when the timeout fired
    .svc_stdout         captured stdout (at most --max-stream-bytes bytes)
    .svc_stderr         captured stderr (same cap); an uncaught exception's traceback is printed
                        exactly as CPython prints it
    .svc_report.json    {phase, exit_code, signal, exception, missing_module, exception_message,
                         execution_ms, max_rss_kb, cpu_time_ms, stdout_truncated, stderr_truncated,
                         timed_out}
    The report is untrusted by design: the program runs with the runner's uid and can overwrite it.

Exit status of the runner
    the program's exit code when it exited (SystemExit semantics as in CPython);
    128 + N when the program was killed by signal N;
    124 when the execution timeout fired (the program was killed);
    125 when the runner itself failed (bad arguments, cannot fork).

How the program is run
    No second interpreter: the runner forks itself; the child calls setsid(), applies rlimits, points
    fds 0/1/2 at /dev/null and the capture pipes, sets sys.argv / sys.path[0] as `python PATH` would,
    and compiles and executes the file in a fresh `__main__` module (what runpy.run_path does, without
    runpy's imports). Uncaught exceptions go through sys.excepthook with the runner's frames removed.
    At the end the child does what the interpreter's exit does that a program can observe (threads
    joined, atexit, its objects finalized, streams flushed) and leaves with os._exit, skipping the
    teardown of the whole interpreter.
    The runner's own objects are frozen (gc.freeze) before the fork, so the program's garbage
    collections do not walk, and copy, the pages it shares with the runner.
    The forking runner is not dumpable (prctl PR_SET_DUMPABLE 0; the program is set dumpable again):
    the program cannot open its /proc/<pid>/mem, ptrace it or use process_vm_* on it. When prctl
    cannot be called the runner exits 125. (--exec: the runner is the program; nothing to protect.)
"""
import os
import sys

EXIT_TIMEOUT = 124
EXIT_RUNNER_ERROR = 125
EXIT_NOT_DELIVERED = 123  # --wait: stdin closed before the go line; no program ran
# --wait --prompt-exit: how long the runner stays after `done` for the host to remove the sandbox.
HELD_LINGER_SEC = 60
BASE_PATH = '/usr/local/bin:/usr/bin:/bin'
RLIMITS = {
    'fsize': 'RLIMIT_FSIZE',
    'nproc': 'RLIMIT_NPROC',
    'nofile': 'RLIMIT_NOFILE',
    'as': 'RLIMIT_AS',
    'core': 'RLIMIT_CORE',
    'cpu': 'RLIMIT_CPU',
    'stack': 'RLIMIT_STACK',
}


class Args:
    code = '/code/main.py'
    input = '/input/data.json'
    output = '/output'
    timeout = 30.0
    max_stream_bytes = 32768
    tee = False
    stream_frames = False
    phase_fd = -1
    cwd = None
    tmp = '/tmp'
    reexeced = False
    exec_mode = False
    egress_proxy = None
    wait = False
    prompt_exit = False
    warm_up = False
    go_port = None

    def __init__(self):
        self.env = []
        self.python_path = []
        self.rlimits = []


def die(msg):
    os.write(2, ('sandpod runner: %s\n' % msg).encode())
    os._exit(EXIT_RUNNER_ERROR)


def parse_args(argv):
    a = Args()
    i = 0
    valued = {'--code', '--input', '--output', '--timeout', '--max-stream-bytes', '--phase-fd', '--env',
              '--python-path', '--rlimit', '--cwd', '--tmp', '--egress-proxy', '--go-port'}
    while i < len(argv):
        opt = argv[i]
        val = None
        if '=' in opt and opt.startswith('--') and opt.split('=', 1)[0] in valued:
            opt, val = opt.split('=', 1)
        elif opt in valued:
            i += 1
            if i >= len(argv):
                die('%s needs a value' % opt)
            val = argv[i]
        try:
            if opt == '--code':
                a.code = val
            elif opt == '--input':
                a.input = val
            elif opt == '--output':
                a.output = val
            elif opt == '--timeout':
                a.timeout = float(val)
            elif opt == '--max-stream-bytes':
                a.max_stream_bytes = int(val)
            elif opt == '--phase-fd':
                a.phase_fd = int(val)
            elif opt == '--env':
                if '=' not in val:
                    die('--env needs KEY=VALUE')
                a.env.append(val)
            elif opt == '--python-path':
                a.python_path.append(val)
            elif opt == '--rlimit':
                name, n = val.split('=', 1)
                if name not in RLIMITS:
                    die('unknown rlimit %s' % name)
                a.rlimits.append((name, int(n)))
            elif opt == '--cwd':
                a.cwd = val
            elif opt == '--tmp':
                a.tmp = val
            elif opt == '--egress-proxy':
                a.egress_proxy = val
            elif opt == '--tee':
                a.tee = True
            elif opt == '--stream-frames':
                a.stream_frames = True
            elif opt == '--exec':
                a.exec_mode = True
            elif opt == '--wait':
                a.wait = True
            elif opt == '--prompt-exit':
                a.prompt_exit = True
            elif opt == '--warm-up':
                a.warm_up = True
            elif opt == '--go-port':
                a.go_port = int(val)
            elif opt == '--reexeced':
                a.reexeced = True
            else:
                die('unknown option %s' % opt)
        except ValueError:
            die('bad value for %s: %r' % (opt, val))
        i += 1
    return a


def program_env(a):
    """The program's whole environment, built from scratch."""
    env = {'PATH': BASE_PATH, 'HOME': a.tmp, 'TMPDIR': a.tmp, 'LANG': 'C.UTF-8'}
    if a.python_path:
        env['PYTHONPATH'] = ':'.join(a.python_path)
    for kv in a.env:
        k, v = kv.split('=', 1)
        env[k] = v
    return env


def write_file(path, data):
    # The program may have left a symlink or anything else under this name: replace it, never follow it.
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        return
    except OSError:
        pass
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        return
    try:
        while data:
            n = os.write(fd, data)
            data = data[n:]
    except OSError:
        pass
    finally:
        os.close(fd)


def apply_rlimits(a, err_fd):
    if a.rlimits:
        import resource
        for name, n in a.rlimits:
            try:
                resource.setrlimit(getattr(resource, RLIMITS[name]), (n, n))
            except (ValueError, OSError) as e:
                os.write(err_fd, ('sandpod runner: cannot set rlimit %s: %s\n' % (name, e)).encode())
                os._exit(EXIT_RUNNER_ERROR)


def prepare_child(a, out_w, err_w):
    """In the forked child, before the program: default signals, its own session, rlimits, fds 0-2, cwd."""
    import _signal
    _signal.set_wakeup_fd(-1)
    for s in (_signal.SIGCHLD, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGALRM):
        _signal.signal(s, _signal.SIG_DFL)
    os.setsid()
    apply_rlimits(a, err_w)
    null = os.open('/dev/null', os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    for fd in (null, out_w, err_w):
        if fd > 2:
            os.close(fd)
    if a.cwd:
        os.chdir(a.cwd)


def warm_up():
    """--wait --warm-up, in the held child: the work of a program's start and end, done once on nothing.

    The child shares the runner's memory copy-on-write: the first write to a page (a reference count,
    the compiler's and the allocator's state, the collector's lists) copies it, a fault each. Compiling
    and running an empty module and collecting once before the go copies most of the pages a program's
    start and exit will write, so the program does not wait for them. Nothing of it outlives this
    function but those private pages.
    """
    import builtins
    import gc
    scratch = {'__builtins__': builtins, '__name__': '__warm__'}
    exec(compile('pass\n', '<warm>', 'exec'), scratch)
    scratch.clear()
    gc.collect()


def child(a, info):
    """Runs in the forked child (prepared); never returns (ends as `python PATH` would: exit_like_python)."""
    import _signal
    # Taken before the program runs: it may replace what the os module holds, not these.
    close, kill, getpid, exit_now = os.close, os.kill, os.getpid, os._exit
    try:
        run_program(a, lambda e: report_exception(e, info))
    except SystemExit as e:
        status = exit_like_python(e)
        # The exit notice (see --prompt-exit), and the streams closed so they reach EOF now rather
        # than after the exit's teardown.
        noticed = info.write(EXIT_NOTICE + b'%d' % status)
        for fd in (0, 1, 2):
            try:
                close(fd)
            except OSError:
                pass
        info.close()
        if noticed and a.wait and a.prompt_exit:
            # Stopped, not gone: the runner has the notice and the host removes the sandbox once it
            # has the result (see --prompt-exit).
            kill(getpid(), _signal.SIGSTOP)
        exit_now(status)


# Starts the exit notice, the last thing a program's process writes on the info pipe: EXIT_NOTICE
# and its exit status in decimal (see --prompt-exit). Never part of an exception record.
EXIT_NOTICE = b'\x1e'


def exit_notice(info):
    """The status an info pipe's trailing exit notice gives and where the notice starts, or (None, len)."""
    at = info.rfind(EXIT_NOTICE)
    tail = bytes(info[at + 1:]) if at >= 0 else b''
    if at < 0 or not tail.isdigit() or len(tail) > 3 or int(tail) > 255:
        return None, len(info)
    return int(tail), at


class InfoPipe:
    """The child's end of the info pipe, written only while that fd is still the pipe it was at the fork.

    The program may close fds it does not know (closerange) and open files that get the same number;
    a write to that number then would land in the program's file.
    """

    def __init__(self, fd):
        self.fd = fd
        # The os functions as they are before the program runs (it may replace the module's).
        self._fstat, self._write, self._close = os.fstat, os.write, os.close
        st = os.fstat(fd)
        self.ident = (st.st_dev, st.st_ino)

    def _ours(self):
        try:
            st = self._fstat(self.fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.ident

    def write(self, data):
        """Whether all of data was written."""
        try:
            return self._ours() and self._write(self.fd, data) == len(data)
        except OSError:
            return False

    def close(self):
        try:
            if self._ours():
                self._close(self.fd)
        except OSError:
            pass


def exit_like_python(e):
    """Ends the forked program as the interpreter's exit would, minus tearing the interpreter down;
    returns the status to exit with.

    What `python PATH` does at exit and a program can observe: SystemExit's status (None is 0, an int
    is itself, anything else is printed to stderr and gives 1), non-daemon threads joined, atexit
    handlers run, the program's objects finalized (its globals dropped and cycles collected, so files
    it left open are flushed and closed and __del__ runs), stdout and stderr flushed (120 when stdout
    cannot be). Freeing the rest of the interpreter (the runner's own frozen objects, every module)
    changes nothing outside the process and costs milliseconds in a forked child, whose exit copies
    the pages it touches; os._exit skips it.
    """
    code = e.code
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xff
    else:
        try:
            sys.stdout.flush()
        except BaseException:
            pass
        try:
            sys.stderr.write('%s\n' % (code,))
        except BaseException:
            pass
        status = 1
    e = None  # noqa: F841 — no reference from here to the program's frames
    threading = sys.modules.get('threading')
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    try:
        import atexit
        atexit._run_exitfuncs()
    except BaseException:
        pass
    try:
        main_mod = sys.modules.get('__main__')
        if main_mod is not None:
            main_mod.__dict__.clear()
        import gc
        gc.collect()
    except BaseException:
        pass
    try:
        sys.stdout.flush()
    except BaseException:
        status = 120
    try:
        sys.stderr.flush()
    except BaseException:
        pass
    return status


def run_program(a, on_exception):
    """Runs the program as `python PATH` would in this process; never returns."""
    import _signal
    code_path = os.path.abspath(a.code)
    sys.argv = [a.code]
    sys.path[0] = os.path.dirname(code_path)
    # What `python PATH` does, without runpy (whose imports would cost more than the program):
    # a fresh __main__ module, the file compiled with its own name, executed in that module.
    import builtins
    main_mod = type(sys)('__main__')
    main_mod.__file__ = a.code
    main_mod.__cached__ = None
    main_mod.__builtins__ = builtins
    try:
        main_mod.__loader__ = sys.modules['_frozen_importlib_external'].SourceFileLoader('__main__', a.code)
    except (KeyError, AttributeError):
        pass
    sys.modules['__main__'] = main_mod
    try:
        with open(a.code, 'rb') as f:
            source = f.read()
        exec(compile(source, a.code, 'exec'), main_mod.__dict__)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: B902 — every uncaught exception is reported, like CPython does
        on_exception(e)
        # Drop the runner's frames so the traceback starts where `python PATH` would start it.
        t = e.__traceback__
        while t is not None and t.tb_frame.f_code.co_filename not in (a.code, code_path):
            t = t.tb_next
        e.__traceback__ = t
        try:
            sys.excepthook(type(e), e, t)
        except BaseException:
            pass
        if isinstance(e, KeyboardInterrupt):
            sys.stdout.flush()
            sys.stderr.flush()
            _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
            os.kill(os.getpid(), _signal.SIGINT)
        raise SystemExit(1)
    raise SystemExit(0)


def exception_parts(e):
    """class, MRO (comma-separated), missing module, message."""
    cls = type(e)
    missing = getattr(e, 'name', None) if isinstance(e, ImportError) else None
    try:
        msg = str(e)[:2000]
    except BaseException:
        msg = ''
    return [cls.__name__, ','.join(c.__name__ for c in cls.__mro__), missing if isinstance(missing, str) else '', msg]


def exception_fields(parts):
    return {'exception': parts[0], 'exception_mro': parts[1].split(',') if parts[1] else None,
            'missing_module': parts[2] or None, 'exception_message': parts[3]}


def report_exception(e, info):
    # NUL-separated so the parent needs no json module.
    try:
        info.write('\0'.join(p.replace('\0', ' ').replace('\x1e', ' ') for p in exception_parts(e)).encode('utf-8', 'replace'))
    except BaseException:
        pass


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


def accept_go(a, listener):
    """--go-port: the first connection becomes the go channel and the phase fd; the port is let go."""
    while True:
        try:
            conn, _ = listener.accept()
            break
        except InterruptedError:
            continue
        except OSError:
            os._exit(EXIT_NOT_DELIVERED)
    listener.close()
    a.phase_fd = os.dup(conn.fileno())
    conn.close()
    return a.phase_fd


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
    while b'\n' not in buf and len(buf) < MAX_GO_LINE:
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

    if a.wait and (a.exec_mode or a.egress_proxy):
        die('--wait cannot be combined with --exec or --egress-proxy')

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
            if a.warm_up:
                warm_up()
            # EOF: the runner ended without a go line (a retired sandbox); nothing runs.
            if not os.read(gate_r, 1):
                os._exit(0)
            os.close(gate_r)
        if relay is not None:
            url = 'http://127.0.0.1:%d' % relay.getsockname()[1]
            relay.close()
            for k in ('NO_PROXY', 'no_proxy'):
                os.environ.pop(k, None)
            for k in ('HTTP_PROXY', 'HTTPS_PROXY', 'ALL_PROXY', 'http_proxy', 'https_proxy', 'all_proxy'):
                os.environ[k] = url
        child(a, InfoPipe(info_w))
        os._exit(EXIT_RUNNER_ERROR)  # not reached
    os.close(out_w)
    os.close(err_w)
    os.close(info_w)
    if a.wait:
        os.close(gate_r)
        wait_for_go(a, accept_go(a, go_listener) if go_listener is not None else 0)
        t0 = time.monotonic()
        os.write(gate_w, b'g')
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
        write_file(os.path.join(out_dir, '.svc_stdout'), bytes(bufs[out_r]))
        write_file(os.path.join(out_dir, '.svc_stderr'), bytes(bufs[err_r]))
        write_file(os.path.join(out_dir, '.svc_report.json'), to_json(report).encode('utf-8', 'replace'))
        write_file(os.path.join(out_dir, '.svc_phase'), phase.encode())
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
