"""End to end in a real frontend: JupyterLab on loopback, driven in Debian's headless Chromium by Playwright.

A notebook trains with `await learn.fit_async(...)`. The test checks that the dashboard renders (bars, buttons, figure)
and that its figure changes during the fit; sets an LR, saves, pauses and resumes; clicks Stop and checks that the fit
ended early with `after_fit` run and each request applied; then moves the LR finder's slider, clicks "Use this LR" and
checks in the kernel that `learn.lr` changed. Screenshots go to
`test-artifacts/ui/`. Recipe and pitfalls: the UI-testing notes (kernel readiness, selectors scoped to outputs)."""
import json, os, shutil, socket, subprocess, sys, time, urllib.request

import nbformat
import pytest

from conftest import BIN, ROOT

CHROMIUM = shutil.which('chromium') or '/usr/bin/chromium'
ARTIFACTS = ROOT / 'test-artifacts' / 'ui'
ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
        '--disable-background-networking', '--disable-component-update', '--disable-sync']

CELLS = [
    '''import time, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from nbtrainer import Callback, Controls, Learner

class SlowMLP(nn.Module):
    "A small model slowed to about 25 ms a batch: a fit long enough to watch and click."
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    def forward(self, x):
        time.sleep(0.025)
        return self.net(x)

class NoteEnd(Callback):
    def after_fit(self): ended.append((self.learn.step, time.time()))

ended = []
torch.manual_seed(0)
x = torch.randn(640, 8); y = (x[:, 0] > 0).long()
dl = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
controls = Controls(save_dir='ckpt')
learn = Learner(SlowMLP(), dl, dl, lr=0.05, cbs=[NoteEnd(), controls])''',
    'await learn.fit_async(100)  # 4000 steps planned: Stop is clicked long before',
    "print('FIT DONE', learn.step, ended[-1][0], repr(ended[-1][1]))",
    "import os; print('CONTROLS', [a for _, a, _ in controls.log], learn.recorder.batches['lr'][-1], os.listdir('ckpt'))",
    "result = learn.lr_find(num_it=40)",
    "print('LR NOW', learn.lr)",
    "print('ALL CELLS DONE')",
]


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def sessions(port):
    return json.load(urllib.request.urlopen(f'http://127.0.0.1:{port}/api/sessions'))


@pytest.fixture
def lab(tmp_path):
    "A fresh JupyterLab server on loopback with the test notebook; the news toast is switched off."
    if not os.path.exists(CHROMIUM):
        pytest.fail("Chromium is missing: apt-get install -y chromium chromium-driver (tools/test.sh does it when root)")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, tmp_path / 'ui_fit.ipynb')
    settings = tmp_path / 'settings' / '@jupyterlab' / 'apputils-extension'
    settings.mkdir(parents=True)
    (settings / 'notification.jupyterlab-settings').write_text('{"fetchNews": "false", "checkForUpdates": false}')
    port = free_port()
    env = {**os.environ, 'JUPYTERLAB_SETTINGS_DIR': str(tmp_path / 'settings'),
           'JUPYTERLAB_WORKSPACES_DIR': str(tmp_path / 'workspaces')}
    log = open(tmp_path / 'lab.log', 'w')
    server = subprocess.Popen([str(BIN / 'jupyter'), 'lab', '--no-browser', f'--port={port}', '--ServerApp.token=',
                               '--ServerApp.ip=127.0.0.1', '--allow-root', f'--ServerApp.root_dir={tmp_path}'],
                              stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f'http://127.0.0.1:{port}/api/status')
                break
            except OSError: time.sleep(0.25)
        yield port
    finally:
        server.terminate()
        try: server.wait(timeout=20)
        except subprocess.TimeoutExpired: server.kill()
        log.close()
        print((tmp_path / 'lab.log').read_text()[-3000:])


def output(text): return f'.jp-OutputArea-output:has-text("{text}")'  # outputs only, never the cell source


