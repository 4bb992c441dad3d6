"""CTC targets and the auxiliary CTC loss: lexicon and units, tokens in data lists, the
loss against a slow reference, the models' CTC head, export without it, and training
with max-pooling + CTC through torchrun with two gloo ranks."""
import copy
import json
import math
import os

import numpy as np
import pytest
import torch

from kws_data import make_kaldi_dir, write_keywords
from toolkit.data.datalist import DataList
from toolkit.tasks.kws.tokens import (BLANK, Tokenizer, char_lexicon, read_lexicon, read_units,
                                 units_of)
from toolkit.tasks.kws.losses import CTCLoss, build_loss, uses_ctc_head
from toolkit.tasks.kws.models import MODELS, build_model
from train_utils import TINY_CONFIG, launcher, latest_payload, run_train


# ---------------------------------------------------------------- reference CTC

def run_bin(module: str, *args: str) -> None:
    """A toolkit binary in its own process (forked from the test zygote), which must succeed."""
    result = run_train(["-m", module, *args])
    assert result.returncode == 0, result.stderr[-2000:]


def ctc_reference(log_probs: np.ndarray, target) -> float:
    """-log p(target | x) by the textbook alpha recursion over the blank-extended target,
    one frame at a time in float64 (log_probs: (T, U), blank 0)."""
    ext = [0]
    for t in target:
        ext += [t, 0]
    S = len(ext)
    alpha = np.full(S, -np.inf)
    alpha[0] = log_probs[0, 0]
    if S > 1:
        alpha[1] = log_probs[0, ext[1]]
    for t in range(1, log_probs.shape[0]):
        new = np.full(S, -np.inf)
        for s in range(S):
            terms = [alpha[s]]
            if s >= 1:
                terms.append(alpha[s - 1])
            if s >= 2 and ext[s] != 0 and ext[s] != ext[s - 2]:
                terms.append(alpha[s - 2])
            new[s] = np.logaddexp.reduce(terms) + log_probs[t, ext[s]]
        alpha = new
    total = alpha[S - 1] if S == 1 else np.logaddexp(alpha[S - 1], alpha[S - 2])
    return float(-total)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ctc_loss_matches_reference(seed):
    g = torch.Generator().manual_seed(seed)
    batch, frames, units = 5, 17, 6
    logits = torch.randn(batch, frames, units, generator=g, dtype=torch.float64) * 2
    lengths = torch.tensor([17, 12, 9, 17, 4])
    # Repeated units (need a blank between them), an empty target (all blank) and a
    # target too long for its 4 frames (infeasible: counted as zero, not infinity).
    targets = [[1, 2, 3], [2, 2, 5], [], [1, 3, 3, 3, 4, 2], [1, 2, 3, 4, 5]]
    tokens = torch.zeros(batch, 6, dtype=torch.int64)
    for i, t in enumerate(targets):
        tokens[i, :len(t)] = torch.tensor(t, dtype=torch.int64)
    token_lengths = torch.tensor([len(t) for t in targets])
    loss, metrics = CTCLoss(CTCLoss.Config(type="ctc"))(logits, lengths, tokens, token_lengths)

    log_probs = torch.log_softmax(logits, dim=-1).numpy()
    expected = []
    for i, t in enumerate(targets):
        value = ctc_reference(log_probs[i, :int(lengths[i])], t)
        expected.append(0.0 if math.isinf(value) else value)
    assert math.isinf(ctc_reference(log_probs[4, :4], targets[4]))
    assert loss.item() == pytest.approx(sum(expected) / batch, rel=1e-5)
    assert metrics["ctc_per_unit"].item() == pytest.approx(sum(expected) / sum(map(len, targets)),
                                                           rel=1e-5)


def test_ctc_ignores_frames_beyond_length():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 10, 4, generator=g)
    lengths = torch.tensor([10, 6])
    tokens = torch.tensor([[1, 2], [3, 0]])
    token_lengths = torch.tensor([2, 1])
    crit = CTCLoss(CTCLoss.Config(type="ctc"))
    a, _ = crit(logits, lengths, tokens, token_lengths)
    changed = logits.clone()
    changed[1, 6:] = 100.0
    b, _ = crit(changed, lengths, tokens, token_lengths)
    assert a.item() == pytest.approx(b.item(), rel=1e-6)


