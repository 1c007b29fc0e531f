"""The package's layers: imports run one way, with no cycle, and no module imports another's private names.

Every module is assigned a layer below; a new module must be added here, which is the point: its place is a decision.
"""

import ast

from conftest import ROOT

PACKAGE = ROOT / 'nbtrainer'
BOTTOM, MIDDLE, TOP = 0, 1, 2
LAYERS = {
    'callback': BOTTOM,
    'checks': BOTTOM,
    'clock': BOTTOM,
    'runfiles': BOTTOM,
    'data': BOTTOM,
    'rng': BOTTOM,
    'metrics': BOTTOM,
    'metric_specs': BOTTOM,
    'layers': BOTTOM,
    'precision': MIDDLE,
    'recorder': MIDDLE,
    'fit_progress': MIDDLE,
    'accumulation': MIDDLE,
    'strategy': MIDDLE,
    'param_groups': MIDDLE,
    'snapshot': MIDDLE,
    'parts': MIDDLE,
    'batches': MIDDLE,
    'core': MIDDLE,
    'progress': TOP,
    'plotting': TOP,
    'checkpoint': TOP,
    'save_load': TOP,
    'checkpointer': TOP,
    'resume': TOP,
    'loggers': TOP,
    'evaluate': TOP,
    'diagnose': TOP,
    'schedule': TOP,
    'lr_finder': TOP,
    'liveplot': TOP,
    'distributed': TOP,
    'launcher': TOP,
    'control': TOP,
    'dashboard': TOP,
    'dashboard_controls': TOP,
    'render': TOP,
    'demo': TOP,
    'testing': TOP,
    'early_stopping': TOP,
    'registry': TOP,
    'track': TOP,
    'experiments': TOP,
    'mlflow_logger': TOP,
    'preemption': TOP,
    'fork': TOP,
    'finetune': TOP,
    'fsdp': TOP,
    'search_space': TOP,
    'study_trials': TOP,
    'study_table': TOP,
    'study_plots': TOP,
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
                else:
                    found.append((target, [a.name for a in node.names], id(node) in top))
        elif isinstance(node, ast.Import):
            found += [
                (a.name.split('.')[1], [], id(node) in top) for a in node.names if a.name.startswith('nbtrainer.')
            ]
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
            if state.get(t) == 'open':
                cycles.append(path[path.index(t) :] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = 'done'

    for m in graph:
        if m not in state:
            visit(m, [m])
    assert not cycles, f'import cycles: {cycles}'


def test_no_module_imports_private_names_of_another():
    private = [(m, t, n) for m in modules() for t, names, _ in imports(m) for n in names if n.startswith('_')]
    assert not private, f'private names imported across modules: {private}'
    for m in modules():  # nor reaches into another module's private names by attribute
        tree = ast.parse((PACKAGE / f'{m}.py').read_text())
        aliases = {
            a.asname or a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.Import)
            for a in n.names
            if a.name.startswith('nbtrainer')
        }
        reached = [
            f'{n.value.id}.{n.attr}'
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id in aliases
            and n.attr.startswith('_')
        ]
        assert not reached, (m, reached)


def test_bottom_and_middle_import_no_ui_even_lazily():
    for m in modules():
        if LAYERS[m] == TOP:
            continue
        source = (PACKAGE / f'{m}.py').read_text()
        assert not [u for u in UI if f'import {u}' in source or f'from {u}' in source], m


# Time has one source: a module that measures a duration or stamps a moment asks nbtrainer.clock (`now()`, `wall()`),
# so a test can drive a FakeClock instead of depending on how busy the machine is. Waiting (`time.sleep`, an Event's
# timeout) and formatting a timestamp are not readings.
CLOCK_READS = {'perf_counter', 'perf_counter_ns', 'time', 'time_ns', 'monotonic', 'monotonic_ns', 'process_time'}


def clock_reads(name):
    "`time.X()` calls in module `name` that read the machine's clock."
    tree = ast.parse((PACKAGE / f'{name}.py').read_text())
    return [
        f'time.{n.attr} (line {n.lineno})'
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == 'time'
        and n.attr in CLOCK_READS
    ]


def test_time_is_read_from_nbtrainer_clock():
    reads = {m: clock_reads(m) for m in modules() if m != 'clock'}
    assert not {m: r for m, r in reads.items() if r}, reads


# State has owners: the loop's state lives in parts (nbs/00f_parts.ipynb names them, each in its module) that the core
# owns. Other modules change it through a part (`learn.fit_progress.step`, `learn.window.step_examples`, ...) or through
# these public setters, which the docs name as what callbacks may change: the batch under way (nbs/00_core.ipynb, "What
# callbacks can read"), the lr and the loaders. `controls` is the running fit's Controls, which nbtrainer.control registers for the dashboard.
PUBLIC_SETTERS = {'lr', 'lr_note', 'train_dl', 'valid_dl', 'batch', 'xb', 'yb', 'pred', 'loss', 'loss_grad', 'controls'}
PARTS = (
    'parts',
    'fit_progress',
    'accumulation',
    'strategy',
    'param_groups',
    'snapshot',
    'batches',
)  # nbs/00f_parts.ipynb
OWNERS = {'core', *PARTS}


def learner_writes(name):
    "(attribute, line) for each assignment to `learn.X` or `self.learn.X` in module `name`."
    tree = ast.parse((PACKAGE / f'{name}.py').read_text())

    def is_learner(node):
        return (isinstance(node, ast.Name) and node.id == 'learn') or (
            isinstance(node, ast.Attribute)
            and node.attr == 'learn'
            and isinstance(node.value, ast.Name)
            and node.value.id == 'self'
        )

    found = []
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        for t in targets:
            for leaf in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(leaf, ast.Attribute) and is_learner(leaf.value):
                    found.append((leaf.attr, leaf.lineno))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == 'setattr'
            and node.args
            and is_learner(node.args[0])
        ):
            found.append(('setattr', node.lineno))
    return found


