"""What a practitioner brings from elsewhere, each against its reference: a sampler or dataset with `set_epoch`, a torch
or Hugging Face scheduler, several validation sets, images for the loggers."""

import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from nbtrainer import Callback, Checkpointer, Learner
from nbtrainer.testing import classification_data, same_history, same_weights, tiny_classifier


class StopAt(Callback):
    "Interrupt the fit after training batch `n` (counted over the fit), after the Checkpointer saved: a kill."

    order = 200

    def __init__(self, n):
        self.n, self.seen = n, 0

    def after_batch(self):
        if self.learn.training:
            self.seen += 1
            if self.seen == self.n:
                raise KeyboardInterrupt()


def killed_and_resumed(make, fit, at):
    "The Learner `make(folder)` gives, fit with `fit(learn, **kw)`, interrupted after batch `at`, then resumed anew."
    folder = Path(tempfile.mkdtemp())
    try:
        fit(make(folder), cbs=[StopAt(at)])
    except KeyboardInterrupt:
        pass
    learn = make(folder)
    fit(learn, resume=True)
    return learn


# ---- set_epoch: called before each epoch in every mode ----
class EpochShuffled(IterableDataset):
    "A stream that reshuffles by its epoch, as Hugging Face's IterableDataset does: without set_epoch, one order."

    def __init__(self, ds):
        self.ds, self.epoch, self.epochs_set = ds, 0, []

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.epochs_set.append(epoch)

    def __iter__(self):
        order = torch.randperm(len(self.ds), generator=torch.Generator().manual_seed(100 + self.epoch))
        return (self.ds[i] for i in order)

    def __len__(self):
        return len(self.ds)


def hand_loop_with_set_epoch(dl, holder, epochs=3):
    "The loop Lightning and accelerate run: set_epoch before each epoch, in one process too."
    model = tiny_classifier(features=8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for epoch in range(epochs):
        holder.set_epoch(epoch)
        for x, y in dl:
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return model


def test_set_epoch_is_called_before_each_epoch_in_one_process_and_resumes_exactly():
    ds = classification_data(96, 8)
    for kind in ('sampler', 'dataset'):

        def loader():
            if kind == 'sampler':
                sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=3)
                return DataLoader(ds, batch_size=16, sampler=sampler), sampler
            stream = EpochShuffled(ds)
            return DataLoader(stream, batch_size=16), stream

        dl, holder = loader()
        reference = hand_loop_with_set_epoch(dl, holder)

        def make(folder=None):
            dl, _ = loader()
            cbs = [Checkpointer(folder, every_steps=1)] if folder else []
            return Learner(tiny_classifier(features=8), dl, lr=1e-2, progress=False, cbs=cbs)

        learn = make()
        learn.fit(3)
        assert same_weights(learn.model, reference), kind
        for at in (3, 6, 10):  # mid-epoch, at an epoch's end, in the last epoch
            resumed = killed_and_resumed(make, lambda learn, **kw: learn.fit(3, **kw), at)
            assert same_weights(resumed.model, reference), (kind, at)
    # a pass that carries over epochs (steps_per_epoch) keeps the epoch it started in, also across a resume
    sampler_epochs = []

    class Recording(DistributedSampler):
        def set_epoch(self, epoch):
            sampler_epochs.append(epoch)
            super().set_epoch(epoch)

    def make(folder=None):
        dl = DataLoader(ds, batch_size=16, sampler=Recording(ds, num_replicas=1, rank=0, shuffle=True, seed=3))
        cbs = [Checkpointer(folder, every_steps=1)] if folder else []
        return Learner(tiny_classifier(features=8), dl, lr=1e-2, progress=False, cbs=cbs)

    straight = make()
    straight.fit(4, steps_per_epoch=4)  # passes of 6 batches: they start in epochs 0, 1 and 3
    assert sampler_epochs == [0, 1, 3]
    for at in (5, 8, 13):
        resumed = killed_and_resumed(make, lambda learn, **kw: learn.fit(4, steps_per_epoch=4, **kw), at)
        assert same_weights(resumed.model, straight.model) and same_history(
            resumed.recorder.history, straight.recorder.history
        ), at
