"""Augmentation material written once per recipe, and test sets derived from a corpus.

* A room bank: image-method impulse responses (toolkit.data.rir) of small, medium and large
  rooms at several distances, `rirs.list` (JSON lines: key, wav, duration, the room).
* A noise bank: white, pink and brown noise and babble of 3-6 talkers taken from a speech
  list, `noise.list` (JSON lines with `kind`: noise | babble, the kinds that
  dataset.noise.snr_db_by_kind ranges name).
  Both feed the training pipeline's reverb.rir_list and noise.noise_list.
* Short noisy crops of a Kaldi data dir (`write_noisy_crops`): every utterance cut to a
  fixed length inside its speech, in noise at a drawn SNR, the same utterance ids and
  speakers, its trial lists copied: the condition a wake-word gate meets (about a second
  of keyword, often in noise).

Each writer compares a stamp of its arguments first and writes it last: a finished bank
of the same arguments is left alone, anything else is made again over its own files only.
Everything is seeded: the same arguments give the same files.
"""
import json
import logging
import os
import shutil
from typing import Dict, List, Sequence, Tuple

import numpy as np
import soundfile as sf

from toolkit.data import kaldi
from toolkit.data.datalist import write_datalist
from toolkit.errors import DataError
from toolkit.fileio import atomic_write_text
from toolkit.voicebank.signal import active_power, background_noise, colored_noise

logger = logging.getLogger(__name__)

COLORS = ("white", "pink", "brown")


def _stamp_path(out_dir: str, stamp: dict) -> str:
    """Each writer's own stamp: a room bank and a noise bank may share a folder."""
    return os.path.join(out_dir, f".{stamp['kind']}_stamp.json")


def _finished(out_dir: str, stamp: dict) -> bool:
    path = _stamp_path(out_dir, stamp)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f) == stamp
    except (OSError, ValueError):
        return False


def _claim(out_dir: str, stamp: dict, names: Sequence[str]) -> None:
    """Removes this writer's own earlier output (named folders and lists, its stamp) and
    nothing else in `out_dir`. Files of those names without this writer's stamp beside
    them are someone else's: refused, nothing touched."""
    os.makedirs(out_dir, exist_ok=True)
    if not os.path.exists(_stamp_path(out_dir, stamp)):
        foreign = [n for n in names if os.path.exists(os.path.join(out_dir, n))]
        if foreign:
            raise DataError(f"{out_dir} holds {', '.join(foreign)} that this writer did not "
                            "write (no stamp of it there): give another output folder")
    for path in [os.path.join(out_dir, n) for n in names] + [_stamp_path(out_dir, stamp)]:
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)


def _finish(out_dir: str, stamp: dict) -> None:
    atomic_write_text(_stamp_path(out_dir, stamp), json.dumps(stamp, sort_keys=True) + "\n")


def _write_wav(path: str, wave: np.ndarray, rate: int) -> float:
    sf.write(path, np.clip(wave, -1.0, 1.0), rate, subtype="PCM_16")
    return len(wave) / rate


def write_rir_bank(out_dir: str, num: int, seed: int, rate: int = 16000) -> str:
    """`num` impulse responses, a third of the rooms each small, medium and large; returns
    the path of rirs.list."""
    from toolkit.data.rir import ROOM_SIZES, image_method_rir, random_room
    stamp = {"kind": "rirs", "num": num, "seed": seed, "rate": rate}
    out_list = os.path.join(out_dir, "rirs.list")
    if _finished(out_dir, stamp):
        logger.info("%s: the room bank is there (%d rooms)", out_dir, num)
        return out_list
    _claim(out_dir, stamp, ["rirs", "rirs.list"])
    os.makedirs(os.path.join(out_dir, "rirs"))
    rng = np.random.default_rng([seed, 1])
    kinds = sorted(ROOM_SIZES)
    entries = []
    for i in range(num):
        room = random_room(rng, kinds[i % len(kinds)])
        rir = image_method_rir(room, rate, length_s=min(1.2, 1.2 * room.rt60 + 0.05))
        key = f"rir_{kinds[i % len(kinds)]}_{i:05d}"
        wav = os.path.join(out_dir, "rirs", key + ".wav")
        entries.append({"key": key, "wav": os.path.abspath(wav),
                        "duration": round(_write_wav(wav, rir, rate), 4),
                        "room": room.describe()})
    write_datalist(out_list, entries)
    _finish(out_dir, stamp)
    logger.info("%s: %d room impulse responses", out_list, num)
    return out_list


