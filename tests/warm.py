"""Worker scripts started warm: `run` and `Popen` work as `subprocess`'s do for `[sys.executable, SCRIPT, *args]`, but
fork the script's process from a server that has imported torch and nbtrainer once (1.7 s of imports a process: about
70 worker processes in a run of the suite). Anything else (other commands, interpreter flags, an environment that changes
what an import reads) starts cold, as `subprocess` does.

The forked process is the script's own: its pid takes signals (SIGKILL, SIGTERM) and `start_new_session`; it runs the
script as `__main__` with the given argv, environment, folder and standard streams, then exits as the interpreter would
(non-daemon threads joined, atexit run, streams flushed). Its exit status comes back through the server, as
`Popen.returncode` does (`-9` when killed). One server per pytest process, started at the first use, ended at exit."""

import atexit, io, json, os, select, shutil, signal, socket, subprocess, sys, tempfile, threading, time
from pathlib import Path

# An environment differing in these from the server's starts cold: torch and nbtrainer read them at import
IMPORT_TIME = ('OMP_', 'MKL_', 'KMP_', 'TORCH', 'CUDA', 'PYTHON', 'LD_', 'NBTRAINER_')
_server = None


def _warm_script(argv, env):
    "The script to start warm, or None to start `argv` cold."
    if sys.platform != 'linux' or len(argv) < 2 or str(argv[0]) != sys.executable or not str(argv[1]).endswith('.py'):
        return None  # Linux: the server ends with its parent by prctl
    differs = {k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k)}
    return None if any(k.startswith(IMPORT_TIME) for k in differs) else str(argv[1])


