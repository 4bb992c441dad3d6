"""DS-TCN: chunked streaming with the cache equals the whole-utterance pass; cache size,
receptive field and parameter count follow from the architecture."""
import numpy as np
import pytest
import torch

from toolkit.tasks.kws.models import build_model, count_parameters
from toolkit.tasks.kws.models.ds_tcn import DSTCN



def make_model(seed=0, input_dim=40, num_outputs=2, **kw):
    torch.manual_seed(seed)
    cfg = DSTCN.Config(type="ds_tcn", input_dim=input_dim, num_outputs=num_outputs, **kw)
    g = torch.Generator().manual_seed(seed + 100)
    cmvn = {"mean": (torch.randn(input_dim, generator=g) * 3 + 10).tolist(),
            "inv_std": (torch.rand(input_dim, generator=g) * 0.5 + 0.2).tolist()}
    model = build_model(cfg, cmvn)
    # Non-trivial BatchNorm statistics, so eval-mode normalisation is not the identity.
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.3)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model.eval(), cmvn


def features(batch, frames, dim, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, frames, dim, generator=g) * 3 + 10   # raw fbank-like scale


def stream(model, feats, chunk):
    cache = model.zero_cache(feats.size(0))
    outs = []
    for start in range(0, feats.size(1), chunk):
        out, cache = model(feats[:, start:start + chunk], cache)
        outs.append(out)
    return torch.cat(outs, dim=1), cache


def test_cmvn_stats_loaded():
    model, cmvn = make_model()
    assert torch.allclose(model.cmvn.mean, torch.tensor(cmvn["mean"]))
    assert torch.allclose(model.cmvn.inv_std, torch.tensor(cmvn["inv_std"]))


def test_streaming_equals_whole_for_every_chunk_size():
    model, _ = make_model()
    T = 60
    feats = features(3, T, 40)
    with torch.no_grad():
        whole, final_cache = model(feats)
        assert whole.shape == (3, T, 2)
        assert final_cache.shape == (3, model.cache_size)
        # Explicit zero cache is the same as "start of stream".
        again, _ = model(feats, model.zero_cache(3))
        assert torch.equal(whole, again)
        worst = 0.0
        for chunk in range(1, T + 1):
            got, cache = stream(model, feats, chunk)
            assert got.shape == whole.shape
            worst = max(worst, (got - whole).abs().max().item())
            assert (cache - final_cache).abs().max().item() <= 1e-5
    assert worst <= 1e-5
    # The batch items are independent: each one alone gives its own rows.
    with torch.no_grad():
        single, _ = model(feats[1:2])
    assert (single[0] - whole[1]).abs().max().item() <= 1e-5


def test_cache_continues_across_utterance_boundary():
    # Streaming two halves equals one pass only if the cache really carries the history:
    # a fresh (zero) cache for the second half must give something different.
    model, _ = make_model(seed=3)
    feats = features(2, 40, 40, seed=4)
    with torch.no_grad():
        whole, _ = model(feats)
        _, cache = model(feats[:, :20])
        carried, _ = model(feats[:, 20:], cache)
        fresh, _ = model(feats[:, 20:])
    assert (carried - whole[:, 20:]).abs().max().item() <= 1e-5
    assert (fresh - whole[:, 20:]).abs().max().item() > 1e-3


@pytest.mark.parametrize("hidden, layers, kernel, dilations", [
    (64, 4, 8, [1, 2, 4, 8]),
    (16, 5, 3, [1, 2]),          # dilations repeat cyclically: 1 2 1 2 1
    (8, 2, 1, [4]),              # kernel 1: no context at all
])
def test_cache_size_and_receptive_field_formula(hidden, layers, kernel, dilations):
    model, _ = make_model(hidden_dim=hidden, num_layers=layers, kernel_size=kernel,
                          dilations=dilations, input_dim=10)
    used = [dilations[i % len(dilations)] for i in range(layers)]
    assert model.cache_size == sum(hidden * (kernel - 1) * d for d in used)
    assert model.receptive_field() == 1 + sum((kernel - 1) * d for d in used)
    assert model.zero_cache(2).shape == (2, model.cache_size)


@pytest.mark.parametrize("kw", [dict(), dict(hidden_dim=16, num_layers=3, kernel_size=3,
                                             dilations=[1, 3])])
def test_receptive_field(kw):
    model, _ = make_model(seed=5, **kw)
    rf = model.receptive_field()
    T = rf + 25
    feats = features(1, T, 40, seed=6)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        base, _ = model(feats)
        for t in (rf - 1, rf + 10, T - 1):
            changed = feats.clone()
            first_relevant = t - rf + 1
            changed[:, :first_relevant] += torch.randn(1, first_relevant, 40, generator=g) * 20
            out, _ = model(changed)
            # Output at t and later frames whose window starts after the change: unchanged.
            assert (out[:, t:] - base[:, t:]).abs().max().item() <= 1e-6
            # The frame just inside the window does matter (the field is not smaller).
            inside = feats.clone()
            inside[:, first_relevant] += torch.randn(40, generator=g) * 20
            out_inside, _ = model(inside)
            assert (out_inside[:, t] - base[:, t]).abs().max().item() > 1e-6
            # Causality: nothing before the change moves.
            assert torch.equal(out_inside[:, :first_relevant], base[:, :first_relevant])


