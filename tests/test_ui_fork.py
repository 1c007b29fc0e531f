"""Forking from the dashboard in a real frontend (JupyterLab in headless Chromium, driven by Playwright).

A fit awaited with `await learn.fit_async(...)` keeps its last evaluations' states (`fork_points`) and records its run
in a registry (`Tracker`). The user pauses it, types a new lr in the LR field and clicks the fork control of an earlier
row. The paused fit ends, the Learner goes back to that evaluation, and the rest of the same fit trains as a branch in
the same output, without interrupting the kernel: the test sees its steps advance from the fork point, its history rows
carry the new lr, the registry records the branch with its parent run and step, and the live figure keeps the parent's
curves behind the branch. Stopped, the output holds both runs' summaries, and the notebook saved to disk keeps them. After the fit,
`learn.dashboard()` shows a fork bar that trains another branch in its place.
Every wait is on a condition with a deadline."""
import json, re, time

import nbformat
import pytest

from test_ui import (ARGS, ARTIFACTS, CHROMIUM, cell, open_notebook, output, run_cell, slow_mlp, wait_for_status)
from test_ui import lab  # noqa: F401  (the JupyterLab fixture)

pytestmark = [pytest.mark.ui, pytest.mark.timeout(1200)]  # JupyterLab in Chromium: minutes on a busy machine

CELLS = [
    slow_mlp(0.02) + '''from nbtrainer import Controls, Learner, Tracker, runs
learn = Learner(SlowMLP(), DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
                DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32), lr=0.05, fork_points=4,
                cbs=[Controls(), Tracker('runs.db')])''',
    'await learn.fit_async(steps=4000, eval_every=10)  # paused, then forked from its dashboard',
    "parent_run, waited = learn.progress.parent, time.time()\n"
    "while not any(r['step'] > parent_run['step'] for r in learn.recorder.history) and time.time() < waited + 60:\n"
    "    time.sleep(0.1)  # the branch trains in the background: its first evaluation row\n"
    "print('BRANCH-STATE', json.dumps({'parent': parent_run, 'fitting': learn.fitting, 'step': learn.step, "
    "'lrs': sorted({r['lr'] for r in learn.recorder.history if r['step'] > parent_run['step']}), "
    "'parent_drawn': learn.cbs[[type(c).__name__ for c in learn.cbs].index('Dashboard')].plot.parent_curves is not None, "
    "'runs': [{'id': r.id, 'parent': r.parent} for r in runs('runs.db')]}))",
    'learn.dashboard()  # after the fit: its summary, and a fork bar',
]
SETUP, FIT, STATE, AFTER = range(4)


