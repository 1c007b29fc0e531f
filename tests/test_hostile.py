"""A run folder from anyone (issue #31): crafted files never run code or touch anything outside their folder, with every
loader the docs name; damaged files end as their documented fallback. These tests stay in the suite."""

import hashlib, io, os, pickle, shutil, signal, subprocess, sys, warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from nbtrainer import Checkpointer, CSVLogger, Learner, Tracker, plain_checkpoint, read_checkpoint, runs
from nbtrainer.testing import classification_data, same_weights, tiny_classifier, wait_for

import warm

STEPS_PER_EPOCH = 4  # 64 examples in batches of 16


class Payload:
    "Unpickled, it makes the folder `marker`: proof that a file ran code."

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def make_learner(folder, seed=0, **kwargs):
    "The run's Learner, writing into `folder` (None: a bare Learner with no callbacks)."
    data = classification_data(n=64, seed=1)
    torch.manual_seed(seed)
    cbs = (
        []
        if folder is None
        else [
            Checkpointer(folder / 'ckpt', every_eval=True, keep_evals=2, keep_last=2, keep_best=1),
            CSVLogger(folder / 'log.csv'),
            Tracker(folder / 'runs.db'),
        ]
    )
    return Learner(
        tiny_classifier(seed=seed),
        DataLoader(data, batch_size=16, shuffle=True),
        DataLoader(data, batch_size=32),
        loss_func=F.cross_entropy,
        lr=1e-2,
        progress=False,
        cbs=cbs,
        **kwargs,
    )


def tree(folder):
    "Every file under `folder` and its bytes' hash: what 'nothing changed' compares."
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else 'dir'
        for p in sorted(folder.rglob('*'))
    }


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    "A run of 3 epochs (12 steps), and the same run's weights at its end: every test works on a copy."
    root = tmp_path_factory.mktemp('trained')
    learn = make_learner(root / 'run')
    learn.fit(3)
    return root / 'run', {k: v.clone() for k, v in learn.model.state_dict().items()}


@pytest.fixture
def run(trained, tmp_path):
    "A copy of the trained run, a victim folder beside it, and a marker path that must never appear."
    folder = tmp_path / 'run'
    shutil.copytree(trained[0], folder)
    (tmp_path / 'victim').mkdir()
    (tmp_path / 'victim' / 'precious.txt').write_text('keep me')
    return folder, tmp_path / 'PWNED', tmp_path / 'victim'


def sharded_copy(plain, target):
    "A sharded checkpoint folder made from a plain checkpoint, as FSDP's `_save_shards` lays it out (DCP in one process)."
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    state = torch.load(plain, weights_only=True)
    learn = make_learner(None)
    learn.load(plain, model_only=True)
    learn.opt.load_state_dict(state['optimizer'])
    model_state, opt_state = get_state_dict(learn.model, learn.opt)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        dcp.save({'model': model_state, 'optimizer': opt_state}, checkpoint_id=target)
    state.update(model=None, optimizer={'param_groups': opt_state['param_groups']}, sharded=True)
    torch.save(state, target / 'state.pt')
    return target


def newest(folder):
    return max((folder / 'ckpt').glob('*.pt'), key=os.path.getmtime)


def make_newest(path):
    later = os.path.getmtime(newest(path.parent.parent)) + 10
    os.utime(path, (later, later))
    return path


# ---- the loaders the docs name, each given a crafted file in the run folder ----


def learn_load(folder, path):
    make_learner(folder.parent / 'other').load(path)


def learn_load_model(folder, path):
    make_learner(folder.parent / 'other').load(path, model_only=True)


def resume(folder, path):
    make_learner(folder).fit(4, resume=True)


def load_best(folder, path):
    make_learner(folder).load_best()


def latest(folder, path):
    Checkpointer(folder / 'ckpt').latest()


def table(folder, path):
    Checkpointer(folder / 'ckpt').table()


def fork_file(folder, path):
    make_learner(folder.parent / 'other').fork(8, checkpoint=path)


def registry_fork(folder, path):
    runs(folder / 'runs.db')[-1].fork(8, build=lambda: make_learner(folder.parent / 'other'))


def plain(folder, path):
    plain_checkpoint(path, folder.parent / 'plain.pt')


def read(folder, path):
    read_checkpoint(path)


LOADERS = [learn_load, learn_load_model, resume, load_best, latest, table, fork_file, registry_fork, plain, read]
GIVEN_THE_FILE = (learn_load, learn_load_model, fork_file, plain, read)  # an error names it; the others may skip it


