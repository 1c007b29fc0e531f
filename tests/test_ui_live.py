"""The live figure in a real frontend (JupyterLab in headless Chromium, driven by Playwright), from the issue's list:

1. A fit of about 2 s shows a live frame in its dashboard before the static summary replaces it.
2. Pausing a background fit redraws the figure where the fit stands, and resuming redraws it again.
3. The theme is followed on each fit: the first fits run in the dark theme; the user switches to the light theme in
   JupyterLab's Settings menu, and the next fit of the same Learner is drawn light.

The kernel records each frame it draws (the step, whether the fit was paused, whether it was the final frame) by
wrapping `LivePlot.render`, so the test checks what was drawn, not only that an image changed. Every wait is on a
condition with a deadline."""
import re, time

import nbformat
import pytest

from test_ui import (ARGS, ARTIFACTS, CHROMIUM, cell, open_notebook, output, run_cell, slow_mlp, wait_for_status)
from test_ui import lab  # noqa: F401  (the JupyterLab fixture)

pytestmark = [pytest.mark.ui, pytest.mark.timeout(1200)]  # JupyterLab in Chromium: minutes on a busy machine

CELLS = [
    slow_mlp(0.02) + '''from nbtrainer import Controls, Learner
from nbtrainer.liveplot import LivePlot

frames = []  # (step, paused, final) of every frame the live figure draws
_render = LivePlot.render
def render(self, final=False):
    _render(self, final)
    frames.append((self.learn.step, controls.paused, final))
LivePlot.render = render

controls = Controls()
learn = Learner(SlowMLP(), DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
                DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32), lr=0.05, cbs=[controls])''',
    'await learn.fit_async(steps=60, eval_every=20)  # about 2 s',
    "print('FRAMES-SHORT', learn.fit_outcome, frames)",
    'frames.clear()\ntask = learn.fit_async(steps=4000, eval_every=40)  # in the background',
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
                live |= set(page.evaluate('''[...document.querySelectorAll('.nbtrainer-dashboard img')]
                    .filter(i => i.offsetWidth > 0 && i.src).map(i => i.src)'''))
                page.wait_for_timeout(30)
            short = printed(page, 'FRAMES-SHORT')
            assert 'finished' in page.locator(output('FRAMES-SHORT')).inner_text()
            assert [f for f in short if not f[2]], f'no live frame during the short fit, only {short}'
            assert live, 'the browser never showed a live frame of the short fit'
            summary = cell(page, SHORT).locator('.jp-OutputArea-output img').first
            assert max(corner_rgb(summary)) < 40  # drawn in the dark theme the user picked

            # ---- 2. pause and resume redraw the figure where the fit stands ----
            run_cell(page, BACKGROUND)
            dash = cell(page, BACKGROUND).locator('.nbtrainer-dashboard')
            wait_for_status(page, dash, r'step (\d{3,})', timeout=120)  # well into the fit
            dash.locator('.widget-button:has-text("Pause")').click()
            paused_at = int(wait_for_status(page, dash, r'paused at step (\d+)').group(1))
            run_cell(page, PAUSED)  # the kernel is free: the fit runs in the background
            drawn = printed(page, 'FRAMES-PAUSED')
            assert (paused_at, True, False) in drawn, f'no frame drawn at the paused step {paused_at}: {drawn}'
            cell(page, BACKGROUND).screenshot(path=str(ARTIFACTS / 'live-paused.png'))
            dash.locator('.widget-button:has-text("Resume")').click()
            wait_for_status(page, dash, r'^(?!.*paused)step \d+')
            run_cell(page, RESUMED)
            drawn = printed(page, 'FRAMES-RESUMED')
            after_pause = drawn[drawn.index((paused_at, True, False)) + 1:]
            assert [f for f in after_pause if not f[1]], f'no frame drawn on resume: {drawn}'
            dash.locator('.widget-button:has-text("Stop")').click()
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
