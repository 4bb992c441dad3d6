"""Rewrites of Kokoro's quantized ONNX graph for the derived graphs of
toolkit.voicebank.kokoro_assets: the dynamically quantized operators as float32 ones,
then the nodes put back in order and what no output needs dropped. onnx is imported
only when a graph is rewritten."""
from typing import Dict, List, Sequence

import numpy as np

from toolkit.voicebank import AssetError


def dequantize(graph) -> int:
    """Rewrites the dynamically quantized operators of `graph` as float32 operators on
    dequantized weights; returns how many. Each MatMulInteger / ConvInteger computes
    (x_q - zp_x)(w_q - zp_w) [+ a bias quantized at the same scale], cast to float and
    multiplied by scale_x * scale_w: that Mul's output becomes MatMul(x, w) / Conv(x, w, b)
    on the float input x and w = (w_q - zp_w) * scale_w. DynamicQuantizeLSTM becomes LSTM
    (its weights transposed to [directions, 4 * hidden, input])."""
    from onnx import helper, numpy_helper

    arr = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: Dict[str, List] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    new_inits: Dict[str, np.ndarray] = {}

    def take_outputs(old, new) -> None:
        """`new` produces `old`'s outputs from now on; `old` is left dangling (pruned)."""
        for k, name in enumerate(old.output):
            if name:
                old.output[k] = name + "_quantized_path"
        graph.node.append(new)

    def init(name: str) -> np.ndarray:
        if name not in arr:
            raise AssetError(f"cannot dequantize: {name} is not a constant")
        return numpy_helper.to_array(arr[name]).astype(np.float32)

    def only_consumer(name: str, op_types: Sequence[str]):
        found = consumers.get(name, [])
        if len(found) != 1 or found[0].op_type not in op_types:
            raise AssetError(f"cannot dequantize: unexpected use of {name}")
        return found[0]

    count = 0
    for node in list(graph.node):
        if node.op_type not in ("MatMulInteger", "ConvInteger"):
            continue
        quantizer = producer[node.input[0]]
        if quantizer.op_type != "DynamicQuantizeLinear":
            raise AssetError(f"cannot dequantize {node.name}: input not dynamically quantized")
        x = quantizer.input[0]
        w = init(node.input[1])
        zero = init(node.input[3]) if len(node.input) > 3 and node.input[3] else np.float32(0)
        step = only_consumer(node.output[0], ("Add", "Cast"))
        bias = None
        if step.op_type == "Add":        # bias quantized as floor(b / (scale_x * scale_w))
            other = step.input[1] if step.input[0] == node.output[0] else step.input[0]
            chain = producer[other]
            while chain.op_type != "Div":
                chain = producer[chain.input[0]]
            bias = chain.input[0]
            step = only_consumer(step.output[0], ("Cast",))
        scale_mul = only_consumer(step.output[0], ("Mul",))
        scale_product = producer[scale_mul.input[1] if scale_mul.input[0] == step.output[0]
                                 else scale_mul.input[0]]
        w_scale = [i for i in scale_product.input if i in arr][0]
        scale = init(w_scale)
        name = node.input[1] + "_float"
        if node.op_type == "MatMulInteger":    # w [K, N], per-column zero point and scale
            new_inits[name] = (w - zero.reshape(1, -1) if np.ndim(zero) else w - zero) * \
                (scale.reshape(1, -1) if np.ndim(scale) else scale)
            new = helper.make_node("MatMul", [x, name], [scale_mul.output[0]],
                                   name=f"{node.name or node.op_type}_float{count}")
        else:                                  # w [M, C, k...], per output channel
            shape = (-1,) + (1,) * (w.ndim - 1)
            new_inits[name] = (w - (zero.reshape(shape) if np.ndim(zero) else zero)) * \
                (scale.reshape(shape) if np.ndim(scale) else scale)
            new = helper.make_node("Conv", [x, name] + ([bias] if bias else []),
                                   [scale_mul.output[0]],
                                   name=f"{node.name or node.op_type}_float{count}")
            new.attribute.extend(node.attribute)
        take_outputs(scale_mul, new)
        count += 1

    for node in list(graph.node):
        if node.op_type != "DynamicQuantizeLSTM":
            continue
        # X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zp, R_scale, R_zp
        ins = list(node.input) + [""] * (12 - len(node.input))
        floats = []
        for q, scale_name, zero_name in ((ins[1], ins[8], ins[9]), (ins[2], ins[10], ins[11])):
            w, scale, zero = init(q), init(scale_name), init(zero_name)   # w [dirs, in, 4h]
            shape = (w.shape[0], 1, -1)
            wf = ((w - zero.reshape(shape)) * scale.reshape(shape)).transpose(0, 2, 1)
            new_inits[q + "_float"] = np.ascontiguousarray(wf)
            floats.append(q + "_float")
        new = helper.make_node("LSTM", [ins[0], floats[0], floats[1]] + ins[3:8],
                               list(node.output), name=f"{node.name or node.op_type}_float{count}")
        new.attribute.extend(node.attribute)
        take_outputs(node, new)
        count += 1
    for name, value in new_inits.items():
        graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), name))
    _topological_sort(graph)
    _prune(graph)
    return count


def _topological_sort(graph) -> None:
    """ONNX wants every node after the producers of its inputs (new nodes were appended)."""
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        rest = []
        for node in pending:
            if all(i in available for i in node.input):
                ordered.append(node)
                available.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            made = {o for n in rest for o in n.output}
            lost = sorted({i for n in rest for i in n.input if i not in available | made})
            raise AssetError(f"cannot order the graph: no producer of {', '.join(lost[:3])}")
        pending = rest
    del graph.node[:]
    graph.node.extend(ordered)


def _prune(graph) -> None:
    """Drops nodes and initializers that no graph output depends on."""
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output if o):
            keep.append(node)
            needed.update(i for i in node.input if i)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
