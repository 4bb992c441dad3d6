"""Suite-wide pytest setup: the groups (tests/unit, tests/integration, tests/recipes) become
markers of the same names, so `pytest -m "not recipe"` is the everyday loop; the slowest
test files are collected first, so that pytest-xdist (--dist loadfile
--no-loadscope-reorder, tools/test.sh) hands them out before the short ones and the workers
finish together instead of one running a long recipe test alone at the end; and the TTS
clip cache (toolkit.voicebank.cache) and the wake-word negatives cache
(toolkit.tasks.kws.negatives) are directories of this run, not the user's."""
import logging
import os
import shutil
import sys
import tempfile

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
GROUPS = {"unit": "unit", "integration": "integration", "recipes": "recipe"}
# The shared helpers (train_utils, speaker_data, ...) live in tests/ and a test may import
# another group's test module for its checks: every group's directory is importable.
for _dir in [TESTS] + [os.path.join(TESTS, g) for g in GROUPS]:
    if _dir not in sys.path:
        sys.path.insert(0, _dir)

# Files of a few seconds or more, longest first: the recipes' from a whole-suite run
# (`tools/test.sh` lists the slowest), the others from `pytest -n 3 --dist loadfile -m "not
# recipe" tests` on 2 cores (seconds per file, 2026-12-06). Files not listed keep their
# order after these. Except the codec recipe (about 130 s): started beside the other long
# recipes (each two ranks on the 2 cores) the suite took 867 s, started late 737 s and 828 s.
SLOWEST_FIRST = [
    "test_recipe_tts_speakers.py", "test_recipe_wake_word.py", "test_recipe_speech_embedding.py",
    "test_recipe_voxceleb.py", "test_recipe_corpora.py", "test_recipe_libritts.py",
    "test_recipe_phone_frontend.py", "test_recipe_voice_bank_speaker.py",
    "test_recipe_voice_bank_phone.py", "test_new_corpus_guide.py",
    "test_trainer_behaviour.py", "test_hf_datasets.py", "test_benchmark_tools.py",
    "test_trainer_faults.py", "test_installers.py", "test_codec_task.py", "test_tts_corpus.py",
    "test_trainer_restarts.py", "test_trainer_resume.py", "test_synth.py", "test_speaker_task.py",
    "test_speech_embedding_frontend.py", "test_shards.py", "test_phone_frontend.py",
    "test_codec_teachers.py", "test_codec_evaluation.py", "test_memory.py", "test_codec_rates.py",
    "test_datalist_dataset.py", "test_pretrained_codec.py", "test_voicebank.py",
    "test_codec_modules.py", "test_ctc.py", "test_data_robustness.py", "test_expected_errors.py",
    "test_models.py", "test_recipe_tts_codec.py", "test_bins_help.py", "test_utils_shell.py",
    "test_pretrained.py", "test_layout.py",
]


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        group = os.path.basename(os.path.dirname(str(item.path)))
        if group not in GROUPS:
            raise pytest.UsageError(f"{item.path}: a test file belongs in one of tests/"
                                    f"{{{','.join(GROUPS)}}}")
        item.add_marker(GROUPS[group])
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_configure(config):
    # Set before xdist starts its workers, so they and every subprocess share it.
    if "TOOLKIT_TTS_CACHE" not in os.environ:
        config._tts_clip_dir = tempfile.mkdtemp(prefix="toolkit-tts-clips-")
        os.environ["TOOLKIT_TTS_CACHE"] = config._tts_clip_dir
    # The wake-word negatives cache (toolkit.tasks.kws.negatives) likewise.
    if "TOOLKIT_NEG_CACHE" not in os.environ:
        config._neg_cache_dir = tempfile.mkdtemp(prefix="toolkit-neg-cache-")
        os.environ["TOOLKIT_NEG_CACHE"] = config._neg_cache_dir


def pytest_unconfigure(config):
    for name in ("_tts_clip_dir", "_neg_cache_dir"):
        path = getattr(config, name, None)
        if path:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Every test module's own torch work on one intra-op thread: the suite runs one worker
    more than cores, and a second thread only spins against the other workers (two RVQ fits
    took 54 CPU-s on two threads, 4 on one). Restored after the module, so a test that sets
    its own count leaves no trace; subprocesses set theirs (OMP_NUM_THREADS)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """A binary's main() run in this process (toolkit.logging_utils.setup_logging) binds
    the root logger to the test's captured stderr, which pytest closes after the test; left
    there, every later in-process main() of the same worker logs "--- Logging error ---"
    tracebacks into its stderr (basicConfig does nothing while a handler exists). The
    handlers a test added go with it; pytest's own come and go by themselves."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if handler not in before and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
