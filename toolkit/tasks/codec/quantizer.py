"""Residual vector quantizer with DAC's factorised, L2-normalised codes.

Each stage projects the residual (latent_dim) down to `codebook_dim` (8 by default), picks the
codebook entry with the highest cosine similarity (nearest neighbour after L2 normalisation of
both sides), and projects the entry back up. Low-dimensional normalised lookup keeps most
entries in use without k-means initialisation or restarts (DAC, Kumar et al. 2023).

Gradients: the straight-through estimator passes the decoder's gradient to the encoder
unchanged (z_q = z_e + sg(q - z_e)); the commitment loss pulls encoder outputs towards their
entries, the codebook loss pulls entries towards encoder outputs. With `ema_decay > 0` the
codebook is a buffer updated by exponential moving averages of the assigned vectors instead
(VQ-VAE-2/EnCodec), entries that fall out of use are replaced by vectors of the current batch,
and the codebook loss is zero.

The whole quantizer is an fp32 island: autocast is disabled inside and the input cast to
float32, because nearest-neighbour search and EMA statistics in bf16 pick wrong entries and
drift. Outputs are float32.
"""
import math
from typing import Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _first_rank_with_data(has_data: bool, device) -> Optional[int]:
    """The lowest rank whose batch is real (every rank must call it); None when none."""
    if not _distributed():
        return 0 if has_data else None
    flags = torch.zeros(dist.get_world_size(), device=device)
    flags[dist.get_rank()] = 1.0 if has_data else 0.0
    dist.all_reduce(flags)
    found = torch.nonzero(flags).flatten()
    return int(found[0]) if len(found) else None


