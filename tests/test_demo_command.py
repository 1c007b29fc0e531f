"""The main job as a user runs it: the `nbtrainer-demo` command in a subprocess."""

import csv, subprocess

import pytest

from conftest import BIN

pytestmark = pytest.mark.slow  # the command in a subprocess: a fresh interpreter, torch and scikit-learn


def test_demo_trains_and_writes_plot_and_csv(tmp_path):
    run = subprocess.run(
        [str(BIN / 'nbtrainer-demo'), '--epochs', '6', '--out', str(tmp_path / 'digits')],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    # its output is a pipe, not a terminal: no bars, a plain line per evaluation, and no control character
    assert 'Fit started' in run.stdout and 'valid_loss=' in run.stdout and 'Fit finished' in run.stdout
    assert not any(c in run.stdout + run.stderr for c in '\r\x1b\b')
    assert 'valid accuracy' in run.stdout
    rows = list(csv.DictReader(open(tmp_path / 'digits' / 'history.csv')))
    assert [int(r['epoch']) for r in rows] == list(range(6))
    assert {'train_loss', 'valid_loss', 'accuracy', 'f1_macro', 'lr', 'time', 'step'} <= set(rows[0])
    assert float(rows[-1]['accuracy']) > 0.9
    assert (tmp_path / 'digits' / 'history.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_demo_rejects_bad_arguments(tmp_path):
    run = subprocess.run(
        [str(BIN / 'nbtrainer-demo'), '--lr', '-1', '--out', str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode != 0 and 'lr must be a finite number > 0' in run.stderr