def test_default_parameter_count():
    cfg = DSTCN.Config(type="ds_tcn", input_dim=40, num_outputs=1)
    assert (cfg.hidden_dim, cfg.num_layers, cfg.kernel_size) == (64, 5, 8)
    model = build_model(cfg)
    n = count_parameters(model)
    h, d, k = 64, 40, 8
    expected = (d * h + h + 2 * h                      # input projection + BatchNorm
                + 5 * (h * k + h + h * h + h + 2 * h)  # depthwise, pointwise, BatchNorm
                + h + 1)                               # classifier
    assert n == expected == 27137
    # 1 + (k - 1) * sum(dilations): the end of a ~1 s keyword still sees its start.
    assert model.receptive_field() == 1 + 7 * (1 + 2 + 4 + 8 + 16) == 218
    # CMVN statistics are buffers, not trainable parameters.
    names = {name for name, _ in model.named_parameters()}
    assert not any(name.startswith("cmvn.") for name in names)


def test_build_model_requires_resolved_dims():
    with pytest.raises(ValueError):
        build_model(DSTCN.Config(type="ds_tcn", input_dim=0, num_outputs=1))
    model = build_model(DSTCN.Config(type="ds_tcn", input_dim=40, num_outputs=1))
    with pytest.raises(ValueError, match="CMVN dimension"):
        model.cmvn.load_stats([0.0] * 39, [1.0] * 39)


def check_chunked_exports(model, feats, cut, onnx_path):
    """TorchScript (<= 1e-5) and ONNX Runtime (<= 1e-4) match PyTorch on two chunks of
    `feats` split at frame `cut`, the cache carried from the first to the second."""
    import onnxruntime as ort

    from toolkit.data.features import fbank_metadata, fbank_options
    from toolkit.tasks.kws.export import StreamingScorer, build_metadata, export_onnx

    meta = build_metadata(model, fbank_metadata(fbank_options(num_mel_bins=feats.size(2))),
                          ["a", "b"], None)
    export_onnx(model, onnx_path, meta)
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    scorer = StreamingScorer(model).eval()
    scripted = torch.jit.script(scorer)
    cache = torch.zeros(feats.size(0), model.cache_size)
    for start, stop in ((0, cut), (cut, feats.size(1))):
        with torch.no_grad():
            probs, cache_next = scorer(feats[:, start:stop], cache)
            ts_probs, ts_cache = scripted(feats[:, start:stop], cache)
        assert (ts_probs - probs).abs().max().item() <= 1e-5
        assert (ts_cache - cache_next).abs().max().item() <= 1e-5
        o_probs, o_cache = session.run(None, {"feats": feats[:, start:stop].numpy(),
                                              "cache": cache.numpy()})
        assert np.abs(o_probs - probs.numpy()).max() <= 1e-4
        assert np.abs(o_cache - cache_next.numpy()).max() <= 1e-4
        cache = cache_next


def test_conv_frontend_streams_and_exports(tmp_path):
    model, _ = make_model(seed=8, hidden_dim=16, frontend_channels=4)
    # 40 bins -> 20 -> 10 after the two frequency strides; 2 frames of context each
    assert model.frontend.cache_shapes == [(40, 2), (4 * 20, 2)]
    assert model.cache_size == 40 * 2 + 80 * 2 + sum(16 * 7 * d for d in (1, 2, 4, 8, 16))
    assert model.receptive_field() == 1 + 2 + 2 + 7 * 31
    for m in model.modules():   # non-trivial 2-D BatchNorm statistics too
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.3)
            m.running_var.uniform_(0.5, 2.0)
    T = 30
    feats = features(2, T, 40, seed=9)
    with torch.no_grad():
        whole, final_cache = model(feats)
        plain, _ = make_model(seed=8, hidden_dim=16)
        assert whole.shape == plain(feats)[0].shape == (2, T, 2)
        for chunk in range(1, T + 1):
            got, cache = stream(model, feats, chunk)
            assert (got - whole).abs().max().item() <= 1e-5, chunk
            assert (cache - final_cache).abs().max().item() <= 1e-5, chunk
        # the front end looks back in time only: a change at frame 20 leaves 0-19 alone
        changed = feats.clone()
        changed[:, 20] += 5.0
        out, _ = model(changed)
        assert torch.equal(out[:, :20], whole[:, :20]) and not torch.equal(out, whole)
    check_chunked_exports(model, feats, 11, str(tmp_path / "model.onnx"))
    with pytest.raises(ValueError, match="frontend_channels"):
        make_model(frontend_channels=-1)
