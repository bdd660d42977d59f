"""GiGPO: group-in-group advantages for multi-turn agents (Feng et al. 2025, arXiv 2505.10978).

An agent's trajectory ``i`` has turns ``t = 0..K_i-1``; turn ``t`` is taken in state ``s_t^i`` and
earns the reward ``r_t^i`` (what the agent's ``step`` returns for it). GiGPO adds two relative
advantages per turn:

* episode level, over the ``N`` trajectories of one prompt (GRPO's group)::

      A^E(i) = (R_i - mean_j R_j) / F({R_j})

  with ``R_i`` the trajectory's score (the host's outcome reward, the sum of its turns' rewards);
* step level, over the turns that share an *anchor state* within the prompt's group: the turns
  ``G(s) = {(i, t) : s_t^i = s}``, each with its discounted return ``R_t^i = sum_{k >= t}
  gamma^(k - t) r_k^i``::

      A^S(i, t) = (R_t^i - mean_{G(s)} R) / F({R in G(s)})

and the turn's advantage is ``A(i, t) = w_E * A^E(i) + w_S * A^S(i, t)`` (paper: ``w_E = 1``,
``w_S = omega = 1``).

``F`` is the normaliser: ``norm="none"`` is 1 (the paper's default for agent tasks, ROLL's example
config ``reward_normalization.method: mean``), ``norm="std"`` the group's sample std plus ``1e-6``.
As in ROLL (``roll/pipeline/agentic/utils.py: agentic_reward_norm``), a group of one -- an anchor
state no other trajectory visited -- and, with ``std``, a group whose std is ``<= 1e-6`` get 0.
``gamma`` defaults to ROLL's ``step_reward_gamma`` 0.95.

Anchor states are any hashable keys (the host's choice; OpenRLHF's glue hashes the text the model
saw before the turn, or takes the agent's own ``anchor_state``). Groups never span prompts.
"""

from __future__ import annotations

from typing import Dict, Hashable, List, Sequence, Tuple

import torch

from .checks import check_scores
from .registry import register_advantage

NORMS = ("none", "std")
EPS = 1e-6


def discounted_returns(rewards: Sequence[float], gamma: float) -> List[float]:
    """``R_t = sum_{k >= t} gamma^(k - t) r_k`` for one trajectory's per-turn rewards."""
    out = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def group_relative(values: torch.Tensor, norm: str) -> torch.Tensor:
    """``(v - mean) / F`` over one group (ROLL's conventions: a group of one, or with ``std`` a std
    ``<= 1e-6``, gives zeros)."""
    if values.numel() <= 1:
        return torch.zeros_like(values)
    centred = values - values.mean()
    if norm == "none":
        return centred
    std = values.std()
    if std <= EPS:
        return torch.zeros_like(values)
    return centred / (std + EPS)


def _check_turns(scores: torch.Tensor, turns, name: str) -> None:
    if turns is None:
        raise ValueError(f"{name} needs turns= (for each trajectory, its turns' (reward, anchor state) pairs); this "
                         "host passed none: GiGPO runs on OpenRLHF's multi-turn agent executor")
    if len(turns) != scores.shape[0] or any(len(row) != scores.shape[1] for row in turns):
        raise ValueError(f"{name}: turns must be grouped like the scores [{scores.shape[0]}][{scores.shape[1]}]")
    for p, row in enumerate(turns):
        for n, trajectory in enumerate(row):
            if not len(trajectory):
                raise ValueError(f"{name}: trajectory [{p}][{n}] has no turn")
            for reward, anchor in trajectory:
                if not torch.isfinite(torch.tensor(float(reward))):
                    raise ValueError(f"{name}: trajectory [{p}][{n}] has a non-finite turn reward {reward!r}")
                if not isinstance(anchor, Hashable):
                    raise ValueError(f"{name}: anchor states must be hashable, got {type(anchor).__name__}")


def gigpo_turn_advantages(
    scores,
    turns: Sequence[Sequence[Sequence[Tuple[float, Hashable]]]],
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    episode_weight: float = 1.0,
    norm: str = "none",
) -> Tuple[List[List[torch.Tensor]], Dict[str, torch.Tensor]]:
    """Each turn's GiGPO advantage: ``([P][N] tensors of shape [K_i], metrics)``.

    ``scores``: ``[P, N]`` trajectory scores; ``turns[p][n]``: that trajectory's ``(reward, anchor)`` per
    turn. Metrics: ``gigpo/anchor_group_size`` (mean number of turns per anchor group) and
    ``gigpo/shared_turn_frac`` (fraction of turns whose anchor another trajectory also visited)."""
    grouped = check_scores(scores, estimator="gigpo")
    if norm not in NORMS:
        raise ValueError(f"gigpo: unknown norm {norm!r}; choose from {', '.join(NORMS)}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gigpo: gamma must be in [0, 1], got {gamma!r}")
    _check_turns(grouped, turns, "gigpo")
    P, N = grouped.shape
    episode = torch.stack([group_relative(grouped[p], norm) for p in range(P)])
    out: List[List[torch.Tensor]] = []
    n_groups = n_turns = n_shared = 0
    for p in range(P):
        returns = [discounted_returns([r for r, _ in turns[p][n]], gamma) for n in range(N)]
        members: Dict[Hashable, List[Tuple[int, int]]] = {}
        for n in range(N):
            for t, (_, anchor) in enumerate(turns[p][n]):
                members.setdefault(anchor, []).append((n, t))
        step = [torch.zeros(len(turns[p][n]), dtype=grouped.dtype) for n in range(N)]
        for group in members.values():
            values = torch.tensor([returns[n][t] for n, t in group], dtype=grouped.dtype)
            for (n, t), a in zip(group, group_relative(values, norm)):
                step[n][t] = a
            n_groups += 1
            n_turns += len(group)
            if len({n for n, _ in group}) > 1:
                n_shared += len(group)
        out.append([episode_weight * episode[p, n] + step_weight * step[n] for n in range(N)])
    metrics = {
        "gigpo/anchor_group_size": torch.tensor(n_turns / max(n_groups, 1)),
        "gigpo/shared_turn_frac": torch.tensor(n_shared / max(n_turns, 1)),
    }
    return out, metrics


@register_advantage("gigpo")
def gigpo(scores, *, turns=None, gamma: float = 0.95, step_weight: float = 1.0, episode_weight: float = 1.0,
          norm: str = "none") -> torch.Tensor:
    """GiGPO (arXiv 2505.10978) by name: ``[P, N, K]`` per-turn advantages, ``K`` the most turns of any
    trajectory, 0 past a trajectory's last turn (:func:`gigpo_turn_advantages`). ``turns`` comes from the
    host (OpenRLHF's agent executor); a host without it is refused."""
    grouped = check_scores(scores, estimator="gigpo")
    _check_turns(grouped, turns, "gigpo")
    per_turn, _ = gigpo_turn_advantages(grouped, turns, gamma=gamma, step_weight=step_weight,
                                        episode_weight=episode_weight, norm=norm)
    k = max(t.numel() for row in per_turn for t in row)
    out = grouped.new_zeros(*grouped.shape, k)
    for p, row in enumerate(per_turn):
        for n, t in enumerate(row):
            out[p, n, : t.numel()] = t
    return out


gigpo.per_turn = True  # hosts: the output is [P, N, K] per turn, and turns= comes from the agent executor

__all__ = ["NORMS", "discounted_returns", "gigpo", "gigpo_turn_advantages", "group_relative"]
