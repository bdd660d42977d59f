"""Two caps on the importance ratio of a clipped surrogate: verl's dual clip and TRL's two-sided clip ``delta``;
which registered losses take them, and why the others refuse them.

* ``dual_clip = c`` (verl 0.9.1's actor key ``clip_ratio_c``, default 3 there; ``--actor.dual_clip`` on
  OpenRLHF; Ye et al. 2020, arXiv 1912.09729; verl's ``core_algos.compute_policy_loss_vanilla``): for
  ``A < 0`` PPO's loss ``max(-A r, -A clip(r, 1 - low, 1 + high))`` is further capped at ``-c A``
  (``c > 1``), so one token with a huge ratio cannot dominate the update; its gradient is 0 there.
* ``delta`` (TRL 1.16's ``GRPOConfig.delta``; INTELLECT-2, arXiv 2505.07291; ``GRPOTrainer._compute_loss``
  clamps ``coef_1`` at ``max=delta`` before the ``min``): ``L = -min(A min(r, delta), A clip(r, 1 - low,
  1 + high))``. TRL applies it on its token ratio and, with ``importance_sampling_level="sequence"``, on
  the sequence ratio (GSPO; LUSPO). For ``delta >= 1 + high`` it is the same function of ``r`` as the dual
  clip with ``c = delta``, value and gradient (for ``A > 0`` the clipped branch is already below ``delta``;
  for ``A < 0`` the loss is ``-A min(r, delta)`` beyond ``1 + high``); TRL recommends that range, and
  below it (``1 < delta < 1 + high``) ``delta`` also lowers the ``A > 0`` upper clip to ``delta``, as TRL's
  formula does. ``delta`` must be > 1 (a cap at or below 1 would cut the on-policy tokens' gradient).

Both compose (the loss is capped at the smaller). They are meaningful on a loss whose objective is PPO's
``min`` of an unclipped and a clipped ratio branch: ``ppo`` (token ratio), ``gspo`` and ``luspo``
(sequence ratio, every token of a sequence capped together) and ``bypass_mode`` (its ``ppo_clip``
surrogate). Every other registered loss refuses them, with the reason in :data:`REFUSED`.

Framework-free: the standard library only.
"""

from __future__ import annotations

from typing import Mapping, Optional

OPTIONS = ("dual_clip", "delta")
TAKES_CAPS = ("ppo", "gspo", "luspo", "bypass_mode")

_NO_RATIO = "its objective has no importance ratio to cap"
_WEIGHT = ("its ratio enters as a stop-gradient weight that {cap}, not as PPO's min of an unclipped and a "
           "clipped branch that these caps act on")
REFUSED = {
    "pg": _NO_RATIO + " (-A log pi)",
    "gpg": _NO_RATIO + " (-A log pi)",
    "dro": _NO_RATIO + " (-(A log pi - beta/2 (log pi - log pi_old)^2))",
    "noclip": "it is the unclipped-ratio surrogate by definition; use ppo for a clipped one",
    "cispo": _WEIGHT.format(cap="clip_ratio_high already caps from above"),
    "vespo": _WEIGHT.format(cap="the Gamma shape already bounds"),
    "sapo": "its ratio passes a smooth sigmoid gate with no hard clip for the caps to extend",
    "gmpo": ("its clip is on each token's log-ratio inside a geometric mean (sign-dependent), so a cap on "
             "the ratio means something else there; verl's geo_mean has no dual clip"),
    "geo_mean": ("its clip is on each token's log-ratio inside a geometric mean (sign-dependent), so a cap "
                 "on the ratio means something else there; verl's geo_mean has no dual clip"),
    "dppo_tv": "its clip_ratio_c is already the cap of its IS weight (a different meaning of verl's key)",
    "dppo_kl": "its clip_ratio_c is already the cap of its IS weight (a different meaning of verl's key)",
    "clip_cov": ("verl's clip_cov has no dual clip, and its covariance selection is defined on PPO's plain "
                 "clip; not offered, so the loss stays verl's"),
    "kl_cov": ("verl's kl_cov has no dual clip, and its KL penalty replaces the clip on the selected "
               "tokens; not offered, so the loss stays verl's"),
}


def check_caps(loss: str, dual_clip: Optional[float], delta: Optional[float]) -> None:
    """Each cap, when given, is a number > 1 (verl asserts ``clip_ratio_c > 1``)."""
    for key, value in (("dual_clip", dual_clip), ("delta", delta)):
        if value is not None and (isinstance(value, bool) or not value > 1.0 or value != value
                                  or value == float("inf")):
            raise ValueError(f"{loss}: {key} must be a finite number > 1 (e.g. 3.0), got {value!r}")


def refusal(name: str, options: Mapping[str, object]) -> Optional[str]:
    """Why the registered loss ``name`` refuses the caps set (not None) in ``options``; None when it takes
    them or none is set. A loss outside :data:`REFUSED` and :data:`TAKES_CAPS` (a third party's) is
    judged by its signature elsewhere."""
    given = [key for key in OPTIONS if options.get(key) is not None]
    if not given or name not in REFUSED:
        return None
    return (f"policy loss {name!r} takes no {' / '.join(given)} (verl's dual clip clip_ratio_c, TRL's two-sided "
            f"clip delta): {REFUSED[name]}; they apply to {', '.join(TAKES_CAPS)}")


__all__ = ["OPTIONS", "REFUSED", "TAKES_CAPS", "check_caps", "refusal"]