def test_weighted_sum_routes_the_ctc_component():
    from toolkit.config import validate
    cfg = copy.deepcopy(TINY_CONFIG)
    cfg["loss"] = {"type": "weighted_sum", "components": [
        {"type": "max_pooling", "weight": 1.0, "min_duration": 2},
        {"type": "ctc", "weight": 0.25}]}
    loss_fn = build_loss(validate(cfg).loss)
    assert uses_ctc_head(loss_fn)
    assert not uses_ctc_head(build_loss(validate(TINY_CONFIG).loss))
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 12, 1, generator=g)
    ctc_logits = torch.randn(3, 12, 5, generator=g)
    lengths = torch.tensor([12, 10, 8])
    labels = torch.tensor([0, -1, -1])
    tokens = torch.tensor([[1, 2, 3], [4, 0, 0], [0, 0, 0]])
    token_lengths = torch.tensor([3, 1, 0])
    total, metrics = loss_fn(logits, lengths, labels, ctc_logits, tokens, token_lengths)
    kw, _ = loss_fn.parts[0](logits, lengths, labels)
    ctc, _ = loss_fn.parts[1](ctc_logits, lengths, tokens, token_lengths)
    assert total.item() == pytest.approx(kw.item() + 0.25 * ctc.item(), rel=1e-6)
    assert metrics["loss_1_ctc"].item() == pytest.approx(ctc.item(), rel=1e-6)
    assert "acc" in metrics


# ---------------------------------------------------------------- lexicon and tokens

def test_lexicon_units_and_tokenizer(tmp_path):
    lex_path = tmp_path / "lexicon.txt"
    lex_path.write_text("hey h eI\nsnips s n I p s\nhey h aI\n")
    lexicon = read_lexicon(str(lex_path))
    assert lexicon["hey"] == ["h", "eI"]            # first pronunciation wins
    units = units_of(lexicon)
    assert units[0] == BLANK and units[1:] == sorted(set(units[1:]))
    tok = Tokenizer(lexicon, units)
    ids, oov = tok.encode("hey <noise> snips")       # markers carry no units
    assert oov == [] and [units[i] for i in ids] == ["h", "eI", "s", "n", "I", "p", "s"]
    assert tok.encode("<noise>") == ([], [])
    assert tok.encode("hey snaps") == (None, ["snaps"])
    assert char_lexicon(["ab"]) == {"ab": ["a", "b"]}


@pytest.mark.parametrize("text, needle", [
    ("hey\n", "lexicon.txt:1"),
    ("hey h\nsnips s <blank>\n", "lexicon.txt:2"),
])
def test_bad_lexicon_names_the_line(tmp_path, text, needle):
    path = tmp_path / "lexicon.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=needle):
        read_lexicon(str(path))


def test_units_need_blank_first(tmp_path):
    path = tmp_path / "units.txt"
    path.write_text("a\n<blank>\n")
    with pytest.raises(ValueError, match="first unit must be <blank>"):
        read_units(str(path))


def test_phone_lexicon_from_espeak_separates_near_homophones(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "text").write_text("u1 hey snips\nu2 hey sneeps\nu3 hai snips\nu4 <noise>\n")
    lex, units = tmp_path / "lexicon.txt", tmp_path / "units.txt"
    run_bin("toolkit.bin.make_lexicon", "--unit", "phone", str(data), "--lexicon", str(lex),
            "--units", str(units))
    lexicon = read_lexicon(str(lex))
    assert set(lexicon) == {"hey", "snips", "sneeps", "hai"}
    for word in lexicon.values():
        assert not any(mark in p for p in word for mark in "',%=")
    assert lexicon["snips"] != lexicon["sneeps"]
    assert lexicon["hey"] != lexicon["hai"]
    assert lexicon["snips"][:2] == lexicon["sneeps"][:2]         # only the vowel differs
    assert read_units(str(units))[0] == BLANK


