"""FSDP2 (`strategy='fsdp'`) on 2 CPU processes (gloo), checked against one process and hand-written references.

The workers start with `nbtrainer.launcher.launch` (fork), except the kill-and-resume test, which runs
tests/fsdp_worker.py as torchrun would (environment variables) and kills it for real.
"""

import math, os, signal, subprocess, sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from conftest import ROOT
from nbtrainer import FSDP, Callback, Checkpointer, Learner, launch, memory_per_rank, plain_checkpoint
from nbtrainer.data import plain_model
from nbtrainer.testing import wait_for
from test_distributed import B, dataset, global_batches, hand_written, loader, make_model

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not dist.is_available() or sys.platform != 'linux', reason='needs torch.distributed and fork'),
]


def full_weights(learn):
    "The whole weights, gathered from every rank's shards (a collective: every rank calls it)."
    return {k: v.full_tensor().clone() for k, v in learn.model.state_dict().items()}


# ---- the same weights as one process on the global batch ----


def train_fsdp(opt_func, n, accumulate, epochs, strategy):
    learn = Learner(
        make_model(),
        loader(dataset(n)),
        opt_func=opt_func,
        lr=0.05,
        metrics=(),
        accumulate=accumulate,
        progress=False,
        strategy=strategy,
    )
    learn.fit(epochs)
    sharded = [type(p).__name__ for p in learn.model.parameters()]
    return full_weights(learn), learn.step, sharded


@pytest.mark.parametrize(
    'opt_func, n, accumulate, strategy',
    [
        (torch.optim.SGD, 48, 1, 'fsdp'),  # the root alone: one unit
        (torch.optim.Adam, 45, 1, FSDP(wrap=nn.Linear)),  # a unit per Linear; rank 1 repeats an example
        (torch.optim.SGD, 45, 2, FSDP(min_params=50)),  # accumulation over an uneven epoch end; units by size
        (torch.optim.Adam, 46, 3, FSDP(wrap=nn.Linear, reshard_after_forward=False)),
        (torch.optim.Adam, 45, 2, FSDP(wrap=nn.Linear, activation_checkpointing=True)),
        (torch.optim.SGD, 45, 1, FSDP(wrap=nn.Linear, cpu_offload=True)),  # on the CPU already: the same arithmetic
    ],
)
def test_two_ranks_equal_one_process_with_the_global_batch(opt_func, n, accumulate, strategy):
    weights, steps, sharded = launch(train_fsdp, nprocs=2, args=(opt_func, n, accumulate, 2, strategy))
    assert set(sharded) == {'DTensor'}
    ref, ref_steps = hand_written(opt_func, n, accumulate, 2)
    assert steps == ref_steps
    assert max((weights[k] - ref[k]).abs().max().item() for k in ref) < 1e-5


# ---- bf16: FSDP's MixedPrecisionPolicy against one process under autocast ----


def rank_batches(n, epochs, world=2):
    "Each global batch as its per-rank parts, in DistributedSampler's order, padding left out."
    from torch.utils.data import DistributedSampler

    ds, out = dataset(n), []
    for epoch in range(epochs):
        shards = []
        for r in range(world):
            sampler = DistributedSampler(ds, num_replicas=world, rank=r, shuffle=True, seed=5)
            sampler.set_epoch(epoch)
            shards.append([i for j, i in enumerate(sampler) if r + j * world < n])
        per_rank = math.ceil(n / world)
        out.append([[s[b : b + B] for s in shards] for b in range(0, per_rank, B)])
    return ds, out


