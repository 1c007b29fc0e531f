"""Distributed data-parallel training on 2 CPU processes (gloo), checked against one process and hand-written references.

Each test starts its workers with `nbtrainer.launcher.launch` (fork), except the kill test, which runs the worker
script the way torchrun would (environment variables) so that no watchdog helps the surviving rank.
"""

import gc, math, os, signal, subprocess, sys, time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from conftest import ROOT, kernel_manager
from nbtrainer import Callback, ConfusionMatrix, Learner, NonFiniteLossError, launch, rank, request_stop, world_size
from nbtrainer.callback import dispatch_tables
from nbtrainer.data import plain_model
from nbtrainer.launcher import _agent_env, _agent_store
from nbtrainer.testing import wait_for

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not dist.is_available() or sys.platform != 'linux', reason='needs torch.distributed and fork'),
]

B, SEED = 4, 5  # per-rank batch size; the loader's shuffle seed


def dataset(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


def make_model(bn=False):
    torch.manual_seed(1)
    if bn:
        return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def loader(ds, shuffle=True):
    return DataLoader(
        ds, batch_size=B, shuffle=shuffle, generator=torch.Generator().manual_seed(SEED) if shuffle else None
    )


def gather(obj):
    "Every rank's `obj`, in rank order."
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


# ---- the same weights as one process on the global batch ----


def train_ddp(opt_func, n, accumulate, epochs):
    learn = Learner(
        make_model(), loader(dataset(n)), opt_func=opt_func, lr=0.05, metrics=(), accumulate=accumulate, progress=False
    )
    learn.fit(epochs)
    return {k: v.clone() for k, v in learn.model.module.state_dict().items()}, learn.step


def global_batches(n, epochs, world=2):
    "One process's batches of 2B: each is rank 0's batch i and rank 1's batch i, in DistributedSampler's order, padding left out."
    ds, batches = dataset(n), []
    for epoch in range(epochs):
        shards = []
        for r in range(world):
            sampler = DistributedSampler(ds, num_replicas=world, rank=r, shuffle=True, seed=SEED)
            sampler.set_epoch(epoch)
            shards.append([i for j, i in enumerate(sampler) if r + j * world < n])  # position >= n: a repeat
        per_rank = math.ceil(n / world)
        batches.append([sum((s[b : b + B] for s in shards), []) for b in range(0, per_rank, B)])
    return ds, batches


def hand_written(opt_func, n, accumulate, epochs, keep=None):
    "A plain loop: windows of `accumulate` global batches, the summed loss divided by the window's example count."
    ds, epochs_batches = global_batches(n, epochs)
    model = make_model()
    opt = opt_func(model.parameters(), lr=0.05)
    steps = 0
    for batches in epochs_batches:
        if keep is not None:
            batches = [[i for i in b if keep(i)] for b in batches]  # weight-0 rows left out
        for w in range(0, len(batches), accumulate):
            window = batches[w : w + accumulate]
            count = sum(len(b) for b in window)
            for b in window:
                x, y = ds[b]
                (F.cross_entropy(model(x), y, reduction='sum') / count).backward()
            opt.step()
            opt.zero_grad()
            steps += 1
    return model.state_dict(), steps


@pytest.mark.parametrize(
    'opt_func, n, accumulate',
    [
        (torch.optim.SGD, 48, 1),  # even: 6 global batches of 8
        (torch.optim.Adam, 48, 1),
        (torch.optim.SGD, 45, 1),  # uneven: rank 1 repeats an example; last global batch 5 (3 + 2, one a repeat)
        (torch.optim.Adam, 45, 1),
        (torch.optim.SGD, 45, 2),  # accumulation over an uneven epoch end
        (torch.optim.Adam, 46, 3),
    ],
)
def test_two_ranks_equal_one_process_with_the_global_batch(opt_func, n, accumulate):
    weights, steps = launch(train_ddp, nprocs=2, args=(opt_func, n, accumulate, 2))
    ref, ref_steps = hand_written(opt_func, n, accumulate, 2)
    assert steps == ref_steps
    assert max((weights[k] - ref[k]).abs().max().item() for k in ref) < 1e-6


class DictData(torch.utils.data.Dataset):
    "Dict examples; every 7th has weight 0 (padding the user added), which must count nowhere."

    def __init__(self, n):
        self.x, self.y = dataset(n).tensors

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {'x': self.x[i], 'y': self.y[i], 'weight': torch.tensor(float(i % 7 != 3))}


class Keyword(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = make_model()

    def forward(self, x):
        return self.net(x)


def train_weighted(n, accumulate):
    learn = Learner(
        Keyword(),
        loader(DictData(n)),
        opt_func=torch.optim.Adam,
        lr=0.05,
        metrics=(),
        accumulate=accumulate,
        progress=False,
    )
    learn.fit(2)
    return {k: v.clone() for k, v in learn.model.module.net.state_dict().items()}


@pytest.mark.parametrize('n, accumulate', [(45, 1), (46, 2)])
def test_weighted_batches_equal_one_process_without_the_zero_weight_rows(n, accumulate):
    "The global count comes from an all-reduce here (the sampler cannot know the weights)."
    weights = launch(train_weighted, nprocs=2, args=(n, accumulate))
    ref, _ = hand_written(torch.optim.Adam, n, accumulate, 2, keep=lambda i: i % 7 != 3)
    assert max((weights[k] - ref[k]).abs().max().item() for k in ref) < 1e-6


class CountSyncs(Callback):
    "Records, per training batch, whether DDP was going to all-reduce this batch's gradients."

    order = 1  # after DistributedTrainer set it in before_batch

    def __init__(self):
        self.syncs = []

    def before_batch(self):
        if self.learn.training:
            self.syncs.append(self.learn.model.require_backward_grad_sync)


def train_counting_syncs():
    counter = CountSyncs()
    learn = Learner(
        make_model(),
        loader(dataset(40)),
        opt_func=torch.optim.SGD,
        metrics=(),
        accumulate=2,
        progress=False,
        cbs=[counter],
    )
    learn.fit(1)
    return counter.syncs


def test_accumulation_skips_the_all_reduce_on_non_final_micro_batches():
    # 20 examples per rank: batches 4,4,4,4,4 -> windows (2, 2, 1): syncs on the 2nd, 4th and 5th
    assert launch(train_counting_syncs, nprocs=2) == [False, True, False, True, True]


# ---- metrics over all ranks ----


def validate_ddp(n):
    x, y = dataset(n, seed=3).tensors
    valid = DataLoader(TensorDataset(x, y), batch_size=5)
    learn = Learner(
        make_model(), loader(dataset(16)), valid, metrics=('accuracy', 'f1', 'mcc', ConfusionMatrix()), progress=False
    )
    with torch.no_grad():
        preds = learn.model.module(x)
    return learn.validate(), preds


@pytest.mark.parametrize('n', [30, 31])  # 31: the sampler repeats one example, which must count nowhere
def test_metrics_on_two_ranks_equal_one_process(n):
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, matthews_corrcoef

    values, preds = launch(validate_ddp, nprocs=2, args=(n,))
    _, y = dataset(n, seed=3).tensors
    labels = preds.argmax(1)
    assert values['confusion_matrix'].sum() == n
    assert values['confusion_matrix'].tolist() == confusion_matrix(y, labels, labels=[0, 1, 2]).tolist()
    assert values['accuracy'] == pytest.approx(accuracy_score(y, labels), abs=1e-12)
    assert values['f1_macro'] == pytest.approx(f1_score(y, labels, average='macro'), abs=1e-12)
    assert values['mcc'] == pytest.approx(matthews_corrcoef(y, labels), abs=1e-12)
    assert values['valid_loss'] == pytest.approx(F.cross_entropy(preds, y).item(), abs=1e-6)


def validate_list():
    x, y = dataset(30, seed=3).tensors
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 30, 8)]  # not a DataLoader: each rank evaluates all of it
    learn = Learner(make_model(), loader(dataset(16)), batches, metrics=(ConfusionMatrix(),), progress=False)
    return learn.validate()['confusion_matrix']


