"""DS-TCN with `members` > 1: a deep ensemble in one model. Each member is independent of
the others, the loss trains each as if alone, and the deployed score (the members'
windowed posteriors averaged) streams and exports exactly."""
import os

import numpy as np
import pytest
import torch

from test_ds_tcn_streaming import check_chunked_exports
from test_losses import max_pooling_reference, random_batch
from toolkit.tasks.kws.losses import MaxPoolingLoss
from toolkit.tasks.kws.models import build_model
from toolkit.tasks.kws.models.base import MemberCombiner
from toolkit.tasks.kws.models.ds_tcn import DSTCN
from in_process import run_main
from train_utils import ROOT, Corpus, run_train



def make_model(seed=0, members=3, **kw):
    torch.manual_seed(seed)
    cfg = DSTCN.Config(type="ds_tcn", input_dim=40, num_outputs=2, hidden_dim=12,
                       frontend_channels=4, members=members, **kw)
    model = build_model(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():   # non-trivial normalisation statistics in eval mode
        if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.3)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model.eval()


def feats(batch=2, frames=40, seed=3):
    return torch.randn(batch, frames, 40, generator=torch.Generator().manual_seed(seed)) * 3


def combined_reference(member_logits, window):
    """Per frame and keyword: mean over members of the max posterior over the member's
    last `window` frames (float64 loops)."""
    p = torch.sigmoid(member_logits.double())          # (B, T, M, K)
    b, t, m, k = p.shape
    out = torch.zeros(b, t, k, dtype=torch.float64)
    for i in range(t):
        out[:, i] = p[:, max(0, i - window + 1):i + 1].amax(dim=1).mean(dim=1)
    return out


def member_logits(model, x):
    """The members' logits, which forward returns in training mode, with every layer
    (dropout, BatchNorm) still in eval mode: only the top module's flag is set."""
    model.training = True
    try:
        with torch.no_grad():
            return model(x)[0]
    finally:
        model.training = False


def test_members_are_independent_and_combined_as_documented():
    model = make_model(member_window=5)
    x = feats()
    members = member_logits(model, x)
    with torch.no_grad():
        combined, _ = model(x)
    assert members.shape == (2, 40, 3, 2) and combined.shape == (2, 40, 2)
    ref = combined_reference(members, 5)
    assert (torch.sigmoid(combined.double()) - ref).abs().max().item() <= 1e-6
    # Members differ (own initialisation) ...
    assert (members[:, :, 0] - members[:, :, 1]).abs().max().item() > 1e-3
    # ... and share nothing: changing every parameter of member 1 leaves 0 and 2 alone.
    # Every parameter's first axis is the members' output channels, member by member.
    with torch.no_grad():
        for p in model.parameters():
            size = p.size(0) // 3
            p[size:2 * size] += 0.5
    changed = member_logits(model, x)
    assert torch.equal(changed[:, :, 0], members[:, :, 0])
    assert torch.equal(changed[:, :, 2], members[:, :, 2])
    assert (changed[:, :, 1] - members[:, :, 1]).abs().max().item() > 1e-3


def test_combiner_keeps_precision_near_one():
    # Two members at 1 - 1e-6 and 1 - 3e-6: the mean is 1 - 2e-6, a logit of 13.12;
    # a probability stored in float32 would round both to 0.999999 and lose the order.
    comb = MemberCombiner(2, 1, 1)
    z = torch.tensor([np.log((1 - 1e-6) / 1e-6), np.log((1 - 3e-6) / 3e-6)],
                     dtype=torch.float32).reshape(1, 1, 2, 1)
    out, _ = comb(z, torch.zeros(1, 2, 0))
    assert abs(out.item() - np.log((1 - 2e-6) / 2e-6)) < 1e-3
    # A fresh (zero) window means "nothing detected", not p = 0.5.
    comb = MemberCombiner(2, 1, 4)
    low = torch.full((1, 1, 2, 1), -8.0)
    out, cache = comb(low, torch.zeros(1, 2, 3))
    assert abs(out.item() + 8.0) < 1e-4 and cache.shape == (1, 2, 3)
    with pytest.raises(ValueError, match="window"):
        MemberCombiner(2, 1, 0)


