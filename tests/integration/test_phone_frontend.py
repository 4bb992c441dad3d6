"""The phone front end, end to end on real espeak-ng speech: the corpus writer's sentences,
espeak-ng phone targets in unlabelled data lists, phone_ctc training through the generic
trainer (its loss falls, its dev PER is logged), export with log-posterior parity, the
front end streaming like the whole utterance, its PER binary (a bound the tiny model and the
shipped one meet and their untrained networks do not), the `phone_frontend` feature type
(fingerprinted) and zero-shot keyword search through `toolkit.bin.kws` (the keyword found,
a confusable and other speech not)."""
import json
import os

import numpy as np
import pytest
import yaml

from train_utils import run_train
from toolkit.errors import DataError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = {
    "task": {"type": "phone_ctc"},
    "dataset": {"sample_rate": 16000, "feature": {"num_mel_bins": 40}, "batch_size": 8,
                "num_workers": 0, "spec_aug": {"enabled": False}},
    "model": {"type": "ds_tcn", "hidden_dim": 48, "num_layers": 2, "kernel_size": 3,
              "dilations": [1, 2], "dropout": 0.0},
    "optim": {"type": "adam", "lr": 0.01, "scheduler": {"type": "constant"}},
    "training": {"seed": 3, "max_epoch": 12, "log_interval": 3, "save_interval_steps": 10,
                 "keep_last": 2, "keep_best": 2},
}


def _run(*args, timeout=300):
    """A binary in a process of its own, forked from the pre-imported zygote: training and
    export, which set process-wide state (torch's threads, seeds, allocator)."""
    proc = run_train(["-m", *args], timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _main(module, *args, status=0):
    """A binary's real main(argv) in this process, for the data stages and the evaluation
    and detection binaries, whose output (exit status, stdout, files) is what is checked: a
    forked process per call cost more than the work. The root logger (setup_logging
    replaces its handlers) and torch's thread count (evaluate_frontend sets one) are put
    back afterwards, for the tests that follow in this process."""
    import importlib
    import logging
    import torch
    root, threads = logging.getLogger(), torch.get_num_threads()
    handlers, level = root.handlers[:], root.level
    try:
        got = importlib.import_module(module).main(list(args))
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)
        torch.set_num_threads(threads)
    assert (got or 0) == status, (module, got)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("phone_frontend")
    data = root / "data"
    _main("toolkit.bin.synth_codec_data", "--out-dir", str(data), "--num-train", "24",
          "--num-dev", "4", "--num-test", "4", "--max-voices", "10", "--sentences", "1,1",
          "--no-noisy", "--nj", "2")
    dirs = [str(data / s) for s in ("train", "dev", "test")]
    dict_dir = data / "dict"
    # espeak-ng phonemizes the lexicon: in a process of its own, never in this one (a
    # process that loaded espeak-ng renders differently afterwards; toolkit.voicebank.pool).
    _run("toolkit.bin.make_lexicon", "--unit", "phone", *dirs, "--lexicon",
         str(dict_dir / "lexicon.txt"), "--units", str(dict_dir / "units.txt"))
    pairs = [x for d in dirs for x in (d, d + "/data.list")]
    _main("toolkit.bin.make_datalist", *pairs, "--label-mode", "none", "--lexicon",
          str(dict_dir / "lexicon.txt"), "--units", str(dict_dir / "units.txt"))
    _main("toolkit.bin.compute_cmvn", dirs[0] + "/data.list", str(data / "cmvn.json"))
    config = root / "conf.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    exp = root / "exp"
    train = _run("toolkit.bin.train", "--config", str(config), "--exp-dir", str(exp),
                 "--train-data", dirs[0] + "/data.list", "--dev-data", dirs[1] + "/data.list",
                 "--inventory", str(dict_dir / "units.txt"), "--cmvn", str(data / "cmvn.json"))
    _main("toolkit.bin.average_model", "--exp-dir", str(exp), "--output", str(exp / "avg.pt"),
          "--num", "2", "--mode", "best")
    _run("toolkit.bin.export_model", "--checkpoint", str(exp / "avg.pt"), "--exp-dir", str(exp),
         "--out-dir", str(exp / "export"), "--test-data", dirs[2] + "/data.list")
    return {"root": root, "data": data, "dirs": dirs, "exp": exp, "log": train.stderr,
            "units": (dict_dir / "units.txt").read_text().split()}


