"""Writers and readers of deployable formats, shared by every task: TorchScript, ONNX
and safetensors + config.json, each carrying the task's metadata (what a runtime needs:
feature options, sizes, class names). Tasks decide which graph goes in; the parity of
each format against PyTorch is checked with `compare`. torch is imported by the
functions that use it, and ONNX metadata is read and written at the protobuf wire level
(toolkit.onnx_proto), without the onnx package: a scoring stage stays light."""
from __future__ import annotations

import json
import logging
import math
import os
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from toolkit.errors import UserError
from toolkit.onnx_proto import read_metadata_props, set_metadata_prop

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)
METADATA_KEY = "toolkit_metadata"
SIDE_CONFIG = "config.json"


def export_torchscript(module: torch.nn.Module, path: str, metadata: dict,
                       trace_example: Optional[Tuple[torch.Tensor, ...]] = None) -> None:
    """Scripted, or traced on `trace_example` for modules TorchScript cannot compile (the
    parity check on inputs of other shapes then shows the trace generalises)."""
    import torch
    module = module.eval()
    if trace_example is not None:
        with torch.no_grad():
            scripted = torch.jit.trace(module, trace_example, check_trace=False)
    else:
        scripted = torch.jit.script(module)
    scripted.save(path, _extra_files={"metadata.json": json.dumps(metadata)})


def export_onnx(module: torch.nn.Module, example: Tuple[torch.Tensor, ...], path: str,
                input_names: Sequence[str], output_names: Sequence[str],
                dynamic_axes: Dict[str, Dict[int, str]], metadata: dict, opset: int = 17) -> None:
    import torch
    torch.onnx.export(module.eval(), example, path, dynamo=False, opset_version=opset,
                      input_names=list(input_names), output_names=list(output_names),
                      dynamic_axes=dynamic_axes)
    set_metadata_prop(path, METADATA_KEY, json.dumps(metadata))


def export_safetensors(module: torch.nn.Module, path: str, metadata: dict,
                       model_config: Optional[dict] = None) -> None:
    """Weights as safetensors; the metadata (with the architecture under `model`, which
    init_checkpoint checks) in config.json beside them."""
    from safetensors.torch import save_file
    state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
    save_file(state, path, metadata={"format": "pt"})
    side = os.path.join(os.path.dirname(os.path.abspath(path)), SIDE_CONFIG)
    body = dict(metadata)
    if model_config is not None:
        body["model"] = model_config
    with open(side, "w", encoding="utf-8") as f:
        json.dump(body, f, indent=1)


def read_metadata(path: str) -> dict:
    """Metadata of any exported format."""
    if path.endswith(".onnx"):
        props = read_metadata_props(path)
        if METADATA_KEY not in props:
            raise ValueError(f"{path}: no {METADATA_KEY} in ONNX metadata")
        return json.loads(props[METADATA_KEY])
    if path.endswith((".zip", ".jit", ".ts")):
        import torch
        extra = {"metadata.json": ""}
        torch.jit.load(path, _extra_files=extra)
        return json.loads(extra["metadata.json"])
    if path.endswith(".safetensors"):
        with open(os.path.join(os.path.dirname(os.path.abspath(path)), SIDE_CONFIG)) as f:
            return json.load(f)
    raise ValueError(f"{path}: unknown model format (expected .onnx, .zip, .safetensors)")


def update_metadata(export_dir: str, changes: dict,
                    names: Iterable[str] = ("model.onnx", "model.zip", SIDE_CONFIG)) -> List[str]:
    """Merges `changes` into the metadata of every exported file present in `export_dir`
    (e.g. the threshold chosen by scoring); returns the files updated."""
    done = []
    for name in names:
        path = os.path.join(export_dir, name)
        if not os.path.exists(path):
            continue
        if name.endswith(".onnx"):
            set_metadata_prop(path, METADATA_KEY, json.dumps(dict(read_metadata(path), **changes)))
        elif name.endswith(".zip"):
            import torch
            extra = {"metadata.json": ""}
            module = torch.jit.load(path, _extra_files=extra)
            meta = dict(json.loads(extra["metadata.json"]), **changes)
            module.save(path, _extra_files={"metadata.json": json.dumps(meta)})
        else:
            with open(path, encoding="utf-8") as f:
                meta = dict(json.load(f), **changes)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(meta, f, indent=1)
        done.append(path)
    return done


# --------------------------------------------------------------------------- parity

