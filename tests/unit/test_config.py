"""Config schema: loading the recipe config, key-path errors, overrides, secret redaction."""
import os

import pytest
import yaml

from toolkit.config import (Config, ConfigError, apply_overrides, dump_config, is_redacted,
                            load_yaml, redact, same_value, to_dict)
from toolkit.config import load_config, validate
from toolkit.tasks.kws.losses import MaxPoolingLoss
from toolkit.tasks.kws.models import MODELS
from toolkit.tasks.kws.models.ds_tcn import DSTCN

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(REPO, "egs", "wake_word", "s0", "conf", "ds_tcn.yaml")


@pytest.fixture
def raw():
    return load_yaml(RECIPE)


def test_recipe_config_loads_with_file_values():
    raw = load_yaml(RECIPE)
    cfg = load_config(RECIPE)
    assert isinstance(cfg, Config)
    assert isinstance(cfg.model, DSTCN.Config)
    assert isinstance(cfg.loss, MaxPoolingLoss.Config)
    # Values come from the file, not the dataclass defaults.
    assert cfg.model.hidden_dim == raw["model"]["hidden_dim"]
    assert cfg.model.dilations == raw["model"]["dilations"]
    assert cfg.loss.min_duration == raw["loss"]["min_duration"]
    assert cfg.training.max_epoch == raw["training"]["max_epoch"]
    assert cfg.optim.lr == pytest.approx(raw["optim"]["lr"])
    assert cfg.optim.scheduler.warmup_steps == raw["optim"]["scheduler"]["warmup_steps"]
    assert cfg.dataset.spec_aug.max_freq_width == raw["dataset"]["spec_aug"]["max_freq_width"]
    # YAML ints for float fields become floats; ints stay ints.
    assert isinstance(cfg.dataset.feature.frame_length_ms, float)
    assert isinstance(cfg.training.grad_clip, float)
    assert type(cfg.training.max_epoch) is int


@pytest.mark.parametrize("section, key, path", [
    ([], "bogus_section", "bogus_section"),
    (["training"], "max_epochs", "training.max_epochs"),
    (["dataset", "feature"], "foo", "dataset.feature.foo"),
    (["optim", "scheduler"], "warmup", "optim.scheduler.warmup"),
    (["model"], "foo", "model.foo"),
    (["loss"], "min_dur", "loss.min_dur"),
])
def test_unknown_key_names_full_path(raw, section, key, path):
    node = raw
    for name in section:
        node = node[name]
    node[key] = 1
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert path in str(err.value)


def test_unknown_key_from_file_names_file_and_path(tmp_path, raw):
    raw["dataset"]["feature"]["foo"] = 3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    msg = str(err.value)
    assert str(path) in msg and "dataset.feature.foo" in msg


@pytest.mark.parametrize("override, path", [
    ("training.max_epoch=abc", "training.max_epoch"),
    ("training.max_epoch=true", "training.max_epoch"),     # bool is not an int
    ("training.max_epoch=2.5", "training.max_epoch"),
    ("training.use_amp=1", "training.use_amp"),            # int is not a bool
    ("optim.lr=fast", "optim.lr"),
    ("optim.lr=false", "optim.lr"),
    ("dataset.speed_perturb=0.9", "dataset.speed_perturb"),
    ("dataset.speed_perturb=[0.9,abc]", "dataset.speed_perturb[1]"),
    ("model.hidden_dim=wide", "model.hidden_dim"),
    ("model.dilations=[1,x]", "model.dilations[1]"),
    ("dataset.feature=3", "dataset.feature"),
])
def test_wrong_types_rejected(override, path):
    with pytest.raises(ConfigError) as err:
        load_config(RECIPE, [override])
    assert path in str(err.value)


def test_overrides_applied_and_typed():
    cfg = load_config(RECIPE, ["training.max_epoch=3", "dataset.speed_perturb=[0.9,1.0,1.1]",
                               "model.type=ds_tcn", "model.hidden_dim=32", "optim.lr=1",
                               "dataset.feature.num_mel_bins=80"])
    assert cfg.training.max_epoch == 3 and type(cfg.training.max_epoch) is int
    assert cfg.dataset.speed_perturb == [0.9, 1.0, 1.1]
    assert all(isinstance(v, float) for v in cfg.dataset.speed_perturb)
    assert isinstance(cfg.model, DSTCN.Config) and cfg.model.type == "ds_tcn"
    assert cfg.model.hidden_dim == 32
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.dataset.feature.num_mel_bins == 80
    # Other values from the file are untouched by overrides.
    assert cfg.model.kernel_size == load_yaml(RECIPE)["model"]["kernel_size"]


