"""End to end in a real frontend: JupyterLab on loopback, driven in Debian's headless Chromium by Playwright, with real
clicks, in JupyterLab's dark theme.

1. A fit with `await learn.fit_async(...)`: the dashboard renders (bars, status, controls, a figure that changes, drawn at
   2x pixel density in the dark theme's colours, beside a table that keeps the last rows). LRs typed (Enter, Tab, a
   click elsewhere) each reach the loop. Pause; while paused, an LR typed with Enter and a Save are carried out at
   once, and the status line says so; Resume; then Save and Stop: the pending save is carried out before the fit ends.
   The fit ends early with `after_fit` run, and the dashboard becomes a static summary that says it was stopped by the
   button, lists the requests, and has no controls left.
2. A fit that fails: one short line in the cell, and a summary with the error and its folded traceback.
3. The LR finder: the slider, "Use this LR", `learn.lr` checked in the kernel; the figure above it is a plain image that
   marks the chosen lr.
4. The notebook is saved and read back from disk: the summaries and the LR finder's figure are kept as plain outputs.
5. A fit started in the background (`learn.fit_async(...)` not awaited), then a browser reload (which loses the running
   fit's dashboard), then `learn.dashboard()` in another cell: the live dashboard again, whose figure is current (new
   frames past the step where the re-attach found the fit, none ahead of the status line), whose Stop button ends the
   fit, and whose summary replaces it.

Screenshots go to `test-artifacts/ui/`. Recipe and pitfalls: the UI-testing notes (kernel readiness, selectors scoped to
outputs). Every wait is on a condition with a deadline: the test passes on a loaded machine. The fits the test stops plan
40,000 steps (1,000 s at least): far more than its waits, so none can end before its Stop."""

import contextlib, json, os, re, shutil, subprocess, time, urllib.request

import nbformat
import pytest

from conftest import CHROMIUM_ARGS, ROOT, serve_jupyter
from nbtrainer.testing import wait_for

pytestmark = [pytest.mark.ui, pytest.mark.timeout(1200)]  # JupyterLab in Chromium: minutes on a busy machine

CHROMIUM = shutil.which('chromium') or '/usr/bin/chromium'
ARTIFACTS = ROOT / 'test-artifacts' / 'ui'
ARGS = CHROMIUM_ARGS  # the flags every headless Chromium here starts with


def slow_mlp(seconds):
    "A browser test notebook's first lines: torch, `SlowMLP` (a small model slowed to `seconds` a batch), data x, y."
    return f'''import time, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

class SlowMLP(nn.Module):
    "A small model slowed to {seconds} s a batch: a fit long enough to watch and click."
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    def forward(self, x):
        time.sleep({seconds})
        return self.net(x)

torch.manual_seed(0)
x = torch.randn(640, 8); y = (x[:, 0] > 0).long()
'''


CELLS = [
    slow_mlp(0.025)
    + '''import os
from nbtrainer import Callback, Controls, Learner

class NoteEnd(Callback):
    def after_fit(self): ended.append((self.learn.step, time.time()))

class Boom(Callback):
    def after_batch(self):
        if self.learn.training and self.learn.step == self.learn.fit_start[1] + 3: raise RuntimeError('boom')

ended = []
dl = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
small = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=16)
controls = Controls(save_dir='ckpt')
learn = Learner(SlowMLP(), dl, small, lr=0.05, cbs=[NoteEnd(), controls])''',
    'await learn.fit_async(1000, eval_every=8)  # 40,000 steps planned: Stop is clicked long before',
    "print('FIT DONE', learn.step, ended[-1][0], repr(ended[-1][1]))",
    "print('CONTROLS', [a for _, a, _ in controls.log], learn.recorder.batches['lr'][-1], sorted(os.listdir('ckpt')))\n"
    "print('LRS', [float(v) for v in dict.fromkeys(learn.recorder.batches['lr'])])",
    'result = learn.lr_find(num_it=40)',
    "print('LR NOW', learn.lr)",
    'await learn.fit_async(2, cbs=[Boom()])  # fails: Run All stops here',
    'task = learn.fit_async(1000)  # in the background: the cell returns at once',
    'learn.dashboard()',
    "print('BACKGROUND DONE', learn.fit_outcome, task.done())",
]
FIT, FINDER, LR_NOW, FAIL, BACKGROUND, REATTACH = 1, 4, 5, 6, 7, 8


