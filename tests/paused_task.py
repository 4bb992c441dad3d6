"""The keyword task under the name `kws_paused`, loaded through TOOLKIT_PLUGINS, that
stops for good at the start of optimizer step PAUSE_AT_STEP once it has created the file
PAUSE_MARKER: a test then SIGKILLs the run at a known point, right after the checkpoint
of the step before, with nothing of the paused step logged yet."""
import os
import time

from toolkit.task import TASKS
from toolkit.tasks.kws.task import KwsTask


@TASKS.register("kws_paused")
class PausedKwsTask(KwsTask):
    name = "kws_paused"

    def train_step(self, batch, ctx):
        if ctx.step_index + 1 == int(os.environ.get("PAUSE_AT_STEP", "0")):
            open(os.environ["PAUSE_MARKER"], "w").close()
            while True:             # until the test kills the run
                time.sleep(1)
        return super().train_step(batch, ctx)
