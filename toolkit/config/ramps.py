"""Values that change over training (a margin, a loss weight, an augmentation
probability): a `Ramp` field is a plain number in YAML, or a mapping such as
`{initial: 0, final: 0.2, start: 0.1, end: 0.4}` over the fraction of `max_steps` done.
A fraction ramp that has reached its start keeps the total it began under when a resume
changes the total (a switched-on loss stays on: Trainer.ramp_total)."""
import math
from dataclasses import dataclass

from toolkit.errors import ConfigError

RAMP_SHAPES = ("linear", "cosine", "exponential", "step")
RAMP_UNITS = ("fraction", "steps")


@dataclass
class Ramp:
    """A value over training progress: `initial` until `start`, `final` from `end` on,
    and in between a `shape`d change (step: a switch at `start`)."""
    initial: float = 0.0       # value before `start`
    final: float = 0.0         # value from `end` on
    start: float = 0.0         # where the change begins, in `unit`s
    end: float = 0.0           # where it ends; equal to `start` for a switch
    shape: str = "linear"      # linear | cosine | exponential | step
    unit: str = "fraction"     # fraction (of max_steps) | steps

    @classmethod
    def constant(cls, value: float) -> "Ramp":
        return cls(initial=float(value), final=float(value))

    def check(self, path: str) -> None:
        if self.shape not in RAMP_SHAPES:
            raise ConfigError(f"{path}.shape: expected one of {', '.join(RAMP_SHAPES)}, "
                              f"got {self.shape!r}")
        if self.unit not in RAMP_UNITS:
            raise ConfigError(f"{path}.unit: expected fraction or steps, got {self.unit!r}")
        if self.end < self.start:
            raise ConfigError(f"{path}: end {self.end} is before start {self.start}")
        if self.unit == "fraction" and not 0.0 <= self.start <= 1.0:
            raise ConfigError(f"{path}.start: a fraction of max_steps lies in [0, 1], "
                              f"got {self.start}")

    @property
    def is_constant(self) -> bool:
        return self.initial == self.final

    def value(self, step: int, total_steps: int) -> float:
        where = step if self.unit == "steps" else step / max(1, total_steps)
        if where < self.start:
            return self.initial
        if self.shape == "step" or where >= self.end:
            return self.final
        t = (where - self.start) / (self.end - self.start)
        if self.shape == "cosine":
            t = 0.5 * (1.0 - math.cos(math.pi * t))
        elif self.shape == "exponential":
            # Fast at first, then settling: 1 - 1000^-t rescaled to reach 1 at t = 1.
            t = (1.0 - 1e-3 ** t) / (1.0 - 1e-3)
        return self.initial + (self.final - self.initial) * t

    def active_from(self) -> float:
        """Progress (in `unit`s) from which the value is nonzero, for switched-on parts."""
        if self.initial != 0.0:
            return 0.0
        return self.start if self.final != 0.0 else math.inf
