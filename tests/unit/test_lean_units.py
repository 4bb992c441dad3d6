"""The memory-lean training pass (toolkit.nn.lean) against the plain modules: the same bits
everywhere (outputs, caches, gradients, BatchNorm statistics, the random stream, two
steps of the real optimizer), a fraction of the activations kept for the backward pass,
the plain modules wherever the mirror does not hold, and results that do not depend on
where the input lies in memory."""
import copy

import pytest
import torch
from torch import nn

from toolkit.nn.lean import conv_bn_relu, plain_pass, use_lean_pass
from toolkit.tasks.kws.models.ds_tcn import DSTCN


CONFIGS = {
    "benchmark": dict(hidden_dim=32, num_layers=4, kernel_size=8, dilations=[1, 2, 4, 8],
                      dropout=0.1),
    "no_dropout": dict(hidden_dim=16, num_layers=3, kernel_size=3, dilations=[1, 2],
                       dropout=0.0),
    "kernel_1": dict(hidden_dim=16, num_layers=2, kernel_size=1, dilations=[1], dropout=0.3),
    "frontend_members": dict(hidden_dim=8, num_layers=2, kernel_size=4, dilations=[1, 2],
                             dropout=0.1, frontend_channels=4, members=2),
}


def model_pair(**kw):
    torch.manual_seed(0)
    model = DSTCN(DSTCN.Config(type="ds_tcn", input_dim=12, num_outputs=2, **kw)).train()
    return model, copy.deepcopy(model)


def feats(batch=5, frames=37, dim=12, seed=1):
    return torch.randn(batch, frames, dim, generator=torch.Generator().manual_seed(seed)) * 3


def train_steps(model, lean: bool, steps: int = 2):
    """Two Adam steps; returns everything a step produces or changes."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    record = []
    for step in range(steps):
        torch.manual_seed(100 + step)         # dropout's stream
        x = feats(seed=step)
        if lean:
            out, cache = model(x)
        else:
            with plain_pass():
                out, cache = model(x)
        weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
        (out * weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        record.append((out.detach(), cache.detach(), grads))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return record, state, torch.get_rng_state()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_lean_pass_is_bitwise_the_plain_pass(name):
    lean_model, plain_model = model_pair(**CONFIGS[name])
    lean, lean_state, lean_rng = train_steps(lean_model, lean=True)
    plain, plain_state, plain_rng = train_steps(plain_model, lean=False)
    for (out_a, cache_a, grads_a), (out_b, cache_b, grads_b) in zip(lean, plain):
        assert torch.equal(out_a, out_b)
        assert torch.equal(cache_a, cache_b)
        differing = [n for n in grads_b if not torch.equal(grads_a[n], grads_b[n])]
        assert not differing, f"gradients differ: {differing}"
    # Weights after the optimizer, running statistics, num_batches_tracked.
    assert [k for k in plain_state if not torch.equal(lean_state[k], plain_state[k])] == []
    assert torch.equal(lean_rng, plain_rng)


def saved_bytes(model, lean: bool) -> int:
    """Bytes of the tensors autograd keeps from the forward pass for the backward pass."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if lean:
            out, _ = model(feats(batch=8, frames=200))
        else:
            with plain_pass():
                out, _ = model(feats(batch=8, frames=200))
    out.sum().backward()
    return total


def test_lean_pass_keeps_a_fraction_of_the_activations():
    lean_model, plain_model = model_pair(**CONFIGS["benchmark"])
    lean, plain = saved_bytes(lean_model, True), saved_bytes(plain_model, False)
    # Per block the plain modules keep five float tensors of its size, the lean pass its
    # input and a byte per element.
    assert lean < 0.35 * plain, (lean, plain)


def test_plain_modules_where_the_mirror_does_not_hold():
    model, _ = model_pair(**CONFIGS["benchmark"])
    x = feats()
    assert use_lean_pass(x, training=True)
    assert not use_lean_pass(x, training=False)
    assert not use_lean_pass(x.double(), training=True)
    with torch.no_grad():
        assert not use_lean_pass(x, training=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not use_lean_pass(x, training=True)
    with plain_pass():
        assert not use_lean_pass(x, training=True)
    # Evaluation and TorchScript export take the plain modules and agree with each other.
    model.eval()
    scripted = torch.jit.script(model)
    with torch.no_grad():
        assert torch.equal(model(x)[0], scripted(x)[0])


def test_unsupported_convolution_is_refused():
    conv = nn.Conv1d(4, 4, 3, stride=2)
    with pytest.raises(ValueError, match="stride-1"):
        conv_bn_relu(torch.randn(2, 4, 9), [conv], nn.BatchNorm1d(4))


@pytest.mark.parametrize("offset_floats", [1, 3, 4, 8, 12])
def test_results_do_not_depend_on_where_the_input_lies(offset_floats):
    """glibc places arrays (and so from_numpy batches) at addresses that depend on what
    was allocated and trimmed before; a training step must give the same bits for an
    input at any alignment."""
    reference_model, model = model_pair(**CONFIGS["benchmark"])
    x = feats()
    buffer = torch.empty(x.numel() + 64)
    shifted = buffer[offset_floats:offset_floats + x.numel()].view_as(x).copy_(x)
    assert shifted.data_ptr() % 64 == 4 * offset_floats % 64 != 0
    results = []
    for m, inp in ((reference_model, x), (model, shifted)):
        torch.manual_seed(7)
        out, _ = m(inp)
        out.sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in m.parameters()]))
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))


def test_the_trainers_switch_changes_no_bit(tmp_path):
    """training.lean_units=false (autograd keeps every intermediate: faster steps, more
    memory) trains to the same parameters as the default lean pass."""
    import re
    from train_utils import Corpus, run_train
    corpus = Corpus(str(tmp_path / "corpus"), num_train=24, num_dev=6)
    checksums = []
    for lean in ("true", "false"):
        exp = tmp_path / f"exp_{lean}"
        result = run_train(corpus.train_args(str(exp), "training.max_epoch=1",
                                             f"training.lean_units={lean}"))
        assert result.returncode == 0, result.stderr[-3000:]
        log = (exp / "log" / "train.rank0.log").read_text()
        checksums.append(re.search(r"final parameter checksum (\w+)", log).group(1))
    assert checksums[0] == checksums[1]
