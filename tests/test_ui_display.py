"""The dashboard in a front end without a widget manager: JupyterLab with the ipywidgets extension disabled
(`jupyter labextension disable @jupyter-widgets/jupyterlab-manager`, in a configuration folder of the test's own), in
headless Chromium driven by Playwright.

1. A default Learner (`display='auto'`) in an awaited `fit_async`: the dashboard's outputs are plain HTML but for its
   controls, which such a front end shows as their text (how to steer the fit from code): a status line whose step
   advances, bars drawn as HTML meters, then the live figure and the table; the static summary replaces it at the end.
2. A plain `fit`, which keeps the kernel busy: the same outputs, live.
3. `Learner(display='html')` in the background: the HTML dashboard from the start, stopped from another cell with
   `learn.controls.stop()`, its summary in the cell that started it.

Every wait is on a condition with a deadline."""

import subprocess, time

import nbformat
import pytest

from conftest import BIN
from test_ui import ARGS, ARTIFACTS, CHROMIUM, cell, lab_server, open_notebook, output, run_cell, slow_mlp

pytestmark = [pytest.mark.ui, pytest.mark.timeout(1200)]  # JupyterLab in Chromium: minutes on a busy machine

CELLS = [
    slow_mlp(0.02)
    + '''from nbtrainer import Learner
train, valid = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True), DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32)
learn = Learner(SlowMLP(), train, valid, lr=0.05)''',
    'await learn.fit_async(steps=400, eval_every=40)  # about 10 s',
    'learn.fit(steps=400, eval_every=40)  # the kernel is busy until it ends',
    "html_learn = Learner(SlowMLP(), train, valid, lr=0.05, display='html')\n"
    'task = html_learn.fit_async(steps=100_000, eval_every=40)  # in the background',
    "html_learn.controls.stop('stopped from another cell')",
]
SETUP, AWAITED, PLAIN, BACKGROUND, STOP = range(5)


# Every change to a cell's outputs, noted by the page itself: a live view shown for a moment between two polls of a
# busy machine is still seen, and reading what was seen never waits on an element that the summary may just replace.
RECORD_LIVE = """([i, key]) => {
    const cell = document.querySelectorAll('.jp-Notebook .jp-Cell')[i];
    const seen = window[key] = {steps: [], meters: 0, figure: 0, rows: 0};
    const note = () => {
        for (const out of cell.querySelectorAll('.jp-OutputArea-output')) {
            const found = out.getClientRects().length && out.innerText.match(/Fit running: step (\\d+)/);
            if (!found) continue;  // not shown, or not the live status
            if (!seen.steps.includes(+found[1])) seen.steps.push(+found[1]);
            seen.meters = Math.max(seen.meters, out.querySelectorAll('.nbtrainer-bars progress').length);
            for (const view of cell.querySelectorAll('.nbtrainer-view')) {  // the figure and table: their own output
                seen.figure = Math.max(seen.figure, view.querySelectorAll('.nbtrainer-figure').length);
                seen.rows = Math.max(seen.rows, view.querySelectorAll('.nbtrainer-history tbody tr').length);
            }
        }
    };
    note();
    new MutationObserver(note).observe(cell, {subtree: true, childList: true, characterData: true, attributes: true});
}"""


def running_steps(page, i):
    "The steps cell `i` has shown in its 'Fit running: step N' line so far (`run_and_watch` records them)."
    return page.evaluate(f'window.live{i}.steps')


def run_and_watch(page, i, deadline=300):
    "Run cell `i` with its outputs recorded; for a fit that ends, wait for its summary: the steps shown, what the HTML held."
    page.evaluate(RECORD_LIVE, [i, f'live{i}'])
    run_cell(page, i)
    end = time.time() + deadline
    while not cell(page, i).locator(output('Fit finished')).count():
        assert time.time() < end, f'cell {i} did not finish within {deadline} s'
        seen = page.evaluate(f'window.live{i}')
        if seen['figure'] and seen['rows'] and not (ARTIFACTS / f'html-cell-{i}.png').exists():
            cell(page, i).screenshot(path=str(ARTIFACTS / f'html-cell-{i}.png'))
        page.wait_for_timeout(100)
    seen = page.evaluate(f'window.live{i}')
    return set(seen.pop('steps')), seen


def test_without_a_widget_manager_the_dashboard_is_html(tmp_path):
    from playwright.sync_api import sync_playwright

    config = tmp_path / 'jupyter-config'
    env = {'JUPYTER_CONFIG_DIR': str(config)}
    subprocess.run(
        [str(BIN / 'jupyter'), 'labextension', 'disable', '--level=user', '@jupyter-widgets/jupyterlab-manager'],
        env={**__import__('os').environ, **env},
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert '"@jupyter-widgets/jupyterlab-manager": true' in (config / 'labconfig' / 'page_config.json').read_text()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, tmp_path / 'display.ipynb')
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with lab_server(tmp_path, env) as port, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={'width': 1400, 'height': 1400})
        try:
            page.goto(f'http://127.0.0.1:{port}/lab/tree/display.ipynb?reset')
            open_notebook(page, port)
            assert not page.evaluate("window.jupyterapp?.hasPlugin?.('@jupyter-widgets/jupyterlab-manager:plugin')")
            run_cell(page, SETUP)

            # ---- 1. the default display: plain outputs, and the controls as the text of how to steer the fit ----
            steps, seen = run_and_watch(page, AWAITED)
            assert len(steps) >= 3, f'the HTML dashboard did not follow the fit: steps shown {sorted(steps)}'
            assert seen['meters'] >= 2 and seen['figure'] == 1 and seen['rows'] >= 1, seen
            summary = cell(page, AWAITED).locator(output('Fit finished')).first
            assert 'step 400 of 400' in summary.inner_text() and summary.locator('img').count() == 1
            assert not cell(page, AWAITED).locator(output('Fit running')).count()  # the summary replaced it
            assert not page.locator('.jp-OutputArea-output:has-text("Error displaying widget")').count()
            assert not cell(page, AWAITED).locator('.nbtrainer-controls').count()  # no widget manager: no widget

            # ---- 2. a plain fit: the same outputs, live ----
            steps, seen = run_and_watch(page, PLAIN)
            assert steps and seen['meters'] >= 2, f'no HTML view of the plain fit: {sorted(steps)}, {seen}'
            assert 'step 800 of 800' in cell(page, PLAIN).locator(output('Fit finished')).first.inner_text()

            # ---- 3. display='html' in the background, stopped from another cell ----
            page.evaluate(RECORD_LIVE, [BACKGROUND, f'live{BACKGROUND}'])
            run_cell(page, BACKGROUND)
            end = time.time() + 300
            while max(running_steps(page, BACKGROUND), default=0) < 100:
                assert time.time() < end, (
                    'the background fit showed no HTML dashboard at step 100 or later within 300 s'
                )
                page.wait_for_timeout(100)
            live = cell(page, BACKGROUND).locator(output('Fit running')).first
            assert 'learn.controls.pause()' in live.inner_text()  # says how to steer it without widgets
            cell(page, BACKGROUND).screenshot(path=str(ARTIFACTS / 'html-display.png'))
            run_cell(page, STOP)
            stopped = cell(page, BACKGROUND).locator(output('Fit stopped'))
            stopped.first.wait_for(timeout=120_000)
            assert 'stopped from another cell' in stopped.first.inner_text()
        except Exception:
            page.screenshot(path=str(ARTIFACTS / 'html-failure.png'))
            raise
        finally:
            browser.close()
