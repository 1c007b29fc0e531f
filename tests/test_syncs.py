"""No host-device sync per step: every read of a tensor back to the host, counted over steady-state training steps,
is no more than a hand-written loop of the same recipe reads (issue #20).

On a GPU each such read (`.item()`, `.tolist()`, `bool(t)`, `float(t)`, `.cpu()`, ...) waits for the device queue to
drain. This test wraps those methods of `torch.Tensor`, runs a window of batches in the middle of an epoch (after the
first batch's checks, between evaluations and checkpoints, and before the Recorder's every-256-batches read), and
compares the count with a hand-written loop doing the same arithmetic. Progress bars read at a throttled wall-clock
refresh; here their refresh is set beyond the test's length so that the count does not depend on the machine's speed.
"""

import contextlib, io, itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import (
    EMA,
    Callback,
    Checkpointer,
    CSVLogger,
    EarlyStopping,
    Learner,
    ProgressCallback,
    ReduceLROnPlateau,
    TensorBoardLogger,
    TorchScheduler,
    Tracker,
    head_body,
)

HOST_READS = ('item', 'tolist', '__bool__', '__float__', '__int__', '__index__', 'cpu', 'numpy')
START, STOP = 20, 60  # the window: batches START..STOP-1 of the first epoch (of 128)


class HostReads:
    "Counts calls of the host-read methods of torch.Tensor while `counting` is True."

    def __init__(self):
        self.count, self.counting, self.where = 0, False, []

    @contextlib.contextmanager
    def installed(self):
        originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

        def wrap(name, f):
            def counted(*args, **kwargs):
                if self.counting:
                    self.count += 1
                    self.where.append(name)
                return f(*args, **kwargs)

            return counted

        for name, f in originals.items():
            setattr(torch.Tensor, name, wrap(name, f))
        try:
            yield self
        finally:
            for name, f in originals.items():
                setattr(torch.Tensor, name, f)


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128 * 8, 6, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def hand_written(reads, precision, accumulate, clip):
    "The recipe by hand: autocast, the loss scaled to its share of the window, GradScaler for fp16, clipping."
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    dtype = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}[precision]
    scaler = torch.amp.GradScaler('cpu') if precision == 'fp16' else None
    batches = list(DataLoader(data(), batch_size=8))
    for i, (x, y) in enumerate(batches):
        reads.counting = START <= i < STOP
        with torch.autocast('cpu', dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(net(x), y) / accumulate
        (scaler.scale(loss) if scaler else loss).backward()
        if (i + 1) % accumulate:
            continue
        if clip:
            if scaler:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad()
    reads.counting = False


class Window(Callback):
    "Count host reads from the START-th training batch of the first epoch to the STOP-th."

    order = -1000  # before every other callback's before_batch, and (run last) after every after_batch

    def __init__(self, reads):
        self.reads = reads

    def before_batch(self):
        if self.learn.training:
            self.reads.counting = self.learn.epoch == 0 and START <= self.learn.iter < STOP

    def after_fit(self):
        self.reads.counting = False


def learner(reads, tmp_path, precision='fp32', accumulate=1, clip=None, extras=()):
    cbs = [Window(reads), ProgressCallback(refresh=1e9, file=io.StringIO())]
    kwargs = {}
    if 'train_metrics' in extras:
        kwargs['train_metrics'] = ('accuracy',)
    if 'finetune' in extras:  # two lr groups, the body frozen, an EMA (fp16: its skipped-step test on the device)
        cbs += [EMA(decay=0.99), ReduceLROnPlateau(patience=1)]
        kwargs.update(splitter=head_body, lr=slice(1e-4, 1e-3))
    if 'scheduler' in extras:  # a torch scheduler stepped after each step: fp32 and bf16 read nothing for it
        cbs.append(TorchScheduler(lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, 500)))
    if 'writers' in extras:
        cbs += [
            CSVLogger(tmp_path / 'log.csv'),
            TensorBoardLogger(tmp_path / 'tb'),
            Checkpointer(tmp_path / 'ckpt'),
            Tracker(tmp_path / 'runs.db'),
            EarlyStopping(patience=3),
        ]
    learn = Learner(
        model(),
        DataLoader(data(), batch_size=8),
        DataLoader(data(), batch_size=64),
        **{'lr': 1e-3, **kwargs},
        precision=precision,
        accumulate=accumulate,
        clip_grad_norm=clip,
        progress=False,
        cbs=cbs,
    )
    if 'finetune' in extras:
        learn.freeze()
    return learn


CASES = [(p, a, c, ()) for p, a, c in itertools.product(('fp32', 'bf16', 'fp16'), (1, 2), (None, 1.0))]
CASES += [
    ('fp32', 1, None, ('train_metrics',)),
    ('fp16', 2, 1.0, ('train_metrics', 'writers')),
    ('bf16', 1, None, ('writers',)),
    ('fp32', 1, None, ('finetune',)),
    ('bf16', 2, 1.0, ('scheduler',)),
    ('fp16', 2, 1.0, ('finetune',)),
]


@pytest.mark.parametrize('precision,accumulate,clip,extras', CASES)
def test_no_more_host_reads_per_step_than_a_hand_written_loop(tmp_path, precision, accumulate, clip, extras):
    with HostReads().installed() as hand:
        hand_written(hand, precision, accumulate, clip)
    with HostReads().installed() as ours:
        learn = learner(ours, tmp_path, precision, accumulate, clip, extras)
        learn.fit(2)
    assert learn.fit_outcome == 'finished'
    # the hand-written loop reads too: AdamW on the CPU reads each step count, GradScaler its found_inf (non-fused)
    assert ours.count <= hand.count, f'{ours.count} host reads ({ours.where[:10]}) against {hand.count} by hand'


def test_the_counter_sees_a_read():
    "The counter is real: a loop that reads its loss each step is caught."

    class ReadsLoss(Callback):
        def after_loss(self):
            self.value = self.learn.loss.item()

    counts = []
    for cbs in ([], [ReadsLoss()]):
        with HostReads().installed() as reads:
            learner(reads, None).fit(1, cbs=cbs)
        counts.append(reads.count)
    assert counts[1] - counts[0] == STOP - START
