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


def closing_problem(nb):
    "What keeps a module notebook's edge cases from closing it in hidden cells of a `## Tests` section, or None."
    cells = nb.cells
    tests = [i for i, c in enumerate(cells) if c.cell_type == 'markdown' and re.search(r'(?m)^## Tests\s*$', c.source)]
    if not tests:
        return 'no "## Tests" section'
    hidden_cells = [i for i, c in enumerate(cells) if hidden(c)]
    before, after = [i for i in hidden_cells if i < tests[-1]], [i for i in hidden_cells if i > tests[-1]]
    if len(before) > 1:  # one may set it up
        return 'hidden test cells before its "## Tests" section'
    if not after:
        return 'no hidden test cell (#| hide) in its "## Tests" section'
    later = [c for c in cells[tests[-1] + 1 :] if c.cell_type == 'markdown' and re.search(r'(?m)^## ', c.source)]
    return 'sections after "## Tests"' if later else None


@pytest.mark.parametrize('path', MODULE_NOTEBOOKS, ids=ids(MODULE_NOTEBOOKS))
def test_hidden_tests_close_the_notebook(path):
    "Every module notebook ends with its edge cases: hidden test cells in a closing `## Tests` section."
    problem = closing_problem(read(path))
    assert problem is None, f'{path.name}: {problem}'


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


def unshown_values(nb):
    "The last lines of the cells that show a value and are stored without it (all of them if nothing is stored)."
    cells = [c for c in nb.cells if c.cell_type == 'code']
    if not any(c.outputs for c in cells):
        return [c.source.splitlines()[-1] for c in cells if c.source.strip()] or ['(no output at all)']
    return [c.source.splitlines()[-1] for c in cells if shows_a_value(c.source) and not c.outputs]


@pytest.mark.parametrize('path', ALL_NOTEBOOKS, ids=ids(ALL_NOTEBOOKS))
def test_stored_with_outputs(path):
    silent = unshown_values(read(path))
    assert not silent, (
        f'{path.name}: cells that show a value are stored without it ({silent[:3]}): '
        f'run `{RERUN.format(path.relative_to(ROOT))}`'
    )


def unreadable_outputs(nb):
    "Stored outputs a reader without a kernel cannot read: errors, tracebacks, live widgets with no static form."
    found = ['widget state in the metadata'] if 'widgets' in nb.metadata else []
    for cell in (c for c in nb.cells if c.cell_type == 'code'):
        where = f'cell starting {cell.source.splitlines()[0][:60]!r}' if cell.source else 'an empty cell'
        for out in cell.outputs:
            if out.output_type == 'error':
                found.append(f'{where}: stored error {out.ename}: {out.evalue}')
            elif 'Traceback (most recent call last)' in out.get('text', ''):
                found.append(f'{where}: stored traceback')
            elif WIDGET in out.get('data', {}) and not any(k in out['data'] for k in STATIC):
                found.append(f'{where}: a live widget with no static form is stored')
    return found


@pytest.mark.parametrize('path', ALL_NOTEBOOKS, ids=ids(ALL_NOTEBOOKS))
def test_stored_outputs_read_without_a_kernel(path):
    "No errors, and no live widget without a static form: a saved notebook would show 'Loading widget...' or `VBox(...)`."
    problems = unreadable_outputs(read(path))
    assert not problems, f'{path.name}: {problems}'


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


def runs(cell):
    "Whether a code cell runs as the notebook runs (nbdev-test and the docs skip `#| eval: false`)."
    return not re.search(r'(?m)^#\|\s*eval:\s*false', cell.source)


def parsed(cell):
    "A code cell's module node, its directives and magics left out (a cell that does not parse has no nodes)."
    code = '\n'.join(line for line in cell.source.splitlines() if not line.lstrip().startswith(('#|', '%', '!')))
    try:
        return ast.parse(code)
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def patched(node):
    "Whether a definition is attached to a class by `@patch_to(...)` (a method, documented as `show_doc(Class.name)`)."
    return any(isinstance(d, ast.Call) and getattr(d.func, 'id', None) == 'patch_to' for d in node.decorator_list)


