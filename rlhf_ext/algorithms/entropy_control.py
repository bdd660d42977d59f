"""Adaptive entropy bonus: the coefficient steps toward a target entropy (Skywork-OR1, arXiv 2505.22312).

The loss is ``L = L_policy - c_k * H`` with ``H`` the mean token entropy. Skywork-OR1's adaptive
control (Sec. 3.2.3; TRL 1.16's ``use_adaptive_entropy``, ``trl/trainer/grpo_trainer.py``) keeps a
coefficient ``alpha`` and, after each update with measured entropy ``e_k``::

    alpha_{k+1} = clip(alpha_k + delta, lo, hi)   if e_k <= target
                  clip(alpha_k - delta, lo, hi)   otherwise
    c_{k+1}     = alpha_{k+1} if e_k <= target else 0

so the bonus acts only while the entropy is at or below the target (before any measurement,
``e = +inf``: no bonus), and its size adapts by ``delta`` per update. TRL's defaults: initial
``alpha`` = ``entropy_coef``, ``delta`` 0.005, ``target`` 0.2, bounds ``[0, 1]``.

Framework-free: the standard library only (hosts measure the entropy and apply the coefficient).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict


@dataclass
class AdaptiveEntropyCoef:
    """The controller's state: ``coef`` (``alpha``), the last measured entropy, and its settings."""

    coef: float = 0.0
    target: float = 0.2
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0
    last_entropy: float = field(default=math.inf)

    def __post_init__(self):
        for name in ("coef", "target", "delta", "coef_min", "coef_max"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"adaptive entropy: {name} must be a finite number, got {value!r}")
        if self.delta < 0:
            raise ValueError(f"adaptive entropy: delta must be >= 0, got {self.delta}")
        if self.target < 0:
            raise ValueError(f"adaptive entropy: the target entropy must be >= 0, got {self.target}")
        if not 0 <= self.coef_min <= self.coef_max:
            raise ValueError(f"adaptive entropy: need 0 <= coef_min <= coef_max, got {self.coef_min}, {self.coef_max}")
        if not self.coef_min <= self.coef <= self.coef_max:
            raise ValueError(f"adaptive entropy: the initial coefficient {self.coef} is outside "
                             f"[{self.coef_min}, {self.coef_max}]")

    def applied(self) -> float:
        """The coefficient the next update applies: ``coef`` while the last entropy is at or below the target."""
        return float(self.coef) if self.last_entropy <= self.target else 0.0

    def update(self, entropy: float) -> float:
        """After an update whose mean token entropy was ``entropy``: step the coefficient; returns it."""
        entropy = float(entropy)
        if not math.isfinite(entropy):
            raise ValueError(f"adaptive entropy: the measured entropy is not finite ({entropy})")
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = entropy
        return self.coef

    def state_dict(self) -> Dict[str, float]:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: Dict[str, float]) -> None:
        self.coef = float(state["coef"])
        self.last_entropy = float(state["last_entropy"])


__all__ = ["AdaptiveEntropyCoef"]
