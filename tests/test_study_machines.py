"""A study run by workers on two "machines" (issue #42): two processes with their own host names (a UTS namespace each,
where `unshare` allows) and their own working folders, so each keeps its own checkpoints, on one registry URL (a real
PostgreSQL server the tests start) for the runs, the study and the claims; each killed at a random place and run again,
in turn, until the study is done. Its trials (points, values, states) and every trial's history equal the same study
never interrupted. The shared-file recipe (one SQLite registry and one study folder both processes see) too."""

import random, shutil, subprocess, sys

import pytest

from conftest import ROOT

optuna = pytest.importorskip('optuna')
from test_study_kills import outcome  # noqa: E402 - it imports optuna

WORKER = str(ROOT / 'tests' / 'ask_kill_worker.py')


def machine(name, cwd, db, kill_at, folder=None):
    "Run the study on `machine` `name`: in its own working folder, under its own host name where unshare allows."
    cwd.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, WORKER, str(db), str(kill_at), *([str(folder)] if folder else [])]
    if shutil.which('unshare') and subprocess.run(['unshare', '-ru', 'true'], capture_output=True).returncode == 0:
        command = ['unshare', '-ru', 'sh', '-c', f'hostname {name} && exec "$0" "$@"', *command]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize('recipe', ['postgresql', 'shared file'])
def test_a_study_on_two_machines_killed_at_random_ends_as_an_uninterrupted_one(request, tmp_path, recipe):
    if recipe == 'postgresql':
        server = request.getfixturevalue('postgres_server')
        straight_db, db, folder = server.database(), server.database(), None
    else:
        straight_db, db, folder = (
            tmp_path / 'straight' / 'runs.db',
            tmp_path / 'shared' / 'runs.db',
            tmp_path / 'shared' / 'study',
        )
    done = machine('reference', tmp_path / 'reference', straight_db, -1)
    assert done.returncode == 0, done.stderr[-3000:]
    places = int(done.stdout.split()[-1])
    reference = outcome(straight_db) if recipe == 'shared file' else None
    chance, turns = random.Random(7), []
    for turn in range(6):  # kills at random places, the machines in turn; then each runs to the end
        name = 'machine-a' if turn % 2 == 0 else 'machine-b'
        kill_at = chance.randrange(places // 2) if turn < 4 else -1
        done = machine(name, tmp_path / name, db, kill_at, folder)
        turns.append((name, kill_at, done.returncode))
        assert done.returncode == (-9 if kill_at >= 0 else 0) or (kill_at >= 0 and done.returncode == 0), (
            turns,
            done.stderr[-3000:],
        )
    got = outcome(db, folder)
    if recipe == 'postgresql':
        reference = outcome(straight_db)
        hosts = {r.host for r in __import__('nbtrainer').runs(db)}
        assert hosts <= {'machine-a', 'machine-b'} or len(hosts) == 1, hosts
    assert got == reference, turns
