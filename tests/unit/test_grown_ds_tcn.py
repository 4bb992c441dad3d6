"""A DS-TCN grown from a trained one (more blocks, training.init_checkpoint with
init_allow_missing): with model.block_init_gain 0.1 the new blocks start near the identity,
so the grown network first computes nearly what the trained one did; with the default gain
it does not."""
import pytest
import torch

from toolkit.tasks.kws.models import build_model
from toolkit.tasks.kws.models.ds_tcn import DSTCN
from toolkit.trainer.experiment import _load_module


def config(layers, gain=1.0):
    return DSTCN.Config(type="ds_tcn", input_dim=40, num_outputs=30,
                        hidden_dim=32, num_layers=layers, kernel_size=5,
                        dilations=[1, 2, 4, 8, 1, 2], frontend_channels=4,
                        block_init_gain=gain)


def trained_like(model):
    """Weights and BatchNorm statistics unlike a fresh model's, as training leaves them."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if t.is_floating_point():
                if name.endswith("running_var"):
                    t.copy_(0.5 + torch.rand(t.shape, generator=g))
                else:
                    t.copy_(0.3 * torch.randn(t.shape, generator=g))
    return model.eval()


def change(gain):
    torch.manual_seed(1)
    small = trained_like(build_model(config(6)))
    grown = build_model(config(10, gain)).eval()
    _load_module(grown, small.state_dict(), "test", allow_missing=True)
    feats = torch.randn(2, 120, 40, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = small.encode(feats)[0]
        after = grown.encode(feats)[0]
    return float((after - before).norm() / before.norm())


def test_new_blocks_start_near_the_identity():
    near, fresh = change(0.1), change(1.0)
    assert near < 0.35 * fresh, (near, fresh)
    assert near > 0          # they are blocks that train, not switched off


def test_gain_must_be_positive():
    with pytest.raises(ValueError, match="block_init_gain"):
        build_model(config(6, gain=0.0))
