"""The registry on both back ends (the `registry` fixture: an SQLite file, and a database on a real PostgreSQL server the
tests start): the same behaviour, checked against the Learner's own history; run identity across registries (a
checkpoint resumed into another registry, registries merged by UUID, across back ends); a server's schema checked for
objects nbtrainer does not make; a password never shown."""

import warnings

import pytest

from conftest import BIN, EndAt
import warm
from nbtrainer import Checkpointer, Tracker, runs
from nbtrainer.experiments import merge
from nbtrainer.registry import connect, database_errors, location, transaction
from nbtrainer.testing import raises, same_history, synth_learner


def test_a_fit_is_a_run_with_the_learners_history(registry):
    db = registry()
    learn = synth_learner(cbs=[Tracker(db, study='s', notes='first', config={'data': 'v1'})])
    learn.fit(3)
    (run,) = runs(db)
    losses = [r['valid_loss'] for r in learn.recorder.history]
    assert run.history == learn.recorder.history and run.final == learn.recorder.history[-1]
    assert run.best == {'value': min(losses), 'step': learn.recorder.history[losses.index(min(losses))]['step']}
    assert (run.status, run.study, run.notes, run.config['data'], run.config['epochs']) == (
        'finished',
        's',
        'first',
        'v1',
        3,
    )
    assert len(run.uid) == 32 and run.resumes == 0
    run.note('edited').tag('x', 'y').untag('y')
    assert (runs(db)[0].notes, runs(db)[0].tags) == ('edited', ['x'])