def test_no_module_writes_learner_attributes_it_does_not_own():
    writes = {
        m: [(a, line) for a, line in learner_writes(m) if a not in PUBLIC_SETTERS] for m in modules() if m not in OWNERS
    }
    writes = {m: w for m, w in writes.items() if w}
    assert not writes, f'modules write Learner attributes instead of going through a part or a public setter: {writes}'


def test_the_learner_is_made_of_parts_with_state_dicts():
    import nbtrainer  # noqa: F401 (the features attach themselves)
    from torch.distributed.checkpoint.stateful import Stateful
    from nbtrainer.strategy import Strategy
    from nbtrainer.testing import synth_learner

    learn = synth_learner()
    learn.fit(1)
    for name, part in learn.parts().items():
        assert isinstance(part, Stateful), name  # torch's protocol
    assert isinstance(learn.strategy, Strategy) and learn.strategy not in learn.cbs  # called by the loop, not an event
    # 75 before parts, 53 before the validation and the fit's state became parts and the dispatch one object
    assert len(vars(learn)) <= 40, sorted(vars(learn))


# One Learner you can read (issue #33): every method defined once, core calling only what it (or its bases and parts)
# defines, one scope mechanism, and sizes a reader can hold.
BASES = (
    ('core', 'Learner'),
    ('core', 'CallbackHost'),  # with the loop since #43, as fastai's _with_events
    ('parts', 'PartNames'),  # the batch reader was a base until #43 made it a part (`learn.reader`)
)  # the class, its bases: (module, class)


def tree(name):
    return ast.parse((PACKAGE / f'{name}.py').read_text())


def class_names(module, cls):
    "Names a class body defines (methods, properties, class attributes), and attributes its methods assign on `self`."
    node = next(n for n in tree(module).body if isinstance(n, ast.ClassDef) and n.name == cls)
    defined, assigned = set(), set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(item.name)
        elif isinstance(item, ast.Assign):
            for t in item.targets:
                defined |= {e.id for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name)}
    for n in ast.walk(node):
        one = isinstance(n, (ast.AugAssign, ast.AnnAssign))
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if one else []
        for t in targets:
            for leaf in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == 'self':
                    assigned.add(leaf.attr)
    return defined, assigned


def patched(module):
    "(class name, function name) of every `@patch_to(Cls)` function in `module`."
    found = []
    for n in ast.walk(tree(module)):
        if isinstance(n, ast.FunctionDef):
            for d in n.decorator_list:
                if (
                    isinstance(d, ast.Call)
                    and getattr(d.func, 'id', None) == 'patch_to'
                    and isinstance(d.args[0], ast.Name)
                ):
                    found.append((d.args[0].id, n.name))
    return found


def test_every_learner_method_is_defined_once():
    own = set().union(*(class_names(m, c)[0] for m, c in BASES))
    patches = [(m, name) for m in modules() for cls, name in patched(m) if cls == 'Learner']
    names = [name for _, name in patches]
    assert not {n for n in names if names.count(n) > 1}, f'two modules attach the same Learner method: {patches}'
    assert not [p for p in patches if p[1] in own], f'patches that would replace a method of the Learner: {patches}'
    for m in modules():  # nor is a Learner attribute set from afar (the old import-time factory slots)
        if m == 'core':
            continue
        writes = [
            n.lineno
            for n in ast.walk(tree(m))
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, (ast.Attribute, ast.Subscript)) and 'Learner' in ast.unparse(t).split('.')[0]
        ]
        assert not writes, f'{m} sets an attribute of the Learner class (lines {writes}): fill a hook instead'


