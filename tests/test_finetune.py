"""Fine-tuning against references: freezing and EMA against a hand-written loop, across a SIGKILL and a resume and on
2 DDP ranks; fp16's skipped steps left out of the EMA."""

import signal, sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from conftest import ROOT
import warm
import finetune_worker as fw
from nbtrainer import EMA, Callback, Learner, head_body, launch
from nbtrainer.testing import wait_for

WORKER = [sys.executable, str(ROOT / 'tests' / 'finetune_worker.py')]


def final(folder):
    return torch.load(folder / 'final.pt', weights_only=True)


def checkpoint_steps(folder):
    return sorted(int(p.stem.split('-')[1]) for p in (folder / 'checkpoints').glob('step-*.pt'))


def hand_loop():
    "The worker's run without the plateau, by hand: requires_grad off for the body until step 20, 2 lr groups, an EMA."
    ds = fw.data()
    model = fw.make_model()
    body, head = head_body(model)
    opt = torch.optim.AdamW([{'params': body, 'lr': fw.LRS[0]}, {'params': head, 'lr': fw.LRS[1]}])
    norm = {id(p) for p in model[1].parameters()}  # BatchNorm keeps training while the body is frozen
    for p in body:
        p.requires_grad_(id(p) in norm)
    tensors = [*model.parameters(), *model.buffers()]
    avg, updates, step = [t.detach().clone() for t in tensors], 0, 0
    dl = DataLoader(ds, batch_size=16, shuffle=True)
    for epoch in range(4):
        for x, y in dl:
            if step == fw.UNFREEZE_AT:
                for p in body:
                    p.requires_grad_(True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            step += 1
            decay = fw.DECAY * min(1.0, updates / fw.WARMUP)
            with torch.no_grad():
                for a, t in zip(avg, tensors):
                    if t.is_floating_point():
                        a -= (1 - decay) * (a - t)
                    else:
                        a.copy_(t)
            updates += 1
    return model.state_dict(), avg


@pytest.mark.slow  # a trained subprocess
def test_freeze_unfreeze_and_ema_equal_a_hand_loop(tmp_path):
    warm.run(WORKER + [str(tmp_path), '--no-plateau'], check=True, timeout=300)
    ours, (weights, avg) = final(tmp_path), hand_loop()
    assert ours['step'] == 52 and ours['frozen'] == 0
    for k, v in weights.items():
        torch.testing.assert_close(ours['model'][k], v, rtol=1e-6, atol=1e-7)
    for a, b in zip(ours['ema'], avg):
        torch.testing.assert_close(a, b, rtol=1.2e-7, atol=1e-7)


@pytest.mark.slow  # three trained subprocesses, one killed
def test_killed_after_the_unfreeze_and_resumed_equals_uninterrupted(tmp_path):
    "The script freezes at its start; the checkpoint's state (unfrozen), the EMA and the plateau's count win."
    warm.run(WORKER + [str(tmp_path / 'straight')], check=True, timeout=300)
    folder = tmp_path / 'killed'
    proc = warm.Popen(WORKER + [str(folder), '--hold'])  # held after step 25, a step after a checkpoint
    try:
        wait_for((folder / 'held').exists, f'the worker to hold at step {fw.HOLD_AT}', timeout=300, process=proc)
    finally:
        proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert checkpoint_steps(folder)[-1] == 24 > fw.UNFREEZE_AT and not (folder / 'final.pt').exists()
    warm.run(WORKER + [str(folder), '--resume'], check=True, timeout=300)
    a, b = final(tmp_path / 'straight'), final(folder)
    assert a['step'] == b['step'] == 52 and a['frozen'] == b['frozen'] == 0
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])
    assert all(torch.equal(x, y) for x, y in zip(a['ema'], b['ema']))  # the average, bit for bit
    assert a['history'] == b['history'] and a['lrs'] == b['lrs']
    assert a['lrs'][1] < fw.LRS[1]  # the plateau lowered the lr, keeping the groups' ratio
    assert a['lrs'][0] / a['lrs'][1] == pytest.approx(fw.LRS[0] / fw.LRS[1])
    assert all('ema_valid_loss' in row and 'lrs' in row for row in a['history'])


