"""Throughput and host memory of one real training run: `toolkit.bin.train` through torchrun
(one process), with its loader workers, sampled from /proc while it runs.

  python tools/benchmarks/trainer_memory.py --config egs/tts_speakers/v1/conf/ecapa.yaml \\
      --items-per-step 32 -- --train-data data/train/fbank/data.list \\
      --dev-data data/dev/fbank/data.list --inventory data/dict/speakers.txt \\
      training.max_steps=60

Everything after `--` goes to the trainer as it is (it trains into a fresh temporary exp
dir unless --exp-dir is among them). Printed: optimizer steps/s and items/s (chunks,
segments, utterances: --items-per-step per step) over the trainer's own training time, the
wall time of the command, the peak RSS of the trainer alone (its getrusage), the peak of the
trainer and its loader workers together, sampled every 20 ms as the sum of their RSS
(shared pages counted in each process) and every 200 ms as the sum of their PSS (shared
pages split among the processes that share them: what the machine gives them), their user
and system CPU seconds (rank 0 and its workers, as the trainer logs them; and the whole
tree: launcher, every rank, every worker), the last dev metrics, the final parameter
checksum and the allocator the trainer logged. --nproc N trains N gloo ranks.

  python tools/benchmarks/trainer_memory.py --make-corpus /tmp/voices   # then:
  python tools/benchmarks/trainer_memory.py --config egs/tts_codec/s0/conf/codec_cpu.yaml \
      -- --train-data /tmp/voices/train.list --dev-data /tmp/voices/dev.list \
      training.max_steps=40

--make-corpus DIR writes a speaker corpus of formant voices (the tests' generator: 64
speakers x 16 utterances of 1-2.5 s, 16 kHz WAVs; dev: 8 other speakers) with its
inventory, for the speaker and codec families, and exits.
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _children(pid: int) -> List[int]:
    kids: List[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(c) for c in f.read().split()]
    except OSError:
        pass                     # the process ended meanwhile
    return kids


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, ValueError, IndexError):
        return 0


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeSampler(threading.Thread):
    """Peak summed RSS and PSS of a trainer and its descendants (loader workers). With
    torchrun the trainers are the launcher's children; the launcher itself is not counted."""

    def __init__(self, launched: int, through_torchrun: bool, interval_s: float = 0.02,
                 pss_every: int = 10):
        super().__init__(daemon=True)
        self.launched = launched
        self.torchrun = through_torchrun
        self.interval = interval_s
        self.pss_every = pss_every
        self.stop = threading.Event()
        self.peak_rss_kib = self.peak_pss_kib = self.peak_processes = 0

    def tree(self) -> List[int]:
        pids: List[int] = []
        todo = _children(self.launched) if self.torchrun else [self.launched]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            todo += _children(pid)
        return pids

    def run(self) -> None:
        tick = 0
        while not self.stop.is_set():
            pids = self.tree()
            self.peak_rss_kib = max(self.peak_rss_kib, sum(_rss_kib(p) for p in pids))
            if tick % self.pss_every == 0:
                self.peak_pss_kib = max(self.peak_pss_kib, sum(_pss_kib(p) for p in pids))
            self.peak_processes = max(self.peak_processes, len(pids))
            tick += 1
            time.sleep(self.interval)


def _last(pattern: str, text: str) -> Optional[re.Match]:
    found = list(re.finditer(pattern, text))
    return found[-1] if found else None


# The trainer's closing line; the limit that ended the run is named in parentheses since
# 2026-12-03 and absent before, so both forms parse (a benchmark compares two commits).
FINISHED = re.compile(r"training finished: (\d+) steps(?: \([^)]*\))?, (\S+) this run "
                      r"\(([\d.]+) steps/s\).*?peak RSS ([\d.]+) GB \(loader workers ([\d.]+) GB\); "
                      r"CPU user (\d+) s, system (\d+) s")


def parse_finished(log: str) -> Optional[re.Match]:
    """The last 'training finished' line of a training log, or None."""
    found = list(FINISHED.finditer(log))
    return found[-1] if found else None


def train_and_measure(trainer_args: Sequence[str], torchrun: bool = True,
                      cwd: str = ROOT, env: Optional[Dict[str, str]] = None,
                      nproc: int = 1) -> Dict:
    """Runs `toolkit.bin.train trainer_args` (in a temporary exp dir, removed afterwards,
    unless --exp-dir is given) with the toolkit of the checkout `cwd` and returns the
    figures the module docstring lists; exits with the trainer's stderr when it fails."""
    if "--exp-dir" in trainer_args:
        return _train_and_measure(list(trainer_args), torchrun, cwd, env, nproc)
    with tempfile.TemporaryDirectory(prefix="trainer_memory_") as exp:
        return _train_and_measure([*trainer_args, "--exp-dir", exp], torchrun, cwd, env, nproc)


