"""A received folder, round two (issue #40): what a folder *is* is untrusted too. By class, for every entry point:
links (symbolic, hard, dangling) and special files (FIFOs) in place of every file nbtrainer reads or writes; allowed
classes carrying attributes that hide their contents from a check; size and count bombs; foreign references in a study;
and loads that fail leave the Learner exactly as it was. Each test asserts that nothing outside the folder changed, the
call ended within a bound far above its expected time (a FIFO that blocked would hang it), and the error names the
file, or the documented fallback was taken. These tests stay in the suite."""

import collections, hashlib, io, json, os, pickle, shutil, stat, struct, subprocess, sys, textwrap, threading, warnings
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from conftest import BIN, ROOT
import warm
from nbtrainer import Checkpointer, CSVLogger, Learner, TensorBoardLogger, Tracker, read_checkpoint, runs
from nbtrainer.runfiles import BadFileError, UnsafeFileError, read_shard_metadata
from nbtrainer.testing import classification_data, same_state, tiny_classifier

BOUND = 120  # seconds: every call here takes well under 5; a FIFO opened for reading would block for ever


def make_learner(folder=None, seed=0, cbs=None):
    "A seeded classifier over 64 examples in batches of 16 (4 steps an epoch), writing into `folder` if given."
    data = classification_data(n=64, seed=1)
    torch.manual_seed(seed)
    if cbs is None and folder is not None:
        cbs = [
            Checkpointer(folder / 'ckpt', every_eval=True, keep_evals=2, keep_last=2, keep_best=1),
            CSVLogger(folder / 'log.csv'),
            Tracker(folder / 'runs.db'),
        ]
    return Learner(
        tiny_classifier(seed=seed),
        DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(seed)),
        DataLoader(data, batch_size=32),
        loss_func=F.cross_entropy,
        lr=1e-2,
        progress=False,
        cbs=cbs or [],
    )


def digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree(folder):
    "Every entry under `folder`: a file's hash, a link's target, or its kind: what 'nothing changed' compares."
    found = {}
    for p in sorted(Path(folder).rglob('*')):
        key = str(p.relative_to(folder))
        found[key] = 'link:' + os.readlink(p) if p.is_symlink() else digest(p) if p.is_file() else 'other'
    return found


def bounded(call, seconds=BOUND):
    "Run `call()` in a thread; its result or its exception, or a failure if it has not returned within `seconds`."
    box = {}

    def run():
        try:
            box['value'] = call()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box['error'] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f'the call had not returned after {seconds} s (blocked on a FIFO?)'
    if 'error' in box:
        raise box['error']
    return box.get('value')


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    "A run of 3 epochs (12 steps) with a Checkpointer, a CSV log and a registry: every test works on a copy."
    root = tmp_path_factory.mktemp('trained')
    make_learner(root / 'run').fit(3)
    return root / 'run'


@pytest.fixture
def place(trained, tmp_path):
    "A copy of the trained run, and a victim folder beside it whose files must never change."
    folder = tmp_path / 'run'
    shutil.copytree(trained, folder, symlinks=True)
    victim = tmp_path / 'victim'
    victim.mkdir()
    (victim / 'precious.txt').write_text('keep me\n' * 100)
    return folder, victim


def plant(path, kind, victim):
    "Put a `kind` entry at `path`: a symbolic link or a hard link to the victim's file, a dangling link, or a FIFO."
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    target = victim / 'precious.txt'
    if kind == 'symlink':
        os.symlink(target, path)
    elif kind == 'hardlink':
        os.link(target, path)
    elif kind == 'dangling':
        os.symlink(victim / 'not-there', path)
    elif kind == 'fifo':
        os.mkfifo(path)
    elif kind == 'device':  # /dev/zero's numbers: a reader of it would read for ever
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        except PermissionError:
            pytest.skip('making a device node needs CAP_MKNOD')
    return path


KINDS = ['symlink', 'hardlink', 'dangling', 'fifo', 'device']


def ends_clearly(call, name):
    "Run `call` within the bound: it succeeds (a documented fallback), or fails with an error that names `name`."
    try:
        bounded(call)
        return None
    except Exception as e:
        assert name in str(e), f'{type(e).__name__}: {e}'
        return e


