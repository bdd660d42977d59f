"""The names rlhf_ext registers in verl, and the settings it reads.

Everything rlhf_ext adds to verl's registries is named ``rlhf_ext_<rlhf_ext name>``: verl's own
names (``grpo``, ``rloo``, ``grpo_passk``, ``vanilla``, ``gspo``, ...) keep their behaviour, and a
run's config says which implementation it uses.
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Tuple

PREFIX = "rlhf_ext_"

# The verl releases this glue was written against (core_algos' registries and calling conventions).
SUPPORTED_SERIES = ((0, 9),)
SUPPORTED_DESCRIPTION = "0.9.x"
ALLOW_UNSUPPORTED_ENV = "RLHF_EXT_ALLOW_UNSUPPORTED_VERL"

# Where estimator options live in verl's config: ``+algorithm.rlhf_ext.<option>=<value>``.
OPTIONS_KEY = "rlhf_ext"

# KL clamp for verl's KL penalties: "LO,HI" or "none"; unset leaves verl's kl_penalty untouched.
KL_CLIP_ENV = "RLHF_EXT_VERL_KL_CLIP"

# REINFORCE++ (arXiv 2501.03262) whitens token advantages over the whole batch after the
# estimator, as verl's own reinforce_plus_plus does; the other estimators are outcome-only.
WHITENED_ESTIMATORS = ("reinforce_pp", "reinforce_pp_baseline")


# ``rlhf_ext_<name>`` gives verl's numbers by default where verl's own loss / estimator of that algorithm
# departs from rlhf_ext's default; the variable (any non-empty value but 0 / false) asks for rlhf_ext's.
RLHF_EXT_DEFAULTS_ENV = "RLHF_EXT_VERL_RLHF_EXT_DEFAULTS"
# verl's geo_mean averages the sequence losses of the micro-batch (torch.mean, every row) and its sapo reduces
# with seq-mean-token-mean, whatever loss_agg_mode says; rlhf_ext's losses are reduced as loss_agg_mode says
VERL_FIXED_REDUCTION = {"gmpo": "row-mean", "geo_mean": "row-mean", "sapo": "seq-mean-token-mean"}
# verl's gpg estimator divides by the number of non-zero rewards (compute_gpg_outcome_advantage); the GPG
# paper (arXiv 2504.02546) and rlhf_ext's default by the number of valid responses
VERL_ESTIMATOR_DEFAULTS = {"gpg": {"alpha_count": "nonzero_reward"}}


def rlhf_ext_defaults() -> bool:
    """Whether ``RLHF_EXT_VERL_RLHF_EXT_DEFAULTS`` asks for rlhf_ext's behaviour instead of verl's."""
    value = os.environ.get(RLHF_EXT_DEFAULTS_ENV, "").strip().lower()
    return value not in ("", "0", "false", "no")


def verl_name(rlhf_ext_name: str) -> str:
    """``"passk"`` -> ``"rlhf_ext_passk"``."""
    return PREFIX + rlhf_ext_name


# what an adapter's function name ends with, by the kind of rlhf_ext function it wraps
ADAPTER_SUFFIX = {"advantage estimator": "advantage", "policy loss": "policy_loss"}


def named_for_verl(adapter: Callable, name: str, kind: str, adapter_module: str, original: Callable) -> Callable:
    """Name ``adapter`` (the verl-convention wrapper of the rlhf_ext ``kind`` ``name``) as verl shows it:
    ``rlhf_ext_<name>_advantage`` / ``rlhf_ext_<name>_policy_loss``, the original's docstring under a
    line naming the adapter module, and ``rlhf_ext_name``. ``kind``: one of :data:`ADAPTER_SUFFIX`."""
    adapter.__name__ = adapter.__qualname__ = f"{verl_name(name)}_{ADAPTER_SUFFIX[kind]}"
    adapter.__doc__ = (f"rlhf_ext's {name!r} {kind} in verl's calling convention "
                       f"(see {adapter_module}).\n\n{original.__doc__ or ''}")
    adapter.rlhf_ext_name = name
    return adapter


def parse_kl_clip(text: Optional[str]) -> Optional[Tuple[float, float]]:
    """``"-5,5"`` -> (-5.0, 5.0); ``"none"`` -> None. ``ValueError`` names the variable on bad input."""
    if text is None:
        raise ValueError(f"{KL_CLIP_ENV} is not set")
    from rlhf_ext.algorithms.kl import parse_kl_clip as shared_rule  # one rule for every host

    return shared_rule(text, setting=KL_CLIP_ENV, form="'LO,HI' (e.g. '-5,5')", bounds=("LO", "HI"), split_text=True)


def kl_clip_setting():
    """The raw ``RLHF_EXT_VERL_KL_CLIP`` value, or None when unset/blank."""
    value = os.environ.get(KL_CLIP_ENV, "")
    return value if value.strip() else None
