"""In a real browser (JupyterLab, Debian's Chromium, Playwright): three fits leave the page where they found it, the
dashboard's space is reserved from its first frame, and a notebook saved mid-fit keeps the fit's latest summary.

1. Three short awaited fits in one notebook. After each, garbage collection is forced through the DevTools protocol
   (`HeapProfiler.collectGarbage`) and `Performance.getMetrics` read: the DOM node count and the JS heap after the third
   fit are those after the first (the first fit pays one-time costs: widget manager, fonts, caches).
2. The dashboard's height, sampled every animation frame over the second fit, moves by a few px at most: bars, figure
   and rows arrive into space kept for them.
3. A background fit; the notebook saved with Ctrl+S while it runs and read from disk: the cell that started it holds a
   plain HTML output with the fit's figure, table and step, which a notebook reopened without the kernel shows.
Fixtures and helpers come from tests/test_ui.py."""
import time

import nbformat

from test_ui import ARGS, ARTIFACTS, CHROMIUM, cell, open_notebook, output, run_cell, wait_for_status
from test_ui import lab as lab_fixture  # noqa: F401  (pytest finds it by name below)

lab = lab_fixture

SETUP = '''import time, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from nbtrainer import Controls, Learner

class SlowMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    def forward(self, x):
        time.sleep(0.01)
        return self.net(x)

torch.manual_seed(0)
x = torch.randn(640, 8); y = (x[:, 0] > 0).long()
dl = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
small = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=16)
learn = Learner(SlowMLP(), dl, small, lr=0.05, cbs=[Controls(save_dir='ckpt')])'''
FIT = 'await learn.fit_async(1, eval_every=2)  # 40 steps, 20 evaluations'
CELLS = [SETUP, FIT, FIT, FIT, 'task = learn.fit_async(100, eval_every=4)  # in the background']
BACKGROUND = 4

SAMPLE = '''sel => { window.__heights = []; const tick = () => { const d = document.querySelector(sel);
    if (d) window.__heights.push(d.getBoundingClientRect().height);
    if (window.__sampling) requestAnimationFrame(tick); }; window.__sampling = true; requestAnimationFrame(tick); }'''


def metrics(cdp):
    "DOM nodes and JS heap after a forced garbage collection."
    for _ in range(3): cdp.send('HeapProfiler.collectGarbage')
    found = {m['name']: m['value'] for m in cdp.send('Performance.getMetrics')['metrics']}
    return {'nodes': int(found['Nodes']), 'heap_mb': found['JSHeapUsedSize'] / 2**20}


def test_three_fits_leave_the_page_as_they_found_it_and_a_mid_fit_save_keeps_the_summary(lab):
    from playwright.sync_api import sync_playwright
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port, folder = lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])  # this test's notebook instead
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, folder / 'ui_fit.ipynb')
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={'width': 1400, 'height': 1600})
        cdp = page.context.new_cdp_session(page)
        cdp.send('Performance.enable')
        try:
            page.goto(f'http://127.0.0.1:{port}/lab/tree/ui_fit.ipynb?reset')
            open_notebook(page, port)
            run_cell(page, 0)
            seen, heights = [], None
            for i in (1, 2, 3):
                if i == 2: page.evaluate(SAMPLE, f'.jp-Notebook .jp-Cell:nth-child({i + 1}) .nbtrainer-dashboard')
                run_cell(page, i)
                cell(page, i).locator(output('Fit finished at step')).wait_for(timeout=120_000)
                if i == 2:
                    page.evaluate('window.__sampling = false')
                    heights = page.evaluate('window.__heights')
                assert cell(page, i).locator('.nbtrainer-dashboard').count() == 0  # the summary replaced it
                page.wait_for_timeout(500)
                seen.append(metrics(cdp))
                print(f'after fit {i}: {seen[-1]}', flush=True)
            first, third = seen[0], seen[2]
            assert third['nodes'] <= first['nodes'] * 1.05, seen  # fits 2 and 3 leave no DOM behind
            assert third['heap_mb'] <= first['heap_mb'] * 1.05, seen
            print(f'dashboard height over fit 2: {len(heights)} samples, {min(heights)}..{max(heights)} px', flush=True)
            assert len(heights) >= 10 and max(heights) - min(heights) <= 4, sorted(set(heights))

            run_cell(page, BACKGROUND)
            live = cell(page, BACKGROUND).locator('.nbtrainer-dashboard')
            wait_for_status(page, live, r'step (\d\d\d)')  # some evaluations and a frame or two in
            page.wait_for_timeout(2500)  # a snapshot refresh
            assert cell(page, BACKGROUND).locator(output('Fit running')).count() == 0  # hidden while the widget lives
            page.keyboard.press('Control+s')
            deadline = time.time() + 30
            while True:
                saved = nbformat.read(folder / 'ui_fit.ipynb', as_version=4).cells[BACKGROUND].outputs
                html = [o['data']['text/html'] for o in saved if 'text/html' in o.get('data', {})]
                if any('Fit running' in h for h in html): break
                assert time.time() < deadline, f'no mid-fit summary saved: {saved}'
                page.wait_for_timeout(200)
            snapshot = next(h for h in html if 'Fit running' in h)
            assert 'data:image/png;base64,' in snapshot and 'nbtrainer-history' in snapshot and 'step ' in snapshot
            live.locator('.widget-button:has-text("Stop")').click()
            cell(page, BACKGROUND).locator(output('Fit stopped at step')).wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / 'leaks-after-fits.png'), full_page=True)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / 'leaks-failure.png'), full_page=True)
            raise
        finally:
            browser.close()