def test_an_evaluation_iterable_that_is_not_a_loader_is_not_summed_twice():
    assert launch(validate_list, nprocs=2).sum() == 30


def model_state_dict():
    learn = Learner(make_model(), loader(dataset(16)), progress=False)
    learn.fit(1)
    return {'weights': learn.model.state_dict(), 'wrapped': type(learn.model).__name__}


def test_launch_returns_a_ddp_models_state_dict_as_the_plain_models():
    "The docs say: return a state_dict. learn.model is DDP's wrapper, whose keys start with module.: they come back plain."
    result = launch(model_state_dict, nprocs=2)
    assert result['wrapped'] == 'DistributedDataParallel'
    assert list(result['weights']) == list(make_model().state_dict())
    make_model().load_state_dict(result['weights'])


def two_sets():
    "Two validation sets, of 31 examples (a rank gets a repeated one, weighted 0) and 30."
    return {
        'valid': DataLoader(dataset(31, seed=3), batch_size=5),
        'test': DataLoader(dataset(30, seed=4), batch_size=4),
    }


def fit_two_sets():
    learn = Learner(make_model(), loader(dataset(16)), two_sets(), metrics=('accuracy', 'f1'), progress=False)
    learn.fit(2, eval_subset=12)
    rows = [{k: v for k, v in r.items() if k != 'time'} for r in learn.recorder.history]
    return rows, learn.validate(), plain_model(learn.model).state_dict()


