"""The dashboard and `fit_async` in a real Jupyter kernel, headless (no browser): what Jupyter receives, interrupts and
errors (one line each), a fit trained in the background whose dashboard is shown again in another cell, a cell queued
behind an awaited fit that shows its dashboard at once (the frames beside busy processes are timed by bench/frames.py).
Every read of the kernel's channels has a deadline and fails saying what it waited for and the last messages seen; the
fits trained in the background plan 40,000 steps (200 s at least), far more than the tests' waits, and are stopped."""

import queue, re, textwrap, time

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import kernel_manager, start_kernel
from nbtrainer.control import _SENT_WITH
from nbtrainer.testing import wait_for

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(900)]

SETUP = '''
import time, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from nbtrainer import Learner, Callback

class SlowLinear(nn.Linear):
    def forward(self, x):
        time.sleep(0.005)
        return super().forward(x)

class NoteEnd(Callback):
    def after_fit(self): ended.append(self.learn.step)

ended = []
x = torch.randn(640, 8); y = (x[:, 0] > 0).long()
dl = DataLoader(TensorDataset(x, y), batch_size=16)
'''


def run_notebook(cells, tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(c)) for c in cells])
    NotebookClient(nb, timeout=120, km=kernel_manager(), resources={'metadata': {'path': str(tmp_path)}}).execute()
    return nb


def test_dashboard_is_the_default_and_leaves_a_static_summary(tmp_path):
    nb = run_notebook(
        [
            SETUP,
            '''
        learn = Learner(SlowLinear(8, 2), dl, dl, lr=0.1, cbs=[NoteEnd()])
        await learn.fit_async(2)''',
            '''
        learn2 = Learner(nn.Linear(8, 2), dl, dl, lr=0.1, dashboard=False)
        learn2.fit(1)
        print(type(learn.cbs[1]).__name__, type(learn2.cbs[1]).__name__)''',
        ],
        tmp_path,
    )
    # the dashboard's output, updated in place to its summary, and the mid-fit snapshot's, emptied at the end
    (dash_out,) = [o for o in nb.cells[1].outputs if any(o.get('data', {}).values())]
    assert dash_out.output_type == 'display_data'
    html = dash_out.data['text/html']
    assert 'Fit finished at step 80 of 80' in html and '<table' in html and 'data:image/png;base64,' in html
    assert 'application/vnd.jupyter.widget-view+json' not in dash_out.data  # replaced, not left as a dead widget
    opt_out = nb.cells[2].outputs  # dashboard=False: tqdm.notebook bars, each ending as its text (no dead widget)
    assert not any('application/vnd.jupyter.widget-view+json' in o.get('data', {}) for o in opt_out)
    bars = [o.data['text/plain'] for o in opt_out if o.output_type == 'display_data' and o.data.get('text/plain')]
    assert len(bars) == 1 and bars[0].startswith('epoch: 100%') and '1/1' in bars[0]
    assert 'Dashboard ProgressCallback' in ''.join(o.get('text', '') for o in opt_out)


def test_the_display_is_chosen_by_argument_or_environment(tmp_path):
    "display='html' and NBTRAINER_DISPLAY=html: no widget, the HTML summary; display='text': text bars and rows."
    nb = run_notebook(
        [
            SETUP,
            """
        learn = Learner(SlowLinear(8, 2), dl, dl, lr=0.1, display='html')
        await learn.fit_async(1)""",
            """
        import os
        os.environ['NBTRAINER_DISPLAY'] = 'html'
        Learner(nn.Linear(8, 2), dl, dl, lr=0.1).fit(1)
        del os.environ['NBTRAINER_DISPLAY']""",
            """
        Learner(nn.Linear(8, 2), dl, dl, lr=0.1, display='text').fit(1)""",
        ],
        tmp_path,
    )
    for i in (1, 2):
        outputs = nb.cells[i].outputs
        assert not any('application/vnd.jupyter.widget-view+json' in o.get('data', {}) for o in outputs)
        (summary,) = [o.data['text/html'] for o in outputs if o.get('data', {}).get('text/html')]
        assert 'Fit finished at step 40 of 40' in summary and '<table' in summary, i
    text = ''.join(o.get('text', '') for o in nb.cells[3].outputs)
    assert not any(o.get('data') for o in nb.cells[3].outputs) and 'epoch: 100%' in text and 'valid_loss' in text


