"""One cell of tests/test_composition.py: a short fit combining features, on 1 process or 2 (`launch`), maybe killed.

    python composition_worker.py CONFIG_JSON OUT [--kill-at STEP] [--resume]

CONFIG_JSON holds precision, accumulate, world, subset, kill, loggers, train_metrics. The run writes OUT/final.pt
(rank 0's weights, steps, history and loss scale) when the fit completes; with --kill-at every rank SIGKILLs itself
right after that optimizer step, as a lost machine would.
"""

import json, os, signal, sys
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import Callback, Checkpointer, CSVLogger, Learner, Order, TensorBoardLogger, launch, plain_state_dict

B, EPOCHS = 8, 3  # the global batch; epochs
N_TRAIN, N_VALID = 38, 20  # 38 = four global batches of 8 and one of 6: windows of 3 end unevenly


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


class KillAt(Callback):
    "SIGKILL this process right after optimizer step `step`, once the Checkpointer has saved it."

    order = Order.CONTROL + 10
    run_valid = False

    def __init__(self, step):
        self.step = step

    def after_batch(self):
        if self.learn.step == self.step and not self.learn.accumulating:
            os.kill(os.getpid(), signal.SIGKILL)


def train(cfg, out, kill_at, resume):
    cbs = []
    if cfg['kill']:
        cbs.append(Checkpointer(out / 'ckpt', every_steps=1, keep_last=2, monitor='valid_loss'))
    if cfg['loggers']:
        cbs += [CSVLogger(out / 'log.csv'), TensorBoardLogger(out / 'tb', run_name='run', log_every=2)]
    if kill_at:
        cbs.append(KillAt(kill_at))
    extra = {'train_metrics': ('accuracy',)} if cfg.get('train_metrics') else {}
    learn = Learner(
        model(),
        DataLoader(data(N_TRAIN, 0), batch_size=B // cfg['world']),
        DataLoader(data(N_VALID, 1), batch_size=5),
        opt_func=torch.optim.Adam,
        lr=0.05,
        precision=cfg['precision'],
        accumulate=cfg['accumulate'],
        progress=False,
        cbs=cbs,
        **extra,
    )
    learn.fit(EPOCHS, eval_subset=7 if cfg['subset'] else None, resume=True if resume else None)
    scaler = learn.precision.scaler
    return {
        'model': {k: v.clone() for k, v in plain_state_dict(learn.model.state_dict()).items()},
        'step': learn.step,
        'history': [{k: v for k, v in r.items() if k != 'time'} for r in learn.recorder.history],
        'scale': scaler.get_scale() if scaler is not None else None,
    }


def main(cfg, out, kill_at=None, resume=False):
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    if cfg['world'] == 1:
        result = train(cfg, out, kill_at, resume)
    else:
        result = launch(train, nprocs=cfg['world'], args=(cfg, out, kill_at, resume))
    torch.save(result, out / 'final.pt')


if __name__ == '__main__':
    args = sys.argv[1:]
    kill_at = int(args[args.index('--kill-at') + 1]) if '--kill-at' in args else None
    main(json.loads(args[0]), Path(args[1]), kill_at, resume='--resume' in args)
