"""A study survives a kill at every place it writes (issue #42): inside Optuna's ask (a trial made, its point not yet
stored), inside tell, inside each registry transaction, and everywhere between. For each place a study is killed there
and run again to its end; its trials, their points, values and states, and every trial's registry history equal those
of the same study never interrupted. One process imports everything once and forks one child per run
(tests/ask_kill_worker.py), so fifty kills cost fifty forks, not fifty interpreters."""

import subprocess, sys

import pytest

from conftest import ROOT

optuna = pytest.importorskip('optuna')
from ask_kill_worker import NAME, TRIALS, study  # noqa: E402 - it imports optuna


def outcome(db, folder=None):
    "What a study ended with: its trials in Optuna, and its runs in the registry (less times and run identities)."
    s = study(db, folder)
    trials = [(t.number, t.state.name, t.params, t.values) for t in s.optuna_study().trials]
    found = s.runs()
    registry = [
        (r.config['trial'], r.status, r.best, [{k: v for k, v in row.items() if k != 'time'} for row in r.history])
        for r in found
    ]
    return trials, registry, len(found)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_kill_at_any_place_leaves_the_study_as_an_uninterrupted_one(tmp_path):
    server = subprocess.Popen(
        [sys.executable, str(ROOT / 'tests' / 'ask_kill_worker.py'), '--serve'],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:

        def run(db, kill_at=-1):
            server.stdin.write(f'{db} {kill_at}\n')
            server.stdin.flush()
            code, passed = server.stdout.readline().split()
            return int(code), passed

        code, places = run(tmp_path / 'straight' / 'runs.db')
        assert code == 0 and int(places) > 3 * TRIALS
        reference = outcome(tmp_path / 'straight' / 'runs.db')
        assert reference[2] == TRIALS and all(state == 'COMPLETE' for _, state, _, _ in reference[0])
        for k in range(int(places)):
            db = tmp_path / f'killed-at-{k}' / 'runs.db'
            assert run(db, k)[0] == -9, f'the study was not killed at place {k}'
            assert run(db)[0] == 0, f'the study killed at place {k} did not run to its end'
            assert outcome(db) == reference, f'killed at place {k} of {places}, the study ended otherwise'
    finally:
        server.stdin.close()
        server.wait(timeout=60)
    assert NAME == 'kills'
