"""The token-level advantage estimators, registered by name: the optimal token baseline (OTB, arXiv
2602.07078; verl 0.9.1's ``optimal_token_baseline``) and its multi-turn form (verl's
``tir_optimal_token_baseline``).

Unlike the outcome estimators (``fn(scores[P, N]) -> [P, N]``) they need, per response token, the old
log-probs and :data:`MISSING_INPUT`, the sum over the vocabulary of the squared token probabilities, which
only an actor that sees the full distribution can compute. A host offers them where it passes those
inputs (verl, with ``actor.calculate_sum_pi_squared``: :mod:`rlhf_ext.patches.verl.token_baseline`) and
refuses them by name at start-up elsewhere (:func:`host_lacks`).
"""

from __future__ import annotations

from .advantages import optimal_token_baseline
from .multiturn_token_baseline import tir_optimal_token_baseline
from .registry import register_token_advantage

TOKEN_INPUTS = ("old_log_probs", "sum_pi_squared")
OPTIONS = ("handle_zero_tail", "eps")
MISSING_INPUT = "sum_pi_squared (the sum over the vocabulary of the squared token probabilities, per position)"

register_token_advantage("optimal_token_baseline")(optimal_token_baseline)
register_token_advantage("tir_optimal_token_baseline")(tir_optimal_token_baseline)


def host_lacks(name: str, setting: str, why: str) -> str:
    """The start-up refusal of the token-level estimator ``name`` on a host whose actor cannot compute
    :data:`MISSING_INPUT` (``why`` says what it has instead)."""
    return (f"{setting} {name} is a token-level estimator: it needs, per response token, {MISSING_INPUT} "
            f"besides the old log-probs; {why}. verl computes it: algorithm.adv_estimator=rlhf_ext_{name} with "
            "actor_rollout_ref.actor.calculate_sum_pi_squared=True")


__all__ = ["MISSING_INPUT", "OPTIONS", "TOKEN_INPUTS", "host_lacks"]
