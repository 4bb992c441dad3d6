"""Shared helpers for tests of the data pipeline (plan, feature pipeline, kws builder)."""
from typing import List, Optional

import numpy as np

from toolkit.data import plan
from toolkit.data.pipeline import FeaturePipeline
from toolkit.tasks.kws.data import KwsExampleBuilder


def plan_batches(datalist, dataset_cfg, seed: int, epoch: int, train: bool) -> List[np.ndarray]:
    """The bucket plan of a data list, as the raw source computes it: estimated fbank
    frames of every entry, entries outside the duration limits left out."""
    durations = datalist.durations
    return plan.plan_batches(plan.estimated_frames(durations, dataset_cfg),
                             plan.usable_indices(durations, dataset_cfg),
                             dataset_cfg, seed, epoch, train)


def kws_builder(pipeline: FeaturePipeline, spec_aug_positives: bool = True,
                num_units: Optional[int] = None) -> KwsExampleBuilder:
    """The keyword-spotting example builder over `pipeline` (the kws task's defaults)."""
    return KwsExampleBuilder(pipeline, spec_aug_positives=spec_aug_positives,
                             num_units=num_units)
