"""sandpod local spawner: a small long-lived root process that starts sandboxes for the local runtime.

Why: forking the service's Node process for every sandbox costs milliseconds of CPU on its main
thread (page tables of a large heap, then an exec), plus a `sh` per run. This process is small, so its
fork is cheap, and its pre-forked ("warm") children already sit in their run's cgroups when a run
arrives: moving a process between cgroups costs an RCU grace period, which stays off the critical path.

Protocol: one JSON object per line on stdin (commands) and stdout (events). Nothing else is read or
written; diagnostics go to stderr.

    {"op": "warm", "id": ID, "procs": [cgroup.procs files], "fds": [files], "drop": {"uid": U, "gid": G}|null,
     "stdin": true|absent, "fifos": [IN, OUT]|absent}
        fork a child: new session, signals reset, enters the cgroups, opens `fds` read-only (they
        become fds 3, 4, ... of the command), with "stdin" gets a pipe from this process as stdin
        (instead of /dev/null; see "input"), then — with "drop" — gives up
        root exactly as `setpriv --reuid=U --regid=G --clear-groups --inh-caps=-all --no-new-privs`
        would (exit 199 when any of that fails), and waits for its command.
        With "fifos" the child's stdin and stdout are not this process's pipes but two named pipes
        made at those paths (mode 600), whose other ends the service opens itself: a warm sandbox's
        go line and its runner's answers then pass no process in between. The service opens them
        after the "pid" event and before "launch" (until the launch this process holds a reader of
        OUT, so the service's open of IN for writing and of OUT for reading never blocks, and the
        command cannot find its stdin without a writer). No "out" events come for such a child.
    {"op": "launch", "id": ID, "file": F, "args": [...], "env": {...}, "cwd": DIR|null, "caps": [O, E]|null}
        the warm child (stdin /dev/null, stdout/stderr pipes read by this process) changes directory
        when asked and execs F (exit 127 when it cannot). With "caps" it spawns F instead and stays, in
        the run's cgroups, as a relay: at most O bytes of F's stdout and E of its stderr are passed on,
        the rest is read and dropped there (charged to the run, not to this process), and it ends as
        F ended (same exit code, or the same signal).
    {"op": "input", "id": ID, "d": TEXT}
        writes TEXT (UTF-8) to the stdin pipe of a child warmed with "stdin" and closes the pipe: one
        message, once (a warm sandbox's go line).
    {"op": "kill", "id": ID}
        SIGKILL to the child's process group, unless it was reaped already (no pid reuse races).
    events: {"ev": "pid", "id", "pid"}, {"ev": "out"|"err", "id", "d": latin-1 text},
            {"ev": "exit", "id", "code": int|null, "sig": int|null} once the child was reaped and both
            of its pipes reached EOF (what Node's 'close' means).

At start every fd but 0-2 is closed, so nothing the service inherited reaches a sandbox.
Neither this process nor a warm child's stream relay is inside a sandbox: they live in the host's PID
namespace, which a program in a sandbox (its own PID namespace) cannot name, so it cannot open their
/proc entries, attach to them or use process_vm_* on them.
When stdin closes (the service went away) every child's process group is killed and the spawner exits.
"""
import ctypes
import fcntl
import gc
import json
import os
import select
import sys

import _signal as signal

WRAPPER_FAILED_EXIT = 199
EXEC_FAILED_EXIT = 127
CHUNK = 65536


class Child:
    __slots__ = ('id', 'pid', 'ctl_w', 'in_w', 'hold', 'fds', 'status')

    def __init__(self, cid, pid, ctl_w, out_r, err_r, in_w=None, hold=None):
        self.id = cid
        self.pid = pid
        self.ctl_w = ctl_w
        self.in_w = in_w
        self.hold = hold
        self.fds = {err_r: 'err'} if out_r is None else {out_r: 'out', err_r: 'err'}
        self.status = None

    def release_hold(self):
        if self.hold is not None:
            os.close(self.hold)
            self.hold = None


def open_fifos(in_path, out_path):
    """Makes the named pipes of a "fifos" child; returns (its stdin, its stdout, this process's
    reader of OUT held until the launch). Opened without blocking: IN for reading has no writer yet
    (the service opens one before the launch), OUT gets a writer because the held reader exists."""
    made = []
    try:
        for p in (in_path, out_path):
            os.mkfifo(p, 0o600)
            made.append(p)
        in_r = os.open(in_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        hold = os.open(out_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        out_w = os.open(out_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        for p in made:
            try:
                os.unlink(p)
            except OSError:
                pass
        raise
    # The command gets ordinary blocking pipe ends, as with the spawner's own pipes.
    for fd in (in_r, out_w):
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return in_r, out_w, hold


def emit(obj):
    data = (json.dumps(obj, separators=(',', ':')) + '\n').encode()
    while data:
        n = os.write(1, data)
        data = data[n:]


def write_and_close(fd, data):
    """Writes all of data to a child's pipe (a child gone early just loses it), then closes it."""
    try:
        while data:
            n = os.write(fd, data)
            data = data[n:]
    except OSError:
        pass
    os.close(fd)


def reset_signals():
    for s in range(1, signal.NSIG):
        if s in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(s, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
    except (OSError, ValueError):
        pass


PR_SET_NO_NEW_PRIVS = 38
LINUX_CAPABILITY_VERSION_3 = 0x20080522
_libc = None


def drop_privileges(uid, gid):
    """setpriv --reuid=uid --regid=gid --clear-groups --inh-caps=-all --no-new-privs, in-process."""
    libc = _libc
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), 'prctl(PR_SET_NO_NEW_PRIVS)')
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    # Leaving uid 0 cleared the permitted, effective and ambient sets; the inheritable set stays
    # unless cleared, so clear everything explicitly (header: version, pid 0 = this thread).
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), 'capset')
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise OSError(0, 'ids did not change')


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


