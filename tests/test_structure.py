"""The package's layers: imports run one way, with no cycle, and no module imports another's private names.

Every module is assigned a layer below; a new module must be added here, which is the point: its place is a decision.
"""
import ast, pathlib

from conftest import ROOT

PACKAGE = ROOT / 'nbtrainer'
BOTTOM, MIDDLE, TOP = 0, 1, 2
LAYERS = {
    'callback': BOTTOM, 'checks': BOTTOM, 'data': BOTTOM, 'rng': BOTTOM, 'metrics': BOTTOM, 'layers': BOTTOM,
    'precision': MIDDLE, 'recorder': MIDDLE, 'core': MIDDLE,
    'progress': TOP, 'plotting': TOP, 'checkpoint': TOP, 'loggers': TOP, 'evaluate': TOP, 'diagnose': TOP,
    'schedule': TOP, 'lr_finder': TOP, 'liveplot': TOP, 'distributed': TOP, 'control': TOP, 'dashboard': TOP,
    'demo': TOP, 'testing': TOP, 'early_stopping': TOP, 'track': TOP,
}
NOT_MODULES = {'__init__', '_modidx'}  # the package's front door imports everything; nbdev's index imports nothing
UI = ('matplotlib', 'ipywidgets', 'tensorboard', 'IPython', 'tqdm.notebook', 'tqdm.auto')


def modules():
    return sorted(p.stem for p in PACKAGE.glob('*.py') if p.stem not in NOT_MODULES)


def imports(name):
    "(imported nbtrainer module, names imported from it, top level?) for every import in module `name`, lazy ones included."
    tree = ast.parse((PACKAGE / f'{name}.py').read_text())
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ''
            if node.level == 1 or module.startswith('nbtrainer.') or module == 'nbtrainer':
                target = module.split('.')[-1] if module not in ('', 'nbtrainer') else None
                if target is None:  # from . import x / from nbtrainer import x
                    found += [(a.name, [], id(node) in top) for a in node.names]
                else: found.append((target, [a.name for a in node.names], id(node) in top))
        elif isinstance(node, ast.Import):
            found += [(a.name.split('.')[1], [], id(node) in top) for a in node.names if a.name.startswith('nbtrainer.')]
    return found


def test_every_module_has_a_layer():
    assert set(modules()) == set(LAYERS), 'assign each module a layer in LAYERS (and drop removed ones)'


def test_imports_never_go_up_a_layer():
    upward = [(m, target) for m in modules() for target, _, _ in imports(m) if LAYERS[target] > LAYERS[m]]
    assert not upward, f'imports from a lower layer to a higher one: {upward}'


def test_no_import_cycle():
    graph = {m: sorted({t for t, _, _ in imports(m)}) for m in modules()}
    state, cycles = {}, []

    def visit(m, path):
        state[m] = 'open'
        for t in graph[m]:
            if state.get(t) == 'open': cycles.append(path[path.index(t):] + [t])
            elif t not in state: visit(t, path + [t])
        state[m] = 'done'

    for m in graph:
        if m not in state: visit(m, [m])
    assert not cycles, f'import cycles: {cycles}'


def test_no_module_imports_private_names_of_another():
    private = [(m, t, n) for m in modules() for t, names, _ in imports(m) for n in names if n.startswith('_')]
    assert not private, f'private names imported across modules: {private}'
    for m in modules():  # nor reaches into another module's private names by attribute
        tree = ast.parse((PACKAGE / f'{m}.py').read_text())
        aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                   if a.name.startswith('nbtrainer')}
        reached = [f'{n.value.id}.{n.attr}' for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                   and isinstance(n.value, ast.Name) and n.value.id in aliases and n.attr.startswith('_')]
        assert not reached, (m, reached)


def test_bottom_and_middle_import_no_ui_even_lazily():
    for m in modules():
        if LAYERS[m] == TOP: continue
        source = (PACKAGE / f'{m}.py').read_text()
        assert not [u for u in UI if f'import {u}' in source or f'from {u}' in source], m
