"""A training script for tests/test_preemption.py, run as `python` (one process) or under torchrun (2 processes).

    python preempt_worker.py FOLDER [--resume] [--slow] [--accumulate N]

Shuffled data, dropout, Adam, a Checkpointer (every 1000 steps: only the preemption's checkpoint lands in the test's
window) and a Tracker. With --slow it sleeps 20 ms a batch and touches FOLDER/started-<rank> after step 5, so that a
test can signal it mid-fit; and after step 15 it waits for the signal (300 s at most, then it fails), so that a test
slow to send it still finds it mid-fit. Rank 0 saves FOLDER/final.pt (weights, step, history without times) when the fit ends.
"""

import os, sys, time
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import Callback, Checkpointer, Learner, Preemption, Tracker
from nbtrainer.testing import HoldAt, wait_for

SIGNALLED_BY = 15  # the step where a --slow run waits for the test's signal


class Slow(Callback):
    def __init__(self, folder):
        self.folder, self.told = folder, False

    def after_batch(self):
        time.sleep(0.02)  # sleeping consumes no randomness
        if self.learn.step >= 5 and not self.told:
            self.told = True
            (self.folder / f'started-{os.environ.get("RANK", "0")}').touch()


def wait_for_the_signal(learn):
    "The handler sets Preemption.received, in the main thread, which waits for this thread meanwhile."
    preemption = next(cb for cb in learn.cbs if isinstance(cb, Preemption))
    wait_for(lambda: preemption.received, f'the test to signal this process (held at step {SIGNALLED_BY})', timeout=300)


def main(folder, resume=False, slow=False, accumulate=1):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(640, 8, generator=g), torch.randint(0, 3, (640,), generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
    cbs = [Checkpointer(folder / 'checkpoints', every_steps=1000, keep_last=2), Tracker(folder / 'runs.db')]
    learn = Learner(
        model,
        DataLoader(ds, batch_size=8, shuffle=True),
        DataLoader(ds, batch_size=64),
        lr=1e-2,
        opt_func=torch.optim.Adam,
        accumulate=accumulate,
        progress=False,
        cbs=cbs,
    )
    if slow:
        learn.add_cbs([Slow(folder), HoldAt(SIGNALLED_BY, lambda: wait_for_the_signal(learn), timeout=600)])
    learn.fit(3, resume=resume)
    if learn.main_process:
        history = [{k: v for k, v in row.items() if k != 'time'} for row in learn.recorder.history]
        torch.save({'model': learn.model.state_dict(), 'step': learn.step, 'history': history}, folder / 'final.pt')


if __name__ == '__main__':
    args = sys.argv[1:]
    accumulate = int(args[args.index('--accumulate') + 1]) if '--accumulate' in args else 1
    main(args[0], resume='--resume' in args, slow='--slow' in args, accumulate=accumulate)
