"""On a CUDA machine: steady-state training steps never synchronise with the host, batches from pinned memory move
without blocking, and two GPUs train under DDP over NCCL like one process on the global batch. Skipped without CUDA
(the development machines and CI have none): these are written for the first GPU run, with bench/gpu.py.
"""

import os, subprocess, sys

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from conftest import ROOT

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')]


def loader(n=512, bs=32, pin=True):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=bs, shuffle=True, pin_memory=pin)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))


@pytest.mark.parametrize('precision', ['fp32', 'bf16', 'fp16'])
@pytest.mark.parametrize('accumulate,clip', [(1, None), (2, 1.0)])
def test_steady_state_steps_do_not_synchronise(precision, accumulate, clip):
    from nbtrainer import Callback, Learner

    class ErrorOnSync(Callback):
        order = -1000

        def before_batch(self):
            if self.learn.training and self.learn.iter == 4:
                torch.cuda.set_sync_debug_mode('error')

        def after_train(self):
            torch.cuda.set_sync_debug_mode('default')  # the epoch's end reads the losses: allowed

        def after_fit(self):
            torch.cuda.set_sync_debug_mode('default')

    learn = Learner(
        model(),
        loader(),
        lr=1e-3,
        metrics=(),
        precision=precision,
        accumulate=accumulate,
        clip_grad_norm=clip,
        progress=False,
        device='cuda',
        cbs=[ErrorOnSync()],
    )
    assert learn.opt.defaults.get('fused')  # the default AdamW is fused on CUDA: fp16's inf check stays on the device
    learn.fit(1)
    assert learn.fit_outcome == 'finished' and learn.step == len(learn.train_dl) // accumulate


def test_pinned_batches_move_without_blocking():
    from nbtrainer import to_device

    x = torch.randn(1024, 1024).pin_memory()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        moved = to_device((x,), torch.device('cuda'))[0]
    stream.synchronize()
    assert torch.equal(moved.cpu(), x)
    torch.cuda.set_sync_debug_mode('error')
    try:
        to_device((x,), torch.device('cuda'))  # a blocking copy would synchronise, and raise here
    finally:
        torch.cuda.set_sync_debug_mode('default')


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='needs two GPUs')
def test_two_gpus_over_nccl_equal_one_process(tmp_path):
    worker = str(ROOT / 'tests' / 'ddp_worker.py')
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    subprocess.run([sys.executable, worker, str(tmp_path / 'one'), '--short'], check=True, timeout=300, env=env)
    subprocess.run(
        [
            sys.executable,
            '-m',
            'torch.distributed.run',
            '--standalone',
            '--nproc-per-node=2',
            worker,
            str(tmp_path / 'two'),
            '--short',
        ],
        check=True,
        timeout=300,
        env=env,
    )
    one, two = (torch.load(tmp_path / d / 'final.pt', weights_only=True) for d in ('one', 'two'))
    assert max((one['model'][k] - two['model'][k]).abs().max().item() for k in one['model']) < 1e-5
