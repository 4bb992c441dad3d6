"""Every family trains on CUDA under training.deterministic (the default): no forward or
backward pass may call an op that PyTorch's deterministic mode refuses on CUDA. CUDA is
not here, so the aten ops of a training pass on CPU are recorded and checked against
those PyTorch lists as nondeterministic on CUDA (torch.use_deterministic_algorithms)."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from toolkit.nn.ctc import ctc_loss, ctc_loss_by_recursion
from toolkit.tasks.codec.discriminators import (MultiPeriodDiscriminator,
                                                MultiPeriodDiscriminatorConfig,
                                                MultiResolutionSTFTDiscriminator,
                                                MultiResolutionSTFTDiscriminatorConfig)
from toolkit.tasks.codec.losses import (MultiResolutionMelLoss, MultiResolutionSTFTLoss,
                                        feature_matching_loss, generator_adversarial_loss)
from toolkit.tasks.codec.model import CodecConfig, CodecModel
from toolkit.tasks.kws.losses import LOSSES
from toolkit.tasks.kws.models import MODELS, build_model
from toolkit.tasks.kws.task import WithCTCHead
from toolkit.tasks.speaker.heads import SPEAKER_HEADS, build_speaker_head
from toolkit.tasks.speaker.models import SPEAKER_MODELS, build_speaker_model

# aten ops that raise under deterministic mode on CUDA (PyTorch's list for
# use_deterministic_algorithms), by name prefix; cumsum only for floating point.
REFUSED_ON_CUDA = (
    "aten::avg_pool3d_backward", "aten::_adaptive_avg_pool2d_backward",
    "aten::adaptive_avg_pool2d_backward", "aten::_adaptive_avg_pool3d_backward",
    "aten::adaptive_avg_pool3d_backward", "aten::adaptive_max_pool2d_backward",
    "aten::fractional_max_pool", "aten::max_unpool", "aten::upsample_linear1d_backward",
    "aten::upsample_bilinear2d_backward", "aten::upsample_bicubic2d_backward",
    "aten::upsample_trilinear3d_backward", "aten::reflection_pad", "aten::nll_loss2d",
    "aten::_ctc_loss_backward", "aten::put_", "aten::histc", "aten::bincount",
    "aten::median", "aten::grid_sampler", "aten::_embedding_bag_backward")


class RefusedOps(TorchDispatchMode):
    """Records the refused-on-CUDA aten ops that run inside it, forward and backward."""

    def __init__(self):
        super().__init__()
        self.found = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name.startswith(REFUSED_ON_CUDA) or (
                name.startswith("aten::cumsum") and args[0].is_floating_point()):
            self.found.add(name)
        return func(*args, **(kwargs or {}))


def refused_ops(training_pass) -> list:
    with RefusedOps() as recorder:
        training_pass()
    return sorted(recorder.found)


def test_the_recorder_sees_what_cuda_refuses():
    x = torch.randn(2, 1, 50, requires_grad=True)
    assert refused_ops(lambda: F.pad(x, (3, 3), mode="reflect").sum().backward()) == [
        "aten::reflection_pad1d", "aten::reflection_pad1d_backward"]
    assert refused_ops(lambda: F.pad(x, (3, 3)).sum().backward()) == []


# --------------------------------------------------------------------------- codec

def test_codec_gan_step():
    # The STFTs and the MPD pad by reflection: CUDA's reflection_pad1d backward stopped every
    # codec config at its first GPU step; they reflect by slices and flips now.
    config = CodecConfig(channels=4, strides=[2, 4, 5, 8], n_codebooks=2, codebook_size=16,
                         codebook_dim=4)
    generator = CodecModel(config)
    mpd = MultiPeriodDiscriminator(MultiPeriodDiscriminatorConfig(channels_scale=1 / 32))
    mstftd = MultiResolutionSTFTDiscriminator(MultiResolutionSTFTDiscriminatorConfig(filters=4))
    mel = MultiResolutionMelLoss(16000)
    real = 0.1 * torch.randn(2, 1, 3205)          # not a multiple of any MPD period

    def gan_step():
        out = generator(real)
        fake_logits, fake_feats = [a + b for a, b in zip(mpd(out["audio"]), mstftd(out["audio"]))]
        _, real_feats = [a + b for a, b in zip(mpd(real), mstftd(real))]
        loss = (mel(out["audio"], real) + sum(MultiResolutionSTFTLoss()(out["audio"], real))
                + generator_adversarial_loss(fake_logits)
                + feature_matching_loss(real_feats, fake_feats)
                + out["commit_loss"] + out["codebook_loss"])
        loss.backward()

    assert refused_ops(gan_step) == []


def test_codec_v2_step():
    """codec-voicebank-v2's terms: the causal inverse-STFT decoder, the compressed complex
    STFT loss and the periodicity teacher, distilled and compared through."""
    from toolkit.tasks.codec.losses import CompressedComplexSTFTLoss
    from toolkit.tasks.codec.pitch import PeriodicityFeatures
    generator = CodecModel(CodecConfig(channels=4, strides=[2, 4, 5, 8], n_codebooks=2,
                                       codebook_size=16, codebook_dim=4, causal=True,
                                       decoder="istft", istft_dim=16, istft_layers=2,
                                       istft_n_fft=640))
    teacher, head = PeriodicityFeatures(), torch.nn.Conv1d(64, 65, 1)
    real = 0.1 * torch.randn(2, 1, 3200)

    def step():
        out = generator(real, first_stage=True)
        target = teacher(real[:, 0]).transpose(1, 2)
        distill = F.l1_loss(head(out["first_stage"]), F.interpolate(
            target, size=out["first_stage"].shape[-1], mode="linear"))
        perceptual = F.l1_loss(teacher(out["audio"][:, 0]), teacher(real[:, 0]))
        loss = CompressedComplexSTFTLoss()(out["audio"], real) + distill + perceptual
        loss.backward()

    assert refused_ops(step) == []


# --------------------------------------------------------------------------- keyword spotting

@pytest.mark.parametrize("name", sorted(MODELS.names()))
def test_keyword_models_with_every_criterion(name):
    torch.manual_seed(0)
    try:
        model = build_model(MODELS.get(name).Config(type=name, input_dim=40, num_outputs=3,
                                                    ctc_outputs=6))
    except ValueError as e:                       # an utterance classifier: no CTC head
        assert "has no CTC head" in str(e)
        model = build_model(MODELS.get(name).Config(type=name, input_dim=40, num_outputs=3))
    feats, lengths = torch.randn(3, 60, 40), torch.tensor([60, 45, 30])
    labels = torch.tensor([0, 2, -1])
    tokens, token_lengths = torch.tensor([[1, 2, 3], [4, 4, 0], [5, 0, 0]]), torch.tensor([3, 2, 1])
    max_pooling = LOSSES.get("max_pooling")(LOSSES.get("max_pooling").Config())
    cross_entropy = LOSSES.get("cross_entropy")(LOSSES.get("cross_entropy").Config())

    def training_pass():
        if getattr(model, "ctc_head", None) is not None:
            logits, ctc_logits = WithCTCHead(model)(feats)
            log_probs = F.log_softmax(ctc_logits.float(), dim=-1).transpose(0, 1)
            # The path CTCLoss takes on CUDA with deterministic algorithms on.
            loss = ctc_loss(log_probs, tokens, lengths, token_lengths, zero_infinity=True,
                            deterministic=True).sum()
        else:
            logits, loss = model(feats), 0.0
        logits = logits[0] if isinstance(logits, tuple) else logits
        if logits.dim() == 3:
            loss = loss + max_pooling(logits, lengths, labels)[0]
        loss = loss + cross_entropy(logits, lengths, labels.clamp(min=0))[0]
        loss.backward()

    assert refused_ops(training_pass) == []


def test_ctc_by_recursion_equals_the_fused_kernel_and_avoids_its_backward():
    torch.manual_seed(0)
    logits = torch.randn(30, 5, 7, requires_grad=True)
    # Repeated labels, a single label, no label, and an input too short for its targets.
    targets = torch.tensor([[1, 2, 2, 3, 0, 0], [4, 4, 4, 4, 4, 4], [1, 0, 0, 0, 0, 0],
                            [0, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6]])
    target_lengths, input_lengths = torch.tensor([4, 6, 1, 0, 6]), torch.tensor([30, 11, 20, 25, 5])
    results = {}
    for deterministic in (False, True):
        def loss_and_grad():
            loss = ctc_loss(F.log_softmax(logits, -1), targets, input_lengths, target_lengths,
                            zero_infinity=True, deterministic=deterministic)
            grad, = torch.autograd.grad(loss.sum(), logits)
            results[deterministic] = loss.detach(), grad
        results[f"ops {deterministic}"] = refused_ops(loss_and_grad)
    assert results["ops False"] == ["aten::_ctc_loss_backward"]
    assert results["ops True"] == []
    (fused, fused_grad), (mine, mine_grad) = results[False], results[True]
    assert fused[4] == mine[4] == 0.0                 # infeasible: zeroed
    assert torch.allclose(mine, fused, rtol=1e-5, atol=1e-4)
    assert torch.allclose(mine_grad, fused_grad, atol=1e-4)
    unzeroed = ctc_loss_by_recursion(F.log_softmax(logits, -1).detach(), targets, input_lengths,
                                     target_lengths)
    assert torch.isinf(unzeroed[4]) and torch.isfinite(unzeroed[:4]).all()
    concatenated = torch.cat([targets[b, :n] for b, n in enumerate(target_lengths.tolist())])
    assert torch.equal(ctc_loss_by_recursion(F.log_softmax(logits, -1).detach(), concatenated,
                                             input_lengths, target_lengths), unzeroed)


# --------------------------------------------------------------------------- speaker

@pytest.mark.parametrize("name", sorted(SPEAKER_MODELS.names()))
@pytest.mark.parametrize("head", sorted(SPEAKER_HEADS.names()))
def test_speaker_models_with_every_head(name, head):
    torch.manual_seed(0)
    model = build_speaker_model(SPEAKER_MODELS.get(name).Config(type=name, input_dim=24,
                                                                embed_dim=16))
    classifier = build_speaker_head(SPEAKER_HEADS.get(head).Config(type=head, num_classes=5), 16)
    feats, labels = torch.randn(2, 80, 24), torch.tensor([1, 4])

    def training_pass():
        logits = classifier(model(feats), labels)
        F.cross_entropy(logits.float(), labels).backward()

    assert refused_ops(training_pass) == []
