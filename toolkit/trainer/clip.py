"""Global-norm gradient clipping that refuses to apply non-finite updates."""
from typing import Iterable, Optional, Tuple

import torch


def clip_and_step(parameters: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                  max_norm: float, scaler: Optional["torch.amp.GradScaler"] = None,
                  factor: float = 1.0) -> Tuple[float, bool]:
    """Unscales (fp16), multiplies by `factor` (the trainer's weighting by contributing
    batches), clips to `max_norm`, and steps only when the norm is finite. Returns (grad
    norm before clipping, whether the update was applied). Under DDP the gradients are
    already averaged, so every rank reaches the same decision."""
    params = [p for p in parameters if p.grad is not None]
    if scaler is not None:
        scaler.unscale_(optimizer)        # clip the true gradients, not the scaled ones
    if factor != 1.0:
        for p in params:
            p.grad.mul_(factor)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    finite = bool(torch.isfinite(norm))
    if scaler is not None:
        scaler.step(optimizer)            # skips by itself when it found inf/NaN
        scaler.update()
    elif finite:
        optimizer.step()
    return float(norm), finite
