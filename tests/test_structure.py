"""The package's layers: imports run one way, with no cycle, and no module imports another's private names.

Every module is assigned a layer below; a new module must be added here, which is the point: its place is a decision.
"""
import ast, pathlib

from conftest import ROOT

PACKAGE = ROOT / 'nbtrainer'
BOTTOM, MIDDLE, TOP = 0, 1, 2
LAYERS = {
    'callback': BOTTOM, 'checks': BOTTOM, 'clock': BOTTOM, 'runfiles': BOTTOM, 'data': BOTTOM, 'rng': BOTTOM, 'metrics': BOTTOM, 'layers': BOTTOM,
    'precision': MIDDLE, 'recorder': MIDDLE, 'parts': MIDDLE, 'core': MIDDLE,
    'progress': TOP, 'plotting': TOP, 'checkpoint': TOP, 'loggers': TOP, 'evaluate': TOP, 'diagnose': TOP,
    'schedule': TOP, 'lr_finder': TOP, 'liveplot': TOP, 'distributed': TOP, 'control': TOP, 'dashboard': TOP,
    'render': TOP, 'demo': TOP, 'testing': TOP, 'early_stopping': TOP, 'track': TOP, 'preemption': TOP, 'fork': TOP, 'finetune': TOP, 'fsdp': TOP,
    'study': TOP,
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


# Time has one source: a module that measures a duration or stamps a moment asks nbtrainer.clock (`now()`, `wall()`),
# so a test can drive a FakeClock instead of depending on how busy the machine is. Waiting (`time.sleep`, an Event's
# timeout) and formatting a timestamp are not readings.
CLOCK_READS = {'perf_counter', 'perf_counter_ns', 'time', 'time_ns', 'monotonic', 'monotonic_ns', 'process_time'}


def clock_reads(name):
    "`time.X()` calls in module `name` that read the machine's clock."
    tree = ast.parse((PACKAGE / f'{name}.py').read_text())
    return [f'time.{n.attr} (line {n.lineno})' for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == 'time' and n.attr in CLOCK_READS]


def test_time_is_read_from_nbtrainer_clock():
    reads = {m: clock_reads(m) for m in modules() if m != 'clock'}
    assert not {m: r for m, r in reads.items() if r}, reads


# State has owners: the loop's state lives in parts (nbs/00f_parts.ipynb) that the core owns. Other modules change it
# through a part (`learn.progress.step`, `learn.window.step_examples`, ...) or through these public setters, which the
# docs name as what callbacks may change: the batch under way (nbs/00_core.ipynb, "What callbacks can read"), the lr and
# the loaders. `controls` is the running fit's Controls, which nbtrainer.control registers for the dashboard.
PUBLIC_SETTERS = {'lr', 'lr_note', 'train_dl', 'valid_dl', 'batch', 'xb', 'yb', 'pred', 'loss', 'loss_grad', 'controls'}
OWNERS = {'core', 'parts'}


def learner_writes(name):
    "(attribute, line) for each assignment to `learn.X` or `self.learn.X` in module `name`."
    tree = ast.parse((PACKAGE / f'{name}.py').read_text())
    def is_learner(node):
        return (isinstance(node, ast.Name) and node.id == 'learn') or (
            isinstance(node, ast.Attribute) and node.attr == 'learn' and isinstance(node.value, ast.Name) and node.value.id == 'self')
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for leaf in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(leaf, ast.Attribute) and is_learner(leaf.value): found.append((leaf.attr, leaf.lineno))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'setattr' and node.args \
                and is_learner(node.args[0]):
            found.append(('setattr', node.lineno))
    return found


def test_no_module_writes_learner_attributes_it_does_not_own():
    writes = {m: [(a, line) for a, line in learner_writes(m) if a not in PUBLIC_SETTERS]
              for m in modules() if m not in OWNERS}
    writes = {m: w for m, w in writes.items() if w}
    assert not writes, f'modules write Learner attributes instead of going through a part or a public setter: {writes}'


def test_the_learner_is_made_of_parts_with_state_dicts():
    import nbtrainer  # noqa: F401 (the features attach themselves)
    from nbtrainer.testing import synth_learner
    learn = synth_learner()
    learn.fit(1)
    for name, part in learn.parts().items():
        assert callable(part.state_dict) and callable(part.load_state_dict), name
    # 75 before parts; added since: tokens, lr_note, param_groups, reproducibility, _read_pairs
    assert len(vars(learn)) <= 53, sorted(vars(learn))
