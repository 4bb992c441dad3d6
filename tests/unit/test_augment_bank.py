"""Rooms by the image method, the noise bank, noisy crops of a test set, and a speaker
encoder's cohort shipped and checked with its card."""
import json
import os

import numpy as np
import pytest
import soundfile as sf

from toolkit.data.rir import ROOM_SIZES, SPEED_OF_SOUND, Room, image_method_rir, random_room
from toolkit.errors import DataError

RATE = 16000


def _t20(rir):
    """RT60 from the Schroeder decay between -5 and -25 dB, times 3."""
    energy = np.cumsum((rir.astype(np.float64) ** 2)[::-1])[::-1]
    edc = 10 * np.log10(energy / energy[0] + 1e-30)
    return (np.argmax(edc < -25) - np.argmax(edc < -5)) / RATE * 3


@pytest.mark.parametrize("kind", sorted(ROOM_SIZES))
def test_a_room_rings_for_its_reverberation_time_and_the_direct_path_comes_first(kind):
    rng = np.random.default_rng(3)
    for _ in range(3):
        room = random_room(rng, kind)
        rir = image_method_rir(room, RATE, length_s=1.5 * room.rt60 + 0.05)
        # Sabine's walls give the asked decay within 25 % (the image method's is a bit longer).
        assert 0.8 * room.rt60 < _t20(rir) < 1.3 * room.rt60, (room, _t20(rir))
        # Nothing loud before the direct path, which arrives at distance / c.
        first = np.flatnonzero(np.abs(rir) > 0.3)[0]
        assert abs(first - room.distance() / SPEED_OF_SOUND * RATE) <= 2
        assert np.max(np.abs(rir)) == pytest.approx(1.0)
        assert abs(float(np.mean(rir))) < 0.01          # the high-pass took the DC out


def test_a_dead_room_decays_faster_than_a_live_one():
    size, src, mic = (5.0, 4.0, 3.0), (1.0, 1.0, 1.5), (4.0, 3.0, 1.2)
    dead = image_method_rir(Room(size, 0.2, src, mic), RATE, 0.6)
    live = image_method_rir(Room(size, 0.8, src, mic), RATE, 0.6)
    assert _t20(dead) < 0.5 * _t20(live)


def test_the_banks_are_seeded_reused_and_never_touch_other_files(tmp_path):
    from toolkit.bin import synth_augment_data
    speech = tmp_path / "speech"
    speech.mkdir()
    rng = np.random.default_rng(0)
    lines = []
    for i in range(4):
        wav = speech / f"s{i}.wav"
        sf.write(wav, 0.1 * np.sin(np.arange(RATE) * (0.05 + 0.01 * i)) * rng.random(RATE), RATE)
        lines.append(json.dumps({"key": f"s{i}", "wav": str(wav), "duration": 1.0}))
    (speech / "data.list").write_text("\n".join(lines) + "\n")
    out = tmp_path / "aug"
    argv = ["--out-dir", str(out), "--num-rirs", "6", "--num-noise", "6", "--noise-seconds", "2",
            "--babble-list", str(speech / "data.list")]
    assert synth_augment_data.main(argv) == 0
    rirs = [json.loads(x) for x in open(out / "rirs.list")]
    noise = [json.loads(x) for x in open(out / "noise.list")]
    assert len(rirs) == 6 and {r["key"].split("_")[1] for r in rirs} == set(ROOM_SIZES)
    assert sorted({n["kind"] for n in noise}) == ["babble", "noise"]
    stamp = os.path.getmtime(out / "rirs.list")
    first = sf.read(rirs[0]["wav"])[0]
    assert synth_augment_data.main(argv) == 0                   # reused, not rewritten
    assert os.path.getmtime(out / "rirs.list") == stamp
    # Other arguments: made again, the same seed gives the same first room.
    assert synth_augment_data.main(argv[:3] + ["7"] + argv[4:]) == 0
    assert len(open(out / "rirs.list").readlines()) == 7
    np.testing.assert_array_equal(sf.read(rirs[0]["wav"])[0], first)
    # A folder holding files of those names that no run of it wrote: refused, kept.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "rirs.list").write_text("mine\n")
    assert synth_augment_data.main(["--out-dir", str(foreign), "--num-rirs", "2",
                                    "--num-noise", "0"]) == 2
    assert (foreign / "rirs.list").read_text() == "mine\n"


