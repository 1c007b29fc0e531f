"""A script of several fit calls for tests/test_scripts.py, rerun from the top with resume=True after a kill.

    python script_worker.py FOLDER PHASES [--resume] [--kill-at N | --kill-at callK]

PHASES is 2 (freeze, fit_one_cycle, unfreeze, fit_one_cycle at discriminative lrs) or 3 (the same, then fine_tune's
two calls and a plain fit: five calls). One Checkpointer, a CSV log, BatchNorm, dropout, shuffled data, bf16 autocast and
accumulation of 2. --kill-at N sends SIGKILL to this process after its N-th training batch (counted over the whole
script), --kill-at callK as its K-th fit call starts. Writes FOLDER/final.pt when the script completes.
"""

import os, signal, sys
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from nbtrainer import Callback, Checkpointer, CSVLogger, Learner, head_body
from nbtrainer.testing import classification_data


class KillAt(Callback):
    "SIGKILL this process after the N-th training batch of the script, or as its K-th fit call starts."

    order = 200  # after the Checkpointer and the logger: a kill after their work, as a lost machine would

    def __init__(self, at):
        self.at, self.batches, self.calls = at, 0, 0

    def before_fit(self):
        self.calls += 1
        if self.at == f'call{self.calls}':
            os.kill(os.getpid(), signal.SIGKILL)

    def after_batch(self):
        if self.learn.training:
            self.batches += 1
            if str(self.batches) == self.at:
                os.kill(os.getpid(), signal.SIGKILL)


def make_learner(folder, kill_at=None):
    ds = classification_data(120, 8)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Dropout(0.2), nn.Linear(24, 3))
    cbs = [Checkpointer(folder / 'checkpoints', every_steps=2, keep_last=2), CSVLogger(folder / 'log.csv')]
    cbs += [KillAt(kill_at)] if kill_at else []
    return Learner(
        model,
        DataLoader(ds, batch_size=16, shuffle=True),
        DataLoader(ds, batch_size=40),
        splitter=head_body,
        lr=1e-2,
        metrics=('accuracy',),
        precision='bf16',
        accumulate=2,
        cbs=cbs,
        progress=False,
    )


def script(learn, phases, resume):
    learn.freeze()
    learn.fit_one_cycle(2, resume=resume)
    learn.unfreeze()
    learn.fit_one_cycle(2, slice(1e-4, 1e-3), resume=resume)
    if phases == 3:
        learn.fine_tune(1, base_lr=2e-3, resume=resume)
        learn.fit(1, lr=1e-4, resume=resume)


def main(folder, phases, resume=False, kill_at=None):
    folder = Path(folder)
    learn = make_learner(folder, kill_at)
    script(learn, phases, True if resume else None)
    history = [{k: v for k, v in row.items() if k != 'time'} for row in learn.recorder.history]
    torch.save(
        {
            'model': learn.model.state_dict(),
            'optimizer': learn.opt.state_dict(),
            'history': history,
            'losses': learn.recorder.train_losses,
            'step': learn.step,
            'calls': learn.fit_progress.calls,
        },
        folder / 'final.pt',
    )


if __name__ == '__main__':
    args = sys.argv[1:]
    kill = args[args.index('--kill-at') + 1] if '--kill-at' in args else None
    main(args[0], int(args[1]), resume='--resume' in args, kill_at=kill)
