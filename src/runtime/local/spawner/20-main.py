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
