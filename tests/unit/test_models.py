"""Models: streaming == whole utterance, TorchScript/ONNX export parity, training smoke,
parameter counts of the recipe configurations."""
import os

import numpy as np
import pytest
import torch

from toolkit.config import load_config
from toolkit.data.features import fbank_metadata, fbank_options
from toolkit.tasks.kws.export import StreamingScorer, build_metadata, export_onnx
from toolkit.tasks.kws.losses import CrossEntropyLoss, MaxPoolingLoss
from toolkit.tasks.kws.models import MODELS, build_model, count_parameters

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONF = os.path.join(REPO, "egs", "wake_word", "s0", "conf")
DIM = 40
CAUSAL = ["ds_tcn", "tcn", "mdtc", "gru"]
ALL = CAUSAL + ["bcresnet"]
# Parameter ranges for the recipe configs (1 keyword, 40 mel) and BC-ResNet (12 classes).
RECIPE_PARAMS = {"ds_tcn": (215_000, 240_000), "tcn": (15_000, 30_000),
                 "mdtc": (30_000, 60_000), "gru": (20_000, 40_000)}
BCRESNET_PARAMS = {1.0: (8_000, 10_500), 3.0: (45_000, 65_000)}


def max_diff(a, b) -> float:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item() if a.numel() else 0.0


def make_model(name: str, seed: int = 0, **overrides):
    """Eval-mode model with random weights, CMVN and BatchNorm statistics, so that no
    layer is an identity that could hide a streaming or export mismatch."""
    torch.manual_seed(seed)
    outputs = 12 if name == "bcresnet" else 1
    config = MODELS.get(name).Config(type=name, input_dim=DIM, num_outputs=outputs, **overrides)
    cmvn = {"mean": torch.randn(DIM) * 3 + 10, "inv_std": torch.rand(DIM) * 0.5 + 0.2}
    model = build_model(config, cmvn)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0, 0.3)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.2)
    return model.eval()


def random_feats(batch: int, frames: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, frames, DIM, generator=g) * 3 + 10   # raw-fbank-like scale


@pytest.mark.parametrize("name", CAUSAL)
def test_streaming_equals_whole_utterance(name):
    model = make_model(name)
    # DSTCN (not owned here) may not declare the attribute yet; it is causal.
    assert getattr(model, "streaming", True)
    T = 40
    feats = random_feats(2, T)
    with torch.no_grad():
        whole, whole_cache = model(feats)
        assert whole.shape == (2, T, 1) and whole_cache.shape == (2, model.cache_size)
        for chunk in range(1, T + 1):
            cache = model.zero_cache(2)
            outs = []
            for start in range(0, T, chunk):
                out, cache = model(feats[:, start:start + chunk], cache)
                outs.append(out)
            diff = max_diff(torch.cat(outs, dim=1), whole)
            assert diff <= 1e-5, f"{name}: chunk {chunk}: max abs diff {diff}"
            assert max_diff(cache, whole_cache) <= 1e-5


def test_bcresnet_contract():
    model = make_model("bcresnet")
    assert not model.streaming and model.cache_size == 0
    with torch.no_grad():
        logits, cache = model(random_feats(3, 57))
    assert logits.shape == (3, 12) and cache.shape == (3, 0)


@pytest.mark.parametrize("name", ALL)
def test_torchscript_and_onnx_export(name, tmp_path):
    import onnxruntime as ort
    model = make_model(name)
    scorer = StreamingScorer(model).eval()
    scripted = torch.jit.script(scorer)
    fbank = fbank_metadata(fbank_options(num_mel_bins=DIM))
    path = str(tmp_path / "model.onnx")
    export_onnx(model, path, build_metadata(model, fbank, ["kw"], None))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    # Two lengths (dynamic time axis), batch 2; the second chunk continues from the
    # first one's cache, so a non-zero cache input is exercised too.
    cache = torch.zeros(2, model.cache_size)
    ort_cache = cache.numpy()
    for i, frames in enumerate((13, 31)):
        feats = random_feats(2, frames, seed=10 + i)
        with torch.no_grad():
            probs, new_cache = scorer(feats, cache)
            ts_probs, ts_cache = scripted(feats, cache)
        o_probs, o_cache = session.run(None, {"feats": feats.numpy(), "cache": ort_cache})
        assert max_diff(ts_probs, probs) <= 1e-5 and max_diff(ts_cache, new_cache) <= 1e-5
        assert max_diff(o_probs, probs) <= 1e-4, name
        assert max_diff(o_cache, new_cache) <= 1e-4, name
        cache, ort_cache = new_cache, o_cache


@pytest.mark.parametrize("name", ALL)
def test_training_smoke(name):
    model = make_model(name, seed=3).train()
    batch, frames = 8, 50
    feats = random_feats(batch, frames, seed=4)
    lengths = torch.tensor([50, 45, 40, 50, 35, 50, 48, 42])
    if name == "bcresnet":
        loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config(type="cross_entropy"))
        labels = torch.arange(batch) % 12
    else:
        loss_fn = MaxPoolingLoss(MaxPoolingLoss.Config(type="max_pooling"))
        labels = torch.tensor([0, -1, 0, -1, 0, -1, 0, -1])
    torch.manual_seed(5)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        logits, _ = model(feats)
        loss, _ = loss_fn(logits, lengths, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print(f"{name}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    assert np.mean(losses[-5:]) < 0.7 * losses[0], losses


def _recipe_model(name: str):
    cfg = load_config(os.path.join(CONF, f"{name}.yaml"))
    cfg.model.input_dim, cfg.model.num_outputs = DIM, 1
    return build_model(cfg.model)


@pytest.mark.parametrize("name", CAUSAL)
def test_recipe_parameter_counts(name):
    model = _recipe_model(name)
    n = count_parameters(model)
    print(f"{name}: {n} parameters, cache {model.cache_size}, "
          f"receptive field {model.receptive_field()} frames")
    low, high = RECIPE_PARAMS[name]
    assert low <= n <= high


def test_bcresnet_parameter_counts():
    for scale, (low, high) in BCRESNET_PARAMS.items():
        n = count_parameters(make_model("bcresnet", scale=scale))
        print(f"bcresnet scale {scale}: {n} parameters (12 classes)")
        assert low <= n <= high


def test_config_defaults_match_recipes():
    """The dataclass defaults are the recipe sizes, so a bare `type: X` is sensible too."""
    for name in ["tcn", "mdtc", "gru"]:
        recipe = _recipe_model(name).config
        default = MODELS.get(name).Config(type=name, input_dim=DIM, num_outputs=1)
        assert recipe == default, name
