"""SIGTERM during a fit, in a real process and in 2 DDP ranks under torchrun: the fit finishes its step, checkpoints it,
ends as 'preempted' (the registry says so), the process exits with 143, and a resumed run ends bit-identical to an
uninterrupted one (issue #18)."""

import os, signal, subprocess, sys

import pytest
import torch

from conftest import ROOT
import warm
from nbtrainer.testing import wait_for

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]  # torchrun, two ranks

WORKER = str(ROOT / 'tests' / 'preempt_worker.py')
ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}
TORCHRUN = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2']


def final(folder):
    return torch.load(folder / 'final.pt', weights_only=True)


def preempted_then_resumed(tmp_path, launcher, ranks, accumulate):
    args = ['--accumulate', str(accumulate)]
    warm.run(launcher + [WORKER, str(tmp_path / 'straight'), *args], check=True, timeout=600, env=ENV)
    folder = tmp_path / 'preempted'
    proc = warm.Popen(
        launcher + [WORKER, str(folder), '--slow', *args],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started = [folder / f'started-{r}' for r in range(ranks)]
    wait_for(lambda: all(p.exists() for p in started), 'every rank to pass step 5 (it waits for the signal at 15)',
             timeout=300, seen=lambda: [p.name for p in started if p.exists()], process=proc)  # fmt: skip
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=300)[0]
    assert not (folder / 'final.pt').exists(), output
    saved = [torch.load(p, weights_only=True) for p in (folder / 'checkpoints').glob('step-*.pt')]
    assert len(saved) == 1, output  # the preemption's own checkpoint (the periodic ones come every 1000 steps)
    step = saved[0]['fit_progress']['step']
    total = 3 * 80 // accumulate // ranks  # 640 examples in batches of 8, sharded over the ranks
    assert 5 <= step < total and saved[0]['data_pass']['batches_done'] % accumulate == 0  # at a step boundary
    from nbtrainer import runs

    run = runs(folder / 'runs.db')[-1]
    assert run.status == 'preempted' and f'at step {step}' in (run.message or ''), (run.status, run.message)

    warm.run(launcher + [WORKER, str(folder), '--resume', *args], check=True, timeout=600, env=ENV)
    a, b = final(tmp_path / 'straight'), final(folder)
    assert a['step'] == b['step'] == total
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])
    assert a['history'] == b['history']
    return proc.returncode, output


@pytest.mark.parametrize('accumulate', [1, 2])
def test_sigterm_in_one_process(tmp_path, accumulate):
    code, output = preempted_then_resumed(tmp_path, [sys.executable], 1, accumulate)
    assert code == 128 + signal.SIGTERM, output


def test_sigterm_under_torchrun_stops_both_ranks_at_one_step(tmp_path):
    code, output = preempted_then_resumed(tmp_path, TORCHRUN, 2, 1)
    assert code != 0, output  # torchrun reports its workers' exit; both checkpointed at the same agreed step above
