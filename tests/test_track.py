"""The experiment registry across processes, on SQLite and on a real PostgreSQL server (the `registry` fixture): killed, failed and stopped runs told apart; four concurrent writers;
kill-and-resume continuing the same run (Tracker and MLflow); one row under DDP; the command line; the notebook path
a real Jupyter server gives its kernel."""

import importlib.util, json, os, signal, subprocess, sys, urllib.request

import pytest
import torch.distributed as dist

from conftest import BIN, ROOT, EndAt, serve_jupyter
import warm
from nbtrainer import CancelFitException, MLflowLogger, Tracker, launch, runs
from nbtrainer.testing import same_history, synth_learner, wait_for

WORKER = [sys.executable, str(ROOT / 'tests' / 'track_worker.py')]


def worker(**cfg):
    return warm.Popen(WORKER + [json.dumps(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return err


@pytest.mark.slow  # a worker process killed mid-fit
def test_killed_failed_stopped_and_finished_runs_are_told_apart(registry):
    db = registry()
    synth_learner(cbs=[Tracker(db, notes='finished')]).fit(2)
    for error in (RuntimeError('out of memory'), CancelFitException('patience ran out'), KeyboardInterrupt()):
        try:
            synth_learner(cbs=[Tracker(db, notes=type(error).__name__), EndAt(6, error)]).fit(3)
        except (RuntimeError, KeyboardInterrupt):
            pass
    proc = worker(db=str(db), kill_at=6, eval_every=3, beat_every=0.2, name='killed')
    assert proc.wait(timeout=300) == -signal.SIGKILL
    # it wrote no status: with a generous threshold it still reads as running, then as died once its heartbeat is stale
    assert runs(db, stale_after=3600)[0].status == 'running'
    wait_for(lambda: runs(db, stale_after=1.0)[0].status == 'died', 'the killed run to read as died (its heartbeat '
             'stale for 1 s)', seen=lambda: runs(db, stale_after=1.0)[0].status, every=0.05)  # fmt: skip
    found = runs(db, stale_after=1.0)
    assert [(r.notes, r.status, r.message) for r in found] == [
        ('killed fit 0', 'died', None),
        ('KeyboardInterrupt', 'stopped', 'KeyboardInterrupt'),
        ('CancelFitException', 'stopped', 'patience ran out'),
        ('RuntimeError', 'failed', 'RuntimeError: out of memory'),
        ('finished', 'finished', None),
    ]
    killed = found[0]
    assert [r['step'] for r in killed.history] == [3, 6] and killed.ended is None and killed.best['step'] in (3, 6)
    assert all(r.ended is not None for r in found[1:])


@pytest.mark.slow  # four worker processes
def test_four_concurrent_writers_lose_nothing(registry, tmp_path):
    db, gate = registry(), tmp_path / 'go'
    # a new database (four processes race to create it); heartbeats every 5 ms on top of a row per step; tags edited
    procs = [
        worker(
            db=str(db),
            gate=str(gate),
            name=f'w{i}',
            study=f'w{i}',
            fits=3,
            epochs=2,
            eval_every=1,
            beat_every=0.005,
            tag=True,
        )
        for i in range(4)
    ]
    gate.write_text('go')
    errors = [finish(p) for p in procs]
    assert not [e for e in errors if 'locked' in e or 'Traceback' in e or 'heartbeat' in e], errors
    found = runs(db)
    assert len(found) == 12 and sorted(r.id for r in found) == list(range(1, 13))
    for i in range(4):
        mine = runs(db, study=f'w{i}')
        assert sorted(r.notes for r in mine) == [f'w{i} fit {f}' for f in range(3)]
        assert all(r.status == 'finished' and r.tags == [f'w{i}'] for r in mine)
        assert all([row['step'] for row in r.history] == list(range(1, 13)) for r in mine)  # 6 batches x 2 epochs
        histories = [[{k: v for k, v in row.items() if k != 'time'} for row in r.history] for r in mine]
        assert histories[0] == histories[1] == histories[2]  # the same seeded fit three times, every row there


@pytest.mark.slow  # three worker processes, one killed
def test_resume_after_sigkill_continues_the_same_run(registry, tmp_path):
    pytest.importorskip('mlflow')
    from mlflow.tracking import MlflowClient

    uri = f'sqlite:///{tmp_path}/mlflow.db'
    client = MlflowClient(uri)
    for name in ('straight', 'killed'):
        client.create_experiment(name, artifact_location=str(tmp_path / 'artifacts' / name))

    common = dict(eval_every=1, epochs=3, mlflow=uri, beat_every=0.2)
    straight_db, killed_db = registry(), registry()
    finish(
        worker(
            db=str(straight_db),
            experiment='straight',
            checkpoints=str(tmp_path / 'ckpt-straight'),
            out=str(tmp_path / 'straight.json'),
            **common,
        )
    )
    folder = str(tmp_path / 'ckpt-killed')
    proc = worker(db=str(killed_db), experiment='killed', checkpoints=folder, kill_at=9, **common)
    assert proc.wait(timeout=300) == -signal.SIGKILL
    (before,) = runs(killed_db, stale_after=3600)
    assert before.status == 'running' and [r['step'] for r in before.history] == list(
        range(1, 10)
    )  # 9 after the checkpoint at 8

    finish(
        worker(
            db=str(killed_db),
            experiment='killed',
            checkpoints=folder,
            resume=True,
            out=str(tmp_path / 'resumed.json'),
            **common,
        )
    )
    straight, resumed = runs(straight_db), runs(killed_db)
    assert len(resumed) == 1 and resumed[0].id == before.id  # the same run, no new one
    run, ref = resumed[0], straight[0]
    assert (run.status, run.resumes, run.message) == ('finished', 1, None)
    assert (
        same_history(run.history, ref.history) and len(run.history) == 18
    )  # rows 8 and 9 written once, by the resumed fit
    assert same_history(run.history, json.load(open(tmp_path / 'resumed.json')))
    assert run.best == ref.best and run.config == ref.config and run.final['step'] == 18

    # MLflow: one run, resumed in place, every series equal to the uninterrupted run's (no step logged twice)
    (s_run,), (k_run,) = (
        client.search_runs([client.get_experiment_by_name(n).experiment_id]) for n in ('straight', 'killed')
    )
    assert k_run.info.status == 'FINISHED' and k_run.data.params == s_run.data.params
    assert k_run.data.tags['nbtrainer.outcome'] == 'finished'
    keys = set(s_run.data.metrics)
    assert keys == set(k_run.data.metrics) and {'loss', 'lr', 'train_loss', 'valid_loss', 'accuracy'} <= keys
    series = lambda r, k: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, k))
    for key in keys:
        assert series(k_run, key) == series(s_run, key), key
    assert series(k_run, 'valid_loss') == [(r['step'], r['valid_loss']) for r in ref.history]
    artifacts = [a.path for a in client.list_artifacts(k_run.info.run_id, 'checkpoints')]
    assert artifacts == ['checkpoints/epoch-2.pt']  # the newest file of the resumed fit's Checkpointer


def ddp_fit(db, uri):
    cbs = [Tracker(db)] + ([MLflowLogger(uri, experiment='ddp', log_every=2)] if uri else [])
    learn = synth_learner(n=64, bs=8, cbs=cbs)
    learn.fit(2)
    return learn.recorder.history, [type(cb).__name__ for cb in learn.cbs] + [type(learn.strategy).__name__]


@pytest.mark.distributed
@pytest.mark.skipif(not dist.is_available() or sys.platform != 'linux', reason='needs torch.distributed and fork')
def test_ddp_writes_one_run(registry, tmp_path):
    has_mlflow = importlib.util.find_spec('mlflow') is not None
    db, uri = registry(), f'sqlite:///{tmp_path}/mlflow.db' if has_mlflow else None
    if has_mlflow:
        from mlflow.tracking import MlflowClient

        MlflowClient(uri).create_experiment('ddp', artifact_location=str(tmp_path / 'artifacts'))
    history, cbs = launch(ddp_fit, nprocs=2, args=(db, uri))  # rank 0's
    assert 'Tracker' in cbs and cbs[-1] == 'DistributedTrainer'  # the strategy, which the loop calls (no callback)
    (run,) = runs(db)
    assert run.status == 'finished' and run.config['world_size'] == 2 and run.history == history
    if not has_mlflow:
        return
    client = MlflowClient(uri)
    mruns = client.search_runs([client.get_experiment_by_name('ddp').experiment_id])
    assert len(mruns) == 1 and mruns[0].data.params['world_size'] == '2'
    assert sorted((m.step, m.value) for m in client.get_metric_history(mruns[0].info.run_id, 'valid_loss')) == [
        (r['step'], r['valid_loss']) for r in history
    ]


def test_command_line(tmp_path):
    script = BIN / 'nbtrainer-runs'
    assert script.exists(), "the nbtrainer-runs script is missing: reinstall the package (pip install -e '.[dev]')"
    db = tmp_path / 'runs.db'
    for study in ('a', 'b'):
        synth_learner(cbs=[Tracker(db, study=study, notes=f'study {study}')]).fit(1)
    run = subprocess.run([str(script), str(db), '--study', 'b'], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split()[:3] == ['id', 'study', 'status'] and len(lines) == 3
    assert lines[2].split()[:3] == ['2', 'b', 'finished'] and lines[2].endswith('study b')
    (tmp_path / 'junk.db').write_text('junk' * 1000)
    bad = warm.run([str(script), str(tmp_path / 'junk.db')], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and 'not a readable nbtrainer experiment database' in bad.stderr
    missing = warm.run([str(script), str(tmp_path / 'none.db')], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and 'no experiment database at' in missing.stderr


@pytest.mark.kernel
def test_the_notebook_path_from_a_real_jupyter_server(tmp_path):
    "A kernel started by jupyter_server for a notebook session (as JupyterLab starts one) knows its notebook."
    from jupyter_client import BlockingKernelClient

    (tmp_path / 'sub').mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log = open(tmp_path / 'server.log', 'w')
    server, port = serve_jupyter(
        'server', tmp_path, ['--ServerApp.password=', '--ServerApp.disable_check_xsrf=True'], env, log
    )
    runtime = tmp_path / '.runtime'
    client = None
    try:
        api = f'http://127.0.0.1:{port}/api'

        def up():
            assert server.poll() is None, (tmp_path / 'server.log').read_text()[-3000:]
            try:
                return urllib.request.urlopen(f'{api}/status', timeout=2).status == 200
            except OSError:
                return False

        wait_for(up, 'the jupyter server to answer', every=0.1)
        # the request JupyterLab makes when a notebook opens: its path from the server root, and its name
        body = json.dumps(
            {'path': 'sub/trial.ipynb', 'name': 'trial.ipynb', 'type': 'notebook', 'kernel': {'name': 'python3'}}
        )
        request = urllib.request.Request(
            f'{api}/sessions', data=body.encode(), method='POST', headers={'Content-Type': 'application/json'}
        )
        kernel_id = json.load(urllib.request.urlopen(request, timeout=60))['kernel']['id']
        connection = runtime / f'kernel-{kernel_id}.json'
        wait_for(connection.exists, f'the kernel connection file {connection}', every=0.05)
        client = BlockingKernelClient(connection_file=str(connection))
        client.load_connection_file()
        # no heartbeat channel: its 1 s time-to-dead reads a kernel busy starting on a loaded machine as dead; the
        # kernel_info replies wait_for_ready reads, with its deadline, say it is alive
        client.start_channels(hb=False)
        client.wait_for_ready(timeout=120)
        printed = []
        client.execute_interactive(
            'from nbtrainer.track import reproduce_command; print(reproduce_command())',
            timeout=120,
            output_hook=lambda m: printed.append(m['content'].get('text', '')),
        )
        assert ''.join(printed).strip() == f"jupyter execute {tmp_path / 'sub' / 'trial.ipynb'}"
    finally:
        if client is not None:
            client.stop_channels()
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