def describe(msg):
    "A message in a few words, for a timeout's report: its type, its request and its gist."
    content, gist = msg['content'], ''
    if msg['msg_type'] == 'status':
        gist = content['execution_state']
    elif msg['msg_type'] in ('display_data', 'update_display_data'):
        gist = next(iter(re.findall(r'step \d+[^<]{0,40}', content['data'].get('text/html', ''))), '')
    elif msg['msg_type'] == 'stream':
        gist = content['text'][:40]
    return f"{msg['msg_type']} of {msg['parent_header'].get('msg_id', '?')[:8]} {gist}".strip()


def incoming(get, what, timeout=120):
    """Messages from `get` (`kc.get_iopub_msg`, `kc.get_shell_msg`) for the caller to read until it has what it waits
    for; after `timeout` s a TimeoutError says `what` that was and the last messages seen (a running fit's updates keep
    coming, so the deadline is checked at each message, not only when the channel is quiet)."""
    deadline, seen = time.monotonic() + timeout, []
    while True:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise queue.Empty
            msg = get(timeout=left)
        except queue.Empty:
            raise TimeoutError(f'waited {timeout} s for {what}; the last messages: {seen[-10:]}') from None
        seen.append(describe(msg))
        yield msg


def shell_reply(kc, msg_id, timeout=60):
    "The shell reply to request `msg_id`: readiness polling and earlier requests may have left other replies queued."
    for msg in incoming(kc.get_shell_msg, f'the shell reply to {msg_id[:8]}', timeout):
        if msg['parent_header'].get('msg_id') == msg_id:
            return msg


def execute(kc, code, timeout=60, **kwargs):
    "Run `code`; return (reply content, printed text). Replies and output are matched to this request by its id."
    msg_id = kc.execute(code, **kwargs)
    reply = shell_reply(kc, msg_id, timeout)
    printed = []
    if reply['content']['status'] == 'aborted':
        return reply['content'], ''  # never ran: no output to wait for
    for msg in incoming(kc.get_iopub_msg, f'the end of the output of {code!r}', timeout):
        if msg['parent_header'].get('msg_id') != msg_id:
            continue
        if msg['msg_type'] == 'stream':
            printed.append(msg['content']['text'])
        if msg['msg_type'] == 'status' and msg['content']['execution_state'] == 'idle':
            break
    return reply['content'], ''.join(printed)


def evaluate(kc, expression, attempts=20):
    "The value of `expression` in the kernel, read from the execute reply (not from printed output)."
    import ast

    for _ in range(
        attempts
    ):  # a request that arrives while the kernel still aborts after an error is aborted: ask again
        reply, _ = execute(kc, '', user_expressions={'value': expression})
        if reply['status'] != 'aborted':
            break
    assert 'user_expressions' in reply, reply
    result = reply['user_expressions']['value']
    assert result['status'] == 'ok', result
    return ast.literal_eval(result['data']['text/plain'])


def status_step(msg):
    "The step the dashboard's status line shows in a display message, None in any other message."
    if msg['msg_type'] not in ('display_data', 'update_display_data'):
        return None
    found = re.search(r'class="nbtrainer-status">step (\d+)', msg['content']['data'].get('text/html', ''))
    return int(found.group(1)) if found else None


def figure_step(msg):
    "The last step of the live frame a display message shows (the figure's `data-step`), None in any other message."
    if msg['msg_type'] not in ('display_data', 'update_display_data'):
        return None
    found = re.search(r'class="nbtrainer-figure" data-step="(\d+)"', msg['content']['data'].get('text/html', ''))
    return int(found.group(1)) if found else None


def wait_until_training(kc, msg_id, timeout=120):
    "Read iopub until the dashboard's status line shows a step > 0: the loop is running, however loaded the machine."
    for msg in incoming(kc.get_iopub_msg, 'the status line to show a step > 0', timeout):
        if msg['parent_header'].get('msg_id') == msg_id and (status_step(msg) or 0) > 0:
            return


