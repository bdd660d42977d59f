"""``rule_verifier.verifier`` with rlhf_ext rewards, and no silent zero for a misspelled name.

MindSpeed-RL's ``verifier(responses, data, config)`` builds a local name -> function table and
skips names it does not know, so a typo scores 0 without a word. The replacement:

* ``rlhf_ext:SPEC`` entries (an rlhf_ext reward such as ``rlhf_ext:accuracy``, a weighted spec, or
  a preset such as ``rlhf_ext:math``) are scored by :class:`rlhf_ext.rewards.WeightedReward`, which
  grades with :class:`~rlhf_ext.rewards.MathGrader` (worker processes with a hard per-sample
  timeout of ``rl_config.verifier_timeout`` seconds, no code execution) and scores a failing
  component 0 with a flag instead of raising;
* MindSpeed-RL's own names go to the original ``verifier`` with just those names and weights;
* anything else raises ``ValueError`` naming it (the driver already refused it at start-up).

Totals are the weighted sum over all entries, in order. Metrics join MindSpeed-RL's own
(``{name}_rewards/mean``): each rlhf_ext component as ``reward/{name}`` and the grader flags as
``reward_flag/{flag}``, the names the OpenRLHF side logs, as per-sample lists like MindSpeed-RL's.
"""

from __future__ import annotations

import functools
import threading
from types import SimpleNamespace
from typing import Dict, List, Tuple

from rlhf_ext.rewards.reward_file import short_form_spec

from .config import MINDSPEED_VERIFIERS

_rewards: Dict[Tuple[str, float], object] = {}
_lock = threading.Lock()


def _weighted_reward(spec: str, timeout: float):
    from rlhf_ext.rewards import WeightedReward

    key = (spec, float(timeout))
    with _lock:
        reward = _rewards.get(key)
        if reward is None:
            reward = _rewards[key] = WeightedReward(spec, timeout=float(timeout))
        return reward


def _timeout(config) -> float:
    value = getattr(config, "verifier_timeout", None)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 5.0
    return value if value > 0 else 5.0


def rlhf_ext_scores(spec: str, responses: List[str], labels, config) -> Tuple[List[float], Dict[str, List[float]]]:
    """Scores of ``rlhf_ext:SPEC`` for decoded responses and gold labels, and its metrics."""
    breakdown = _weighted_reward(spec, _timeout(config))(list(responses), list(labels))
    metrics = {f"reward/{name}": values for name, values in breakdown.components.items()}
    metrics.update({f"reward_flag/{flag}": values for flag, values in breakdown.flags.items()})
    return breakdown.rewards, metrics


def make_verifier(original, module):
    @functools.wraps(original)
    def verifier(responses, data, config, **kwargs):
        functions = list(config.verifier_function)
        weights = list(config.verifier_weight)
        unknown = [f for f in functions if short_form_spec(f) is None and f not in MINDSPEED_VERIFIERS]
        if unknown:
            raise ValueError(
                f"rl_config.verifier_function names unknown reward(s) {', '.join(map(repr, unknown))}; MindSpeed-RL's: "
                f"{', '.join(MINDSPEED_VERIFIERS)}; rlhf_ext's: rlhf_ext:NAME (see rlhf_ext.rewards.available_rewards())"
            )
        if len(weights) != len(functions):
            raise ValueError(f"rl_config.verifier_weight has {len(weights)} entries for {len(functions)} verifier_function entries")
        builtin = [(f, w) for f, w in zip(functions, weights) if f in MINDSPEED_VERIFIERS]
        ours = [(short_form_spec(f), w) for f, w in zip(functions, weights) if f not in MINDSPEED_VERIFIERS]
        n = len(data["labels"])
        metrics: Dict = {}
        rewards = [0.0] * n
        if builtin or not ours:
            # The original with only its own names: identical scores and metrics for those.
            view = SimpleNamespace(**{k: v for k, v in vars(config).items()})
            view.verifier_function = [f for f, _ in builtin]
            view.verifier_weight = [w for _, w in builtin]
            rewards, metrics = original(responses, data, view, **kwargs)
            rewards = list(rewards)
        for spec, weight in ours:
            scores, extra = rlhf_ext_scores(spec, responses, data["labels"], config)
            rewards = [r + float(weight) * s for r, s in zip(rewards, scores)]
            for key, values in extra.items():
                metrics[key] = values
        return rewards, metrics

    return verifier
