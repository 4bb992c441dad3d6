"""The task contract (toolkit/task.py) as the trainer and the binaries use it: values a
task derives from its data are overrides validated with the rest, never edits of a
validated config; inputs a task declares are the training binary's options (per task in
--help; another task's input is refused); the trainer hands each task its ready train
and dev FeaturePipeline."""
import copy
import json
import os

import pytest
import torch

import toolkit.tasks  # noqa: F401  (registers the families)
from toolkit.config import ConfigError, load_yaml, set_values, to_dict
from toolkit.data.pipeline import FeaturePipeline
from toolkit.config import TASKS, resolve_config, validate
from toolkit.task import Task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONF = {"wake_word": os.path.join(ROOT, "egs", "wake_word", "s0", "conf", "ds_tcn.yaml"),
        "wake_word_ctc": os.path.join(ROOT, "egs", "wake_word", "s0", "conf", "ds_tcn_ctc.yaml"),
        "speaker": os.path.join(ROOT, "egs", "tts_speakers", "v1", "conf", "resnet.yaml"),
        "codec": os.path.join(ROOT, "egs", "tts_codec", "s0", "conf", "codec_cpu.yaml")}


@pytest.fixture
def files(tmp_path):
    """An inventory of three keywords, a unit list of five units, a CMVN file."""
    inventory = tmp_path / "keywords.txt"
    inventory.write_text("hey chirp\nhello there\nstop\n")
    units = tmp_path / "units.txt"
    units.write_text("<blank>\na\nb\nc\nd\n")
    cmvn = tmp_path / "cmvn.json"
    cmvn.write_text(json.dumps({"mean": [0.0] * 40, "inv_std": [1.0] * 40}))
    return {"inventory": str(inventory), "units": str(units), "cmvn": str(cmvn)}


def test_derived_values_are_overrides_validated_once(files):
    raw = load_yaml(CONF["wake_word_ctc"])
    cfg, inventory = resolve_config(raw, dict(files), source=CONF["wake_word_ctc"])
    assert inventory == ["hey chirp", "hello there", "stop"]
    assert (cfg.model.num_outputs, cfg.model.input_dim, cfg.model.ctc_outputs) == (3, 40, 5)
    assert cfg.model.cmvn_file == files["cmvn"]
    # Exactly the config the raw file plus those values validates to; the draft (the file
    # alone) is untouched.
    derived = {"model.num_outputs": 3, "model.input_dim": 40, "model.ctc_outputs": 5,
               "model.cmvn_file": files["cmvn"]}
    assert to_dict(cfg) == to_dict(validate(set_values(raw, derived)))
    assert raw == load_yaml(CONF["wake_word_ctc"])
    draft = validate(raw)
    assert (draft.model.num_outputs, draft.model.input_dim, draft.model.ctc_outputs) == (0, 0, 0)
    # A validated config keeps its sections.
    with pytest.raises(AttributeError, match="not replaced"):
        cfg.model = draft.model


def test_a_file_path_is_taken_as_it_is(tmp_path, files):
    """A derived value is not YAML-parsed like a command-line override: a CMVN path that
    YAML would read as a mapping or a number stays the path."""
    odd = tmp_path / "stats: 1e3"
    odd.write_text(open(files["cmvn"]).read())
    cfg, _ = resolve_config(load_yaml(CONF["wake_word"]), dict(files, cmvn=str(odd)))
    assert cfg.model.cmvn_file == str(odd)


@pytest.mark.parametrize("family", ["wake_word_ctc", "speaker", "codec"])
def test_the_task_never_changes_its_validated_config(family, files):
    """Building the task, its modules and its builders around the trainer's pipelines
    leaves the config exactly as resolved (what config.yaml records)."""
    raw = load_yaml(CONF[family])
    inputs = dict(files) if family == "wake_word_ctc" else {}
    task_cls = TASKS.get(raw["task"]["type"])
    inventory = [f"spk{i}" for i in range(7)] if family == "speaker" else None
    cfg, inventory = resolve_config(raw, inputs, inventory=inventory)
    before = copy.deepcopy(to_dict(cfg))
    task = task_cls(cfg, inventory)
    with torch.device("meta"):
        task.build_modules()
    task.example_builder(FeaturePipeline(cfg.dataset, 1, True, steps_per_epoch=3,
                                         total_steps=9))
    task.example_builder(FeaturePipeline(cfg.dataset, 1, False))
    assert to_dict(cfg) == before


