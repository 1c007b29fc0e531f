"""One rank of a long 2-rank run for tests/test_distributed.py, started like torchrun starts workers (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment). Touches FOLDER/started-RANK once training is under way.

    RANK=0 WORLD_SIZE=2 ... python ddp_worker.py FOLDER
"""
import os, sys, time
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer.core import Callback, Learner


class Started(Callback):
    def __init__(self, folder): self.folder = folder
    def after_batch(self):
        time.sleep(0.01)
        if self.learn.iter == 2: (self.folder / f'started-{os.environ["RANK"]}').touch()


def main(folder):
    folder = Path(folder)
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(4000, 6, generator=g), torch.randint(0, 3, (4000,), generator=g))
    torch.manual_seed(0)
    learn = Learner(nn.Linear(6, 3), DataLoader(ds, batch_size=8, shuffle=True), metrics=(), progress=False,
                    cbs=[Started(folder)])  # finds the process group from the environment
    assert learn.distributed
    learn.fit(100)


if __name__ == '__main__':
    main(sys.argv[1])
