"""What a practitioner brings from elsewhere, each against its reference: a sampler or dataset with `set_epoch`, a torch
or Hugging Face scheduler, several validation sets, images for the loggers."""

import tempfile, warnings

import pytest
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from nbtrainer import Callback, Checkpointer, Learner
from nbtrainer.testing import classification_data, same_history, same_weights, tiny_classifier


class StopAt(Callback):
    "Interrupt the fit after training batch `n` (counted over the fit), after the Checkpointer saved: a kill."

    order = 200

    def __init__(self, n):
        self.n, self.seen = n, 0

    def after_batch(self):
        if self.learn.training:
            self.seen += 1
            if self.seen == self.n:
                raise KeyboardInterrupt()


def killed_and_resumed(make, fit, at):
    "The Learner `make(folder)` gives, fit with `fit(learn, **kw)`, interrupted after batch `at`, then resumed anew."
    folder = Path(tempfile.mkdtemp())
    try:
        fit(make(folder), cbs=[StopAt(at)])
    except KeyboardInterrupt:
        pass
    learn = make(folder)
    fit(learn, resume=True)
    return learn


# ---- set_epoch: called before each epoch in every mode ----
class EpochShuffled(IterableDataset):
    "A stream that reshuffles by its epoch, as Hugging Face's IterableDataset does: without set_epoch, one order."

    def __init__(self, ds):
        self.ds, self.epoch, self.epochs_set = ds, 0, []

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.epochs_set.append(epoch)

    def __iter__(self):
        order = torch.randperm(len(self.ds), generator=torch.Generator().manual_seed(100 + self.epoch))
        return (self.ds[i] for i in order)

    def __len__(self):
        return len(self.ds)


def hand_loop_with_set_epoch(dl, holder, epochs=3):
    "The loop Lightning and accelerate run: set_epoch before each epoch, in one process too."
    model = tiny_classifier(features=8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for epoch in range(epochs):
        holder.set_epoch(epoch)
        for x, y in dl:
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return model


def test_set_epoch_is_called_before_each_epoch_in_one_process_and_resumes_exactly():
    ds = classification_data(96, 8)
    for kind in ('sampler', 'dataset'):

        def loader():
            if kind == 'sampler':
                sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=3)
                return DataLoader(ds, batch_size=16, sampler=sampler), sampler
            stream = EpochShuffled(ds)
            return DataLoader(stream, batch_size=16), stream

        dl, holder = loader()
        reference = hand_loop_with_set_epoch(dl, holder)

        def make(folder=None):
            dl, _ = loader()
            cbs = [Checkpointer(folder, every_steps=1)] if folder else []
            return Learner(tiny_classifier(features=8), dl, lr=1e-2, progress=False, cbs=cbs)

        learn = make()
        learn.fit(3)
        assert same_weights(learn.model, reference), kind
        for at in (3, 6, 10):  # mid-epoch, at an epoch's end, in the last epoch
            resumed = killed_and_resumed(make, lambda learn, **kw: learn.fit(3, **kw), at)
            assert same_weights(resumed.model, reference), (kind, at)
    # a pass that carries over epochs (steps_per_epoch) keeps the epoch it started in, also across a resume
    sampler_epochs = []

    class Recording(DistributedSampler):
        def set_epoch(self, epoch):
            sampler_epochs.append(epoch)
            super().set_epoch(epoch)

    def make(folder=None):
        dl = DataLoader(ds, batch_size=16, sampler=Recording(ds, num_replicas=1, rank=0, shuffle=True, seed=3))
        cbs = [Checkpointer(folder, every_steps=1)] if folder else []
        return Learner(tiny_classifier(features=8), dl, lr=1e-2, progress=False, cbs=cbs)

    straight = make()
    straight.fit(4, steps_per_epoch=4)  # passes of 6 batches: they start in epochs 0, 1 and 3
    assert sampler_epochs == [0, 1, 3]
    for at in (5, 8, 13):
        resumed = killed_and_resumed(make, lambda learn, **kw: learn.fit(4, steps_per_epoch=4, **kw), at)
        assert same_weights(resumed.model, straight.model) and same_history(
            resumed.recorder.history, straight.recorder.history
        ), at


