import os, pathlib, shutil, sys

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
    """Under pytest-xdist the tests that start process groups take turns (a lock the workers of one run share): two
    `launch()`es at once can pick the same free port, and four ranks on 2 cores only wait for each other."""
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
