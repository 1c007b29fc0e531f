"""The notebooks are the docs: module notebooks read as tutorials (prose and examples first, hidden edge-case tests in a
closing Tests section), and every notebook is stored executed, so a reader sees its figures and tables without running it."""

import ast, functools, re

import nbformat
import pytest

from conftest import ROOT

# nbs/index.ipynb is a link to the quick start (../index.ipynb), there for nbdev's docs: each notebook is read once
MODULE_NOTEBOOKS = sorted(p for p in (ROOT / 'nbs').glob('*.ipynb') if not p.is_symlink())
ALL_NOTEBOOKS = sorted(
    p for p in (ROOT / 'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts and not p.is_symlink()
)
ALL_NOTEBOOKS += [ROOT / 'index.ipynb']
RERUN = 'python tools/run_notebooks.py {}'  # the tool that re-executes a notebook and saves it with its outputs

WIDGET = 'application/vnd.jupyter.widget-view+json'
STATIC = ('text/html', 'image/png', 'image/svg+xml', 'text/markdown', 'text/latex')


def ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def hidden(cell):
    return cell.cell_type == 'code' and cell.source.lstrip().startswith('#| hide')


@functools.cache
def read(path):
    return nbformat.read(path, as_version=4)  # once per notebook: the four checks below only read it


def code_cells(path):
    return [c for c in read(path).cells if c.cell_type == 'code']


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
    later = [c for c in cells[tests[-1] + 1 :] if c.cell_type == 'markdown' and re.search(r'(?m)^## ', c.source)]
    assert not later, f'{path.name}: sections after "## Tests"'


def shows_a_value(source):
    "Whether a cell ends in an expression whose value Jupyter displays (a name, attribute, subscript, literal...)."
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(('#', '%', '!'))]
    try:
        body = ast.parse('\n'.join(lines)).body
    except SyntaxError:
        return False
    if not body or not isinstance(body[-1], ast.Expr) or source.rstrip().endswith(';'):
        return False
    return not isinstance(
        body[-1].value, (ast.Call, ast.Await, ast.Constant)
    )  # calls may return None; strings are docs


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
    assert info.get('name') == 'python' and info.get('file_extension') == '.py', (
        f'{path.name}: run `{RERUN.format(path.relative_to(ROOT))}`'
    )


# The rhythm of fastai's notebooks (issue #33): every exported function and class has its `show_doc`; no run of
# markdown over 250 words before the code it leads to; at least 70% of the example cells (not hidden, not exported,
# not a show_doc) show an output; an export cell over 120 lines holds one function or class (a long class is one
# unit: the Learner is read top to bottom in one cell), its helpers in cells of their own, beside the prose that
# explains them. Every notebook passes all four; an internal helper is exported with `#| exporti` (out of
# `__all__`), so only the API needs its show_doc.
MOST_WORDS, LEAST_SHOWN, LONG_CELL = 250, 0.7, 120


def words(text):
    return len(re.findall(r"\w+(?:['’-]\w+)*", text))


def directives(cell):
    return set(re.findall(r'(?m)^#\|\s*([\w-]+)', cell.source))


def show_doc_only(cell):
    return all(line.startswith('show_doc(') for line in cell.source.strip().splitlines())


def exported_api(path):
    "The functions and classes the notebook exports (its module's `__all__`), or () for a notebook that exports none."
    found = re.search(r'(?m)^#\|\s*default_exp\s+([\w.]+)', '\n'.join(c.source for c in code_cells(path)))
    if not found or found.group(1) == '__init__':
        return ()
    module = ast.parse((ROOT / 'nbtrainer' / f'{found.group(1)}.py').read_text())
    listed = next(
        (
            ast.literal_eval(n.value)
            for n in module.body
            if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', None) == '__all__'
        ),
        [],
    )
    defined = {n.name for n in module.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return [name for name in listed if name in defined]


def definitions(cell):
    "The names of the functions and classes a code cell defines at its top level."
    code = '\n'.join(line for line in cell.source.splitlines() if not line.lstrip().startswith(('#|', '%', '!')))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [node.name for node in ast.parse(code).body if isinstance(node, kinds)]


def long_mixed_cells(cells):
    "The export cells of over `LONG_CELL` lines that define more than one function or class: {first name: lines}."
    exports = [c for c in cells if c.cell_type == 'code' and directives(c) & {'export', 'exporti'}]
    return {
        definitions(c)[0]: len(c.source.splitlines())
        for c in exports
        if len(c.source.splitlines()) > LONG_CELL and len(definitions(c)) > 1
    }


def rhythm_problems(path):
    "{check: what fails it} for the notebook at `path`."
    cells, problems = read(path).cells, {}
    sources = '\n'.join(c.source for c in cells if c.cell_type == 'code')
    undocumented = [n for n in exported_api(path) if not re.search(rf'show_doc\(\s*{re.escape(n)}\b', sources)]
    if undocumented:
        problems['show_doc'] = undocumented
    runs, run = [], 0
    for cell in cells:
        if cell.cell_type == 'markdown':
            run += words(cell.source)
        elif cell.cell_type == 'code':
            runs, run = runs + [run], 0
    if max(runs + [run]) > MOST_WORDS:
        problems['words'] = max(runs + [run])
    examples = [
        c
        for c in code_cells(path)
        if not directives(c) & {'hide', 'export', 'exports', 'exporti', 'default_exp'}
        and not show_doc_only(c)
        and c.source.strip()
    ]
    shown = sum(bool(c.outputs) for c in examples)
    if examples and shown < LEAST_SHOWN * len(examples):
        problems['outputs'] = f'{shown} of {len(examples)}'
    if long_mixed_cells(cells):
        problems['split'] = long_mixed_cells(cells)
    return problems


@pytest.mark.parametrize('path', ALL_NOTEBOOKS, ids=ids(ALL_NOTEBOOKS))
def test_rhythm(path):
    problems = rhythm_problems(path)
    assert not problems, (
        f"{path.relative_to(ROOT)} breaks the notebooks' rhythm: {problems} (show_doc: a `show_doc(name)` cell after "
        f'the export, or `#| exporti` for a helper no user calls; words: a run of markdown over {MOST_WORDS} words '
        f'before code; outputs: under {LEAST_SHOWN:.0%} of the example cells show an output; split: an export cell '
        f'over {LONG_CELL} lines defining several functions or classes)'
    )


def test_rhythm_checks_can_fail():
    "The checks find what they look for: a wall of words, silent examples, an export without its show_doc."
    cell = nbformat.v4.new_markdown_cell(' '.join(['word'] * (MOST_WORDS + 1)))
    assert words(cell.source) == MOST_WORDS + 1 and words("don't stop-words") == 2
    assert show_doc_only(nbformat.v4.new_code_cell('show_doc(Learner)\nshow_doc(Learner.fit)'))
    assert exported_api(ROOT / 'nbs' / '00_core.ipynb')[:1] == ['patch_to']
    helper = 'def helper():\n' + '    pass\n' * LONG_CELL
    mixed, unit = (nbformat.v4.new_code_cell(f'#| export\n{code}') for code in (helper + 'class Big: ...', helper))
    assert long_mixed_cells([mixed, unit]) == {'helper': LONG_CELL + 3}  # a long class or function alone is one unit
