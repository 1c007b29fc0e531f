"""What live controls cost: `await learn.fit_async(...)` (the loop in a worker thread, with `Controls` attached) against
`learn.fit(...)` and a hand-written loop, per step, and how long a Stop request takes to end the fit.

The foundation benchmark's setup (bench/overhead.py: a 784-64-64-10 MLP, batch 64, Adam, one thread, 938 prepared
batches an epoch), order rotating, CPU time of the whole process (the awaiting main thread included). Then the
latency: a thread calls `controls.stop()` (what the Stop button does) at a random moment of a fit, and the time until
`after_fit` starts is measured, over several fits.

    python bench/controls.py [--rounds 6] [--epochs 3] [--steps 938] [--stops 10]
"""

import argparse, asyncio, random, statistics, sys, threading, time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from overhead import default_learner, hand_written_epoch, make_batches, make_model, paired_ratios, summary
from nbtrainer import Callback, Controls


class StopClock(Callback):
    "Notes when `after_fit` starts."

    order = -100

    def after_fit(self):
        self.ended = time.perf_counter()


def stop_latency(train, valid, trials):
    "Seconds from `controls.stop()` to `after_fit`, one random stop time per fit."
    controls, clock = Controls(), StopClock()
    learn = default_learner(make_model(), train, valid)
    learn.add_cbs([controls, clock])
    latencies, rng = [], random.Random(0)
    for _ in range(trials):
        asked = []
        timer = threading.Timer(rng.uniform(0.3, 1.5), lambda: (asked.append(time.perf_counter()), controls.stop()))
        timer.start()
        asyncio.run(learn.fit_async(50))  # far longer than the stop time
        latencies.append(clock.ended - asked[0])
    return latencies


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=6)
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--steps', type=int, default=938, help='batches per epoch')
    parser.add_argument('--stops', type=int, default=10, help='fits stopped for the latency figure')
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, valid = make_batches(args.steps), make_batches(max(1, args.steps // 5), seed=1)
    ref, control = make_model(), make_model()
    ref_opt, control_opt = (torch.optim.Adam(m.parameters(), lr=1e-3) for m in (ref, control))
    plain, threaded = default_learner(make_model(), train, valid), default_learner(make_model(), train, valid)
    epochs = args.epochs
    contenders = {
        'hand': lambda: [hand_written_epoch(ref, ref_opt, train, valid) for _ in range(epochs)],
        'control': lambda: [hand_written_epoch(control, control_opt, train, valid) for _ in range(epochs)],
        'fit': lambda: plain.fit(epochs),
        'fit_async': lambda: asyncio.run(threaded.fit_async(epochs)),
    }
    times = paired_ratios(contenders, args.rounds, args.steps * epochs)
    print(f'{args.rounds} rounds of {epochs} epochs x {args.steps} steps; per-step CPU time, median of paired rounds:')
    for label, name, base in (
        ('learn.fit / hand-written      ', 'fit', 'hand'),
        ('learn.fit_async / hand-written', 'fit_async', 'hand'),
        ('learn.fit_async / learn.fit   ', 'fit_async', 'fit'),
        ('control: hand / hand          ', 'control', 'hand'),
    ):
        ratio, q1, q3 = summary(times, name, base)
        print(f'  {label} {ratio:7.3f}x  (quartiles {q1:.3f}-{q3:.3f})')
    latencies = stop_latency(train, valid, args.stops)
    step_ms = statistics.median(times['fit']) * 1e3
    print(
        f'Stop request -> after_fit over {args.stops} fits: median {statistics.median(latencies) * 1e3:.1f} ms, '
        f'max {max(latencies) * 1e3:.1f} ms (one step takes about {step_ms:.2f} ms; the target is <= 1 s)'
    )


if __name__ == '__main__':
    main()
