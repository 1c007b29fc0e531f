"""Checkpoint size, save time and load time against the number of batches trained.

A Learner's Recorder keeps one row per training batch (epoch, batch, step, lr, loss). This fills it with N rows (and a
history row every 1000 batches), then measures, for the files a `Checkpointer` writes (the rows in the folder's
append-only side file) and for `learn.save(path)` (its rows in `batches-<run id>.f64` beside it):
  - the checkpoint file's size;
  - the time of a save after 100 more batches (a Checkpointer's steady state: only those rows are appended);
  - the time to load it into a fresh Learner, rows included, and the bytes a batch's row then takes in memory (the
    rows are mapped from the side file, not read);
  - in the last Learner loaded (once, not a median), the first save after 100 more batches (it appends them, reading
    none of the file), then the first read of every row (`train_losses`: the rows' one CRC-32 check and a list of floats);
  - in another Learner loaded, the first save to a new folder (its side file starts as a copy of the loaded one's rows).
Median of 5 repeats; times on this shared machine are noisy, the trend across N is the point.

    python bench/checkpoint_size.py [--sizes 10000 100000 1000000]
"""

import argparse, statistics, tempfile, time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from nbtrainer import Learner

ROWS_PER_EVAL = 1000


def learner():
    torch.manual_seed(0)
    return Learner(nn.Linear(16, 4), [(torch.randn(8, 16), torch.randint(0, 4, (8,)))], progress=False)


def fill(learn, n):
    "N per-batch rows and a history row every 1000 of them, as a long run leaves."
    i = np.arange(n)
    rows = np.stack([i // 1000, i % 1000, i, np.full(n, 1e-3), np.random.default_rng(0).random(n)], axis=1)
    learn.recorder.restore_batches(rows)
    learn.recorder.history = [
        {
            'epoch': e,
            'step': (e + 1) * 1000,
            'train_loss': 0.5,
            'valid_loss': 0.4,
            'accuracy': 0.9,
            'lr': 1e-3,
            'time': 1.0,
        }
        for e in range(n // ROWS_PER_EVAL)
    ]
    learn.step = n


def more_rows(learn, k=100):
    "k more batches, as a fit would append them."
    n = len(learn.recorder.batches['loss'])
    for j in range(n, n + k):
        for column, value in zip(learn.recorder.columns, (j // 1000, j % 1000, j, 1e-3, 0.5)):
            learn.recorder.batches[column].append(value)


def measure(n, side_file, repeats=5):
    folder = Path(tempfile.mkdtemp())
    learn = learner()
    fill(learn, n)
    batches_file = folder / 'batches.f64' if side_file else None  # None: learn.save's own, beside the file
    learn.save(folder / 'first.pt', batches_file=batches_file)  # a side file starts with every row once
    saves, loads = [], []
    for r in range(repeats):
        more_rows(learn)
        start = time.perf_counter()
        learn.save(folder / 'ckpt.pt', batches_file=batches_file)
        saves.append(time.perf_counter() - start)
        fresh = learner()
        start = time.perf_counter()
        fresh.load(folder / 'ckpt.pt')
        loads.append(time.perf_counter() - start)
        assert len(fresh.recorder.batches['loss']) == len(learn.recorder.batches['loss'])
    memory = sum(c.nbytes for c in fresh.recorder.batches.values()) / len(fresh.recorder.batches['loss'])
    more_rows(fresh)  # the loaded Learner goes on (once: a second time would find its rows in the file already)
    start = time.perf_counter()
    fresh.save(folder / 'resumed.pt', batches_file=batches_file)
    resumed_save = time.perf_counter() - start
    start = time.perf_counter()
    assert len(fresh.recorder.train_losses) == n + 100 * (repeats + 1)
    read = time.perf_counter() - start
    elsewhere = learner()
    elsewhere.load(folder / 'ckpt.pt')
    more_rows(elsewhere)
    start = time.perf_counter()
    elsewhere.save(folder / 'elsewhere' / 'copy.pt')
    elsewhere_save = time.perf_counter() - start
    median = statistics.median
    return (folder / 'ckpt.pt').stat().st_size, median(saves), median(loads), memory, resumed_save, read, elsewhere_save


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--sizes', type=int, nargs='+', default=[10_000, 100_000, 1_000_000])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f'{"batches":>10} | {"Checkpointer (side file)":^33} | {"learn.save(path) (own side file)":^33} | loaded rows '
        '| in the loaded Learner (Checkpointer)'
    )
    print(
        f'{"":>10} | {"size":>9} {"save":>11} {"load":>11} | {"size":>9} {"save":>11} {"load":>11} | in memory '
        f'  | {"first save":>11} {"read all":>10} {"save elsewhere":>14}'
    )
    for n in args.sizes:
        figures = [measure(n, side) for side in (True, False)]
        cells = ' | '.join(
            f'{size / 1e3:8.0f}K {save * 1e3:9.1f}ms {load * 1e3:9.1f}ms' for size, save, load, *_ in figures
        )
        resumed_save, read, elsewhere = figures[0][4:]
        print(
            f'{n:>10} | {cells} | {figures[0][3]:5.1f} B/batch | {resumed_save * 1e3:9.1f}ms {read * 1e3:8.1f}ms '
            f'{elsewhere * 1e3:12.1f}ms'
        )


if __name__ == '__main__':
    main()
