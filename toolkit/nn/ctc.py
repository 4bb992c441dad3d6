"""CTC loss whose backward is deterministic on CUDA.

CUDA's CTC backward accumulates gradients with atomics, so under
torch.use_deterministic_algorithms (training.deterministic, the default) it is an error at
the first step. `ctc_loss` computes the same negative log-likelihood with the forward
(alpha) recursion in plain tensor ops, whose backward autograd derives without atomics;
it runs only where the fused kernel would fail, and the fused kernel everywhere else.

Unreachable states hold a large finite negative number instead of -inf: log-sum-exp over
-inf alone has a NaN gradient, which a zero upstream gradient does not cancel.
"""
from typing import Optional

import torch
import torch.nn.functional as F

_NEG = -1.0e30          # log-probability of an unreachable state
_INFEASIBLE = -1.0e29   # a total below this: no alignment fits (input shorter than targets)


def _padded_targets(targets: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """(B, S) targets from either of F.ctc_loss's layouts (padded or concatenated)."""
    if targets.dim() == 2:
        return targets
    batch = target_lengths.numel()
    longest = int(target_lengths.max().item()) if batch else 0
    out = targets.new_zeros(batch, max(longest, 1))
    start = 0
    for b, n in enumerate(target_lengths.tolist()):
        out[b, :n] = targets[start:start + n]
        start += n
    return out


def ctc_loss_by_recursion(log_probs: torch.Tensor, targets: torch.Tensor,
                          input_lengths: torch.Tensor, target_lengths: torch.Tensor,
                          blank: int = 0, zero_infinity: bool = False) -> torch.Tensor:
    """Per-utterance CTC negative log-likelihood (B,), as F.ctc_loss(reduction="none").

    log_probs (T, B, U) log-softmax outputs; targets (B, S) padded or concatenated;
    input_lengths, target_lengths (B,)."""
    frames, batch, _ = log_probs.shape
    device = log_probs.device
    input_lengths = torch.as_tensor(input_lengths, device=device).long()
    target_lengths = torch.as_tensor(target_lengths, device=device).long()
    labels = _padded_targets(torch.as_tensor(targets, device=device).long(), target_lengths)
    states = 2 * labels.size(1) + 1
    # Extended labels: blank, l1, blank, l2, ..., blank.
    extended = labels.new_full((batch, states), blank)
    extended[:, 1::2] = labels
    position = torch.arange(states, device=device)
    valid = position[None, :] < (2 * target_lengths + 1)[:, None]
    previous_two = torch.cat([extended.new_full((batch, 2), blank), extended[:, :-2]], dim=1)
    may_skip = (extended != blank) & (extended != previous_two) & (position >= 2)[None, :]
    emissions = log_probs.float().gather(2, extended[None].expand(frames, batch, states))

    neg = torch.full((batch, states), _NEG, device=device)
    alpha = torch.where((position < 2)[None, :] & valid, emissions[0], neg)
    for t in range(1, frames):
        stay = alpha
        step = torch.cat([neg[:, :1], alpha[:, :-1]], dim=1)
        skip = torch.where(may_skip, torch.cat([neg[:, :2], alpha[:, :-2]], dim=1), neg)
        new = torch.logsumexp(torch.stack([stay, step, skip]), dim=0) + emissions[t]
        new = torch.where(valid, new, neg)
        alpha = torch.where((t < input_lengths)[:, None], new, alpha)

    last = 2 * target_lengths                                  # the final blank
    end_blank = alpha.gather(1, last[:, None]).squeeze(1)
    end_label = alpha.gather(1, (last - 1).clamp(min=0)[:, None]).squeeze(1)
    end_label = torch.where(target_lengths > 0, end_label, torch.full_like(end_label, _NEG))
    total = torch.logsumexp(torch.stack([end_blank, end_label]), dim=0)
    feasible = total > _INFEASIBLE
    loss = torch.where(feasible, -total, torch.full_like(total, float("inf")))
    if zero_infinity:
        loss = torch.where(feasible, loss, torch.zeros_like(loss))
    return loss


def ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
             target_lengths: torch.Tensor, blank: int = 0, zero_infinity: bool = False,
             deterministic: Optional[bool] = None) -> torch.Tensor:
    """Per-utterance CTC loss (B,). `deterministic` (default: on CUDA with deterministic
    algorithms on) selects the recursion above instead of the fused kernel."""
    if deterministic is None:
        deterministic = log_probs.is_cuda and torch.are_deterministic_algorithms_enabled()
    if deterministic:
        return ctc_loss_by_recursion(log_probs, targets, input_lengths, target_lengths,
                                     blank=blank, zero_infinity=zero_infinity)
    return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=blank,
                      reduction="none", zero_infinity=zero_infinity)


def greedy_decode(log_probs, length: Optional[int] = None, blank: int = 0) -> list:
    """Best-path CTC decoding of one utterance: (T, U) scores -> unit ids, repeats merged
    and blanks dropped."""
    best = torch.as_tensor(log_probs)[:length].argmax(dim=-1).tolist()
    out, previous = [], blank
    for unit in best:
        if unit != blank and unit != previous:
            out.append(unit)
        previous = unit
    return out


def edit_distance(hyp, ref) -> int:
    """Levenshtein distance between two sequences (substitutions, insertions, deletions)."""
    row = list(range(len(ref) + 1))
    for i, h in enumerate(hyp, 1):
        diagonal, row[0] = row[0], i
        for j, r in enumerate(ref, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (h != r))
    return row[-1]
