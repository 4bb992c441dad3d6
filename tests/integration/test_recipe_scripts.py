"""The small utils/ scripts the speaker recipes' stages call with explicit arguments:
speaker_cohort_list.sh (the AS-Norm cohort's list, rewritten only when it changes),
speaker_embed.sh (one embedding dir per list, stale ones removed first) and speaker_score.sh
(score dir names and the summary). The binaries they call are stood in for by a `python`
on PATH that records its arguments: the recipes' own tests run the real ones."""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UTILS = os.path.join(ROOT, "utils")

# Records `python -m MODULE ARGS...` and writes what the scripts read back: a summary
# line for score_speaker, a file for extract_embeddings.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
module=$2
shift 2
while [ $# -gt 0 ]; do
  case $1 in
    --out-dir) out=$2 ;;
    --name) name=$2 ;;
  esac
  shift
done
mkdir -p "$out"
case $module in
  toolkit.bin.score_speaker) echo "$name cosine: EER 1.00%" > "$out/summary.txt" ;;
  toolkit.bin.extract_embeddings) touch "$out/embeddings.scp" ;;
esac
"""


def run(tmp_path, script, *args):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
               CALLS=str(tmp_path / "calls"))
    return subprocess.run(["bash", os.path.join(UTILS, script), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=60)


def calls(tmp_path):
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_cohort_list_keeps_the_first_utterances_of_each_speaker(tmp_path):
    rows = [{"key": f"{spk}-{i}", "spk": spk} for spk in ("a", "b") for i in range(3)]
    rows.insert(1, {"key": "c-0", "spk": "c"})
    data_list = tmp_path / "data.list"
    data_list.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cohort_2.list"
    result = run(tmp_path, "speaker_cohort_list.sh", 2, data_list, out)
    assert result.returncode == 0, result.stderr
    assert [json.loads(l)["key"] for l in out.read_text().splitlines()] == \
        ["a-0", "c-0", "a-1", "b-0", "b-1"]
    # The same list again leaves the file alone: a newer one means a new extraction.
    os.utime(out, (1, 1))
    assert run(tmp_path, "speaker_cohort_list.sh", 2, data_list, out).returncode == 0
    assert os.stat(out).st_mtime == 1 and not (tmp_path / "cohort_2.list.tmp").exists()
    assert run(tmp_path, "speaker_cohort_list.sh", 1, data_list, out).returncode == 0
    assert len(out.read_text().splitlines()) == 3


def test_embed_removes_what_an_older_export_or_another_list_made(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_text("m")
    a, b = tmp_path / "a.list", tmp_path / "b.list"
    a.write_text("a\n")
    b.write_text("b\n")
    emb = tmp_path / "emb"
    for path in (model, a, b):
        os.utime(path, (1, 1))
    result = run(tmp_path, "speaker_embed.sh", "--nj", 3, model, emb, f"test={a}", f"outside/test={b}")
    assert result.returncode == 0, result.stderr
    assert calls(tmp_path) == [
        f"-m toolkit.bin.extract_embeddings --model {model} --data-list {a} "
        f"--out-dir {emb}/test --nj 3",
        f"-m toolkit.bin.extract_embeddings --model {model} --data-list {b} "
        f"--out-dir {emb}/outside/test --nj 3"]
    assert (emb / "outside" / "test" / ".source").read_text() == f"{b}\n"
    # A part of the same export and list is resumed (kept); of another list, made again.
    (emb / "test" / "part").write_text("done")
    assert run(tmp_path, "speaker_embed.sh", model, emb, f"test={a}").returncode == 0
    assert (emb / "test" / "part").exists()
    assert run(tmp_path, "speaker_embed.sh", model, emb, f"test={b}").returncode == 0
    assert not (emb / "test" / "part").exists()
    assert (emb / "test" / ".source").read_text() == f"{b}\n"
    # A newer export: made again.
    (emb / "test" / "part").write_text("done")
    os.utime(emb / "test" / ".source", (1, 1))
    model.write_text("m2")
    assert run(tmp_path, "speaker_embed.sh", model, emb, f"test={b}").returncode == 0
    assert not (emb / "test" / "part").exists()


def test_score_names_the_lists_of_other_sets_by_their_set(tmp_path):
    sys_dir = tmp_path / "exp" / "ecapa"
    (sys_dir / "score").mkdir(parents=True)
    (sys_dir / "score" / "summary.txt").write_text("an older run's line\n")
    result = run(tmp_path, "speaker_score.sh", "--as-norm-top", 4, sys_dir,
                 "test=/d/test/trials", "test=/d/test/trials_kokoro",
                 "outside/test=/d/outside/test/trials", "vox1=/d/trials/vox1_O.txt")
    assert result.returncode == 0, result.stderr
    names = ["trials", "trials_kokoro", "outside_trials", "vox1_vox1_O"]
    assert (sys_dir / "score" / "summary.txt").read_text().splitlines() == \
        [f"ecapa {n} cosine: EER 1.00%" for n in names]
    first = calls(tmp_path)[0]
    assert first == (f"-m toolkit.bin.score_speaker --trials /d/test/trials --embeddings "
                     f"{sys_dir}/embeddings/test/embeddings.scp --cohort "
                     f"{sys_dir}/embeddings/cohort/speaker_embeddings.scp --as-norm-top 4 "
                     f"--out-dir {sys_dir}/score/trials --name ecapa trials")
    assert f"--embeddings {sys_dir}/embeddings/outside/test/embeddings.scp" in calls(tmp_path)[2]
    # The usage is named when arguments are missing.
    usage = run(tmp_path, "speaker_score.sh", sys_dir)
    assert usage.returncode == 1 and "usage:" in usage.stderr
