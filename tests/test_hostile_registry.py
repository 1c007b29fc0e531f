"""The experiment registry against a folder from anywhere: moved and copied registries fork from their own files;
crafted `checkpoints` fields, another run's files, damaged bytes (bit flips at the start, middle and end, a garbage
page, a truncated file, a deleted WAL), a read-only filesystem and a full disk each end in one clear error naming the
file, or in the documented fallback, and nothing outside the folder changes. The read-only filesystem and the full disk
are real: a read-only bind mount and a tiny tmpfs, each in a user and mount namespace of its own (`unshare -rm`), which
works as root (where `chmod 444` does not stop a writer) and as a user; the full disk is also simulated in the process
by filling the pages SQLite may use (`PRAGMA max_page_count`, SQLITE_FULL)."""

import hashlib, json, os, shutil, sqlite3, subprocess, sys, textwrap, warnings
from contextlib import closing
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import BIN, ROOT
import warm
from nbtrainer import Callback, Checkpointer, Learner, Order, Tracker, runs
from nbtrainer.testing import classification_data, raises, same_weights, synth_learner, tiny_classifier

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings('ignore:checkpoint .* has state for callbacks this Learner lacks'),
]


def make(cbs=()):
    "A seeded classifier with dropout (so the random streams matter), 24 optimizer steps over 4 epochs."
    torch.manual_seed(0)
    train = DataLoader(
        classification_data(96, seed=0), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    valid = DataLoader(classification_data(48, seed=1), batch_size=24)
    return Learner(tiny_classifier(dropout=0.2), train, valid, lr=0.01, progress=False, cbs=list(cbs))


def train_registry(home):
    "A registry folder: the database and one run's checkpoints (every evaluation, 6 steps apart) under it."
    make([Tracker(home / 'experiments.db'), Checkpointer(home / 'ckpt', every_eval=True, keep_best=0)]).fit(4)
    return home / 'experiments.db'


def branch_weights(run, step):
    "Fork `run` at `step` with a fresh Learner, train the branch on with a lower lr, and return its weights."
    learn = run.fork(step, make)
    learn.fit(4, lr=0.003)
    return learn.model


def reader_state(path):
    "SQLite's index of a WAL (`-shm`) and an empty WAL: what any reader of a WAL database may leave, no data of its own."
    return path.name.endswith('-shm') or (path.name.endswith('-wal') and path.stat().st_size == 0)


def snapshot(root, leave_out=()):
    "Every file under `root` (less the folders `leave_out`, and SQLite's reader state) with the hash of its bytes."
    found = {}
    for path in sorted(Path(root).rglob('*')):
        if path.is_file() and not reader_state(path) and not any(path.is_relative_to(f) for f in leave_out):
            found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def sql(db, statement, params=()):
    "Run one statement on the database file, as any SQLite client would, and return its rows."
    with closing(sqlite3.connect(db)) as con, con:
        return con.execute(statement, params).fetchall()


def stored_folder(db, run_id=1):
    return sql(db, 'SELECT checkpoints FROM runs WHERE id = ?', (run_id,))[0][0]


def set_folder(db, text, run_id=1):
    sql(db, 'UPDATE runs SET checkpoints = ? WHERE id = ?', (text, run_id))


def test_a_moved_or_copied_registry_forks_from_its_own_files(tmp_path):
    db = train_registry(tmp_path / 'original')
    assert stored_folder(db) == 'ckpt'  # relative to the database's folder
    (run,) = runs(db)
    assert run.checkpoints == str((tmp_path / 'original' / 'ckpt').resolve())
    reference = {step: branch_weights(run, step) for step in (12, 18)}  # forks done in the original place

    # moved: the original place is gone, so nothing can be read from it
    shutil.move(tmp_path / 'original', tmp_path / 'moved')
    (run,) = runs(tmp_path / 'moved' / 'experiments.db')
    assert run.checkpoints == str((tmp_path / 'moved' / 'ckpt').resolve())
    assert same_weights(branch_weights(run, 12), reference[12])

    # copied: the copy lost eval-12.pt, and the folder it was copied from changed its eval-18.pt; the copy reads its own
    shutil.copytree(tmp_path / 'moved', tmp_path / 'copy')
    (tmp_path / 'copy' / 'ckpt' / 'eval-12.pt').unlink()
    (tmp_path / 'moved' / 'ckpt' / 'eval-18.pt').write_bytes(b'the original, changed after the copy')
    before = snapshot(tmp_path, leave_out=[tmp_path / 'copy'])
    (run,) = runs(tmp_path / 'copy' / 'experiments.db')
    raises(
        lambda: run.fork(12, make),
        'kept no state for the evaluation at step 12',
        str(tmp_path / 'copy' / 'ckpt'),
        'steps [6, 18, 24]',
    )
    assert same_weights(branch_weights(run, 18), reference[18])
    assert snapshot(tmp_path, leave_out=[tmp_path / 'copy']) == before  # the branches wrote into no other folder


def test_an_old_database_with_absolute_folders_still_forks(tmp_path):
    "Files written before folders were relative hold absolute paths: they are read as they are, owner checked."
    db = train_registry(tmp_path / 'old')
    reference = branch_weights(runs(db)[0], 12)
    set_folder(db, str((tmp_path / 'old' / 'ckpt').resolve()))  # as nbtrainer used to write it
    assert same_weights(branch_weights(runs(db)[0], 12), reference)
    # moved with its database, an absolute folder still names the old place: the fork says so, and reads nothing
    shutil.move(tmp_path / 'old', tmp_path / 'moved')
    raises(
        lambda: runs(tmp_path / 'moved' / 'experiments.db')[0].fork(12, make),
        'kept its checkpoints in',
        str(tmp_path / 'old' / 'ckpt'),
        'is not there',
    )


def test_crafted_checkpoint_folders_are_refused(tmp_path):
    victim = tmp_path / 'victim'
    victim.mkdir()
    (victim / 'eval-12.pt').write_text('not a checkpoint')
    other = train_registry(tmp_path / 'other')
    make([Tracker(other), Checkpointer(tmp_path / 'other' / 'ckpt2', every_eval=True, keep_best=0)]).fit(2)  # its run 2
    db = train_registry(tmp_path / 'home')
    home = db.parent
    make([Checkpointer(home / 'anonymous', every_eval=True, keep_best=0)]).fit(2)  # no Tracker: its files name no run
    make([Tracker(db, notes='second'), Checkpointer(home / 'second', every_eval=True, keep_best=0)]).fit(2)
    files = [db, home / 'experiments.db-wal', home / 'experiments.db-shm']
    before = snapshot(tmp_path, leave_out=files)
    original = stored_folder(db)
    for text, words in (
        ('../../victim', (str(db), "run 1's 'checkpoints' field climbs out of its folder", 'refused')),
        ('ckpt/../../../victim', ("'checkpoints' field climbs out",)),
        (str(victim / '..' / 'victim'), ("'checkpoints' field climbs out",)),
        ('..\\..\\victim', ("'checkpoints' field climbs out",)),
        ('ckpt\0/x', ("run 1's 'checkpoints' field holds a NUL character",)),
        (' ', ("'checkpoints' field is empty",)),
        ('second', ('second/eval-12.pt holds the state of another run at step 12', "run 2 where", "not run 1's")),
        (str(tmp_path / 'other' / 'ckpt2'), ('ckpt2/eval-12.pt holds the state of another run at step 12',)),
        ('anonymous', ('anonymous/eval-12.pt does not say which run it holds', "run 1's")),
        (str(victim), (str(victim / 'eval-12.pt'),)),
    ):  # read and checked as any file, never changed
        set_folder(db, text)
        raises(lambda: runs(db)[1].fork(12, make), *words)
        raises(lambda: runs(db)[1].fork(12), *words)
        assert snapshot(tmp_path, leave_out=files) == before
    set_folder(db, original)
    assert runs(db)[1].fork(12)['fit_progress']['step'] == 12
    # an absolute folder that holds another registry's run of the same id: told apart by the runs' UUIDs, and refused
    set_folder(db, str(tmp_path / 'other' / 'ckpt'))
    raises(lambda: runs(db)[1].fork(12), 'holds the state of another run at step 12', "run 1 where", "not run 1's")


def test_crafted_rows_get_one_clear_error(tmp_path):
    db = train_registry(tmp_path / 'home')
    for column, value, words in (
        ('config', '{"lr": ', ("run 1 has a damaged 'config' field",)),
        ('config', '[1, 2]', ("damaged 'config'",)),
        ('tags', '"x"', ("damaged 'tags'",)),
        ('parent', '{"run": "1; DROP TABLE runs", "step": 2}', ("damaged 'parent'",)),
        ('started', 'yesterday', ("damaged 'started'",)),
        ('status', b'\x1b', ("damaged 'status'",)),  # a BLOB
        ('config', '[' * 100000 + ']' * 100000, ("damaged 'config'",)),
    ):
        copy = tmp_path / f'copy-{column}.db'
        shutil.copy(db, copy)
        sql(copy, f'UPDATE runs SET {column} = ?', (value,))
        raises(lambda: runs(copy), str(copy), *words)
    copy = tmp_path / 'history.db'
    shutil.copy(db, copy)
    sql(copy, "UPDATE evals SET row = '{\"step\": ' WHERE seq = 1")
    raises(lambda: runs(copy)[0].history, 'run 1 has a damaged history row (seq 1)')
    # a run forked from run 1 at step 30 owns run 1's state at step 12; runs whose parents make a loop own nothing else
    insert = (
        "INSERT INTO runs (id, status, started, heartbeat, beat_every, config, parent, checkpoints) "
        "VALUES (?, 'finished', 0, 0, 10, '{}', ?, 'elsewhere')"
    )
    for run_id, parent in ((2, '{"run": 1, "step": 30}'), (3, '{"run": 4, "step": 30}'), (4, '{"run": 3, "step": 30}')):
        sql(db, insert, (run_id, parent))
    (tmp_path / 'home' / 'elsewhere').mkdir()
    shutil.copy(tmp_path / 'home' / 'ckpt' / 'eval-12.pt', tmp_path / 'home' / 'elsewhere' / 'eval-12.pt')
    by_id = {r.id: r for r in runs(db)}
    assert by_id[2].fork(12)['fit_progress']['step'] == 12
    raises(lambda: by_id[3].fork(12), 'holds the state of another run at step 12 (run 1 where', "not run 3's")


def test_a_crafted_tracker_state_is_refused():
    for state in (
        {'run': '1; DROP TABLE runs', 'rows': 0, 'best': [None, None]},
        {'run': 1, 'rows': -1, 'best': [None, None]},
        {'run': 1, 'rows': 0, 'best': [1.0, 2, 3]},
        {'run': 1, 'rows': 0},
        ['run', 1],
    ):
        raises(lambda: Tracker().load_state_dict(state), 'not a Tracker state')


def damage(db, where, how):
    "Damage the database file: flip a bit, overwrite a whole page with garbage, or cut the file."
    data = bytearray(db.read_bytes())
    page = 4096
    offset = {'start': 60, 'header': 18, 'middle': len(data) // 2 + 700, 'end': len(data) - 300}[where]
    if how == 'flip':
        data[offset] ^= 0x10
    elif how == 'page':
        start = offset // page * page
        data[start : start + page] = (
            torch.randint(0, 256, (page,), generator=torch.Generator().manual_seed(start), dtype=torch.uint8)
            .numpy()
            .tobytes()
        )
    elif how == 'truncate':
        del data[offset:]
    db.write_bytes(bytes(data))


def clear_or_intact(f, path):
    "Call f: it either works, or fails with one clear error (ValueError or OSError) naming the file; nothing else."
    try:
        return f()
    except (ValueError, OSError) as e:
        assert str(path) in str(e), e
        return e


@pytest.mark.parametrize('how', ['flip', 'page', 'truncate'])
@pytest.mark.parametrize('where', ['header', 'start', 'middle', 'end'])
def test_damaged_bytes_end_in_a_clear_error_or_intact(tmp_path, where, how):
    db = train_registry(tmp_path / 'home')
    for notes in ('two', 'three'):
        synth_learner(cbs=[Tracker(db, notes=notes)]).fit(3)
    damage(db, where, how)
    before = snapshot(tmp_path, leave_out=[tmp_path / 'home'])
    found = clear_or_intact(lambda: runs(db), db)
    if not isinstance(found, Exception):
        for run in found:
            clear_or_intact(lambda: run.history, db)
    learn = synth_learner(cbs=[Tracker(db)])
    initial = [p.detach().clone() for p in learn.model.parameters()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        outcome = clear_or_intact(lambda: learn.fit(2), db)
    if isinstance(outcome, Exception):  # refused before the first step: the model is as it was
        assert learn.step == 0 and all(torch.equal(a, b) for a, b in zip(initial, learn.model.parameters()))
    else:  # trained; if the file failed during the fit, one warning says the Tracker stopped recording
        reference = synth_learner()
        reference.fit(2)
        assert same_weights(learn.model, reference.model)
        stopped = [w for w in caught if 'stopped recording' in str(w.message)]
        assert len(stopped) <= 1 and all(str(db) in str(w.message) for w in stopped)
    assert snapshot(tmp_path, leave_out=[tmp_path / 'home']) == before


def test_a_garbage_page_is_refused_before_the_first_step(tmp_path):
    db = tmp_path / 'experiments.db'
    for i in range(6):
        synth_learner(cbs=[Tracker(db, notes='x' * 3000)]).fit(5)  # pages of runs and of history rows
    pages = sql(db, 'PRAGMA page_count')[0][0]
    damage(db, 'middle', 'page')
    try:
        assert sql(db, 'PRAGMA quick_check')[0][0] != 'ok'  # the damage is real: SQLite's own check finds it
    except sqlite3.DatabaseError:
        pass
    assert pages > 4
    tracker = Tracker(db)
    learn = synth_learner(cbs=[tracker])
    initial = learn.model.weight.detach().clone()
    raises(lambda: learn.fit(2), str(db), 'not a readable nbtrainer experiment database', 'corrupt')
    assert learn.step == 0 and torch.equal(learn.model.weight, initial) and tracker._con is None  # closed again


def test_a_deleted_wal_or_shm_reads_as_the_last_checkpoint(tmp_path):
    db = tmp_path / 'live' / 'experiments.db'
    synth_learner(cbs=[Tracker(db, notes='merged')]).fit(1)
    keep = sqlite3.connect(db)  # another process's open connection: the next run stays in the WAL, not merged
    keep.execute('SELECT count(*) FROM runs').fetchone()
    synth_learner(cbs=[Tracker(db, notes='in the wal')]).fit(1)
    assert (tmp_path / 'live' / 'experiments.db-wal').stat().st_size > 0
    for lost in ('-wal', '-shm'):  # what a copy of the folder, or a cleanup, could leave
        copy = tmp_path / f'without{lost}'
        shutil.copytree(tmp_path / 'live', copy)
        (copy / f'experiments.db{lost}').unlink()
        if lost == '-wal':
            (copy / 'experiments.db-shm').unlink()  # a WAL deleted with its index
        notes = [r.notes for r in runs(copy / 'experiments.db')]
        assert notes == (['merged'] if lost == '-wal' else ['in the wal', 'merged'])
        synth_learner(cbs=[Tracker(copy / 'experiments.db', notes='after')]).fit(1)  # and it takes new runs
        assert runs(copy / 'experiments.db')[0].notes == 'after'
    keep.close()


class FullAt(Callback):
    "At the evaluation at `step`, cap the Tracker's database at the pages it has (what SQLite does on a full disk)."

    order = Order.WRITE - 1

    def __init__(self, tracker, step):
        self.tracker, self.step = tracker, step

    def after_eval(self):
        if self.learn.step == self.step:
            con = self.tracker._con
            con.execute(f"PRAGMA max_page_count = {con.execute('PRAGMA page_count').fetchone()[0]}")
            try:  # fill the pages it has, as the other files on a disk fill it
                for seq in range(10**6):
                    con.execute("INSERT INTO evals VALUES (-1, ?, NULL, 'filler')", (seq,))
            except sqlite3.OperationalError as e:
                assert e.sqlite_errorname == 'SQLITE_FULL'


def test_a_full_disk_during_a_fit_warns_and_trains_on(tmp_path):
    db = tmp_path / 'experiments.db'
    tracker = Tracker(db)
    learn = synth_learner(cbs=[tracker, FullAt(tracker, 8)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        learn.fit(4)
    reference = synth_learner()
    reference.fit(4)
    assert same_weights(learn.model, reference.model) and learn.fit_outcome == 'finished'
    stopped = [str(w.message) for w in caught if 'stopped recording' in str(w.message)]
    assert len(stopped) == 1 and str(db) in stopped[0] and 'disk holding it is full' in stopped[0], stopped
    (run,) = runs(db)
    assert [r['step'] for r in run.history] == [4] and run.status == 'running'  # it wrote nothing more
    assert runs(db, stale_after=0)[0].status == 'died'
    assert tracker.state_dict() == {}  # a resume would not continue a run it stopped recording


def unshare_works(tmp_path):
    probe = tmp_path / 'probe'
    probe.mkdir()
    try:
        done = subprocess.run(
            ['unshare', '-rm', 'sh', '-c', f'mount -t tmpfs -o size=64k tmpfs {probe}'], capture_output=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def in_namespace(tmp_path, mount, code):
    "Run `code` (Python) after the shell command `mount`, in a user and mount namespace: the mount is its alone."
    script = tmp_path / 'child.py'
    script.write_text(textwrap.dedent(code))
    done = subprocess.run(
        ['unshare', '-rm', 'sh', '-c', f'{mount} && exec {sys.executable} {script}'],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT / 'tests')),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_read_only_filesystem_is_read_and_refused_clearly(tmp_path):
    if not unshare_works(tmp_path):
        pytest.skip('needs unshare -rm (user and mount namespaces) for a read-only mount')
    home = tmp_path / 'ro'
    db = train_registry(home)
    synth_learner(cbs=[Tracker(db, notes='second \x1b[2J')]).fit(1)
    before = snapshot(tmp_path)
    result = in_namespace(
        tmp_path,
        f'mount --bind {home} {home} && mount -o remount,ro,bind {home}',
        f'''
        import json, torch, warnings
        from pathlib import Path
        from nbtrainer import Tracker, runs
        from nbtrainer.testing import synth_learner
        from test_hostile_registry import make
        db = Path({str(db)!r})
        try: (db.parent / 'probe').write_text('x'); writable = True
        except OSError: writable = False
        found = runs(db)
        out = {{'writable': writable, 'notes': [r.notes for r in found], 'rows': len(found[1].history),
               'fork': found[1].fork(12)['fit_progress']['step']}}
        out['branch'] = [p.tolist() for p in found[1].fork(12, make).model.parameters()]
        try: found[0].note('changed'); out['note'] = None
        except PermissionError as e: out['note'] = str(e)
        learn = synth_learner(cbs=[Tracker(db)])
        initial = learn.model.weight.detach().clone()
        try: learn.fit(1); out['fit'] = None
        except PermissionError as e: out['fit'] = str(e)
        out['untouched'] = learn.step == 0 and bool(torch.equal(learn.model.weight, initial))
        print(json.dumps(out))
    ''',
    )
    assert result['writable'] is False  # really read-only, for root too
    assert result['notes'] == ['second \x1b[2J', ''] and result['rows'] == 4 and result['fork'] == 12
    reference = runs(db)[1].fork(12, make)
    assert [p.tolist() for p in reference.model.parameters()] == result['branch']
    for refused in (result['note'], result['fit']):
        assert f'{db} is read-only' in refused and 'can read it' in refused
    assert result['untouched']
    assert snapshot(tmp_path, leave_out=[tmp_path / 'child.py']) == before


def test_a_full_disk_is_read_and_refused_clearly(tmp_path):
    if not unshare_works(tmp_path):
        pytest.skip('needs unshare -rm (user and mount namespaces) to mount a small tmpfs')
    disk = tmp_path / 'disk'
    disk.mkdir()
    result = in_namespace(
        tmp_path,
        f'mount -t tmpfs -o size=1m tmpfs {disk}',
        f'''
        import json, warnings
        from pathlib import Path
        from nbtrainer import Callback, Order, Tracker, runs
        from nbtrainer.testing import same_weights, synth_learner
        from nbtrainer.experiments import main
        db = Path({str(disk)!r}) / 'experiments.db'
        synth_learner(cbs=[Tracker(db, notes='before')]).fit(2)

        def fill():
            with open(db.parent / 'filler', 'ab', buffering=0) as f:
                try:
                    while True: f.write(b'x' * 4096)
                except OSError: pass

        class Fill(Callback):
            order = Order.WRITE - 1
            def after_eval(self):
                if self.learn.step == 4: fill()

        learn = synth_learner(cbs=[Tracker(db, notes='filled'), Fill()])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            learn.fit(3)
        reference = synth_learner()
        reference.fit(3)
        out = {{'same': same_weights(learn.model, reference.model), 'warnings': [str(w.message) for w in caught
                                                                              if 'Tracker' in str(w.message)]}}
        found = runs(db)
        out['notes'], out['rows'] = [r.notes for r in found], [len(r.history) for r in found]
        learn = synth_learner(cbs=[Tracker(db, notes='on a full disk')])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            try: learn.fit(2)
            except OSError as e: out['next'] = [str(e), learn.step]
            else:
                reference = synth_learner()
                reference.fit(2)
                out['next'] = [same_weights(learn.model, reference.model)]
        out['next_warnings'] = [str(w.message) for w in caught if 'Tracker' in str(w.message)]
        print(json.dumps(out))
    ''',
    )
    assert result['same']  # the fit trained on
    assert len(result['warnings']) == 1 and 'disk holding it is full' in result['warnings'][0], result['warnings']
    assert result['notes'] == ['filled', 'before'] and result['rows'] in ([0, 2], [1, 2])  # read on the full disk
    # another fit on the full disk: refused before its first step, or it warns once and trains on
    if len(result['next']) == 2:
        assert 'disk holding it is full' in result['next'][0] and result['next'][1] == 0
    else:
        assert result['next'] == [True] and len(result['next_warnings']) == 1


def test_the_command_line_refuses_bad_input_and_prints_no_control_characters(tmp_path):
    script = str(BIN / 'nbtrainer-runs')
    run = lambda *args: warm.run([script, *map(str, args)], capture_output=True, text=True, timeout=120)
    missing = run(tmp_path / 'no' / 'such' / 'folder' / 'deep' / 'runs.db')
    assert missing.returncode == 2 and 'no experiment database at' in missing.stderr
    assert 'Traceback' not in missing.stderr
    db = tmp_path / 'runs.db'
    synth_learner(cbs=[Tracker(db, study='s\x1b]0;pwned\x07', notes='\x1b[2J\x1b[31mred\u202e')]).fit(1)
    shown = run(db)
    assert shown.returncode == 0, shown.stderr
    assert '\\x1b[2J\\x1b[31mred\\u202e' in shown.stdout and 's\\x1b]0;pwned\\x07' in shown.stdout
    assert not any(c in shown.stdout for c in '\x1b\x07\u202e')
    for value in ('nan', '-1', 'soon'):
        bad = run(db, '--stale-after', value)
        assert bad.returncode == 2 and '--stale-after' in bad.stderr and 'seconds >= 0' in bad.stderr, bad.stderr
    assert run(db, '--stale-after', 'inf').returncode == 0
    raises(lambda: runs(db, stale_after=float('nan')), 'stale_after must be a number of seconds >= 0')
    raises(lambda: runs(db, stale_after=-1), 'stale_after must be')
