"""Features combined as users combine them, each combination checked against a hand-written reference loop.

Factors: precision (fp32, bf16, fp16) × accumulate (1, or 3 with an uneven last window) × processes (1, or 2 under DDP)
× evaluation on a subset (off, on) × a Checkpointer with a SIGKILL and a resume (off, on) × CSV and TensorBoard loggers
(off, on) × training metrics (off, on). The rows below are a covering array: every pair of levels of any two factors
meets in some row, so 8 runs cover what the full product (192 runs) would pair up. Weights, the number of optimizer
steps and the fp16 loss scale must equal those of one hand-written PyTorch loop on the global batch (the standard
GradScaler recipe for fp16); evaluation subsets, checkpoints and loggers must not change them. Each cell runs in its own
process (two, under DDP), as a user's script would.
"""

import itertools, json, math, sys, time

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from conftest import ROOT
import warm

sys.path.insert(0, str(ROOT / 'tests'))
import composition_worker as cw

FACTORS = ('precision', 'accumulate', 'world', 'subset', 'kill', 'loggers', 'train_metrics')
LEVELS = (('fp32', 'bf16', 'fp16'), (1, 3), (1, 2), (False, True), (False, True), (False, True), (False, True))
COVERING = [
    (0, 0, 1, 0, 1, 0, 1),
    (0, 0, 0, 1, 1, 1, 0),
    (1, 1, 1, 0, 1, 1, 1),
    (1, 0, 1, 1, 0, 1, 1),
    (2, 0, 1, 1, 0, 1, 0),
    (2, 1, 0, 0, 1, 0, 1),
    (0, 1, 0, 0, 0, 0, 0),
    (1, 1, 0, 1, 1, 0, 0),
]
ROWS = [dict(zip(FACTORS, (levels[i] for levels, i in zip(LEVELS, row)))) for row in COVERING]


def test_the_rows_cover_every_pair_of_levels():
    for (a, la), (b, lb) in itertools.combinations(enumerate(LEVELS), 2):
        seen = {(r[a], r[b]) for r in COVERING}
        assert seen == set(itertools.product(range(len(la)), range(len(lb)))), (FACTORS[a], FACTORS[b])


def reference(precision, accumulate):
    "The hand-written loop on the global batches: windows of `accumulate`, the summed loss over the window's examples."
    model = cw.model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    dtype = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}[precision]
    scaler = torch.amp.GradScaler('cpu') if precision == 'fp16' else None
    batches, steps, accuracy = list(DataLoader(cw.data(cw.N_TRAIN, 0), batch_size=cw.B)), 0, []
    for _ in range(cw.EPOCHS):
        correct = 0
        for w in range(0, len(batches), accumulate):
            window = batches[w : w + accumulate]
            count = sum(len(y) for _, y in window)
            for x, y in window:
                with torch.autocast('cpu', dtype=dtype, enabled=dtype is not None):
                    pred = model(x)
                    loss = F.cross_entropy(pred, y, reduction='sum') / count
                correct += (pred.argmax(1) == y).sum().item()
                (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            steps += 1  # steps attempted, as torch's recipe counts them for its scheduler (skipped ones too)
            opt.zero_grad()
        accuracy.append(correct / cw.N_TRAIN)
    return model.state_dict(), steps, scaler.get_scale() if scaler else None, accuracy


def run(cfg, out, *flags):
    return warm.run(
        [sys.executable, str(ROOT / 'tests' / 'composition_worker.py'), json.dumps(cfg), str(out), *flags],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow  # a trained subprocess or two per row
@pytest.mark.parametrize(
    'cfg',
    [pytest.param(r, marks=[pytest.mark.distributed] if r['world'] > 1 else []) for r in ROWS],
    ids=['-'.join(f'{k}={v}' for k, v in r.items()) for r in ROWS],
)
def test_combination_equals_the_reference(cfg, tmp_path):
    steps_per_epoch = math.ceil(5 / cfg['accumulate'])
    if cfg['kill']:
        kill_at = steps_per_epoch + 1  # mid-way through the second epoch
        killed = run(cfg, tmp_path, '--kill-at', str(kill_at))
        assert killed.returncode != 0 and not (tmp_path / 'final.pt').exists(), killed.stderr[-2000:]
        if cfg['loggers']:
            time.sleep(1.1)  # TensorBoard orders event files by the second in their name
        done = run(cfg, tmp_path, '--resume')
    else:
        done = run(cfg, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = torch.load(tmp_path / 'final.pt', weights_only=True)
    weights, steps, scale, train_accuracy = reference(cfg['precision'], cfg['accumulate'])
    assert result['step'] == steps == cw.EPOCHS * steps_per_epoch
    assert result['scale'] == scale
    diff = max((result['model'][k] - weights[k]).abs().max().item() for k in weights)
    assert diff < (1e-5 if cfg['precision'] == 'fp32' else 2e-2), diff

    history = result['history']
    if cfg['subset']:
        # the last row holds the full set's values beside the subset's: one row per evaluation, none repeating a step
        assert [('subset_valid_loss' in r, 'valid_loss' in r) for r in history] == [(True, False)] * (cw.EPOCHS - 1) + [
            (True, True)
        ]
    else:
        assert len(history) == cw.EPOCHS and all('valid_loss' in r for r in history)
    if cfg['train_metrics']:  # over every rank's batches, since the previous row; low precision may flip a near tie
        ours = [r['train_accuracy'] for r in history[: cw.EPOCHS]]
        assert all(
            abs(a - b) <= (0 if cfg['precision'] == 'fp32' else 2 / cw.N_TRAIN) for a, b in zip(ours, train_accuracy)
        ), (ours, train_accuracy)

    if cfg['loggers']:
        import csv
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        rows = list(csv.DictReader(open(tmp_path / 'log.csv')))
        batch_rows, eval_rows = [r for r in rows if r['batch']], [r for r in rows if not r['batch']]
        assert [(int(r['epoch']), int(r['batch'])) for r in batch_rows] == [
            (e, b) for e in range(cw.EPOCHS) for b in range(5)
        ]
        assert not eval_rows  # every evaluation shares its step's batch row
        full = [r for r in rows if r['valid_loss']]
        assert len(full) == (1 if cfg['subset'] else cw.EPOCHS) and full[-1] == rows[-1]  # with a subset: the last row
        assert len({c for c in rows[0] if 'loss' in c}) == len([c for c in rows[0] if 'loss' in c])  # no column twice
        train = EventAccumulator(str(tmp_path / 'tb' / 'run' / 'train'))
        train.Reload()
        loss_steps = [e.step for e in train.Scalars('loss')]
        assert loss_steps == sorted(set(loss_steps)) and loss_steps[-1] == steps  # each point once, up to the last step
        valid = EventAccumulator(str(tmp_path / 'tb' / 'run' / 'valid'))
        valid.Reload()
        periodic = 'subset_valid_loss' if cfg['subset'] else 'loss'
        assert [e.step for e in valid.Scalars(periodic)] == [r['step'] for r in history[: cw.EPOCHS]]