def test_overrides_do_not_mutate_input_and_create_sections(raw):
    before = yaml.safe_dump(raw)
    out = apply_overrides(raw, ["training.max_epoch=7", "dataset.noise.prob=0.5"])
    assert yaml.safe_dump(raw) == before
    assert out["training"]["max_epoch"] == 7
    assert out["dataset"]["noise"] == {"prob": 0.5}
    with pytest.raises(ConfigError):
        apply_overrides(raw, ["training.max_epoch.x=1"])   # max_epoch is not a section
    with pytest.raises(ConfigError):
        apply_overrides(raw, ["no_equals_sign"])
    with pytest.raises(ConfigError):
        apply_overrides(raw, ["bad key=1"])


def test_value_checks():
    with pytest.raises(ConfigError, match="speed_perturb"):
        load_config(RECIPE, ["dataset.speed_perturb=[0.9,0.0]"])
    with pytest.raises(ConfigError, match="volume_range"):
        load_config(RECIPE, ["dataset.volume_range=[1.5,0.5]"])
    with pytest.raises(ConfigError, match=r"vtlp_range: warp factors must lie in \[0.5, 2.0\]"):
        load_config(RECIPE, ["dataset.vtlp_range=[0.0,1.1]"])
    assert load_config(RECIPE, ["dataset.vtlp_range=[0.9,1.1]"]).dataset.vtlp_range == [0.9, 1.1]
    # Posterior temperatures: phone posteriors only, >= 1, named in the error.
    phone = os.path.join(os.path.dirname(RECIPE), "phone_ds_tcn.yaml")
    assert load_config(phone, ["dataset.posterior_temperature=[1.0,1.5]"]) \
        .dataset.posterior_temperature == [1.0, 1.5]
    for config, override, message in (
            (RECIPE, "[1.0,1.5]", "posterior_temperature flattens log phone posteriors: it "
                                  "needs dataset.feature.type phone_frontend .* got fbank"),
            (phone, "[0.5,1.5]", r"posterior_temperature: temperatures must lie in \[1.0, 4.0\]"),
            (phone, "[1.5,1.0]", r"posterior_temperature: expected \[low, high\]")):
        with pytest.raises(ConfigError, match=message):
            load_config(config, [f"dataset.posterior_temperature={override}"])
    with pytest.raises(ConfigError, match=r"got phone_frontend \(hidden\)"):
        load_config(phone, ["dataset.posterior_temperature=[1.0,1.5]",
                            "dataset.feature.frontend_output=hidden"])
    for bad, message in (("prob=1.5", "voice_perturb.prob must be in"),
                         ("low_range=[1.2,0.8]", "voice_perturb.low_range: expected"),
                         ("high_range=[0.1,1.0]", "voice_perturb.high_range: warp factors"),
                         ("tilt_db=[3]", "voice_perturb.tilt_db: expected"),
                         ("split_hz=9000", "voice_perturb.split_hz must lie in"),
                         ("formants=2", "unknown key")):
        with pytest.raises(ConfigError, match=message):
            load_config(RECIPE, [f"dataset.voice_perturb.{bad}"])
    vp = load_config(RECIPE, ["dataset.voice_perturb.prob=0.5",
                              "dataset.voice_perturb.tilt_db=[-6,6]"]).dataset.voice_perturb
    assert vp.prob == 0.5 and vp.tilt_db == [-6, 6] and vp.low_range == [1.0, 1.0]
    with pytest.raises(ConfigError, match="amp_dtype"):
        load_config(RECIPE, ["training.amp_dtype=float8"])


def test_unknown_model_type_lists_known_ones():
    with pytest.raises(ConfigError) as err:
        load_config(RECIPE, ["model.type=transformer_xl"])
    msg = str(err.value)
    assert "model.type" in msg and "transformer_xl" in msg
    assert MODELS.names()
    for name in MODELS.names():
        assert name in msg


