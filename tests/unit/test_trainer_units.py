"""Trainer pieces in isolation: schedules, loss schedule, clipping, checkpoint files,
retention, full disk, worker division."""
import errno
import math
import os
import subprocess

import pytest
import torch

from toolkit.config import ConfigError, OptimConfig, SchedulerConfig, build_dataclass
from toolkit.trainer.trainer import workers_per_rank
from toolkit.tasks.kws.losses import LOSSES, build_loss
from toolkit.trainer import checkpoint as ckpt
from toolkit.trainer.clip import clip_and_step
from toolkit.trainer.optim import build_optimizer, build_schedule


def lrs(kind, steps=10, **kw):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([param], OptimConfig(lr=1.0))
    sched = build_schedule(opt, SchedulerConfig(type=kind, **kw), total_steps=steps)
    out = [sched.lr()]
    for _ in range(steps):
        sched.step()
        out.append(sched.lr())
    return out, sched


def test_warmup_zero_starts_at_peak():
    for kind in ("warmup_cosine", "warmup_linear", "constant", "reduce_on_plateau"):
        values, _ = lrs(kind, warmup_steps=0, final_lr_ratio=0.1)
        assert values[0] == pytest.approx(1.0), kind


def test_warmup_then_decay_to_final_ratio():
    values, _ = lrs("warmup_cosine", steps=10, warmup_steps=4, final_lr_ratio=0.1)
    assert values[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert values[10] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(values[4:], values[5:]))
    linear, _ = lrs("warmup_linear", steps=10, warmup_steps=0, final_lr_ratio=0.0)
    assert linear[5] == pytest.approx(0.5) and linear[10] == pytest.approx(0.0)


def test_plateau_reduces_after_patience_and_state_round_trips():
    _, sched = lrs("reduce_on_plateau", steps=1, patience=1, factor=0.5)
    for loss in (1.0, 1.1, 1.2):
        sched.on_validation(loss)
    assert sched.lr() == pytest.approx(0.5)
    state = sched.state_dict()
    _, other = lrs("reduce_on_plateau", steps=0, patience=1, factor=0.5)
    other.load_state_dict(state)
    assert other.lr() == pytest.approx(0.5) and other.state_dict() == state


def test_loss_schedule_switches_components_on():
    cfg = build_dataclass(LOSSES.get("weighted_sum").Config, {"type": "weighted_sum", "components": [
        {"type": "cross_entropy", "weight": 1.0},
        {"type": "max_pooling", "weight": 2.0, "start_fraction": 0.5, "min_duration": 0}]}, "loss")
    loss_fn = build_loss(cfg)
    logits = torch.randn(3, 7, 2)
    lengths = torch.tensor([7, 5, 3])
    labels = torch.tensor([0, 1, 0])
    ce, _ = LOSSES.get("cross_entropy")(cfg.parsed[0][0])(logits, lengths, labels)
    mp, _ = LOSSES.get("max_pooling")(cfg.parsed[1][0])(logits, lengths, labels)
    early, _ = loss_fn(logits, lengths, labels, step=20, total_steps=100)
    late, metrics = loss_fn(logits, lengths, labels, step=60, total_steps=100)
    assert early.item() == pytest.approx(ce.item())
    assert late.item() == pytest.approx(ce.item() + 2.0 * mp.item())
    assert "loss_1_max_pooling" in metrics
    assert loss_fn.switches_parts()


def test_loss_weight_ramps_over_progress():
    cfg = build_dataclass(LOSSES.get("weighted_sum").Config, {"type": "weighted_sum", "components": [
        {"type": "cross_entropy", "weight": 1.0},
        {"type": "max_pooling", "weight": {"initial": 0.0, "final": 1.0, "start": 0.2, "end": 0.6},
         "min_duration": 0}]}, "loss")
    loss_fn = build_loss(cfg)
    logits = torch.randn(3, 7, 2)
    lengths = torch.tensor([7, 5, 3])
    labels = torch.tensor([0, 1, 0])
    ce, _ = LOSSES.get("cross_entropy")(cfg.parsed[0][0])(logits, lengths, labels)
    mp, _ = LOSSES.get("max_pooling")(cfg.parsed[1][0])(logits, lengths, labels)
    for step, weight in ((10, 0.0), (40, 0.5), (80, 1.0)):
        total, _ = loss_fn(logits, lengths, labels, step=step, total_steps=100)
        assert total.item() == pytest.approx(ce.item() + weight * mp.item(), rel=1e-5)


def test_loss_schedule_rejects_bad_components():
    with pytest.raises(ConfigError, match="components\\[0\\].type"):
        build_dataclass(LOSSES.get("weighted_sum").Config,
                        {"type": "weighted_sum", "components": [{"type": "nope"}]}, "loss")
    with pytest.raises(ConfigError, match="unknown key"):
        build_dataclass(LOSSES.get("weighted_sum").Config, {"type": "weighted_sum", "components": [
            {"type": "max_pooling", "bogus": 1}]}, "loss")


def test_clip_skips_non_finite_and_clips_finite():
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([param], lr=1.0)
    param.grad = torch.tensor([float("nan"), 1.0, 1.0])
    norm, applied = clip_and_step([param], opt, 1.0)
    assert not applied and math.isnan(norm) and torch.equal(param.data, torch.ones(3))
    param.grad = torch.tensor([3.0, 4.0, 0.0])
    norm, applied = clip_and_step([param], opt, 1.0)
    assert applied and norm == pytest.approx(5.0)
    assert param.data.tolist() == pytest.approx([1 - 0.6, 1 - 0.8, 1.0])


def test_workers_divided_across_local_ranks():
    assert workers_per_rank(8, 4) == 2
    assert workers_per_rank(2, 4) == 1       # never zero when workers were asked for
    assert workers_per_rank(0, 2) == 0


