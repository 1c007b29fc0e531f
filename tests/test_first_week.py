"""docs/guide.md's first-week section quotes the errors a new user's likely mistakes get: each quote must be what the
code raises today, so the page cannot drift from the code. Each mistake below is made as the page describes it, in
the page's order, and must fail before the first optimizer step with the model unchanged."""

import re

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from conftest import ROOT
from nbtrainer import Learner
from nbtrainer.testing import classification_data, tiny_classifier

SECTION = '## Your first week'


def quoted_messages():
    "The ```text blocks of the guide's first-week section, in order."
    guide = (ROOT / 'docs' / 'guide.md').read_text()
    section = guide[guide.index(SECTION) :]
    section = section[: section.index('\n## ', 1)]
    return [block.strip() for block in re.findall(r'```text\n(.*?)```', section, re.S)]


x, y = classification_data(64).tensors  # 10 features, labels 0..2
xr = torch.randn(64, 3)


def loader(inputs, targets):
    return DataLoader(TensorDataset(inputs, targets), batch_size=16)


def fit(model, inputs, targets, **kwargs):
    "A one-epoch fit that must fail before its first step, leaving the model unchanged."
    learn = Learner(model, loader(inputs, targets), progress=False, **kwargs)
    before = [p.detach().clone() for p in learn.model.parameters()]
    try:
        learn.fit(1)
    finally:
        assert learn.step == 0 and all(torch.equal(a, p) for a, p in zip(before, learn.model.parameters()))


def generator():
    for batch in loader(x, y):
        yield batch


MISTAKES = [  # in the order of the page
    ('class labels stored as floats', lambda: fit(tiny_classifier(), x, y.float())),
    ('labels of shape (N, 1)', lambda: fit(tiny_classifier(), x, y[:, None])),
    ('labels from 1', lambda: fit(tiny_classifier(), x, y + 1)),
    ('regression without loss_func', lambda: fit(nn.Linear(3, 1), xr, xr.sum(1))),
    ('two classes, one output', lambda: fit(nn.Linear(10, 1), x, y % 2)),
    ('(N, 1) predictions, (N,) targets', lambda: fit(nn.Linear(3, 1), xr, xr.sum(1), loss_func=F.mse_loss, metrics=())),
    ('(N, 3) predictions, (N,) targets', lambda: fit(nn.Linear(3, 3), xr, xr.sum(1), loss_func=F.mse_loss, metrics=())),
    (
        'accuracy on a regression',
        lambda: fit(nn.Linear(3, 1), xr, xr.sum(1, keepdim=True), loss_func=F.mse_loss, metrics='accuracy'),
    ),
    ('a Dataset for a loader', lambda: Learner(tiny_classifier(), TensorDataset(x, y), progress=False)),
    ('a generator for a loader', lambda: Learner(tiny_classifier(), generator(), progress=False)),
    ('lr=slice without groups', lambda: Learner(tiny_classifier(), loader(x, y), lr=slice(1e-4, 1e-2), progress=False)),
    (
        'a loss that is not reduced',
        lambda: fit(
            tiny_classifier(), x, y, loss_func=lambda pred, target: F.cross_entropy(pred, target, reduction='none')
        ),
    ),
]


def raised(make):
    try:
        make()
    except Exception as e:
        return f'{type(e).__name__}: {e}'
    raise AssertionError('no error raised')


def test_the_guide_quotes_what_the_code_raises():
    quoted = quoted_messages()
    assert len(quoted) == len(MISTAKES), (
        f'the page quotes {len(quoted)} messages, this test makes {len(MISTAKES)} mistakes'
    )
    for (what, make), quote in zip(MISTAKES, quoted):
        assert raised(make) == quote, f'{what}: the code now says\n{raised(make)}\nthe page quotes\n{quote}'


def test_each_message_names_a_fix():
    "Every quoted message says what to write instead, in code."
    for quote in quoted_messages():
        assert re.search(
            r'y\.long\(\)|y\.squeeze|y - 1|loss_func=|outputs|y\[:, None\]|metrics that fit|DataLoader\(|'
            r'splitter=|\.mean\(\)|Pass a DataLoader',
            quote,
        ), quote
