"""The dashboard and `fit_async` in a real Jupyter kernel, headless (no browser): what Jupyter receives, and interrupts."""
import queue, re, textwrap, time

import nbformat
import pytest
from jupyter_client.manager import start_new_kernel
from nbclient import NotebookClient

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
    NotebookClient(nb, timeout=120, kernel_name='python3', resources={'metadata': {'path': str(tmp_path)}}).execute()
    return nb


def test_dashboard_is_the_default_and_leaves_a_static_summary(tmp_path):
    nb = run_notebook([SETUP, '''
        learn = Learner(SlowLinear(8, 2), dl, dl, lr=0.1, cbs=[NoteEnd()])
        await learn.fit_async(2)''', '''
        learn2 = Learner(nn.Linear(8, 2), dl, dl, lr=0.1, dashboard=False)
        learn2.fit(1)
        print(type(learn.cbs[1]).__name__, type(learn2.cbs[1]).__name__)'''], tmp_path)
    dash_out, = nb.cells[1].outputs  # one output, updated in place: the dashboard, then its summary
    assert dash_out.output_type == 'display_data'
    html = dash_out.data['text/html']
    assert 'Fit ended at step 80 of 80' in html and '<table' in html and 'data:image/png;base64,' in html
    assert 'application/vnd.jupyter.widget-view+json' not in dash_out.data  # replaced, not left as a dead widget
    opt_out = nb.cells[2].outputs
    assert any('application/vnd.jupyter.widget-view+json' in o.get('data', {}) for o in opt_out)  # tqdm.notebook bars
    assert 'Dashboard ProgressCallback' in ''.join(o.get('text', '') for o in opt_out)


def shell_reply(kc, msg_id, timeout=60):
    "The shell reply to request `msg_id`: readiness polling and earlier requests may have left other replies queued."
    deadline = time.time() + timeout
    while True:
        msg = kc.get_shell_msg(timeout=max(0.1, deadline - time.time()))
        if msg['parent_header'].get('msg_id') == msg_id: return msg


def execute(kc, code, timeout=60, **kwargs):
    "Run `code`; return (reply content, printed text). Replies and output are matched to this request by its id."
    msg_id = kc.execute(code, **kwargs)
    reply = shell_reply(kc, msg_id, timeout)
    printed = []
    if reply['content']['status'] == 'aborted': return reply['content'], ''  # never ran: no output to wait for
    deadline = time.time() + timeout
    while True:
        try: msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.time()))
        except queue.Empty: raise TimeoutError(code)
        if msg['parent_header'].get('msg_id') != msg_id: continue
        if msg['msg_type'] == 'stream': printed.append(msg['content']['text'])
        if msg['msg_type'] == 'status' and msg['content']['execution_state'] == 'idle': break
    return reply['content'], ''.join(printed)


def evaluate(kc, expression, attempts=20):
    "The value of `expression` in the kernel, read from the execute reply (not from printed output)."
    import ast
    for _ in range(attempts):  # a request that arrives while the kernel still aborts after an error is aborted: ask again
        reply, _ = execute(kc, '', user_expressions={'value': expression})
        if reply['status'] != 'aborted': break
    assert 'user_expressions' in reply, reply
    result = reply['user_expressions']['value']
    assert result['status'] == 'ok', result
    return ast.literal_eval(result['data']['text/plain'])


def wait_until_training(kc, msg_id, timeout=120):
    "Read iopub until the dashboard's status line shows a step > 0: the loop is running, however loaded the machine."
    deadline = time.time() + timeout
    while True:
        msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.time()))
        if msg['parent_header'].get('msg_id') != msg_id or msg['msg_type'] != 'comm_msg': continue
        value = msg['content']['data'].get('state', {}).get('value')
        if isinstance(value, str) and re.match(r'step [1-9]', value): return


@pytest.mark.parametrize('call', ['await learn.fit_async(100)', 'learn.fit(100)'])
def test_interrupt_ends_the_fit_cleanly(call):
    km, kc = start_new_kernel(kernel_name='python3')
    try:
        execute(kc, SETUP)
        execute(kc, 'learn = Learner(SlowLinear(8, 2), dl, dl, lr=0.1, cbs=[NoteEnd()])')
        msg_id = kc.execute(call)
        wait_until_training(kc, msg_id)
        km.interrupt_kernel()
        reply = shell_reply(kc, msg_id)
        assert reply['content']['status'] == 'error'
        assert reply['content']['ename'] in ('KeyboardInterrupt', 'CancelledError')
        ended, step, fitting, training = evaluate(kc, '(ended, learn.step, learn.fitting, learn.model.training)')
        assert ended == [step] and 0 < step < 4000 and not fitting and training  # after_fit ran, at the last batch
        assert evaluate(kc, '(learn.fit(1), learn.step)[1]') == step + 40  # still usable
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.mark.parametrize('name', ['16_control', '17_dashboard'])
def test_control_and_dashboard_notebooks_in_a_real_kernel(name, tmp_path):
    "nbdev-test runs these without a kernel; here the dashboard is displayed for real and fit_async meets ipykernel's loop."
    from conftest import ROOT
    nb = nbformat.read(ROOT / 'nbs' / f'{name}.ipynb', as_version=4)
    NotebookClient(nb, timeout=300, kernel_name='python3', resources={'metadata': {'path': str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs if o.output_type == 'error']
    assert not errors, errors
