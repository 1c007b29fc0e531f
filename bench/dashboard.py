"""What a long fit's live dashboard costs the browser, in a real JupyterLab in headless Chromium (Playwright).

A token-less JupyterLab on a free loopback port runs one cell: a linear model whose training forward sleeps `--step-ms`,
`Learner(..., metrics=('accuracy', 'f1'))` with its default display (the `Dashboard`, live figure on) and
`await learn.fit_async(steps=N, eval_every=1)`: N evaluations, a table row each. The browser records each websocket
frame (bytes; sent when, from its header; received when; holding the live figure, i.e. a figure frame?) and each main-thread long
task (>= 50 ms); the kernel, the fit's start and end, each evaluation's end and the figure frames it drew. Reported:
bytes per evaluation (first and last 100), MB over the fit (summary included), long tasks until the summary shows and
over the last 100 evaluations, the first figure frame and the longest gap between frames. A benchmark: no assertions.

    python bench/dashboard.py [--evals 1000] [--step-ms 10] [--code CHECKOUT] [--json]
"""

import argparse, contextlib, json, os, shutil, socket, struct, subprocess, sys, tempfile, time, urllib.request
from datetime import datetime
from pathlib import Path

import nbformat

ARGS = [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
]
LONGTASKS = '''window.__longtasks = [];
new PerformanceObserver(list => { for (const e of list.getEntries())
    window.__longtasks.push([(performance.timeOrigin + e.startTime) / 1000, e.duration]); })
  .observe({type: 'longtask', buffered: true});'''
CELL = '''import sys; sys.path.insert(0, {code!r})
import json, time, torch, torch.nn as nn, nbtrainer
from torch.utils.data import DataLoader, TensorDataset
from nbtrainer import Callback, Learner, Order, Dashboard

class Slow(nn.Linear):
    def forward(self, x):
        if self.training: time.sleep({step_ms} / 1000)
        return super().forward(x)

class Clock(Callback):
    order = Order.DISPLAY + 1  # after the dashboard has sent the evaluation's row
    def before_fit(self): self.start, self.evals = time.time(), []
    def after_eval(self): self.evals.append(time.time())
    def after_fit(self): self.end = time.time()

torch.manual_seed(0)
x = torch.randn(256, 8); y = (x[:, 0] > 0).long()
train = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
valid = DataLoader(TensorDataset(x[:32], y[:32]), batch_size=32)
clock = Clock()
learn = Learner(Slow(8, 2), train, valid, lr=0.05, metrics=('accuracy', 'f1'), cbs=[clock])
await learn.fit_async(steps={evals}, eval_every=1)
dash = next(cb for cb in learn.cbs if isinstance(cb, Dashboard))
json.dump(dict(start=clock.start, end=clock.end, evals=clock.evals, frames=dash.plot.times, module=nbtrainer.__file__),
          open('kernel.json', 'w'))'''


@contextlib.contextmanager
def jupyterlab(folder):
    "A token-less JupyterLab on a free loopback port serving `folder` (news toast and autosave off); yields the port."
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    settings = folder / 'settings' / '@jupyterlab'
    for plugin, text in (
        ('apputils-extension/notification', '{"fetchNews": "false", "checkForUpdates": false}'),
        ('docmanager-extension/plugin', '{"autosave": false}'),
    ):
        (settings / plugin).parent.mkdir(parents=True, exist_ok=True)
        (settings / plugin).with_suffix('.jupyterlab-settings').write_text(text)
    env = {
        **os.environ,
        'JUPYTERLAB_SETTINGS_DIR': str(settings.parent),
        'JUPYTERLAB_WORKSPACES_DIR': str(folder / 'ws'),
    }
    with open(folder / 'lab.log', 'w') as log:
        lab = subprocess.Popen(
            [
                Path(sys.executable).parent / 'jupyter',
                'lab',
                '--no-browser',
                f'--port={port}',
                '--ServerApp.token=',
                '--ServerApp.ip=127.0.0.1',
                '--allow-root',
                f'--ServerApp.root_dir={folder}',
            ],
            env=env,
            cwd=folder,
            stdout=log,
            stderr=log,
        )
        try:
            for _ in range(240):
                try:
                    urllib.request.urlopen(f'http://127.0.0.1:{port}/api/status')
                    break
                except OSError:
                    time.sleep(0.25)
            else:
                sys.exit('JupyterLab did not start')
            yield port
        finally:
            lab.terminate()
            try:
                lab.wait(timeout=20)
            except subprocess.TimeoutExpired:
                lab.kill()


def wait(page, condition, what, timeout):
    "Poll `condition` (the page's events are taken meanwhile) until it holds, or fail after `timeout` seconds."
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            sys.exit(f'timed out waiting for {what}')
        page.wait_for_timeout(100)


