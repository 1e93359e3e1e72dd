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
        # What only the run knows (its TRACEPARENT): it crosses the gate to the held child as
        # KEY=VALUE lines, so neither may hold a newline, and the key no '='.
        env = msg.get('env', {})
        for k, v in env.items():
            if not (isinstance(k, str) and isinstance(v, str)) or not k or '=' in k or any(c in k + v for c in '\n\0'):
                raise TypeError('env')
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