@pytest.mark.parametrize("change,inputs,message", [
    (["model.num_outputs=5"], {}, r"model.num_outputs=5 but the inventory .*keywords.txt has 3 "
                                   r"entries"),
    ([], {"units": None}, r"the loss has a ctc component but model.ctc_outputs is 0: pass "
                          r"--units"),
    (["model.ctc_outputs=9"], {}, r"model.ctc_outputs=9 but the unit list .*units.txt has 5 "
                                  r"entries"),
    ([], {"units": "/nonexistent/units.txt"}, r"--units: .*nonexistent"),
    ([], {"inventory": None}, r"--inventory is required for task kws"),
    (["model.hidden_dimm=3"], {}, r"ds_tcn_ctc.yaml: unknown key\(s\): model.hidden_dimm"),
])
def test_resolution_errors_name_the_key_or_flag(files, change, inputs, message):
    from toolkit.config import apply_overrides
    raw = apply_overrides(load_yaml(CONF["wake_word_ctc"]), change)
    with pytest.raises(ConfigError, match=message):
        resolve_config(raw, dict(files, **inputs), source=CONF["wake_word_ctc"])


def test_an_input_the_task_does_not_declare_is_refused(files):
    raw = load_yaml(CONF["speaker"])
    with pytest.raises(ConfigError, match=r"--units: task speaker takes no such input "
                                          r"\(its inputs: none\)"):
        resolve_config(raw, {"units": files["units"]}, inventory=["a", "b"])


def test_a_unit_list_for_a_config_without_ctc_changes_nothing(files):
    """The recipe passes --units whenever it prepared them; a config whose loss has no
    ctc component trains no CTC head."""
    cfg, _ = resolve_config(load_yaml(CONF["wake_word"]), dict(files))
    assert cfg.model.ctc_outputs == 0


# --------------------------------------------------------------------------- the binary

def test_declared_inputs_are_options_of_the_training_binary(files, tmp_path, capsys):
    from toolkit.bin.train import get_args
    base = ["--exp-dir", str(tmp_path / "exp")]
    args = get_args(["--config", CONF["wake_word"], *base, "--cmvn", files["cmvn"],
                     "--units", files["units"], "training.max_epoch=2"])
    assert args.task_inputs == {"cmvn": files["cmvn"], "units": files["units"]}
    assert args.overrides == ["training.max_epoch=2"]
    assert get_args(["--config", CONF["wake_word"], *base]).task_inputs == {}
    # Another task's input is a usage error (status 2) naming the option.
    with pytest.raises(SystemExit) as exit_:
        get_args(["--config", CONF["speaker"], *base, "--cmvn", files["cmvn"]])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --cmvn" in capsys.readouterr().err
    # --help lists them per task.
    with pytest.raises(SystemExit):
        get_args(["--help"])
    help_text = capsys.readouterr().out
    for task in TASKS.names():
        assert f"inputs of task {task}:" in help_text
    kws = " ".join(help_text[help_text.index("inputs of task kws:"):].split())
    assert "--cmvn PATH" in kws and "(sets model.cmvn_file)" in kws
    assert "--units PATH" in kws and "(sets model.ctc_outputs)" in kws


def test_an_unreadable_config_is_reported_as_such(tmp_path, capsys):
    """With a config that cannot be read, every task's inputs are accepted, so that the
    error the binary prints is the config's, not an unknown option."""
    from toolkit.bin.train import main
    missing = str(tmp_path / "nosuch.yaml")
    assert main(["--config", missing, "--exp-dir", str(tmp_path / "exp"),
                 "--cmvn", "x.json"]) == 2
    err = capsys.readouterr().err
    assert f"error: config file not found: {missing}" in err
    assert "unrecognized" not in err


# --------------------------------------------------------------------------- pipelines

class RecordingTask(Task):
    """Records the pipelines the trainer hands over (a subclass of no registry)."""
    seen = []

    def example_builder(self, pipeline):
        RecordingTask.seen.append(pipeline)
        return None


