"""Speaker embedding extractors and classification heads."""
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from toolkit.config import ConfigError, Ramp
from toolkit.tasks.speaker.heads import (SPEAKER_HEADS, AAMSoftmaxHead, AMSoftmaxHead,
                                         SoftmaxHead, build_speaker_head)
from toolkit.tasks.speaker.models import (SPEAKER_MODELS, ECAPATDNN, SpeakerResNet,
                                          XVectorTDNN, build_speaker_model, count_parameters)


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def build(name, **fields):
    return build_speaker_model(SPEAKER_MODELS.get(name).Config(type=name, **fields))


def calibrated(model, dim=80, frames=120):
    """The model in eval mode with BatchNorm statistics of a few random batches, so
    activations have the scale of a trained model rather than that of unit-variance
    running statistics compounded over many layers."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.momentum = None             # cumulative average
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, frames, dim))
    return model.eval()


# Each architecture with every layer, kernel, dilation and stride of its default but fewer
# channels: shapes, the time axis, normalisation and export behave as at full width, at a
# fraction of the compute. The defaults are counted below and run once (shortest input).
RUNNABLE = [("tdnn_xvector", {"frame_channels": [64, 64, 64, 64, 192], "embed_dim": 32}),
            ("resnet", {"base_channels": 8, "embed_dim": 32}),
            ("ecapa_tdnn", {"channels": 64, "mfa_channels": 192, "se_bottleneck": 16,
                            "attention_bottleneck": 16, "embed_dim": 32})]
DEFAULTS = [(name, {}) for name, _ in RUNNABLE]


# ------------------------------------------------------------------- parameter counts

def test_registry_lists_the_three_models():
    assert SPEAKER_MODELS.names() == ["ecapa_tdnn", "resnet", "tdnn_xvector"]
    assert SPEAKER_MODELS.get("resnet") is SpeakerResNet


def test_resnet34_default_matches_wespeaker_count():
    model = build("resnet")
    assert model.config.num_blocks == [3, 4, 6, 3] and model.config.embed_dim == 256
    # WeSpeaker reports 6.63 M for ResNet34 (80-d fbank, 256-d embedding).
    assert 6.5e6 <= count_parameters(model) <= 6.75e6


def test_resnet18_is_the_shallower_variant():
    deep, shallow = build("resnet"), build("resnet", num_blocks=[2, 2, 2, 2])
    assert count_parameters(shallow) < count_parameters(deep)
    assert len(shallow.stages[0]) == 2 and len(deep.stages[2]) == 6


def test_ecapa_counts_match_the_paper():
    # Desplanques et al.: 14.7 M (C=1024; WeSpeaker 14.65 M) and 6.2 M (C=512).
    assert 14.4e6 <= count_parameters(build("ecapa_tdnn", channels=1024)) <= 14.9e6
    assert 6.0e6 <= count_parameters(build("ecapa_tdnn", channels=512)) <= 6.4e6


def test_xvector_count():
    # By hand: frame convs 205,312 + 786,944 + 786,944 + 262,656 + 769,500, their
    # BatchNorms 2 * (4 * 512 + 1500) = 7,096, embedding 3000 * 512 + 512 = 1,536,512:
    # 4,354,964.
    n = count_parameters(build("tdnn_xvector"))
    assert abs(n - 4_354_964) <= 0.03 * 4_354_964


# ------------------------------------------------------------------------- forward

@pytest.mark.parametrize("name,fields", RUNNABLE)
def test_output_shape_for_two_lengths(name, fields):
    model = build(name, **fields).eval()
    embed_dim = model.config.embed_dim
    with torch.no_grad():
        for frames in (100, 237):
            out = model(torch.randn(2, frames, 80))
            assert out.shape == (2, embed_dim)
            assert torch.isfinite(out).all()


@pytest.mark.parametrize("name,fields", RUNNABLE + DEFAULTS)
def test_shortest_input_runs(name, fields):
    model = build(name, **fields).eval()
    with torch.no_grad():
        out = model(torch.randn(1, model.min_frames, 80))
    assert out.shape == (1, model.config.embed_dim) and torch.isfinite(out).all()


def test_xvector_needs_its_context():
    model = build("tdnn_xvector").eval()
    assert model.min_frames == 15          # 1 + 4 + 4 + 6 frames of context
    with pytest.raises(RuntimeError):
        model(torch.randn(1, model.min_frames - 1, 80))


@pytest.mark.parametrize("name,fields", RUNNABLE)
def test_utterance_mean_makes_output_offset_invariant(name, fields):
    model = calibrated(build(name, **fields))
    feats = torch.randn(2, 60, 80)
    offset = 3.0 * torch.randn(1, 1, 80)      # a channel / gain difference per bin
    with torch.no_grad():
        ref, shifted = model(feats), model(feats + offset)
    assert torch.allclose(ref, shifted, atol=1e-4 * max(1.0, ref.abs().max().item()))

    model.config.input_norm = "none"          # without it the offset does change the output
    with torch.no_grad():
        assert not torch.allclose(model(feats), model(feats + offset), atol=1e-2)


def test_unknown_input_norm_is_a_config_error():
    with pytest.raises(ConfigError, match="input_norm"):
        build("resnet", input_norm="global")


def test_ecapa_rejects_channels_not_divisible_by_scale():
    with pytest.raises(ConfigError, match="res2net_scale"):
        build("ecapa_tdnn", channels=100)


def test_build_rejects_unknown_type():
    with pytest.raises(ConfigError, match="unknown 'conformer'"):
        build_speaker_model(XVectorTDNN.Config(type="conformer"))


def test_every_config_field_is_commented():
    import inspect
    for cls in (XVectorTDNN, SpeakerResNet, ECAPATDNN, AMSoftmaxHead, AAMSoftmaxHead, SoftmaxHead):
        lines = inspect.getsource(cls.Config).splitlines()
        for i, line in enumerate(lines):
            stripped = line.strip()
            if ":" not in stripped or stripped.startswith(("#", "@", "class")):
                continue
            if stripped.startswith("type:"):
                continue
            assert "#" in line or lines[i - 1].strip().startswith("#"), \
                f"{cls.__name__}.Config: {stripped!r} has no comment"


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
@pytest.mark.parametrize("name,fields", RUNNABLE)
def test_onnx_export_has_a_dynamic_time_axis(name, fields, tmp_path):
    import onnxruntime as ort
    model = calibrated(build(name, **fields))
    path = str(tmp_path / f"{name}.onnx")
    torch.onnx.export(model, (torch.randn(1, 50, 80),), path, dynamo=False, opset_version=17,
                      input_names=["feats"], output_names=["embedding"],
                      dynamic_axes={"feats": {0: "batch", 1: "frames"},
                                    "embedding": {0: "batch"}})
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for frames in (73, 161):               # neither is the traced length
        feats = torch.randn(2, frames, 80)
        with torch.no_grad():
            ref = model(feats).numpy()
        out = session.run(None, {"feats": feats.numpy()})[0]
        assert out.shape == ref.shape
        assert np.abs(out - ref).max() <= 1e-4


# ---------------------------------------------------------------------------- heads

EMBED = 4
SCALE = 32.0


def margin_head(kind, num_classes=3):
    cls = SPEAKER_HEADS.get(kind)
    head = build_speaker_head(cls.Config(type=kind, num_classes=num_classes), EMBED)
    with torch.no_grad():                  # class c along axis c: cosines are coordinates
        head.weight.copy_(torch.eye(num_classes, EMBED) * 2.5)
    return head


def at_angle(theta):
    """Embeddings at angles `theta` from class 0 (axis 0), in the plane of axes 0 and 3,
    so their cosine to classes 1 and 2 is 0."""
    theta = torch.as_tensor(theta, dtype=torch.float64)
    x = torch.zeros(theta.numel(), EMBED, dtype=torch.float64)
    x[:, 0], x[:, 3] = torch.cos(theta), torch.sin(theta)
    return (x * 1.7).float()               # the length must not matter


def test_head_registry_and_weight_shapes():
    assert SPEAKER_HEADS.names() == ["aam_softmax", "am_softmax", "softmax"]
    for kind in SPEAKER_HEADS.names():
        config = SPEAKER_HEADS.get(kind).Config(type=kind, num_classes=7)
        head = build_speaker_head(config, 16)
        assert head.weight.shape == (7, 16)
        if kind != "softmax":
            # The margin ramps to 0.2 over training (a number gives a constant margin).
            assert config.scale == 32.0 and config.margin.final == 0.2
            assert config.margin.value(0, 100) == 0.0 and config.margin.value(100, 100) == 0.2


def test_reset_parameters_reinitialises_the_weights():
    for kind in SPEAKER_HEADS.names():
        head = build_speaker_head(SPEAKER_HEADS.get(kind).Config(type=kind, num_classes=5), 8)
        with torch.no_grad():
            head.weight.fill_(1.0)
        head.reset_parameters()
        assert head.weight.std() > 0.01


def test_unresolved_num_classes_is_a_config_error():
    with pytest.raises(ConfigError, match="num_classes"):
        build_speaker_head(AAMSoftmaxHead.Config(type="aam_softmax"), 8)


@pytest.mark.parametrize("kind", ["am_softmax", "aam_softmax"])
def test_margin_zero_gives_scaled_cosine(kind):
    head = build_speaker_head(SPEAKER_HEADS.get(kind).Config(type=kind, num_classes=6), 10)
    emb = torch.randn(5, 10)
    labels = torch.tensor([0, 1, 2, 3, 5])
    cos = F.normalize(emb, dim=1) @ F.normalize(head.weight, dim=1).T
    assert torch.allclose(head(emb, labels, 0.0), SCALE * cos, atol=1e-5)
    assert torch.allclose(head(emb, None, 0.3), SCALE * cos, atol=1e-5)


def test_aam_target_logit_is_scaled_cos_of_theta_plus_m():
    head = margin_head("aam_softmax")
    theta = torch.tensor([0.3, 0.8, 1.2, 1.9, 2.5])         # all below pi - m
    m = 0.2
    logits = head(at_angle(theta), torch.zeros(5, dtype=torch.long), m)
    assert torch.allclose(logits[:, 0], SCALE * torch.cos(theta + m), atol=1e-4)


def test_aam_target_logit_is_monotone_and_finite_up_to_pi():
    head = margin_head("aam_softmax")
    m = 0.2
    # dense near pi, where cos(theta + m) would turn back up
    theta = torch.cat([torch.linspace(0.0, math.pi - 0.5, 50),
                       torch.linspace(math.pi - 0.5, math.pi, 200)])
    emb = at_angle(theta).requires_grad_()
    target = head(emb, torch.zeros(len(theta), dtype=torch.long), m)[:, 0]
    assert torch.isfinite(target).all()
    assert (target[1:] <= target[:-1] + 1e-4).all()
    # past the switch it is the linear continuation cos(theta) - m sin(m)
    past = theta > math.pi - m + 1e-3
    expected = SCALE * (torch.cos(theta[past]) - m * math.sin(m))
    assert torch.allclose(target[past], expected, atol=1e-4)
    # cos = +-1 exactly (theta = 0 and pi) still has a finite gradient
    target.sum().backward()
    assert torch.isfinite(emb.grad).all()


def test_am_target_logit_is_scaled_cos_minus_m():
    head = margin_head("am_softmax")
    theta = torch.tensor([0.1, 1.0, 2.0, 3.1])
    logits = head(at_angle(theta), torch.zeros(4, dtype=torch.long), 0.35)
    assert torch.allclose(logits[:, 0], SCALE * (torch.cos(theta) - 0.35), atol=1e-4)


@pytest.mark.parametrize("kind", ["am_softmax", "aam_softmax"])
def test_margin_changes_only_the_target_logit(kind):
    head = build_speaker_head(SPEAKER_HEADS.get(kind).Config(type=kind, num_classes=6), 10)
    emb = torch.randn(8, 10)
    labels = torch.randint(0, 6, (8,))
    plain, with_margin = head(emb, labels, 0.0), head(emb, labels, 0.3)
    target = F.one_hot(labels, 6).bool()
    assert torch.equal(plain[~target], with_margin[~target])
    assert (with_margin[target] < plain[target]).all()     # the margin is a penalty


@pytest.mark.parametrize("kind", ["softmax", "am_softmax", "aam_softmax"])
def test_gradients_reach_embeddings_and_weights(kind):
    head = build_speaker_head(SPEAKER_HEADS.get(kind).Config(type=kind, num_classes=6), 10)
    emb = torch.randn(8, 10, requires_grad=True)
    labels = torch.randint(0, 6, (8,))
    margin = 0.0 if kind == "softmax" else 0.2
    F.cross_entropy(head(emb, labels, margin), labels).backward()
    for grad in (emb.grad, head.weight.grad):
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_softmax_head_refuses_a_margin():
    head = build_speaker_head(SoftmaxHead.Config(type="softmax", num_classes=3), 4)
    emb = torch.randn(2, 4)
    assert torch.allclose(head(emb, None, 0.0), head.linear(emb))
    with pytest.raises(ValueError, match="margin"):
        head(emb, torch.tensor([0, 1]), 0.2)
    with pytest.raises(ConfigError, match="margin"):
        SoftmaxHead(SoftmaxHead.Config(type="softmax", num_classes=3,
                                       margin=Ramp.constant(0.2)), 4)