def test_unlabelled_lists_carry_phone_targets(trained):
    rows = [json.loads(x) for x in open(trained["dirs"][0] + "/data.list")]
    assert len(rows) == 24 and {r["label"] for r in rows} == {-1}
    assert all(r["tokens"] and 0 < min(r["tokens"]) and max(r["tokens"]) < len(trained["units"])
               for r in rows)
    assert trained["units"][0] == "<blank>"
    assert not any(u.endswith(("#", "2")) or u == ";" for u in trained["units"])


def test_training_learns_and_reports_the_phone_error_rate(trained):
    losses = [float(line.split(" loss ")[1].split()[0]) for line in trained["log"].splitlines()
              if " step " in line and " loss " in line and "dev:" not in line]
    assert len(losses) >= 4
    assert losses[-1] < 0.6 * losses[0], losses
    dev = [line for line in trained["log"].splitlines() if " dev: " in line]
    assert dev and all(" per " in line for line in dev)


def test_export_streams_like_the_whole_utterance_and_evaluates(trained, capsys):
    from toolkit.data.augment import load_mono
    from toolkit.tasks.kws.frontend import PhoneFrontEnd
    export = trained["exp"] / "export"
    meta = json.loads((export / "config.json").read_text())
    assert meta["task"] == "phone_ctc" and meta["units"] == trained["units"]
    assert meta["activation"] == "log_softmax"
    front = PhoneFrontEnd(str(export))
    wav = json.loads(open(trained["dirs"][2] + "/data.list").readline())["wav"]
    wave = load_mono(wav, 16000)
    whole = front.compute(wave)
    assert whole.shape[1] == len(trained["units"])
    assert np.allclose(np.exp(whole).sum(axis=1), 1.0, atol=1e-4)
    stream = front.stream()
    parts, start = [], 0
    for i, n in enumerate([1, 37, 160, 999, 4000] * 100):
        if start >= len(wave):
            break
        parts.append(stream.accept(wave[start:start + n]))
        start += n
    assert np.abs(np.concatenate(parts) - whole).max() < 1e-4
    out = trained["root"] / "eval"
    capsys.readouterr()
    _main("toolkit.bin.evaluate_frontend", "--frontend", str(export), "--data",
          f"held out={trained['dirs'][2]}/data.list", "--out-dir", str(out), "--rtf-seconds", "3")
    stdout = capsys.readouterr().out
    result = json.loads((out / "results.json").read_text())
    row = result["rows"][0]
    # The tiny run emits a few right phones among blanks (PER 94.6 % here); a front end that
    # emits nothing scores exactly 100 %, the same network untrained 138 %.
    untrained = untrained_per(front, trained["dirs"][2] + "/data.list")
    assert row["utterances"] == 4 and row["per"] < 1.0 < untrained, (row, untrained)
    assert 0 < result["rtf"] < 0.5
    assert "PER %" in stdout


def test_per_binary_on_the_shipped_front_end(trained):
    """The PER binary with a front end that learned phones: the shipped one on this
    module's held-out voices (lists remade with its unit list) decodes 7.5 % PER here; the
    same network untrained 153 %."""
    from toolkit import pretrained
    from toolkit.tasks.kws.frontend import PhoneFrontEnd
    root = trained["root"]
    units = root / "shipped_units.txt"
    units.write_text("".join(u + "\n" for u in pretrained.metadata("phone-voicebank-v2")["units"]))
    listed = str(root / "shipped_test.list")
    _main("toolkit.bin.make_datalist", trained["dirs"][2], listed, "--label-mode", "none",
          "--lexicon", str(trained["data"] / "dict" / "lexicon.txt"), "--units", str(units))
    out = root / "eval_shipped"
    _main("toolkit.bin.evaluate_frontend", "--frontend", "pretrained:phone-voicebank-v2",
          "--data", f"held out={listed}", "--out-dir", str(out), "--rtf-seconds", "1")
    row = json.loads((out / "results.json").read_text())["rows"][0]
    untrained = untrained_per(PhoneFrontEnd("pretrained:phone-voicebank-v2"), listed)
    assert row["utterances"] == 4 and row["per"] < 0.25 and untrained > 1.0, (row, untrained)