def test_several_validation_sets_are_each_gathered_over_the_ranks():
    "Each set is sharded over the ranks and its metrics summed: every set's values equal one process's with the weights."
    rows, values, weights = launch(fit_two_sets, nprocs=2)
    model = make_model()
    model.load_state_dict(weights)
    one = Learner(model, loader(dataset(16)), two_sets(), metrics=('accuracy', 'f1'), progress=False).validate()
    assert (
        values.keys()
        == one.keys()
        == {'valid_loss', 'accuracy', 'f1_macro', 'test_loss', 'test_accuracy', 'test_f1_macro'}
    )
    assert all(abs(values[k] - one[k]) < 1e-6 for k in one), (values, one)
    assert {'subset_test_loss', 'subset_test_accuracy'} <= rows[0].keys() and {'test_loss', 'valid_loss'} <= rows[
        -1
    ].keys()
    assert all(abs(rows[-1][k] - one[k]) < 1e-6 for k in one)  # the fit's last evaluation: the whole sets, gathered


def fit_history(world, train_metrics=('accuracy',), cbs=(), epochs=3):
    "Rows of a fit of 2 ranks with batch B each, or of one process with batch 2B: the same global batches."
    valid = DataLoader(dataset(31, seed=3), batch_size=5)
    train = DataLoader(
        dataset(45), batch_size=B * 2 // world
    )  # in order: global batch i is the same examples either way
    learn = Learner(
        make_model(),
        train,
        valid,
        opt_func=torch.optim.Adam,
        lr=0.05,
        train_metrics=train_metrics,
        metrics=('accuracy', balanced_accuracy),
        progress=False,
        cbs=list(cbs),
    )
    learn.fit(epochs)
    return [{k: v for k, v in r.items() if k != 'time'} for r in learn.recorder.history], learn.step


def balanced_accuracy(preds, targets):
    from sklearn.metrics import balanced_accuracy_score

    return balanced_accuracy_score(targets, preds.argmax(1))


def ddp_history(*args):
    rows, step = fit_history(2, *args)
    return gather((rows, step))


def test_training_rows_are_global_and_function_metrics_see_every_rank():
    "train_loss, training metrics and a function metric on 2 ranks equal one process on the global batch."
    (rows0, step0), (rows1, step1) = launch(ddp_history, nprocs=2)
    one, one_step = fit_history(1)
    assert rows0 == rows1 and step0 == step1 == one_step  # every rank holds the same, global rows
    for a, b in zip(rows0, one):
        assert a.keys() == b.keys() and {'train_loss', 'train_accuracy', 'balanced_accuracy'} <= a.keys()
        assert all(abs(a[k] - b[k]) < 1e-6 for k in a if isinstance(a[k], float)), (a, b)


def early_stopped(world):
    from nbtrainer import EarlyStopping

    rows, step = fit_history(world, (), [EarlyStopping(monitor='valid_loss', patience=1)], epochs=30)
    return gather(step) if world > 1 else step


def test_early_stopping_stops_every_rank_where_one_process_stops():
    steps = launch(early_stopped, nprocs=2, args=(2,))
    assert steps[0] == steps[1] == early_stopped(1) < 30 * 6


# ---- checkpoints ----


def train_bn_and_save(path):
    learn = Learner(make_model(bn=True), loader(dataset(40)), metrics=(), progress=False)
    learn.fit(1)
    model = learn.model.module
    model.train()
    with torch.no_grad():
        model(dataset(8, seed=10 + rank()).tensors[0])  # each rank's BatchNorm statistics drift apart
    stats = gather(model[1].running_mean.clone())
    learn.save(path)  # every rank calls it; rank 0 writes
    model.eval()
    with torch.no_grad():
        preds = learn.model(dataset(20, seed=7).tensors[0])
    return stats, preds, model[1].running_mean.clone()