# ---- links and special files in place of every file of a run folder ----

# (where, what happens): 'refused' = the fit stops before training with an error naming the file; 'fallback' = the
# entry is replaced by a file of nbtrainer's own (with a warning) and the fit goes on
RUN_FILES = [
    ('ckpt/.lock', 'refused'),
    ('ckpt/batches.f64', 'fallback'),
    ('ckpt/.eval-16.pt.tmp', 'fallback'),  # the fixed temporary names of earlier versions: removed, never written
    ('ckpt/.step-16.pt.tmp', 'fallback'),
    ('log.csv', 'fallback'),
    ('runs.db-wal', 'refused'),
    ('runs.db-shm', 'refused'),
]


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('name,outcome', RUN_FILES, ids=[n for n, _ in RUN_FILES])
@pytest.mark.parametrize('how', ['fresh', 'resume'])
def test_a_link_or_fifo_in_a_run_folder_never_writes_outside(place, name, outcome, kind, how):
    folder, victim = place
    if how == 'fresh':
        shutil.rmtree(folder)
        (folder / 'ckpt').mkdir(parents=True)
    plant(folder / name, kind, victim)
    before = tree(victim)
    learn = make_learner(folder, seed=3)
    weights = {k: v.clone() for k, v in learn.model.state_dict().items()}
    refused = outcome == 'refused'
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        error = ends_clearly(lambda: learn.fit(5, resume=how == 'resume'), Path(name).name)
    assert tree(victim) == before, f'{name} as a {kind} changed a file outside the folder'
    if error is None:
        assert learn.step == 20 and file_kinds(folder / name) in ('regular file', None)
    else:
        assert refused, f'{name} as a {kind} should have been replaced, but: {error}'
        assert learn.step in (0, 12) and (how == 'resume' or same_state(learn.model.state_dict(), weights))


def file_kinds(path):
    from nbtrainer.runfiles import file_kind

    return file_kind(path)


@pytest.mark.parametrize('kind', KINDS)
def test_learn_save_replaces_a_link_and_never_writes_through_it(tmp_path, kind):
    victim = tmp_path / 'victim'
    victim.mkdir()
    (victim / 'precious.txt').write_text('keep me')
    learn = make_learner(seed=1)
    learn.fit(1)
    folder = tmp_path / 'saved'
    plant(folder / 'model.pt', kind, victim)
    plant(folder / f'batches-{learn.fit_progress.run_id}.f64', kind, victim)
    before = tree(victim)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # the side file in the link's place is replaced, with a warning
        bounded(lambda: learn.save(folder / 'model.pt'))
    assert tree(victim) == before
    other = make_learner(seed=2)
    other.load(folder / 'model.pt')
    assert same_state(other.model.state_dict(), learn.model.state_dict())


@pytest.mark.parametrize('kind', KINDS)
def test_a_linked_or_special_newest_checkpoint_is_skipped_by_name(place, kind):
    "The newest checkpoint is a link (even to a genuine checkpoint elsewhere) or a FIFO: resume skips it, naming it."
    folder, victim = place
    elsewhere = victim / 'precious.txt'
    shutil.copy(max((folder / 'ckpt').glob('eval-*.pt'), key=os.path.getmtime), elsewhere)
    newest = folder / 'ckpt' / 'step-99.pt'
    plant(newest, kind, victim)
    os.utime(newest, (2**31, 2**31), follow_symlinks=False)
    before = tree(victim)
    learn = make_learner(folder, seed=3)
    if kind == 'hardlink':  # a regular file in the folder, whatever else names it: read as the checkpoint it is
        bounded(lambda: learn.fit(5, resume=True))
    else:
        with pytest.warns(UserWarning, match=r'skipped .*step-99\.pt'):
            bounded(lambda: learn.fit(5, resume=True))
    assert learn.step == 20 and tree(victim) == before


