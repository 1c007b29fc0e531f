"""Forking from the dashboard in a real frontend (JupyterLab in headless Chromium, driven by Playwright).

A fit awaited with `await learn.fit_async(...)` keeps its last evaluations' states (`fork_points`) and records its run
in a registry (`Tracker`). The user pauses it, types a new lr in the LR field and clicks the fork control of an earlier
evaluation (the paused controls offer one for each shown row whose state is kept). The paused fit ends, the Learner goes back to that evaluation, and the rest of the same fit trains as a branch in
the same output, without interrupting the kernel: the test sees its steps advance from the fork point, its history rows
carry the new lr, the registry records the branch with its parent run and step, and the live figure keeps the parent's
curves behind the branch. Stopped, the output holds both runs' summaries, and the notebook saved to disk keeps them. After the fit,
`learn.dashboard()` shows a fork bar that trains another branch in its place.
Every wait is on a condition with a deadline."""

import json, re, time

import nbformat
import pytest

from test_ui import (
    ARGS,
    ARTIFACTS,
    CHROMIUM,
    boxes,
    cell,
    control,
    open_notebook,
    output,
    read_saved,
    run_cell,
    screenshot,
    slow_mlp,
    wait_for_status,
)
from test_ui import lab  # noqa: F401  (the JupyterLab fixture)

pytestmark = [pytest.mark.ui, pytest.mark.timeout(1200)]  # JupyterLab in Chromium: minutes on a busy machine

CELLS = [
    slow_mlp(0.02)
    + '''from nbtrainer import Controls, Learner, Tracker, runs
def accuracy(preds, targets): return (preds.argmax(1) == targets).float().mean()
accuracy.__name__ = LONG_NAME  # a long name, with mathtext's $: the legend shows it, cut to fit
learn = Learner(SlowMLP(), DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
                DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32), lr=0.05, fork_points=4,
                metrics=[accuracy], cbs=[Controls(), Tracker('runs.db')])''',
    'await learn.fit_async(steps=40_000, eval_every=10)  # paused, then forked from its dashboard',
    "from nbtrainer.testing import wait_for\n"
    "parent_run = learn.fit_progress.parent\n"
    "wait_for(lambda: any(r['step'] > parent_run['step'] for r in learn.recorder.history), 'the branch\\'s first "
    "evaluation row', seen=lambda: f'step {learn.step}, rows at {[r[\"step\"] for r in learn.recorder.history][-3:]}')\n"
    "print('BRANCH-STATE', json.dumps({'parent': parent_run, 'fitting': learn.fitting, 'step': learn.step, "
    "'lrs': sorted({r['lr'] for r in learn.recorder.history if r['step'] > parent_run['step']}), "
    "'parent_drawn': learn.cbs[[type(c).__name__ for c in learn.cbs].index('Dashboard')].plot.parent_curves is not None, "
    "'runs': [{'id': r.id, 'parent': r.parent} for r in runs('runs.db')]}))",
    'learn.dashboard()  # after the fit: its summary, and a fork bar',
]
SETUP, FIT, STATE, AFTER = range(4)
LONG_NAME = 'accuracy_in_$_of_the_held_out_examples_counted_over_every_evaluation_batch_seen'  # 80 characters


