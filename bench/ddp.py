"""One process against two on this machine: training throughput and scaling efficiency of `Learner` under DDP.

A CPU figure, honestly labelled: 2 shared cores, gloo over loopback, one thread per process (as torchrun sets).
It says what DDP costs and gains on such a machine, nothing about GPUs, where the all-reduce is NCCL over NVLink
or PCIe and the step is far shorter.

Setup: a 784-256-256-10 MLP, Adam, in-memory data of 60,000 random examples in a shuffled DataLoader.
Rows, each the median of `--rounds` rounds in rotating order, `--steps` optimizer steps after a warm-up:

- 1 process, batch 64: the baseline;
- 2 processes, batch 64 each (global 128): weak scaling, what DDP is for;
- 2 processes, batch 32 each (global 64): strong scaling, the same global batch as the baseline;
- a hand-written DDP loop (no nbtrainer), 2 x 64: what nbtrainer adds on top of DDP itself.

Throughput is examples per second summed over the ranks; efficiency is throughput / (N x one process's).
Then the Learner against the hand-written loop in the same two processes, segments in turn (`--pairs` of them): each
pair's ratio cancels the drift between launches, which on a shared machine is larger than what is measured.

    python bench/ddp.py [--rounds 3] [--steps 300] [--pairs 8]
"""

import argparse, itertools, statistics, time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from nbtrainer import Callback, Learner, launch, world_size

N = 60_000


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def make_data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(N, 784, generator=g), torch.randint(0, 10, (N,), generator=g))


class Clock(Callback):
    "Time `steps` optimizer steps after `warmup`, between barriers (every rank starts and ends together)."

    def __init__(self, warmup, steps):
        self.warmup, self.steps, self.seconds = warmup, steps, None

    def after_step(self):
        step = self.learn.step
        if step == self.warmup:
            if dist.is_initialized():
                dist.barrier()
            self.start = time.perf_counter()
        elif step == self.warmup + self.steps:
            if dist.is_initialized():
                dist.barrier()
            self.seconds = time.perf_counter() - self.start


def learner_run(batch, warmup, steps):
    torch.set_num_threads(1)
    clock = Clock(warmup, steps)
    learn = Learner(
        make_model(),
        DataLoader(make_data(), batch_size=batch, shuffle=True),
        opt_func=torch.optim.Adam,
        metrics=(),
        progress=False,
        cbs=[clock],
    )
    learn.fit(steps=warmup + steps)
    return batch * world_size() * steps / clock.seconds


def hand_written_run(batch, warmup, steps):
    "Plain DDP: DistributedSampler, mean loss, DDP's averaged gradients (exact for even batches only)."
    torch.set_num_threads(1)
    ds = make_data()
    sampler = DistributedSampler(ds, shuffle=True)
    model = nn.parallel.DistributedDataParallel(make_model())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def epochs():  # a new shuffle each epoch, as the Learner's
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            yield from DataLoader(ds, batch_size=batch, sampler=sampler)

    it = epochs()
    for i in range(warmup + steps):
        if i == warmup:
            dist.barrier()
            start = time.perf_counter()
        x, y = next(it)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    return batch * world_size() * steps / (time.perf_counter() - start)


def paired_run(batch, warmup, steps, pairs):
    "Learner / hand-written loop throughput, each pair's two segments run in turn in the same processes (order alternating)."
    ratios = []
    for p in range(pairs):
        runs = (learner_run, hand_written_run) if p % 2 else (hand_written_run, learner_run)
        speed = {run: run(batch, warmup, steps) for run in runs}  # examples per second
        ratios.append(speed[learner_run] / speed[hand_written_run])
    return ratios


def main(rounds, steps, pairs, warmup=20):
    runs = {
        '1 process, batch 64': lambda: launch(learner_run, nprocs=1, args=(64, warmup, steps)),
        '2 processes, batch 64 each (global 128)': lambda: launch(learner_run, nprocs=2, args=(64, warmup, steps)),
        '2 processes, batch 32 each (global 64)': lambda: launch(learner_run, nprocs=2, args=(32, warmup, steps)),
        'hand-written DDP loop, 2 x 64': lambda: launch(hand_written_run, nprocs=2, args=(64, warmup, steps)),
    }
    results = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order: drift hits every row alike
            results[name].append(runs[name]())
    base = statistics.median(results[names[0]])
    print(
        f'CPU figure: 2 shared cores, gloo, 1 thread per process, torch {torch.__version__}; '
        f'median of {rounds} rounds of {steps} steps'
    )
    print(f"{'':42s} {'examples/s':>11s} {'speed-up':>9s} {'efficiency':>11s}   (all rounds)")
    for name in names:
        thr = statistics.median(results[name])
        procs = 1 if name.startswith('1 ') else 2
        print(
            f'{name:42s} {thr:11.0f} {thr / base:8.2f}x {thr / base / procs:10.0%}   '
            f"({', '.join(f'{v:.0f}' for v in results[name])})"
        )
    learner, hand = (statistics.median(results[n]) for n in (names[1], names[3]))
    print(f'Learner / hand-written DDP loop, 2 x 64, medians of separate launches: {learner / hand:.3f}x')
    if not pairs:
        return
    ratios = launch(paired_run, nprocs=2, args=(64, warmup, steps, pairs))
    print(
        f'Learner / hand-written DDP loop, 2 x 64, {pairs} pairs in the same processes: median '
        f'{statistics.median(ratios):.3f}x (range {min(ratios):.3f}-{max(ratios):.3f}; '
        f"{', '.join(f'{r:.3f}' for r in ratios)})"
    )


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--steps', type=int, default=300)
    parser.add_argument('--pairs', type=int, default=8)
    args = parser.parse_args()
    main(args.rounds, args.steps, args.pairs)