def test_checkpoint_under_ddp_loads_into_a_bare_model(tmp_path):
    path = tmp_path / 'ddp.pt'
    stats, preds, synced = launch(train_bn_and_save, nprocs=2, args=(path,))
    assert not torch.allclose(stats[0], stats[1])
    state = torch.load(path, weights_only=True)['model']
    assert torch.allclose(state['1.running_mean'], (stats[0] + stats[1]) / 2, atol=1e-6)  # averaged over the ranks
    assert torch.equal(state['1.running_mean'], synced)
    bare = make_model(bn=True)
    bare.load_state_dict(state)  # plain keys: no DDP 'module.' prefix
    bare.eval()
    with torch.no_grad():
        assert torch.equal(bare(dataset(20, seed=7).tensors[0]), preds)


def train_ghost_bn(path):
    "GhostBatchNorm keeps running statistics like BatchNorm: they must be averaged over the ranks the same way."
    from nbtrainer import GhostBatchNorm

    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 16), GhostBatchNorm(16, virtual_batch_size=2), nn.ReLU(), nn.Linear(16, 3))
    learn = Learner(model, loader(dataset(40)), metrics=(), progress=False)
    learn.fit(1)
    ghost = learn.model.module[1]
    ghost.train()
    with torch.no_grad():
        learn.model.module(dataset(8, seed=10 + rank()).tensors[0])  # each rank's statistics drift apart
    stats = gather(ghost.running_mean.clone())
    learn.save(path)  # averages them first
    return stats, ghost.running_mean.clone(), learn.validate()['valid_loss'] if learn.valid_dl else None


def test_ghost_batchnorm_statistics_are_averaged_over_the_ranks(tmp_path):
    stats, synced, _ = launch(train_ghost_bn, nprocs=2, args=(tmp_path / 'ghost.pt',))
    assert not torch.allclose(stats[0], stats[1])
    saved = torch.load(tmp_path / 'ghost.pt', weights_only=True)['model']['1.running_mean']
    assert torch.allclose(saved, (stats[0] + stats[1]) / 2, atol=1e-6) and torch.equal(saved, synced)


# ---- only rank 0 writes ----


def train_with_writers(folder, strategy='auto'):
    from nbtrainer import Checkpointer, CSVLogger, LivePlot, SavePredictions, TensorBoardLogger, Tracker

    mine = folder / f'rank{rank()}'  # each rank's writers point at its own folder: only rank 0's may appear

    def learner():
        cbs = [
            CSVLogger(mine / 'log.csv'),
            TensorBoardLogger(mine / 'tb', run_name='run'),
            Checkpointer(folder / 'ckpt', keep_last=1),
            LivePlot(path=mine / 'live.png'),
            SavePredictions([0, 1], path=mine / 'preds.pt'),
            Tracker(mine / 'runs.db'),
        ]
        return Learner(
            make_model(), loader(dataset(40)), DataLoader(dataset(21, seed=3), batch_size=8), cbs=cbs, strategy=strategy
        )

    learner().fit(2)
    learn = learner()
    learn.fit(3, resume=True)  # every rank reads rank 0's last checkpoint and trains the third epoch
    listening = sorted(type(cb).__name__ for cb, _ in dispatch_tables(learn.cbs, learn.main_process)[True]['after_fit'])
    return gather((listening, learn.step, learn.recorder.history[-1]['accuracy']))


@pytest.mark.parametrize('strategy', ['ddp', 'fsdp'])
def test_only_rank_0_writes_files(tmp_path, strategy):
    per_rank = launch(train_with_writers, nprocs=2, args=(tmp_path, strategy))
    assert sorted(p.name for p in tmp_path.iterdir()) == ['ckpt', 'rank0']  # nothing from rank 1's writers
    written = {p.relative_to(tmp_path / 'rank0').parts[0] for p in (tmp_path / 'rank0').rglob('*') if p.is_file()}
    assert written == {'log.csv', 'tb', 'live.png', 'preds.pt', 'runs.db'}
    kept = sorted(p.name for p in (tmp_path / 'ckpt').iterdir())
    assert 'epoch-2.pt' in kept and not [
        n for n in kept if n.startswith('.') and n != '.lock'
    ]  # rank 0's checkpoints, no leftovers
    (cbs0, step0, acc0), (cbs1, step1, acc1) = per_rank
    assert step0 == step1 == 15 and acc0 == acc1  # the same decisions and the same global metrics
    writers = {'CSVLogger', 'LivePlot', 'ProgressLog', 'TensorBoardLogger', 'Tracker'}  # a worker's output: a pipe
    assert writers <= set(cbs0) and not writers & set(cbs1)
    assert all((tmp_path / 'ckpt' / k).is_dir() == (strategy == 'fsdp') for k in kept if k.endswith('.pt'))


# ---- stopping every rank together ----


class StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def after_step(self):
        if rank() == 0 and self.learn.step == self.step:
            request_stop(self.learn)  # e.g. a dashboard's Stop button


def train_until_stopped():
    learn = Learner(make_model(), loader(dataset(200)), metrics=(), progress=False, cbs=[StopAt(5)])
    learn.fit(3)
    return gather(learn.step)


def test_a_stop_on_rank_0_ends_every_rank_at_the_same_batch():
    assert launch(train_until_stopped, nprocs=2) == [16, 16]  # requested at step 5, seen at the next check (every 16)


def preempted_on_rank_1():
    from nbtrainer import Preemption

    class SignalOnRank1(Callback):  # what the OS does when only rank 1's machine is being taken back
        def after_step(self):
            if rank() == 1 and self.learn.step == 5:
                next(cb for cb in self.learn.cbs if isinstance(cb, Preemption))._handle(signal.SIGUSR1, None)

    learn = Learner(
        make_model(),
        loader(dataset(200)),
        metrics=(),
        progress=False,
        preemption=False,
        cbs=[Preemption(exit=False), SignalOnRank1()],
    )
    learn.fit(3)
    return gather((learn.fit_outcome, learn.step, str(learn.fit_exception)))


def test_a_signal_on_one_rank_preempts_every_rank_at_the_same_step():
    assert launch(preempted_on_rank_1, nprocs=2) == [
        ('preempted', 16, 'preempted by SIGUSR1 on another rank at step 16'),  # carried by the check every 16 batches
        ('preempted', 16, 'preempted by SIGUSR1 at step 16'),
    ]


def all_reduces_per_fit(preemption):
    calls, real = [], dist.all_reduce
    dist.all_reduce = lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs)
    Learner(make_model(), loader(dataset(200)), metrics=(), progress=False, preemption=preemption).fit(2)
    dist.all_reduce = real
    return gather(len(calls))


def test_preemption_adds_no_collective_of_its_own():
    with_it, without = (
        launch(all_reduces_per_fit, nprocs=2, args=(True,)),
        launch(all_reduces_per_fit, nprocs=2, args=(False,)),
    )
    assert with_it == without and with_it[0] > 0  # its signal rides on the strategy's periodic check


def train_into_nan():
    x, y = dataset(200).tensors
    if rank() == 1:
        x[60:] = float('nan')  # only rank 1's data goes bad, late in its shard
    learn = Learner(make_model(), DataLoader(TensorDataset(x, y), batch_size=B), metrics=(), progress=rank() == 0)
    try:
        learn.fit(2)
        outcome = 'finished'
    except NonFiniteLossError as e:
        outcome = type(e).__name__
    return gather((outcome, learn.step))


def test_a_nan_on_one_rank_stops_every_rank_cleanly():
    (a, step0), (b, step1) = launch(train_into_nan, nprocs=2)
    # the Recorder reads the losses at the end of the epoch (or every 256 batches, or when rank 0's bar refreshes);
    # then every rank stops at the same batch, instead of training on into the second epoch
    assert a == b == 'NonFiniteLossError' and step0 == step1 <= 25


def train_skipping_nan():
    x, y = dataset(64).tensors
    if rank() == 1:
        x[9] = float('nan')  # rank 1's 3rd batch
    learn = Learner(
        make_model(),
        DataLoader(TensorDataset(x, y), batch_size=B),
        opt_func=torch.optim.SGD,
        metrics=(),
        progress=False,
        skip_nonfinite=True,
    )
    learn.fit(2)
    skipped = [cb.skipped for cb in learn.cbs if hasattr(cb, 'skipped')]
    return gather((learn.step, skipped, torch.isfinite(learn.model.module[0].weight).all().item()))


def test_skip_nonfinite_skips_the_batch_on_every_rank():
    # a rank that skipped alone would leave the other waiting in the all-reduce
    assert launch(train_skipping_nan, nprocs=2, timeout=60) == [(14, [2], True)] * 2  # 8 batches per epoch, one skipped


# ---- seeds ----


def seeds(_):
    torch.manual_seed(0)
    model = make_model()
    init = torch.cat([p.detach().flatten() for p in model.parameters()])
    ds = TensorDataset(torch.arange(8.0))
    workers = DataLoader(ds, batch_size=4, num_workers=1, worker_init_fn=None)
    Learner(model, workers, metrics=(), progress=False)
    augmentation = torch.rand(3)
    worker_seed = next(iter(DataLoader(WorkerSeed(), batch_size=1, num_workers=1)))
    return gather((init, augmentation, worker_seed))


