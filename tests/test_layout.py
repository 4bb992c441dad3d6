"""The layout's rules, checked on the source: generic code (config engine, data I/O and
augmentation, features, trainer, export writers, TTS engines, the task contract) imports
no task package; the data stages import no torch; the trainer and the data pipeline name
no model family; no import cycles between modules; every binary is thin and documented;
the generated config reference is current."""
import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "toolkit")
GENERIC = ["config.py", "registry.py", "fileio.py", "errors.py", "progress.py",
           "logging_utils.py", "memory.py", "task.py", "export.py", "data", "trainer", "nn", "tts"]


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


def test_lazy_registry_imports_on_first_get(tmp_path, monkeypatch):
    (tmp_path / "widgets.py").write_text(
        "from toolkit.registry import Registry\n"
        "REG = Registry('widget')\n"
        "REG.register_lazy('thing', 'widgets_thing')\n"
        "REG.register_lazy('nothing', 'widgets_nothing')\n")
    (tmp_path / "widgets_thing.py").write_text(
        "from widgets import REG\n@REG.register('thing')\nclass Thing:\n    pass\n")
    (tmp_path / "widgets_nothing.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    from widgets import REG
    assert "thing" in REG and REG.names() == ["nothing", "thing"]
    assert "widgets_thing" not in sys.modules         # listing names imports nothing
    assert REG.get("thing").__name__ == "Thing" and "widgets_thing" in sys.modules
    assert REG.names() == ["nothing", "thing"]
    with pytest.raises(KeyError, match="importing widgets_nothing did not register it"):
        REG.get("nothing")
    with pytest.raises(KeyError, match="registered twice"):
        REG.register_lazy("thing", "widgets_thing")
    with pytest.raises(KeyError, match="unknown widget 'other'; known: nothing, thing"):
        REG.get("other")


def test_data_stages_import_no_torch(tmp_path):
    """Data lists, lexicons, fbank and CMVN (a recipe's stages before training) and reading
    an export's ONNX metadata run without torch: each such stage pays no torch import."""
    from kws_data import make_kaldi_dir, write_keywords
    data = make_kaldi_dir(str(tmp_path), "train", 3, 3, seed=1)
    keywords = write_keywords(str(tmp_path), ["hey chirp"])
    config = os.path.join(ROOT, "egs", "wake_word", "s0", "conf", "ds_tcn.yaml")
    script = f"""
import sys
from toolkit.bin import compute_cmvn, compute_feats, make_datalist, make_lexicon
d, t = {data!r}, {str(tmp_path)!r}
assert make_lexicon.main([d, "--unit", "char", "--lexicon", t + "/lexicon.txt",
                          "--units", t + "/units.txt"]) == 0
assert make_datalist.main([d, t + "/data.list", "--inventory", {keywords!r}, "--nj", "1",
                           "--lexicon", t + "/lexicon.txt", "--units", t + "/units.txt"]) == 0
assert compute_feats.main([t + "/data.list", t + "/fbank", "--config", {config!r},
                           "--nj", "1"]) == 0
assert compute_cmvn.main([t + "/fbank/data.list", t + "/cmvn.json", "--config", {config!r},
                          "--nj", "1"]) == 0
import onnx
from onnx import helper
from toolkit.export import METADATA_KEY, read_metadata
x, y = (helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1]) for n in "xy")
model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])],
                                            "g", [x], [y]))
entry = model.metadata_props.add()
entry.key, entry.value = METADATA_KEY, '{{"feature": {{"frame_shift_ms": 10}}}}'
onnx.save(model, t + "/model.onnx")
assert read_metadata(t + "/model.onnx")["feature"]["frame_shift_ms"] == 10
print("torch imported:", "torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "torch imported: False" in out.stdout
    assert (tmp_path / "cmvn.json").exists() and (tmp_path / "fbank" / "feats.scp").exists()


def test_data_stages_check_the_dataset_section(tmp_path):
    """The stages before training read the dataset section as training does: an unknown
    key there is refused with the file and key named."""
    from toolkit.config import ConfigError, load_dataset_config
    import toolkit.tasks  # noqa: F401
    good = load_dataset_config(os.path.join(ROOT, "egs", "wake_word", "s0", "conf",
                                            "ds_tcn.yaml"))
    assert good.feature.num_mel_bins > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: {type: kws}\ndataset: {feature: {num_mel_binz: 40}}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: .*num_mel_binz"):
        load_dataset_config(str(bad))
    bad.write_text("task: {type: nosuch}\ndataset: {}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: task.type: expected one of codec, kws, "
                                          r"speaker, got 'nosuch'"):
        load_dataset_config(str(bad))
