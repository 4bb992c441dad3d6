"""Condition copies of a Kaldi data dir: every utterance once, under one seeded random chain
of channel conditions (toolkit.voicebank.channel: room, noise, telephone, Codec2, Opus,
microphone colouring, clipping), with the same utterance ids, speakers and texts, so that
targets derived from the text stay valid.

  write_condition_copy("data/train", "data/train_cond", seed=1234, nj=2)

writes data/train_cond/{wav.scp, text, utt2spk, spk2utt, utt2dur, utt2cond} and the 16-bit
WAVs under data/train_cond/wavs/ (at each source file's rate; `utt2cond` names each
utterance's chain, e.g. `room:medium/2.1m+noise:babble/8.3dB+codec2:1600`).

Determinism. Each utterance draws its chain from a generator seeded by (seed, crc32 of its
id, 0) and its noise samples from (seed, crc32, 1); babble talks with up to 6 other
utterances of the dir drawn by (seed, crc32, 2). Groups of GROUP_SIZE utterances (sorted
ids) run in freshly forked children (toolkit.voicebank.pool), at most `nj` at once: the
files are byte-identical for any `nj` and any order.

Safety. A stamp (`.conditions_stamp.json`: the source dir, a digest of its tables, the
seed, the settings) is compared first and written last, marked unfinished at the start:
  * a finished copy of the same arguments is left alone;
  * an unfinished one of the same arguments (a killed run) resumes: every WAV is written to
    a temporary name and renamed, so the WAVs there are whole and are kept; the rest are
    made;
  * a copy of other arguments is removed first: its tables, stamp and the WAVs under wavs/
    (nothing else there);
  * a folder with these names and no stamp of this writer is refused, nothing touched.
An unreadable source WAV is logged and skipped; more than 1 % skipped is an error (the
stamp stays unfinished; a rerun resumes).
"""
import hashlib
import json
import logging
import os
import shutil
import time
import zlib
from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from toolkit.data import kaldi
from toolkit.errors import DataError
from toolkit.fileio import atomic_write_text
from toolkit.voicebank.channel import ConditionSettings, apply_chain, sample_chain, settings_dict

logger = logging.getLogger(__name__)

STAMP_NAME = ".conditions_stamp.json"
WAVS_NAME = "wavs"
TMP_NAME = ".conditions_tmp"
TABLES = ("wav.scp", "text", "utt2spk", "spk2utt", "utt2dur", "utt2cond")
SOURCE_TABLES = ("wav.scp", "segments", "utt2spk", "text")
GROUP_SIZE = 8                 # utterances per forked child (fixed: the output never depends on it)
BABBLE_TALKERS = 6             # other utterances a babble noise is drawn from
MAX_SKIPPED = 0.01             # fraction of unreadable utterances tolerated
FORMAT = 1                     # bump when the same arguments would give other files


def utterance_rngs(seed: int, key: str) -> Tuple[np.random.Generator, ...]:
    """(chain, noise samples, babble talkers) generators of one utterance."""
    crc = zlib.crc32(key.encode("utf-8"))
    return tuple(np.random.default_rng([int(seed), crc, stream]) for stream in range(3))