def iopub_until_idle(kc, msg_id, timeout=120):
    "Every iopub message of request `msg_id` until the kernel is idle again."
    found = []
    for msg in incoming(kc.get_iopub_msg, f'request {msg_id[:8]} to end (the kernel idle)', timeout):
        if msg['parent_header'].get('msg_id') != msg_id:
            continue
        found.append(msg)
        if msg['msg_type'] == 'status' and msg['content']['execution_state'] == 'idle':
            return found


def wait_for_kernel(kc, expression, what, timeout=60):
    "Evaluate `expression` in the kernel until it is true (a deadline; the message says what it was last)."
    last = []
    wait_for(
        lambda: last.append(evaluate(kc, expression)) or last[-1], what, timeout, seen=lambda: last[-1:], every=0.1
    )


def start_background_fit(kc, learner_args):
    """In a fresh kernel: the setup, a Learner made with `learn_args`, and `task = learn.fit_async(1000)` not awaited
    (40,000 steps: the test stops it); returns the fit cell's iopub messages (the cell ends while the fit trains)."""
    execute(kc, SETUP)
    execute(kc, f'learn = Learner(SlowLinear(8, 2), dl, dl, lr=0.1, {learner_args})')
    first = kc.execute('task = learn.fit_async(1000)')
    messages = iopub_until_idle(kc, first)
    assert shell_reply(kc, first)['content']['status'] == 'ok'
    return messages


def summaries(messages):
    """The HTML every updated display ends with, by display id: the static summaries the dashboard put in place of its
    displays (the mid-fit snapshot's output, below the first, shows the summary for a moment, then ends empty)."""
    last = {
        m['content']['transient']['display_id']: m['content']['data']
        for m in messages
        if m['msg_type'] == 'update_display_data'
    }
    return {i: data['text/html'] for i, data in last.items() if 'text/html' in data}