class WorkerSeed(torch.utils.data.Dataset):
    def __len__(self):
        return 1

    def __getitem__(self, i):
        return torch.utils.data.get_worker_info().seed


def test_seed_policy_same_model_init_distinct_augmentation_and_workers():
    (init0, aug0, w0), (init1, aug1, w1) = launch(seeds, nprocs=2, args=(None,))
    assert torch.equal(init0, init1)  # the same seed for model initialisation
    assert not torch.equal(aug0, aug1)  # rank-distinct streams for augmentation
    assert not torch.equal(w0, w1)  # and for loader workers
    (again0, aug0b, _), _ = launch(seeds, nprocs=2, args=(None,))
    assert torch.equal(aug0, aug0b)  # reproducible


# ---- failures ----


def killed_mid_fit():
    class Die(Callback):
        def after_batch(self):
            if rank() == 1 and self.learn.iter == 3:
                os.kill(os.getpid(), signal.SIGKILL)

    learn = Learner(make_model(), loader(dataset(4000)), metrics=(), progress=False, cbs=[Die()])
    learn.fit(100)


@pytest.mark.timeout(300)  # a deadline far above the few seconds it takes, far below the collective timeout
def test_launch_stops_the_survivors_when_a_rank_dies():
    "A survivor left waiting in a collective would wait an hour: this test's time limit fails it, with its stack."
    with pytest.raises(RuntimeError, match='rank 1 exited with code -9'):
        launch(killed_mid_fit, nprocs=2, timeout=3600)


