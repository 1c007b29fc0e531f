"""What nbtrainer's loop costs over a hand-written PyTorch loop, measured in the same process.

Setup (from the foundation issue): a 784-64-64-10 MLP, batch 64, Adam, one thread, batches prepared in
advance, an MNIST-sized epoch (938 batches) and a validation set a fifth of that. Each round runs three
epochs of the hand-written loop, `learn.fit(3)` with the default callbacks (progress, recorder, validation
metrics), the same with a CSV log, TensorBoard and a checkpoint every epoch, and, as a control, the
hand-written loop again on a second model. The order rotates every round. Both loops validate the same way:
loss and accuracy accumulated on the device, read once.

Absolute times on a shared machine are noise; the paired ratio is not. The control row (hand-written loop
against itself) shows how large the noise is on the machine at hand.

    python bench/overhead.py [--rounds 8] [--epochs 3] [--steps 938]
"""

import argparse, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from nbtrainer import Learner


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def make_batches(n, bs=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(bs, 784, generator=g), torch.randint(0, 10, (bs,), generator=g)) for _ in range(n)]


def hand_written_epoch(model, opt, train, valid):
    model.train()
    for x, y in train:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():  # the same validation work the Learner does: loss and accuracy, read once
        total, correct, n = torch.zeros(()), torch.zeros((), dtype=torch.long), 0
        for x, y in valid:
            pred = model(x)
            total += F.cross_entropy(pred, y) * len(y)
            correct += (pred.argmax(1) == y).sum()
            n += len(y)
        (total / n).item(), (correct / n).item()


def default_learner(model, train, valid):
    learn = Learner(model, train, valid, opt_func=torch.optim.Adam, lr=1e-3, metrics=('accuracy',))
    for cb in learn.cbs:  # progress stays on (it is a default callback), drawn to /dev/null
        if type(cb).__name__ == 'ProgressCallback':
            cb.file = open(os.devnull, 'w')
    return learn


def logging_learner(model, train, valid):
    "Defaults plus a CSV log, TensorBoard and a checkpoint every epoch: the issue's 'mechanics' run."
    from nbtrainer import Checkpointer, CSVLogger, TensorBoardLogger

    out = Path(tempfile.mkdtemp())
    learn = default_learner(model, train, valid)
    learn.add_cbs([CSVLogger(out / 'log.csv'), TensorBoardLogger(out / 'tb'), Checkpointer(out / 'ckpt', keep_best=0)])
    return learn


def paired_ratios(contenders, rounds, steps):
    "Per-step CPU time of each contender per round, order rotating; returns {name: [seconds per step]}."
    names = list(contenders)
    times = {name: [] for name in names}
    for r in range(rounds + 1):  # round 0 warms everything up
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            t = time.process_time()  # this process's CPU time: other tenants of a shared machine don't count
            contenders[name]()
            if r:
                times[name].append((time.process_time() - t) / steps)  # per step: steps counts all epochs
    return times


def summary(times, name, base):
    ratios = [a / b for a, b in zip(times[name], times[base])]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return statistics.median(ratios), q1, q3


def import_time(stmt, repeats=5):
    "Median seconds that `stmt` adds after `import torch`, each in a fresh interpreter."
    code = 'import time; import torch; t = time.perf_counter(); ' + stmt + '; print(time.perf_counter() - t)'
    runs = [float(subprocess.check_output([sys.executable, '-c', code], text=True)) for _ in range(repeats)]
    return statistics.median(runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=8)
    parser.add_argument('--epochs', type=int, default=3, help='epochs per fit (per-fit costs amortize as in real use)')
    parser.add_argument('--steps', type=int, default=938, help='batches per epoch')
    parser.add_argument('--no-logging', action='store_true', help='skip the CSV + TensorBoard + checkpoint run')
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, valid = make_batches(args.steps), make_batches(max(1, args.steps // 5), seed=1)
    ref, control = make_model(), make_model()
    ref_opt, control_opt = (torch.optim.Adam(m.parameters(), lr=1e-3) for m in (ref, control))
    learn = default_learner(make_model(), train, valid)
    epochs = args.epochs
    contenders = {
        'hand': lambda: [hand_written_epoch(ref, ref_opt, train, valid) for _ in range(epochs)],
        'control': lambda: [hand_written_epoch(control, control_opt, train, valid) for _ in range(epochs)],
        'learner': lambda: learn.fit(epochs),
    }
    if not args.no_logging:
        logged = logging_learner(make_model(), train, valid)
        contenders['logging'] = lambda: logged.fit(epochs)
    times = paired_ratios(contenders, args.rounds, args.steps * epochs)
    print(f'{args.rounds} rounds of {epochs} epochs x {args.steps} steps; per-step CPU time, median of rounds:')
    print(f'  hand-written loop        {statistics.median(times["hand"]) * 1e6:8.1f} us')
    print(f'  learn.fit (defaults)     {statistics.median(times["learner"]) * 1e6:8.1f} us')
    rows = [('learn.fit / hand-written', 'learner'), ('control: hand / hand    ', 'control')]
    if 'logging' in times:
        rows.insert(1, ('+CSV+TB+ckpt / hand     ', 'logging'))
    for label, name in rows:
        ratio, q1, q3 = summary(times, name, 'hand')
        of_medians = statistics.median(times[name]) / statistics.median(times['hand'])
        print(
            f'  {label} {ratio:8.3f}x  median of paired rounds (quartiles {q1:.3f}-{q3:.3f}); '
            f'{of_medians:.3f}x ratio of medians'
        )
    print('  targets: learn.fit / hand-written <= 1.03x; with CSV, TensorBoard and checkpoints <= 1.08x')
    for stmt in ('import nbtrainer', 'from nbtrainer.core import Learner'):
        print(f'  {stmt + " after torch:":<48}{import_time(stmt):6.3f} s (target <= 0.3 s)')


if __name__ == '__main__':
    main()