def test_a_fifo_as_a_sharded_checkpoints_index_is_skipped(place):
    folder, victim = place
    sharded = folder / 'ckpt' / 'step-99.pt'
    sharded.mkdir()
    shutil.copy(max((folder / 'ckpt').glob('eval-*.pt'), key=os.path.getmtime), sharded / 'state.pt')
    os.mkfifo(sharded / '.metadata')
    with pytest.raises(BadFileError, match=r'step-99\.pt.*FIFO'):
        bounded(lambda: read_checkpoint(sharded))
    learn = make_learner(folder, seed=3)
    os.utime(sharded, (2**31, 2**31))
    with pytest.warns(UserWarning, match=r'skipped .*step-99\.pt'):
        bounded(lambda: learn.fit(4, resume=True))
    assert learn.step == 16


def test_a_tensorboard_run_folder_that_is_a_link_is_refused(tmp_path):
    victim = tmp_path / 'victim'
    victim.mkdir()
    (tmp_path / 'tb' / 'run').mkdir(parents=True)
    os.symlink(victim, tmp_path / 'tb' / 'run' / 'train')
    learn = make_learner(cbs=[TensorBoardLogger(tmp_path / 'tb', run_name='run')])
    with pytest.raises(UnsafeFileError, match='train'):
        bounded(lambda: learn.fit(1))
    assert list(victim.iterdir()) == [] and learn.step == 0


# ---- a registry from elsewhere: hot journals and foreign schema objects, for every entry point ----