def test_dashboard_controls_and_lr_finder_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port, t0 = lab, time.time()
    lap = lambda msg: print(f'{time.time() - t0:6.1f}s  {msg}', flush=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={'width': 1280, 'height': 1600})
        try:
            page.goto(f'http://127.0.0.1:{port}/lab/tree/ui_fit.ipynb?reset')
            page.wait_for_selector('.jp-Notebook .jp-Cell', timeout=90_000)
            deadline = time.time() + 90
            while not any(s['kernel']['execution_state'] == 'idle' and s['kernel']['connections'] > 0 for s in sessions(port)):
                assert time.time() < deadline, 'the kernel did not become idle and connected'
                page.wait_for_timeout(200)
            lap('notebook open, kernel idle and connected')
            page.locator('.jp-Notebook').first.click()
            page.get_by_role('menuitem', name='Run', exact=True).click()
            page.click('li[data-command="runmenu:run-all"]')

            # The dashboard: bars, buttons, and a figure that changes while the fit runs.
            stop = page.locator('.jp-OutputArea-output .widget-button:has-text("Stop")')
            stop.wait_for(timeout=120_000)
            lap('dashboard shown')
            frames, deadline = set(), time.time() + 90
            while len(frames) < 2 and time.time() < deadline:
                frames |= set(page.evaluate("[...document.querySelectorAll('.nbtrainer-dashboard img')].map(i => i.src)"))
                page.wait_for_timeout(100)
            found = {'bars': page.locator('.nbtrainer-dashboard .widget-hprogress').count(),
                     'buttons': page.locator('.nbtrainer-dashboard .widget-button').count(),
                     'figure': page.locator('.nbtrainer-dashboard img').count()}
            lap(f'rendered {found}; {len(frames)} distinct figure frames')
            page.screenshot(path=str(ARTIFACTS / 'dashboard-running.png'), full_page=True)
            assert found['bars'] >= 2 and found['buttons'] >= 4 and found['figure'] == 1, found
            assert len(frames) >= 2, 'the live figure did not change during the fit'
            assert not stop.is_disabled()

            # LR, Save, Pause / Resume: each takes effect at a batch boundary of the running fit.
            lr_box = page.locator('.nbtrainer-dashboard input[type="number"]')
            lr_box.fill('0.01')
            lr_box.press('Enter')
            page.locator('.nbtrainer-dashboard .widget-button:has-text("Set LR")').click()
            page.locator('.nbtrainer-dashboard .widget-button:has-text("Save")').click()
            page.locator('.nbtrainer-dashboard .widget-button:has-text("Pause")').click()
            page.wait_for_selector('.nbtrainer-dashboard .widget-button:has-text("Resume")', timeout=10_000)
            page.wait_for_timeout(1500)
            page.screenshot(path=str(ARTIFACTS / 'dashboard-paused.png'), full_page=True)
            page.locator('.nbtrainer-dashboard .widget-button:has-text("Resume")').click()
            page.wait_for_timeout(500)

            clicked = time.time()
            stop.click()
            page.wait_for_selector(output('FIT DONE'), timeout=60_000)
            done_text = page.locator(output('FIT DONE')).inner_text()
            step, ended_step, ended_at = done_text.split()[2:]
            latency = float(ended_at) - clicked
            lap(f'Stop: the fit ended at step {step} of 4000, {latency:.2f} s after the click')
            assert int(step) == int(ended_step) and 0 < int(step) < 4000  # after_fit ran, early
            summary = page.locator(output('stopped by the Stop button'))
            assert summary.count() == 1 and summary.locator('img').count() == 1  # the static summary replaced it
            page.screenshot(path=str(ARTIFACTS / 'dashboard-stopped.png'), full_page=True)
            page.wait_for_selector(output('CONTROLS'), timeout=30_000)
            controls_text = page.locator(output('CONTROLS')).inner_text()
            lap(controls_text.strip())
            assert "['lr', 'save', 'pause', 'resume', 'stop'] 0.01 ['manual-step" in controls_text

            # The LR finder: move the slider by typing into its readout, click "Use this LR", ask the kernel.
            page.wait_for_selector(output('ALL CELLS DONE'), timeout=120_000)
            before = float(page.locator(output('LR NOW')).inner_text().split()[-1])
            page.locator('.jp-OutputArea-output .widget-hslider .noUi-handle').first.focus()
            page.keyboard.press('Home')  # the slider's lowest tested lr
            page.wait_for_timeout(500)
            chosen = float(page.locator('.jp-OutputArea-output .widget-readout').first.inner_text())
            page.locator('.jp-OutputArea-output .widget-button:has-text("Use this LR")').click()
            page.wait_for_selector('.widget-label:has-text("now learn.lr")', timeout=30_000)
            lr_cell = page.locator('.jp-CodeCell:has(.jp-InputArea-editor:has-text("print(\'LR NOW\'"))')
            lr_cell.locator('.jp-InputArea-editor').click()
            page.keyboard.press('Shift+Enter')
            page.wait_for_function(f"[...document.querySelectorAll('.jp-OutputArea-output')]"
                                   f".some(o => o.innerText.startsWith('LR NOW') && !o.innerText.includes('{before}'))",
                                   timeout=30_000)
            after = float(page.locator(output('LR NOW')).inner_text().split()[-1])
            lap(f'LR finder: learn.lr {before} -> {after}')
            assert after != before and abs(after - chosen) <= 0.01 * chosen  # the slider's value (its readout is rounded)
            page.screenshot(path=str(ARTIFACTS / 'lr-finder.png'), full_page=True)
            (ARTIFACTS / 'measurements.json').write_text(json.dumps(
                {'stop_click_to_after_fit_s': latency, 'stopped_at_step': int(step), 'figure_frames_seen': len(frames),
                 'lr_before': before, 'lr_after': after}, indent=1))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / 'failure.png'), full_page=True)
            raise
        finally:
            browser.close()