def test_missing_model_type_is_an_error(raw):
    del raw["model"]["type"]
    with pytest.raises(ConfigError, match="model.type"):
        validate(raw)


def test_redact_secret_keys_and_whole_env_values(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "s3cr3t-value-xyz")
    data = {
        "api_key": "abc123", "hf_token": "hf_zzz", "db": {"password": "hunter2",
                                                          "ApiKey": "k"},
        "empty_token": "",
        "path": "/data/s3cr3t-value-xyz/train.list",
        "items": ["plain", "s3cr3t-value-xyz"],
        "lr": 0.1, "name": "keep me",
    }
    out = redact(data)
    for value in (out["api_key"], out["hf_token"], out["db"]["password"], out["db"]["ApiKey"],
                  out["items"][1]):
        assert is_redacted(value) and "abc123" not in value and "hunter2" not in value
    # Redaction never changes what a later stage reads: a secret inside a longer value
    # (a path) is not a secret value, and the path stays as it is.
    assert out["path"] == "/data/s3cr3t-value-xyz/train.list"
    assert out["items"][0] == "plain"
    assert out["empty_token"] == ""         # nothing to hide
    assert out["lr"] == 0.1 and out["name"] == "keep me"
    # The input is not modified.
    assert data["api_key"] == "abc123" and data["db"]["password"] == "hunter2"
    # A salted digest tells whether a rerun's value is the same, without revealing it.
    assert same_value(out["api_key"], "abc123") and not same_value(out["api_key"], "abc124")


def test_dump_config_writes_no_secret(tmp_path, monkeypatch):
    secret, env_secret = "tok-9f8e7d6c5b4a", "envtok-1234abcd"
    monkeypatch.setenv("HF_TOKEN", env_secret)
    cfg = load_config(RECIPE, [f"dataset.auth_token={secret}",
                               f"training.init_checkpoint={env_secret}",
                               "dataset.train_data=/data/HF_TOKEN-dir/train.list"])
    path = tmp_path / "config.yaml"
    dump_config(cfg, str(path))
    text = path.read_text()
    assert secret not in text and env_secret not in text
    # The dump is still a complete config: it validates and keeps non-secret values.
    back = yaml.safe_load(text)
    assert is_redacted(back["dataset"]["auth_token"])
    assert back["dataset"]["train_data"] == "/data/HF_TOKEN-dir/train.list"
    again = validate(back)
    assert again.training.max_epoch == cfg.training.max_epoch
    assert to_dict(again)["model"] == to_dict(cfg)["model"]




def test_only_credential_variables_hold_secrets_and_short_values_are_not_hidden(monkeypatch):
    """Issue 34: any variable with a credential word anywhere in its name made its value a
    secret, so TOKENIZERS_PARALLELISM=false turned every `false` of a log line into
    `<redacted>`. Now a name must end in a credential word, and a value shorter than
    secrets.MIN_SECRET_CHARS (a flag, a number, a word) is never hidden inside other text."""
    import logging
    from toolkit.config import secret_env_values
    from toolkit.logging_utils import RedactSecrets
    credentials = {"HF_TOKEN": "hf_abcdef123456789", "WANDB_API_KEY": "0123456789abcdef0123",
                   "TOOLKIT_DATA_TOKEN": "data-t0ken-42", "HUGGING_FACE_HUB_TOKEN": "hf_legacy_99x",
                   "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG", "PGPASSWORD": "pg-pass-123",
                   "MY_CLIENT_SECRET": "cl1ent-s3cret"}
    not_secrets = {"TOKENIZERS_PARALLELISM": "false", "MAX_TOKENS_PER_BATCH": "40000000",
                   "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "PASSWORD_STORE_DIR": "/home/u/.pw",
                   # credential names with flag values
                   "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1", "SOME_API_KEY": "none",
                   "GIT_TOKEN": "offline"}
    for name, value in {**credentials, **not_secrets}.items():
        monkeypatch.setenv(name, value)
    found = secret_env_values()
    assert set(credentials.values()) <= found
    assert not set(not_secrets.values()) & found

    def logged(message):
        record = logging.LogRecord("t", logging.INFO, __file__, 1, message, None, None)
        RedactSecrets().filter(record)
        return record.getMessage()
    line = "reading /data/false_positives/train.list (1 of 40000000, offline, none)"
    assert logged(line) == line
    assert logged("GET https://hub/x?token=hf_abcdef123456789 failed") == \
        "GET https://hub/x?token=<redacted> failed"