def crafted_plain(folder, marker, slot):
    "eval-8.pt with a pickle payload in `slot` of its state, made the newest and the best."
    path = folder / 'ckpt' / 'eval-8.pt'
    state = torch.load(path, weights_only=True)
    if slot == 'model':
        state['model'][next(iter(state['model']))] = Payload(marker)
    elif slot == 'callbacks':
        state['callbacks']['Recorder']['history'] = Payload(marker)
    else:
        state[slot] = Payload(marker)
    torch.save(state, path)  # pickled by torch.save, as an attacker would
    return make_newest(path)


def crafted_sharded(folder, marker, slot):
    "eval-8.pt as a sharded checkpoint (a folder) whose `.metadata`, `state.pt` or a byte item holds a payload."
    path = folder / 'ckpt' / 'eval-8.pt'
    plain_file = folder.parent / 'eval-8-plain.pt'
    shutil.move(path, plain_file)
    sharded_copy(plain_file, path)
    if slot == 'metadata':
        (path / '.metadata').write_bytes(pickle.dumps(Payload(marker)))
    elif slot == 'state.pt':
        state = torch.load(path / 'state.pt', weights_only=True)
        state['fit_progress'] = Payload(marker)
        torch.save(state, path / 'state.pt')
    elif slot == 'byte item':  # the optimizer's lr, pointed at a payload appended to the shard file
        from nbtrainer.runfiles import read_shard_metadata

        meta = read_shard_metadata(path)
        index = next(i for i in meta.storage_data if i.fqn.endswith('param_groups.0.lr'))
        info = meta.storage_data[index]
        buffer = io.BytesIO()
        torch.save(Payload(marker), buffer)
        with open(path / info.relative_path, 'ab') as f:
            info.offset = f.tell()
            f.write(buffer.getvalue())
        info.length = len(buffer.getvalue())
        with open(path / '.metadata', 'wb') as f:
            pickle.dump(meta, f)
    return make_newest(path)


SLOTS = [(crafted_plain, s) for s in ('model', 'optimizer', 'callbacks', 'data_pass')] + [
    (crafted_sharded, s) for s in ('metadata', 'state.pt', 'byte item')
]


