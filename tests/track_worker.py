"""Fits with a Tracker (and maybe an MLflowLogger and a Checkpointer) for tests/test_track.py, in a process of their own.

    python track_worker.py CONFIG_JSON

CONFIG_JSON holds db, and optionally: study, name, fits (how many fits, one after the other), epochs, eval_every,
beat_every (the heartbeat interval), gate (a file to wait for, so that several workers start together), mlflow (a
tracking URI) and experiment, checkpoints (a folder: a Checkpointer saving every 2 steps), kill_at (SIGKILL this
process in the evaluation at that step, as a lost machine would), resume (fit(resume=True)), tag (each run tags
itself with `name` afterwards, through runs()), out (a JSON file for the last fit's history).
"""

import json, os, signal, sys

import torch
from torch.utils.data import DataLoader

from nbtrainer import Callback, Checkpointer, Learner, MLflowLogger, Order, Tracker, runs
from nbtrainer.testing import classification_data, tiny_classifier, wait_for


class KillAt(Callback):
    "SIGKILL this process in the evaluation at optimizer step `step`, once the writers have written it."

    order = Order.CONTROL + 10

    def __init__(self, step):
        self.step = step

    def after_eval(self):
        if self.learn.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def learner(cbs):
    torch.manual_seed(0)
    train = DataLoader(
        classification_data(96, seed=0), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    valid = DataLoader(classification_data(48, seed=1), batch_size=24)
    return Learner(tiny_classifier(), train, valid, lr=0.01, progress=False, cbs=cbs)


def main(cfg):
    torch.set_num_threads(1)
    if cfg.get('gate'):  # the workers start together (a deadline, then an error)
        wait_for(lambda: os.path.exists(cfg['gate']), f"the gate {cfg['gate']}", timeout=300)
    for fit in range(cfg.get('fits', 1)):
        tracker = Tracker(cfg['db'], study=cfg.get('study'), notes=f"{cfg.get('name', '')} fit {fit}".strip())
        tracker.beat_every = cfg.get('beat_every', Tracker.beat_every)
        cbs = [tracker]
        if cfg.get('mlflow'):
            cbs.append(MLflowLogger(cfg['mlflow'], experiment=cfg['experiment'], run_name='worker', log_every=2))
        if cfg.get('checkpoints'):
            cbs.append(Checkpointer(cfg['checkpoints'], every_steps=2, keep_last=2, keep_best=0))
        if cfg.get('kill_at'):
            cbs.append(KillAt(cfg['kill_at']))
        learn = learner(cbs)
        learn.fit(cfg.get('epochs', 3), eval_every=cfg.get('eval_every'), resume=True if cfg.get('resume') else None)
        if cfg.get('tag'):
            run = next(r for r in runs(cfg['db']) if r.id == tracker.run_id)
            run.tag(cfg['name'])
    if cfg.get('out'):
        with open(cfg['out'], 'w') as f:
            json.dump(learn.recorder.history, f)


if __name__ == '__main__':
    main(json.loads(sys.argv[1]))