# ---- your own scheduler: TorchScheduler against the loop written by hand ----
def scheduler_data():
    return classification_data(96, 8)


class InfAt(Callback):
    "An inf in a gradient after the backward of these training batches (counted over the fit): fp16 skips the step."

    def __init__(self, batches):
        self.batches, self.seen = set(batches), 0

    def after_backward(self):
        self.seen += 1
        if self.seen in self.batches:
            next(self.learn.model.parameters()).grad[0, 0] = float('inf')


def hand_scheduled(
    make_scheduler, epochs=3, bs=16, lr=1e-2, accumulate=1, groups=None, interval='step', fp16=False, inf_at=()
):
    "AdamW and the scheduler, stepped after each optimizer step (or epoch): the loop most code has. Its lrs, its model."
    from torch.utils.data import DataLoader as DL

    model, ds, seen = tiny_classifier(features=8), scheduler_data(), 0
    params = (
        [{'params': list(model[0].parameters()), 'lr': lr / 10}, {'params': list(model[3].parameters()), 'lr': lr}]
        if groups
        else model.parameters()
    )
    opt = torch.optim.AdamW(params, lr=lr)
    scheduler, lrs = make_scheduler(opt), []
    scaler = torch.amp.GradScaler('cpu') if fp16 else None
    batches = list(DL(ds, batch_size=bs))
    for _ in range(epochs):
        for i in range(0, len(batches), accumulate):
            window = batches[i : i + accumulate]
            n = sum(len(y) for _, y in window)
            for x, y in window:
                lrs.append(opt.param_groups[-1]['lr'])
                with torch.autocast('cpu', dtype=torch.float16, enabled=fp16):
                    loss = F.cross_entropy(model(x), y) * len(y) / n
                (scaler.scale(loss) if fp16 else loss).backward()
                seen += 1
                if seen in inf_at:
                    next(model.parameters()).grad[0, 0] = float('inf')
            if fp16:
                before = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
                stepped = scaler.get_scale() >= before  # HF's check: the scale backs off when the step was skipped
            else:
                opt.step()
                stepped = True
            opt.zero_grad()
            if interval == 'step' and stepped:
                scheduler.step()
        if interval == 'epoch':
            scheduler.step()
    return model, lrs


def scheduled_learner(make_scheduler, folder=None, interval='step', groups=False, more=(), **kwargs):
    from nbtrainer import TorchScheduler

    def splitter(model):
        return [list(model[0].parameters()), list(model[3].parameters())]

    cbs = [TorchScheduler(make_scheduler, interval), *more] + ([Checkpointer(folder, every_steps=1)] if folder else [])
    return Learner(
        tiny_classifier(features=8),
        DataLoader(scheduler_data(), batch_size=16),
        opt_func=torch.optim.AdamW,
        lr=slice(1e-3, 1e-2) if groups else 1e-2,
        splitter=splitter if groups else None,
        progress=False,
        cbs=cbs,
        **kwargs,
    )


def test_torch_and_hugging_face_schedulers_equal_a_hand_loop_also_across_a_kill():
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    cases = {
        'HF cosine with warmup': (lambda opt: get_cosine_schedule_with_warmup(opt, 4, 18), 'step', {}),
        'HF linear warmup, 2 groups': (lambda opt: get_linear_schedule_with_warmup(opt, 3, 18), 'step', {'groups': 1}),
        'OneCycleLR (momentum too)': (
            lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, 0.05, total_steps=18),
            'step',
            {},
        ),
        'StepLR per epoch': (lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.3), 'epoch', {}),
        'cosine, accumulation 2': (
            lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, 9),
            'step',
            {'accumulate': 2},
        ),
    }
    for name, (factory, interval, how) in cases.items():
        accumulate, groups = how.get('accumulate', 1), how.get('groups')
        model, lrs = hand_scheduled(factory, accumulate=accumulate, groups=groups, interval=interval)
        kw = {'accumulate': accumulate} if accumulate > 1 else {}
        learn = scheduled_learner(factory, interval=interval, groups=bool(groups), **kw)
        learn.fit(3)
        assert same_weights(learn.model, model) and learn.recorder.batches['lr'] == lrs, name
        assert [g['lr'] for g in learn.opt.param_groups][-1] == learn.lr  # back at learn.lr after the fit
        for at in (2, 7, 12):  # mid-epoch, at an epoch's end, later: the resumed scheduler and the groups' lrs as saved
            resumed = killed_and_resumed(
                lambda folder: scheduled_learner(factory, folder, interval, bool(groups), **kw),
                lambda learn, **k: learn.fit(3, **k),
                at,
            )
            assert same_weights(resumed.model, model), (name, at)
            assert resumed.recorder.batches['lr'] == lrs, (name, at)