@pytest.mark.parametrize('loader', LOADERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize('craft,slot', SLOTS, ids=[f'{c.__name__}-{s}' for c, s in SLOTS])
def test_a_pickle_payload_never_runs(run, loader, craft, slot):
    folder, marker, victim = run
    path = craft(folder, marker, slot)
    before = tree(victim)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # resume=True and the Checkpointer's readers skip the file with a warning
        try:
            loader(folder, path)
        except (ValueError, FileNotFoundError) as e:
            assert loader not in GIVEN_THE_FILE or 'eval-8.pt' in str(e), e
    assert not marker.exists(), f'{loader.__name__} ran the payload in {slot}'
    assert tree(victim) == before


def test_resume_skips_a_crafted_checkpoint_and_says_so(run):
    folder, marker, _ = run
    crafted_sharded(folder, marker, 'metadata')
    with pytest.warns(UserWarning, match=r'skipped .*eval-8\.pt.*not a class of checkpoint metadata'):
        make_learner(folder).fit(4, resume=True)
    assert not marker.exists()


# ---- names that lead outside the folder ----

TRAVERSALS = ['../../victim', '../victim', '..', '/tmp', 'eval-8.pt/../../../victim']


def with_kept(folder, field, name):
    "The newest checkpoint, its Checkpointer state naming `name` in `field`."
    path = newest(folder)
    state = torch.load(path, weights_only=True)
    kept = state['callbacks']['Checkpointer']
    if field == 'best':
        kept['best'] = [[0.0, name, {'step': 8}]]
    else:
        kept[field] = [name]
    torch.save(state, path)
    return path


@pytest.mark.parametrize('name', TRAVERSALS)
@pytest.mark.parametrize('field', ['last', 'best', 'evals'])
def test_kept_names_outside_the_folder_are_refused(run, field, name):
    folder, _, victim = run
    path = with_kept(folder, field, name)
    before, run_files = tree(victim), tree(folder.parent)
    for reader in (lambda: Checkpointer(folder / 'ckpt').table(), lambda: make_learner(folder).load_best()):
        with pytest.raises(ValueError, match=rf'{path.name}.*Checkpointer\.{field}'):
            reader()
    learn = make_learner(folder, seed=7)
    # resumed with rotation, it would delete them: refused before anything was loaded, and skipped by name for the next
    with pytest.warns(UserWarning, match=rf'skipped .*{path.name}.*Checkpointer\.{field}'):
        learn.fit(6, resume=True)
    assert learn.step == 24 and tree(victim) == before
    changed = {k for k in set(tree(folder.parent)) | set(run_files) if tree(folder.parent).get(k) != run_files.get(k)}
    assert all(k.startswith('run/') for k in changed), changed  # the refused fit wrote nothing outside the run


@pytest.mark.parametrize('name', ['../batches.f64', '../../victim/precious.txt', '..', '/etc/passwd'])
def test_a_side_file_outside_the_folder_is_refused(run, name):
    folder, _, victim = run
    path = newest(folder)
    state = torch.load(path, weights_only=True)
    state['batches']['file'] = name
    torch.save(state, path)
    with pytest.raises(ValueError, match='per-batch side file'):
        make_learner(folder.parent / 'other').load(path)
    assert (victim / 'precious.txt').read_text() == 'keep me'


def test_a_tensorboard_run_outside_its_folder_is_refused(tmp_path):
    from nbtrainer import TensorBoardLogger

    logger = TensorBoardLogger(tmp_path / 'tb')
    with pytest.raises(ValueError, match='TensorBoardLogger.run'):
        logger.check_state({'run': '..', 'logged': 0})
    logger.check_state({'run': '20260101-120000', 'logged': 0, 'purge_steps': {'train': 1, 'valid': 1}})


def test_a_shard_outside_the_folder_is_refused(run):
    folder, marker, victim = run
    path = crafted_sharded(folder, marker, None)  # a genuine sharded checkpoint, then its index altered
    from nbtrainer.runfiles import read_shard_metadata

    meta = read_shard_metadata(path)
    for info in meta.storage_data.values():
        info.relative_path = '../../../victim/precious.txt'
    with open(path / '.metadata', 'wb') as f:
        pickle.dump(meta, f)
    for loader in (read, plain, learn_load):
        with pytest.raises(ValueError, match='shard file'):
            loader(folder, path)
    assert (victim / 'precious.txt').read_text() == 'keep me'


# ---- damaged files: each ends as its documented fallback ----


def damage(path, how):
    data = path.read_bytes()
    if how == 'delete':
        path.unlink()
    elif how == 'truncate':
        path.write_bytes(data[: len(data) // 2])
    else:
        at = {'start': 0, 'middle': len(data) // 2, 'end': len(data) - 1}[how]
        flipped = bytearray(data)
        flipped[at] ^= 0x04
        path.write_bytes(bytes(flipped))


FILES = ['ckpt/eval-8.pt', 'ckpt/eval-12.pt', 'ckpt/epoch-2.pt', 'ckpt/best', 'ckpt/batches.f64', 'log.csv', 'runs.db']
HOW = ['start', 'middle', 'end', 'truncate', 'delete']


def resolve(folder, name):
    if name != 'ckpt/best':
        return folder / name
    return Path(Checkpointer(folder / 'ckpt').best())


@pytest.mark.slow
@pytest.mark.parametrize('how', HOW)
@pytest.mark.parametrize('name', FILES)
def test_a_damaged_file_ends_as_its_fallback(run, trained, name, how):
    "Resumed after the damage and trained to the end, the run ends on the uninterrupted run's weights, whatever broke."
    folder = run[0]
    damage(resolve(folder, name), how)
    straight = make_learner(folder.parent / 'straight')
    straight.fit(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        try:
            resumed = make_learner(folder)
        except ValueError as e:  # a damaged registry is refused before anything starts, by name
            assert name == 'runs.db' and 'runs.db' in str(e), e
            return
        try:
            resumed.fit(4, resume=True)
        except ValueError as e:
            assert name == 'runs.db' and 'runs.db' in str(e), e
            return
    assert resumed.step == 16 and same_weights(resumed.model, straight.model), [str(w.message) for w in caught]
    if name.endswith('.pt') or name == 'ckpt/best':  # a damaged checkpoint is skipped by name, unless it was not newest
        assert all('Traceback' not in str(w.message) for w in caught)


@pytest.mark.slow
@pytest.mark.parametrize('how', HOW)
def test_a_damaged_side_file_loses_only_the_per_batch_losses(run, how):
    folder = run[0]
    damage(folder / 'ckpt' / 'batches.f64', how)
    learn = make_learner(folder)
    with pytest.warns(UserWarning, match='per-batch history'):
        learn.fit(4, resume=True)  # its first save used to fail here (IndexError)
        learn.recorder.train_losses
    assert learn.step == 16 and len(learn.recorder.history) == 4 and len(learn.recorder.train_losses) == 4
    again = make_learner(folder.parent / 'other')
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # the side file written since the damage is whole: no warning
        again.load(newest(folder))
        assert again.recorder.train_losses == learn.recorder.train_losses


@pytest.mark.slow
def test_a_flip_anywhere_in_a_checkpoint_is_caught_or_harmless(run, trained):
    "Every byte of the zip's end records and a sample across the file: a clear error naming the file, or the same weights."
    folder = run[0]
    path = folder / 'ckpt' / 'eval-12.pt'
    data = path.read_bytes()
    reference = make_learner(None)
    reference.load(path)
    positions = [*range(len(data) - 120, len(data)), *range(0, len(data), max(1, len(data) // 200))]
    for at in positions:
        flipped = bytearray(data)
        flipped[at] ^= 0x01
        path.write_bytes(bytes(flipped))
        learn = make_learner(None)
        try:
            learn.load(path)
        except ValueError as e:
            assert 'eval-12.pt' in str(e), (at, e)
        else:
            assert same_weights(learn.model, reference.model), at


# ---- real processes: killed anywhere, signalled after the last step, a second writer ----

WORKER = [sys.executable, str(Path(__file__).parent / 'run_folder_worker.py')]
ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}


def worker(folder, *args):
    return warm.run(WORKER + [str(folder), *args], capture_output=True, text=True, timeout=600, env=ENV)


def outcome(folder):
    "What a finished run leaves: its final weights and history, the CSV log, the registry's history of its run."
    final = torch.load(folder / 'final.pt', weights_only=True)
    registry = [{k: v for k, v in row.items() if k != 'time'} for row in runs(folder / 'runs.db')[0].history]
    return final, (folder / 'log.csv').read_text(), registry


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp('uninterrupted') / 'run'
    done = worker(folder)
    assert done.returncode == 0, done.stderr
    return outcome(folder)


@pytest.mark.slow
@pytest.mark.parametrize(
    'moment', ['before_validate:8', 'after_eval:8', 'after_batch:9', 'after_batch:12', 'before_validate:24']
)
def test_killed_anywhere_resumes_to_the_uninterrupted_run(tmp_path, uninterrupted, moment):
    "Every column of the history (grad_norm too), the CSV log, the registry and EarlyStopping's restored best weights."
    folder = tmp_path / 'run'
    killed = worker(folder, '--kill', moment)
    assert killed.returncode == -9, killed.stderr
    resumed = worker(folder, '--resume')
    assert resumed.returncode == 0, resumed.stderr
    (a, csv_a, reg_a), (b, csv_b, reg_b) = uninterrupted, outcome(folder)
    assert a['step'] == b['step'] == 24
    assert (
        a['best_step'] == b['best_step'] and a['best_step'] < 24
    )  # the best came before the end: restore_best matters
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])  # the best weights, restored after a kill
    assert a['history'] == b['history'] and all('grad_norm' in row for row in b['history'])
    assert csv_a == csv_b and reg_a == reg_b
    assert b['times'] == sorted(b['times'])  # the resumed fit's time goes on from the checkpoint's


@pytest.mark.slow
def test_sigterm_in_the_final_evaluation_exits_143(tmp_path):
    folder = tmp_path / 'run'
    done = worker(folder, '--signal', 'before_validate:24')
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    run = runs(folder / 'runs.db')[0]
    assert run.status == 'finished' and len(run.history) == 6  # the fit ended as it would have, then the process exited


@pytest.mark.slow
def test_a_second_writer_leaves_the_first_runs_files_alone(tmp_path, uninterrupted):
    folder = tmp_path / 'run'
    first = warm.Popen(WORKER + [str(folder), '--hold-at', '5'], env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        wait_for((folder / 'held').exists, 'the first run to hold at step 5', timeout=300, process=first)
        files = tree(folder)  # the registry too: the worker's heartbeat is set not to beat while it is held
        for args in ((), ('--resume',)):
            second = worker(folder, *args)
            assert second.returncode != 0 and 'is being written by process' in second.stderr, second.stderr
            assert tree(folder) == files
        assert len(runs(folder / 'runs.db')) == 1  # the refused processes started no run
        (folder / 'go').touch()
        assert first.wait(timeout=300) == 0, first.stderr.read()
    finally:
        if first.poll() is None:
            first.kill()
    final, csv, registry = outcome(folder)
    assert all(torch.equal(final['model'][k], uninterrupted[0]['model'][k]) for k in final['model'])
    assert csv == uninterrupted[1] and registry == uninterrupted[2]


def test_an_mlflow_run_id_that_is_no_id_is_refused():
    from nbtrainer import MLflowLogger

    for bad in ('../../victim', 'a' * 31, None, 3):
        with pytest.raises(ValueError, match='not an MLflow run id'):
            MLflowLogger().check_state({'run_id': bad, 'logged': 0})
    MLflowLogger().check_state({'run_id': '0123456789abcdef0123456789abcdef', 'logged': 4})
