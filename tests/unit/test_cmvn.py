"""Global CMVN: parallel statistics vs numpy, JSON / Kaldi round trips, bad files."""
import json

import kaldiio
import numpy as np
import pytest
import soundfile as sf

from toolkit.data.cmvn import compute_global_cmvn, read_cmvn, write_cmvn
from toolkit.config import DatasetConfig
from toolkit.data.augment import load_mono
from toolkit.data.features import compute_fbank, options_from_config

RATE = 16000


@pytest.fixture(scope="module")
def data_list(tmp_path_factory):
    """Five real WAVs of different lengths and levels, plus one missing file."""
    root = tmp_path_factory.mktemp("cmvn")
    rng = np.random.default_rng(0)
    lines, paths = [], []
    for i, seconds in enumerate([0.3, 0.55, 0.8, 0.42, 1.0]):
        n = int(seconds * RATE)
        t = np.arange(n) / RATE
        x = 0.1 * (i + 1) * np.sin(2 * np.pi * (200 + 150 * i) * t) + 0.02 * rng.standard_normal(n)
        path = str(root / f"u{i}.wav")
        sf.write(path, x.astype(np.float32), RATE, subtype="PCM_16")
        paths.append(path)
        lines.append({"key": f"u{i}", "wav": path, "duration": seconds})
    lines.insert(2, {"key": "gone", "wav": str(root / "gone.wav"), "duration": 0.5})
    list_path = root / "data.list"
    list_path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    return str(list_path), paths


def reference_stats(paths, cfg):
    opts = options_from_config(cfg.feature, cfg.sample_rate)
    feats = np.concatenate([compute_fbank(load_mono(p, cfg.sample_rate), opts) for p in paths])
    return feats.astype(np.float64)


def test_global_cmvn_matches_numpy(data_list):
    list_path, paths = data_list
    cfg = DatasetConfig()
    feats = reference_stats(paths, cfg)
    cmvn = compute_global_cmvn(list_path, cfg, num_workers=1)
    assert cmvn["frames"] == len(feats)             # the missing file is skipped
    assert len(cmvn["mean"]) == cfg.feature.num_mel_bins
    np.testing.assert_allclose(cmvn["mean"], feats.mean(axis=0), rtol=1e-4)
    std = feats.std(axis=0)
    assert std.min() > 0.1                           # the variance floor is not in play
    np.testing.assert_allclose(1.0 / np.asarray(cmvn["inv_std"]), std, rtol=1e-4)


def test_global_cmvn_parallel_equals_serial(data_list):
    list_path, _ = data_list
    cfg = DatasetConfig()
    one = compute_global_cmvn(list_path, cfg, num_workers=1)
    two = compute_global_cmvn(list_path, cfg, num_workers=2)
    assert one["frames"] == two["frames"]
    np.testing.assert_allclose(two["mean"], one["mean"], rtol=1e-10)
    np.testing.assert_allclose(two["inv_std"], one["inv_std"], rtol=1e-10)


def test_global_cmvn_other_bin_count(data_list):
    list_path, paths = data_list
    cfg = DatasetConfig()
    cfg.feature.num_mel_bins = 23
    cmvn = compute_global_cmvn(list_path, cfg, num_workers=1)
    np.testing.assert_allclose(cmvn["mean"], reference_stats(paths, cfg).mean(axis=0), rtol=1e-4)


def test_no_usable_frames_is_an_error(tmp_path):
    path = tmp_path / "bad.list"
    path.write_text(json.dumps({"key": "x", "wav": str(tmp_path / "none.wav"),
                                "duration": 1.0}) + "\n")
    with pytest.raises(ValueError, match="no usable frames"):
        compute_global_cmvn(str(path), DatasetConfig(), num_workers=1)


def test_write_read_json_and_kaldi(tmp_path, data_list):
    cmvn = compute_global_cmvn(data_list[0], DatasetConfig(), num_workers=1)
    json_path, ark_path = str(tmp_path / "cmvn.json"), str(tmp_path / "cmvn.ark")
    write_cmvn(cmvn, json_path, ark_path)
    from_json = read_cmvn(json_path)
    from_ark = read_cmvn(ark_path)
    for got in (from_json, from_ark):
        np.testing.assert_allclose(got["mean"], cmvn["mean"], rtol=1e-12)
        np.testing.assert_allclose(got["inv_std"], cmvn["inv_std"], rtol=1e-12)
    # The Kaldi file really is Kaldi stats: sums and count, sums of squares.
    stats = kaldiio.load_mat(ark_path)
    assert stats.shape == (2, len(cmvn["mean"]) + 1)
    assert stats[0, -1] == cmvn["frames"]
    np.testing.assert_allclose(stats[0, :-1] / stats[0, -1], cmvn["mean"], rtol=1e-12)


@pytest.mark.parametrize("text", [False, True])
def test_kaldi_archive_with_key(tmp_path, text):
    # What compute-cmvn-stats writes: an archive `global <matrix>`.
    rng = np.random.default_rng(1)
    frames, dim = 500, 13
    feats = rng.standard_normal((frames, dim)) * 2 + 5
    stats = np.zeros((2, dim + 1))
    stats[0, :dim] = feats.sum(axis=0)
    stats[0, dim] = frames
    stats[1, :dim] = (feats ** 2).sum(axis=0)
    path = str(tmp_path / "cmvn.ark")
    kaldiio.save_ark(path, {"global": stats}, text=text)
    got = read_cmvn(path)
    np.testing.assert_allclose(got["mean"], feats.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(got["inv_std"], 1.0 / feats.std(axis=0), rtol=1e-6)


def test_wrong_shape_kaldi_matrix(tmp_path):
    path = str(tmp_path / "m.ark")
    kaldiio.save_mat(path, np.ones((3, 41)))
    with pytest.raises(ValueError, match="not Kaldi CMVN stats"):
        read_cmvn(path)


def test_json_without_fields(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"mean": [0.0]}))
    with pytest.raises(ValueError, match="inv_std"):
        read_cmvn(str(path))


@pytest.mark.parametrize("content", [b"hello world\n", b"", b"\x00\x01garbage" * 10],
                         ids=["text", "empty", "binary"])
def test_bogus_file_gives_value_error(tmp_path, content):
    path = tmp_path / "cmvn.ark"
    path.write_bytes(content)
    with pytest.raises(ValueError):
        read_cmvn(str(path))