def hand_written_bf16(n, accumulate, epochs, per_rank):
    """One process, bf16 autocast, SGD. `per_rank`: each rank's part of a global batch goes through forward and backward
    on its own (bf16 rounds each part's gradient, as each rank does), else the global batch at once."""
    ds, epochs_batches = rank_batches(n, epochs)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for batches in epochs_batches:
        for w in range(0, len(batches), accumulate):
            window = batches[w : w + accumulate]
            count = sum(len(part) for parts in window for part in parts)
            for parts in window:
                for part in parts if per_rank else [sum(parts, [])]:
                    if not part:
                        continue
                    x, y = ds[part]
                    with torch.autocast('cpu', dtype=torch.bfloat16):
                        loss = F.cross_entropy(model(x), y, reduction='sum') / count
                    loss.backward()
            opt.step()
            opt.zero_grad()
    return model.state_dict()


def train_bf16(n, accumulate, precision):
    learn = Learner(
        make_model(),
        loader(dataset(n)),
        opt_func=torch.optim.SGD,
        lr=0.05,
        metrics=(),
        accumulate=accumulate,
        progress=False,
        precision=precision,
        strategy=FSDP(wrap=nn.Linear),
    )
    dtypes = set()
    learn.model[0].register_forward_pre_hook(lambda m, args: dtypes.add(m.weight.dtype))  # after FSDP's gather
    learn.fit(2)
    return full_weights(learn), dtypes


@pytest.mark.parametrize('n, accumulate', [(48, 1), (45, 2)])
def test_bf16_equals_one_process_under_autocast(n, accumulate):
    """bf16 rounds where the sums are taken: a rank's gradient is the bf16 gradient of its part of the global batch,
    the parts then summed in fp32 (reduce_dtype). A one-process reference that computes each rank's part separately
    under autocast does the same arithmetic, so it agrees to fp32 rounding. The reference that takes the global batch
    at once rounds other sums: it differs by bf16's rounding (8 bits of mantissa), about as much as fp32 differs from
    bf16, which is the tolerance for that comparison."""
    weights, dtypes = launch(train_bf16, nprocs=2, args=(n, accumulate, 'bf16'))
    assert dtypes == {torch.bfloat16}  # FSDP gathered the weights in bf16 for the forward pass
    same_parts = hand_written_bf16(n, accumulate, 2, per_rank=True)
    assert max((weights[k] - same_parts[k]).abs().max().item() for k in weights) < 1e-6  # 0.0 here
    whole = hand_written_bf16(n, accumulate, 2, per_rank=False)
    fp32, _ = hand_written(torch.optim.SGD, n, accumulate, 2)
    bf16_effect = max((whole[k] - fp32[k]).abs().max().item() for k in weights)
    assert bf16_effect > 2e-5  # 20x fp32's agreement (1e-6): bf16 changes the result, the comparisons mean something
    assert max((weights[k] - whole[k]).abs().max().item() for k in weights) < 2 * bf16_effect


# ---- sharded checkpoints: kill and resume, one process, plain into FSDP ----

WORKER = str(ROOT / 'tests' / 'fsdp_worker.py')
ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}
TORCHRUN = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2']


def run_worker(folder, *args):
    subprocess.run(
        TORCHRUN + [WORKER, str(folder), *args],
        check=True,
        timeout=600,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    return torch.load(folder / 'final.pt', weights_only=True)


def gone(pid):
    "The process has exited (a zombie nobody reaped yet counts as gone)."
    try:
        return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0] == 'Z'
    except (FileNotFoundError, ProcessLookupError):
        return True


def killed_mid_fit(folder, *args):
    """Start the worker slowed down, and SIGKILL torchrun and both ranks once they are past step 10: a few batches
    later, perhaps during a save (the worker waits to be killed at step 18 if the test is slow)."""
    proc = subprocess.Popen(
        TORCHRUN + [WORKER, str(folder), '--slow', *args],
        env=ENV,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started = [folder / f'started-{r}' for r in range(2)]
    try:
        wait_for(lambda: all(p.exists() and p.read_text() for p in started), 'both ranks to pass step 10',
                 timeout=300, seen=lambda: [p.name for p in started if p.exists()], process=proc)  # fmt: skip
        pids = [int(p.read_text()) for p in started]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)  # no handler: a lost machine
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # and torchrun (its workers run in sessions of their own)
    proc.wait(30)
    wait_for(lambda: all(gone(pid) for pid in pids), 'the killed ranks to be gone', timeout=60,
             seen=lambda: [pid for pid in pids if not gone(pid)])  # fmt: skip
    assert not (folder / 'final.pt').exists()


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    "The worker's run, not killed, once per set of arguments in this file: its folder and what the ranks gathered."
    done = {}

    def run(*args):
        if args not in done:
            folder = tmp_path_factory.mktemp('fsdp')
            done[args] = folder, run_worker(folder, *args)
        return done[args]

    return run


