"""Speaker embeddings after training: the exported extractor (fbank frames -> embedding,
any length), a Python API that embeds WAVs with any exported format or a checkpoint, and
the extraction of a whole data list into Kaldi archives (resumable per split).

    embedder = Embedder.from_path("exp/resnet34/export/model.onnx")
    embedder = Embedder.from_pretrained("ecapa-voicebank-v1")   # shipped: toolkit.pretrained
    score = embedder.score("a.wav", "b.wav")        # cosine, higher = same speaker
"""
import dataclasses
import json
import logging
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from toolkit import export as writers
from toolkit.data.features import compute_fbank, fbank_metadata, fbank_options, options_from_config
from toolkit.errors import DataError, MissingInputError
from toolkit.export import compare, onnx_runner, parity_inputs, read_metadata, torch_runner
from toolkit.fileio import atomic_write_text, sha256_file
from toolkit.tasks.speaker.models import SPEAKER_MODELS, build_speaker_model
from toolkit.trainer.checkpoint import load_payload, module_states_from_file

logger = logging.getLogger(__name__)
# Utterances longer than this are embedded in chunks whose embeddings are averaged
# (weighted by length): memory stays bounded and very long recordings stay usable.
MAX_CHUNK_FRAMES = 3000


def model_from_checkpoint(path: str) -> Tuple[nn.Module, dict]:
    """The embedding network (eval mode) and its config dict from a training or averaged
    checkpoint."""
    payload = load_payload(path)
    _check_speaker_task(path, payload.get("config", {}).get("task", {}).get("type", ""))
    raw = dict(payload["config"]["model"])
    model = build_speaker_model(SPEAKER_MODELS.get(raw["type"]).Config(**raw))
    model.load_state_dict(module_states_from_file(path)["model"])
    return model.eval(), payload["config"]


def build_metadata(model: nn.Module, fbank: dict, threshold: Optional[float] = None,
                   num_speakers: int = 0) -> dict:
    return {"format_version": 1, "task": "speaker", "model_type": model.config.type,
            "model_config": dataclasses.asdict(model.config), "feature": fbank,
            "input_norm": model.config.input_norm, "embed_dim": int(model.config.embed_dim),
            "min_frames": int(getattr(model, "min_frames", 1)),
            "training_speakers": int(num_speakers), "threshold": threshold,
            "output": "embedding (batch, embed_dim); cosine scoring after length norm"}


def export_embedder(task, checkpoint: str, out_dir: str, test_data: str, num_check: int = 20,
                    tolerance: float = 1e-4, threshold: Optional[float] = None) -> Dict[str, float]:
    """model.onnx (dynamic batch and time axes), model.zip (TorchScript), model.safetensors
    + config.json; each checked against PyTorch on real test utterances of their own
    lengths. The classification head is not exported."""
    from toolkit.data.pipeline import evaluation_pipeline
    model, _ = model_from_checkpoint(checkpoint)
    d = task.cfg.dataset
    metadata = build_metadata(model, fbank_metadata(options_from_config(d.feature, d.sample_rate)),
                              threshold, task.cfg.head.num_classes)
    pipeline = evaluation_pipeline(d)
    pipeline.min_frames = max(1, int(model.min_frames))     # shorter ones: counted skips
    cases = parity_inputs(test_data, lambda e: (pipeline.features(e, 0)[None],), num_check)
    return _write_exports(model, metadata, out_dir, cases, tolerance, safetensors=True)


def export_embedder_weights(weights: str, out_dir: str, test_data: Optional[str] = None,
                            num_check: int = 20, tolerance: float = 1e-4) -> Dict[str, float]:
    """model.onnx and model.zip of a safetensors export (e.g. a shipped pretrained model),
    its config.json copied beside them; checked on the fbank of `test_data`'s utterances,
    or without it on seeded random features of 1-6 s."""
    import shutil
    model = model_from_safetensors(weights)
    metadata = read_metadata(weights)
    os.makedirs(out_dir, exist_ok=True)
    side = os.path.join(os.path.dirname(os.path.abspath(weights)), writers.SIDE_CONFIG)
    if os.path.abspath(out_dir) != os.path.dirname(os.path.abspath(weights)):
        shutil.copyfile(weights, os.path.join(out_dir, "model.safetensors"))
        shutil.copyfile(side, os.path.join(out_dir, writers.SIDE_CONFIG))
    if test_data:
        pipeline = pipeline_from_metadata(metadata)
        pipeline.min_frames = max(1, int(model.min_frames))     # shorter ones: counted skips
        cases = parity_inputs(test_data, lambda e: (pipeline.features(e, 0)[None],), num_check)
    else:
        rng = np.random.default_rng(0)
        cases = [(rng.standard_normal((1, int(n), model.config.input_dim)).astype(np.float32),)
                 for n in np.linspace(max(100, model.min_frames), 600, num_check)]
    return _write_exports(model, metadata, out_dir, cases, tolerance, safetensors=False)


