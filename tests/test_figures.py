"""Every figure nbtrainer draws, with hostile names (mathtext's `$` and `\\`, a newline, 200 characters, right-to-left
text): it draws without an error, and every legend and every label lies inside the figure, measured on the drawn
figure: the live figure, `recorder.plot()`, the LR finder and each study plot."""

import math

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from nbtrainer.lr_finder import lr_find
from nbtrainer.render import LiveFigure
from nbtrainer.testing import synth_learner

HOSTILE = ['usd_$_per_$_call', r'acc $\foo$', 'two\nlines', 'x' * 200, 'دقة النموذج']
LONG_PARAM = 'a_parameter_with_a_name_of_about_seventy_five_characters_in_all_written_out'


def metric(name, sign=1.0):
    def fn(preds, targets):
        return sign * ((preds - targets) ** 2).mean()

    fn.__name__ = name
    return fn


def outside(fig):
    """What of `fig` (drawn in full) reaches past its edges by more than a pixel: each axes with what it draws around it
    (tick labels, axis labels, title, legend), each figure legend: (what, its extent)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer, box = canvas.get_renderer(), fig.bbox
    found = []
    for artist in [*fig.axes, *fig.legends]:
        extent = artist.get_tightbbox(renderer) if hasattr(artist, 'get_tightbbox') else None
        extent = extent or artist.get_window_extent(renderer)
        if extent.x0 < box.x0 - 1 or extent.y0 < box.y0 - 1 or extent.x1 > box.x1 + 1 or extent.y1 > box.y1 + 1:
            found.append((type(artist).__name__, [round(v) for v in extent.extents], [round(v) for v in box.extents]))
    return found


def test_the_check_can_fail():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    fig.add_subplot().legend(handles=fig.axes[0].plot([1], [1]), labels=['y' * 200])
    assert outside(fig)


def test_the_live_figure_and_its_final_frame():
    live = LiveFigure(metrics=HOSTILE)
    live.add(
        [1, 2, 3], [1.0, 0.9, 0.8], [1.0, 0.95, 0.9], [{'step': 3, 'valid_loss': 0.7, **dict.fromkeys(HOSTILE, 0.5)}]
    )
    live.live_png()
    fig = live.figures['light'][0]
    assert not outside(fig)
    assert live.final_png()[:4] == b'\x89PNG'


def test_recorder_plot():
    learn = synth_learner(metrics=[metric(n) for n in HOSTILE])
    learn.fit(2)
    assert not outside(learn.recorder.plot())


def test_the_lr_finder():
    learn = synth_learner(metrics=[metric(n) for n in HOSTILE])
    found = lr_find(learn, num_it=30, show=False)
    fig = found.plot(lr=found.suggestions.best, chosen=found.suggestions.best)
    assert not outside(fig)


@pytest.fixture(scope='module')
def studies(tmp_path_factory):
    pytest.importorskip('optuna')
    from nbtrainer.study import Float, Study

    db, hostile = tmp_path_factory.mktemp('figures') / 'runs.db', HOSTILE[0]
    space = {LONG_PARAM: Float(1e-3, 0.3, log=True, role='scientific'), 'momentum': Float(0.5, 0.9)}

    def build(params):
        return synth_learner(n=32, lr=params[LONG_PARAM], metrics=[metric(hostile), metric('size', -1.0)])

    one = Study('one', space, build, trials=4, fit=dict(epochs=2), db=db, monitor=hostile, display=False).run()
    two = Study(
        'two', space, build, trials=4, fit=dict(epochs=2), db=db, monitor=(hostile, 'size'), mode=('min', 'min'),
        display=False,
    ).run()  # fmt: skip
    return one, two


@pytest.mark.parametrize('plot', ['plot_isolation', 'plot_params', 'plot_curves', 'plot_pareto'])
def test_every_study_plot(studies, plot):
    one, two = studies
    fig = getattr(two if plot == 'plot_pareto' else one, plot)()
    assert not outside(fig), outside(fig)
    if plot == 'plot_curves':  # named by what the study searched as science, not by every config key that varies
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert labels and all('momentum' not in label and 'lr=' not in label for label in labels), labels
        assert all(math.isfinite(w) for w in fig.get_size_inches())
