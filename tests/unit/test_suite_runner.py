"""The README's test command (tools/test.sh) hands the slowest test files out first: every
file conftest.SLOWEST_FIRST names exists, and xdist is told to keep that order."""
import os
import re
from importlib.metadata import version

import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_file_of_the_slowest_first_order_exists():
    files = {name for group in conftest.GROUPS
             for name in os.listdir(os.path.join(conftest.TESTS, group))}
    missing = [name for name in conftest.SLOWEST_FIRST if name not in files]
    assert not missing, f"tests/conftest.py SLOWEST_FIRST names files that are gone: {missing}"
    assert len(set(conftest.SLOWEST_FIRST)) == len(conftest.SLOWEST_FIRST)


def test_xdist_keeps_the_collection_order():
    """Without --no-loadscope-reorder, pytest-xdist (3.6 and later) hands out the files with
    the most tests first: the one-test recipe files went last and ran alone at the end."""
    with open(os.path.join(ROOT, "tools", "test.sh"), encoding="utf-8") as f:
        script = f.read()
    command = re.search(r"-m pytest (.*?)tests$", script, re.M | re.S).group(1)
    assert "--dist loadfile" in command and "--no-loadscope-reorder" in command, command
    major, minor = (int(x) for x in version("pytest-xdist").split(".")[:2])
    assert (major, minor) >= (3, 6), version("pytest-xdist")