def _train_and_measure(args: List[str], torchrun: bool, cwd: str, env: Optional[Dict[str, str]],
                       nproc: int) -> Dict:
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.abspath(cwd)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    exp = args[args.index("--exp-dir") + 1]
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] \
        if torchrun else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    proc = subprocess.Popen([sys.executable, *launcher, "-m", "toolkit.bin.train", *args],
                            cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    sampler = TreeSampler(proc.pid, torchrun)
    sampler.start()
    _, stderr = proc.communicate()
    wall = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        sys.exit(f"training failed (exit {proc.returncode}):\n{stderr[-3000:]}")
    with open(os.path.join(exp, "log", "train.rank0.log"), encoding="utf-8") as f:
        log = f.read()
    done = parse_finished(log)
    if done is None:
        sys.exit(f"{exp}/log/train.rank0.log has no 'training finished' line")
    dev = _last(r"dev: (.*?) over \d+ utterances", log)
    checksum = _last(r"final parameter checksum (\w+)", log)
    allocator = _last(r"allocator: (.*)", log)
    seconds = 0
    for part in done.group(2).split(":"):
        seconds = 60 * seconds + int(part)
    steps, rate = int(done.group(1)), float(done.group(3))
    if seconds < 20 and rate > 0 and steps:     # short runs: finer than whole seconds
        seconds = steps / rate
    return {"steps": steps, "train_s": round(seconds, 1), "wall_s": round(wall, 1),
            "peak_rss_trainer_gb": float(done.group(4)),
            "peak_rss_worker_gb": float(done.group(5)),
            "peak_rss_sum_gb": round(sampler.peak_rss_kib / 2 ** 20, 3),
            "peak_pss_sum_gb": round(sampler.peak_pss_kib / 2 ** 20, 3),
            "processes": sampler.peak_processes,
            "user_s": int(done.group(6)), "sys_s": int(done.group(7)),
            "tree_user_s": round(after.ru_utime - before.ru_utime),
            "tree_sys_s": round(after.ru_stime - before.ru_stime),
            "dev": dev.group(1) if dev else None,
            "checksum": checksum.group(1) if checksum else None,
            "allocator": allocator.group(1).strip() if allocator else "(not logged)",
            "exp": exp}


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="training config (YAML)")
    p.add_argument("--make-corpus", metavar="DIR", help="write the voices corpus and exit")
    p.add_argument("--nproc", type=int, default=1, help="gloo ranks (torchrun)")
    p.add_argument("--items-per-step", type=float, default=0,
                   help="chunks/segments/utterances per optimizer step, for items/s")
    p.add_argument("--no-torchrun", action="store_true",
                   help="start the trainer directly instead of through torchrun")
    p.add_argument("--toolkit-root", default=ROOT, metavar="DIR",
                   help="checkout whose toolkit trains (another commit's worktree, to compare "
                   "before and after; default: this one)")
    p.add_argument("trainer_args", nargs=argparse.REMAINDER,
                   help="-- then the trainer's arguments and overrides")
    args = p.parse_args(argv)
    if args.trainer_args and args.trainer_args[0] == "--":
        args.trainer_args = args.trainer_args[1:]
    if not args.make_corpus and not args.config:
        p.error("give --config (or --make-corpus DIR)")
    return args


def make_corpus(out: str, speakers: int = 64, utts: int = 16) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from speaker_data import speaker_list
    os.makedirs(out, exist_ok=True)
    names = [f"spk{s:03d}" for s in range(speakers)]
    with open(os.path.join(out, "speakers.txt"), "w") as f:
        f.writelines(n + "\n" for n in names)
    index = {n: i for i, n in enumerate(names)}
    speaker_list(out, "train", range(speakers), utts, 1, index)
    speaker_list(out, "dev", range(100, 108), 4, 2, index)
    print(f"--train-data {out}/train.list --dev-data {out}/dev.list "
          f"--inventory {out}/speakers.txt")


def main(argv=None):
    args = get_args(argv)
    if args.make_corpus:
        make_corpus(os.path.abspath(args.make_corpus))
        return 0
    r = train_and_measure(["--config", os.path.abspath(args.config), *args.trainer_args],
                          torchrun=not args.no_torchrun, cwd=args.toolkit_root,
                          nproc=args.nproc)
    rate = r["steps"] / max(r["train_s"], 1)
    items = f"{rate * args.items_per_step:.1f}" if args.items_per_step else "-"
    print(f"{args.config}: toolkit {args.toolkit_root}, {args.nproc} rank(s), "
          f"{os.cpu_count()} CPUs, allocator {r['allocator']}")
    print("| steps | train s / wall s | steps/s | items/s | peak RSS trainer / a worker GB | "
          "ranks+workers RSS / PSS GB | user / sys s (rank 0) | user / sys s (tree) | "
          "last dev | checksum |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    print(f"| {r['steps']} | {r['train_s']} / {r['wall_s']} | {rate:.2f} | {items} | "
          f"{r['peak_rss_trainer_gb']} / {r['peak_rss_worker_gb']} | {r['peak_rss_sum_gb']} / "
          f"{r['peak_pss_sum_gb']} | {r['user_s']} / {r['sys_s']} | {r['tree_user_s']} / "
          f"{r['tree_sys_s']} | {r['dev']} | {r['checksum']} |")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
