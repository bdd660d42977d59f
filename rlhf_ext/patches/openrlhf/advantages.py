"""``RemoteExperienceMaker.compute_advantages_and_returns`` with every registered estimator.

OpenRLHF's own estimator names run OpenRLHF's method untouched. Any other name is looked up in
:mod:`rlhf_ext.algorithms`' registry and runs the same pipeline around it:

1. rewards promoted to fp32 and OpenRLHF's length penalties applied (``apply_length_penalties``);
2. outcome rewards (or ``scores`` with ``--algo.advantage.input score``) grouped
   ``[prompts, n_samples_per_prompt]`` in prompt order and clamped to ``--reward.clip_range``;
3. ``A = estimator(grouped, **options)`` -- the math lives in :mod:`rlhf_ext.algorithms`;
4. OpenRLHF's ``compute_reward`` puts ``A`` on each response's last token and subtracts
   ``kl_coef * KL`` per token (KL in the reward); returns are accumulated with OpenRLHF's
   ``get_cumulative_returns`` (gamma = 1 except for ``reinforce_pp``) and kept on the model's
   tokens only (``action_mask``): 0 on the prompt and on a multi-turn agent's environment feedback,
   which OpenRLHF's accumulation would otherwise cross (its own estimators keep that; their loss
   masks it);
5. REINFORCE++ and REINFORCE++-baseline whiten the token advantages over the whole batch
   (:func:`rlhf_ext.algorithms.whiten`, Hu 2025, arXiv 2501.03262).

Every estimator also logs ``zero_variance_group_frac``: the fraction of prompt groups whose
rewards are all equal (DAPO's dynamic-sampling signal, :func:`rlhf_ext.algorithms.zero_variance_groups`),
and ``advantage_std``: the std of the advantages over the batch's response tokens (both with
``--rlhf_ext.step_metrics all``, the default).

With the non-finite guard on (``--rlhf_ext.guard stop|warn``), a NaN/Inf reward or score does not
end the run here with an input check's ``ValueError``: the method runs under
:func:`rlhf_ext.algorithms.deferred_finite_checks`, the non-finite advantages go on to the actor,
whose guard stops (or warns) on them before backward, and the first finding is recorded as a
``nonfinite_input`` event (check name, counts, first index) in the run record.
"""

from __future__ import annotations

import functools
import itertools
from typing import List, Tuple

import torch

from rlhf_ext.algorithms import deferred_finite_checks, get_advantage, host_inputs, whiten

from . import turn_credit
from .config import (
    DISCOUNTED_ESTIMATORS,
    OPENRLHF_ESTIMATORS,
    WHITENED_ESTIMATORS,
    estimator_options,
    setting,
    step_metrics,
)

ZERO_VARIANCE_KEY = "zero_variance_group_frac"
ADVANTAGE_STD_KEY = "advantage_std"


def _prompt_order(experiences) -> Tuple[torch.Tensor, List[int]]:
    exp_len = [len(e.index) for e in experiences]
    indices = torch.tensor(list(itertools.chain.from_iterable(e.index for e in experiences)))
    return indices, exp_len


def group_values(experiences, values: List[torch.Tensor], n: int) -> Tuple[torch.Tensor, torch.Tensor, List[int]]:
    """Per-sample values -> ``[prompts, n]`` in prompt order (the layout OpenRLHF groups rewards in).

    Returns ``(grouped, indices, exp_len)``; ``grouped.reshape(-1)[indices].split(exp_len)`` maps back.
    """
    indices, exp_len = _prompt_order(experiences)
    flat = torch.cat(values, dim=0)
    ordered = torch.empty_like(flat)
    ordered[indices] = flat
    if ordered.numel() % n:
        raise ValueError(
            f"{ordered.numel()} samples cannot be split into groups of n_samples_per_prompt={n}"
        )
    return ordered.reshape(-1, n), indices, exp_len


def _ungroup(grouped: torch.Tensor, indices: torch.Tensor, exp_len: List[int]):
    return grouped.reshape(-1)[indices].split(exp_len)


def attach_zero_variance(experiences, grouped: torch.Tensor, indices, exp_len) -> None:
    """Per-sample 0/1 "my group's rewards are all equal"; its mean over the batch is the group fraction.

    :func:`rlhf_ext.algorithms.zero_variance_groups` without its input checks (one ``aminmax``
    pass, no synchronisation): this runs on every rollout batch, and the estimator validates the
    same scores right after.
    """
    if grouped.shape[1] < 2:
        return
    low, high = torch.aminmax(grouped, dim=1)
    flags = (low == high).to(torch.float32)[:, None].expand_as(grouped)
    for experience, value in zip(experiences, _ungroup(flags.contiguous(), indices, exp_len)):
        experience.info[ZERO_VARIANCE_KEY] = value.clone()