@pytest.mark.parametrize('args', [(), ('--accumulate', '2', '--precision', 'bf16')])
def test_killed_and_resumed_from_sharded_checkpoints_is_bit_identical(tmp_path, uninterrupted, args):
    _, straight = uninterrupted(*args)
    folder = tmp_path / 'killed'
    killed_mid_fit(folder, *args)
    kept = sorted(p.name for p in (folder / 'checkpoints').glob('step-*.pt'))
    assert kept and all((folder / 'checkpoints' / k).is_dir() for k in kept)  # folders of shards
    resumed = run_worker(folder, '--resume', *args)
    accumulate = int(dict(zip(args[::2], args[1::2])).get('--accumulate', 1))
    saved_at = resumed['start'] % 4 == 0 or resumed['start'] % (20 // accumulate) == 0  # every 4 steps, epoch ends
    assert straight['start'] == 0 and 8 <= resumed['start'] < resumed['step'] and saved_at  # mid-fit
    assert straight['step'] == resumed['step'] == 60 // accumulate
    assert all(torch.equal(straight['model'][k], resumed['model'][k]) for k in straight['model'])
    assert torch.equal(straight['preds'], resumed['preds'])
    assert straight['history'] == resumed['history']
    assert not list((folder / 'checkpoints').glob('.*.tmp'))  # a save the kill cut short was cleaned up


@pytest.fixture(scope='module')
def trained(uninterrupted):
    "A finished FSDP run: its sharded checkpoints, and the whole weights and predictions the ranks gathered."
    return uninterrupted()


def test_a_sharded_checkpoint_loads_into_a_bare_model_in_one_process(trained, tmp_path):
    import fsdp_worker

    folder, final = trained
    x = fsdp_worker.probe_inputs()
    # learn.load in one process: no process group, each tensor read whole from the two ranks' shards
    learn = Learner(
        fsdp_worker.make_model(),
        [(x, torch.zeros(16, dtype=torch.long))],
        opt_func=torch.optim.AdamW,
        progress=False,
        lr=1e-2,
    )
    assert not learn.distributed
    with pytest.warns(UserWarning, match='callbacks this Learner lacks'):  # the run's FSDP strategy and Checkpointer
        learn.load(folder / 'last.pt', check_data=False)  # its own data, not the run's
    learn.model.eval()
    with torch.no_grad():
        assert torch.equal(learn.model(x), final['preds'])
    assert all(torch.equal(learn.model.state_dict()[k], final['model'][k]) for k in final['model'])
    assert len(learn.opt.state) == len(list(learn.model.parameters()))  # the AdamW moments came too
    # converted to one plain file, read by torch alone into a bare model
    plain = plain_checkpoint(folder / 'last.pt', tmp_path / 'plain.pt')
    bare = fsdp_worker.make_model().eval()
    bare.load_state_dict(torch.load(plain, weights_only=True)['model'])
    with torch.no_grad():
        assert torch.equal(bare(x), final['preds'])


def resume_in_fsdp(checkpoint):
    "One more epoch of the worker's run, resumed under FSDP from `checkpoint` (a sharded folder or a plain file)."
    import fsdp_worker
    from torch.utils.data import DataLoader

    learn = Learner(
        fsdp_worker.make_model(),
        DataLoader(fsdp_worker.data(), batch_size=8, shuffle=True),
        lr=1e-2,
        opt_func=torch.optim.AdamW,
        clip_grad_norm=1.0,
        progress=False,
        metrics=(),
        strategy=FSDP(wrap=nn.Linear),
    )
    learn.fit(4, resume=str(checkpoint))
    return full_weights(learn), learn.step


def test_a_plain_checkpoint_loads_into_an_fsdp_run(trained, tmp_path):
    folder, _ = trained
    plain = plain_checkpoint(folder / 'checkpoints' / 'epoch-2.pt', tmp_path / 'plain.pt')
    from_shards, steps = launch(resume_in_fsdp, nprocs=2, args=(folder / 'checkpoints' / 'epoch-2.pt',))
    from_plain, steps_plain = launch(resume_in_fsdp, nprocs=2, args=(plain,))
    assert steps == steps_plain == 80  # 60 steps in 3 epochs, one more epoch of 20
    assert all(torch.equal(from_shards[k], from_plain[k]) for k in from_shards)


class CountForwards(Callback):
    "How many times the first Linear's forward ran during training batches."

    def __init__(self):
        self.n = 0

    def before_fit(self):
        self.learn.model[0].register_forward_pre_hook(lambda m, a: setattr(self, 'n', self.n + self.learn.training))


def forwards_per_batch(checkpointing):
    counter = CountForwards()
    learn = Learner(
        make_model(),
        loader(dataset(32)),
        metrics=(),
        progress=False,
        cbs=[counter],
        strategy=FSDP(wrap=nn.Linear, activation_checkpointing=checkpointing),
    )
    learn.fit(1)
    return counter.n / learn.step


def test_activation_checkpointing_recomputes_each_unit_in_backward():
    assert launch(forwards_per_batch, nprocs=2, args=(False,)) == 1
    assert launch(forwards_per_batch, nprocs=2, args=(True,)) == 2  # forward, then again in backward


# ---- memory per rank ----


class Measure(Callback):
    "memory_per_rank after the first step, while the gradients are still there (zero_grad comes after after_step)."

    def after_step(self):
        if self.learn.step == 1:
            self.bytes = memory_per_rank(self.learn)


def measure(strategy, width):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(4)])
    ds = torch.utils.data.TensorDataset(torch.randn(16, width), torch.randn(16, width))
    m = Measure()
    learn = Learner(
        model,
        torch.utils.data.DataLoader(ds, batch_size=4),
        loss_func=F.mse_loss,
        metrics=(),
        progress=False,
        strategy=strategy,
        cbs=[m],
    )
    learn.fit(steps=1)
    return m.bytes, dist.get_world_size()


