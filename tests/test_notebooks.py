"""The notebooks read as tutorials: prose and examples first, hidden edge-case tests gathered in a closing Tests section."""
import re

import nbformat
import pytest

from conftest import ROOT

NOTEBOOKS = sorted((ROOT / 'nbs').glob('*.ipynb'))


def hidden(cell): return cell.cell_type == 'code' and cell.source.lstrip().startswith('#| hide')


@pytest.mark.parametrize('path', NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_hidden_tests_close_the_notebook(path):
    cells = nbformat.read(path, as_version=4).cells
    tests = [i for i, c in enumerate(cells) if c.cell_type == 'markdown' and re.search(r'(?m)^## Tests\s*$', c.source)]
    hidden_tests = [i for i, c in enumerate(cells) if hidden(c)][1:]  # the first hidden cell sets the notebook up
    if not hidden_tests: return
    assert tests, f'{path.name}: hidden tests but no "## Tests" section'
    assert all(i > tests[-1] for i in hidden_tests), f'{path.name}: hidden test cells before its "## Tests" section'
    later = [c for c in cells[tests[-1] + 1:] if c.cell_type == 'markdown' and re.search(r'(?m)^## ', c.source)]
    assert not later, f'{path.name}: sections after "## Tests"'
