"""What `DataWait` costs per training step, measured in the same process.

The foundation setup of `bench/overhead.py` (784-64-64-10 MLP, batch 64, Adam, one thread, batches prepared in
advance), reusing its helpers: `learn.fit` with the default callbacks, against the same Learner with a `DataWait`
callback, and, as a control, a second plain Learner. The order rotates every round; the paired per-round ratio of
CPU time per step is the figure (the control row shows the noise of the machine at hand).

    python bench/datawait.py [--rounds 6] [--epochs 1] [--steps 938]
"""

import argparse, statistics, time, warnings

import torch

from overhead import default_learner, make_batches, make_model, paired_ratios, summary
from nbtrainer import DataWait


def own_cost(data_wait, n=200_000):
    "CPU seconds per step of DataWait's two per-batch events alone: a figure free of the fit's noise."
    data_wait.learn.training = True
    data_wait.before_fit()
    data_wait.before_train()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # back-to-back calls look like all waiting: no advice wanted here
        t = time.process_time()
        for _ in range(n):
            data_wait.before_batch()
            data_wait.after_batch()
        cost = (time.process_time() - t) / n
    data_wait.learn.training = False
    return cost


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=6)
    parser.add_argument('--epochs', type=int, default=1)
    parser.add_argument('--steps', type=int, default=938, help='batches per epoch')
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, valid = make_batches(args.steps), make_batches(max(1, args.steps // 5), seed=1)
    plain, control, measured = (default_learner(make_model(), train, valid) for _ in range(3))
    data_wait = DataWait()
    measured.add_cbs([data_wait])
    contenders = {
        'plain': lambda: plain.fit(args.epochs),
        'control': lambda: control.fit(args.epochs),
        'datawait': lambda: measured.fit(args.epochs),
    }
    times = paired_ratios(contenders, args.rounds, args.steps * args.epochs)
    print(f'{args.rounds} rounds of {args.epochs} epoch(s) x {args.steps} steps; per-step CPU time, median of rounds:')
    print(f'  learn.fit (defaults)           {statistics.median(times["plain"]) * 1e6:8.1f} us')
    print(f'  learn.fit + DataWait           {statistics.median(times["datawait"]) * 1e6:8.1f} us')
    for label, name in (('+DataWait / defaults          ', 'datawait'), ('control: defaults / defaults  ', 'control')):
        ratio, q1, q3 = summary(times, name, 'plain')
        print(f'  {label} {ratio:6.3f}x  median of paired rounds (quartiles {q1:.3f}-{q3:.3f})')
    print(f'  data wait share reported on in-memory batches: {data_wait.data_wait_share:.1%}')
    own = own_cost(data_wait)
    print(
        f'  DataWait own work, timed alone: {own * 1e6:.2f} us per step '
        f'({own / statistics.median(times["plain"]):.2%} of a step)'
    )


if __name__ == '__main__':
    main()
