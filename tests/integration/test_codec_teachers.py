"""Frozen teachers and the three training phases of the codec: teachers that the tests build
(a TorchScript module and its ONNX export), loaded frozen and kept out of optimizers,
checkpoints and exports; semantic distillation through a training-only head that
init_checkpoint leaves fresh; the perceptual loss (TorchScript only); and
egs/tts_codec/s0/conf/codec_phases.yaml trained through the real binary, its phases switching
on where the config says, a run killed before each phase boundary resuming bitwise equal to
the uninterrupted one."""
import copy
import glob
import os
import re
import time

import numpy as np
import pytest
import torch

from codec_teachers import FrameFeatures, write_teachers
from speaker_data import speaker_list
from tensorboard_reader import scalars
from test_trainer_resume import assert_same_run, newest_step
from train_utils import (ROOT, assert_none_alive, kill_tree, latest_payload, run_train,
                         start_train)

PHASES_CONFIG = os.path.join(ROOT, "egs", "tts_codec", "s0", "conf", "codec_phases.yaml")
# The recipe config at test size: 6 steps put phase 2 at step index 2 (0.3 x 6 rounded up)
# and phase 3 at step index 4 (0.6 x 6). No loader workers: the loader is not under test here
# (test_codec_task.py's resume covers a codec run's workers).
TINY = ["model.channels=4", "model.strides=[2,4,5]", "model.dilations=[1]",
        "model.kernel_size=3", "model.n_codebooks=2", "model.codebook_size=16",
        "model.codebook_dim=4", "discriminator.mpd.periods=[2,3]",
        "task.segment_seconds=0.25", "task.eval_seconds=0.5", "dataset.batch_size=3",
        "dataset.num_workers=0", "dataset.sort_window=20", "training.max_steps=6",
        "training.seed=3", "training.log_interval=1", "training.save_interval_steps=1",
        "training.val_interval_steps=0", "training.keep_last=10"]
PHASE_2, PHASE_3 = 2, 4           # step indices where the phases begin


class Corpus:
    def __init__(self, root: str):
        self.root = root
        self.train = speaker_list(root, "train", range(3), 4, 1, {})
        self.dev = speaker_list(root, "dev", range(10, 12), 1, 2, {})
        self.teachers = write_teachers(root)

    def args(self, exp: str, *overrides: str, distill_format: str = "onnx"):
        return ["-m", "toolkit.bin.train", "--config", PHASES_CONFIG, "--exp-dir", exp,
                "--train-data", self.train, "--dev-data", self.dev, *TINY,
                f"teachers.distillation.model={self.teachers[distill_format]}",
                f"teachers.perceptual.model={self.teachers['torchscript']}", *overrides]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return Corpus(str(tmp_path_factory.mktemp("codec_teachers")))


# --------------------------------------------------------------------------- units

@pytest.mark.parametrize("rates", [(24000, 16000), (16000, 24000), (44100, 16000),
                                   (16000, 44100)])
def test_differentiable_resampler_equals_the_data_pipeline_resampler(rates):
    from toolkit.data.audio import resample
    from toolkit.tasks.codec.teachers import Resampler
    orig, new = rates
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3001)).astype(np.float32)
    expected = np.stack([resample(row, orig, new) for row in x])
    source = torch.from_numpy(x).requires_grad_(True)
    got = Resampler(orig, new)(source)
    assert got.shape == expected.shape
    assert np.abs(got.detach().numpy() - expected).max() < 1e-5
    got.square().sum().backward()
    assert source.grad is not None and float(source.grad.abs().sum()) > 0


