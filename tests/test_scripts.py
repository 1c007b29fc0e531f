"""A script of several fit calls (freeze, fit_one_cycle, unfreeze, fit_one_cycle at discriminative lrs; then fine_tune
and a plain fit) killed with SIGKILL at random points and rerun from the top with resume=True on every call: it ends
bit for bit where the uninterrupted script does (weights, BatchNorm statistics, optimizer, history, the CSV log)."""

import random, signal, subprocess, sys

import pytest
import torch

from conftest import ROOT
import warm

pytestmark = pytest.mark.slow  # worker processes that train, killed and rerun

WORKER = [sys.executable, str(ROOT / 'tests' / 'script_worker.py')]
BATCHES = {2: 32, 3: 56}  # training batches of the whole script: 8 an epoch (120 examples, batches of 16)


def final(folder):
    return torch.load(folder / 'final.pt', weights_only=True)


def same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def kill_points(phases, n, seed):
    "`n` points of the script, at random: after a training batch, or as a fit call starts (not the first)."
    rng = random.Random(seed)
    calls = [f'call{k}' for k in range(2, 3 if phases == 2 else 6)]
    return rng.sample(calls, 1) + [str(b) for b in rng.sample(range(1, BATCHES[phases] + 1), n - 1)]


@pytest.mark.parametrize('phases', [2, 3])
def test_a_script_killed_anywhere_and_rerun_with_resume_ends_as_the_uninterrupted_one(tmp_path, phases):
    straight = tmp_path / 'straight'
    warm.run(WORKER + [str(straight), str(phases)], check=True, timeout=300)
    ref = final(straight)
    assert ref['step'] == BATCHES[phases] // 2 and len(ref['calls']) == {2: 2, 3: 5}[phases]
    for at in kill_points(phases, 3, seed=phases):
        folder = tmp_path / f'killed-{at}'
        killed = warm.run(WORKER + [str(folder), str(phases), '--kill-at', at], timeout=300)
        assert killed.returncode == -signal.SIGKILL, at
        rerun = warm.run(WORKER + [str(folder), str(phases), '--resume'], capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, (at, rerun.stderr[-3000:])
        got = final(folder)
        for key in ('model', 'optimizer', 'history', 'losses', 'step', 'calls'):
            assert same(ref[key], got[key]), (at, key)
        assert (straight / 'log.csv').read_text() == (folder / 'log.csv').read_text(), at


def test_a_rerun_with_other_calls_is_refused_by_name(tmp_path):
    "The killed script's first call was fit_one_cycle(2): a rerun whose first call is fit_one_cycle(3) is refused."
    folder = tmp_path / 'run'
    warm.run(WORKER + [str(folder), '2', '--kill-at', '20'], timeout=300)
    code = f'''
import sys; sys.path.insert(0, {str(ROOT / 'tests')!r})
from pathlib import Path
import script_worker as w
learn = w.make_learner(Path({str(folder)!r}))
learn.freeze()
learn.fit_one_cycle(3, resume=True)
'''
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert 'fit call 1 of this Learner (fit_one_cycle)' in out.stderr and 'epochs=3 here, 2 there' in out.stderr