class VectorQuantizer(nn.Module):
    """One stage: input_dim -> codebook_dim lookup -> input_dim."""

    def __init__(self, input_dim: int, codebook_size: int, codebook_dim: int,
                 ema_decay: float = 0.0, dead_code_threshold: float = 0.1):
        super().__init__()
        if codebook_size < 2:
            raise ValueError(f"codebook_size must be >= 2, got {codebook_size}")
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay}")
        self.codebook_size = codebook_size
        self.codebook_dim = codebook_dim
        self.ema_decay = ema_decay
        self.dead_code_threshold = dead_code_threshold
        self.in_proj = nn.Conv1d(input_dim, codebook_dim, kernel_size=1)
        self.out_proj = nn.Conv1d(codebook_dim, input_dim, kernel_size=1)
        init = torch.randn(codebook_size, codebook_dim)
        if ema_decay > 0:
            self.register_buffer("codebook", init)
            self.register_buffer("cluster_size", torch.zeros(codebook_size))
            self.register_buffer("embed_sum", init.clone())
            # False until the first training batch initialises the codebook from data.
            self.register_buffer("initialised", torch.tensor(False))
        else:
            self.codebook = nn.Parameter(init)
        # Set by the trainer around a zero-weight step (a rank's stand-in batch when it
        # has no data): its vectors must not move the EMA statistics. The collectives of
        # an EMA step still run, with nothing contributed.
        self.statistics_frozen = False

    @property
    def uses_ema(self) -> bool:
        return self.ema_decay > 0

    def _nearest(self, flat: torch.Tensor) -> torch.Tensor:
        """Indices of the entries with the highest cosine similarity to rows of `flat`."""
        sims = F.normalize(flat, dim=1) @ F.normalize(self.codebook, dim=1).t()
        return sims.argmax(dim=1)

    def forward(self, z: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                 torch.Tensor]:
        """z (B, input_dim, frames) -> (z_q (B, input_dim, frames), codes (B, frames),
        commit_loss (B,), codebook_loss (B,)); losses are per batch item so that the caller
        can mask items (quantizer dropout)."""
        z_e = self.in_proj(z)                                         # (B, d, frames)
        flat = z_e.transpose(1, 2).reshape(-1, self.codebook_dim)     # (B*frames, d)
        ema_step = self.uses_ema and self.training
        if ema_step and not bool(self.initialised):
            self._init_from_data(flat.detach())
        codes = self._nearest(flat.detach())
        if ema_step and bool(self.initialised):
            self._ema_update(flat.detach(), codes)
        codes = codes.view(z.shape[0], z.shape[2])
        q = self.lookup(codes)                                        # (B, d, frames)
        commit = F.mse_loss(z_e, q.detach(), reduction="none").mean(dim=(1, 2))
        if self.uses_ema:
            codebook_loss = torch.zeros_like(commit)
        else:
            codebook_loss = F.mse_loss(q, z_e.detach(), reduction="none").mean(dim=(1, 2))
        q = z_e + (q - z_e).detach()                                  # straight-through
        return self.out_proj(q), codes, commit, codebook_loss

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, frames) -> codebook vectors (B, codebook_dim, frames)."""
        return F.embedding(codes, self.codebook).transpose(1, 2)

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, frames) -> this stage's contribution (B, input_dim, frames)."""
        return self.out_proj(self.lookup(codes))

    @torch.no_grad()
    def _init_from_data(self, flat: torch.Tensor) -> None:
        """Entries drawn from the first training batch, counts at the uniform share: a
        data-driven start without k-means."""
        source = _first_rank_with_data(not self.statistics_frozen, flat.device)
        if source is None:
            return          # only stand-in batches so far: the first real one initialises
        fresh = self._sample_rows(flat, self.codebook_size)
        rows = torch.tensor([float(flat.shape[0])], device=flat.device)
        if _distributed():
            dist.broadcast(fresh, src=source)
            dist.broadcast(rows, src=source)
        self.codebook.copy_(fresh)
        self.cluster_size.fill_(float(rows[0]) / self.codebook_size)
        self.embed_sum.copy_(self.codebook * self.cluster_size[:, None])
        self.initialised.fill_(True)

    @torch.no_grad()
    def _ema_update(self, flat: torch.Tensor, codes: torch.Tensor) -> None:
        """Moving averages of per-entry counts and sums of the vectors assigned to each
        entry; entries whose average count falls below `dead_code_threshold` x the uniform
        share are re-seeded from the batch."""
        onehot = F.one_hot(codes, self.codebook_size).type(flat.dtype)
        # Counts with the number of vectors appended: one collective for both.
        counts = torch.cat([onehot.sum(dim=0), onehot.new_tensor([float(flat.shape[0])])])
        sums = onehot.t() @ flat
        if self.statistics_frozen:
            counts.zero_()
            sums.zero_()
        if _distributed():          # every rank must keep the same codebook
            dist.all_reduce(counts)
            dist.all_reduce(sums)
        counts, n = counts[:-1], float(counts[-1])
        if n == 0:
            return                  # no rank had real vectors this step
        decay = self.ema_decay
        self.cluster_size.mul_(decay).add_(counts, alpha=1.0 - decay)
        self.embed_sum.mul_(decay).add_(sums, alpha=1.0 - decay)
        # Laplace smoothing keeps a rarely used entry's division finite.
        total = self.cluster_size.sum()
        eps = 1e-5
        smoothed = (self.cluster_size + eps) / (total + self.codebook_size * eps) * total
        self.codebook.copy_(self.embed_sum / smoothed[:, None])

        uniform_share = n / self.codebook_size
        dead = self.cluster_size < self.dead_code_threshold * uniform_share
        n_dead = int(dead.sum())
        if n_dead:
            source = _first_rank_with_data(not self.statistics_frozen, flat.device)
            fresh = self._sample_rows(flat, n_dead)
            if _distributed():      # one rank's choice, so that codebooks stay identical
                dist.broadcast(fresh, src=source)
            self.codebook[dead] = fresh
            self.cluster_size[dead] = uniform_share
            self.embed_sum[dead] = fresh * uniform_share

    @staticmethod
    def _sample_rows(flat: torch.Tensor, k: int) -> torch.Tensor:
        if flat.shape[0] >= k:
            return flat[torch.randperm(flat.shape[0], device=flat.device)[:k]].clone()
        picks = torch.randint(0, flat.shape[0], (k,), device=flat.device)
        return flat[picks] + 1e-3 * torch.randn(k, flat.shape[1], device=flat.device)


