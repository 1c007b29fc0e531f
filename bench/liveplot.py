"""What the live plot costs, and how steadily it draws: the share of a fit's wall time spent rendering, when the first
frame comes, and the longest gap between frames.

The foundation benchmark's setup (a 784-64-64-10 MLP, batch 64, Adam, one thread, prepared batches, defaults plus
progress), with `LivePlot(path=...)` writing a PNG as a script does (frames at 2x pixel density, as in Jupyter), for
fits of about 10 s, 30 s and 100 s (their step counts are calibrated from a short timed fit), with one `LivePlot` kept
across fits as a notebook's dashboard keeps it: the first fit of the process (cold) pays matplotlib's one-time costs
(fonts, text layout caches, building the figure), later ones (warm) do not. Prints, per fit:
frames, the first frame's time, the longest gap between frames (the final frame included), the mean cost of a frame
and of a full draw, and `render_seconds / fit_seconds`. The budget keeps that share within `max_share` (2%), the final
frame included.

    python bench/liveplot.py [--seconds 10 30 100] [--repeats 2] [--every 1.0]
"""
import argparse, sys, tempfile, time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from overhead import default_learner, make_batches, make_model
from nbtrainer import LivePlot


def steps_per_second(train, valid):
    "Optimizer steps a second in this setup, from a short timed fit (validation included, as in the real ones)."
    learn = default_learner(make_model(), train, valid)
    learn.fit(steps=50)  # warm-up
    t = time.perf_counter()
    learn.fit(steps=200)
    return 200 / (time.perf_counter() - t)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seconds', type=float, nargs='+', default=[10, 30, 100])
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--every', type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train = make_batches(938)
    valid = make_batches(188, seed=1)
    rate = steps_per_second(train, valid)
    print(f'{rate:.0f} steps/s in this setup; figure 7 x 3.5 in, drawn at 2x (1120 x 560 px)')
    live = LivePlot(every=args.every, path=Path(tempfile.mkdtemp()) / 'live.png')  # one, as a notebook's dashboard keeps
    runs = [(args.seconds[0], 'cold')] + [(s, 'warm') for s in args.seconds for _ in range(args.repeats)]
    for seconds, kind in runs:
        learn = default_learner(make_model(), train, valid)
        learn.add_cbs([live])
        steps = int(rate * seconds)
        t = time.perf_counter()
        learn.fit(steps=steps, eval_every=max(1, steps // 5))  # 5 evaluations
        fit_seconds = time.perf_counter() - t
        gaps = [b - a for a, b in zip(live.times, live.times[1:])]
        print(f'{kind} {fit_seconds:5.1f} s fit: {live.renders:3d} frames, first at {live.times[0]:4.1f} s, '
              f'longest gap {max(gaps or [0]):4.1f} s, {live.render_seconds / live.renders * 1e3:3.0f} ms a frame '
              f'({live.frames.full_draws} full draws so far), '
              f'render_seconds / fit_seconds = {live.render_seconds / fit_seconds:.2%} (budget {live.max_share:.0%})')


if __name__ == '__main__':
    main()
