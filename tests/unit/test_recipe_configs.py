"""Every recipe config goes through the one schema, and the published-scale configs build
the models their READMEs describe: the sizes a user reads are the sizes the code trains."""
import glob
import os
import re

import pytest
import torch

import toolkit.tasks  # noqa: F401
from toolkit.config import TASKS, load_config, resolve_config
from toolkit.config import load_yaml
from toolkit.config.schema import to_dict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(p for p in glob.glob(os.path.join(ROOT, "egs", "*", "*", "conf", "*.yaml"))
                 # parts that other configs name in `defaults:`, and the corpus generators'
                 # option files (*corpus.yaml): not training configs
                 if os.path.basename(p) not in ("base.yaml", "lm.yaml")
                 and not p.endswith("corpus.yaml"))


def readme_count(recipe: str, config: str) -> int:
    """The parameter count the recipe README's model table gives for `config`."""
    text = open(os.path.join(ROOT, "egs", recipe, "README.md"), encoding="utf-8").read()
    row = next(line for line in text.splitlines() if f"`conf/{config}`" in line and "|" in line)
    return int(re.findall(r"\| ([\d,]{7,}) \|", row)[0].replace(",", ""))


def test_there_are_recipe_configs():
    assert len(CONFIGS) >= 15


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, os.path.join(ROOT, "egs")))
def test_recipe_config_is_valid(path):
    cfg = load_config(path)
    assert cfg.task.type in TASKS.names()


def _build(path, inventory_size=10):
    task_cls = TASKS.get(load_config(path).task.type)
    inventory = [f"c{i}" for i in range(inventory_size)] if task_cls.needs_inventory else None
    cfg, _ = resolve_config(load_yaml(path), source=path, inventory=inventory)
    with torch.device("meta"):           # sizes only: no memory for 75 M weights
        return task_cls(cfg, inventory).build_modules()


def count(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("config", ["resnet34.yaml", "ecapa_c1024.yaml"])
def test_voxceleb_models_have_the_published_sizes(config):
    modules = _build(os.path.join(ROOT, "egs", "voxceleb", "v2", "conf", config))
    assert count(modules["model"]) == readme_count("voxceleb/v2", config)


def test_codec_gpu_config_is_dac_scale():
    modules = _build(os.path.join(ROOT, "egs", "tts_codec", "s0", "conf", "codec_gpu.yaml"))
    generator = count(modules["generator"])
    assert 70e6 < generator < 78e6, generator      # README: about 74 M (DAC 16 kHz)
    assert count(modules["discriminator"]) > 10e6


@pytest.mark.parametrize("version", ["v2", "v3", "v4", "v5"])
def test_the_other_front_ends_heads_differ_from_the_readmes_only_in_the_front_end(version):
    conf = os.path.join(ROOT, "egs", "wake_word", "s0", "conf")
    readme, other = (load_config(os.path.join(conf, n)) for n in ("phone_ds_tcn.yaml",
                                                                  f"phone_ds_tcn_{version}.yaml"))
    assert readme.dataset.feature.frontend_model == "pretrained:phone-voicebank-v5"
    assert other.dataset.feature.frontend_model == f"pretrained:phone-voicebank-{version}"
    other.dataset.feature.frontend_model = readme.dataset.feature.frontend_model
    assert to_dict(other) == to_dict(readme)
