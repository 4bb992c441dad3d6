"""Memory-lean training pass of the commonest convolutional unit: 1-D convolutions ->
BatchNorm -> ReLU -> dropout (-> + input), with bitwise the results of the plain modules.

Autograd keeps every intermediate of such a unit for the backward pass: the (padded)
input, each convolution's output, the normalised output, the ReLU output and dropout's
float noise, five tensors of the unit's size. This pass keeps the unit's input and two
one-byte masks (ReLU and dropout) and recomputes the convolutions in the backward pass.
Each recomputed tensor is bitwise the forward one (the same kernels on the same inputs),
and the backward calls the same ATen kernels autograd would call on them, so gradients,
running statistics and the random stream are bitwise those of the plain modules (tested
in tests/test_lean_units.py against them).

The mirror covers the CPU float32 training pass: dropout draws its noise there with
`bernoulli_` (CUDA uses a fused kernel with another random stream) and autocast changes
dtypes. Everything else (evaluation, no_grad, autocast, CUDA, TorchScript) takes the
plain modules; `use_lean_pass` says which.
"""
import contextlib
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
import torch.nn.functional as F


_ENABLED = True


@contextlib.contextmanager
def plain_pass() -> Iterator[None]:
    """Within it, models take their plain modules (to compare with, or to measure)."""
    global _ENABLED
    saved, _ENABLED = _ENABLED, False
    try:
        yield
    finally:
        _ENABLED = saved


def use_lean_pass(x: torch.Tensor, training: bool) -> bool:
    """Whether the lean pass reproduces the plain modules for this call (see above)."""
    return (_ENABLED and training and torch.is_grad_enabled() and x.device.type == "cpu"
            and x.dtype == torch.float32 and not torch.is_autocast_enabled("cpu"))


def _conv(x: torch.Tensor, conv: nn.Conv1d, left: Optional[torch.Tensor]) -> torch.Tensor:
    # What CausalConv1d / nn.Conv1d compute: the cache concatenated in front, then the
    # unpadded convolution (nn.Conv1d._conv_forward with zero padding).
    full = torch.cat([left, x], dim=2) if left is not None else x
    return F.conv1d(full, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation,
                    conv.groups)


def _batch_norm_args(bn: nn.modules.batchnorm._BatchNorm) -> Tuple[float, Optional[torch.Tensor],
                                                                   Optional[torch.Tensor]]:
    """The momentum factor and running buffers nn.BatchNorm's training forward uses, with
    its num_batches_tracked update."""
    factor = 0.0 if bn.momentum is None else bn.momentum
    if bn.track_running_stats and bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
    running = bn.track_running_stats
    return factor, (bn.running_mean if running else None), (bn.running_var if running else None)


# What the backward pass needs of ReLU and dropout, one byte per element: the ReLU output
# was zero (its gradient is 0), dropout dropped it (the gradient is multiplied by 0, which
# keeps the sign of zero and NaN of the plain pass), or neither (times the dropout scale).
_PASSED, _ZEROED, _DROPPED = 0, 1, 2