def test_teachers_load_frozen_and_both_formats_agree(tmp_path):
    from toolkit.config import DatasetConfig  # noqa: F401  (toolkit importable)
    from toolkit.tasks.codec.teachers import FrozenTeacher, TeacherConfig
    paths = write_teachers(str(tmp_path))
    cpu = torch.device("cpu")
    scripted = FrozenTeacher(TeacherConfig(model=paths["torchscript"]), "perceptual", cpu,
                             differentiable=True)
    onnx = FrozenTeacher(TeacherConfig(model=paths["onnx"]), "distillation", cpu,
                         differentiable=False)
    assert not scripted.module.training
    assert not any(p.requires_grad for p in scripted.module.parameters())
    assert scripted.feature_dim() == onnx.feature_dim() == 6
    audio = (0.1 * torch.randn(2, 24000)).requires_grad_(True)
    # The teacher reads 16 kHz: 24 kHz audio is resampled to it first (1 s -> 50 frames).
    features = scripted.features(audio, 24000)
    assert features.shape == (2, 50, 6)
    assert torch.allclose(features, onnx.features(audio, 24000), atol=1e-5)
    # The perceptual teacher passes the gradient to its input, never into its parameters.
    features.sum().backward()
    assert audio.grad is not None and float(audio.grad.abs().sum()) > 0
    assert all(p.grad is None for p in scripted.module.parameters())
    # The distillation teacher gives constants.
    assert not onnx.features(audio, 24000).requires_grad
    # (batch, dim, time) features come out as (batch, time, dim).
    transposed = FrozenTeacher(TeacherConfig(model=paths["torchscript"], time_axis=2),
                               "perceptual", cpu, differentiable=True)
    assert transposed.features(audio[:, :16000].detach(), 16000).shape == (2, 6, 50)


def test_teacher_problems_are_named(tmp_path):
    import toolkit.tasks  # noqa: F401
    from toolkit.config import ConfigError
    from toolkit.config import load_config
    from toolkit.errors import DataError, MissingInputError
    from toolkit.tasks.codec.teachers import FrozenTeacher, TeacherConfig
    paths = write_teachers(str(tmp_path))

    def refused(*overrides):
        with pytest.raises(ConfigError) as err:
            load_config(PHASES_CONFIG, list(overrides))
        return str(err.value)

    text = refused(f"teachers.perceptual.model={paths['onnx']}")
    assert "teachers.perceptual.model" in text and "ONNX" in text and "TorchScript" in text
    assert "loss.distillation" in refused("teachers.distillation.model=")
    assert "teachers.distillation.model" in refused("teachers.distillation.model=t.h5")
    assert "teachers.distillation.source" in refused("teachers.distillation.source=decoder")
    assert "teachers.distillation.loss" in refused("teachers.distillation.loss=mse")
    assert "teachers.perceptual.time_axis" in refused("teachers.perceptual.time_axis=0")
    # A switched-off teacher needs no file.
    cfg = load_config(PHASES_CONFIG, ["loss.perceptual=0", "teachers.perceptual.model="])
    assert cfg.loss.perceptual.final == 0.0
    cpu = torch.device("cpu")
    with pytest.raises(MissingInputError, match="teachers.perceptual.model"):
        FrozenTeacher(TeacherConfig(model=str(tmp_path / "none.pt")), "perceptual", cpu, True)
    with pytest.raises(DataError, match="output=2"):
        FrozenTeacher(TeacherConfig(model=paths["onnx"], output=2), "distillation", cpu,
                      False).feature_dim()
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a model")
    with pytest.raises(DataError, match="not a TorchScript model"):
        FrozenTeacher(TeacherConfig(model=str(junk)), "perceptual", cpu, True)


def test_builtin_periodicity_teacher_finds_the_period():
    """builtin:periodicity: a 200 Hz buzz peaks at the 80-sample lag in every frame, noise
    peaks nowhere near 1; one feature row per 20 ms frame plus the log energy; unknown
    built-in names are refused by the config, and the teacher needs no file."""
    import toolkit.tasks  # noqa: F401
    from toolkit.config import ConfigError, load_config
    from toolkit.tasks.codec.teachers import FrozenTeacher, TeacherConfig
    teacher = FrozenTeacher(TeacherConfig(model="builtin:periodicity"), "distillation",
                            torch.device("cpu"), differentiable=False)
    t = np.arange(16000) / 16000
    buzz = 0.1 * sum(np.sin(2 * np.pi * k * 200 * t) / k for k in range(1, 20))
    feats = teacher.features(torch.tensor(buzz, dtype=torch.float32)[None], 16000)
    assert feats.shape == (1, 50, 65) and teacher.feature_dim() == 65
    lags = teacher.module.lags.numpy()
    peaks = lags[feats[0, 5:-5, :64].argmax(-1).numpy()]
    assert np.all(np.abs(16000 / peaks - 200) < 8)
    assert feats[0, 5:-5, :64].max(-1).values.min() > 0.9
    noise = teacher.features(0.1 * torch.randn(1, 16000, generator=torch.Generator().manual_seed(0)),
                             16000)
    assert noise[0, 5:-5, :64].max(-1).values.max() < 0.5
    with pytest.raises(ConfigError, match="builtin:periodicity"):
        load_config(PHASES_CONFIG, ["teachers.distillation.model=builtin:pitchy"])