# ---- 2 DDP ranks ----

B = 4


def ddp_data(n=48):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


def ddp_model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def split3(m):
    return [m[0], m[2], m[4]]


def valid_data():
    return ddp_data(45)  # uneven over 2 ranks: one example repeated, weighted 0


def train_ddp():
    ds = ddp_data()
    dl = DataLoader(ds, batch_size=B, shuffle=True, generator=torch.Generator().manual_seed(5))
    ema = EMA(decay=0.8)
    learn = Learner(
        ddp_model(),
        dl,
        DataLoader(valid_data(), batch_size=8),
        opt_func=torch.optim.AdamW,
        lr=slice(1e-3, 5e-2),
        splitter=split3,
        metrics=(),
        progress=False,
        cbs=[ema],
    )
    learn.freeze_to(2)
    learn.fit(1)
    learn.freeze_to(1)
    learn.fit(1)
    learn.unfreeze()
    learn.fit(1)
    weights = {k: v.clone() for k, v in learn.model.module.state_dict().items()}
    return weights, [a.clone() for a in ema.averaged], learn.recorder.history[-1]


@pytest.mark.distributed
def test_freezing_on_two_ranks_equals_a_one_process_hand_loop():
    "DDP is wrapped anew when the trainable set changes: without it the reducer waits for gradients that never come."
    from test_distributed import global_batches
    import test_distributed as td

    weights, averaged, row = launch(train_ddp, nprocs=2)
    saved = td.B, td.SEED, td.dataset
    td.B, td.SEED, td.dataset = B, 5, lambda n, seed=0: ddp_data(n)
    try:
        ds, epochs = global_batches(48, 3)
    finally:
        td.B, td.SEED, td.dataset = saved
    model = ddp_model()
    groups = [list(m.parameters()) for m in split3(model)]
    lrs = [1e-3 * 50 ** (i / 2) for i in range(3)]
    opt = torch.optim.AdamW([{'params': g, 'lr': lr} for g, lr in zip(groups, lrs)])
    tensors = list(model.parameters())
    avg = [t.detach().clone() for t in tensors]
    for frozen, batches in zip((2, 1, 0), epochs):
        for i, g in enumerate(groups):
            for p in g:
                p.requires_grad_(i >= frozen)
        for b in batches:
            x, y = ds[b]
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                for a, t in zip(avg, tensors):
                    a -= (1 - 0.8) * (a - t)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(weights[k], v, rtol=1e-5, atol=1e-6)
    for a, b in zip(averaged, avg):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    x, y = valid_data().tensors  # the row's losses: every validation example once, raw weights and the average
    with torch.no_grad():
        assert row['valid_loss'] == pytest.approx(F.cross_entropy(model(x), y).item(), rel=1e-5)
        for p, a in zip(model.parameters(), avg):
            p.copy_(a)
        assert row['ema_valid_loss'] == pytest.approx(F.cross_entropy(model(x), y).item(), rel=1e-5)


def test_fp16_skipped_steps_are_left_out_of_the_ema():
    "A step the loss scaler skips (an inf gradient) leaves the weights, and so the average, as they were."
    ds = ddp_data(64)
    ema = EMA(decay=0.7)
    snapshots = []

    class Poison(Callback):
        def before_step(self):
            if self.learn.step in (3, 7):
                next(self.learn.model.parameters()).grad[0, 0] = float('inf')

        def after_step(self):
            snapshots.append(([p.detach().clone() for p in self.learn.model.parameters()], self.learn.skipped_steps))

    learn = Learner(
        ddp_model(), DataLoader(ds, batch_size=8), precision='fp16', metrics=(), progress=False, cbs=[ema, Poison()]
    )
    start = [p.detach().clone() for p in learn.model.parameters()]
    learn.fit(1)
    avg, skipped_before = start, 0
    for weights, skipped in snapshots:
        if skipped == skipped_before:
            avg = [a - (1 - 0.7) * (a - w) for a, w in zip(avg, weights)]
        skipped_before = skipped
    assert skipped_before == 2
    for a, b in zip(ema.averaged, avg):
        torch.testing.assert_close(a, b, rtol=1.2e-7, atol=1e-7)
