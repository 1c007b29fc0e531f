"""FSDP2 (`strategy='fsdp'`) on 2 CPU processes (gloo), checked against one process and hand-written references.

The workers start with `nbtrainer.distributed.launch` (fork), except the kill-and-resume test, which runs
tests/fsdp_worker.py as torchrun would (environment variables) and kills it for real.
"""
import math, os, signal, subprocess, sys, time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from conftest import ROOT
from nbtrainer import FSDP, Callback, Checkpointer, Learner, launch, memory_per_rank, plain_checkpoint
from test_distributed import B, dataset, global_batches, hand_written, loader, make_model

pytestmark = pytest.mark.skipif(not dist.is_available() or sys.platform != 'linux', reason='needs torch.distributed and fork')


def full_weights(learn):
    "The whole weights, gathered from every rank's shards (a collective: every rank calls it)."
    return {k: v.full_tensor().clone() for k, v in learn.model.state_dict().items()}


# ---- the same weights as one process on the global batch ----

def train_fsdp(opt_func, n, accumulate, epochs, strategy):
    learn = Learner(make_model(), loader(dataset(n)), opt_func=opt_func, lr=0.05, metrics=(), accumulate=accumulate,
                    progress=False, strategy=strategy)
    learn.fit(epochs)
    sharded = [type(p).__name__ for p in learn.model.parameters()]
    return full_weights(learn), learn.step, sharded


@pytest.mark.parametrize('opt_func, n, accumulate, strategy', [
    (torch.optim.SGD, 48, 1, 'fsdp'),                  # the root alone: one unit
    (torch.optim.Adam, 45, 1, FSDP(wrap=nn.Linear)),   # a unit per Linear; rank 1 repeats an example
    (torch.optim.SGD, 45, 2, FSDP(min_params=50)),     # accumulation over an uneven epoch end; units by size
    (torch.optim.Adam, 46, 3, FSDP(wrap=nn.Linear, reshard_after_forward=False)),
])
def test_two_ranks_equal_one_process_with_the_global_batch(opt_func, n, accumulate, strategy):
    weights, steps, sharded = launch(train_fsdp, nprocs=2, args=(opt_func, n, accumulate, 2, strategy))
    assert set(sharded) == {'DTensor'}
    ref, ref_steps = hand_written(opt_func, n, accumulate, 2)
    assert steps == ref_steps
    assert max((weights[k] - ref[k]).abs().max().item() for k in ref) < 1e-5
