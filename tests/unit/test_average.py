"""Checkpoint averaging (toolkit.average, toolkit.bin.average_model) on real checkpoints
of a DS-TCN with BatchNorm written by the trainer's save_checkpoint after a few
training steps, so weights, running statistics and num_batches_tracked all differ."""
import dataclasses
import os
import shutil
import subprocess
import sys

import pytest
import torch

from toolkit.trainer.average import average_checkpoints, average_states, select_checkpoints
from toolkit.tasks.kws.export import model_from_checkpoint
from toolkit.tasks.kws.models import MODELS, build_model
from toolkit.trainer.checkpoint import list_checkpoints, load_payload, save_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# step -> dev loss; the best two (5, 9) are neither the first nor the last two.
DEV_LOSS = {3: 0.50, 5: 0.20, 7: 0.90, 9: 0.30}


def ds_tcn_config(hidden_dim=8):
    return MODELS.get("ds_tcn").Config(type="ds_tcn", input_dim=10, num_outputs=2,
                                       hidden_dim=hidden_dim, num_layers=2, kernel_size=3,
                                       dilations=[1, 2], dropout=0.0)


def train_and_save(exp_dir, config, save_steps, dev_metric=None, seed=0):
    """One training run; a checkpoint after each step in save_steps. Returns
    step -> state dict (deep copies, as saved)."""
    torch.manual_seed(seed)
    model = build_model(config).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(seed + 1)
    states = {}
    for step in range(1, max(save_steps) + 1):
        feats = torch.randn(4, 12, config.input_dim, generator=g) * 2 + 1
        target = torch.randn(4, 12, config.num_outputs, generator=g)
        logits, _ = model(feats)
        loss = torch.nn.functional.mse_loss(logits, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step in save_steps:
            meta = {"epoch": step // 4}
            if dev_metric is not None:
                meta["dev_metric"] = dev_metric[step]
            save_checkpoint(str(exp_dir), step,
                            {"format": 2, "task": "kws", "modules": {"model": model.state_dict()},
                             "config": {"task": {"type": "kws"},
                                        "model": dataclasses.asdict(config)}},
                            meta)
            states[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return states


def expected_mean(states, key):
    return torch.stack([s[key].to(torch.float64) for s in states]).mean(dim=0)


def assert_average_of(averaged, states):
    """Float tensors: the float64 mean (rounded once to float32); counters: the max."""
    for key, ref in states[0].items():
        got = averaged[key]
        assert got.dtype == ref.dtype and got.shape == ref.shape, key
        if ref.is_floating_point():
            mean = expected_mean(states, key)
            assert torch.allclose(got.to(torch.float64), mean, rtol=1e-7, atol=1e-7), key
            assert torch.equal(got, mean.to(ref.dtype)), key
        else:
            assert torch.equal(got, torch.stack([s[key] for s in states]).max(dim=0).values), key


@pytest.fixture()
def exp(tmp_path):
    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    states = train_and_save(exp_dir, ds_tcn_config(), sorted(DEV_LOSS), DEV_LOSS)
    return exp_dir, states


def test_average_states_mean_and_counters(exp):
    _, states = exp
    chosen = [states[3], states[5], states[7]]
    counters = [k for k in chosen[0] if k.endswith("num_batches_tracked")]
    assert counters, "DS-TCN should have BatchNorm counters"
    assert [int(s[counters[0]]) for s in chosen] == [3, 5, 7]
    # The runs really differ, so a wrong average cannot pass by accident.
    assert not torch.equal(chosen[0]["classifier.weight"], chosen[2]["classifier.weight"])
    averaged = average_states(chosen, ["a", "b", "c"])
    assert_average_of(averaged, chosen)
    for key in counters:
        # A counter, not a weight: the max (7), not a truncated mean (5), kept integer.
        assert averaged[key].dtype == torch.int64 and int(averaged[key]) == 7


def test_best_picks_lowest_dev_metrics(exp):
    exp_dir, states = exp
    chosen = select_checkpoints(str(exp_dir), 2, "best")
    assert [c.step for c in chosen] == [5, 9]
    result = average_checkpoints(str(exp_dir), 2, "best")
    assert [a["step"] for a in result["averaged_from"]] == [5, 9]
    assert [a["dev_metric"] for a in result["averaged_from"]] == [0.20, 0.30]
    assert_average_of(result["modules"]["model"], [states[5], states[9]])
    assert result["config"]["model"] == dataclasses.asdict(ds_tcn_config())


def test_last_uses_steps_not_file_times(exp):
    exp_dir, states = exp
    # Oldest step gets the newest mtime: file times must not decide "last".
    for info in list_checkpoints(str(exp_dir)):
        t = 1_700_000_000 + 1000 * (10 - info.step)
        for path in (info.path, info.path[:-3] + ".json"):
            os.utime(path, (t, t))
    assert [c.step for c in select_checkpoints(str(exp_dir), 3, "last")] == [9, 7, 5]
    result = average_checkpoints(str(exp_dir), 3, "last")
    assert [a["step"] for a in result["averaged_from"]] == [9, 7, 5]
    assert_average_of(result["modules"]["model"], [states[9], states[7], states[5]])


def test_corrupted_checkpoints_are_excluded(exp):
    exp_dir, states = exp
    infos = {c.step: c for c in list_checkpoints(str(exp_dir))}
    # Same size, flipped bytes (silent corruption) in the best; the newest truncated.
    with open(infos[5].path, "r+b") as f:
        f.seek(os.path.getsize(infos[5].path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with open(infos[9].path, "r+b") as f:
        f.truncate(100)
    assert [c.step for c in select_checkpoints(str(exp_dir), 2, "best")] == [3, 7]
    assert [c.step for c in select_checkpoints(str(exp_dir), 2, "last")] == [7, 3]
    result = average_checkpoints(str(exp_dir), 2, "best")
    assert [a["step"] for a in result["averaged_from"]] == [3, 7]
    assert_average_of(result["modules"]["model"], [states[3], states[7]])


def test_no_dev_metric_and_no_usable_checkpoint(tmp_path):
    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    train_and_save(exp_dir, ds_tcn_config(), [2, 4])       # no dev loss recorded
    with pytest.raises(FileNotFoundError, match="with a dev loss"):
        average_checkpoints(str(exp_dir), 2, "best")
    assert len(average_checkpoints(str(exp_dir), 5, "last")["averaged_from"]) == 2
    with pytest.raises(ValueError, match="unknown averaging mode"):
        average_checkpoints(str(exp_dir), 2, "newest")


def test_different_architectures_refused(tmp_path):
    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    small = train_and_save(exp_dir, ds_tcn_config(8), [3], {3: 0.4})
    other = tmp_path / "other"
    other.mkdir()
    wide = train_and_save(other, ds_tcn_config(12), [5], {5: 0.3})
    for name in os.listdir(other):
        shutil.copy(other / name, exp_dir / name)
    with pytest.raises(ValueError, match="different model configuration.*different architectures"):
        average_checkpoints(str(exp_dir), 2, "best")
    # Without the config check, the state comparison names the tensor and both shapes.
    with pytest.raises(ValueError) as err:
        average_states([small[3], wide[5]], ["small.pt", "wide.pt"])
    message = str(err.value)
    assert "wide.pt" in message and "small.pt" in message
    assert "(12, 10, 1)" in message and "(8, 10, 1)" in message
    assert "different architectures" in message
    # A missing layer is named too.
    deeper = build_model(dataclasses.replace(ds_tcn_config(8), num_layers=3,
                                             dilations=[1, 2, 4])).state_dict()
    with pytest.raises(ValueError, match=r"blocks\.2\."):
        average_states([small[3], deeper], ["small.pt", "deeper.pt"])


def test_cli_writes_loadable_checkpoint(exp, tmp_path):
    exp_dir, states = exp
    out = tmp_path / "out" / "avg.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.average_model", "--exp-dir",
                           str(exp_dir), "--output", str(out), "--num", "2", "--mode", "best"],
                          cwd=REPO, capture_output=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    payload = torch.load(str(out), map_location="cpu", weights_only=True)
    assert set(payload) >= {"modules", "config", "averaged_from"}
    assert [a["step"] for a in payload["averaged_from"]] == [5, 9]
    model_config = payload["config"]["model"]
    config = MODELS.get(model_config["type"]).Config(**model_config)
    model = build_model(config)
    model.load_state_dict(payload["modules"]["model"], strict=True)
    assert_average_of(model.state_dict(), [states[5], states[9]])
    # What export and scoring read it with.
    loaded = model_from_checkpoint(str(out))
    feats = torch.randn(1, 20, 10)
    with torch.no_grad():
        assert torch.equal(loaded(feats)[0], model.eval()(feats)[0])
    assert load_payload(str(out))["config"]["model"] == dataclasses.asdict(ds_tcn_config())
    assert not [n for n in os.listdir(out.parent) if n.startswith(".tmp-")]
