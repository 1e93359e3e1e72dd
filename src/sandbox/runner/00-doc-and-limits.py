#!/usr/bin/env python3
"""sandpod sandbox runner: runs the user's program inside a sandbox and reports what happened.

The same file is used by every runtime (local bubblewrap/gVisor/process engines, and the `main`
container of a Kubernetes run). Keep the CLI below stable: other runtimes depend on it.

One concern, one file on purpose: everything here is the run of one program (argument parsing, the
clean environment, stream capture, limits, the time limit, the phase file and the report). It is
copied whole into every sandbox and every run's Secret, so it must not import anything of ours.
The source is kept as parts, src/sandbox/runner/NN-*.py, joined in name order into this one file
(src/sandbox/paths.ts; `npm run build` writes dist/sandbox/runner.py): a part is a concern (this
text and the limits, arguments, the program's process, the in-process runner and relay, the go
channel, main), and the joined file is what every sandbox gets.

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
                            {"timeout": SECONDS, "max_stream_bytes": N, "env": {"KEY": "VALUE"}} (all
                            optional) that overrides those options; "env" adds to the program's
                            environment what only the run knows (its TRACEPARENT). The host writes the program and its input into the
                            (read-only to the sandbox) /code and /input mounts before that line (on
                            Kubernetes the pod's collector does, see --go-port), or puts them in the
                            line as "code" and "input" strings: the runner then writes them to the
                            --code and --input paths before the program starts (only where those
                            are the runner's to write; no runtime of ours uses this any more).
                            Lines `ping` before it are each answered `ready\n` on the phase fd (a
                            sandbox restored from a checkpoint taken while it waited says so once it
                            runs again). At the go the program's process reseeds `random`,
                            `numpy.random` and tempfile's names (see reseed).
                            The line may be up to 64 MiB. fd 0 is
                            then replaced by /dev/null, so the program never sees the channel; EOF
                            without a line ends the runner with exit status 123 and nothing run (a
                            retired sandbox, or a hand-over that failed: the host must not take it
                            for a program's success). The run then goes on as
                            without --wait, and after the report is written the runner writes
                            `done N\n` (N its exit status) to the phase fd, so the host need not wait
                            for the sandbox's teardown. Not with --exec. With --egress-proxy the
                            relay starts at the go line. The go line may carry "proxy": a URL (e.g.
                            http://run-credential@proxy:3128, Kubernetes pool pods with allowed_hosts)
                            that the program's HTTP(S)_PROXY and ALL_PROXY (both cases) are set to at
                            the go: a per-run credential is never baked into a sandbox at its start.
    --session               a persistent interpreter that runs cells one after another (sessions, issue 19);
                            see run_session in the session part for its channel. Not with --wait or --exec.
                            With --egress-proxy the interpreter's proxy variables name the runner's
                            loopback relay, as a one-shot program's do.
    --go-port PORT          with --wait (Kubernetes pool pods): the go line and the phase lines travel over
                            one TCP connection on 127.0.0.1:PORT instead of stdin and the phase fd. The
                            runner listens before anything else runs in the pod (so no program can hold
                            the port), takes the first connection (the pod's `collector`, which wrote the
                            program and input into volumes this container mounts read-only: see
                            deliver.py), writes `ready`, reads the go line from it, then writes
                            `execution`, the report's files (a line `control NAME LEN ...` and their
                            bytes, for the collector's outputs archive; they are written to --output
                            too) and `done N` to it. stdout and stderr then carry only what
                            --tee copies (the program's output), as in a cold pod. The connection
                            closing before the go line is EOF (exit 123).
    --warm-up               with --wait: while it waits for the go line, the program's process compiles,
                            runs and collects an empty module once, so that the memory a program's start
                            and exit write is its own already (see warm_up). For sandboxes that wait long
                            before their go line (a local pool); it costs CPU right at start, which a pod
                            whose go line comes at once (a CPU-limited cold pod) would wait for.
    --preload M1,M2         with --wait: the program's process imports these modules (comma-separated,
                            repeatable) before it waits for the go line, with the program's rlimits and
                            environment, so the program's own `import` costs nothing. What the imports
                            print goes to the runner's stderr (its log), not into the program's
                            streams. A module that fails to import is logged there (`sandpod runner:
                            preload of M failed, skipped: ...`) and skipped, with whatever it imported
                            dropped from sys.modules, so the program then gets the real error.
                            What the imports built is then frozen (gc.freeze): the program's
                            collections, and its exit's, walk only the program's own objects.
    --ready-listen HOST:PORT with --go-port: once the go port is held and the held program process has
                            done its --preload and --warm-up, the runner listens on HOST:PORT (a
                            Kubernetes pool pod's own IP) and accepts and closes at once whatever
                            connects there: a `tcpSocket` startup probe, so the pod counts as ready
                            only then, without an exec into the sandbox. The listener is opened after
                            the fork, close-on-exec, in the runner only, and closed when the go
                            connection arrives: the program never has it, and it is gone before any
                            of the program's code runs.
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


