def write_file(path, data):
    # The program may have left a symlink or anything else under this name: replace it, never follow it
    # (O_EXCL fails on any name that exists, a dangling symlink too). Created first, removed only when
    # something is there: one call fewer per file in the common case (each is a gofer walk on gVisor).
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        try:
            os.unlink(path)
        except IsADirectoryError:
            return
        except OSError:
            pass
        try:
            fd = os.open(path, flags, 0o644)
        except OSError:
            return
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


