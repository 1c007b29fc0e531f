"""How steadily the live figure's frames reach a front end while a kernel trains beside busy processes (issue #32).

A CPU-bound fit of `--seconds` with the default dashboard, in a real Jupyter kernel, beside `--busy` processes running
`while True: pass` (a laptop running a browser, a shared box): each new figure frame in the figure's output is timed
by the kernel's message header, from the dashboard's first output to the fit's summary. Issue #32 asks for a frame at
least every 2 s on average and no gap over 3 s. A measurement of wall time on a shared machine, so it lives here and
not in the test suite; the exit status says whether the bounds were met.

    python bench/frames.py [--seconds 30] [--busy 2] [--calls fit fit_async] [--repeats 1]
"""

import argparse, re, subprocess, sys, time
from datetime import datetime

SETUP = '''
import time, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from nbtrainer import Callback, CancelFitException, Learner
torch.set_num_threads(1)

class StopAfter(Callback):
    "Stop the fit after `seconds` of wall time: a fit of a known length whatever the machine's speed."
    def __init__(self, seconds): self.seconds = seconds
    def before_fit(self): self.start = time.time()
    def after_batch(self):
        if time.time() - self.start > self.seconds: raise CancelFitException('time is up')

torch.manual_seed(0)
x, y = torch.randn(4096, 784), torch.randint(0, 10, (4096,))
model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
learn = Learner(model, DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True),
                DataLoader(TensorDataset(x[:512], y[:512]), batch_size=256), lr=1e-3, metrics=('accuracy',))
'''
CALLS = {'fit': 'learn.fit', 'fit_async': 'await learn.fit_async'}
FRAME = re.compile(r'class="nbtrainer-figure"[^>]*base64,([^"]+)"')


def sent_at(msg):
    "When the kernel sent a message: its header's date, in seconds."
    date = msg['header']['date']
    return (date if isinstance(date, datetime) else datetime.fromisoformat(str(date))).timestamp()


def messages_of(kc, code, timeout):
    "Every iopub message `code` causes, matched by its request id, until the kernel is idle again."
    msg_id, deadline = kc.execute(code), time.time() + timeout
    while True:
        msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.time()))
        if msg['parent_header'].get('msg_id') != msg_id:
            continue
        yield msg
        if msg['msg_type'] == 'status' and msg['content']['execution_state'] == 'idle':
            return


def frame_times(call, seconds):
    "The dashboard's first output, each new frame and the summary, in seconds after the first output."
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name='python3')
    try:
        for _ in messages_of(kc, SETUP, timeout=180):
            pass
        start, end, frames, shown = None, None, [], set()
        for msg in messages_of(kc, f'{call}(steps=10**7, cbs=[StopAfter({seconds})])', timeout=10 * seconds + 120):
            html = msg['content'].get('data', {}).get('text/html', '')
            if msg['msg_type'] == 'display_data' and start is None:
                start = sent_at(msg)
            found = FRAME.search(html)
            if found and found.group(1) not in shown:
                shown.add(found.group(1))
                frames.append(sent_at(msg))
            if 'Fit stopped at step' in html:
                end = sent_at(msg)
        if start is None or end is None:
            raise RuntimeError(f'{call}: no dashboard or no summary came')
        return [t - start for t in [start, *frames, end]]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seconds', type=float, default=30)
    parser.add_argument('--busy', type=int, default=2)
    parser.add_argument('--calls', nargs='+', default=list(CALLS), choices=list(CALLS))
    parser.add_argument('--repeats', type=int, default=1)
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(args.busy)]
    met = True
    try:
        for _ in range(args.repeats):
            for name in args.calls:
                moments = frame_times(CALLS[name], args.seconds)
                gaps = [b - a for a, b in zip(moments, moments[1:])]
                mean, longest = sum(gaps) / len(gaps), max(gaps)
                met &= mean <= 2 and longest <= 3
                print(
                    f'{CALLS[name]:22} beside {args.busy} busy: {len(moments) - 2} frames in {moments[-1]:.1f} s, '
                    f'mean gap {mean:.2f} s, longest {longest:.2f} s; frames at {[round(t, 1) for t in moments[1:-1]]}',
                    flush=True,
                )
    finally:
        for process in busy:
            process.kill()
    print('issue #32 bounds (mean gap <= 2 s, longest <= 3 s):', 'met' if met else 'NOT met')
    sys.exit(0 if met else 1)


if __name__ == '__main__':
    main()