def _save(exp, step, dev_metric=None):
    return ckpt.save_checkpoint(str(exp), step, {"model": {"w": torch.full((2,), float(step))}},
                                {"epoch": 0, "dev_metric": dev_metric})


def test_retention_keeps_last_k_and_best_n(tmp_path):
    losses = {1: 0.9, 2: 0.1, 3: 0.8, 4: 0.2, 5: 0.7, 6: None, 7: 0.95}
    for step, loss in losses.items():
        _save(tmp_path, step, loss)
    # left by a killed checkpoint write, and another tool's write in progress
    (tmp_path / ".tmp-abc1_x-ckpt-000000008.pt").write_bytes(b"partial")
    (tmp_path / ".tmp-k2j3-avg_5.pt").write_bytes(b"partial")
    ckpt.prune(str(tmp_path), keep_last=2, keep_best=2)
    kept = [c.step for c in ckpt.list_checkpoints(str(tmp_path))]
    assert kept == [2, 4, 6, 7]
    assert not (tmp_path / ".tmp-abc1_x-ckpt-000000008.pt").exists()
    assert (tmp_path / ".tmp-k2j3-avg_5.pt").exists()


def test_checkpoint_is_weights_only_and_verified(tmp_path):
    path = _save(tmp_path, 3)
    payload = torch.load(path, weights_only=True)
    assert payload["model"]["w"].tolist() == [3.0, 3.0]
    info = ckpt.list_checkpoints(str(tmp_path))[0]
    assert ckpt.verify(info) is None
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF                         # flip one byte: same size, bad hash
    open(path, "wb").write(bytes(data))
    assert "sha256" in ckpt.verify(info)
    assert ckpt.latest_valid(str(tmp_path)) is None
    # A .pt without its .json (killed between the two writes) does not count.
    _save(tmp_path, 4)
    os.unlink(tmp_path / "ckpt-000000004.json")
    assert [c.step for c in ckpt.list_checkpoints(str(tmp_path))] == [3]


def test_rng_state_round_trip():
    state = ckpt.rng_state()
    a = (torch.rand(3), __import__("random").random(), __import__("numpy").random.rand())
    ckpt.set_rng_state(state)
    b = (torch.rand(3), __import__("random").random(), __import__("numpy").random.rand())
    assert torch.equal(a[0], b[0]) and a[1] == b[1] and a[2] == b[2]


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 256 KiB file system (tmpfs) that fills up. Mounting it needs root, as CI and
    tools/test.sh run; without it the test fails saying so and never skips (a skip would
    hide that the full-disk path never ran)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail("mounting a 256 KiB tmpfs for the full-disk test failed (it needs root, "
                    f"as CI runs): {done.stderr.strip()[-200:]}", pytrace=False)
    try:
        stat = os.statvfs(mount)
        assert stat.f_blocks * stat.f_frsize <= 256 * 1024, "not the small tmpfs"
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def test_full_disk_during_save_keeps_previous_checkpoint(tiny_disk):
    exp = tiny_disk / "exp"
    exp.mkdir()
    small = ckpt.save_checkpoint(str(exp), 1, {"model": {"w": torch.zeros(1000)}}, {"epoch": 0})
    with pytest.raises(OSError) as err:
        ckpt.save_checkpoint(str(exp), 2, {"model": {"w": torch.zeros(200_000)}}, {"epoch": 0})
    assert err.value.errno == errno.ENOSPC and "previous file is intact" in str(err.value)
    infos = ckpt.list_checkpoints(str(exp))
    assert [c.step for c in infos] == [1] and ckpt.verify(infos[0]) is None
    assert not [n for n in os.listdir(exp) if n.startswith(".tmp-")]   # no debris left
    assert os.path.exists(small)


def test_a_begun_fraction_ramp_keeps_the_total_it_began_under():
    """A loss switched on at 60 % of 100 steps, resumed at step 70 with max_steps 200:
    it stays on (evaluated against the total it began under); a ramp that had not begun
    by the resume (at 80 %) follows the new total; steps-unit ramps never move."""
    from types import SimpleNamespace
    from toolkit.config.ramps import Ramp
    from toolkit.trainer.trainer import Trainer
    resumed = SimpleNamespace(ramp_totals=[(0, 100), (70, 200)], total_steps=200)
    begun = Ramp(initial=0.0, final=1.0, start=0.6, end=0.6, shape="step")
    later = Ramp(initial=0.0, final=1.0, start=0.8, end=0.8, shape="step")
    in_steps = Ramp(initial=0.0, final=1.0, start=90, end=90, shape="step", unit="steps")

    def value(ramp, step):
        return ramp.value(step, Trainer.ramp_total(resumed, ramp, step))

    assert [value(begun, s) for s in (59, 60, 70, 100, 150)] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert [value(later, s) for s in (80, 120, 159, 160)] == [0.0, 0.0, 0.0, 1.0]
    assert [value(in_steps, s) for s in (89, 90)] == [0.0, 1.0]
    # One run, one total: every ramp against it.
    plain = SimpleNamespace(ramp_totals=[(0, 100)], total_steps=100)
    assert Trainer.ramp_total(plain, later, 10) == 100


def test_checkpoint_metadata_of_older_exp_dirs_still_reads(tmp_path):
    """Exp dirs written before the rename hold the value as dev_loss and the metric's name
    in dev_metric: averaging and pruning must still rank them."""
    from toolkit.trainer.checkpoint import dev_metric_of
    assert dev_metric_of({"dev_loss": 0.25, "dev_metric": "eer"}) == 0.25
    assert dev_metric_of({"dev_metric": 0.5, "dev_metric_name": "eer"}) == 0.5
    assert dev_metric_of({"step": 3}) is None