def _first_input(x: torch.Tensor, left: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.cat([left, x], dim=2) if left is not None else x


class _LeanUnit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, convs, lefts, bn, p, residual, *params):
        ctx.convs, ctx.lefts, ctx.bn, ctx.p, ctx.residual = convs, lefts, bn, p, residual
        y = x
        for conv, left in zip(convs, lefts):
            y = _conv(y, conv, left)
        factor, mean, var = _batch_norm_args(bn)
        y, save_mean, save_invstd = torch.native_batch_norm(y, bn.weight, bn.bias, mean, var,
                                                             True, factor, bn.eps)
        torch.relu_(y)
        # threshold_backward's test (y <= 0), so that a NaN output passes its gradient.
        state = (y <= 0).view(torch.uint8)
        if p > 0:
            # F.dropout's CPU path (ATen's _dropout): float noise from bernoulli_, divided
            # by the keep probability, multiplied in. The noise holds only 0 and one scale.
            noise = torch.empty_like(y).bernoulli_(1 - p)
            noise.div_(1 - p)
            dropped = (noise == 0).view(torch.uint8)
            y.mul_(noise)
            del noise
            # ZEROED wins over DROPPED: the plain pass gives +0 there either way.
            state = torch.where(state.bool(), state, dropped.mul_(_DROPPED))
            del dropped
            ctx.scale = torch.ones(1, dtype=y.dtype).div_(1 - p)
        if residual:
            y.add_(x)
        ctx.save_for_backward(x, state, save_mean, save_invstd)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, state, save_mean, save_invstd = ctx.saved_tensors
        convs, lefts, bn = ctx.convs, ctx.lefts, ctx.bn
        # The gradient reaching BatchNorm is contiguous, as threshold_backward's output
        # is: its layout decides the order of BatchNorm's backward reductions (a gradient
        # arriving transposed, e.g. from a classifier over (B, T, C), would change bits).
        if ctx.p > 0:
            # MulBackward0 of the dropout product: grad * noise.
            zero = torch.zeros(1, dtype=grad.dtype)
            g = torch.where(state == _DROPPED, zero, ctx.scale).mul_(grad)
        else:
            g = grad.clone(memory_format=torch.contiguous_format)
        g.masked_fill_(state == _ZEROED, 0.0)                  # threshold_backward
        del state
        # The outputs of the convolutions again (bitwise those of the forward pass); the
        # first convolution's input is rebuilt only when its backward needs it.
        outputs: List[torch.Tensor] = []
        with torch.no_grad():
            y = x
            for conv, left in zip(convs, lefts):
                y = _conv(y, conv, left)
                outputs.append(y)
        del y
        mean = bn.running_mean if bn.track_running_stats else None
        var = bn.running_var if bn.track_running_stats else None
        g, g_bn_w, g_bn_b = torch.ops.aten.native_batch_norm_backward(
            g, outputs.pop(), bn.weight, mean, var, save_mean, save_invstd, True, bn.eps,
            [True, bn.weight is not None, bn.bias is not None])
        conv_grads: List[Tuple[torch.Tensor, torch.Tensor]] = []
        for i in reversed(range(len(convs))):
            conv = convs[i]
            conv_input = outputs.pop() if i > 0 else _first_input(x, lefts[0])
            needs_input = i > 0 or ctx.needs_input_grad[0]
            bias_sizes = [conv.bias.shape[0]] if conv.bias is not None else None
            g_in, g_w, g_b = torch.ops.aten.convolution_backward(
                g, conv_input, conv.weight, bias_sizes, list(conv.stride), list(conv.padding),
                list(conv.dilation), False, [0], conv.groups,
                [needs_input, True, conv.bias is not None])
            del conv_input
            conv_grads.append((g_w, g_b))
            g = g_in
            if g is not None and lefts[i] is not None:
                g = g[:, :, lefts[i].size(2):]                 # CatBackward0
        conv_grads.reverse()
        grad_x = None
        if ctx.needs_input_grad[0]:
            # The residual's gradient added in place (the sum is the same either way).
            grad_x = g.add_(grad) if ctx.residual else g
        params: List[Optional[torch.Tensor]] = []
        for conv, (g_w, g_b) in zip(convs, conv_grads):
            params.append(g_w)
            if conv.bias is not None:
                params.append(g_b)
        if bn.weight is not None:
            params += [g_bn_w, g_bn_b]
        return (grad_x, None, None, None, None, None, *params)


def conv_bn_relu(x: torch.Tensor, convs: Sequence[nn.Conv1d], bn: nn.modules.batchnorm._BatchNorm,
                 dropout: float = 0.0, residual: bool = False,
                 lefts: Optional[Sequence[Optional[torch.Tensor]]] = None) -> torch.Tensor:
    """[x +] dropout(relu(bn(conv_n(...conv_1(x))))) in training, memory-lean (see the
    module docstring; call it when `use_lean_pass` holds). `lefts[i]`, when given, is
    concatenated in front of conv i's input along time (a causal convolution's cache)."""
    convs = list(convs)
    lefts = list(lefts) if lefts is not None else [None] * len(convs)
    if any(c.padding_mode != "zeros" or c.stride != (1,) for c in convs):
        raise ValueError("conv_bn_relu: only stride-1 convolutions with zero padding")
    params: List[torch.Tensor] = []
    for conv in convs:
        params.append(conv.weight)
        if conv.bias is not None:
            params.append(conv.bias)
    if bn.weight is not None:
        params += [bn.weight, bn.bias]
    return _LeanUnit.apply(x, convs, lefts, bn, float(dropout), residual, *params)
