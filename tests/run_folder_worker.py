"""A run for tests/test_hostile.py's process tests: shuffled data, dropout, clipping, EarlyStopping(restore_best) with
no Checkpointer keeping its best, a Checkpointer every 2 steps, a CSV log and a Tracker, evaluations every 4 steps.

    python run_folder_worker.py FOLDER [--resume] [--kill EVENT:STEP] [--signal EVENT:STEP] [--hold-at STEP]

--kill sends this process SIGKILL at the event of the given step (after_batch, before_validate, after_eval), --signal
SIGTERM; --hold-at waits at that step's after_batch until FOLDER/go exists (FOLDER/held says it is waiting).
Writes FOLDER/final.pt (weights, step, history without times) when the fit returns.
"""

import os, signal, sys
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import Callback, Checkpointer, CSVLogger, EarlyStopping, Learner, Tracker
from nbtrainer.testing import wait_for


class At(Callback):
    "At `event` of `step` (training's step count), do `act`."

    order = 200  # after every other callback, the Checkpointer's save of this step included

    def __init__(self, event, step, act):
        self.step, self.act = step, act
        setattr(self, event, self.maybe)

    def maybe(self):
        if self.learn.step == self.step:
            self.act()


def hold(folder):
    "Tell the test the run is held (FOLDER/held), then wait for its go (FOLDER/go): 300 s at most, then fail."
    (folder / 'held').touch()
    wait_for((folder / 'go').exists, "the test's go (FOLDER/go)", timeout=300, every=0.02)


def main(folder, resume=False, kill=None, term=None, hold_at=None):
    folder = Path(folder)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g))
    valid = TensorDataset(
        torch.randn(48, 8, generator=g), torch.randint(0, 3, (48,), generator=g)
    )  # its best comes early
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
    stopper = EarlyStopping(patience=10, restore_best=True)  # its best weights: in its state, none in a file
    cbs = [
        Checkpointer(folder / 'ckpt', every_steps=2, keep_last=2, keep_best=0),
        CSVLogger(folder / 'log.csv'),
        Tracker(folder / 'runs.db'),
        stopper,
    ]
    cbs[2].beat_every = 3600.0  # no heartbeat while a test holds the run: its files stay byte for byte as they are
    for spec, signum in ((kill, signal.SIGKILL), (term, signal.SIGTERM)):
        if spec:
            event, step = spec.split(':')
            cbs.append(At(event, int(step), lambda s=signum: os.kill(os.getpid(), s)))
    if hold_at is not None:
        cbs.append(At('after_batch', hold_at, lambda: hold(folder)))
    learn = Learner(
        model,
        DataLoader(ds, batch_size=16, shuffle=True),
        DataLoader(valid, batch_size=48),
        lr=3e-2,
        clip_grad_norm=0.5,
        progress=False,
        cbs=cbs,
    )
    learn.fit(4, eval_every=4, resume=resume)
    history = [{k: v for k, v in row.items() if k != 'time'} for row in learn.recorder.history]
    torch.save(
        {
            'model': learn.model.state_dict(),
            'step': learn.step,
            'history': history,
            'best_step': stopper.best_step,
            'times': [row['time'] for row in learn.recorder.history],
        },
        folder / 'final.pt',
    )


if __name__ == '__main__':
    args = sys.argv[1:]
    option = lambda name: args[args.index(name) + 1] if name in args else None
    main(
        args[0],
        resume='--resume' in args,
        kill=option('--kill'),
        term=option('--signal'),
        hold_at=int(option('--hold-at')) if option('--hold-at') else None,
    )
