"""toolkit.entry_cache: directories built once, found again by their key, verified on use,
rebuilt when damaged, and built once when several processes ask for one at once."""
import json
import logging
import multiprocessing
import os
import time

import pytest

from toolkit.entry_cache import EntryCache, key_digest, link_or_copy

KEY = {"what": "test", "n": 3, "x": 0.1}


def _builder(log_path, payload="abc", delay=0.0):
    def build(folder):
        with open(log_path, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(delay)
        os.makedirs(os.path.join(folder, "sub"))
        with open(os.path.join(folder, "sub", "data.bin"), "w") as f:
            f.write(payload * 1000)
        with open(os.path.join(folder, "meta.txt"), "w") as f:
            f.write("meta")
    return build


def _builds(log_path):
    return len(open(log_path).read().split()) if os.path.exists(log_path) else 0


def test_built_once_then_reused(tmp_path):
    cache, log = EntryCache(str(tmp_path / "c")), str(tmp_path / "builds")
    with cache.open(KEY, _builder(log)) as entry:
        assert entry.built and entry.digest == key_digest(KEY)
        assert entry.path == cache.path(KEY) and os.path.isdir(entry.path)
        first = entry.content
    with cache.open(dict(reversed(list(KEY.items()))), _builder(log, "zzz")) as entry:
        assert not entry.built and entry.content == first     # key order does not matter
        assert open(os.path.join(entry.path, "sub", "data.bin")).read() == "abc" * 1000
    assert _builds(log) == 1
    manifest = json.load(open(os.path.join(entry.path, "manifest.json")))["files"]
    assert sorted(manifest) == ["meta.txt", os.path.join("sub", "data.bin")]
    assert json.load(open(os.path.join(entry.path, "key.json"))) == KEY
    with cache.open({**KEY, "n": 4}, _builder(log)) as other:   # another key: another entry
        assert other.built and other.path != entry.path
    with cache.open({**KEY, "n": 5}, None) as missing:          # no builder: nothing
        assert missing is None
    assert not [n for n in os.listdir(cache.root) if ".tmp-" in n]


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "extra", "manifest"])
def test_a_damaged_entry_is_named_and_rebuilt(tmp_path, caplog, damage):
    cache, log = EntryCache(str(tmp_path / "c")), str(tmp_path / "builds")
    with cache.open(KEY, _builder(log)) as entry:
        good = entry.content
    data = os.path.join(entry.path, "sub", "data.bin")
    os.chmod(data, 0o644)           # built files are read-only
    if damage == "flip":            # same size, one byte changed
        with open(data, "r+b") as f:
            f.seek(10)
            f.write(b"X")
    elif damage == "truncate":
        os.truncate(data, 100)
    elif damage == "remove":
        os.unlink(data)
    elif damage == "extra":
        open(os.path.join(entry.path, "stray.txt"), "w").write("?")
    else:
        open(os.path.join(entry.path, "manifest.json"), "w").write("{")
    caplog.set_level(logging.WARNING, "toolkit.entry_cache")
    with cache.open(KEY, _builder(log)) as entry:
        assert entry.built and entry.content == good
        assert open(data).read() == "abc" * 1000
    assert _builds(log) == 2
    named = {"flip": "data.bin: sha256", "truncate": "data.bin: 100 bytes", "remove":
             "data.bin: missing", "extra": "stray.txt: a file the manifest does not list",
             "manifest": "unreadable key or manifest"}[damage]
    assert any(named in r.getMessage() and "damaged" in r.getMessage() and "building it again"
               in r.getMessage() for r in caplog.records), caplog.text
    assert sorted(os.listdir(cache.root)) == sorted([entry.digest, ".locks"])


def test_a_failed_build_leaves_nothing_and_a_killed_ones_leftovers_are_removed(tmp_path):
    cache = EntryCache(str(tmp_path / "c"))

    def fails(folder):
        open(os.path.join(folder, "half"), "w").write("x")
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        with cache.open(KEY, fails):
            pass
    assert not os.path.exists(cache.path(KEY))
    assert sorted(os.listdir(cache.root)) == [".locks"]
    leftover = os.path.join(cache.root, f".{key_digest(KEY)}.tmp-killed")
    os.makedirs(leftover)
    with cache.open(KEY, _builder(str(tmp_path / "builds"))) as entry:
        assert entry.built
    assert not os.path.exists(leftover)
    with pytest.raises(ValueError, match="not an entry"):
        cache.discard(str(tmp_path))           # never anything outside the cache


def _race(args):
    root, log, out = args
    cache = EntryCache(root)
    with cache.open(KEY, _builder(log, delay=1.5)) as entry:
        with open(out, "w") as f:
            json.dump({"built": entry.built, "content": entry.content,
                       "data": open(os.path.join(entry.path, "sub", "data.bin")).read()}, f)


def test_two_processes_at_once_build_once(tmp_path, caplog):
    root, log = str(tmp_path / "c"), str(tmp_path / "builds")
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=_race, args=((root, log, str(tmp_path / f"out{i}")),))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    outs = [json.load(open(tmp_path / f"out{i}")) for i in range(2)]
    assert _builds(log) == 1
    assert sorted(o["built"] for o in outs) == [False, True]
    assert outs[0]["content"] == outs[1]["content"] and outs[0]["data"] == outs[1]["data"]


def test_link_or_copy_replaces_the_target(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_text("new")
    dst.write_text("old")
    link_or_copy(str(src), str(dst))
    assert dst.read_text() == "new" and os.stat(src).st_ino == os.stat(dst).st_ino
