"""A fine-tuning run for tests/test_finetune.py: a frozen body unfrozen at step 20, discriminative lrs, EMA, a plateau.

    python finetune_worker.py FOLDER [--resume] [--hold] [--no-plateau]

Shuffled data, dropout, BatchNorm, AdamW, checkpoints every 2 steps; writes FOLDER/final.pt when the fit completes. With
--hold it stops after step 25 (after the unfreeze, a step after the checkpoint of step 24), writes FOLDER/held and waits
there for the test's SIGKILL (300 s at most, then it fails).
"""

import sys, time
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import EMA, Callback, Checkpointer, Learner, ReduceLROnPlateau, head_body
from nbtrainer.testing import HoldAt

UNFREEZE_AT, DECAY, WARMUP, LRS = 20, 0.9, 3, (1e-3, 1e-2)
HOLD_AT = UNFREEZE_AT + 5  # a step after the checkpoint of step 24


def data():
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(200, 8, generator=g), torch.randint(0, 3, (200,), generator=g))


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))


def wait_to_be_killed(folder):
    "Tell the test the run is held (FOLDER/held), then wait for its SIGKILL; sleeping consumes no randomness."
    (folder / 'held').touch()
    time.sleep(300)
    raise TimeoutError(f'held at step {HOLD_AT} for 300 s: the test never killed this process')


class Unfreeze(Callback):
    "Unfreeze the body at a step; a resumed run from a later checkpoint must already be unfrozen."

    def before_batch(self):
        if self.learn.step == UNFREEZE_AT and self.learn.training:
            self.learn.unfreeze()


def main(folder, resume=False, hold=False, plateau=True):
    folder = Path(folder)
    ds = data()
    model = make_model()
    ema = EMA(decay=DECAY, warmup=WARMUP)
    cbs = [Checkpointer(folder / 'checkpoints', every_steps=2, keep_last=2), ema, Unfreeze()]
    cbs += [ReduceLROnPlateau(factor=0.5, patience=0, threshold=0.1)] if plateau else []
    cbs += [HoldAt(HOLD_AT, lambda: wait_to_be_killed(folder), timeout=600)] if hold else []
    learn = Learner(
        model,
        DataLoader(ds, batch_size=16, shuffle=True),
        DataLoader(ds, batch_size=64),
        splitter=head_body,
        lr=slice(*LRS),
        metrics=('accuracy',),
        cbs=cbs,
        progress=False,
    )
    learn.freeze()  # as a script that always starts frozen: a resume past the unfreeze must not stay frozen
    learn.fit(4, eval_every=5, resume=resume)
    history = [{k: v for k, v in row.items() if k != 'time'} for row in learn.recorder.history]
    torch.save(
        {
            'model': learn.model.state_dict(),
            'ema': ema.averaged,
            'history': history,
            'step': learn.step,
            'lrs': [g['lr'] for g in learn.opt.param_groups],
            'frozen': learn.param_groups.frozen,
        },
        folder / 'final.pt',
    )


if __name__ == '__main__':
    main(sys.argv[1], resume='--resume' in sys.argv, hold='--hold' in sys.argv, plateau='--no-plateau' not in sys.argv)
