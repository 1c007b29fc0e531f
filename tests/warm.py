"""Worker scripts started warm: `run` and `Popen` work as `subprocess`'s do for `[sys.executable, SCRIPT, *args]`, but
fork the script's process from a server that has imported torch and nbtrainer once (1.7 s of imports a process: about
100 worker processes in a run of the suite, `nbtrainer-runs` included). Anything else (other commands, interpreter
flags) starts cold, as `subprocess` does.

The forked process is the script's own: its pid takes signals (SIGKILL, SIGTERM) and `start_new_session`; it runs the
script as `__main__` with the given argv, environment, folder and standard streams, then exits as the interpreter would
(non-daemon threads joined, atexit run, streams flushed). Its exit status comes back through the server, as
`Popen.returncode` does (`-9` when killed). A server is started at the first use of an environment that changes what
an import reads (`OMP_NUM_THREADS`, ...), with that environment: one or two per pytest process, ended as it ends.
A console script this environment installed (`.venv/bin/nbtrainer-runs`, its first line this interpreter) is a worker
script too."""

import atexit, io, json, os, select, shutil, signal, socket, subprocess, sys, tempfile, threading, time
from pathlib import Path

# Variables torch and nbtrainer read at import: each setting of them has a server of its own
IMPORT_TIME = ('OMP_', 'MKL_', 'KMP_', 'TORCH', 'CUDA', 'PYTHON', 'LD_', 'NBTRAINER_')
# ...except these, which torch sets in a process that compiled (inductor's cache folder) and reads only when compiling
SET_BY_TORCH = {'TORCHINDUCTOR_CACHE_DIR'}
_servers = {}  # what the imports read -> its server


def _server_for(env):
    "The server whose imports read what a process started with `env` would read (started at its first use)."
    read = tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in SET_BY_TORCH))
    if read not in _servers:
        _servers[read] = _Server(env)
    return _servers[read]


def _installed_script(path):
    "Whether `path` is a script whose first line runs this interpreter (a console script of this environment)."
    if os.sep not in path or not os.path.isfile(path):
        return False
    with open(path, 'rb') as f:
        first = f.readline(4096).decode(errors='replace')
    here = os.path.dirname(sys.executable)
    runs = first[2:].strip() if first.startswith('#!') else ''
    return os.path.dirname(runs) == here and os.path.realpath(runs) == os.path.realpath(sys.executable)


def _script_argv(argv):
    "The script's argv (its path first) to start warm, or None to start `argv` cold."
    argv = [str(a) for a in argv]
    if sys.platform != 'linux':
        return None  # Linux: SOCK_SEQPACKET and passing descriptors as this module does them
    if len(argv) >= 2 and argv[0] == sys.executable and argv[1].endswith('.py'):
        script = argv[1:]
    elif argv and _installed_script(argv[0]):
        script = argv
    else:
        return None
    return script


class _Server:
    def __init__(self, env):
        self.folder = tempfile.mkdtemp(prefix='nbtrainer-warm-')
        self.path = f'{self.folder}/socket'
        # The server ends when this pipe does, as this process ends however it ends (not PR_SET_PDEATHSIG: that fires
        # when the thread that started the server ends, and a test may start it from a thread)
        alive, self.alive = os.pipe()
        with open(f'{self.folder}/server.log', 'w') as log:  # not pytest's streams: nothing here may hold them open
            self.process = subprocess.Popen(
                [sys.executable, __file__, self.path, str(alive)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=[alive],
            )
        os.close(alive)
        atexit.register(self.stop)

    def connect(self):
        from nbtrainer.testing import wait_for

        def connected():
            assert self.process.poll() is None, self.log_tail()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message a send: no framing to do
            try:
                sock.connect(self.path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                return None

        return wait_for(connected, 'the warm server to listen', timeout=120, every=0.01)

    def log_tail(self):
        return Path(f'{self.folder}/server.log').read_text()[-3000:]

    def stop(self):
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class Popen:
    "`subprocess.Popen` for a worker script (see the module's doc); stdout and stderr: files, PIPE, DEVNULL or None."

    def __new__(cls, argv, env=None, cwd=None, stdout=None, stderr=None, text=False, start_new_session=False):
        if _script_argv(argv) is None:
            return subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr, text=text, start_new_session=start_new_session
            )
        return super().__new__(cls)

    def __init__(self, argv, env=None, cwd=None, stdout=None, stderr=None, text=False, start_new_session=False):
        env = dict(os.environ if env is None else env)
        server = _server_for(env)
        self.args, self.returncode, self._text = list(argv), None, text
        streams, ours = [0], []
        for given, inherited in ((stdout, 1), (stderr, 2)):
            if given == subprocess.DEVNULL:
                streams.append(os.open(os.devnull, os.O_WRONLY))
                ours.append(None)
            elif given == subprocess.PIPE:
                read, write = os.pipe()
                streams.append(write)
                ours.append(open(read, 'r' if text else 'rb'))
            else:
                fd = given if isinstance(given, int) else inherited if given is None else given.fileno()
                streams.append(streams[1] if given == subprocess.STDOUT else fd)
                ours.append(None)
        self.stdout, self.stderr = ours
        request = {
            'argv': _script_argv(argv),
            'env': env,
            'cwd': str(cwd or os.getcwd()),
            'new_session': start_new_session,
        }
        self._sock = server.connect()
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], streams)
        except BaseException:
            self._sock.close()  # else the server waits for this request, and every later one behind it
            raise
        finally:
            for fd, given in zip(streams[1:], (stdout, stderr)):
                if given in (subprocess.PIPE, subprocess.DEVNULL):
                    os.close(fd)  # the child has it (a pipe's EOF comes when the child exits)
        if not select.select([self._sock], [], [], 120)[0]:  # a fork: milliseconds, unless the server is stuck
            self._sock.close()
            raise TimeoutError(f'the warm server did not start {self.args[1:2]} in 120 s: {server.log_tail()}')
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


def serve(path, alive):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + '.new')
    listener.listen(64)
    import torch, torch.nn, torch.utils.data, nbtrainer  # noqa: F401, E401 - what every worker imports

    os.rename(path + '.new', path)  # clients connect once the imports are done
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the supervisors are reaped as they end
    while True:
        if alive in select.select([listener, alive], [], [])[0]:
            os._exit(0)  # the pipe's end: the process that started this server has ended
        conn, _ = listener.accept()
        conn.settimeout(60)  # a client sends its request as it connects
        try:
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        except OSError:
            conn.close()
            continue
        if os.fork() == 0:
            try:
                listener.close()
                os.close(alive)
                _supervise(conn, json.loads(message), fds)
            finally:
                os._exit(1)  # never back into this loop: a second server (a client that left broke the pipe)
        conn.close()
        for fd in fds:
            os.close(fd)


if __name__ == '__main__':
    serve(sys.argv[1], int(sys.argv[2]))