def main():
    global _libc
    close_inherited_fds()
    _libc = ctypes.CDLL(None, use_errno=True)
    # Every warm child shares this process's pages copy-on-write until it execs: a collection walking
    # all objects would copy them. Nothing here makes reference cycles, so the collector stays off.
    gc.disable()
    gc.freeze()
    children = {}
    by_pid = {}
    by_fd = {}
    poller = select.poll()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    # The service decides when this process ends (by closing stdin), not a signal to its process group.
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    poller.register(0, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    inbuf = bytearray()

    def finish_if_done(c):
        if c.status is None or c.fds:
            return
        st = c.status
        code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else None
        sig = os.WTERMSIG(st) if os.WIFSIGNALED(st) else None
        children.pop(c.id, None)
        emit({'ev': 'exit', 'id': c.id, 'code': code, 'sig': sig})

    def reap():
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            c = by_pid.pop(pid, None)
            if c is None:
                continue
            c.status = st
            if c.ctl_w is not None:
                os.close(c.ctl_w)
                c.ctl_w = None
            if c.in_w is not None:
                os.close(c.in_w)
                c.in_w = None
            c.release_hold()
            finish_if_done(c)

    def kill(c):
        if c.status is not None:
            return
        try:
            os.killpg(c.pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(c.pid, signal.SIGKILL)
            except OSError:
                pass

    def command(msg):
        op = msg.get('op')
        cid = msg.get('id')
        if op == 'warm':
            ctl_r, ctl_w = os.pipe2(os.O_CLOEXEC)
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            in_r, in_w = os.pipe2(os.O_CLOEXEC) if msg.get('stdin') and not msg.get('fifos') else (None, None)
            hold = None
            try:
                if msg.get('fifos'):
                    os.close(out_r)
                    os.close(out_w)
                    out_r = out_w = None
                    in_r, out_w, hold = open_fifos(*msg['fifos'])
                pid = os.fork()
            except OSError as e:
                for fd in (ctl_r, ctl_w, out_r, out_w, err_r, err_w, in_r, in_w, hold):
                    if fd is not None:
                        os.close(fd)
                emit({'ev': 'exit', 'id': cid, 'code': None, 'sig': None, 'error': 'cannot start: %s' % e})
                return
            if pid == 0:
                inherited = [ctl_w, err_r, wake_r, wake_w] + list(by_fd)
                inherited += [c.ctl_w for c in children.values() if c.ctl_w is not None]
                inherited += [c.in_w for c in children.values() if c.in_w is not None]
                inherited += [c.hold for c in children.values() if c.hold is not None]
                inherited += [fd for fd in (out_r, in_w, hold) if fd is not None]
                warm_child(msg.get('procs') or [], msg.get('fds') or [], msg.get('drop'), ctl_r, out_w, err_w, inherited, in_r)
            for fd in (ctl_r, out_w, err_w, in_r):
                if fd is not None:
                    os.close(fd)
            c = Child(cid, pid, ctl_w, out_r, err_r, in_w, hold)
            children[cid] = c
            by_pid[pid] = c
            for fd in c.fds:
                by_fd[fd] = c
                poller.register(fd, select.POLLIN)
            emit({'ev': 'pid', 'id': cid, 'pid': pid})
        elif op == 'launch':
            c = children.get(cid)
            if c is None or c.ctl_w is None:
                return
            write_and_close(c.ctl_w, json.dumps({'file': msg['file'], 'args': msg.get('args') or [], 'env': msg.get('env') or {},
                                                 'cwd': msg.get('cwd'), 'caps': msg.get('caps')}).encode())
            c.ctl_w = None
            c.release_hold()
        elif op == 'input':
            c = children.get(cid)
            if c is None or c.in_w is None:
                return
            write_and_close(c.in_w, str(msg.get('d') or '').encode())
            c.in_w = None
        elif op == 'kill':
            c = children.get(cid)
            if c is not None:
                kill(c)

    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        for fd, ev in events:
            if fd == wake_r:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                reap()
            elif fd == 0:
                chunk = os.read(0, CHUNK)
                if not chunk:
                    for c in list(children.values()):
                        kill(c)
                    os._exit(0)
                inbuf.extend(chunk)
                while True:
                    nl = inbuf.find(b'\n')
                    if nl < 0:
                        break
                    line = bytes(inbuf[:nl])
                    del inbuf[:nl + 1]
                    if line.strip():
                        command(json.loads(line))
            else:
                c = by_fd.get(fd)
                if c is None:
                    continue
                try:
                    chunk = os.read(fd, CHUNK)
                except OSError:
                    chunk = b''
                if chunk:
                    emit({'ev': c.fds[fd], 'id': c.id, 'd': chunk.decode('latin-1')})
                    continue
                poller.unregister(fd)
                os.close(fd)
                del by_fd[fd]
                del c.fds[fd]
                finish_if_done(c)
        # SIGCHLD may have arrived while handling other fds.
        reap()


if __name__ == '__main__':
    try:
        main()
    except BrokenPipeError:
        os._exit(0)
    except Exception as e:  # noqa: B902
        os.write(2, ('sandpod spawner failed: %r\n' % (e,)).encode())
        os._exit(1)
