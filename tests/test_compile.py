"""`Learner(compile=True)`: a compiled fit matches an eager one, and its checkpoint loads into a bare model."""

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import Learner

pytestmark = pytest.mark.slow  # torch.compile's first compilation: about a minute on 2 cores


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))


def test_compiled_fit_matches_eager_and_checkpoint_loads_bare(tmp_path):
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))
    dl = DataLoader(ds, batch_size=16)
    eager = Learner(make_model(), dl, opt_func=torch.optim.SGD, lr=0.1, progress=False)
    eager.fit(2)
    compiled = Learner(make_model(), dl, opt_func=torch.optim.SGD, lr=0.1, progress=False, compile=True)
    compiled.fit(2)
    assert any(k.startswith('_orig_mod.') for k in compiled.model.state_dict())
    for a, b in zip(eager.model.state_dict().values(), compiled.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # fused kernels may round differently
    compiled.save(tmp_path / 'compiled.pt')
    bare = make_model()
    bare.load_state_dict(torch.load(tmp_path / 'compiled.pt', weights_only=True)['model'])
    assert all(torch.equal(a, b) for a, b in zip(bare.state_dict().values(), compiled.model.state_dict().values()))