def test_distillation_and_perceptual_losses():
    from toolkit.tasks.codec.teachers import distillation_loss, perceptual_loss
    target = torch.randn(2, 10, 4)                           # (B, teacher frames, dim)
    same = target.transpose(1, 2)                            # (B, dim, frames)
    assert float(distillation_loss(same, target, "cosine")) < 1e-6
    assert float(distillation_loss(same, target, "l1")) < 1e-6
    assert float(distillation_loss(-same, target, "cosine")) == pytest.approx(2.0, abs=1e-5)
    # Teacher frames at half the code frame rate are interpolated onto the code frames.
    slow = torch.linspace(0, 1, 10).repeat(1, 4, 1)          # (1, 4, 10) codec frames
    teacher = slow[:, :, 1::2].transpose(1, 2)               # 5 frames
    assert float(distillation_loss(slow, teacher, "l1")) < 0.06
    fake, real = torch.randn(2, 7, 3, requires_grad=True), torch.randn(2, 7, 3)
    loss = perceptual_loss(fake, real)
    assert float(perceptual_loss(real, real)) == 0.0 and float(loss.detach()) > 0
    loss.backward()
    assert fake.grad is not None


@pytest.mark.parametrize("source", ["encoder", "first_stage"])
def test_step_with_teachers_under_bf16_keeps_them_frozen(source, tmp_path):
    """One step of the third phase under bf16 autocast: distillation (ONNX teacher) and
    perceptual (TorchScript teacher) terms are finite fp32 losses, the head gets a
    gradient, the teachers none and stay in eval mode."""
    import toolkit.tasks  # noqa: F401
    from toolkit.config import load_config
    from toolkit.tasks.codec.task import CodecTask
    from test_codec_task import RecordingContext
    paths = write_teachers(str(tmp_path))
    cfg = load_config(PHASES_CONFIG, [o for o in TINY] + [
        f"teachers.distillation.model={paths['onnx']}", f"teachers.distillation.source={source}",
        f"teachers.perceptual.model={paths['torchscript']}"])
    task = CodecTask(cfg)
    torch.manual_seed(0)
    modules = task.build_modules()
    rng = np.random.default_rng(0)
    batch = task.batch_of(0.1 * rng.standard_normal((2, task.segment)).astype(np.float32),
                          ["a", "b"])
    ctx = RecordingContext(modules, 5, 6)
    grads = {}
    for name in ("generator", "distill_head"):
        params = list(modules[name].parameters())
        params[0].register_hook(lambda g, name=name: grads.setdefault(name, g.clone()))
    stats = task.train_step(batch, ctx)
    assert set(stats) == set(task.metrics.train)
    assert {"distill", "perceptual", "adv_g"} <= set(stats)
    assert all(np.isfinite(v) for v in stats.values())
    assert ctx.losses == {"discriminator": torch.float32, "generator": torch.float32}
    assert set(grads) == {"generator", "distill_head"}
    teacher = task.teacher("perceptual", torch.device("cpu"))
    assert not teacher.module.training
    assert all(p.grad is None and not p.requires_grad for p in teacher.module.parameters())
    assert task.teacher("distillation", torch.device("cpu")).onnx


def test_a_changed_teacher_file_is_refused_on_resume(corpus, tmp_path):
    """The teachers' files are part of the exp dir's fingerprint: a teacher replaced under
    the same path between a run and its resume is refused, naming it; put back, the run
    resumes."""
    import shutil
    teachers = write_teachers(str(tmp_path))
    saved = str(tmp_path / "teacher.onnx.orig")
    shutil.copy(teachers["onnx"], saved)
    exp = str(tmp_path / "exp")

    def args(steps):
        return ["-m", "toolkit.bin.train", "--config", PHASES_CONFIG, "--exp-dir", exp,
                "--train-data", corpus.train, *TINY, f"training.max_steps={steps}",
                f"teachers.distillation.model={teachers['onnx']}",
                f"teachers.perceptual.model={teachers['torchscript']}"]
    first = run_train(args(1))
    assert first.returncode == 0, first.stderr[-3000:]
    (tmp_path / "other").mkdir()
    other = write_teachers(str(tmp_path / "other"), seed=4)      # same shapes, other weights
    shutil.copy(other["onnx"], teachers["onnx"])
    refused = run_train(args(2))
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert re.search(r"teachers.distillation.model \S+teacher.onnx changed since the run "
                     r"began \(sha256 \w+ -> \w+, \d+ -> \d+ bytes\): put the run's file "
                     r"back or start a new exp dir", refused.stderr), refused.stderr[-3000:]
    assert "teachers.perceptual.model" not in refused.stderr
    shutil.copy(saved, teachers["onnx"])
    again = run_train(args(2))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr


# --------------------------------------------------------------------------- the phases

@pytest.fixture(scope="module")
def phases_run(corpus, tmp_path_factory):
    exp = str(tmp_path_factory.mktemp("phases") / "exp")
    result = run_train(corpus.args(exp))
    assert result.returncode == 0, result.stderr[-3000:]
    return exp, result


def test_phases_switch_on_where_the_config_says(corpus, phases_run):
    exp, result = phases_run
    assert "distillation head" in result.stderr and "perceptual teacher" in result.stderr
    events = scalars(glob.glob(os.path.join(exp, "tensorboard", "events.out.tfevents*")))
    steps = lambda tag: [s for s, _ in events[tag]]              # noqa: E731
    for tag in ("train/mel", "train/distill", "train/commit", "train/codebook"):
        assert steps(tag) == [1, 2, 3, 4, 5, 6], tag             # phase 1 on from the start
    for tag in ("train/d_loss", "train/adv_g", "train/fm"):
        assert steps(tag) == [3, 4, 5, 6], tag                   # phase 2: step index 2 on
    assert steps("train/perceptual") == [5, 6]                   # phase 3: step index 4 on
    assert all(np.isfinite(v) for _, v in events["train/perceptual"])
    final = latest_payload(exp)
    assert final["schedules"]["discriminator"]["step_count"] == 6 - PHASE_2


