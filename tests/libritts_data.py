"""A miniature LibriTTS (OpenSLR 60) in the real layout, one .tar.gz per subset as the site
serves them (members under LibriTTS/, the corpus-wide metadata files in every archive):

  LibriTTS/<subset>/<speaker>/<chapter>/<speaker>_<chapter>_<para>_<sent>.wav  (24 kHz)
      + .normalized.txt and .original.txt beside each WAV,
  LibriTTS/<subset>/<speaker>/<chapter>/<speaker>_<chapter>.book.tsv / .trans.tsv,
  LibriTTS/{BOOKS.txt, CHAPTERS.txt, SPEAKERS.txt, speakers.tsv, LICENSE.txt, ...}.

Speech is the voice-like signal of tests/speaker_data.py, resampled to 24 kHz. One train
utterance is an empty WAV (header only) and one has only an original transcript, as
stage 0 must handle. Also a small HTTP server for the archives that honours Range
requests (or, with `ranges=False`, ignores them as some servers do)."""
import hashlib
import http.server
import os
import tarfile
import threading
from typing import Dict, List, Tuple

import numpy as np
import soundfile as sf

from speaker_data import RATE, speaker_params, voice_wave

LIBRITTS_RATE = 24000
# subset -> [(speaker, chapter, utterances)]
LAYOUT = {
    "train-clean-100": [("19", "198", 3), ("26", "495", 3)],
    "train-clean-360": [("100", "121669", 3)],
    "dev-clean": [("84", "121123", 2), ("174", "50561", 2)],
    "test-clean": [("1089", "134686", 2), ("121", "121726", 2)],
}
EMPTY_UTT = "26_495_000004_000001"
ORIGINAL_ONLY_UTT = "19_198_000002_000002"
WORDS = "the a of and to in that was he it his with had as you for she her".split()


def utterance_ids(speaker: str, chapter: str, count: int) -> List[str]:
    """<speaker>_<chapter>_<paragraph>_<sentence>, as LibriTTS names its files."""
    return [f"{speaker}_{chapter}_{2 * i:06d}_{1 + i % 2:06d}" for i in range(count)]


def build_libritts(root: str, seed: int = 7) -> Dict[str, Dict[str, Tuple[str, str]]]:
    """Writes <root>/LibriTTS/...; returns subset -> {utt: (speaker, normalized text)} of
    the utterances stage 0 should keep."""
    from toolkit.data.audio import resample
    rng = np.random.default_rng(seed)
    base = os.path.join(root, "LibriTTS")
    kept: Dict[str, Dict[str, Tuple[str, str]]] = {}
    for subset, chapters in LAYOUT.items():
        kept[subset] = {}
        for speaker, chapter, count in chapters:
            folder = os.path.join(base, subset, speaker, chapter)
            os.makedirs(folder, exist_ok=True)
            pitch, formants = speaker_params(int(speaker))
            ids = utterance_ids(speaker, chapter, count)
            if speaker == "26":
                ids.append(EMPTY_UTT)
            rows = []
            for utt in ids:
                words = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 8))))
                original, normalized = words.capitalize() + ".", words.capitalize() + "."
                wav = os.path.join(folder, utt + ".wav")
                if utt == EMPTY_UTT:
                    sf.write(wav, np.zeros(0, np.float32), LIBRITTS_RATE, subtype="PCM_16")
                else:
                    wave = voice_wave(rng, pitch, formants, float(rng.uniform(1.0, 1.8)))
                    sf.write(wav, np.clip(resample(wave, RATE, LIBRITTS_RATE), -1, 1),
                             LIBRITTS_RATE, subtype="PCM_16")
                    kept[subset][utt] = (speaker, normalized)
                with open(os.path.join(folder, utt + ".original.txt"), "w") as f:
                    f.write(original)
                if utt != ORIGINAL_ONLY_UTT:
                    with open(os.path.join(folder, utt + ".normalized.txt"), "w") as f:
                        f.write(normalized)
                rows.append(f"{utt}\t{original}\t{normalized}\n")
            for kind in ("book", "trans"):
                with open(os.path.join(folder, f"{speaker}_{chapter}.{kind}.tsv"), "w") as f:
                    f.writelines(rows)
    for name in ("BOOKS.txt", "CHAPTERS.txt", "SPEAKERS.txt", "LICENSE.txt", "NOTE.txt",
                 "README_librispeech.txt", "reader_book.tsv", "speakers.tsv"):
        with open(os.path.join(base, name), "w") as f:
            f.write(f"; miniature LibriTTS {name} for tests\n")
    return kept


def libritts_archives(root: str, out_dir: str) -> Dict[str, str]:
    """<out_dir>/<subset>.tar.gz for every subset; returns name -> sha256."""
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(root, "LibriTTS")
    digests = {}
    for subset in LAYOUT:
        name = f"{subset}.tar.gz"
        path = os.path.join(out_dir, name)
        with tarfile.open(path, "w:gz") as tar:
            for meta in sorted(os.listdir(base)):
                if os.path.isfile(os.path.join(base, meta)):
                    tar.add(os.path.join(base, meta), arcname=f"LibriTTS/{meta}")
            tar.add(os.path.join(base, subset), arcname=f"LibriTTS/{subset}")
        digests[name] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return digests


class ArchiveServer:
    """Serves `directory` on 127.0.0.1 in a thread; records each request's Range header."""

    def __init__(self, directory: str, ranges: bool = True):
        self.requests: List[Tuple[str, str]] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=directory, **kwargs)

            def log_message(self, *args):
                pass

            def do_GET(self):
                wanted = self.headers.get("Range", "")
                server.requests.append((self.path, wanted))
                path = self.translate_path(self.path)
                if not (ranges and wanted.startswith("bytes=") and os.path.isfile(path)):
                    return super().do_GET()
                start = int(wanted[len("bytes="):].split("-")[0])
                size = os.path.getsize(path)
                if start >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.end_headers()
                    return
                with open(path, "rb") as f:
                    f.seek(start)
                    body = f.read()
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)
