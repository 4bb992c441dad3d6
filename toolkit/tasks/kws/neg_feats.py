"""Features of the general negatives of a synthetic wake-word corpus, computed once per
front end and kept across keywords (compute_feats --neg-cache).

A data list whose data dir holds a negatives cache record (toolkit.tasks.kws.negatives:
the corpus took its general negatives from an entry of the negatives cache) takes those
utterances' features from an entry of <toolkit cache>/kws_negatives/feats: the features of
every general negative of that split of that entry, computed by the feature type of the
config (toolkit.entry_cache: keyed, locked, verified, published whole; built from the
negatives entry's WAVs when missing or damaged). Only the other utterances (the keyword's
own) are computed. The output is what compute_features_for_list writes (data.list in the
input's order, feats.scp, the archives), the cached archives hard-linked (or copied) into
the output dir as negcache.<name>.ark.

A features entry's key: the negatives entry (digest and content) and split, and everything
that decides the features of a WAV of a given key (feature_fingerprint): the sample rate
and channel, the feature section, the sha256 of the model files the feature type runs (a
phone front end's weights and config.json, not its name: another front end misses), and
the versions of the libraries that compute them. On use, the first cached utterances are
also computed again and compared, so that a change of code behind an unchanged key is
caught (the entry is then rebuilt).
"""
import json
import logging
import os
from dataclasses import asdict
from typing import Dict, List, Optional, Tuple

import numpy as np

from toolkit.data.datalist import DataList
from toolkit.data.features import STORED_TAG
from toolkit.data.features_store import compute_features_for_list
from toolkit.entry_cache import EntryCache, link_or_copy
from toolkit.fileio import atomic_write_text, sha256_file
from toolkit.tasks.kws.negatives import LENGTHS_NAME, cache_root, read_record, wav_path

logger = logging.getLogger(__name__)

INDEX_NAME = "index"            # `utt <archive>:<offset>` of every cached utterance
TAG_NAME = "tag.json"           # the feature type's record in each entry (STORED_TAG)
LINK_PREFIX = "negcache."       # the archives' names in an output dir
SPOT_CHECKS = 2                 # cached utterances computed again on use
TOLERANCE = 1e-4                # between a job's features and the parent's (thread counts)
LIBRARIES = {"fbank": ("kaldi-native-fbank", "numpy", "soundfile"),
             "phone_frontend": ("torch", "kaldi-native-fbank", "numpy", "soundfile"),
             "speech_embedding": ("onnxruntime", "numpy", "soundfile")}


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def feature_fingerprint(dataset_cfg) -> Optional[dict]:
    """What decides the features of a WAV and key under `dataset_cfg` (see the module
    docstring); None for a feature type this does not know (then nothing is cached)."""
    feature = dataset_cfg.feature
    if feature.type not in LIBRARIES:
        return None
    if feature.type == "phone_frontend":
        from toolkit.tasks.kws.frontend import DEFAULT_FRONTEND, frontend_files
        files = frontend_files(feature.frontend_model or DEFAULT_FRONTEND)
    elif feature.type == "speech_embedding":
        from toolkit.data.features import EMBEDDING_MODEL, MEL_MODEL, oww_model_path
        files = [oww_model_path(MEL_MODEL, feature.mel_model),
                 oww_model_path(EMBEDDING_MODEL, feature.embedding_model)]
    else:
        files = []
    return {"sample_rate": int(dataset_cfg.sample_rate), "channel": int(dataset_cfg.channel),
            "feature": asdict(feature),
            "model_files": [[os.path.basename(f), sha256_file(f)] for f in files],
            "libraries": {d: _version(d) for d in LIBRARIES[feature.type]}}


