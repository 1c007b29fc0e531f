"""The loop's overhead in instructions, counted by valgrind's callgrind: exact and repeatable where timings are noise.

Same setup as bench/overhead.py. Each loop runs in its own process under callgrind twice, with a short and a long
epoch (validation set a fifth of it); the difference divided by the extra steps is the cost per step with
start-up and per-fit costs removed. Progress bars are off here: they refresh by wall time, and under valgrind
every step is ~100x slower, so they would refresh ~100x more often than in real use (bench/overhead.py times
them). For the same reason the Tracker's heartbeat (every 10 s of wall time) is off; bench/track.py times a beat.
Needs valgrind (apt-get install valgrind). Takes a few minutes.

    python bench/instructions.py [--short 20] [--long 120] [--modes hand learner logging train_metrics tracker] [--jobs 2]
    python bench/instructions.py --modes hand learner --layouts 3   # the median of 3 memory layouts
    python bench/instructions.py --modes hand learner --layouts 3 --without-allocators   # less malloc's and free's
    python bench/instructions.py --modes hand_loader learner_loader
    python bench/instructions.py --modes hand_valid learner_valid --short 20 --long 420
    NBTRAINER_TREE=/path/to/other/checkout python bench/instructions.py ...   # that tree's nbtrainer: A/B in one session

The `_valid` modes validate `steps` batches and train none (the hand-written loop's validation, and `learn.validate()`):
a validation batch's own cost, which a fit's step holds a fifth of.

The `_loader` modes read the same batches from a `DataLoader` (collated on the CPU each time), the hand-written loop
moving each to the device as a GPU user's does: the path of a CPU loader feeding a model on a device (here the CPU).
    python bench/instructions.py --modes ddp_hand ddp_learner --short 10 --long 60
    python bench/instructions.py --modes learner dashboard --short 100 --long 700 [--step-ms 10]

The `dashboard` mode attaches the `Dashboard` Jupyter shows by default (its outputs updated as in a kernel, less the
send): it refreshes by wall time, so here it reads a `FakeClock` that moves `--step-ms` a training batch (a fit of
that speed), whatever valgrind's slowdown. Its figure is drawn by the rendering process, which valgrind does not follow
(a process of its own): what is counted is what the training process does, the rendering thread's share included.

The DDP modes run bench/ddp.py's two loops in two ranks (gloo, fork) and count both ranks' instructions: the work each
step costs, which bench/ddp.py's timings cannot resolve to a few percent on a shared machine.

Counts do not depend on the machine's load, so `--jobs` runs that many valgrind processes at once.

"""

import argparse, os, re, shutil, statistics, subprocess, sys, tempfile
from concurrent.futures import ThreadPoolExecutor


def dashboard_fit(learn, step_ms):
    "`learn.fit(1)` with the default Jupyter dashboard, on a fake clock that moves `step_ms` a training batch."
    from nbtrainer import Callback, Dashboard
    from nbtrainer.clock import FakeClock, use_clock

    fake = FakeClock()

    class Ticks(Callback):
        order = -1000

        def after_batch(self):
            if self.learn.training:
                fake.advance(step_ms / 1000)

    class Sink:
        "A display handle that takes updates and sends nothing: a kernel's, less the send."

        def update(self, bundle, raw=False):
            pass

    dashboard = Dashboard()
    dashboard.carry = ([{'status': Sink(), 'figure': Sink()}], [], None)  # shown, as in a notebook
    learn.add_cbs([Ticks(), dashboard])
    with use_clock(fake):
        learn.fit(1)


