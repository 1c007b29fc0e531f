"""The experiment registry's costs: writing a run's row at each evaluation, and reading a large registry.

1. `Tracker.after_eval` (one history row, the best value, the heartbeat: one transaction) timed inside real fits that
   evaluate after every step, on the local disk; with --writers N, N processes write the same database at once.
   Then one heartbeat (the update the Tracker's thread makes every 10 s).
2. `runs()` over a registry of 1,000 runs of 100 evaluations each (written through the same schema), then the table,
   every history, and a plot of ten runs.

    python bench/track.py [--evals 400] [--writers 1 4] [--runs 1000] [--rows 100]

The per-step cost is counted by `python bench/instructions.py` (mode 'tracker').
"""

import argparse, json, multiprocessing as mp, os, random, statistics, sys, tempfile, time
from contextlib import closing
from pathlib import Path


def timed_fit(db, evals, out):
    import torch
    from torch.utils.data import DataLoader
    from nbtrainer import Learner
    from nbtrainer.testing import classification_data, tiny_classifier
    from nbtrainer.track import Tracker

    torch.set_num_threads(1)

    class TimedTracker(Tracker):
        def after_eval(self):
            start = time.perf_counter()
            super().after_eval()
            self.times.append(time.perf_counter() - start)

    tracker = TimedTracker(db)
    tracker.times = []
    dl = DataLoader(classification_data(64), batch_size=16)
    Learner(tiny_classifier(), dl, dl, metrics=('accuracy', 'f1'), progress=False, cbs=[tracker]).fit(
        steps=evals, eval_every=1
    )
    Path(out).write_text(json.dumps(tracker.times))


def row_writes(evals, writers):
    "Seconds per `after_eval`, from every process of `writers` writing one fresh database at once."
    folder = Path(tempfile.mkdtemp())
    ctx = mp.get_context('spawn')
    procs = [
        ctx.Process(target=timed_fit, args=(str(folder / 'runs.db'), evals, str(folder / f'{i}.json')))
        for i in range(writers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        sys.exit('a writer failed')
    return sorted(t for i in range(writers) for t in json.loads((folder / f'{i}.json').read_text()))


def build_registry(db, n_runs, n_rows):
    "A registry of `n_runs` finished runs with `n_rows` history rows each, in 10 studies, written through the real schema."
    from nbtrainer.registry import connect, transaction

    rng = random.Random(0)
    config = {
        'lr': 0.001,
        'opt': 'AdamW',
        'opt.betas': [0.9, 0.999],
        'opt.eps': 1e-08,
        'opt.weight_decay': 0.01,
        'opt.amsgrad': False,
        'opt.maximize': False,
        'loss': 'cross_entropy',
        'batch_size': 64,
        'world_size': 1,
        'model': 'Sequential',
        'params': 9610,
        'metrics': ['accuracy'],
        'precision': 'fp32',
        'accumulate': 1,
        'epochs': 100,
        'eval_every': None,
        'seed': 0,
        'loader_seed': 0,
    }
    with closing(connect(db, create=True)) as con:
        for i in range(n_runs):
            cfg = {**config, 'lr': 10 ** rng.uniform(-4, -1), 'seed': i}
            rows = [
                {
                    'epoch': e,
                    'step': 23 * (e + 1),
                    'train_loss': rng.random(),
                    'valid_loss': rng.random(),
                    'accuracy': rng.random(),
                    'lr': cfg['lr'],
                    'time': 0.5 * (e + 1),
                }
                for e in range(n_rows)
            ]
            best = min(rows, key=lambda r: r['valid_loss'])
            with transaction(con):
                run = con.execute(
                    "INSERT INTO runs (study, status, started, ended, heartbeat, beat_every, host, command, "
                    "config, monitor, mode, best_value, best_step, final, notes) "
                    "VALUES (?, 'finished', ?, ?, ?, 10, 'bench', 'python train.py', ?, 'valid_loss', 'min', ?, ?, ?, ?)",
                    (
                        f'study-{i % 10}',
                        1e9 + i,
                        1e9 + i + 50,
                        1e9 + i + 50,
                        json.dumps(cfg),
                        best['valid_loss'],
                        best['step'],
                        json.dumps(rows[-1]),
                        f'trial {i}',
                    ),
                ).lastrowid
                con.executemany(
                    'INSERT INTO evals (run, seq, step, row) VALUES (?, ?, ?, ?)',
                    [(run, j, r['step'], json.dumps(r)) for j, r in enumerate(rows)],
                )


def best_of(f, repeat=5):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = f()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--evals', type=int, default=400, help='evaluations (rows) per writer')
    parser.add_argument('--writers', type=int, nargs='+', default=[1, 4])
    parser.add_argument('--runs', type=int, default=1000)
    parser.add_argument('--rows', type=int, default=100)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nbtrainer.experiments import runs

    print('1. Tracker.after_eval: one history row, the best value and the heartbeat, one transaction')
    for writers in args.writers:
        t = row_writes(args.evals, writers)
        q = lambda p: t[min(len(t) - 1, int(p * len(t)))] * 1e3
        print(
            f'   {writers} writer(s), {len(t)} rows: median {q(0.5):.3f} ms, p95 {q(0.95):.3f} ms, p99 {q(0.99):.3f} ms, '
            f'max {t[-1] * 1e3:.1f} ms'
        )

    from nbtrainer.registry import connect, transaction

    beat_db = Path(tempfile.mkdtemp()) / 'beat.db'
    with closing(connect(beat_db, create=True)) as con:  # what the heartbeat thread does every beat_every (10) seconds
        with transaction(con):
            con.execute(
                "INSERT INTO runs (status, started, heartbeat, beat_every, config) VALUES ('running', 0, 0, 10, '{}')"
            )
        beats = []
        for _ in range(args.evals):
            start = time.perf_counter()
            with transaction(con):
                con.execute("UPDATE runs SET heartbeat = ? WHERE id = 1 AND status = 'running'", (time.time(),))
            beats.append(time.perf_counter() - start)
    beat = statistics.median(beats)
    print(f'   a heartbeat: median {beat * 1e3:.3f} ms, every 10 s: {beat / 10:.1e} of the wall time')

    db = Path(tempfile.mkdtemp()) / 'registry.db'
    start = time.perf_counter()
    build_registry(db, args.runs, args.rows)
    print(
        f'2. a registry of {args.runs} runs x {args.rows} evaluations ({os.path.getsize(db) / 1e6:.0f} MB), '
        f'written in {time.perf_counter() - start:.1f} s'
    )
    t, found = best_of(lambda: runs(db))
    print(f'   runs(db): {t * 1e3:.0f} ms ({len(found)} runs)')
    t, _ = best_of(lambda: runs(db, study='study-3'))
    print(f'   runs(db, study=...): {t * 1e3:.0f} ms (a tenth of them)')
    t, _ = best_of(lambda: (repr(found), found._repr_html_()))
    print(f'   the text and HTML tables of all of them: {t * 1e3:.0f} ms')
    t, _ = best_of(lambda: runs(db).histories(), repeat=3)
    print(f'   runs(db) and every history ({args.runs * args.rows} rows): {t * 1e3:.0f} ms')
    t, _ = best_of(lambda: runs(db).best())
    print(f'   runs(db).best(): {t * 1e3:.0f} ms')
    t, _ = best_of(lambda: runs(db)[:10].plot('valid_loss'), repeat=3)
    print(f'   runs(db)[:10].plot(): {t * 1e3:.0f} ms')


if __name__ == '__main__':
    main()
