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