def _build(record: dict, dataset_cfg, nj: int, folder: str) -> None:
    """The features entry of `record`'s split: from the negatives entry's WAVs, verified
    and locked meanwhile."""
    audio = EntryCache(os.path.dirname(record["entry"]), "negatives cache entry")
    try:
        with open(os.path.join(record["entry"], "key.json"), encoding="utf-8") as f:
            key = json.load(f)
    except (OSError, ValueError) as err:
        raise _Unusable(f"the negatives cache entry {record['entry']} is unreadable ({err})")
    with audio.open(key, None) as entry:
        if entry is None or entry.content != record["content"]:
            raise _Unusable(f"the negatives cache entry {record['entry']} is gone or was made "
                            "again since stage 0")
        from toolkit.data import kaldi
        lengths = kaldi.read_table(os.path.join(entry.path, LENGTHS_NAME))
        rate = int(key["settings"]["sample_rate"])
        split = record["split"]
        utts = sorted(u for u in lengths if os.path.exists(wav_path(entry.path, split, u)))
        lst = os.path.join(folder, "negatives.list")
        atomic_write_text(lst, "".join(json.dumps({"key": u, "wav": wav_path(entry.path, split, u),
                                                   "duration": round(int(lengths[u]) / rate, 4)})
                                       + "\n" for u in utts))
        compute_features_for_list(lst, folder, dataset_cfg, nj)
    index, tag = {}, None
    with open(os.path.join(folder, "data.list"), encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            archive, offset = e["feat"].rsplit(":", 1)
            index[e["key"]] = f"{os.path.basename(archive)}:{offset}"
            tag = e.get(STORED_TAG)
    for name in os.listdir(folder):
        if not name.endswith(".ark"):
            os.unlink(os.path.join(folder, name))
    atomic_write_text(os.path.join(folder, INDEX_NAME), "".join(
        f"{k} {v}\n" for k, v in sorted(index.items())))
    atomic_write_text(os.path.join(folder, TAG_NAME), json.dumps(tag, sort_keys=True))


class _Unusable(Exception):
    """The cache cannot serve this list: its features are computed as without it."""


def _read_entry(path: str) -> Tuple[Dict[str, str], Optional[dict]]:
    from toolkit.data import kaldi
    index = kaldi.read_table(os.path.join(path, INDEX_NAME))
    with open(os.path.join(path, TAG_NAME), encoding="utf-8") as f:
        return index, json.load(f)


def _spot_check(args) -> Optional[str]:
    """Process body: the first utterance of `entries` whose features computed now differ
    from the cached ones, or None."""
    import kaldiio
    from toolkit.data.audio import BadEntry
    from toolkit.data.pipeline import evaluation_pipeline
    dataset_cfg, entries, path, index = args
    pipeline = evaluation_pipeline(dataset_cfg)
    for entry in entries:
        cached = kaldiio.load_mat(os.path.join(path, index[entry["key"]]))
        try:
            now = pipeline.features(entry, epoch=0)
        except BadEntry:
            return entry["key"]
        if cached.shape != now.shape or not np.allclose(cached, now, rtol=TOLERANCE,
                                                        atol=TOLERANCE):
            return entry["key"]
    return None


def _same_features(dataset_cfg, entries: List[dict], path: str, index: Dict[str, str],
                   nj: int) -> bool:
    """The first SPOT_CHECKS cached utterances of `entries`, computed again now, match the
    cached ones. Where the feature jobs run as forked processes (nj > 1) so does the check:
    a parent that ran torch can fork no more workers that do (libgomp hangs them)."""
    import multiprocessing
    todo = [e for e in entries if e["key"] in index][:SPOT_CHECKS]
    if not todo:
        return True
    if nj <= 1:
        differs = _spot_check((dataset_cfg, todo, path, index))
    else:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            differs = pool.apply(_spot_check, ((dataset_cfg, todo, path, index),))
    if differs is not None:
        logger.warning("negatives features cache %s: the features of %s computed now differ "
                       "from the cached ones (code or library changed?)", path, differs)
    return differs is None


def compute_features_cached(list_path: str, out_dir: str, dataset_cfg, nj: int,
                            speed_copies=()) -> str:
    """compute_features_for_list, the general negatives' features from the cache when the
    list's data dir records them (see the module docstring); the same output either way."""
    record = read_record(os.path.dirname(os.path.abspath(list_path)))
    fingerprint = feature_fingerprint(dataset_cfg) if record else None
    why = ("no negatives cache record beside it" if record is None else
           "speed copies are computed" if speed_copies else
           f"feature type {dataset_cfg.feature.type} is not cached" if fingerprint is None
           else "")
    if why:
        logger.info("features of %s: all computed (%s)", list_path, why)
        return compute_features_for_list(list_path, out_dir, dataset_cfg, nj, speed_copies)
    datalist = DataList.load(list_path, require_label=False)
    entries = [datalist.entry(i) for i in range(len(datalist))]
    wanted = set(record["utts"])
    mine = [e for e in entries if e["key"] in wanted and "start" not in e and "end" not in e]
    cache = EntryCache(os.path.join(cache_root(), "feats"), "negatives features cache entry")
    key = {"what": "features of the general negatives of a synthetic wake-word corpus",
           "negatives": {n: record[n] for n in ("digest", "content", "split")},
           "features": fingerprint}
    os.makedirs(out_dir, exist_ok=True)
    try:
        for attempt in range(2):
            with cache.open(key, lambda folder: _build(record, dataset_cfg, nj, folder)) as fe:
                index, tag = _read_entry(fe.path)
                if not _same_features(dataset_cfg, mine, fe.path, index, nj) and attempt == 0:
                    cache.discard(fe.path)
                    continue
                archives = sorted({v.rsplit(":", 1)[0] for v in index.values()})
                for name in archives:
                    link_or_copy(os.path.join(fe.path, name),
                                 os.path.join(out_dir, LINK_PREFIX + name))
                built = fe.built
                break
    except (_Unusable, OSError) as err:   # a cache must only ever cost the saving
        logger.warning("features of %s: all computed (%s)", list_path, err)
        return compute_features_for_list(list_path, out_dir, dataset_cfg, nj)
    cached = {e["key"]: index[e["key"]] for e in mine if e["key"] in index}
    logger.info("features of %s: %d general negatives from the cache (%s), %d computed",
                list_path, len(cached), "built now" if built else "cached",
                len(entries) - len(cached))
    return _merge(entries, cached, tag, out_dir, dataset_cfg, nj)


def _merge(entries: List[dict], cached: Dict[str, str], tag: Optional[dict], out_dir: str,
           dataset_cfg, nj: int) -> str:
    """Computes the entries not `cached` into `out_dir`, then writes data.list (the input's
    order) and feats.scp over them all, as compute_features_for_list does."""
    rest = [e for e in entries if e["key"] not in cached]
    computed: Dict[str, str] = {}
    scp_lines = []
    if rest:
        rest_list = os.path.join(out_dir, ".uncached.list")
        atomic_write_text(rest_list, "".join(json.dumps(e, ensure_ascii=False) + "\n"
                                             for e in rest))
        compute_features_for_list(rest_list, out_dir, dataset_cfg, nj)
        os.unlink(rest_list)
        with open(os.path.join(out_dir, "data.list"), encoding="utf-8") as f:
            computed = {json.loads(line)["key"]: line.rstrip("\n") for line in f}
        with open(os.path.join(out_dir, "feats.scp"), encoding="utf-8") as f:
            scp_lines = list(f)
    lines = []
    for entry in entries:
        key = entry["key"]
        if key in cached:
            archive, offset = cached[key].rsplit(":", 1)
            location = os.path.abspath(os.path.join(out_dir, LINK_PREFIX + archive)) + ":" + offset
            out = {k: v for k, v in entry.items() if k != STORED_TAG}
            out = dict(out, **{STORED_TAG: tag}) if tag else out
            lines.append(json.dumps(dict(out, feat=location), ensure_ascii=False))
            scp_lines.append(f"{key} {location}\n")
        elif key in computed:
            lines.append(computed[key])
    atomic_write_text(os.path.join(out_dir, "feats.scp"), "".join(sorted(scp_lines)))
    out_list = os.path.join(out_dir, "data.list")
    atomic_write_text(out_list, "".join(line + "\n" for line in lines))
    logger.info("wrote %s (%d utterances) and feats.scp", out_list, len(lines))
    return out_list
