"""What the live plot costs the training loop, how steadily its frames come, and what a frame costs the rendering process.

1. Fits of about `--seconds` each (their steps calibrated from a short timed fit) of the foundation benchmark's setup
   (a 784-64-64-10 MLP, batch 64, Adam, one thread, prepared batches, defaults), with `LivePlot(path=...)` writing a
   PNG as a script does, against the same fit without it, in alternating order. Printed: the ratio of their times (the
   loop's cost of the display: a hand-over of what changed about once a second), the frames shown, the first one's
   time and the longest gap between frames (the final one included). The frames are drawn by the rendering process
   (`nbtrainer.render`), started once for the whole run, as a kernel keeps it.
2. The rendering process's own work, timed here in-process with a `Drawer`, on the data of a fit of 30,000 steps (at
   300 steps a second, an evaluation every 1,000) arriving a second at a time: the median live frame (lines over saved
   layers; the x axis when its range grows; a full draw when a y range changes), its PNG's size, the final frame (a new
   figure, a full draw, full colours), and the slowest live frame.

    python bench/liveplot.py [--seconds 10 30] [--repeats 2]
"""

import argparse, math, statistics, sys, tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from overhead import default_learner, make_batches, make_model
from nbtrainer import LivePlot, clock
from nbtrainer.render import Drawer, pack_arrays


def steps_per_second(train, valid):
    "Optimizer steps a second in this setup, from a short timed fit (validation included, as in the real ones)."
    learn = default_learner(make_model(), train, valid)
    learn.fit(steps=50)  # warm-up
    start = clock.now()
    learn.fit(steps=200)
    return 200 / (clock.now() - start)


def timed_fit(train, valid, steps, live=None):
    "The wall time of a fit of `steps` steps (5 evaluations), with `live` attached if given."
    learn = default_learner(make_model(), train, valid)
    if live is not None:
        learn.add_cbs([live])
    start = clock.now()
    learn.fit(steps=steps, eval_every=max(1, steps // 5))
    return clock.now() - start


def loop_and_frames(args):
    torch.set_num_threads(1)
    train, valid = make_batches(938), make_batches(188, seed=1)
    rate = steps_per_second(train, valid)
    print(f'{rate:.0f} steps/s in this setup; figure 7 x 3.5 in, drawn at 2x (1120 x 560 px)')
    live = LivePlot(path=Path(tempfile.mkdtemp()) / 'live.png')
    timed_fit(train, valid, 100, live)  # the rendering process started and warm, as a kernel keeps it
    for seconds in args.seconds:
        for _ in range(args.repeats):
            steps = int(rate * seconds)
            plain, with_plot = timed_fit(train, valid, steps), timed_fit(train, valid, steps, live)
            moments = [0, *live.times, with_plot]
            gaps = [b - a for a, b in zip(moments, moments[1:])]
            print(
                f'{with_plot:5.1f} s fit: {with_plot / plain:.3f}x the time of the same fit without LivePlot; '
                f'{live.frames} live frames, the first at {live.times[0] if live.times else math.nan:.1f} s, '
                f'longest gap {max(gaps):.1f} s',
                flush=True,
            )


def frame_costs():
    "Time the rendering process's work on a 30,000-step fit arriving a second (300 steps) at a time."
    drawer, rows, costs, sizes = Drawer(), [], [], []
    drawer.warm_up()
    steps = range(1, 30_001)
    losses = [2.3 * math.exp(-s / 8000) + 0.2 + 0.05 * math.sin(s * 1.7) for s in steps]
    drawer.answer({'job': 1, 'start': {'theme': 'light', 'metrics': ['accuracy']}})
    for first in range(0, 30_000, 300):
        chunk = slice(first, first + 300)
        new_rows = [
            {'step': s, 'valid_loss': losses[s - 1] + 0.05, 'accuracy': 1 - losses[s - 1] / 3}
            for s in steps[chunk]
            if s % 1000 == 0
        ]
        arrays, payload = pack_arrays(steps=steps[chunk], losses=losses[chunk], smoothed=losses[chunk])
        start = clock.now()
        reply, png = drawer.answer({'job': 1, 'arrays': arrays, 'rows': new_rows, 'draw': 'live'}, payload)
        costs.append(clock.now() - start)
        sizes.append(len(png))
        rows += new_rows
    start = clock.now()
    _, final = drawer.answer({'job': 1, 'draw': 'final', 'end': True})
    final_cost = clock.now() - start
    frames = drawer.figures['light'][1]
    print(
        f'rendering process, 100 live frames of a 30,000-step fit: median {statistics.median(costs) * 1e3:.0f} ms, '
        f'slowest {max(costs) * 1e3:.0f} ms ({frames.full_draws} full draws, {frames.x_draws} x-axis draws), '
        f'{statistics.median(sizes) / 1024:.0f} KB a frame; final frame {final_cost * 1e3:.0f} ms, {len(final) / 1024:.0f} KB'
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seconds', type=float, nargs='+', default=[10, 30])
    parser.add_argument('--repeats', type=int, default=2)
    args = parser.parse_args()
    loop_and_frames(args)
    frame_costs()


if __name__ == '__main__':
    main()
