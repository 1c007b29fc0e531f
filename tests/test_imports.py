"""`import nbtrainer` stays light: no UI, plotting or logging library is imported until something displays or logs."""

import subprocess, sys

HEAVY = ('matplotlib', 'ipywidgets', 'tqdm.auto', 'tqdm.notebook', 'tensorboard', 'IPython', 'sklearn', 'mlflow')


def modules_after(code):
    "Modules that `code` imports beyond what `import torch` already did (torch itself imports plain tqdm)."
    script = 'import sys, torch; before = set(sys.modules); ' + code + '; print(" ".join(set(sys.modules) - before))'
    return set(subprocess.check_output([sys.executable, '-c', script], text=True, timeout=300).split())


def test_the_package_imports_no_ui():
    loaded = modules_after('import nbtrainer')
    assert not [m for m in HEAVY if m in loaded]
    assert {'nbtrainer.checkpoint', 'nbtrainer.control', 'nbtrainer.dashboard'} <= loaded  # every feature attached


def test_the_public_api():
    code = (
        'from nbtrainer import Learner, Callback, Checkpointer, CSVLogger, TensorBoardLogger, Controls, '
        'Dashboard, launch, MixedPrecision, GhostBatchNorm, ParamScheduler; '
        'assert all(callable(getattr(Learner, m)) for m in ("save", "load", "load_best", "resume", "lr_find", '
        '"fit_one_cycle", "evaluate", "profile", "probe", "fit_async"))'
    )
    modules_after(code)


def test_a_fit_outside_jupyter_imports_no_widgets():
    "Text bars (plain tqdm, which torch imports anyway); widget bars only in a Jupyter kernel."
    code = (
        'from nbtrainer import Learner; '
        'learn = Learner(torch.nn.Linear(2, 2), [(torch.randn(4, 2), torch.tensor([0, 1, 0, 1]))], device="cpu"); '
        'learn.fit(1)'
    )
    loaded = modules_after(code)
    assert not [m for m in HEAVY if m in loaded and m != 'matplotlib'], loaded  # the live figure's PNG file: matplotlib