class _Server:
    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix='nbtrainer-warm-')
        self.path = f'{self.folder}/socket'
        with open(f'{self.folder}/server.log', 'w') as log:  # not pytest's streams: nothing here may hold them open
            self.process = subprocess.Popen(
                [sys.executable, __file__, self.path], stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        atexit.register(self.stop)

    def connect(self):
        from nbtrainer.testing import wait_for

        def connected():
            assert self.process.poll() is None, Path(f'{self.folder}/server.log').read_text()[-3000:]
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message a send: no framing to do
            try:
                sock.connect(self.path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                return None

        return wait_for(connected, 'the warm server to listen', timeout=120, every=0.01)

    def stop(self):
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class Popen:
    "`subprocess.Popen` for a worker script (see the module's doc); stdout and stderr may be files, PIPE or None."

    def __new__(cls, argv, env=None, cwd=None, stdout=None, stderr=None, text=False, start_new_session=False):
        env = dict(os.environ if env is None else env)
        if _warm_script(argv, env) is None:
            return subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr, text=text, start_new_session=start_new_session
            )
        return super().__new__(cls)

    def __init__(self, argv, env=None, cwd=None, stdout=None, stderr=None, text=False, start_new_session=False):
        global _server
        if _server is None:
            _server = _Server()
        self.args, self.returncode, self._text = list(argv), None, text
        streams, ours = [0], []
        for given, inherited in ((stdout, 1), (stderr, 2)):
            if given == subprocess.PIPE:
                read, write = os.pipe()
                streams.append(write)
                ours.append(open(read, 'r' if text else 'rb'))
            else:
                fd = given if isinstance(given, int) else inherited if given is None else given.fileno()
                streams.append(streams[1] if given == subprocess.STDOUT else fd)
                ours.append(None)
        self.stdout, self.stderr = ours
        request = {
            'argv': [str(a) for a in argv[1:]],
            'env': dict(os.environ if env is None else env),
            'cwd': str(cwd or os.getcwd()),
            'new_session': start_new_session,
        }
        self._sock = _server.connect()
        socket.send_fds(self._sock, [json.dumps(request).encode()], streams)
        for fd, given in zip(streams[1:], (stdout, stderr)):
            if given == subprocess.PIPE:
                os.close(fd)  # the child has it: EOF when the child exits
        self.pid = int(self._sock.recv(64))

    def poll(self):
        return (
            self.wait(0) if self.returncode is None and select.select([self._sock], [], [], 0)[0] else self.returncode
        )

    def wait(self, timeout=None):
        if self.returncode is None:
            if not select.select([self._sock], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = int(self._sock.recv(64))
            self._sock.close()
        return self.returncode

    def communicate(self, timeout=None):
        "Read the pipes to their ends, then wait: (stdout, stderr), as `subprocess.Popen.communicate` gives them."
        deadline = None if timeout is None else time.monotonic() + timeout
        pipes = [f for f in (self.stdout, self.stderr) if f is not None]
        read = {f: [] for f in pipes}
        while pipes:
            left = None if deadline is None else deadline - time.monotonic()
            ready = select.select(pipes, [], [], left)[0] if left is None or left > 0 else []
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout)
            for f in ready:
                data = os.read(f.fileno(), 1 << 16)
                read[f].append(data) if data else pipes.remove(f)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        outputs = [b''.join(read[f]) if f is not None else None for f in (self.stdout, self.stderr)]
        return tuple(o.decode() if self._text and o is not None else o for o in outputs)

    def send_signal(self, sig):
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def run(
    argv, env=None, cwd=None, capture_output=False, text=False, timeout=None, check=False, stdout=None, stderr=None
):
    "`subprocess.run` for a worker script: output captured through files, so no pipe can fill up."
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        if capture_output:
            stdout, stderr = out, err
        proc = Popen(argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr, text=text)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        outputs = []
        for file in (out, err):
            file.seek(0)
            data = file.read() if capture_output else None
            outputs.append(data.decode() if text and data is not None else data)
    if check and code:
        raise subprocess.CalledProcessError(code, argv, *outputs)
    return subprocess.CompletedProcess(argv, code, *outputs)


# ---- the server ----


def _exit_code(error):
    "The interpreter's exit status for a SystemExit (after printing a message one carries)."
    if error.code is None or isinstance(error.code, int):
        return error.code or 0
    print(error.code, file=sys.stderr)
    return 1


def _script(conn, request, fds):
    """In the forked process: become the script's process, say its pid (its session and streams are set by then, as
    `subprocess.Popen` returns after them), run the script as `__main__`, and exit as the interpreter would."""
    import runpy

    if request['new_session']:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    conn.send(str(os.getpid()).encode())
    conn.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, 'r', closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, 'w', closefd=False))
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, 'w', closefd=False), line_buffering=True)
    sys.argv, sys.path[0] = request['argv'], os.path.dirname(os.path.abspath(request['argv'][0]))
    if 'numpy' in sys.modules:
        sys.modules['numpy'].random.seed()  # a fresh process's own seed, not the server's
    code = 0
    try:
        runpy.run_path(request['argv'][0], run_name='__main__')
    except SystemExit as error:
        code = _exit_code(error)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _supervise(conn, request, fds):
    "In a process of its own: fork the script's process (which says its pid), then say its exit status."
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        _script(conn, request, fds)
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    conn.send(str(os.waitstatus_to_exitcode(status)).encode())
    os._exit(0)


def serve(path):
    import ctypes

    ctypes.CDLL(None).prctl(
        1, signal.SIGKILL
    )  # PR_SET_PDEATHSIG: the server ends with the pytest process that started it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + '.new')
    listener.listen(64)
    import torch, torch.nn, torch.utils.data, nbtrainer  # noqa: F401, E401 - what every worker imports

    os.rename(path + '.new', path)  # clients connect once the imports are done
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the supervisors are reaped as they end
    while True:
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        if os.fork() == 0:
            listener.close()
            _supervise(conn, json.loads(message), fds)
        conn.close()
        for fd in fds:
            os.close(fd)


if __name__ == '__main__':
    serve(sys.argv[1])
