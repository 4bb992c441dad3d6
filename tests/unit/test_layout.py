"""The layout's rules, checked on the source: generic code (config engine, data I/O and
augmentation, features, trainer, export writers, TTS engines, the task contract) imports
no task package; the data stages import no torch; the trainer and the data pipeline name
no model family; no import cycles between modules; every binary is thin and documented;
the generated config reference is current."""
import ast
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "toolkit")
GENERIC = ["config", "registry.py", "cli.py", "fileio.py", "errors.py", "progress.py",
           "logging_utils.py", "memory.py", "task.py", "export.py", "data", "trainer", "nn",
           "voicebank"]


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


@pytest.mark.parametrize("name", ["trainer/trainer.py", "trainer/context.py", "trainer/resume.py",
                                  "trainer/report.py", "config/resolve.py",
                                  "trainer/run.py", "trainer/checkpoint.py",
                                  "trainer/experiment.py", "data/pipeline.py", "data/sources.py",
                                  "data/plan.py", "data/loader.py", "data/shards.py",
                                  "data/shard_tar.py", "data/transport.py",
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


def module_imports(name: str, path: str, known: set) -> set:
    """Every toolkit module that importing `name` runs, from its whole source: imports at
    module level, inside functions, under `if` (TYPE_CHECKING too) and `try`. `from A
    import b` is module A.b when that is a module, else A; relative imports are resolved.
    Importing a.b.c also runs the packages a.b and a (their __init__), except those that
    contain `name` itself (they are imported before it)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = name if os.path.basename(path) == "__init__.py" else name.rpartition(".")[0]

    def owner(dotted: str):
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(owner(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                targets.add(owner(f"{base}.{a.name}") if f"{base}.{a.name}" in known
                            else owner(base))
    out = set()
    for target in targets - {None, name}:
        out.add(target)
        parent = target.rpartition(".")[0]
        while parent:
            if parent in known and not (name == parent or name.startswith(parent + ".")):
                out.add(parent)
            parent = parent.rpartition(".")[0]
    return out - {name}


def import_graph() -> dict:
    found = dict(modules())
    return {n: module_imports(n, p, set(found)) for n, p in found.items()}


def shortest_cycle(graph: dict, start: str, group: set) -> list:
    previous, frontier = {}, [start]
    while frontier:
        step = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [v]
                    while path[0] != start:
                        path.insert(0, previous[path[0]])
                    return path
                if w not in previous:
                    previous[w] = v
                    step.append(w)
        frontier = step
    return []


def import_cycles(graph: dict) -> list:
    """The shortest cycle through each module that lies on one, as a path
    "a -> b -> ... -> a" (each cycle once)."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []

    def connect(v):                      # Tarjan's strongly connected groups
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)
    for v in sorted(graph):
        if v not in index:
            connect(v)
    cycles = set()
    for group in groups:
        for v in group:
            path = shortest_cycle(graph, v, group)
            first = path.index(min(path))
            cycles.add(" -> ".join(path[first:] + path[:first] + [min(path)]))
    return sorted(cycles)


def test_no_import_cycles():
    """No module can reach itself through imports of any kind (see module_imports)."""
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_check_sees_every_kind_of_import(tmp_path):
    """A cycle hidden in a function, behind TYPE_CHECKING, in a relative import or in a
    package's __init__ is still found, and named by its path."""
    files = {"pkg/__init__.py": "from pkg import b\n",
             "pkg/a.py": "def f():\n    from pkg.b import g\n",
             "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from . import a\ndef g():\n    pass\n",
             "pkg/c.py": "import os\n",
             "other.py": "from pkg.c import x\n",
             "pkg/sub/__init__.py": "import other\n", "pkg/sub/d.py": ""}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = {rel[:-3].replace("/", ".").replace(".__init__", ""): str(tmp_path / rel)
             for rel in files}
    graph = {n: module_imports(n, p, set(found)) for n, p in found.items()}
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert graph["other"] == {"pkg.c", "pkg"}          # the package __init__ runs too
    assert graph["pkg.sub.d"] == set()
    assert import_cycles(graph) == ["pkg.a -> pkg.b -> pkg.a"]
    graph["pkg.c"] = {"pkg.sub"}                        # pkg.sub's __init__ imports other
    assert import_cycles(graph) == ["other -> pkg.c -> pkg.sub -> other",
                                    "pkg.a -> pkg.b -> pkg.a"]


def _task_uses(path):
    """Attributes read on a task object (`task.x`, `self.task.x`, `task_cls.x`, and
    `task.x` over the classes the reference generator walks) in one file."""
    used = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("task", "task_cls"):
            used.add(node.attr)
        elif isinstance(owner, ast.Attribute) and owner.attr == "task" and \
                isinstance(owner.value, ast.Name) and owner.value.id == "self":
            used.add(node.attr)
    return used


def test_the_contract_declares_everything_its_callers_use():
    """Every method or attribute of a task that the trainer, a binary, the config
    resolution or the reference generator uses is declared on toolkit.task.Task, and every
    method there says in a docstring what it is for."""
    from toolkit.task import Task
    callers = [os.path.join(folder, f) for sub in ("trainer", "bin")
               for folder, _, files in os.walk(os.path.join(PKG, sub))
               for f in files if f.endswith(".py")]
    callers += [os.path.join(PKG, "task.py"), os.path.join(PKG, "export.py"),
                os.path.join(PKG, "config", "reference.py"),
                os.path.join(PKG, "config", "resolve.py")]
    used = set().union(*(_task_uses(p) for p in callers)) - {"type"}   # cfg.task.type
    assert {"example_builder", "export", "describe", "adapt_init_state", "derived_values",
            "check_config", "inputs", "optim_defaults", "eval_batch"} <= used
    undeclared = sorted(name for name in used if not hasattr(Task, name))
    assert not undeclared, f"used on tasks but not declared on Task: {undeclared}"
    methods = [n for n, v in vars(Task).items() if callable(v) or isinstance(v, classmethod)]
    undocumented = [n for n in methods if not n.startswith("__")
                    and not (getattr(Task, n).__doc__ or "").strip()]
    assert not undocumented, undocumented


def test_no_task_builds_its_training_pipeline():
    """The trainer builds the train and dev FeaturePipeline and hands it to
    example_builder; task code only uses toolkit.data.pipeline.evaluation_pipeline (export,
    evaluation)."""
    paths = [os.path.join(folder, f) for folder, _, files in os.walk(os.path.join(PKG, "tasks"))
             for f in files if f.endswith(".py")]
    builders = []
    for path in paths:
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
                if name == "FeaturePipeline":
                    builders.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert not builders, builders


def test_the_generic_binary_has_no_family_options():
    """Family inputs are declared by tasks (Task.inputs), not written into toolkit.bin.train."""
    source = open(os.path.join(PKG, "bin", "train.py"), encoding="utf-8").read()
    assert not re.search(r"--units|--cmvn|keyword task", source)


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
    from train_utils import run_train      # a process of its own, forked from the zygote
    out = run_train(["-m", "toolkit.bin.train", "--print-config-reference"], cwd=ROOT,
                    timeout=120)
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
    from toolkit.config import ConfigError
    from toolkit.config import load_dataset_config
    import toolkit.tasks  # noqa: F401
    good = load_dataset_config(os.path.join(ROOT, "egs", "wake_word", "s0", "conf",
                                            "ds_tcn.yaml"))
    assert good.feature.num_mel_bins > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: {type: kws}\ndataset: {feature: {num_mel_binz: 40}}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: .*num_mel_binz"):
        load_dataset_config(str(bad))
    bad.write_text("task: {type: nosuch}\ndataset: {}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: task.type: expected one of codec, example, "
                                          r"kws, phone_ctc, speaker, got 'nosuch'"):
        load_dataset_config(str(bad))


KEYWORD_RECIPES = ("wake_word/s0", "hey_snips/s0", "hi_xiaowen/s0", "speech_commands/s0")
SOURCED = re.compile(r"^\s*(?:\.|source)\s+(\S+)", re.M)


RECIPES = sorted(os.path.relpath(os.path.dirname(p), os.path.join(ROOT, "egs"))
                 for p in glob.glob(os.path.join(ROOT, "egs", "*", "*", "run.sh")))


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipes_hold_their_stages_inline(recipe):
    """A recipe's run.sh shows its stages' commands: it sources no utils/*_stages.sh that
    reads the recipe's variables (path.sh and utils/parse_options.sh are sourced, as in
    Kaldi)."""
    text = open(os.path.join(ROOT, "egs", recipe, "run.sh"), encoding="utf-8").read()
    sourced = SOURCED.findall(text)
    assert not [s for s in sourced if re.search(r"utils/\S*_stages\.sh", s)], sourced
    assert set(sourced) <= {"./path.sh", "utils/parse_options.sh"}, sourced


def test_no_shared_stages_file():
    assert all(os.path.isdir(os.path.join(ROOT, "egs", r)) for r in KEYWORD_RECIPES)
    assert not glob.glob(os.path.join(ROOT, "utils", "*_stages.sh"))


# The same step has the same number in every recipe (a user who knows one knows all).
STAGE_OF_STEP = {"training": 3, "averaging": 4, "export": 5}


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_numbers_its_steps_alike(recipe):
    text = open(os.path.join(ROOT, "egs", recipe, "run.sh"), encoding="utf-8").read()
    announced = re.findall(r'echo "stage (-?\d+): (\w+)', text)
    for step, number in STAGE_OF_STEP.items():
        stages = {int(n) for n, word in announced if word == step}
        assert stages == {number}, f"{recipe}: '{step}' is stage {sorted(stages)}, not {number}"
    # stage 1 makes the data lists (with an inventory first for the speaker family)
    assert any(n == "1" for n, _ in announced), recipe


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_readme_tables_the_stages_run_sh_has(recipe):
    """The stages table of a recipe's README lists exactly the stages its run.sh runs (an
    unused number is a row that says so)."""
    run = open(os.path.join(ROOT, "egs", recipe, "run.sh"), encoding="utf-8").read()
    readme = open(os.path.join(ROOT, "egs", recipe, "README.md"), encoding="utf-8").read()
    in_run = {int(n) for n in re.findall(r'\$stage"? -le (-?\d+) \]', run)}
    rows = {int(n): text for n, text in re.findall(r"^\| *(-?\d+) *\|([^\n]*)$", readme, re.M)}
    used = {n for n, text in rows.items() if not text.strip().startswith("unused")}
    assert used == in_run, f"{recipe}: README table {sorted(used)}, run.sh {sorted(in_run)}"
