"""The codec task on the generic trainer, through the real binaries: the adversarial phase
(generator alone first, then both optimizers), exact SIGKILL resume with both optimizers
(1 process with bf16 autocast, 2 gloo ranks with fp16 and GradScalers), the fp32 islands
of a bf16 step, fine-tuning from a safetensors export, secrets kept out of every file,
export parity, the encode/decode CLI and the evaluation table with baselines. Models are a
few ten thousand parameters on 0.25 s segments; runs are forked from the test zygote (two
ranks too: torchrun itself is test_trainer_resume's), without data-loader workers except
where a resume covers them, so the file runs in about a minute on one core."""
import contextlib
import copy
import glob
import json
import os
import random
import shutil
import sys

import numpy as np
import pytest
import soundfile as sf
import torch

from speaker_data import speaker_list
from tensorboard_reader import scalars
from test_trainer_resume import assert_same_run, train_with_kills
from train_utils import latest_payload, run_train

PHASE = {"initial": 0.0, "start": 0.5, "end": 0.5, "shape": "step"}
CONFIG = {
    "task": {"type": "codec", "segment_seconds": 0.25, "eval_seconds": 0.5},
    "dataset": {"volume_range": [0.6, 1.0], "speed_perturb": [0.95, 1.0, 1.05],
                "batch_size": 3, "sort_window": 20, "num_workers": 0},
    "model": {"channels": 4, "strides": [2, 4, 5], "dilations": [1, 3], "n_codebooks": 2,
              "codebook_size": 16, "codebook_dim": 4, "causal": True},
    "discriminator": {"mpd": {"periods": [2, 3], "channels": [4, 8, 8], "max_channels": 8},
                      "mrsd": {"n_ffts": [128], "filters": 4, "dilations": [1],
                               "kernel_size": [3, 5]}},
    "loss": {"mel_window_lengths": [64, 256, 1024], "mel_n_mels": [10, 40, 80],
             "adversarial": dict(PHASE, final=1.0), "feature_matching": dict(PHASE, final=2.0)},
    "optim": {"generator": {"lr": 0.002, "scheduler": {"type": "exponential", "gamma": 0.98}},
              "discriminator": {"lr": 0.002, "start_fraction": 0.5}},
    "training": {"seed": 5, "max_steps": 4, "log_interval": 1,
                 "save_interval_steps": 1, "keep_last": 10, "keep_best": 1},
}
SECRET, ENV_SECRET = "c0dec-S3CRET-token", "envtok-C0DEC-987654"


class Corpus:
    def __init__(self, root: str):
        self.root = root
        self.train = speaker_list(root, "train", range(3), 4, 1, {})
        # Two dev utterances, validated at every epoch end.
        self.dev = speaker_list(root, "dev", range(10, 12), 1, 2, {})
        self.config = self.write_config(CONFIG)

    def first(self, n: int) -> str:
        """A list of the first `n` training utterances: n / batch_size steps per epoch, for
        the tests that count epochs (batches of 3, not of all 12: a quarter of the work)."""
        path = os.path.join(self.root, f"first{n}.list")
        with open(self.train) as f, open(path, "w") as out:
            out.writelines(f.readlines()[:n])
        return path

    def write_config(self, config: dict, name: str = "codec.yaml") -> str:
        import yaml
        path = os.path.join(self.root, name)
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        return path

    def train_args(self, exp: str, *overrides: str, config: str = None, train: str = None):
        return ["-m", "toolkit.bin.train", "--config", config or self.config, "--exp-dir", exp,
                "--train-data", train or self.train, "--dev-data", self.dev, *overrides]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return Corpus(str(tmp_path_factory.mktemp("codec_data")))


def payload(path: str) -> dict:
    from toolkit.trainer.checkpoint import load_payload
    return load_payload(path)


def checkpoint_at(exp: str, step: int) -> str:
    from toolkit.trainer.checkpoint import list_checkpoints
    found = [c.path for c in list_checkpoints(exp) if c.step == step]
    assert found, f"no checkpoint of step {step} in {exp}"
    return found[0]


