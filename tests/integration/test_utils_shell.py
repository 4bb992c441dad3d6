"""The Kaldi-style shell utilities run for real through bash: data-dir validation, fixing,
splitting and combining, the queue.sh job runner (local and a stand-in sbatch), the Slurm
multi-node example, and parse_options.sh."""
import os
import re
import shutil
import stat
import subprocess

import numpy as np
import pytest
import soundfile as sf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UTILS = os.path.join(ROOT, "utils")
VENV_BIN = os.path.join(ROOT, "tools", "venv", "bin")
BASE_PATH = f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin"


def sh(script, *args, cwd=None, path=BASE_PATH, env=None, timeout=60):
    full_env = dict(os.environ, PATH=path, LC_ALL="C", **(env or {}))
    full_env.pop("SLURM_OPTS", None)
    full_env.update(env or {})
    cmd = ["bash", script if os.path.isabs(script) else os.path.join(UTILS, script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=full_env,
                          timeout=timeout)


def write(path, text):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_wav(path, seconds=1.0, freq=440.0):
    t = np.arange(int(16000 * seconds)) / 16000
    sf.write(str(path), (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), 16000)


def make_executable(path, text):
    write(path, text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


# ---------------------------------------------------------------------------- data dirs

@pytest.fixture
def good_dir(tmp_path):
    d = tmp_path / "good"
    os.makedirs(d)
    utts = {"spk1-u1": "spk1", "spk1-u2": "spk1", "spk2-u1": "spk2"}
    for i, utt in enumerate(utts):
        write_wav(tmp_path / f"{utt}.wav", freq=300 + 100 * i)
    write(d / "wav.scp", "".join(f"{u} {tmp_path / u}.wav\n" for u in utts))
    write(d / "text", "spk1-u1 hey snips\nspk1-u2 hello there\nspk2-u1 hey snips now\n")
    write(d / "utt2spk", "".join(f"{u} {s}\n" for u, s in utts.items()))
    write(d / "spk2utt", "spk1 spk1-u1 spk1-u2\nspk2 spk2-u1\n")
    write(d / "utt2dur", "".join(f"{u} 1.000\n" for u in utts))
    return d


@pytest.fixture
def broken_dir(tmp_path):
    """One dir with every problem kind: unsorted, duplicate, missing keys, no value,
    empty text, missing + corrupt audio, utt2spk/spk2utt mismatch, bad segments."""
    d = tmp_path / "broken"
    os.makedirs(d)
    write_wav(tmp_path / "recA.wav", seconds=2.0)
    write_wav(tmp_path / "recB.wav", seconds=2.0, freq=600)
    with open(tmp_path / "recD.wav", "wb") as f:
        f.write(b"RIFF\x10\x00\x00\x00WAVEjunkjunkjunk")
    # recB before recA: not sorted.
    write(d / "wav.scp", f"recB {tmp_path}/recB.wav\nrecA {tmp_path}/recA.wav\n"
                         f"recC {tmp_path}/missing.wav\nrecD {tmp_path}/recD.wav\n")
    write(d / "segments", "a1 recA 0.0 0.5\na2 recA 0.5 1.0\nb1 recB 0.0 0.5\n"
                          "b2 recB 0.8 0.3\nc1 recC 0.0 1.0\nd1 recD 0.0 1.0\nx1 recX 0.0 1.0\n")
    # a2: empty text; b1 twice.
    write(d / "text", "a1 hey snips\na2\nb1 hello\nb1 hello again\nb2 hi\nc1 hi\n"
                      "d1 hey\nx1 hey\n")
    write(d / "utt2spk", "a1 s1\na2 s2\nb1 s1\nb2 s1\nc1 s2\nd1 s2\nx1 s2\n")
    # a2 listed under s1 but utt2spk says s2.
    write(d / "spk2utt", "s1 a1 a2 b1 b2\ns2 c1 d1 x1\n")
    # b1: no value; c1: missing.
    write(d / "utt2dur", "a1 0.5\na2 0.5\nb1\nb2 0.5\nd1 1.0\nx1 1.0\n")
    return d


EXPECTED = {
    "not sorted": r"wav\.scp:2: not sorted in C order.*'recA' comes after 'recB'",
    "duplicate": r"text: 1 duplicate key\(s\): b1 \(lines 3, 4\)",
    "missing keys": r"utt2dur: lacks 1 of the 7 utterances listed in segments, text, "
                    r"utt2spk: c1",
    "no value": r"utt2dur: 1 line\(s\) without a value: line 3 \(b1\)",
    "empty text": r"text: 1 utterance\(s\) with empty text: line 2 \(a2\)",
    "missing audio": r"wav\.scp:3: recC: cannot read audio: missing_file",
    "corrupt audio": r"wav\.scp:4: recD: cannot read audio: (unreadable|truncated)_audio",
    "speakers": r"utt2spk and spk2utt disagree: 1 utterance\(s\) under another speaker.*a2",
    "unknown recording": r"segments: 1 segment\(s\) reference unknown recording.*x1 -> recX",
    "end <= start": r"segments: 1 bad segment\(s\): line 4 \(b2: end <= start",
}


def test_validate_reports_every_problem_at_once(broken_dir):
    result = sh("validate_data_dir.sh", str(broken_dir), "--nj", "2")
    assert result.returncode == 1
    out = result.stdout + result.stderr
    missing = [kind for kind, pattern in EXPECTED.items() if not re.search(pattern, out)]
    assert not missing, f"not reported: {missing}\n{out}"


def test_validate_passes_a_good_dir(good_dir):
    result = sh("validate_data_dir.sh", str(good_dir))
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout
    assert sh("validate_data_dir.sh", "--no-audio", str(good_dir)).returncode == 0


def test_validate_usage_errors(good_dir):
    for args in ([], ["--bogus", str(good_dir)], [str(good_dir), str(good_dir)]):
        result = sh("validate_data_dir.sh", *args)
        assert result.returncode == 1 and "usage" in result.stderr, args
    result = sh("validate_data_dir.sh", str(good_dir / "nope"), "--no-audio")
    assert result.returncode == 1 and "not a directory" in result.stderr


def test_fix_repairs_the_broken_dir(broken_dir):
    original = (broken_dir / "wav.scp").read_text()
    result = sh("fix_data_dir.sh", str(broken_dir))
    assert result.returncode == 0, result.stderr
    assert (broken_dir / ".backup" / "wav.scp").read_text() == original
    assert "kept" in result.stdout and "duplicate" in result.stdout
    # Only the audio problem of recD (its utterance d1 is otherwise complete) remains.
    problems = sh("validate_data_dir.sh", str(broken_dir)).stderr.strip().splitlines()[1:]
    assert problems and all("cannot read audio" in p and "recD" in p for p in problems), problems
    assert sh("validate_data_dir.sh", "--no-audio", str(broken_dir)).returncode == 0
    # Kept: the utterances complete everywhere (b1 had no duration, so it goes too).
    assert (broken_dir / "segments").read_text() == "a1 recA 0.0 0.5\nd1 recD 0.0 1.0\n"
    assert (broken_dir / "wav.scp").read_text().splitlines()[0].startswith("recA ")
    assert (broken_dir / "spk2utt").read_text() == "s1 a1\ns2 d1\n"
    assert (broken_dir / "text").read_text() == "a1 hey snips\nd1 hey\n"
    # A second run changes nothing, so the backup still holds the true original.
    again = sh("fix_data_dir.sh", str(broken_dir))
    assert again.returncode == 0 and "nothing to fix" in again.stdout
    assert (broken_dir / ".backup" / "wav.scp").read_text() == original


# ---------------------------------------------------------------------------- split/combine

def read_parts(paths):
    return [open(p).read().splitlines() for p in paths]


def test_split_scp_even_parts(tmp_path):
    lines = [f"utt{i:02d} /x/{i}.wav" for i in range(10)]
    write(tmp_path / "wav.scp", "\n".join(lines) + "\n")
    outs = [str(tmp_path / "split" / f"wav.{n}.scp") for n in (1, 2, 3)]
    result = sh("split_scp.sh", str(tmp_path / "wav.scp"), *outs)
    assert result.returncode == 0, result.stderr
    parts = read_parts(outs)
    assert sum(parts, []) == lines            # disjoint, complete, in order
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sizes == [4, 3, 3]
    too_many = sh("split_scp.sh", str(tmp_path / "wav.scp"), *[str(tmp_path / f"o{n}")
                                                                for n in range(11)])
    assert too_many.returncode == 1 and "fewer than the 11 parts" in too_many.stderr


def test_split_scp_keeps_speakers_whole(tmp_path):
    counts = {"a": 3, "b": 1, "c": 4, "d": 2, "e": 2}
    u2s = [(f"{s}-{i}", s) for s, n in counts.items() for i in range(n)]
    write(tmp_path / "utt2spk", "".join(f"{u} {s}\n" for u, s in u2s))
    write(tmp_path / "text", "".join(f"{u} word\n" for u, _ in u2s))
    outs = [str(tmp_path / f"text.{n}") for n in (1, 2, 3)]
    result = sh("split_scp.sh", "--utt2spk", str(tmp_path / "utt2spk"),
                str(tmp_path / "text"), *outs)
    assert result.returncode == 0, result.stderr
    parts = read_parts(outs)
    assert sum(parts, []) == [f"{u} word" for u, _ in u2s]
    owner = {}
    for n, part in enumerate(parts):
        assert part, "empty part"
        for line in part:
            assert owner.setdefault(line.split("-")[0], n) == n, "speaker split across parts"
    # A speaker whose lines are not together cannot be kept whole: a clear error.
    write(tmp_path / "shuffled", "a-0 x\nb-0 x\na-1 x\n")
    bad = sh("split_scp.sh", "--utt2spk=" + str(tmp_path / "utt2spk"),
             str(tmp_path / "shuffled"), *outs[:2])
    assert bad.returncode == 1 and "shuffled:3: speaker a appears again" in bad.stderr


def test_combine_sorts_and_rejects_duplicates(tmp_path):
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    write(a / "wav.scp", "u1 /w/1.wav\nu3 /w/3.wav\n")
    write(a / "utt2spk", "u1 s1\nu3 s2\n")
    write(a / "text", "u1 one\nu3 three\n")
    write(b / "wav.scp", "u2 /w/2.wav\nu4 /w/4.wav\n")
    write(b / "utt2spk", "u2 s1\nu4 s3\n")
    result = sh("combine_data.sh", str(out), str(a), str(b))
    assert result.returncode == 0, result.stderr
    assert (out / "wav.scp").read_text() == "u1 /w/1.wav\nu2 /w/2.wav\nu3 /w/3.wav\nu4 /w/4.wav\n"
    assert (out / "spk2utt").read_text() == "s1 u1 u2\ns2 u3\ns3 u4\n"
    assert not (out / "text").exists() and "text: skipped" in result.stdout
    write(b / "wav.scp", "u2 /w/2.wav\nu3 /w/other.wav\n")
    dup = sh("combine_data.sh", str(tmp_path / "out2"), str(a), str(b))
    assert dup.returncode == 1
    assert f"u3 in {a} and {b} (wav.scp)" in dup.stderr
    assert sh("combine_data.sh", str(out)).returncode == 1   # usage


# ---------------------------------------------------------------------------- queue.sh

def test_queue_local_parallel_limit_and_failures(tmp_path):
    events = tmp_path / "events"
    job = (f"echo job JOB; echo start $(date +%s%N) >> {events}; sleep 0.5; "
           f"echo end $(date +%s%N) >> {events}; [ JOB != 3 ]")
    result = sh("queue.sh", "--max-parallel", "2", "JOB=1:4", "log/x.JOB.log", job,
                cwd=tmp_path)
    assert result.returncode == 1
    for n in (1, 2, 3, 4):
        log = (tmp_path / "log" / f"x.{n}.log").read_text()
        assert f"job {n}\n" in log and f"[ {n} != 3 ]" in log
    assert "JOB=3: exit code 1, log: log/x.3.log" in result.stderr
    assert "x.1.log" not in result.stderr.split("last lines")[0]
    running = peak = 0
    stamps = sorted((int(t), kind) for kind, t in map(str.split, events.read_text().splitlines()))
    for _, kind in stamps:
        running += 1 if kind == "start" else -1
        peak = max(peak, running)
    assert peak == 2


def test_queue_local_success_and_quoting(tmp_path):
    # As typed in a recipe: ... echo "a  b" JOB \| tr a-z A-Z  ("|" is one argument).
    result = sh("queue.sh", "--nj", "3", "log/q.JOB.log", "echo", "a  b", "JOB",
                "|", "tr", "a-z", "A-Z", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "A  B 2\n" in (tmp_path / "log" / "q.2.log").read_text()
    one_log = sh("queue.sh", "JOB=1:2", "log/same.log", "true", cwd=tmp_path)
    assert one_log.returncode == 1 and "put JOB in its name" in one_log.stderr
    assert sh("queue.sh", "--bogus", "1", "JOB=1:2", "l.JOB", "true").returncode == 1


def test_queue_slurm_without_sbatch_is_a_clear_error(tmp_path):
    if shutil.which("sbatch", path=BASE_PATH):
        pytest.skip("sbatch is installed here")
    result = sh("queue.sh", "--backend", "slurm", "JOB=1:2", "log/x.JOB.log", "true",
                cwd=tmp_path)
    assert result.returncode == 1
    assert "needs 'sbatch' on PATH" in result.stderr and "--backend local" in result.stderr


FAKE_SBATCH = r"""#!/usr/bin/env bash
# Stand-in for `sbatch --wait --array=A-B`: records its arguments, runs every task here.
echo "$@" > "$FAKE_LOG"
for a in "$@"; do case $a in --array=*) range=${a#--array=}; range=${range%%%*};; esac; done
script=${!#}
echo 4242
rc=0
for ((i = ${range%-*}; i <= ${range#*-}; i++)); do
  SLURM_ARRAY_TASK_ID=$i SLURM_JOB_ID=4242 bash "$script" || rc=1
done
exit $rc
"""


def test_queue_slurm_array_with_stand_in_sbatch(tmp_path):
    make_executable(tmp_path / "bin" / "sbatch", FAKE_SBATCH)
    env = {"FAKE_LOG": str(tmp_path / "sbatch.args"), "SLURM_OPTS": "-p gpu --time 1:00:00"}
    result = sh("queue.sh", "--backend", "slurm", "--gpu", "1", "--max-parallel", "2",
                "JOB=1:3", "exp/log/feat.JOB.log", "echo", "part", "JOB", "&&", "[", "JOB",
                "!=", "2", "]", cwd=tmp_path, path=f"{tmp_path}/bin:{BASE_PATH}", env=env)
    args = (tmp_path / "sbatch.args").read_text()
    for expected in ("--wait", "--array=1-3%2", "--job-name=feat", "--gres=gpu:1",
                     "-p gpu --time 1:00:00", f"{tmp_path}/exp/log/q/feat.sh"):
        assert expected in args, (expected, args)
    assert "part 3" in (tmp_path / "exp" / "log" / "feat.3.log").read_text()
    assert result.returncode == 1
    assert "JOB=2: exit code 1, log: exp/log/feat.2.log" in result.stderr
    assert "feat.1.log" not in result.stderr.split("last lines")[0]


# ---------------------------------------------------------------------------- Slurm training

def test_slurm_train_example_gives_each_node_its_rank(tmp_path):
    bin_dir = tmp_path / "bin"
    make_executable(bin_dir / "scontrol", "#!/usr/bin/env bash\nprintf 'gpu03\\ngpu04\\n'\n")
    # srun: one task per node, each with its own SLURM_NODEID.
    make_executable(bin_dir / "srun", "#!/usr/bin/env bash\n"
                    "while [[ $1 == --* ]]; do shift; done\n"
                    "for n in 0 1; do SLURM_NODEID=$n \"$@\" || exit 1; done\n")
    write(tmp_path / "run.sh", 'echo "$*" >> calls\n')
    env = {"SLURM_JOB_NODELIST": "gpu[03-04]", "SLURM_NNODES": "2", "SLURM_JOB_ID": "77"}
    result = sh(os.path.join(UTILS, "slurm_train.sbatch.example"), cwd=tmp_path,
                path=f"{bin_dir}:{BASE_PATH}", env=env)
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    common = ("--stage 3 --stop-stage 3 --num-nodes 2 --node-rank {} "
              "--rdzv-endpoint gpu03:29400 --gpus 0,1,2,3,4,5,6,7")
    assert calls == [common.format(0), common.format(1)]


# ---------------------------------------------------------------------------- parse_options.sh

def options_script(tmp_path):
    path = tmp_path / "opts.sh"
    write(path, "set -euo pipefail\nstage=0\nstop_stage=10\nname=\"a b\"\n"
                f". {UTILS}/parse_options.sh\n"
                'echo "stage=$stage stop_stage=$stop_stage name=$name rest=$*"\n')
    return str(path)


def test_parse_options_sets_existing_variables(tmp_path):
    script = options_script(tmp_path)
    result = sh(script, "--stage", "3", "--name", "x y", "pos")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "stage=3 stop_stage=10 name=x y rest=pos"
    result = sh(script, "--stop-stage", "5")
    assert result.returncode == 0 and "stage=0 stop_stage=5 " in result.stdout


def test_parse_options_leaves_other_defaults_alone(tmp_path):
    # parse_options.sh must not use a caller's variable (here `name`) for its own work.
    result = sh(options_script(tmp_path), "--stage", "3")
    assert result.stdout.strip() == "stage=3 stop_stage=10 name=a b rest="


def test_parse_options_rejects_bad_options(tmp_path):
    script = options_script(tmp_path)
    unknown = sh(script, "--stgae", "3")
    assert unknown.returncode == 1 and "unknown option --stgae" in unknown.stderr
    no_value = sh(script, "--stage")
    assert no_value.returncode == 1 and "--stage needs a value" in no_value.stderr


def test_scripts_parse_and_show_usage():
    for name in ("queue.sh", "validate_data_dir.sh", "fix_data_dir.sh", "split_scp.sh",
                 "combine_data.sh", "cmd.sh.example", "slurm_train.sbatch.example"):
        assert subprocess.run(["bash", "-n", os.path.join(UTILS, name)]).returncode == 0, name
    for name in ("queue.sh", "validate_data_dir.sh", "fix_data_dir.sh", "split_scp.sh",
                 "combine_data.sh"):
        bare = sh(name)
        assert bare.returncode == 1 and "usage" in bare.stderr.lower(), name
        helped = sh(name, "--help")
        assert helped.returncode == 0 and "usage" in (helped.stdout + helped.stderr).lower()