@pytest.mark.parametrize('width', [64, 63])  # 63: rows do not split evenly, FSDP pads the shards
def test_fsdp_holds_half_of_what_ddp_holds_on_two_ranks(width):
    ddp, world = launch(measure, nprocs=2, args=('ddp', width))
    fsdp, _ = launch(measure, nprocs=2, args=(FSDP(wrap=nn.Linear), width))
    n = 4 * (width * width + width)  # parameters
    steps = 8 * 4  # AdamW's step counter: a float32 scalar per parameter tensor, on every rank
    assert ddp == {'parameters': 4 * n, 'gradients': 4 * n, 'optimizer': 2 * 4 * n + steps, 'total': 16 * n + steps}
    padding = 4 * 4 * width * 4  # at most a row per weight, for the weights, gradients and both Adam moments
    for part in ('parameters', 'gradients'):
        assert ddp[part] / world <= fsdp[part] <= ddp[part] / world + padding / 4
    assert fsdp['total'] <= ddp['total'] / world + padding + steps


# ---- a window whose last micro-batch is cancelled ----


class CancelSecond(Callback):
    "Cancel each window's second micro-batch before its backward: the step uses the first one's gradients alone."

    def before_backward(self):
        from nbtrainer import CancelBatchException

        if self.learn.window_batch == 1:
            raise CancelBatchException()


