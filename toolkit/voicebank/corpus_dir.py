"""What every synthetic TTS corpus writes alike: its groups rendered in forked children,
and its output directory (toolkit.voicebank.corpus: engines, reserved voices, voice
splits).

Rendering. libespeak-ng keeps waveform state from one utterance to the next and nothing
resets it, so a corpus is planned in the parent (every random choice but the noise
samples) as fixed `Group`s whose composition does not depend on the number of jobs, and
`CorpusDir.render` renders each group in a freshly forked child that loads the engines
itself (toolkit.voicebank.pool): the files are byte-identical for any `nj`. The parent never
loads espeak-ng.

Output directory (`CorpusDir`). The stamp (the arguments, engines, voices and engine
versions, as JSON) is compared first and written last: a complete corpus of the same
arguments is left alone; otherwise what the old stamp says the generator wrote, and only
that, is removed and made again. A run claims the directory (its stamp, marked unfinished)
before it removes or writes anything. A test-only corpus and a full one never share a
directory (their test splits would be the same files): a run into a directory holding a
finished corpus of the other kind, or files no stamp of this generator accounts for, is
refused and nothing there is touched. Every corpus has one voice inventory, `voices.tsv`:
each voice that speaks, with its split, engine, engine voice, blend weights and engine
version.
"""
import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from toolkit.data import kaldi
from toolkit.fileio import atomic_write_text
from toolkit.progress import Progress
from toolkit.voicebank import SynthError, Voice, seeded_rng
from toolkit.voicebank.corpus import SPLITS
from toolkit.voicebank.pool import run_forked, single_thread_blas
from toolkit.voicebank.render import Renderer

logger = logging.getLogger(__name__)

INVENTORY_NAME = "voices.tsv"
INVENTORY_COLUMNS = ("speaker", "split", "engine", "voice", "blend", "engine_version")
WAVS_NAME = "wavs"
TMP_NAME = ".synth_tmp"
# A claim (the stamp a run writes before anything else) carries FINISHED: False; a stamp
# without the key is a finished corpus's (written last, and by older versions).
FINISHED = "finished"


# --------------------------------------------------------------------------------------
# Groups and their rendering
# --------------------------------------------------------------------------------------

@dataclass
class Group:
    """A fixed run of planned utterances rendered in one fresh child: `seed` seeds the
    child's generator (noise samples, TTS seeds); `babble` is spoken first, as noise."""
    split: str
    index: int
    seed: Tuple[int, ...]
    specs: List
    babble: List = field(default_factory=list)


# Child body: (group, renderer, the group's generator) -> what the parent collects.
GroupBody = Callable[[Group, Renderer, np.random.Generator], object]


# --------------------------------------------------------------------------------------
# The output directory
# --------------------------------------------------------------------------------------