class ResidualVectorQuantizer(nn.Module):
    """`n_codebooks` stages, each quantizing what the previous ones left.

    Quantizer dropout (training, `n_q=None`): with probability `quantizer_dropout` a batch
    item uses only the first k stages, k uniform in [1, n_codebooks], so that one model serves
    every bitrate from 1 to n_codebooks codebooks."""

    def __init__(self, input_dim: int, n_codebooks: int = 8, codebook_size: int = 1024,
                 codebook_dim: int = 8, quantizer_dropout: float = 0.5,
                 ema_decay: float = 0.0, dead_code_threshold: float = 0.1):
        super().__init__()
        if n_codebooks < 1:
            raise ValueError(f"n_codebooks must be >= 1, got {n_codebooks}")
        if not 0.0 <= quantizer_dropout <= 1.0:
            raise ValueError(f"quantizer_dropout must be in [0, 1], got {quantizer_dropout}")
        self.n_codebooks = n_codebooks
        self.codebook_size = codebook_size
        self.quantizer_dropout = quantizer_dropout
        self.stages = nn.ModuleList(
            VectorQuantizer(input_dim, codebook_size, codebook_dim, ema_decay,
                            dead_code_threshold)
            for _ in range(n_codebooks))

    def _check_n_q(self, n_q: Optional[int]) -> int:
        n_q = self.n_codebooks if n_q is None else int(n_q)
        if not 1 <= n_q <= self.n_codebooks:
            raise ValueError(f"n_q must be in [1, {self.n_codebooks}], got {n_q}")
        return n_q

    def quantize(self, z: torch.Tensor, n_q: Optional[int] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """z (B, input_dim, frames) -> (z_q (B, input_dim, frames) float32,
        codes (B, n_q, frames) int64, commit_loss (), codebook_loss ()).

        With `n_q` given every item uses exactly n_q stages. With n_q=None: all stages in
        eval mode; quantizer dropout in training mode, where codes still has n_codebooks
        rows (the ones an item did not use are computed but do not reach z_q)."""
        return self.quantize_with_first_stage(z, n_q)[:4]

    def quantize_with_first_stage(self, z: torch.Tensor, n_q: Optional[int] = None):
        """`quantize`'s outputs and the first stage's output (B, input_dim, frames), which
        every item uses whatever quantizer dropout draws (semantic distillation reads it)."""
        dropout = n_q is None and self.training and self.quantizer_dropout > 0
        n_q = self._check_n_q(n_q)
        with torch.autocast(device_type=z.device.type, enabled=False):
            residual = z.float()
            batch = residual.shape[0]
            # Per-item count of stages that contribute to z_q.
            active = torch.full((batch,), n_q, device=z.device)
            if dropout:
                drawn = torch.randint(1, self.n_codebooks + 1, (batch,), device=z.device)
                use = torch.rand(batch, device=z.device) < self.quantizer_dropout
                active = torch.where(use, drawn, active)
            z_q = torch.zeros_like(residual)
            commit = residual.new_zeros(())
            codebook = residual.new_zeros(())
            codes = []
            first = None
            for i, stage in enumerate(self.stages[:n_q]):
                stage_q, stage_codes, stage_commit, stage_codebook = stage(residual)
                first = stage_q if first is None else first
                mask = (active > i).to(residual.dtype)
                z_q = z_q + stage_q * mask[:, None, None]
                residual = residual - stage_q
                # Mean over all items, masked ones counting zero (DAC's weighting).
                commit = commit + (stage_commit * mask).mean()
                codebook = codebook + (stage_codebook * mask).mean()
                codes.append(stage_codes)
            return z_q, torch.stack(codes, dim=1), commit, codebook, first

    forward = quantize

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, n_q, frames), n_q <= n_codebooks -> z_q (B, input_dim, frames) float32."""
        if codes.dim() != 3:
            raise ValueError(f"codes must be (B, n_q, frames), got {tuple(codes.shape)}")
        n_q = self._check_n_q(codes.shape[1])
        with torch.autocast(device_type=codes.device.type, enabled=False):
            z_q = None
            for i in range(n_q):
                part = self.stages[i].decode_codes(codes[:, i])
                z_q = part if z_q is None else z_q + part
            return z_q

    def bitrate(self, frames_per_s: float, n_q: Optional[int] = None) -> float:
        """Bits per second at `frames_per_s` code frames per second with n_q codebooks."""
        return frames_per_s * self._check_n_q(n_q) * math.log2(self.codebook_size)
