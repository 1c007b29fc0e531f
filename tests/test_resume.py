"""An uninterrupted run against one killed with SIGKILL mid-epoch and resumed: bit-identical weights and history."""
import signal, subprocess, sys, time

import torch

from conftest import ROOT

WORKER = [sys.executable, str(ROOT / 'tests' / 'resume_worker.py')]


def final(folder):
    return torch.load(folder / 'final.pt', weights_only=True)


def test_killed_and_resumed_run_equals_uninterrupted(tmp_path):
    subprocess.run(WORKER + [str(tmp_path / 'straight')], check=True, timeout=300)

    folder = tmp_path / 'killed'
    started = time.time()
    proc = subprocess.Popen(WORKER + [str(folder), '--slow'])
    deadline = time.time() + 120
    while time.time() < deadline and len(list((folder / 'checkpoints').glob('step-*.pt'))) < 2:
        time.sleep(0.05)
    time.sleep(0.37)  # somewhere mid-epoch, between checkpoints
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not (folder / 'final.pt').exists()
    saved = sorted(int(p.stem.split('-')[1]) for p in (folder / 'checkpoints').glob('step-*.pt'))
    assert saved and saved[-1] < 52  # 13 batches per epoch, 4 epochs: it really was cut short

    time.sleep(max(0.0, started + 1.5 - time.time()))  # TensorBoard orders event files by their name's second
    subprocess.run(WORKER + [str(folder), '--resume'], check=True, timeout=300)
    a, b = final(tmp_path / 'straight'), final(folder)
    assert a['step'] == b['step'] == 52
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])
    assert a['history'] == b['history'] and a['losses'] == b['losses']
    # the logs continue where the checkpoint was, without the rows the killed run wrote after it
    assert (tmp_path / 'straight' / 'log.csv').read_text() == (folder / 'log.csv').read_text()
    assert tensorboard_series(tmp_path / 'straight') == tensorboard_series(folder)


def tensorboard_series(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    series = {}
    for split, tags in (('train', ('loss', 'lr')), ('valid', ('loss', 'accuracy'))):
        acc = EventAccumulator(str(folder / 'tb' / 'run' / split))
        acc.Reload()
        series.update({(split, tag): [(e.step, e.value) for e in acc.Scalars(tag)] for tag in tags})
    return series