def test_the_trainer_hands_each_task_its_train_and_dev_pipeline(tmp_path):
    """Trainer.__init__ builds the train pipeline (augmentation on, the noise list loaded
    for a probability that becomes positive, the step counts ramps follow) and the dev
    pipeline (no augmentation, the training seed for dither)."""
    from toolkit.trainer.distributed import DistInfo
    from toolkit.trainer.trainer import Trainer
    from train_utils import TINY_CONFIG, Corpus
    corpus = Corpus(str(tmp_path / "data"), num_train=12, num_dev=4)
    noise = tmp_path / "noise.list"
    noise.write_text(open(corpus.dev).readline())
    raw = copy.deepcopy(TINY_CONFIG)
    raw["dataset"].update(train_data=corpus.train, dev_data=corpus.dev, num_workers=0,
                          noise={"noise_list": str(noise),
                                 "prob": {"initial": 0.0, "final": 0.5, "start": 0.5,
                                          "end": 0.5, "shape": "step"}})
    cfg, inventory = resolve_config(raw, {"inventory": corpus.inventory})
    task = TASKS.get("kws")(cfg, inventory)
    task.example_builder = RecordingTask.example_builder.__get__(task)
    RecordingTask.seen.clear()
    info = DistInfo(world_size=1, rank=0, local_rank=0, local_world_size=1,
                    device=torch.device("cpu"))
    trainer = Trainer(cfg, task, str(tmp_path / "exp"), info)
    train, dev = RecordingTask.seen
    assert train.train and not dev.train
    assert train.cfg is cfg.dataset and dev.cfg is cfg.dataset
    assert train.seed == dev.seed == cfg.training.seed
    assert len(train.noise) == 1 and train.rirs is None and dev.noise is None
    assert (train.steps_per_epoch, train.total_steps) == (trainer.steps_per_epoch,
                                                          trainer.total_steps) != (0, 0)


# --------------------------------------------------------------------------- typed contract

def test_the_trainers_step_context_satisfies_the_protocol():
    """Every member of toolkit.task.StepContext exists on the trainer's context with the
    same parameters (names, kinds, order); the attributes are set for each micro-batch."""
    import inspect
    import types

    from toolkit.task import StepContext
    from toolkit.trainer.context import TrainerStepContext
    members = {n for n in vars(StepContext) if not n.startswith("_")}
    attributes = set(StepContext.__annotations__)
    assert {"module", "raw", "autocast", "fp32", "backward", "step", "active", "frozen",
            "value", "progress"} <= members
    assert attributes == {"step_index", "total_steps", "epoch", "device", "training"}
    for name in sorted(members):
        declared, implemented = getattr(StepContext, name), getattr(TrainerStepContext, name)
        if isinstance(declared, property):
            assert isinstance(implemented, property), name
            continue
        want = [(p.name, p.kind) for p in inspect.signature(declared).parameters.values()]
        have = [(p.name, p.kind) for p in inspect.signature(implemented).parameters.values()]
        assert have == want, f"{name}: {have} != {want}"
    trainer = types.SimpleNamespace(step=3, total_steps=9, epoch=1, device=torch.device("cpu"))
    ctx = TrainerStepContext(trainer, True)
    assert all(hasattr(ctx, a) for a in attributes)
    assert ctx.progress == 3 / 9


def test_the_required_hooks_are_abstract():
    """A task without its modules, builder or training step cannot be built; one without
    any validation cannot be declared."""
    assert {"build_modules", "example_builder", "train_step"} <= Task.__abstractmethods__
    with pytest.raises(TypeError, match="abstract"):
        RecordingTask(None)
    with pytest.raises(TypeError, match="neither eval_step nor eval_batch"):
        type("NoValidation", (Task,), {"build_modules": lambda self: {},
                                       "example_builder": lambda self, p: None,
                                       "train_step": lambda self, b, c: {}})
    for name in TASKS.names():
        task = TASKS.get(name)
        assert not task.__abstractmethods__, name
        metrics = task.metrics
        assert metrics.select in metrics.eval


def test_the_worked_example_learns(tmp_path):
    """The package's example task (task.type: example, no plugin) trains through the
    binary and its dev reconstruction loss falls."""
    import re

    from train_utils import Corpus, run_train
    corpus = Corpus(str(tmp_path / "data"), num_train=24, num_dev=6)
    config = corpus.write_config({
        "task": {"type": "example"},
        "dataset": {"feature": {"num_mel_bins": 20}, "batch_size": 6, "num_workers": 0},
        "model": {"hidden": 16, "dropout": 0.0},
        "optim": {"generator": {"lr": 0.01}, "critic": {"lr": 0.001, "start_fraction": 0.3}},
        "training": {"seed": 2, "max_epoch": 4, "log_interval": 2}}, "example.yaml")
    result = run_train(["-m", "toolkit.bin.train", "--config", config, "--exp-dir",
                        str(tmp_path / "exp"), "--train-data", corpus.train, "--dev-data",
                        corpus.dev])
    assert result.returncode == 0, result.stderr[-3000:]
    dev = [float(x) for x in re.findall(r"epoch \d+ dev: loss ([0-9.]+)", result.stderr)]
    assert len(dev) == 4 and dev[-1] < 0.8 * dev[0], dev