def attach_advantage_std(experiences) -> None:
    """The population std of the advantages over every response token of the batch (where
    ``action_mask`` is set), stored in each sample's ``info`` with the same value: OpenRLHF averages
    ``info`` over samples, micro-batches and ranks, which returns it unchanged as
    ``train/advantage_std``. It collapses towards 0 when most groups carry no signal (all rewards
    equal), whatever the estimator; OpenRLHF's own estimators included. Non-finite advantages are
    left out (the guard reports them)."""
    parts = []
    for e in experiences:
        adv = getattr(e, "advantages", None)
        if adv is None:
            return
        mask = getattr(e, "action_mask", None)
        parts.append((adv[mask.bool()] if mask is not None and mask.shape == adv.shape else adv.reshape(-1)).float())
    flat = torch.cat([p.reshape(-1) for p in parts])
    flat = flat[torch.isfinite(flat)]
    if flat.numel() < 2:
        return
    std = flat.std(unbiased=False)
    for e in experiences:
        e.info[ADVANTAGE_STD_KEY] = std.to(e.advantages.device).expand(e.advantages.shape[0]).clone()


def _n_samples(args) -> int:
    return int(setting(args, "rollout.n_samples_per_prompt", 1))


def make_compute_advantages_and_returns(original, module):
    """Factory for the patched method; ``module`` is ``openrlhf.trainer.ppo_utils.experience_maker``."""

    @functools.wraps(original)
    def compute_advantages_and_returns(self, experiences):
        args = self.strategy.args
        if setting(args, "rlhf_ext.guard", "off") == "off":
            return _compute(self, experiences)
        with deferred_finite_checks() as findings:
            experiences = _compute(self, experiences)
        if findings:
            from .run_record import add_event

            add_event("nonfinite_input", None, where="advantages", estimator=self.advantage_estimator,
                      **{"check": findings[0]["name"], **{k: v for k, v in findings[0].items() if k != "name"}})
        return experiences

    def _compute(self, experiences):
        experiences = _estimate(self, experiences)
        if step_metrics(self.strategy.args) and experiences:
            attach_advantage_std(experiences)
        return experiences

    def _estimate(self, experiences):
        name = self.advantage_estimator
        args = self.strategy.args
        if name in OPENRLHF_ESTIMATORS:
            experiences = original(self, experiences)
            n = _n_samples(args)
            if step_metrics(args) and experiences and all(e.rewards is not None for e in experiences):
                grouped, indices, exp_len = group_values(experiences, [e.rewards.float() for e in experiences], n)
                attach_zero_variance(experiences, grouped, indices, exp_len)
            return experiences
        return _registered_estimator(self, experiences, name, module)

    return torch.no_grad()(compute_advantages_and_returns)


def _registered_estimator(maker, experiences, name: str, module):
    args = maker.strategy.args
    estimator = get_advantage(name)  # UnknownNameError lists the registered names
    options = estimator_options(args, name)
    n = _n_samples(args)

    for experience in experiences:
        experience.rewards = experience.rewards.to(torch.promote_types(experience.rewards.dtype, torch.float32))
    module.apply_length_penalties(experiences, args)

    source = setting(args, "algo.advantage.input", "reward")
    if source == "score":
        if any(e.scores is None for e in experiences):
            raise ValueError(
                "--algo.advantage.input score: the reward function returned no 'scores' for some samples"
            )
        values = [e.scores.to(torch.float32) for e in experiences]
    elif source == "reward":
        values = [e.rewards for e in experiences]
    else:
        raise ValueError(f"--algo.advantage.input must be 'reward' or 'score', got {source!r}")
    grouped, indices, exp_len = group_values(experiences, values, n)
    clip_range = setting(args, "reward.clip_range")
    if clip_range:
        grouped = grouped.clamp(min=clip_range[0], max=clip_range[1])

    if n > 1:
        stds = grouped.std(-1, keepdim=True).expand_as(grouped).contiguous()
        for experience, std in zip(experiences, _ungroup(stds, indices, exp_len)):
            experience.info["group_reward_std"] = std
    if step_metrics(args):
        attach_zero_variance(experiences, grouped, indices, exp_len)

    inputs, turn_data = {}, None
    for needed in host_inputs(estimator):
        if needed == "turns":  # a multi-turn agent's per-turn rewards and anchors (.turn_credit)
            turn_data = turn_credit.pop_turns(experiences)
            inputs["turns"] = turn_credit.grouped_turns(turn_data, indices, n)
            turn_credit.attach_turn_metrics(experiences, inputs["turns"])
        else:
            inputs[needed] = _host_input(needed, experiences, n)
    try:
        advantages = estimator(grouped, **options, **inputs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"advantage estimator {name!r} failed on this batch: {exc}") from exc
    if turn_data is not None and advantages.dim() == 3 and advantages.shape[:2] == grouped.shape:
        _per_turn_advantages(maker, module, experiences, advantages.to(grouped.dtype), turn_data, indices, exp_len)
        return experiences
    if advantages.shape != grouped.shape:
        raise ValueError(
            f"advantage estimator {name!r} returned shape {tuple(advantages.shape)} for scores of shape "
            f"{tuple(grouped.shape)}"
        )

    gamma = 1.0
    if name in DISCOUNTED_ESTIMATORS:
        gamma = float(setting(args, "algo.advantage.gamma", 1.0))
    kl_coef = maker.kl_ctl.value
    for experience, advantage in zip(experiences, _ungroup(advantages.to(grouped.dtype), indices, exp_len)):
        token_reward = module.compute_reward(
            advantage,
            kl_coef,
            experience.kl,
            action_mask=experience.action_mask,
            reward_clip_range=None,  # already applied to the outcome rewards above
        )
        returns = maker.get_cumulative_returns(token_reward, experience.action_mask, gamma)
        # only the model's tokens carry an advantage: OpenRLHF's cumulative return also runs through the
        # prompt and, with a multi-turn agent, through the environment's feedback between turns (mask 0)
        returns = torch.where(experience.action_mask.bool(), returns, returns.new_zeros(()))
        experience.returns = returns
        experience.advantages = returns.clone()
        experience.info["return"] = token_reward.sum(dim=-1)
        experience.kl = None

    if name in WHITENED_ESTIMATORS:
        _whiten_batch(experiences, no_std_norm=bool(setting(args, "algo.advantage.no_std_norm", False)))
    if setting(args, "rlhf_ext.guard", "off") != "off":
        # guarded (the input checks deferred): an estimator may hide a NaN score (maxrl zeroes a group
        # whose mean is not > 0); the advantage of a sample without a finite score is undefined, and
        # the guard must see it, naming that sample
        bad = ~torch.isfinite(grouped)
        if bool(bad.any()):
            for experience, flags in zip(experiences, _ungroup(bad, indices, exp_len)):
                if bool(flags.any()):
                    experience.advantages = experience.advantages.clone()
                    experience.advantages[flags] = float("nan")
    return experiences


