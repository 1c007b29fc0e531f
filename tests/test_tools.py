"""The test command's own tools: tools/test_notebooks.py runs each notebook in a process of its own and reports every
failure (tools/test.sh's notebook stage)."""

import subprocess, sys

import nbformat, pytest

from conftest import ROOT


def notebook(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return str(path)


@pytest.mark.slow
def test_each_notebook_runs_alone_and_every_failure_is_reported(tmp_path):
    # torch is imported before the forks: what one notebook attaches to it must not reach the next
    first = notebook(tmp_path / 'a_attaches.ipynb', 'import torch\ntorch.ATTACHED = 1', 'assert torch.ATTACHED == 1')
    second = notebook(tmp_path / 'b_fresh.ipynb', "import torch\nassert not hasattr(torch, 'ATTACHED')")
    failing = notebook(tmp_path / 'c_fails.ipynb', 'x = 1', "assert x == 2, 'a failing cell'")
    skipped = notebook(tmp_path / 'd_skips.ipynb', '#| notest\nraise RuntimeError("a cell nbdev skips")')
    run = subprocess.run(
        [sys.executable, str(ROOT / 'tools' / 'test_notebooks.py'), '-j', '1', first, second, failing, skipped],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = run.stdout.splitlines()
    assert run.returncode == 1, run.stdout + run.stderr
    for name, word in (('a_attaches', 'ok  '), ('b_fresh', 'ok  '), ('c_fails', 'FAIL'), ('d_skips', 'ok  ')):
        assert any(line.startswith(word) and name in line for line in lines), (name, run.stdout)
    assert 'a failing cell' in run.stdout
    assert [line for line in lines if line.startswith('failed: ')] == [f'failed: {failing} (run: nbdev-test {failing})']


def test_the_long_test_files_are_collected_first():
    "conftest's order: files with `slow` tests, then process-group, kernel and browser ones, then the rest, each whole."
    run = subprocess.run(
        [sys.executable, '-m', 'pytest', 'tests', '--collect-only', '-q', '-p', 'no:cacheprovider'],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    files = [line.split('::')[0] for line in run.stdout.splitlines() if '::' in line]
    order = list(dict.fromkeys(files))
    assert len(order) == len(set(order)), 'a file split in two'  # each file's tests together
    sources = {f: (ROOT / f).read_text() for f in order}
    rank = [
        0
        if 'mark.slow' in sources[f]
        else 1
        if any(f'mark.{m}' in sources[f] for m in ('ui', 'kernel', 'distributed'))
        else 2
        for f in order
    ]
    assert rank == sorted(rank), list(zip(order, rank))
