"""FSDP2 on 2 CPU processes (gloo): the weights equal one process on the global batch, checkpoints are plain state_dicts
gathered to rank 0 that resume bit-identically and load into a bare model, and each rank holds half the parameters."""
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import Checkpointer, FullyShardedTrainer, Learner, launch, world_size
from nbtrainer.callback import CancelFitException

pytestmark = pytest.mark.skipif(not dist.is_available() or sys.platform != 'linux', reason='needs torch.distributed and fork')
B = 4  # per-rank batch size


def dataset(n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


def make_model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Sequential(nn.Linear(6, 32), nn.Tanh()), nn.Sequential(nn.Linear(32, 32), nn.Tanh()),
                         nn.Linear(32, 3))


def learner(world, accumulate=1, cbs=(), clip=None, precision='fp32'):
    "2 ranks with batch B each, or one process with batch 2B: the same global batches (in order)."
    strategy = FullyShardedTrainer(shard=(nn.Sequential,)) if world > 1 else None
    return Learner(make_model(), DataLoader(dataset(), batch_size=B * 2 // world), opt_func=torch.optim.AdamW, lr=0.02,
                   metrics=(), accumulate=accumulate, clip_grad_norm=clip, progress=False, strategy=strategy, cbs=list(cbs),
                   precision=precision)


def full_weights(learn):
    state = learn.strategy.full_state(learn.model, learn.opt)[0]
    return {k: v.clone() for k, v in state.items()}


def train(world, accumulate, clip, precision='fp32'):
    learn = learner(world, accumulate, clip=clip, precision=precision)
    learn.fit(2)
    local = sum(p.to_local().numel() for p in learn.model.parameters()) if world > 1 else None
    return full_weights(learn), learn.step, local


@pytest.mark.parametrize('accumulate, clip, precision', [(1, None, 'fp32'), (3, None, 'fp32'), (2, 0.5, 'fp32'),
                                                        (2, None, 'bf16')])
def test_fsdp_equals_one_process_on_the_global_batch(accumulate, clip, precision):
    (weights, steps, local) = launch(train, nprocs=2, args=(2, accumulate, clip, precision))
    one, one_steps, _ = train(1, accumulate, clip, precision)
    assert steps == one_steps
    # bf16 autocast: half-batch matmuls round differently from the one process's full batch (as for DDP in
    # tests/test_composition.py); fp32: the same sums in another order
    tolerance = 1e-5 if precision == 'fp32' else 2e-2
    assert max((weights[k] - one[k]).abs().max().item() for k in one) <= tolerance
    total = sum(v.numel() for v in one.values())
    assert local <= total / 2 + 32 * 3  # each rank holds about half of every parameter (dim 0 split, rounded up)


def stop_at(step):
    def callback(learn, event):
        if event == 'after_step' and learn.step == step: raise CancelFitException()
    return callback


def resumed(folder):
    straight = learner(2)
    straight.fit(3)
    first = learner(2, cbs=[Checkpointer(folder, every_steps=1, every_epoch=False)])
    first.fit(3, cbs=[stop_at(7)])
    again = learner(2, cbs=[Checkpointer(folder, every_steps=1, every_epoch=False)])
    again.fit(3, resume=True)
    return full_weights(straight), full_weights(again), again.step, first.step


def test_a_gathered_checkpoint_resumes_bit_identically_and_loads_into_a_bare_model(tmp_path):
    straight, again, step, stopped = launch(resumed, nprocs=2, args=(tmp_path,))
    assert stopped == 7 and step == straight_steps() and all(torch.equal(straight[k], again[k]) for k in straight)
    # the last checkpoint is a plain state_dict: one process, a bare model, the same predictions as the FSDP weights
    bare = make_model()
    saved = torch.load(sorted(tmp_path.glob('step-*.pt'), key=lambda p: int(p.stem.split('-')[1]))[-1],
                       weights_only=False)
    bare.load_state_dict(saved['model'])
    reference = make_model()
    reference.load_state_dict(again)
    x = dataset(8, seed=3).tensors[0]
    assert torch.equal(bare(x), reference(x))
    # and it resumes a one-process Learner too (optimizer state by position, as torch's)
    single = learner(1)
    single.load(sorted(tmp_path.glob('step-*.pt'))[-1], check_data=False, allow_changes=True)


def straight_steps(): return 3 * len(DataLoader(dataset(), batch_size=2 * B))
