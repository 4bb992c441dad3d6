"""The project's shipped pretrained models (toolkit/pretrained/): each matches its card's
sha256 and size limit, loads, embeds chunked input as it embeds the whole, exports to ONNX
with the same output, extracts a data list and fine-tunes; the packager refuses a hole in a
card, damaged weights and an oversized model; each recipe's card template is complete."""
import glob
import importlib
import json
import os
import re
import shutil

import numpy as np
import pytest
import soundfile as sf
import torch

from in_process import run_main
from speaker_data import RATE, SpeakerCorpus, speaker_params, voice_wave
from train_utils import run_train
from toolkit import pretrained
from toolkit.errors import ConfigError, DataError, MissingInputError
from toolkit.pretrained.package import AUTO_FIELDS, MAX_BYTES, package

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEAKER_ENCODER = "ecapa-voicebank-v1"
# The figures a model card of each task must quote.
CARD_FIGURES = {"speaker": ("EER",), "codec": ("STOI", "PESQ-WB", "Codec2", "Opus"),
                "phone_ctc": ("PER", "real-time factor", "festival", "Kokoro reserved")}


def _run(module, *args):
    """The binary's real main(argv) in this process (in_process.run_main): no interpreter
    start-up or re-import per call; it must succeed."""
    proc = run_main(importlib.import_module(module).main, args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _speech(path, index, seconds, seed=0):
    pitch, formants = speaker_params(index)
    sf.write(path, voice_wave(np.random.default_rng(seed), pitch, formants, seconds), RATE,
             subtype="PCM_16")
    return str(path)


# --------------------------------------------------------------------------- shipped models

def test_the_speaker_encoder_is_shipped():
    assert SPEAKER_ENCODER in pretrained.available()


@pytest.mark.parametrize("name", pretrained.available())
def test_each_shipped_model_matches_its_card(name):
    folder = pretrained.model_dir(name)
    weights = pretrained.weights(name)                    # checks the card's sha256
    assert pretrained.card_sha256(name) == pretrained.file_sha256(weights)
    assert os.path.getsize(weights) + os.path.getsize(os.path.join(folder, "config.json")) \
        <= MAX_BYTES
    card = open(os.path.join(folder, "README.md"), encoding="utf-8").read()
    assert "{{" not in card
    recipe = re.search(r"bash (egs/\S+/run\.sh)", card)
    assert recipe and os.path.exists(os.path.join(ROOT, recipe.group(1))), "card names no recipe"
    assert re.search(r"at commit [0-9a-f]{40}", card), "card names no commit"
    task = pretrained.metadata(name)["task"]
    for word in ("Licences", "Apache-2.0", "GPL-3.0", "Hardware") + CARD_FIGURES[task]:
        assert word in card, word


@pytest.mark.parametrize("name", pretrained.available())
def test_damaged_weights_are_refused(tmp_path, name):
    root = str(tmp_path)
    shutil.copytree(pretrained.model_dir(name), os.path.join(root, name))
    path = os.path.join(root, name, "model.safetensors")
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 1
    open(path, "wb").write(bytes(data))
    with pytest.raises(DataError, match="differs from its model card"):
        pretrained.weights(name, root=root)
    with pytest.raises(MissingInputError, match="no pretrained model 'nope'"):
        pretrained.weights("nope", root=root)


def test_speaker_encoder_chunked_onnx_extraction_and_cli(tmp_path):
    from toolkit.tasks.speaker.embed import Embedder
    whole = Embedder.from_pretrained(SPEAKER_ENCODER)
    assert whole.metadata["task"] == "speaker"
    a = _speech(tmp_path / "a.wav", 1, 12.0, seed=1)
    b = _speech(tmp_path / "b.wav", 1, 4.0, seed=2)
    c = _speech(tmp_path / "c.wav", 7, 4.0, seed=3)
    # The same 12 s embedded whole and in 2 s chunks (length-weighted mean) agree.
    chunked = Embedder.from_pretrained(SPEAKER_ENCODER)
    chunked.max_chunk_frames = 200
    full, parts = whole.embed(a), chunked.embed(a)
    assert np.all(np.isfinite(full)) and full.shape == (whole.metadata["embed_dim"],)
    assert whole.cosine(full, parts) > 0.95, whole.cosine(full, parts)
    # ONNX and TorchScript from the shipped weights, parity-checked, same embeddings.
    out = str(tmp_path / "onnx")
    _run("toolkit.bin.export_model", "--pretrained", SPEAKER_ENCODER, "--out-dir", out,
         "--num-check", "4")
    onnx = Embedder.from_path(os.path.join(out, "model.onnx"))
    assert np.max(np.abs(onnx.embed(b) - whole.embed(b))) < 1e-4
    assert os.path.exists(os.path.join(out, "model.zip"))
    # A data list through extract_embeddings --pretrained.
    listing = tmp_path / "list"
    listing.write_text("".join(json.dumps({"key": k, "wav": w, "spk": s, "duration": d}) + "\n"
                               for k, w, s, d in (("a", a, "s1", 12.0), ("b", b, "s1", 4.0),
                                                  ("c", c, "s7", 4.0))))
    _run("toolkit.bin.extract_embeddings", "--pretrained", SPEAKER_ENCODER, "--data-list",
         str(listing), "--out-dir", str(tmp_path / "emb"))
    # The parity check on a data list's audio instead of random features.
    checked = _run("toolkit.bin.export_model", "--pretrained", SPEAKER_ENCODER, "--out-dir",
                   str(tmp_path / "onnx_listed"), "--test-data", str(listing), "--num-check", "3")
    assert checked.stderr.count("parity onnx vs PyTorch") == 1
    import kaldiio
    got = kaldiio.load_scp(str(tmp_path / "emb" / "embeddings.scp"))
    assert sorted(got) == ["a", "b", "c"]
    assert np.max(np.abs(np.asarray(got["b"]) - whole.embed(b))) < 1e-4
    cli = _run("toolkit.bin.speaker", "--pretrained", SPEAKER_ENCODER, b, c)
    assert abs(float(cli.stdout.split()[0]) - whole.score(b, c)) < 1e-4


def test_fine_tuning_starts_from_the_shipped_encoder(tmp_path):
    meta = pretrained.metadata(SPEAKER_ENCODER)
    config = {"task": {"type": "speaker", "chunk_frames": 100, "eval_max_frames": 200},
              "dataset": {"feature": {"num_mel_bins": meta["feature"]["num_mel_bins"]},
                          "batch_size": 8, "num_workers": 0},
              "model": dict(meta["model_config"]),
              "head": {"type": "aam_softmax", "scale": 16.0},
              "optim": {"type": "adam", "lr": 0.0},
              "training": {"seed": 3, "max_steps": 1, "log_interval": 1,
                           "init_checkpoint": "pretrained:" + SPEAKER_ENCODER}}
    config["model"].pop("input_dim", None)
    corpus = SpeakerCorpus(str(tmp_path / "data"), num_speakers=4, utts=3, dev_speakers=3,
                           config=config)
    exp = str(tmp_path / "exp")
    proc = run_train(corpus.train_args(exp))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"from {pretrained.weights(SPEAKER_ENCODER)}" in proc.stderr
    from safetensors.torch import load_file
    shipped = load_file(pretrained.weights(SPEAKER_ENCODER))
    tuned = torch.load(sorted(glob.glob(os.path.join(exp, "ckpt-*.pt")))[-1],
                       weights_only=False)["modules"]["model"]
    key = next(k for k in shipped if k.endswith("weight") and "bn" not in k)
    assert torch.equal(shipped[key], tuned[key])             # lr 0: the shipped weights


# --------------------------------------------------------------------------- the packager

def _tiny_export(folder):
    from toolkit import export as writers
    from toolkit.tasks.speaker.embed import build_metadata
    from toolkit.tasks.speaker.models import SPEAKER_MODELS, build_speaker_model
    model = build_speaker_model(SPEAKER_MODELS.get("ecapa_tdnn").Config(
        type="ecapa_tdnn", input_dim=24, channels=16, mfa_channels=48, embed_dim=8,
        se_bottleneck=8, attention_bottleneck=8))
    fbank = {"sample_rate": 16000, "num_mel_bins": 24, "frame_length_ms": 25.0,
             "frame_shift_ms": 10.0}
    meta = build_metadata(model, fbank)
    os.makedirs(folder, exist_ok=True)
    writers.export_safetensors(model, os.path.join(folder, "model.safetensors"), meta,
                               meta["model_config"])
    return str(folder), sum(p.numel() for p in model.parameters())


def test_packager_writes_a_checkable_card_and_refuses_holes(tmp_path):
    export, params = _tiny_export(tmp_path / "export")
    template = tmp_path / "card.md"
    template.write_text("# {{name}}\n\nat commit {{commit}}, {{parameters}} parameters\n"
                        "sha256 (model.safetensors): `{{sha256}}`\n\n{{ mine }}\n```\n{{summary}}\n```\n")
    summary = tmp_path / "summary.txt"
    summary.write_text("tiny trials cosine: EER 1.00%\n")
    root = str(tmp_path / "shipped")
    os.makedirs(root)
    out = package(export, "tiny-v1", str(template), {"mine": "hello"}, [str(summary)],
                  root=root)
    card = open(os.path.join(out, "README.md")).read()
    assert f"{params:,} parameters" in card and "hello" in card and "EER 1.00%" in card
    assert pretrained.available(root) == ["tiny-v1"]
    assert pretrained.card_sha256("tiny-v1", root) == \
        pretrained.file_sha256(pretrained.weights("tiny-v1", root=root))
    # A field nobody fills names the template's line; nothing is written.
    template.write_text("# {{name}}\n\n{{licence}}\n")
    with pytest.raises(ConfigError, match=r"card\.md:3: no value for \{\{licence\}\}"):
        package(export, "tiny-v2", str(template), {}, root=root)
    assert pretrained.available(root) == ["tiny-v1"]
    with pytest.raises(DataError, match="over the"):
        package(export, "tiny-v3", str(template), {"licence": "x"}, root=root, max_bytes=1000)
    with pytest.raises(ConfigError, match="lower case"):
        package(export, "Tiny", str(template), {"licence": "x"}, root=root)


def test_every_recipe_card_template_is_filled_by_its_recipe():
    """The fields a recipe's packaging stage passes (--set/--set-file), with the
    packager's own, fill every field of its template."""
    templates = glob.glob(os.path.join(ROOT, "egs", "*", "*", "conf", "card*.md"))
    assert templates
    for template in templates:
        run_sh = open(os.path.join(os.path.dirname(os.path.dirname(template)), "run.sh")).read()
        assert "toolkit.bin.package_pretrained" in run_sh, template
        given = set(re.findall(r'--set(?:-file)? "([a-z0-9_]+)=', run_sh))
        # A field per eval set, from a loop: `for name in a b; do ... --set-file "eval_$name=`.
        for sets, prefix in re.findall(r'for name in ([a-z ]+); do[^\n]*\n(?:.*\n){0,8}?.*'
                                       r'--set(?:-file)? "([a-z0-9_]+)\$name=', run_sh):
            given |= {prefix + name for name in sets.split()}
        fields = set(re.findall(r"\{\{\s*([a-z0-9_]+)\s*\}\}", open(template).read()))
        assert fields <= given | set(AUTO_FIELDS), (template, fields - given - set(AUTO_FIELDS))


# --------------------------------------------------------------------------- licence

def test_the_code_and_every_shipped_models_weights_are_apache_2():
    text = open(os.path.join(ROOT, "LICENSE"), encoding="utf-8").read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license="Apache-2.0"' in open(os.path.join(ROOT, "setup.py")).read()
    for name in pretrained.available():
        card = open(os.path.join(pretrained.model_dir(name), "README.md")).read()
        licences = card.split("## Licences", 1)[1]
        # The weights' own licence, beside the data's (Kokoro's Apache-2.0, espeak's GPL).
        assert re.search(r"weights are this project's, released under the Apache License "
                         r"2\.0\s+\(Apache-2\.0", licences), name


# --------------------------------------------------------------------------- integrity

@pytest.mark.parametrize("name", pretrained.available())
def test_an_edited_config_is_refused(tmp_path, name):
    """The card's digest covers config.json too: units order, fbank options or threshold
    edited after shipping load no more."""
    root = str(tmp_path)
    shutil.copytree(pretrained.model_dir(name), os.path.join(root, name))
    assert pretrained.metadata(name, root) == pretrained.metadata(name)   # as shipped: fine
    path = os.path.join(root, name, "config.json")
    meta = json.load(open(path))
    meta["threshold"] = 0.123
    json.dump(meta, open(path, "w"))
    for load in (lambda: pretrained.weights(name, root=root),
                 lambda: pretrained.metadata(name, root)):
        with pytest.raises(DataError, match=r"config\.json: sha256 .* differs from its model card"):
            load()
    # A card that states no digest of the config cannot vouch for it.
    card = os.path.join(root, name, "README.md")
    text = open(card).read()
    open(card, "w").write(re.sub(r"sha256 \(config\.json\).*\n", "", text))
    with pytest.raises(DataError, match=r"expected one line 'sha256 \(config\.json\)"):
        pretrained.weights(name, root=root)


def test_packager_cards_always_carry_both_digests_and_replace_atomically(tmp_path):
    export, _ = _tiny_export(tmp_path / "export")
    template = tmp_path / "card.md"
    template.write_text("# {{name}}\n\nNo digest line in this template.\n")   # d486171: unloadable
    root = str(tmp_path / "shipped")
    out = package(export, "tiny-v1", str(template), {}, root=root)
    assert pretrained.weights("tiny-v1", root=root) == os.path.join(out, "model.safetensors")
    assert pretrained.card_digests("tiny-v1", root) == {
        f: pretrained.file_sha256(os.path.join(out, f)) for f in pretrained.DIGESTED}
    # The same name again: refused unless asked, so a recipe rerun keeps a shipped model.
    with pytest.raises(ConfigError, match="exists: package under a new name, or pass --overwrite"):
        package(export, "tiny-v1", str(template), {}, root=root)
    # A packaging that died after renaming the old model aside (d486171 deleted it first,
    # then left NAME.tmp listed as a model): the name still loads, nothing else is listed.
    os.rename(out, os.path.join(root, ".tiny-v1.old"))
    shutil.copytree(os.path.join(root, ".tiny-v1.old"), os.path.join(root, "tiny-v1.tmp"))
    assert pretrained.available(root) == ["tiny-v1"]
    pretrained.weights("tiny-v1", root=root)
    # Replacing: the old one is put back first, then swapped; no staging dir is left.
    template.write_text("# {{name}} again\n\nsha256 (model.safetensors): `{{sha256}}`\n")
    package(export, "tiny-v1", str(template), {}, root=root, overwrite=True)
    assert sorted(os.listdir(root)) == ["tiny-v1", "tiny-v1.tmp"]
    assert pretrained.available(root) == ["tiny-v1"]
    assert open(os.path.join(out, "README.md")).read().startswith("# tiny-v1 again")
    pretrained.weights("tiny-v1", root=root)
    # The binary's --overwrite.
    from toolkit.bin import package_pretrained
    argv = ["--export-dir", export, "--name", "tiny-v1", "--card", str(template),
            "--out-root", root]
    assert package_pretrained.main(argv) == 2
    assert package_pretrained.main(argv + ["--overwrite"]) == 0


# --------------------------------------------------------------------------- speaker paths

@pytest.mark.parametrize("name, what", [("phone-voicebank-v2", "a phone front end"),
                                        ("codec-voicebank-v1", "a speech codec")])
def test_speaker_paths_refuse_another_tasks_model_in_one_line(tmp_path, capsys, name, what):
    from toolkit.bin import extract_embeddings, speaker
    from toolkit.tasks.speaker.embed import Embedder
    message = f"pretrained model '{name}' is {what} (task "
    with pytest.raises(DataError, match=re.escape(message)):
        Embedder.from_pretrained(name)
    a = _speech(tmp_path / "a.wav", 1, 2.0)
    listing = tmp_path / "list"
    listing.write_text(json.dumps({"key": "a", "wav": a, "spk": "s1", "duration": 2.0}) + "\n")
    for run in (lambda: speaker.main(["--pretrained", name, a, a]),
                lambda: extract_embeddings.main(["--pretrained", name, "--data-list",
                                                 str(listing), "--out-dir",
                                                 str(tmp_path / "emb")])):
        rc = run()
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err[-1].startswith("error: " + message), err
    # The file of another task's export, given by path.
    with pytest.raises(DataError, match="is a .* model, not a speaker encoder"):
        Embedder.from_path(os.path.join(pretrained.model_dir(name), "model.safetensors"))


def test_a_silent_wav_is_one_line_naming_it(tmp_path, capsys):
    from toolkit.bin import speaker
    silent = str(tmp_path / "silent.wav")
    sf.write(silent, np.zeros(RATE * 2, np.float32), RATE, subtype="PCM_16")
    a = _speech(tmp_path / "a.wav", 1, 2.0)
    assert speaker.main(["--pretrained", SPEAKER_ENCODER, a, silent]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {silent}: no speaker embedding of this audio (silent audio)"], err


def test_extraction_parts_of_another_model_list_or_split_are_redone(tmp_path):
    """d486171 kept a used out dir's parts whatever made them: another model's embeddings
    came back (exit 0)."""
    import kaldiio
    from toolkit.tasks.speaker.embed import Embedder, extract_embeddings
    export, _ = _tiny_export(tmp_path / "tiny")
    tiny = os.path.join(export, "model.safetensors")
    waves = [_speech(tmp_path / f"{i}.wav", i, 1.5, seed=i) for i in range(3)]
    listing = tmp_path / "list"
    listing.write_text("".join(json.dumps({"key": f"u{i}", "wav": w, "spk": f"s{i}",
                                           "duration": 1.5}) + "\n" for i, w in enumerate(waves)))
    out = str(tmp_path / "emb")

    def extracted():
        return kaldiio.load_scp(os.path.join(out, "embeddings.scp"))

    def expect(model, keys):
        got, embedder = extracted(), Embedder.from_path(model)
        assert sorted(got) == keys
        for i, key in enumerate(keys):
            want = embedder.embed(waves[i])
            assert np.shape(got[key]) == want.shape, "another model's embeddings came back"
            assert np.max(np.abs(np.asarray(got[key]) - want)) < 1e-4

    extract_embeddings("pretrained:" + SPEAKER_ENCODER, str(listing), out, nj=2)
    expect("pretrained:" + SPEAKER_ENCODER, ["u0", "u1", "u2"])
    extract_embeddings(tiny, str(listing), out, nj=2)             # another model
    expect(tiny, ["u0", "u1", "u2"])
    listing.write_text("".join(open(listing).readlines()[:2]))     # another list
    extract_embeddings(tiny, str(listing), out, nj=2)
    expect(tiny, ["u0", "u1"])
    extract_embeddings(tiny, str(listing), out, nj=1)             # another split
    expect(tiny, ["u0", "u1"])
    done = json.load(open(os.path.join(out, "embeddings.1.done")))
    assert done["source"]["model_sha256"].startswith(pretrained.file_sha256(tiny))
    # The same model, list and split again: kept (the parts are not rewritten).
    stamp = os.path.getmtime(os.path.join(out, "embeddings.1.ark"))
    extract_embeddings(tiny, str(listing), out, nj=1)
    assert os.path.getmtime(os.path.join(out, "embeddings.1.ark")) == stamp


def test_the_gate_encoder_ships_its_cohort_checked_by_its_card():
    """ecapa-voicebank-v2's AS-Norm cohort: one unit row per training speaker, its digest on
    the card, and the gate's default encoder."""
    from toolkit.tasks.kws.enrol import DEFAULT_SPEAKER_ENCODER, load_cohort
    name = "ecapa-voicebank-v2"
    assert DEFAULT_SPEAKER_ENCODER == pretrained.PREFIX + name
    pretrained.verify_files(name, files=(pretrained.COHORT,))
    cohort = load_cohort(DEFAULT_SPEAKER_ENCODER)
    assert cohort.shape == (1041, 192)
    np.testing.assert_allclose(np.linalg.norm(cohort, axis=1), 1.0, atol=1e-5)
    # v1 ships none: its gate scores by cosine.
    assert load_cohort(pretrained.PREFIX + "ecapa-voicebank-v1") is None
