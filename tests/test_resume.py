"""An uninterrupted run against one killed with SIGKILL mid-epoch and resumed: bit-identical weights and history."""

import signal, subprocess, sys, time

import pytest
import torch

from conftest import ROOT
import warm
from nbtrainer.testing import wait_for

pytestmark = pytest.mark.slow  # worker processes that train, one killed

WORKER = [sys.executable, str(ROOT / 'tests' / 'resume_worker.py')]


def final(folder):
    return torch.load(folder / 'final.pt', weights_only=True)


def kill_mid_run(folder):
    """Start a run in `folder` that holds mid-epoch, between checkpoints (after step 17: it says so in FOLDER/held), and
    SIGKILL it there; returns when it started."""
    started = time.time()
    proc = warm.Popen(WORKER + [str(folder), '--hold'])
    try:
        wait_for((folder / 'held').exists, 'the worker to hold at step 17', timeout=300, process=proc)
    finally:
        proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    return started


def test_killed_and_resumed_run_equals_uninterrupted(tmp_path):
    warm.run(WORKER + [str(tmp_path / 'straight')], check=True, timeout=300)

    folder = tmp_path / 'killed'
    started = kill_mid_run(folder)
    assert not (folder / 'final.pt').exists()
    saved = sorted(int(p.stem.split('-')[1]) for p in (folder / 'checkpoints').glob('step-*.pt'))
    assert saved[-1] == 16  # 13 batches per epoch, 4 epochs: cut short mid-epoch 1, a step after the checkpoint

    time.sleep(max(0.0, started + 1.5 - time.time()))  # TensorBoard orders event files by their name's second
    warm.run(WORKER + [str(folder), '--resume'], check=True, timeout=300)
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


def flip_a_bit(path):
    "Flip one bit in the middle of the largest tensor record of a checkpoint (a zip file), as a bad disk or copy would."
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size // 2] ^= 0x01
    path.write_bytes(bytes(data))


def snapshot(folder):
    return {
        p.relative_to(folder): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.rglob('*')) if p.is_file()
    }


def test_a_run_folder_can_be_copied_corrupted_and_moved(tmp_path):
    "A killed run's folder copied elsewhere resumes there in a fresh process, bit for bit, leaving the original alone, even"
    "with its newest checkpoint corrupted; a finished run's folder moved elsewhere gives its best checkpoint to a fresh process."
    import shutil

    warm.run(WORKER + [str(tmp_path / 'straight')], check=True, timeout=300)
    folder = tmp_path / 'killed'
    started = kill_mid_run(folder)
    copy = tmp_path / 'elsewhere' / 'copy'
    shutil.copytree(folder, copy)
    newest = max((copy / 'checkpoints').glob('step-*.pt'), key=lambda p: int(p.stem.split('-')[1]))
    flip_a_bit(newest)
    original = snapshot(folder)

    time.sleep(max(0.0, started + 1.5 - time.time()))  # TensorBoard orders event files by their name's second
    resumed = warm.run(WORKER + [str(copy), '--resume'], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f'skipped {newest}' in resumed.stderr and 'CRC-32' in resumed.stderr  # the corrupt one, named
    a, b = final(tmp_path / 'straight'), final(copy)
    assert a['step'] == b['step'] == 52 and all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])
    assert a['history'] == b['history'] and a['losses'] == b['losses']
    assert (tmp_path / 'straight' / 'log.csv').read_text() == (copy / 'log.csv').read_text()
    assert snapshot(folder) == original  # the copy's run touched nothing of the original's

    moved = tmp_path / 'archive' / 'moved'
    shutil.move(tmp_path / 'straight', moved)
    script = f'''
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from nbtrainer import Checkpointer, Learner, read_checkpoint
ckpt = Checkpointer({str(moved / 'checkpoints')!r})
best = ckpt.best()
assert best is not None and best.startswith({str(moved)!r}), best
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
ds = TensorDataset(torch.randn(200, 8), torch.randint(0, 3, (200,)))
learn = Learner(model, DataLoader(ds, batch_size=16), cbs=[ckpt], progress=False)
learn.load_best()
saved = read_checkpoint(best)['model']
assert all(torch.equal(v, saved[k]) for k, v in learn.model.state_dict().items())
print(best)
'''
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