def test_paging_and_the_study_filter(registry):
    db = registry()
    for study in ('a', 'b', 'a', 'b', 'a'):
        synth_learner(cbs=[Tracker(db, study=study)]).fit(1)
    page = runs(db, limit=2, offset=1)
    assert [r.id for r in page] == [4, 3] and page.total == 5 and 'runs 2 to 3 of 5' in str(page)
    assert [r.id for r in runs(db, study='a')] == [5, 3, 1] and runs(db, study='a', limit=1).total == 3
    out = warm.run([BIN / 'nbtrainer-runs', str(db), '--limit', '2'], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and 'runs 1 to 2 of 5' in out.stdout, out.stderr


def test_a_checkpoint_resumes_its_own_run_in_any_registry(registry, tmp_path):
    "Killed mid-fit and resumed: into the same registry, the same run; into another one, adopted by its UUID."
    db, folder = registry(), tmp_path / 'ckpt'
    straight = synth_learner()
    straight.fit(4)
    learn = synth_learner(cbs=[Tracker(db), Checkpointer(folder, keep_last=5, keep_best=0), EndAt(10, RuntimeError())])
    with pytest.raises(RuntimeError):
        learn.fit(4)
    (killed,) = runs(db)
    elsewhere = registry()  # another machine's registry, or a new one: it has never seen the run
    resumed = synth_learner(cbs=[Tracker(elsewhere), Checkpointer(folder, keep_last=5, keep_best=0)])
    with pytest.warns(UserWarning, match='is recorded there now as run 1'):
        resumed.fit(4, resume=True)
    (adopted,) = runs(elsewhere)
    assert adopted.uid == killed.uid and adopted.status == 'finished' and adopted.resumes == 1
    assert same_history(adopted.history, straight.recorder.history)
    again = synth_learner(cbs=[Tracker(db), Checkpointer(folder, keep_last=5, keep_best=0)])
    again.fit(5, resume=True)  # back in the first registry: its own run goes on, found by its UUID
    (same,) = runs(db)
    assert same.uid == killed.uid and same.resumes == 1 and len(same.history) == 5


@pytest.mark.parametrize('direction', ['into a file', 'into a server'])
def test_registries_merge_by_uuid_across_back_ends(postgres_server, tmp_path, direction):
    file, server = tmp_path / 'laptop' / 'runs.db', postgres_server.database()
    into, source = (file, server) if direction == 'into a file' else (server, file)
    for db, notes in ((into, 'only into'), (source, 'only source'), (into, 'into again')):
        synth_learner(cbs=[Tracker(db, notes=notes)]).fit(2)
    branch_parent = runs(source)[0]
    learn = synth_learner(fork_points=2, cbs=[Tracker(source, notes='a branch')])
    learn.fit(2)
    learn.fork(4)
    learn.fit(2, lr=0.01)
    assert merge(into, source) == (3, 0)
    merged = runs(into)
    assert len(merged) == 5 and len({r.uid for r in merged}) == 5
    by_uid = {r.uid: r for r in merged}
    for r in runs(source):
        assert by_uid[r.uid].history == r.history and by_uid[r.uid].notes == r.notes
    branch = next(r for r in merged if r.parent is not None)
    assert branch.parent['uid'] == next(r.uid for r in runs(source) if r.parent is None and r.notes == 'a branch')
    assert by_uid[branch.parent['uid']].id == branch.parent['run']  # renumbered to its id here
    assert merge(into, source) == (0, 0) and branch_parent.uid in by_uid
    third = tmp_path / 'third' / 'runs.db'  # the command line: each source in turn, into a new file
    out = warm.run(
        [BIN / 'nbtrainer-runs', 'merge', str(third), str(into), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and ': 5 runs added, 0 updated' in out.stdout and ': 0 runs added' in out.stdout, (
        out.stderr
    )
    assert sorted(r.uid for r in runs(third)) == sorted(r.uid for r in merged)


def test_a_server_with_objects_nbtrainer_does_not_make_is_refused(postgres_server):
    import psycopg

    for sql in (
        'CREATE FUNCTION nbtrainer.wipe() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN DELETE FROM nbtrainer.evals; '
        'RETURN NEW; END $$',
        'CREATE VIEW nbtrainer.everything AS SELECT * FROM nbtrainer.runs',
        'CREATE TABLE nbtrainer.extra (x INTEGER)',
        'ALTER TABLE nbtrainer.runs ADD COLUMN extra TEXT',
    ):
        url = postgres_server.database()
        synth_learner(cbs=[Tracker(url)]).fit(1)
        with psycopg.connect(url, autocommit=True) as con:
            con.execute(sql)
        for call in (lambda: runs(url), lambda: synth_learner(cbs=[Tracker(url)]).fit(1)):
            raises(call, url.split('@')[1], 'nbtrainer')
        assert len(psycopg.connect(url).execute('SELECT * FROM nbtrainer.runs').fetchall()) == 1


def test_a_readers_connection_cannot_write_and_a_password_is_never_shown(postgres_server):
    import psycopg

    url = postgres_server.database()
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(
            "CREATE ROLE ana LOGIN PASSWORD 'secret-pw'; GRANT ALL ON DATABASE " + url.rsplit('/', 1)[1] + ' TO ana'
        )
    with_password = url.replace('postgres@', 'ana:secret-pw@')
    synth_learner(cbs=[Tracker(url)]).fit(1)
    with psycopg.connect(url, autocommit=True) as con:
        con.execute('GRANT ALL ON SCHEMA nbtrainer TO ana; GRANT ALL ON ALL TABLES IN SCHEMA nbtrainer TO ana')
    assert 'secret-pw' not in str(location(with_password)) and 'ana:***@' in f'{location(with_password)}'
    assert len(runs(with_password)) == 1
    with pytest.raises(PermissionError) as refused:
        con = connect(with_password, readonly=True)
        with database_errors(location(with_password)), transaction(con):
            con.execute("UPDATE runs SET notes = 'changed'")
    assert 'secret-pw' not in str(refused.value) and 'read-only' in str(refused.value)
    port = int(with_password.split(':')[3].split('/')[0])
    wrong = with_password.replace('secret-pw', 'wrong-pw').replace(f':{port}/', f':{port + 1}/')  # no server there
    with pytest.raises(OSError) as refused:
        runs(wrong)
    assert 'wrong-pw' not in str(refused.value) and 'cannot be reached, or refused' in str(refused.value)
    out = warm.run([BIN / 'nbtrainer-runs', wrong], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and 'wrong-pw' not in out.stderr + out.stdout


def test_a_run_on_a_server_forks_from_its_recorded_folder(postgres_server, tmp_path):
    url = postgres_server.database()
    learn = synth_learner(cbs=[Tracker(url), Checkpointer(tmp_path / 'ckpt', every_eval=True, keep_best=0)])
    learn.fit(3)
    (run,) = runs(url)
    assert run.checkpoints == str((tmp_path / 'ckpt').resolve())  # absolute: a server has no folder
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        branch = run.fork(8, lambda: synth_learner(cbs=[Tracker(url)]))
    branch.fit(3, lr=0.01)
    assert runs(url)[0].parent == {'run': run.id, 'step': 8, 'uid': run.uid}


def test_pictures_go_beside_a_registry_file_and_a_server_says_once_it_keeps_none(registry, tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.chdir(tmp_path)  # a server registry writes nothing anywhere: not even here
    db = registry()
    image = np.zeros((4, 5, 3), dtype=np.uint8)
    tracker = Tracker(db)
    learn = synth_learner(cbs=[tracker])
    learn.fit(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for step in (1, 2, 3):
            tracker.log_image('sample', image, step)
    said = [str(w.message) for w in caught if 'keeps no pictures' in str(w.message)]
    if isinstance(db, str):  # a server URL
        assert len(said) == 1 and 'TensorBoard and MLflow do' in said[0], said
        assert list(tmp_path.iterdir()) == []
    else:
        assert said == []
        folder = db.with_name(db.stem + '-images') / tracker.uid
        assert sorted(p.name for p in folder.iterdir()) == ['sample-1.png', 'sample-2.png', 'sample-3.png']


def _connect_at(url, barrier, answers):
    barrier.wait()  # all connect at once
    try:
        connect(url, create=True).close()
        answers.put('ok')
    except Exception as e:
        answers.put(f'{type(e).__name__}: {e}')


def test_processes_that_make_a_new_registry_at_once_all_succeed(registry):
    # server: each waited for the creator's lock inside a transaction begun before the tables existed, and made them
    # again (DuplicateTable: 20 rounds of 20 failed so before the lock was taken outside the transaction). File: the
    # first maker switched the file to WAL in place, and the others found its rollback journal or the file locked (29
    # rounds of 30, six processes, failed so before the file was made aside and renamed into place whole)
    import multiprocessing

    fork = multiprocessing.get_context('fork')
    for _ in range(3):
        db, barrier, answers = registry(), fork.Barrier(6), fork.Queue()
        workers = [fork.Process(target=_connect_at, args=(db, barrier, answers)) for _ in range(6)]
        for w in workers:
            w.start()
        said = [answers.get(timeout=120) for _ in workers]
        for w in workers:
            w.join(timeout=120)
        assert said == ['ok'] * 6, said
        if not isinstance(db, str):  # the file's makers leave nothing else behind
            assert [p.name for p in db.parent.iterdir()] == ['runs.db']
