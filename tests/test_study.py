"""Studies across processes: 8 trials of a seeded study in 2 worker processes on one registry, both killed mid-trial,
then the study run again; against plain Optuna (parameters, pruning) and an uninterrupted study (every trial's values);
the plots drawn in a fresh process from the registry alone."""

import json, shutil, signal, subprocess, sys

import pytest
import torch

optuna = pytest.importorskip('optuna')
from optuna.trial import TrialState

from conftest import ROOT
import warm
from nbtrainer.testing import same_history
from nbtrainer.experiments import runs
from study_worker import FIT, NAME, SEED, TRIALS, UPPER, study

WORKER = [sys.executable, str(ROOT / 'tests' / 'study_worker.py')]


STARTED = []  # the workers a test started: any still running when it ends is killed (a failed test leaves none)


@pytest.fixture(autouse=True)
def no_worker_left():
    yield
    for proc in STARTED:
        if proc.poll() is None:
            proc.kill()
    STARTED.clear()


def worker(db, kill=None):
    config = json.dumps({'db': str(db), 'kill': kill})
    STARTED.append(warm.Popen(WORKER + [config], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return STARTED[-1]


def ended(proc, timeout=600):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def plain_optuna(runs_by_trial):
    "Plain Optuna with the same sampler, seed and pruner, fed each trial's recorded values in turn: its trials."

    def objective(trial):
        trial.suggest_float('lr', 1e-3, 1.0, log=True)
        trial.suggest_float('weight_decay', 1e-6, 1e-2, log=True)
        trial.suggest_float('momentum', 0.5, 0.99)
        run = runs_by_trial[trial.number]
        for row in run.history:
            trial.report(row['valid_loss'], row['step'])
            if trial.should_prune():
                raise optuna.TrialPruned()
        return run.best['value']

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        sampler = optuna.samplers.QMCSampler(scramble=True, seed=SEED)
    plain = optuna.create_study(sampler=sampler, pruner=optuna.pruners.ThresholdPruner(upper=UPPER))
    plain.optimize(objective, n_trials=TRIALS)
    return plain.trials


@pytest.mark.slow
def test_a_study_in_two_processes_killed_and_resumed_ends_as_an_uninterrupted_one(tmp_path):
    torch.set_num_threads(1)
    straight = study(tmp_path / 'straight' / 'runs.db').run()  # the reference: one process, never interrupted

    db = tmp_path / 'shared' / 'runs.db'
    # each dies in a trial after a checkpoint: one mid-training, one before the study reported the evaluation to Optuna
    first, second = worker(db, kill={'step': 20}), worker(db, kill={'trial': 2})
    for proc in (first, second):
        code, err = ended(proc)
        assert code == -signal.SIGKILL, err[-3000:]
    resumed = study(db)  # the same study, read back by this process
    optuna_trials = resumed.optuna_study().trials
    killed = [t.number for t in optuna_trials if t.state == TrialState.RUNNING]
    assert len(killed) in (1, 2) and len(optuna_trials) <= TRIALS  # one process may have taken over the other's trial
    assert all(r.status == 'running' for r in resumed.runs() if r.config['trial'] in killed)  # no end was written

    procs = [worker(db), worker(db)]  # the study again, in two processes: the killed trials first, then the missing
    for proc in procs:
        code, err = ended(proc)
        assert code == 0, err[-3000:]

    # every trial once, in Optuna and in the registry, as in the uninterrupted study
    found, reference = resumed.runs(), straight.runs()
    assert [r.config['trial'] for r in found] == [r.config['trial'] for r in reference] == list(range(TRIALS))
    assert len(runs(db, study=NAME)) == TRIALS and len(resumed.optuna_study().trials) == TRIALS
    assert sum(r.resumes for r in found) == 2  # each kill: one resume, in the same run
    statuses = [r.status for r in found]
    assert set(statuses) == {'finished', 'pruned'}, statuses
    for run, ref in zip(found, reference):
        assert resumed.params(run) == straight.params(ref)
        assert (run.status, run.message, run.best) == (ref.status, ref.message, ref.best)
        assert same_history(run.history, ref.history)
        assert run.config == ref.config  # the parameters, the trial's number and seed, the space
        assert run.config['space'] == resumed.description()['space'] and run.study == NAME
        assert run.checkpoints.endswith(f'studies/{NAME}/trial-{run.config["trial"]}')
        if run.status == 'pruned':
            last = run.history[-1]
            assert last['valid_loss'] > UPPER
            assert run.message == f"pruned at step {last['step']}: valid_loss {last['valid_loss']:.4g}"
        else:
            assert run.history[-1]['step'] == FIT['steps'] and all(r['valid_loss'] <= UPPER for r in run.history)
    got, ref_trials = resumed.optuna_study().trials, straight.optuna_study().trials
    assert [(t.state, t.value, t.intermediate_values) for t in got] == [
        (t.state, t.value, t.intermediate_values) for t in ref_trials
    ]
    assert [t.user_attrs['run'] for t in got] == [r.id for r in found]

    # plain Optuna, same sampler, seed and pruner, fed the recorded values: the same parameters, pruned at the same step
    plain = plain_optuna(found)
    assert [t.params for t in plain] == [{k: resumed.params(r)[k] for k in plain[0].params} for r in found]
    outcomes = lambda trials: [(t.state, max(t.intermediate_values)) for t in trials]
    assert outcomes(plain) == outcomes(got)

    # the plots, in a fresh process, from the registry alone (Optuna's journal moved away)
    shutil.move(resumed.folder / 'optuna.journal', tmp_path / 'journal')
    png = {name: str(tmp_path / f'{name}.png') for name in ('isolation', 'params', 'curves')}
    script = (
        f'from nbtrainer.study import Study; s = Study({NAME!r}, db={str(db)!r}); '
        f"s.plot_isolation(path={png['isolation']!r}); s.plot_params(path={png['params']!r}); "
        f"s.plot_curves(path={png['curves']!r}); print(s.best.id); print(s.near_bounds()); print(repr(s))"
    )
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    best_id, edges, table = out.stdout.split('\n', 2)
    finished = [r for r in found if r.status == 'finished']
    assert int(best_id) == resumed.best.id == min(finished, key=lambda r: r.best['value']).id
    assert edges == str(resumed.near_bounds()) and table.strip() == repr(resumed)
    for path in png.values():
        assert open(path, 'rb').read(4) == b'\x89PNG'


def one_trial_job(db, name='ddp', stop=False):
    "What a torchrun job of a study runs: one trial, on every rank; each rank's Learner step at the end."
    import torch.distributed as dist
    from nbtrainer.study import Float, Study
    from nbtrainer.testing import synth_learner

    built = []

    def build(params):
        built.append(synth_learner(n=64, bs=16, lr=params['lr']))
        return built[-1]

    # 'ddp': every loss is above 0, so each trial is pruned at its first evaluation; 'ddp-stop': never pruned
    pruner = optuna.pruners.ThresholdPruner(upper=0.0) if name == 'ddp' else None
    study = Study(
        name,
        dict(lr=Float(1e-3, 0.1, log=True)),
        build,
        trials=2 if name == 'ddp' else 1,
        fit=dict(epochs=3),
        db=db,
        seed=1,
        pruner=pruner,
        display=False,
    )
    if stop and dist.get_rank() == 0:
        study.listeners.append(study.stop)  # Stop clicked on rank 0, in the trial
    study.run(trials=1)
    steps = [None] * dist.get_world_size()
    dist.all_gather_object(steps, [learn.step for learn in built])
    return steps


@pytest.mark.slow
@pytest.mark.distributed
def test_one_torchrun_job_per_trial(tmp_path):
    from nbtrainer.launcher import launch
    from nbtrainer.study import STOP_MESSAGE, Study

    db = tmp_path / 'runs.db'
    first, second = launch(one_trial_job, nprocs=2, args=(db,)), launch(one_trial_job, nprocs=2, args=(db,))
    assert first == second == [[2], [2]]  # rank 1 took rank 0's pruning decision: both stopped at the first evaluation
    study = Study('ddp', db=db)
    found = study.runs()
    assert [(r.config['trial'], r.status, r.config['world_size'], r.history[-1]['step']) for r in found] == [
        (0, 'pruned', 2, 2),
        (1, 'pruned', 2, 2),
    ]  # one registry run per trial, written by rank 0
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        sampler = optuna.samplers.QMCSampler(scramble=True, seed=1)
    plain = optuna.create_study(sampler=sampler)
    plain.optimize(lambda t: t.suggest_float('lr', 1e-3, 0.1, log=True), n_trials=2)
    assert [r.config['lr'] for r in found] == [t.params['lr'] for t in plain.trials]

    # Stop on rank 0: every rank ends the trial at the same evaluation; the next job resumes it on both ranks
    assert launch(one_trial_job, nprocs=2, args=(db, 'ddp-stop', True)) == [[2], [2]]
    (stopped,) = Study('ddp-stop', db=db).runs()
    assert (stopped.status, stopped.message, stopped.history[-1]['step']) == ('stopped', STOP_MESSAGE, 2)
    assert launch(one_trial_job, nprocs=2, args=(db, 'ddp-stop')) == [[6], [6]]
    (resumed,) = Study('ddp-stop', db=db).runs()
    assert (resumed.id, resumed.status, resumed.resumes, [r['step'] for r in resumed.history]) == (
        stopped.id,
        'finished',
        1,
        [2, 4, 6],
    )