def test_torch_scheduler_skips_fp16_skipped_steps_and_leaves_lr_find_alone():
    factory = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))  # noqa: E731
    model, lrs = hand_scheduled(factory, fp16=True, inf_at=(3, 4, 10))
    learn = scheduled_learner(factory, precision='fp16', more=[InfAt((3, 4, 10))])
    learn.fit(3)
    assert learn.skipped_steps == 3  # the steps a gradient was inf at: the scheduler was not stepped after them
    assert same_weights(learn.model, model) and learn.recorder.batches['lr'] == lrs
    # the LR finder's range test sets its own lrs: the scheduler does nothing during it, and the lr it finds is the base
    made = []
    learn = scheduled_learner(lambda opt: made.append(factory(opt)) or made[-1])
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # a range test this short may find no descent
        learn.lr_find(num_it=30, stop_div=False, show=False)
    assert made == [] and learn.lr == 1e-2  # no scheduler was made for the range test
    learn.lr = 3e-3  # "Use this LR": the next fit's schedule starts from it
    learn.fit(1)
    assert learn.recorder.batches['lr'][0] == 3e-3 and learn.recorder.batches['lr'][1] == 3e-3 / 2


def test_torch_scheduler_state_is_checked_before_a_load():
    import pytest
    from nbtrainer import TorchScheduler

    learn = scheduled_learner(lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1))
    scheduler = learn.cbs[-1]
    assert isinstance(scheduler, TorchScheduler)
    good = {'scheduler': torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1)], lr=1.0), 1).state_dict()}
    scheduler.check_state(good)
    for bad in (
        {'scheduler': {**good['scheduler'], 'optimizer': 1}},  # a load would replace the scheduler's optimizer
        {'scheduler': {**good['scheduler'], 'base_lrs': [1.0, 2.0]}},
        {'scheduler': {**good['scheduler'], 'last_epoch': 'x'}},
        {'scheduler': [1]},
    ):
        with pytest.raises(ValueError):
            scheduler.check_state(bad)


def test_torch_scheduler_composes_with_freeze_and_unfreeze_between_fits():
    "Each fit makes its scheduler anew from learn.lr: a frozen body then all, as a hand loop making one per phase."
    from transformers import get_cosine_schedule_with_warmup

    factory = lambda opt: get_cosine_schedule_with_warmup(opt, 2, 6)  # noqa: E731
    model, ds = tiny_classifier(features=8), scheduler_data()
    opt = torch.optim.AdamW(
        [{'params': list(model[0].parameters()), 'lr': 1e-3}, {'params': list(model[3].parameters()), 'lr': 1e-2}]
    )
    lrs = []
    for frozen in (True, False):
        for p in model[0].parameters():
            p.requires_grad_(not frozen)
        for g in opt.param_groups:
            g['initial_lr'] = g['lr']
        scheduler = factory(opt)
        for x, y in DataLoader(ds, batch_size=16):
            lrs.append(opt.param_groups[-1]['lr'])
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            scheduler.step()
        for g, base in zip(opt.param_groups, (1e-3, 1e-2)):
            g['lr'] = base  # back at the base lrs, as TorchScheduler leaves them after a fit
    learn = scheduled_learner(factory, groups=True)
    learn.freeze()
    learn.fit(1)
    learn.unfreeze()
    learn.fit(1)
    assert same_weights(learn.model, model) and learn.recorder.batches['lr'] == lrs


