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
    ready_listen = None
    session = False

    def __init__(self):
        self.env = []
        # --wait: variables the go line adds to the program's environment (its TRACEPARENT).
        self.go_env = {}
        self.python_path = []
        self.rlimits = []
        self.preload = []


def die(msg):
    os.write(2, ('sandpod runner: %s\n' % msg).encode())
    os._exit(EXIT_RUNNER_ERROR)


def parse_args(argv):
    a = Args()
    i = 0
    valued = {'--code', '--input', '--output', '--timeout', '--max-stream-bytes', '--phase-fd', '--env',
              '--python-path', '--rlimit', '--cwd', '--tmp', '--egress-proxy', '--go-port',
              '--preload', '--ready-listen'}
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
            elif opt == '--session':
                a.session = True
            elif opt == '--warm-up':
                a.warm_up = True
            elif opt == '--go-port':
                a.go_port = int(val)
            elif opt == '--preload':
                a.preload.extend(m for m in val.split(',') if m)
            elif opt == '--ready-listen':
                a.ready_listen = val
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