def test_patch_to_refuses_to_replace():
    import pytest
    from nbtrainer.core import Learner, patch_to

    def validate(learn, dl=None):
        return {}

    with pytest.raises(TypeError, match='exists already'):
        patch_to(Learner)(validate)


def test_core_calls_only_what_core_its_bases_and_parts_define():
    defined = set()
    for m, c in BASES:
        own, assigned = class_names(m, c)
        defined |= own | assigned
    for module, cls in BASES:  # the Learner's own code
        node = next(n for n in tree(module).body if isinstance(n, ast.ClassDef) and n.name == cls)
        calls = {
            n.func.attr
            for n in ast.walk(node)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name)
            and n.func.value.id == 'self'
        }
        missing = calls - defined - {'__init__'}
        assert not missing, f'{module} calls methods of the Learner that it does not define: {sorted(missing)}'


def test_hooks_are_filled_once_by_one_module():
    from nbtrainer.core import HOOKS

    filled = {}
    for m in modules():
        for n in ast.walk(tree(m)):
            if isinstance(n, ast.Call) and getattr(n.func, 'id', None) == 'fills':
                filled.setdefault(n.args[0].value, []).append(m)
    assert set(filled) == set(HOOKS) and all(len(ms) == 1 for ms in filled.values()), filled


def test_one_scope_mechanism():
    "Every event pair is an EventScope: the Learner catches no cancel exception of its own."
    from nbtrainer.callback import SCOPES
    from nbtrainer.core import _SCOPES

    assert [s[0] for s in _SCOPES] == list(SCOPES)
    for module in ('core', 'batches'):
        caught = [
            ast.unparse(h.type)
            for h in ast.walk(tree(module))
            if isinstance(h, ast.ExceptHandler) and h.type is not None
        ]
        assert not [c for c in caught if 'Cancel' in c], (module, caught)


def test_sizes_a_reader_can_hold():
    core = tree('core')
    learner = next(n for n in core.body if isinstance(n, ast.ClassDef) and n.name == 'Learner')
    assert learner.end_lineno - learner.lineno + 1 <= 400, learner.end_lineno - learner.lineno + 1
    # 600 until #43 brought the event host and its scopes to the loop (a batch fires its events without leaving core)
    assert len((PACKAGE / 'core.py').read_text().splitlines()) <= 700
    for module in PARTS:  # one concept a module (#43: parts.py was 1,174 lines)
        assert len((PACKAGE / f'{module}.py').read_text().splitlines()) <= 700, module
    for module in ('core', *PARTS, 'precision', 'batches', 'callback'):  # one name per thing: `step` counts steps
        methods = {n.name for n in ast.walk(tree(module)) if isinstance(n, ast.FunctionDef)}
        assert not methods & {'step', '_step', 'opt_step'}, (module, methods & {'step', '_step', 'opt_step'})


def test_the_bases_do_not_shadow_the_parts():
    "A name the parts own (`learn.main_process` is `learn.strategy.main_process`) is PartNames', whatever the other bases say."
    from nbtrainer.core import Learner
    from nbtrainer.parts import PartNames

    shadowed = [
        n for n in vars(PartNames) if not n.startswith('__') and getattr(Learner, n) is not getattr(PartNames, n)
    ]
    assert not shadowed, f"the Learner's other bases hide these PartNames: {shadowed}"


def test_a_training_batch_leaves_core_for_its_parts_and_listeners_only():
    "#43: one training batch's calls, read as modules: at most 10 switches (the issue counted 18; 35 before the host moved)."
    import nbtrainer  # noqa: F401 (Preemption joins every Learner)
    from torch.utils.data import DataLoader
    from nbtrainer.core import Learner
    from nbtrainer.testing import batch_route, classification_data, synth_learner, tiny_classifier

    data = DataLoader(classification_data(), batch_size=16)
    for learn in (synth_learner(), Learner(tiny_classifier(), data, metrics=['accuracy'], progress=False)):
        route = batch_route(learn)
        modules = [m for m, _ in route]
        assert len(route) - 1 <= 10, ' > '.join(f'{m}.{f}' for m, f in route)
        # Preemption hears no batch before a signal arrives (nbs/08b_preemption.ipynb): it is not on the route
        assert modules[0] == 'core' and set(modules) == {'core', 'batches', 'accumulation', 'recorder'}