def torch_runner(module) -> Callable:
    """numpy arrays in -> tuple of numpy arrays out, through a PyTorch/TorchScript module."""
    import torch

    def run(*arrays: np.ndarray):
        with torch.no_grad():
            out = module(*(torch.from_numpy(a) for a in arrays))
        if isinstance(out, torch.Tensor):
            out = (out,)
        return tuple(o.numpy() for o in out)
    return run


def onnx_runner(path: str, threads: int = 1) -> Callable:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(*arrays: np.ndarray):
        return tuple(session.run(None, dict(zip(names, arrays))))
    return run


class ParityError(UserError, RuntimeError):
    """An export that does not reproduce PyTorch, or a checkpoint whose own outputs are
    not finite (a diverged run): nothing to deploy."""


def output_difference(expected: Sequence[np.ndarray], got: Sequence[np.ndarray]
                      ) -> Tuple[float, Optional[str]]:
    """Max |diff| of one candidate's outputs against PyTorch's, and what makes them
    incomparable (another number of outputs, another shape, non-finite values where
    PyTorch's are finite): then the difference is infinite. No broadcasting, and a NaN
    never hides behind a smaller maximum."""
    expected, got = tuple(expected), tuple(got)
    if len(got) != len(expected):
        return math.inf, f"{len(got)} outputs, PyTorch {len(expected)}"
    worst = 0.0
    for i, (e, g) in enumerate(zip(expected, got)):
        e, g = np.asarray(e), np.asarray(g)
        if g.shape != e.shape:
            return math.inf, f"output {i} has shape {g.shape}, PyTorch {e.shape}"
        if not np.size(e):
            continue
        diff = np.abs(g.astype(np.float64) - e.astype(np.float64))
        if not np.all(np.isfinite(diff)):
            return math.inf, f"output {i} has non-finite values"
        worst = max(worst, float(diff.max()))
    return worst, None


def check_finite_reference(outputs: Sequence[np.ndarray], what: str) -> None:
    for i, out in enumerate(outputs):
        if not np.all(np.isfinite(np.asarray(out))):
            raise ParityError(f"{what}: PyTorch output {i} of the checkpoint is not finite "
                              "(a diverged checkpoint?); nothing exported is usable")


def compare(reference: Callable, candidates: Dict[str, Callable],
            cases: Sequence[Tuple[np.ndarray, ...]], tolerance: float,
            what: str = "exported model", difference: Callable = output_difference,
            measure: str = "max abs diff") -> Dict[str, float]:
    """The worst `difference` (default: max |diff|) of each candidate's outputs against the
    reference over `cases` (tuples of input arrays). Raises ParityError when any exceeds
    `tolerance`, when outputs are missing, shaped differently or not finite, and when the
    reference's own outputs are not finite."""
    worst = {name: 0.0 for name in candidates}
    problems: Dict[str, str] = {}
    for case in cases:
        expected = reference(*case)
        if isinstance(expected, np.ndarray):
            expected = (expected,)
        check_finite_reference(expected, what)
        for name, fn in candidates.items():
            got = fn(*case)
            diff, problem = difference(expected, (got,) if isinstance(got, np.ndarray)
                                       else got)
            worst[name] = max(worst[name], diff)
            if problem and name not in problems:
                problems[name] = problem
    for name, diff in worst.items():
        logger.info("parity %s vs PyTorch: %s %.3g over %d inputs", name, measure, diff,
                    len(cases))
    failed = {k: v for k, v in worst.items() if not v <= tolerance}
    if failed:
        raise ParityError(f"{what} disagrees with PyTorch beyond tolerance {tolerance}: "
                          + ", ".join(f"{k} {v:.3g}" + (f" ({problems[k]})" if k in problems
                                                         else "") for k, v in failed.items()))
    return worst


def parity_inputs(data_list: str, make, count: int) -> list:
    """`make(entry)` for `count` utterances spread over a data list; entries it cannot
    process (BadEntry) are skipped and counted like everywhere else."""
    from toolkit.data.audio import BadEntry
    from toolkit.data.datalist import BadCounter, DataList
    from toolkit.errors import DataError
    test = DataList.load(data_list, require_label=False)
    bad = BadCounter()
    out = []
    step = max(1, len(test) // max(1, count))
    for i in list(range(0, len(test), step)) + list(range(len(test))):
        if len(out) >= count:
            break
        entry = test.entry(i)
        try:
            out.append(make(entry))
        except BadEntry as err:
            bad.add(err.reason, entry["key"], err.detail)
    if not out:
        raise DataError(f"{data_list}: no usable utterance for the parity check ({bad.summary()})")
    return out