def sessions(port):
    return json.load(urllib.request.urlopen(f'http://127.0.0.1:{port}/api/sessions'))


def read_saved(path, deadline=30):
    """The notebook at `path` as last saved. JupyterLab's save may be writing it as we read (a file cut short is not
    JSON): read it again until it parses, for up to `deadline` seconds."""
    end = time.time() + deadline
    while True:
        try:
            return nbformat.read(path, as_version=4)
        except (ValueError, OSError) as error:  # nbformat's NotJSONError is a ValueError; a replace may hide the file
            if time.time() > end:
                raise AssertionError(f'{path} did not parse within {deadline} s: {error}') from error
            time.sleep(0.1)


@contextlib.contextmanager
def lab_server(folder, env=None):
    "A fresh JupyterLab server on loopback serving `folder`, in the dark theme, the news toast off; yields its port."
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            "Chromium is missing: apt-get install -y chromium chromium-driver (tools/test.sh does it when root)"
        )
    settings = folder / 'settings' / '@jupyterlab' / 'apputils-extension'
    settings.mkdir(parents=True)
    (settings / 'notification.jupyterlab-settings').write_text('{"fetchNews": "false", "checkForUpdates": false}')
    docmanager = folder / 'settings' / '@jupyterlab' / 'docmanager-extension'
    docmanager.mkdir(parents=True)
    (docmanager / 'plugin.jupyterlab-settings').write_text('{"autosave": false}')  # the test decides what is saved
    (settings / 'themes.jupyterlab-settings').write_text(
        '{\n  // the user picked the dark theme\n  "theme": "JupyterLab Dark"\n}'
    )
    env = {
        **os.environ,
        'JUPYTERLAB_SETTINGS_DIR': str(folder / 'settings'),
        'JUPYTERLAB_WORKSPACES_DIR': str(folder / 'workspaces'),
        **(env or {}),
    }
    log = open(folder / 'lab.log', 'w')
    server, port = serve_jupyter('lab', folder, [], env, log)

    def up():
        assert server.poll() is None, f'JupyterLab exited with code {server.returncode}'
        try:
            return urllib.request.urlopen(f'http://127.0.0.1:{port}/api/status', timeout=5).status == 200
        except OSError:
            return False

    try:
        wait_for(up, f'JupyterLab to answer on port {port}', timeout=120, every=0.25)
        yield port
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        print((folder / 'lab.log').read_text()[-3000:])


@pytest.fixture
def lab(tmp_path):
    "JupyterLab with the test notebook (`lab_server`)."
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, tmp_path / 'ui_fit.ipynb')
    with lab_server(tmp_path) as port:
        yield port, tmp_path


def output(text):
    return f'.jp-OutputArea-output:has-text("{text}")'  # outputs only, never the cell source


def open_notebook(page, port, deadline=90):
    page.wait_for_selector('.jp-Notebook .jp-Cell', timeout=deadline * 1000)
    end = time.time() + deadline
    while not any(s['kernel']['execution_state'] == 'idle' and s['kernel']['connections'] > 0 for s in sessions(port)):
        assert time.time() < end, 'the kernel did not become idle and connected'
        page.wait_for_timeout(200)


def cell(page, i):
    return page.locator('.jp-Notebook .jp-Cell').nth(i)


def run_cell(page, i):
    "Select cell `i` and run it (Shift+Enter), as a person would."
    cell(page, i).locator('.jp-InputArea-editor').click()
    page.keyboard.press('Shift+Enter')


