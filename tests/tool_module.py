"""A script under tools/ (a benchmark, an analysis) loaded as a module from its file, as the
tests of those scripts need it: the environment and sys.path it sets for itself (thread
counts for one core, its own imports) are undone, so they do not leak into later tests."""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_tool(relative_path: str):
    """tools/<relative_path>'s module, e.g. load_tool("benchmarks/oww_verifier.py")."""
    path = os.path.join(ROOT, "tools", relative_path)
    name = os.path.splitext(os.path.basename(path))[0]
    environ, sys_path = dict(os.environ), list(sys.path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = sys_path
    return module
