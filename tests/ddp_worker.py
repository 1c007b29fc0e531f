"""Training scripts for tests/test_distributed.py, run as `python` (one process) or under torchrun (N processes).

RANK=0 WORLD_SIZE=2 ... python ddp_worker.py FOLDER     a long run; touches FOLDER/started-RANK once training
torchrun --nproc-per-node=2 ddp_worker.py FOLDER --short   (or plain python) a short run, global batch 8, that
                                                         saves FOLDER/final.pt from rank 0
"""

import os, sys, time
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import Callback, Learner, init_distributed, world_size


class Started(Callback):
    def __init__(self, folder):
        self.folder = folder

    def after_batch(self):
        time.sleep(0.01)
        if self.learn.iter == 2:
            (self.folder / f'started-{os.environ["RANK"]}').touch()


def main(folder):
    folder = Path(folder)
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(4000, 6, generator=g), torch.randint(0, 3, (4000,), generator=g))
    torch.manual_seed(0)
    learn = Learner(
        nn.Linear(6, 3), DataLoader(ds, batch_size=8, shuffle=True), metrics=(), progress=False, cbs=[Started(folder)]
    )  # finds the process group from the environment
    assert learn.distributed
    learn.fit(100)


def short(folder):
    "The same script on 1 or N processes: batches of 8 // N in order, so the global batches are the same 8 examples."
    if 'WORLD_SIZE' in os.environ:
        init_distributed()  # torchrun; the Learner would also do it by itself
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(44, 6, generator=g), torch.randint(0, 3, (44,), generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    learn = Learner(
        model,
        DataLoader(ds, batch_size=8 // world_size()),
        opt_func=torch.optim.Adam,
        lr=0.05,
        metrics=(),
        progress=False,
    )
    learn.fit(2)
    learn.save(Path(folder) / 'final.pt')  # every rank calls it; rank 0 writes


if __name__ == '__main__':
    if '--short' in sys.argv:
        short(sys.argv[1])
    else:
        main(sys.argv[1])