# ---- several validation sets ----
def test_several_validation_sets_reach_every_logger_and_monitor(tmp_path):
    "valid_dl={'valid': ..., 'test': ...}: the test set's columns equal the set evaluated by hand, in every logger, table"
    "and monitor; eval_subset applies to each set."
    import io

    from sklearn.metrics import accuracy_score
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from nbtrainer import (
        EarlyStopping,
        CSVLogger,
        MLflowLogger,
        ProgressCallback,
        ReduceLROnPlateau,
        TensorBoardLogger,
        Tracker,
    )
    from nbtrainer.data import subset_loader
    from nbtrainer.dashboard import Dashboard
    from nbtrainer.experiments import runs

    train, test = classification_data(96, 8), classification_data(50, 8, seed=7)
    sets = {'valid': DataLoader(train, batch_size=32), 'test': DataLoader(test, batch_size=16)}
    console, dash = io.StringIO(), Dashboard(display='html', plot=False)
    from mlflow.tracking import MlflowClient

    mlflow_uri = f'sqlite:///{tmp_path}/mlflow.db'  # its artifacts (the last checkpoint) in tmp_path, not here
    MlflowClient(mlflow_uri).create_experiment('sets', artifact_location=str(tmp_path / 'mlartifacts'))
    cbs = [
        CSVLogger(tmp_path / 'log.csv'),
        TensorBoardLogger(tmp_path / 'tb', run_name='run'),
        MLflowLogger(tracking_uri=mlflow_uri, experiment='sets'),
        Tracker(tmp_path / 'runs.db', monitor='test_loss'),
        Checkpointer(tmp_path / 'ckpt', monitor='test_accuracy', mode='max'),
        EarlyStopping(monitor='test_loss', patience=20),
        ReduceLROnPlateau(monitor='test_loss', patience=20),
        ProgressCallback(refresh=1e9, file=console),
        dash,
    ]
    learn = Learner(
        tiny_classifier(features=8), DataLoader(train, batch_size=16), sets, metrics='accuracy', progress=False, cbs=cbs
    )
    learn.fit(3, eval_every=3, eval_subset=20)
    rows = learn.recorder.history
    last = rows[-1]

    def by_hand(dl):
        "The loss (a mean over examples) and accuracy of the model on `dl`, with sklearn."
        x = torch.cat([x for x, _ in dl])
        y = torch.cat([y for _, y in dl])
        with torch.no_grad():
            out = learn.model.eval()(x)
        return F.cross_entropy(out, y).item(), accuracy_score(y, out.argmax(1))

    loss, accuracy = by_hand(sets['test'])
    assert abs(last['test_loss'] - loss) < 1e-6 and abs(last['test_accuracy'] - accuracy) < 1e-12
    sub_loss, sub_accuracy = by_hand(subset_loader(sets['test'], 20, learn.eval_seed))
    assert abs(last['subset_test_loss'] - sub_loss) < 1e-6 and last['subset_test_accuracy'] == sub_accuracy
    assert all({'subset_test_loss', 'subset_valid_loss'} <= r.keys() for r in rows)
    assert learn.validate('test') == {'test_loss': last['test_loss'], 'test_accuracy': last['test_accuracy']}
    values = [r['test_loss'] for r in rows if 'test_loss' in r] + [r['subset_test_loss'] for r in rows]

    # every logger carries the test set's columns
    import csv

    logged = [r for r in csv.DictReader(open(tmp_path / 'log.csv')) if r['test_loss']]
    assert float(logged[-1]['test_loss']) == last['test_loss'] and float(logged[-1]['test_accuracy']) == accuracy
    events = EventAccumulator(str(tmp_path / 'tb' / 'run' / 'test'))
    events.Reload()
    assert events.Scalars('loss')[-1].value == pytest.approx(last['test_loss'], rel=1e-6)
    assert events.Scalars('accuracy')[-1].step == last['step']
    client = MlflowClient(mlflow_uri)
    history = client.get_metric_history(cbs[2].run_id, 'test_loss')
    assert history[-1].value == pytest.approx(last['test_loss'], rel=1e-9)
    (run,) = runs(tmp_path / 'runs.db')
    assert run.history[-1]['test_loss'] == last['test_loss'] and run.best['value'] == min(values)
    assert 'test_loss' in console.getvalue() and 'test_accuracy' in console.getvalue()  # the console table
    assert 'test_accuracy' in dash.summary or 'test_accuracy' in str(dash.static)  # the dashboard's table
    # the monitors read the column: Checkpointer's best is the best test accuracy
    best = cbs[4].table()[0]
    from nbtrainer import monitored_value

    assert monitored_value(best, 'test_accuracy') == max(monitored_value(r, 'test_accuracy') for r in rows)


