"""The notebooks are the docs: module notebooks read as tutorials (prose and examples first, hidden edge-case tests in a
closing Tests section), and every notebook is stored executed, so a reader sees its figures and tables without running it."""
import ast, functools, re

import nbformat
import pytest

from conftest import ROOT

MODULE_NOTEBOOKS = sorted((ROOT / 'nbs').glob('*.ipynb'))
ALL_NOTEBOOKS = sorted(p for p in (ROOT / 'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts) + [ROOT / 'index.ipynb']
RERUN = 'python tools/run_notebooks.py {}'  # the tool that re-executes a notebook and saves it with its outputs

WIDGET = 'application/vnd.jupyter.widget-view+json'
STATIC = ('text/html', 'image/png', 'image/svg+xml', 'text/markdown', 'text/latex')


def ids(paths): return [str(p.relative_to(ROOT)) for p in paths]
def hidden(cell): return cell.cell_type == 'code' and cell.source.lstrip().startswith('#| hide')
@functools.cache
def read(path): return nbformat.read(path, as_version=4)  # once per notebook: the four checks below only read it
def code_cells(path): return [c for c in read(path).cells if c.cell_type == 'code']


@pytest.mark.parametrize('path', MODULE_NOTEBOOKS, ids=ids(MODULE_NOTEBOOKS))
def test_hidden_tests_close_the_notebook(path):
    "Every module notebook ends with its edge cases: hidden test cells in a closing `## Tests` section."
    cells = read(path).cells
    tests = [i for i, c in enumerate(cells) if c.cell_type == 'markdown' and re.search(r'(?m)^## Tests\s*$', c.source)]
    assert tests, f'{path.name}: no "## Tests" section'
    hidden_cells = [i for i, c in enumerate(cells) if hidden(c)]
    before, after = [i for i in hidden_cells if i < tests[-1]], [i for i in hidden_cells if i > tests[-1]]
    assert len(before) <= 1, f'{path.name}: hidden test cells before its "## Tests" section'  # one may set it up
    assert after, f'{path.name}: no hidden test cell (#| hide) in its "## Tests" section'
    later = [c for c in cells[tests[-1] + 1:] if c.cell_type == 'markdown' and re.search(r'(?m)^## ', c.source)]
    assert not later, f'{path.name}: sections after "## Tests"'


def shows_a_value(source):
    "Whether a cell ends in an expression whose value Jupyter displays (a name, attribute, subscript, literal...)."
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(('#', '%', '!'))]
    try: body = ast.parse('\n'.join(lines)).body
    except SyntaxError: return False
    if not body or not isinstance(body[-1], ast.Expr) or source.rstrip().endswith(';'): return False
    return not isinstance(body[-1].value, (ast.Call, ast.Await, ast.Constant))  # calls may return None; strings are docs


@pytest.mark.parametrize('path', ALL_NOTEBOOKS, ids=ids(ALL_NOTEBOOKS))
def test_stored_with_outputs(path):
    cells = code_cells(path)
    rerun = RERUN.format(path.relative_to(ROOT))
    assert any(c.outputs for c in cells), f'{path.name} is stored without outputs: run `{rerun}`'
    silent = [c.source.splitlines()[-1] for c in cells if shows_a_value(c.source) and not c.outputs]
    assert not silent, f'{path.name}: cells that show a value are stored without it ({silent[:3]}): run `{rerun}`'


@pytest.mark.parametrize('path', ALL_NOTEBOOKS, ids=ids(ALL_NOTEBOOKS))
def test_stored_outputs_read_without_a_kernel(path):
    "No errors, and no live widget without a static form: a saved notebook would show 'Loading widget...' or `VBox(...)`."
    assert 'widgets' not in read(path).metadata, f'{path.name} stores widget state it does not need'
    for cell in code_cells(path):
        where = f'{path.name}, cell starting {cell.source.splitlines()[0][:60]!r}'
        for out in cell.outputs:
            assert out.output_type != 'error', f'{where}: stored error {out.ename}: {out.evalue}'
            assert 'Traceback (most recent call last)' not in out.get('text', ''), f'{where}: stored traceback'
            data = out.get('data', {})
            if WIDGET in data:
                assert any(k in data for k in STATIC), f'{where}: a live widget with no static form is stored'


@pytest.mark.parametrize('path', ALL_NOTEBOOKS, ids=ids(ALL_NOTEBOOKS))
def test_stored_with_the_language_jupyter_adds(path):
    "Jupyter adds `language_info` when it opens a notebook that lacks it, and the notebook opens as modified."
    info = read(path).metadata.get('language_info', {})
    assert info.get('name') == 'python' and info.get('file_extension') == '.py', f'{path.name}: run `{RERUN.format(path.relative_to(ROOT))}`'