def test_a_rows_fork_control_during_a_paused_fit_trains_a_branch(lab):
    from playwright.sync_api import sync_playwright

    port, folder = lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.cells[0].source = f'import json, time\nLONG_NAME = {LONG_NAME!r}\n' + nb.cells[0].source
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
            dash = cell(page, FIT)
            forks, rows = dash.locator('.nbtrainer-fork button'), dash.locator('.nbtrainer-history tbody tr')
            deadline = time.time() + 180
            while rows.count() < 4:  # four evaluations shown
                assert time.time() < deadline, 'the table never got four rows'
                page.wait_for_timeout(100)
            assert forks.count() == 0  # running: nothing to fork from yet

            screenshot(dash.locator('.nbtrainer-figure'), ARTIFACTS / 'long-legend.png')  # replaced as the fit runs
            control(dash, 'Pause').click()
            paused_at = int(wait_for_status(page, dash, r'paused at step (\d+)').group(1))
            assert dash.locator('.nbtrainer-head').inner_text() == f'Paused at step {paused_at}:'
            forks.first.wait_for(timeout=30_000)  # offered while paused: the kept evaluations among the rows shown
            # the fork choices read as forks: not red as Stop is, their label on their line, left of them
            colors = dash.evaluate('''d => [d.querySelector('.nbtrainer-actions button'),
                d.querySelector('.nbtrainer-fork button')].map(b => getComputedStyle(b).backgroundColor)''')
            assert colors[0] != colors[1], colors
            where = boxes(dash, label='.nbtrainer-fork-label', button='.nbtrainer-fork button')
            label, button = where['label'], where['button']
            middle = label['y'] + label['height'] / 2
            assert button['y'] <= middle <= button['y'] + button['height'] and label['x'] < button['x'], where
            deadline = time.time() + 30
            while True:  # the table's view may show the newest row a moment after the fork buttons: both settle
                shown = [int(rows.nth(i).locator('td').nth(1).inner_text()) for i in range(rows.count())]
                offered = [int(forks.nth(i).inner_text()) for i in range(forks.count())]
                if set(offered) <= set(shown) or time.time() > deadline:
                    break
                page.wait_for_timeout(100)
            assert offered and set(offered) <= set(shown) and len(offered) <= 4, (offered, shown)  # fork_points=4
            field = dash.locator('.nbtrainer-controls input').first
            field.fill('0.005')
            field.press('Enter')
            wait_for_status(page, dash, r'lr 0\.005')  # applied at once while paused: the field holds it
            fork_step = offered[0]
            assert fork_step < paused_at
            page.screenshot(path=str(ARTIFACTS / 'fork-paused.png'))
            screenshot(dash.locator('.nbtrainer-controls'), ARTIFACTS / 'fork-controls.png')
            forks.first.click()

            # the parent ends, the branch takes its place in the same output and trains from the fork point. The parent's
            # summary first says the fork; it names the branch's run once the branch has one, above the branch's own
            # dashboard, whose status is running (the parent's said paused, at a step past the fork too)
            named = rf'Requests: paused at step {paused_at} · forked at step {fork_step} with lr 0\.005 → run [0-9a-f]{{12}}'
            branch = cell(page, FIT)
            deadline = time.time() + 180
            while True:
                shown = branch.locator('.nbtrainer-status')
                status = shown.first.inner_text() if shown.count() else ''
                found = re.search(r'step (\d+)', status)
                trained = found and 'paused' not in status and int(found.group(1)) > fork_step + 10
                said = branch.inner_text()
                if re.search(named, said) and trained:
                    break
                assert time.time() < deadline, (
                    f'the branch did not train under a summary naming it: {status!r} {said!r}'
                )
                page.wait_for_timeout(100)
            assert 'resumed at step' not in said and 'lr 0.005 from step' not in said
            run_cell(page, STATE)  # the kernel is free: the awaited parent fit has ended
            box = page.locator(output('BRANCH-STATE')).first
            box.wait_for(timeout=120_000)
            state = json.loads(box.inner_text().split('BRANCH-STATE', 1)[1])
            assert state['parent']['step'] == fork_step and state['fitting'] and state['step'] > fork_step
            assert state['lrs'] == [0.005], state['lrs']  # every branch row trained with the new lr
            assert state['parent_drawn']  # the live figure draws the parent run behind the branch
            branches = [r for r in state['runs'] if r['parent']]  # the registry: the parent run, and its branch
            assert len(state['runs']) == 2 and len(branches) == 1 and branches[0]['parent']['step'] == fork_step
            assert branches[0]['parent']['run'] in {r['id'] for r in state['runs']} - {
                branches[0]['id']
            }  # its id there
            branch.locator('.nbtrainer-figure').wait_for(timeout=60_000)  # the branch's first frame
            cell(page, FIT).screenshot(path=str(ARTIFACTS / 'fork-branch.png'))

            control(branch, 'Stop').click()
            outputs = cell(page, FIT).locator('.jp-OutputArea')
            deadline = time.time() + 120
            live = cell(page, FIT).locator('.nbtrainer-controls')
            while outputs.inner_text().count('Fit stopped') < 2 or live.count():  # both summaries, as plain outputs
                assert time.time() < deadline, 'the branch did not stop'
                page.wait_for_timeout(100)
            deadline = time.time() + 60
            while True:  # the saved notebook keeps both runs' summaries in the cell that ran the fit
                page.keyboard.press('Control+s')
                saved = read_saved(folder / 'fork.ipynb').cells[FIT].outputs
                html_out = ''.join(o.get('data', {}).get('text/html', '') for o in saved)
                if f'forked at step {fork_step}' in html_out and html_out.count('Fit stopped') == 2:
                    break
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
            again = cell(page, AFTER)
            deadline = time.time() + 120
            while True:
                status = again.locator('.nbtrainer-status')
                found = re.search(r'step (\d+)', status.inner_text() if status.count() else '')
                if found and int(found.group(1)) > chosen + 5:
                    break
                assert time.time() < deadline, 'the branch from the fork bar did not train'
                page.wait_for_timeout(100)
            assert 'lr 0.002' in again.locator('.nbtrainer-status').inner_text()
            control(again, 'Stop').scroll_into_view_if_needed()
            control(again, 'Stop').click()
            cell(page, AFTER).locator('.jp-OutputArea-output:has-text("Fit stopped")').first.wait_for(timeout=120_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / 'fork-failure.png'))
            raise
        finally:
            browser.close()
