"""A training script for tests/test_fsdp.py, run under torchrun (2 processes) with FSDP and sharded checkpoints.

    torchrun --nproc-per-node=2 fsdp_worker.py FOLDER [--resume] [--slow] [--accumulate N] [--precision bf16]

Shuffled data, dropout, AdamW, clipping, a unit per Linear, a Checkpointer every 4 steps (sharded: folders). With
--slow it sleeps 20 ms a batch and writes its pid to FOLDER/started-<rank> after step 10, so that a test can kill it
mid-fit, a few batches later, perhaps during a save; and after step 18 it waits for that kill (300 s at most, then it
fails), so that a test slow to kill it still finds it mid-fit. At the end every rank takes part in gathering the whole weights and the predictions on fixed inputs, and in
a last sharded save (FOLDER/last.pt, a folder); rank 0 saves FOLDER/final.pt (weights, predictions, step, history
without times, and the step the fit started at).
"""

import os, sys, time
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import FSDP, Callback, Checkpointer, Learner
from nbtrainer.testing import HoldAt

KILLED_BY = 18  # the step where a --slow run waits to be killed: mid-epoch, after the saves of steps 12 and 16


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))


def data():
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(320, 8, generator=g), torch.randint(0, 3, (320,), generator=g))


def probe_inputs():
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(2))


class StartStep(Callback):
    "The step the fit starts at: after a resume, the checkpoint's."

    def before_fit(self):
        self.step = self.learn.step


class Slow(Callback):
    def __init__(self, folder):
        self.folder, self.told = folder, False

    def after_batch(self):
        time.sleep(0.02)  # sleeping consumes no randomness
        if self.learn.step >= 10 and not self.told:
            self.told = True
            (self.folder / f'started-{os.environ.get("RANK", "0")}').write_text(str(os.getpid()))  # to be killed


def wait_to_be_killed():
    time.sleep(300)  # sleeping consumes no randomness
    raise TimeoutError(f'held at step {KILLED_BY} for 300 s: the test never killed this process')


def main(folder, resume=False, slow=False, accumulate=1, precision='fp32'):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    ds = data()
    start = StartStep()
    cbs = [Checkpointer(folder / 'checkpoints', every_steps=4, keep_last=2), start]
    cbs += [Slow(folder), HoldAt(KILLED_BY, wait_to_be_killed, timeout=600)] if slow else []
    learn = Learner(
        make_model(),
        DataLoader(ds, batch_size=8, shuffle=True),
        DataLoader(ds, batch_size=64),
        lr=1e-2,
        opt_func=torch.optim.AdamW,
        accumulate=accumulate,
        precision=precision,
        clip_grad_norm=1.0,
        progress=False,
        strategy=FSDP(wrap=nn.Linear),
        cbs=cbs,
    )
    learn.fit(3, resume=resume)
    weights = {k: v.full_tensor() for k, v in learn.model.state_dict().items()}  # a collective
    learn.model.eval()
    with torch.no_grad():
        preds = learn.model(probe_inputs())  # a collective too: every rank runs it
    learn.save(folder / 'last.pt')
    if learn.main_process:
        history = [{k: v for k, v in row.items() if k != 'time'} for row in learn.recorder.history]
        torch.save(
            {'model': weights, 'preds': preds, 'step': learn.step, 'history': history, 'start': start.step},
            folder / 'final.pt',
        )


if __name__ == '__main__':
    args = sys.argv[1:]
    opt = lambda name, default: type(default)(args[args.index(name) + 1]) if name in args else default
    main(
        args[0],
        resume='--resume' in args,
        slow='--slow' in args,
        accumulate=opt('--accumulate', 1),
        precision=opt('--precision', 'fp32'),
    )