def pipeline_from_metadata(metadata: dict):
    """The evaluation pipeline (fbank, no dither, any length) an export's metadata names."""
    from toolkit.config import DatasetConfig
    from toolkit.data.pipeline import evaluation_pipeline
    f = metadata["feature"]
    dcfg = DatasetConfig(sample_rate=int(f["sample_rate"]), max_duration=1e9, min_duration=0.0)
    dcfg.feature.num_mel_bins = int(f["num_mel_bins"])
    dcfg.feature.frame_length_ms = float(f["frame_length_ms"])
    dcfg.feature.frame_shift_ms = float(f["frame_shift_ms"])
    return evaluation_pipeline(dcfg)


def _write_exports(model: nn.Module, metadata: dict, out_dir: str, cases: list,
                   tolerance: float, safetensors: bool) -> Dict[str, float]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"torchscript": os.path.join(out_dir, "model.zip"),
             "onnx": os.path.join(out_dir, "model.onnx")}
    example = (torch.randn(1, 120, model.config.input_dim),)
    writers.export_torchscript(model, paths["torchscript"], metadata, trace_example=example)
    writers.export_onnx(model, example, paths["onnx"], ["feats"], ["embedding"],
                        {"feats": {0: "batch", 1: "frames"}, "embedding": {0: "batch"}}, metadata)
    candidates = {"torchscript": torch_runner(torch.jit.load(paths["torchscript"]).eval()),
                  "onnx": onnx_runner(paths["onnx"])}
    if safetensors:
        writers.export_safetensors(model, os.path.join(out_dir, "model.safetensors"), metadata,
                                   metadata["model_config"])
        candidates["safetensors"] = torch_runner(model_from_safetensors(
            os.path.join(out_dir, "model.safetensors")))
    return compare(torch_runner(model), candidates, cases, tolerance,
                   "exported embedding extractor")


def model_from_safetensors(path: str) -> nn.Module:
    """The embedding network of an export (model.safetensors + config.json), eval mode."""
    from safetensors.torch import load_file
    raw = dict(read_metadata(path)["model_config"])
    model = build_speaker_model(SPEAKER_MODELS.get(raw["type"]).Config(**raw))
    model.load_state_dict(load_file(path))
    return model.eval()


def speaker_model_file(path: str) -> str:
    """The file of a speaker model: `pretrained:NAME` resolved (and checked against its
    card), the file checked to exist and to hold a speaker encoder (task speaker), so a
    phone front end or codec is refused naming its task instead of failing on a key."""
    from toolkit import pretrained
    path = pretrained.resolve(path, task="speaker")
    if not os.path.exists(path):
        raise MissingInputError(f"speaker model {path} not found (run the export stage)")
    if path.endswith((".onnx", ".zip", ".safetensors")):
        try:
            task = read_metadata(path).get("task", "")
        except (OSError, ValueError) as err:
            raise DataError(f"{path}: not a readable model export ({err})") from None
        _check_speaker_task(path, task)
    return path       # a checkpoint's task: model_from_checkpoint, which reads it anyway


def _check_speaker_task(path: str, task: str) -> None:
    if task != "speaker":
        raise DataError(f"{path} is a {task or 'task-less'} model, not a speaker encoder "
                        "(task speaker)")


def model_fingerprint(path: str) -> str:
    """sha256 of a speaker model's file (with the config.json a safetensors export is read
    with): what a finished extraction part records it was made by."""
    digest = sha256_file(path)
    if path.endswith(".safetensors"):
        side = os.path.join(os.path.dirname(os.path.abspath(path)), writers.SIDE_CONFIG)
        digest += "+" + sha256_file(side)
    return digest


