"""``compute_advantage`` with every registered estimator (seam: the ``@ray.remote`` task).

MindSpeed-RL's task (``trainer/utils/compute_utils.py``) knows ``gae`` and ``group_norm`` and raises
``NotImplementedError`` for anything else, inside the task, at the first batch. The replacement is
a Ray task of the same signature, imported by name into the three trainers:

* ``gae`` / ``group_norm`` call MindSpeed-RL's own function (its body, unchanged);
* any other name reads the same transfer-dock columns (``responses``, ``rm_scores``,
  ``response_length``), groups the outcome scores ``[prompts, n_samples_per_prompt]`` in the order
  the dock hands them out (prompt-major, as ``group_norm`` assumes), runs the rlhf_ext estimator
  (:mod:`rlhf_ext.algorithms`) and spreads each response's advantage over its tokens, like
  ``group_norm`` does; REINFORCE++ and REINFORCE++-baseline then whiten the token advantages over
  the batch the task took from the dock (:func:`rlhf_ext.algorithms.whiten`, Hu 2025, arXiv
  2501.03262) -- ``rl_config.adv_dispatch_size`` samples, so set it to the whole rollout batch for
  the paper's batch-wide statistics. Like ``group_norm``, each batch must hold whole groups. Returns equal the
  advantages (outcome rewards, gamma = 1, as MindSpeed-RL's ``group_norm`` sets them).

Estimator options come with the estimator name (:class:`.config.ConfiguredName`).
"""

from __future__ import annotations

import ray
import torch

from rlhf_ext.algorithms import get_advantage, host_inputs, whiten

from .config import MINDSPEED_ESTIMATORS, WHITENED_ESTIMATORS, settings_of

COLUMNS = ["responses", "rm_scores", "response_length"]


def _mstx_range(name):
    """NPU profiler range around the task, as MindSpeed-RL's ``mstx_timer_decorator`` does, only on NPUs."""
    from rlhf_ext.npu import detect_backend

    if detect_backend() != "npu":
        return None, None
    from rlhf_ext.npu import import_torch_npu

    mstx = import_torch_npu().npu.mstx
    return mstx, mstx.range_start(name)


def estimator_advantages(name: str, scores: torch.Tensor, mask: torch.Tensor, n: int, options=None) -> torch.Tensor:
    """Token advantages ``[B, T]`` for outcome ``scores`` (B,) or (B, 1) of B = prompts x n responses."""
    estimator = get_advantage(name)
    flat = scores.reshape(-1).to(torch.float32)
    if n < 1 or flat.numel() % n:
        raise ValueError(f"{flat.numel()} responses cannot be split into groups of n_samples_per_prompt={n}")
    grouped = flat.reshape(-1, n)
    inputs = {}
    for needed in host_inputs(estimator):
        if needed != "lengths":  # refused at start-up by config.check_estimator
            raise ValueError(f"advantage estimator {name!r} needs the reward's {needed}, which MindSpeed-RL does not pass")
        inputs["lengths"] = mask.to(torch.float32).sum(dim=-1).reshape(grouped.shape)
    try:
        adv = estimator(grouped, **dict(options or {}), **inputs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"advantage estimator {name!r} failed on this batch: {exc}") from exc
    if adv.shape != grouped.shape:
        raise ValueError(f"advantage estimator {name!r} returned shape {tuple(adv.shape)} for {tuple(grouped.shape)}")
    maskf = mask.to(torch.float32)
    token_adv = adv.reshape(-1, 1).to(torch.float32) * maskf
    if name in WHITENED_ESTIMATORS:
        token_adv = whiten(token_adv, mask.bool())
    return token_adv


def _compute(td, gamma, lam, adv_estimator, experience_count, tokenizer, global_batch_size, guarantee_order,
             n_sample_per_prompt, use_kl_in_reward=False, multi_turn_enable=False):
    from mindspeed_rl.trainer.utils import compute_utils as cu

    name = str(adv_estimator)
    get_advantage(name)  # an unknown name fails here, listing the registered ones
    options = settings_of(adv_estimator).get("adv_estimator_options", {})
    stage = "compute_advantage"
    columns = list(COLUMNS) + (["response_mask"] if multi_turn_enable else [])
    pad_token_id = tokenizer.pad if tokenizer.pad is not None else tokenizer.eod
    sorted_indexes = (
        cu.get_current_dp_range_indexes(experience_count=experience_count, assign_batch_size=global_batch_size)
        if guarantee_order else None
    )
    while not ray.get(td.all_consumed.remote(stage)):
        batch, index = ray.get(td.get_experience.remote(
            stage, columns, experience_count, indexes=sorted_indexes.pop(0) if guarantee_order else None))
        batch = cu.remove_padding_tensor_dict_to_dict(batch)
        if not (batch and index):
            continue
        batch = cu.pad_experience(batch, pad_token_id)
        mask = batch["response_mask"] if "response_mask" in batch else cu.generate_mask(
            batch["responses"], batch["response_length"])
        mask = mask.to(batch["responses"].device)
        advantages = estimator_advantages(name, batch["rm_scores"], mask, int(n_sample_per_prompt), options)
        returns = advantages.clone()
        advantages = cu.truncate_rows(advantages, batch["response_length"])
        returns = cu.truncate_rows(returns, batch["response_length"])
        td.put_experience.remote(data_dict=cu.padding_dict_to_tensor_dict({"advantages": advantages, "returns": returns}),
                                 indexes=index)


def _run(td, gamma, lam, adv_estimator, experience_count, tokenizer, global_batch_size, guarantee_order,
         n_sample_per_prompt, use_kl_in_reward=False, multi_turn_enable=False):
    from mindspeed_rl.trainer.utils import compute_utils as cu

    from .compat import original

    args = (td, gamma, lam, adv_estimator, experience_count, tokenizer, global_batch_size, guarantee_order,
            n_sample_per_prompt, use_kl_in_reward, multi_turn_enable)
    if str(adv_estimator) in MINDSPEED_ESTIMATORS:
        try:
            builtin = original(cu, "compute_advantage")
        except KeyError:  # this worker imported compute_utils without the plugin: it is the original
            builtin = cu.compute_advantage
        # The plain name: MindSpeed-RL's body compares it and may log it.
        return builtin._function(*args[:3], str(adv_estimator), *args[4:])
    mstx, range_id = _mstx_range("compute_advantage")
    try:
        return _compute(*args)
    finally:
        if mstx is not None:
            mstx.range_end(range_id)


# Same parameter list as MindSpeed-RL's task, so the trainers' calls are unchanged.
@ray.remote
def compute_advantage(td, gamma, lam, adv_estimator, experience_count, tokenizer, global_batch_size, guarantee_order,
                      n_sample_per_prompt, use_kl_in_reward=False, multi_turn_enable=False):
    """rlhf_ext's ``compute_advantage`` task (see the module docstring)."""
    return _run(td, gamma, lam, adv_estimator, experience_count, tokenizer, global_batch_size, guarantee_order,
                n_sample_per_prompt, use_kl_in_reward, multi_turn_enable)


def make_compute_advantage(original, module):
    return compute_advantage