def test_tokens_checked_when_a_batch_is_built(tmp_path):
    from toolkit.data.audio import BadEntry
    from toolkit.data.sources import BatchDataset
    from toolkit.tasks.kws.data import KwsExampleBuilder

    class Features:           # stands in for the fbank pipeline: tokens are checked first
        num_bins = 3

        def features(self, entry, epoch, audio=None, spec_aug=True):
            return np.zeros((4, 3), np.float32)

    path = tmp_path / "list"
    rows = [
        {"key": "a", "wav": "a.wav", "duration": 1.0, "label": 0, "tokens": [1, 2]},
        {"key": "b", "wav": "b.wav", "duration": 1.0, "label": -1, "tokens": []},
        {"key": "c", "wav": "c.wav", "duration": 1.0, "label": -1},
        {"key": "d", "wav": "d.wav", "duration": 1.0, "label": -1, "tokens": [1, 9]},
        {"key": "e", "wav": "e.wav", "duration": 1.0, "label": -1, "tokens": [0]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    datalist = DataList.load(str(path))
    assert len(datalist) == 5                    # tokens matter only to a CTC loss
    batch = BatchDataset(datalist, [np.arange(5)], KwsExampleBuilder(Features(), True, 5), 0)[0]
    assert batch.keys == ["a", "b"]
    assert batch.tokens.tolist() == [[1, 2], [0, 0]] and batch.token_lengths.tolist() == [2, 0]
    assert batch.bad.counts == {"missing_tokens": 1, "token_not_in_units": 2}
    plain = BatchDataset(datalist, [np.arange(5)], KwsExampleBuilder(Features(), True, None), 0)[0]
    assert len(plain) == 5 and plain.get("tokens") is None
    with pytest.raises(BadEntry):
        KwsExampleBuilder(Features(), True, 5)(datalist.entry(2), 0)


# ---------------------------------------------------------------- models and export

STREAMING = ["ds_tcn", "tcn", "mdtc", "gru"]


def tiny_model(kind: str, ctc_outputs: int):
    from toolkit.config import validate
    cfg = copy.deepcopy(TINY_CONFIG)
    cfg["model"] = {"type": kind, "input_dim": 20, "num_outputs": 2, "ctc_outputs": ctc_outputs}
    return build_model(validate(cfg).model)


@pytest.mark.parametrize("kind", STREAMING)
def test_ctc_head_shares_the_encoder(kind):
    torch.manual_seed(0)
    model = tiny_model(kind, 7).eval()
    feats = torch.randn(2, 30, 20)
    hidden, _ = model.encode(feats)
    logits, _ = model(feats)
    assert logits.shape == (2, 30, 2)
    assert torch.allclose(logits, model.classifier(hidden))
    assert model.ctc_head(hidden).shape == (2, 30, 7)
    assert tiny_model(kind, 0).ctc_head is None


def test_ctc_head_refused_by_utterance_classifier():
    assert "bcresnet" in MODELS
    with pytest.raises(ValueError, match="no CTC head"):
        tiny_model("bcresnet", 5)


def test_export_of_a_ctc_model_keeps_the_keyword_output(tmp_path):
    from toolkit.tasks.kws.export import check_parity, export_onnx, export_torchscript
    torch.manual_seed(1)
    model = tiny_model("ds_tcn", 9).eval()
    meta = {"keywords": ["a", "b"], "cache_size": model.cache_size}
    paths = {"onnx": str(tmp_path / "m.onnx"), "torchscript": str(tmp_path / "m.pt")}
    export_onnx(model, paths["onnx"], meta)
    export_torchscript(model, paths["torchscript"], meta)
    feats = [np.random.default_rng(0).standard_normal((40, 20)).astype(np.float32)]
    report = check_parity(model, paths, feats)
    assert report
    import onnxruntime as ort
    sess = ort.InferenceSession(paths["onnx"], providers=["CPUExecutionProvider"])
    out = sess.run(None, {"feats": feats[0][None],
                          "cache": np.zeros((1, model.cache_size), np.float32)})
    assert out[0].shape == (1, 40, 2)


# ---------------------------------------------------------------- training

@pytest.fixture(scope="module")
def ctc_corpus(tmp_path_factory):
    """Kaldi dirs -> char lexicon -> data lists with tokens, through the binaries."""
    root = str(tmp_path_factory.mktemp("ctc"))
    dirs = {"train": make_kaldi_dir(root, "train", 8, 16, 1),
            "dev": make_kaldi_dir(root, "dev", 3, 3, 2)}
    lex, units = os.path.join(root, "lexicon.txt"), os.path.join(root, "units.txt")
    run_bin("toolkit.bin.make_lexicon", "--unit", "char", *dirs.values(), "--lexicon", lex,
            "--units", units)
    inventory = write_keywords(root, ["hey chirp"])
    lists = {}
    for name, d in dirs.items():
        lists[name] = os.path.join(root, f"{name}.list")
        run_bin("toolkit.bin.make_datalist", d, lists[name], "--inventory", inventory,
                "--lexicon", lex, "--units", units)
    cfg = copy.deepcopy(TINY_CONFIG)
    cfg["loss"] = {"type": "weighted_sum", "components": [
        {"type": "max_pooling", "weight": 1.0, "min_duration": 5},
        {"type": "ctc", "weight": 0.1}]}
    config = os.path.join(root, "ctc.yaml")
    import yaml
    with open(config, "w") as f:
        yaml.safe_dump(cfg, f)
    return {"root": root, "lists": lists, "units": units, "inventory": inventory,
            "config": config}


def ctc_args(c, exp, *extra, units=True):
    return ["-m", "toolkit.bin.train", "--config", c["config"], "--exp-dir", exp,
            "--train-data", c["lists"]["train"], "--dev-data", c["lists"]["dev"],
            "--inventory", c["inventory"], *(["--units", c["units"]] if units else []), *extra]


def test_datalist_tokens_from_binaries(ctc_corpus):
    units = read_units(ctc_corpus["units"])
    entries = [json.loads(line) for line in open(ctc_corpus["lists"]["train"])]
    pos = next(e for e in entries if e["label"] == 0)
    assert "".join(units[i] for i in pos["tokens"]) == "heychirp"
    neg = next(e for e in entries if e["label"] == -1)
    assert "".join(units[i] for i in neg["tokens"]) == "somethingelse"


def test_train_with_ctc_on_two_gloo_ranks(ctc_corpus, tmp_path):
    exp = str(tmp_path / "exp")
    result = run_train(ctc_args(ctc_corpus, exp, "training.max_epoch=2"), nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    payload = latest_payload(exp)
    units = len(read_units(ctc_corpus["units"]))
    assert payload["modules"]["model"]["ctc_head.weight"].shape[0] == units
    with open(os.path.join(exp, "config.yaml")) as f:
        assert f"ctc_outputs: {units}" in f.read()
    log = open(os.path.join(exp, "log", "train.rank0.log")).read()
    dev_losses = [float(line.split("dev: loss ")[1].split()[0])
                  for line in log.splitlines() if "dev: loss " in line]
    assert len(dev_losses) == 2 and dev_losses[1] < dev_losses[0]
    # Each component is logged on its own, in the log and in TensorBoard.
    assert " loss_0_max_pooling " in log and " loss_1_ctc " in log
    import glob
    from tensorboard_reader import scalar_tags
    tags = scalar_tags(glob.glob(os.path.join(exp, "tensorboard", "events.out.tfevents.*")))
    assert {"train/loss_0_max_pooling", "train/loss_1_ctc"} <= set(tags)
    # The checkpoint loads into a fresh model built from the experiment's config.
    from toolkit.tasks.kws.export import model_from_checkpoint
    model = model_from_checkpoint(os.path.join(exp, os.path.basename(
        sorted(p for p in os.listdir(exp) if p.endswith(".pt"))[-1])))
    assert model.ctc_head is not None


def test_ctc_without_units_is_a_clear_error(ctc_corpus, tmp_path):
    result = run_train(ctc_args(ctc_corpus, str(tmp_path / "exp"), units=False))
    assert result.returncode != 0
    assert "model.ctc_outputs is 0" in result.stderr


def list_without_tokens(c, tmp_path) -> str:
    """The corpus's train list with every entry's `tokens` removed."""
    plain = tmp_path / "plain.list"
    with open(c["lists"]["train"]) as f, open(plain, "w") as w:
        for line in f:
            entry = json.loads(line)
            entry.pop("tokens")
            w.write(json.dumps(entry) + "\n")
    return str(plain)


def test_ctc_with_lists_lacking_tokens_is_refused(ctc_corpus, tmp_path):
    args = ctc_args(ctc_corpus, str(tmp_path / "exp"))
    args[args.index("--train-data") + 1] = list_without_tokens(ctc_corpus, tmp_path)
    result = run_train(args)
    assert result.returncode != 0
    assert "missing_tokens" in result.stderr


def test_train_with_ctc_from_shards(ctc_corpus, tmp_path):
    """Tar shards carry the tokens (in each utterance's JSON): a CTC loss trains from
    them, and shards made from a list without tokens fail the bad-input check."""
    def shard(data_list, out):
        run_bin("toolkit.bin.make_shards", data_list, str(out), "--utts-per-shard", "6")
        return str(out / "shards.list")

    args = ctc_args(ctc_corpus, str(tmp_path / "exp"), "training.max_epoch=1")
    args[args.index("--train-data") + 1] = shard(ctc_corpus["lists"]["train"], tmp_path / "sh")
    result = run_train(args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "24 utterances used, 0 skipped" in result.stderr
    log = open(os.path.join(str(tmp_path / "exp"), "log", "train.rank0.log")).read()
    assert " loss_1_ctc " in log

    args = ctc_args(ctc_corpus, str(tmp_path / "exp2"), "training.max_epoch=1")
    args[args.index("--train-data") + 1] = shard(list_without_tokens(ctc_corpus, tmp_path),
                                                 tmp_path / "sh_plain")
    result = run_train(args)
    assert result.returncode != 0
    assert "missing_tokens" in result.stderr