class Embedder:
    """Embeds waveforms or fbank features with an exported extractor (.onnx, .zip,
    .safetensors + config.json) or a checkpoint (.pt, with its exp dir's config)."""

    def __init__(self, run, metadata: dict, max_chunk_frames: int = MAX_CHUNK_FRAMES):
        self._run = run
        self.metadata = metadata
        f = metadata["feature"]
        self.sample_rate = int(f["sample_rate"])
        self.opts = fbank_options(int(f["num_mel_bins"]), float(f["frame_length_ms"]),
                                  float(f["frame_shift_ms"]), 0.0, self.sample_rate)
        self.max_chunk_frames = max_chunk_frames
        self.min_frames = int(metadata.get("min_frames", 1))

    @classmethod
    def from_pretrained(cls, name: str, threads: int = 1) -> "Embedder":
        """A shipped pretrained encoder (toolkit.pretrained), checked against its card."""
        from toolkit import pretrained
        return cls.from_path(pretrained.PREFIX + name, threads)

    @classmethod
    def from_path(cls, path: str, threads: int = 1) -> "Embedder":
        """`path`: an export (.onnx, .zip, .safetensors), a checkpoint (.pt), or
        `pretrained:NAME` for a shipped model; another task's model is refused in one line."""
        path = speaker_model_file(path)
        torch.set_num_threads(threads)
        if path.endswith(".onnx"):
            return cls(onnx_runner(path, threads), read_metadata(path))
        if path.endswith(".zip"):
            return cls(torch_runner(torch.jit.load(path).eval()), read_metadata(path))
        if path.endswith(".safetensors"):
            return cls(torch_runner(model_from_safetensors(path)), read_metadata(path))
        model, cfg = model_from_checkpoint(path)
        d = cfg["dataset"]
        fbank = fbank_metadata(fbank_options(d["feature"]["num_mel_bins"],
                                             d["feature"]["frame_length_ms"],
                                             d["feature"]["frame_shift_ms"], 0.0,
                                             d["sample_rate"]))
        return cls(torch_runner(model), build_metadata(model, fbank))

    def features(self, wave: np.ndarray) -> np.ndarray:
        return compute_fbank(np.asarray(wave, dtype=np.float32), self.opts)

    def embed_features(self, feats: np.ndarray) -> np.ndarray:
        """(T, D) fbank -> (E,) embedding; long inputs in chunks, length-weighted mean."""
        feats = np.asarray(feats, dtype=np.float32)
        if len(feats) < self.min_frames:
            raise DataError(f"{len(feats)} frames is shorter than the model's minimum "
                            f"{self.min_frames}")
        n = self.max_chunk_frames
        pieces = [feats[s:s + n] for s in range(0, len(feats), n)] if n else [feats]
        if len(pieces) > 1 and len(pieces[-1]) < max(self.min_frames, n // 4):
            pieces[-2] = np.concatenate([pieces[-2], pieces.pop()])   # no tiny last chunk
        out = np.zeros(int(self.metadata["embed_dim"]), np.float64)
        for piece in pieces:
            out += self._run(piece[None])[0][0].astype(np.float64) * len(piece)
        return (out / len(feats)).astype(np.float32)

    def embed(self, audio) -> np.ndarray:
        """A WAV path or mono float samples at the model's rate -> embedding. A file with
        no speaker to embed (silent, empty, unreadable) is a DataError naming it."""
        if isinstance(audio, str):
            from toolkit.data.audio import BadEntry
            from toolkit.data.augment import load_mono
            try:
                audio = load_mono(audio, self.sample_rate)
            except BadEntry as err:
                raise DataError(f"{audio}: no speaker embedding of this audio "
                                f"({err.reason.replace('_', ' ')})") from None
        return self.embed_features(self.features(audio))

    @staticmethod
    def cosine(a: np.ndarray, b: np.ndarray) -> float:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))

    def score(self, a, b) -> float:
        return self.cosine(self.embed(a), self.embed(b))


# --------------------------------------------------------------------------- extraction

def _extract_part(args) -> Tuple[int, int, List[str]]:
    model_path, list_path, out_dir, part, parts, threads, source = args
    import kaldiio
    from toolkit.data.audio import BadEntry
    from toolkit.data.datalist import BadCounter, DataList, split_range
    embedder = Embedder.from_path(model_path, threads)
    pipeline = pipeline_from_metadata(embedder.metadata)
    datalist = DataList.load(list_path, require_label=False)
    start, end = split_range(len(datalist), parts, part)
    ark = os.path.join(out_dir, f"embeddings.{part + 1}.ark")
    scp = os.path.join(out_dir, f"embeddings.{part + 1}.scp")
    bad = BadCounter()
    written = 0
    with kaldiio.WriteHelper(f"ark,scp:{ark}.tmp,{scp}.tmp") as writer:
        for i in range(start, end):
            entry = datalist.entry(i)
            try:
                writer(entry["key"], embedder.embed_features(pipeline.features(entry, 0)))
                written += 1
            except (BadEntry, DataError) as err:
                bad.add(getattr(err, "reason", "other"), entry["key"], str(err))
    # kaldiio wrote the .tmp ark's path into the scp: point it at the final name.
    with open(scp + ".tmp", encoding="utf-8") as f_in:
        lines = [line.replace(f"{ark}.tmp:", f"{ark}:") for line in f_in]
    os.replace(ark + ".tmp", ark)
    with open(scp, "w", encoding="utf-8") as f_out:
        f_out.writelines(lines)
    os.remove(scp + ".tmp")
    atomic_write_text(os.path.join(out_dir, f"embeddings.{part + 1}.done"), json.dumps(
        {"utterances": written, "skipped": bad.total(), "source": source}))
    return part, written, [f"{r}={n}" for r, n in bad.counts.items()]


