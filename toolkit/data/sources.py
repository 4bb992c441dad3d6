"""Input forms of the pipeline: a JSON-lines data list (wav or feat entries) or tar
shards. Each can plan an epoch and serve one rank's batches from any position, through a
task's ExampleBuilder."""
import logging
import os
import urllib.parse
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
from torch.utils.data import Dataset

from toolkit.data import shards
from toolkit.data.audio import BadEntry
from toolkit.data.datalist import BadCounter, DataList
from toolkit.data.loader import make_loader
from toolkit.data.plan import plan_epoch, report_duration_filter, usable_indices
from toolkit.errors import MissingInputError
from toolkit.registry import Registry

logger = logging.getLogger(__name__)
SOURCES: Registry = Registry("data type")
# Hugging Face datasets (dataset.hf.train / dataset.hf.dev); imports `datasets` when used.
SOURCES.register_lazy("hf", "toolkit.data.hf_source")


class DataSource:
    """What the trainer needs of an input: its size, a plan per epoch, a loader per rank."""
    bad: BadCounter
    path: str
    outside_duration: int = 0     # utterances the duration limits leave out (named in the log)

    def __len__(self) -> int:
        raise NotImplementedError

    def total_hours(self) -> float:
        raise NotImplementedError

    def has_features(self) -> bool:
        return False

    def plan(self, dataset_cfg, seed: int, epoch: int, train: bool) -> List[np.ndarray]:
        raise NotImplementedError

    def loader(self, batches, builder, epoch: int, start: int, num_workers: int,
               prefetch_factor: int, seed: int):
        raise NotImplementedError

    def referenced_files(self) -> List[str]:
        """Files whose content training reads (audio, feature archives, shards)."""
        return []

    def field_values(self, name: str) -> Optional[List[Tuple[str, object]]]:
        """(key, value of field `name` or None) of every utterance the plans use; None
        when entries are only read together with their audio (shards)."""
        return None


class BatchDataset(Dataset):
    """Item i = the i-th batch of this rank's plan, built by the task and collated."""

    def __init__(self, datalist: DataList, batches: Sequence[np.ndarray], builder, epoch: int):
        self.datalist = datalist
        self.batches = batches
        self.builder = builder
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int):
        examples, keys = [], []
        bad = BadCounter()
        seconds = 0.0
        for idx in self.batches[i]:
            idx = int(idx)
            entry = self.datalist.entry(idx)
            entry["label"] = int(self.datalist.labels[idx])
            try:
                example = self.builder(entry, self.epoch)
            except BadEntry as err:
                bad.add(err.reason, entry["key"], err.detail)
                continue
            examples.append(example)
            keys.append(entry["key"])
            seconds += float(self.datalist.durations[idx])
        return self.builder.collate(examples, keys, seconds, bad)


@SOURCES.register("raw")
class RawSource(DataSource):
    """A JSON-lines data list."""

    def __init__(self, path: str, requirements, dataset_cfg, frames_of: Callable):
        self.path = path
        self.data = DataList.load(path, num_classes=requirements.num_classes,
                                  require_label=requirements.require_label,
                                  allow_negative=requirements.allow_negative_label)
        self.bad = self.data.bad
        self.keep = usable_indices(self.data.durations, dataset_cfg)
        self.outside_duration = report_duration_filter(self.data.durations, self.data.key,
                                                       dataset_cfg, path)
        self.frames = frames_of(self.data.durations)

    def __len__(self) -> int:
        return len(self.data)

    def total_hours(self) -> float:
        return self.data.total_hours()

    def has_features(self) -> bool:
        return self.data.has_features()

    def plan(self, dataset_cfg, seed, epoch, train):
        return plan_epoch(self.frames, self.keep, dataset_cfg, seed, epoch, train,
                          self.data.labels)

    def loader(self, batches, builder, epoch, start, num_workers, prefetch_factor, seed):
        return make_loader(BatchDataset(self.data, batches, builder, epoch),
                           start, num_workers, prefetch_factor, seed)

    def referenced_files(self) -> List[str]:
        return self.data.referenced_files()

    def field_values(self, name: str) -> Optional[List[Tuple[str, object]]]:
        return [(e["key"], e.get(name)) for e in map(self.data.entry, self.keep.tolist())]