def write_noise_bank(out_dir: str, num: int, seconds: float, seed: int,
                     babble_list: str = "", rate: int = 16000, babble_pool: int = 200) -> str:
    """`num` noise clips of `seconds`: coloured noise (kind noise) and, with `babble_list`
    (a data list of speech), babble of its talkers (kind babble), half each. Returns the
    path of noise.list."""
    from toolkit.data.audio import BadEntry
    from toolkit.data.augment import load_mono
    from toolkit.data.datalist import DataList
    stamp = {"kind": "noise", "num": num, "seconds": seconds, "seed": seed, "rate": rate,
             "babble_list": os.path.abspath(babble_list) if babble_list else "",
             "babble_pool": babble_pool}
    out_list = os.path.join(out_dir, "noise.list")
    if _finished(out_dir, stamp):
        logger.info("%s: the noise bank is there (%d clips)", out_dir, num)
        return out_list
    rng = np.random.default_rng([seed, 2])
    pool: List[np.ndarray] = []
    if babble_list:
        speech = DataList.load(babble_list, require_label=False)
        if len(speech) == 0:
            raise DataError(f"{babble_list}: no speech to make babble of")
        for i in rng.permutation(len(speech))[:babble_pool]:
            try:
                pool.append(load_mono(speech.entry(int(i))["wav"], rate))
            except BadEntry as err:
                logger.warning("%s: babble source skipped: %s", babble_list, err)
        if not pool:
            raise DataError(f"{babble_list}: none of its audio could be read for babble")
    _claim(out_dir, stamp, ["noise", "noise.list"])
    os.makedirs(os.path.join(out_dir, "noise"))
    n = int(round(seconds * rate))
    entries = []
    for i in range(num):
        if pool and i % 2 == 1:
            kind, name, wave = "babble", "babble", background_noise(n, "babble", rng, rate, pool)
        else:
            name = COLORS[(i // (2 if pool else 1)) % len(COLORS)]
            kind, wave = "noise", colored_noise(n, name, rng, rate)
        key = f"noise_{name}_{i:05d}"
        wav = os.path.join(out_dir, "noise", key + ".wav")
        entries.append({"key": key, "wav": os.path.abspath(wav),
                        "duration": round(_write_wav(wav, 0.25 * wave, rate), 4), "kind": kind})
    write_datalist(out_list, entries)
    _finish(out_dir, stamp)
    logger.info("%s: %d noise clips (%s)", out_list, num, "coloured and babble" if pool else "coloured")
    return out_list


def speech_span(wave: np.ndarray, rate: int, floor_db: float = 30.0) -> Tuple[int, int]:
    """First and last sample of the 20 ms frames within `floor_db` of the active level: the
    utterance without its leading and trailing silence."""
    frame = rate // 50
    count = len(wave) // frame
    if count == 0:
        return 0, len(wave)
    power = np.mean(wave[:count * frame].astype(np.float64).reshape(count, frame) ** 2, axis=1)
    level = active_power(wave)
    loud = np.flatnonzero(power >= level * 10 ** (-floor_db / 10)) if level > 0 else []
    if len(loud) == 0:
        return 0, len(wave)
    return int(loud[0] * frame), int(min(len(wave), (loud[-1] + 1) * frame))


def noisy_crop(wave: np.ndarray, rate: int, seconds: float, noise_kind: str, snr_db: float,
               rng: np.random.Generator) -> np.ndarray:
    """A `seconds` crop at a random place inside the speech (the whole speech, padded with
    silence, when it is shorter), in `noise_kind` noise at `snr_db` against the crop's
    active speech level."""
    n = int(round(seconds * rate))
    lo, hi = speech_span(wave, rate)
    if hi - lo >= n:
        start = int(rng.integers(lo, hi - n + 1))
        crop = wave[start:start + n].astype(np.float32)
    else:
        crop = np.zeros(n, np.float32)
        offset = int(rng.integers(0, n - (hi - lo) + 1))
        crop[offset:offset + hi - lo] = wave[lo:hi]
    noise = colored_noise(n, noise_kind, rng, rate)
    gain = np.sqrt(active_power(crop) / 10 ** (snr_db / 10))
    mixed = crop + gain * noise
    peak = float(np.max(np.abs(mixed)))
    return (mixed * (0.95 / peak) if peak > 0.95 else mixed).astype(np.float32)


def write_noisy_crops(in_dir: str, out_dir: str, seconds: float, noise_kinds: Sequence[str],
                      snr_db: Tuple[float, float], seed: int) -> Dict[str, int]:
    """A Kaldi data dir of `in_dir`'s utterances as noisy crops (same ids, utt2spk and any
    trials* lists); the noise kind and SNR of each crop in `utt2noise`."""
    from toolkit.data.audio import BadEntry
    from toolkit.data.augment import load_mono
    for kind in noise_kinds:
        if kind not in COLORS:
            raise DataError(f"noise kind {kind!r}: expected some of {', '.join(COLORS)}")
    stamp = {"kind": "crops", "in_dir": os.path.abspath(in_dir), "seconds": seconds,
             "noise": list(noise_kinds), "snr_db": list(snr_db), "seed": seed}
    if _finished(out_dir, stamp):
        logger.info("%s: the crops are there", out_dir)
        return {}
    if os.path.abspath(in_dir) == os.path.abspath(out_dir):
        raise DataError(f"{out_dir}: the crops need a folder of their own, not their source's")
    wav_scp = kaldi.read_table(os.path.join(in_dir, "wav.scp"))
    utt2spk = kaldi.read_table(os.path.join(in_dir, "utt2spk"))
    trials = sorted(f for f in os.listdir(in_dir) if f.startswith("trials"))
    _claim(out_dir, stamp, ["wavs", "wav.scp", "utt2spk", "spk2utt", "utt2noise", "utt2dur"] + trials)
    os.makedirs(os.path.join(out_dir, "wavs"))
    rate = 16000
    scp, noise_of, skipped = {}, {}, 0
    for key in sorted(wav_scp):
        rng = np.random.default_rng([seed, *key.encode("utf-8")])
        try:
            wave = load_mono(wav_scp[key], rate)
        except BadEntry as err:
            logger.warning("%s: %s skipped: %s", in_dir, key, err)
            skipped += 1
            continue
        kind = str(noise_kinds[int(rng.integers(len(noise_kinds)))])
        snr = float(rng.uniform(*snr_db))
        path = os.path.abspath(os.path.join(out_dir, "wavs", key + ".wav"))
        _write_wav(path, noisy_crop(wave, rate, seconds, kind, snr, rng), rate)
        scp[key] = path
        noise_of[key] = f"{kind} {snr:.1f}"
    spk = {k: utt2spk[k] for k in scp if k in utt2spk}
    kaldi.write_table(os.path.join(out_dir, "wav.scp"), scp)
    kaldi.write_table(os.path.join(out_dir, "utt2spk"), spk)
    kaldi.write_table(os.path.join(out_dir, "spk2utt"), kaldi.spk2utt_of(spk))
    kaldi.write_table(os.path.join(out_dir, "utt2noise"), noise_of)
    for name in trials:
        shutil.copyfile(os.path.join(in_dir, name), os.path.join(out_dir, name))
    _finish(out_dir, stamp)
    logger.info("%s: %d crops of %.2f s (%d skipped)", out_dir, len(scp), seconds, skipped)
    return {"crops": len(scp), "skipped": skipped}