def test_a_killed_rank_makes_the_other_fail_within_the_timeout(tmp_path):
    "No launch() watchdog here: the survivor itself must notice, as under torchrun."
    store = _agent_store(2)  # kept bound while the ranks run
    env = {
        **os.environ,
        **_agent_env(store.port),
        'WORLD_SIZE': '2',
        'NBTRAINER_DIST_TIMEOUT': '60',
        'OMP_NUM_THREADS': '1',
    }
    worker = [sys.executable, str(ROOT / 'tests' / 'ddp_worker.py'), str(tmp_path)]
    procs = [
        subprocess.Popen(worker, env={**env, 'RANK': str(r), 'LOCAL_RANK': str(r)}, stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    try:

        def rank_1_training():  # a 100-epoch fit: neither rank ends before it is killed
            for r, p in enumerate(procs):
                assert p.poll() is None, f'rank {r} ended with code {p.returncode} before rank 1 started training'
            return (tmp_path / 'started-1').exists()

        wait_for(rank_1_training, 'rank 1 to start training', timeout=300)
        procs[1].send_signal(signal.SIGKILL)
        try:  # the timeout is 60 s, and a closed socket is usually noticed at once: a deadline far above, for a hang
            code = procs[0].wait(timeout=300)
        except subprocess.TimeoutExpired:
            raise AssertionError('rank 0 still ran 300 s after its peer was killed (its timeout is 60 s)') from None
        assert code != 0, f'rank 0 ended with code {code} after its peer was killed'
        assert 'Error' in procs[0].stderr.read()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.parametrize('ending, alive_at_exit', [('normal', False), ('error', True)])
def test_a_script_leaves_its_group_at_exit_unless_it_failed(ending, alive_at_exit):
    "gloo threads alive during interpreter teardown abort a finished rank now and then (SIGABRT, 1 run in ~20 under torchrun)."
    script = (
        'import atexit, sys, torch.distributed as dist\n'
        'atexit.register(lambda: print("group alive at exit:", dist.is_initialized(), flush=True))  # runs last\n'
        'from nbtrainer import init_distributed\n'
        'init_distributed()\n'
        'if sys.argv[1] == "error": raise RuntimeError("a rank failed")\n'
    )
    store = _agent_store(1)
    env = {**os.environ, **_agent_env(store.port), 'WORLD_SIZE': '1', 'RANK': '0'}
    done = subprocess.run([sys.executable, '-c', script, ending], env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode != 0) == (ending == 'error')
    assert (
        f'group alive at exit: {alive_at_exit}' in done.stdout
    )  # after an error, other ranks may wait in a collective


# ---- launch() from a notebook ----


def test_launch_from_a_notebook_run_by_nbclient(tmp_path, monkeypatch):
    monkeypatch.setenv(
        'PYTHONPATH', os.pathsep.join([str(ROOT), *filter(None, [os.environ.get('PYTHONPATH')])])
    )  # the kernel imports this checkout
    import nbformat
    from nbclient import NotebookClient

    cells = [
        'import torch\nfrom nbtrainer.distributed import rank, world_size\nfrom nbtrainer.launcher import launch',
        # defined in the notebook's __main__: fork makes it available to the workers
        'def train(n):\n    print(f"rank {rank()} of {world_size()} says hello")\n    return rank() * 10 + n',
        'result = launch(train, nprocs=2, args=(7,))\nassert result == 7\nprint("result", result)',
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'python3', 'language': 'python'}
    NotebookClient(nb, timeout=180, km=kernel_manager(), resources={'metadata': {'path': str(tmp_path)}}).execute()
    text = ''.join(o.get('text', '') for o in nb.cells[2].outputs if o.output_type == 'stream')
    assert 'rank 0 of 2 says hello' in text and 'result 7' in text
    assert 'rank 1' not in text  # only rank 0's output is streamed into the cell


def sync_bn_on_cpu():
    try:
        Learner(make_model(bn=True), loader(dataset(8)), progress=False, sync_bn=True)
    except ValueError as e:
        return str(e)


def test_sync_bn_on_the_cpu_says_it_needs_gpus():
    assert 'needs GPUs' in launch(sync_bn_on_cpu, nprocs=2)


def test_launch_with_spawn_sends_the_function_by_value():
    pytest.importorskip('cloudpickle')
    local = lambda n: (rank(), world_size(), n)  # not importable by a spawned child: cloudpickle sends it by value
    assert launch(local, nprocs=2, args=(5,), start_method='spawn') == (0, 2, 5)


def _collect_garbage():
    gc.collect()
    return 'collected'


@pytest.mark.timeout(120)
def test_a_forked_rank_never_frees_a_store_it_inherited():
    """A TCPStore left in a reference cycle (a traceback that holds a frame, say) is freed before launch() forks: a rank
    that freed its copy would wait forever for the store's thread, which the fork did not copy. Without the fix the rank
    hangs in `gc.collect()` and pytest's timeout fails the test."""
    gc.disable()  # else the automatic collector may free the cycle first, by chance
    try:
        cycle = [_agent_store(1)]
        cycle.append(cycle)
        del cycle
        assert launch(_collect_garbage, nprocs=2) == 'collected'
    finally:
        gc.enable()


def test_package_level_launch_and_light_import():
    import nbtrainer

    assert nbtrainer.launch is launch
    script = (
        'import sys, torch; before = set(sys.modules); import nbtrainer.distributed; '
        'print(" ".join(set(sys.modules) - before))'
    )
    loaded = set(subprocess.check_output([sys.executable, '-c', script], text=True, timeout=300).split())
    assert not [m for m in ('matplotlib', 'ipywidgets', 'tqdm.auto', 'tensorboard', 'IPython') if m in loaded]


def test_the_same_script_under_torchrun_and_plain_python(tmp_path):
    worker = [str(ROOT / 'tests' / 'ddp_worker.py'), '--short']
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    subprocess.run([sys.executable, *worker[:1], str(tmp_path / 'one'), *worker[1:]], check=True, timeout=120, env=env)
    subprocess.run(
        [
            sys.executable,
            '-m',
            'torch.distributed.run',
            '--standalone',
            '--nproc-per-node=2',  # picks a free port
            worker[0],
            str(tmp_path / 'two'),
            *worker[1:],
        ],
        check=True,
        timeout=180,
        env=env,
    )
    one, two = (torch.load(tmp_path / d / 'final.pt', weights_only=True) for d in ('one', 'two'))
    assert (
        one['fit_progress']['step'] == two['fit_progress']['step'] == 12
    )  # 44 examples: global batches 8, 8, 8, 8, 8, 4 per epoch
    assert max((one['model'][k] - two['model'][k]).abs().max().item() for k in one['model']) < 1e-6


def hangs_on_rank_1():
    class Hang(Callback):
        def after_batch(self):
            if rank() == 1 and self.learn.step == 3:
                time.sleep(10**6)  # stuck: not dead, not answering

    learn = Learner(make_model(), loader(dataset(400)), metrics=(), progress=False, cbs=[Hang()])
    learn.fit(5)


def test_launch_names_the_rank_that_hung():
    with pytest.raises(RuntimeError) as caught:
        launch(hangs_on_rank_1, nprocs=2, timeout=15)
    message = str(caught.value)
    assert message.startswith('rank 1 hung') and 'rank 0 timed out waiting for it' in message, message


# ---- first-week edges under DDP ----


def validate_torchmetrics(n):
    import torchmetrics

    valid = DataLoader(dataset(n, seed=3), batch_size=5)
    metrics = [
        torchmetrics.classification.MulticlassAccuracy(num_classes=3, average='micro'),
        torchmetrics.classification.MulticlassF1Score(num_classes=3, average='macro'),
    ]
    learn = Learner(make_model(), loader(dataset(16)), valid, metrics=metrics, progress=False)
    values = learn.validate()
    model = learn.model.module.eval()
    with torch.no_grad():
        preds = model(dataset(n, seed=3).tensors[0])
    return gather(values), preds


@pytest.mark.parametrize('n', [30, 31])  # 31: the sampler repeats one example, which torchmetrics must not see
def test_torchmetrics_objects_on_two_ranks_equal_sklearn(n):
    "torchmetrics syncs its own states over the ranks; the padding row is left out of its updates."
    from sklearn.metrics import accuracy_score, f1_score

    (values0, values1), preds = launch(validate_torchmetrics, nprocs=2, args=(n,))
    _, y = dataset(n, seed=3).tensors
    labels = preds.argmax(1)
    assert values0 == values1
    assert values0['accuracy'] == pytest.approx(accuracy_score(y, labels), abs=1e-6)
    assert values0['f1_macro'] == pytest.approx(f1_score(y, labels, average='macro'), abs=1e-6)


def train_on_unsharded(shard):
    import warnings

    x, y = dataset(32).tensors
    batches = [(x[i : i + B], y[i : i + B]) for i in range(0, 32, B)]
    if shard:
        batches = batches[rank() :: world_size()]  # each rank its own batches
    learn = Learner(make_model(), batches, metrics=(), progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        learn.fit(1)
    return gather([str(w.message) for w in caught if 'same first training batch' in str(w.message)])


@pytest.mark.parametrize('shard', [False, True])
def test_identical_batches_on_every_rank_are_named(shard):
    found = launch(train_on_unsharded, nprocs=2, args=(shard,))
    assert all(len(f) == (0 if shard else 1) for f in found), found


class TokenTagger(nn.Module):
    "Tags each token, and computes its own loss as Hugging Face models do: the mean over the labels that are not -100."

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embed, self.head = nn.Embedding(20, 8), nn.Linear(8, 4)

    def forward(self, input_ids, labels=None):
        logits = self.head(torch.tanh(self.embed(input_ids)))
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return {'loss': loss, 'logits': logits}


def tagged(n=24, width=7):
    "Sequences with 1..width counted tokens each: batches differ in tokens, so example weighting would be wrong."
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 20, (n, width), generator=g)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    labels = (ids % 4).masked_fill(torch.arange(width) >= lengths[:, None], -100)
    return [{'input_ids': ids[i], 'labels': labels[i]} for i in range(n)]


def train_tagger(world, accumulate):
    data = tagged()
    dl = DataLoader(data, batch_size=B * 2 // world)  # in order: global batch i is the same examples either way
    learn = Learner(
        TokenTagger(), dl, opt_func=torch.optim.SGD, lr=0.5, metrics=(), accumulate=accumulate, progress=False
    )
    learn.fit(2)
    model = learn.model.module if world > 1 else learn.model
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize('accumulate', [1, 2])
def test_token_mean_loss_on_two_ranks_equals_one_process(accumulate):
    "Each rank's micro-batch weighs its tokens, counted over the ranks: 2 ranks equal one process on the global batch."
    ddp = launch(train_tagger, nprocs=2, args=(2, accumulate))
    one = train_tagger(1, accumulate)
    assert max((ddp[k] - one[k]).abs().max().item() for k in one) < 1e-6


# ---- get_preds: every rank's rows, back in the dataset's order ----


def preds_on_ranks(strategy):
    learn = Learner(
        make_model(),
        loader(dataset(40)),
        DataLoader(dataset(21, seed=3), batch_size=4),
        metrics=(),
        progress=False,
        strategy=strategy,
    )
    learn.fit(1)
    preds, targets = learn.get_preds()
    weights = {
        k: (v.full_tensor() if hasattr(v, 'full_tensor') else v).clone()
        for k, v in plain_model(learn.model).state_dict().items()
    }
    return preds, targets, weights


@pytest.mark.parametrize('strategy', ['ddp', 'fsdp'])
def test_get_preds_gathers_every_rank_in_the_datasets_order(strategy):
    preds, targets, weights = launch(preds_on_ranks, nprocs=2, args=(strategy,))
    model = make_model()
    model.load_state_dict(weights)
    x, y = dataset(21, seed=3).tensors  # 21 rows on 2 ranks: rank 1's last row is padding, left out
    with torch.no_grad():
        expected = model(x)
    assert preds.shape == expected.shape and torch.equal(targets, y)
    assert (preds - expected).abs().max().item() < 1e-6
