"""A tiny study for tests/test_study_kills.py, in a process of its own, that can kill itself at any write it makes.

    python ask_kill_worker.py DB KILL_AT [FOLDER]
    python ask_kill_worker.py --serve        (lines of DB KILL_AT on stdin; see serve())

Every write the study makes to Optuna's storage (a trial made, a parameter, a value, a state, an attribute) and every
registry transaction counts as one place; with KILL_AT = k >= 0 the process SIGKILLs itself at the k-th, before that
write is made (so inside `ask` between the trial and its parameters, inside `tell`, inside a registry transaction's
BEGIN and COMMIT). It prints the number of places it passed, so the test knows how many there are.
"""

import contextlib, os, signal, sys

import torch

from nbtrainer import registry
from nbtrainer.study import Float, Int, Study
from nbtrainer.testing import synth_learner

NAME, TRIALS, FIT = 'kills', 3, dict(steps=4, eval_every=2)
SPACE = dict(lr=Float(1e-3, 0.3, log=True, role='scientific'), width=Int(1, 9))
WRITES = (
    'create_new_trial', 'set_trial_param', 'set_trial_state_values', 'set_trial_intermediate_value',
    'set_trial_user_attr', 'set_trial_system_attr', 'set_study_user_attr', 'set_study_system_attr',
)  # fmt: skip


class Places:
    "Counts the places a write is made; SIGKILLs this process at the `kill_at`-th."

    def __init__(self, kill_at):
        self.kill_at, self.passed = kill_at, 0

    def here(self):
        if self.passed == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        self.passed += 1


def study(db, folder=None):
    def build(params):
        return synth_learner(n=32, bs=8, lr=params['lr'] * params['width'] / 5)

    return Study(NAME, SPACE, build, trials=TRIALS, fit=FIT, db=db, folder=folder, seed=3, pruner=None, display=False)


def instrumented(places):
    "Count the study's storage writes (a journal's or a server's) and the registry's transactions as places (see above)."
    from optuna.storages import JournalStorage, RDBStorage

    for storage in (JournalStorage, RDBStorage):
        for name in WRITES:
            original = getattr(storage, name)

            def counted(self, *args, _original=original, **kwargs):
                places.here()
                return _original(self, *args, **kwargs)

            setattr(storage, name, counted)
    transaction = registry.transaction

    @contextlib.contextmanager
    def counted_transaction(con):
        with transaction(con):
            places.here()  # inside BEGIN ... COMMIT
            yield con

    for module in (registry, sys.modules['nbtrainer.track'], sys.modules['nbtrainer.experiments']):
        module.transaction = counted_transaction


def run(db, kill_at, folder=None):
    places = Places(kill_at)
    instrumented(places)
    study(db, folder).run()
    return places.passed


def serve():
    """Read `DB KILL_AT` lines; run each in a process forked from this one (everything imported once), and answer with
    its exit status and the places it passed: fifty kills cost fifty forks, not fifty interpreters."""
    import optuna, nbtrainer.study  # noqa: F401 - imported before the forks

    # and what a first study imports on its way: torch._dynamo at the first optimizer (torch's Optimizer.__init__), SciPy's
    # stats for Optuna's quasi-random sampler; 1.9 s each fork otherwise (2.07 s a run, 0.18 s with them, idle)
    import scipy.stats, torch._dynamo  # noqa: F401

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for line in sys.stdin:
        db, kill_at = line.split()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            passed = run(db, int(kill_at))
            os.write(write, str(passed).encode())
            os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read) as f:
            passed = f.read() or '-'
        print(os.waitstatus_to_exitcode(status), passed, flush=True)


if __name__ == '__main__':
    torch.set_num_threads(1)
    if sys.argv[1:] == ['--serve']:
        serve()
    else:  # DB KILL_AT [FOLDER]
        print(run(sys.argv[1], int(sys.argv[2]), *sys.argv[3:]))