def status_text(page, dash):
    return dash.locator('.nbtrainer-status').inner_text()


def control(dash, label):
    "The dashboard's control button labelled `label` (Stop, Pause, Resume, Save: one ToggleButtons widget)."
    return dash.locator(f'.nbtrainer-controls button:has-text("{label}")')


def steps_shown(dash):
    """(the status line's step, the live figure's last step) of a dashboard, at the same moment (one turn of the page);
    again while a live output is being replaced."""
    read = lambda: dash.evaluate('''d => { const s = d.querySelector('.nbtrainer-status');
        const f = d.querySelector('.nbtrainer-figure'), m = s && s.innerText.match(/step (\\d+)/);
        return m && f && f.dataset.step ? [parseInt(m[1]), parseInt(f.dataset.step)] : null; }''')
    return wait_for(read, 'the status line and the live figure shown together', timeout=60, every=0.05)


def wait_for_status(page, dash, pattern, timeout=60):
    "Wait until the dashboard's status line matches `pattern`; return the match."
    deadline = time.time() + timeout
    while True:
        found = re.search(pattern, status_text(page, dash))
        if found:
            return found
        assert time.time() < deadline, f'status never matched {pattern!r}: {status_text(page, dash)!r}'
        page.wait_for_timeout(100)


def pixel(page, selector):
    """The RGB of pixel (3, 3) of the first image matching `selector`, and its natural and displayed widths, read in one
    turn of the page; again while the image is being replaced (a live output updated in place) or not decoded yet."""
    read = lambda: page.evaluate(
        '''sel => { const img = document.querySelector(sel);
        if (!img || !img.complete || !img.naturalWidth || !img.getClientRects().length) return null;
        const c = document.createElement('canvas'); c.width = 8; c.height = 8; const g = c.getContext('2d');
        g.drawImage(img, 0, 0);
        return [Array.from(g.getImageData(3, 3, 1, 1).data).slice(0, 3), img.naturalWidth, img.getBoundingClientRect().width]; }''',
        selector,
    )
    return wait_for(read, f'a decoded image {selector} on the page', timeout=60, every=0.05)


def screenshot(locator, path, timeout=60):
    """A screenshot of the first element `locator` matches, though a live output may replace it mid-shot (each update of
    a dashboard draws its HTML anew, and a shot waits for the element to be stable first): taken again until one lands,
    within `timeout` seconds."""
    from playwright.sync_api import Error

    def shot():
        try:
            return locator.first.screenshot(path=str(path), timeout=timeout * 1000)
        except Error as e:
            if 'not attached' not in str(e):
                raise  # any other failure is the test's
            return None  # replaced mid-shot: again

    wait_for(shot, f'a screenshot of {locator} while it was not being replaced', timeout=timeout, every=0.05)


def boxes(dash, **selectors):
    """The bounding boxes of the first element matching each selector inside `dash`, read in one turn of the page (a
    live output replaced between two reads has no box); again until every one is shown."""
    read = lambda: dash.evaluate(
        '''(d, sels) => { const out = {};
        for (const [k, sel] of Object.entries(sels)) { const e = d.querySelector(sel);
            if (!e || !e.getClientRects().length) return null; const r = e.getBoundingClientRect();
            out[k] = {x: r.x, y: r.y, width: r.width, height: r.height}; }
        return out; }''',
        selectors,
    )
    return wait_for(read, f'{sorted(selectors)} shown together', timeout=60, every=0.05)