@pytest.mark.parametrize("window", [1, 10])
def test_members_stream_and_export(window, tmp_path):
    model = make_model(seed=4, member_window=window)
    single = make_model(seed=4, members=1)
    # The window's past frames join the cache; the receptive field grows by them.
    assert model.cache_size == 3 * (single.cache_size - 40 * 2) + 40 * 2 + 3 * 2 * (window - 1)
    assert model.receptive_field() == single.receptive_field() + window - 1
    T = 30
    x = feats(2, T, seed=5)
    with torch.no_grad():
        whole, final = model(x)
        for chunk in range(1, T + 1):
            cache, outs = model.zero_cache(2), []
            for s in range(0, T, chunk):
                o, cache = model(x[:, s:s + chunk], cache)
                outs.append(o)
            assert (torch.cat(outs, 1) - whole).abs().max().item() <= 1e-5, chunk
            assert (cache - final).abs().max().item() <= 1e-5, chunk
    check_chunked_exports(model, x, 9, str(tmp_path / "model.onnx"))


def test_bad_member_settings_rejected():
    with pytest.raises(ValueError, match="members must be >= 1"):
        make_model(members=0)
    with pytest.raises(ValueError, match="CTC"):
        make_model(members=2, ctc_outputs=5)
    with pytest.raises(ValueError, match="model.member_window"):
        make_model(members=2, member_window=0)


@pytest.mark.parametrize("seed", [0, 1])
def test_loss_trains_each_member_as_if_alone(seed):
    """4-D logits (B, T, M, K): the loss is the mean of each member's own loss."""
    loss_fn = MaxPoolingLoss(MaxPoolingLoss.Config(type="max_pooling", min_duration=4,
                                                   end_window=[-2, 3]))
    per_member = []
    for m in range(3):
        logits, lengths, labels = random_batch(seed * 10 + m)
        per_member.append(logits)
    stacked = torch.stack(per_member, dim=2)          # (B, T, M, K)
    end = torch.randint(-1, 20, (stacked.size(0),), generator=torch.Generator().manual_seed(seed))
    loss, stats = loss_fn(stacked, lengths, labels, keyword_end=end)
    refs = [max_pooling_reference(lg.double(), lengths, labels, 4, keyword_end=end,
                                  end_window=[-2, 3]) for lg in per_member]
    assert abs(loss.item() - np.mean([r[0].item() for r in refs])) < 1e-5
    assert abs(stats["acc"].item() - np.mean([r[1] for r in refs])) < 1e-6


def test_trainer_averaging_and_export_with_members(tmp_path):
    """The real binaries: train a 2-member model, average it, export it (parity-checked)."""
    corpus = Corpus(str(tmp_path), num_train=24, num_dev=6)
    exp = str(tmp_path / "exp")
    args = corpus.train_args(exp, "model.members=2", "model.member_window=4",
                             "training.max_epoch=2", "dataset.num_workers=0")
    # Training in its own process, forked from the pre-imported zygote (no import time);
    # averaging and export are their binaries' real main(argv), in this process.
    res = run_train(args, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    from toolkit.bin import average_model, export_model
    res = run_main(average_model.main, ["--exp-dir", exp, "--output", f"{exp}/avg.pt", "--num",
                                        "2", "--mode", "last"])
    assert res.returncode == 0, res.stderr[-3000:]
    res = run_main(export_model.main, ["--checkpoint", f"{exp}/avg.pt", "--exp-dir", exp,
                                       "--out-dir", f"{exp}/export", "--test-data", corpus.dev])
    assert res.returncode == 0, res.stderr[-3000:]
    assert os.path.exists(f"{exp}/export/model.onnx") and os.path.exists(f"{exp}/export/model.zip")