def test_the_first_frame_comes_as_the_fit_starts_and_a_dollar_named_metric_draws():
    """The layout frame (axes to come) is the first figure the kernel sends, requested before the first batch; live
    curves follow in order. The metric is named with mathtext's `$`: it is drawn as plain text, no error anywhere."""
    km, kc = start_kernel()
    try:
        execute(kc, SETUP)
        setup = """
            def odd(preds, targets): return (preds.argmax(1) == targets).float().mean()
            odd.__name__ = 'usd_$_per_$_call'
            learn = Learner(SlowLinear(8, 2), dl, dl, lr=0.1, metrics=[odd])"""
        execute(kc, textwrap.dedent(setup))
        msg_id = kc.execute('learn.fit(8)')  # 320 batches of 5 ms or more
        messages = iopub_until_idle(kc, msg_id)
        assert shell_reply(kc, msg_id)['content']['status'] == 'ok'
        shown = [m for m in messages if m['msg_type'] in ('display_data', 'update_display_data')]
        figures = [m for m in shown if 'class="nbtrainer-figure"' in m['content']['data'].get('text/html', '')]
        assert figures and figure_step(figures[0]) is None, 'the first frame is the layout frame, sent before a batch'
        live = [figure_step(m) for m in figures[1:]]
        assert live and None not in live and live == sorted(live), live
        print(f'then {len(live)} live frames at steps {live}')
        (summary,) = summaries(messages).values()
        assert 'Fit finished at step 320 of 320' in summary and 'could not be drawn' not in summary
        assert 'usd_$_per_$_call' in summary and 'data:image/png;base64,' in summary
        assert evaluate(kc, 'learn.fit_outcome') == 'finished'
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.mark.parametrize('call', ['await learn.fit_async(1000)', 'learn.fit(1000)'])
def test_interrupt_ends_the_fit_cleanly(call):
    km, kc = start_kernel()
    try:
        execute(kc, SETUP)
        execute(kc, 'learn = Learner(SlowLinear(8, 2), dl, dl, lr=0.1, cbs=[NoteEnd()])')
        msg_id = kc.execute(call)
        wait_until_training(kc, msg_id)
        km.interrupt_kernel()
        messages = iopub_until_idle(kc, msg_id)
        reply = shell_reply(kc, msg_id)
        assert reply['content']['status'] == 'error'
        assert reply['content']['ename'] in ('KeyboardInterrupt', 'CancelledError')
        ended, step, fitting, training = evaluate(kc, '(ended, learn.step, learn.fitting, learn.model.training)')
        assert ended == [step] and 0 < step < 40000 and not fitting and training  # after_fit ran, at the last batch
        # One line in the cell, not a traceback through asyncio or the loop; the dashboard's summary says the same.
        (line,) = reply['content']['traceback']
        assert f'Fit interrupted at step {step} of 40000' in line, line
        (summary,) = summaries(messages).values()
        assert f'Fit interrupted at step {step} of 40000' in summary
        assert evaluate(kc, '(learn.fit(1), learn.step)[1]') == step + 40  # still usable
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_interrupt_button_ends_a_background_fit_and_is_harmless_with_none():
    "An idle ipykernel ignores SIGINT: nbtrainer makes it end the fit trained in the background, cleanly."
    km, kc = start_kernel()
    try:
        start_background_fit(kc, 'cbs=[NoteEnd()]')
        assert evaluate(kc, 'learn.fitting')
        km.interrupt_kernel()  # the kernel is idle: no cell runs
        wait_for_kernel(kc, 'task.done()', 'the interrupt to end the background fit')
        ended, step, outcome = evaluate(kc, '(ended, learn.step, learn.fit_outcome)')
        assert ended == [step] and 0 < step < 40000 and outcome == 'interrupted'  # after_fit ran, early
        km.interrupt_kernel()  # no fit runs: nothing happens, the kernel and its state stay
        # The signal is pending once interrupt_kernel() returns, and Python runs its handler on the main thread before
        # any further code there: before this request is handled, so the fit below comes after it (no sleep needed).
        assert evaluate(kc, '(learn.fit(1), learn.step)[1]') == step + 40
        # a running cell still gets the usual KeyboardInterrupt: interrupted once it has printed that it runs
        slow = kc.execute("print('running', flush=True); import time; time.sleep(300)")
        for msg in incoming(kc.get_iopub_msg, 'the slow cell to start running'):
            if msg['parent_header'].get('msg_id') == slow and msg['msg_type'] == 'stream':
                break
        km.interrupt_kernel()
        assert shell_reply(kc, slow)['content']['ename'] == 'KeyboardInterrupt'
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_an_error_in_fit_async_is_one_line_with_the_traceback_in_the_summary():
    km, kc = start_kernel()
    try:
        execute(kc, SETUP)
        execute(
            kc,
            textwrap.dedent('''
            class Boom(Callback):
                def after_batch(self):
                    if self.learn.training and self.learn.step == 3: raise RuntimeError('boom')
            learn = Learner(SlowLinear(8, 2), dl, dl, lr=0.1, cbs=[NoteEnd()])'''),
        )
        msg_id = kc.execute('await learn.fit_async(2, cbs=[Boom()])')
        messages = iopub_until_idle(kc, msg_id)
        reply = shell_reply(kc, msg_id)['content']
        assert reply['status'] == 'error' and reply['ename'] == 'RuntimeError'
        (line,) = reply['traceback']
        assert (
            'Fit failed at step 3 of 80' in line
            and 'RuntimeError: boom (raised in callback Boom during after_batch)' in line
        )
        (summary,) = summaries(messages).values()
        assert 'Fit failed at step 3 of 80' in summary and '<summary>Traceback</summary>' in summary
        assert "raise RuntimeError(&#x27;boom&#x27;)" in summary  # the full traceback, folded, in the saved output
        assert evaluate(kc, 'ended') == [3]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_background_fit_is_shown_again_by_learn_dashboard_and_both_views_get_the_summary():
    """Not awaited, fit_async returns at once; learn.dashboard() in another cell shows the dashboard again, with controls
    and the figure as it stands (its frame within a few steps of the status line); both end as the summary."""
    km, kc = start_kernel()
    try:
        launch = start_background_fit(kc, 'cbs=[NoteEnd()]')  # the cell has ended, its dashboard shown
        assert evaluate(kc, 'learn.fitting and not task.done()')
        shown = [m for m in launch if m['msg_type'] == 'display_data']
        assert 'Fit running' in shown[0]['content']['data']['text/html']  # status and bars, then controls, then figure
        assert 'application/vnd.jupyter.widget-view+json' in shown[1]['content']['data']
        assert shown[1]['content']['data']['text/plain'].startswith('Controls of the running fit')
        figure_id = shown[2]['content']['transient']['display_id']
        for msg in incoming(kc.get_iopub_msg, 'a live frame in the first view'):  # some frames in
            if figure_step(msg) and msg['content']['transient']['display_id'] == figure_id:
                drawn = figure_step(msg)  # a frame the kernel has sent: the dashboard has it, or a newer one
                break
        again = kc.execute('learn.dashboard()')
        attached = [m for m in iopub_until_idle(kc, again) if m['msg_type'] == 'display_data']
        assert len(attached) == 3 and 'application/vnd.jupyter.widget-view+json' in attached[1]['content']['data']
        status, figure = status_step(attached[0]), figure_step(attached[2])
        assert figure is not None and drawn <= figure <= status, (drawn, figure, status)  # the figure as it stands
        ids = {
            m['content']['transient']['display_id'] for m in (shown[2], attached[2])
        }  # the summary comes in the figures' place
        kc.execute("learn.controls.stop('stopped from another cell')")  # its output is not waited for: nothing skipped
        ended_views = {}
        for msg in incoming(kc.get_iopub_msg, f'the summary in both views {ids}'):
            for i, html in summaries([msg]).items():  # frames drawn before the stop update these views too: skip them
                assert i not in ended_views, f'{i} was updated after its summary: {html[:200]}'
                if i in ids and 'Fit stopped at step' in html:
                    ended_views[i] = html
            if ids <= set(ended_views):  # the summary replaces both, whatever cell is current
                break
        assert all('stopped from another cell' in html for html in ended_views.values())
        wait_for_kernel(kc, 'task.done()', 'the task to end')  # it polls the thread
        assert evaluate(kc, '(ended == [learn.step], learn.fit_outcome, learn.controls)') == (True, 'stopped', None)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def send_comm_update(kc, comm_id, state):
    "What a front end sends when a widget's value changes (a click on a ToggleButtons sets its index)."
    msg = kc.session.msg(
        'comm_msg', {'comm_id': comm_id, 'data': {'method': 'update', 'state': state, 'buffer_paths': []}}
    )
    kc.shell_channel.send(msg)


