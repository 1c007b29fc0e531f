"""A study's live table in a real frontend (JupyterLab in headless Chromium, driven by Playwright): `study.run_async()`
shows the table with a working Stop button in the cell that started it; the table shows the running trial; a click on
Stop ends that trial at its next batch (left to resume), starts no new one, and the live widget is replaced by the
static table, which says so."""

import ast, re

import nbformat
import pytest

from test_ui import ARGS, ARTIFACTS, CHROMIUM, cell, lab_server, open_notebook, output, run_cell, slow_mlp

pytest.importorskip('optuna')
pytestmark = [pytest.mark.ui, pytest.mark.timeout(1200)]  # JupyterLab in Chromium: minutes on a busy machine

CELLS = [
    slow_mlp(0.02)
    + '''import tempfile
from pathlib import Path
from nbtrainer import Learner
from nbtrainer.study import STOP_MESSAGE, Float, Study

def build(params):
    train = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
    return Learner(SlowMLP(), train, DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32), lr=params['lr'],
                   progress=False)

study = Study('ui', dict(lr=Float(1e-3, 0.1, log=True, role='scientific')), build, trials=3,
              fit=dict(steps=20_000, eval_every=10), db=Path(tempfile.mkdtemp()) / 'runs.db', pruner=None)''',
    'task = study.run_async()  # in the background: the table and its Stop button show here',
    "await task\nprint('STUDY-ENDED', [(r.config['trial'], r.status, r.message == STOP_MESSAGE) for r in study.runs()])",
]
SETUP, RUN, ENDED = range(3)
RUNNING_ROW = '''cell => {
    const row = [...cell.querySelectorAll('table.nbtrainer-study tr')].find(r => r.innerText.includes('running'));
    const tds = row.querySelectorAll('td');
    return [tds[1].innerText, getComputedStyle(tds[0]).paddingLeft];
}'''


@pytest.fixture
def lab(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, tmp_path / 'study.ipynb')
    with lab_server(tmp_path) as port:
        yield port, tmp_path


def test_the_live_study_table_and_its_stop_button(lab):
    from playwright.sync_api import sync_playwright

    port, folder = lab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={'width': 1400, 'height': 1000})
        try:
            page.goto(f'http://127.0.0.1:{port}/lab/tree/study.ipynb?reset')
            open_notebook(page, port)
            run_cell(page, SETUP)
            run_cell(page, RUN)
            live = cell(page, RUN)
            # the running trial is in the table, with the curve of its evaluations so far (the table refreshes)
            live.locator('table.nbtrainer-study tr:has-text("running") svg polyline').first.wait_for(timeout=180_000)
            # it names the running trial's step, its cells padded as the static table's are (one style, set inline);
            # read in one script, as the refresh replaces the table and a row found a moment earlier is detached
            status, padding = live.evaluate(RUNNING_ROW)
            assert re.fullmatch(r'running, step \d+', status.strip()), status
            assert padding == '8px', padding
            stop = live.locator('.jp-OutputArea-output .widget-button:has-text("Stop")')
            assert stop.is_enabled()
            live.screenshot(path=str(ARTIFACTS / 'study-live.png'))
            stop.click()
            # the live widget becomes the static table: trial 0 stopped, to resume; no trial started after it
            live.locator(output('stopped (resumes)')).first.wait_for(timeout=120_000)
            assert not live.locator('.widget-button').count()
            run_cell(page, ENDED)
            box = page.locator(output('STUDY-ENDED')).first
            box.wait_for(timeout=120_000)
            assert ast.literal_eval(box.inner_text().split('STUDY-ENDED', 1)[1].strip()) == [(0, 'stopped', True)]
        except Exception:
            page.screenshot(path=str(ARTIFACTS / 'study-failure.png'))
            raise
        finally:
            browser.close()