def test_dashboard_controls_endings_lr_finder_and_reattach_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (port, folder), t0 = lab, time.time()
    lap = lambda msg: print(f'{time.time() - t0:6.1f}s  {msg}', flush=True)
    measured = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={'width': 1400, 'height': 1600})
        page.on('dialog', lambda dialog: dialog.accept())  # "leave the page?" at the reload
        try:
            page.goto(f'http://127.0.0.1:{port}/lab/tree/ui_fit.ipynb?reset')
            open_notebook(page, port)
            lap('notebook open, kernel idle and connected')
            cell(page, BACKGROUND).locator('.jp-InputArea-editor').click()  # run everything above the background fit
            page.get_by_role('menuitem', name='Run', exact=True).click()
            page.click('li[data-command="notebook:run-all-above"]')

            # ---- 1. The dashboard of an awaited fit_async, and its controls ----
            dash = cell(page, FIT)  # its outputs: status and bars, controls, figure beside the table
            stop = control(dash, 'Stop')
            stop.wait_for(timeout=120_000)
            lap('dashboard shown')
            frames, rows = set(), dash.locator('.nbtrainer-history tbody tr')

            def rendered():
                frames.update(page.evaluate("[...document.querySelectorAll('.nbtrainer-figure')].map(i => i.src)"))
                return len(frames) >= 2 and rows.count() >= 8

            wait_for(rendered, 'two distinct figure frames and 8 table rows', timeout=120, every=0.1,
                     seen=lambda: f'{len(frames)} frames, {rows.count()} rows')  # fmt: skip
            found = {
                'bars': dash.locator('.nbtrainer-bars progress').count(),
                'buttons': dash.locator('.nbtrainer-controls button').count(),
                'figure': dash.locator('.nbtrainer-figure').count(),
                'table rows': dash.locator('.nbtrainer-history tbody tr').count(),
            }
            lap(f'rendered {found}; {len(frames)} distinct figure frames')
            assert found['bars'] >= 2 and found['buttons'] == 3 and found['figure'] == 1, found
            assert len(frames) >= 2, 'the live figure did not change during the fit'
            assert found['table rows'] == 8  # the last 8 evaluations, however many ran
            layout = boxes(dash, figure='.nbtrainer-figure', table='.nbtrainer-history', outputs='.jp-OutputArea')
            figure_box, table_box = layout['figure'], layout['table']
            beside = figure_box['x'] + figure_box['width'] <= table_box['x'] + 1  # a wide page; else the table is below
            assert beside or figure_box['y'] + figure_box['height'] <= table_box['y'] + 1  # the figure first
            measured['dashboard_height_px'] = layout['outputs']['height']
            assert measured['dashboard_height_px'] < 1100  # bars, controls, figure, 8 rows: it stops growing
            rgb, natural, shown = pixel(page, '.nbtrainer-figure')
            assert max(rgb) < 40 and natural == 2 * shown, (rgb, natural, shown)  # dark theme; 2x pixel density
            assert not stop.is_disabled()
            page.screenshot(path=str(ARTIFACTS / 'dashboard-running.png'), full_page=True)
            dash.screenshot(path=str(ARTIFACTS / 'cell-running.png'))  # for the dashboard notebook

            # Several LRs typed while the awaited fit runs, each sent a different way: every one reaches the loop.
            lr_box = dash.locator('.nbtrainer-controls input[type="number"]')
            for lr, send in (('0.04', 'Enter'), ('0.03', 'Tab'), ('0.02', 'a click elsewhere')):
                lr_box.fill(lr)
                if send == 'a click elsewhere':
                    dash.locator('.nbtrainer-status').click()
                else:
                    lr_box.press(send)
                applied = int(wait_for_status(page, dash, rf'lr {re.escape(lr)} from step (\d+)').group(1))
                wait_for_status(page, dash, rf'^step (?!{applied}\b)\d+')  # it trained a step before the next edit
            lap(f'three LRs typed during the awaited fit, each carried out: {status_text(page, dash)!r}')

            # Pause; while paused an LR typed + Enter, and Save, are carried out at once, at the held step.
            control(dash, 'Pause').click()
            held = int(wait_for_status(page, dash, r'paused at step (\d+)').group(1))
            lr_box.fill('0.01')
            lr_box.press('Enter')
            wait_for_status(page, dash, rf'lr 0\.01 from step {held}\b')
            control(dash, 'Save').click()
            wait_for_status(page, dash, rf'saved ckpt/manual-step{held}\.pt')
            assert int(re.match(r'step (\d+)', status_text(page, dash)).group(1)) == held  # still held there
            lap(f'paused at step {held}: lr and save carried out at once: {status_text(page, dash)!r}')
            page.screenshot(path=str(ARTIFACTS / 'dashboard-paused.png'), full_page=True)
            dash.screenshot(path=str(ARTIFACTS / 'cell-paused.png'))
            control(dash, 'Resume').click()
            deadline = time.time() + 60
            while (
                'paused' in status_text(page, dash)
                or int(re.match(r'step (\d+)', status_text(page, dash)).group(1)) <= held
            ):
                assert time.time() < deadline, 'the fit did not resume'
                page.wait_for_timeout(100)

            # Save, then Stop at once: the save still waiting is carried out before the fit ends.
            control(dash, 'Save').click()
            clicked = time.time()
            stop.click()
            page.wait_for_selector(output('FIT DONE'), timeout=60_000)
            step, ended_step, ended_at = page.locator(output('FIT DONE')).inner_text().split()[2:]
            measured['stop_click_to_after_fit_s'] = float(ended_at) - clicked
            lap(
                f'Stop: the fit ended at step {step} of 40000, {measured["stop_click_to_after_fit_s"]:.2f} s after the click'
            )
            assert int(step) == int(ended_step) and held < int(step) < 40000  # after_fit ran, early
            summary = cell(page, FIT).locator(output('Fit stopped at step'))
            assert summary.count() == 1 and 'Stop button clicked' in summary.inner_text()
            assert f'lr 0.01 from step {held}' in summary.inner_text() and 'Requests:' in summary.inner_text()
            assert summary.locator('img').count() == 1 and cell(page, FIT).locator('.nbtrainer-controls').count() == 0
            page.screenshot(path=str(ARTIFACTS / 'dashboard-stopped.png'), full_page=True)
            summary.screenshot(path=str(ARTIFACTS / 'cell-stopped.png'))
            page.wait_for_selector(output('CONTROLS'), timeout=30_000)
            controls_text = page.locator(output('CONTROLS')).inner_text()
            lap(controls_text.strip())
            actions, saved = controls_text.split('LRS')[0].split(' 0.01 ')
            assert "['lr', 'lr', 'lr', 'pause', 'lr', 'save', 'resume', 'save', 'stop']" in actions
            lrs = controls_text.split('LRS')[1]  # one output; has-text ignores case: lr_find may warn of 'lrs'
            assert json.loads(lrs) == [0.05, 0.04, 0.03, 0.02, 0.01], lrs  # each LR typed trained steps, in order
            assert f'manual-step{held}.pt' in saved and saved.count('manual-step') == 2

            # ---- 2. A failing fit: one line in the cell, the summary with the error and the folded traceback ----
            error = cell(page, FAIL).locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
            error.wait_for(timeout=60_000)
            assert 'Fit failed at step' in error.inner_text() and error.inner_text().strip().count('\n') == 0
            failed = cell(page, FAIL).locator(output('RuntimeError: boom'))
            assert failed.locator('details summary:has-text("Traceback")').count() == 1
            assert cell(page, FAIL).locator('.nbtrainer-controls').count() == 0
            lap(f'failure shown as: {error.inner_text().strip()!r}')
            cell(page, FAIL).screenshot(path=str(ARTIFACTS / 'cell-failed.png'))

            # ---- 3. The LR finder: slider, "Use this LR", the kernel's learn.lr, and the figure marks the choice ----
            page.wait_for_selector(output('LR NOW'), timeout=120_000)
            before = float(page.locator(output('LR NOW')).inner_text().split()[-1])
            figure = cell(page, FINDER).locator('.jp-OutputArea-output img').first
            first_src = figure.get_attribute('src')
            slider = cell(page, FINDER).locator('.widget-hslider')
            assert slider.bounding_box()['width'] >= 400  # 8 decades: a slider long enough to pick from
            from nbtrainer.lr_finder import PLOT_AREA

            image, track = (
                figure.bounding_box(),
                cell(page, FINDER).locator('.widget-hslider .noUi-base').bounding_box(),
            )
            axis = image['x'] + PLOT_AREA['left'] * image['width'], image['x'] + PLOT_AREA['right'] * image['width']
            measured['lr slider track vs axis (px)'] = track['x'] - axis[0], track['x'] + track['width'] - axis[1]
            assert all(abs(d) <= 2 for d in measured['lr slider track vs axis (px)']), (
                measured
            )  # lr for lr under the axis
            readout = cell(page, FINDER).locator('.widget-readout').first
            target = '2e-7' if float(readout.inner_text()) < 1.5e-7 else '1e-7'  # the test's first lr, or its second
            readout.click()  # type an lr into the slider's readout, as a person can
            page.keyboard.press('Control+A')
            page.keyboard.type(target)
            page.keyboard.press('Enter')
            deadline = time.time() + 30
            while float(readout.inner_text()) > 1.5 * float(target):  # the slider moved to (about) the lr typed
                assert time.time() < deadline, f'the slider did not move: {readout.inner_text()}'
                page.wait_for_timeout(100)
            deadline = time.time() + 30
            while figure.get_attribute('src') == first_src:  # the figure follows the slider
                assert time.time() < deadline, 'the figure did not follow the slider'
                page.wait_for_timeout(100)
            chosen = float(cell(page, FINDER).locator('.widget-readout').first.inner_text())
            cell(page, FINDER).locator('.widget-button:has-text("Use this LR")').click()
            page.wait_for_selector('.widget-label:has-text("now learn.lr")', timeout=30_000)
            run_cell(page, LR_NOW)
            page.wait_for_function(
                f"[...document.querySelectorAll('.jp-OutputArea-output')]"
                f".some(o => o.innerText.startsWith('LR NOW') && !o.innerText.includes('{before}'))",
                timeout=30_000,
            )
            after = float(page.locator(output('LR NOW')).inner_text().split()[-1])
            lap(f'LR finder: learn.lr {before} -> {after}')
            assert (
                after != before and abs(after - chosen) <= 0.01 * chosen
            )  # the slider's value (its readout is rounded)
            page.screenshot(path=str(ARTIFACTS / 'lr-finder.png'), full_page=True)
            cell(page, FINDER).screenshot(path=str(ARTIFACTS / 'cell-lr-finder.png'))

            # ---- 4. Saved, and read back from disk: the summaries and the finder's figure are plain outputs ----
            page.keyboard.press('Control+s')
            deadline = time.time() + 30
            while True:
                saved_nb = read_saved(folder / 'ui_fit.ipynb')
                if saved_nb.cells[FINDER].outputs:
                    break
                assert time.time() < deadline, 'the notebook was not saved'
                page.wait_for_timeout(200)
            fit_out = [o for o in saved_nb.cells[FIT].outputs if 'text/html' in o.get('data', {})]
            assert 'Fit stopped at step' in fit_out[0]['data']['text/html']
            assert not any(
                'application/vnd.jupyter.widget-view+json' in o.get('data', {}) for o in saved_nb.cells[FIT].outputs
            )
            assert any(
                'Fit failed at step' in o.get('data', {}).get('text/html', '') for o in saved_nb.cells[FAIL].outputs
            )
            finder_images = [o for o in saved_nb.cells[FINDER].outputs if 'image/png' in o.get('data', {})]
            assert len(finder_images) == 1 and finder_images[0]['data']['image/png'] != first_src.split(',')[-1]
            lap('saved notebook keeps the summaries and the LR finder figure')

            # ---- 5. A background fit; a browser reload loses its dashboard; learn.dashboard() brings it back ----
            run_cell(page, BACKGROUND)
            live = cell(page, BACKGROUND)
            control(live, 'Stop').wait_for(timeout=60_000)
            wait_for_status(page, live, r'step [1-9]')
            lap('background fit running; reloading the page')
            page.reload()
            open_notebook(page, port)
            assert page.locator('.nbtrainer-controls').count() == 0  # the running fit's dashboard is gone
            run_cell(page, REATTACH)
            again = cell(page, REATTACH)
            again_stop = control(again, 'Stop')
            again_stop.wait_for(timeout=60_000)
            first_step = int(wait_for_status(page, again, r'step (\d+)').group(1))
            wait_for_status(page, again, rf'step (?!{first_step}\b)\d+')  # live: the step moves on
            again.locator('.nbtrainer-figure').wait_for(timeout=60_000)
            # the current figure, as the status line is: frames drawn past where the re-attach found the fit, not a
            # frame left over from the fit's start (how soon they come is timed by bench/frames.py, not here)
            wait_for(lambda: steps_shown(again)[1] > first_step, f'a frame past step {first_step} in the re-attached '
                     'view', timeout=120, every=0.1, seen=lambda: f'(status, figure) steps {steps_shown(again)}')  # fmt: skip
            status_step, figure_step = steps_shown(again)
            measured['reattached: status step, figure step'] = status_step, figure_step
            lap(f'learn.dashboard() after the reload: status at step {status_step}, figure at step {figure_step}')
            assert first_step < figure_step <= status_step, (status_step, figure_step, first_step)
            page.screenshot(path=str(ARTIFACTS / 'dashboard-reattached.png'), full_page=True)
            again.screenshot(path=str(ARTIFACTS / 'cell-reattached.png'))
            again_stop.click()
            cell(page, REATTACH).locator(output('Stop button clicked')).wait_for(timeout=60_000)
            assert cell(page, REATTACH).locator(output('Fit stopped at step')).count() == 1
            run_cell(page, REATTACH + 1)
            page.wait_for_selector(output('BACKGROUND DONE stopped'), timeout=60_000)
            lap('the re-attached Stop ended the background fit; its summary replaced the dashboard')
            page.screenshot(path=str(ARTIFACTS / 'dashboard-reattached-stopped.png'), full_page=True)
            (ARTIFACTS / 'measurements.json').write_text(
                json.dumps(
                    {
                        **measured,
                        'stopped_at_step': int(step),
                        'figure_frames_seen': len(frames),
                        'lr_before': before,
                        'lr_after': after,
                        'seconds': time.time() - t0,
                    },
                    indent=1,
                )
            )
        except Exception:
            page.screenshot(path=str(ARTIFACTS / 'failure.png'), full_page=True)
            raise
        finally:
            browser.close()


def test_a_screenshot_of_an_element_replaced_as_it_is_taken_lands(tmp_path):
    "An element a live output draws anew at every frame fails a plain shot; `screenshot` lands once the output settles."
    from playwright.sync_api import Error, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.set_content('''<div id="out"></div><script>window.left = Infinity;
                function draw() { document.getElementById('out').innerHTML =
                    '<div class="fig" style="width: 40px; height: 40px; background: teal"></div>';
                    if (--window.left > 0) requestAnimationFrame(draw); }
                requestAnimationFrame(draw);</script>''')
            page.locator('.fig').wait_for(timeout=60_000)
            with pytest.raises(Error, match='not attached'):  # what one CI run beside two busy processes saw
                page.locator('.fig').screenshot(path=str(tmp_path / 'plain.png'), timeout=60_000)
            page.evaluate('window.left = 30')  # the output settles 30 frames from now
            screenshot(page.locator('.fig'), tmp_path / 'shot.png')
            assert (tmp_path / 'shot.png').stat().st_size > 0
        finally:
            browser.close()