def test_noisy_crops_keep_ids_speakers_and_trials_at_the_asked_length_and_snr(tmp_path):
    from toolkit.bin import make_noisy_crops
    from toolkit.voicebank.signal import active_power
    src = tmp_path / "test"
    (src / "wavs").mkdir(parents=True)
    scp, spk = [], []
    t = np.arange(4 * RATE) / RATE
    for i in range(3):
        wave = np.zeros(5 * RATE, np.float32)
        wave[RATE // 2:RATE // 2 + len(t)] = 0.3 * np.sin(2 * np.pi * (150 + 50 * i) * t)
        sf.write(src / "wavs" / f"u{i}.wav", wave, RATE)
        scp.append(f"u{i} {src / 'wavs' / f'u{i}.wav'}")
        spk.append(f"u{i} s{i % 2}")
    (src / "wav.scp").write_text("\n".join(scp) + "\n")
    (src / "utt2spk").write_text("\n".join(spk) + "\n")
    (src / "trials").write_text("u0 u2 target\nu0 u1 nontarget\n")
    out = tmp_path / "short"
    assert make_noisy_crops.main([str(src), str(out), "--seconds", "1.5",
                                  "--snr-db", "10,10", "--noise", "white"]) == 0
    assert (out / "trials").read_text() == (src / "trials").read_text()
    assert (out / "utt2spk").read_text() == (src / "utt2spk").read_text()
    for line in (out / "wav.scp").read_text().split("\n")[:-1]:
        key, path = line.split()
        crop = sf.read(path)[0]
        assert len(crop) == int(1.5 * RATE)
        # The tone is 0.3 in amplitude everywhere inside the speech: the crop is inside it
        # and the noise sits 10 dB below it.
        tone_power = 0.3 ** 2 / 2
        assert 10 * np.log10(active_power(crop) / tone_power) == pytest.approx(
            10 * np.log10(1 + 0.1), abs=0.3)
    assert make_noisy_crops.main([str(src), str(src)]) == 2       # its own source: refused
    with pytest.raises(SystemExit):
        make_noisy_crops.main([str(src), str(out), "--snr-db", "15,5"])


def test_a_cohort_ships_with_its_model_and_is_checked_against_the_card(tmp_path):
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
    from safetensors.numpy import save_file
    from toolkit import pretrained
    from toolkit.pretrained.package import package
    from toolkit.tasks.speaker.embed import write_cohort  # noqa: F401  (the writer exists)
    from test_pretrained import _tiny_export
    export, _ = _tiny_export(tmp_path / "export")
    save_file({"embeddings": np.eye(8, dtype=np.float32)}, os.path.join(export, pretrained.COHORT))
    template = tmp_path / "card.md"
    template.write_text("# {{name}}\n\nsha256 (model.safetensors): `{{sha256}}`\n")
    root = str(tmp_path / "shipped")
    out = package(export, "tiny-v1", str(template), {}, root=root)
    digests = pretrained.card_digests("tiny-v1", root)
    assert digests[pretrained.COHORT] == pretrained.file_sha256(os.path.join(out, pretrained.COHORT))
    weights = pretrained.weights("tiny-v1", root=root)
    # Beside a shipped model the cohort counts only as its card states it.
    monkey_root = pretrained.ROOT
    try:
        pretrained.ROOT = root
        assert pretrained.companion(weights, pretrained.COHORT) == os.path.join(out, pretrained.COHORT)
        save_file({"embeddings": np.ones((8, 8), np.float32)}, os.path.join(out, pretrained.COHORT))
        with pytest.raises(DataError, match="cohort.safetensors: sha256 .* differs from its model card"):
            pretrained.companion(weights, pretrained.COHORT)
    finally:
        pretrained.ROOT = monkey_root
    # A model without one: None, and its two digests are all the card needs.
    os.remove(os.path.join(export, pretrained.COHORT))
    out2 = package(export, "tiny-v2", str(template), {}, root=root)
    assert pretrained.COHORT not in pretrained.card_digests("tiny-v2", root)
    assert not os.path.exists(os.path.join(out2, pretrained.COHORT))
