"""The layout's rules, checked on the source: generic code (config engine, data I/O and
augmentation, features, trainer, export writers, TTS engines, the task contract) imports
no task package; the trainer and the data pipeline name no model family; no import
cycles between modules; every binary is thin and documented; the generated config
reference is current."""
import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "toolkit")
GENERIC = ["config.py", "registry.py", "fileio.py", "errors.py", "progress.py",
           "logging_utils.py", "task.py", "export.py", "data", "trainer", "nn", "tts"]


def modules():
    for folder, _, files in os.walk(PKG):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                yield (rel[:-len(".__init__")] if rel.endswith(".__init__") else rel), path


def imports_of(path, top_level_only=False):
    tree = ast.parse(open(path, encoding="utf-8").read())
    nodes = tree.body if top_level_only else ast.walk(tree)
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in out if m.startswith("toolkit")}


def generic_files():
    for entry in GENERIC:
        path = os.path.join(PKG, entry)
        if os.path.isdir(path):
            for folder, _, files in os.walk(path):
                yield from (os.path.join(folder, f) for f in files if f.endswith(".py"))
        else:
            yield path


def test_generic_code_imports_no_task_package():
    offenders = {os.path.relpath(p, ROOT): sorted(m for m in imports_of(p)
                                                  if m.startswith("toolkit.tasks"))
                 for p in generic_files()}
    assert not {k: v for k, v in offenders.items() if v}


FAMILY_WORDS = re.compile(r"\b(kws|keyword|wake|ctc|max_pooling|speaker|codec|discriminator|"
                          r"generator|margin|embedding)\w*", re.IGNORECASE)


@pytest.mark.parametrize("name", ["trainer/trainer.py", "trainer/run.py", "trainer/checkpoint.py",
                                  "trainer/experiment.py", "data/pipeline.py", "data/sources.py",
                                  "data/plan.py", "data/loader.py", "data/shards.py",
                                  "export.py"])
def test_generic_layers_name_no_model_family(name):
    """Code, not prose: comments and docstrings may give examples, identifiers may not."""
    source = open(os.path.join(PKG, name), encoding="utf-8").read()
    tree = ast.parse(source)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                len(node.value) < 40 and " " not in node.value:
            names.add(node.value)    # dict keys and registry names, not messages
    library = {"Generator"}                  # numpy's and torch's random generators
    family = sorted(n for n in names - library if FAMILY_WORDS.match(n))
    assert not family, f"{name} names family concepts: {family}"


def test_no_import_cycles():
    graph = {}
    for name, path in modules():
        graph[name] = {m for m in imports_of(path, top_level_only=True)}
    names = set(graph)

    def resolve(m):
        while m and m not in names:
            m = m.rpartition(".")[0]
        return m
    edges = {n: {resolve(m) for m in deps} - {None, "", n, "toolkit"} for n, deps in graph.items()}
    # A package importing its own submodules (registration) is not a cycle of concern.
    for n in edges:
        edges[n] = {m for m in edges[n] if not m.startswith(n + ".")}
    state, stack, cycles = {}, [], []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in edges.get(n, ()):
            if state.get(m) == 1:
                cycles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2
    for n in sorted(edges):
        if n not in state:
            visit(n)
    assert not cycles, cycles


def test_binaries_are_thin_and_documented():
    folder = os.path.join(PKG, "bin")
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py") or name == "__init__.py":
            continue
        tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"get_args", "main"} <= functions, name
        assert ast.get_docstring(tree), f"{name} has no module docstring (its --help)"
        lines = len(open(os.path.join(folder, name), encoding="utf-8").read().splitlines())
        assert lines <= 200, f"{name}: {lines} lines; move logic into the library"


def test_config_reference_is_current():
    doc = os.path.join(ROOT, "docs", "config_reference.md")
    out = subprocess.run([sys.executable, "-m", "toolkit.bin.train", "--print-config-reference"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert open(doc, encoding="utf-8").read() == out.stdout, \
        "regenerate: python -m toolkit.bin.train --print-config-reference > docs/config_reference.md"
    # Every key has its one line.
    undocumented = [line for line in out.stdout.splitlines()
                    if line.startswith("| `") and line.rstrip().endswith("|  |")]
    assert not undocumented, undocumented[:10]
