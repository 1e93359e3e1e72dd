"""sandpod local spawner: a small long-lived root process that starts sandboxes for the local runtime.

Kept as parts (src/runtime/local/spawner/NN-*.py: this text and a child's set-up, the warm child and
the relay, main) and run as their join in name order (spawner.ts), since `python3 -I -S` imports
nothing from beside the script.

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