def hot_journal(db, victim_file):
    "A rollback journal beside `db` whose super-journal is `victim_file`: SQLite would roll back, then delete it."
    page = 4096
    name = str(victim_file).encode()
    header = (bytes.fromhex('d9d505f920a163d7') + struct.pack('>IIIII', 0, 12345, 2, 512, page)).ljust(512, b'\0')
    checksum = sum(b if b < 128 else b - 256 for b in name) & 0xFFFFFFFF
    tail = struct.pack('>I', 0x40000000 // page + 1) + name + struct.pack('>II', len(name), checksum)
    Path(str(db) + '-journal').write_bytes(header + tail + bytes.fromhex('d9d505f920a163d7'))


def sql(db, *statements):
    import sqlite3

    with sqlite3.connect(db) as con:
        for s in statements:
            con.execute(s)
    con.close()


def registry_entry_points(db):
    "Every way nbtrainer opens a registry: reading, the command line, editing, forking, a study's reading, a fit."
    from nbtrainer.study import Study

    def cli():
        done = warm.run([BIN / 'nbtrainer-runs', str(db)], capture_output=True, text=True, timeout=BOUND)
        if done.returncode:
            raise ValueError(done.stderr)

    return {
        'runs': lambda: runs(db),
        'cli': cli,
        'note': lambda: runs(db)[0].note('x'),
        'fork': lambda: runs(db)[0].fork(8),
        'study': lambda: Study('s', db=db),
        'tracker': lambda: make_learner(cbs=[Tracker(db)]).fit(1),
    }


CRAFTS = {
    'hot journal': None,  # set per test: needs the victim's path
    'trigger': ['CREATE TRIGGER t AFTER INSERT ON evals BEGIN DELETE FROM evals; END'],
    'view': ['ALTER TABLE evals RENAME TO e2', 'CREATE VIEW evals AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL '
             'SELECT x + 1 FROM r) SELECT 0 AS run, x AS seq, 0 AS step, \'{}\' AS row FROM r'],
    'unknown table': ['CREATE TABLE extra (x)'],
    'altered table': ['ALTER TABLE runs ADD COLUMN extra TEXT'],
}  # fmt: skip


@pytest.mark.parametrize('entry', ['runs', 'cli', 'note', 'fork', 'study', 'tracker'])
@pytest.mark.parametrize('craft', list(CRAFTS))
def test_a_received_registry_is_checked_before_sqlite_opens_it(place, craft, entry):
    folder, victim = place
    db = folder / 'runs.db'
    if craft == 'hot journal':
        hot_journal(db, victim / 'precious.txt')
    else:
        sql(db, *CRAFTS[craft])
    before, files = tree(victim), tree(folder)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        error = ends_clearly(registry_entry_points(db)[entry], 'runs.db')
    assert error is not None, f'{entry} accepted a registry with a {craft}'
    assert (victim / 'precious.txt').exists() and tree(victim) == before
    assert {k: v for k, v in tree(folder).items() if not k.endswith(('-shm', '-wal'))} == {
        k: v for k, v in files.items() if not k.endswith(('-shm', '-wal'))
    }


@pytest.mark.parametrize('name', ['runs.db', 'runs.db-wal', 'runs.db-shm', 'runs.db-journal'])
@pytest.mark.parametrize('kind', KINDS)
def test_sqlites_own_files_as_links_are_refused(place, name, kind):
    folder, victim = place
    if name == 'runs.db':
        shutil.copy(folder / 'runs.db', victim / 'precious.txt')  # a genuine registry outside, linked in
    plant(folder / name, kind, victim)
    before = tree(victim)
    for entry, call in registry_entry_points(folder / 'runs.db').items():
        if entry in ('study', 'cli'):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            try:
                bounded(call)
            except Exception as e:
                assert name in str(e) or 'runs.db' in str(e), (entry, e)
        assert tree(victim) == before, (entry, kind)


@pytest.mark.slow
def test_a_registry_of_a_million_runs_lists_in_seconds(tmp_path):
    "Listing is paged: runs() and the CLI read the newest page and count the rest (bounds far above what they take)."
    import sqlite3, time

    db = tmp_path / 'big.db'
    make_learner(cbs=[Tracker(db)]).fit(1)
    config = json.dumps({'lr': 0.01, 'model': 'Sequential'})
    with sqlite3.connect(db) as con:
        con.executemany(
            "INSERT INTO runs (status, started, heartbeat, beat_every, config, study) VALUES ('finished', ?, ?, 10, ?, ?)",
            ((i, i, config, f's{i % 100}') for i in range(10**6)),
        )
    con.close()
    started = time.monotonic()
    found = runs(db)
    took = time.monotonic() - started
    assert len(found) == 1000 and found.total == 10**6 + 1 and 'runs 1 to 1,000 of 1,000,001' in str(found)
    assert took < 60, f'runs() took {took:.1f} s on a million runs'
    started = time.monotonic()
    done = warm.run([BIN / 'nbtrainer-runs', str(db), '--study', 's7'], capture_output=True, text=True, timeout=BOUND)
    assert done.returncode == 0 and 'of 10,000' in done.stdout, done.stderr
    assert time.monotonic() - started < BOUND


# ---- allowed classes that hide their contents from a check ----


class Shadowed(collections.OrderedDict):
    "Pickled as an OrderedDict whose instance attributes `items`, `keys` and `values` hide its entries."

    def __reduce__(self):
        hidden = {'items': torch.Size, 'keys': torch.Size, 'values': torch.Size}
        return (collections.OrderedDict, (), hidden, None, iter(list(dict.items(self))))


def test_a_checkpoint_whose_dicts_hide_their_entries_is_checked_by_their_real_contents(place):
    folder, _ = place
    path = folder / 'ckpt' / 'crafted.pt'
    state = torch.load(max((folder / 'ckpt').glob('eval-*.pt'), key=os.path.getmtime), weights_only=True)
    model = Shadowed(state['model'])
    model[next(iter(state['model']))] = torch.zeros(7, 7)  # the wrong shape, hidden from `.items()`
    state['model'] = model
    torch.save(state, path)
    raw = torch.load(path, weights_only=True)
    assert list(raw['model'].items()) == []  # the trick works on torch's own result
    learn = make_learner(seed=5)
    weights = {k: v.clone() for k, v in learn.model.state_dict().items()}
    with pytest.raises(ValueError, match=r'crafted\.pt.*shape'):
        learn.load(path)
    assert same_state(learn.model.state_dict(), weights)


def sharded(folder):
    "A sharded checkpoint (DCP, one process) of a tiny model with a byte item, in `folder`."
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        dcp.save({'model': {'w': torch.arange(6.0).reshape(2, 3)}, 'optimizer': {'lr': 0.1}}, checkpoint_id=folder)
    return folder


def test_a_sharded_index_whose_dicts_hide_their_records_is_checked_by_their_real_contents(tmp_path):
    folder = sharded(tmp_path / 'step-1.pt')
    meta = pickle.loads((folder / '.metadata').read_bytes())
    for info in meta.storage_data.values():
        info.relative_path = '../../victim.txt'  # would be read, were the check to miss it
    meta.storage_data = Shadowed(meta.storage_data)
    (folder / '.metadata').write_bytes(pickle.dumps(meta))
    with pytest.raises(BadFileError, match='shard file'):
        read_shard_metadata(folder)


def test_a_sharded_index_with_extra_attributes_is_refused(tmp_path):
    folder = sharded(tmp_path / 'step-1.pt')
    meta = pickle.loads((folder / '.metadata').read_bytes())
    next(iter(meta.storage_data.values())).fs = '/dev/zero'  # a field DCP's class never has
    (folder / '.metadata').write_bytes(pickle.dumps(meta))
    with pytest.raises(BadFileError, match='_StorageInfo with the fields'):
        read_shard_metadata(folder)


# ---- size and count bombs ----

ISOLATED = textwrap.dedent(
    '''
    import json, resource, sys, time, warnings
    warnings.simplefilter('ignore')
    sys.path.insert(0, {tests!r})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    try:
        {call}
        error = None
    except Exception as e:
        error = f'{{type(e).__name__}}: {{e}}'
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(json.dumps({{'error': error, 'seconds': time.monotonic() - started, 'grown_mb': grown}}))
    '''
)


def isolated(setup, call):
    "Run `call` (after `setup`) in a fresh process: its error, its time and how much its memory grew (MB)."
    code = setup + ISOLATED.format(tests=str(ROOT / 'tests'), call=call)
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=BOUND * 2)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_deflate_bomb_is_refused_before_it_inflates(tmp_path):
    path = tmp_path / 'bomb.pt'
    buffer = io.BytesIO()
    torch.save({'model': {'w': torch.zeros(10)}}, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as z, zipfile.ZipFile(path, 'w') as out:
        for info in z.infolist():
            if not info.filename.endswith('/data/0'):
                out.writestr(info.filename, z.read(info), compress_type=zipfile.ZIP_DEFLATED)
                continue
            record = zipfile.ZipInfo(info.filename)
            record.compress_type = zipfile.ZIP_DEFLATED
            with out.open(record, 'w', force_zip64=True) as w:  # half a gigabyte of zeros, deflated to ~500 KB
                for _ in range(512):
                    w.write(bytes(2**20))
    assert path.stat().st_size < 5 * 2**20
    result = isolated(
        'import torch\nfrom nbtrainer.runfiles import read_torch_file\n', f'read_torch_file({str(path)!r})'
    )
    assert result['error'] and 'compressed' in result['error'] and 'bomb.pt' in result['error'], result
    assert result['grown_mb'] < 200, result


def test_a_pass_position_past_the_loader_is_refused_and_nothing_changes(place):
    folder, _ = place
    path = max((folder / 'ckpt').glob('eval-*.pt'), key=os.path.getmtime)
    state = torch.load(path, weights_only=True)
    state['data_pass'] = {**state['data_pass'], 'batches_done': 10**15, 'epoch_start': state['data_pass']['rng']}
    torch.save(state, path)
    learn = make_learner(seed=5)
    weights = {k: v.clone() for k, v in learn.model.state_dict().items()}
    with pytest.raises(BadFileError, match=r'pass position is batch 1000000000000000 of a loader of 4'):
        learn.load(path, check_data=False)
    assert same_state(learn.model.state_dict(), weights)


def test_a_deeply_nested_history_is_refused_before_the_weights_change(place):
    folder, _ = place
    path = max((folder / 'ckpt').glob('eval-*.pt'), key=os.path.getmtime)
    state = torch.load(path, weights_only=True)
    state['callbacks']['Recorder']['history'] = '[' * 100_000 + ']' * 100_000
    torch.save(state, path)
    learn = make_learner(seed=5)
    weights = {k: v.clone() for k, v in learn.model.state_dict().items()}
    with pytest.raises(BadFileError, match=r'Recorder.*nests deeper'):
        learn.load(path, check_data=False)
    assert same_state(learn.model.state_dict(), weights)


def test_planner_data_and_tensor_sizes_are_bounded_by_what_the_folder_holds(tmp_path):
    for change, words in (
        (lambda m: m.planner_data.update({'optimizer.lr': ('optimizer', 10**12)}), 'list position'),
        (lambda m: setattr(m.state_dict_metadata['model.w'], 'size', torch.Size([10**5, 10**5])), 'do not cover'),
    ):
        folder = sharded(tmp_path / f'step-{len(words)}.pt')
        meta = pickle.loads((folder / '.metadata').read_bytes())
        change(meta)
        (folder / '.metadata').write_bytes(pickle.dumps(meta))
        result = isolated('from nbtrainer.runfiles import read_shards\n', f'read_shards({str(folder)!r})')
        assert result['error'] and words in result['error'], result
        assert result['seconds'] < 60 and result['grown_mb'] < 200, result


# ---- every refused load leaves the Learner exactly as it was ----


def corrupt(state, where):
    "Damage one part of a checkpoint's state: a count out of range, a structure of the wrong kind, a bad value."
    if where == 'progress':
        state['fit_progress']['step'] = -3
    elif where == 'pass rng':
        state['data_pass']['rng']['python'][1] = [0] * 10
    elif where == 'groups':
        state['param_groups']['frozen'] = 7
    elif where == 'recorder':
        state['callbacks']['Recorder']['history'] = json.dumps([{'step': {'a': {'b': {'c': {'d': 1}}}}}])
    elif where == 'checkpointer':
        state['callbacks']['Checkpointer']['last'] = ['../../x.pt']
    elif where == 'tracker':
        state['callbacks']['Tracker'] = {'run': 'one', 'rows': -1, 'best': [None, None]}
    elif where == 'csv':
        state['callbacks']['CSVLogger'] = {'rows': 'many', 'logged': 0}
    elif where == 'optimizer shape':
        first = next(iter(state['optimizer']['state'].values()))
        first['exp_avg'] = torch.zeros(3)
    elif where == 'optimizer kind':
        state['optimizer']['state'] = [1, 2, 3]
    elif where == 'lr':
        state['lr'] = float('nan')
    elif where == 'model value':
        state['model'][next(iter(state['model']))] = [1.0, 2.0]
    elif where == 'batches':
        state['batches']['rows'] = -5
    elif where == 'no callbacks':
        state['callbacks'] = ['Recorder']
    return state


WHERE = [
    'progress', 'pass rng', 'groups', 'recorder', 'checkpointer', 'tracker', 'csv', 'optimizer shape', 'optimizer kind',
    'lr', 'model value', 'batches', 'no callbacks',
]  # fmt: skip


def learner_state(learn):
    "Everything a load could change, by value."
    return {
        'model': {k: v.clone() for k, v in learn.model.state_dict().items()},
        'opt': json.loads(json.dumps(learn.opt.state_dict(), default=lambda t: t.tolist())),
        'step': (learn.step, learn.epoch, learn.lr),
        'history': json.dumps(learn.recorder.history),
        'callbacks': [json.dumps(cb.state_dict(), default=str) for cb in learn.cbs],
    }


@pytest.mark.parametrize('where', WHERE)
def test_a_refused_load_leaves_the_learner_as_it_was(place, where):
    folder, _ = place
    path = max((folder / 'ckpt').glob('eval-*.pt'), key=os.path.getmtime)
    torch.save(corrupt(torch.load(path, weights_only=True), where), path)
    learn = make_learner(folder.parent / 'other', seed=5)
    learn.fit(1)  # something to lose: weights, optimizer moments, history, callbacks' state
    before = learner_state(learn)
    with pytest.raises(BadFileError, match=path.name):
        learn.load(path, check_data=False)
    after = learner_state(learn)
    assert all(same_state(before[k], after[k]) for k in before), [
        k for k in before if not same_state(before[k], after[k])
    ]


@pytest.mark.parametrize('where', WHERE)
def test_resume_skips_a_malformed_newest_checkpoint_with_a_warning(place, where):
    folder, _ = place
    path = max((folder / 'ckpt').glob('*.pt'), key=os.path.getmtime)
    torch.save(corrupt(torch.load(path, weights_only=True), where), path)
    os.utime(path, (2**31, 2**31))
    learn = make_learner(folder, seed=5)
    with pytest.warns(UserWarning, match=rf'skipped .*{path.name}'):
        bounded(lambda: learn.fit(4, resume=True))
    assert learn.step == 16


# ---- a study folder from elsewhere ----

optuna = pytest.importorskip('optuna')


def test_a_received_studys_trial_never_takes_over_an_unrelated_run(tmp_path):
    from nbtrainer.study import Float, Study

    db = tmp_path / 'runs.db'
    mine = make_learner(cbs=[Tracker(db, notes='my own run')])
    mine.fit(2)
    history = runs(db)[0].history
    study = Study('got', {'lr': Float(1e-3, 1e-1, log=True)}, lambda p: make_learner(), trials=1, fit={'epochs': 1},
                  db=db, display=False)  # fmt: skip
    storage = study.optuna_study()
    trial = storage.ask({'lr': study.searched['lr'].distribution()})
    trial.set_user_attr('run', runs(db)[0].id)  # a crafted journal: "this trial is that run", by id and by UUID
    trial.set_user_attr('run_uid', runs(db)[0].uid)
    with pytest.warns(UserWarning, match='belongs to another study or trial'):
        study.run()
    assert runs(db, study=None)[-1].history == history and runs(db)[-1].notes == 'my own run'
    assert len(study.runs()) == 1 and study.runs()[0].id != runs(db)[-1].id


def test_a_received_studys_parameters_outside_the_space_never_reach_build(tmp_path):
    from optuna.distributions import IntDistribution
    from nbtrainer.study import Int, Study

    built = []
    study = Study('got', {'width': Int(8, 64)}, lambda p: built.append(p) or make_learner(), trials=1,
                  fit={'epochs': 1}, db=tmp_path / 'runs.db', display=False)  # fmt: skip
    storage = study.optuna_study()
    trial = storage.ask()  # what a crafted journal holds: a running trial, and a value outside the space
    storage._storage.set_trial_param(trial._trial_id, 'width', 764881855.0, IntDistribution(0, 10**10))
    with pytest.raises(ValueError, match=r'width=764881855.*outside Int\(8, 64'):
        study.run()
    assert built == []


# ---- a property-based fuzzer over the checkpoint and metadata readers ----

hypothesis = pytest.importorskip('hypothesis')
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402


@pytest.fixture(scope='module')
def genuine(tmp_path_factory):
    root = tmp_path_factory.mktemp('genuine')
    learn = make_learner(root / 'run')
    learn.fit(1)
    path = max((root / 'run' / 'ckpt').glob('*.pt'), key=os.path.getmtime)
    return path.read_bytes(), sharded(root / 'step-1.pt')


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_checkpoints_load_or_are_refused_by_name(genuine, tmp_path_factory, data):
    raw, _ = genuine
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(1, 255)), min_size=1, max_size=8))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    damaged = bytearray(raw)
    for at, mask in flips:
        damaged[at] ^= mask
    path = tmp_path_factory.mktemp('fuzz') / 'eval-4.pt'
    path.write_bytes(bytes(damaged[:cut]))
    learn = make_learner(seed=5)
    before = learner_state(learn)
    try:
        bounded(lambda: learn.load(path, check_data=False))
    except (ValueError, FileNotFoundError) as e:  # a refusal: the file named, the Learner as it was
        assert 'eval-4.pt' in str(e), e
        assert all(same_state(before[k], learner_state(learn)[k]) for k in before)
    except RuntimeError as e:  # only torch's own check of the loaded state may raise besides, never a crash
        pytest.fail(f'{type(e).__name__} past the checks: {e}')


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_sharded_indexes_are_read_or_refused_by_name(genuine, tmp_path_factory, data):
    _, folder = genuine
    raw = (folder / '.metadata').read_bytes()
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(1, 255)), min_size=1, max_size=6))
    damaged = bytearray(raw)
    for at, mask in flips:
        damaged[at] ^= mask
    copy = tmp_path_factory.mktemp('fuzz') / 'step-1.pt'
    shutil.copytree(folder, copy)
    (copy / '.metadata').write_bytes(bytes(damaged))
    try:
        meta = bounded(lambda: read_shard_metadata(copy))
    except BadFileError as e:
        assert 'step-1.pt' in str(e), e
        return
    for info in meta.storage_data.values():  # what was accepted points inside the folder, within its files
        assert (copy / info.relative_path).stat().st_size >= info.offset + info.length


