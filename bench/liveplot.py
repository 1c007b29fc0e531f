"""What the live plot costs: the share of a fit's wall time spent rendering.

The foundation benchmark's setup (a 784-64-64-10 MLP, batch 64, Adam, one thread, 938 prepared batches an epoch,
defaults plus progress), a fit with `LivePlot(path=...)` writing a PNG, as a script does, twice: the first fit in
the process pays matplotlib's one-time costs (fonts, text layout caches), a later one does not. Prints
`render_seconds / fit_seconds`; the budget keeps it within `max_share` (2%) of the fit's projected time, the final
frame included, once the fit is long enough to afford one frame (about 60-100 ms here, so a few seconds).

    python bench/liveplot.py [--epochs 3] [--steps 938] [--every 1.0]
"""
import argparse, sys, tempfile, time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from overhead import default_learner, make_batches, make_model
from nbtrainer import LivePlot


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--steps', type=int, default=938, help='batches per epoch')
    parser.add_argument('--every', type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, valid = make_batches(args.steps), make_batches(max(1, args.steps // 5), seed=1)
    for run in ('cold (first figure of the process)', 'warm (a later fit, as in a notebook session)'):
        learn = default_learner(make_model(), train, valid)
        live = LivePlot(every=args.every, path=Path(tempfile.mkdtemp()) / 'live.png')
        learn.add_cbs([live])
        t = time.perf_counter()
        learn.fit(args.epochs)
        fit_seconds = time.perf_counter() - t
        print(f'{run}: {args.epochs} epochs x {args.steps} steps, fit {fit_seconds:.2f} s, {live.renders} renders '
              f'({live.render_seconds / live.renders * 1e3:.0f} ms each, {live.frames.full_draws} full draws), '
              f'render_seconds / fit_seconds = {live.render_seconds / fit_seconds:.2%} (budget {live.max_share:.0%})')

if __name__ == '__main__':
    main()