def train_cancelling(strategy):
    learn = Learner(
        make_model(),
        loader(dataset(48)),
        opt_func=torch.optim.Adam,
        lr=0.05,
        metrics=(),
        accumulate=2,
        progress=False,
        strategy=strategy,
        cbs=[CancelSecond()],
    )
    learn.fit(2)
    return full_weights(learn) if learn.strategy.sharded else dict(learn.model.module.state_dict()), learn.step


@pytest.mark.parametrize('strategy', ['ddp', FSDP(wrap=nn.Linear)])
def test_a_cancelled_last_micro_batch_still_reduces_the_window(strategy):
    "Its gradients never reached a reduce-scatter: the strategy reduces what the window has before the step."
    weights, steps = launch(train_cancelling, nprocs=2, args=(strategy,))
    ds, epochs_batches = global_batches(48, 2)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for batches in epochs_batches:
        for b in batches[::2]:  # each window's first global batch
            x, y = ds[b]
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert steps == 6
    assert max((weights[k] - model.state_dict()[k]).abs().max().item() for k in weights) < 1e-5


# ---- the rest composes: probe (snapshot and restore), schedules, metrics over all ranks, early stopping ----


def compose():
    from nbtrainer import EarlyStopping

    learn = Learner(
        make_model(),
        loader(dataset(45)),
        loader(dataset(37, seed=1), shuffle=False),
        lr=0.05,
        progress=False,
        strategy=FSDP(wrap=nn.Linear),
    )
    before = full_weights(learn)
    learn.probe(3)  # trains 3 steps, then puts everything back (what lr_find does in one process)
    restored = all(torch.equal(before[k], v) for k, v in full_weights(learn).items()) and not learn.opt.state
    restored = restored and learn.step == 0
    learn.add_cbs([EarlyStopping(patience=5)])  # after probe, which trains without validation
    learn.fit_one_cycle(3, 0.05)
    return restored, full_weights(learn), learn.recorder.history[-1]


def test_probe_schedules_and_metrics_compose_with_fsdp():
    restored, weights, row = launch(compose, nprocs=2)
    assert restored  # probe put the sharded weights, the optimizer and the step back exactly
    model = make_model()
    model.load_state_dict(weights)
    x, y = dataset(37, seed=1).tensors
    with torch.no_grad():
        logits = model(x)
    assert abs(row['valid_loss'] - F.cross_entropy(logits, y).item()) < 1e-5  # both ranks' shards, padding counted once
    assert abs(row['accuracy'] - (logits.argmax(1) == y).float().mean().item()) < 1e-6


def test_a_damaged_shard_is_refused_and_the_newest_intact_checkpoint_is_taken(trained, tmp_path):
    import shutil
    from nbtrainer import read_checkpoint

    folder, _ = trained
    kept = tmp_path / 'checkpoints'
    shutil.copytree(folder / 'checkpoints', kept)  # modification times kept: the newest stays the newest
    newest = max(kept.glob('*.pt'), key=os.path.getmtime)
    assert Checkpointer(kept).latest() == str(newest)
    shard = newest / '__1_0.distcp'
    shard.write_bytes(shard.read_bytes()[:-100])  # a copy cut short
    with pytest.raises(ValueError, match='__1_0.distcp is missing or truncated'):
        read_checkpoint(newest)
    fallback = Checkpointer(kept).latest()
    assert fallback != str(newest) and read_checkpoint(fallback)['sharded']
    (Path(fallback) / 'state.pt').unlink()  # and one without its state file
    with pytest.raises(FileNotFoundError):
        read_checkpoint(fallback)
    assert Checkpointer(kept).latest() not in (str(newest), fallback)


# ---- clipping over the shards: the global norm, as one process clips ----