def exported_api(nb):
    "The public functions and classes of the notebook's `#| export` cells: what nbdev lists in the module's `__all__`."
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    exports = [c for c in nb.cells if c.cell_type == 'code' and directives(c) & {'export', 'exports'}]
    return [
        node.name
        for cell in exports
        for node in parsed(cell).body
        if isinstance(node, kinds) and not node.name.startswith('_') and not patched(node)
    ]


def documented(nb):
    "The names a visible cell that runs passes to `show_doc` (a call in code, not in a comment, a string or a hidden cell)."
    cells = [c for c in nb.cells if c.cell_type == 'code' and not hidden(c) and runs(c)]
    calls = [n for c in cells for n in ast.walk(parsed(c)) if isinstance(n, ast.Call) and n.args]
    return {ast.unparse(n.args[0]) for n in calls if getattr(n.func, 'id', None) == 'show_doc'}


def definitions(cell):
    "The names of the functions and classes a code cell defines at its top level."
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [node.name for node in parsed(cell).body if isinstance(node, kinds)]


def long_mixed_cells(cells):
    "The export cells of over `LONG_CELL` lines that define more than one function or class: {first name: lines}."
    exports = [c for c in cells if c.cell_type == 'code' and directives(c) & {'export', 'exporti'}]
    return {
        definitions(c)[0]: len(c.source.splitlines())
        for c in exports
        if len(c.source.splitlines()) > LONG_CELL and len(definitions(c)) > 1
    }