class CorpusDir:
    """One generator's output directory: `stamp_name` (the generator's stamp), `owned`
    (every other name it writes in it, whatever this run's options: a name that is a split
    or starts with `<split>_` belongs to that split, the rest to every corpus), and what
    every generator writes besides: the WAVs under wavs/<owned data dir>, the inventory, a
    temporary dir.

    The stamp is the directory's title deed: only what a stamp of this generator says was
    written (a full corpus: every split; a test-only one: the test split) is ever removed.
    A run claims the directory by writing its stamp marked unfinished before it removes or
    writes anything, so that an interrupted run is cleaned up by the next one; a directory
    whose files no stamp of this generator accounts for, or that holds a finished corpus of
    the other kind (full or test-only), is refused, not emptied."""

    def __init__(self, path: str, stamp_name: str, owned: Sequence[str]):
        self.path = path
        self.abspath = os.path.abspath(path)
        self.stamp_name = stamp_name
        self.owned = tuple(owned)

    def written_names(self) -> Tuple[str, ...]:
        return (self.stamp_name, INVENTORY_NAME, WAVS_NAME, TMP_NAME) + self.owned

    def wav_dir(self, name: str) -> str:
        return os.path.join(self.abspath, WAVS_NAME, name)

    def is_complete(self, config: dict, required: Mapping[str, Sequence[str]]) -> bool:
        """The stamp equals `config`, the inventory and every `required` file (dir ->
        names) exist, and so does every WAV each required wav.scp lists."""
        try:
            with open(os.path.join(self.path, self.stamp_name), encoding="utf-8") as f:
                if json.load(f) != config:
                    return False
            if not os.path.exists(os.path.join(self.path, INVENTORY_NAME)):
                return False
            for folder, names in required.items():
                d = os.path.join(self.path, folder)
                if not all(os.path.exists(os.path.join(d, n)) for n in names):
                    return False
                if "wav.scp" in names:
                    with open(os.path.join(d, "wav.scp"), encoding="utf-8") as f:
                        if not all(os.path.exists(line.split(maxsplit=1)[1].strip())
                                   for line in f):
                            return False
        except (OSError, ValueError, IndexError):
            return False
        return True

    def read_stamp(self) -> Optional[dict]:
        """The stamp in the directory (a claim carries FINISHED: False), None when there
        is none; SynthError naming it when it cannot be read, as then nothing tells what
        the directory holds."""
        path = os.path.join(self.path, self.stamp_name)
        if not os.path.lexists(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                stamp = json.load(f)
            if not isinstance(stamp, dict):
                raise ValueError(f"a JSON {type(stamp).__name__}, not an object")
        except (OSError, ValueError) as err:
            raise SynthError(f"{path}: unreadable stamp ({err}): what {self.path} holds is "
                             f"unknown, so nothing there is removed; remove the corpus "
                             f"yourself or choose another --out-dir") from None
        return stamp

    def _split_names(self, test_only: bool) -> Tuple[List[str], List[str]]:
        """(top-level names, wavs/ subdirs) a corpus of that kind writes, stamp last."""
        splits = ("test",) if test_only else SPLITS
        owned = [n for n in self.owned
                 if _split_of(n) is None or _split_of(n) in splits]
        data_dirs = [n for n in owned if _split_of(n) is not None]
        return [INVENTORY_NAME, TMP_NAME] + owned + [WAVS_NAME, self.stamp_name], data_dirs

    def _present(self, names: Iterable[str]) -> List[str]:
        """`names` that exist here, dirs written with a slash."""
        return [n + ("/" if os.path.isdir(os.path.join(self.path, n)) else "")
                for n in names if os.path.lexists(os.path.join(self.path, n))]

    def clean(self) -> None:
        """Removes what the stamp here says this generator wrote (later stages' files in its
        data dirs too, which would be stale): every split's names for a full corpus, the
        test split's for a test-only one; the stamp itself last, so that a removal cut short
        is finished by the next run. Nothing without a stamp; never wavs/ entries or files
        the stamp does not account for."""
        stamp = self.read_stamp()
        if stamp is None:
            return
        names, wav_dirs = self._split_names(bool(stamp.get("test_only", False)))
        for name in wav_dirs:
            _remove(self.wav_dir(name))
        for name in names:
            p = os.path.join(self.path, name)
            if name == WAVS_NAME:       # removed once nothing else is left in it
                if os.path.isdir(p) and not os.path.islink(p) and not os.listdir(p):
                    os.rmdir(p)
            else:
                _remove(p)

    def claim(self, config: dict) -> None:
        """Makes the directory this request's before anything is written: refuses (one
        SynthError line naming the directory and what it holds) a finished corpus of the
        other kind, and any name this request writes that the stamp here does not account
        for (all of them without a stamp); else cleans what the stamp says was written and
        writes `config` marked unfinished."""
        stamp = self.read_stamp()
        test_only = bool(config.get("test_only", False))
        stamped_test_only = stamp is not None and bool(stamp.get("test_only", False))
        if stamp is not None and stamp.get(FINISHED, True) and stamped_test_only != test_only:
            held = ", ".join(self._present(self._split_names(stamped_test_only)[0]))
            harm = ("--test-only there would overwrite its test split and remove its train and "
                    "dev splits; give --test-only an --out-dir of its own" if test_only else
                    "a full corpus there would remove it; give the full corpus an --out-dir "
                    "of its own")
            raise SynthError(f"{self.path} holds a finished "
                             f"{'test-only' if stamped_test_only else 'full'} corpus ({held}): "
                             f"{harm}")
        names, wav_dirs = self._split_names(test_only)
        ours, our_wavs = self._split_names(stamped_test_only) if stamp is not None else ([], [])
        in_the_way = self._present(
            [n for n in names if n not in ours and n not in (WAVS_NAME, self.stamp_name)] +
            [os.path.join(WAVS_NAME, d) for d in wav_dirs if d not in our_wavs])
        if in_the_way:
            if stamp is None:
                others = sorted(n for n in (os.listdir(self.path) if os.path.isdir(self.path)
                                            else ()) if re.fullmatch(r"\.synth_.*\.json", n))
                whose = f"no {self.stamp_name}" + (
                    f" (it has {', '.join(others)}: another generator's corpus)" if others else "")
            else:
                whose = f"{self.stamp_name} does not account for them"
            raise SynthError(
                f"{self.path} holds {', '.join(in_the_way)} but {whose}: they are not a corpus "
                f"this generator wrote, so they are left alone; give this corpus an --out-dir "
                f"of its own, or remove them first")
        self.clean()
        os.makedirs(self.path, exist_ok=True)
        atomic_write_text(os.path.join(self.path, self.stamp_name),
                          _stamp_text({**config, FINISHED: False}))

    @contextlib.contextmanager
    def workspace(self, config: dict) -> Iterator[str]:
        """Claims the directory for a corpus of `config` (claim) and yields a temporary dir
        inside it (planning probes, private espeak-ng data), removed afterwards whatever
        happens. A run that fails in here removes what it wrote, claim included (none of it
        would be kept), and the directory itself when this run made it and it is left
        empty; one killed leaves its claim, and the next run removes the rest."""
        made_here = not os.path.lexists(self.path)
        self.claim(config)
        tmp_dir = os.path.join(self.abspath, TMP_NAME)
        failed = False
        try:
            os.makedirs(tmp_dir)
            yield tmp_dir
        except BaseException:
            failed = True
            with contextlib.suppress(OSError, SynthError):     # the first error is the one
                self.clean()
            raise
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            if failed and made_here:
                with contextlib.suppress(OSError):            # not empty: left as it is
                    os.rmdir(self.path)

    def render(self, groups: Sequence[Group], body: GroupBody, nj: int, tmp_dir: str,
               sample_rate: int, wav_dirs: Sequence[str],
               espeak_data: Optional[str] = None) -> List:
        """body(group, renderer, generator) for every group, each in a fresh child (at most
        `nj` at once) with one BLAS thread, its generator seeded by `group.seed` and a
        Renderer at `sample_rate`; returns the bodies' results in group order. Makes
        wavs/<d> for each of `wav_dirs` first."""
        for name in wav_dirs:
            os.makedirs(self.wav_dir(name))

        def child(group: Group):
            single_thread_blas()
            rng = seeded_rng(*group.seed)
            with tempfile.TemporaryDirectory(prefix="synth_") as tmp:
                return body(group, Renderer(sample_rate, tmp, espeak_data), rng)

        bar = Progress(len(groups), "rendering", "groups", interval_s=10.0, log=logger)
        results = run_forked(child, groups, nj, tmp_dir,
                             lambda done, _: bar.update(done - bar.done))
        bar.close()
        return results

    def write_inventory(self, by_split: Mapping[str, Iterable[Voice]], speaking: Set[str],
                        versions: Mapping[str, str]) -> None:
        """voices.tsv: one row per voice of `by_split` that speaks (its speaker id in
        `speaking`), splits in order, speakers sorted within each."""
        rows = ["\t".join(INVENTORY_COLUMNS)]
        for split in SPLITS:
            for v in sorted(by_split.get(split, ()), key=lambda v: v.spk):
                if v.spk in speaking:
                    rows.append("\t".join((v.spk, split, v.engine, v.name, _blend_text(v),
                                           versions.get(v.engine, "unknown"))))
        atomic_write_text(os.path.join(self.path, INVENTORY_NAME), "".join(r + "\n" for r in rows))

    def write_stamp(self, config: dict) -> None:
        """Written last, in place of the claim: a stamp not marked unfinished marks a
        complete corpus."""
        atomic_write_text(os.path.join(self.path, self.stamp_name), _stamp_text(config))


def _stamp_text(config: dict) -> str:
    return json.dumps(config, indent=1, sort_keys=True)


def _split_of(name: str) -> Optional[str]:
    """The split an owned name belongs to (train, train_noisy: train), None for names every
    corpus writes (dict, voices.txt)."""
    return next((s for s in SPLITS if name == s or name.startswith(s + "_")), None)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _blend_text(voice: Voice) -> str:
    """`name:weight,...` of a blended voice (Voice.mix), else -."""
    if not voice.mix:
        return "-"
    return ",".join(f"{name}:{float(weight):g}" for name, weight in voice.mix)


def data_dir_summary(data_dir: str) -> dict:
    """Utterances, hours (utt2dur) and speakers (utt2spk) of a written data dir."""
    dur = kaldi.read_table(os.path.join(data_dir, "utt2dur"))
    spk = kaldi.read_table(os.path.join(data_dir, "utt2spk"))
    return {"utts": len(dur), "hours": sum(float(v) for v in dur.values()) / 3600,
            "speakers": len(set(spk.values()))}
