"""Core stays light: no UI or plotting library is imported until something displays."""
import subprocess, sys

HEAVY = ('matplotlib', 'ipywidgets', 'tqdm.auto', 'tqdm.notebook', 'tensorboard', 'IPython', 'sklearn')


def modules_after(code):
    "Modules that `code` imports beyond what `import torch` already did (torch itself imports plain tqdm)."
    script = ('import sys, torch; before = set(sys.modules); ' + code +
              '; print(" ".join(set(sys.modules) - before))')
    return set(subprocess.check_output([sys.executable, '-c', script], text=True).split())


def test_core_imports_no_ui():
    loaded = modules_after('import nbtrainer.core, nbtrainer.metrics, nbtrainer.progress, nbtrainer.plotting, '
                           'nbtrainer.amp, nbtrainer.gradients, nbtrainer.checkpoint, nbtrainer.loggers, '
                           'nbtrainer.evaluate, nbtrainer.diagnose, nbtrainer.layers')
    assert not [m for m in HEAVY if m in loaded]


def test_progress_bars_are_imported_only_when_a_fit_starts():
    code = ('from nbtrainer.core import Learner; '
            'learn = Learner(torch.nn.Linear(2, 2), [(torch.randn(4, 2), torch.tensor([0, 1, 0, 1]))], device="cpu")')
    assert 'tqdm.auto' not in modules_after(code)
    assert 'tqdm.auto' in modules_after(code + '; learn.fit(1)')
