"""A study of the digits MLP for tests/test_study.py, run in a process of its own.

    python study_worker.py CONFIG_JSON

CONFIG_JSON holds db (the registry), and optionally kill, which SIGKILLs this process (as a lost machine would):
{"step": s} in the training step s of the first trial this process runs that gets there (mid-training, after a
checkpoint), or {"trial": k} at the first evaluation of the k-th trial it runs (counting from 1), after the Checkpointer
kept its state and before the study reported it to Optuna. `study()` and `SPACE` are what the test compares with.
"""

import json, os, signal, sys

import torch

from nbtrainer import Callback, Learner, Order
from nbtrainer.demo import digits_loaders, digits_model
from nbtrainer.study import Fixed, Float, Study

NAME, SEED, TRIALS, FIT = 'digits-parallel', 7, 8, dict(steps=60, eval_every=15)
SPACE = dict(
    lr=Float(1e-3, 1.0, log=True, role='scientific'),
    weight_decay=Float(1e-6, 1e-2, log=True, role='scientific'),
    momentum=Float(0.5, 0.99),
    hidden=Fixed(32),
)
UPPER = 2.25  # the threshold pruner's bound on valid_loss: a trial above it at an evaluation is pruned there


class KillAt(Callback):
    "SIGKILL this process after training step `step`, or (None) at the first evaluation, once the Checkpointer saved."

    order = Order.SAVE + 1  # after the Checkpointer, before the study's TrialReport

    def __init__(self, step=None):
        self.step = step

    def after_batch(self):
        if self.learn.training and self.learn.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)

    def after_eval(self):
        if self.step is None:
            os.kill(os.getpid(), signal.SIGKILL)


def pruner():
    import optuna

    return optuna.pruners.ThresholdPruner(upper=UPPER)  # decides from the trial's own values: the same in any process


def study(db, kill=None):
    "The study; with `kill` (see above), its build adds a callback that kills this process."
    builds = []

    def build(params):
        builds.append(params)
        train, valid = digits_loaders(seed=0)

        def sgd(parameters, lr):
            return torch.optim.SGD(parameters, lr=lr, momentum=params['momentum'], weight_decay=params['weight_decay'])

        if not kill:
            cbs = []
        else:
            cbs = [KillAt(kill['step'])] if 'step' in kill else [KillAt()] if len(builds) == kill['trial'] else []
        model = digits_model(hidden=params['hidden'])
        return Learner(model, train, valid, lr=params['lr'], opt_func=sgd, progress=False, cbs=cbs)

    return Study(NAME, SPACE, build, trials=TRIALS, fit=FIT, db=db, seed=SEED, pruner=pruner(), display=False)


if __name__ == '__main__':
    torch.set_num_threads(1)
    cfg = json.loads(sys.argv[1])
    study(cfg['db'], cfg.get('kill')).run()
