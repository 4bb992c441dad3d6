"""torchrun --max-restarts: a rank killed mid-training, the job restarts once and resumes
from the last checkpoint — on one node through the agent's shared store, and on two
nodes (two launchers, c10d rendezvous, one rank each: a world of two) through
utils/torchrun.sh.

Only one restart is allowed, so a restarted round that reads the dead round's
addresses (connection refused) fails the test instead of being retried away."""
import glob
import os
import socket
import subprocess
import sys
import time

import pytest

from train_utils import ROOT, TORCHRUN, Corpus, env, latest_payload, rank_process

# 24 utterances in batches of 6 over 2 ranks: 2 steps an epoch, 20 in all. The kill lands
# right after the first checkpoint (step 2), long before the end; the rest is resumed.
EPOCHS = 10


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    # No loader workers: torchrun's restarts are under test here, not the data loader.
    return Corpus(str(tmp_path_factory.mktemp("restarts")), num_train=24, num_dev=6,
                  workers=0)


def wait_for_checkpoint(exp, procs, timeout=120):
    deadline = time.time() + timeout
    while not glob.glob(os.path.join(exp, "ckpt-*.json")):
        assert time.time() < deadline, "no checkpoint appeared"
        assert all(p.poll() is None for p in procs), "training ended before the kill"
        time.sleep(0.05)


def assert_resumed_to_the_end(exp, outputs):
    text = "\n".join(outputs)
    assert "Connection refused" not in text, text[-4000:]
    assert latest_payload(exp)["epoch"] == EPOCHS
    log = open(os.path.join(exp, "log", "train.rank0.log")).read()
    assert log.count("resumed from") == 1, log[-3000:]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_node_restart_resumes(corpus, tmp_path):
    exp = str(tmp_path / "exp")
    cmd = [TORCHRUN, "--standalone", "--nnodes=1", "--nproc-per-node=2", "--max-restarts=1",
           *corpus.train_args(exp, f"training.max_epoch={EPOCHS}")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env(), start_new_session=True)
    try:
        wait_for_checkpoint(exp, [proc])
        os.kill(rank_process(proc.pid, 1), 9)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    assert "exitcode: -9" in out          # the kill really hit a rank
    assert_resumed_to_the_end(exp, [out])


def test_two_node_restart_through_utils_torchrun(corpus, tmp_path):
    exp = str(tmp_path / "exp")
    endpoint = f"127.0.0.1:{free_port()}"
    launch_env = env(PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
                     TORCHRUN_EXTRA="--max-restarts=1", TOOLKIT_RDZV_ID=f"restart-{os.getpid()}")
    procs = []
    for node_rank in (0, 1):
        cmd = ["bash", os.path.join(ROOT, "utils", "torchrun.sh"), "-1", "1", "2",
               str(node_rank), endpoint,
               *corpus.train_args(exp, f"training.max_epoch={EPOCHS}")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=launch_env, start_new_session=True))
    try:
        wait_for_checkpoint(exp, procs)
        os.kill(rank_process(procs[1].pid, 1), 9)      # node 1's only worker
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    assert "exitcode: -9" in outs[1]
    assert_resumed_to_the_end(exp, outs)
    # one rank on each of the two nodes: both trained, as one world of two
    assert os.path.exists(os.path.join(exp, "log", "train.rank1.log"))
    assert "world=2" in open(os.path.join(exp, "log", "train.rank0.log")).read()
    assert latest_payload(exp)["world_size"] == 2