def _per_turn_advantages(maker, module, experiences, advantages, turn_data, indices, exp_len) -> None:
    """Each model token gets its turn's advantage; KL in the reward (``kl_coef * KL`` per token) is accumulated
    over the response as OpenRLHF does (gamma 1) and added, as for the outcome estimators."""
    kl_coef = maker.kl_ctl.value
    for experience, token_adv in zip(experiences, turn_credit.assign_turn_advantages(advantages, turn_data, indices,
                                                                                     exp_len)):
        mask = experience.action_mask
        zero = torch.zeros(mask.shape[0], dtype=token_adv.dtype, device=mask.device)
        kl_reward = module.compute_reward(zero, kl_coef, experience.kl, action_mask=mask, reward_clip_range=None)
        kl_returns = maker.get_cumulative_returns(kl_reward, mask, 1.0)
        returns = torch.where(mask.bool(), token_adv.to(kl_returns.dtype) + kl_returns, kl_returns.new_zeros(()))
        experience.returns = returns
        experience.advantages = returns.clone()
        last = mask.long().cumsum(-1).argmax(-1, keepdim=True)  # the response's last model token
        experience.info["return"] = token_adv.gather(1, last).squeeze(1) + kl_reward.sum(dim=-1)
        experience.kl = None


COMPONENT_PREFIX = "reward/"  # rlhf_ext's reward puts each unweighted component in extra_logs under this


def _host_input(needed: str, experiences, n: int):
    """An estimator's extra per-sample input (:data:`rlhf_ext.algorithms.HOST_INPUTS`), grouped like the rewards."""
    if needed == "lengths":
        lengths = [e.action_mask.sum(dim=-1).to(torch.float32) for e in experiences]
        return group_values(experiences, lengths, n)[0]
    keys = sorted({k for e in experiences for k in e.info if k.startswith(COMPONENT_PREFIX)})
    if not keys or any(k not in e.info for e in experiences for k in keys):
        raise ValueError(
            "this estimator needs the reward's components, and the rollouts carry none (use rlhf_ext's "
            "weighted reward, --reward.functions accuracy:1.0,format:0.2, whose extra_logs hold them)"
        )
    return {k[len(COMPONENT_PREFIX):]: group_values(experiences, [e.info[k].to(torch.float32).reshape(-1)
                                                                for e in experiences], n)[0] for k in keys}


def _whiten_batch(experiences, *, no_std_norm: bool) -> None:
    """Token-level whitening over the whole rollout batch (all experiences together)."""
    flat_adv = torch.cat([e.advantages.flatten() for e in experiences]).float()[None, :]
    flat_mask = torch.cat([e.action_mask.flatten() for e in experiences]).bool()[None, :]
    if no_std_norm:
        m = flat_mask.to(flat_adv.dtype)
        flat_adv = (flat_adv - (flat_adv * m).sum() / m.sum()) * m
    else:
        flat_adv = whiten(flat_adv, flat_mask)
    sizes = [e.advantages.numel() for e in experiences]
    for experience, chunk in zip(experiences, flat_adv[0].split(sizes)):
        experience.advantages = chunk.reshape(experience.advantages.shape).to(experience.advantages.dtype)