# ---- the smaller items: one reader for evaluations, text that cannot steer a terminal or a spreadsheet, a full disk ----


def test_an_evaluation_is_read_by_the_one_reader(tmp_path):
    from nbtrainer.evaluate import Evaluation

    evaluation = Evaluation(torch.randn(6, 3), torch.arange(6) % 3, torch.rand(6), class_names=['a', 'b', 'c'])
    evaluation.save(tmp_path / 'eval.pt')
    assert torch.equal(Evaluation.load(tmp_path / 'eval.pt').preds, evaluation.preds)

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / 'PWNED'),))

    torch.save({'preds': Payload()}, tmp_path / 'crafted.pt')
    os.symlink(tmp_path / 'eval.pt', tmp_path / 'linked.pt')
    for name, words in (('crafted.pt', 'not a readable checkpoint'), ('linked.pt', 'symbolic link')):
        with pytest.raises(BadFileError, match=rf'{name}.*{words}'):
            Evaluation.load(tmp_path / name)
    assert not (tmp_path / 'PWNED').exists()


def test_text_outputs_show_control_characters_as_escapes(tmp_path):
    from nbtrainer.evaluate import Report

    report = str(Report([{'class': 'cat\x1b[2J\rdog', 'f1': 0.5}]))
    assert '\x1b' not in report and '\r' not in report and '\\x1b[2J\\rdog' in report
    from nbtrainer.study import Choice, Study

    study = Study('esc', {'kind': Choice(['plain', 'x\x1b]0;pwned\x07y'])}, lambda p: make_learner(), trials=2,
                  fit={'epochs': 1}, db=tmp_path / 'runs.db', sampler='grid', display=False)  # fmt: skip
    study.run()
    shown = str(study)
    assert '\x1b' not in shown and '\x07' not in shown and '\\x1b]0;pwned\\x07y' in shown


