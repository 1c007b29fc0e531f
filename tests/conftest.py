import itertools, os, pathlib, shutil, subprocess, sys, tempfile

import pytest

# One thread per process: the tests train tiny models, often in several processes at once (xdist workers, ranks,
# kernels), and torch's default of a thread per core makes them spin against each other: 3x the CPU time on 2 cores.
# Set before torch is imported; the processes the tests start inherit it.
os.environ.setdefault('OMP_NUM_THREADS', '1')

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent  # console scripts of the environment running pytest

# Debian's Chromium for browser tests (never `playwright install`: it downloads, and fails offline)
CHROMIUM = next(
    filter(None, map(shutil.which, ('chromium', 'google-chrome'))), '/usr/bin/chromium'
)  # Debian; GitHub runners
CHROMIUM_ARGS = [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
]

from nbtrainer.callback import Callback  # noqa: E402 - after OMP_NUM_THREADS, which torch reads at import


def serve_jupyter(app, folder, args, env, log):
    """Start `jupyter <app>` (`server` or `lab`) on loopback serving `folder`, on a port the system picks, and return
    (the process, its port). The port is read from the server's runtime file: a port picked before the server binds it
    can be taken meanwhile by any socket on the machine (a CI run saw JupyterLab move on to the next port while the test
    polled the one it had picked). The runtime files (kernels' connection files too) go to `folder/.runtime`, which
    JupyterLab's file browser hides."""
    import json
    from nbtrainer.testing import wait_for

    runtime = folder / '.runtime'
    server = subprocess.Popen(
        [
            str(BIN / 'jupyter'),
            app,
            '--no-browser',
            '--port=0',
            '--ServerApp.port_retries=0',
            '--ServerApp.token=',
            '--ServerApp.ip=127.0.0.1',
            '--allow-root',
            f'--ServerApp.root_dir={folder}',
            *args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**env, 'JUPYTER_RUNTIME_DIR': str(runtime)},
        cwd=folder,
    )

    def log_tail():
        return pathlib.Path(log.name).read_text()[-3000:]

    def port():
        assert server.poll() is None, f'jupyter {app} exited with code {server.returncode}: {log_tail()}'
        for info in runtime.glob('jpserver-*.json'):
            try:
                return json.loads(info.read_text())['port']
            except (ValueError, KeyError, OSError):  # being written as we read it
                pass
        return None

    try:
        return server, wait_for(port, f'jupyter {app} to write its port to {runtime}', seen=log_tail, every=0.1)
    except BaseException:
        server.kill()
        server.wait()
        raise


_kernels = itertools.count()


def kernel_manager():
    """A manager for a python3 kernel whose channels are Unix sockets (ZeroMQ's ipc transport) named for this process:
    the TCP ports jupyter_client picks, and releases for the kernel to bind, can be taken meanwhile by any socket on the
    machine (then the kernel dies at its start). Start it, or give it to nbclient (`NotebookClient(nb, km=...)`)."""
    from jupyter_client.manager import KernelManager

    prefix = f'{tempfile.gettempdir()}/nbtrainer-kernel-{os.getpid()}-{next(_kernels)}'
    return KernelManager(kernel_name='python3', transport='ipc', ip=prefix)


def start_kernel(timeout=120):
    "A started `kernel_manager()` and its client, ready (jupyter_client's `start_new_kernel`, on Unix sockets)."
    km = kernel_manager()
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=timeout)
    except BaseException:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        raise
    return km, kc


# jsonschema (which nbformat imports) builds an Earley parser for IRIs at import when the optional rfc3987-syntax is
# installed: 1 to 4 s in every pytest process, for a string format nbformat never checks. Without it, no IRI checker.
sys.modules.setdefault('rfc3987_syntax', None)


class EndAt(Callback):
    "A callback that raises `error` after the training batch that makes step `step`: a fit ended there, on purpose."

    def __init__(self, step, error):
        self.step, self.error = step, error

    def after_batch(self):
        if self.learn.training and self.learn.step == self.step:
            raise self.error


@pytest.fixture(autouse=True)
def one_process_group_at_a_time(request, tmp_path_factory):
    """Under pytest-xdist the tests that start process groups take turns (a lock the workers of one run share): four
    ranks on 2 cores only wait for each other."""
    if 'PYTEST_XDIST_WORKER' not in os.environ or request.node.get_closest_marker('distributed') is None:
        yield
        return
    import fcntl

    from nbtrainer.testing import wait_for

    def taken(lock):
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    run_folder = tmp_path_factory.getbasetemp().parent  # each worker's base folder is in the run's
    with open(run_folder / 'process-groups.lock', 'w') as lock:
        # the other worker's test holds it at most its time limit (pytest-timeout): a deadline far above that
        wait_for(lambda: taken(lock), "the other pytest worker's process-group test to end (a lock)", timeout=1800,
                 seen=lambda: 'the lock still held', every=0.1)  # fmt: skip
        yield


@pytest.fixture(scope='session')
def postgres_server():
    "A real PostgreSQL server for this pytest process (tests/postgres.py), stopped at the end."
    pytest.importorskip('psycopg', reason="the PostgreSQL registry needs psycopg: pip install -e '.[dev]'")
    from postgres import Server

    server = Server()
    yield server
    server.stop()


@pytest.fixture(params=['sqlite', 'postgresql'])
def registry(request, tmp_path):
    "A factory of new, empty registries: SQLite files, or databases on a real PostgreSQL server (both, by parameter)."
    if request.param == 'sqlite':
        count = iter(range(10**6))
        return lambda: tmp_path / f'registry-{next(count)}' / 'runs.db'
    server = request.getfixturevalue('postgres_server')
    return server.database


def pytest_collection_modifyitems(config, items):
    """The files whose tests train in subprocesses first, then those that start process groups, kernels or browsers,
    then the rest. tools/test.sh runs `--dist loadfile --no-loadscope-reorder`: a worker takes the next file as it
    finishes one, so the long files start early and the run does not end with one worker alone on one of them (xdist's
    default order, by number of tests, started the one-test kill-everywhere file last: a 3-minute tail)."""
    heavy = ('distributed', 'ui', 'kernel')
    rank = {}
    for item in items:
        if item.get_closest_marker('slow'):
            rank[item.path] = 0
        elif any(item.get_closest_marker(m) for m in heavy):
            rank[item.path] = min(rank.get(item.path, 1), 1)
    items.sort(key=lambda item: rank.get(item.path, 2))  # stable: each file's tests stay together, in their order