def rhythm_problems(nb):
    "{check: what fails it} for the notebook `nb`."
    cells, problems = nb.cells, {}
    undocumented = [name for name in exported_api(nb) if name not in documented(nb)]
    if undocumented:
        problems['show_doc'] = undocumented
    runs_of_words, run = [], 0
    for cell in cells:
        if cell.cell_type == 'markdown':
            run += words(cell.source)
        elif cell.cell_type == 'code':
            runs_of_words, run = runs_of_words + [run], 0
    if max(runs_of_words + [run]) > MOST_WORDS:
        problems['words'] = max(runs_of_words + [run])
    examples = [
        c
        for c in cells
        if c.cell_type == 'code'
        and not directives(c) & {'hide', 'export', 'exports', 'exporti', 'default_exp'}
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
    problems = rhythm_problems(read(path))
    assert not problems, (
        f"{path.relative_to(ROOT)} breaks the notebooks' rhythm: {problems} (show_doc: a `show_doc(name)` cell after "
        f'the export, or `#| exporti` for a helper no user calls; words: a run of markdown over {MOST_WORDS} words '
        f'before code; outputs: under {LEAST_SHOWN:.0%} of the example cells show an output; split: an export cell '
        f'over {LONG_CELL} lines defining several functions or classes)'
    )


def tutorial(*changes):
    "A small module notebook in the rhythm (API, show_doc, prose, an example with its output, hidden tests), then `changes`."

    def example(source, shown):
        result = nbformat.v4.new_output('execute_result', data={'text/plain': shown}, execution_count=1)
        return nbformat.v4.new_code_cell(source, outputs=[result])

    cells = [
        nbformat.v4.new_markdown_cell('# Doubling\n> A number, twice.'),
        nbformat.v4.new_code_cell('#| default_exp doubling'),
        nbformat.v4.new_code_cell('#| export\ndef double(x):\n    "Twice `x`."\n    return 2 * x'),
        example('show_doc(double)', 'double(x): Twice `x`.'),
        nbformat.v4.new_markdown_cell('It doubles:'),
        example('double(2)', '4'),
        example('x = double(3)\nx', '6'),
        example('double(-1)', '-2'),
        example('double(0.5)', '1.0'),
        nbformat.v4.new_markdown_cell('## Tests'),
        nbformat.v4.new_code_cell('#| hide\nassert double(0) == 0'),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    for change in changes:
        change(nb.cells)
    return nb


def code(source, **kw):
    return lambda cells: cells.insert(kw.get('at', 3), nbformat.v4.new_code_cell(source))


def edit(index, source=None, outputs=None):
    def change(cells):
        if source is not None:
            cells[index].source = source
        if outputs is not None:
            cells[index].outputs = outputs

    return change


def drop(index):
    return lambda cells: cells.pop(index)


def all_problems(nb):
    "Every check of this file on `nb`, by name (the rhythm's four, the closing tests, outputs stored and readable)."
    found = dict(rhythm_problems(nb))
    if closing_problem(nb):
        found['closing'] = closing_problem(nb)
    if unshown_values(nb):
        found['stored'] = unshown_values(nb)
    if unreadable_outputs(nb):
        found['readable'] = unreadable_outputs(nb)
    return found


ERROR = nbformat.v4.new_output('error', ename='ValueError', evalue='bad', traceback=[])
WIDGET_ONLY = nbformat.v4.new_output('display_data', data={WIDGET: {'model_id': 'x'}, 'text/plain': 'VBox()'})
LONG_MIXED = '#| exporti\ndef helper():\n' + '    pass\n' * LONG_CELL + 'class Big: ...'
BROKEN = {  # a notebook that breaks one rule: the check that must say so
    'no show_doc': (['show_doc'], drop(3)),
    'show_doc only in a comment': (['show_doc'], edit(3, '# show_doc(double)')),
    'show_doc only in a string': (['show_doc'], edit(3, "'show_doc(double)'")),
    'show_doc only in a hidden cell': (['show_doc'], edit(3, '#| hide\nshow_doc(double)')),
    'show_doc in a cell that does not run': (['show_doc'], edit(3, '#| eval: false\nshow_doc(double)')),
    'show_doc of another name': (['show_doc'], edit(3, 'show_doc(doubled)')),
    'a wall of words': (['words'], edit(4, ' '.join(['word'] * (MOST_WORDS + 1)))),
    'examples without outputs': (['outputs'], edit(5, outputs=[]), edit(7, outputs=[])),
    'a long export cell of two definitions': (['split'], code(LONG_MIXED)),
    'no Tests section': (['closing'], edit(9, '## Checks')),
    'hidden tests before the Tests section': (['closing'], code('#| hide\nassert 1'), code('#| hide\nassert 2')),
    'a section after the Tests section': (
        ['closing'],
        lambda cells: cells.append(nbformat.v4.new_markdown_cell('## More')),
    ),
    'no hidden test in the Tests section': (['closing'], drop(10)),
    'a value stored without its output': (['stored'], edit(6, outputs=[])),
    'stored with no output at all': (['outputs', 'stored'], *(edit(i, outputs=[]) for i in (3, 5, 6, 7, 8))),
    'a stored error': (['readable'], edit(5, outputs=[ERROR])),
    'a live widget with no static form': (['readable'], edit(5, outputs=[WIDGET_ONLY])),
}


def test_the_checks_pass_the_model_notebook():
    "The small notebook in the rhythm passes every check, so each broken one below fails for its one reason."
    assert all_problems(tutorial()) == {}
    assert exported_api(tutorial()) == ['double'] and documented(tutorial()) == {'double'}


@pytest.mark.parametrize('case', BROKEN, ids=list(BROKEN))
def test_the_checks_reject_a_broken_notebook(case):
    expected, *changes = BROKEN[case]
    assert sorted(all_problems(tutorial(*changes))) == sorted(expected)


def test_the_api_is_what_nbdev_lists():
    "exported_api reads the cells as nbdev does: every module's `__all__` holds its public definitions, and no more."
    for path in MODULE_NOTEBOOKS:
        found = re.search(r'(?m)^#\|\s*default_exp\s+([\w.]+)', '\n'.join(c.source for c in code_cells(path)))
        if not found or found.group(1) == '__init__':
            continue
        module = ast.parse((ROOT / 'nbtrainer' / f'{found.group(1)}.py').read_text())
        listed = next(ast.literal_eval(n.value) for n in module.body if getattr(n, 'targets', [None])[0] is not None
                      and getattr(n.targets[0], 'id', None) == '__all__')  # fmt: skip
        defined = {n.name for n in module.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        assert sorted(exported_api(read(path))) == sorted(n for n in listed if n in defined), path.name
    assert show_doc_only(nbformat.v4.new_code_cell('show_doc(Learner)\nshow_doc(Learner.fit)'))
    assert words("don't stop-words") == 2