def test_csv_cells_that_read_as_formulas_are_written_as_text(tmp_path):
    import csv

    def formula(preds, targets):
        return (preds.argmax(1) == targets).float().mean()

    formula.__name__ = '=HYPERLINK("http://example.com")'
    data = classification_data(n=64, seed=1)
    learn = Learner(tiny_classifier(), DataLoader(data, batch_size=16), DataLoader(data, batch_size=32),
                    loss_func=F.cross_entropy, metrics=[formula], progress=False, cbs=[CSVLogger(tmp_path / 'log.csv')])  # fmt: skip
    learn.fit(1)
    learn.recorder.history[-1]['note'] = '@cmd|calc'
    learn.recorder.history[-1]['delta'] = '-0.5'
    learn.recorder.to_csv(tmp_path / 'history.csv')
    header = next(csv.reader(open(tmp_path / 'history.csv')))
    row = list(csv.DictReader(open(tmp_path / 'history.csv')))[-1]
    assert '\'=HYPERLINK("http://example.com")' in header and row['note'] == "'@cmd|calc" and row['delta'] == '-0.5'
    assert '\'=HYPERLINK("http://example.com")' in next(csv.reader(open(tmp_path / 'log.csv')))


def test_a_full_disk_names_the_file(tmp_path):
    from test_hostile_registry import in_namespace, unshare_works

    if not unshare_works(tmp_path):
        pytest.skip('needs unshare -rm (user and mount namespaces) for a small tmpfs')
    disk = tmp_path / 'disk'
    disk.mkdir()
    result = in_namespace(
        tmp_path,
        f'mount -t tmpfs -o size=64k tmpfs {disk}',
        f'''
        import json, torch, warnings
        from pathlib import Path
        from test_hostile_files import make_learner
        warnings.simplefilter('ignore')
        learn = make_learner()
        learn.fit(1)
        try:  # the disk filled up by something else first
            with open(Path({str(disk)!r}) / 'filler', 'wb') as f:
                while True:
                    f.write(bytes(4096))
                    f.flush()
        except OSError:
            pass
        try:
            learn.save(Path({str(disk)!r}) / 'model.pt')
            out = None
        except OSError as e:
            out = str(e)
        print(json.dumps({{'error': out}}))
    ''',
    )
    assert result['error'] and 'No space left on device' in result['error'] and 'model.pt' in result['error'], result