def sent_at(payload):
    "When the kernel (or server) sent a websocket message: its header's date. JupyterLab 4 speaks the binary v1 protocol."
    try:
        if isinstance(payload, str):
            header = json.loads(payload)['header']
        else:  # v1: the number of parts, their offsets, then channel, header, parent, metadata, content, buffers
            offsets = struct.unpack_from(f'<{struct.unpack_from("<Q", payload)[0]}Q', payload, 8)
            header = json.loads(payload[offsets[1] : offsets[2]])
        return datetime.fromisoformat(header['date'].replace('Z', '+00:00')).timestamp()
    except (ValueError, KeyError, struct.error):
        return None  # not a kernel message (the server's event stream)


def measure(args, folder, port):
    from playwright.sync_api import sync_playwright

    cell = CELL.format(code=str(args.code), step_ms=args.step_ms, evals=args.evals)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, folder / 'bench.ipynb')
    api = lambda path: json.load(urllib.request.urlopen(f'http://127.0.0.1:{port}/api/{path}'))
    frames = []  # (sent, received, bytes, holds a live frame): the figure's output, updated with a new frame

    def received(payload):
        data = payload.encode() if isinstance(payload, str) else payload
        if (sent := sent_at(payload)) is not None:
            frames.append((sent, time.time(), len(data), b'nbtrainer-figure' in data and b'base64' in data))

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which('chromium') or '/usr/bin/chromium', args=ARGS)
        page = browser.new_page(viewport={'width': 1400, 'height': 1200})
        page.add_init_script(LONGTASKS)
        page.on('websocket', lambda ws: ws.on('framereceived', received))
        page.goto(f'http://127.0.0.1:{port}/lab/tree/bench.ipynb?reset')
        page.wait_for_selector('.jp-Notebook .jp-Cell', timeout=120_000)
        wait(
            page,
            lambda: any(
                s['kernel']['execution_state'] == 'idle' and s['kernel']['connections'] > 0 for s in api('sessions')
            ),
            'an idle, connected kernel',
            120,
        )
        page.locator('.jp-Notebook .jp-Cell .jp-InputArea-editor').first.click()
        page.keyboard.press('Shift+Enter')
        summary = page.locator('.jp-OutputArea-output:has-text("Fit finished at step")')
        wait(page, lambda: summary.count() > 0, 'the summary of the fit', 3600)  # every earlier message is in
        shown = time.time()
        wait(page, (folder / 'kernel.json').exists, "the kernel's figures", 60)
        page.wait_for_timeout(500)  # the observer's last entries
        longtasks = page.evaluate('window.__longtasks')
        browser.close()
    return json.loads((folder / 'kernel.json').read_text()), frames, longtasks, shown


def report(kernel, frames, longtasks, shown):
    "Bytes by when the kernel sent them; stalls and figure frames by when the browser had them (it may lag behind)."
    start, end, evals, drawn = kernel['start'], kernel['end'], kernel['evals'], kernel['frames']
    k = min(100, len(evals) // 2)
    sent = lambda a, b, png=(True, False): sum(n for t, _, n, p in frames if a < t <= b and p in png)
    per_eval = lambda a, b, png=(True, False): round(sent(a, b, png) / k)

    def stalls(a, b):
        ds = [d for t, d in longtasks if a <= t <= b]
        return dict(count=len(ds), total_ms=round(sum(ds)), longest_ms=round(max(ds, default=0)))

    last_k = min(r for t, r, _, _ in frames if t > evals[-k - 1])  # when the browser got the first of the last k
    pngs = sorted(r for t, r, _, p in frames if p and t >= start)
    gap = lambda ts: round(max((b - a for a, b in zip(ts, ts[1:])), default=0), 2)
    return {
        'evaluations': len(evals),
        'fit_s': round(end - start, 1),
        'summary_shown_s': round(shown - start, 1),
        f'bytes_per_eval_first_{k}': per_eval(start, evals[k - 1]),
        f'bytes_per_eval_last_{k}': per_eval(evals[-k - 1], evals[-1]),
        f'bytes_per_eval_first_{k}_no_figure': per_eval(start, evals[k - 1], (False,)),
        f'bytes_per_eval_last_{k}_no_figure': per_eval(evals[-k - 1], evals[-1], (False,)),
        'fit_MB': round(sent(start, end) / 1e6, 2),
        'fit_figure_MB': round(sent(start, end, (True,)) / 1e6, 2),
        'longtasks_fit': stalls(start, shown),
        f'longtasks_last_{k}': stalls(last_k, shown),
        'figure_frames_received': len(pngs),
        'first_frame_s': round(pngs[0] - start, 2) if pngs else None,
        'longest_frame_gap_s': gap(pngs),
        'figure_frames_shown': len(drawn),
        'longest_gap_shown_s': gap(drawn),
        'module': kernel['module'],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--evals', type=int, default=1000)
    parser.add_argument('--step-ms', type=float, default=10)
    parser.add_argument('--code', type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument('--json', action='store_true')
    args = parser.parse_args()
    args.code = args.code.resolve()
    with tempfile.TemporaryDirectory() as tmp, jupyterlab(Path(tmp)) as port:
        result = report(*measure(args, Path(tmp), port))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for key, value in result.items():
            print(
                f'{key:34} '
                + (' '.join(f'{k} {v}' for k, v in value.items()) if isinstance(value, dict) else str(value))
            )


if __name__ == '__main__':
    main()