def test_a_rows_fork_control_during_a_paused_fit_trains_a_branch(lab):
    from playwright.sync_api import sync_playwright
    port, folder = lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.cells[0].source = 'import json, time\n' + nb.cells[0].source
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, folder / 'fork.ipynb')
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={'width': 1400, 'height': 1400})
        try:
            page.goto(f'http://127.0.0.1:{port}/lab/tree/fork.ipynb?reset')
            open_notebook(page, port)
            run_cell(page, SETUP)
            run_cell(page, FIT)
            dash = cell(page, FIT).locator('.nbtrainer-dashboard')
            forks, rows = dash.locator('.nbtrainer-fork'), dash.locator('.nbtrainer-history tbody tr')
            deadline = time.time() + 180
            while rows.count() < 4:  # four evaluations shown, a fork control beside each row
                assert time.time() < deadline, 'the table never got four rows'
                page.wait_for_timeout(100)
            assert forks.count() >= 4 and all(forks.nth(i).is_disabled() for i in range(forks.count()))  # not running

            dash.locator('.widget-button:has-text("Pause")').click()
            paused_at = int(wait_for_status(page, dash, r'paused at step (\d+)').group(1))
            enabled = [i for i in range(forks.count()) if not forks.nth(i).is_disabled()]
            assert enabled, 'no fork control became usable while paused'
            field = dash.locator('.widget-text input, .widget-hbox input').first
            field.fill('0.005')
            field.press('Enter')
            wait_for_status(page, dash, r'lr 0\.005')  # applied at once while paused: the field holds it
            target = enabled[0]
            fork_step = int(rows.nth(target).locator('td').nth(1).inner_text())
            assert fork_step < paused_at
            page.screenshot(path=str(ARTIFACTS / 'fork-paused.png'))
            forks.nth(target).click()

            # the parent ends, the branch takes its place in the same output and trains from the fork point
            parent_summary = cell(page, FIT).locator(f'.jp-OutputArea-output:has-text("forked at step {fork_step}")')
            branch = cell(page, FIT).locator('.nbtrainer-dashboard')
            deadline = time.time() + 180
            while True:
                text = branch.locator('.nbtrainer-status').inner_text() if branch.count() else ''
                found = re.search(r'step (\d+)', text)
                if parent_summary.count() and found and int(found.group(1)) > fork_step + 10: break
                assert time.time() < deadline, f'the branch did not train: {text!r}'
                page.wait_for_timeout(100)
            assert 'forked at step' in branch.inner_text()  # the parent's summary above the branch's dashboard
            run_cell(page, STATE)  # the kernel is free: the awaited parent fit has ended
            box = page.locator(output('BRANCH-STATE')).first
            box.wait_for(timeout=120_000)
            state = json.loads(box.inner_text().split('BRANCH-STATE', 1)[1])
            assert state['parent']['step'] == fork_step and state['fitting'] and state['step'] > fork_step
            assert state['lrs'] == [0.005], state['lrs']  # every branch row trained with the new lr
            assert state['parent_drawn']  # the live figure draws the parent run behind the branch
            branches = [r for r in state['runs'] if r['parent']]  # the registry: the parent run, and its branch
            assert len(state['runs']) == 2 and len(branches) == 1 and branches[0]['parent']['step'] == fork_step
            assert branches[0]['parent']['run'] in {r['id'] for r in state['runs']} - {branches[0]['id']}  # its id there
            page.wait_for_function('''[...document.querySelectorAll('.nbtrainer-dashboard img.widget-image')]
                .some(i => getComputedStyle(i).visibility === 'visible')''', timeout=60_000)  # the branch's first frame
            cell(page, FIT).screenshot(path=str(ARTIFACTS / 'fork-branch.png'))

            branch.locator('.widget-button:has-text("Stop")').click()
            outputs = cell(page, FIT).locator('.jp-OutputArea')
            deadline = time.time() + 120
            live = cell(page, FIT).locator('.nbtrainer-dashboard')
            while outputs.inner_text().count('Fit stopped') < 2 or live.count():  # both summaries, as plain outputs
                assert time.time() < deadline, 'the branch did not stop'
                page.wait_for_timeout(100)
            deadline = time.time() + 60
            while True:  # the saved notebook keeps both runs' summaries in the cell that ran the fit
                page.keyboard.press('Control+s')
                saved = nbformat.read(folder / 'fork.ipynb', as_version=4).cells[FIT].outputs
                html_out = ''.join(o.get('data', {}).get('text/html', '') for o in saved)
                if f'forked at step {fork_step}' in html_out and html_out.count('Fit stopped') == 2: break
                assert time.time() < deadline, html_out[-2000:]
                page.wait_for_timeout(500)

            # after the fit: learn.dashboard() shows the summary and a fork bar; its branch replaces the bar
            run_cell(page, AFTER)
            bar = cell(page, AFTER).locator('.nbtrainer-fork-bar')
            bar.wait_for(timeout=60_000)
            chosen = int(bar.locator('select').input_value())
            bar.locator('input').fill('0.002')
            bar.locator('input').press('Enter')
            bar.locator('.widget-button:has-text("Fork and train")').click()
            again = cell(page, AFTER).locator('.nbtrainer-dashboard')
            deadline = time.time() + 120
            while True:
                found = re.search(r'step (\d+)', again.locator('.nbtrainer-status').inner_text() if again.count() else '')
                if found and int(found.group(1)) > chosen + 5: break
                assert time.time() < deadline, 'the branch from the fork bar did not train'
                page.wait_for_timeout(100)
            assert 'lr 0.002' in again.locator('.nbtrainer-status').inner_text()
            again.scroll_into_view_if_needed()
            again.locator('.widget-button:has-text("Stop")').click()
            cell(page, AFTER).locator('.jp-OutputArea-output:has-text("Fit stopped")').first.wait_for(timeout=120_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / 'fork-failure.png'))
            raise
        finally:
            browser.close()

