"""Feature extraction into Kaldi archives, in parallel, one archive per job. Features a
model computes (a phone front end) carry that model's record in every entry
(`feat_frontend`), which `check_stored_features` compares with the model a config names."""
import json
import logging
import os

import numpy as np

from toolkit.data.audio import BadEntry
from toolkit.data.datalist import BadCounter, DataList, split_range
from toolkit.data.features import STORED_TAG
from toolkit.fileio import atomic_write_text
from toolkit.progress import parallel_map, tick

logger = logging.getLogger(__name__)


def perturbed_key(key: str, factor: float) -> str:
    """Kaldi's naming for speed-perturbed copies: sp0.9-<key>."""
    return f"sp{factor:g}-{key}"


def _speed_copy(processor, entry: dict, factor: float):
    """(entry, features) of `entry` played `factor` times faster (a new utterance)."""
    copy = dict(entry, key=perturbed_key(entry["key"], factor),
                duration=round(float(entry["duration"]) / factor, 4), speed=factor)
    if "spk" in entry:
        copy["spk"] = perturbed_key(str(entry["spk"]), factor)
    for name in ("kw_start", "kw_end"):      # keyword times shrink with the audio
        if isinstance(entry.get(name), (int, float)):
            copy[name] = round(float(entry[name]) / factor, 4)
    return copy, processor.features_at_speed(entry, factor)


def _job(args):
    list_path, out_dir, dataset_cfg, part, parts, speeds = args
    import kaldiio
    from toolkit.data.pipeline import FeaturePipeline
    datalist = DataList.load(list_path, require_label=False)
    processor = FeaturePipeline(dataset_cfg, seed=0, train=False)
    start, end = split_range(len(datalist), parts, part)
    tag = processor.extractor.stored_tag()

    def tagged(entry):
        entry = {k: v for k, v in entry.items() if k != STORED_TAG}
        return dict(entry, **{STORED_TAG: tag}) if tag else entry
    ark = os.path.join(out_dir, f"feats.{part + 1}.ark")
    scp = os.path.join(out_dir, f"feats.{part + 1}.scp")
    bad = BadCounter()
    lines = []
    with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}") as writer:
        for i in range(start, end):
            entry = datalist.entry(i)
            try:
                feats = processor.features(entry, epoch=0)
            except BadEntry as err:
                bad.add(err.reason, entry["key"], err.detail)
                continue
            writer(entry["key"], feats.astype(np.float32))
            lines.append(tagged(entry))
            tick()
            for factor in speeds:
                try:
                    copy, feats = _speed_copy(processor, entry, factor)
                except BadEntry as err:
                    bad.add(err.reason, perturbed_key(entry["key"], factor), err.detail)
                    continue
                writer(copy["key"], feats.astype(np.float32))
                lines.append(tagged(copy))
    return scp, lines, bad


def compute_features_for_list(list_path: str, out_dir: str, dataset_cfg, nj: int,
                              speed_copies=()) -> str:
    """`speed_copies`: factors (e.g. 0.9, 1.1) of speed-perturbed copies added beside each
    utterance, as Kaldi's 3-way speed perturbation of training data does: new voices
    (pitch and formants move with the speed) at the cost of features computed once."""
    speeds = [float(f) for f in speed_copies]
    bad_speeds = [f for f in speeds if f <= 0 or f == 1.0]
    if bad_speeds or len(set(speeds)) != len(speeds):
        raise ValueError(f"speed copies must be distinct positive factors other than 1: {speeds}")
    os.makedirs(out_dir, exist_ok=True)
    jobs = [(list_path, out_dir, dataset_cfg, p, max(1, nj), speeds) for p in range(max(1, nj))]
    total = len(DataList.load(list_path, require_label=False))
    results = parallel_map(_job, jobs, nj, total, f"features of {list_path}")
    feat_of = {}
    scp_lines = []
    bad = BadCounter()
    for scp, _, job_bad in results:
        bad.merge(job_bad)
        with open(scp, encoding="utf-8") as f:
            for line in f:
                key, location = line.rstrip("\n").split(" ", 1)
                feat_of[key] = os.path.abspath(location.split(":")[0]) + ":" + location.rsplit(":", 1)[1]
                scp_lines.append(f"{key} {feat_of[key]}\n")
    atomic_write_text(os.path.join(out_dir, "feats.scp"), "".join(sorted(scp_lines)))
    out_list = os.path.join(out_dir, "data.list")
    entries = []
    for _, lines, _ in results:
        for entry in lines:
            entry = dict(entry, feat=feat_of[entry["key"]])
            entries.append(json.dumps(entry, ensure_ascii=False))
    atomic_write_text(out_list, "".join(e + "\n" for e in entries))
    if bad.total():
        logger.warning("features: %d utterances skipped: %s", bad.total(), bad.summary())
    logger.info("wrote %s (%d utterances) and feats.scp", out_list, len(entries))
    return out_list


def check_stored_features(source, extractor, what: str) -> None:
    """Refuses (DataError naming `what`, the list) precomputed entries of a list whose
    features another model made than the one `extractor` runs (see FeatureExtractor.
    stored_tag); lists of audio, and feature types no model computes, pass. `source`: a
    toolkit.data.sources.DataSource (entries read through field_values)."""
    if extractor.stored_tag() is None or not source.has_features():
        return
    tags = source.field_values(STORED_TAG) or []
    feats = dict(source.field_values("feat") or [])
    for key, tag in tags:
        if feats.get(key) is not None:
            extractor.check_stored({"key": key, STORED_TAG: tag}, what)