def same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def fresh_modules(corpus, seed: int):
    """The modules as the trainer initialises them (seeded, before any step)."""
    import toolkit.tasks  # noqa: F401
    from toolkit.config import validate
    from toolkit.tasks.codec.task import CodecTask
    raw = copy.deepcopy(CONFIG)
    raw["training"]["seed"] = seed
    task = CodecTask(validate(raw))
    torch.manual_seed(seed)
    return {n: m.state_dict() for n, m in task.build_modules().items()}


@pytest.fixture(scope="module")
def phase_run(corpus, tmp_path_factory):
    """4 steps, the discriminators switched on at 50 %: steps 1-2 train the generator
    alone, steps 3-4 both. A dataset token rides along in the config and the environment."""
    exp = str(tmp_path_factory.mktemp("phase") / "exp")
    result = run_train(corpus.train_args(exp, f"dataset.auth_token={SECRET}"),
                       extra_env={"TOOLKIT_DATA_TOKEN": ENV_SECRET, "MY_API_TOKEN": ENV_SECRET})
    assert result.returncode == 0, result.stderr[-3000:]
    return exp, result


def test_generator_alone_before_the_phase_then_both_modules_step(corpus, phase_run):
    exp, _ = phase_run
    init = fresh_modules(corpus, CONFIG["training"]["seed"])
    states = {s: payload(checkpoint_at(exp, s)) for s in (1, 2, 3, 4)}
    # Before the phase: the generator moves, the discriminator keeps its initial weights
    # and its optimizer has taken no step.
    assert not same(init["generator"], states[1]["modules"]["generator"])
    assert not same(states[1]["modules"]["generator"], states[2]["modules"]["generator"])
    for s in (1, 2):
        assert same(init["discriminator"], states[s]["modules"]["discriminator"])
        assert not states[s]["optimizers"]["discriminator"]["state"]
    # One adversarial step with both optimizers changes both modules.
    for name in ("generator", "discriminator"):
        assert not same(states[2]["modules"][name], states[3]["modules"][name]), name
    assert states[3]["optimizers"]["discriminator"]["state"]


def test_discriminator_phase_starts_at_its_fraction(phase_run):
    exp, result = phase_run
    final = latest_payload(exp)
    assert final["step"] == 4
    # The discriminator's schedule counts only its own steps (4 - ceil(0.5 * 4)).
    assert final["schedules"]["discriminator"]["step_count"] == 2
    assert final["schedules"]["generator"]["step_count"] == 4
    events = scalars(glob.glob(os.path.join(exp, "tensorboard", "events.out.tfevents*")))
    for tag in ("train/d_loss", "train/adv_g", "train/fm", "train/lr_discriminator"):
        assert [s for s, _ in events[tag]] == [3, 4], tag
    for tag in ("train/mel", "train/commit", "train/codebook", "train/total"):
        assert [s for s, _ in events[tag]] == [1, 2, 3, 4], tag
    for tag in ("dev/mel_distance", "dev/stft_distance", "dev/si_sdr"):
        assert events[tag] and all(np.isfinite(v) for _, v in events[tag]), tag
    assert "d_loss" not in result.stderr.split("step 2/4")[1].split("\n")[0]
    assert "d_loss" in result.stderr.split("step 3/4")[1].split("\n")[0]


def test_dataset_token_is_written_nowhere(phase_run):
    exp, result = phase_run
    files = [p for p in glob.glob(os.path.join(exp, "**", "*"), recursive=True)
             + glob.glob(os.path.join(exp, ".*", "*")) if os.path.isfile(p)]
    assert any("events.out.tfevents" in p for p in files)
    assert any(p.endswith(".pt") for p in files) and any(p.endswith(".log") for p in files)
    for text in (SECRET, ENV_SECRET):
        assert text not in result.stderr and text not in result.stdout
        for path in files:
            assert text.encode() not in open(path, "rb").read(), f"secret found in {path}"


# --------------------------------------------------------------------------- how long