def test_teachers_stay_out_of_checkpoints_optimizers_and_export(corpus, phases_run, tmp_path):
    exp, _ = phases_run
    final = latest_payload(exp)
    assert set(final["modules"]) == {"generator", "discriminator", "distill_head"}
    teacher_names = set(FrameFeatures().state_dict())
    for name, state in final["modules"].items():
        assert not teacher_names & set(state), name
    head = final["modules"]["distill_head"]
    assert head["project.weight"].shape == (6, 4 * 2 ** 3, 1)     # teacher dim x latent dim
    # The generator's optimizer steps the generator and the head, nothing else.
    import toolkit.tasks  # noqa: F401
    from toolkit.tasks.codec.model import CodecModel
    from toolkit.trainer.experiment import load_exp_config
    cfg = load_exp_config(exp)
    generator = CodecModel(cfg.model)
    sizes = sorted(p.numel() for p in generator.parameters()) + [6 * 32, 6]
    state = final["optimizers"]["generator"]["state"]
    assert sorted(s["exp_avg"].numel() for s in state.values()) == sorted(sizes)
    # The export holds the generator alone.
    from safetensors.torch import load_file
    from toolkit.trainer.checkpoint import latest_valid
    out = str(tmp_path / "export")
    result = run_train(["-m", "toolkit.bin.export_model", "--checkpoint",
                        latest_valid(exp).path, "--exp-dir", exp, "--out-dir", out,
                        "--test-data", corpus.dev, "--num-check", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    weights = load_file(os.path.join(out, "model.safetensors"))
    assert not any(k.startswith("project") or k in teacher_names for k in weights)


def test_init_checkpoint_starts_the_distillation_head_fresh(corpus, phases_run, tmp_path):
    from toolkit.trainer.checkpoint import latest_valid
    source_exp, _ = phases_run
    source = latest_payload(source_exp)
    exp = str(tmp_path / "tuned")
    result = run_train(corpus.args(exp, f"training.init_checkpoint={latest_valid(source_exp).path}",
                                   "training.max_steps=1", "optim.generator.lr=0"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"initialised generator from \S+; discriminator, distill_head start "
                     r"fresh", result.stderr)
    tuned = latest_payload(exp)
    for key, value in source["modules"]["generator"].items():
        assert torch.equal(tuned["modules"]["generator"][key], value), key
    # The head is the fresh one of this run's seed, not the trained one.
    import toolkit.tasks  # noqa: F401
    from toolkit.tasks.codec.task import CodecTask
    from toolkit.trainer.experiment import load_exp_config
    cfg = load_exp_config(exp)
    torch.manual_seed(cfg.training.seed)
    fresh = CodecTask(cfg).build_modules()["distill_head"].state_dict()
    for key, value in fresh.items():
        assert torch.equal(tuned["modules"]["distill_head"][key], value), key
        assert not torch.equal(source["modules"]["distill_head"][key], value), key


def test_frozen_parts_keep_their_weights_and_reinit_starts_the_decoder_fresh(
        corpus, phases_run, tmp_path):
    """A decoder trained on a codec's codes (task.frozen: encoder, quantizer; task.reinit:
    decoder): the frozen parts leave training as they came, and no optimizer holds them;
    the decoder starts from this run's fresh weights, not the file's, and learns."""
    import toolkit.tasks  # noqa: F401
    from toolkit.tasks.codec.task import CodecTask
    from toolkit.trainer.checkpoint import latest_valid
    from toolkit.trainer.experiment import load_exp_config
    source_exp, _ = phases_run
    source = latest_payload(source_exp)["modules"]["generator"]
    exp = str(tmp_path / "decoder_only")
    result = run_train(corpus.args(exp, f"training.init_checkpoint={latest_valid(source_exp).path}",
                                   "task.frozen=[encoder,quantizer]", "task.reinit=[decoder]",
                                   "training.max_steps=2"))
    assert result.returncode == 0, result.stderr[-3000:]
    tuned = latest_payload(exp)
    generator = tuned["modules"]["generator"]
    cfg = load_exp_config(exp)
    torch.manual_seed(cfg.training.seed)
    fresh = CodecTask(cfg).build_modules()["generator"].state_dict()
    decoder = [k for k in generator if k.startswith("decoder.")]
    assert decoder and all(k.startswith(("encoder.", "quantizer.", "decoder.")) for k in generator)
    for key, value in generator.items():
        if key in decoder:
            assert not torch.equal(value, source[key]), key
        else:
            assert torch.equal(value, source[key]), key
    # Fresh, then trained: some decoder tensor moved from this seed's initialisation.
    assert any(not torch.equal(generator[k], fresh[k]) for k in decoder)
    held = sum(len(group["params"]) for group in
               tuned["optimizers"]["generator"]["param_groups"])
    # The generator's optimizer: the decoder and the distillation head, no frozen tensor.
    head = tuned["modules"].get("distill_head", {})
    assert held == len(decoder) + len(head)


def test_frozen_and_reinit_errors_name_the_key(corpus, tmp_path):
    import toolkit.tasks  # noqa: F401
    from toolkit.config import ConfigError, load_config
    for overrides, key in ((["task.frozen=[encoder]"], "training.init_checkpoint"),
                           (["task.frozen=[decoder]", "training.init_checkpoint=x.pt"],
                            "task.frozen"),
                           (["task.reinit=[head]"], "task.reinit"),
                           (["task.frozen=[encoder]", "task.reinit=[encoder]",
                             "training.init_checkpoint=x.pt"], "task.reinit")):
        with pytest.raises(ConfigError, match=key):
            load_config(PHASES_CONFIG, overrides)


def _kill_after_checkpoint(args, exp, step: int) -> None:
    """Starts the run and SIGKILLs it (with its loader workers) as soon as the checkpoint
    of `step` exists: the next phase begins with step index `step`."""
    proc = start_train(args)                 # forked from the test zygote, own session
    deadline = time.time() + 180
    while proc.poll() is None and newest_step(exp) < step and time.time() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be killed"
    kill_tree(proc)


def test_killed_before_each_phase_boundary_resumes_bitwise(corpus, phases_run, tmp_path):
    """SIGKILL right after the last checkpoint before phase 2, rerun (killed again right
    before phase 3), rerun to the end: every module, optimizer, schedule and random stream
    equals the uninterrupted run's."""
    from toolkit.trainer.checkpoint import latest_valid
    reference_exp, _ = phases_run
    exp = str(tmp_path / "killed")
    args = corpus.args(exp)
    resumed_at = []
    for boundary in (PHASE_2, PHASE_3):
        _kill_after_checkpoint(args, exp, boundary)
        resumed_at.append(latest_valid(exp).step)
    result = run_train(args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_none_alive(naming=exp)          # each kill checked its own; nothing lives on
    # Each rerun started before the boundary it then crossed.
    assert resumed_at[0] <= PHASE_2 < resumed_at[1] <= PHASE_3, resumed_at
    assert_same_run(latest_payload(reference_exp), latest_payload(exp))
    log = open(os.path.join(exp, "log", "train.rank0.log")).read()
    assert log.count("resumed from") == 2