def train_clipped(world):
    "2 ranks with batch B each and clipping at 0.5, or one process with batch 2B: the same global batches in order."
    learn = Learner(
        make_model(),
        DataLoader(dataset(48), batch_size=B * 2 // world),
        opt_func=torch.optim.AdamW,
        lr=0.02,
        metrics=(),
        accumulate=2,
        clip_grad_norm=0.5,
        progress=False,
        strategy=FSDP(wrap=nn.Linear) if world > 1 else 'auto',
    )
    learn.fit(2)
    return full_weights(learn) if world > 1 else dict(learn.model.state_dict()), learn.step


def test_clipping_takes_the_global_norm_over_the_shards():
    weights, steps = launch(train_clipped, nprocs=2, args=(2,))
    one, one_steps = train_clipped(1)
    assert steps == one_steps
    assert max((weights[k] - one[k]).abs().max().item() for k in one) < 1e-5


# ---- lr_find over the ranks: the global batch's curve, and the sharded state put back exactly ----


def find_lr(world, strategy):
    learn = Learner(
        make_model(),
        DataLoader(dataset(64), batch_size=B * 2 // world, shuffle=False),
        lr=0.05,
        metrics=(),
        progress=False,
        strategy=strategy if world > 1 else 'auto',
    )
    gather = full_weights if world > 1 and strategy != 'ddp' else lambda _: dict(plain_model(learn.model).state_dict())
    before = {k: v.clone() for k, v in gather(learn).items()}
    result = learn.lr_find(start_lr=1e-4, end_lr=100, num_it=40, show=False)
    after = gather(learn)
    restored = all(torch.equal(before[k], after[k]) for k in before) and not learn.opt.state and learn.step == 0
    return result.lrs, result.losses, result.suggestions, restored


@pytest.mark.parametrize('strategy', ['ddp', FSDP(wrap=nn.Linear)])
def test_lr_find_on_two_ranks_equals_one_process_on_the_global_batch(strategy):
    lrs, losses, suggestions, restored = launch(find_lr, nprocs=2, args=(2, strategy))
    ref_lrs, ref_losses, ref_suggestions, ref_restored = find_lr(1, None)
    assert restored and ref_restored
    assert len(lrs) == len(ref_lrs) < 40  # the same divergence stop, at the same step on both ranks
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) < 1e-5
    assert all(abs(a - b) <= 1e-6 * b for a, b in zip(lrs, ref_lrs))
    assert suggestions == ref_suggestions


def fork_points_under_fsdp():
    learn = Learner(make_model(), loader(dataset(16)), progress=False, strategy='fsdp', fork_points=2)
    try:
        learn.fit(1)
    except ValueError as e:
        return str(e), learn.step


def test_fork_points_in_memory_are_refused_under_fsdp_before_any_step():
    message, step = launch(fork_points_under_fsdp, nprocs=2)
    assert 'Checkpointer(every_eval=True)' in message and step == 0


# ---- fork from a sharded every-evaluation checkpoint, in a fresh Learner ----


def fork_from_shards(folder):
    def learner():
        return Learner(
            make_model(),
            loader(dataset(48)),
            loader(dataset(20, seed=1), shuffle=False),
            lr=0.05,
            progress=False,
            strategy=FSDP(wrap=nn.Linear),
            cbs=[Checkpointer(folder, every_eval=True)],
        )

    original = learner()
    original.fit(4, eval_every=4)
    forked = learner()  # a fresh Learner: the state comes from the folder of shards written at step 8's evaluation
    forked.fork(8)
    at_fork = forked.step
    forked.fit(4, eval_every=4)
    return full_weights(original), full_weights(forked), at_fork, forked.fit_progress.parent


def test_a_fork_from_sharded_checkpoints_reproduces_the_run(tmp_path):
    original, forked, at_fork, parent = launch(fork_from_shards, nprocs=2, args=(tmp_path / 'evals',))
    assert at_fork == 8 and parent['step'] == 8
    assert all(torch.equal(original[k], forked[k]) for k in original)  # the same fit after the fork: bit for bit
