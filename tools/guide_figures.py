"""The figures docs/guide.md gives that the code decides: the notebook table and the Learner's sizes. They are written
between markers (`<!-- figures:NAME -->` ... `<!-- /figures:NAME -->`) from the notebooks and the package themselves,
so they cannot drift; tests/test_guide.py fails when the guide is not what this writes.

    python tools/guide_figures.py           # rewrite the guide's figures
    python tools/guide_figures.py --check   # exit 1 if they are stale
"""

import ast, re, sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / 'docs' / 'guide.md'


def notebook_table():
    "A row per module notebook: its path, the module it exports, and its one-line summary (the `> ...` under its title)."
    rows = ['| notebook | module | what |', '|---|---|---|']
    for path in sorted(p for p in (ROOT / 'nbs').glob('*.ipynb') if not p.is_symlink()):
        cells = nbformat.read(path, as_version=4).cells
        code = '\n'.join(c.source for c in cells if c.cell_type == 'code')
        found = re.search(r'(?m)^#\|\s*default_exp\s+([\w.]+)', code)
        module = (
            '—' if not found else '`nbtrainer`' if found.group(1) == '__init__' else f'`nbtrainer.{found.group(1)}`'
        )
        heading = next(c.source for c in cells if c.cell_type == 'markdown')
        summary = re.search(r'(?m)^> (.+)$', heading)
        rows.append(f'| `nbs/{path.name}` | {module} | {summary.group(1).strip() if summary else ""} |')
    return '\n'.join(rows)


def learner_sizes():
    "The Learner class's lines, core.py's lines and a Learner's attributes after `fit(1)`, as the guide states them."
    sys.path.insert(0, str(ROOT))
    from nbtrainer.testing import synth_learner

    source = (ROOT / 'nbtrainer' / 'core.py').read_text()
    learner = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == 'Learner')
    learn = synth_learner()
    learn.fit(1)
    return (
        f'{learner.end_lineno - learner.lineno + 1} lines (core.py: {len(source.splitlines())}), and '
        f'{len(vars(learn))} attributes on a Learner after `fit(1)`'
    )


def batch_route():
    "The route of the third training batch of a default fit (synth_learner), as `nbtrainer.testing.batch_route` traces it."
    sys.path.insert(0, str(ROOT))
    import nbtrainer  # noqa: F401 (the default callbacks: Preemption joins every Learner)
    from nbtrainer.testing import batch_route, synth_learner

    route = batch_route(synth_learner())
    hops = '\n'.join(f'{"  → " if i else "    "}{module}.{function}' for i, (module, function) in enumerate(route))
    return f'```\n{hops}\n```\n{len(route) - 1} switches of module'


FIGURES = {'notebooks': notebook_table, 'learner-sizes': learner_sizes, 'batch-route': batch_route}


def written(text):
    "`text` with every marked figure as the code gives it now."
    for name, make in FIGURES.items():
        pattern = rf'(<!-- figures:{name} -->)(.*?)(<!-- /figures:{name} -->)'
        if not re.search(pattern, text, re.S):
            raise ValueError(f'docs/guide.md has no <!-- figures:{name} --> marker')
        value = make()
        separator = '\n' if '\n' in value else ''
        text = re.sub(pattern, lambda m: m.group(1) + separator + value + separator + m.group(3), text, flags=re.S)
    return text


def main():
    text = GUIDE.read_text()
    new = written(text)
    if '--check' in sys.argv[1:]:
        if new != text:
            sys.exit('docs/guide.md: its figures are stale: run `python tools/guide_figures.py`')
        return
    GUIDE.write_text(new)


if __name__ == '__main__':
    main()