def _digest(src_dir: str) -> str:
    h = hashlib.sha256()
    for name in SOURCE_TABLES:
        path = os.path.join(src_dir, name)
        if os.path.exists(path):
            h.update(name.encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def _read_stamp(out_dir: str) -> Optional[dict]:
    try:
        with open(os.path.join(out_dir, STAMP_NAME), encoding="utf-8") as f:
            stamp = json.load(f)
        return stamp if isinstance(stamp, dict) else None
    except (OSError, ValueError):
        return None


def _write_stamp(out_dir: str, stamp: dict, finished: bool) -> None:
    atomic_write_text(os.path.join(out_dir, STAMP_NAME),
                      json.dumps({**stamp, "finished": finished}, sort_keys=True) + "\n")


def _is_own_wav(name: str) -> bool:
    return name.endswith(".wav") or name.startswith(".tmp-")


def _remove_own(out_dir: str, keep_wavs: bool) -> None:
    """This writer's files in `out_dir`: the tables and the temporary dir, and (unless
    `keep_wavs`) its WAVs and the stamp; temporary WAVs always. Nothing else."""
    for name in TABLES:
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            os.remove(path)
    shutil.rmtree(os.path.join(out_dir, TMP_NAME), ignore_errors=True)
    wavs = os.path.join(out_dir, WAVS_NAME)
    if os.path.isdir(wavs):
        for name in os.listdir(wavs):
            if name.startswith(".tmp-") or (not keep_wavs and _is_own_wav(name)):
                os.remove(os.path.join(wavs, name))
        if not keep_wavs and not os.listdir(wavs):
            os.rmdir(wavs)
    if not keep_wavs and os.path.exists(os.path.join(out_dir, STAMP_NAME)):
        os.remove(os.path.join(out_dir, STAMP_NAME))


def _complete(out_dir: str) -> bool:
    """Every table but text (a source may have none) and every WAV wav.scp lists exist."""
    if not all(os.path.exists(os.path.join(out_dir, n)) for n in TABLES if n != "text"):
        return False
    return all(os.path.exists(p) for p in
               kaldi.read_table(os.path.join(out_dir, "wav.scp")).values())


def _sources(src_dir: str) -> Dict[str, Tuple[str, float, float]]:
    """utt -> (audio source, start s, end s or -1): wav.scp, through segments when there."""
    wav_scp = kaldi.read_table(os.path.join(src_dir, "wav.scp"))
    segments = kaldi.read_table(os.path.join(src_dir, "segments"), required=False)
    if not segments:
        return {k: (v, 0.0, -1.0) for k, v in wav_scp.items()}
    out = {}
    for utt, value in segments.items():
        parts = value.split()
        try:
            reco, start, end = parts[0], float(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            raise DataError(f"{src_dir}/segments: {utt}: expected `<recording> <start> "
                            f"<end>`, got {value!r}") from None
        if reco not in wav_scp:
            raise DataError(f"{src_dir}/segments: {utt}: recording {reco} not in wav.scp")
        out[utt] = (wav_scp[reco], start, end)
    return out


def _load(source: Tuple[str, float, float]) -> Tuple[np.ndarray, int]:
    from toolkit.data.audio import check_and_mix, read_audio
    audio, rate = read_audio(*source)
    return check_and_mix(audio, source[0]), rate


def _render_one(key: str, keys: Sequence[str], sources: Dict, seed: int,
                settings: ConditionSettings, wav_dir: str
                ) -> Tuple[str, Optional[int], int, str, str]:
    """(key, samples or None, rate, chain label, why skipped) of one utterance; its WAV written
    (temporary name, then renamed) unless a whole one is there already."""
    import soundfile as sf
    from toolkit.data.audio import BadEntry
    from toolkit.voicebank.signal import pcm16, peak_gain
    chain_rng, noise_rng, babble_rng = utterance_rngs(seed, key)
    path = os.path.join(wav_dir, key + ".wav")
    if os.path.exists(path):                         # written whole by an earlier run
        info = sf.info(path)
        chain = sample_chain(chain_rng, settings, info.samplerate, babble=len(keys) > 1)
        return key, int(info.frames), int(info.samplerate), chain.label, ""
    try:
        wave, rate = _load(sources[key])
    except BadEntry as err:
        return key, None, 0, "", str(err)
    chain = sample_chain(chain_rng, settings, rate, babble=len(keys) > 1)
    pool: List[np.ndarray] = []
    noise = chain.step("noise")
    if noise is not None and noise.params["kind"] == "babble":
        others = [k for k in keys if k != key]
        picks = babble_rng.choice(len(others), min(BABBLE_TALKERS, len(others)), replace=False)
        for i in sorted(int(i) for i in picks):
            try:
                other, other_rate = _load(sources[others[i]])
            except BadEntry:
                continue
            if other_rate != rate:
                from toolkit.data.audio import resample
                other = resample(other, other_rate, rate)
            pool.append(other)
        if not pool:
            return key, None, 0, "", "babble: none of the other utterances drawn could be read"
    out = apply_chain(wave, rate, chain, noise_rng, pool)
    tmp = os.path.join(wav_dir, f".tmp-{key}.wav")
    sf.write(tmp, pcm16(out * peak_gain(out)), rate, subtype="PCM_16")
    os.replace(tmp, path)
    return key, len(out), rate, chain.label, ""


def write_condition_copy(src_dir: str, out_dir: str, seed: int, nj: int = 1,
                         settings: ConditionSettings = ConditionSettings()) -> Dict:
    """The condition copy of `src_dir` in `out_dir` (see the module's docstring). Returns a
    summary: utts, skipped, hours, seconds, and how many utterances took each condition."""
    settings.check()
    if seed < 0:
        raise DataError(f"seed {seed}: must be >= 0")
    if os.path.abspath(src_dir) == os.path.abspath(out_dir):
        raise DataError(f"{out_dir}: the copy needs a folder of its own, not its source's")
    sources = _sources(src_dir)                   # MissingInputError names a missing wav.scp
    utt2spk = kaldi.read_table(os.path.join(src_dir, "utt2spk"))
    text = kaldi.read_table(os.path.join(src_dir, "text"), required=False)
    keys = sorted(sources, key=kaldi.c_order)
    if not keys:
        raise DataError(f"{src_dir}/wav.scp: no utterances")
    bad = [k for k in keys if "/" in k or k.startswith(".")]
    if bad:
        raise DataError(f"{src_dir}: utterance id {bad[0]!r} cannot name a file")
    missing = [k for k in keys if k not in utt2spk]
    if missing:
        raise DataError(f"{src_dir}/utt2spk: no speaker for {missing[0]} "
                        f"({len(missing)} utterances); {kaldi.FIX_HINT.format(dir=src_dir)}")
    stamp = {"kind": "conditions", "format": FORMAT, "src": os.path.abspath(src_dir),
             "source_tables": _digest(src_dir), "seed": int(seed),
             "settings": settings_dict(settings)}
    old = _read_stamp(out_dir)
    if old == {**stamp, "finished": True} and _complete(out_dir):
        logger.info("%s: the condition copy of %s is there; nothing to do", out_dir, src_dir)
        summary = summarize(out_dir)
        return {**summary, "skipped": len(keys) - summary["utts"]}
    if old is None:
        foreign = [n for n in TABLES + (WAVS_NAME,) if os.path.exists(os.path.join(out_dir, n))]
        if foreign:
            raise DataError(f"{out_dir} holds {', '.join(foreign)} that this writer did not "
                            f"write (no {STAMP_NAME} there): give another output folder")
    resume = old is not None and {k: v for k, v in old.items() if k != "finished"} == stamp
    if old is not None:
        _remove_own(out_dir, keep_wavs=resume)
        logger.info("%s: %s", out_dir, "resuming (the whole WAVs there are kept)" if resume
                    else "made with other arguments: its files are removed and made again")
    os.makedirs(out_dir, exist_ok=True)
    _write_stamp(out_dir, stamp, finished=False)
    wav_dir = os.path.abspath(os.path.join(out_dir, WAVS_NAME))
    tmp_dir = os.path.join(out_dir, TMP_NAME)
    os.makedirs(wav_dir, exist_ok=True)
    os.makedirs(tmp_dir, exist_ok=True)
    groups = [keys[i:i + GROUP_SIZE] for i in range(0, len(keys), GROUP_SIZE)]

    def render(group):
        from toolkit.voicebank.pool import single_thread_blas
        single_thread_blas()
        return [_render_one(k, keys, sources, seed, settings, wav_dir) for k in group]

    from toolkit.voicebank.pool import run_forked
    t0 = time.time()
    logger.info("%s: %d utterances in %d groups, nj=%d", src_dir, len(keys), len(groups), nj)
    results = [r for res in run_forked(render, groups, nj, tmp_dir) for r in res]
    shutil.rmtree(tmp_dir, ignore_errors=True)
    skipped = [(k, why) for k, n, _, _, why in results if n is None]
    for key, why in skipped:
        logger.warning("%s: %s skipped: %s", src_dir, key, why)
    if len(skipped) > MAX_SKIPPED * len(keys):
        raise DataError(f"{src_dir}: {len(skipped)} of {len(keys)} utterances could not be "
                        f"read (more than {100 * MAX_SKIPPED:g} %), e.g. {skipped[0][0]}: "
                        f"{skipped[0][1]}; the WAVs made so far are kept for a rerun")
    done = [r for r in results if r[1] is not None]
    tables = {"wav.scp": {k: os.path.join(wav_dir, k + ".wav") for k, *_ in done},
              "utt2spk": {k: utt2spk[k] for k, *_ in done},
              "utt2dur": {k: f"{n / rate:.3f}" for k, n, rate, _, _ in done},
              "utt2cond": {k: label for k, _, _, label, _ in done}}
    if text:
        tables["text"] = {k: text[k] for k, *_ in done if k in text}
    kaldi.write_data_dir(out_dir, tables)
    _write_stamp(out_dir, stamp, finished=True)
    summary = summarize(out_dir)
    logger.info("%s: %d utterances (%.2f h) in %.1f s, %d skipped; conditions %s", out_dir,
                summary["utts"], summary["hours"], time.time() - t0, len(skipped),
                summary["conditions"])
    return {**summary, "skipped": len(skipped)}


def summarize(out_dir: str) -> Dict:
    """utts, hours and how many utterances took each kind of condition (room, noise, ...,
    clean) in a finished copy."""
    durations = kaldi.read_table(os.path.join(out_dir, "utt2dur"))
    labels = kaldi.read_table(os.path.join(out_dir, "utt2cond"))
    kinds = Counter(step.split(":")[0] for label in labels.values() for step in label.split("+"))
    hours = sum(float(v) for v in durations.values()) / 3600
    return {"utts": len(labels), "hours": round(hours, 4),
            "conditions": dict(sorted(kinds.items()))}
