"""The live figure in a real frontend (JupyterLab in headless Chromium, driven by Playwright), from the issue's list:

1. A fit of about 2 s shows a live frame in its dashboard before the static summary replaces it.
2. A long background fit, mid-way: the figure is current (its last step within a few seconds of the status line's).
   Pausing it redraws the figure where the fit stands, and resuming redraws it again.
3. The theme is followed on each fit: the first fits run in the dark theme; the user switches to the light theme in
   JupyterLab's Settings menu, and the next fit of the same Learner is drawn light.
4. (A second test.) An awaited fit, then a browser reload, which loses its output: the next cell run says at once that
   it waits for the fit, and shows the fit's dashboard there, whose Stop ends it.

The kernel records each frame it shows (the step, whether the fit was paused, whether it was the final frame) by
wrapping `LivePlot.show`, so the test checks what was drawn, not only that an image changed. Every wait is on a
condition with a deadline."""

import re, time

import nbformat
import pytest

from nbtrainer.testing import wait_for

from test_ui import (
    ARGS,
    ARTIFACTS,
    CHROMIUM,
    cell,
    control,
    open_notebook,
    output,
    run_cell,
    sessions,
    slow_mlp,
    steps_shown,
    wait_for_status,
)
from test_ui import lab  # noqa: F401  (the JupyterLab fixture)

pytestmark = [pytest.mark.ui, pytest.mark.timeout(1200)]  # JupyterLab in Chromium: minutes on a busy machine

CELLS = [
    slow_mlp(0.02)
    + '''from nbtrainer import Controls, Learner
from nbtrainer.liveplot import LivePlot

frames = []  # (step, paused, final) of every frame the live figure shows
_show = LivePlot.show
def show(self, png, step=None, final=False):
    _show(self, png, step, final)
    frames.append((step, controls.paused, final))
LivePlot.show = show

controls = Controls()
learn = Learner(SlowMLP(), DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
                DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32), lr=0.05, cbs=[controls])''',
    'await learn.fit_async(steps=60, eval_every=20)  # about 2 s',
    "print('FRAMES-SHORT', learn.fit_outcome, frames)",
    'frames.clear()\ntask = learn.fit_async(steps=40_000, eval_every=40)  # in the background, until Stop',
    "from nbtrainer.testing import wait_for\n"  # the pause's frame is drawn by the rendering process: it may trail
    "wait_for(lambda: any(p and s == learn.step for s, p, _ in frames), 'the paused step drawn', timeout=60)\n"
    "print('FRAMES-PAUSED', frames)",
    "print('FRAMES-RESUMED', frames)",
    'frames.clear()\nawait learn.fit_async(steps=60, eval_every=20)  # after the switch to the light theme',
    "print('FRAMES-LIGHT', learn.fit_outcome, frames)",
]
SETUP, SHORT, SHORT_DONE, BACKGROUND, PAUSED, RESUMED, LIGHT, LIGHT_DONE = range(8)


def printed(page, tag, deadline=120):
    "The frames list a cell printed after `tag` (unique: `:has-text` ignores case), once its output is there."
    box = page.locator(output(tag)).first
    box.wait_for(timeout=deadline * 1000)
    return eval(box.inner_text().split(tag, 1)[1].split('[', 1)[1].rsplit(']', 1)[0].join('[]'))


def corner_rgb(locator):
    "The RGB of pixel (3, 3) of an image element: the figure's background."
    return locator.evaluate('''img => { const c = document.createElement('canvas'); c.width = 8; c.height = 8;
        const g = c.getContext('2d'); g.drawImage(img, 0, 0); return Array.from(g.getImageData(3, 3, 1, 1).data).slice(0, 3); }''')