def test_a_study_monitors_a_second_sets_column(tmp_path):
    optuna = pytest.importorskip('optuna')  # noqa: F841
    from nbtrainer.study import Float, Study

    train, test = classification_data(96, 8), classification_data(50, 8, seed=7)

    def build(params):
        sets = {'valid': DataLoader(train, batch_size=32), 'test': DataLoader(test, batch_size=16)}
        return Learner(
            tiny_classifier(features=8), DataLoader(train, batch_size=16), sets, lr=params['lr'], progress=False
        )

    study = Study(
        'sets',
        {'lr': Float(1e-3, 1e-1, log=True)},
        build,
        trials=2,
        fit=dict(epochs=1),
        db=tmp_path / 'runs.db',
        monitor='test_loss',
        pruner=None,
        display=False,
    ).run()
    for run in study.runs():
        assert run.best['value'] == min(r['test_loss'] for r in run.history)


# ---- pictures for the loggers ----
def test_pictures_reach_every_logger_that_keeps_them_and_never_fail_a_fit(tmp_path):
    import numpy as np
    import PIL.Image
    from matplotlib.figure import Figure
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from nbtrainer import CSVLogger, MLflowLogger, TensorBoardLogger, Tracker

    uri = f'sqlite:///{tmp_path}/mlflow.db'
    MlflowClient(uri).create_experiment('pictures', artifact_location=str(tmp_path / 'art'))
    image = np.random.default_rng(0).integers(0, 256, (6, 5, 3), dtype=np.uint8)

    class Pictures(Callback):
        def after_epoch(self):
            self.learn.log_image('sample', torch.from_numpy(image).permute(2, 0, 1))  # C×H×W, as torch has it
            fig = Figure(figsize=(1, 1))
            fig.add_subplot().plot([1, 2])
            self.learn.log_figure('curve', fig)

    class Broken(Callback):
        def log_image(self, tag, array, step):
            raise OSError('disk full')

    tracker, mlflow = Tracker(tmp_path / 'runs.db'), MLflowLogger(uri, 'pictures')
    cbs = [TensorBoardLogger(tmp_path / 'tb', run_name='run'), CSVLogger(tmp_path / 'log.csv'), tracker, mlflow]
    learn = Learner(tiny_classifier(features=8), DataLoader(scheduler_data(), batch_size=16), progress=False)
    learn.add_cbs([*cbs, Broken(), Pictures()])
    with pytest.warns(UserWarning, match='Broken could not log the picture .sample.: OSError: disk full'):
        learn.fit(2)
    assert learn.fit_outcome == 'finished'
    steps = [6, 12]
    events = EventAccumulator(str(tmp_path / 'tb' / 'run' / 'train'), size_guidance={'images': 0})
    events.Reload()
    assert [e.step for e in events.Images('sample')] == [e.step for e in events.Images('curve')] == steps
    saved = np.asarray(PIL.Image.open(tmp_path / 'log-images' / 'sample-12.png'))
    assert np.array_equal(saved, image)  # the picture, pixel for pixel
    assert (tmp_path / 'log-images' / 'curve-6.png').exists()
    assert np.array_equal(np.asarray(PIL.Image.open(tmp_path / 'runs-images' / tracker.uid / 'sample-6.png')), image)
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(mlflow.run_id, 'images')}
    assert artifacts == {f'images/{t}-{s}.png' for t in ('sample', 'curve') for s in steps}
    # a bad image is one clear error before any logger writes; with no logger, nothing at all is done
    before = sorted(p.name for p in (tmp_path / 'log-images').iterdir())
    for bad, words in (
        (np.zeros((5, 5, 2)), 'H×W, H×W×C or C×H×W'),
        (np.full((4, 4), 2.0), 'values in [0, 1]'),
        (np.full((4, 4), 300), 'values in 0..255'),
    ):
        with pytest.raises(ValueError, match=words.replace('[', r'\[').replace(']', r'\]')):
            learn.log_image('bad', bad)
    with pytest.raises(TypeError, match='log_figure takes a matplotlib figure'):
        learn.log_figure('bad', image)
    assert sorted(p.name for p in (tmp_path / 'log-images').iterdir()) == before
    bare = Learner(tiny_classifier(features=8), DataLoader(scheduler_data(), batch_size=16), progress=False)
    bare.log_image('anything', object())  # no logger attached: not even looked at


