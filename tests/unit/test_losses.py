"""Losses vs slow per-utterance references written independently of the batched code."""
import pytest
import torch

from toolkit.tasks.kws.losses import CrossEntropyLoss, MaxPoolingLoss, build_loss


def softplus64(x):
    return torch.log1p(torch.exp(-x.abs())) + x.clamp(min=0)


def max_pooling_reference(logits, lengths, labels, min_duration, focal_gamma=0.0,
                          keyword_end=None, end_window=None):
    """Loop over utterances and keywords; float64. Returns (loss, accuracy)."""
    total = logits.new_zeros(())
    correct = 0
    batch, _, num_kw = logits.shape
    for b in range(batch):
        length, label = int(lengths[b]), int(labels[b])
        seq = logits[b, :length]                       # (L, K) valid frames only
        detected = []
        for k in range(num_kw):
            end = -1 if keyword_end is None else int(keyword_end[b])
            if k == label and end_window and end >= 0 and \
                    max(0, end + end_window[0]) <= min(length - 1, end + end_window[1]):
                m = seq[max(0, end + end_window[0]):end + end_window[1] + 1, k].max()
                p_wrong = 1 - 1 / (1 + torch.exp(-m))
                total = total + softplus64(-m) * p_wrong ** focal_gamma
            elif k == label:
                guarded = seq[min_duration:, k] if length > min_duration else seq[:, k]
                m = guarded.max()
                p_wrong = 1 - 1 / (1 + torch.exp(-m))   # 1 - sigmoid(m)
                total = total + softplus64(-m) * p_wrong ** focal_gamma   # -log sigmoid(m)
            else:
                m = seq[:, k].max()
                p_wrong = 1 / (1 + torch.exp(-m))
                total = total + softplus64(m) * p_wrong ** focal_gamma    # -log (1 - sigmoid(m))
            detected.append(bool(m > 0))
        if label >= 0:
            correct += int(detected[label] and sum(detected) == 1)
        else:
            correct += int(not any(detected))
    return total / batch, correct / batch


def random_batch(seed, batch=9, frames=23, num_kw=3, short=5):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, frames, num_kw, generator=g) * 3
    lengths = torch.randint(1, frames + 1, (batch,), generator=g)
    lengths[0] = frames                         # one full-length utterance
    lengths[1] = 1                              # shorter than any min_duration > 1
    lengths[2] = short                          # exactly min_duration frames
    lengths[3] = short + 1
    labels = torch.tensor([-1, 0, 1, 2] * 3)[:batch][torch.randperm(batch, generator=g)]
    labels[1], labels[2], labels[3] = 1, 2, 0   # short utterances carry keywords
    return logits, lengths, labels


@pytest.mark.parametrize("min_duration", [0, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_max_pooling_matches_reference(min_duration, seed):
    logits, lengths, labels = random_batch(seed, short=max(min_duration, 3))
    loss_fn = build_loss(MaxPoolingLoss.Config(type="max_pooling", min_duration=min_duration))
    assert isinstance(loss_fn, MaxPoolingLoss)

    x = logits.clone().requires_grad_(True)
    loss, metrics = loss_fn(x, lengths, labels)
    loss.backward()

    x_ref = logits.double().clone().requires_grad_(True)
    ref_loss, ref_acc = max_pooling_reference(x_ref, lengths, labels, min_duration)
    ref_loss.backward()

    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert abs(loss.item() - ref_loss.item()) <= 1e-6 * max(1.0, abs(ref_loss.item()))
    assert torch.max(torch.abs(x.grad.double() - x_ref.grad)).item() <= 1e-6
    assert metrics["acc"].item() == pytest.approx(ref_acc)
    # Padding frames never receive gradient.
    for b in range(len(lengths)):
        assert torch.all(x.grad[b, int(lengths[b]):] == 0)


def test_max_pooling_min_duration_changes_positive_frame():
    # Keyword 0 peaks at frame 1; with min_duration 5 the positive max must come from
    # frames 5.. instead, so the loss differs and the gradient moves.
    logits = torch.full((1, 10, 1), -2.0)
    logits[0, 1, 0] = 4.0
    logits[0, 7, 0] = 1.0
    lengths, labels = torch.tensor([10]), torch.tensor([0])
    g = []
    for md in (0, 5):
        x = logits.clone().requires_grad_(True)
        loss, _ = MaxPoolingLoss(MaxPoolingLoss.Config(min_duration=md))(x, lengths, labels)
        loss.backward()
        g.append(x.grad[0, :, 0].nonzero().flatten().tolist())
        expected = softplus64(-torch.tensor(4.0 if md == 0 else 1.0, dtype=torch.float64))
        assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert g == [[1], [7]]
    # Negatives (filler) use every frame regardless of min_duration.
    x = logits.clone().requires_grad_(True)
    loss, _ = MaxPoolingLoss(MaxPoolingLoss.Config(min_duration=5))(x, lengths, torch.tensor([-1]))
    loss.backward()
    assert x.grad[0, :, 0].nonzero().flatten().tolist() == [1]


def test_max_pooling_ignores_padding_values():
    logits, lengths, labels = random_batch(7)
    loss_fn = MaxPoolingLoss(MaxPoolingLoss.Config(min_duration=5))
    a, _ = loss_fn(logits, lengths, labels)
    spoiled = logits.clone()
    for b in range(len(lengths)):
        spoiled[b, int(lengths[b]):] = 1e4
    b_, _ = loss_fn(spoiled, lengths, labels)
    assert a.item() == b_.item()


def cross_entropy_reference(logits, lengths, labels, smoothing):
    total = logits.new_zeros(())
    for b in range(logits.shape[0]):
        mean = logits[b, :int(lengths[b])].mean(dim=0) if logits.dim() == 3 else logits[b]
        logp = mean - torch.logsumexp(mean, dim=0)
        nll = -logp[int(labels[b])]
        total = total + (1 - smoothing) * nll + smoothing * (-logp.mean())
    return total / logits.shape[0]


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_3d_masked_mean(smoothing):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 15, 5, generator=g) * 2
    lengths = torch.tensor([15, 1, 7, 3, 15, 10])
    labels = torch.tensor([0, 4, 2, 2, 1, 3])
    loss_fn = build_loss(CrossEntropyLoss.Config(type="cross_entropy", label_smoothing=smoothing))
    x = logits.clone().requires_grad_(True)
    loss, metrics = loss_fn(x, lengths, labels)
    loss.backward()
    x_ref = logits.double().clone().requires_grad_(True)
    ref = cross_entropy_reference(x_ref, lengths, labels, smoothing)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.max(torch.abs(x.grad.double() - x_ref.grad)).item() <= 1e-6
    for b in range(len(lengths)):
        assert torch.all(x.grad[b, int(lengths[b]):] == 0)
    means = torch.stack([logits[b, :int(lengths[b])].mean(0) for b in range(len(lengths))])
    assert metrics["acc"].item() == pytest.approx((means.argmax(1) == labels).float().mean().item())


def test_cross_entropy_2d_used_as_is():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(5, 4, generator=g)
    labels = torch.tensor([0, 1, 2, 3, 0])
    loss, _ = CrossEntropyLoss(CrossEntropyLoss.Config())(logits, torch.ones(5, dtype=torch.long),
                                                          labels)
    ref = cross_entropy_reference(logits.double(), None, labels, 0.0)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)