def test_a_cell_queued_behind_an_awaited_fit_shows_its_dashboard_with_working_controls():
    """`await learn.fit_async(...)` keeps the kernel busy; a cell run meanwhile (after a browser reload, say) is told at
    once that it waits for the fit, and shows the live dashboard, whose Stop ends the fit; when the fit ends, the queued
    `learn.dashboard()` runs and shows nothing more. A cell sent with the fit's (as Run All sends them) is told nothing."""
    km, kc = start_kernel()
    try:
        execute(kc, SETUP)
        execute(kc, 'learn = Learner(SlowLinear(8, 2), dl, dl, lr=0.1, cbs=[NoteEnd()])')
        awaited = kc.execute('await learn.fit_async(1000)')  # 40,000 steps: stopped below
        sent = time.time()  # the request's header is dated before this
        along = kc.execute("print('sent with the fit')")  # as Run All sends the next cells: they wait, told nothing
        wait_until_training(kc, awaited)
        # The user comes back (after a reload, say). A cell sent within _SENT_WITH s of the fit's was sent with it (Run
        # All, which must not be told): the kernel tells them apart by the dates in their headers, so this one is sent
        # later than that, by the clock those dates come from. A real constraint of the feature, not a wait for a state.
        time.sleep(max(0.0, sent + _SENT_WITH + 0.5 - time.time()))
        queued = kc.execute('learn.dashboard()')
        seen, boxes, toggles = [], {}, {}
        for msg in incoming(kc.get_iopub_msg, "the queued cell's note, status and controls"):
            if msg['msg_type'] == 'comm_open':  # the widgets' models: a box's children, a toggle's options
                state = msg['content']['data'].get('state', {})
                if state.get('_model_name') == 'HBoxModel':
                    boxes[msg['content']['comm_id']] = state['children']
                if state.get('_model_name') == 'ToggleButtonsModel':
                    toggles[msg['content']['comm_id']] = state
            if msg['parent_header'].get('msg_id') == queued and msg['msg_type'] == 'display_data':
                seen.append(msg)
            assert not (msg['parent_header'].get('msg_id') == along and msg['msg_type'] == 'display_data'), msg
            if msg['parent_header'].get('msg_id') == queued and msg['msg_type'] == 'status':
                raise AssertionError('the queued cell ran before the fit ended')
            if any('Controls of the running fit' in m['content']['data'].get('text/plain', '') for m in seen):
                break
        note, status, controls = (m['content']['data'] for m in seen[:3])
        assert 'This cell waits for the fit' in note['text/plain'] and 'Fit running' in status['text/html']
        box = controls['application/vnd.jupyter.widget-view+json']['model_id']
        stop = boxes[box][0].removeprefix('IPY_MODEL_')
        assert toggles[stop]['_options_labels'][0] == 'Stop'
        send_comm_update(kc, stop, {'index': 0})  # Stop, clicked in the queued cell while the other one awaits
        messages = iopub_until_idle(kc, awaited)
        assert shell_reply(kc, awaited)['content']['status'] == 'ok'
        assert [m['msg_type'] for m in iopub_until_idle(kc, along)] == ['status', 'execute_input', 'stream', 'status']
        later = iopub_until_idle(kc, queued)
        assert shell_reply(kc, queued)['content']['status'] == 'ok'
        ended = summaries(messages + later)  # the awaiting cell's status output and the queued cell's, as summaries
        assert len(ended) == 2 and all(
            'Fit stopped at step' in h and 'Stop button clicked' in h for h in ended.values()
        )
        ran = [
            m for m in later if m['msg_type'] == 'display_data'
        ]  # learn.dashboard(), run at last, shows nothing more
        assert not ran, ran
        assert evaluate(kc, '(ended == [learn.step], learn.fit_outcome)') == (True, 'stopped')
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_html_dashboard_of_a_background_fit_is_shown_again_and_both_views_get_the_summary():
    """display='html': plain outputs, no widget (the status refreshed in place, then the figure and table);
    learn.dashboard() adds another pair; stopped from code, the summary takes each figure's place, each status
    empties."""
    km, kc = start_kernel()
    try:
        shown = [m for m in start_background_fit(kc, "display='html'") if m['msg_type'] == 'display_data']
        assert len(shown) == 2 and 'Fit running' in shown[0]['content']['data']['text/html']
        assert not any('application/vnd.jupyter.widget-view+json' in m['content']['data'] for m in shown)
        again = kc.execute('learn.dashboard()')
        attached = [m for m in iopub_until_idle(kc, again) if m['msg_type'] == 'display_data']
        assert len(attached) == 2 and 'Fit running' in attached[0]['content']['data']['text/html']
        assert 'nbtrainer-view' in attached[1]['content']['data']['text/html']  # the figure as it stands, and the rows
        display_id = lambda m: m['content']['transient']['display_id']
        statuses = {display_id(shown[0]), display_id(attached[0])}
        figures = {display_id(shown[1]), display_id(attached[1])}
        running, updates = set(), {}
        for msg in incoming(kc.get_iopub_msg, f'both status outputs {statuses} refreshed while it trains'):
            if msg['msg_type'] == 'update_display_data' and 'Fit running' in msg['content']['data'].get(
                'text/html', ''
            ):
                running.add(display_id(msg))
            if len(running) == 2:
                break
        assert running == statuses
        kc.execute("learn.controls.stop('stopped from another cell')")  # its output is not waited for: nothing skipped

        def ended():  # live refreshes may still come first: the figures' summaries and the statuses emptied count
            return all('Fit stopped at step' in updates.get(i, '') for i in figures) and all(
                updates.get(i) == '' for i in statuses
            )

        for msg in incoming(kc.get_iopub_msg, 'the summaries in the figures and the statuses emptied'):
            if msg['msg_type'] == 'update_display_data':
                updates[display_id(msg)] = msg['content']['data'].get('text/html', '')
            if ended():
                break
        assert all('stopped from another cell' in updates[i] for i in figures), updates
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.mark.parametrize('name', ['16_control', '17_dashboard', '17a_dashboard_controls'])
def test_control_and_dashboard_notebooks_in_a_real_kernel(name, tmp_path):
    "nbdev-test runs these without a kernel; here the dashboard is displayed for real and fit_async meets ipykernel's loop."
    from conftest import ROOT

    nb = nbformat.read(ROOT / 'nbs' / f'{name}.ipynb', as_version=4)
    NotebookClient(nb, timeout=300, km=kernel_manager(), resources={'metadata': {'path': str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs if o.output_type == 'error']
    assert not errors, errors