def _finished(out_dir: str, part: int, source: dict) -> bool:
    """Whether part `part` is done from `source` (the same model, list and split); one
    done from anything else is logged and extracted again."""
    path = os.path.join(out_dir, f"embeddings.{part + 1}.done")
    if not os.path.exists(path):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            done = json.load(f).get("source")
    except (OSError, ValueError, AttributeError):
        done = None
    if done == source:
        return True
    changed = [k for k in source if not isinstance(done, dict) or done.get(k) != source[k]]
    logger.info("%s: part %d was extracted with another %s: extracting it again", out_dir,
                part + 1, " and ".join(k.replace("_sha256", "").replace("_", " ") for k in changed))
    return False


def extract_embeddings(model_path: str, list_path: str, out_dir: str, nj: int = 1,
                       threads: int = 1) -> Dict[str, int]:
    """Embeds every utterance of a data list into out_dir/embeddings.scp (Kaldi vectors,
    in nj parts that a rerun skips once done), and writes the per-speaker means
    (speaker_embeddings.{ark,scp}, from each entry's `spk`)."""
    import multiprocessing as mp

    import kaldiio
    from toolkit.data.datalist import DataList
    from toolkit.progress import Progress
    os.makedirs(out_dir, exist_ok=True)
    model_file = speaker_model_file(model_path)
    if not os.path.exists(list_path):
        raise MissingInputError(f"data list {list_path} not found")
    # What a finished part is made of: a rerun with another model, list or split into
    # parts must not keep embeddings of the old one.
    source = {"model_sha256": model_fingerprint(model_file),
              "data_list_sha256": sha256_file(list_path), "parts": nj}
    todo = [p for p in range(nj) if not _finished(out_dir, p, source)]
    if len(todo) < nj:
        logger.info("%s: %d of %d parts already extracted; extracting the other %d", out_dir,
                    nj - len(todo), nj, len(todo))
    jobs = [(model_file, list_path, out_dir, p, nj, threads, source) for p in todo]
    progress = Progress(len(jobs), "embedding parts", "parts")
    if len(jobs) > 1:
        with mp.get_context("fork").Pool(min(len(jobs), nj)) as pool:
            for part, n, bad in pool.imap_unordered(_extract_part, jobs):
                progress.update()
                logger.info("part %d: %d embeddings%s", part + 1, n,
                            f", skipped {', '.join(bad)}" if bad else "")
    else:
        for job in jobs:
            part, n, bad = _extract_part(job)
            progress.update()
            logger.info("part %d: %d embeddings%s", part + 1, n,
                        f", skipped {', '.join(bad)}" if bad else "")
    progress.close()
    lines = []
    for p in range(nj):
        with open(os.path.join(out_dir, f"embeddings.{p + 1}.scp"), encoding="utf-8") as f:
            lines += f.readlines()
    atomic_write_text(os.path.join(out_dir, "embeddings.scp"), "".join(sorted(lines)))
    vectors = kaldiio.load_scp(os.path.join(out_dir, "embeddings.scp"))
    datalist = DataList.load(list_path, require_label=False)
    by_spk: Dict[str, List[np.ndarray]] = {}
    for i in range(len(datalist)):
        e = datalist.entry(i)
        if e["key"] in vectors and e.get("spk"):
            by_spk.setdefault(e["spk"], []).append(np.asarray(vectors[e["key"]], np.float64))
    spk_ark = os.path.join(out_dir, "speaker_embeddings.ark")
    with kaldiio.WriteHelper(f"ark,scp:{spk_ark},{spk_ark[:-4]}.scp") as writer:
        for spk in sorted(by_spk):
            writer(spk, np.mean(by_spk[spk], axis=0).astype(np.float32))
    return {"utterances": len(lines), "speakers": len(by_spk)}


def write_cohort(speaker_scp: str, out_path: str) -> int:
    """The per-speaker mean embeddings of `speaker_scp` as an AS-Norm cohort: safetensors
    with one tensor `embeddings` (speakers x dim, unit rows) and the speaker names in its
    metadata; returns the number of speakers."""
    import kaldiio
    from safetensors.numpy import save_file
    vectors = kaldiio.load_scp(speaker_scp)
    names = sorted(vectors)
    if not names:
        raise DataError(f"{speaker_scp}: no speaker embeddings to make a cohort of")
    matrix = np.stack([np.asarray(vectors[n], np.float32) for n in names])
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True) + 1e-12
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = out_path + ".tmp"
    save_file({"embeddings": matrix}, tmp, metadata={"speakers": json.dumps(names)})
    os.replace(tmp, out_path)
    return len(names)
