"""A fork from the registry in a fresh process: one process trains with fp16, accumulation and dropout, recording its
run in a registry and its evaluations' states on disk, and exits; another process finds the run with `runs(db)`, forks
it at an evaluation with `run.fork(step, build)` and continues with the same fit (`learn.fit_progress.call`): its final
weights equal the original's bit for bit; a third forks there with a tenth of the lr, and the registry records the
branch with its parent run and step."""

import subprocess, sys, textwrap

import pytest
import torch

pytestmark = pytest.mark.slow  # three processes that train

SCRIPT = textwrap.dedent('''
    import sys, torch
    from pathlib import Path
    from torch.utils.data import DataLoader
    from nbtrainer import Checkpointer, Learner, Tracker, runs
    from nbtrainer.testing import classification_data, tiny_classifier

    folder, mode = Path(sys.argv[1]), sys.argv[2]
    db = folder / 'runs.db'

    def build(*cbs):
        torch.manual_seed(0)
        dl = DataLoader(classification_data(), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
        return Learner(tiny_classifier(dropout=0.2), dl, DataLoader(classification_data(seed=1), batch_size=50),
                       precision='fp16', accumulate=3, progress=False, cbs=[Tracker(db), *cbs])

    if mode == 'train':
        learn = build(Checkpointer(folder / 'evals', every_eval=True, keep_best=0))
        learn.fit(4, eval_every=2)
    else:
        run = next(r for r in runs(db) if r.parent is None)
        learn = run.fork(6, build)
        learn.fit(**learn.fit_progress.call, **({'lr': learn.lr / 10} if mode == 'branch' else {}))
    torch.save({k: v.clone() for k, v in learn.model.state_dict().items()}, folder / f'{mode}.pt')
''')


def run(folder, mode):
    subprocess.run([sys.executable, '-c', SCRIPT, str(folder), mode], check=True, timeout=300)
    return torch.load(folder / f'{mode}.pt', weights_only=True)


def test_a_fork_from_the_registry_in_a_fresh_process_reproduces_the_run_and_records_its_branch(tmp_path):
    from nbtrainer import runs

    original = run(tmp_path, 'train')
    same = run(tmp_path, 'same')
    assert all(torch.equal(original[k], same[k]) for k in original)
    branch = run(tmp_path, 'branch')
    assert any(not torch.equal(original[k], branch[k]) for k in original)
    found = runs(tmp_path / 'runs.db')
    parent = next(r for r in found if r.parent is None)
    assert len(found) == 3 and all(
        r.parent == {'run': parent.id, 'step': 6, 'uid': parent.uid} for r in found if r is not parent
    )
    assert [row['lr'] for row in found[0].history][-1] == parent.history[-1]['lr'] / 10  # the newest: the branch