# ---- logs a cluster can read ----
FIT_SCRIPT = '''
import sys, torch
from torch.utils.data import DataLoader
from nbtrainer import Learner, EMA
from nbtrainer.testing import classification_data, tiny_classifier
ds = classification_data(96, 8)
kwargs = {'progress': sys.argv[1]} if sys.argv[1] == 'log' else {}
learn = Learner(tiny_classifier(features=8), DataLoader(ds, batch_size=16), DataLoader(ds, batch_size=32),
                metrics=('accuracy', 'f1'), train_metrics=('accuracy',), cbs=[EMA()], **kwargs)
learn.fit(3)
'''


def test_a_fit_logged_to_a_file_has_no_control_characters(tmp_path):
    "stdout and stderr in one file (> log 2>&1, nohup, SLURM): a line at the start, a row per evaluation, a line at the end."
    import subprocess, sys

    for progress in ('default', 'log'):
        log = tmp_path / f'{progress}.log'
        with open(log, 'w') as out:
            done = subprocess.run(
                [sys.executable, '-c', FIT_SCRIPT, progress], stdout=out, stderr=subprocess.STDOUT, timeout=300
            )
        text = log.read_text()
        assert done.returncode == 0, text
        assert not any(c in text for c in '\r\x1b\b'), repr(text[:500])
        lines = text.splitlines()
        assert lines[0].startswith('Fit started: 3 epochs, 18 steps from step 0') and len(lines) == 5, lines
        assert all(line.startswith('epoch=') and ' ema_valid_loss=' in line for line in lines[1:4])
        assert lines[-1].startswith('Fit finished at step 18 of 18 (epoch 3,')


def test_the_console_table_wraps_between_columns_at_the_terminals_width(tmp_path):
    "In a terminal of 60 columns the bars stay, and each table line fits: a column is never cut."
    import fcntl, os, pty, re, struct, subprocess, sys, termios

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 60, 0, 0))  # a terminal of 24 rows, 60 columns
    proc = subprocess.Popen(
        [sys.executable, '-c', FIT_SCRIPT, 'default'],
        stdin=child,
        stdout=child,
        stderr=child,
        env={k: v for k, v in os.environ.items() if k not in ('COLUMNS', 'LINES')},
        close_fds=True,
    )
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=300) == 0
    os.close(main)
    text = b''.join(chunks).decode()
    assert '\r' in text and 'epoch:' in text  # the bars, in a terminal
    plain = [re.sub(r'\x1b\[[0-9;]*[A-Za-z]', '', line.rstrip('\r').split('\r')[-1]) for line in text.split('\n')]
    table = [line for line in plain if re.fullmatch(r'[ \w.+-]+', line.strip() or '?') and line.strip()]
    assert any('ema_valid_loss' in line for line in table) and all(len(line) <= 60 for line in table), table