def test_max_steps_alone_trains_past_ten_epochs(corpus, tmp_path):
    """One step per epoch (3 utterances, batches of 3) and max_steps=12 with no
    max_epoch: training runs the 12 steps over 12 epochs; no epoch default cuts it short."""
    exp = str(tmp_path / "exp")
    result = run_train(corpus.train_args(exp, "training.max_steps=12",
                                         "training.save_interval_steps=100", train=corpus.first(3)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 optimizer steps/epoch" in result.stderr
    final = latest_payload(exp)
    assert (final["step"], final["epoch"]) == (12, 12)
    assert "training finished: 12 steps (training.max_steps=12 reached at epoch 12)" \
        in result.stderr
    assert "step 12/12" in result.stderr           # the ETA counts towards max_steps
    # The phase at 0.5 of 12 steps: the discriminator took 6 steps.
    assert final["schedules"]["discriminator"]["step_count"] == 6
    assert final["phase_starts"] == {"generator": 0, "discriminator": 6}


def test_both_limits_the_first_reached_ends_and_is_named(corpus, tmp_path):
    exp = str(tmp_path / "exp")
    result = run_train(corpus.train_args(exp, "training.max_steps=12", "training.max_epoch=3",
                                         train=corpus.first(3)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert latest_payload(exp)["step"] == 3
    assert "training finished: 3 steps (training.max_epoch=3 reached at step 3)" in result.stderr
    assert "step 3/3" in result.stderr
    exp2 = str(tmp_path / "exp2")
    result = run_train(corpus.train_args(exp2, "training.max_steps=2", "training.max_epoch=3",
                                         train=corpus.first(3)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "training finished: 2 steps (training.max_steps=2 reached at epoch 2)" in result.stderr


def test_no_limit_given_is_one_error_line(corpus, tmp_path):
    raw = copy.deepcopy(CONFIG)
    del raw["training"]["max_steps"]
    config = corpus.write_config(raw, "no_limit.yaml")
    result = run_train(corpus.train_args(str(tmp_path / "exp"), config=config))
    assert result.returncode == 2
    assert "error: training.max_epoch or training.max_steps must be given" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_begun_phase_stays_on_when_max_steps_grows(corpus, phase_run, tmp_path):
    """4 steps with the phase at 0.5 (the discriminators start at step index 2: a copy of
    phase_run's exp dir), then a resume with max_steps=12: the phase would now begin at
    step index 6, but it had begun, so steps 5-12 keep training the discriminators with
    the adversarial terms on."""
    exp = str(tmp_path / "exp")
    shutil.copytree(phase_run[0], exp)
    assert latest_payload(exp)["step"] == 4
    assert latest_payload(exp)["schedules"]["discriminator"]["step_count"] == 2
    again = run_train(corpus.train_args(exp, f"dataset.auth_token={SECRET}",
                                         "training.max_steps=12",
                                         "training.save_interval_steps=100"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "allowed configuration change on resume: training.max_steps: 4 -> 12" in again.stderr
    final = latest_payload(exp)
    assert final["step"] == 12
    assert final["schedules"]["discriminator"]["step_count"] == 10
    for step in (5, 6, 12):
        line = again.stderr.split(f"step {step}/12")[1].split("\n")[0]
        assert "d_loss" in line and "adv_g" in line, line
    assert final["phase_starts"]["discriminator"] == 2
    assert final["ramp_totals"] == [[0, 4], [4, 12]]


def test_plateau_schedule_counts_no_validation_before_its_phase(corpus, tmp_path):
    """A reduce_on_plateau discriminator schedule with validation at every step: the
    validations before the phase (steps 1-2 of 4) judge steps it never took and are not
    counted; from its first step on they are. Two steps per epoch: steps 1 and 3 validate
    mid-epoch, steps 2 and 4 at an epoch end."""
    exp = str(tmp_path / "exp")
    result = run_train(corpus.train_args(
        exp, "training.max_steps=4", "training.val_interval_steps=1",
        "optim.discriminator.scheduler.type=reduce_on_plateau",
        "optim.discriminator.scheduler.patience=0", train=corpus.first(6)))
    assert result.returncode == 0, result.stderr[-3000:]
    for step in (1, 2):
        sched = payload(checkpoint_at(exp, step))["schedules"]["discriminator"]
        assert (sched["best"], sched["bad_validations"], sched["scale"]) == \
            (float("inf"), 0, 1.0), (step, sched)
    for step in (3, 4):
        state = payload(checkpoint_at(exp, step))["schedules"]
        assert np.isfinite(state["discriminator"]["best"]), step
        assert state["generator"]["step_count"] == step


# --------------------------------------------------------------------------- fp32 islands

class RecordingContext:
    """The StepContext contract on bare modules, bf16 autocast, recording loss dtypes."""

    def __init__(self, modules, step, total):
        self.modules, self.step_index, self.total_steps = modules, step, total
        self.device = torch.device("cpu")
        self.losses = {}

    def module(self, name):
        return self.modules[name]

    raw = module

    def autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16)

    def fp32(self):
        return torch.autocast("cpu", enabled=False)

    def active(self, optimizer):
        return True

    @contextlib.contextmanager
    def frozen(self, *names):
        params = [p for n in names for p in self.modules[n].parameters()]
        for p in params:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in params:
                p.requires_grad_(True)

    def value(self, ramp):
        return ramp.value(self.step_index, self.total_steps)

    def backward(self, loss, optimizer):
        self.losses[optimizer] = loss.dtype
        loss.backward()

    def step(self, optimizer):
        for p in self.modules[optimizer].parameters():
            p.grad = None


def test_quantizer_and_loss_spectrograms_stay_fp32_under_bf16(monkeypatch):
    import toolkit.tasks  # noqa: F401
    from toolkit.config import validate
    from toolkit.task import Batch
    from toolkit.tasks.codec import discriminators, losses
    from toolkit.tasks.codec.task import CodecTask
    task = CodecTask(validate(copy.deepcopy(CONFIG)))
    torch.manual_seed(0)
    modules = task.build_modules()
    seen = {"encoder": [], "quantizer": [], "mel_stft": [], "disc_stft": []}
    g = modules["generator"]
    g.encoder.register_forward_hook(lambda m, i, o: seen["encoder"].append(o.dtype))
    mel_stft, disc_stft = losses.stft_magnitude, discriminators.stft

    def record(key, fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            seen[key].append(out.dtype)
            return out
        return wrapped
    quantize = g.quantizer.quantize
    monkeypatch.setattr(g.quantizer, "quantize", lambda z, n_q=None: record_floats(quantize(z, n_q)))

    def record_floats(out):
        seen["quantizer"].append(tuple(t.dtype for t in out if t.is_floating_point()))
        return out
    monkeypatch.setattr(losses, "stft_magnitude", record("mel_stft", mel_stft))
    monkeypatch.setattr(discriminators, "stft", record("disc_stft", disc_stft))
    wave = 0.1 * torch.randn(2, task.segment)
    batch = Batch(["a", "b"], {"audio": wave, "lengths": torch.full((2,), task.segment)})
    ctx = RecordingContext(modules, 3, 4)
    stats = task.train_step(batch, ctx)
    assert set(stats) == set(task.metrics.train)
    assert seen["encoder"] == [torch.bfloat16]         # autocast really is on
    assert seen["quantizer"] == [(torch.float32,) * 3]  # z_q, commitment, codebook losses
    assert seen["mel_stft"] and set(seen["mel_stft"]) == {torch.float32}
    assert seen["disc_stft"] and set(seen["disc_stft"]) == {torch.complex64}
    assert ctx.losses == {"discriminator": torch.float32, "generator": torch.float32}
    assert all(np.isfinite(v) for v in stats.values())


# --------------------------------------------------------------------------- config

def test_config_checks_name_the_keys():
    import toolkit.tasks  # noqa: F401
    from toolkit.config import ConfigError
    from toolkit.config import validate

    def check(change, *words):
        raw = copy.deepcopy(CONFIG)
        change(raw)
        with pytest.raises(ConfigError) as err:
            validate(raw)
        for word in words:
            assert word in str(err.value)

    check(lambda r: r["optim"]["discriminator"].update(start_fraction=0.8),
          "optim.discriminator.start_fraction", "loss.adversarial", "after")
    check(lambda r: r["optim"]["discriminator"].update(start_fraction=0.1),
          "optim.discriminator.start_fraction", "loss.adversarial", "before")
    check(lambda r: r["dataset"].update(sample_rate=8000), "dataset.sample_rate",
          "model.sample_rate")
    check(lambda r: r["discriminator"].update(use_mpd=False, use_mrsd=False),
          "discriminator.use_mpd")
    check(lambda r: r["discriminator"]["mrsd"].update(n_ffts=[4]), "discriminator.mrsd.n_ffts")
    # The defaults agree with each other: the discriminator starts with the adversarial loss.
    cfg = validate({"task": {"type": "codec"},
                    "optim": {"generator": {}, "discriminator": {"lr": 3e-4}},
                    "training": {"max_steps": 100}})
    assert cfg.optim["discriminator"].start_fraction == pytest.approx(0.1)
    assert cfg.optim["discriminator"].lr == pytest.approx(3e-4)
    assert cfg.optim["generator"].start_fraction == 0.0
    assert cfg.loss.adversarial.active_from() == pytest.approx(0.1)


# --------------------------------------------------------------------------- resume

RESUME = {
    "codec-1proc-bf16": (0, ["training.use_amp=true", "training.amp_dtype=bfloat16"], 2),
    "codec-2ranks-fp16": (2, ["training.use_amp=true", "training.amp_dtype=float16"], 1),
}


@pytest.mark.parametrize("case", sorted(RESUME))
def test_killed_codec_runs_end_bitwise_identical(corpus, tmp_path, case):
    nproc, overrides, kills = RESUME[case]
    # A loader worker: its random streams (speed and volume perturbation) resume too.
    overrides = overrides + ["training.max_steps=8", "training.save_interval_steps=2",
                             "training.keep_last=2", "training.log_interval=2",
                             "dataset.num_workers=1"]
    ref_exp = str(tmp_path / "reference")
    result = run_train(corpus.train_args(ref_exp, *overrides), nproc)
    assert result.returncode == 0, result.stderr[-3000:]
    reference = latest_payload(ref_exp)
    exp = str(tmp_path / "killed")
    rng = random.Random(4321 + nproc)
    points = sorted(rng.sample(range(1, 6), kills))
    # Killing a real torchrun's tree is covered by the kws and speaker cases.
    hits = train_with_kills(corpus.train_args(exp, *overrides), nproc, points, exp, rng,
                            torchrun=False)
    assert hits >= 1
    resumed = latest_payload(exp)
    assert_same_run(reference, resumed)
    assert set(resumed["optimizers"]) == {"generator", "discriminator"}
    assert resumed["schedules"]["discriminator"]["step_count"] == 4
    if "fp16" in case:
        # Both GradScalers resumed; the generator's backed off from 2^16 (its first mel-loss
        # gradients overflow fp16 there: those updates are skipped, as GradScaler does).
        assert set(resumed["scalers"]) == {"generator", "discriminator"}
        assert resumed["scalers"]["generator"]["scale"] < 2.0 ** 16
    assert "resumed from" in open(os.path.join(exp, "log", "train.rank0.log")).read()


# --------------------------------------------------------------------------- export

@pytest.fixture(scope="module")
def exported(corpus, phase_run, tmp_path_factory):
    exp, _ = phase_run
    out = str(tmp_path_factory.mktemp("export") / "export")
    result = run_train(["-m", "toolkit.bin.export_model", "--checkpoint", checkpoint_at(exp, 4),
                        "--exp-dir", exp, "--out-dir", out, "--test-data", corpus.dev,
                        "--num-check", "2"])
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result.stderr


def test_export_parity_and_metadata(corpus, phase_run, exported):
    from toolkit.export import onnx_runner, read_metadata
    from toolkit.tasks.codec.export import load_safetensors_model
    out, log = exported
    assert sorted(os.listdir(out)) == ["config.json", "decoder.onnx", "decoder.zip",
                                       "encoder.onnx", "encoder.zip", "model.safetensors"]
    assert "max diff" in log
    meta = read_metadata(os.path.join(out, "encoder.onnx"))
    assert meta == read_metadata(os.path.join(out, "decoder.zip"))
    assert (meta["sample_rate"], meta["hop"], meta["n_codebooks"], meta["codebook_size"]) == \
        (16000, 40, 2, 16)
    assert meta["frame_rate"] == 400.0 and meta["bitrate"] == 3200.0 and meta["causal"] is True
    side = json.load(open(os.path.join(out, "config.json")))
    assert side["model"]["channels"] == 4 and side["fingerprint"] == meta["fingerprint"]
    # Our own check on real utterances of other lengths and a batch of two: codes equal,
    # decoded audio within 1e-4, for both graph formats.
    model = load_safetensors_model(os.path.join(out, "model.safetensors"))
    waves = [sf.read(json.loads(line)["wav"], dtype="float32")[0]
             for line in open(corpus.dev)][:2]
    n = min(len(w) for w in waves) // 40 * 40 - 40 * 7
    wav = np.stack([w[:n] for w in waves])[:, None]
    expected = model.encode(torch.from_numpy(wav))
    audio = model.decode(expected).numpy()
    runners = {"onnx": [onnx_runner(os.path.join(out, f"{p}.onnx")) for p in ("encoder", "decoder")],
               "torch": [torch.jit.load(os.path.join(out, f"{p}.zip")).eval()
                         for p in ("encoder", "decoder")]}
    for backend, (enc, dec) in runners.items():
        if backend == "torch":
            codes = enc(torch.from_numpy(wav)).numpy()
            decoded = dec(torch.from_numpy(codes)).detach().numpy()
        else:
            codes, = enc(wav)
            decoded, = dec(codes)
        assert np.array_equal(codes, expected.numpy()), backend
        assert np.abs(decoded - audio).max() < 1e-4, backend
        assert decoded.shape == (2, 1, n)
    # The inference weights are the checkpoint's (weight norm folded in).
    from toolkit.tasks.codec.model import CodecModel, remove_weight_norm
    exp, _ = phase_run
    trained = CodecModel(model.config)
    trained.load_state_dict(payload(checkpoint_at(exp, 4))["modules"]["generator"])
    trained = remove_weight_norm(trained.eval())
    assert torch.equal(trained.encode(torch.from_numpy(wav)), expected)


def test_init_from_safetensors_export(corpus, phase_run, exported, tmp_path):
    """Generator from the export (strict), discriminator fresh, nothing else restored: with
    zero learning rates one step leaves the loaded weights as they were."""
    from safetensors.torch import load_file
    from toolkit.tasks.codec.model import CodecModel, CodecConfig, remove_weight_norm
    out, _ = exported
    source_exp, _ = phase_run
    exp = str(tmp_path / "finetune")
    init = os.path.join(out, "model.safetensors")
    result = run_train(corpus.train_args(exp, "--init-checkpoint", init, "training.max_steps=1",
                                         "training.seed=99", "optim.generator.lr=0",
                                         "optim.discriminator.lr=0"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "initialised generator from" in result.stderr
    assert "discriminator start fresh" in result.stderr
    tuned = latest_payload(exp)
    assert tuned["step"] == 1
    assert tuned["schedules"]["generator"]["step_count"] == 1
    assert not tuned["optimizers"]["discriminator"]["state"]
    model = CodecModel(CodecConfig(**{k: v for k, v in CONFIG["model"].items()}))
    model.load_state_dict(tuned["modules"]["generator"])
    folded = remove_weight_norm(model).state_dict()
    exported_weights = load_file(init)
    assert folded.keys() == exported_weights.keys()
    for key, value in exported_weights.items():
        assert torch.allclose(folded[key], value, rtol=1e-5, atol=1e-7), key
    source = latest_payload(source_exp)["modules"]["discriminator"]
    fresh = tuned["modules"]["discriminator"]
    assert not same(source, fresh)
    assert same(fresh, fresh_modules(corpus, 99)["discriminator"])


# --------------------------------------------------------------------------- CLI

@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
def test_codec_cli_round_trip_and_wrong_model(corpus, phase_run, exported, tmp_path, capsys):
    import toolkit.tasks  # noqa: F401
    from toolkit.bin import codec as codec_bin
    from toolkit.trainer.experiment import load_exp_config
    from toolkit.tasks.codec.runtime import ExportedCodec, read_codes
    from toolkit.tasks.codec.task import CodecTask
    out, _ = exported
    wav = json.loads(open(corpus.dev).readline())["wav"]
    original, rate = sf.read(wav, dtype="float32")
    codes_path, decoded_path = str(tmp_path / "utt.codes"), str(tmp_path / "utt.wav")
    # The binary in process (its @cli wrapper included), as test_codec_cli.py runs it.
    assert codec_bin.main(["encode", "--model", out, "--chunk-seconds", "0.1", wav,
                           codes_path]) == 0, capsys.readouterr().err[-2000:]
    assert codec_bin.main(["decode", "--model", out, "--backend", "torch", "--chunk-seconds",
                           "0.15", codes_path, decoded_path]) == 0, capsys.readouterr().err[-2000:]
    decoded, decoded_rate = sf.read(decoded_path, dtype="float32")
    assert decoded_rate == rate == 16000 and len(decoded) == len(original)
    # Chunked encoding gives the codes of the whole file; chunked decoding its audio (to
    # rounding and 16-bit PCM).
    codec = ExportedCodec(out, "onnx")
    data = read_codes(codes_path, codec)
    assert data["codes"].dtype == np.int64 and data["length"] == len(original)
    assert np.array_equal(data["codes"], codec.encode(original))
    whole = np.clip(codec.decode(data["codes"], len(original)), -1, 1)
    assert np.abs(decoded - whole).max() < 2e-4
    with np.load(codes_path) as raw:
        assert raw["codes"].dtype == np.int16 and raw["codes"].shape == (2, -(-len(original) // 40))
    # Codes of one model are refused by another, in one line.
    exp, _ = phase_run
    other = str(tmp_path / "other_export")
    CodecTask(load_exp_config(exp)).export(checkpoint_at(exp, 2), other, corpus.dev, num_check=1)
    capsys.readouterr()
    assert codec_bin.main(["decode", "--model", other, codes_path,
                           str(tmp_path / "wrong.wav")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "fingerprint" in err and "decode with the model that encoded it" in err
    assert not os.path.exists(tmp_path / "wrong.wav")


def test_evaluate_codec_writes_table_with_baselines(corpus, exported, tmp_path, monkeypatch,
                                                    capsys):
    from toolkit.bin import evaluate_codec
    out, _ = exported
    report = str(tmp_path / "eval")
    capsys.readouterr()
    assert evaluate_codec.main(["--model", out, "--test-data", corpus.dev, "--out-dir", report,
                                "--max-utts", "1", "--baseline", "mulaw:8000:8", "--baseline",
                                "melgl:40:50:4"]) == 0, capsys.readouterr().err[-2000:]
    stdout = capsys.readouterr().out
    table = open(os.path.join(report, "results.md")).read()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows[1:]] == [
        "codec", "mu-law 8 kHz 8 bit", "mel+Griffin-Lim 40 mels 50 fps 4 bit"]
    assert [r.split("|")[2].strip() for r in rows[1:]] == ["3.2", "64", "8"]
    assert "n/a" not in table and all(r in stdout for r in rows)
    summary = json.load(open(os.path.join(report, "results.json")))
    assert summary["utterances"] == 1                   # --max-utts of the 2 in the list
    mulaw = summary["systems"][1]
    assert mulaw["si_sdr"] > 20 and 0.9 < mulaw["stoi"] <= 1.0
    assert open(os.path.join(report, "spectrograms.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # Without pystoi the table is refused with the fix, not filled with gaps.
    monkeypatch.setitem(sys.modules, "pystoi", None)
    other = str(tmp_path / "eval_no_stoi")
    assert evaluate_codec.main(["--model", out, "--test-data", corpus.dev, "--out-dir", other,
                                "--max-utts", "1"]) == 2
    assert "pystoi" in capsys.readouterr().err
    monkeypatch.delitem(sys.modules, "pystoi")
    # A malformed baseline is a usage error.
    with pytest.raises(SystemExit) as exit_info:
        evaluate_codec.main(["--model", out, "--test-data", corpus.dev, "--out-dir", other,
                             "--baseline", "mulaw:8"])
    assert exit_info.value.code == 2 and "mulaw:TARGET_RATE:BITS" in capsys.readouterr().err