def untrained_per(front, data_list: str) -> float:
    """The phone error rate of the front end's network freshly initialised (seeded), decoded
    like the trained one on the same utterances: what a pipeline that learned nothing gets."""
    import torch
    from toolkit.data.augment import load_mono
    from toolkit.nn.ctc import edit_distance, greedy_decode
    from toolkit.tasks.kws.models import build_model
    torch.manual_seed(0)
    model = build_model(type(front.model.config)(**vars(front.model.config))).eval()
    errors = reference = 0
    for entry in map(json.loads, open(data_list)):
        feats = torch.from_numpy(front.fbank.compute(load_mono(entry["wav"], 16000)))[None]
        with torch.no_grad():
            errors += edit_distance(greedy_decode(model(feats)[0][0]), entry["tokens"])
        reference += len(entry["tokens"])
    return errors / reference


def test_phone_frontend_features_are_fingerprinted(trained):
    from toolkit.config import FeatureConfig
    from toolkit.data.features import build_extractor, extractor_from_metadata
    from toolkit.tasks.kws.export import stream_in_chunks
    export = str(trained["exp"] / "export" / "model.safetensors")
    extractor = build_extractor(FeatureConfig(type="phone_frontend", frontend_model=export,
                                              frontend_output="hidden"), 16000)
    wave = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    feats = extractor.compute(wave)
    assert feats.shape == (98, 48)                        # hidden_dim of the tiny model
    meta = extractor.metadata()
    again = extractor_from_metadata(meta)
    assert np.abs(stream_in_chunks(again.streaming(), wave) - feats).max() < 1e-4
    meta["frontend"]["sha256"] = "0" * 64
    with pytest.raises(DataError, match="not the phone front end this model was trained on"):
        extractor_from_metadata(meta)


def test_zero_shot_cli_detects_and_calibrates(trained, tmp_path):
    # The default front end (the shipped one) at the default threshold: the keyword said
    # is found, once and where it was said; a confusable and other speech fire nothing.
    import soundfile as sf
    from toolkit.data.audio import resample
    from toolkit.voicebank.pool import run_forked
    said = {"positive": "hey jarvis, turn on the lights",
            "confusable": "hey travis, turn on the lights",
            "other": "good morning everyone, how are you"}

    def speak(_):
        """In a forked child: a process that loaded espeak-ng renders differently afterwards
        (toolkit.voicebank.pool), and the tests after this one in this process use it."""
        from toolkit.voicebank.espeak import Espeak
        engine, waves = Espeak(), []
        for seed, text in enumerate(said.values()):
            engine.seed(seed)    # espeak-ng's breath noise is otherwise seeded from the clock
            waves.append(resample(engine.synth(text, "en-us"), engine.rate, 16000))
        return waves

    pad, wavs = np.zeros(8000, np.float32), {}
    for name, wave in zip(said, run_forked(speak, [None], 1, str(tmp_path))[0]):
        wavs[name] = str(tmp_path / f"{name}.wav")
        sf.write(wavs[name], np.concatenate([pad, wave, pad]), 16000, subtype="PCM_16")
    # The detector phonemizes the keywords with espeak-ng: each run a process of its own.
    proc = _run("toolkit.bin.kws", "--keywords", "hey jarvis", *wavs.values())
    fired = [line.split("\t") for line in proc.stdout.splitlines()]
    assert [(f[0], f[1]) for f in fired] == [(wavs["positive"], "hey jarvis")], proc.stdout
    assert 0.8 < float(fired[0][3]) < 1.6        # "hey jarvis" ends 1.24 s in (0.5 s lead-in)
    export = str(trained["exp"] / "export")
    wav = json.loads(open(trained["dirs"][2] + "/data.list").readline())["wav"]
    proc = _run("toolkit.bin.kws", "--keywords", "hello there", "--frontend", export,
                "--threshold", "0.0001", wav)
    assert "hello there" in proc.stdout               # a threshold this low fires on anything
    proc = _run("toolkit.bin.kws", "--keywords", "hello there", "--frontend", export,
                "--calibrate", trained["dirs"][2] + "/data.list", "--fa-per-hour", "1")
    assert "threshold" in proc.stdout and "4 utterances" in proc.stdout
    bad = run_train(["-m", "toolkit.bin.kws", "--keywords", "hello", "--frontend",
                     str(tmp_path / "missing"), wav], cwd=ROOT)
    assert bad.returncode == 2 and "not found" in bad.stderr