@pytest.mark.parametrize("gamma", [0.5, 2.0])
def test_max_pooling_focal_matches_reference(gamma):
    logits, lengths, labels = random_batch(7)
    crit = MaxPoolingLoss(MaxPoolingLoss.Config(type="max_pooling", min_duration=5,
                                                focal_gamma=gamma))
    loss, _ = crit(logits, lengths, labels)
    expected, _ = max_pooling_reference(logits.double(), lengths, labels, 5, gamma)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    plain, _ = MaxPoolingLoss(MaxPoolingLoss.Config(type="max_pooling", min_duration=5))(
        logits, lengths, labels)
    assert loss.item() < plain.item()          # every term is scaled by a factor < 1


def test_focal_gamma_must_not_be_negative():
    from toolkit.config import ConfigError
    with pytest.raises(ConfigError, match="focal_gamma"):
        MaxPoolingLoss.Config(type="max_pooling", focal_gamma=-1.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_max_pooling_end_window_matches_reference(seed):
    """Positives with a known keyword end take their maximum only in [end-3, end+2];
    unknown ends (-1) and windows outside the utterance fall back to min_duration."""
    logits, lengths, labels = random_batch(seed, short=4)
    g = torch.Generator().manual_seed(100 + seed)
    ends = torch.stack([torch.randint(0, int(n), (1,), generator=g)[0] for n in lengths])
    ends[labels < 0] = -1
    ends[3] = -1                                          # a positive without alignment
    ends[0] = int(lengths[0]) + 10                        # window entirely past the end
    window = [-3, 2]
    loss_fn = build_loss(MaxPoolingLoss.Config(type="max_pooling", min_duration=4,
                                               end_window=window))
    x = logits.clone().requires_grad_(True)
    loss, metrics = loss_fn(x, lengths, labels, keyword_end=ends)
    ref_loss, ref_acc = max_pooling_reference(logits.double(), lengths, labels, 4,
                                              keyword_end=ends, end_window=window)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    assert metrics["acc"].item() == pytest.approx(ref_acc)
    # anchoring changes the loss: a peak before the window no longer counts for a positive
    early = torch.full((1, 20, 1), -10.0)
    early[0, 5, 0] = 10.0                                 # fires at frame 5 only
    one = dict(lengths=torch.tensor([20]), labels=torch.tensor([0]))
    anchored, _ = loss_fn(early, **one, keyword_end=torch.tensor([12]))   # window 9..14
    unanchored, _ = loss_fn(early, **one)                                 # frames 4..19
    assert unanchored.item() < 1e-3 and anchored.item() > 9.0
    with pytest.raises(Exception, match="end_window"):
        MaxPoolingLoss.Config(type="max_pooling", end_window=[5, 1])
