def warm_child(procs, fds, drop, ctl_r, out_w, err_w, inherited, in_r=None):
    """In the forked child: never returns."""
    # Nothing of the spawner's stays open here: another child's control pipe held by this one would
    # never reach EOF. stdio is what the command will get (stdin /dev/null, stdout/stderr the pipes).
    for fd in inherited:
        try:
            os.close(fd)
        except OSError:
            pass
    null = os.open('/dev/null', os.O_RDONLY | os.O_CLOEXEC) if in_r is None else in_r
    os.dup2(null, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    for fd in (null, out_w, err_w):
        os.close(fd)
    try:
        signal.set_wakeup_fd(-1)
        reset_signals()
        os.setsid()
        me = str(os.getpid()).encode()
        for f in procs:
            fd = os.open(f, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, me)
            finally:
                os.close(fd)
        # Parked above the target range until the launch puts them in place.
        parked = [fcntl.fcntl(os.open(f, os.O_RDONLY | os.O_CLOEXEC), fcntl.F_DUPFD_CLOEXEC, 100) for f in fds]
        if drop:
            drop_privileges(int(drop['uid']), int(drop['gid']))
    except Exception as e:  # noqa: B902 — fail closed: no command runs in a half-prepared child
        try:
            os.write(2, ('sandpod spawner: cannot enter the run cgroup or drop privileges: %s\n' % e).encode())
        finally:
            os._exit(WRAPPER_FAILED_EXIT)
    try:
        buf = bytearray()
        while True:
            chunk = os.read(ctl_r, CHUNK)
            if not chunk:
                break
            buf.extend(chunk)
        if not buf:
            os._exit(0)
        spec = json.loads(bytes(buf))
        if spec.get('cwd'):
            os.chdir(spec['cwd'])
        f = spec['file']
        argv = [f] + list(spec['args'])
        caps = spec.get('caps')
        if caps:
            # posix_spawn (vfork-like): no copy of this process's page tables for a child that execs.
            pipes = (os.pipe2(os.O_CLOEXEC), os.pipe2(os.O_CLOEXEC))
            actions = [(os.POSIX_SPAWN_DUP2, pipes[0][1], 1), (os.POSIX_SPAWN_DUP2, pipes[1][1], 2)]
            actions += [(os.POSIX_SPAWN_DUP2, fd, 3 + i) for i, fd in enumerate(parked)]
            pid = os.posix_spawn(f, argv, spec['env'], file_actions=actions)
            for _, w in pipes:
                os.close(w)
            relay(pid, [(pipes[0][0], 1, int(caps[0])), (pipes[1][0], 2, int(caps[1]))])
        for i, fd in enumerate(parked):
            os.dup2(fd, 3 + i)
        os.execve(f, argv, spec['env'])
    except BaseException as e:  # noqa: B902 — whatever went wrong, the child must not return
        try:
            os.write(2, ('sandpod spawner: cannot start %s\n' % (e,)).encode())
        finally:
            os._exit(EXEC_FAILED_EXIT)
    os._exit(EXEC_FAILED_EXIT)


def relay(pid, streams):
    """In a warm child that forked its command: passes at most `cap` bytes of each stream on, drops
    the rest, waits for the command and ends the same way. Never returns."""
    try:
        poller = select.poll()
        room = {}
        for r, out, cap in streams:
            poller.register(r, select.POLLIN)
            room[r] = [out, cap]
        while room:
            for r, _ in poller.poll():
                chunk = os.read(r, CHUNK)
                if not chunk:
                    poller.unregister(r)
                    del room[r]
                    continue
                out, left = room[r]
                if left > 0:
                    part = chunk[:left]
                    room[r][1] = left - len(part)
                    while part:
                        part = part[os.write(out, part):]
        _, st = os.waitpid(pid, 0)
    except BaseException:  # noqa: B902 — the relay must end, and its command with it
        try:
            os.kill(pid, signal.SIGKILL)
        finally:
            os._exit(EXEC_FAILED_EXIT)
    if os.WIFSIGNALED(st):
        sig = os.WTERMSIG(st)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(st))


def close_inherited_fds():
    """Closes every fd but stdio. The service gives this process only fds 0-2; anything else was
    inherited without close-on-exec from whoever started the service (a CI harness, a shell) and
    would otherwise reach every sandbox."""
    try:
        fds = [int(n) for n in os.listdir('/proc/self/fd')]
    except OSError:
        os.closerange(3, 65536)
        return
    for fd in fds:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass


