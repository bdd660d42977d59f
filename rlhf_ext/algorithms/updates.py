"""Zero-advantage updates: count them (attempted vs applied) instead of hiding or skipping them.

When every advantage of an optimizer step is 0 -- every group's rewards equal under a
group-relative estimator, no accepted sample under ``rft`` -- the policy-gradient term of that
step is exactly 0; only the KL / entropy terms (and the optimizer's momentum) move the weights.
Some trainers skip such steps silently, which makes "N steps" mean different budgets for different
algorithms. rlhf_ext keeps the step (the framework's schedule stays the same for every variant)
and reports how many of the attempted updates carried a policy-gradient signal, so a comparison
of algorithms at equal step counts can see the real number of applied updates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import torch

from .checks import check_token_inputs


def zero_advantage_rows(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``BoolTensor[B]``: True for sequences whose advantage is exactly 0 on every response token."""
    maskb = check_token_inputs(mask, advantages=advantages)
    nonzero = torch.where(maskb, advantages.detach() != 0, torch.zeros_like(maskb))
    return ~nonzero.any(dim=1)


def has_signal(advantages: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether any response token of the batch has a non-zero advantage (a non-zero policy gradient)."""
    return not bool(zero_advantage_rows(advantages, mask).all())


@dataclass
class UpdateCounter:
    """Optimizer updates attempted, and those applied with a non-zero advantage somewhere.

    Feed each micro-batch with :meth:`add_micro_batch`, close each optimizer step with
    :meth:`end_update` (``signal`` overrides the local verdict, e.g. with the maximum over data
    parallel ranks: a step is applied if any rank had signal).
    """

    attempted: int = 0
    applied: int = 0
    _window_signal: bool = False

    def add_micro_batch(self, advantages: torch.Tensor, mask: torch.Tensor) -> bool:
        return self.add_signal(has_signal(advantages, mask))

    def add_signal(self, signal: bool) -> bool:
        """Record a micro-batch whose signal the caller already knows (e.g. from a cheaper test)."""
        signal = bool(signal)
        self._window_signal = self._window_signal or signal
        return signal

    @property
    def window_signal(self) -> bool:
        return self._window_signal

    def end_update(self, signal: bool = None) -> bool:
        applied = self._window_signal if signal is None else bool(signal)
        self.attempted += 1
        self.applied += int(applied)
        self._window_signal = False
        return applied

    @property
    def zero_advantage(self) -> int:
        return self.attempted - self.applied

    def metrics(self, prefix: str = "rlhf_ext/") -> Dict[str, float]:
        return {
            f"{prefix}updates_attempted": float(self.attempted),
            f"{prefix}updates_applied": float(self.applied),
            f"{prefix}updates_zero_advantage": float(self.zero_advantage),
        }

    def reset(self) -> None:
        self.attempted = self.applied = 0
        self._window_signal = False


__all__ = ["UpdateCounter", "has_signal", "zero_advantage_rows"]
