"""A training run for tests/test_resume.py: shuffled data, dropout, Adam, checkpoints every 2 steps.

    python resume_worker.py FOLDER [--resume] [--hold]

Writes FOLDER/final.pt (weights, history without times, per-batch losses) when the fit completes. With --hold it stops
after step 17 (mid-epoch 1, a step after the checkpoint of step 16), writes FOLDER/held and waits there for the test's
SIGKILL (300 s at most, then it fails).
"""

import sys, time
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import Checkpointer, CSVLogger, Learner, TensorBoardLogger
from nbtrainer.testing import HoldAt

HOLD_AT = 17  # 13 batches an epoch: mid-epoch 1, between the checkpoints of steps 16 and 18


def wait_to_be_killed(folder):
    "Tell the test the run is held (FOLDER/held), then wait for its SIGKILL; sleeping consumes no randomness."
    (folder / 'held').touch()
    time.sleep(300)
    raise TimeoutError(f'held at step {HOLD_AT} for 300 s: the test never killed this process')


def main(folder, resume=False, hold=False):
    folder = Path(folder)
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(200, 8, generator=g), torch.randint(0, 3, (200,), generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
    train = DataLoader(ds, batch_size=16, shuffle=True)  # order drawn from the global generator each epoch
    cbs = [
        Checkpointer(folder / 'checkpoints', every_steps=2, keep_last=2),
        CSVLogger(folder / 'log.csv'),
        TensorBoardLogger(folder / 'tb', run_name='run', log_every=3),
    ] + ([HoldAt(HOLD_AT, lambda: wait_to_be_killed(folder), timeout=600)] if hold else [])
    learn = Learner(
        model, train, DataLoader(ds, batch_size=64), lr=1e-2, metrics=('accuracy',), cbs=cbs, progress=False
    )
    learn.fit(4, eval_every=5, resume=resume)
    history = [{k: v for k, v in row.items() if k != 'time'} for row in learn.recorder.history]
    torch.save(
        {
            'model': learn.model.state_dict(),
            'history': history,
            'losses': learn.recorder.train_losses,
            'step': learn.step,
        },
        folder / 'final.pt',
    )


if __name__ == '__main__':
    main(sys.argv[1], resume='--resume' in sys.argv, hold='--hold' in sys.argv)
