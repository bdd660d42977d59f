"""rlhf_ext's advantage estimators under verl's estimator calling convention.

verl (``verl.trainer.ppo.ray_trainer.compute_advantage``) calls a registered estimator as
``fn(token_level_rewards=[B, T], response_mask=[B, T], config=<algorithm config>, index=<uid per
row>, ...)`` and expects ``(advantages, returns)``, both ``[B, T]``. Rows of one prompt share a
``uid`` and can sit anywhere in the batch (verl groups by ``uid``, not by position). This adapter:

1. takes each row's outcome ``r = sum_t token_level_rewards`` (verl's own outcome estimators do
   the same; with ``algorithm.use_kl_in_reward`` the KL penalty is already in those rewards);
2. groups rows by ``uid`` into ``[prompts, n]`` (groups of different sizes are estimated in
   separate calls, one per size, so a batch with a dropped sample still works);
3. calls the rlhf_ext estimator with the options under ``algorithm.rlhf_ext`` -- the formulas live
   in :mod:`rlhf_ext.algorithms` and are cited there; where verl's estimator of the same algorithm has
   another default (``gpg``: ``alpha_count=nonzero_reward``, :data:`.names.VERL_ESTIMATOR_DEFAULTS`) that
   default fills an option not given, unless ``RLHF_EXT_VERL_RLHF_EXT_DEFAULTS`` is set;
4. spreads each advantage over its response tokens (``A * response_mask``); REINFORCE++ and
   REINFORCE++-baseline then whiten over every response token of the batch
   (:func:`rlhf_ext.algorithms.whiten`), as their paper and verl's own implementation do.

Returns equal advantages, as for verl's other outcome estimators.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch

from .names import (OPTIONS_KEY, VERL_ESTIMATOR_DEFAULTS, WHITENED_ESTIMATORS, named_for_verl, rlhf_ext_defaults,
                    verl_name)


def as_plain(value: Any) -> Any:
    """OmegaConf containers -> dicts/lists (options reach the estimator as plain Python values)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - verl always has omegaconf
        pass
    return value


def estimator_options(config: Any, name: str, estimator: Callable) -> Dict[str, Any]:
    """``algorithm.rlhf_ext`` as keyword options for ``estimator``; unknown keys raise ``ValueError``."""
    raw = None
    if config is not None:
        getter = getattr(config, "get", None)
        raw = getter(OPTIONS_KEY, None) if getter is not None else getattr(config, OPTIONS_KEY, None)
    raw = as_plain(raw)
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"algorithm.{OPTIONS_KEY} must be a mapping of estimator options "
                         f"(e.g. +algorithm.{OPTIONS_KEY}.k=4), got {raw!r}")
    options = {str(k): v for k, v in raw.items()}
    if not rlhf_ext_defaults():  # verl's numbers by default (names.VERL_ESTIMATOR_DEFAULTS)
        options = {**VERL_ESTIMATOR_DEFAULTS.get(name, {}), **options}
    params = inspect.signature(estimator).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return options
    from rlhf_ext.algorithms import HOST_INPUTS

    accepted = [p for p, v in list(params.items())[1:]
                if v.kind in (v.KEYWORD_ONLY, v.POSITIONAL_OR_KEYWORD) and p not in HOST_INPUTS]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"advantage estimator {verl_name(name)!r} has no option {', '.join(map(repr, unknown))} "
            f"(from algorithm.{OPTIONS_KEY}); it takes: {', '.join(accepted) or '(no options)'}"
        )
    return options


def group_rows(index) -> "OrderedDict[Any, List[int]]":
    """Row numbers of each ``uid``, groups in order of first appearance, rows in batch order."""
    groups: "OrderedDict[Any, List[int]]" = OrderedDict()
    for row, uid in enumerate(index):
        groups.setdefault(uid.item() if hasattr(uid, "item") and not isinstance(uid, str) else uid, []).append(row)
    return groups


def outcome_advantages(name: str, estimator: Callable, scores: torch.Tensor, index,
                       options: Mapping[str, Any], inputs: Optional[Mapping[str, torch.Tensor]] = None) -> torch.Tensor:
    """Per-row advantages ``[B]`` from per-row outcomes ``[B]`` grouped by ``index``."""
    if index is None:
        raise ValueError(f"advantage estimator {verl_name(name)!r} needs verl's 'uid' groups "
                         "(data.non_tensor_batch['uid']), and the batch has none")
    if len(index) != scores.shape[0]:
        raise ValueError(f"{verl_name(name)}: {scores.shape[0]} rows but {len(index)} uid entries")
    by_size: "OrderedDict[int, List[List[int]]]" = OrderedDict()
    for rows in group_rows(index).values():
        by_size.setdefault(len(rows), []).append(rows)
    out = torch.empty_like(scores)
    for size, groups in by_size.items():
        rows = torch.tensor(groups, dtype=torch.long, device=scores.device)  # [prompts, size]
        try:
            adv = estimator(scores[rows], **options, **{k: v[rows] for k, v in (inputs or {}).items()})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"advantage estimator {verl_name(name)!r} failed on groups of {size} "
                             f"(algorithm.{OPTIONS_KEY} = {dict(options)}): {exc}") from exc
        if not isinstance(adv, torch.Tensor) or adv.shape != rows.shape:
            got = tuple(adv.shape) if isinstance(adv, torch.Tensor) else type(adv).__name__
            raise ValueError(f"advantage estimator {verl_name(name)!r} returned {got} for scores of shape "
                             f"{tuple(rows.shape)}")
        out[rows.reshape(-1)] = adv.reshape(-1).to(out.dtype)
    return out


def host_inputs_of(name: str, estimator: Callable, response_mask: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The estimator's extra per-row inputs (:data:`rlhf_ext.algorithms.HOST_INPUTS`) from what verl passes."""
    from rlhf_ext.algorithms import host_inputs

    inputs = {}
    for needed in host_inputs(estimator):
        if needed == "lengths":
            inputs["lengths"] = response_mask.sum(dim=-1).to(torch.float32)
        else:
            # verl 0.9.1's compute_advantage hands non_tensor_batch (the reward components) only to
            # the estimator named exactly "gdpo".
            raise ValueError(
                f"advantage estimator {verl_name(name)!r} needs the reward's {needed}, which verl passes only to "
                f"its own estimator: use algorithm.adv_estimator=gdpo with algorithm.gdpo_reward_keys "
                f"(rlhf_ext's verl reward reports its components as reward_<name>)"
            )
    return inputs


def make_verl_estimator(name: str, estimator: Callable) -> Callable:
    """verl-convention wrapper of the rlhf_ext estimator ``name`` (registered as ``rlhf_ext_<name>``)."""

    @torch.no_grad()
    def verl_estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None,
                       config: Optional[Any] = None, **kwargs):
        options = estimator_options(config, name, estimator)
        scores = token_level_rewards.sum(dim=-1).to(torch.promote_types(token_level_rewards.dtype, torch.float32))
        adv = outcome_advantages(name, estimator, scores, index, options, host_inputs_of(name, estimator, response_mask))
        token_adv = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
        if name in WHITENED_ESTIMATORS:
            from rlhf_ext.algorithms import whiten

            token_adv = whiten(token_adv, response_mask.bool())
        token_adv = token_adv.to(token_level_rewards.dtype)
        return token_adv, token_adv.clone()

    return named_for_verl(verl_estimator, name, "advantage estimator", __name__, estimator)
