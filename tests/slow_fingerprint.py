"""A plugin for the trainer tests (TOOLKIT_PLUGINS=slow_fingerprint): rank 0's data
fingerprint takes SLOW_FINGERPRINT_S seconds longer, as on a large corpus on network
storage, while the other ranks wait for it."""
import os
import time

from toolkit.trainer import run

_fingerprint = run.data_fingerprint


def _slow(*args, **kwargs):
    time.sleep(float(os.environ.get("SLOW_FINGERPRINT_S", "0")))
    return _fingerprint(*args, **kwargs)


run.data_fingerprint = _slow