def test_short_fits_draw_live_pause_redraws_and_the_theme_is_followed(lab):
    from playwright.sync_api import sync_playwright

    port, folder = lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, folder / 'live.ipynb')
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={'width': 1400, 'height': 1400})
        try:
            page.goto(f'http://127.0.0.1:{port}/lab/tree/live.ipynb?reset')
            open_notebook(page, port)
            run_cell(page, SETUP)

            # ---- 1. a fit of about 2 s: a live frame in the dashboard before the summary ----
            run_cell(page, SHORT)
            run_cell(page, SHORT_DONE)  # queued: runs when the fit has ended
            live, deadline = set(), time.time() + 180
            while not page.locator(output('FRAMES-SHORT')).count():
                assert time.time() < deadline, 'the short fit did not end'
                live |= set(
                    page.evaluate('''[...document.querySelectorAll('.nbtrainer-figure')]
                    .filter(i => i.offsetWidth > 0 && i.src).map(i => i.src)''')
                )
                page.wait_for_timeout(30)
            short = printed(page, 'FRAMES-SHORT')
            assert 'finished' in page.locator(output('FRAMES-SHORT')).inner_text()
            assert [f for f in short if not f[2]], f'no live frame during the short fit, only {short}'
            assert live, 'the browser never showed a live frame of the short fit'
            summary = cell(page, SHORT).locator('.jp-OutputArea-output img').first
            assert max(corner_rgb(summary)) < 40  # drawn in the dark theme the user picked

            # ---- 2. a long fit mid-way shows a current figure; pause and resume redraw it where the fit stands ----
            run_cell(page, BACKGROUND)
            dash = cell(page, BACKGROUND)
            well_in = int(wait_for_status(page, dash, r'step ([6-9]\d\d|\d{4,})', timeout=180).group(1))
            # the figure follows the fit mid-way: a frame drawn past that step comes, and none is ahead of the status
            # line (how soon frames come is timed by bench/frames.py, not here)
            wait_for(lambda: steps_shown(dash)[1] > well_in, f'a frame past step {well_in}', timeout=120, every=0.1,
                     seen=lambda: f'(status, figure) steps {steps_shown(dash)}')  # fmt: skip
            status_step, figure_step = steps_shown(dash)
            print(f'mid-way: status at step {status_step}, figure at step {figure_step}', flush=True)
            assert well_in < figure_step <= status_step, (well_in, status_step, figure_step)
            dash.screenshot(path=str(ARTIFACTS / 'live-long-fit.png'))
            control(dash, 'Pause').click()
            paused_at = int(wait_for_status(page, dash, r'paused at step (\d+)').group(1))
            run_cell(page, PAUSED)  # the kernel is free: the fit runs in the background
            drawn = printed(page, 'FRAMES-PAUSED')
            assert (paused_at, True, False) in drawn, f'no frame drawn at the paused step {paused_at}: {drawn}'
            cell(page, BACKGROUND).screenshot(path=str(ARTIFACTS / 'live-paused.png'))
            control(dash, 'Resume').click()
            wait_for_status(page, dash, r'^(?!.*paused)step \d+')
            run_cell(page, RESUMED)
            drawn = printed(page, 'FRAMES-RESUMED')
            after_pause = drawn[drawn.index((paused_at, True, False)) + 1 :]
            assert [f for f in after_pause if not f[1]], f'no frame drawn on resume: {drawn}'
            control(dash, 'Stop').click()
            cell(page, BACKGROUND).locator('.jp-OutputArea-output:has-text("stopped")').first.wait_for(timeout=120_000)

            # ---- 3. the user switches to the light theme; the next fit follows it ----
            page.get_by_role('menuitem', name='Settings', exact=True).click()
            page.locator('.lm-Menu-item:has(.lm-Menu-itemLabel:text-is("Theme"))').first.click()  # opens the submenu
            page.locator('.lm-Menu-item:has(.lm-Menu-itemLabel:text-is("JupyterLab Light"))').first.click()
            page.wait_for_selector('body[data-jp-theme-light="true"]', state='attached', timeout=60_000)
            settings = folder / 'settings' / '@jupyterlab' / 'apputils-extension' / 'themes.jupyterlab-settings'
            deadline = time.time() + 60
            while not re.search(r'"theme"\s*:\s*"JupyterLab Light"', settings.read_text()):  # saved by the server
                assert time.time() < deadline, settings.read_text()
                page.wait_for_timeout(200)
            run_cell(page, LIGHT)
            run_cell(page, LIGHT_DONE)
            light = printed(page, 'FRAMES-LIGHT', deadline=180)
            assert [f for f in light if not f[2]], f'no live frame in the fit after the switch: {light}'
            summary = cell(page, LIGHT).locator('.jp-OutputArea-output img').first
            assert min(corner_rgb(summary)) > 215  # the same Learner, drawn light now
            cell(page, LIGHT).screenshot(path=str(ARTIFACTS / 'live-light-theme.png'))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / 'live-failure.png'))
            raise
        finally:
            browser.close()


WAITING_CELLS = [
    slow_mlp(0.02)
    + '''from nbtrainer import Learner
learn = Learner(SlowMLP(), DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
                DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32), lr=0.05)''',
    'await learn.fit_async(steps=100_000, eval_every=40)  # the cell waits; a reload loses its output',
    'learn.dashboard()  # run after the reload: it waits behind the fit',
    "print('AFTER', learn.fit_outcome)",
]


def test_after_a_reload_during_an_awaited_fit_the_next_cell_run_shows_its_dashboard(lab):
    from playwright.sync_api import sync_playwright

    port, folder = lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in WAITING_CELLS])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, folder / 'waiting.ipynb')
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={'width': 1400, 'height': 1400})
        page.on('dialog', lambda dialog: dialog.accept())  # "leave the page?" at the reload
        try:
            page.goto(f'http://127.0.0.1:{port}/lab/tree/waiting.ipynb?reset')
            open_notebook(page, port)
            run_cell(page, 0)
            run_cell(page, 1)
            wait_for_status(page, cell(page, 1), r'step [1-9]', timeout=180)
            page.reload()  # the awaiting cell's output is lost; the kernel is still busy with it
            page.wait_for_selector('.jp-Notebook .jp-Cell', timeout=90_000)
            deadline = time.time() + 90
            while not any(s['kernel']['connections'] > 0 for s in sessions(port)):  # busy, and connected again
                assert time.time() < deadline, 'the page did not connect to the busy kernel'
                page.wait_for_timeout(200)
            run_cell(page, 2)
            waiting = cell(page, 2)
            waiting.locator(output('This cell waits for the fit')).wait_for(timeout=60_000)  # at once, not at the end
            first = int(wait_for_status(page, waiting, r'step (\d+)').group(1))
            wait_for_status(page, waiting, rf'step (?!{first}\b)\d+')  # live
            waiting.locator('.nbtrainer-figure').wait_for(timeout=60_000)
            waiting.screenshot(path=str(ARTIFACTS / 'live-waiting.png'))
            control(waiting, 'Stop').click()  # the controls work there, while the other cell still awaits
            waiting.locator(output('Fit stopped at step')).wait_for(timeout=120_000)
            assert 'Stop button clicked' in waiting.locator(output('Fit stopped at step')).inner_text()
            run_cell(page, 3)
            page.wait_for_selector(output('AFTER stopped'), timeout=60_000)
            assert (
                waiting.locator(output('Fit stopped at step')).count() == 1
            )  # learn.dashboard(), run at last: nothing more
        except Exception:
            page.screenshot(path=str(ARTIFACTS / 'waiting-failure.png'))
            raise
        finally:
            browser.close()
