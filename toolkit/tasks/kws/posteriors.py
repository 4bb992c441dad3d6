"""Frame posteriors of a data list through a deployable model, written as one Kaldi ark
(key -> frames x outputs) in the list's order, by `nj` forked workers.

Each worker takes a contiguous slice of the list, loads its own backend (an ONNX Runtime
session is not carried across a fork; one intra-op thread each, so nj workers fill nj
cores) and writes the slice's part ark beside the output. The parts are joined in slice
order into a temporary file that is renamed onto the output, so the ark is byte for byte
the same whatever nj, and an interrupted run never leaves a partial output."""
import logging
import os
import shutil
from typing import List, NamedTuple, Tuple

import numpy as np

from toolkit.data.datalist import BadCounter

logger = logging.getLogger(__name__)


class PosteriorJob(NamedTuple):
    model: str
    data_list: str
    part_path: str
    start: int
    end: int
    chunk_frames: int
    fuse_zero_shot: bool
    components: bool


def _slices(n: int, parts: int) -> List[Tuple[int, int]]:
    """`parts` contiguous, nearly equal [start, end) ranges covering 0..n."""
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _write_slice(job: PosteriorJob) -> Tuple[int, BadCounter]:
    import kaldiio
    from toolkit.config import dataset_config_from_metadata
    from toolkit.data.audio import BadEntry
    from toolkit.data.datalist import DataList
    from toolkit.data.pipeline import evaluation_pipeline
    from toolkit.progress import tick
    from toolkit.tasks.kws.detector import load_backend

    backend = load_backend(job.model, fuse_zero_shot=job.fuse_zero_shot)
    cfg = dataset_config_from_metadata(backend.metadata["feature"])
    datalist = DataList.load(job.data_list, require_label=False)
    processor = evaluation_pipeline(cfg)
    bad = BadCounter()
    written = 0
    with kaldiio.WriteHelper(f"ark:{job.part_path}") as writer:
        for i in range(job.start, job.end):
            entry = datalist.entry(i)
            tick()
            try:
                feats = processor.features(entry, 0)
            except BadEntry as err:
                bad.add(err.reason, entry["key"], err.detail)
                continue
            backend.reset()
            chunk = job.chunk_frames or len(feats)
            probs = []
            for s in range(0, len(feats), chunk):
                fused = backend.step(feats[s:s + chunk])
                probs.append(backend.components if job.components else fused)
            writer(entry["key"], np.concatenate(probs).astype(np.float32))
            written += 1
    return written, bad


def write_posteriors(model: str, data_list: str, output: str, chunk_frames: int = 0,
                     fuse_zero_shot: bool = False, components: bool = False,
                     nj: int = 1) -> Tuple[int, BadCounter]:
    """Posteriors of every entry of `data_list` through `model` into the ark `output`:
    the fused score with `fuse_zero_shot`, its parts [head | search | verifier] with
    `components` too. Entries whose features cannot be made are skipped and counted.
    Returns (utterances written, the skips)."""
    from toolkit.data.datalist import DataList
    from toolkit.progress import parallel_map
    from toolkit.tasks.kws.detector import load_backend

    if nj < 1:
        raise ValueError(f"nj must be at least 1, got {nj}")
    # The model and the list are read here first, so that either's error is reported once,
    # before any worker starts; the workers load their own backends.
    load_backend(model, fuse_zero_shot=fuse_zero_shot)     # dropped at once
    n = len(DataList.load(data_list, require_label=False))
    out_dir = os.path.dirname(os.path.abspath(output))
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{output}.tmp{os.getpid()}"
    jobs = [PosteriorJob(model, data_list, f"{tmp}.part{k}", a, b, chunk_frames,
                         fuse_zero_shot, components)
            for k, (a, b) in enumerate(_slices(n, nj) or [(0, 0)])]
    try:
        results = parallel_map(_write_slice, jobs, nj, n, f"posteriors of {data_list}")
        with open(tmp, "wb") as out:
            for job in jobs:
                with open(job.part_path, "rb") as part:
                    shutil.copyfileobj(part, out)
        os.replace(tmp, output)
    finally:
        for path in [tmp] + [job.part_path for job in jobs]:
            if os.path.exists(path):
                os.remove(path)
    bad = BadCounter()
    for _, part_bad in results:
        bad.merge(part_bad)
    return sum(w for w, _ in results), bad