@SOURCES.register("shard")
class ShardSource(DataSource):
    """Tar shards named by a shard list, planned from their index without opening them."""

    def __init__(self, path: str, requirements, dataset_cfg, frames_of: Callable):
        if dataset_cfg.sampler.type != "bucket":
            raise ValueError(f"{path}: dataset.sampler.type={dataset_cfg.sampler.type} needs "
                             "random access; tar shards are read in order (use a data list)")
        self.path = path
        self.index = shards.ShardIndex.load(path, token=dataset_cfg.auth_token)
        self.bad = BadCounter()
        self.frames_of = frames_of
        labels = self.index.labels
        if requirements.num_classes is not None:
            low = -1 if requirements.allow_negative_label else 0
            wrong = (labels < low) | (labels >= requirements.num_classes)
            if wrong.any():
                raise ValueError(f"{path}: {int(wrong.sum())} utterances have labels outside the "
                                 f"inventory of {requirements.num_classes} classes")
        self.outside_duration = report_duration_filter(self.index.durations, self.index.key,
                                                       dataset_cfg, path)

    def __len__(self) -> int:
        return len(self.index)

    def total_hours(self) -> float:
        return self.index.total_hours()

    def plan(self, dataset_cfg, seed, epoch, train):
        return shards.plan_shard_batches(self.index, dataset_cfg, seed, epoch, train,
                                         frames_of=self.frames_of)

    def loader(self, batches, builder, epoch, start, num_workers, prefetch_factor, seed):
        dataset = shards.ShardBatchDataset(self.index, batches, builder, epoch, start=start,
                                           channel=builder_channel(builder))
        return shards.make_shard_loader(dataset, num_workers, prefetch_factor, seed)

    def referenced_files(self) -> List[str]:
        return list(self.index.sources)


def builder_channel(builder) -> int:
    pipeline = getattr(builder, "pipeline", None)
    return pipeline.cfg.channel if pipeline is not None else -1


def detect_data_type(path: str, token: str = "") -> str:
    """A data list holds JSON objects; a shard list holds tar paths or URLs."""
    text = shards.read_text(path, token)
    for line in text.splitlines():
        if line.strip():
            return "raw" if line.lstrip().startswith("{") else "shard"
    return "raw"


def is_url(path: str) -> bool:
    return bool(urllib.parse.urlsplit(path).scheme) and "://" in path


def has_input(dataset_cfg, split: str) -> bool:
    """Whether the config names an input for `split` (train, dev): a list or shard-list
    path, or Hugging Face datasets."""
    return bool(getattr(dataset_cfg, f"{split}_data") or getattr(dataset_cfg.hf, split))


def open_split(dataset_cfg, split: str, requirements, frames_of: Callable) -> DataSource:
    """The input of `split`: `dataset.hf.<split>` when it lists datasets, else the list or
    shard list at `dataset.<split>_data`."""
    if getattr(dataset_cfg.hf, split):
        return SOURCES.get("hf")(split, requirements, dataset_cfg, frames_of)
    path = getattr(dataset_cfg, f"{split}_data")
    if not path or not (os.path.exists(path) or is_url(path)):
        raise MissingInputError(f"dataset.{split}_data: data list '{path}' not found")
    return open_source(dataset_cfg.data_type, path, requirements, dataset_cfg, frames_of)


def open_source(data_type: str, path: str, requirements, dataset_cfg,
                frames_of: Callable) -> DataSource:
    if data_type == "auto":
        data_type = detect_data_type(path, dataset_cfg.auth_token)
    if data_type == "raw" and is_url(path):
        raise ValueError(f"{path}: a data list must be a local file (URLs are for shard lists)")
    return SOURCES.get(data_type)(path, requirements, dataset_cfg, frames_of)