def test_shared_copy_holds_the_fixed_redaction(monkeypatch):
    """What goes to W&B: every secret is the fixed `<redacted>` (a salted sha256 with its
    salt beside it gave a weak secret away in 0.17 s), a secret inside a string is replaced
    as in logs, and nothing else changes."""
    from toolkit.config.secrets import redact_shared
    monkeypatch.setenv("MY_SERVICE_TOKEN", "s3cr3t-value-xyz")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    data = {"api_key": "abc", "db": {"password": 1234, "token": redact({"token": "x"})["token"]},
            "empty_token": "", "path": "/data/s3cr3t-value-xyz/false_positives.list",
            "items": ["false", "s3cr3t-value-xyz"], "flag": False, "lr": 0.1}
    out = redact_shared(data)
    assert out == {"api_key": "<redacted>", "db": {"password": "<redacted>", "token": "<redacted>"},
                   "empty_token": "", "path": "/data/<redacted>/false_positives.list",
                   "items": ["false", "<redacted>"], "flag": False, "lr": 0.1}


def test_a_secret_may_be_any_scalar_and_is_never_quoted(tmp_path):
    """A numeric token stays the exact text given (leading zeros, every digit), from the
    command line, a YAML file or a mapping; a wrong type is named without the value."""
    token = "20240917123456"
    cfg = load_config(RECIPE, [f"dataset.auth_token={token}"])
    assert cfg.dataset.auth_token == token
    assert load_config(RECIPE, ["dataset.auth_token=0123"]).dataset.auth_token == "0123"
    path = tmp_path / "conf.yaml"
    path.write_text(f"defaults: [{RECIPE}]\ndataset: {{auth_token: 007012, batch_size: 8}}\n")
    cfg = load_config(str(path))
    assert cfg.dataset.auth_token == "007012" and cfg.dataset.batch_size == 8
    raw = to_dict(load_config(RECIPE))
    raw["dataset"]["auth_token"] = 4711
    assert validate(raw).dataset.auth_token == "4711"
    raw["dataset"]["auth_token"] = ["s3cret-in-a-list"]
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert "dataset.auth_token: expected a string, got a list" in str(err.value)
    assert "s3cret" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(RECIPE, ["dataset.auth_token=[unclosed-s3cret"])
    assert "s3cret" not in str(err.value)


def test_a_numeric_token_reaches_no_log(tmp_path):
    """The issue's case: a numeric token on the command line, before the fix quoted by a
    ConfigError in the log and on stderr. Training stops later here (no train list), after
    the token was read as text and registered as a secret."""
    from train_utils import run_train      # a process of its own, forked from the zygote
    token = "20240917123456"
    exp = tmp_path / "exp"
    result = run_train(
        ["-m", "toolkit.bin.train", "--config", RECIPE, "--exp-dir", str(exp),
         "--train-data", str(tmp_path / "missing.list"), "--inventory", str(tmp_path / "kw.txt"),
         f"dataset.auth_token={token}"], timeout=120)
    assert result.returncode == 2
    assert "expected a string" not in result.stderr
    assert token not in result.stderr + result.stdout
    for log in exp.glob("log/*.log"):
        assert token not in log.read_text()


@pytest.mark.parametrize("key, words", [
    ("training.log_interval=0", "training.log_interval must be >= 1"),
    ("training.keep_last=0", "training.keep_last must be >= 1"),
    ("training.max_steps=-1", "training.max_epoch and training.max_steps must be >= 0"),
])
def test_values_that_would_break_a_run_are_refused(key, words):
    """log_interval 0 divided by zero at the first step; keep_last 0 deleted each new
    checkpoint right after writing it (nothing left to resume from)."""
    with pytest.raises(ConfigError, match=words):
        load_config(RECIPE, [key])