def child(mode, steps, step_ms, layout=0):
    tree = os.environ.get('NBTRAINER_TREE')  # another checkout's package, ahead of the installed (editable) one
    if tree:
        import importlib.machinery

        sys.path.insert(0, tree)
        sys.meta_path.insert(0, importlib.machinery.PathFinder)
    import torch

    held = [object() for _ in range(layout * 997)]  # noqa: F841 (kept: later objects land at other addresses)
    sys.path.insert(0, os.path.dirname(__file__))
    import overhead as ov
    from nbtrainer import Learner, launch

    torch.set_num_threads(1)
    if mode.startswith('ddp'):  # bench/ddp.py's loops in 2 ranks (gloo): the instructions of both ranks are counted
        import ddp

        return launch(ddp.learner_run if mode == 'ddp_learner' else ddp.hand_written_run, nprocs=2, args=(64, 5, steps))
    if mode.endswith('_valid'):  # validation alone: `steps` batches of it
        train, valid = ov.make_batches(2), ov.make_batches(steps, seed=1)
    else:
        train, valid = ov.make_batches(steps), ov.make_batches(max(1, steps // 5), seed=1)
    if mode.endswith('_loader'):  # a DataLoader that collates each batch on the CPU: what a GPU user's loop reads from
        train, valid = loader(train), loader(valid)
    model = ov.make_model()
    if mode == 'hand_valid':
        ov.hand_written_epoch(model, torch.optim.Adam(model.parameters(), lr=1e-3), [], valid)
        return
    if mode == 'hand':
        ov.hand_written_epoch(model, torch.optim.Adam(model.parameters(), lr=1e-3), train, valid)
        return
    if mode == 'hand_loader':
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        hand_written_loader_epoch(model, opt, train, valid, torch.device('cpu'))
        return
    extra = {'train_metrics': ('accuracy',)} if mode == 'train_metrics' else {}
    learn = Learner(
        model, train, valid, opt_func=torch.optim.Adam, lr=1e-3, metrics=('accuracy',), progress=False, **extra
    )
    if mode == 'dashboard':
        return dashboard_fit(learn, step_ms)
    if mode == 'learner_valid':
        return learn.validate()
    if mode == 'logging':  # CSV, TensorBoard and a checkpoint at the epoch's end
        from nbtrainer import Checkpointer, CSVLogger, TensorBoardLogger

        out = tempfile.mkdtemp()
        learn.add_cbs(
            [CSVLogger(f'{out}/log.csv'), TensorBoardLogger(f'{out}/tb'), Checkpointer(f'{out}/ckpt', keep_best=0)]
        )
    if mode == 'tracker':  # the experiment registry: a run row at the start, a history row per evaluation
        from nbtrainer import Tracker

        tracker = Tracker(f'{tempfile.mkdtemp()}/runs.db')
        tracker.beat_every = 1e9  # its heartbeat thread beats by wall time, like the bars: bench/track.py times a beat
        learn.add_cbs([tracker])
    learn.fit(1)


def loader(batches):
    "The same examples from a `DataLoader` (batch 64, in order, no workers): each batch collated from the dataset."
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    return DataLoader(TensorDataset(x, y), batch_size=len(batches[0][1]))


def hand_written_loader_epoch(model, opt, train_dl, valid_dl, device):
    "bench/overhead.py's hand-written epoch as a GPU user writes it: each batch moved to `device` first."
    import torch
    import torch.nn.functional as F

    model.train()
    for x, y in train_dl:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        total, correct, n = torch.zeros((), device=device), torch.zeros((), dtype=torch.long, device=device), 0
        for x, y in valid_dl:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            pred = model(x)
            total += F.cross_entropy(pred, y) * len(y)
            correct += (pred.argmax(1) == y).sum()
            n += len(y)
        (total / n).item(), (correct / n).item()


ALLOCATORS = re.compile(r'(?:^|/)(?:obmalloc|malloc)\.c:')  # CPython's small-object allocator, glibc's malloc and free


def allocator_share(out_file):
    "Instructions a callgrind output file spends in the memory allocators (functions of `ALLOCATORS`' files)."
    text = subprocess.run(
        ['callgrind_annotate', '--inclusive=no', '--threshold=100', out_file],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = (re.match(r'\s*([\d,]+) \([^)]*\)\s+(\S+)', line) for line in text.splitlines())
    return sum(int(m.group(1).replace(',', '')) for m in rows if m and ALLOCATORS.search(m.group(2)))


def count(mode, steps, step_ms=10, layout=0, without_allocators=False):
    """Instructions executed by a child process running `mode` for `steps` steps (by its ranks, for a DDP mode);
    `without_allocators`: less those spent in malloc and free, whose share moves with the memory layout, not the work."""
    env = dict(
        os.environ, OPENBLAS_NUM_THREADS='1', OMP_NUM_THREADS='1', PYTHONHASHSEED='0'
    )  # idle BLAS threads spin, and set orders vary: noise
    with tempfile.TemporaryDirectory() as tmp:
        # without address randomization (setarch -R) the counts repeat from run to run: hashes of addresses, malloc
        fixed = ['setarch', os.uname().machine, '-R'] if shutil.which('setarch') else []
        run = subprocess.run(
            [
                *fixed,
                'valgrind',
                '--tool=callgrind',
                f'--callgrind-out-file={tmp}/out.%p',
                sys.executable,
                __file__,
                '--child',
                mode,
                str(steps),
                str(step_ms),
                str(layout),
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        found = re.findall(r'==(\d+)== Collected : (\d+)', run.stderr)  # one per process: the forked ranks too
        if run.returncode or not found:
            sys.exit(f'callgrind failed for {mode}:\n{run.stderr[-2000:]}')
        main_pid = re.search(r'==(\d+)==', run.stderr).group(1)  # the first to speak
        counted = [(pid, int(n)) for pid, n in found if (pid == main_pid) != mode.startswith('ddp')]  # DDP: the ranks
        if without_allocators:
            counted = [(pid, n - allocator_share(f'{tmp}/out.{pid}')) for pid, n in counted]
        return sum(n for _, n in counted)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--short', type=int, default=20)
    parser.add_argument('--long', type=int, default=120)
    modes = [
        'hand',
        'learner',
        'logging',
        'train_metrics',
        'tracker',
        'hand_loader',
        'learner_loader',
        'hand_valid',
        'learner_valid',
        'ddp_hand',
        'ddp_learner',
        'dashboard',
    ]
    parser.add_argument('--modes', nargs='+', default=modes[:5], choices=modes)  # DDP, the dashboard: asked for by name
    parser.add_argument('--jobs', type=int, default=1, help='valgrind processes at once')
    parser.add_argument('--step-ms', type=float, default=10, help="the dashboard mode's fake time a training batch")
    parser.add_argument('--layouts', type=int, default=1, help='memory layouts a count is taken in (the median)')
    parser.add_argument('--without-allocators', action='store_true', help="leave out malloc's and free's instructions")
    parser.add_argument('--child', nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]), float(args.child[2]), int(args.child[3]))
    per_step = {}
    with ThreadPoolExecutor(args.jobs) as pool:  # each count is a valgrind process: threads only wait for them
        layouts, lengths = range(args.layouts), (args.short, args.long)
        counts = {
            (mode, n, k): pool.submit(count, mode, n, args.step_ms, k, args.without_allocators)
            for mode in args.modes
            for k in layouts
            for n in lengths
        }
        for mode in args.modes:  # a layout moves a count by ~0.1% (hashes of addresses): the median of the layouts'
            extras = [counts[mode, args.long, k].result() - counts[mode, args.short, k].result() for k in layouts]
            per_step[mode] = statistics.median(extras) / (args.long - args.short)
            if args.layouts > 1:
                spread = ', '.join(f'{e / (args.long - args.short) / 1e6:.3f}' for e in extras)
                print(f'  {mode:<14} layouts: {spread} M', flush=True)
            what = (
                'both ranks'
                if mode.startswith('ddp')
                else 'a batch'
                if mode.endswith('_valid')
                else 'validation included'
            )
            where = ' outside the allocators' if args.without_allocators else ''
            print(f'  {mode:<14} {per_step[mode] / 1e6:8.3f} M instructions{where} per step ({what})', flush=True)
    ratios = (
        ('learner', 'hand', 'learn.fit / hand-written'),
        ('logging', 'hand', 'with CSV + TensorBoard + checkpoint / hand-written'),
        ('train_metrics', 'hand', 'with train_metrics=("accuracy",) / hand-written'),
        ('tracker', 'hand', 'with a Tracker / hand-written'),
        ('tracker', 'learner', 'with a Tracker / learn.fit without it'),
        ('learner_loader', 'hand_loader', 'from a DataLoader: learn.fit / hand-written loop moving each batch'),
        ('learner_valid', 'hand_valid', 'a validation batch: learn.validate / hand-written'),
        ('ddp_learner', 'ddp_hand', 'DDP, 2 ranks: learn.fit / hand-written DDP loop'),
        ('dashboard', 'learner', 'with the Jupyter dashboard / learn.fit without a display'),
    )
    for a, b, name in ratios:
        if a in per_step and b in per_step:
            print(f'  {name}: {per_step[a] / per_step[b]:.4f}x instructions per step')


if __name__ == '__main__':
    main()
